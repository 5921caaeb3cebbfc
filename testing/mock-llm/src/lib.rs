//! A scriptable mock of the OpenAI Chat Completions and Anthropic Messages APIs, for summon's
//! tests and benchmarks.
//!
//! [`MockServer::start`] binds `127.0.0.1:0` (never another address) and serves
//! `POST /v1/chat/completions`, `POST /v1/messages`, `GET /v1/models` and `GET /props` (a
//! model's context window, as llama.cpp says it). Each chat request is
//! answered by the next scripted [`Reply`] of the queue, else by the [`MockConfig::rule`], else by
//! the default reply ([`Reply::Echo`] unless configured). Requests are recorded for assertions
//! unless recording is switched off; the request counter and the in-flight peak always run. The
//! server does no per-request logging, so benchmarks can push many requests through it.
//!
//! The batch APIs of both providers (OpenAI Batch, Anthropic Message Batches) are served too;
//! see the `batch` module.
//!
//! Strict mode ([`MockConfig::strict`], on unless switched off) refuses with HTTP 400 what the
//! real APIs refuse (blank text blocks, unanswered tool calls, ...); see the `strict` module.
//! Replies can also end the way real answers end badly: cut off at the output limit, filtered,
//! empty, or with a tool call of a type other than `function` ([`Reply::finish`],
//! [`Reply::Empty`], [`Reply::CustomToolCall`]).
//!
//! Prompt caching ([`MockConfig::cache`], on unless switched off) follows the providers'
//! documented rules and reports cache tokens in `usage`; see the `cache` module.
//!
//! [`MockConfig::faults`] injects failures (429, 500/503, dropped connections, stalled and
//! truncated responses) into a share of chat requests; see the `faults` module.
//!
//! [`MockConfig::ration`] rations the server's one key by requests and tokens per minute, as
//! OpenAI and Anthropic do, with their rate-limit headers and 429s; see the `ration` module.

mod batch;
pub mod cache;
mod clock;
mod faults;
mod fence;
mod lean;
pub mod ration;
mod strict;
mod window;

pub use batch::{BatchConfig, BatchOutcome, BatchRecord};
pub use faults::{Fault, FaultPlan};
pub use fence::{FencePlan, FenceStats};
pub use lean::{LeanStats, serve_lean};
pub use ration::{Ledger, Ration, RationStats};
pub use window::prompt_tokens;

