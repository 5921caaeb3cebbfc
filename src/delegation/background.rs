//! Running a delegation, in the foreground or in a detached background worker.
//!
//! `summon delegate --async` records the task in the store (`.summon/state.db`), which
//! allocates its id and takes a slot under `SUMMON_MAX_BACKGROUND_TASKS` in one transaction,
//! then starts `summon __worker ID` in a new session (so the caller's exit or Ctrl-C does not
//! reach it), with its output in `.summon/tasks/ID.log`, and returns. The worker:
//!
//! ```text
//! queued? -> wait for a slot (claim_slot) -> prepare -> agent loop -> finish
//!            heartbeat thread: every second, heartbeat(); a cancel request stops the loop;
//!            the end of the task wakes it, so the result is recorded at once
//! ```
//!
//! Any command that reads tasks first fails the tasks whose worker is gone (no live pid, or
//! no heartbeat for a while) and drops results older than `SUMMON_COMPLETED_TASK_TTL_SECS`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::command::Ctx;
use crate::config::load_config;
use crate::delegation::{PrepareError, Request, prepare};
use crate::diag::Diagnostic;
use crate::env::Env;
use crate::error::{Error, Result};
use crate::process::pid_alive;
use crate::provider::{Client, RateLimiter, RetryPolicy, Usage};
use crate::recipe::ParamInput;
use crate::store::{Claim, Control, Store, TaskId, TaskRecord, TaskStatus};
use crate::subagent::{SubagentEvent, SubagentResult, SubagentStatus, run_subagent};

/// Default for `SUMMON_MAX_BACKGROUND_TASKS`.
pub(crate) const DEFAULT_MAX_TASKS: usize = 5;
/// Default for `SUMMON_COMPLETED_TASK_TTL_SECS`.
pub(crate) const DEFAULT_TTL_SECS: u64 = 600;
/// How often a worker proves it is alive.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// A worker silent for this long is taken for dead even if its pid answers (pid reuse
/// after a restart).
const STALE_AFTER: Duration = Duration::from_secs(30);

/// A delegation as recorded for a background worker; files named on the command line are
/// already read.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct DelegationRequest {
    pub(crate) source: Option<String>,
    pub(crate) instructions: Option<String>,
    pub(crate) params: Vec<(String, String)>,
    pub(crate) extensions: Option<Vec<String>>,
    pub(crate) provider: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) temperature: Option<f64>,
    pub(crate) max_turns: Option<u32>,
    #[serde(default)]
    pub(crate) max_output_tokens: Option<u32>,
    pub(crate) context: Option<String>,
    pub(crate) working_dir: Option<std::path::PathBuf>,
    /// The `--sandbox` / `--network` flags.
    #[serde(default)]
    pub(crate) sandbox: Option<crate::sandbox::Policy>,
    #[serde(default)]
    pub(crate) network: Option<bool>,
}

impl DelegationRequest {
    /// A one-line description: the source, or the start of the instructions.
    pub(crate) fn description(&self) -> String {
        let instructions = self
            .instructions
            .as_deref()
            .map(|i| i.split_whitespace().collect::<Vec<_>>().join(" "));
        let short = instructions.map(|i| {
            if i.chars().count() > 60 {
                format!("{}...", i.chars().take(57).collect::<String>())
            } else {
                i
            }
        });
        match (&self.source, short) {
            (Some(source), Some(text)) => format!("{source}: {text}"),
            (Some(source), None) => source.clone(),
            (None, Some(text)) => text,
            (None, None) => "task".into(),
        }
    }

    fn to_request(&self) -> Request {
        let mut params = ParamInput::default();
        for (key, value) in &self.params {
            params.values.insert(
                key.clone(),
                (value.clone(), crate::recipe::params::Origin::Flag),
            );
        }
        Request {
            instructions: self.instructions.clone(),
            params,
            extensions: self.extensions.clone(),
            provider: self.provider.clone(),
            model: self.model.clone(),
            temperature: self.temperature,
            max_turns: self.max_turns,
            max_output_tokens: self.max_output_tokens,
            allow_empty: false,
            context: self.context.clone(),
            working_dir: self.working_dir.clone(),
            response_schema: None,
            sandbox: (self.sandbox, self.network),
            context_window: None,
            tools: None,
        }
    }
}

