//! When a request may go: the provider's rate limits, as its own headers tell them, and the
//! limits configured for it, in the provider's own accounting.
//!
//! One [`Admission`] per provider and run, shared by every task (and every service tier) that
//! talks to it. It keeps a token bucket per limit the provider rations by — requests, tokens
//! (OpenAI), input and output tokens (Anthropic) — each holding one minute of budget and
//! refilling continuously. A request is charged what the provider will count for it
//! ([`Admission::cost`]):
//!
//! - OpenAI counts a request at admission as the larger of its output limit (`max_tokens`) and
//!   its input estimated from characters / 4, and gives nothing back when the answer is shorter.
//! - Anthropic holds the output limit against the output tokens per minute until the answer
//!   ends, then counts what was written; input counts uncached input and cache writes, not
//!   cache reads.
//!
//! [`Admission::reserve`] takes the request's share at once, into debt if need be, and says how
//! long the debt takes to pay off: the caller waits that long (without its concurrency slot) and
//! then sends, so waiters go in arrival order without polling. Every answer's rate-limit headers
//! (`x-ratelimit-*`, `anthropic-ratelimit-*`) set the limits and bring the balances back to the
//! provider's own numbers ([`Admission::observe`]): what the provider says remained when it
//! admitted a request, refilled since, less what this run charged after that request. The
//! provider's word thus also counts what other processes on the same key spent. A 429 that says
//! which limit it hit and when to try again ([`Admission::rate_limited`]) empties that bucket
//! until then. Configured limits (`requests_per_minute`, `tokens_per_minute`,
//! `input_tokens_per_minute`, `output_tokens_per_minute`) apply as well; the smaller limit wins.
//!
//! Until a limit is known (configured, or seen in a header) nothing is held for it, and a
//! request costs one short mutex hold here.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use reqwest::header::HeaderMap;
use tokio::time::Instant;

use super::client::ProviderKind;
use super::message::{ChatRequest, Message, Usage};

/// Configured limits, per minute; `None` means none configured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RateLimits {
    pub(crate) requests_per_minute: Option<u32>,
    pub(crate) tokens_per_minute: Option<u64>,
    /// Anthropic-style keys: input tokens per minute.
    pub(crate) input_tokens_per_minute: Option<u64>,
    /// Anthropic-style keys: output tokens per minute.
    pub(crate) output_tokens_per_minute: Option<u64>,
}

impl RateLimits {
    /// The share of one of `shards` processes on the same key: each limit divided by their
    /// number (at least 1 a minute).
    pub(crate) fn shared_by(self, shards: u32) -> Self {
        if shards <= 1 {
            return self;
        }
        let part = |n: u64| (n / u64::from(shards)).max(1);
        Self {
            requests_per_minute: self
                .requests_per_minute
                .map(|n| u32::try_from(part(u64::from(n))).unwrap_or(1)),
            tokens_per_minute: self.tokens_per_minute.map(part),
            input_tokens_per_minute: self.input_tokens_per_minute.map(part),
            output_tokens_per_minute: self.output_tokens_per_minute.map(part),
        }
    }
}

/// A limit a provider rations a key by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dim {
    Requests = 0,
    /// OpenAI's tokens per minute (input and output limit counted together).
    Tokens = 1,
    /// Anthropic's input tokens per minute.
    Input = 2,
    /// Anthropic's output tokens per minute.
    Output = 3,
}

const DIMS: [Dim; 4] = [Dim::Requests, Dim::Tokens, Dim::Input, Dim::Output];

impl Dim {
    /// `output tokens per minute`
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::Requests => "requests per minute",
            Self::Tokens => "tokens per minute",
            Self::Input => "input tokens per minute",
            Self::Output => "output tokens per minute",
        }
    }

    /// The configuration key of the limit.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Self::Requests => "requests_per_minute",
            Self::Tokens => "tokens_per_minute",
            Self::Input => "input_tokens_per_minute",
            Self::Output => "output_tokens_per_minute",
        }
    }
}

/// What one request is charged in each limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Cost([f64; 4]);

impl Cost {
    pub(crate) fn get(&self, dim: Dim) -> f64 {
        self.0[dim as usize]
    }

    /// The tokens of the cost (what the provider holds against its token limits).
    pub(crate) fn tokens(&self) -> f64 {
        self.0[1] + self.0[2] + self.0[3]
    }
}

/// The limit that holds requests back, for the person watching: `the provider's output tokens
/// per minute (40k)`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Binding {
    pub(crate) dim: Dim,
    pub(crate) limit: u64,
    /// Learned from the provider's headers (else configured).
    pub(crate) provider: bool,
}

impl Binding {
    pub(crate) fn describe(&self) -> String {
        let whose = if self.provider {
            "the provider's"
        } else {
            "the configured"
        };
        format!(
            "{whose} {} ({})",
            self.dim.describe(),
            short_number(self.limit)
        )
    }
}

