//! Collecting a background task: waiting for its result, a look at its progress, stopping it.

use std::time::{Duration, Instant};

use crate::env::Env;
use crate::error::{Error, Result};
use crate::process::pid_alive;
use crate::store::{StoreError, TaskId, TaskLookup, TaskRecord};

use super::tasks::{TaskStore, TaskView};

/// How long a cancelled worker gets to stop by itself before it is killed, unless
/// `SUMMON_CANCEL_GRACE_MS` says otherwise.
const CANCEL_GRACE: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(100);
/// How often a wait checks that the task's worker is still alive.
const SWEEP: Duration = Duration::from_secs(1);

/// Why a task cannot be collected.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CollectError {
    /// No task has this id (or the project has no store).
    #[error("Task '{0}' not found. Use `summon tasks` to see background tasks.")]
    NotFound(TaskId),
    /// The task finished and its result was dropped after its TTL.
    #[error("Task '{0}' not found (expired)")]
    Expired(TaskId),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<CollectError> for Error {
    fn from(error: CollectError) -> Self {
        match error {
            CollectError::Store(e) => Error::Store(e),
            other => Error::usage(other.to_string()),
        }
    }
}

/// The end of a wait for a task.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Collected {
    pub(crate) view: TaskView,
    /// The wait ran out before the task finished: `view` is its progress so far.
    pub(crate) still_running: bool,
}

/// The end of a cancel.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cancelled {
    /// The task as it ended (unchanged when it had already finished).
    pub(crate) view: TaskView,
    /// The worker did not stop within the grace and was killed.
    pub(crate) killed: bool,
}

/// The task as it is now, at once: its progress while it runs, its result once it finished.
pub(crate) fn peek(tasks: &TaskStore, id: &TaskId) -> Result<TaskView, CollectError> {
    find(tasks, id).map(TaskView::now)
}

/// Waits up to `timeout` for the task to finish.
pub(crate) fn wait(
    tasks: &TaskStore,
    id: &TaskId,
    timeout: Duration,
) -> Result<Collected, CollectError> {
    let started = Instant::now();
    let deadline = started + timeout;
    let mut swept = started;
    let mut task = find(tasks, id)?;
    while !task.status.is_terminal() {
        let now = Instant::now();
        if now >= deadline {
            return Ok(Collected {
                view: TaskView::now(task),
                still_running: true,
            });
        }
        std::thread::sleep(poll_pause(now - started).min(deadline - now));
        // Re-check liveness now and then, so a dead worker ends the wait.
        if swept.elapsed() >= SWEEP {
            tasks.refresh()?;
            swept = Instant::now();
        }
        task = find(tasks, id)?;
    }
    Ok(Collected {
        view: TaskView::now(task),
        still_running: false,
    })
}

/// Asks the task's worker to stop, waits for it, and kills it (and its process group) when
/// it does not stop within `grace`. A finished task is left as it is.
pub(crate) fn cancel(
    tasks: &TaskStore,
    id: &TaskId,
    grace: Duration,
) -> Result<Cancelled, CollectError> {
    let task = find(tasks, id)?;
    let ended = |task: TaskRecord, killed: bool| Cancelled {
        view: TaskView::now(task),
        killed,
    };
    if task.status.is_terminal() {
        return Ok(ended(task, false));
    }
    let store = tasks.store();
    store.request_cancel(id)?;
    let deadline = Instant::now() + grace;
    loop {
        let current = find(tasks, id)?;
        if current.status.is_terminal() {
            return Ok(ended(current, false));
        }
        if Instant::now() >= deadline {
            let pid = current.pid.filter(|pid| pid_alive(*pid));
            if let Some(pid) = pid {
                // The worker leads its own process group: stop it and its children.
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .stderr(std::process::Stdio::null())
                    .status();
            }
            store.cancel(id)?;
            return Ok(ended(find(tasks, id)?, pid.is_some()));
        }
        std::thread::sleep(POLL);
    }
}

/// The grace a cancelled worker gets: `SUMMON_CANCEL_GRACE_MS` or 5 s.
pub(crate) fn cancel_grace(env: &Env) -> Result<Duration> {
    let grace = env.millis("SUMMON_CANCEL_GRACE_MS").map_err(Error::usage)?;
    Ok(grace.unwrap_or(CANCEL_GRACE))
}

fn find(tasks: &TaskStore, id: &TaskId) -> Result<TaskRecord, CollectError> {
    match tasks.store().lookup(id)? {
        TaskLookup::Found(task) => Ok(*task),
        TaskLookup::Expired => Err(CollectError::Expired(*id)),
        TaskLookup::NotFound => Err(CollectError::NotFound(*id)),
    }
}

