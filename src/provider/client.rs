//! One HTTP client per provider: the endpoint's configuration, a shared keep-alive connection
//! pool, and `chat` / `list_models` over either wire format.
//!
//! A [`Client`] sends exactly one request per call; retrying is [`super::retry`]'s job and
//! when a request may go is [`super::admission`]'s, which every answer's rate-limit headers
//! reach from here. Every error leaves this file classified as a
//! [`ProviderError`] with provider text redacted.
//!
//! Until a provider has answered once, its requests go one at a time: a provider that refuses
//! the key (401 or 403 at its first answer) is sent one request, and every later one fails
//! without being sent ([`ProviderStop::Refused`]). So does every request to a provider that
//! answered before and then could not be reached at all for a while
//! ([`ProviderStop::Unreachable`], [`Client::note_unreachable`]).

use std::fmt;
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use super::anthropic;
use super::error::{ErrorContext, ProviderError, Secret, classify};
use super::message::{ChatRequest, ChatResponse};
use super::openai;
use super::structured::{OpenAiFormat, refuses_response_format, take_answer_tool};

/// Installs rustls' `ring` crypto provider as the process default, once. reqwest is built
/// without a provider of its own, so this must run before any client is built; a provider
/// installed earlier by someone else is kept.
pub(crate) fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // Err means a default provider is already installed: fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Which wire format a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProviderKind {
    /// OpenAI-compatible Chat Completions (OpenAI, Ollama, vLLM, LM Studio, OpenRouter, ...).
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
}

/// summon's output limit of an OpenAI-compatible request that sets none: what every current
/// OpenAI model takes, and a bound for local servers, which otherwise generate until the
/// context is full.
pub(crate) const DEFAULT_OPENAI_OUTPUT_LIMIT: u32 = 4096;

impl ProviderKind {
    /// The output limit summon sends when none is set: [`DEFAULT_OPENAI_OUTPUT_LIMIT`], or
    /// Anthropic's default. A context window, when known, lowers the OpenAI one to what is
    /// left of it after `prompt` tokens (servers refuse a prompt and limit that overflow it).
    pub(crate) fn default_output_limit(self, window: Option<u64>, prompt: u64) -> u32 {
        match self {
            Self::Anthropic => super::anthropic::DEFAULT_MAX_TOKENS,
            Self::OpenAi => {
                let left = window.map_or(u64::MAX, |w| w.saturating_sub(prompt)).max(1);
                u32::try_from(left.min(u64::from(DEFAULT_OPENAI_OUTPUT_LIMIT)))
                    .unwrap_or(DEFAULT_OPENAI_OUTPUT_LIMIT)
            }
        }
    }

    /// The output limit of a request that sets none: Anthropic requires one and summon sends
    /// its default; for OpenAI-compatible servers only a limit that was set counts here (the
    /// default one is fitted to the context window, see [`Self::default_output_limit`]).
    pub(crate) fn output_limit(self, set: Option<u32>) -> Option<u32> {
        match self {
            Self::Anthropic => Some(set.unwrap_or(super::anthropic::DEFAULT_MAX_TOKENS)),
            Self::OpenAi => set,
        }
    }
}

/// Where and how to reach one provider.
#[derive(Debug, Clone)]
pub(crate) struct ProviderEndpoint {
    /// The provider's name in summon's configuration (`openai`, `ollama`, a config entry, ...).
    pub(crate) name: String,
    pub(crate) kind: ProviderKind,
    /// For [`ProviderKind::OpenAi`] including `/v1` (`http://localhost:11434/v1`); for
    /// [`ProviderKind::Anthropic`] without it (`https://api.anthropic.com`).
    pub(crate) base_url: String,
    /// `None` sends no credentials (Ollama and other local servers need none).
    pub(crate) api_key: Option<Secret>,
    /// The environment variable the key came from, named in authentication errors.
    pub(crate) api_key_env: Option<String>,
    pub(crate) connect_timeout: Duration,
    /// The whole request, from connecting to the end of the response body.
    pub(crate) request_timeout: Duration,
    /// The structured-output mechanism an OpenAI-compatible server is sent first
    /// (`structured_output` in the config file); a 400 still steps it down.
    pub(crate) structured_output: OpenAiFormat,
    /// The service tier every chat request asks for (OpenAI's `service_tier`: `flex`,
    /// `priority`); none: the provider's default.
    pub(crate) service_tier: Option<&'static str>,
    /// A flex request answered 429 is sent again at once at the standard tier.
    pub(crate) flex_fallback: bool,
    /// Whether the server is a local one (`local` in the config file); `None`: told from the
    /// base URL ([`ProviderEndpoint::is_local`]).
    pub(crate) local: Option<bool>,
}

impl ProviderEndpoint {
    pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
    pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

    /// An endpoint without a key and with the default timeouts.
    pub(crate) fn new(
        name: impl Into<String>,
        kind: ProviderKind,
        base_url: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            kind,
            base_url: base_url.into(),
            api_key: None,
            api_key_env: None,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            request_timeout: Self::DEFAULT_REQUEST_TIMEOUT,
            structured_output: OpenAiFormat::JsonSchema,
            service_tier: None,
            flex_fallback: false,
            local: None,
        }
    }

    /// Whether the server runs on this machine or the local network (loopback, a private or
    /// link-local address, `localhost`, a `.local` or `.internal` name), where nothing but the
    /// output limit stops a model that writes until its context is full. A hosted provider
    /// ends answers itself; the config file's `local` says otherwise.
    pub(crate) fn is_local(&self) -> bool {
        if let Some(local) = self.local {
            return local;
        }
        let Ok(url) = reqwest::Url::parse(&self.base_url) else {
            return false;
        };
        let Some(host) = url.host_str() else {
            return false;
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        match host.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(ip)) => {
                ip.is_loopback() || ip.is_private() || ip.is_link_local()
            }
            Ok(std::net::IpAddr::V6(ip)) => {
                ip.is_loopback() || ip.is_unique_local() || ip.is_unicast_link_local()
            }
            Err(_) => {
                let name = host.trim_end_matches('.').to_ascii_lowercase();
                name == "localhost"
                    || name.ends_with(".localhost")
                    || name.ends_with(".local")
                    || name.ends_with(".internal")
                    || name.ends_with(".lan")
                    || !name.contains('.')
            }
        }
    }

    /// The slowest a flex answer is waited for, at least (OpenAI's own examples raise the
    /// client timeout to 15 minutes for flex).
    pub(crate) const FLEX_REQUEST_TIMEOUT: Duration = Duration::from_secs(900);

    /// This endpoint asking for `service_tier` (`flex`, `priority`; none: the default), a
    /// flex request waited for at least [`Self::FLEX_REQUEST_TIMEOUT`] and, with `fallback`,
    /// sent at the standard tier when the provider has no flex capacity.
    #[must_use]
    pub(crate) fn at_tier(mut self, service_tier: Option<&'static str>, fallback: bool) -> Self {
        if service_tier == Some("flex") {
            self.request_timeout = self.request_timeout.max(Self::FLEX_REQUEST_TIMEOUT);
            self.flex_fallback = fallback;
        }
        self.service_tier = service_tier;
        self
    }

    /// Sets the key and the variable it came from (`None` when it came from a config file).
    pub(crate) fn with_api_key(mut self, key: Secret, env_var: Option<&str>) -> Self {
        self.api_key = Some(key);
        self.api_key_env = env_var.map(str::to_owned);
        self
    }
}

/// Why a provider is sent no more requests by this client (and its clones).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ProviderStop {
    /// Its first answer was HTTP 401 or 403: the key is refused.
    Refused(ProviderError),
    /// It had answered, then every request failed to connect for `window`; `error` is the
    /// last one.
    Unreachable { window: Duration, error: String },
    /// It answered every request with HTTP 429 for `window`; `error` is the last one.
    RateLimited { window: Duration, error: String },
    /// Nothing answered at its URL before it ever answered, and no server was said to be
    /// starting there (`SUMMON_STARTUP_WAIT_MS`), or an `https://` URL was answered in plain
    /// HTTP; `error` is the failed connection.
    NoServer { error: String },
}

impl ProviderStop {
    /// What stopped the provider `name`, in one sentence.
    pub(crate) fn describe(&self, name: &str) -> String {
        match self {
            Self::Refused(err) => format!("provider `{name}` refused the key: {err}"),
            Self::Unreachable { window, error } => format!(
                "provider `{name}` could not be reached for {} ({error})",
                seconds(*window)
            ),
            Self::RateLimited { window, error } => format!(
                "provider `{name}` answered every request with a rate limit for {} ({error})",
                seconds(*window)
            ),
            Self::NoServer { error } => format!("provider `{name}` did not answer: {error}"),
        }
    }
}

