//! Provider errors, classified once at the HTTP edge from status, headers and body.
//!
//! Everything above the clients sees only [`ProviderError`]: whether to retry, how long the
//! server asked us to wait, and a message that is safe to print. API keys travel in a [`Secret`]
//! and every text quoted from a provider goes through [`redact`], so a key can never reach a
//! log, a report or a terminal.

use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use regex::Regex;
use reqwest::header::HeaderMap;
use serde_json::Value;

/// The longest provider message quoted in an error, in characters.
const MAX_QUOTED_CHARS: usize = 600;
/// The longest summary of a body that is not JSON (a proxy's HTML error page), in characters.
const MAX_PAGE_CHARS: usize = 120;

/// An API key. Its `Debug` never shows the value and it has no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(String);

impl Secret {
    pub(crate) fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The key itself, for the one place that puts it in a request header.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

static TOKEN_PATTERN: LazyLock<Regex> = LazyLock::new(|| {
    // `sk-...` keys (OpenAI, Anthropic `sk-ant-...`, OpenRouter `sk-or-...`), also when the
    // provider masks part of them with `*`, and bearer tokens echoed back.
    Regex::new(r"sk-[A-Za-z0-9_\-*]{6,}|(?i:bearer)\s+[A-Za-z0-9._~+/\-]{8,}=*")
        .unwrap_or_else(|e| panic!("static redaction pattern must compile: {e}"))
});

/// Keys shorter than this are placeholders (`x`, `dummy`, `ollama` for a local server), not
/// secrets: replacing them would cut every `x` out of a message.
pub(crate) const MIN_KEY_CHARS: usize = 12;

/// Replaces every occurrence of `key` (when it is long enough to be a real key) and of
/// anything that looks like an API key by `[redacted]`.
pub(crate) fn redact(text: &str, key: Option<&Secret>) -> String {
    let mut out = match key {
        Some(key) if key.expose().chars().count() >= MIN_KEY_CHARS => {
            text.replace(key.expose(), "[redacted]")
        }
        _ => text.to_owned(),
    };
    if TOKEN_PATTERN.is_match(&out) {
        out = TOKEN_PATTERN.replace_all(&out, "[redacted]").into_owned();
    }
    out
}

/// What kind of network trouble a [`ProviderError::Network`] is: decided where the error is
/// made (from reqwest's own classification), so nothing downstream reads its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NetworkKind {
    /// No complete answer within the request timeout.
    Timeout,
    /// The connection could not be made (refused, DNS, TLS handshake).
    Connect,
    /// The answer started but its body could not be read (reset mid-way).
    Body,
    /// A success whose body is not JSON, e.g. cut off by a proxy.
    InvalidResponse,
    /// Any other transport failure, or the provider's own HTTP 408.
    Other,
    /// An `https://` URL whose server answered the TLS handshake in plain HTTP: never
    /// retried, nor taken for a server still starting.
    PlainHttp,
}

impl NetworkKind {
    /// What the message of this kind starts with.
    fn headline(self) -> &'static str {
        match self {
            Self::Timeout => "request timed out",
            Self::Connect => "cannot connect",
            Self::Body => "cannot read the response",
            Self::InvalidResponse | Self::Other => "request failed",
            Self::PlainHttp => "TLS handshake failed: the server speaks plain HTTP",
        }
    }
}

/// Why a provider request failed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ProviderError {
    /// HTTP 429 (not a quota problem): retried, after `retry_after` when the server said so.
    RateLimited {
        retry_after: Option<Duration>,
        message: String,
    },
    /// HTTP 5xx, Anthropic's 529 `overloaded_error`: retried.
    Overloaded {
        status: u16,
        retry_after: Option<Duration>,
        message: String,
    },
    /// Connect failure, timeout, reset, unreadable body: retried.
    Network { kind: NetworkKind, message: String },
    /// HTTP 401/403; `env_var` names the variable that holds the key, when there is one.
    Auth {
        status: u16,
        env_var: Option<String>,
        message: String,
    },
    /// The prompt does not fit in the model's context window.
    ContextTooLong { message: String },
    /// Any other 4xx: the request itself is wrong (unknown model, bad schema, ...).
    BadRequest { status: u16, message: String },
    /// The account is out of credit or quota (`insufficient_quota`): never retried.
    QuotaExhausted { message: String },
    /// Anything else (unexpected status, unusable response).
    Other {
        status: Option<u16>,
        message: String,
    },
    /// Not sent: the provider refused the key at its first answer, or could not be reached
    /// for a while ([`super::client::ProviderStop`]); the run starts no more tasks.
    NotSent { message: String },
}

