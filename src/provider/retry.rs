//! Retrying transient provider errors.
//!
//! Exponential backoff with full or decorrelated jitter, bounded in the number of retries and in
//! the total time spent waiting. A wait the server asked for (`Retry-After` and friends) wins over
//! the computed delay, but never over the total budget: when the server asks for more than is
//! left, the error is returned instead. Only [`ProviderError::is_transient`] errors are retried.

use std::future::Future;
use std::time::Duration;

use super::client::Client;
use super::error::ProviderError;
use super::message::{ChatRequest, ChatResponse};

/// How the computed delays are randomised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Jitter {
    /// `random(0, min(cap, base * 2^n))`.
    #[default]
    Full,
    /// `min(cap, random(base, previous * 3))`.
    #[cfg_attr(not(test), expect(dead_code, reason = "only the tests pick it yet"))]
    Decorrelated,
}

/// Retry limits. Defaults: base 1 s, cap 30 s, 5 retries, 120 s total wait, full jitter,
/// 180 s for a provider that is still starting (and, when `SUMMON_STARTUP_WAIT_MS` is set,
/// for one that gives no connection before it ever answered), 30 s of failed connections for
/// one that answered before, and 300 s of nothing but 429s.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RetryPolicy {
    pub(crate) base: Duration,
    /// The longest computed delay (a server-given wait may be longer).
    pub(crate) cap: Duration,
    /// Retries after the first attempt.
    pub(crate) max_retries: u32,
    /// Upper bound on the sum of all waits of one request.
    pub(crate) max_total_wait: Duration,
    pub(crate) jitter: Jitter,
    /// How long a provider still starting (503 "Loading model", or no connection before it
    /// ever answered) is waited for, apart from the retries above.
    pub(crate) startup_wait: Duration,
    /// Whether a provider that gives no connection before it ever answered is waited for
    /// (`SUMMON_STARTUP_WAIT_MS` is set: a server is being started). Without it, such a
    /// provider fails at once: nothing listens there.
    pub(crate) wait_for_server: bool,
    /// How long a provider that answered before may fail every connection before it is
    /// taken for dead: then nothing more is sent to it.
    pub(crate) unreachable_window: Duration,
    /// How long a provider may answer every request with a 429 before it is taken as
    /// refusing the run: then nothing more is sent to it.
    pub(crate) rate_limited_window: Duration,
}

/// The longest pause of a task waiting out the unreachable window.
const UNREACHABLE_POLL_CAP: Duration = Duration::from_secs(2);

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(30),
            max_retries: 5,
            max_total_wait: Duration::from_secs(120),
            jitter: Jitter::Full,
            startup_wait: Duration::from_secs(180),
            wait_for_server: false,
            unreachable_window: Duration::from_secs(30),
            rate_limited_window: Duration::from_secs(300),
        }
    }
}

impl RetryPolicy {
    /// The default policy, with what the environment sets: the base delay
    /// (`SUMMON_RETRY_BASE_MS`; tests and local servers use a short one), the start-up wait,
    /// and the windows of an unreachable and a rate-limiting provider. Each is a whole number
    /// of milliseconds; anything else is refused, naming the variable.
    pub(crate) fn from_env(env: &crate::env::Env) -> Result<Self, String> {
        let mut policy = Self::default();
        for (key, field) in [
            ("SUMMON_RETRY_BASE_MS", &mut policy.base),
            ("SUMMON_STARTUP_WAIT_MS", &mut policy.startup_wait),
            ("SUMMON_UNREACHABLE_MS", &mut policy.unreachable_window),
            ("SUMMON_RATE_LIMITED_MS", &mut policy.rate_limited_window),
        ] {
            if let Some(value) = env.millis(key)? {
                *field = value;
            }
        }
        policy.wait_for_server = env.millis("SUMMON_STARTUP_WAIT_MS")?.is_some();
        let bound = super::client::MAX_RESPONSE_VAR;
        if let Some(text) = env.var(bound)
            && !text.trim().parse::<u64>().is_ok_and(|mb| mb > 0)
        {
            return Err(format!(
                "{bound} must be a whole number of MiB above 0, found `{text}`"
            ));
        }
        Ok(policy)
    }

    /// A policy that never retries.
    #[cfg(test)]
    pub(crate) fn none() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }
}

