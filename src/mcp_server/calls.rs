//! The tools' work, on a thread of its own per call: each delegation is a task of the
//! project's store run by a worker (`delegation::start`), waited for here while its tool
//! calls go to the client as progress; a cancelled call cancels its task.

use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::args::{Args, Object};
use super::session::Session;
use super::tools::{DELEGATE, LOAD, RUN_PIPELINE, SPAWN_AGENT};
use super::{Progress, Shared};
use crate::config::load_config;
use crate::delegation::{self, DelegationRequest, TaskStore, TaskView, format_secs};
use crate::error::Error;
use crate::source::{Catalog, SourceKind};
use crate::store::{TaskId, TaskStatus};

/// How often a running task is looked at.
const POLL: Duration = Duration::from_millis(200);
/// The longest a foreground call stays without a progress line, unless
/// `SUMMON_MCP_PROGRESS_SECS` says otherwise.
const QUIET: Duration = Duration::from_secs(20);
/// An answer longer than this (about 10,000 tokens) is cut, the whole text kept in a file.
const ANSWER_LIMIT: usize = 40_000;
/// The refusal of a nested delegation, in the seed's words.
pub(super) const NESTED: &str = "Delegated tasks cannot spawn further delegations";

/// What a call returns: its text, and whether it is an error the model should see.
pub(super) struct Reply {
    pub(super) text: String,
    pub(super) error: bool,
    /// The background task it started, for `structuredContent` and `_meta`.
    pub(super) task: Option<TaskId>,
}

impl Reply {
    fn ok(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            error: false,
            task: None,
        }
    }

    fn error(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            error: true,
            task: None,
        }
    }
}

/// One tool call: the server, the client's session, where its progress goes and whether
/// the client cancelled it.
pub(super) struct Call<'a> {
    pub(super) shared: &'a Shared,
    pub(super) session: &'a Session,
    pub(super) progress: &'a Progress,
    pub(super) cancel: &'a CancellationToken,
}

impl Call<'_> {
    /// Runs the tool `name`; argument errors and refusals are error replies naming the key.
    pub(super) fn run(&self, name: &str, args: &Object) -> Reply {
        let shared = self.shared;
        if shared.nested && [DELEGATE, SPAWN_AGENT, RUN_PIPELINE].contains(&name) {
            return Reply::error(NESTED);
        }
        let result = match name {
            LOAD => load(shared, self.session, args, self.cancel),
            DELEGATE => delegate(self, args),
            SPAWN_AGENT => spawn_agent(self, args),
            RUN_PIPELINE => super::pipeline::run(shared, args, self.progress, self.cancel),
            _ => Err(format!("Unknown tool `{}`", crate::text::printable(name))),
        };
        result.unwrap_or_else(Reply::error)
    }
}

/// The spend a new call may have: the session's cap (`--max-cost`, else the config file's
/// `max_cost`) less what the session's tasks spent or may still spend, held for the call
/// until its tasks are started; `None` without a cap.
fn allowance<'a>(
    shared: &Shared,
    session: &'a Session,
    config: &crate::config::Config,
) -> Result<Option<super::session::Held<'a>>, String> {
    let Some(cap) = shared.options.max_cost.or(config.max_cost) else {
        return Ok(None);
    };
    let tasks = open_tasks(shared)?;
    session
        .hold(cap, &tasks, config)
        .map(Some)
        .map_err(|committed| {
            format!(
                "This session's spend cap of {} is reached: its tasks spent or may still spend {}. \
A running task holds what it may spend until it ends. Start a new session, or raise the cap (summon mcp --max-cost, or max_cost in the config file).",
                crate::output::fmt_cost(cap),
                crate::output::fmt_cost(committed),
            )
        })
}

/// An agent's `tools` as the session's catalog froze them; `None` for any other source.
fn frozen_tools(shared: &Shared, source: Option<&str>) -> Option<delegation::RoleTools> {
    let name = source?;
    shared
        .listing
        .sources
        .iter()
        .find(|s| s.name == name && s.kind == SourceKind::Agent)
        .map(|s| delegation::RoleTools {
            tools: s.tools.clone(),
        })
}