impl ProviderError {
    /// True for the errors worth retrying: rate limits, overload and network trouble.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Self::Network { kind, .. } => *kind != NetworkKind::PlainHttp,
            Self::RateLimited { .. } | Self::Overloaded { .. } => true,
            _ => false,
        }
    }

    /// An `https://` URL pointed at a server that speaks plain HTTP.
    pub(crate) fn is_plain_http(&self) -> bool {
        matches!(
            self,
            Self::Network {
                kind: NetworkKind::PlainHttp,
                ..
            }
        )
    }

    /// A server still starting: its 503 says it is loading the model (llama.cpp's "Loading
    /// model", vLLM's and others' alike).
    pub(crate) fn is_loading(&self) -> bool {
        matches!(self, Self::Overloaded { status: 503, message, .. }
            if message.to_lowercase().contains("loading"))
    }

    /// No connection could be made (refused, DNS, TLS handshake).
    pub(crate) fn is_connect(&self) -> bool {
        matches!(
            self,
            Self::Network {
                kind: NetworkKind::Connect,
                ..
            }
        )
    }

    /// How long the server asked us to wait before trying again.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_after, .. } | Self::Overloaded { retry_after, .. } => {
                *retry_after
            }
            _ => None,
        }
    }

    /// The error without the provider's quoted message: what a retry line shows, since the
    /// message is given once, in the final error.
    pub(crate) fn headline(&self) -> String {
        match self {
            Self::RateLimited { .. } => "rate limited by the provider (HTTP 429)".to_owned(),
            Self::Overloaded { status, .. } => {
                format!("provider overloaded or failing (HTTP {status})")
            }
            other => other.to_string(),
        }
    }

    /// A short stable name of the class, for reports and JSON output.
    #[cfg(test)]
    pub(crate) fn code(&self) -> &'static str {
        match self {
            Self::RateLimited { .. } => "rate_limited",
            Self::Overloaded { .. } => "overloaded",
            Self::Network { .. } => "network",
            Self::Auth { .. } => "auth",
            Self::ContextTooLong { .. } => "context_too_long",
            Self::BadRequest { .. } => "bad_request",
            Self::QuotaExhausted { .. } => "quota_exhausted",
            Self::Other { .. } => "other",
            Self::NotSent { .. } => "not_sent",
        }
    }

    /// The retry class of a transient error, for the run report's `retries_by_class`:
    /// `rate_limited`, `server_error`, `timeout` (no complete answer in time),
    /// `invalid_response` (a success whose body is not JSON, e.g. cut off) or `connection`
    /// (every other network failure); `None` for errors that are never retried.
    /// The error's class, for a task's failure: the [`Self::retry_class`] of a transient
    /// one, else `auth`, `context_too_long`, `bad_request`, `quota_exhausted` or `other`.
    pub(crate) fn class(&self) -> &'static str {
        self.retry_class().unwrap_or(match self {
            Self::Auth { .. } => "auth",
            Self::ContextTooLong { .. } => "context_too_long",
            Self::BadRequest { .. } => "bad_request",
            Self::QuotaExhausted { .. } => "quota_exhausted",
            Self::NotSent { .. } => "not_sent",
            _ => "other",
        })
    }

    pub(crate) fn retry_class(&self) -> Option<&'static str> {
        match self {
            Self::RateLimited { .. } => Some("rate_limited"),
            Self::Overloaded { .. } => Some("server_error"),
            Self::Network { kind, .. } => Some(match kind {
                NetworkKind::Timeout => "timeout",
                NetworkKind::InvalidResponse => "invalid_response",
                NetworkKind::Connect
                | NetworkKind::Body
                | NetworkKind::Other
                | NetworkKind::PlainHttp => "connection",
            }),
            _ => None,
        }
    }

    /// A network-class error of `kind` with a (redacted) message.
    pub(crate) fn network(
        kind: NetworkKind,
        message: impl AsRef<str>,
        key: Option<&Secret>,
    ) -> Self {
        Self::Network {
            kind,
            message: redact(message.as_ref(), key),
        }
    }

    /// Maps a transport error from reqwest (connect, timeout, reset, body) to [`Self::Network`].
    pub(crate) fn from_transport(err: reqwest::Error, key: Option<&Secret>) -> Self {
        let kind = if err.is_timeout() {
            NetworkKind::Timeout
        } else if plain_http_answer(&err) {
            NetworkKind::PlainHttp
        } else if err.is_connect() {
            NetworkKind::Connect
        } else if err.is_body() || err.is_decode() {
            NetworkKind::Body
        } else {
            NetworkKind::Other
        };
        let what = kind.headline();
        let url = err.url().map(|url| {
            let mut url = url.clone();
            // Credentials in a base URL must not be shown either.
            let _ = url.set_password(None);
            let _ = url.set_username("");
            url.to_string()
        });
        let err = err.without_url();
        let mut text = format!("{what}: {err}");
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            let cause_text = cause.to_string();
            if !text.contains(&cause_text) {
                text.push_str(": ");
                text.push_str(&cause_text);
            }
            source = cause.source();
        }
        if let Some(url) = url {
            text.push_str(&format!(" ({url})"));
            if kind == NetworkKind::PlainHttp {
                text.push_str(&format!(
                    "; the URL starts with https:// but the server answers in plain HTTP: \
                     use {}",
                    url.replacen("https://", "http://", 1)
                ));
            }
        }
        Self::network(kind, text, key)
    }
}