/// `950`, `40k`, `1.5M`
fn short_number(n: u64) -> String {
    let trim = |x: f64| {
        let text = format!("{x:.1}");
        text.strip_suffix(".0").map(str::to_owned).unwrap_or(text)
    };
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{}k", trim(n as f64 / 1e3)),
        _ => format!("{}M", trim(n as f64 / 1e6)),
    }
}

/// Counts the time a held request waited when its wait ends (or is dropped: a run stopped).
struct Waited<'a> {
    admission: &'a Admission,
    binding: Option<&'a Binding>,
    start: Instant,
}

impl Drop for Waited<'_> {
    fn drop(&mut self) {
        if let Some(binding) = self.binding {
            self.admission.note_waited(self.start.elapsed(), binding);
        }
    }
}

/// A request's reservation, from [`Admission::reserve`] to its answer.
#[derive(Debug)]
pub(crate) struct Ticket {
    cost: Cost,
    /// This run's net charges of each limit just after this reservation.
    net_at: [f64; 4],
    /// When the request goes (the reservation, plus its wait).
    at: Instant,
    /// Once sent ([`Admission::mark_sent`]): the charges of every request sent so far, this
    /// one included, and when it went.
    sent: std::sync::Mutex<Option<([f64; 4], Instant)>>,
    /// How long the request must wait before it goes, and the limit that holds it.
    pub(crate) wait: Option<(Duration, Binding)>,
    /// Per limit it owed at reservation: the limit's credit at which the debt is paid.
    targets: [Option<f64>; 4],
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    configured: Option<f64>,
    learned: Option<f64>,
    balance: f64,
    /// Everything this run charged the limit, less the charges of requests never sent. Not
    /// less the tokens answers gave back: the provider may have counted those before it
    /// said what remained ([`Admission::observe`] counts them there, not twice).
    net: f64,
    /// The part of `net` of requests already sent.
    sent: f64,
    /// Everything the balance has gained so far, other than by a reservation's charge
    /// (refill, tokens given back, the provider's word): a waiting request goes once this
    /// reaches its [`Ticket`]'s target, so tokens given back let it go early.
    credit: f64,
}

impl Bucket {
    /// Sets the balance, counting what it gained as credit.
    fn set_balance(&mut self, balance: f64) {
        self.credit += balance - self.balance;
        self.balance = balance;
    }

    fn limit(&self) -> Option<f64> {
        match (self.configured, self.learned) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn per_second(&self) -> Option<f64> {
        self.limit().map(|l| l / 60.0)
    }

    /// Time until the balance is back to zero.
    fn debt_wait(&self) -> Duration {
        match self.per_second() {
            Some(rate) if self.balance < 0.0 => {
                Duration::from_secs_f64((-self.balance / rate).min(1e6))
            }
            _ => Duration::ZERO,
        }
    }
}

#[derive(Debug)]
struct State {
    buckets: [Bucket; 4],
    updated: Instant,
    /// An answer has said it read from the prompt cache (Anthropic: such reads cost no input
    /// budget, so a request with a cached prefix is charged without it).
    cache_reads: bool,
}

/// What a run's requests were held back for and charged, for the report.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub(crate) struct AdmissionStats {
    /// Requests that waited for a limit before they went.
    pub(crate) held: u64,
    /// The longest of those waits, and their sum, in seconds.
    pub(crate) held_max_s: f64,
    pub(crate) held_total_s: f64,
    /// The limit that held requests back the longest in all, `the provider's tokens per
    /// minute (300k)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) binding: Option<String>,
    /// Answers that said the key was over a limit (HTTP 429).
    pub(crate) rate_limited: u64,
    /// The tokens the provider held for the run's requests at admission (its own accounting),
    /// and the tokens their answers used.
    pub(crate) tokens_reserved: u64,
    pub(crate) tokens_used: u64,
    /// The limits the provider's headers gave, by configuration key.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) provider_limits: Vec<(String, u64)>,
    /// The configured limits in force (a shard's share under `--shard`), by configuration key.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) configured_limits: Vec<(String, u64)>,
}

/// One provider's admission of requests; see the module documentation.
#[derive(Debug)]
pub(crate) struct Admission {
    kind: ProviderKind,
    state: Mutex<State>,
    held: AtomicU64,
    /// Held time per limit, in microseconds.
    held_us: [AtomicU64; 4],
    held_max_us: AtomicU64,
    rate_limited: AtomicU64,
    reserved: AtomicU64,
    used: AtomicU64,
    /// The binding limit's last description, per limit.
    binding: Mutex<[Option<Binding>; 4]>,
    /// Told when the balances gained more than their refill: waiting requests look again.
    gained: tokio::sync::Notify,
}

