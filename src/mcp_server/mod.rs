//! `summon mcp`: the project served to an MCP client over stdio, with rmcp's server side.
//!
//! Tools: `load`, `delegate`, `spawn_agent`, `run_pipeline` (`load` alone inside a
//! subagent). The catalog is read once when the server starts: its agents go to the client
//! in the server's instructions and are the names `spawn_agent` accepts for the session.
//! Every delegation is a task of the project's store, run by a worker process
//! ([`crate::delegation::start`]); a foreground call waits for it, sends its tool calls as
//! progress notifications, and cancels it when the client cancels the call or goes away.
//! Background tasks (`async: true`) outlive the server.

mod args;
mod calls;
mod duplicates;
mod http;
mod pipeline;
mod session;
mod stop;
mod tools;
mod trust;

pub(crate) use http::{Listen, serve_http};

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    CreateTaskResult, DetailedTask, GetTaskParams, GetTaskResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ServerCapabilities,
    ServerConfig, Task, TaskPayload, TaskStatus,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler, ServiceExt as _};
use tokio_util::sync::CancellationToken;

use crate::delegation::{self, SourceList};
use crate::env::Env;
use crate::error::{Error, Result};
use crate::source::Catalog;
use crate::store::TaskId;
use session::Session;

/// How `summon mcp` serves (its flags).
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// The longest wait of one `load` of a running task.
    pub(crate) load_wait: Duration,
    /// The longest a foreground `delegate` call keeps its host waiting before it answers
    /// with its still-running task (`--call-wait`); `None`: until the task ends, or as long
    /// as the session has shown its host waits.
    pub(crate) call_wait: Option<Duration>,
    /// Every session sees, collects and cancels all of the project's tasks.
    pub(crate) share_tasks: bool,
    /// The most tasks of one `spawn_agent` call.
    pub(crate) max_spawn: usize,
    /// Each session's spend cap in USD (over the config file's `max_cost`).
    pub(crate) max_cost: Option<f64>,
    /// Over HTTP: the most sessions alive at once.
    pub(crate) max_sessions: usize,
    /// Over HTTP: how long a session that called no tool lives.
    pub(crate) idle_session: Duration,
}

/// What the server holds for as long as it runs.
pub(crate) struct Shared {
    env: Env,
    options: Options,
    /// When the server started: a pipeline file written or changed since is not run.
    started: std::time::SystemTime,
    /// The catalog read when the session started.
    catalog: Catalog,
    listing: SourceList,
    /// Started inside a subagent: `load` only.
    nested: bool,
    /// Cancelled when the client goes away: foreground work stops.
    shutdown: CancellationToken,
    /// The foreground tasks running now.
    foreground: Mutex<HashSet<TaskId>>,
    /// The process groups of the `run_pipeline` runs going on now.
    runs: Mutex<HashSet<u32>>,
    /// The last scan of the sources, and when it was made ([`Shared::sources`]).
    sources: Mutex<Option<(std::time::Instant, std::sync::Arc<Sources>)>>,
    /// Calls whose arguments write a key twice, refused ([`duplicates`]).
    duplicates: std::sync::Arc<duplicates::Duplicates>,
    /// Over HTTP: the sessions (their ids) that called a tool.
    used_sessions: Mutex<HashSet<String>>,
    instructions: String,
    /// The catalog of roles as the model reads it (in the instructions and in
    /// `spawn_agent`'s description); empty without roles.
    catalog_text: String,
    /// The session's traces, when the `OTEL_*` variables or the config file turn them on.
    traces: Option<crate::telemetry::SessionTraces>,
}

/// How long a scan of the sources is used before the next call scans again (goose's
/// `source_cache`), unless `SUMMON_MCP_SOURCES_SECS` says otherwise.
const SOURCES_TTL: Duration = Duration::from_secs(60);

/// The project's sources as a call sees them: scanned again at most every
/// [`SOURCES_TTL`], with the roles (agents) as the session froze them.
pub(crate) struct Sources {
    catalog: Catalog,
    listing: SourceList,
}

