//! Per-provider requests-per-minute and tokens-per-minute budgets, shared by every task that
//! talks to the provider.
//!
//! Two token buckets (GCRA-style reservations): each bucket holds at most one minute of budget
//! and refills continuously. [`RateLimiter::acquire`] takes its share at once, even into debt,
//! and sleeps until the debt is paid, so waiters are served in arrival order without polling.
//! When a token estimate turns out wrong, [`RateLimiter::record_actual`] corrects the balance.
//! An unconfigured limiter is a `None` and costs nothing.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::message::{ChatRequest, Message};

/// Configured limits; `None` means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RateLimits {
    pub(crate) requests_per_minute: Option<u32>,
    pub(crate) tokens_per_minute: Option<u64>,
}

/// A shared limiter; clones share one budget.
#[derive(Debug, Clone, Default)]
pub(crate) struct RateLimiter {
    inner: Option<Arc<Inner>>,
}

#[derive(Debug)]
struct Inner {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    capacity: f64,
    per_second: f64,
}

impl Bucket {
    fn per_minute(limit: f64) -> Option<Self> {
        (limit > 0.0).then(|| Self {
            capacity: limit,
            per_second: limit / 60.0,
        })
    }

    /// Time until `balance` is back to zero.
    fn debt_wait(&self, balance: f64) -> Duration {
        if balance >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((-balance / self.per_second).min(1e9))
        }
    }
}

#[derive(Debug)]
struct State {
    requests: f64,
    tokens: f64,
    updated: Instant,
}

impl RateLimiter {
    /// A limiter for `limits`; unlimited (free) when neither limit is set or both are zero.
    pub(crate) fn new(limits: RateLimits) -> Self {
        let requests = limits
            .requests_per_minute
            .and_then(|l| Bucket::per_minute(f64::from(l)));
        // Token counts beyond 2^53 per minute are not a real limit.
        let tokens = limits
            .tokens_per_minute
            .and_then(|l| Bucket::per_minute(l as f64));
        if requests.is_none() && tokens.is_none() {
            return Self::unlimited();
        }
        let state = State {
            requests: requests.map_or(0.0, |b| b.capacity),
            tokens: tokens.map_or(0.0, |b| b.capacity),
            updated: Instant::now(),
        };
        Self {
            inner: Some(Arc::new(Inner {
                requests,
                tokens,
                state: Mutex::new(state),
            })),
        }
    }

    pub(crate) fn unlimited() -> Self {
        Self { inner: None }
    }

    pub(crate) fn is_unlimited(&self) -> bool {
        self.inner.is_none()
    }

    /// Waits until one request of about `estimated_tokens` tokens fits in both budgets, and
    /// takes it. A request larger than the whole per-minute token budget waits for a full bucket.
    /// When the returned future is dropped before it completes, the share is given back.
    pub(crate) async fn acquire(&self, estimated_tokens: u64) {
        let Some(inner) = &self.inner else { return };
        let tokens = inner.token_share(estimated_tokens);
        let wait = {
            let mut state = inner.lock_refilled();
            let mut wait = Duration::ZERO;
            if let Some(bucket) = inner.requests {
                state.requests -= 1.0;
                wait = wait.max(bucket.debt_wait(state.requests));
            }
            if let Some(bucket) = inner.tokens {
                state.tokens -= tokens;
                wait = wait.max(bucket.debt_wait(state.tokens));
            }
            wait
        };
        if wait.is_zero() {
            return;
        }
        let mut refund = Refund {
            inner,
            tokens,
            armed: true,
        };
        tokio::time::sleep(wait).await;
        refund.armed = false;
    }

    /// Corrects the token budget once the real usage of a request is known: `estimated` is what
    /// was passed to [`Self::acquire`], `actual` what the provider reported.
    pub(crate) fn record_actual(&self, estimated: u64, actual: u64) {
        let Some(inner) = &self.inner else { return };
        let Some(bucket) = inner.tokens else { return };
        let mut state = inner.lock_refilled();
        let correction = inner.token_share(estimated) - actual as f64;
        state.tokens = (state.tokens + correction).min(bucket.capacity);
    }
}

impl Inner {
    fn token_share(&self, estimated: u64) -> f64 {
        self.tokens
            .map_or(0.0, |bucket| (estimated as f64).min(bucket.capacity))
    }

    /// Locks the state after crediting the budget earned since the last update.
    fn lock_refilled(&self) -> MutexGuard<'_, State> {
        // The state stays consistent even if a holder panicked: it is plain numbers.
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(state.updated).as_secs_f64();
        state.updated = now;
        if let Some(bucket) = self.requests {
            state.requests = (state.requests + elapsed * bucket.per_second).min(bucket.capacity);
        }
        if let Some(bucket) = self.tokens {
            state.tokens = (state.tokens + elapsed * bucket.per_second).min(bucket.capacity);
        }
        state
    }
}

/// Gives a reservation back when its waiter is cancelled.
struct Refund<'a> {
    inner: &'a Inner,
    tokens: f64,
    armed: bool,
}