impl Admission {
    pub(crate) fn new(kind: ProviderKind, limits: RateLimits) -> Self {
        let mut buckets = [Bucket::default(); 4];
        let configured = [
            limits.requests_per_minute.map(f64::from),
            limits.tokens_per_minute.map(|n| n as f64),
            limits.input_tokens_per_minute.map(|n| n as f64),
            limits.output_tokens_per_minute.map(|n| n as f64),
        ];
        for (bucket, limit) in buckets.iter_mut().zip(configured) {
            bucket.configured = limit.filter(|l| *l > 0.0);
            bucket.balance = bucket.configured.unwrap_or(0.0);
        }
        Self {
            kind,
            state: Mutex::new(State {
                buckets,
                updated: Instant::now(),
                cache_reads: false,
            }),
            held: AtomicU64::new(0),
            held_us: Default::default(),
            held_max_us: AtomicU64::new(0),
            rate_limited: AtomicU64::new(0),
            reserved: AtomicU64::new(0),
            used: AtomicU64::new(0),
            binding: Mutex::new(Default::default()),
            gained: tokio::sync::Notify::new(),
        }
    }

    /// What the provider will charge `req` when sent with the output limit `max_tokens`.
    pub(crate) fn cost(&self, req: &ChatRequest, max_tokens: Option<u32>) -> Cost {
        let input = (estimate_tokens(req) - u64::from(req.max_tokens.unwrap_or(0))) as f64;
        let output = f64::from(max_tokens.unwrap_or(0));
        let mut cost = [1.0, 0.0, 0.0, 0.0];
        match self.kind {
            ProviderKind::OpenAi => cost[Dim::Tokens as usize] = output.max(input),
            ProviderKind::Anthropic => {
                let cached = req.cache.prefix && self.lock().cache_reads;
                let prefix = if cached {
                    ((tool_chars(&req.tools) + req.system.len()) as f64 / 4.0).ceil()
                } else {
                    0.0
                };
                cost[Dim::Input as usize] = (input - prefix).max(1.0);
                cost[Dim::Output as usize] = output;
            }
        }
        Cost(cost)
    }

    /// The largest output limit the key's limits can ever admit for `req`, where a limit is
    /// known: Anthropic's output tokens per minute; on OpenAI the tokens per minute less the
    /// request's input (a request counted above a whole minute's budget is refused, "Request
    /// too large", however long it waits). `None` when no limit bounds it.
    pub(crate) fn output_room(&self, req: &ChatRequest) -> Option<u32> {
        let state = self.lock();
        let room = match self.kind {
            ProviderKind::Anthropic => state.buckets[Dim::Output as usize].limit()?,
            ProviderKind::OpenAi => {
                let input = (estimate_tokens(req) - u64::from(req.max_tokens.unwrap_or(0))) as f64;
                state.buckets[Dim::Tokens as usize].limit()? - input
            }
        };
        Some(room.clamp(1.0, f64::from(u32::MAX)) as u32)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Plain numbers: consistent even if a holder panicked.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Credits every bucket with what it earned since the last update.
    fn refilled(&self) -> std::sync::MutexGuard<'_, State> {
        let mut state = self.lock();
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(state.updated).as_secs_f64();
        state.updated = now;
        for bucket in &mut state.buckets {
            if let (Some(limit), Some(rate)) = (bucket.limit(), bucket.per_second()) {
                bucket.set_balance((bucket.balance + elapsed * rate).min(limit));
            }
        }
        state
    }

    /// Takes `cost` from every limit at once and says how long the request must wait for the
    /// debt to be paid (none when every limit allows it now). A cost larger than a whole
    /// minute's limit waits for a full bucket.
    pub(crate) fn reserve(&self, cost: Cost) -> Ticket {
        let mut state = self.refilled();
        let mut wait: Option<(Duration, Dim)> = None;
        let mut targets = [None; 4];
        for dim in DIMS {
            let bucket = &mut state.buckets[dim as usize];
            let charge = cost.get(dim);
            bucket.net += charge;
            if let Some(limit) = bucket.limit() {
                bucket.balance -= charge.min(limit);
                let left = bucket.debt_wait();
                if !left.is_zero() {
                    targets[dim as usize] = Some(bucket.credit - bucket.balance);
                    if wait.is_none_or(|(w, _)| left > w) {
                        wait = Some((left, dim));
                    }
                }
            }
        }
        let net_at = state.buckets.map(|b| b.net);
        let binding = wait.map(|(left, dim)| {
            let bucket = state.buckets[dim as usize];
            let limit = bucket.limit().unwrap_or(0.0);
            let provider = bucket.learned.is_some_and(|l| l <= limit);
            (
                left,
                Binding {
                    dim,
                    limit: limit as u64,
                    provider,
                },
            )
        });
        drop(state);
        if let Some((_, binding)) = &binding {
            self.note_held(binding);
        }
        // The request goes once its wait is over: what the provider says then is as of then.
        let at = Instant::now() + binding.as_ref().map_or(Duration::ZERO, |(w, _)| *w);
        Ticket {
            cost,
            net_at,
            at,
            sent: std::sync::Mutex::new(None),
            wait: binding,
            targets,
        }
    }

