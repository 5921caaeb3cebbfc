//! The project's background tasks: the store, kept up to date for everyone who reads it.
//!
//! Any command that reads tasks first fails the tasks whose worker is gone (no live pid, or
//! no heartbeat for a while) and drops results older than `SUMMON_COMPLETED_TASK_TTL_SECS`.

use std::time::Duration;

use jiff::Timestamp;

use crate::env::Env;
use crate::error::{Error, Result};
use crate::process::pid_alive;
use crate::store::{Store, StoreError, TaskFilter, TaskRecord};

/// Default for `SUMMON_MAX_BACKGROUND_TASKS`.
const DEFAULT_MAX_TASKS: usize = 5;
/// Default for `SUMMON_COMPLETED_TASK_TTL_SECS`.
const DEFAULT_TTL_SECS: u64 = 600;
/// A worker silent for this long is taken for dead even if its pid answers (pid reuse
/// after a restart).
const STALE_AFTER: Duration = Duration::from_secs(30);

/// A whole-number setting from the environment (or goose's name for it), with its default.
pub(crate) fn env_number(env: &Env, key: &'static str, default: u64) -> Result<u64> {
    match env.var_or_goose(key) {
        None => Ok(default),
        Some((text, var)) => text
            .trim()
            .parse()
            .map_err(|_| Error::usage(format!("{var} must be a whole number, got `{text}`"))),
    }
}

/// How many background tasks may run at once: `SUMMON_MAX_BACKGROUND_TASKS`, at least 1.
pub(crate) fn max_tasks(env: &Env) -> Result<usize> {
    let n = env_number(env, "SUMMON_MAX_BACKGROUND_TASKS", DEFAULT_MAX_TASKS as u64)?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX).max(1))
}

/// The project's store of background tasks, brought up to date when opened: dead workers
/// failed, old results dropped.
pub(crate) struct TaskStore {
    store: Store,
    ttl: Duration,
}

impl TaskStore {
    /// Opens the project's store, creating it in the working directory when there is none
    /// above it.
    pub(crate) fn open(env: &Env) -> Result<Self> {
        Self::refreshed(env, Store::open_for(env)?)
    }

    /// [`TaskStore::open`] for readers: `None` when the project has no store, and none is
    /// created.
    pub(crate) fn open_existing(env: &Env) -> Result<Option<Self>> {
        match Store::open_existing(&env.cwd)? {
            Some(store) => Self::refreshed(env, store).map(Some),
            None => Ok(None),
        }
    }

    fn refreshed(env: &Env, store: Store) -> Result<Self> {
        let ttl = env_number(env, "SUMMON_COMPLETED_TASK_TTL_SECS", DEFAULT_TTL_SECS)?;
        let tasks = Self {
            store,
            ttl: Duration::from_secs(ttl),
        };
        tasks.refresh()?;
        Ok(tasks)
    }

    /// Fails the tasks whose worker is gone and drops results past their TTL.
    pub(crate) fn refresh(&self) -> Result<(), StoreError> {
        fail_dead_workers(&self.store)?;
        self.store.expire(self.ttl)?;
        Ok(())
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// The tasks `filter` selects, in creation order, as they are now.
    pub(crate) fn list(&self, filter: TaskFilter) -> Result<Vec<TaskView>, StoreError> {
        let now = Timestamp::now();
        Ok(self
            .store
            .list(filter)?
            .into_iter()
            .map(|task| TaskView::at(task, now))
            .collect())
    }
}

/// A background task as it is at one moment: its record, how long it has run and how long
/// it has been quiet.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TaskView {
    pub(crate) task: TaskRecord,
    /// Seconds from start (or creation) to finish (or now).
    pub(crate) elapsed_secs: f64,
    /// Seconds since the last progress (or the start, or the creation).
    pub(crate) idle_secs: f64,
}

impl TaskView {
    /// The task as it is now.
    pub(crate) fn now(task: TaskRecord) -> Self {
        Self::at(task, Timestamp::now())
    }

    fn at(task: TaskRecord, now: Timestamp) -> Self {
        let secs = |from: Timestamp, to: Timestamp| to.duration_since(from).as_secs_f64().max(0.0);
        let start = task.started_at.unwrap_or(task.created_at);
        let elapsed_secs = secs(start, task.finished_at.unwrap_or(now));
        let last = task
            .last_activity_at
            .or(task.started_at)
            .unwrap_or(task.created_at);
        let idle_secs = secs(last, now);
        Self {
            task,
            elapsed_secs,
            idle_secs,
        }
    }

    /// Nothing has happened yet: no reply from the model, no tool call.
    pub(crate) fn initialising(&self) -> bool {
        self.task.turns == 0 && self.task.recent_tool_calls.is_empty()
    }

    /// How the task is doing, for people and models: status, elapsed and idle time, turns,
    /// whether it is initialising, its latest tool calls; `collect` says how to collect its
    /// result once it finished (`summon load ID`, `load(source: "ID")`).
    pub(crate) fn progress_text(&self, collect: &str) -> String {
        let task = &self.task;
        let mut text = format!(
            "Task {}: {} (\"{}\")\nElapsed: {}\nTurns: {}\nIdle: {}\n",
            task.id,
            task.status.as_str(),
            task.description,
            format_secs(self.elapsed_secs),
            task.turns,
            format_secs(self.idle_secs),
        );
        if task.status.is_terminal() {
            text.push_str(&format!("Finished: collect it with {collect}.\n"));
        } else if self.initialising() {
            text.push_str("Task is initialising (no tool activity yet).\n");
        }
        if !task.recent_tool_calls.is_empty() {
            text.push_str(&format!(
                "Tool calls ({} in all, latest last):\n",
                task.tool_calls
            ));
            for line in &task.recent_tool_calls {
                text.push_str(&format!("  {line}\n"));
            }
        }
        text
    }