/// An error as the model reads it: diagnostics rendered without colour.
pub(super) fn error_text(error: &Error, shared: &Shared) -> String {
    delegation::loading::error_text(error, &shared.env)
}

fn load(
    shared: &Shared,
    session: &Session,
    map: &Object,
    cancel: &CancellationToken,
) -> Result<Reply, String> {
    let args = Args::new(LOAD, map, &["source", "peek", "cancel"])?;
    let source = args.string("source")?;
    let (peek, stop) = (args.boolean("peek")?, args.boolean("cancel")?);
    // A wait that fits the host: short at first, longer each time the host waited it out,
    // never as long as a call it gave up on (see Session::load_started).
    let most = shared
        .options
        .call_wait
        .map_or(shared.options.load_wait, |c| {
            c.min(shared.options.load_wait)
        });
    let waiting = source
        .as_deref()
        .filter(|_| !peek && !stop)
        .map(|s| (s, session.load_started(s, most)));
    let wait = waiting.as_ref().map_or(most, |(_, (w, _))| *w);
    let superseded = waiting.as_ref().map(|(_, (_, token))| token.clone());
    let interrupted = || {
        cancel.is_cancelled()
            || shared.shutdown.is_cancelled()
            || superseded
                .as_ref()
                .is_some_and(CancellationToken::is_cancelled)
    };
    let answer = |id: &str, answer: &str| sized(shared, id, answer, ANSWER_LIMIT);
    let owns = |id: &TaskId| session.owns(id);
    let delivered = |id: &TaskId| session.was_delivered(id);
    let started = std::time::Instant::now();
    let sources = shared.sources();
    let loaded = delegation::loading::Loading {
        env: &shared.env,
        catalog: &sources.catalog,
        listing: &sources.listing,
        wait,
        interrupted: &interrupted,
        answer: &answer,
        tool: LOAD,
        owned: Some(&owns),
        delivered: Some(&delivered),
    }
    .load(source.as_deref(), peek, stop);
    if let Some((source, (wait, token))) = &waiting {
        let cut = cancel.is_cancelled() && !shared.shutdown.is_cancelled();
        session.load_ended(source, token, *wait, started.elapsed(), cut);
    }
    let mut text = loaded?;
    if source.is_none() && !shared.nested && !sources.listing.sources.is_empty() {
        text.push_str("Use delegate(source: name) to run as subagent.\n");
    }
    Ok(Reply::ok(text))
}

fn open_tasks(shared: &Shared) -> Result<TaskStore, String> {
    TaskStore::open(&shared.env).map_err(|e| error_text(&e, shared))
}

/// A finished task: what it was, how it went, and its answer (cut when long).
fn result_text(shared: &Shared, view: &TaskView) -> String {
    let answer = |id: &str, answer: &str| sized(shared, id, answer, ANSWER_LIMIT);
    delegation::loading::Loading {
        env: &shared.env,
        catalog: &shared.catalog,
        listing: &shared.listing,
        wait: shared.options.load_wait,
        interrupted: &|| false,
        answer: &answer,
        tool: LOAD,
        owned: None,
        delivered: None,
    }
    .result_text(view)
}

/// An answer sized for a model: above `limit` bytes it is cut at a character boundary, with
/// its size and the file holding the whole text (`.summon/mcp/NAME.md`).
pub(super) fn sized(shared: &Shared, name: &str, answer: &str, limit: usize) -> String {
    if answer.len() <= limit {
        return answer.to_owned();
    }
    let mut cut = answer.to_owned();
    crate::text::truncate_at_boundary(&mut cut, limit);
    let dir = shared.env.cwd.join(".summon").join("mcp");
    let path = dir.join(format!("{name}.md"));
    let kept = std::fs::create_dir_all(&dir)
        .and_then(|()| crate::safe_fs::write_replacing(&path, answer.as_bytes()));
    let size = format!(
        "{} characters, about {} tokens",
        answer.chars().count(),
        answer.len().div_ceil(4)
    );
    match kept {
        Ok(()) => format!(
            "{cut}\n\n[The answer was cut here: it has {size}. The whole text is in {}]",
            path.display()
        ),
        Err(e) => format!(
            "{cut}\n\n[The answer was cut here: it has {size}; writing the whole text to {} failed: {e}]",
            path.display()
        ),
    }
}