    /// How long `ticket`'s request has still to wait: until every limit it owed has gained
    /// its debt back, by refill or by tokens given back (an answer shorter than its output
    /// limit, a cancelled request) or the provider's word.
    pub(crate) fn left(&self, ticket: &Ticket) -> Duration {
        let state = self.refilled();
        DIMS.into_iter()
            .filter_map(|dim| {
                let target = ticket.targets[dim as usize]?;
                let bucket = &state.buckets[dim as usize];
                let rate = bucket.per_second()?;
                let owed = target - bucket.credit;
                (owed > 0.0).then(|| Duration::from_secs_f64((owed / rate).min(1e6)))
            })
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// Waits until `ticket`'s request may go ([`Admission::left`]): woken early whenever the
    /// balances gain more than their refill.
    pub(crate) async fn ready(&self, ticket: &Ticket) {
        let start = Instant::now();
        let _counted = Waited {
            admission: self,
            binding: ticket.wait.as_ref().map(|(_, b)| b),
            start,
        };
        loop {
            let gained = self.gained.notified();
            tokio::pin!(gained);
            gained.as_mut().enable();
            let left = self.left(ticket);
            if left < Duration::from_millis(1) {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(left) => {}
                () = gained => {}
            }
        }
    }

    /// A request is held by `binding` ([`Admission::ready`] counts the time it really
    /// waited).
    fn note_held(&self, binding: &Binding) {
        self.held.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut last) = self.binding.lock() {
            last[binding.dim as usize] = Some(binding.clone());
        }
    }

    /// A request held by `binding` waited `waited`.
    fn note_waited(&self, waited: Duration, binding: &Binding) {
        let us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.held_us[binding.dim as usize].fetch_add(us, Ordering::Relaxed);
        self.held_max_us.fetch_max(us, Ordering::Relaxed);
    }

    /// The request of `ticket` goes now. The provider counts requests in the order they
    /// arrive, not the order they were reserved in: what it says of one counts those sent
    /// before it ([`Admission::observe`]).
    pub(crate) fn mark_sent(&self, ticket: &Ticket) {
        let mut sent = ticket.sent.lock().unwrap_or_else(|p| p.into_inner());
        if sent.is_some() {
            return;
        }
        let mut state = self.lock();
        for dim in DIMS {
            state.buckets[dim as usize].sent += ticket.cost.get(dim);
        }
        *sent = Some((state.buckets.map(|b| b.sent), Instant::now()));
    }