impl Shared {
    /// The sources now: a recipe written during the session is found once the last scan is
    /// older than a minute; the agents stay those of the session's catalog.
    fn sources(&self) -> std::sync::Arc<Sources> {
        let Ok(mut cache) = self.sources.lock() else {
            return std::sync::Arc::new(self.scan());
        };
        let ttl = self
            .env
            .var("SUMMON_MCP_SOURCES_SECS")
            .and_then(|v| v.parse().ok())
            .map_or(SOURCES_TTL, Duration::from_secs);
        match &*cache {
            Some((at, sources)) if at.elapsed() < ttl => std::sync::Arc::clone(sources),
            _ => {
                let sources = std::sync::Arc::new(self.scan());
                *cache = Some((std::time::Instant::now(), std::sync::Arc::clone(&sources)));
                sources
            }
        }
    }

    fn scan(&self) -> Sources {
        let mut catalog = crate::source::discover(crate::source::search_dirs(&self.env));
        let kind = crate::source::SourceKind::Agent;
        catalog.sources.retain(|s| s.kind != kind);
        catalog.sources.extend(
            self.catalog
                .sources
                .iter()
                .filter(|s| s.kind == kind)
                .cloned(),
        );
        let listing = delegation::list_sources(&catalog);
        Sources { catalog, listing }
    }

    fn track(&self, id: TaskId, running: bool) {
        if let Ok(mut set) = self.foreground.lock() {
            if running {
                set.insert(id);
            } else {
                set.remove(&id);
            }
        }
    }
}

/// Sends a call's progress lines to the client, when it asked for progress.
pub(crate) struct Progress {
    peer: Peer<RoleServer>,
    token: Option<ProgressToken>,
    handle: tokio::runtime::Handle,
    sent: AtomicU64,
    /// The call's span context (`TRACEPARENT`) for the workers and runs it starts, when
    /// the session exports traces.
    trace: Option<String>,
}

impl Progress {
    /// The environment of what the call starts: the session's, under the call's span.
    fn env<'a>(&self, shared: &'a Shared) -> std::borrow::Cow<'a, Env> {
        traced_env(shared, self.trace.as_deref())
    }

    /// One line, as a progress notification whose count goes up by one.
    fn line(&self, message: &str) {
        let Some(token) = &self.token else {
            return;
        };
        let n = self.sent.fetch_add(1, Ordering::SeqCst) + 1;
        let param = ProgressNotificationParam::new(token.clone(), n as f64).with_message(message);
        let _ = self.handle.block_on(self.peer.notify_progress(param));
    }
}