impl Drop for Refund<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut state = self.inner.lock_refilled();
        if let Some(bucket) = self.inner.requests {
            state.requests = (state.requests + 1.0).min(bucket.capacity);
        }
        if let Some(bucket) = self.inner.tokens {
            state.tokens = (state.tokens + self.tokens).min(bucket.capacity);
        }
    }
}

/// A rough token estimate of a request for the limiter: about four characters per token of
/// everything sent, plus the output allowance.
pub(crate) fn estimate_tokens(req: &ChatRequest) -> u64 {
    let mut chars = req.system.len() + req.model.len();
    for message in &req.messages {
        chars += match message {
            Message::User { text } => text.len(),
            Message::Assistant { text, tool_calls } => {
                text.as_deref().map_or(0, str::len)
                    + tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.id.len() + c.arguments.to_string().len())
                        .sum::<usize>()
            }
            Message::ToolResult {
                call_id,
                name,
                content,
                ..
            } => call_id.len() + name.len() + content.len(),
        };
    }
    chars += tool_chars(&req.tools);
    (chars as u64).div_ceil(4) + u64::from(req.max_tokens.unwrap_or(0))
}

/// The characters the tool specs add to [`estimate_tokens`] (the same for every request that
/// carries them).
pub(crate) fn tool_chars(tools: &[super::ToolSpec]) -> usize {
    tools
        .iter()
        .map(|tool| tool.name.len() + tool.description.len() + tool.parameters.to_string().len())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(rpm: Option<u32>, tpm: Option<u64>) -> RateLimiter {
        RateLimiter::new(RateLimits {
            requests_per_minute: rpm,
            tokens_per_minute: tpm,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn unlimited_never_waits() {
        for limiter in [
            RateLimiter::default(),
            limiter(None, None),
            limiter(Some(0), Some(0)),
        ] {
            assert!(limiter.is_unlimited());
            let start = Instant::now();
            for _ in 0..10_000 {
                limiter.acquire(1_000_000).await;
            }
            limiter.record_actual(1, 1_000_000_000);
            assert_eq!(start.elapsed(), Duration::ZERO);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_per_minute() {
        let limiter = limiter(Some(60), None);
        let start = Instant::now();
        for _ in 0..60 {
            limiter.acquire(0).await;
        }
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "a full minute of budget at start"
        );
        limiter.acquire(0).await;
        assert_eq!(start.elapsed().as_millis(), 1000);
        limiter.acquire(0).await;
        assert_eq!(start.elapsed().as_millis(), 2000);
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_per_minute_and_corrections() {
        let limiter = limiter(None, Some(600)); // 10 tokens per second
        let start = Instant::now();
        limiter.acquire(600).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        limiter.acquire(100).await;
        assert_eq!(start.elapsed().as_millis(), 10_000);
        // The 100-token request really used 40: 60 come back at once.
        limiter.record_actual(100, 40);
        limiter.acquire(60).await;
        assert_eq!(start.elapsed().as_millis(), 10_000);
        // Under-estimates put the budget in debt.
        limiter.record_actual(10, 110);
        limiter.acquire(0).await;
        assert_eq!(start.elapsed().as_millis(), 20_000);
    }

    #[tokio::test(start_paused = true)]
    async fn oversized_requests_wait_for_a_full_bucket() {
        let limiter = limiter(None, Some(600));
        let start = Instant::now();
        limiter.acquire(10_000).await;
        limiter.acquire(10_000).await;
        assert_eq!(start.elapsed().as_millis(), 60_000);
    }

    #[tokio::test(start_paused = true)]
    async fn both_budgets_must_allow() {
        let limiter = limiter(Some(600), Some(60)); // 10 req/s, 1 token/s
        let start = Instant::now();
        limiter.acquire(60).await;
        limiter.acquire(5).await;
        assert_eq!(start.elapsed().as_millis(), 5_000);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_waiters_are_spread_over_time() {
        let limiter = limiter(Some(60), None);
        for _ in 0..60 {
            limiter.acquire(0).await;
        }
        let start = Instant::now();
        let tasks: Vec<_> = (0..10)
            .map(|_| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    limiter.acquire(0).await;
                    start.elapsed()
                })
            })
            .collect();
        let mut finished = Vec::new();
        for task in tasks {
            finished.push(task.await.expect("task").as_millis());
        }
        finished.sort_unstable();
        assert_eq!(finished, (1..=10).map(|s| s * 1000).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_gives_its_share_back() {
        let limiter = limiter(Some(60), None);
        for _ in 0..60 {
            limiter.acquire(0).await;
        }
        let start = Instant::now();
        let cancelled = tokio::time::timeout(Duration::from_millis(100), limiter.acquire(0)).await;
        assert!(cancelled.is_err());
        limiter.acquire(0).await;
        assert_eq!(start.elapsed().as_millis(), 1000);
    }

    #[test]
    fn estimates_count_characters_and_output_allowance() {
        let req = ChatRequest {
            model: "m".into(),
            system: "s".repeat(399),
            messages: vec![Message::user("u".repeat(400))],
            max_tokens: Some(50),
            ..ChatRequest::default()
        };
        assert_eq!(estimate_tokens(&req), 200 + 50);
    }
}