    fn was_sent(ticket: &Ticket) -> bool {
        ticket
            .sent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Gives a reservation back: the request was not admitted (a 429) or never sent.
    pub(crate) fn cancel(&self, ticket: &Ticket) {
        let sent = Self::was_sent(ticket);
        let mut state = self.refilled();
        for dim in DIMS {
            let bucket = &mut state.buckets[dim as usize];
            let charge = ticket.cost.get(dim);
            // A request sent and refused stays in `net` until the provider's next word
            // (which may have counted it: the sooner is the safer).
            if !sent {
                bucket.net -= charge;
            }
            if let Some(limit) = bucket.limit() {
                bucket.set_balance((bucket.balance + charge.min(limit)).min(limit));
            }
        }
        drop(state);
        self.gained.notify_waiters();
    }

    /// The request of `ticket` was answered with `usage`: the provider counts what the answer
    /// really used where it gives back (Anthropic's output and input), and the run's stats
    /// take both.
    pub(crate) fn settle(&self, ticket: &Ticket, usage: &Usage) {
        let counted_input = usage.input_tokens.saturating_sub(usage.cache_read_tokens);
        self.reserved
            .fetch_add(ticket.cost.tokens() as u64, Ordering::Relaxed);
        self.used.fetch_add(
            usage.input_tokens.saturating_add(usage.output_tokens),
            Ordering::Relaxed,
        );
        if self.kind != ProviderKind::Anthropic {
            return;
        }
        let mut state = self.refilled();
        if usage.cache_read_tokens > 0 {
            state.cache_reads = true;
        }
        for (dim, actual) in [
            (Dim::Input, counted_input as f64),
            (Dim::Output, usage.output_tokens as f64),
        ] {
            let bucket = &mut state.buckets[dim as usize];
            let back = ticket.cost.get(dim) - actual;
            if let Some(limit) = bucket.limit() {
                bucket.set_balance((bucket.balance + back).min(limit));
            }
        }
        drop(state);
        self.gained.notify_waiters();
    }

    /// Brings the limits and balances to what the answer to `ticket`'s request says in its
    /// rate-limit headers. `admitted`: the provider took the request (not a 429), so the
    /// remaining figures already count it. Headers that are missing or not numbers are
    /// ignored.
    pub(crate) fn observe(&self, headers: &HeaderMap, ticket: &Ticket, admitted: bool) {
        let seen = read_headers(headers);
        if seen.iter().all(Option::is_none) {
            return;
        }
        let sent = *ticket.sent.lock().unwrap_or_else(|p| p.into_inner());
        let mut state = self.refilled();
        let now = Instant::now();
        // As of when the request went: the charges of the requests sent before it are in
        // what the provider said; those sent after it, and those not sent yet, are not.
        let (before, at) = sent.unwrap_or((ticket.net_at, ticket.at));
        let elapsed = now.saturating_duration_since(at).as_secs_f64();
        for dim in DIMS {
            let Some((limit, remaining)) = seen[dim as usize] else {
                continue;
            };
            let bucket = &mut state.buckets[dim as usize];
            let first = bucket.limit().is_none();
            bucket.learned = Some(limit);
            let Some(effective) = bucket.limit() else {
                continue;
            };
            // A refused request is charged here until its cancellation gives back what its
            // reservation took: at most the whole limit (a request above a minute's budget
            // is refused with nothing taken).
            let charged = if admitted {
                0.0
            } else {
                ticket.cost.get(dim).min(effective)
            };
            // What the provider has left now: what it said, refilled since, less what this
            // run charged that it had not counted then. It said it when the request arrived,
            // some time between its sending and its answer: refilled since the sending at
            // most, since the answer at least. A balance within those two stays as it is
            // (it follows every charge and refill of the run); one outside is brought to the
            // nearer.
            let since = bucket.net - before[dim as usize];
            let said = (remaining - charged).min(limit);
            let least = said - since.max(0.0);
            let most = (said + elapsed * limit / 60.0).min(limit) - since.max(0.0);
            let configured_binds = bucket.configured.is_some_and(|c| c < limit);
            bucket.set_balance(if first {
                least.min(effective)
            } else if configured_binds {
                bucket.balance.min(most)
            } else {
                bucket.balance.clamp(least, most.max(least))
            });
        }
        drop(state);
        self.gained.notify_waiters();
    }

    /// A 429: counts it, and where its message says which limit was hit, how much the request
    /// asked and when to try again (OpenAI: "on tokens per min (TPM): Limit 30000, Used 29000,
    /// Requested 4400. Please try again in 1.2s."), that limit holds every request until then.
    pub(crate) fn rate_limited(&self, message: &str, wait: Option<Duration>) {
        self.rate_limited.fetch_add(1, Ordering::Relaxed);
        let Some(hit) = parse_limit_message(message) else {
            return;
        };
        let mut state = self.refilled();
        let bucket = &mut state.buckets[hit.dim as usize];
        if let Some(limit) = hit.limit {
            bucket.learned = Some(limit);
        }
        let (Some(rate), Some(wait)) = (bucket.per_second(), wait) else {
            return;
        };
        // In `wait` the provider has the request's share again: the balance is that far in
        // debt once the request's own share (still charged here) is given back by its
        // cancellation.
        bucket.set_balance(bucket.balance.min(-wait.as_secs_f64() * rate));
    }

    /// The totals so far.
    pub(crate) fn stats(&self) -> AdmissionStats {
        let held_us = self.held_us.each_ref().map(|a| a.load(Ordering::Relaxed));
        let binding = self.binding.lock().ok().and_then(|last| {
            // The limit that held longest; while the first holds are still waiting, the one
            // that held last.
            let longest = DIMS
                .into_iter()
                .filter(|d| last[*d as usize].is_some())
                .max_by_key(|d| held_us[*d as usize])?;
            last[longest as usize].as_ref().map(Binding::describe)
        });
        let state = self.lock();
        let limits = |which: fn(&Bucket) -> Option<f64>| -> Vec<(String, u64)> {
            DIMS.into_iter()
                .filter_map(|d| {
                    which(&state.buckets[d as usize]).map(|l| (d.key().to_owned(), l as u64))
                })
                .collect()
        };
        let provider_limits = limits(|b| b.learned);
        let configured_limits = limits(|b| b.configured);
        AdmissionStats {
            held: self.held.load(Ordering::Relaxed),
            held_max_s: self.held_max_us.load(Ordering::Relaxed) as f64 / 1e6,
            held_total_s: held_us.iter().sum::<u64>() as f64 / 1e6,
            binding,
            rate_limited: self.rate_limited.load(Ordering::Relaxed),
            tokens_reserved: self.reserved.load(Ordering::Relaxed),
            tokens_used: self.used.load(Ordering::Relaxed),
            provider_limits,
            configured_limits,
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

/// Each limit's (limit, remaining) from an answer's rate-limit headers.
fn read_headers(headers: &HeaderMap) -> [Option<(f64, f64)>; 4] {
    let number = |name: &str| -> Option<f64> {
        let value = headers.get(name)?.to_str().ok()?.trim();
        let n: f64 = value.parse().ok()?;
        (n.is_finite() && n >= 0.0).then_some(n)
    };
    let pair = |limit: &str, remaining: &str| -> Option<(f64, f64)> {
        let limit = number(limit).filter(|l| *l > 0.0)?;
        Some((limit, number(remaining)?.min(limit)))
    };
    let mut seen = [None; 4];
    seen[Dim::Requests as usize] = pair(
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
    )
    .or_else(|| {
        pair(
            "anthropic-ratelimit-requests-limit",
            "anthropic-ratelimit-requests-remaining",
        )
    });
    seen[Dim::Tokens as usize] = pair("x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens");
    seen[Dim::Input as usize] = pair(
        "anthropic-ratelimit-input-tokens-limit",
        "anthropic-ratelimit-input-tokens-remaining",
    );
    seen[Dim::Output as usize] = pair(
        "anthropic-ratelimit-output-tokens-limit",
        "anthropic-ratelimit-output-tokens-remaining",
    );
    seen
}

/// What a 429's message says of the limit it hit.
#[derive(Debug, PartialEq)]
struct Hit {
    dim: Dim,
    limit: Option<f64>,
}

fn parse_limit_message(message: &str) -> Option<Hit> {
    use std::sync::LazyLock;
    static NUMBER: LazyLock<regex::Regex> = LazyLock::new(|| {
        regex::Regex::new(r"(?i)\b(limit|rate limit of)\s*:?\s*([0-9][0-9,]*)")
            .unwrap_or_else(|e| panic!("static pattern must compile: {e}"))
    });
    let lower = message.to_ascii_lowercase();
    let dim = if lower.contains("output tokens per minute") || lower.contains("(otpm)") {
        Dim::Output
    } else if lower.contains("input tokens per minute") || lower.contains("(itpm)") {
        Dim::Input
    } else if lower.contains("tokens per min") || lower.contains("(tpm)") {
        Dim::Tokens
    } else if lower.contains("requests per min") || lower.contains("(rpm)") {
        Dim::Requests
    } else {
        return None;
    };
    let mut hit = Hit { dim, limit: None };
    for captures in NUMBER.captures_iter(message) {
        let value: Option<f64> = captures[2].replace(',', "").parse().ok();
        if matches!(
            captures[1].to_ascii_lowercase().as_str(),
            "limit" | "rate limit of"
        ) {
            hit.limit = hit.limit.or(value.filter(|v| *v > 0.0));
        }
    }
    Some(hit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn openai(tokens: f64) -> Cost {
        let mut cost = [1.0, 0.0, 0.0, 0.0];
        cost[Dim::Tokens as usize] = tokens;
        Cost(cost)
    }

    fn wait_of(ticket: &Ticket) -> Duration {
        ticket.wait.as_ref().map_or(Duration::ZERO, |(w, _)| *w)
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_known_holds_nothing() {
        let admission = Admission::new(ProviderKind::OpenAi, RateLimits::default());
        for _ in 0..1000 {
            assert!(admission.reserve(openai(1e9)).wait.is_none());
        }
        assert_eq!(admission.stats().held, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn configured_limits_hold_requests_in_arrival_order() {
        let admission = Admission::new(
            ProviderKind::OpenAi,
            RateLimits {
                tokens_per_minute: Some(600),
                ..RateLimits::default()
            },
        );
        // 600 tokens a minute is 10 a second: the bucket starts full.
        assert!(admission.reserve(openai(600.0)).wait.is_none());
        let second = admission.reserve(openai(100.0));
        assert_eq!(wait_of(&second), Duration::from_secs(10));
        let third = admission.reserve(openai(100.0));
        assert_eq!(wait_of(&third), Duration::from_secs(20));
        let binding = &third.wait.as_ref().unwrap().1;
        assert_eq!(binding.describe(), "the configured tokens per minute (600)");
        // A cancelled reservation is given back.
        admission.cancel(&third);
        let fourth = admission.reserve(openai(100.0));
        assert_eq!(wait_of(&fourth), Duration::from_secs(20));
    }

    #[tokio::test(start_paused = true)]
    async fn the_headers_teach_the_limits_and_the_balance() {
        let admission = Admission::new(ProviderKind::OpenAi, RateLimits::default());
        let first = admission.reserve(openai(1000.0));
        assert!(first.wait.is_none());
        // Another process on the key spent most of the minute: 1,000 of 60,000 left after
        // this request.
        admission.observe(
            &headers(&[
                ("x-ratelimit-limit-tokens", "60000"),
                ("x-ratelimit-remaining-tokens", "1000"),
                ("x-ratelimit-limit-requests", "5000"),
                ("x-ratelimit-remaining-requests", "4999"),
            ]),
            &first,
            true,
        );
        assert!(admission.reserve(openai(1000.0)).wait.is_none());
        // 1,000 tokens a second refill; this one is 2,000 short.
        let held = admission.reserve(openai(2000.0));
        assert_eq!(wait_of(&held), Duration::from_secs(2));
        let binding = &held.wait.as_ref().unwrap().1;
        assert_eq!(binding.describe(), "the provider's tokens per minute (60k)");
        let stats = admission.stats();
        assert_eq!(stats.held, 1);
        assert_eq!(
            stats.binding.as_deref(),
            Some("the provider's tokens per minute (60k)")
        );
        assert!(
            stats
                .provider_limits
                .contains(&("tokens_per_minute".to_owned(), 60_000))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_to_an_older_request_does_not_count_later_ones_twice() {
        let admission = Admission::new(ProviderKind::OpenAi, RateLimits::default());
        let learn = admission.reserve(openai(10.0));
        admission.observe(
            &headers(&[
                ("x-ratelimit-limit-tokens", "6000"),
                ("x-ratelimit-remaining-tokens", "5990"),
            ]),
            &learn,
            true,
        );
        let a = admission.reserve(openai(1000.0));
        let b = admission.reserve(openai(1000.0));
        // The provider admitted `a` when 4,990 were left; `b` came after.
        admission.observe(
            &headers(&[
                ("x-ratelimit-limit-tokens", "6000"),
                ("x-ratelimit-remaining-tokens", "4990"),
            ]),
            &a,
            true,
        );
        admission.observe(
            &headers(&[
                ("x-ratelimit-limit-tokens", "6000"),
                ("x-ratelimit-remaining-tokens", "3990"),
            ]),
            &b,
            true,
        );
        // 3,990 left: a request of 3,990 goes, one more token waits.
        assert!(admission.reserve(openai(3990.0)).wait.is_none());
        assert!(admission.reserve(openai(1.0)).wait.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_reserved_earlier_but_sent_later_is_not_counted_as_seen() {
        let admission = Admission::new(ProviderKind::OpenAi, RateLimits::default());
        let learn = admission.reserve(openai(10.0));
        admission.mark_sent(&learn);
        admission.observe(
            &headers(&[
                ("x-ratelimit-limit-tokens", "6000"),
                ("x-ratelimit-remaining-tokens", "5990"),
            ]),
            &learn,
            true,
        );
        // `late` is reserved first but goes after `early` (it waited for a slot): the
        // provider's word on `early` does not count it.
        let late = admission.reserve(openai(1000.0));
        let early = admission.reserve(openai(1000.0));
        admission.mark_sent(&early);
        admission.observe(
            &headers(&[
                ("x-ratelimit-limit-tokens", "6000"),
                ("x-ratelimit-remaining-tokens", "4990"),
            ]),
            &early,
            true,
        );
        admission.mark_sent(&late);
        // 3,990 left once `late` is counted.
        assert!(admission.reserve(openai(3990.0)).wait.is_none());
        assert!(admission.reserve(openai(1.0)).wait.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn anthropic_gives_unused_output_back_at_the_answer() {
        let admission = Admission::new(
            ProviderKind::Anthropic,
            RateLimits {
                output_tokens_per_minute: Some(10_000),
                ..RateLimits::default()
            },
        );
        let req = ChatRequest {
            model: "m".into(),
            messages: vec![super::super::Message::user("u".repeat(400))],
            ..ChatRequest::default()
        };
        let cost = admission.cost(&req, Some(8192));
        assert_eq!(cost.get(Dim::Output), 8192.0);
        assert_eq!(cost.get(Dim::Input), 101.0);
        let first = admission.reserve(cost);
        assert!(first.wait.is_none());
        // The second would overdraw the 10,000 output tokens held.
        let second = admission.reserve(cost);
        assert!(second.wait.is_some());
        admission.cancel(&second);
        // The answer wrote 50 tokens: 8,142 come back.
        admission.settle(
            &first,
            &Usage {
                input_tokens: 101,
                output_tokens: 50,
                ..Usage::default()
            },
        );
        assert!(admission.reserve(cost).wait.is_none());
        let stats = admission.stats();
        assert_eq!(stats.tokens_reserved, 8192 + 101);
        assert_eq!(stats.tokens_used, 151);
    }

    #[tokio::test(start_paused = true)]
    async fn anthropic_cache_reads_cost_no_input_budget() {
        let admission = Admission::new(ProviderKind::Anthropic, RateLimits::default());
        let req = ChatRequest {
            model: "m".into(),
            system: "s".repeat(4000),
            messages: vec![super::super::Message::user("u".repeat(40))],
            cache: super::super::CacheHint {
                prefix: true,
                ..Default::default()
            },
            ..ChatRequest::default()
        };
        assert_eq!(admission.cost(&req, Some(10)).get(Dim::Input), 1011.0);
        let ticket = admission.reserve(admission.cost(&req, Some(10)));
        admission.settle(
            &ticket,
            &Usage {
                input_tokens: 1011,
                output_tokens: 5,
                cache_read_tokens: 1000,
                ..Usage::default()
            },
        );
        assert_eq!(admission.cost(&req, Some(10)).get(Dim::Input), 11.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_above_the_whole_minute_is_refused_and_nothing_stays_owed() {
        let admission = Admission::new(ProviderKind::Anthropic, RateLimits::default());
        let req = ChatRequest {
            model: "m".into(),
            messages: vec![super::super::Message::user("u".repeat(80))],
            ..ChatRequest::default()
        };
        assert_eq!(admission.output_room(&req), None);
        // 8,192 output tokens asked of a key that allows 3,000 a minute: refused, nothing
        // taken, and no retry-after (no wait admits it).
        let big = admission.reserve(admission.cost(&req, Some(8192)));
        admission.mark_sent(&big);
        let limits = |remaining: &str| {
            headers(&[
                ("anthropic-ratelimit-output-tokens-limit", "3000"),
                ("anthropic-ratelimit-output-tokens-remaining", remaining),
                ("anthropic-ratelimit-input-tokens-limit", "200000"),
                ("anthropic-ratelimit-input-tokens-remaining", "200000"),
                ("anthropic-ratelimit-requests-limit", "4000"),
                ("anthropic-ratelimit-requests-remaining", "4000"),
            ])
        };
        admission.observe(&limits("3000"), &big, false);
        admission.rate_limited(
            "This request would exceed your organization's rate limit of 3,000 output tokens \
             per minute (org: x, model: m).",
            None,
        );
        admission.cancel(&big);
        assert_eq!(admission.output_room(&req), Some(3000));
        // The whole minute is still there: the request fitted to it goes at once.
        let fitted = admission.reserve(admission.cost(&req, Some(3000)));
        assert_eq!(wait_of(&fitted), Duration::ZERO);
        admission.mark_sent(&fitted);
        admission.observe(&limits("0"), &fitted, true);
        admission.settle(
            &fitted,
            &Usage {
                input_tokens: 20,
                output_tokens: 5,
                ..Usage::default()
            },
        );
        // 2,995 came back: small requests go at once.
        for _ in 0..10 {
            assert_eq!(
                wait_of(&admission.reserve(admission.cost(&req, Some(48)))),
                Duration::ZERO
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_an_answer_gives_back_let_a_held_request_go_early() {
        let admission = Admission::new(
            ProviderKind::Anthropic,
            RateLimits {
                output_tokens_per_minute: Some(600),
                ..RateLimits::default()
            },
        );
        let req = ChatRequest {
            model: "m".into(),
            messages: vec![super::super::Message::user("u".repeat(40))],
            ..ChatRequest::default()
        };
        let first = admission.reserve(admission.cost(&req, Some(600)));
        assert!(first.wait.is_none());
        let second = admission.reserve(admission.cost(&req, Some(300)));
        let third = admission.reserve(admission.cost(&req, Some(300)));
        assert_eq!(wait_of(&second), Duration::from_secs(30));
        assert_eq!(wait_of(&third), Duration::from_secs(60));
        // The first answer wrote 300 of its 600: the second may go now, the third in 30 s.
        admission.settle(
            &first,
            &Usage {
                input_tokens: 10,
                output_tokens: 300,
                ..Usage::default()
            },
        );
        assert_eq!(admission.left(&second), Duration::ZERO);
        let started = Instant::now();
        admission.ready(&second).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        let left = admission.left(&third);
        assert!(
            left > Duration::from_secs(29) && left <= Duration::from_secs(30),
            "{left:?}"
        );
        // The time the held requests waited is what the report says.
        admission.ready(&third).await;
        let stats = admission.stats();
        assert!((stats.held_total_s - 30.0).abs() < 0.1, "{stats:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_that_says_when_holds_until_then() {
        let admission = Admission::new(ProviderKind::OpenAi, RateLimits::default());
        let ticket = admission.reserve(openai(4400.0));
        admission.rate_limited(
            "Rate limit reached for gpt-4.1 in organization org-x on tokens per min (TPM): \
             Limit 30000, Used 29000, Requested 4400. Please try again in 1.2s. Visit ...",
            Some(Duration::from_millis(1200)),
        );
        admission.cancel(&ticket);
        let again = admission.reserve(openai(4400.0));
        let wait = wait_of(&again);
        assert!(
            wait >= Duration::from_millis(1190) && wait <= Duration::from_millis(1210),
            "{wait:?}"
        );
        assert_eq!(admission.stats().rate_limited, 1);
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

    #[test]
    fn limit_messages_of_both_providers_are_read() {
        assert_eq!(
            parse_limit_message(
                "Rate limit reached for gpt-4o on requests per min (RPM): Limit 500, Used 500, \
                 Requested 1. Please try again in 120ms."
            ),
            Some(Hit {
                dim: Dim::Requests,
                limit: Some(500.0),
            })
        );
        assert_eq!(
            parse_limit_message(
                "This request would exceed your organization's rate limit of 40,000 output \
                 tokens per minute (org: x, model: claude)."
            ),
            Some(Hit {
                dim: Dim::Output,
                limit: Some(40_000.0),
            })
        );
        assert_eq!(parse_limit_message("Too many requests"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn malformed_headers_are_ignored() {
        let admission = Admission::new(ProviderKind::OpenAi, RateLimits::default());
        let ticket = admission.reserve(openai(10.0));
        for bad in ["", "-5", "lots", "NaN", "inf", "1e400"] {
            admission.observe(
                &headers(&[
                    ("x-ratelimit-limit-tokens", bad),
                    ("x-ratelimit-remaining-tokens", "0"),
                ]),
                &ticket,
                true,
            );
        }
        assert!(admission.reserve(openai(1e9)).wait.is_none());
        assert!(admission.stats().provider_limits.is_empty());
    }

    #[test]
    fn a_shard_gets_its_share_of_a_configured_limit() {
        let limits = RateLimits {
            requests_per_minute: Some(500),
            tokens_per_minute: Some(200_000),
            input_tokens_per_minute: None,
            output_tokens_per_minute: Some(3),
        };
        let share = limits.shared_by(4);
        assert_eq!(share.requests_per_minute, Some(125));
        assert_eq!(share.tokens_per_minute, Some(50_000));
        assert_eq!(share.output_tokens_per_minute, Some(1));
        assert_eq!(limits.shared_by(1), limits);
    }
}
