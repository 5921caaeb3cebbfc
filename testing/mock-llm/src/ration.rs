//! Rate limits of one key, rationed the way OpenAI and Anthropic document it
//! ([`crate::MockConfig::ration`], `summon-mock-llm --ration-openai RPM,TPM` and
//! `--ration-anthropic RPM,ITPM,OTPM`). Off by default.
//!
//! Each limit is a bucket that holds one minute of budget, starts full (a burst at the start
//! of a run is allowed) and refills continuously at the limit / 60 a second, counted in
//! nanoseconds with integers (no rounding drift). The server has one key: its buckets are
//! shared by every connection. A request is admitted or refused when it arrives, before the
//! configured latency; a refusal is answered at once with HTTP 429, an admitted request after
//! the latency as usual.
//!
//! **OpenAI** (`POST /v1/chat/completions`): requests per minute and tokens per minute. A
//! request costs 1 request and `max(limit, estimate)` tokens, where `limit` is
//! `max_completion_tokens`, else `max_tokens`, else 0, and `estimate` is
//! [`openai_input_tokens`]: ceil(characters / 4), the characters being those of
//! - the text of every message: its `content` when a string, else the `text` of each of its
//!   parts; an assistant message's tool calls' `function.name` and `function.arguments`;
//! - the compact JSON text of the `tools` array and of `response_format` (as serde_json
//!   writes them: no spaces, the same escapes);
//!
//! counted as Unicode characters (of the decoded text values; role names and other fields do
//! not count). Nothing is given back when the answer uses less. Every answer to an
//! admission, 200 or 429, carries `x-ratelimit-limit-requests`, `x-ratelimit-limit-tokens`,
//! `x-ratelimit-remaining-requests`, `x-ratelimit-remaining-tokens`,
//! `x-ratelimit-reset-requests` and `x-ratelimit-reset-tokens` (remaining: whole units left
//! after this request's charge; reset: the time until the bucket is full again, in OpenAI's
//! format, [`openai_duration`]: `0s`, `120ms`, `1.5s`, `6m0s`, rounded up to the
//! millisecond). Over a limit: HTTP 429 without `Retry-After`, body
//! `{"error":{"message":"Rate limit reached for MODEL in organization org-mock on tokens per
//! min (TPM): Limit N, Used U, Requested R. Please try again in 1.234s. Visit
//! https://platform.openai.com/account/rate-limits to learn more.","type":"tokens",
//! "code":"rate_limit_exceeded","param":null}}` (`requests per min (RPM)` and type
//! `requests` for the request limit). The wait is exact, rounded up to the millisecond: the
//! request sent again after it is admitted (if nothing else was admitted meanwhile); the
//! limit named is the one whose wait is longest. Used is the limit less what remains. A
//! request costing more than a whole minute's tokens can never be admitted: 429 "Request too
//! large for MODEL in organization org-mock on tokens per min (TPM): Limit N, Requested R. The
//! input or output tokens must be reduced in order to run successfully. ...".
//!
//! **Anthropic** (`POST /v1/messages`): requests, input tokens and output tokens per minute.
//! A request costs 1 request; its input tokens are the uncached input plus cache writes
//! (cache reads are free): `usage.input_tokens + usage.cache_creation_input_tokens` of its
//! answer when the prompt cache is on, else its `input_tokens`; its output is held at
//! `max_tokens` at admission and settled to the answer's `usage.output_tokens` when the
//! answer is sent: the unused part comes back then (an output longer than `max_tokens` is
//! charged in full; an error answer, or a connection closed before the answer, gives all of
//! it back). Every answer to an admission carries
//! `anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}-{limit,remaining,reset}`;
//! reset is the RFC 3339 UTC time at which the bucket is full again ([`rfc3339`]:
//! `2026-12-07T18:30:12Z`, or with milliseconds, `2026-12-07T18:30:12.345Z`, rounded up).
//! The `tokens-*` headers repeat those of the input or the output bucket, whichever has fewer
//! tokens remaining (the input one on a tie). Over a limit: HTTP 429 with `retry-after` (the
//! exact wait in whole seconds, rounded up) and body `{"type":"error","error":{"type":
//! "rate_limit_error","message":"This request would exceed your organization's rate limit of
//! N output tokens per minute (org: org-mock, model: MODEL). ..."}}` (`requests`, `input
//! tokens` or `output tokens`, the limit whose wait is longest). A request that costs more
//! than a minute's budget of a limit gets that 429 without `retry-after`: no wait admits it.
//!
//! [`RationStats`] counts admissions, 429s and the tokens charged per dimension
//! ([`crate::MockServer::ration_stats`]; the binary prints them when it stops).

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::Api;