/// What a provider that never answered is told with: nothing listens at its URL.
const NO_SERVER: &str = "nothing answers there: start the server, or set OPENAI_BASE_URL \
    (or the config's `base_url`) to one that runs, or OPENAI_API_KEY or ANTHROPIC_API_KEY for \
    a hosted provider (`summon doctor` checks it); for a server still starting, set \
    SUMMON_STARTUP_WAIT_MS (e.g. 180000) to wait for it";

/// Ended by the first Ctrl-C: every wait for a provider (a retry's, a start-up wait, a
/// provider unreachable) ends, and its request fails unsent.
static WAITS_ENDED: std::sync::OnceLock<tokio_util::sync::CancellationToken> =
    std::sync::OnceLock::new();

fn waits_ended() -> &'static tokio_util::sync::CancellationToken {
    WAITS_ENDED.get_or_init(tokio_util::sync::CancellationToken::new)
}

/// Ends every wait for a provider in this process, now and later (the first Ctrl-C).
pub(crate) fn end_waits() {
    waits_ended().cancel();
}

/// `wait`, unless the waits end first: then the error a request fails with.
async fn or_interrupted(wait: impl Future<Output = ()>) -> Result<(), ProviderError> {
    tokio::select! {
        biased;
        () = waits_ended().cancelled() => Err(ProviderError::NotSent {
            message: "interrupted (Ctrl-C) while waiting for the provider".to_owned(),
        }),
        () = wait => Ok(()),
    }
}

/// The retry state of one request.
#[derive(Debug, Clone)]
pub(crate) struct Backoff<'a> {
    policy: &'a RetryPolicy,
    retries: u32,
    waited: Duration,
    previous: Duration,
}

impl<'a> Backoff<'a> {
    pub(crate) fn new(policy: &'a RetryPolicy) -> Self {
        Self {
            policy,
            retries: 0,
            waited: Duration::ZERO,
            previous: policy.base,
        }
    }

    /// Retries granted so far.
    pub(crate) fn retries(&self) -> u32 {
        self.retries
    }

    /// Total wait granted so far.
    #[cfg(test)]
    pub(crate) fn waited(&self) -> Duration {
        self.waited
    }

    /// The wait before retrying after `err`, or `None` when `err` must be returned: it is not
    /// transient, the retries are used up, or the wait would exceed the total budget.
    pub(crate) fn next_delay(&mut self, err: &ProviderError) -> Option<Duration> {
        self.next_delay_with(err, rand::random::<f64>())
    }

    /// [`Self::next_delay`] with the random number (in `[0, 1)`) given, for tests.
    fn next_delay_with(&mut self, err: &ProviderError, unit: f64) -> Option<Duration> {
        let policy = self.policy;
        if !err.is_transient() || self.retries >= policy.max_retries {
            return None;
        }
        let left = policy.max_total_wait.saturating_sub(self.waited);
        if left.is_zero() {
            return None;
        }
        let unit = unit.clamp(0.0, 1.0);
        let delay = match err.retry_after() {
            Some(asked) => {
                if asked > left {
                    return None;
                }
                // Spread the herd a little (at most 10 %, at most 1 s), never within the wait
                // the server asked for.
                let spread = (asked / 10).min(Duration::from_secs(1)).min(left - asked);
                asked + spread.mul_f64(unit)
            }
            None => self.computed(unit).min(left),
        };
        self.retries += 1;
        self.waited += delay;
        self.previous = delay.max(policy.base);
        Some(delay)
    }

    fn computed(&self, unit: f64) -> Duration {
        let policy = self.policy;
        match policy.jitter {
            Jitter::Full => {
                let factor = 1u32.checked_shl(self.retries).unwrap_or(u32::MAX);
                policy
                    .base
                    .saturating_mul(factor)
                    .min(policy.cap)
                    .mul_f64(unit)
            }
            Jitter::Decorrelated => {
                let low = policy.base.min(policy.cap);
                let high = self.previous.saturating_mul(3).min(policy.cap).max(low);
                (low + (high - low).mul_f64(unit)).min(policy.cap)
            }
        }
    }
}

/// Told about every retry before its wait; may also take over the wait itself.
///
/// Any `FnMut(&ProviderError, attempt, delay)` closure is a hook. A scheduler implements the
/// trait to give its concurrency slot back during [`RetryHook::wait`] and take one again after.
pub(crate) trait RetryHook {
    /// `attempt` counts retries from 1; `delay` is the wait before it.
    fn on_retry(&mut self, err: &ProviderError, attempt: u32, delay: Duration);