/// The pause between two tries of a provider that cannot be reached (after it answered).
const PROBE_PACE: Duration = Duration::from_secs(1);

/// The first pause between two tries of a provider still starting (no connection before it
/// ever answered, or a 503 saying it is loading its model); each failed try doubles it up to
/// [`STARTUP_PACE_CAP`].
const STARTUP_PACE: Duration = Duration::from_millis(10);
const STARTUP_PACE_CAP: Duration = Duration::from_secs(2);

/// `30s`, `0.5s`.
fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}s")
    } else {
        format!("{s:.1}s")
    }
}

/// Until a provider has answered, its requests go one at a time (a provider that refuses the
/// key or is not up gets one request, not one per task). A task that finds the first request
/// in flight asks the provider for its model list meanwhile (once per provider): a success
/// there, with the same credentials, opens the gate for every task without waiting for the
/// first answer, which a model may take seconds to give.
#[derive(Debug, Default)]
struct Opening {
    /// The model list has been asked (or is being asked).
    asked: std::sync::atomic::AtomicBool,
    /// The model list was given: the tasks waiting at the gate go.
    open: tokio::sync::watch::Sender<bool>,
    /// A request of summon's own (not the model list) has had an answer: a refused key on the
    /// first one stops the provider.
    replied: std::sync::atomic::AtomicBool,
}

/// Whether the provider can still be sent requests, and when the next try may go.
#[derive(Debug)]
struct Health {
    /// Since when every request has failed to connect, after the provider had answered.
    unreachable_since: Option<Instant>,
    /// Since when the provider has been waited for to start: no connection before it ever
    /// answered, or 503s saying it is loading its model.
    starting_since: Option<Instant>,
    /// While the provider is waited for (starting or unreachable), the one request going
    /// through the gate is sent no earlier than this: one try per pause, whatever the number
    /// of tasks waiting.
    next_try: Option<Instant>,
    /// The pause after the next failed try of a starting provider.
    startup_pace: Duration,
    /// Since when every answer has been a 429.
    limited_since: Option<Instant>,
    stop: Option<ProviderStop>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            unreachable_since: None,
            starting_since: None,
            next_try: None,
            startup_pace: STARTUP_PACE,
            limited_since: None,
            stop: None,
        }
    }
}

impl Health {
    /// A try of a starting provider failed: the next one waits the pace, which doubles.
    fn starting_failed(&mut self, now: Instant) {
        self.starting_since.get_or_insert(now);
        self.next_try = Some(now + self.startup_pace);
        self.startup_pace = (self.startup_pace * 2).min(STARTUP_PACE_CAP);
    }

    /// The provider gave an answer that is not "still loading": nothing is waited for.
    fn answered(&mut self) {
        self.unreachable_since = None;
        self.starting_since = None;
        self.next_try = None;
        self.startup_pace = STARTUP_PACE;
        self.limited_since = None;
    }
}

