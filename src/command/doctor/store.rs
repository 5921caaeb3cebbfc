//! The `.summon/` store: its schema version, and tasks marked running whose worker is gone.

use std::path::Path;
use std::time::Duration;

use jiff::Timestamp;

use super::check::{Check, Section};
use crate::env::Env;
use crate::process::pid_alive;
use crate::store::{DB_FILE, DIR_NAME, SCHEMA_VERSION, Store, StoreError, TaskFilter, TaskRecord};

/// A running task whose heartbeat is older than this has lost its worker (workers beat
/// every second; the same bound as the store's own dead-worker sweep).
const STALE_AFTER: Duration = Duration::from_secs(30);

pub(super) fn check(env: &Env, checks: &mut Vec<Check>) {
    let project = crate::store::find_project(&env.cwd).unwrap_or_else(|| env.cwd.clone());
    let db = project.join(DIR_NAME).join(DB_FILE);
    if !db.is_file() {
        checks.push(Check::ok(
            Section::Store,
            format!(
                "no store yet: {}/ is made by the first background task or pipeline run",
                DIR_NAME
            ),
        ));
        return;
    }
    let store = match Store::open(&project) {
        Ok(store) => store,
        Err(error) => {
            let fix = match &error {
                StoreError::NewerSchema { .. } => "upgrade summon to the version that wrote it",
                StoreError::Busy { .. } => "wait for the other summon processes, then try again",
                _ => {
                    "move the .summon/ folder away to start over (its tasks and run journals are lost)"
                }
            };
            checks.push(
                Check::error(Section::Store, error.to_string())
                    .in_file(&db)
                    .fix(fix),
            );
            return;
        }
    };
    match store.schema_version() {
        Ok(version) => checks.push(
            Check::ok(
                Section::Store,
                format!("schema version {version} (this summon writes {SCHEMA_VERSION})"),
            )
            .in_file(&db),
        ),
        Err(error) => {
            checks.push(Check::error(Section::Store, error.to_string()).in_file(&db));
            return;
        }
    }
    let tasks = match store.list(TaskFilter::Active) {
        Ok(tasks) => tasks,
        Err(error) => {
            checks.push(Check::error(Section::Store, error.to_string()).in_file(&db));
            return;
        }
    };
    let now = Timestamp::now();
    let mut live = 0;
    for task in &tasks {
        match gone_since(task, now) {
            Some(quiet) => checks.push(
                Check::warning(
                    Section::Store,
                    format!(
                        "task {} is marked {} but its worker{} is gone (no sign of life for {}s)",
                        task.id,
                        task.status,
                        task.pid.map(|p| format!(" (pid {p})")).unwrap_or_default(),
                        quiet.as_secs()
                    ),
                )
                .fix(format!(
                    "`summon tasks` marks it failed; its log is {}",
                    display_log(&store, task, &env.cwd)
                )),
            ),
            None => live += 1,
        }
    }
    if live > 0 {
        checks.push(Check::ok(
            Section::Store,
            format!("{live} background task(s) running or queued"),
        ));
    }
}

/// How long a queued or running task has been without a worker, or `None` while its worker
/// lives (a task whose worker is still being started has a grace period).
fn gone_since(task: &TaskRecord, now: Timestamp) -> Option<Duration> {
    let age = |t: Timestamp| now.duration_since(t).unsigned_abs();
    let quiet = age(task.heartbeat_at);
    let alive = match task.pid {
        None => age(task.created_at) < STALE_AFTER,
        Some(pid) => pid_alive(pid) && quiet < STALE_AFTER,
    };
    (!alive).then_some(quiet)
}

fn display_log(store: &Store, task: &TaskRecord, cwd: &Path) -> String {
    crate::diag::render::display_path(&store.task_log_path(&task.id), cwd)
}