/// A `delegate` call's arguments as a request, checked as `summon delegate` checks them;
/// and whether it asks for `async`.
fn delegate_request(map: &Object) -> Result<(DelegationRequest, bool), String> {
    let args = Args::new(
        DELEGATE,
        map,
        &[
            "instructions",
            "source",
            "parameters",
            "extensions",
            "provider",
            "model",
            "temperature",
            "max_turns",
            "context",
            "working_dir",
            "async",
        ],
    )?;
    let request = DelegationRequest {
        source: args.string("source")?,
        instructions: args.string("instructions")?,
        params: args.values("parameters")?,
        extensions: args.strings("extensions")?.map(|list| {
            list.iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        }),
        provider: args.string("provider")?,
        model: args.string("model")?,
        temperature: args.number("temperature")?,
        max_turns: args.count("max_turns")?,
        context: args.string("context")?,
        working_dir: args.string("working_dir")?.map(Into::into),
        ..DelegationRequest::default()
    };
    let background = args.boolean("async")?;
    if request.instructions.is_none() && request.source.is_none() {
        return Err("delegate: nothing to do: give `instructions`, `source`, or both".into());
    }
    if request
        .instructions
        .as_deref()
        .is_some_and(|task| task.trim().is_empty())
    {
        return Err("delegate: `instructions` is blank: give the subagent a task, or leave it out to run the source's own prompt".into());
    }
    if request.source.is_none() && !request.params.is_empty() {
        return Err("delegate: `parameters` needs `source`".into());
    }
    Ok((request, background))
}

/// A `delegate` call made a task of the tasks extension: started as a background task of
/// the store at once (queued when every slot is taken); its id is the protocol task's id.
pub(super) fn start_task(
    shared: &Shared,
    session: &Session,
    map: &Object,
    trace: Option<&str>,
) -> Result<crate::store::TaskRecord, String> {
    let (mut request, _) = delegate_request(map)?;
    let (config, _) = load_config(&shared.env).map_err(|d| error_text(&Error::Input(d), shared))?;
    request.role_tools = frozen_tools(shared, request.source.as_deref());
    let held = allowance(shared, session, &config)?;
    request.max_cost = held.as_ref().map(super::session::Held::amount);
    let env = super::traced_env(shared, trace);
    let started = delegation::start(&env, &config, &shared.sources().catalog, &request, true)
        .map_err(|e| error_text(&e, shared))?;
    session.started(started.id, request.max_cost);
    drop(held);
    let tasks = open_tasks(shared)?;
    delegation::peek(&tasks, &started.id)
        .map(|view| view.task)
        .map_err(|e| e.to_string())
}

/// A task id of the session: another session's task, or one that does not exist, is
/// unknown.
fn own_task(session: &Session, id: &str) -> Result<TaskId, String> {
    let unknown = || format!("unknown task `{}`", crate::text::printable(id));
    let id: TaskId = id.parse().map_err(|_| unknown())?;
    if session.owns(&id) {
        Ok(id)
    } else {
        Err(unknown())
    }
}

/// A task of the tasks extension as it is now: its record and, once it ended, the text a
/// `delegate` call would have returned and whether that is an error.
pub(super) fn task_state(
    shared: &Shared,
    session: &Session,
    id: &str,
) -> Result<(crate::store::TaskRecord, Option<Reply>), String> {
    let id = own_task(session, id)?;
    let tasks = open_tasks(shared)?;
    let view = delegation::peek(&tasks, &id).map_err(|e| e.to_string())?;
    let done = view.task.status.is_terminal().then(|| Reply {
        text: result_text(shared, &view),
        error: view.task.status != TaskStatus::Completed,
        task: None,
    });
    Ok((view.task, done))
}