use std::collections::VecDeque;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::Response;
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Which API a request was addressed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`
    OpenAi,
    /// `POST /v1/messages`
    Anthropic,
    /// `GET /v1/models`
    Models,
    /// `GET /props` (llama.cpp's server properties)
    Props,
    /// The batch endpoints: `/v1/files`, `/v1/batches`, `/v1/messages/batches`, ...
    Batch,
    /// Anything else (answered with 404).
    Unknown,
}

/// One scripted answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// A plain text answer.
    Text(String),
    /// Tool calls, with optional text before them. Each call is `(name, arguments)`; arguments
    /// given as a JSON string are sent as that raw text (OpenAI), so malformed arguments can be
    /// scripted.
    ToolCalls {
        text: Option<String>,
        calls: Vec<(String, Value)>,
    },
    /// A raw HTTP response (errors such as 429, 401, 500, 529, or an odd 200 body).
    Status {
        code: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// The inner reply, after a delay.
    Delay(Duration, Box<Reply>),
    /// `echo: ` followed by the text of the last user message.
    Echo,
    /// The inner text or tool-call reply, with this `finish_reason` (OpenAI) or `stop_reason`
    /// (Anthropic) instead of the usual one, verbatim: `length`, `content_filter`,
    /// `max_tokens`, `refusal`, ...
    Finish(String, Box<Reply>),
    /// An answer with no text and no tool call (`content: null` / `content: []`).
    Empty,
    /// One OpenAI tool call of `type: "custom"` (free-text input, no `function` object). In
    /// the Anthropic format, which has no such calls, a `tool_use` block without a name.
    CustomToolCall { name: String, input: String },
}

impl Reply {
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text(text.into())
    }

    /// One tool call without text.
    pub fn tool_call(name: impl Into<String>, arguments: Value) -> Self {
        Self::ToolCalls {
            text: None,
            calls: vec![(name.into(), arguments)],
        }
    }

    /// Several tool calls without text.
    pub fn tool_calls<N: Into<String>>(calls: impl IntoIterator<Item = (N, Value)>) -> Self {
        Self::ToolCalls {
            text: None,
            calls: calls.into_iter().map(|(n, a)| (n.into(), a)).collect(),
        }
    }

    /// A raw response with a status code and body, no extra headers.
    pub fn status(code: u16, body: impl Into<String>) -> Self {
        Self::Status {
            code,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// A raw response with headers.
    pub fn status_with_headers<K: Into<String>, V: Into<String>>(
        code: u16,
        headers: impl IntoIterator<Item = (K, V)>,
        body: impl Into<String>,
    ) -> Self {
        Self::Status {
            code,
            headers: headers
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            body: body.into(),
        }
    }

    /// This reply after `delay`.
    pub fn delayed(self, delay: Duration) -> Self {
        Self::Delay(delay, Box::new(self))
    }

    /// This reply ending with `reason` as its finish (OpenAI) or stop (Anthropic) reason.
    pub fn finish(self, reason: impl Into<String>) -> Self {
        Self::Finish(reason.into(), Box::new(self))
    }

    /// One custom (non-function) tool call.
    pub fn custom_tool_call(name: impl Into<String>, input: impl Into<String>) -> Self {
        Self::CustomToolCall {
            name: name.into(),
            input: input.into(),
        }
    }
}

/// Answers a request from its content.
pub type Rule = Arc<dyn Fn(&RecordedRequest) -> Reply + Send + Sync>;

/// How the server behaves.
#[derive(Clone)]
pub struct MockConfig {
    /// Replies consumed in order, one per chat request.
    pub replies: Vec<Reply>,
    /// Answers chat requests once the queue is empty.
    pub rule: Option<Rule>,
    /// Answers chat requests when the queue is empty and there is no rule.
    pub default_reply: Reply,
    /// Added before every reply.
    pub latency: Duration,
    /// Measure the latency with the system clock on a timer thread instead of tokio's timer,
    /// which rounds it up to the next millisecond and more (for benchmarks; tests that pause
    /// tokio's clock need tokio's timer).
    pub exact_latency: bool,
    /// Keep every request for [`MockServer::requests`]; off for benchmarks.
    pub record: bool,
    /// The ids `GET /v1/models` lists.
    pub models: Vec<String>,
    /// How batches behave.
    pub batch: BatchConfig,
    /// Failures injected into chat requests.
    pub faults: Option<FaultPlan>,
    /// Refuse (HTTP 400, the provider's error body) chat requests the real API refuses; on by
    /// default. Refused requests are recorded and consume no scripted reply.
    pub strict: bool,
    /// `response_format` types (`json_schema`, `json_object`) refused with HTTP 400, as by a
    /// server that does not know them; none by default.
    pub refused_formats: Vec<String>,
    /// Context windows by model: a request whose prompt (and output limit) exceeds its model's
    /// is refused with HTTP 400 and the provider's message; see the `window` module.
    pub context_windows: Vec<(String, u64)>,
    /// Apply the providers' prompt caching rules and report cache tokens; on by default.
    pub cache: bool,
    /// How long a cache entry lives after its last use (default: 5 minutes).
    pub cache_ttl: Duration,
    /// How many `service_tier: flex` chat requests (OpenAI) are answered 429 "Resource
    /// Unavailable" before flex serves again, as OpenAI's flex does when capacity is short.
    /// Every OpenAI answer says the tier that served it (`service_tier`: the one asked for,
    /// `default` otherwise).
    pub flex_unavailable: u64,
    /// What `GET /props` answers, as llama.cpp's server does (its chat template's
    /// capabilities among it), with the window of a model given one. With neither (the
    /// default) it answers 404, as other servers do, and the request is counted by
    /// [`MockServer::props_count`] only, not recorded.
    pub props: Option<Value>,
    /// The key a request must carry (`Authorization: Bearer KEY` or `x-api-key: KEY`): any
    /// other chat or model-list request is answered 401 with the API's "invalid key" body, as
    /// a provider refusing the key answers on every path (recorded, consuming no scripted
    /// reply). `None` (the default): every key is taken.
    pub api_key: Option<String>,
    /// Per-minute limits of the server's key, at most one per API (none by default); see
    /// the `ration` module.
    pub rations: Vec<Ration>,
    /// An answer longer than the request's `max_tokens` (four characters a token) is cut
    /// there and ends with `length` / `max_tokens`, as the real APIs cut it. Off by default:
    /// the tests of very large answers script answers past any limit summon sends.
    pub cut_at_max_tokens: bool,
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            replies: Vec::new(),
            rule: None,
            default_reply: Reply::Echo,
            latency: Duration::ZERO,
            exact_latency: false,
            record: true,
            models: vec!["mock-model".to_owned()],
            batch: BatchConfig {
                polls: 1,
                ..BatchConfig::default()
            },
            faults: None,
            strict: true,
            refused_formats: Vec::new(),
            context_windows: Vec::new(),
            cache: true,
            cache_ttl: cache::DEFAULT_TTL,
            flex_unavailable: 0,
            props: None,
            api_key: None,
            rations: Vec::new(),
            cut_at_max_tokens: false,
        }
    }
}

impl fmt::Debug for MockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockConfig")
            .field("replies", &self.replies)
            .field("rule", &self.rule.as_ref().map(|_| "Fn"))
            .field("default_reply", &self.default_reply)
            .field("latency", &self.latency)
            .field("exact_latency", &self.exact_latency)
            .field("record", &self.record)
            .field("models", &self.models)
            .field("batch", &self.batch)
            .field("faults", &self.faults)
            .field("strict", &self.strict)
            .field("refused_formats", &self.refused_formats)
            .field("context_windows", &self.context_windows)
            .field("cache", &self.cache)
            .field("cache_ttl", &self.cache_ttl)
            .field("props", &self.props)
            .field("rations", &self.rations)
            .finish()
    }
}

impl MockConfig {
    /// `GET /props` answers `props` (llama.cpp's server properties).
    pub fn props(mut self, props: Value) -> Self {
        self.props = Some(props);
        self
    }

    pub fn new() -> Self {
        Self::default()
    }

    /// Appends scripted replies.
    pub fn replies(mut self, replies: impl IntoIterator<Item = Reply>) -> Self {
        self.replies.extend(replies);
        self
    }

    /// Appends one scripted reply.
    pub fn reply(mut self, reply: Reply) -> Self {
        self.replies.push(reply);
        self
    }

    pub fn rule(
        mut self,
        rule: impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static,
    ) -> Self {
        self.rule = Some(Arc::new(rule));
        self
    }

    pub fn default_reply(mut self, reply: Reply) -> Self {
        self.default_reply = reply;
        self
    }

    /// Refuses (401) every request that does not carry `key`; see [`MockConfig::api_key`].
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    pub fn exact_latency(mut self, exact: bool) -> Self {
        self.exact_latency = exact;
        self
    }

    pub fn record(mut self, record: bool) -> Self {
        self.record = record;
        self
    }

    pub fn models<S: Into<String>>(mut self, models: impl IntoIterator<Item = S>) -> Self {
        self.models = models.into_iter().map(Into::into).collect();
        self
    }

    /// Whether requests the real API refuses are refused (default: yes).
    /// Refuse requests whose `response_format.type` is one of `types` (HTTP 400).
    pub fn refuse_formats<S: Into<String>>(mut self, types: impl IntoIterator<Item = S>) -> Self {
        self.refused_formats = types.into_iter().map(Into::into).collect();
        self
    }

    /// Gives `model` a context window of `tokens`: larger requests are refused (HTTP 400).
    pub fn context_window(mut self, model: impl Into<String>, tokens: u64) -> Self {
        self.context_windows.push((model.into(), tokens));
        self
    }

    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// Whether an answer longer than the request's output limit is cut there (default: no).
    pub fn cut_at_max_tokens(mut self, cut: bool) -> Self {
        self.cut_at_max_tokens = cut;
        self
    }

    /// Whether prompt caching is applied (default: yes).
    pub fn cache(mut self, cache: bool) -> Self {
        self.cache = cache;
        self
    }

    /// How long a cache entry lives after its last use.
    pub fn cache_ttl(mut self, ttl: Duration) -> Self {
        self.cache_ttl = ttl;
        self
    }

    /// Rations the key of the API `ration` is for (replacing an earlier ration of it): see the
    /// `ration` module.
    pub fn ration(mut self, ration: Ration) -> Self {
        self.rations.retain(|r| r.api() != ration.api());
        self.rations.push(ration);
        self
    }

    /// Injects failures into chat requests as `plan` says (before the reply would be sent).
    pub fn faults(mut self, plan: FaultPlan) -> Self {
        self.faults = Some(plan);
        self
    }
}

/// A request as the server received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// Arrival order, from 0.
    pub seq: u64,
    pub api: Api,
    pub method: String,
    pub path: String,
    /// Header names in lower case, in arrival order; empty for chat requests when recording is
    /// off and there is no rule (nobody could look at them).
    pub headers: Vec<(String, String)>,
    /// The JSON body; `Value::Null` when there was none or it was not JSON.
    pub body: Value,
    pub received_at: Instant,
    /// The failure injected instead of the reply, if any.
    pub fault: Option<Fault>,
    /// Why strict mode refused the request (the provider's error message), if it did.
    pub refused: Option<String>,
}

impl RecordedRequest {
    /// The first value of a header (name in any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `model` of the body.
    pub fn model(&self) -> Option<&str> {
        self.body.get("model").and_then(Value::as_str)
    }

    /// The names of the offered tools, in either API's format.
    pub fn tool_names(&self) -> Vec<String> {
        let Some(tools) = self.body.get("tools").and_then(Value::as_array) else {
            return Vec::new();
        };
        tools
            .iter()
            .filter_map(|tool| {
                tool.get("function")
                    .and_then(|f| f.get("name"))
                    .or_else(|| tool.get("name"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .collect()
    }

    /// The text of the last user message (its text parts; its tool results when it has none).
    pub fn last_user_text(&self) -> Option<String> {
        last_user_text(&self.body)
    }
}

/// The text of the last user message of a chat request body.
fn last_user_text(body: &Value) -> Option<String> {
    let messages = body.get("messages")?.as_array()?;
    let last = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))?;
    let content = last.get("content")?;
    if let Some(text) = content.as_str() {
        return Some(text.to_owned());
    }
    let blocks = content.as_array()?;
    let texts = collect_text(blocks, "text");
    if !texts.is_empty() {
        return Some(texts);
    }
    let results: Vec<String> = blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
        .filter_map(|b| match b.get("content")? {
            Value::String(text) => Some(text.clone()),
            Value::Array(inner) => Some(collect_text(inner, "text")),
            _ => None,
        })
        .collect();
    (!results.is_empty()).then(|| results.join("\n"))
}

fn collect_text(blocks: &[Value], kind: &str) -> String {
    blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some(kind))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("")
}

struct Shared {
    addr: SocketAddr,
    props: Option<Value>,
    api_key: Option<String>,
    props_count: AtomicU64,
    batch: Mutex<batch::BatchState>,
    queue: Mutex<VecDeque<Reply>>,
    rule: Option<Rule>,
    default_reply: Reply,
    latency: Duration,
    /// Set with [`MockConfig::exact_latency`].
    timer: Option<clock::Timer>,
    record: bool,
    models: Vec<String>,
    faults: Option<FaultPlan>,
    strict: bool,
    cut_at_max_tokens: bool,
    refused_formats: Vec<String>,
    context_windows: Vec<(String, u64)>,
    /// The prompt cache, when caching is on.
    cache: Option<cache::PromptCache>,
    /// Flex requests still to be answered 429.
    flex_unavailable: AtomicU64,
    /// The key's rate limits, when rationed.
    ledger: Option<Ledger>,
    fault_counts: faults::FaultCounts,
    recorded: Mutex<Vec<RecordedRequest>>,
    count: AtomicU64,
    in_flight: AtomicU64,
    peak_in_flight: AtomicU64,
    next_id: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A running mock server; it shuts down when dropped.
pub struct MockServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl fmt::Debug for MockServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl MockServer {
    /// Starts a server on `127.0.0.1` at a free port.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start(config: MockConfig) -> MockServer {
        match Self::start_on_port(config, 0).await {
            Ok(server) => server,
            Err(err) => panic!("the mock LLM server cannot bind 127.0.0.1: {err}"),
        }
    }

    /// Starts a server on `127.0.0.1:port` (0 picks a free port).
    pub async fn start_on_port(config: MockConfig, port: u16) -> std::io::Result<MockServer> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            addr,
            props: config.props.clone(),
            api_key: config.api_key.clone(),
            props_count: AtomicU64::new(0),
            batch: Mutex::new(batch::BatchState::new(&config.batch)),
            queue: Mutex::new(config.replies.into()),
            rule: config.rule,
            default_reply: config.default_reply,
            latency: config.latency,
            timer: if config.exact_latency {
                Some(clock::Timer::start()?)
            } else {
                None
            },
            record: config.record,
            models: config.models,
            faults: config.faults,
            strict: config.strict,
            cut_at_max_tokens: config.cut_at_max_tokens,
            refused_formats: config.refused_formats.clone(),
            context_windows: config.context_windows.clone(),
            flex_unavailable: AtomicU64::new(config.flex_unavailable),
            ledger: (!config.rations.is_empty()).then(|| Ledger::new(&config.rations)),
            cache: config
                .cache
                .then(|| cache::PromptCache::new(config.cache_ttl)),
            fault_counts: faults::FaultCounts::default(),
            recorded: Mutex::new(Vec::new()),
            count: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            peak_in_flight: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(handle_openai))
            .route("/v1/messages", post(handle_anthropic))
            .route("/v1/models", get(handle_models))
            .route("/props", get(handle_props))
            .merge(batch::routes())
            .fallback(handle_unknown)
            .layer(DefaultBodyLimit::max(256 * 1024 * 1024))
            .with_state(Arc::clone(&shared));
        let (shutdown, signal) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = signal.await;
                })
                .await;
        });
        Ok(MockServer {
            addr,
            shared,
            shutdown: Some(shutdown),
            task: Some(task),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Base URL for OpenAI-compatible clients: `http://127.0.0.1:PORT/v1`.
    pub fn url_openai(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Base URL for Anthropic clients: `http://127.0.0.1:PORT`.
    pub fn url_anthropic(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Appends a scripted reply to the queue.
    pub fn push_reply(&self, reply: Reply) {
        lock(&self.shared.queue).push_back(reply);
    }

    /// Scripted replies not consumed yet.
    pub fn pending_replies(&self) -> usize {
        lock(&self.shared.queue).len()
    }

    /// The recorded requests, in arrival order (empty when recording is off).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        let mut requests = lock(&self.shared.recorded).clone();
        requests.sort_by_key(|r| r.seq);
        requests
    }

    /// Requests received (all paths), recorded or not.
    pub fn request_count(&self) -> u64 {
        self.shared.count.load(Ordering::Relaxed)
    }

    /// `GET /props` requests received (not among [`Self::request_count`]).
    pub fn props_count(&self) -> u64 {
        self.shared.props_count.load(Ordering::Relaxed)
    }

    /// Requests being answered right now.
    pub fn in_flight(&self) -> u64 {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// The most requests answered at the same time.
    pub fn peak_in_flight(&self) -> u64 {
        self.shared.peak_in_flight.load(Ordering::Relaxed)
    }

    /// What the rationing did so far (all zero when nothing is rationed).
    pub fn ration_stats(&self) -> RationStats {
        self.shared
            .ledger
            .as_ref()
            .map(Ledger::stats)
            .unwrap_or_default()
    }

    /// Faults injected so far, per class (every class present).
    pub fn faults_injected(&self) -> std::collections::BTreeMap<Fault, u64> {
        self.shared.fault_counts.snapshot()
    }

    /// Stops accepting connections and waits (at most 5 s) for open ones to finish.
    pub async fn shutdown(mut self) {
        if let Some(signal) = self.shutdown.take() {
            let _ = signal.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        if let Some(signal) = self.shutdown.take() {
            let _ = signal.send(());
        }
    }
}

/// Counts a request in flight for as long as it lives.
struct InFlight<'a>(&'a Shared);

impl<'a> InFlight<'a> {
    /// Counts the request and returns its arrival number.
    fn enter(shared: &'a Shared) -> (Self, u64) {
        let seq = shared.count.fetch_add(1, Ordering::Relaxed);
        let now = shared.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        shared.peak_in_flight.fetch_max(now, Ordering::Relaxed);
        (Self(shared), seq)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

type AppState = State<Arc<Shared>>;

/// Waits until the configured latency has passed since `arrived`.
async fn wait_latency(shared: &Shared, arrived: Instant) {
    match &shared.timer {
        Some(timer) => timer.sleep_until(arrived + shared.latency).await,
        None if !shared.latency.is_zero() => tokio::time::sleep(shared.latency).await,
        None => {}
    }
}

/// The 401 a provider gives a request without the key [`MockConfig::api_key`] names.
fn key_refusal(shared: &Shared, api: Api, headers: &HeaderMap) -> Option<Response> {
    let wanted = shared.api_key.as_deref()?;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let given = header("x-api-key")
        .or_else(|| header("authorization").and_then(|value| value.strip_prefix("Bearer ")));
    if given == Some(wanted) {
        return None;
    }
    let body = match api {
        Api::Anthropic => json!({
            "type": "error",
            "error": {"type": "authentication_error", "message": "invalid x-api-key"},
        }),
        _ => json!({
            "error": {
                "message": "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.",
                "type": "invalid_request_error",
                "param": null,
                "code": "invalid_api_key",
            },
        }),
    };
    Some(json_response(StatusCode::UNAUTHORIZED, &body))
}

async fn handle_openai(State(shared): AppState, headers: HeaderMap, body: Bytes) -> Response {
    handle_chat(&shared, Api::OpenAi, "/v1/chat/completions", headers, body).await
}

async fn handle_anthropic(State(shared): AppState, headers: HeaderMap, body: Bytes) -> Response {
    handle_chat(&shared, Api::Anthropic, "/v1/messages", headers, body).await
}

async fn handle_models(State(shared): AppState, headers: HeaderMap) -> Response {
    let (_guard, seq) = InFlight::enter(&shared);
    if shared.record {
        let request = record(seq, Api::Models, "GET", "/v1/models", &headers, Value::Null);
        lock(&shared.recorded).push(request);
    }
    let api = if headers.contains_key("x-api-key") {
        Api::Anthropic
    } else {
        Api::OpenAi
    };
    if let Some(refusal) = key_refusal(&shared, api, &headers) {
        return refusal;
    }
    let data: Vec<Value> = shared
        .models
        .iter()
        .map(|id| {
            let mut model = json!({"id": id, "object": "model", "type": "model",
                "display_name": id, "created": 0, "owned_by": "summon-mock-llm"});
            // vLLM says each model's window.
            if let Some((_, window)) = shared.context_windows.iter().find(|(m, _)| m == id) {
                model["max_model_len"] = json!(window);
            }
            model
        })
        .collect();
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": data, "has_more": false}),
    )
}

/// llama.cpp's `GET /props`: what the config says (its chat template's capabilities), with
/// the window of one slot, `default_generation_settings.n_ctx`, of the first listed model
/// that has one. A mock told neither answers 404, as a server other than llama.cpp does,
/// and keeps no record of it (summon asks a local server once per client; the tests that
/// are not about it keep their request counts); every `GET /props` is counted by
/// [`MockServer::props_count`].
async fn handle_props(State(shared): AppState, headers: HeaderMap) -> Response {
    shared.props_count.fetch_add(1, Ordering::Relaxed);
    let window = shared.models.iter().find_map(|id| {
        shared
            .context_windows
            .iter()
            .find(|(m, _)| m == id)
            .map(|(_, w)| *w)
    });
    if shared.props.is_none() && window.is_none() {
        return json_response(
            StatusCode::NOT_FOUND,
            &json!({"error": {"message": "summon-mock-llm: no route for GET /props", "type": "not_found"}}),
        );
    }
    let (_guard, seq) = InFlight::enter(&shared);
    if shared.record {
        let request = record(seq, Api::Props, "GET", "/props", &headers, Value::Null);
        lock(&shared.recorded).push(request);
    }
    let mut props = shared.props.clone().unwrap_or_else(|| json!({}));
    if let Some(n_ctx) = window
        && let Some(object) = props.as_object_mut()
    {
        object.insert(
            "default_generation_settings".to_owned(),
            json!({"n_ctx": n_ctx}),
        );
        object.entry("total_slots").or_insert(json!(1));
    }
    json_response(StatusCode::OK, &props)
}

async fn handle_unknown(
    State(shared): AppState,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let (_guard, seq) = InFlight::enter(&shared);
    if shared.record {
        let request = record(
            seq,
            Api::Unknown,
            method.as_str(),
            uri.path(),
            &headers,
            Value::Null,
        );
        lock(&shared.recorded).push(request);
    }
    let message = format!("summon-mock-llm: no route for {method} {}", uri.path());
    json_response(
        StatusCode::NOT_FOUND,
        &json!({"error": {"message": message, "type": "not_found"}}),
    )
}

fn record(
    seq: u64,
    api: Api,
    method: &str,
    path: &str,
    headers: &HeaderMap,
    body: Value,
) -> RecordedRequest {
    RecordedRequest {
        seq,
        api,
        method: method.to_owned(),
        path: path.to_owned(),
        headers: headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body,
        received_at: Instant::now(),
        fault: None,
        refused: None,
    }
}

async fn handle_chat(
    shared: &Shared,
    api: Api,
    path: &str,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (_guard, seq) = InFlight::enter(shared);
    let arrived = Instant::now();
    // Whether anyone can look at the request: the body is read whole and the headers copied
    // only then.
    let inspected = shared.record
        || shared.rule.is_some()
        || shared.strict
        || !shared.refused_formats.is_empty()
        || !shared.context_windows.is_empty()
        || shared.cache.is_some()
        || shared.ledger.is_some();
    let json: Value = if inspected {
        serde_json::from_slice(&body).unwrap_or(Value::Null)
    } else {
        essentials(&body)
    };
    let empty = HeaderMap::new();
    let seen_headers = if inspected { &headers } else { &empty };
    let mut request = record(seq, api, "POST", path, seen_headers, json);
    if let Some(refusal) = key_refusal(shared, api, &headers) {
        request.refused = Some("invalid API key".into());
        if shared.record {
            lock(&shared.recorded).push(request);
        }
        wait_latency(shared, arrived).await;
        return refusal;
    }
    let refused = if shared.strict {
        strict::refusal(api, &request.body)
    } else {
        None
    };
    let looked_up = match &shared.cache {
        Some(cache) => cache.lookup(api, &request.body).map(Some),
        None => Ok(None),
    };
    let (cached, cache_refusal) = match looked_up {
        Ok(cached) => (cached, None),
        Err(message) => (None, Some(message)),
    };
    if let Some(message) = refused
        .or(cache_refusal)
        .or_else(|| format_refusal(&shared.refused_formats, &request.body))
    {
        let body = strict::error_body(api, &message);
        request.refused = Some(message);
        if shared.record {
            lock(&shared.recorded).push(request);
        }
        return json_response(StatusCode::BAD_REQUEST, &body);
    }
    let window = request.model().and_then(|model| {
        shared
            .context_windows
            .iter()
            .find(|(m, _)| m == model)
            .map(|(_, w)| *w)
    });
    if let Some((message, body)) = window.and_then(|w| window::refusal(api, &request.body, w)) {
        request.refused = Some(message);
        if shared.record {
            lock(&shared.recorded).push(request);
        }
        return json_response(StatusCode::BAD_REQUEST, &body);
    }
    let asked_tier = request
        .body
        .get("service_tier")
        .and_then(Value::as_str)
        .map(str::to_owned);
    if api == Api::OpenAi
        && asked_tier.as_deref() == Some("flex")
        && shared
            .flex_unavailable
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    {
        request.refused = Some("flex: resource unavailable (429)".to_owned());
        if shared.record {
            lock(&shared.recorded).push(request);
        }
        let body = json!({"error": {
            "message": "Resource Unavailable: the flex processing tier has no capacity right now; try again later or use the default tier",
            "type": "resource_unavailable", "param": null, "code": "resource_unavailable",
        }});
        return raw_response(429, &[], body.to_string());
    }
    let input_tokens = cache::total_tokens(api, body.len(), &request.body);
    let model = request.model().unwrap_or("mock-model").to_owned();
    // The output limit the request set: a longer answer is cut there, as the real APIs cut it.
    let max_tokens = request
        .body
        .get("max_tokens")
        .or_else(|| request.body.get("max_completion_tokens"))
        .and_then(Value::as_u64)
        .filter(|_| shared.cut_at_max_tokens);
    let (verdict, hold) = match &shared.ledger {
        Some(ledger) => admit(
            ledger,
            api,
            arrived,
            &model,
            &request.body,
            input_tokens,
            cached.as_ref(),
        ),
        None => (None, None),
    };
    let rate_headers = verdict.as_ref().map_or(&[][..], |v| &v.headers[..]);
    if let Some(refusal) = verdict.as_ref().and_then(|v| v.refusal.as_ref()) {
        request.refused = Some(format!("rate limited (429): {}", refusal.message));
        if shared.record {
            lock(&shared.recorded).push(request);
        }
        return with_headers(
            json_response(StatusCode::TOO_MANY_REQUESTS, &refusal.body),
            rate_headers,
        );
    }
    let fault = shared.faults.as_ref().and_then(|plan| plan.draw(seq));
    request.fault = fault;

    let scripted = lock(&shared.queue).pop_front();
    let mut reply = match (scripted, &shared.rule) {
        (Some(reply), _) => reply,
        (None, Some(rule)) => rule(&request),
        (None, None) => shared.default_reply.clone(),
    };
    let echo = if contains_echo(&reply) {
        Some(format!(
            "echo: {}",
            request.last_user_text().unwrap_or_default()
        ))
    } else {
        None
    };
    if shared.record {
        lock(&shared.recorded).push(request);
    }

    wait_latency(shared, arrived).await;
    let mut finish = None;
    loop {
        match reply {
            Reply::Delay(delay, inner) => {
                tokio::time::sleep(delay).await;
                reply = *inner;
            }
            Reply::Echo => {
                reply = Reply::Text(echo.clone().unwrap_or_default());
            }
            Reply::Finish(reason, inner) => {
                finish = Some(reason);
                reply = *inner;
            }
            _ => break,
        }
    }

    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    if let (Some(fault), Some(plan)) = (fault, &shared.faults) {
        shared.fault_counts.add(fault);
        let text = match &reply {
            Reply::Text(text) => Some(text.as_str()),
            _ => Some(""),
        };
        let answer = Answer {
            text,
            ..Answer::default()
        };
        let body = success_body(api, id, &model, &answer, input_tokens).to_string();
        return with_headers(faults::respond(fault, plan, &body), rate_headers);
    }
    let answer = match Answer::of(&reply) {
        Some(answer) => Answer {
            finish: finish.as_deref().or(answer.finish),
            ..answer
        },
        None => match reply {
            Reply::Status {
                code,
                headers,
                body,
            } => return with_headers(raw_response(code, &headers, body), rate_headers),
            _ => Answer::text(""),
        },
    };
    // An answer longer than the request's output limit (four characters a token, as the
    // usage counts them) is cut there, with `length` / `max_tokens` as its reason.
    let cut;
    let answer = match (answer.text, max_tokens) {
        (Some(text), Some(limit)) if answer.finish.is_none() && text.len() as u64 / 4 > limit => {
            let mut end = usize::try_from(limit.saturating_mul(4)).unwrap_or(usize::MAX);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            cut = &text[..end];
            Answer {
                text: Some(cut),
                finish: Some(if api == Api::Anthropic {
                    "max_tokens"
                } else {
                    "length"
                }),
                ..answer
            }
        }
        _ => answer,
    };
    let mut body = success_body(api, id, &model, &answer, input_tokens);
    if api == Api::OpenAi {
        // The tier that served it: the one asked for (`auto` is served at `default`).
        let served = asked_tier
            .as_deref()
            .filter(|tier| matches!(*tier, "flex" | "priority"))
            .unwrap_or("default");
        body["service_tier"] = json!(served);
    }
    if let (Some(cache), Some(outcome)) = (&shared.cache, &cached) {
        cache::report(api, &mut body, outcome, input_tokens);
        cache.commit(outcome);
    }
    if let Some(hold) = hold {
        let output = body.pointer("/usage/output_tokens").and_then(Value::as_u64);
        hold.settle(output.unwrap_or(0), Instant::now());
    }
    with_headers(json_response(StatusCode::OK, &body), rate_headers)
}

/// Rations a chat request at its arrival: the verdict (`None` when its API is not
/// rationed) and, for an admitted Anthropic request, its output hold.
fn admit<'a>(
    ledger: &'a Ledger,
    api: Api,
    arrived: Instant,
    model: &str,
    body: &Value,
    input_tokens: u64,
    cached: Option<&cache::Outcome>,
) -> (Option<ration::Verdict>, Option<ration::Hold<'a>>) {
    match api {
        Api::OpenAi => (
            ledger.admit_openai(arrived, model, ration::openai_cost(body)),
            None,
        ),
        Api::Anthropic => {
            // Uncached input plus cache writes, as `usage` reports them.
            let input = cached.map_or(input_tokens, |outcome| {
                input_tokens.max(outcome.read + outcome.written) - outcome.read
            });
            let max_tokens = body.get("max_tokens").and_then(Value::as_u64).unwrap_or(0);
            let wall = std::time::SystemTime::now();
            match ledger.admit_anthropic(arrived, wall, model, input, max_tokens) {
                Some((verdict, hold)) => (Some(verdict), hold),
                None => (None, None),
            }
        }
        _ => (None, None),
    }
}

/// `response` with the rate-limit headers of its admission.
fn with_headers(mut response: Response, headers: &[(&'static str, String)]) -> Response {
    let map = response.headers_mut();
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_str(value) {
            map.insert(HeaderName::from_static(name), value);
        }
    }
    response
}

/// What a successful answer holds.
#[derive(Default)]
struct Answer<'a> {
    text: Option<&'a str>,
    calls: &'a [(String, Value)],
    /// A custom tool call: name and free-text input.
    custom: Option<(&'a str, &'a str)>,
    /// The finish or stop reason, when not the usual one.
    finish: Option<&'a str>,
}

impl<'a> Answer<'a> {
    fn text(text: &'a str) -> Self {
        Self {
            text: Some(text),
            ..Self::default()
        }
    }

    /// The answer a reply gives once delays and echoes are resolved; `None` for a raw
    /// status reply.
    fn of(reply: &'a Reply) -> Option<Self> {
        Some(match reply {
            Reply::Status { .. } => return None,
            Reply::Text(text) => Self::text(text),
            Reply::ToolCalls { text, calls } => Self {
                text: text.as_deref(),
                calls,
                ..Self::default()
            },
            Reply::CustomToolCall { name, input } => Self {
                custom: Some((name, input)),
                ..Self::default()
            },
            Reply::Empty => Self::default(),
            Reply::Finish(reason, inner) => Self {
                finish: Some(reason),
                ..Self::of(inner)?
            },
            // Resolved before an answer is built; answer something valid anyway.
            Reply::Delay(..) | Reply::Echo => Self::text(""),
        })
    }
}

/// What an answer needs of a request that nobody records or inspects, its model and its last
/// user message, as a body of just those (read without building the whole JSON tree: a
/// benchmark's requests are about 5 kB each). Anything unexpected is read whole.
fn essentials(body: &[u8]) -> Value {
    use serde_json::value::RawValue;
    use std::borrow::Cow;
    #[derive(serde::Deserialize)]
    struct Peek<'a> {
        #[serde(default, borrow)]
        model: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        messages: Vec<Message<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Message<'a> {
        #[serde(default, borrow)]
        role: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        content: Option<&'a RawValue>,
    }
    let Ok(peek) = serde_json::from_slice::<Peek<'_>>(body) else {
        return serde_json::from_slice(body).unwrap_or(Value::Null);
    };
    let last_user = peek
        .messages
        .iter()
        .rev()
        .find(|m| m.role.as_deref() == Some("user"))
        .and_then(|m| m.content)
        .and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok());
    let messages: Vec<Value> = last_user
        .map(|content| json!({"role": "user", "content": content}))
        .into_iter()
        .collect();
    json!({"model": peek.model, "messages": messages})
}