/// The result of running a delegation.
pub(crate) struct Outcome {
    pub(crate) result: SubagentResult,
    pub(crate) error: Option<String>,
    pub(crate) notes: Vec<Diagnostic>,
    pub(crate) provider: String,
    pub(crate) provider_from: String,
    pub(crate) model: String,
    pub(crate) model_from: String,
    /// The sandbox of the shell commands, when the task has the shell.
    pub(crate) sandbox: Option<crate::sandbox::Sandbox>,
}

impl Outcome {
    /// What goes to stdout: the structured answer as JSON, or the final (or last) text.
    pub(crate) fn final_text(&self) -> String {
        match &self.result.structured {
            Some(value) => serde_json::to_string_pretty(value).unwrap_or_default(),
            None => self.result.text.clone(),
        }
    }
}

/// A delegation checked and ready to run: everything a foreground `delegate` refuses has been
/// refused by the time one exists.
pub(crate) struct Ready {
    runtime: tokio::runtime::Runtime,
    prepared: crate::delegation::Prepared,
    notes: Vec<Diagnostic>,
}

/// Checks and prepares a delegation without contacting the model: the config, the source
/// (catalog read once and frozen), its parameters, an agent's task, the working directory,
/// and the provider and model. `delegate --async` runs this before it stores a task, so it
/// refuses exactly what the foreground refuses, with the same message.
pub(crate) fn ready(env: &Env, request: &DelegationRequest) -> Result<Ready> {
    let (config, warnings) = load_config(env).map_err(Error::Input)?;
    let catalog = crate::source::discover(crate::source::search_dirs(env));
    let source = match &request.source {
        Some(name) => Some(
            catalog
                .get(name)
                .ok_or_else(|| Error::from(catalog.not_found(name)))?,
        ),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let prepared = match runtime.block_on(prepare(env, &config, source, &request.to_request())) {
        Ok(prepared) => prepared,
        Err(PrepareError::Input(diags)) => return Err(Error::Input(diags)),
        Err(PrepareError::Task(message)) => return Err(Error::Failed(message)),
    };
    let mut notes = warnings.items;
    notes.extend(prepared.notes.iter().cloned());
    Ok(Ready {
        runtime,
        prepared,
        notes,
    })
}

/// Runs a delegation in this process. `observer` gets the source label and each event.
/// A cancelled `cancel` token ends the loop with status failed (`cancelled`).
pub(crate) fn execute(
    env: &Env,
    request: &DelegationRequest,
    observer: &mut (dyn FnMut(&str, SubagentEvent) + Send),
    cancel: Option<CancellationToken>,
) -> Result<Outcome> {
    let Ready {
        runtime,
        prepared,
        notes,
    } = ready(env, request)?;
    let client =
        Client::new(prepared.resolved.endpoint.clone()).map_err(|e| Error::usage(e.to_string()))?;
    let limiter = RateLimiter::new(prepared.resolved.limits);
    let label = prepared.label.clone();
    let mut events = |event: SubagentEvent| observer(&label, event);
    let policy = RetryPolicy::from_env(env);
    let run = run_subagent(&client, &policy, &limiter, &prepared.spec, &mut events);
    let result = runtime.block_on(async {
        match cancel {
            Some(token) => tokio::select! {
                result = run => Some(result),
                () = token.cancelled() => None,
            },
            None => Some(run.await),
        }
    });
    let result = result.unwrap_or_else(|| SubagentResult {
        status: SubagentStatus::Failed("cancelled".into()),
        text: String::new(),
        structured: None,
        extracted: false,
        corrections: 0,
        turns: 0,
        tool_calls: 0,
        usage: Usage::default(),
        duration: Duration::ZERO,
        warnings: Vec::new(),
    });
    let error = result.error(prepared.spec.max_turns);
    Ok(Outcome {
        error,
        result,
        notes,
        provider: prepared.resolved.provider_name.clone(),
        provider_from: prepared.resolved.provider_origin.to_string(),
        model: prepared.resolved.model.clone(),
        model_from: prepared.resolved.model_origin.to_string(),
        sandbox: prepared
            .spec
            .tools
            .has_shell()
            .then(|| prepared.spec.tools.sandbox()),
    })
}

/// A whole-number setting from the environment, with its default.
pub(crate) fn env_number(env: &Env, key: &str, default: u64) -> Result<u64> {
    match env.var(key) {
        None => Ok(default),
        Some(text) => text
            .trim()
            .parse()
            .map_err(|_| Error::usage(format!("{key} must be a whole number, got `{text}`"))),
    }
}

fn max_tasks(env: &Env) -> Result<usize> {
    let n = env_number(env, "SUMMON_MAX_BACKGROUND_TASKS", DEFAULT_MAX_TASKS as u64)?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX).max(1))
}