/// `tasks/cancel`: the task's worker is asked to stop, then killed with its process group.
pub(super) fn cancel_task(shared: &Shared, session: &Session, id: &str) -> Result<(), String> {
    let id = own_task(session, id)?;
    let tasks = open_tasks(shared)?;
    let grace = delegation::cancel_grace(&shared.env).map_err(|e| error_text(&e, shared))?;
    delegation::cancel(&tasks, &id, grace).map_err(|e| e.to_string())?;
    Ok(())
}

fn delegate(call: &Call<'_>, map: &Object) -> Result<Reply, String> {
    let shared = call.shared;
    let (mut request, background) = delegate_request(map)?;
    let (config, _) = load_config(&shared.env).map_err(|d| error_text(&Error::Input(d), shared))?;
    request.role_tools = frozen_tools(shared, request.source.as_deref());
    if background {
        let held = allowance(shared, call.session, &config)?;
        request.max_cost = held.as_ref().map(super::session::Held::amount);
        let started = delegation::start(
            &call.progress.env(shared),
            &config,
            &shared.sources().catalog,
            &request,
            false,
        )
        .map_err(|e| error_text(&e, shared))?;
        call.session.started(started.id, request.max_cost);
        drop(held);
        let queued = if started.status == TaskStatus::Queued {
            " (queued until a slot is free)"
        } else {
            ""
        };
        let mut reply = Reply::ok(format!(
            "Task started in background: {id} (\"{description}\"){queued}\n\
Continue with other work. When you need the result, use load(source: \"{id}\").",
            id = started.id,
            description = started.description,
        ));
        reply.task = Some(started.id);
        return Ok(reply);
    }
    let label = request.source.clone().unwrap_or_else(|| "task".into());
    let held = allowance(shared, call.session, &config)?;
    request.max_cost = held.as_ref().map(super::session::Held::amount);
    // Where the host does not wait for the whole task (`--call-wait`, or a call it gave up
    // on before), the call answers in time with the task, which the host collects with load.
    let most = match (shared.options.call_wait, call.session.patience()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let sources = shared.sources();
    let view = match foreground_for(
        call,
        &config,
        &sources.catalog,
        &request,
        &label,
        held,
        most,
    )? {
        Watched::Done(view) => view,
        Watched::Running(view) => {
            let id = view.task.id;
            let mut reply = Reply::ok(format!(
                "Task {id} (\"{description}\") is still running after {elapsed}, longer than this host waits for a call, so it goes on in the background.\n\
Continue with other work. When you need the result, use load(source: \"{id}\").",
                description = view.task.description,
                elapsed = format_secs(view.elapsed_secs),
            ));
            reply.task = Some(id);
            return Ok(reply);
        }
    };
    let failed = view.task.status != TaskStatus::Completed;
    call.session.delivered(view.task.id);
    let text = result_text(shared, &view);
    Ok(Reply {
        text,
        error: failed,
        task: None,
    })
}

/// Runs a delegation as a task of the store and waits for it, its tool calls sent as
/// progress lines; a cancelled call (or a closed client) cancels the task. `held` is the
/// session's spend held for it, given up once the task is recorded as the session's.
fn foreground(
    call: &Call<'_>,
    config: &crate::config::Config,
    catalog: &Catalog,
    request: &DelegationRequest,
    label: &str,
    held: Option<super::session::Held<'_>>,
) -> Result<TaskView, String> {
    match foreground_for(call, config, catalog, request, label, held, None)? {
        Watched::Done(view) | Watched::Running(view) => Ok(view),
    }
}

/// How a watched task stands when its call answers.
enum Watched {
    Done(TaskView),
    /// Still running when the call's time (`most`) was up: it goes on, the session's to
    /// collect, and stops with the server as foreground work does.
    Running(TaskView),
}

/// [`foreground`], answering after `most` at the latest.
fn foreground_for(
    call: &Call<'_>,
    config: &crate::config::Config,
    catalog: &Catalog,
    request: &DelegationRequest,
    label: &str,
    held: Option<super::session::Held<'_>>,
    most: Option<Duration>,
) -> Result<Watched, String> {
    let shared = call.shared;
    let started = delegation::start(&call.progress.env(shared), config, catalog, request, true)
        .map_err(|e| error_text(&e, shared))?;
    let id = started.id;
    call.session.started(id, request.max_cost);
    drop(held);
    shared.track(id, true);
    let outcome = watch(shared, id, label, call.progress, call.cancel, most);
    match &outcome {
        // Still the server's: a stop of the server stops it, and its end is not waited for.
        Ok(Watched::Running(_)) => {}
        _ => shared.track(id, false),
    }
    if call.cancel.is_cancelled() && !shared.shutdown.is_cancelled() {
        // The host gave up on the call: its later calls answer sooner.
        call.session.gave_up(started_at(&outcome));
    }
    outcome
}

/// How long a watched task had run when its call answered.
fn started_at(outcome: &Result<Watched, String>) -> Duration {
    match outcome {
        Ok(Watched::Done(view) | Watched::Running(view)) => {
            Duration::from_secs_f64(view.elapsed_secs.max(0.0))
        }
        Err(_) => Duration::ZERO,
    }
}

fn watch(
    shared: &Shared,
    id: TaskId,
    label: &str,
    progress: &Progress,
    cancel: &CancellationToken,
    most: Option<Duration>,
) -> Result<Watched, String> {
    let began = std::time::Instant::now();
    let tasks = open_tasks(shared)?;
    let mut seen = 0u64;
    let mut said = std::time::Instant::now();
    let quiet = shared
        .env
        .var("SUMMON_MCP_PROGRESS_SECS")
        .and_then(|v| v.parse().ok())
        .map_or(QUIET, Duration::from_secs);
    loop {
        let collected = delegation::wait(&tasks, &id, POLL).map_err(|e| e.to_string())?;
        let task = &collected.view.task;
        if task.tool_calls > seen {
            let new = usize::try_from(task.tool_calls - seen).unwrap_or(usize::MAX);
            let lines = &task.recent_tool_calls;
            for line in &lines[lines.len().saturating_sub(new)..] {
                progress.line(&format!("[subagent {label}] {line}"));
            }
            seen = task.tool_calls;
            said = std::time::Instant::now();
        } else if said.elapsed() >= quiet && !task.status.is_terminal() {
            // A long model turn: a line anyway, so hosts that abort quiet calls wait.
            progress.line(&format!(
                "[subagent {label}] working: {}, {} elapsed",
                crate::plural::count(task.turns, "turn"),
                format_secs(collected.view.elapsed_secs)
            ));
            said = std::time::Instant::now();
        }
        if !collected.still_running {
            return Ok(Watched::Done(collected.view));
        }
        // When the server stops, its own stop ends the task at once (the task stays
        // tracked until then).
        if cancel.is_cancelled() && !shared.shutdown.is_cancelled() {
            let grace =
                delegation::cancel_grace(&shared.env).map_err(|e| error_text(&e, shared))?;
            let cancelled = delegation::cancel(&tasks, &id, grace).map_err(|e| e.to_string())?;
            return Ok(Watched::Done(cancelled.view));
        }
        if most.is_some_and(|most| began.elapsed() >= most) {
            return Ok(Watched::Running(collected.view));
        }
    }
}

struct SpawnTask {
    agent: Option<String>,
    task: String,
}

fn spawn_tasks(map: &Object) -> Result<Vec<SpawnTask>, String> {
    let args = Args::new(SPAWN_AGENT, map, &["tasks"])?;
    let Some(raw) = args.raw("tasks") else {
        return Err("spawn_agent: missing argument `tasks` (a list of {\"agent\": name or null, \"task\": text})".into());
    };
    let Value::Array(items) = raw else {
        return Err(format!(
            "spawn_agent: argument `tasks` must be a list, found {}",
            super::args::kind_of(raw)
        ));
    };
    if items.is_empty() {
        return Err("spawn_agent: argument `tasks` is empty: give at least one task".into());
    }
    let mut tasks = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let Value::Object(object) = item else {
            return Err(format!(
                "spawn_agent: `tasks[{i}]` must be an object {{\"agent\": name or null, \"task\": text}}, found {}",
                super::args::kind_of(item)
            ));
        };
        if let Some(key) = object.keys().find(|k| *k != "agent" && *k != "task") {
            return Err(format!(
                "spawn_agent: `tasks[{i}]` has an unknown key `{}`; a task has exactly `agent` and `task`",
                crate::text::printable(key)
            ));
        }
        let agent = match object.get("agent") {
            None => {
                return Err(format!(
                    "spawn_agent: `tasks[{i}]` has no `agent` key: give a subagent name, or null for a general subagent (where null does not reach the server, call delegate with the task as its instructions)"
                ));
            }
            Some(Value::Null) => None,
            Some(Value::String(name)) => Some(name.clone()),
            Some(other) => {
                return Err(format!(
                    "spawn_agent: `tasks[{i}].agent` must be a name or null, found {}",
                    super::args::kind_of(other)
                ));
            }
        };
        let task = match object.get("task") {
            None => return Err(format!("spawn_agent: `tasks[{i}]` has no `task` key")),
            Some(Value::String(text)) if text.trim().is_empty() => {
                return Err(format!("spawn_agent: `tasks[{i}].task` is blank"));
            }
            Some(Value::String(text)) => text.clone(),
            Some(other) => {
                return Err(format!(
                    "spawn_agent: `tasks[{i}].task` must be a string, found {}",
                    super::args::kind_of(other)
                ));
            }
        };
        tasks.push(SpawnTask { agent, task });
    }
    Ok(tasks)
}