    /// The task's answer (what it produced so far when it was cancelled), trailing
    /// whitespace cut.
    pub(crate) fn answer(&self) -> &str {
        self.task.output.as_deref().unwrap_or("").trim_end()
    }
}

/// Fails the tasks whose worker is gone, and stops the MCP servers those workers left
/// running (a worker killed with SIGKILL could not stop them).
pub(super) fn fail_dead_workers(store: &Store) -> Result<(), StoreError> {
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

/// Seconds for people: `4.2s`, `3m05s`.
pub(crate) fn format_secs(secs: f64) -> String {
    if secs < 60.0 {
        format!("{secs:.1}s")
    } else {
        let whole = secs.round() as u64;
        format!("{}m{:02}s", whole / 60, whole % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Usage;
    use crate::store::TaskStatus;

    #[test]
    fn a_reader_creates_no_store() {
        let dir = tempfile::tempdir().unwrap();
        let env = Env::for_test(dir.path(), &[]);
        assert!(TaskStore::open_existing(&env).unwrap().is_none());
        assert!(!dir.path().join(crate::store::DIR_NAME).exists());
        TaskStore::open(&env).unwrap();
        assert!(TaskStore::open_existing(&env).unwrap().is_some());
    }

    #[test]
    fn opening_fails_tasks_whose_worker_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let env = Env::for_test(dir.path(), &[]);
        let tasks = TaskStore::open(&env).unwrap();
        let store = tasks.store();
        let dead = store.create_task("dead", None, "{}", 5, false).unwrap().id;
        let starting = store
            .create_task("starting", None, "{}", 5, false)
            .unwrap()
            .id;
        // A process that has ended and been reaped.
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        store.set_pid(&dead, gone.id()).unwrap();

        let tasks = TaskStore::open_existing(&env).unwrap().unwrap();
        let listed = tasks.list(TaskFilter::All).unwrap();
        let status: Vec<_> = listed.iter().map(|v| (v.task.id, v.task.status)).collect();
        assert_eq!(
            status,
            [(dead, TaskStatus::Failed), (starting, TaskStatus::Running)]
        );
        let error = listed[0].task.error.as_deref().unwrap();
        assert!(error.starts_with("worker died"), "{error}");
        let finished = tasks.list(TaskFilter::Finished).unwrap();
        assert_eq!(finished.len(), 1);
        assert_eq!(finished[0].task.id, dead);
    }

    #[test]
    fn results_past_their_ttl_are_dropped_and_a_bad_ttl_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let env = Env::for_test(dir.path(), &[("SUMMON_COMPLETED_TASK_TTL_SECS", "0")]);
        let tasks = TaskStore::open(&env).unwrap();
        let id = tasks
            .store()
            .create_task("t", None, "{}", 5, false)
            .unwrap()
            .id;
        tasks
            .store()
            .finish(
                &id,
                TaskStatus::Completed,
                Some("x"),
                None,
                Usage::default(),
                1,
            )
            .unwrap();
        let tasks = TaskStore::open_existing(&env).unwrap().unwrap();
        assert!(tasks.list(TaskFilter::All).unwrap().is_empty());

        let env = Env::for_test(dir.path(), &[("SUMMON_COMPLETED_TASK_TTL_SECS", "ten")]);
        let Err(error) = TaskStore::open_existing(&env) else {
            panic!("a TTL that is not a number was accepted");
        };
        assert_eq!(error.exit_code(), crate::error::exit::USAGE);
    }

    #[test]
    fn a_view_measures_a_finished_task_up_to_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let env = Env::for_test(dir.path(), &[]);
        let tasks = TaskStore::open(&env).unwrap();
        let id = tasks
            .store()
            .create_task("t", None, "{}", 5, false)
            .unwrap()
            .id;
        tasks
            .store()
            .finish(
                &id,
                TaskStatus::Failed,
                None,
                Some("e"),
                Usage::default(),
                0,
            )
            .unwrap();
        let mut task = tasks.store().get(&id).unwrap().unwrap();
        let start = task.created_at;
        task.started_at = Some(start);
        task.finished_at = Some(start + jiff::SignedDuration::from_millis(2500));
        task.last_activity_at = Some(start + jiff::SignedDuration::from_millis(1000));
        let later = start + jiff::SignedDuration::from_secs(60);
        let view = TaskView::at(task, later);
        assert_eq!(view.elapsed_secs, 2.5);
        assert_eq!(view.idle_secs, 59.0);
        assert!(view.initialising());
        assert_eq!(view.answer(), "");
    }

    #[test]
    fn the_background_limit_is_at_least_one() {
        let limit = |vars: &[(&str, &str)]| max_tasks(&Env::for_test("/", vars));
        assert_eq!(limit(&[]).unwrap(), DEFAULT_MAX_TASKS);
        assert_eq!(limit(&[("SUMMON_MAX_BACKGROUND_TASKS", "0")]).unwrap(), 1);
        assert_eq!(limit(&[("SUMMON_MAX_BACKGROUND_TASKS", " 8 ")]).unwrap(), 8);
        assert!(limit(&[("SUMMON_MAX_BACKGROUND_TASKS", "-1")]).is_err());
    }
}