/// Opens the project's store, creating it in the working directory when there is none above
/// it, and brings it up to date: dead workers failed, old results dropped.
pub(crate) fn open_store(env: &Env) -> Result<Store> {
    let store = Store::open_for(&env.cwd)?;
    refresh(env, store)
}

/// [`open_store`] for commands that only read: `None` when the project has no store, and
/// none is created.
pub(crate) fn open_existing_store(env: &Env) -> Result<Option<Store>> {
    match Store::open_existing(&env.cwd)? {
        Some(store) => refresh(env, store).map(Some),
        None => Ok(None),
    }
}

/// Fails the tasks whose worker is gone and drops results past their TTL.
fn refresh(env: &Env, store: Store) -> Result<Store> {
    let ttl = env_number(env, "SUMMON_COMPLETED_TASK_TTL_SECS", DEFAULT_TTL_SECS)?;
    fail_dead_workers(&store)?;
    store.expire(Duration::from_secs(ttl))?;
    Ok(store)
}

/// Fails the tasks whose worker is gone, and stops the MCP servers those workers left
/// running (a worker killed with SIGKILL could not stop them).
fn fail_dead_workers(store: &Store) -> Result<()> {
    for id in store.mark_dead_workers(worker_alive, Duration::ZERO)? {
        let worker = store.get(&id)?.and_then(|task| task.pid);
        for (pgid, started) in store.take_servers(&id)? {
            if let Some(worker) = worker {
                crate::mcp::stop_recorded(pgid, started, worker);
            }
        }
    }
    Ok(())
}

/// Whether a task's worker is still there: its pid runs and its heartbeat is recent. A task
/// whose worker is still being started (no pid yet) gets a grace period.
fn worker_alive(task: &TaskRecord) -> bool {
    let age = |t: Timestamp| Timestamp::now().duration_since(t).unsigned_abs();
    match task.pid {
        None => age(task.created_at) < STALE_AFTER,
        Some(pid) => pid_alive(pid) && age(task.heartbeat_at) < STALE_AFTER,
    }
}

/// `delegate --async`: record the task, start its worker, print the id.
pub(crate) fn start(
    request: DelegationRequest,
    queue: bool,
    json: bool,
    ctx: &mut Ctx,
) -> Result<()> {
    // Everything the foreground refuses is refused here, before a task exists.
    drop(ready(&ctx.env, &request)?);
    let cap = max_tasks(&ctx.env)?;
    let store = open_store(&ctx.env)?;
    let description = request.description();
    let request_json = serde_json::to_string(&request)
        .map_err(|e| Error::internal(format!("cannot encode the task request: {e}")))?;
    let task = store.create_task(
        &description,
        request.source.as_deref(),
        &request_json,
        cap,
        queue,
    )?;
    let pid = match spawn_worker(&store, &task.id, ctx) {
        Ok(pid) => pid,
        Err(e) => {
            let message = format!("could not start the background worker: {e}");
            let _ = store.finish(
                &task.id,
                TaskStatus::Failed,
                None,
                Some(&message),
                Usage::default(),
                0,
            );
            return Err(Error::usage(message));
        }
    };
    let _ = store.set_pid(&task.id, pid);
    if json {
        ctx.out.json(&json!({
            "task_id": task.id.to_string(),
            "status": task.status.as_str(),
            "description": description,
        }))?;
    } else {
        let queued = if task.status == TaskStatus::Queued {
            format!(" (queued: {cap} tasks are running; it starts when one finishes)")
        } else {
            String::new()
        };
        ctx.out.write(&format!(
            "Task {id} started in background: \"{description}\"{queued}\n\
             Collect the result with `summon load {id}` (`--peek` to check on it, `--cancel` to stop it).\n",
            id = task.id
        ))?;
    }
    Ok(())
}