/// Nanoseconds in a minute: a bucket's level is kept in tokens × this, so a refill of
/// `limit` per nanosecond is exact.
const NANOS_PER_MINUTE: i128 = 60_000_000_000;

/// The per-minute limits of one key, for one provider's API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ration {
    /// OpenAI's accounting of `POST /v1/chat/completions`: requests and tokens per minute.
    OpenAi { rpm: u64, tpm: u64 },
    /// Anthropic's accounting of `POST /v1/messages`: requests, input tokens and output tokens
    /// per minute.
    Anthropic { rpm: u64, itpm: u64, otpm: u64 },
}

impl Ration {
    pub fn openai(rpm: u64, tpm: u64) -> Self {
        Self::OpenAi { rpm, tpm }
    }

    pub fn anthropic(rpm: u64, itpm: u64, otpm: u64) -> Self {
        Self::Anthropic { rpm, itpm, otpm }
    }

    /// The API whose requests this rations.
    pub fn api(&self) -> Api {
        match self {
            Self::OpenAi { .. } => Api::OpenAi,
            Self::Anthropic { .. } => Api::Anthropic,
        }
    }
}

/// What the rationing did, over both APIs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RationStats {
    /// Requests admitted (each charged 1 request).
    pub admitted: u64,
    /// Requests answered 429, in all.
    pub limited: u64,
    /// 429s by the limit named: requests per minute.
    pub limited_by_requests: u64,
    /// ... tokens per minute (OpenAI) or input tokens per minute (Anthropic).
    pub limited_by_tokens: u64,
    /// ... output tokens per minute (Anthropic).
    pub limited_by_output_tokens: u64,
    /// OpenAI: tokens charged at admission.
    pub tokens: u64,
    /// Anthropic: input tokens charged.
    pub input_tokens: u64,
    /// Anthropic: output tokens charged: the real output of the answers sent, plus
    /// `max_tokens` of those not sent yet.
    pub output_tokens: u64,
    /// Anthropic: `max_tokens` held at admission, in all (before answers gave back what they
    /// did not use).
    pub output_held: u64,
}

/// One limit: a minute of budget refilling continuously.
#[derive(Debug, Clone)]
struct Bucket {
    limit: u64,
    /// Tokens available × [`NANOS_PER_MINUTE`]; below zero after an answer longer than the
    /// output held for it.
    level: i128,
    /// When `level` was last brought up to date.
    at: Instant,
}

impl Bucket {
    fn new(limit: u64, now: Instant) -> Self {
        Self {
            limit,
            level: i128::from(limit) * NANOS_PER_MINUTE,
            at: now,
        }
    }

    fn capacity(&self) -> i128 {
        i128::from(self.limit) * NANOS_PER_MINUTE
    }

    /// Adds what `now - at` refilled.
    fn refill(&mut self, now: Instant) {
        if now <= self.at {
            return;
        }
        let elapsed = i128::try_from(now.duration_since(self.at).as_nanos()).unwrap_or(i128::MAX);
        self.level = self
            .level
            .saturating_add(elapsed.saturating_mul(i128::from(self.limit)))
            .min(self.capacity());
        self.at = now;
    }

