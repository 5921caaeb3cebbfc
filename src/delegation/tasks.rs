//! The project's background tasks: the store, kept up to date for everyone who reads it.
//!
//! Any command that reads tasks first fails the tasks whose worker is gone (no live pid, or
//! no heartbeat for a while) and drops results older than `SUMMON_COMPLETED_TASK_TTL_SECS`.

use std::time::Duration;

use jiff::Timestamp;

use crate::env::Env;
use crate::error::{Error, Result};
use crate::process::pid_alive;
use crate::store::{Store, StoreError, TaskRecord};

/// Default for `SUMMON_MAX_BACKGROUND_TASKS`.
const DEFAULT_MAX_TASKS: usize = 5;
/// Default for `SUMMON_COMPLETED_TASK_TTL_SECS`.
const DEFAULT_TTL_SECS: u64 = 600;
/// A worker silent for this long is taken for dead even if its pid answers (pid reuse
/// after a restart).
const STALE_AFTER: Duration = Duration::from_secs(30);

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
        Self::refreshed(env, Store::open_for(&env.cwd)?)
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