/// Starts `summon __worker ID` in its own session, output to the task's log file.
fn spawn_worker(store: &Store, id: &TaskId, ctx: &Ctx) -> std::io::Result<u32> {
    use process_wrap::std::{CommandWrap, ProcessSession};
    let log_path = store.task_log_path(id);
    if let Some(dir) = log_path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let log = std::fs::File::create(&log_path)?;
    let exe = std::env::current_exe()?;
    let mut command = std::process::Command::new(exe);
    command
        .arg("__worker")
        .arg(id.to_string())
        .current_dir(&ctx.env.cwd)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // `--trust` stands for the variable; the worker reads the environment.
    if let Some(value) = ctx.env.var(crate::config::trust::TRUST_ENV) {
        command.env(crate::config::trust::TRUST_ENV, value);
    }
    let mut wrapped = CommandWrap::from(command);
    wrapped.wrap(ProcessSession);
    let child = wrapped.spawn()?;
    Ok(child.id())
}

/// The worker process of a background task.
pub(crate) fn run_worker(id_text: &str, ctx: &mut Ctx) -> Result<()> {
    let id: TaskId = id_text
        .parse()
        .map_err(|_| Error::usage(format!("not a task id: `{id_text}`")))?;
    // The store its caller created or found; the worker runs in the caller's directory.
    let store = Store::open_for(&ctx.env.cwd)?;
    let project = store.project_dir().to_path_buf();
    let fail = |store: &Store, message: &str| {
        let _ = store.finish(
            &id,
            TaskStatus::Failed,
            None,
            Some(message),
            Usage::default(),
            0,
        );
    };
    let Some(task) = store.get(&id)? else {
        return Err(Error::usage(format!("Task '{id}' not found")));
    };
    let _ = store.set_pid(&id, std::process::id());
    if task.status == TaskStatus::Queued {
        let cap = max_tasks(&ctx.env)?;
        loop {
            match store.claim_slot(&id, cap) {
                Ok(Claim::Claimed) => break,
                Ok(Claim::Full) => std::thread::sleep(Duration::from_millis(200)),
                Ok(Claim::Gone(_)) => return Ok(()),
                Err(e) => {
                    fail(&store, &e.to_string());
                    return Err(e.into());
                }
            }
            // Slots held by dead workers are given back.
            let _ = fail_dead_workers(&store);
        }
    } else if task.status.is_terminal() {
        return Ok(());
    }
    let request: DelegationRequest = match serde_json::from_str(&task.request_json) {
        Ok(request) => request,
        Err(e) => {
            fail(&store, &format!("unreadable task request: {e}"));
            return Ok(());
        }
    };
    record_servers(&project, id)?;
    let cancel = CancellationToken::new();
    let (done, heartbeat) = start_heartbeat(project.clone(), id, cancel.clone());
    let last_text = Arc::new(Mutex::new(String::new()));
    let progress = Progress {
        store: Store::open(&project)?,
        id,
        turns: 0,
        tokens: Usage::default(),
        last_text: Arc::clone(&last_text),
    };
    let progress = Mutex::new(progress);
    let mut observer = |label: &str, event: SubagentEvent| {
        if let Ok(mut p) = progress.lock() {
            p.on_event(label, event);
        }
    };
    let outcome = execute(&ctx.env, &request, &mut observer, Some(cancel.clone()));
    // Wakes the heartbeat thread at once: the result is recorded when the task ends, not at
    // the next beat.
    drop(done);
    let _ = heartbeat.join();
    let (turns, tokens) = progress
        .lock()
        .map(|p| (p.turns, p.tokens))
        .unwrap_or_default();
    match outcome {
        Ok(outcome) => {
            let _ = store.set_model(&id, &outcome.provider, &outcome.model);
            let cancelled = cancel.is_cancelled();
            let text = if cancelled {
                last_text.lock().map(|t| t.clone()).unwrap_or_default()
            } else {
                outcome.final_text()
            };
            let (status, error) = if cancelled {
                (TaskStatus::Cancelled, Some("cancelled".to_owned()))
            } else if outcome.error.is_some() {
                (TaskStatus::Failed, outcome.error.clone())
            } else {
                (TaskStatus::Completed, None)
            };
            let tokens = if cancelled {
                tokens
            } else {
                outcome.result.usage
            };
            let turns = if cancelled {
                turns
            } else {
                outcome.result.turns
            };
            store.set_warnings(&id, &outcome.result.warnings)?;
            store.finish(&id, status, Some(&text), error.as_deref(), tokens, turns)?;
            for note in &outcome.notes {
                eprintln!("{}", note.message);
            }
        }
        Err(error) => {
            let message = match &error {
                Error::Input(diags) => diags
                    .items
                    .iter()
                    .map(|d| d.message.clone())
                    .collect::<Vec<_>>()
                    .join("\n"),
                Error::Failed(message) => message.clone(),
                Error::Store(e) => e.to_string(),
                Error::Internal(message) => format!("internal error: {message}"),
                other => format!("{other:?}"),
            };
            let _ = store.finish(&id, TaskStatus::Failed, None, Some(&message), tokens, turns);
        }
    }
    Ok(())
}