    /// How long until `cost` fits: zero when it does now, `None` when it never does (more than
    /// a minute's budget).
    fn wait_for(&self, cost: u64) -> Option<Duration> {
        if cost > self.limit {
            return None;
        }
        let missing = i128::from(cost) * NANOS_PER_MINUTE - self.level;
        if missing <= 0 {
            return Some(Duration::ZERO);
        }
        let limit = i128::from(self.limit);
        Some(nanos((missing + limit - 1) / limit))
    }

    /// Adds `tokens` (negative: takes them), never above a minute's budget.
    fn add(&mut self, tokens: i128) {
        self.level = (self.level + tokens * NANOS_PER_MINUTE).min(self.capacity());
    }

    /// Whole units left.
    fn remaining(&self) -> u64 {
        u64::try_from(self.level.max(0) / NANOS_PER_MINUTE).unwrap_or(u64::MAX)
    }

    /// How long until the bucket is full again.
    fn until_full(&self) -> Duration {
        if self.limit == 0 {
            return Duration::ZERO;
        }
        let limit = i128::from(self.limit);
        nanos((self.capacity() - self.level + limit - 1) / limit)
    }
}

fn nanos(n: i128) -> Duration {
    let n = u128::try_from(n.max(0)).unwrap_or(0);
    Duration::new(
        u64::try_from(n / 1_000_000_000).unwrap_or(u64::MAX),
        (n % 1_000_000_000) as u32,
    )
}

/// The buckets of one API, with which dimension is which.
#[derive(Debug)]
struct Account {
    requests: Bucket,
    /// OpenAI: tokens; Anthropic: input tokens.
    tokens: Bucket,
    /// Anthropic only.
    output: Option<Bucket>,
}

/// The limits of the key (the server's one), shared by every connection.
#[derive(Debug)]
pub struct Ledger {
    state: Mutex<LedgerState>,
}

#[derive(Debug)]
struct LedgerState {
    openai: Option<Account>,
    anthropic: Option<Account>,
    stats: RationStats,
}

/// What admission decided, with the headers every answer to it carries.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Verdict {
    /// Rate-limit headers, lower-case names (and `retry-after` on an Anthropic 429).
    pub(crate) headers: Vec<(&'static str, String)>,
    /// `None`: admitted.
    pub(crate) refusal: Option<Refusal>,
}

/// A 429.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refusal {
    pub(crate) message: String,
    pub(crate) body: Value,
    /// How long until the request would be admitted; `None`: never (more than a minute's
    /// budget).
    pub(crate) wait: Option<Duration>,
}

/// Output tokens held for an admitted Anthropic request, settled when its answer is sent;
/// given back whole if it never is.
#[derive(Debug)]
pub(crate) struct Hold<'a> {
    ledger: &'a Ledger,
    held: u64,
    settled: bool,
}

impl Hold<'_> {
    /// The answer used `output` tokens: the rest of the hold comes back.
    pub(crate) fn settle(mut self, output: u64, now: Instant) {
        self.settled = true;
        self.ledger.settle(self.held, output, now);
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.ledger.settle(self.held, 0, Instant::now());
        }
    }
}

/// Which limit a 429 names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dimension {
    Requests,
    Tokens,
    Output,
}

impl Ledger {
    /// The full buckets of `rations` (a later ration of the same API replaces an earlier one).
    pub fn new(rations: &[Ration]) -> Self {
        Self::starting_at(rations, Instant::now())
    }

    pub(crate) fn starting_at(rations: &[Ration], now: Instant) -> Self {
        let mut state = LedgerState {
            openai: None,
            anthropic: None,
            stats: RationStats::default(),
        };
        for ration in rations {
            match *ration {
                Ration::OpenAi { rpm, tpm } => {
                    state.openai = Some(Account {
                        requests: Bucket::new(rpm, now),
                        tokens: Bucket::new(tpm, now),
                        output: None,
                    });
                }
                Ration::Anthropic { rpm, itpm, otpm } => {
                    state.anthropic = Some(Account {
                        requests: Bucket::new(rpm, now),
                        tokens: Bucket::new(itpm, now),
                        output: Some(Bucket::new(otpm, now)),
                    });
                }
            }
        }
        Self {
            state: Mutex::new(state),
        }
    }

