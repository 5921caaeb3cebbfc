//! Running a delegation in a detached background worker.
//!
//! [`start`] records the task in the store (`.summon/state.db`), which allocates its id and
//! takes a slot under `SUMMON_MAX_BACKGROUND_TASKS` in one transaction, then starts
//! `summon __worker ID` in a new session (so the caller's exit or Ctrl-C does not reach it),
//! with its output in `.summon/tasks/ID.log`, and returns. The worker ([`run_worker`]):
//!
//! ```text
//! queued? -> wait for a slot (claim_slot) -> prepare -> agent loop -> finish
//!            heartbeat thread: every second, heartbeat(); a cancel request stops the loop;
//!            the end of the task wakes it, so the result is recorded at once
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::{Config, load_config};
use crate::diag::Diagnostic;
use crate::env::Env;
use crate::error::{Error, Result};
use crate::provider::Usage;
use crate::source::Catalog;
use crate::store::{Claim, Control, Store, StoreError, TaskId, TaskStatus};
use crate::subagent::SubagentEvent;

use super::request::DelegationRequest;
use super::run::{DelegationOutcome, Observer, ready, run};
use super::tasks::{TaskStore, fail_dead_workers, max_tasks};

/// How often a worker proves it is alive.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// A background task just started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Started {
    pub(crate) id: TaskId,
    /// `running`, or `queued` until a slot is free.
    pub(crate) status: TaskStatus,
    pub(crate) description: String,
    /// How many tasks may run at once.
    pub(crate) cap: usize,
}