/// Whether a failed connection is a TLS handshake answered in plain HTTP: rustls finds a
/// record of an unknown content type (`HTTP/1.1 400 ...` read as a TLS record).
fn plain_http_answer(err: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(cause) = source {
        let tls = cause.downcast_ref::<rustls::Error>().or_else(|| {
            cause
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        // Through hyper's connector the rustls error may reach here as text only.
        if matches!(
            tls,
            Some(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::InvalidContentType
            ))
        ) || cause
            .to_string()
            .ends_with("received corrupt message of type InvalidContentType")
        {
            return true;
        }
        source = cause.source();
    }
    false
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RateLimited {
                retry_after,
                message,
            } => {
                write!(f, "rate limited by the provider (HTTP 429)")?;
                if let Some(wait) = retry_after {
                    write!(f, ", retry after {:.1}s", wait.as_secs_f64())?;
                }
                quote(f, message)
            }
            Self::Overloaded {
                status, message, ..
            } => {
                write!(f, "provider overloaded or failing (HTTP {status})")?;
                quote(f, message)
            }
            Self::Network { message, .. } => write!(f, "network error: {message}"),
            Self::Auth {
                status,
                env_var,
                message,
            } => {
                write!(f, "authentication failed (HTTP {status}): ")?;
                match env_var {
                    Some(var) => write!(f, "check the key in `{var}`")?,
                    None => write!(f, "check the API key configured for this provider")?,
                }
                if !message.is_empty() {
                    write!(f, " (provider said: {message})")?;
                }
                Ok(())
            }
            Self::ContextTooLong { message } => {
                write!(f, "the prompt is too long for the model's context window")?;
                quote(f, message)
            }
            Self::BadRequest { status, message } => {
                write!(f, "the provider rejected the request (HTTP {status})")?;
                quote(f, message)
            }
            Self::QuotaExhausted { message } => {
                write!(
                    f,
                    "the provider account has no quota or credit left; check plan and billing"
                )?;
                quote(f, message)
            }
            Self::Other {
                status: Some(status),
                message,
            } => {
                write!(f, "unexpected provider response (HTTP {status})")?;
                quote(f, message)
            }
            Self::Other {
                status: None,
                message,
            } => write!(f, "{message}"),
            Self::NotSent { message } => write!(f, "not sent: {message}"),
        }
    }
}

fn quote(f: &mut fmt::Formatter<'_>, message: &str) -> fmt::Result {
    if message.is_empty() {
        Ok(())
    } else {
        write!(f, ": {message}")
    }
}

impl std::error::Error for ProviderError {}

/// What the classifier needs to know about the provider besides the response.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ErrorContext<'a> {
    /// The key to redact from quoted messages.
    pub(crate) api_key: Option<&'a Secret>,
    /// The environment variable that holds the key, named in authentication errors.
    pub(crate) api_key_env: Option<&'a str>,
}

/// Classifies a non-success HTTP response.
pub(crate) fn classify(
    status: u16,
    headers: &HeaderMap,
    body: &str,
    ctx: &ErrorContext<'_>,
) -> ProviderError {
    classify_at(status, headers, body, ctx, jiff::Timestamp::now())
}