    /// Whether requests to `api` are rationed.
    pub fn rations(&self, api: Api) -> bool {
        let state = crate::lock(&self.state);
        match api {
            Api::OpenAi => state.openai.is_some(),
            Api::Anthropic => state.anthropic.is_some(),
            _ => false,
        }
    }

    pub fn stats(&self) -> RationStats {
        crate::lock(&self.state).stats
    }

    /// Admits an OpenAI request costing `tokens` (see [`openai_cost`]) at `now`, or refuses
    /// it. `None` when OpenAI requests are not rationed.
    pub(crate) fn admit_openai(&self, now: Instant, model: &str, tokens: u64) -> Option<Verdict> {
        let mut guard = crate::lock(&self.state);
        let state = &mut *guard;
        let account = state.openai.as_mut()?;
        account.requests.refill(now);
        account.tokens.refill(now);
        let waits = [
            (Dimension::Requests, account.requests.wait_for(1)),
            (Dimension::Tokens, account.tokens.wait_for(tokens)),
        ];
        let refusal = binding(&waits).map(|(dimension, wait)| {
            let bucket = match dimension {
                Dimension::Requests => &account.requests,
                _ => &account.tokens,
            };
            let cost = if dimension == Dimension::Requests {
                1
            } else {
                tokens
            };
            count_refusal(&mut state.stats, dimension);
            openai_refusal(model, dimension, bucket, cost, wait)
        });
        if refusal.is_none() {
            account.requests.add(-1);
            account.tokens.add(-i128::from(tokens));
            state.stats.admitted += 1;
            state.stats.tokens += tokens;
        }
        let mut headers = Vec::with_capacity(6);
        for (names, bucket) in [
            (
                [
                    "x-ratelimit-limit-requests",
                    "x-ratelimit-remaining-requests",
                    "x-ratelimit-reset-requests",
                ],
                &account.requests,
            ),
            (
                [
                    "x-ratelimit-limit-tokens",
                    "x-ratelimit-remaining-tokens",
                    "x-ratelimit-reset-tokens",
                ],
                &account.tokens,
            ),
        ] {
            let [limit, remaining, reset] = names;
            headers.push((limit, bucket.limit.to_string()));
            headers.push((remaining, bucket.remaining().to_string()));
            headers.push((reset, openai_duration(bucket.until_full())));
        }
        Some(Verdict { headers, refusal })
    }