    /// Told before each wait of `delay` for a provider that is still starting (`err`), which
    /// is waited for at most `budget`, apart from the retries; `first` once per provider.
    fn on_startup_wait(
        &mut self,
        _err: &ProviderError,
        _budget: Duration,
        _delay: Duration,
        _first: bool,
    ) {
    }

    /// Told before a request waits `delay` for the provider's rate limits to allow it
    /// (`binding` is the limit that holds it); the wait itself is [`RetryHook::wait`]'s.
    fn on_hold(&mut self, _binding: &super::admission::Binding, _delay: Duration) {}

    /// Waits out `delay` before the next attempt.
    fn wait(&mut self, delay: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(delay)
    }

    /// Waits until `ready` (the provider's limits admit the request), giving back what
    /// [`RetryHook::wait`] gives back.
    fn hold<R: Future<Output = ()> + Send>(&mut self, ready: R) -> impl Future<Output = ()> + Send {
        ready
    }

    /// Waits out `delay` for a provider still starting, keeping whatever [`RetryHook::wait`]
    /// would give back.
    fn pause(&mut self, delay: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(delay)
    }
}

impl<F> RetryHook for F
where
    F: FnMut(&ProviderError, u32, Duration),
{
    fn on_retry(&mut self, err: &ProviderError, attempt: u32, delay: Duration) {
        self(err, attempt, delay)
    }
}