fn contains_echo(reply: &Reply) -> bool {
    match reply {
        Reply::Echo => true,
        Reply::Delay(_, inner) | Reply::Finish(_, inner) => contains_echo(inner),
        _ => false,
    }
}

/// The body of a successful chat answer in `api`'s format.
fn success_body(api: Api, id: u64, model: &str, answer: &Answer<'_>, input_tokens: u64) -> Value {
    let Answer {
        text,
        calls,
        custom,
        finish,
    } = *answer;
    let mut output_chars = text.map_or(0, str::len);
    let called = !calls.is_empty() || custom.is_some();
    match api {
        Api::Anthropic => {
            let mut content = Vec::with_capacity(calls.len() + 1);
            if let Some(text) = text {
                content.push(json!({"type": "text", "text": text}));
            }
            for (index, (name, arguments)) in calls.iter().enumerate() {
                let input = match arguments {
                    Value::String(raw) => serde_json::from_str(raw).unwrap_or_else(|_| json!({})),
                    other => other.clone(),
                };
                output_chars += name.len() + arguments.to_string().len();
                content.push(json!({
                    "type": "tool_use", "id": format!("toolu_mock_{id}_{index}"),
                    "name": name, "input": input,
                }));
            }
            if let Some((_, input)) = custom {
                output_chars += input.len();
                content.push(json!({
                    "type": "tool_use", "id": format!("toolu_mock_{id}_custom"),
                    "input": {"input": input},
                }));
            }
            let usual = if called { "tool_use" } else { "end_turn" };
            json!({
                "id": format!("msg_mock_{id}"),
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": content,
                "stop_reason": finish.unwrap_or(usual),
                "stop_sequence": null,
                "usage": {"input_tokens": input_tokens, "output_tokens": (output_chars as u64 / 4).max(1)},
            })
        }
        _ => {
            let mut tool_calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(index, (name, arguments))| {
                    let arguments = match arguments {
                        Value::String(raw) => raw.clone(),
                        other => other.to_string(),
                    };
                    output_chars += name.len() + arguments.len();
                    json!({
                        "id": format!("call_mock_{id}_{index}"),
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    })
                })
                .collect();
            if let Some((name, input)) = custom {
                output_chars += name.len() + input.len();
                tool_calls.push(json!({
                    "id": format!("call_mock_{id}_custom"),
                    "type": "custom",
                    "custom": {"name": name, "input": input},
                }));
            }
            let mut message = json!({"role": "assistant", "content": text});
            if !tool_calls.is_empty() {
                message["tool_calls"] = Value::Array(tool_calls);
            }
            let output_tokens = (output_chars as u64 / 4).max(1);
            let usual = if called { "tool_calls" } else { "stop" };
            json!({
                "id": format!("chatcmpl-mock-{id}"),
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [{
                    "index": 0,
                    "message": message,
                    "finish_reason": finish.unwrap_or(usual),
                }],
                "usage": {
                    "prompt_tokens": input_tokens,
                    "completion_tokens": output_tokens,
                    "total_tokens": input_tokens + output_tokens,
                },
            })
        }
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn raw_response(code: u16, headers: &[(String, String)], body: String) -> Response {
    let json_like = body.trim_start().starts_with('{');
    let mut response = Response::new(Body::from(body));
    *response.status_mut() =
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let map = response.headers_mut();
    if json_like {
        map.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            map.insert(name, value);
        }
    }
    response
}