#[derive(Clone)]
struct Server {
    shared: std::sync::Arc<Shared>,
    /// This client's session.
    session: std::sync::Arc<Session>,
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_instructions(self.shared.instructions.clone());
        info.server_info = rmcp::model::Implementation::new("summon", env!("CARGO_PKG_VERSION"));
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::tools(
            self.shared.nested,
            &self.shared.catalog_text,
        )))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        // Inside a subagent the other tools are not listed, yet a call of one gets the
        // seed's refusal rather than "unknown tool".
        if !tools::is_tool(&name) {
            return Err(ErrorData::invalid_params(
                format!("unknown tool `{}`", crate::text::printable(&name)),
                None,
            ));
        }
        // Arguments that wrote a key twice were read with the last value: refused.
        let http_session = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        if let Ok(id) = serde_json::to_string(&context.id)
            && let Some(refusal) = self.shared.duplicates.take(&http_session, &id)
        {
            return Ok(CallToolResponse::from(CallToolResult::error(vec![
                ContentBlock::text(refusal),
            ])));
        }
        let arguments = request.arguments.unwrap_or_default();
        // Over HTTP, a session that calls a tool is no longer ended as idle.
        if let Some(id) = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            && let Ok(mut used) = self.shared.used_sessions.lock()
        {
            used.insert(id.to_owned());
        }
        let span = self.shared.traces.as_ref().map(|traces| {
            traces.call(
                &name,
                context.meta.get_traceparent(),
                context.meta.get_tracestate(),
            )
        });
        let trace = span.as_ref().map(crate::telemetry::CallSpan::traceparent);
        // A client of the tasks extension gets a `delegate` as a task of the store, polled
        // with tasks/get (an `async: true` call answers at once either way).
        let tasks_client = context
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks());
        if tasks_client
            && name == tools::DELEGATE
            && !self.shared.nested
            && arguments.get("async") != Some(&serde_json::Value::Bool(true))
        {
            let shared = std::sync::Arc::clone(&self.shared);
            let session = std::sync::Arc::clone(&self.session);
            let started = blocking(move || {
                calls::start_task(&shared, &session, &arguments, trace.as_deref())
            })
            .await?;
            if let Some(span) = span {
                span.end(started.as_ref().err().map(String::as_str));
            }
            return Ok(match started {
                Ok(task) => CallToolResponse::Task(CreateTaskResult::new(protocol_task(&task))),
                Err(message) => CallToolResult::error(vec![ContentBlock::text(message)]).into(),
            });
        }
        let progress = Progress {
            peer: context.peer.clone(),
            token: context.meta.get_progress_token(),
            handle: tokio::runtime::Handle::current(),
            sent: AtomicU64::new(0),
            trace,
        };
        let cancel = context.ct.clone();
        let shared = std::sync::Arc::clone(&self.shared);
        let session = std::sync::Arc::clone(&self.session);
        let (send, receive) = tokio::sync::oneshot::channel();
        // The work blocks (the store, worker processes): a thread of its own per call.
        std::thread::spawn(move || {
            let call = calls::Call {
                shared: &shared,
                session: &session,
                progress: &progress,
                cancel: &cancel,
            };
            let reply = call.run(&name, &arguments);
            let _ = send.send(reply);
        });
        let reply = receive
            .await
            .map_err(|_| ErrorData::internal_error("the tool call's thread ended early", None))?;
        if let Some(span) = span {
            span.end(reply.error.then(|| reply.text.lines().next().unwrap_or("")));
        }
        Ok(tool_result(reply).into())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<GetTaskResult, ErrorData> {
        let shared = std::sync::Arc::clone(&self.shared);
        let session = std::sync::Arc::clone(&self.session);
        let id = request.task_id;
        let (task, done) = blocking(move || calls::task_state(&shared, &session, &id))
            .await?
            .map_err(|message| ErrorData::invalid_params(message, None))?;
        let payload = match (&task.status, done) {
            (crate::store::TaskStatus::Cancelled, _) => TaskPayload::Cancelled,
            (_, Some(reply)) => {
                let result = serde_json::to_value(tool_result(reply))
                    .ok()
                    .and_then(|v| v.as_object().cloned())
                    .unwrap_or_default();
                TaskPayload::Completed { result }
            }
            (_, None) => TaskPayload::Working,
        };
        Ok(GetTaskResult::new(DetailedTask::new(
            protocol_task(&task),
            payload,
        )))
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<(), ErrorData> {
        let shared = std::sync::Arc::clone(&self.shared);
        let session = std::sync::Arc::clone(&self.session);
        let id = request.task_id;
        blocking(move || calls::cancel_task(&shared, &session, &id))
            .await?
            .map_err(|message| ErrorData::invalid_params(message, None))
    }
}

/// The session's environment, with `TRACEPARENT` set to `trace` when there is one.
fn traced_env<'a>(shared: &'a Shared, trace: Option<&str>) -> std::borrow::Cow<'a, Env> {
    match trace {
        Some(trace) => std::borrow::Cow::Owned(shared.env.clone().with_var("TRACEPARENT", trace)),
        None => std::borrow::Cow::Borrowed(&shared.env),
    }
}

/// A reply as the protocol's tool result.
/// A background task's id also goes in `structuredContent` and `_meta`, for hosts that read
/// them rather than the text.
fn tool_result(reply: calls::Reply) -> CallToolResult {
    let content = vec![ContentBlock::text(reply.text)];
    let mut result = if reply.error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    if let Some(id) = reply.task {
        let id = id.to_string();
        result.structured_content = Some(serde_json::json!({"task_id": id}));
        let mut meta = serde_json::Map::new();
        meta.insert("summon/task_id".to_owned(), serde_json::Value::String(id));
        result.meta = Some(rmcp::model::MetaObject(meta));
    }
    result
}

/// A task of the store as the tasks extension shows it: its id, status and last change.
fn protocol_task(task: &crate::store::TaskRecord) -> Task {
    use crate::store::TaskStatus as S;
    let status = match task.status {
        S::Queued | S::Running => TaskStatus::Working,
        S::Completed | S::Failed => TaskStatus::Completed,
        S::Cancelled => TaskStatus::Cancelled,
    };
    let updated = task
        .finished_at
        .or(task.last_activity_at)
        .or(task.started_at)
        .unwrap_or(task.created_at);
    let mut shown = Task::new(
        task.id.to_string(),
        status,
        task.created_at.to_string(),
        updated.to_string(),
    )
    .with_poll_interval_ms(1000);
    if let Some(line) = task.recent_tool_calls.last() {
        shown =
            shown.with_status_message(format!("{} tool calls; latest: {line}", task.tool_calls));
    }
    shown
}

