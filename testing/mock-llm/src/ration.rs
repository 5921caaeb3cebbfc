//! Rate limits of one key, rationed the way OpenAI and Anthropic document it
//! ([`crate::MockConfig::ration`], `summon-mock-llm --ration-openai RPM,TPM` and
//! `--ration-anthropic RPM,ITPM,OTPM`). Off by default.
//!
//! Each limit is a bucket that holds one minute of budget, starts full (a burst at the start
//! of a run is allowed) and refills continuously at the limit / 60 a second, counted in
//! nanoseconds with integers (no rounding drift). The server has one key: its buckets are
//! shared by every connection. A request is admitted or refused when it arrives, before the
//! configured latency; a refusal is answered at once with HTTP 429 and charges nothing, an
//! admitted request is answered after the latency as usual. Requests the server refuses
//! before (strict mode's 400s, a wrong key's 401) are not rationed and carry no rate-limit
//! headers; the batch endpoints are not rationed.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(verdict: &'a Verdict, name: &str) -> &'a str {
        verdict
            .headers
            .iter()
            .find(|(n, _)| *n == name)
            .map_or_else(
                || panic!("no header {name}: {verdict:?}"),
                |(_, v)| v.as_str(),
            )
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn an_openai_request_costs_its_output_limit_or_its_input_estimate_whichever_is_larger() {
        let mut body = json!({"model": "m", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [
                {"type": "text", "text": "héllo"},
                {"type": "image_url", "image_url": {"url": "http://x/a.png"}},
            ]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{\"p\":1}"}},
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ],
        "tools": [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}],
        "response_format": {"type": "json_object"}});
        // Characters: "Be brief." 9, "héllo" 5 (characters, not bytes), "read" 4, "{\"p\":1}" 7,
        // "42" 2, the tools' compact JSON 79, the response format's 22: 128; 128 / 4.
        let tools = body["tools"].to_string().chars().count();
        let format = body["response_format"].to_string().chars().count();
        assert_eq!((tools, format), (79, 22));
        assert_eq!(openai_input_tokens(&body), 32);
        assert_eq!(
            openai_cost(&body),
            32,
            "no output limit: the input estimate"
        );
        body["max_tokens"] = json!(4096);
        assert_eq!(openai_cost(&body), 4096);
        body["max_completion_tokens"] = json!(64);
        assert_eq!(openai_cost(&body), 64, "max_completion_tokens comes first");
        body["max_completion_tokens"] = json!(8);
        assert_eq!(openai_cost(&body), 32, "an input larger than the limit");
        assert_eq!(openai_input_tokens(&json!({"messages": []})), 0);
    }

    #[test]
    fn openai_charges_at_admission_refills_continuously_and_says_the_exact_wait() {
        let t0 = Instant::now();
        let ledger = Ledger::starting_at(&[Ration::openai(3, 100)], t0);
        assert!(ledger.rations(Api::OpenAi) && !ledger.rations(Api::Anthropic));
        assert!(ledger.admit_anthropic(t0, UNIX_EPOCH, "m", 1, 1).is_none());
        let first = ledger.admit_openai(t0, "gpt-x", 30).unwrap();
        assert_eq!(first.refusal, None);
        assert_eq!(
            first.headers,
            [
                ("x-ratelimit-limit-requests", "3".to_owned()),
                ("x-ratelimit-remaining-requests", "2".to_owned()),
                // One request back in 20 s (3 a minute).
                ("x-ratelimit-reset-requests", "20s".to_owned()),
                ("x-ratelimit-limit-tokens", "100".to_owned()),
                ("x-ratelimit-remaining-tokens", "70".to_owned()),
                // 30 tokens at 100 a minute.
                ("x-ratelimit-reset-tokens", "18s".to_owned()),
            ]
        );
        // 80 tokens: 10 missing, back in 6 s.
        let refused = ledger.admit_openai(t0, "gpt-x", 80).unwrap();
        let refusal = refused.refusal.clone().unwrap();
        assert_eq!(refusal.wait, Some(secs(6)));
        assert_eq!(
            refusal.body,
            json!({"error": {
                "message": "Rate limit reached for gpt-x in organization org-mock on tokens per min (TPM): Limit 100, Used 30, Requested 80. Please try again in 6s. Visit https://platform.openai.com/account/rate-limits to learn more.",
                "type": "tokens", "code": "rate_limit_exceeded", "param": null,
            }})
        );
        // A 429 charges nothing and says the same remaining budget.
        assert_eq!(header(&refused, "x-ratelimit-remaining-tokens"), "70");
        assert_eq!(header(&refused, "x-ratelimit-remaining-requests"), "2");
        assert_eq!(header(&refused, "x-ratelimit-reset-tokens"), "18s");
        // A nanosecond before the wait is over it is still refused, with 1 ms to go (rounded
        // up); at the wait it is admitted.
        let early = ledger
            .admit_openai(t0 + secs(6) - Duration::from_nanos(1), "gpt-x", 80)
            .unwrap();
        let message = early.refusal.map(|r| r.message).unwrap_or_default();
        assert!(message.contains("try again in 1ms."), "{message}");
        let admitted = ledger.admit_openai(t0 + secs(6), "gpt-x", 80).unwrap();
        assert_eq!(admitted.refusal, None);
        assert_eq!(header(&admitted, "x-ratelimit-remaining-tokens"), "0");
        assert_eq!(header(&admitted, "x-ratelimit-reset-tokens"), "1m0s");
        // The requests run out: with 0.3 of a request refilled at 6 s, 1.3 were left for the
        // second admission, and after a third the next waits for the missing 0.7 (14 s).
        let third = ledger.admit_openai(t0 + secs(6), "gpt-x", 0).unwrap();
        assert_eq!(third.refusal, None);
        assert_eq!(header(&third, "x-ratelimit-remaining-requests"), "0");
        let refused = ledger.admit_openai(t0 + secs(6), "gpt-x", 0).unwrap();
        let refusal = refused.refusal.unwrap();
        assert_eq!(refusal.wait, Some(secs(14)));
        assert_eq!(refusal.body["error"]["type"], "requests");
        assert!(
            refusal.message.contains(
                "on requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 14s."
            ),
            "{}",
            refusal.message
        );
        // More than a minute of tokens can never be admitted.
        let too_large = ledger.admit_openai(t0 + secs(600), "gpt-x", 101).unwrap();
        let refusal = too_large.refusal.unwrap();
        assert_eq!(refusal.wait, None);
        assert!(
            refusal.message.starts_with("Request too large for gpt-x in organization org-mock on tokens per min (TPM): Limit 100, Requested 101."),
            "{}",
            refusal.message
        );
        // Ten minutes on, the buckets are full again, not fuller.
        let later = ledger.admit_openai(t0 + secs(600), "gpt-x", 100).unwrap();
        assert_eq!(later.refusal, None);
        assert_eq!(header(&later, "x-ratelimit-remaining-requests"), "2");
        let stats = ledger.stats();
        assert_eq!((stats.admitted, stats.tokens, stats.limited), (4, 210, 4));
        assert_eq!((stats.limited_by_requests, stats.limited_by_tokens), (1, 3));
    }

    #[test]
    fn the_limit_named_is_the_one_with_the_longest_wait() {
        let t0 = Instant::now();
        let ledger = Ledger::starting_at(&[Ration::openai(1, 600)], t0);
        assert_eq!(ledger.admit_openai(t0, "m", 590).unwrap().refusal, None);
        // Both are short: the request comes back in 60 s, the 20 tokens in 1 s.
        let refusal = ledger.admit_openai(t0, "m", 30).unwrap().refusal.unwrap();
        assert_eq!(refusal.body["error"]["type"], "requests");
        assert_eq!(refusal.wait, Some(secs(60)));
    }

    #[test]
    fn anthropic_holds_max_tokens_until_the_answer_ends_and_gives_back_the_unused_part() {
        let t0 = Instant::now();
        let wall = UNIX_EPOCH + secs(1_796_668_200); // 2026-12-07T18:30:00Z
        let ledger = Ledger::starting_at(&[Ration::anthropic(2, 1000, 500)], t0);
        let (first, hold) = ledger
            .admit_anthropic(t0, wall, "claude-x", 100, 300)
            .unwrap();
        assert_eq!(first.refusal, None);
        let expected = [
            ("anthropic-ratelimit-requests-limit", "2"),
            ("anthropic-ratelimit-requests-remaining", "1"),
            ("anthropic-ratelimit-requests-reset", "2026-12-07T18:30:30Z"),
            ("anthropic-ratelimit-input-tokens-limit", "1000"),
            ("anthropic-ratelimit-input-tokens-remaining", "900"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2026-12-07T18:30:06Z",
            ),
            ("anthropic-ratelimit-output-tokens-limit", "500"),
            ("anthropic-ratelimit-output-tokens-remaining", "200"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2026-12-07T18:30:36Z",
            ),
            // The output bucket has fewer tokens left.
            ("anthropic-ratelimit-tokens-limit", "500"),
            ("anthropic-ratelimit-tokens-remaining", "200"),
            ("anthropic-ratelimit-tokens-reset", "2026-12-07T18:30:36Z"),
        ];
        let got: Vec<(&str, &str)> = first
            .headers
            .iter()
            .map(|(n, v)| (*n, v.as_str()))
            .collect();
        assert_eq!(got, expected);
        // Another 300 would overdraw the output tokens by 100: 12 s at 500 a minute.
        let (refused, none) = ledger
            .admit_anthropic(t0, wall, "claude-x", 100, 300)
            .unwrap();
        assert!(none.is_none());
        assert_eq!(header(&refused, "retry-after"), "12");
        assert_eq!(
            refused.refusal.unwrap().body,
            json!({"type": "error", "error": {"type": "rate_limit_error",
                "message": "This request would exceed your organization's rate limit of 500 output tokens per minute (org: org-mock, model: claude-x). For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the response headers for current usage. Please reduce the prompt length or the maximum tokens requested, or try again later."}})
        );
        assert_eq!(ledger.stats().output_tokens, 300);
        // The answer used 50: 250 come back at its end.
        hold.unwrap().settle(50, t0);
        assert_eq!(ledger.stats().output_tokens, 50);
        let (second, hold) = ledger
            .admit_anthropic(t0, wall, "claude-x", 100, 300)
            .unwrap();
        assert_eq!(second.refusal, None);
        assert_eq!(
            header(&second, "anthropic-ratelimit-output-tokens-remaining"),
            "150"
        );
        // 800 input tokens left, 150 output: the tokens headers are the output's.
        assert_eq!(
            header(&second, "anthropic-ratelimit-tokens-remaining"),
            "150"
        );
        // An answer that never ends (its connection closed) gives back all it held.
        drop(hold);
        let stats = ledger.stats();
        assert_eq!(
            (
                stats.admitted,
                stats.input_tokens,
                stats.output_tokens,
                stats.output_held
            ),
            (2, 200, 50, 600)
        );
        assert_eq!((stats.limited, stats.limited_by_output_tokens), (1, 1));
        // The requests are spent: one comes back in 30 s; retry-after rounds 29.5 s up.
        let (third, _) = ledger
            .admit_anthropic(t0 + Duration::from_millis(500), wall, "claude-x", 1, 1)
            .unwrap();
        assert_eq!(header(&third, "retry-after"), "30");
        assert!(
            third
                .refusal
                .unwrap()
                .message
                .contains("rate limit of 2 requests per minute")
        );
        // An answer longer than its hold is charged in full.
        let (_, hold) = ledger
            .admit_anthropic(t0 + secs(60), wall, "claude-x", 1, 10)
            .unwrap();
        hold.unwrap().settle(40, t0 + secs(60));
        assert_eq!(ledger.stats().output_tokens, 90);
        // More than a minute of input: no retry-after, no wait admits it.
        let (huge, _) = ledger
            .admit_anthropic(t0 + secs(600), wall, "claude-x", 1001, 1)
            .unwrap();
        assert!(huge.headers.iter().all(|(n, _)| *n != "retry-after"));
        assert!(
            huge.refusal
                .unwrap()
                .message
                .contains("of 1000 input tokens per minute")
        );
    }

    #[test]
    fn openai_durations_are_written_as_openai_writes_them() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ms"),
            (Duration::from_millis(120), "120ms"),
            (Duration::from_millis(999), "999ms"),
            (secs(1), "1s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_micros(1_233_001), "1.234s"),
            (Duration::from_millis(59_016), "59.016s"),
            (secs(360), "6m0s"),
            (Duration::from_millis(3_723_400), "1h2m3.4s"),
        ];
        for (duration, written) in cases {
            assert_eq!(openai_duration(duration), written, "{duration:?}");
        }
    }

    #[test]
    fn reset_times_are_rfc3339_in_utc() {
        let cases = [
            (Duration::ZERO, "1970-01-01T00:00:00Z"),
            (secs(1_796_668_212), "2026-12-07T18:30:12Z"),
            (secs(1_709_251_199), "2024-02-29T23:59:59Z"),
            (secs(951_868_800), "2000-03-01T00:00:00Z"),
            (
                Duration::from_millis(1_796_668_212_345),
                "2026-12-07T18:30:12.345Z",
            ),
            (
                secs(1_796_668_212) + Duration::from_nanos(1),
                "2026-12-07T18:30:12.001Z",
            ),
        ];
        for (since, written) in cases {
            assert_eq!(rfc3339(UNIX_EPOCH + since), written, "{since:?}");
        }
    }

    /// POSTs `body` on a connection of its own: the status, the headers (names in lower
    /// case) and the JSON body.
    async fn post(
        addr: std::net::SocketAddr,
        path: &str,
        body: &Value,
    ) -> (u16, Vec<(String, String)>, Value) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let body = body.to_string();
        let request = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        let answer = String::from_utf8(answer).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        let mut lines = head.lines();
        let status = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers = lines
            .filter_map(|l| l.split_once(": "))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.to_owned()))
            .collect();
        (status, headers, serde_json::from_str(body).unwrap())
    }

    fn find<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    #[tokio::test]
    async fn the_server_answers_a_request_over_the_limit_429_at_once_and_records_why() {
        let config = crate::MockConfig::new()
            .ration(Ration::openai(1, 1000))
            .latency(Duration::from_millis(20));
        let server = crate::MockServer::start(config).await;
        let body = json!({"model": "gpt-x", "max_tokens": 40,
            "messages": [{"role": "user", "content": "hi"}]});
        let path = "/v1/chat/completions";
        let (status, headers, answer) = post(server.addr(), path, &body).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["choices"][0]["message"]["content"], "echo: hi");
        assert_eq!(find(&headers, "x-ratelimit-remaining-requests"), Some("0"));
        assert_eq!(find(&headers, "x-ratelimit-remaining-tokens"), Some("960"));
        assert_eq!(find(&headers, "x-ratelimit-limit-tokens"), Some("1000"));
        let (status, headers, answer) = post(server.addr(), path, &body).await;
        assert_eq!(status, 429);
        assert_eq!(answer["error"]["code"], "rate_limit_exceeded");
        assert_eq!(answer["error"]["type"], "requests");
        assert_eq!(
            find(&headers, "retry-after"),
            None,
            "OpenAI sends no Retry-After"
        );
        assert_eq!(find(&headers, "x-ratelimit-remaining-tokens"), Some("960"));
        assert_eq!(server.request_count(), 2);
        let stats = server.ration_stats();
        assert_eq!((stats.admitted, stats.limited, stats.tokens), (1, 1, 40));
        let recorded = server.requests();
        assert_eq!(recorded[0].refused, None);
        let refused = recorded[1].refused.as_deref().unwrap_or_default();
        assert!(
            refused.starts_with("rate limited (429): Rate limit reached for gpt-x"),
            "{refused}"
        );
        // The other API is not rationed.
        let anthropic = json!({"model": "claude-x", "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}]});
        let (status, headers, _) = post(server.addr(), "/v1/messages", &anthropic).await;
        assert_eq!(status, 200);
        assert!(
            headers.iter().all(|(n, _)| !n.contains("ratelimit")),
            "{headers:?}"
        );
    }

    #[tokio::test]
    async fn anthropic_input_is_charged_without_cache_reads_and_output_as_the_answers_used() {
        let server = crate::MockServer::start(
            crate::MockConfig::new().ration(Ration::anthropic(100, 100_000, 10_000)),
        )
        .await;
        // A system prompt above the 1,024-token minimum, marked for caching.
        let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 500,
            "system": [{"type": "text", "text": "policy ".repeat(700),
                        "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "label this ticket"}]});
        let mut charged = 0;
        let mut output = 0;
        let mut reads = Vec::new();
        for _ in 0..2 {
            let (status, headers, answer) = post(server.addr(), "/v1/messages", &body).await;
            assert_eq!(status, 200, "{answer}");
            let usage = &answer["usage"];
            let n = |k: &str| usage[k].as_u64().unwrap();
            charged += n("input_tokens") + n("cache_creation_input_tokens");
            output += n("output_tokens");
            reads.push(n("cache_read_input_tokens"));
            assert_eq!(
                find(&headers, "anthropic-ratelimit-output-tokens-limit"),
                Some("10000")
            );
            let reset = find(&headers, "anthropic-ratelimit-input-tokens-reset").unwrap();
            assert!(reset.ends_with('Z') && reset.len() >= 20, "{reset}");
        }
        assert!(
            reads[0] == 0 && reads[1] > 1000,
            "the second request reads the cache: {reads:?}"
        );
        let stats = server.ration_stats();
        assert_eq!(stats.input_tokens, charged);
        assert_eq!((stats.output_tokens, stats.output_held), (output, 1000));
        assert!(output < 1000);
    }
}