/// A provider client; cheap to clone, clones share one connection pool.
#[derive(Clone)]
pub(crate) struct Client {
    endpoint: Arc<ProviderEndpoint>,
    /// Sends the provider's credentials, so it goes only to the provider's own origin: it
    /// follows no redirect to another one.
    http: reqwest::Client,
    /// Without credentials, for URLs on another origin (a batch's results URL, a redirect);
    /// built the first time one is met.
    plain: Arc<std::sync::OnceLock<reqwest::Client>>,
    /// Scheme, host and port of the base URL: where credentials may go.
    origin: reqwest::Url,
    /// The normalized base URL (see [`ProviderEndpoint::base_url`]).
    base: String,
    /// Parsed once: a URL is cloned per request, not parsed again.
    chat_url: reqwest::Url,
    models_url: String,
    /// How far the server supports `response_format`, shared by every task on this provider:
    /// 0 `json_schema`, 1 `json_object`, 2 none (each step down after a 400 refusing it).
    format_level: Arc<std::sync::atomic::AtomicU8>,
    /// A warning for the run (a step down of `format_level`), taken by the next caller.
    notice: Arc<std::sync::Mutex<Option<String>>>,
    /// The provider has given an HTTP answer (any status): a connection refused after that
    /// is not a server still starting.
    answered: Arc<std::sync::atomic::AtomicBool>,
    /// The wait for a starting provider has been said (once per provider).
    startup_said: Arc<std::sync::atomic::AtomicBool>,
    /// The provider refused `max_tokens` and asked for `max_completion_tokens` (OpenAI's
    /// reasoning models): every later request names the limit so.
    completion_tokens: Arc<std::sync::atomic::AtomicBool>,
    /// Anthropic refused `output_config` once: structured answers go through the answer tool
    /// from then on.
    native_refused: Arc<std::sync::atomic::AtomicBool>,
    /// An output limit was lowered to what the key's limits admit (said once).
    output_lowered: Arc<std::sync::atomic::AtomicBool>,
    /// Held by the request in flight until the provider's first answer: one at a time.
    first: Arc<tokio::sync::Mutex<()>>,
    /// The provider's model list, asked while the first request is in flight: see
    /// [`Opening`].
    opening: Arc<Opening>,
    health: Arc<std::sync::Mutex<Health>>,
    /// The requests in flight and their limit once the provider rate-limits.
    pace: Arc<super::pace::Pace>,
    /// Whether the server's chat template says it has no tool support (asked once).
    drops_tools: Arc<tokio::sync::OnceCell<bool>>,
    /// The provider's rate limits and what this run charged them (shared by the clients of
    /// every service tier of one provider).
    admission: Arc<super::admission::Admission>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Builds the client (and its connection pool) for one provider.
    pub(crate) fn new(endpoint: ProviderEndpoint) -> Result<Self, ProviderError> {
        install_crypto_provider();
        let base = normalized_base(&endpoint)?;
        let (chat_url, models_url) = match endpoint.kind {
            ProviderKind::OpenAi => (
                format!("{base}{}", openai::CHAT_PATH),
                format!("{base}{}", openai::MODELS_PATH),
            ),
            ProviderKind::Anthropic => (
                format!("{base}{}", anthropic::MESSAGES_PATH),
                format!("{base}{}?limit=1000", anthropic::MODELS_PATH),
            ),
        };
        let chat_url = reqwest::Url::parse(&chat_url).map_err(|err| ProviderError::Other {
            status: None,
            message: format!(
                "invalid base URL `{base}` for provider `{}`: {err}",
                endpoint.name
            ),
        })?;
        let origin = chat_url.clone();
        let home = origin.origin();
        let http = http_builder(&endpoint, chat_url.scheme() == "http")
            .default_headers(default_headers(&endpoint)?)
            // A redirect to another origin is not followed with the credentials: the answer
            // comes back as it is and `send_bytes` follows it without them.
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.url().origin() != home {
                    attempt.stop()
                } else if attempt.previous().len() > 10 {
                    attempt.error("too many redirects")
                } else {
                    attempt.follow()
                }
            }))
            .build()
            .map_err(|err| setup_error(&endpoint, err))?;
        let endpoint_format = endpoint.structured_output;
        let endpoint_kind = endpoint.kind;
        Ok(Self {
            endpoint: Arc::new(endpoint),
            http,
            plain: Arc::default(),
            origin,
            base,
            chat_url,
            models_url,
            format_level: Arc::new(std::sync::atomic::AtomicU8::new(match endpoint_format {
                OpenAiFormat::JsonSchema => 0,
                OpenAiFormat::JsonObject => 1,
                OpenAiFormat::None => 2,
            })),
            notice: Arc::default(),
            answered: Arc::default(),
            startup_said: Arc::default(),
            completion_tokens: Arc::default(),
            native_refused: Arc::default(),
            output_lowered: Arc::default(),
            first: Arc::default(),
            opening: Arc::default(),
            health: Arc::default(),
            pace: Arc::default(),
            drops_tools: Arc::default(),
            admission: Arc::new(super::admission::Admission::new(
                endpoint_kind,
                super::admission::RateLimits::default(),
            )),
        })
    }

    /// The client with configured rate limits (they apply with what the provider's headers
    /// say; the smaller wins).
    pub(crate) fn with_limits(mut self, limits: super::admission::RateLimits) -> Self {
        self.admission = Arc::new(super::admission::Admission::new(self.endpoint.kind, limits));
        self
    }

    /// The client sharing `other`'s admission: the rate limits are the provider's, whatever
    /// the service tier.
    pub(crate) fn sharing_limits_of(mut self, other: &Client) -> Self {
        self.admission = Arc::clone(&other.admission);
        self
    }

    /// When requests to this provider may go.
    pub(crate) fn admission(&self) -> &super::admission::Admission {
        &self.admission
    }

    /// Whether the server drops the tools of a request: llama.cpp's server says, at
    /// `GET /props`, that its chat template has no tool support (`chat_template_caps`'
    /// `supports_tools: false`), and then answers as if none were sent. Asked once per
    /// client, only of an OpenAI-compatible server over plain HTTP (a local one); any other
    /// answer, or none within 2 s, is taken for no.
    pub(crate) async fn drops_tools(&self) -> bool {
        *self
            .drops_tools
            .get_or_init(|| async {
                if self.endpoint.kind != ProviderKind::OpenAi || self.origin.scheme() != "http" {
                    return false;
                }
                let mut url = self.origin.clone();
                url.set_path("/props");
                url.set_query(None);
                let key = url.to_string();
                let request = self.http.get(url).timeout(Duration::from_secs(2));
                // Shared with the context-window lookup: one `/props` per server.
                let props = super::window::props(request, &key)
                    .await
                    .unwrap_or_default();
                props["chat_template_caps"]["supports_tools"] == Value::Bool(false)
            })
            .await
    }

    /// Why the provider is sent no more requests, once it is so.
    pub(crate) fn stop(&self) -> Option<ProviderStop> {
        self.health.lock().ok().and_then(|h| h.stop.clone())
    }

    /// The error of a request not sent because the provider is stopped.
    fn not_sent(&self) -> Option<ProviderError> {
        self.stop().map(|stop| ProviderError::NotSent {
            message: stop.describe(&self.endpoint.name),
        })
    }

    fn unreachable_since(&self) -> Option<Instant> {
        self.health.lock().ok().and_then(|h| h.unreachable_since)
    }

    /// Whether requests go through the gate one at a time: until the provider's first answer,
    /// while it is starting, and while it cannot be reached.
    fn gated(&self) -> bool {
        !self.has_answered()
            || self
                .health
                .lock()
                .is_ok_and(|h| h.unreachable_since.is_some() || h.starting_since.is_some())
    }

    /// How long a task should wait before trying a starting provider again (until the gate's
    /// next try), or `None` once it has been waited for `budget` since its first failed try.
    pub(crate) fn startup_pause(&self, budget: Duration) -> Option<Duration> {
        let health = self.health.lock().ok()?;
        let since = health.starting_since?;
        if since.elapsed() >= budget {
            return None;
        }
        let left = budget - since.elapsed();
        let until = health.next_try.map_or(Duration::ZERO, |at| {
            at.saturating_duration_since(Instant::now())
        });
        Some(until.min(left))
    }

    /// After `err`, a failed connection to a provider that answered before: how much is left
    /// of `window` before it is taken for dead (`None` for any other error).
    pub(crate) fn unreachable_left(
        &self,
        err: &ProviderError,
        window: Duration,
    ) -> Option<Duration> {
        if !err.is_connect() || !self.has_answered() {
            return None;
        }
        let left = window.saturating_sub(self.unreachable_since()?.elapsed());
        (!left.is_zero()).then_some(left)
    }

    /// Stops the provider, which could not be reached for `window` (`err` the last failed
    /// connection).
    pub(crate) fn stop_unreachable(&self, err: &ProviderError, window: Duration) {
        if let Ok(mut health) = self.health.lock() {
            health
                .stop
                .get_or_insert_with(|| ProviderStop::Unreachable {
                    window,
                    error: err.to_string(),
                });
        }
    }

    /// Stops the provider, which has never answered: nothing listens at its URL, or it
    /// speaks plain HTTP to an `https://` URL (`err`).
    pub(crate) fn stop_no_server(&self, err: &ProviderError) {
        if let Ok(mut health) = self.health.lock() {
            health.stop.get_or_insert_with(|| ProviderStop::NoServer {
                error: err.to_string(),
            });
        }
    }

    /// After a request failed to connect: when every request has failed so for `window`
    /// (and the provider had answered before), the provider is stopped; answers the error to
    /// return then.
    pub(crate) fn note_unreachable(
        &self,
        err: &ProviderError,
        window: Duration,
    ) -> Option<ProviderError> {
        if !err.is_connect() || !self.has_answered() {
            return None;
        }
        {
            let mut health = self.health.lock().ok()?;
            let since = *health.unreachable_since.get_or_insert_with(Instant::now);
            if health.stop.is_none() && since.elapsed() >= window {
                health.stop = Some(ProviderStop::Unreachable {
                    window,
                    error: err.to_string(),
                });
            }
        }
        self.not_sent()
    }

    /// After a 429: when every answer has been one for `window`, the provider is stopped;
    /// answers the error to return then.
    pub(crate) fn note_rate_limited(
        &self,
        err: &ProviderError,
        window: Duration,
    ) -> Option<ProviderError> {
        if !matches!(err, ProviderError::RateLimited { .. }) {
            return None;
        }
        {
            let mut health = self.health.lock().ok()?;
            let since = health.limited_since?;
            if health.stop.is_none() && since.elapsed() >= window {
                health.stop = Some(ProviderStop::RateLimited {
                    window,
                    error: err.to_string(),
                });
            }
        }
        self.not_sent()
    }

    /// The provider answered (`err`: with an error): a 503 "loading" keeps it starting, a 429
    /// keeps the clock of 429s running and paces the requests, anything else ends every wait.
    fn note_answer(&self, err: Option<&ProviderError>) {
        self.answered
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut health) = self.health.lock() {
            let limited = health.limited_since;
            match err {
                Some(err) if err.is_loading() => {
                    health.unreachable_since = None;
                    health.starting_failed(Instant::now());
                }
                Some(ProviderError::RateLimited { .. }) => {
                    health.answered();
                    health.limited_since = Some(limited.unwrap_or_else(Instant::now));
                }
                _ => health.answered(),
            }
        }
        match err {
            Some(ProviderError::RateLimited { retry_after, .. }) => {
                self.pace.rate_limited(*retry_after);
            }
            None => self.pace.succeeded(),
            Some(_) => {}
        }
    }

    /// Whether the provider has given any HTTP answer yet.
    pub(crate) fn has_answered(&self) -> bool {
        self.answered.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// True the first time it is asked: the wait for a starting provider is said once.
    pub(crate) fn first_startup_wait(&self) -> bool {
        !self
            .startup_said
            .swap(true, std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn endpoint(&self) -> &ProviderEndpoint {
        &self.endpoint
    }

    /// Sends one chat request (no retries). A server that refuses `response_format` (HTTP 400
    /// naming it) is asked again with the next simpler form, `json_object` and then none, and
    /// so is every later request to it; [`Client::take_notice`] says so once. One that refuses
    /// `max_tokens` for `max_completion_tokens` (OpenAI's reasoning models) is sent that name
    /// from then on.
    #[cfg(test)]
    pub(crate) async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, ProviderError> {
        let ticket = self.reserve(req);
        if let Some((wait, _)) = &ticket.wait {
            tokio::time::sleep(*wait).await;
        }
        self.chat_reserved(req, &ticket).await
    }

    /// `req` with an output limit the key can admit: one above the key's whole minute of
    /// output (Anthropic's output tokens per minute, OpenAI's tokens per minute less the
    /// input) would be refused however long it waited, so it is lowered to that, and said
    /// once.
    pub(crate) fn fitted<'a>(&self, req: &'a ChatRequest) -> std::borrow::Cow<'a, ChatRequest> {
        let wanted = self.endpoint.kind.output_limit(req.max_tokens);
        match (wanted, self.admission.output_room(req)) {
            (Some(wanted), Some(room)) if wanted > room => {
                if !self
                    .output_lowered
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                    && let Ok(mut notice) = self.notice.lock()
                {
                    *notice = Some(format!(
                        "provider `{}`: output limit lowered from {wanted} to {room} tokens: \
                         the key's rate limits admit no more in one request",
                        self.endpoint.name
                    ));
                }
                let mut req = req.clone();
                req.max_tokens = Some(room);
                std::borrow::Cow::Owned(req)
            }
            _ => std::borrow::Cow::Borrowed(req),
        }
    }

    /// Charges `req` to the provider's limits ([`super::admission::Admission::reserve`]): the
    /// ticket says how long to wait before [`Client::chat_reserved`] sends it.
    pub(crate) fn reserve(&self, req: &ChatRequest) -> super::admission::Ticket {
        let limit = self.endpoint.kind.output_limit(req.max_tokens);
        self.admission.reserve(self.admission.cost(req, limit))
    }

    /// [`Client::chat`] of a request already reserved and waited for: the answer settles the
    /// reservation, a refusal gives it back.
    pub(crate) async fn chat_reserved(
        &self,
        req: &ChatRequest,
        ticket: &super::admission::Ticket,
    ) -> Result<ChatResponse, ProviderError> {
        let result = self.chat_tiers(req, ticket).await;
        match &result {
            Ok(response) => self.admission.settle(ticket, &response.usage),
            Err(err) => {
                if let ProviderError::RateLimited {
                    message,
                    retry_after,
                } = err
                {
                    self.admission.rate_limited(message, *retry_after);
                }
                self.admission.cancel(ticket);
            }
        }
        result
    }

    async fn chat_tiers(
        &self,
        req: &ChatRequest,
        ticket: &super::admission::Ticket,
    ) -> Result<ChatResponse, ProviderError> {
        let mut tier = self.endpoint.service_tier;
        loop {
            let level = self.format_level();
            let native = !self
                .native_refused
                .load(std::sync::atomic::Ordering::Relaxed);
            let completion = self
                .completion_tokens
                .load(std::sync::atomic::Ordering::Relaxed);
            match self
                .chat_as(req, level, completion, native, tier, ticket)
                .await
            {
                // Flex capacity is short ("resource unavailable"): with `flex_fallback:
                // standard` the request goes at once at the standard tier (and is priced so,
                // by the tier the answer says served it).
                Err(ProviderError::RateLimited { .. })
                    if tier == Some("flex") && self.endpoint.flex_fallback =>
                {
                    tier = None;
                    if let Ok(mut notice) = self.notice.lock() {
                        *notice = Some(format!(
                            "provider `{}` has no flex capacity now (429); sent at the standard \
                             tier (flex_fallback: standard)",
                            self.endpoint.name
                        ));
                    }
                }
                Err(ProviderError::BadRequest {
                    status: 400,
                    message,
                }) if req.response_format.is_some()
                    && self.endpoint.kind == ProviderKind::OpenAi
                    && level != OpenAiFormat::None
                    && refuses_response_format(&message) =>
                {
                    self.step_down(level, &message);
                }
                // Anthropic refusing `output_config` (a model or schema it cannot take): the
                // answer tool from now on.
                Err(ProviderError::BadRequest {
                    status: 400,
                    message,
                }) if self.endpoint.kind == ProviderKind::Anthropic
                    && native
                    && req
                        .response_format
                        .as_ref()
                        .is_some_and(|f| f.anthropic_native())
                    && (message.contains("output_config") || message.contains("schema")) =>
                {
                    let first = !self
                        .native_refused
                        .swap(true, std::sync::atomic::Ordering::Relaxed);
                    if first && let Ok(mut notice) = self.notice.lock() {
                        *notice = Some(format!(
                            "provider `{}` refused the structured-output request ({message}); sending an answer tool from now on",
                            self.endpoint.name
                        ));
                    }
                }
                Err(ProviderError::BadRequest {
                    status: 400,
                    message,
                }) if req.max_tokens.is_some()
                    && self.endpoint.kind == ProviderKind::OpenAi
                    && !completion
                    && message.contains("max_completion_tokens") =>
                {
                    self.completion_tokens
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
                other => return other,
            }
        }
    }

    /// A warning about this provider for the run to show, once.
    pub(crate) fn take_notice(&self) -> Option<String> {
        self.notice.lock().ok()?.take()
    }

    fn format_level(&self) -> OpenAiFormat {
        match self.format_level.load(std::sync::atomic::Ordering::Relaxed) {
            0 => OpenAiFormat::JsonSchema,
            1 => OpenAiFormat::JsonObject,
            _ => OpenAiFormat::None,
        }
    }

    /// Steps `format_level` down from `seen` (once, whoever else saw the same refusal).
    fn step_down(&self, seen: OpenAiFormat, message: &str) {
        let (from, to, next) = match seen {
            OpenAiFormat::JsonSchema => (0, 1, "`json_object`"),
            _ => (
                1,
                2,
                "no `response_format` (the prompt and lenient extraction only)",
            ),
        };
        let stepped = self
            .format_level
            .compare_exchange(
                from,
                to,
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
            )
            .is_ok();
        if stepped && let Ok(mut notice) = self.notice.lock() {
            *notice = Some(format!(
                "provider `{}` refused the structured-output request ({message}); sending {next} from now on",
                self.endpoint.name
            ));
        }
    }

    async fn chat_as(
        &self,
        req: &ChatRequest,
        format: OpenAiFormat,
        completion: bool,
        native: bool,
        tier: Option<&str>,
        ticket: &super::admission::Ticket,
    ) -> Result<ChatResponse, ProviderError> {
        let req = &*super::structured::prompted(
            req,
            self.endpoint.kind,
            format,
            native,
            self.endpoint.is_local(),
        );
        let body = match self.endpoint.kind {
            ProviderKind::OpenAi => openai::request_bytes_tier(req, format, completion, tier),
            ProviderKind::Anthropic => {
                serde_json::to_vec(&anthropic::request_body_as(req, native)).unwrap_or_default()
            }
        };
        let request = self
            .http
            .post(self.chat_url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        let body = self.send_bytes(request, Some(ticket)).await?;
        if self.endpoint.kind == ProviderKind::OpenAi
            && let Some(response) = openai::parse_response_fast(&body)
        {
            return Ok(response);
        }
        let response = self.parse_json(&body)?;
        let mut response = match self.endpoint.kind {
            ProviderKind::OpenAi => openai::parse_response(&response),
            ProviderKind::Anthropic => anthropic::parse_response(&response),
        }?;
        if req.response_format.is_some() {
            take_answer_tool(&mut response);
        }
        Ok(response)
    }

    /// The ids of the models the provider offers.
    pub(crate) async fn list_models(&self) -> Result<Vec<String>, ProviderError> {
        let response = self.send(self.http.get(&self.models_url)).await?;
        Ok(openai::parse_models(&response))
    }

    /// The shared connection pool (with the provider's credentials as default headers).
    pub(super) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The connection pool for `url`: with credentials on the provider's origin, without
    /// them anywhere else.
    pub(super) fn http_for(&self, url: &str) -> &reqwest::Client {
        match reqwest::Url::parse(url) {
            Ok(parsed) if parsed.origin() == self.origin.origin() => &self.http,
            _ => self.plain(),
        }
    }

    fn plain(&self) -> &reqwest::Client {
        self.plain.get_or_init(|| {
            let endpoint = &self.endpoint;
            http_builder(endpoint, false)
                .build()
                .unwrap_or_else(|_| reqwest::Client::new())
        })
    }

    /// The base URL without a trailing `/` (OpenAI-compatible: with `/v1`; Anthropic: without).
    pub(super) fn base_url(&self) -> &str {
        &self.base
    }

    /// Sends one request and parses the JSON answer; every failure is classified.
    pub(super) async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<Value, ProviderError> {
        let body = self.send_bytes(request, None).await?;
        self.parse_json(&body)
    }

    /// A successful answer's body as JSON; one that is not JSON is classified.
    fn parse_json(&self, body: &[u8]) -> Result<Value, ProviderError> {
        let key = self.endpoint.api_key.as_ref();
        serde_json::from_slice(body).map_err(|err| {
            ProviderError::network(
                super::error::NetworkKind::InvalidResponse,
                format!(
                    "the response of provider `{}` is not valid JSON ({err}); it may have been cut off",
                    self.endpoint.name,
                ),
                key,
            )
        })
    }

    /// For a task waiting at the gate of a provider that has not answered yet (the first request
    /// is in flight): asks the provider's model list, once per provider, and returns once it
    /// was given (by this task or another). Never returns while the provider is starting or
    /// cannot be reached, nor when the list was refused or could not be had: the first
    /// answer opens the gate then.
    async fn open_early(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let waiting = !self.has_answered()
            && self
                .health
                .lock()
                .is_ok_and(|h| h.starting_since.is_none() && h.unreachable_since.is_none());
        if !waiting {
            return std::future::pending().await;
        }
        if !self.opening.asked.swap(true, Relaxed) && self.models_given().await {
            self.opening.open.send_replace(true);
            return;
        }
        let mut open = self.opening.open.subscribe();
        if open.wait_for(|open| *open).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Whether the provider lists its models to these credentials (a 2xx answer); notes it
    /// as the provider's first answer then.
    async fn models_given(&self) -> bool {
        let Ok(response) = self.http.get(&self.models_url).send().await else {
            return false;
        };
        if !response.status().is_success() || response.bytes().await.is_err() {
            return false;
        }
        self.note_answer(None);
        true
    }

    /// Sends one request and returns the raw body of a successful answer.
    /// `ticket`: the request's reservation, brought to what the answer's rate-limit headers
    /// say.
    pub(super) async fn send_bytes(
        &self,
        request: reqwest::RequestBuilder,
        ticket: Option<&super::admission::Ticket>,
    ) -> Result<Vec<u8>, ProviderError> {
        self.send_bytes_within(request, ticket, max_response_bytes())
            .await
    }

    /// [`Self::send_bytes`] with `max` bytes as the largest body read (a batch's results
    /// file holds the answers of thousands of requests).
    pub(super) async fn send_bytes_within(
        &self,
        request: reqwest::RequestBuilder,
        ticket: Option<&super::admission::Ticket>,
        max: u64,
    ) -> Result<Vec<u8>, ProviderError> {
        let key = self.endpoint.api_key.as_ref();
        // One request at a time until the provider has answered once, while it is starting and
        // while it cannot be reached; each goes no earlier than the pause after the last
        // failed try.
        let _gate = loop {
            if !self.gated() {
                break None;
            }
            let held = tokio::select! {
                biased;
                held = self.first.lock() => held,
                // The model list was given while the first request was in flight.
                () = self.open_early() => continue,
            };
            // Those that waited for the first answer go together once it came.
            if !self.gated() {
                break None;
            }
            let next = self.health.lock().ok().and_then(|h| h.next_try);
            if let Some(at) = next {
                tokio::time::sleep_until(at.into()).await;
            }
            break Some(held);
        };
        if let Some(err) = self.not_sent() {
            return Err(err);
        }
        let _in_flight = self.pace.admit().await;
        // Stopped while it waited (another task's answer stopped the provider).
        if let Some(err) = self.not_sent() {
            return Err(err);
        }
        if let Some(ticket) = ticket {
            self.admission.mark_sent(ticket);
        }
        let sent = request.send().await;
        let mut response = match sent {
            Ok(response) => response,
            Err(e) => {
                let err = ProviderError::from_transport(e, key);
                if err.is_connect()
                    && let Ok(mut health) = self.health.lock()
                {
                    let now = Instant::now();
                    if self.has_answered() {
                        // While it cannot be reached, the provider is tried at most once a
                        // second, whatever the number of tasks waiting for it.
                        health.unreachable_since.get_or_insert(now);
                        health.next_try = Some(now + PROBE_PACE);
                    } else {
                        health.starting_failed(now);
                    }
                }
                return Err(err);
            }
        };
        if let Some(next) = redirect_elsewhere(&response) {
            // Another origin: followed, but without the provider's credentials.
            response = self
                .plain()
                .get(next)
                .send()
                .await
                .map_err(|e| ProviderError::from_transport(e, key))?;
        }
        let status = response.status();
        if let Some(ticket) = ticket {
            self.admission
                .observe(response.headers(), ticket, status.as_u16() != 429);
        }
        let url = response.url().clone();
        let first = !self
            .opening
            .replied
            .swap(true, std::sync::atomic::Ordering::Relaxed);
        let error_headers = (!status.is_success()).then(|| response.headers().clone());
        let body = read_bounded(&mut response, &self.endpoint.name, max, key).await;
        let body = match body {
            Ok(body) => body,
            Err(err) => {
                self.note_answer(Some(&err));
                return Err(err);
            }
        };
        if let Some(headers) = error_headers {
            let ctx = ErrorContext {
                api_key: key,
                api_key_env: self.endpoint.api_key_env.as_deref(),
            };
            let err = classify(
                status.as_u16(),
                &headers,
                &String::from_utf8_lossy(&body),
                &ctx,
            );
            let err = self.not_found_here(err, &url);
            self.note_answer(Some(&err));
            if first
                && matches!(err, ProviderError::Auth { .. })
                && let Ok(mut health) = self.health.lock()
            {
                health
                    .stop
                    .get_or_insert(ProviderStop::Refused(err.clone()));
            }
            return Err(err);
        }
        self.note_answer(None);
        Ok(body)
    }
}

/// The variable that sets the largest answer summon reads from a provider, in MiB.
pub(crate) const MAX_RESPONSE_VAR: &str = "SUMMON_MAX_RESPONSE_MB";
/// Its default: far above any model's answer, far below what would exhaust memory.
const DEFAULT_MAX_RESPONSE_MB: u64 = 64;

/// The largest answer body summon reads, in bytes (`SUMMON_MAX_RESPONSE_MB`, else 64 MiB; a
/// value that is not a positive whole number is refused before any request, by
/// [`super::retry::RetryPolicy::from_env`]).
pub(super) fn max_response_bytes() -> u64 {
    static MAX: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        max_response_mb(std::env::var(MAX_RESPONSE_VAR).ok().as_deref()).saturating_mul(1024 * 1024)
    })
}

/// The limit `value` of `SUMMON_MAX_RESPONSE_MB` sets, in MiB.
pub(crate) fn max_response_mb(value: Option<&str>) -> u64 {
    value
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|mb| *mb > 0)
        .unwrap_or(DEFAULT_MAX_RESPONSE_MB)
}