/// The 400 message of a server that does not know the request's `response_format` type.
fn format_refusal(refused: &[String], body: &Value) -> Option<String> {
    let kind = body.get("response_format")?.get("type")?.as_str()?;
    refused.iter().any(|r| r == kind).then(|| {
        format!("Invalid parameter: 'response_format' of type '{kind}' is not supported with this model.")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> RecordedRequest {
        record(0, Api::OpenAi, "POST", "/", &HeaderMap::new(), body)
    }

    #[test]
    fn the_essentials_give_the_same_model_and_last_user_text_as_the_whole_body() {
        let bodies = [
            json!({"model": "m", "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "second"},
            ]}),
            json!({"model": "claude", "system": "s", "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            ]}),
            json!({"messages": [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": "42"},
            ]}]}),
            json!({"model": "m", "messages": [{"role": "assistant", "content": "only"}]}),
            // Not the usual shape: read whole.
            json!({"model": 7, "messages": "none"}),
            json!(["not", "an", "object"]),
        ];
        for body in bodies {
            let bytes = serde_json::to_vec(&body).unwrap();
            let whole = request(body.clone());
            let essentials = request(essentials(&bytes));
            assert_eq!(essentials.model(), whole.model(), "{body}");
            assert_eq!(
                essentials.last_user_text(),
                whole.last_user_text(),
                "{body}"
            );
        }
        assert_eq!(essentials(b"not json"), Value::Null);
    }
}