/// Starts a delegation as a background task: checks it as the foreground would, records the
/// task (queued when `queue` is set and every slot is taken, else refused), and starts its
/// worker.
pub(crate) fn start(
    env: &Env,
    config: &Config,
    catalog: &Catalog,
    request: &DelegationRequest,
    queue: bool,
) -> Result<Started> {
    // Everything the foreground refuses is refused here, before a task exists.
    drop(ready(env, config, catalog, request)?);
    let cap = max_tasks(env)?;
    let tasks = TaskStore::open(env)?;
    let store = tasks.store();
    let description = request.description();
    let task = create_signed(env, store, request, cap, queue)?;
    let pid = match spawn_worker(store, &task.id, env) {
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
    Ok(Started {
        id: task.id,
        status: task.status,
        description,
        cap,
    })
}

/// Records `request` as a background task ([`Store::create_task`]) and signs it with the
/// user's key before any worker can start: the worker runs only a request summon wrote
/// (the store is in the project, where a model's commands may write).
fn create_signed(
    env: &Env,
    store: &Store,
    request: &DelegationRequest,
    cap: usize,
    queue: bool,
) -> Result<crate::store::TaskRecord> {
    let request_json = serde_json::to_string(request)
        .map_err(|e| Error::internal(format!("cannot encode the task request: {e}")))?;
    let task = store.create_task(
        &request.description(),
        request.source.as_deref(),
        &request_json,
        cap,
        queue,
    )?;
    if let Some(key) = crate::store::sign::env_key(env) {
        let mac = crate::store::sign::task_request_mac(&key, &task.id.to_string(), &request_json);
        store.sign_task_request(&task.id, &mac)?;
    }
    Ok(task)
}

/// Starts `summon __worker ID` in its own session, output to the task's log file.
fn spawn_worker(store: &Store, id: &TaskId, env: &Env) -> std::io::Result<u32> {
    use process_wrap::std::{CommandWrap, ProcessSession};
    let log_path = store.task_log_path(id);
    if let Some(dir) = log_path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let log = crate::safe_fs::create_log(&log_path)?;
    let exe = std::env::current_exe()?;
    let mut command = std::process::Command::new(exe);
    command
        .arg("__worker")
        .arg(id.to_string())
        .current_dir(&env.cwd)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // `--trust` stands for the variable; the worker reads the environment.
    if let Some(value) = env.var(crate::config::trust::TRUST_ENV) {
        command.env(crate::config::trust::TRUST_ENV, value);
    }
    // The worker's trace joins its starter's (a `summon mcp` call's span).
    if let Some(value) = env.var("TRACEPARENT") {
        command.env("TRACEPARENT", value);
    }
    let mut wrapped = CommandWrap::from(command);
    wrapped.wrap(ProcessSession);
    let mut child = wrapped.spawn()?;
    let pid = child.id();
    // Waited for on a thread of its own, so a long-lived starter (`summon mcp`) keeps no
    // zombie per task; a starter that exits first leaves the worker to init.
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    Ok(pid)
}

/// The work of a background task's worker process: waits for a slot when the task is
/// queued, runs the delegation with its events sent to `observer` and its progress recorded,
/// and records the result. Returns the notes of preparing it (config warnings first), for
/// the task's log.
pub(crate) fn run_worker(
    env: &Env,
    id: TaskId,
    observer: &mut Observer<'_>,
) -> Result<Vec<Diagnostic>> {
    // The store its caller created or found; the worker runs in the caller's directory.
    let store = Store::open_for(env)?;
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
        let cap = max_tasks(env)?;
        match wait_for_slot(&store, id, cap) {
            Ok(true) => {}
            Ok(false) => return Ok(Vec::new()),
            Err(e) => {
                fail(&store, &e.to_string());
                return Err(e.into());
            }
        }
    } else if task.status.is_terminal() {
        return Ok(Vec::new());
    }
    if let Some(key) = crate::store::sign::env_key(env) {
        let mac = crate::store::sign::task_request_mac(&key, &id.to_string(), &task.request_json);
        if task.request_mac.as_deref() != Some(mac.as_str()) {
            fail(
                &store,
                "the task's request in the store does not carry summon's signature (it was \
                 written or changed by something other than summon): not run; start the task \
                 again",
            );
            return Ok(Vec::new());
        }
    }
    let request: DelegationRequest = match serde_json::from_str(&task.request_json) {
        Ok(request) => request,
        Err(e) => {
            fail(&store, &format!("unreadable task request: {e}"));
            return Ok(Vec::new());
        }
    };
    record_servers(&project, id)?;
    let cancel = CancellationToken::new();
    let (done, heartbeat) =
        start_heartbeat(Store::open(&project)?, project.clone(), id, cancel.clone());
    let last_text = Arc::new(Mutex::new(String::new()));
    let progress = Progress {
        store: Store::open(&project)?,
        id,
        turns: 0,
        tokens: Usage::default(),
        last_text: Arc::clone(&last_text),
        observer,
    };
    let progress = Mutex::new(progress);
    let mut recording = |label: &str, event: SubagentEvent| {
        if let Ok(mut p) = progress.lock() {
            p.on_event(label, event);
        }
    };
    // The catalog is read as the task starts, as a foreground delegation reads it.
    let outcome = load_config(env)
        .map_err(Error::Input)
        .and_then(|(config, warnings)| {
            let catalog = crate::source::discover(crate::source::search_dirs(env));
            let outcome = run(
                env,
                &config,
                &catalog,
                &request,
                &mut recording,
                Some(cancel.clone()),
            )?;
            Ok((outcome, warnings))
        });
    // Wakes the heartbeat thread at once: the result is recorded when the task ends, not at
    // the next beat.
    drop(done);
    let _ = heartbeat.join();
    let (turns, tokens) = progress
        .lock()
        .map(|p| (p.turns, p.tokens))
        .unwrap_or_default();
    match outcome {
        Ok((outcome, warnings)) => {
            // A cancelled task keeps what it produced so far.
            let so_far = cancel.is_cancelled().then(|| {
                let text = last_text.lock().map(|t| t.clone()).unwrap_or_default();
                (text, turns, tokens)
            });
            record_outcome(&store, id, &outcome, so_far)?;
            let mut notes = warnings.items;
            notes.extend(outcome.notes);
            Ok(notes)
        }
        Err(error) => {
            let message = failure_message(&error);
            let _ = store.finish(&id, TaskStatus::Failed, None, Some(&message), tokens, turns);
            Ok(Vec::new())
        }
    }
}

/// Records how a task ended: completed or failed as `outcome` says, or cancelled with what it
/// produced so far (`so_far`: the last text, turns and tokens).
fn record_outcome(
    store: &Store,
    id: TaskId,
    outcome: &DelegationOutcome,
    so_far: Option<(String, u32, Usage)>,
) -> Result<()> {
    let _ = store.set_model(&id, &outcome.model.provider, &outcome.model.model);
    let (status, error, (text, turns, tokens)) = match so_far {
        Some(so_far) => (TaskStatus::Cancelled, Some("cancelled"), so_far),
        None => {
            let ended = (outcome.answer(), outcome.turns, outcome.usage);
            match &outcome.error {
                Some(error) => (TaskStatus::Failed, Some(error.message.as_str()), ended),
                None => (TaskStatus::Completed, None, ended),
            }
        }
    };
    store.set_warnings(&id, &outcome.warnings)?;
    store.finish(&id, status, Some(&text), error, tokens, turns)?;
    Ok(())
}