/// The pause between two looks at a task being waited for: a tenth of the wait so far,
/// between 5 and 100 ms. A quick task is collected within milliseconds of its end, and a
/// long wait reads the store ten times a second.
fn poll_pause(waited: Duration) -> Duration {
    (waited / 10).clamp(Duration::from_millis(5), POLL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Usage;
    use crate::store::{Control, Store, TaskStatus};

    /// A project in a temporary directory, its task store, and one running task in it.
    fn project(vars: &[(&str, &str)]) -> (tempfile::TempDir, Env, TaskStore, TaskId) {
        let dir = tempfile::tempdir().unwrap();
        let env = Env::for_test(dir.path(), vars);
        let tasks = TaskStore::open(&env).unwrap();
        let id = tasks
            .store()
            .create_task("summarise the notes", Some("notes"), "{}", 5, false)
            .unwrap()
            .id;
        (dir, env, tasks, id)
    }

    fn usage(input: u64, output: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            ..Usage::default()
        }
    }

    #[test]
    fn a_finished_task_is_collected_with_its_answer() {
        let (_dir, _env, tasks, id) = project(&[]);
        let store = tasks.store();
        store.set_model(&id, "openai", "gpt-x").unwrap();
        store
            .finish(
                &id,
                TaskStatus::Completed,
                Some("the answer\n\n"),
                None,
                usage(120, 30),
                3,
            )
            .unwrap();
        let collected = wait(&tasks, &id, Duration::from_secs(60)).unwrap();
        assert!(!collected.still_running);
        let task = &collected.view.task;
        assert_eq!(task.status, TaskStatus::Completed);
        assert_eq!(collected.view.answer(), "the answer");
        assert_eq!(task.turns, 3);
        assert_eq!(
            (task.tokens.input_tokens, task.tokens.output_tokens),
            (120, 30)
        );
        assert_eq!(task.model.as_deref(), Some("gpt-x"));
        // A result can be read again until it expires.
        let again = wait(&tasks, &id, Duration::ZERO).unwrap();
        assert_eq!(again.view.answer(), "the answer");
    }

    #[test]
    fn a_wait_that_runs_out_returns_the_running_task() {
        let (_dir, _env, tasks, id) = project(&[]);
        let collected = wait(&tasks, &id, Duration::ZERO).unwrap();
        assert!(collected.still_running);
        assert_eq!(collected.view.task.status, TaskStatus::Running);
        assert_eq!(collected.view.answer(), "");
    }

    #[test]
    fn a_wait_ends_when_the_task_finishes() {
        let (_dir, _env, tasks, id) = project(&[]);
        let project_dir = tasks.store().project_dir().to_path_buf();
        let worker = std::thread::spawn(move || {
            let store = Store::open(&project_dir).unwrap();
            store
                .finish(
                    &id,
                    TaskStatus::Failed,
                    Some("half"),
                    Some("boom"),
                    usage(1, 1),
                    1,
                )
                .unwrap();
        });
        let collected = wait(&tasks, &id, Duration::from_secs(60)).unwrap();
        worker.join().unwrap();
        assert!(!collected.still_running);
        assert_eq!(collected.view.task.status, TaskStatus::Failed);
        assert_eq!(collected.view.task.error.as_deref(), Some("boom"));
        assert_eq!(collected.view.answer(), "half");
    }

    #[test]
    fn unknown_and_expired_tasks_are_told_apart() {
        let (_dir, _env, tasks, id) = project(&[("SUMMON_COMPLETED_TASK_TTL_SECS", "0")]);
        let unknown: TaskId = "20250101_7".parse().unwrap();
        let error = peek(&tasks, &unknown).unwrap_err();
        assert!(matches!(error, CollectError::NotFound(found) if found == unknown));
        assert_eq!(
            error.to_string(),
            "Task '20250101_7' not found. Use `summon tasks` to see background tasks."
        );
        assert_eq!(Error::from(error).exit_code(), crate::error::exit::USAGE);
        assert!(matches!(
            wait(&tasks, &unknown, Duration::ZERO),
            Err(CollectError::NotFound(_))
        ));
        assert!(matches!(
            cancel(&tasks, &unknown, Duration::ZERO),
            Err(CollectError::NotFound(_))
        ));

        let store = tasks.store();
        store
            .finish(
                &id,
                TaskStatus::Completed,
                Some("done"),
                None,
                usage(0, 0),
                1,
            )
            .unwrap();
        tasks.refresh().unwrap();
        let error = wait(&tasks, &id, Duration::ZERO).unwrap_err();
        assert!(matches!(error, CollectError::Expired(found) if found == id));
        assert_eq!(
            error.to_string(),
            format!("Task '{id}' not found (expired)")
        );
    }

    #[test]
    fn peek_shows_the_progress_so_far() {
        let (_dir, _env, tasks, id) = project(&[]);
        let view = peek(&tasks, &id).unwrap();
        assert!(view.initialising());
        assert_eq!(view.task.description, "summarise the notes");
        assert_eq!(view.task.source.as_deref(), Some("notes"));

        let store = tasks.store();
        store
            .record_progress(&id, 1, Some("read_file: completed"), usage(10, 2))
            .unwrap();
        store
            .record_progress(&id, 2, Some("shell: failed: exit 1"), usage(20, 4))
            .unwrap();
        let view = peek(&tasks, &id).unwrap();
        assert!(!view.initialising());
        assert_eq!(view.task.status, TaskStatus::Running);
        assert_eq!(view.task.turns, 2);
        assert_eq!(view.task.tool_calls, 2);
        assert_eq!(
            view.task.recent_tool_calls,
            ["read_file: completed", "shell: failed: exit 1"]
        );
        assert!(view.idle_secs >= 0.0 && view.idle_secs < 30.0);
    }

    #[test]
    fn cancel_leaves_a_finished_task_as_it_is() {
        let (_dir, _env, tasks, id) = project(&[]);
        tasks
            .store()
            .finish(
                &id,
                TaskStatus::Completed,
                Some("kept"),
                None,
                usage(0, 0),
                1,
            )
            .unwrap();
        let cancelled = cancel(&tasks, &id, Duration::ZERO).unwrap();
        assert!(!cancelled.killed);
        assert_eq!(cancelled.view.task.status, TaskStatus::Completed);
        assert_eq!(cancelled.view.answer(), "kept");
    }

    #[test]
    fn a_worker_that_stops_when_asked_keeps_what_it_produced() {
        let (_dir, _env, tasks, id) = project(&[]);
        let project_dir = tasks.store().project_dir().to_path_buf();
        // A worker: reports until it is told to stop, then records its partial answer.
        let worker = std::thread::spawn(move || {
            let store = Store::open(&project_dir).unwrap();
            while store.heartbeat(&id).unwrap() == Control::Continue {
                std::thread::yield_now();
            }
            store
                .finish(
                    &id,
                    TaskStatus::Cancelled,
                    Some("so far"),
                    Some("cancelled"),
                    usage(5, 5),
                    2,
                )
                .unwrap();
        });
        let cancelled = cancel(&tasks, &id, Duration::from_secs(60)).unwrap();
        worker.join().unwrap();
        assert!(!cancelled.killed);
        assert_eq!(cancelled.view.task.status, TaskStatus::Cancelled);
        assert_eq!(cancelled.view.answer(), "so far");
        assert_eq!(cancelled.view.task.turns, 2);
    }

    #[test]
    fn a_worker_that_does_not_stop_is_killed_with_its_group() {
        use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
        let (_dir, _env, tasks, id) = project(&[]);
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .process_group(0)
            .spawn()
            .unwrap();
        tasks.store().set_pid(&id, child.id()).unwrap();
        let cancelled = cancel(&tasks, &id, Duration::ZERO).unwrap();
        let status = child.wait().unwrap();
        assert!(cancelled.killed);
        assert_eq!(status.signal(), Some(9));
        assert_eq!(cancelled.view.task.status, TaskStatus::Cancelled);
        assert!(cancelled.view.task.cancel_requested);
    }

    #[test]
    fn a_task_without_a_worker_is_cancelled_after_the_grace() {
        let (_dir, _env, tasks, id) = project(&[]);
        let cancelled = cancel(&tasks, &id, Duration::ZERO).unwrap();
        assert!(!cancelled.killed);
        assert_eq!(cancelled.view.task.status, TaskStatus::Cancelled);
    }

    #[test]
    fn the_cancel_grace_comes_from_the_environment() {
        let grace = |vars: &[(&str, &str)]| cancel_grace(&Env::for_test("/", vars));
        assert_eq!(grace(&[]).unwrap(), Duration::from_secs(5));
        assert_eq!(
            grace(&[("SUMMON_CANCEL_GRACE_MS", "250")]).unwrap(),
            Duration::from_millis(250)
        );
        assert!(grace(&[("SUMMON_CANCEL_GRACE_MS", "soon")]).is_err());
    }
}