/// [`classify`] with an explicit current time (for reset headers that carry a timestamp).
pub(crate) fn classify_at(
    status: u16,
    headers: &HeaderMap,
    body: &str,
    ctx: &ErrorContext<'_>,
    now: jiff::Timestamp,
) -> ProviderError {
    let info = BodyInfo::parse(body);
    let message = redact(&info.message, ctx.api_key);
    let haystack = format!("{} {} {}", info.kind, info.code, info.message).to_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| haystack.contains(n));

    const QUOTA: &[&str] = &[
        "insufficient_quota",
        "credit balance is too low",
        "billing_hard_limit_reached",
        "exceeded your current quota",
    ];
    const CONTEXT: &[&str] = &[
        "context_length_exceeded",
        "prompt is too long",
        "maximum context length",
        "context window",
        "input is too long",
        "too many input tokens",
    ];

    // A server error that says the request itself cannot be read (llama.cpp's "Failed to
    // parse tool call arguments as JSON" is a 500): the same request would fail again.
    const UNPARSEABLE: &[&str] = &[
        "failed to parse",
        "could not parse",
        "unable to parse",
        "cannot parse",
    ];

    match status {
        401 | 403 => ProviderError::Auth {
            status,
            env_var: ctx.api_key_env.map(str::to_owned),
            message,
        },
        402 => ProviderError::QuotaExhausted { message },
        400..=499 if has(QUOTA) => ProviderError::QuotaExhausted { message },
        // The wait asked in a header or in words is when the request would be admitted; a
        // reset header says when the whole bucket is full again, which may be a minute away.
        429 => ProviderError::RateLimited {
            retry_after: asked_wait(headers, now)
                .or_else(|| wait_in_message(&info.message))
                .or_else(|| retry_after(headers, now)),
            message,
        },
        408 => ProviderError::Network {
            kind: NetworkKind::Other,
            message: format!(
                "the provider timed out waiting for the request (HTTP 408){}",
                {
                    if message.is_empty() {
                        String::new()
                    } else {
                        format!(": {message}")
                    }
                }
            ),
        },
        413 => ProviderError::ContextTooLong { message },
        400..=499 if has(CONTEXT) => ProviderError::ContextTooLong { message },
        400..=499 => ProviderError::BadRequest { status, message },
        500..=599 if has(UNPARSEABLE) => ProviderError::BadRequest { status, message },
        500..=599 => ProviderError::Overloaded {
            status,
            retry_after: retry_after(headers, now),
            message,
        },
        _ if info.kind == "overloaded_error" => ProviderError::Overloaded {
            status,
            retry_after: retry_after(headers, now),
            message,
        },
        _ => ProviderError::Other {
            status: Some(status),
            message,
        },
    }
}

/// The interesting parts of an error body in any of the usual shapes.
#[derive(Debug, Default, PartialEq)]
struct BodyInfo {
    message: String,
    kind: String,
    code: String,
}

impl BodyInfo {
    fn parse(body: &str) -> Self {
        let trimmed = body.trim();
        let mut info = BodyInfo::default();
        if let Ok(json) = serde_json::from_str::<Value>(trimmed) {
            // OpenAI / Anthropic: {"error": {"message", "type", "code"}}; Ollama: {"error": "..."};
            // vLLM and others: {"message", "type", "code"} at the top level.
            let error = json.get("error").unwrap_or(&json);
            match error {
                Value::String(text) => info.message = text.clone(),
                Value::Object(_) => {
                    info.message = text_of(error.get("message"))
                        .or_else(|| text_of(error.get("detail")))
                        .unwrap_or_default();
                    info.kind = text_of(error.get("type")).unwrap_or_default();
                    info.code = text_of(error.get("code")).unwrap_or_default();
                }
                _ => {}
            }
            if info.message.is_empty() {
                info.message = trimmed.to_owned();
            }
            info.message = truncate(&info.message, MAX_QUOTED_CHARS);
        } else {
            info.message = truncate(&page_summary(trimmed), MAX_PAGE_CHARS);
        }
        info
    }
}

/// A body that is not JSON, such as a proxy's HTML error page, in a few words: its `<title>`,
/// else its first line with any tags removed.
fn page_summary(body: &str) -> String {
    static TITLE: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?is)<title[^>]*>(.*?)</title>")
            .unwrap_or_else(|e| panic!("static title pattern must compile: {e}"))
    });
    static TAG: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"<[^>]*>").unwrap_or_else(|e| panic!("static tag pattern must compile: {e}"))
    });
    let collapse = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some(title) = TITLE.captures(body).map(|c| collapse(&c[1]))
        && !title.is_empty()
    {
        return title;
    }
    body.lines()
        .map(|line| collapse(&TAG.replace_all(line, " ")))
        .find(|line| !line.is_empty())
        .unwrap_or_default()
}

/// The wait a rate-limit message asks for in words, as proxies such as LiteLLM's and OpenAI
/// itself write it: "Please try again in 20s", "try again in 1.5 seconds", "in 1m30s",
/// "in 250ms".
fn wait_in_message(message: &str) -> Option<Duration> {
    static WAIT: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"(?i)try again in\s+((?:\d+(?:\.\d+)?(?:h|ms|m|s))+|\d+(?:\.\d+)?)\s*(milliseconds?|seconds?|secs?|minutes?|mins?)?\b",
        )
        .unwrap_or_else(|e| panic!("static wait pattern must compile: {e}"))
    });
    let captures = WAIT.captures(message)?;
    let amount = &captures[1];
    let seconds_per_unit = match captures.get(2).map(|u| u.as_str().to_lowercase()) {
        None => return parse_go_duration(amount),
        Some(unit) if unit.starts_with("milli") => 1e-3,
        Some(unit) if unit.starts_with("min") => 60.0,
        Some(_) => 1.0,
    };
    let value = parse_non_negative(amount)? * seconds_per_unit;
    (value < 1e9).then(|| Duration::from_secs_f64(value))
}