/// How one spawned task ended.
struct Spawned {
    status: String,
    /// `task ID`, or `not started`.
    started: String,
    requests: u32,
    tool_calls: u64,
    text: String,
}

fn spawn_agent(call: &Call<'_>, map: &Object) -> Result<Reply, String> {
    let shared = call.shared;
    let tasks = spawn_tasks(map)?;
    let most = shared.options.max_spawn;
    if tasks.len() > most {
        return Err(format!(
            "spawn_agent: {} tasks in one call; the most is {most} (summon mcp --max-spawn). Split the work over several calls.",
            tasks.len()
        ));
    }
    // Every name is checked against the session's catalog before anything runs.
    for task in &tasks {
        if let Some(name) = &task.agent {
            let known = shared
                .catalog
                .get(name)
                .is_some_and(|s| s.kind == SourceKind::Agent);
            if !known {
                let names: Vec<&str> = shared
                    .listing
                    .of_kind(SourceKind::Agent)
                    .map(|s| s.name.as_str())
                    .collect();
                let names = if names.is_empty() {
                    "The catalog is empty.".to_owned()
                } else if names.len() > super::tools::CATALOG_ROLES {
                    format!(
                        "The names: {}, and {} more (load() lists them).",
                        names[..super::tools::CATALOG_ROLES].join(", "),
                        names.len() - super::tools::CATALOG_ROLES
                    )
                } else {
                    format!("The names: {}.", names.join(", "))
                };
                return Err(format!(
                    "Subagent \"{}\" is not in this session's catalog. Use a name from it, or null for a general subagent. {names}",
                    crate::text::printable(name)
                ));
            }
        }
    }
    let (config, _) = load_config(&shared.env).map_err(|d| error_text(&Error::Input(d), shared))?;
    // The call's tasks share what the session may still spend, in equal parts: together
    // they stay within it.
    let held = allowance(shared, call.session, &config)?;
    let share = held.as_ref().map(|held| held.amount() / tasks.len() as f64);
    // The role text is read as each subagent starts; its tools are the session's.
    let current = crate::source::discover(crate::source::search_dirs(&shared.env));
    let total = tasks.len();
    let results: Vec<Spawned> = std::thread::scope(|scope| {
        let handles: Vec<_> = tasks
            .iter()
            .enumerate()
            .map(|(i, task)| {
                let (config, current) = (&config, &current);
                scope.spawn(move || {
                    let label = match &task.agent {
                        Some(name) => format!("{}/{total} {name}", i + 1),
                        None => format!("{}/{total}", i + 1),
                    };
                    spawn_one(call, config, current, task, &label, share)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| Spawned {
                    status: "failed".into(),
                    started: "not started".into(),
                    requests: 0,
                    tool_calls: 0,
                    text: "the task's thread panicked".into(),
                })
            })
            .collect()
    });
    drop(held);
    let count = |status: &str| results.iter().filter(|r| r.status == status).count();
    let mut text = format!(
        "Subagent results: {total} tasks, {} completed, {} failed, {} cancelled.\n",
        count("completed"),
        count("failed"),
        count("cancelled"),
    );
    let limit = (ANSWER_LIMIT / total).max(4_000);
    for (i, (task, result)) in tasks.iter().zip(&results).enumerate() {
        let role = task
            .agent
            .as_deref()
            .map(|n| format!(" {n}"))
            .unwrap_or_default();
        let requests = crate::plural::count(result.requests, "request");
        let calls = crate::plural::count(result.tool_calls, "tool call");
        text.push_str(&format!(
            "\n[{}/{total}{role}] {} · {} · {requests}, {calls}\n",
            i + 1,
            result.status,
            result.started,
        ));
        let name = match result.started.strip_prefix("task ") {
            Some(id) => id.to_owned(),
            None => format!("spawn-{}", i + 1),
        };
        let body = sized(shared, &name, result.text.trim_end(), limit);
        if !body.is_empty() {
            text.push_str(&body);
            text.push('\n');
        }
    }
    // Every task failed or was cancelled: the call failed.
    if count("completed") == 0 {
        return Ok(Reply::error(text));
    }
    Ok(Reply::ok(text))
}

fn spawn_one(
    call: &Call<'_>,
    config: &crate::config::Config,
    current: &Catalog,
    task: &SpawnTask,
    label: &str,
    share: Option<f64>,
) -> Spawned {
    let shared = call.shared;
    let not_started = |text: String| Spawned {
        status: "failed".into(),
        started: "not started".into(),
        requests: 0,
        tool_calls: 0,
        text,
    };
    if let Some(name) = &task.agent {
        // The session's entry; the file must still define the role.
        let path = shared
            .catalog
            .get(name)
            .map(|s| s.path.clone())
            .unwrap_or_default();
        let shown = crate::diag::render::display_path(&path, &shared.env.cwd);
        if let Err(e) = std::fs::read(&path) {
            return not_started(format!("Cannot read {shown}: {e}"));
        }
        let still = current
            .get(name)
            .is_some_and(|s| s.kind == SourceKind::Agent && s.path == path);
        if !still {
            let why = current
                .unusable(name)
                .unwrap_or_else(|| format!("it no longer defines the subagent \"{name}\""));
            return not_started(format!("Cannot read {shown}: {why}"));
        }
    }
    let request = DelegationRequest {
        source: task.agent.clone(),
        instructions: Some(task.task.clone()),
        role_tools: frozen_tools(shared, task.agent.as_deref()),
        max_cost: share,
        ..DelegationRequest::default()
    };
    match foreground(call, config, current, &request, label, None) {
        Err(message) => not_started(message),
        Ok(view) => {
            call.session.delivered(view.task.id);
            let task = &view.task;
            let mut text = view.answer().to_owned();
            if let Some(error) = &task.error {
                text = if text.is_empty() {
                    format!("Error: {error}")
                } else {
                    format!("Error: {error}\n{text}")
                };
            }
            // What the task's block says first: its role's listed tools that were left out
            // (`Listed tools not available, left out: ...`), and its other warnings.
            for warning in task.warnings.iter().rev() {
                text = format!("{warning}\n{text}");
            }
            Spawned {
                status: task.status.as_str().to_owned(),
                started: format!("task {}", task.id),
                requests: task.turns,
                tool_calls: task.tool_calls,
                text,
            }
        }
    }
}