    /// Admits an Anthropic request of `input` tokens (uncached input and cache writes) asking
    /// for `max_tokens`, at `now` (`wall`: the same moment by the system clock, for the reset
    /// times), or refuses it. `None` when Anthropic requests are not rationed.
    pub(crate) fn admit_anthropic(
        &self,
        now: Instant,
        wall: SystemTime,
        model: &str,
        input: u64,
        max_tokens: u64,
    ) -> Option<(Verdict, Option<Hold<'_>>)> {
        let mut guard = crate::lock(&self.state);
        let state = &mut *guard;
        let account = state.anthropic.as_mut()?;
        let output = account.output.as_mut()?;
        account.requests.refill(now);
        account.tokens.refill(now);
        output.refill(now);
        let waits = [
            (Dimension::Requests, account.requests.wait_for(1)),
            (Dimension::Tokens, account.tokens.wait_for(input)),
            (Dimension::Output, output.wait_for(max_tokens)),
        ];
        let refusal = binding(&waits).map(|(dimension, wait)| {
            let (limit, what) = match dimension {
                Dimension::Requests => (account.requests.limit, "requests"),
                Dimension::Tokens => (account.tokens.limit, "input tokens"),
                Dimension::Output => (output.limit, "output tokens"),
            };
            count_refusal(&mut state.stats, dimension);
            anthropic_refusal(model, limit, what, wait)
        });
        let hold = if refusal.is_none() {
            account.requests.add(-1);
            account.tokens.add(-i128::from(input));
            output.add(-i128::from(max_tokens));
            let stats = &mut state.stats;
            stats.admitted += 1;
            stats.input_tokens += input;
            stats.output_tokens += max_tokens;
            stats.output_held += max_tokens;
            Some(max_tokens)
        } else {
            None
        };
        let tokens = if output.remaining() < account.tokens.remaining() {
            &*output
        } else {
            &account.tokens
        };
        let mut headers = Vec::with_capacity(13);
        for (names, bucket) in [
            (
                [
                    "anthropic-ratelimit-requests-limit",
                    "anthropic-ratelimit-requests-remaining",
                    "anthropic-ratelimit-requests-reset",
                ],
                &account.requests,
            ),
            (
                [
                    "anthropic-ratelimit-input-tokens-limit",
                    "anthropic-ratelimit-input-tokens-remaining",
                    "anthropic-ratelimit-input-tokens-reset",
                ],
                &account.tokens,
            ),
            (
                [
                    "anthropic-ratelimit-output-tokens-limit",
                    "anthropic-ratelimit-output-tokens-remaining",
                    "anthropic-ratelimit-output-tokens-reset",
                ],
                &*output,
            ),
            (
                [
                    "anthropic-ratelimit-tokens-limit",
                    "anthropic-ratelimit-tokens-remaining",
                    "anthropic-ratelimit-tokens-reset",
                ],
                tokens,
            ),
        ] {
            let [limit, remaining, reset] = names;
            headers.push((limit, bucket.limit.to_string()));
            headers.push((remaining, bucket.remaining().to_string()));
            headers.push((reset, rfc3339(wall + bucket.until_full())));
        }
        if let Some(Refusal {
            wait: Some(wait), ..
        }) = &refusal
        {
            let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            headers.push(("retry-after", seconds.to_string()));
        }
        drop(guard);
        let hold = hold.map(|held| Hold {
            ledger: self,
            held,
            settled: false,
        });
        Some((Verdict { headers, refusal }, hold))
    }

    /// An Anthropic answer that held `held` output tokens used `output`.
    fn settle(&self, held: u64, output: u64, now: Instant) {
        let mut guard = crate::lock(&self.state);
        let state = &mut *guard;
        if let Some(bucket) = state.anthropic.as_mut().and_then(|a| a.output.as_mut()) {
            bucket.refill(now);
            bucket.add(i128::from(held) - i128::from(output));
        }
        state.stats.output_tokens = (state.stats.output_tokens + output).saturating_sub(held);
    }
}

/// The limit that refuses the request and how long until it would be admitted: the longest
/// wait (`Duration::MAX` for a cost no wait admits); `None` when every limit admits it.
fn binding(waits: &[(Dimension, Option<Duration>)]) -> Option<(Dimension, Option<Duration>)> {
    waits
        .iter()
        .filter(|(_, wait)| *wait != Some(Duration::ZERO))
        .max_by_key(|(_, wait)| wait.unwrap_or(Duration::MAX))
        .copied()
}

fn count_refusal(stats: &mut RationStats, dimension: Dimension) {
    stats.limited += 1;
    match dimension {
        Dimension::Requests => stats.limited_by_requests += 1,
        Dimension::Tokens => stats.limited_by_tokens += 1,
        Dimension::Output => stats.limited_by_output_tokens += 1,
    }
}

fn openai_refusal(
    model: &str,
    dimension: Dimension,
    bucket: &Bucket,
    cost: u64,
    wait: Option<Duration>,
) -> Refusal {
    let (what, kind) = match dimension {
        Dimension::Requests => ("requests per min (RPM)", "requests"),
        _ => ("tokens per min (TPM)", "tokens"),
    };
    let limit = bucket.limit;
    let message = match wait {
        Some(wait) => format!(
            "Rate limit reached for {model} in organization org-mock on {what}: Limit {limit}, Used {}, Requested {cost}. Please try again in {}. Visit https://platform.openai.com/account/rate-limits to learn more.",
            limit.saturating_sub(bucket.remaining()),
            openai_duration(wait)
        ),
        None => format!(
            "Request too large for {model} in organization org-mock on {what}: Limit {limit}, Requested {cost}. The input or output tokens must be reduced in order to run successfully. Visit https://platform.openai.com/account/rate-limits to learn more."
        ),
    };
    let body = json!({"error": {
        "message": message,
        "type": kind,
        "code": "rate_limit_exceeded",
        "param": null,
    }});
    Refusal {
        message,
        body,
        wait,
    }
}