fn text_of(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(text) => Some(text.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

fn truncate(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

/// The wait a server asked for in so many words: `retry-after-ms`, or `Retry-After` (seconds
/// or an HTTP date).
fn asked_wait(headers: &HeaderMap, now: jiff::Timestamp) -> Option<Duration> {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = get("retry-after-ms").and_then(parse_non_negative) {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let value = get("retry-after")?;
    if let Some(secs) = parse_non_negative(value) {
        return Some(Duration::from_secs_f64(secs));
    }
    jiff::fmt::rfc2822::DateTimeParser::new()
        .parse_timestamp(value)
        .ok()
        .map(|at| until(now, at))
}

/// The wait a server asked for, from any of the headers providers use.
///
/// Precedence: `retry-after-ms`, `Retry-After` (seconds or HTTP-date), then the rate-limit reset
/// headers of OpenAI (`x-ratelimit-reset-requests`/`-tokens`, Go durations like `6m0s`) and
/// Anthropic (`anthropic-ratelimit-*-reset`, RFC 3339). Of the reset headers, those whose budget
/// is exhausted (`remaining: 0`) count; when none says so, the longest wait counts.
pub(crate) fn retry_after(headers: &HeaderMap, now: jiff::Timestamp) -> Option<Duration> {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };

    if let Some(wait) = asked_wait(headers, now) {
        return Some(wait);
    }

    let mut exhausted = Vec::new();
    let mut all = Vec::new();
    let mut consider = |reset: Option<Duration>, remaining: Option<&str>| {
        if let Some(wait) = reset {
            if remaining.is_some_and(|r| r == "0") {
                exhausted.push(wait);
            }
            all.push(wait);
        }
    };
    for kind in ["requests", "tokens"] {
        consider(
            get(&format!("x-ratelimit-reset-{kind}")).and_then(parse_go_duration),
            get(&format!("x-ratelimit-remaining-{kind}")),
        );
    }
    for kind in ["requests", "tokens", "input-tokens", "output-tokens"] {
        let reset = get(&format!("anthropic-ratelimit-{kind}-reset"))
            .and_then(|v| v.parse::<jiff::Timestamp>().ok())
            .map(|at| until(now, at));
        consider(reset, get(&format!("anthropic-ratelimit-{kind}-remaining")));
    }
    // OpenRouter and others: `x-ratelimit-reset` as epoch milliseconds/seconds or a duration.
    if let Some(value) = get("x-ratelimit-reset") {
        let reset = match value.parse::<i64>() {
            Ok(ms) if ms > 1_000_000_000_000 => jiff::Timestamp::from_millisecond(ms)
                .ok()
                .map(|at| until(now, at)),
            Ok(secs) if secs > 1_000_000_000 => jiff::Timestamp::from_second(secs)
                .ok()
                .map(|at| until(now, at)),
            _ => parse_go_duration(value),
        };
        consider(reset, get("x-ratelimit-remaining"));
    }
    exhausted
        .into_iter()
        .max()
        .or_else(|| all.into_iter().max())
}

fn parse_non_negative(text: &str) -> Option<f64> {
    let value: f64 = text.parse().ok()?;
    (0.0..1e9).contains(&value).then_some(value)
}

fn until(now: jiff::Timestamp, at: jiff::Timestamp) -> Duration {
    let span = now.duration_until(at);
    if span.is_negative() {
        Duration::ZERO
    } else {
        span.unsigned_abs()
    }
}

/// Parses Go-style durations as sent by OpenAI: `1s`, `6m0s`, `20ms`, `1h2m3.5s`, `0.5s`; a
/// bare number means seconds.
pub(crate) fn parse_go_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if let Some(secs) = parse_non_negative(text) {
        return Some(Duration::from_secs_f64(secs));
    }
    let mut total = 0.0_f64;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        if number_len == 0 {
            return None;
        }
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += number * seconds_per_unit;
        rest = &rest[unit_len..];
    }
    (total.is_finite() && total < 1e9).then(|| Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderName, HeaderValue};

    #[test]
    fn retry_class_follows_the_network_kind_not_the_message() {
        let class = |kind| ProviderError::network(kind, "request timed out", None).retry_class();
        assert_eq!(class(NetworkKind::Timeout), Some("timeout"));
        assert_eq!(
            class(NetworkKind::InvalidResponse),
            Some("invalid_response")
        );
        assert_eq!(class(NetworkKind::Connect), Some("connection"));
        assert_eq!(class(NetworkKind::Body), Some("connection"));
        assert_eq!(class(NetworkKind::Other), Some("connection"));
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                HeaderName::from_bytes(name.as_bytes()).expect("header name"),
                HeaderValue::from_str(value).expect("header value"),
            );
        }
        map
    }

    fn now() -> jiff::Timestamp {
        "2026-02-19T12:00:00Z".parse().expect("timestamp")
    }

    fn class(status: u16, hdrs: &[(&str, &str)], body: &str) -> ProviderError {
        let key = Secret::new("sk-test-0123456789abcdef");
        let ctx = ErrorContext {
            api_key: Some(&key),
            api_key_env: Some("OPENAI_API_KEY"),
        };
        classify_at(status, &headers(hdrs), body, &ctx, now())
    }

    #[test]
    fn classification_table() {
        let openai = |kind: &str, code: &str, msg: &str| {
            format!(r#"{{"error":{{"message":"{msg}","type":"{kind}","code":"{code}"}}}}"#)
        };
        let anthropic = |kind: &str, msg: &str| {
            format!(r#"{{"type":"error","error":{{"type":"{kind}","message":"{msg}"}}}}"#)
        };
        let cases: Vec<(u16, String, &str)> = vec![
            (
                429,
                openai("requests", "rate_limit_exceeded", "Rate limit reached"),
                "rate_limited",
            ),
            (
                429,
                openai(
                    "insufficient_quota",
                    "insufficient_quota",
                    "You exceeded your current quota",
                ),
                "quota_exhausted",
            ),
            (
                429,
                anthropic("rate_limit_error", "Number of request tokens has exceeded"),
                "rate_limited",
            ),
            (
                400,
                anthropic(
                    "invalid_request_error",
                    "Your credit balance is too low to access the Anthropic API.",
                ),
                "quota_exhausted",
            ),
            (
                402,
                r#"{"error":{"message":"Insufficient credits"}}"#.into(),
                "quota_exhausted",
            ),
            (
                401,
                openai(
                    "invalid_request_error",
                    "invalid_api_key",
                    "Incorrect API key provided",
                ),
                "auth",
            ),
            (403, anthropic("permission_error", "no access"), "auth"),
            (
                500,
                openai("server_error", "", "The server had an error"),
                "overloaded",
            ),
            (502, "<html>Bad Gateway</html>".into(), "overloaded"),
            (503, "".into(), "overloaded"),
            (
                529,
                anthropic("overloaded_error", "Overloaded"),
                "overloaded",
            ),
            (408, "".into(), "network"),
            (
                400,
                openai(
                    "invalid_request_error",
                    "context_length_exceeded",
                    "This model's maximum context length is 8192 tokens",
                ),
                "context_too_long",
            ),
            (
                400,
                anthropic(
                    "invalid_request_error",
                    "prompt is too long: 210000 tokens > 200000 maximum",
                ),
                "context_too_long",
            ),
            (
                413,
                anthropic(
                    "request_too_large",
                    "Request exceeds the maximum allowed number of bytes.",
                ),
                "context_too_long",
            ),
            (
                400,
                openai("invalid_request_error", "", "Invalid schema for function"),
                "bad_request",
            ),
            (
                404,
                r#"{"error":"model 'llama9' not found"}"#.into(),
                "bad_request",
            ),
            (
                422,
                r#"{"object":"error","message":"bad","type":"BadRequestError","code":422}"#.into(),
                "bad_request",
            ),
            (302, "".into(), "other"),
        ];
        for (status, body, expected) in cases {
            let err = class(status, &[], &body);
            assert_eq!(err.code(), expected, "HTTP {status} {body} -> {err:?}");
            let transient = matches!(expected, "rate_limited" | "overloaded" | "network");
            assert_eq!(err.is_transient(), transient, "{err:?}");
        }
    }

    #[test]
    fn messages_are_extracted_from_bodies() {
        let err = class(
            400,
            &[],
            r#"{"error":{"message":"Invalid schema","type":"invalid_request_error"}}"#,
        );
        assert_eq!(
            err.to_string(),
            "the provider rejected the request (HTTP 400): Invalid schema"
        );
        let err = class(404, &[], r#"{"error":"model 'x' not found"}"#);
        assert_eq!(
            err.to_string(),
            "the provider rejected the request (HTTP 404): model 'x' not found"
        );
        let err = class(500, &[], "plain text failure\n");
        assert_eq!(
            err.to_string(),
            "provider overloaded or failing (HTTP 500): plain text failure"
        );
        let long = "x".repeat(5000);
        let err = class(400, &[], &long);
        assert!(err.to_string().len() < 1000);
    }

    #[test]
    fn a_server_error_saying_the_request_cannot_be_parsed_is_not_retried() {
        let err = class(
            500,
            &[],
            r#"{"error":{"code":500,"message":"Failed to parse tool call arguments as JSON: [json.exception.parse_error.101]","type":"server_error"}}"#,
        );
        assert!(!err.is_transient(), "{err:?}");
        assert_eq!(
            err.to_string(),
            "the provider rejected the request (HTTP 500): Failed to parse tool call arguments as JSON: [json.exception.parse_error.101]"
        );
        let err = class(500, &[], r#"{"error":{"message":"out of memory"}}"#);
        assert!(err.is_transient(), "{err:?}");
    }

    #[test]
    fn a_proxy_page_is_summarised() {
        let page = format!(
            "<!DOCTYPE html>\n<html><head>\n<title>502 Bad\n  Gateway</title></head>\n<body>{}</body></html>",
            "<p>nginx</p>".repeat(200)
        );
        let err = class(502, &[], &page);
        assert_eq!(
            err.to_string(),
            "provider overloaded or failing (HTTP 502): 502 Bad Gateway"
        );
        assert_eq!(err.headline(), "provider overloaded or failing (HTTP 502)");
        let err = class(503, &[], "\n\n<h1>Service   Unavailable</h1>\n<p>later</p>");
        assert_eq!(
            err.to_string(),
            "provider overloaded or failing (HTTP 503): Service Unavailable"
        );
        let err = class(502, &[], &format!("<title>{}</title>", "y".repeat(400)));
        assert!(err.to_string().chars().count() < 170, "{err}");
    }

    #[test]
    fn a_wait_in_words_is_honoured_without_retry_after() {
        let wait = |message: &str| {
            class(
                429,
                &[],
                &format!(r#"{{"error":{{"message":"{message}"}}}}"#),
            )
            .retry_after()
        };
        assert_eq!(
            wait("litellm.RateLimitError: Rate limited. Try again in 7 seconds."),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            wait("Rate limit reached for gpt-4o. Please try again in 1.5s. Visit ..."),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            wait("Please try again in 1m30s."),
            Some(Duration::from_secs(90))
        );
        assert_eq!(wait("try again in 250ms"), Some(Duration::from_millis(250)));
        assert_eq!(
            wait("try again in 2 minutes"),
            Some(Duration::from_secs(120))
        );
        assert_eq!(wait("slow down"), None);
        // A header still wins.
        let err = class(
            429,
            &[("retry-after", "3")],
            r#"{"error":{"message":"try again in 9 seconds"}}"#,
        );
        assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));
        // ... but a reset header, which says when the whole minute's bucket is full again,
        // does not: OpenAI's 429 names the wait for this request in words.
        let err = class(
            429,
            &[
                ("x-ratelimit-remaining-tokens", "0"),
                ("x-ratelimit-reset-tokens", "59s"),
            ],
            r#"{"error":{"message":"Rate limit reached on tokens per min (TPM): Limit 300000, Used 299000, Requested 4096. Please try again in 620ms."}}"#,
        );
        assert_eq!(err.retry_after(), Some(Duration::from_millis(620)));
    }

    #[test]
    fn auth_error_names_the_env_var_and_hides_the_key() {
        let body = r#"{"error":{"message":"Incorrect API key provided: sk-test-0123456789abcdef. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","code":"invalid_api_key"}}"#;
        let err = class(401, &[], body);
        let shown = err.to_string();
        assert!(
            shown
                .starts_with("authentication failed (HTTP 401): check the key in `OPENAI_API_KEY`"),
            "{shown}"
        );
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
        assert!(!format!("{err:?}").contains("0123456789abcdef"));
        assert!(shown.contains("[redacted]"));

        let ctx = ErrorContext {
            api_key: None,
            api_key_env: None,
        };
        let err = classify_at(401, &HeaderMap::new(), "", &ctx, now());
        assert_eq!(
            err.to_string(),
            "authentication failed (HTTP 401): check the API key configured for this provider"
        );
    }

    #[test]
    fn redaction() {
        let key = Secret::new("my-very-own-key-42");
        assert_eq!(
            redact(
                "got my-very-own-key-42 twice my-very-own-key-42",
                Some(&key)
            ),
            "got [redacted] twice [redacted]"
        );
        assert_eq!(
            redact("key sk-proj-abcDEF123_-xyz is bad.", None),
            "key [redacted] is bad."
        );
        assert_eq!(
            redact("masked sk-proj-****************abcd here", None),
            "masked [redacted] here"
        );
        assert_eq!(redact("sk-ant-api03-AAAAAAAAAAAAAAAA", None), "[redacted]");
        assert_eq!(
            redact("Authorization: Bearer abcdefghijklmnop", None),
            "Authorization: [redacted]"
        );
        assert_eq!(
            redact("task-list is fine, so is sk-1", None),
            "task-list is fine, so is sk-1"
        );
        assert_eq!(
            redact("nothing to hide", Some(&Secret::new(""))),
            "nothing to hide"
        );
        // Placeholder keys of local servers are not secrets.
        for placeholder in ["x", "dummy", "ollama", "eleven-char"] {
            assert_eq!(
                redact("maximum context length", Some(&Secret::new(placeholder))),
                "maximum context length"
            );
        }
        assert_eq!(
            redact("got twelve-chars", Some(&Secret::new("twelve-chars"))),
            "got [redacted]"
        );
        assert_eq!(format!("{key:?}"), "Secret([redacted])");
        let endpoint_like = format!("{:?}", Some(key));
        assert!(!endpoint_like.contains("my-very-own"));
    }

    #[test]
    fn retry_after_every_header_form() {
        let ra = |pairs: &[(&str, &str)]| retry_after(&headers(pairs), now());
        assert_eq!(ra(&[]), None);
        assert_eq!(ra(&[("retry-after", "1")]), Some(Duration::from_secs(1)));
        assert_eq!(
            ra(&[("Retry-After", " 30 ")]),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            ra(&[("retry-after", "1.5")]),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            ra(&[("retry-after", "Thu, 19 Feb 2026 12:00:07 GMT")]),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            ra(&[("retry-after", "Thu, 19 Feb 2026 11:00:00 GMT")]),
            Some(Duration::ZERO)
        );
        assert_eq!(ra(&[("retry-after", "soon")]), None);
        assert_eq!(ra(&[("retry-after", "-3")]), None);
        // retry-after-ms wins over retry-after
        assert_eq!(
            ra(&[("retry-after-ms", "250"), ("retry-after", "9")]),
            Some(Duration::from_millis(250))
        );
        // OpenAI reset headers
        assert_eq!(
            ra(&[("x-ratelimit-reset-requests", "20ms")]),
            Some(Duration::from_millis(20))
        );
        assert_eq!(
            ra(&[
                ("x-ratelimit-reset-requests", "1s"),
                ("x-ratelimit-reset-tokens", "6m0s")
            ]),
            Some(Duration::from_secs(360))
        );
        assert_eq!(
            ra(&[
                ("x-ratelimit-reset-requests", "1s"),
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-tokens", "6m0s"),
                ("x-ratelimit-remaining-tokens", "5000"),
            ]),
            Some(Duration::from_secs(1))
        );
        // Retry-After wins over reset headers
        assert_eq!(
            ra(&[("retry-after", "2"), ("x-ratelimit-reset-tokens", "6m0s")]),
            Some(Duration::from_secs(2))
        );
        // Anthropic RFC 3339 resets
        assert_eq!(
            ra(&[("anthropic-ratelimit-requests-reset", "2026-02-19T12:00:05Z")]),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            ra(&[
                ("anthropic-ratelimit-requests-reset", "2026-02-19T12:00:05Z"),
                ("anthropic-ratelimit-requests-remaining", "10"),
                (
                    "anthropic-ratelimit-input-tokens-reset",
                    "2026-02-19T12:00:02.500Z"
                ),
                ("anthropic-ratelimit-input-tokens-remaining", "0"),
            ]),
            Some(Duration::from_millis(2500))
        );
        assert_eq!(
            ra(&[("anthropic-ratelimit-tokens-reset", "2026-02-19T11:59:00Z")]),
            Some(Duration::ZERO)
        );
        // Epoch-millisecond reset (OpenRouter)
        let at = now().as_millisecond() + 4000;
        assert_eq!(
            ra(&[("x-ratelimit-reset", &at.to_string())]),
            Some(Duration::from_secs(4))
        );
    }

    #[test]
    fn retry_after_reaches_the_error() {
        let err = class(429, &[("retry-after", "3")], "{}");
        assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));
        let err = class(503, &[("retry-after", "2")], "");
        assert_eq!(err.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(class(400, &[("retry-after", "2")], "").retry_after(), None);
    }

    #[test]
    fn go_durations() {
        let d = parse_go_duration;
        assert_eq!(d("1s"), Some(Duration::from_secs(1)));
        assert_eq!(d("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(d("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(d("1h2m3.5s"), Some(Duration::from_millis(3_723_500)));
        assert_eq!(d("0.5s"), Some(Duration::from_millis(500)));
        assert_eq!(d("7"), Some(Duration::from_secs(7)));
        assert_eq!(d("250us"), Some(Duration::from_micros(250)));
        assert_eq!(d(""), None);
        assert_eq!(d("s"), None);
        assert_eq!(d("5x"), None);
        assert_eq!(d("1.2.3s"), None);
    }
}