/// The response's body, read a chunk at a time and refused once it passes `max` bytes (by its
/// `Content-Length`, before reading, or as it comes): an answer of hundreds of megabytes
/// fails the request, naming the provider and the limit, instead of taking summon's memory.
/// The refusal is not retried (the same request would bring the same answer).
async fn read_bounded(
    response: &mut reqwest::Response,
    provider: &str,
    max: u64,
    key: Option<&crate::provider::Secret>,
) -> Result<Vec<u8>, ProviderError> {
    let status = response.status().as_u16();
    let too_large = || ProviderError::Other {
        status: Some(status),
        message: format!(
            "the answer of provider `{provider}` is larger than {} MiB, the most summon reads \
             ({MAX_RESPONSE_VAR} sets it); nothing of it was used",
            max / (1024 * 1024)
        ),
    };
    if response.content_length().is_some_and(|length| length > max) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| ProviderError::from_transport(e, key))?
    {
        if (body.len() + chunk.len()) as u64 > max {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

impl Client {
    /// A 404 that is not about a model (`model ... not found`) means the base URL leads
    /// nowhere: the error names the URL and, for an OpenAI-compatible base URL without
    /// `/v1`, suggests it.
    fn not_found_here(&self, err: ProviderError, url: &reqwest::Url) -> ProviderError {
        let ProviderError::BadRequest {
            status: 404,
            message,
        } = err
        else {
            return err;
        };
        if message.to_lowercase().contains("model") {
            return ProviderError::BadRequest {
                status: 404,
                message,
            };
        }
        let mut shown = url.clone();
        let _ = shown.set_password(None);
        let _ = shown.set_username("");
        let base = self.base_url();
        let hint = if self.endpoint.kind == ProviderKind::OpenAi && !base.ends_with("/v1") {
            format!(
                "; is the base URL right? OpenAI-compatible servers answer under `/v1`: try {base}/v1"
            )
        } else {
            format!("; is the base URL ({base}) right?")
        };
        let message = if message.is_empty() {
            "not found".to_owned()
        } else {
            message
        };
        ProviderError::BadRequest {
            status: 404,
            message: format!("{message} at {shown}{hint}"),
        }
    }
}

/// The base URL without a trailing `/` (and, for Anthropic, without a mistaken `/v1`).
fn normalized_base(endpoint: &ProviderEndpoint) -> Result<String, ProviderError> {
    let trimmed = endpoint.base_url.trim().trim_end_matches('/');
    let base = match endpoint.kind {
        ProviderKind::OpenAi => trimmed,
        ProviderKind::Anthropic => trimmed.strip_suffix("/v1").unwrap_or(trimmed),
    };
    let invalid = |why: String| ProviderError::Other {
        status: None,
        message: format!(
            "invalid base URL `{}` for provider `{}`: {why}",
            base, endpoint.name
        ),
    };
    let url = reqwest::Url::parse(base).map_err(|err| invalid(err.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("it must start with http:// or https://".to_owned()));
    }
    Ok(base.to_owned())
}

/// What every connection pool of a provider shares: timeouts, user agent, no retries of
/// its own (summon retries by its `RetryPolicy`; reqwest's retry of protocol NACKs would also
/// copy every request's headers in case it retries).
fn http_builder(endpoint: &ProviderEndpoint, plain_http: bool) -> reqwest::ClientBuilder {
    let mut http = reqwest::Client::builder();
    if plain_http {
        // Plain HTTP (a local server): no need to load the system's certificates.
        http = http.tls_certs_only(Vec::new());
    }
    http.user_agent(concat!("summon/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(endpoint.connect_timeout)
        .timeout(endpoint.request_timeout)
        .pool_max_idle_per_host(1024)
        .tcp_nodelay(true)
        .retry(reqwest::retry::never().max_retries_per_request(0))
}

fn setup_error(endpoint: &ProviderEndpoint, err: reqwest::Error) -> ProviderError {
    ProviderError::Other {
        status: None,
        message: format!(
            "cannot set up the HTTP client for provider `{}`: {err}",
            endpoint.name
        ),
    }
}

/// The target of a redirect the credentialed client did not follow (one to another origin),
/// for a `GET` to follow without credentials.
fn redirect_elsewhere(response: &reqwest::Response) -> Option<reqwest::Url> {
    if !response.status().is_redirection() {
        return None;
    }
    let location = response
        .headers()
        .get(reqwest::header::LOCATION)?
        .to_str()
        .ok()?;
    let next = response.url().join(location).ok()?;
    (next.origin() != response.url().origin()).then_some(next)
}

fn default_headers(endpoint: &ProviderEndpoint) -> Result<HeaderMap, ProviderError> {
    let mut headers = HeaderMap::new();
    let secret_header = |value: String| {
        let mut value = HeaderValue::from_str(&value).map_err(|_| ProviderError::Other {
            status: None,
            message: format!(
                "the API key {} contains characters that cannot be sent in an HTTP header",
                endpoint.api_key_env.as_deref().map_or_else(
                    || format!("of provider `{}`", endpoint.name),
                    |v| format!("in `{v}`")
                )
            ),
        })?;
        value.set_sensitive(true);
        Ok::<_, ProviderError>(value)
    };
    let key = endpoint
        .api_key
        .as_ref()
        .map(|k| k.expose().trim())
        .filter(|k| !k.is_empty());
    match endpoint.kind {
        ProviderKind::OpenAi => {
            if let Some(key) = key {
                headers.insert(AUTHORIZATION, secret_header(format!("Bearer {key}"))?);
            }
        }
        ProviderKind::Anthropic => {
            if let Some(key) = key {
                headers.insert(
                    HeaderName::from_static("x-api-key"),
                    secret_header(key.to_owned())?,
                );
            }
            headers.insert(
                HeaderName::from_static("anthropic-version"),
                HeaderValue::from_static(anthropic::API_VERSION),
            );
        }
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::message::{Message, ToolSpec};
    use crate::provider::retry::{RetryPolicy, send_with_retry};
    use serde_json::json;
    use std::time::Instant;
    use summon_mock_llm::{Api, MockConfig, MockServer, Reply};

    const KEY: &str = "sk-test-abcdefghijklmnop0123";

    fn endpoint(kind: ProviderKind, server: &MockServer) -> ProviderEndpoint {
        let (url, env) = match kind {
            ProviderKind::OpenAi => (server.url_openai(), "OPENAI_API_KEY"),
            ProviderKind::Anthropic => (server.url_anthropic(), "ANTHROPIC_API_KEY"),
        };
        ProviderEndpoint::new("mock", kind, url).with_api_key(Secret::new(KEY), Some(env))
    }

    fn client(kind: ProviderKind, server: &MockServer) -> Client {
        Client::new(endpoint(kind, server)).expect("client")
    }

    fn fast_policy() -> RetryPolicy {
        RetryPolicy {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(5),
            max_retries: 5,
            max_total_wait: Duration::from_secs(10),
            startup_wait: Duration::from_millis(20),
            // A server said to be starting (`SUMMON_STARTUP_WAIT_MS` set).
            wait_for_server: true,
            ..RetryPolicy::default()
        }
    }

    fn tool_request() -> ChatRequest {
        ChatRequest {
            model: "mock-model".into(),
            system: "Be brief.".into(),
            messages: vec![Message::user("How many files are there?")],
            tools: vec![ToolSpec {
                name: "list_files".into(),
                description: "List the files of a directory".into(),
                parameters: json!({"type": "object", "properties": {"dir": {"type": "string"}}}),
            }]
            .into(),
            ..ChatRequest::default()
        }
    }

    fn error_body(kind: &str, message: &str) -> String {
        json!({"error": {"message": message, "type": kind, "code": kind}}).to_string()
    }

    /// Sends the tool request, answers the tool call, and returns the final text.
    async fn round_trip(client: &Client) -> String {
        let mut req = tool_request();
        let first = client.chat(&req).await.expect("first turn");
        assert_eq!(first.text, None);
        assert_eq!(first.tool_calls.len(), 1);
        let call = first.tool_calls[0].clone();
        assert_eq!(call.name, "list_files");
        assert_eq!(call.arguments, json!({"dir": "."}));
        assert!(first.usage.input_tokens > 0 && first.usage.output_tokens > 0);
        req.messages.push(Message::Assistant {
            text: None,
            tool_calls: vec![call.clone()],
        });
        req.messages.push(Message::ToolResult {
            call_id: call.id.clone(),
            name: call.name,
            content: "a.txt\nb.txt".into(),
            is_error: false,
        });
        let second = client.chat(&req).await.expect("second turn");
        assert!(second.tool_calls.is_empty());
        second.text.expect("final text")
    }

    #[tokio::test]
    async fn openai_tool_call_round_trip() {
        let server = MockServer::start(MockConfig::new().replies([
            Reply::tool_call("list_files", json!({"dir": "."})),
            Reply::text("2 files"),
        ]))
        .await;
        let client = client(ProviderKind::OpenAi, &server);
        assert_eq!(round_trip(&client).await, "2 files");

        let requests = server.requests();
        assert_eq!(requests.len(), 2);
        let first = &requests[0];
        assert_eq!(
            (first.api, first.path.as_str()),
            (Api::OpenAi, "/v1/chat/completions")
        );
        assert_eq!(
            first.header("authorization"),
            Some(format!("Bearer {KEY}").as_str())
        );
        assert_eq!(first.tool_names(), ["list_files"]);
        assert_eq!(
            first.body["tools"][0],
            json!({"type": "function", "function": {
                "name": "list_files",
                "description": "List the files of a directory",
                "parameters": {"type": "object", "properties": {"dir": {"type": "string"}}},
            }})
        );
        assert_eq!(
            first.body["messages"][0],
            json!({"role": "system", "content": "Be brief."})
        );
        let messages = requests[1].body["messages"]
            .as_array()
            .expect("messages")
            .clone();
        let call_id = messages[2]["tool_calls"][0]["id"]
            .as_str()
            .expect("call id")
            .to_owned();
        assert_eq!(
            messages[2]["tool_calls"][0]["function"]["arguments"],
            json!("{\"dir\":\".\"}")
        );
        assert_eq!(
            messages[3],
            json!({"role": "tool", "tool_call_id": call_id, "name": "list_files", "content": "a.txt\nb.txt"})
        );
    }

    #[tokio::test]
    async fn anthropic_tool_call_round_trip() {
        let server = MockServer::start(MockConfig::new().replies([
            Reply::tool_call("list_files", json!({"dir": "."})),
            Reply::text("2 files"),
        ]))
        .await;
        let client = client(ProviderKind::Anthropic, &server);
        assert_eq!(round_trip(&client).await, "2 files");

        let requests = server.requests();
        assert_eq!(requests.len(), 2);
        let first = &requests[0];
        assert_eq!(
            (first.api, first.path.as_str()),
            (Api::Anthropic, "/v1/messages")
        );
        assert_eq!(first.header("x-api-key"), Some(KEY));
        assert_eq!(first.header("anthropic-version"), Some("2023-06-01"));
        assert_eq!(first.header("authorization"), None);
        assert_eq!(first.body["system"], json!("Be brief."));
        assert_eq!(first.body["max_tokens"], json!(8192));
        assert_eq!(
            first.body["tools"],
            json!([{
                "name": "list_files",
                "description": "List the files of a directory",
                "input_schema": {"type": "object", "properties": {"dir": {"type": "string"}}},
            }])
        );
        let messages = requests[1].body["messages"]
            .as_array()
            .expect("messages")
            .clone();
        assert_eq!(messages.len(), 3);
        let call_id = messages[1]["content"][0]["id"]
            .as_str()
            .expect("tool_use id")
            .to_owned();
        assert_eq!(
            messages[2],
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call_id, "content": "a.txt\nb.txt"}
            ]})
        );
    }

    #[tokio::test]
    async fn rate_limit_waits_for_retry_after() {
        let server = MockServer::start(MockConfig::new().replies([
            Reply::status_with_headers(
                429,
                [("retry-after", "1")],
                error_body("rate_limit_exceeded", "slow down"),
            ),
            Reply::text("ok"),
        ]))
        .await;
        let client = client(ProviderKind::OpenAi, &server);
        let mut retries = Vec::new();
        let mut hook = |err: &ProviderError, attempt: u32, delay: Duration| {
            retries.push((err.code(), attempt, delay));
        };
        let start = Instant::now();
        let response = send_with_retry(&client, &tool_request(), &fast_policy(), &mut hook)
            .await
            .expect("retried");
        let elapsed = start.elapsed();
        assert_eq!(response.text.as_deref(), Some("ok"));
        assert!(
            elapsed >= Duration::from_secs(1),
            "retried after {elapsed:?}"
        );
        assert_eq!(server.request_count(), 2);
        assert_eq!(retries.len(), 1);
        assert_eq!((retries[0].0, retries[0].1), ("rate_limited", 1));
        assert!(retries[0].2 >= Duration::from_secs(1));
    }

    #[tokio::test]
    async fn auth_failure_is_not_retried_and_hides_the_key() {
        for kind in [ProviderKind::OpenAi, ProviderKind::Anthropic] {
            let body = error_body(
                "invalid_api_key",
                &format!("Incorrect API key provided: {KEY}"),
            );
            let server = MockServer::start(MockConfig::new().reply(Reply::status(401, body))).await;
            let client = client(kind, &server);
            let mut retried = false;
            let mut hook = |_: &ProviderError, _: u32, _: Duration| retried = true;
            let err = send_with_retry(&client, &tool_request(), &fast_policy(), &mut hook)
                .await
                .expect_err("401");
            assert!(!retried);
            assert_eq!(server.request_count(), 1, "{kind:?}");
            let env = match kind {
                ProviderKind::OpenAi => "OPENAI_API_KEY",
                ProviderKind::Anthropic => "ANTHROPIC_API_KEY",
            };
            let shown = err.to_string();
            assert!(
                matches!(err, ProviderError::Auth { status: 401, .. }),
                "{err:?}"
            );
            assert!(
                shown.contains(&format!("check the key in `{env}`")),
                "{shown}"
            );
            for text in [shown, format!("{err:?}"), format!("{client:?}")] {
                assert!(!text.contains("abcdefghijklmnop"), "key leaked: {text}");
            }
        }
    }

    #[tokio::test]
    async fn server_errors_are_retried_until_success() {
        let server = MockServer::start(MockConfig::new().replies([
            Reply::status(500, error_body("server_error", "boom")),
            Reply::status(503, ""),
            Reply::status(
                529,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            ),
            Reply::text("finally"),
        ]))
        .await;
        let client = client(ProviderKind::Anthropic, &server);
        let mut codes = Vec::new();
        let mut hook = |err: &ProviderError, _: u32, _: Duration| codes.push(err.code());
        let response = send_with_retry(&client, &tool_request(), &fast_policy(), &mut hook)
            .await
            .expect("success after retries");
        assert_eq!(response.text.as_deref(), Some("finally"));
        assert_eq!(server.request_count(), 4);
        assert_eq!(codes, ["overloaded"; 3]);
    }

    #[tokio::test]
    async fn retries_give_up_after_the_limit() {
        let server =
            MockServer::start(MockConfig::new().default_reply(Reply::status(502, "bad gateway")))
                .await;
        let client = client(ProviderKind::OpenAi, &server);
        let mut hook = |_: &ProviderError, _: u32, _: Duration| {};
        let err = send_with_retry(&client, &tool_request(), &fast_policy(), &mut hook)
            .await
            .expect_err("always 502");
        assert_eq!(err.code(), "overloaded");
        assert_eq!(server.request_count(), 6);
    }

    #[tokio::test]
    async fn quota_exhaustion_is_not_retried() {
        let body = error_body(
            "insufficient_quota",
            "You exceeded your current quota, please check your plan and billing details.",
        );
        let server = MockServer::start(MockConfig::new().reply(Reply::status(429, body))).await;
        let client = client(ProviderKind::OpenAi, &server);
        let mut hook = |_: &ProviderError, _: u32, _: Duration| {};
        let err = send_with_retry(&client, &tool_request(), &fast_policy(), &mut hook)
            .await
            .expect_err("quota");
        assert!(
            matches!(err, ProviderError::QuotaExhausted { .. }),
            "{err:?}"
        );
        assert_eq!(server.request_count(), 1);
    }

    #[tokio::test]
    async fn bad_requests_and_context_overflows_are_classified() {
        let server = MockServer::start(MockConfig::new().replies([
            Reply::status(
                400,
                error_body(
                    "context_length_exceeded",
                    "This model's maximum context length is 8192 tokens.",
                ),
            ),
            Reply::status(
                404,
                r#"{"error":"model \"nope\" not found, try pulling it first"}"#,
            ),
        ]))
        .await;
        let client = client(ProviderKind::OpenAi, &server);
        let err = client.chat(&tool_request()).await.expect_err("400");
        assert_eq!(err.code(), "context_too_long");
        let err = client.chat(&tool_request()).await.expect_err("404");
        assert_eq!(
            err.to_string(),
            "the provider rejected the request (HTTP 404): model \"nope\" not found, try pulling it first"
        );
    }

    #[tokio::test]
    async fn malformed_tool_arguments_reach_the_caller() {
        let server = MockServer::start(
            MockConfig::new().reply(Reply::tool_call("read_file", json!("{\"path\": oops"))),
        )
        .await;
        let response = client(ProviderKind::OpenAi, &server)
            .chat(&tool_request())
            .await
            .expect("parsed");
        assert_eq!(
            response.tool_calls[0].malformed_arguments(),
            Some("{\"path\": oops")
        );
        assert_eq!(response.stop_reason.as_deref(), Some("tool_calls"));
    }

    #[tokio::test]
    async fn invalid_json_on_success_is_a_network_error() {
        let server =
            MockServer::start(MockConfig::new().reply(Reply::status(200, "{\"choices\": ["))).await;
        let err = client(ProviderKind::OpenAi, &server)
            .chat(&tool_request())
            .await
            .expect_err("cut off");
        assert_eq!(err.code(), "network");
    }

    #[tokio::test]
    async fn without_a_key_no_credentials_are_sent() {
        let server = MockServer::start(MockConfig::new()).await;
        let endpoint = ProviderEndpoint::new("ollama", ProviderKind::OpenAi, server.url_openai());
        let client = Client::new(endpoint).expect("client");
        let response = client.chat(&tool_request()).await.expect("echo");
        assert_eq!(
            response.text.as_deref(),
            Some("echo: How many files are there?")
        );
        assert_eq!(server.requests()[0].header("authorization"), None);
    }

    #[tokio::test]
    async fn lists_models_on_both_apis() {
        let server = MockServer::start(MockConfig::new().models(["m-1", "m-2"])).await;
        for kind in [ProviderKind::OpenAi, ProviderKind::Anthropic] {
            let models = client(kind, &server).list_models().await.expect("models");
            assert_eq!(models, ["m-1", "m-2"]);
        }
        let requests = server.requests();
        assert!(
            requests
                .iter()
                .all(|r| r.api == Api::Models && r.method == "GET")
        );
        assert_eq!(requests[1].header("x-api-key"), Some(KEY));
    }

    fn refused_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    }

    fn down(port: u16) -> Client {
        let endpoint = ProviderEndpoint::new(
            "down",
            ProviderKind::OpenAi,
            format!("http://127.0.0.1:{port}/v1"),
        );
        Client::new(endpoint).expect("client")
    }

    #[tokio::test]
    async fn connection_refused_is_a_network_error_waited_out_then_the_provider_is_stopped() {
        let client = down(refused_port());
        let mut retries = 0;
        let mut hook = |_: &ProviderError, _: u32, _: Duration| retries += 1;
        let err = send_with_retry(&client, &tool_request(), &fast_policy(), &mut hook)
            .await
            .expect_err("refused");
        assert!(matches!(err, ProviderError::Network { .. }), "{err:?}");
        assert!(err.to_string().contains("cannot connect"), "{err}");
        // The start-up wait, not the retries, is what a provider never reached gets.
        assert_eq!(retries, 0);
        assert!(
            matches!(client.stop(), Some(ProviderStop::Unreachable { .. })),
            "{:?}",
            client.stop()
        );
        let again = client.chat(&tool_request()).await.expect_err("not sent");
        assert!(matches!(again, ProviderError::NotSent { .. }), "{again:?}");
    }

    #[tokio::test]
    async fn connection_refused_where_no_server_was_said_to_start_stops_the_provider_at_once() {
        let client = down(refused_port());
        let tries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let policy = RetryPolicy {
            wait_for_server: false,
            ..fast_policy()
        };
        let err = send_with_retry(
            &client,
            &tool_request(),
            &policy,
            &mut Tries(Arc::clone(&tries)),
        )
        .await
        .expect_err("refused");
        assert!(err.is_connect(), "{err:?}");
        assert!(err.to_string().contains("nothing answers there"), "{err}");
        // Not waited for as a server starting.
        assert_eq!(tries.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert!(
            matches!(client.stop(), Some(ProviderStop::NoServer { .. })),
            "{:?}",
            client.stop()
        );
        let again = client.chat(&tool_request()).await.expect_err("not sent");
        assert!(matches!(again, ProviderError::NotSent { .. }), "{again:?}");
    }

    /// Counts the failed tries of a starting provider a task saw.
    struct Tries(Arc<std::sync::atomic::AtomicUsize>);

    impl crate::provider::RetryHook for Tries {
        fn on_retry(&mut self, _: &ProviderError, _: u32, _: Duration) {}

        fn on_startup_wait(&mut self, _: &ProviderError, _: Duration, _: Duration, _: bool) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Two requests to a provider that has not answered yet, the second started while the
    /// first is in flight: when the chats arrived, and which model lists were asked.
    async fn two_first_requests(
        kind: ProviderKind,
        config: MockConfig,
    ) -> (Vec<Instant>, Vec<String>) {
        let server = MockServer::start(config.latency(Duration::from_millis(800))).await;
        let client = client(kind, &server);
        let send = |client: Client| async move {
            let req = ChatRequest {
                model: "mock-model".into(),
                messages: vec![Message::user("hi")],
                ..ChatRequest::default()
            };
            let _ = client.chat(&req).await;
        };
        let first = tokio::spawn(send(client.clone()));
        wait_until(|| server.in_flight() == 1).await;
        send(client.clone()).await;
        first.await.expect("join");
        let requests = server.requests();
        let chats = requests
            .iter()
            .filter(|r| r.api != summon_mock_llm::Api::Models)
            .map(|r| r.received_at)
            .collect();
        let lists = requests
            .iter()
            .filter(|r| r.api == summon_mock_llm::Api::Models)
            .map(|r| {
                let key = r.header("x-api-key").or(r.header("authorization"));
                format!("{} {}", r.path, key.unwrap_or("no key"))
            })
            .collect();
        (chats, lists)
    }

    async fn wait_until(done: impl Fn() -> bool) {
        for _ in 0..2000 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("never happened");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_model_list_given_meanwhile_lets_the_second_request_go_before_the_first_answer() {
        for kind in [ProviderKind::OpenAi, ProviderKind::Anthropic] {
            let (chats, lists) = two_first_requests(kind, MockConfig::new()).await;
            assert_eq!(chats.len(), 2, "{kind:?}");
            let gap = chats[1].duration_since(chats[0]);
            assert!(gap < Duration::from_millis(800), "{kind:?}: {gap:?}");
            let key = match kind {
                ProviderKind::OpenAi => format!("Bearer {KEY}"),
                ProviderKind::Anthropic => KEY.to_owned(),
            };
            assert_eq!(lists, [format!("/v1/models {key}")], "{kind:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_model_list_refused_keeps_the_second_request_waiting_for_the_first_answer() {
        // The key is refused on every path: the list does not open the gate, and the first
        // answer, a refusal too, stops the provider before the second request is sent.
        let config = MockConfig::new().api_key("another key");
        let (chats, lists) = two_first_requests(ProviderKind::OpenAi, config).await;
        assert_eq!(chats.len(), 1, "{chats:?}");
        assert_eq!(lists.len(), 1, "{lists:?}");
    }

    /// However many tasks wait for a provider that does not start, it is tried once per
    /// pause (10 ms doubling to 2 s), not once per task and pause.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_provider_never_reached_is_tried_once_per_pause_whatever_the_tasks() {
        let client = down(refused_port());
        let policy = RetryPolicy {
            startup_wait: Duration::from_millis(400),
            ..fast_policy()
        };
        let tries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (client, policy) = (client.clone(), policy.clone());
                let mut hook = Tries(Arc::clone(&tries));
                tokio::spawn(async move {
                    send_with_retry(&client, &tool_request(), &policy, &mut hook).await
                })
            })
            .collect();
        for task in tasks {
            let err = task.await.expect("task").expect_err("refused");
            assert!(
                err.is_connect() || matches!(err, ProviderError::NotSent { .. }),
                "{err:?}"
            );
        }
        // Tries at 0, 10, 30, 70, 150 and 310 ms, and the one that finds the wait spent
        // (before: each of the 64 tasks polled on its own).
        let tries = tries.load(std::sync::atomic::Ordering::Relaxed);
        assert!((4..=8).contains(&tries), "{tries} tries");
    }

    #[tokio::test]
    async fn slow_responses_time_out() {
        let server = MockServer::start(
            MockConfig::new().reply(Reply::text("late").delayed(Duration::from_secs(30))),
        )
        .await;
        let mut endpoint = endpoint(ProviderKind::OpenAi, &server);
        endpoint.request_timeout = Duration::from_millis(200);
        let err = Client::new(endpoint)
            .expect("client")
            .chat(&tool_request())
            .await
            .expect_err("timeout");
        assert!(err.is_transient());
        assert!(err.to_string().contains("timed out"), "{err}");
    }

    #[tokio::test]
    async fn concurrent_requests_share_one_client() {
        let server = MockServer::start(
            MockConfig::new()
                .record(false)
                .latency(Duration::from_millis(50))
                .rule(|req| {
                    Reply::text(format!("re: {}", req.last_user_text().unwrap_or_default()))
                }),
        )
        .await;
        let client = client(ProviderKind::OpenAi, &server);
        let tasks: Vec<_> = (0..40)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move {
                    let req = ChatRequest {
                        model: "m".into(),
                        messages: vec![Message::user(format!("task {i}"))],
                        ..ChatRequest::default()
                    };
                    (i, client.chat(&req).await)
                })
            })
            .collect();
        for task in tasks {
            let (i, result) = task.await.expect("join");
            assert_eq!(result.expect("reply").text, Some(format!("re: task {i}")));
        }
        // The 40 chat requests, and the model list one of them asked while the first request
        // was in flight (the others went once it was given).
        assert_eq!(server.request_count(), 41);
        assert!(server.peak_in_flight() > 1);
        assert!(server.requests().is_empty(), "recording is off");
    }

    #[test]
    fn base_urls_are_normalized_and_checked() {
        let anthropic = ProviderEndpoint::new(
            "a",
            ProviderKind::Anthropic,
            "https://api.anthropic.com/v1/",
        );
        assert_eq!(
            normalized_base(&anthropic).expect("ok"),
            "https://api.anthropic.com"
        );
        let openai = ProviderEndpoint::new("o", ProviderKind::OpenAi, "http://localhost:11434/v1/");
        assert_eq!(
            normalized_base(&openai).expect("ok"),
            "http://localhost:11434/v1"
        );
        let client = Client::new(anthropic).expect("client");
        assert_eq!(
            client.chat_url.as_str(),
            "https://api.anthropic.com/v1/messages"
        );
        let bad = ProviderEndpoint::new("x", ProviderKind::OpenAi, "localhost:1234");
        assert!(Client::new(bad).is_err());
        let bad = ProviderEndpoint::new("x", ProviderKind::OpenAi, "ftp://host/v1");
        assert!(
            Client::new(bad)
                .expect_err("scheme")
                .to_string()
                .contains("http://")
        );
        let bad_key = ProviderEndpoint::new("x", ProviderKind::OpenAi, "http://h/v1")
            .with_api_key(Secret::new("sk-abc\ndef"), Some("OPENAI_API_KEY"));
        let err = Client::new(bad_key).expect_err("bad key");
        assert!(err.to_string().contains("`OPENAI_API_KEY`") && !err.to_string().contains("abc"));
    }
}