/// Runs blocking work (the store, worker processes) on a thread of its own.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> std::result::Result<T, ErrorData> {
    let (send, receive) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = send.send(work());
    });
    receive
        .await
        .map_err(|_| ErrorData::internal_error("the call's thread ended early", None))
}

/// The session's state: the catalog read now, whether this runs inside a subagent.
fn shared(env: Env, options: Options) -> std::sync::Arc<Shared> {
    let catalog = crate::source::discover(crate::source::search_dirs(&env));
    let listing = delegation::list_sources(&catalog);
    let nested = crate::subagent::inside_subagent(&env);
    let catalog_text = tools::catalog(&listing, &env.cwd);
    let instructions = tools::instructions(&catalog_text, nested);
    let traces = session_traces(&env);
    std::sync::Arc::new(Shared {
        env,
        options,
        started: std::time::SystemTime::now(),
        catalog,
        listing,
        nested,
        shutdown: CancellationToken::new(),
        foreground: Mutex::new(HashSet::new()),
        runs: Mutex::new(HashSet::new()),
        used_sessions: Mutex::new(HashSet::new()),
        sources: Mutex::new(None),
        duplicates: std::sync::Arc::default(),
        instructions,
        catalog_text,
        traces,
    })
}

/// The session's traces, when turned on; a setting summon cannot use leaves them off with
/// a warning (the client reads the server's stderr as its log).
fn session_traces(env: &Env) -> Option<crate::telemetry::SessionTraces> {
    let (config, _) = crate::config::load_config(env).ok()?;
    let settings = match crate::telemetry::Settings::resolve(env, &config) {
        Ok(settings) => settings?,
        Err(diagnostic) => {
            eprintln!("summon: warning: traces are off: {}", diagnostic.message);
            return None;
        }
    };
    match crate::telemetry::SessionTraces::start(&settings, env) {
        Ok(traces) => Some(traces),
        Err(e) => {
            eprintln!("summon: warning: traces are off: {e}");
            None
        }
    }
}

/// The end of a session: its spans are sent, within the flush time.
fn finish_traces(shared: &Shared) {
    if let Some(warning) = shared.traces.as_ref().and_then(|t| t.finish()) {
        eprintln!("summon: warning: {warning}");
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// Serves the project of `env.cwd` over stdio until the client closes stdin or a signal
/// (SIGTERM, SIGINT, SIGHUP) arrives; then the foreground tasks are stopped, their workers
/// killed with every process they started (background tasks keep running).
pub(crate) fn serve(env: Env, options: Options) -> Result<()> {
    let shared = shared(env, options);
    let runtime = runtime()?;
    let server = Server {
        shared: std::sync::Arc::clone(&shared),
        session: std::sync::Arc::new(Session::new(shared.options.share_tasks)),
    };
    let duplicates = std::sync::Arc::clone(&shared.duplicates);
    let (served, signal) = runtime
        .block_on(async move {
            let signals = stop::Signals::new()?;
            // The end of stdin is seen as it is read: the session's own end waits for the calls
            // in flight, which stop only once the server stops them.
            let closed = CancellationToken::new();
            let stdin = stop::EndOfInput::new(
                duplicates::Watch::new(tokio::io::stdin(), duplicates),
                closed.clone(),
            );
            let service = server
                .serve((stdin, tokio::io::stdout()))
                .await
                .map_err(|e| Error::Failed(format!("the MCP session did not start: {e}")))?;
            tokio::select! {
                ended = service.waiting() => {
                    let ended = ended
                        .map(|_| ())
                        .map_err(|e| Error::internal(format!("the MCP session ended badly: {e}")));
                    Ok::<_, Error>((ended, None))
                }
                () = closed.cancelled() => Ok((Ok(()), None)),
                signal = signals.next() => Ok((Ok(()), Some(signal))),
            }
        })
        .unwrap_or_else(|e| (Err(e), None));
    stop::finish(&shared, runtime, signal);
    served
}