fn anthropic_refusal(model: &str, limit: u64, what: &str, wait: Option<Duration>) -> Refusal {
    let message = format!(
        "This request would exceed your organization's rate limit of {limit} {what} per minute (org: org-mock, model: {model}). For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the response headers for current usage. Please reduce the prompt length or the maximum tokens requested, or try again later."
    );
    let body = json!({"type": "error", "error": {"type": "rate_limit_error", "message": message}});
    Refusal {
        message,
        body,
        wait,
    }
}

/// An OpenAI request's cost in tokens: `max(max_completion_tokens or max_tokens (absent: 0),
/// [`openai_input_tokens`])`.
pub fn openai_cost(body: &Value) -> u64 {
    let limit = body
        .get("max_completion_tokens")
        .and_then(Value::as_u64)
        .or_else(|| body.get("max_tokens").and_then(Value::as_u64))
        .unwrap_or(0);
    limit.max(openai_input_tokens(body))
}

/// OpenAI's input estimate of a chat request: ceil(characters / 4); see the module doc for
/// which characters.
pub fn openai_input_tokens(body: &Value) -> u64 {
    fn chars(text: &str) -> usize {
        text.chars().count()
    }
    let mut count = 0usize;
    for message in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match message.get("content") {
            Some(Value::String(text)) => count += chars(text),
            Some(Value::Array(parts)) => {
                for part in parts {
                    if let Some(text) = part.get("text").and_then(Value::as_str) {
                        count += chars(text);
                    }
                }
            }
            _ => {}
        }
        for call in message
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            for field in ["/function/name", "/function/arguments"] {
                if let Some(text) = call.pointer(field).and_then(Value::as_str) {
                    count += chars(text);
                }
            }
        }
    }
    for field in ["tools", "response_format"] {
        if let Some(value) = body.get(field) {
            count += chars(&value.to_string());
        }
    }
    count.div_ceil(4) as u64
}

/// A duration as OpenAI's headers and messages write it (Go's format, to the millisecond,
/// rounded up): `0s`, `120ms`, `1s`, `1.5s`, `59.016s`, `6m0s`, `1h2m3.4s`.
pub fn openai_duration(duration: Duration) -> String {
    let ms = duration.as_nanos().div_ceil(1_000_000);
    if ms == 0 {
        return "0s".to_owned();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (hours, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (minutes, rest) = (rest / 60_000, rest % 60_000);
    let (seconds, millis) = (rest / 1000, rest % 1000);
    let mut secs = seconds.to_string();
    if millis > 0 {
        let fraction = format!("{millis:03}");
        secs.push('.');
        secs.push_str(fraction.trim_end_matches('0'));
    }
    if hours > 0 {
        format!("{hours}h{minutes}m{secs}s")
    } else if minutes > 0 {
        format!("{minutes}m{secs}s")
    } else {
        format!("{secs}s")
    }
}

/// A UTC time in RFC 3339, to the millisecond (rounded up), the fraction left out when zero:
/// `2026-12-07T18:30:12Z`, `2026-12-07T18:30:12.345Z`.
pub fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let ms = since.as_nanos().div_ceil(1_000_000);
    let (secs, millis) = ((ms / 1000) as i64, (ms % 1000) as u32);
    let (days, of_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    let (h, m, s) = (of_day / 3600, of_day % 3600 / 60, of_day % 60);
    if millis == 0 {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
    } else {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{millis:03}Z")
    }
}

/// Year, month and day of a count of days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}