/// Waits until the queued task `id` holds one of the `cap` slots: `false` when it stopped
/// waiting (cancelled, failed, or gone).
fn wait_for_slot(store: &Store, id: TaskId, cap: usize) -> Result<bool, StoreError> {
    loop {
        match store.claim_slot(&id, cap)? {
            Claim::Claimed => return Ok(true),
            Claim::Full => std::thread::sleep(Duration::from_millis(200)),
            Claim::Gone(_) => return Ok(false),
        }
        // Slots held by dead workers are given back.
        let _ = fail_dead_workers(store);
    }
}

/// The error of a task that could not run, as recorded for `summon load`.
fn failure_message(error: &Error) -> String {
    match error {
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
    }
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
/// channel rather than sleeping), so a finished task is never held back for a beat. `store` is
/// opened by the caller while the project is there: opened on the thread, after the project
/// folder was deleted, it would make the folder again.
fn start_heartbeat(
    store: Store,
    project: std::path::PathBuf,
    id: TaskId,
    cancel: CancellationToken,
) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let handle = std::thread::spawn(move || {
        loop {
            // A project folder deleted under the task (a temporary one, say) ends it too:
            // nobody is left to collect it.
            let gone = !project.join(crate::store::DIR_NAME).is_dir();
            if gone || matches!(store.heartbeat(&id), Ok(Control::Stop)) {
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

/// Writes a worker's progress to the store as events arrive, and passes each event on.
struct Progress<'a> {
    store: Store,
    id: TaskId,
    turns: u32,
    tokens: Usage,
    last_text: Arc<Mutex<String>>,
    observer: &'a mut Observer<'a>,
}

impl Progress<'_> {
    fn on_event(&mut self, label: &str, event: SubagentEvent) {
        let line = match &event {
            // A turn counts once its reply has arrived (until then the task is still
            // initialising, as far as `--peek` is concerned).
            SubagentEvent::Turn { .. } | SubagentEvent::Framing { .. } => {
                (self.observer)(label, event);
                return;
            }
            SubagentEvent::Tokens { total } => {
                self.tokens = *total;
                self.turns += 1;
                None
            }
            SubagentEvent::Text { text } => {
                if let Ok(mut last) = self.last_text.lock() {
                    last.clone_from(text);
                }
                (self.observer)(label, event);
                return;
            }
            SubagentEvent::ToolCall { name, ok, summary } => Some(if *ok {
                format!("{name}: completed")
            } else {
                format!("{name}: failed: {summary}")
            }),
            _ => None,
        };
        (self.observer)(label, event);
        if let Err(e) =
            self.store
                .record_progress(&self.id, self.turns, line.as_deref(), self.tokens)
        {
            let message = format!("cannot record progress: {e}");
            (self.observer)(label, SubagentEvent::Warning { message });
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use summon_mock_llm::{MockConfig, Reply};

    use super::*;
    use crate::delegation::test_support::MockProject;

    #[test]
    fn the_worker_records_progress_and_the_result_and_passes_events_on() {
        let mock = MockProject::start(MockConfig::new().replies([
            Reply::tool_call("read_file", json!({"path": "notes.md"})),
            Reply::text("the summary"),
        ]));
        let request = DelegationRequest {
            instructions: Some("summarise notes.md".into()),
            ..DelegationRequest::default()
        };
        let store = Store::open_for(&mock.env).unwrap();
        let task = create_signed(&mock.env, &store, &request, 5, false).unwrap();
        let mut seen = Vec::new();
        let mut observer = |label: &str, event: SubagentEvent| {
            if let SubagentEvent::ToolCall { name, ok, .. } = event {
                seen.push(format!("{label} {name} {ok}"));
            }
        };
        let notes = run_worker(&mock.env, task.id, &mut observer).unwrap();
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(seen, ["task read_file true"]);

        let done = store.get(&task.id).unwrap().unwrap();
        assert_eq!(done.status, TaskStatus::Completed);
        assert_eq!(done.output.as_deref(), Some("the summary"));
        assert_eq!(done.error, None);
        assert_eq!((done.turns, done.tool_calls), (2, 1));
        assert_eq!(done.recent_tool_calls, ["read_file: completed"]);
        assert_eq!(done.pid, Some(std::process::id()));
        assert_eq!(done.model.as_deref(), Some("mock-model"));
        assert!(done.tokens.input_tokens > 0);
    }

    #[test]
    fn the_worker_records_a_task_that_cannot_be_prepared_as_failed() {
        let mock = MockProject::start(MockConfig::new().default_reply(Reply::text("no")));
        let request = DelegationRequest {
            source: Some("nowhere".into()),
            ..DelegationRequest::default()
        };
        let store = Store::open_for(&mock.env).unwrap();
        let id = create_signed(&mock.env, &store, &request, 5, false)
            .unwrap()
            .id;
        let mut events = 0;
        let notes = run_worker(&mock.env, id, &mut |_: &str, _: SubagentEvent| events += 1);
        assert!(notes.unwrap().is_empty());
        assert_eq!(events, 0);
        let failed = store.get(&id).unwrap().unwrap();
        assert_eq!(failed.status, TaskStatus::Failed);
        assert_eq!(
            failed.error.as_deref(),
            Some("Source 'nowhere' not found. Use summon load to see available sources.")
        );
        assert!(mock.server.requests().is_empty());
    }

    #[test]
    fn the_worker_runs_no_request_changed_in_the_store() {
        let mock = MockProject::start(MockConfig::new().default_reply(Reply::text("ran")));
        let request = DelegationRequest {
            instructions: Some("summarise notes.md".into()),
            ..DelegationRequest::default()
        };
        let store = Store::open_for(&mock.env).unwrap();
        let signed = create_signed(&mock.env, &store, &request, 5, false).unwrap();
        // What a command that can write the project could do between the start and its worker.
        let forged = DelegationRequest {
            instructions: Some("something else entirely".into()),
            ..request.clone()
        };
        let conn =
            rusqlite::Connection::open(store.project_dir().join(".summon/state.db")).unwrap();
        conn.execute(
            "UPDATE tasks SET request = ?1 WHERE id = ?2",
            rusqlite::params![
                serde_json::to_string(&forged).unwrap(),
                signed.id.to_string()
            ],
        )
        .unwrap();
        // And one recorded without summon's signature at all.
        let unsigned = store
            .create_task(
                "unsigned",
                None,
                &serde_json::to_string(&request).unwrap(),
                5,
                false,
            )
            .unwrap();
        for id in [signed.id, unsigned.id] {
            let notes = run_worker(&mock.env, id, &mut |_: &str, _: SubagentEvent| {}).unwrap();
            assert!(notes.is_empty(), "{notes:?}");
            let failed = store.get(&id).unwrap().unwrap();
            assert_eq!(failed.status, TaskStatus::Failed);
            assert!(
                failed
                    .error
                    .as_deref()
                    .is_some_and(|e| e.contains("does not carry summon's signature")),
                "{:?}",
                failed.error
            );
        }
        assert!(mock.server.requests().is_empty());
        // The request as summon wrote it runs.
        let fine = create_signed(&mock.env, &store, &request, 5, false).unwrap();
        run_worker(&mock.env, fine.id, &mut |_: &str, _: SubagentEvent| {}).unwrap();
        let done = store.get(&fine.id).unwrap().unwrap();
        assert_eq!(done.status, TaskStatus::Completed, "{:?}", done.error);
    }

    #[tokio::test]
    async fn a_worker_whose_project_folder_is_deleted_stops() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("project");
        std::fs::create_dir_all(project.join(".summon")).unwrap();
        let store = Store::open(&project).unwrap();
        let task = store.create_task("t", None, "{}", 5, false).unwrap();
        let cancel = CancellationToken::new();
        let (done, heartbeat) = start_heartbeat(
            Store::open(&project).unwrap(),
            project.clone(),
            task.id,
            cancel.clone(),
        );
        assert!(!cancel.is_cancelled(), "a live project's task goes on");
        std::fs::remove_dir_all(&project).unwrap();
        tokio::time::timeout(Duration::from_secs(30), cancel.cancelled())
            .await
            .expect("the task is stopped once its project folder is gone");
        drop(done);
        heartbeat.join().unwrap();
    }

    #[test]
    fn a_start_that_would_fail_in_the_foreground_records_no_task() {
        let mock = MockProject::start(MockConfig::new().default_reply(Reply::text("no")));
        let request = DelegationRequest {
            instructions: Some("go".into()),
            working_dir: Some("../elsewhere".into()),
            ..DelegationRequest::default()
        };
        std::fs::create_dir_all(mock.dir.path().join("elsewhere")).unwrap();
        let Err(Error::Input(diags)) =
            start(&mock.env, &mock.config(), &mock.catalog(), &request, false)
        else {
            panic!("a working directory outside the project was accepted");
        };
        assert_eq!(
            diags.items[0].message,
            "--working-dir `../elsewhere` is outside the current directory"
        );
        assert!(!mock.env.cwd.join(crate::store::DIR_NAME).exists());
    }
}