/// Runs `op` until it succeeds, fails with an error that must not be retried, or the policy's
/// budget is spent; returns the last error then.
pub(crate) async fn retry_transient<T, F, Fut, H>(
    policy: &RetryPolicy,
    hook: &mut H,
    mut op: F,
) -> Result<T, ProviderError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ProviderError>>,
    H: RetryHook,
{
    let mut backoff = Backoff::new(policy);
    loop {
        let err = match op().await {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        let Some(delay) = backoff.next_delay(&err) else {
            return Err(err);
        };
        hook.on_retry(&err, backoff.retries(), delay);
        or_interrupted(hook.wait(delay)).await?;
    }
}

/// Sends `req` through `client`, retrying transient errors as `policy` allows. A provider
/// still starting — a 503 that says it is loading, or no connection before it ever answered —
/// is waited for within the policy's start-up wait first, apart from the retries, and said
/// once per provider through [`RetryHook::on_startup_wait`]. A provider stopped (see
/// [`super::client::ProviderStop`]) is sent nothing more: the request fails `NotSent`.
pub(crate) async fn send_with_retry<H: RetryHook>(
    client: &Client,
    req: &ChatRequest,
    policy: &RetryPolicy,
    hook: &mut H,
) -> Result<ChatResponse, ProviderError> {
    let mut backoff = Backoff::new(policy);
    loop {
        // Each attempt goes when the provider's limits allow it, waiting without the slot,
        // with an output limit they can admit (learned from the last answer's headers).
        let req = &*client.fitted(req);
        let ticket = client.reserve(req);
        if let Some((delay, binding)) = &ticket.wait {
            hook.on_hold(binding, *delay);
            // Until the limits have the request's share: tokens given back (an answer
            // shorter than its limit) let it go before `delay`.
            hook.hold(client.admission().ready(&ticket)).await;
        }
        let err = match client.chat_reserved(req, &ticket).await {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        // A provider that answered before and has not been reachable since for the window:
        // nothing more is sent to it.
        if let Some(stopped) = client.note_unreachable(&err, policy.unreachable_window) {
            return Err(stopped);
        }
        // One that has answered every request with a 429 for its window, likewise.
        if let Some(stopped) = client.note_rate_limited(&err, policy.rate_limited_window) {
            return Err(stopped);
        }
        let never_answered = err.is_connect() && !client.has_answered();
        // Nothing listens where no server was said to be starting, or an https:// URL is
        // answered in plain HTTP: no wait would help; nothing more is sent to it.
        if (never_answered && !policy.wait_for_server) || err.is_plain_http() {
            let err = match err {
                ProviderError::Network { kind, message } if never_answered => {
                    ProviderError::Network {
                        kind,
                        message: format!("{message}; {NO_SERVER}"),
                    }
                }
                other => other,
            };
            client.stop_no_server(&err);
            return Err(err);
        }
        if err.is_loading() || never_answered {
            if let Some(delay) = client.startup_pause(policy.startup_wait) {
                let first = client.first_startup_wait();
                hook.on_startup_wait(&err, policy.startup_wait, delay, first);
                // The slot is kept: a task started in its place would only wait too.
                or_interrupted(hook.pause(delay)).await?;
                continue;
            }
            // No connection through the start-up wait: the provider is taken for dead, and no
            // other request is sent to it.
            if never_answered {
                client.stop_unreachable(&err, policy.startup_wait);
                return Err(err);
            }
        }
        let Some(delay) = backoff.next_delay(&err) else {
            // Its retries spent, a request to a provider that answered before and cannot be
            // reached now waits for the end of the window: the provider is back or taken for
            // dead by then.
            if let Some(left) = client.unreachable_left(&err, policy.unreachable_window) {
                or_interrupted(hook.wait(left.min(UNREACHABLE_POLL_CAP))).await?;
                continue;
            }
            return Err(err);
        };
        hook.on_retry(&err, backoff.retries(), delay);
        or_interrupted(hook.wait(delay)).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn overloaded() -> ProviderError {
        ProviderError::Overloaded {
            status: 503,
            retry_after: None,
            message: String::new(),
        }
    }

    fn rate_limited(secs: u64) -> ProviderError {
        ProviderError::RateLimited {
            retry_after: Some(Duration::from_secs(secs)),
            message: String::new(),
        }
    }

    #[test]
    fn computed_delays_stay_under_the_cap_and_the_budget() {
        for jitter in [Jitter::Full, Jitter::Decorrelated] {
            let policy = RetryPolicy {
                base: Duration::from_millis(100),
                cap: Duration::from_secs(2),
                max_retries: 50,
                max_total_wait: Duration::from_secs(20),
                jitter,
                ..RetryPolicy::default()
            };
            for round in 0..200 {
                let mut backoff = Backoff::new(&policy);
                let mut total = Duration::ZERO;
                let mut count = 0;
                while let Some(delay) = backoff.next_delay(&overloaded()) {
                    assert!(delay <= policy.cap, "{jitter:?} round {round}: {delay:?}");
                    if jitter == Jitter::Decorrelated {
                        assert!(delay >= policy.base.min(policy.max_total_wait - total));
                    }
                    total += delay;
                    count += 1;
                }
                assert!(total <= policy.max_total_wait, "{total:?}");
                assert!(count <= policy.max_retries);
                assert_eq!(total, backoff.waited());
            }
        }
    }

    #[test]
    fn full_jitter_grows_exponentially_up_to_the_cap() {
        let policy = RetryPolicy {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(30),
            max_retries: 10,
            max_total_wait: Duration::from_secs(1000),
            jitter: Jitter::Full,
            ..RetryPolicy::default()
        };
        let mut backoff = Backoff::new(&policy);
        let ceilings: Vec<_> = (0..7)
            .map(|_| {
                backoff
                    .next_delay_with(&overloaded(), 1.0)
                    .map(|d| d.as_secs())
            })
            .collect();
        assert_eq!(ceilings, [1, 2, 4, 8, 16, 30, 30].map(Some));
        let mut backoff = Backoff::new(&policy);
        assert_eq!(
            backoff.next_delay_with(&overloaded(), 0.0),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn retries_are_bounded_in_count() {
        let policy = RetryPolicy::default();
        let mut backoff = Backoff::new(&policy);
        let granted = std::iter::from_fn(|| backoff.next_delay_with(&overloaded(), 0.1)).count();
        assert_eq!(granted, 5);
        let never = RetryPolicy::none();
        assert_eq!(Backoff::new(&never).next_delay(&overloaded()), None);
    }

    #[test]
    fn server_wait_wins_but_not_over_the_budget() {
        let policy = RetryPolicy {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(10),
            max_retries: 5,
            max_total_wait: Duration::from_secs(60),
            jitter: Jitter::Full,
            ..RetryPolicy::default()
        };
        let mut backoff = Backoff::new(&policy);
        // Longer than the cap: the server's word counts.
        let delay = backoff
            .next_delay_with(&rate_limited(20), 0.999)
            .expect("retry");
        assert!(
            delay >= Duration::from_secs(20) && delay <= Duration::from_secs(21),
            "{delay:?}"
        );
        let delay = backoff
            .next_delay_with(&rate_limited(30), 0.0)
            .expect("retry");
        assert_eq!(delay, Duration::from_secs(30));
        // 50 s of 60 s spent: a 20 s wait does not fit.
        assert_eq!(backoff.next_delay_with(&rate_limited(20), 0.0), None);
        // ... while a computed delay is shortened to what is left.
        let delay = backoff
            .next_delay_with(&overloaded(), 0.999)
            .expect("retry");
        assert!(delay <= Duration::from_millis(10));
    }

    #[test]
    fn permanent_errors_are_never_retried() {
        let policy = RetryPolicy::default();
        let permanent = [
            ProviderError::Auth {
                status: 401,
                env_var: None,
                message: String::new(),
            },
            ProviderError::QuotaExhausted {
                message: String::new(),
            },
            ProviderError::BadRequest {
                status: 400,
                message: String::new(),
            },
            ProviderError::ContextTooLong {
                message: String::new(),
            },
            ProviderError::Other {
                status: Some(302),
                message: String::new(),
            },
        ];
        for err in permanent {
            assert_eq!(Backoff::new(&policy).next_delay(&err), None, "{err:?}");
        }
        let network = ProviderError::Network {
            kind: super::super::error::NetworkKind::Body,
            message: "reset".into(),
        };
        assert!(Backoff::new(&policy).next_delay(&network).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn retry_loop_reports_each_retry_and_returns_the_last_error() {
        let policy = RetryPolicy {
            max_retries: 3,
            ..RetryPolicy::default()
        };
        let calls = Cell::new(0u32);
        let mut seen = Vec::new();
        let mut hook = |err: &ProviderError, attempt: u32, delay: Duration| {
            seen.push((err.code(), attempt, delay));
        };
        let result: Result<(), _> = retry_transient(&policy, &mut hook, || {
            calls.set(calls.get() + 1);
            async { Err(overloaded()) }
        })
        .await;
        assert_eq!(result.map_err(|e| e.code()), Err("overloaded"));
        assert_eq!(calls.get(), 4);
        assert_eq!(seen.iter().map(|s| s.1).collect::<Vec<_>>(), [1, 2, 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_loop_waits_the_server_time_then_succeeds() {
        let policy = RetryPolicy::default();
        let calls = Cell::new(0u32);
        let start = tokio::time::Instant::now();
        let mut hook = |_: &ProviderError, _: u32, _: Duration| {};
        let result = retry_transient(&policy, &mut hook, || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move { if n == 1 { Err(rate_limited(7)) } else { Ok(n) } }
        })
        .await;
        assert_eq!(result, Ok(2));
        assert!(start.elapsed() >= Duration::from_secs(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_custom_hook_can_take_over_the_wait() {
        struct Recorder {
            waits: Vec<Duration>,
        }
        impl RetryHook for Recorder {
            fn on_retry(&mut self, _: &ProviderError, _: u32, _: Duration) {}
            fn wait(&mut self, delay: Duration) -> impl Future<Output = ()> + Send {
                self.waits.push(delay);
                std::future::ready(())
            }
        }
        let policy = RetryPolicy {
            max_retries: 2,
            ..RetryPolicy::default()
        };
        let mut hook = Recorder { waits: Vec::new() };
        let start = tokio::time::Instant::now();
        let result: Result<(), _> =
            retry_transient(&policy, &mut hook, || async { Err(rate_limited(5)) }).await;
        assert!(result.is_err());
        assert_eq!(hook.waits.len(), 2);
        assert!(hook.waits.iter().all(|w| *w >= Duration::from_secs(5)));
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn permanent_errors_return_after_one_call() {
        let calls = Cell::new(0u32);
        let retried = Cell::new(false);
        let mut hook = |_: &ProviderError, _: u32, _: Duration| retried.set(true);
        let result: Result<(), _> = retry_transient(&RetryPolicy::default(), &mut hook, || {
            calls.set(calls.get() + 1);
            async {
                Err(ProviderError::QuotaExhausted {
                    message: "insufficient_quota".into(),
                })
            }
        })
        .await;
        assert!(matches!(result, Err(ProviderError::QuotaExhausted { .. })));
        assert_eq!(calls.get(), 1);
        assert!(!retried.get());
    }
}