/// Records in the store each MCP server the task starts and stops, for [`fail_dead_workers`].
fn record_servers(project: &std::path::Path, id: TaskId) -> Result<()> {
    let store = Mutex::new(Store::open(project)?);
    crate::mcp::on_server_change(Box::new(move |change| {
        let Ok(store) = store.lock() else {
            return;
        };
        let _ = match change {
            crate::mcp::ServerChange::Started { pgid, started } => {
                store.add_server(&id, pgid, started)
            }
            crate::mcp::ServerChange::Stopped { pgid } => store.remove_server(&id, pgid),
        };
    }));
    Ok(())
}

/// Starts the thread that proves the worker alive every [`HEARTBEAT`] and turns a cancel
/// request into `cancel`. It stops as soon as the returned sender is dropped (it waits on the
/// channel rather than sleeping), so a finished task is never held back for a beat.
fn start_heartbeat(
    project: std::path::PathBuf,
    id: TaskId,
    cancel: CancellationToken,
) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let handle = std::thread::spawn(move || {
        let Ok(store) = Store::open(&project) else {
            return;
        };
        loop {
            if matches!(store.heartbeat(&id), Ok(Control::Stop)) {
                cancel.cancel();
                return;
            }
            match finished.recv_timeout(HEARTBEAT) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    });
    (done, handle)
}

/// Writes a worker's progress to the store as events arrive.
struct Progress {
    store: Store,
    id: TaskId,
    turns: u32,
    tokens: Usage,
    last_text: Arc<Mutex<String>>,
}

impl Progress {
    fn on_event(&mut self, label: &str, event: SubagentEvent) {
        let line = match &event {
            // A turn counts once its reply has arrived (until then the task is still
            // initialising, as far as `--peek` is concerned).
            SubagentEvent::Turn { .. } | SubagentEvent::Framing { .. } => return,
            SubagentEvent::Tokens { total } => {
                self.tokens = *total;
                self.turns += 1;
                None
            }
            SubagentEvent::Text { text } => {
                if let Ok(mut last) = self.last_text.lock() {
                    last.clone_from(text);
                }
                return;
            }
            SubagentEvent::ToolCall { name, ok, summary } => Some(if *ok {
                format!("{name}: completed")
            } else {
                format!("{name}: failed: {summary}")
            }),
            _ => None,
        };
        crate::command::progress_line(label, crate::color::Palette::default(), event);
        if let Err(e) =
            self.store
                .record_progress(&self.id, self.turns, line.as_deref(), self.tokens)
        {
            eprintln!("summon: cannot record progress: {e}");
        }
    }
}
