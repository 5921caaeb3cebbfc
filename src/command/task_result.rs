//! `summon load TASK_ID`: wait for a background task and print its result; `--peek` for
//! progress at once; `--cancel` to stop it.
//!
//! Text: the answer alone on stdout; the task, status, duration, turns and any error on
//! stderr. Exit 0 completed, 2 failed or cancelled, 124 when the wait ran out first.
//!
//! JSON (`--json`): `{"id", "status", "description", "source", "elapsed_secs", "turns",
//! "tool_calls", "idle_secs", "recent_tool_calls", "output", "error", "tokens": {"input",
//! "output"}, "provider", "model", "still_running"}`.

use std::time::{Duration, Instant};

use jiff::Timestamp;
use serde_json::json;

use super::Ctx;
use super::tasks::{elapsed_secs, format_secs, task_json};
use crate::cli::LoadArgs;
use crate::delegation::TaskStore;
use crate::error::{Error, Result};
use crate::process::pid_alive;
use crate::store::{Store, TaskId, TaskLookup, TaskRecord, TaskStatus};

/// How long a cancelled worker gets to stop by itself before it is killed, unless
/// `SUMMON_CANCEL_GRACE_MS` says otherwise.
const CANCEL_GRACE: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(100);
/// How often a waiting `load` checks that the task's worker is still alive.
const SWEEP: Duration = Duration::from_secs(1);

/// The pause between two looks at a task being waited for: a tenth of the wait so far,
/// between 5 and 100 ms. A quick task is collected within milliseconds of its end, and a
/// long wait reads the store ten times a second.
fn poll_pause(waited: Duration) -> Duration {
    (waited / 10).clamp(Duration::from_millis(5), POLL)
}

pub(crate) fn run(id: &TaskId, args: &LoadArgs, ctx: &mut Ctx) -> Result<()> {
    let Some(tasks) = TaskStore::open_existing(&ctx.env)? else {
        return Err(not_found(id));
    };
    let store = tasks.store();
    let task = find(store, id)?;
    if args.peek {
        return peek(&task, args.output.json, ctx);
    }
    if args.cancel {
        let grace = cancel_grace(&ctx.env)?;
        let (task, killed) = cancel(store, &task, grace)?;
        if killed {
            ctx.note(&format!(
                "the worker did not stop within {} and was killed",
                format_grace(grace)
            ));
        }
        return show(&task, false, args.output.json, ctx);
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.timeout);
    let mut swept = started;
    let mut task = task;
    while !task.status.is_terminal() {
        let now = Instant::now();
        if now >= deadline {
            return show(&task, true, args.output.json, ctx);
        }
        std::thread::sleep(poll_pause(now - started).min(deadline - now));
        // Re-check liveness now and then, so a dead worker ends the wait.
        if swept.elapsed() >= SWEEP {
            tasks.refresh()?;
            swept = Instant::now();
        }
        task = find(store, id)?;
    }
    show(&task, false, args.output.json, ctx)
}

fn find(store: &Store, id: &TaskId) -> Result<TaskRecord> {
    match store.lookup(id)? {
        TaskLookup::Found(task) => Ok(*task),
        TaskLookup::Expired => Err(Error::usage(format!("Task '{id}' not found (expired)"))),
        TaskLookup::NotFound => Err(not_found(id)),
    }
}

fn not_found(id: &TaskId) -> Error {
    Error::usage(format!(
        "Task '{id}' not found. Use `summon tasks` to see background tasks."
    ))
}

fn idle_secs(task: &TaskRecord) -> f64 {
    let last = task
        .last_activity_at
        .or(task.started_at)
        .unwrap_or(task.created_at);
    Timestamp::now().duration_since(last).as_secs_f64().max(0.0)
}

fn peek(task: &TaskRecord, json: bool, ctx: &mut Ctx) -> Result<()> {
    if json {
        let mut value = task_json(task);
        value["idle_secs"] = json!((idle_secs(task) * 10.0).round() / 10.0);
        value["recent_tool_calls"] = json!(task.recent_tool_calls);
        value["initialising"] = json!(task.turns == 0 && task.recent_tool_calls.is_empty());
        ctx.out.json(&value)?;
        return Ok(());
    }
    let mut text = format!(
        "Task {}: {} (\"{}\")\nElapsed: {}\nTurns: {}\nIdle: {}\n",
        task.id,
        task.status.as_str(),
        task.description,
        format_secs(elapsed_secs(task)),
        task.turns,
        format_secs(idle_secs(task)),
    );
    if task.status.is_terminal() {
        text.push_str(&format!(
            "Finished: collect it with `summon load {}`.\n",
            task.id
        ));
    } else if task.turns == 0 && task.recent_tool_calls.is_empty() {
        text.push_str("Task is initialising (no activity yet).\n");
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
    ctx.out.write(&text)?;
    Ok(())
}

/// The grace a cancelled worker gets: `SUMMON_CANCEL_GRACE_MS` or 5 s.
fn cancel_grace(env: &crate::env::Env) -> Result<Duration> {
    match env.var("SUMMON_CANCEL_GRACE_MS") {
        None => Ok(CANCEL_GRACE),
        Some(text) => text.parse().map(Duration::from_millis).map_err(|_| {
            Error::usage(format!(
                "SUMMON_CANCEL_GRACE_MS must be a number of milliseconds, found `{text}`"
            ))
        }),
    }
}

fn format_grace(grace: Duration) -> String {
    if grace.subsec_millis() == 0 {
        format!("{} s", grace.as_secs())
    } else {
        format!("{} ms", grace.as_millis())
    }
}

/// Asks the worker to stop, waits for it, and kills it when it does not stop within
/// `grace`; says whether it had to be killed.
fn cancel(store: &Store, task: &TaskRecord, grace: Duration) -> Result<(TaskRecord, bool)> {
    if task.status.is_terminal() {
        return Ok((task.clone(), false));
    }
    store.request_cancel(&task.id)?;
    let deadline = Instant::now() + grace;
    loop {
        let current = find(store, &task.id)?;
        if current.status.is_terminal() {
            return Ok((current, false));
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
            store.cancel(&task.id)?;
            return Ok((find(store, &task.id)?, pid.is_some()));
        }
        std::thread::sleep(POLL);
    }
}

/// A task's result: the answer alone on stdout, what it was and how it went on stderr (all of
/// it in `--json`), so `summon load ID > answer.md` keeps only the answer. A wait that ran out
/// exits 124 whatever the format, so a script can tell "no result yet" from a result.
fn show(task: &TaskRecord, still_running: bool, json: bool, ctx: &mut Ctx) -> Result<()> {
    if json {
        let mut value = task_json(task);
        value["output"] = json!(task.output);
        value["tokens"] =
            json!({"input": task.tokens.input_tokens, "output": task.tokens.output_tokens});
        value["provider"] = json!(task.provider);
        value["model"] = json!(task.model);
        value["still_running"] = json!(still_running);
        value["recent_tool_calls"] = json!(task.recent_tool_calls);
        value["idle_secs"] = json!((idle_secs(task) * 10.0).round() / 10.0);
        value["warnings"] = json!(task.warnings);
        ctx.out.json(&value)?;
    } else if still_running {
        to_stderr(&format!(
            "Task {id} is still running after the wait (elapsed {elapsed}, {turns} turns).\n\
             Wait again with `summon load {id}` (--timeout SECS), check on it with `--peek`, or stop it with `--cancel`.\n",
            id = task.id,
            elapsed = format_secs(elapsed_secs(task)),
            turns = task.turns,
        ));
    } else {
        let mut meta = format!(
            "Task {}: {}\nStatus: {}\nDuration: {}\nTurns: {}\n",
            task.id,
            task.description,
            task.status.as_str(),
            format_secs(elapsed_secs(task)),
            task.turns
        );
        if let Some(error) = &task.error {
            meta.push_str(&format!("Error: {error}\n"));
        }
        for warning in &task.warnings {
            meta.push_str(&format!("Warning: {warning}\n"));
        }
        to_stderr(&meta);
        let answer = task.output.as_deref().unwrap_or("").trim_end();
        if !answer.is_empty() {
            ctx.out.line(answer)?;
        }
    }
    if still_running {
        return Err(Error::StillRunning);
    }
    match task.status {
        TaskStatus::Failed | TaskStatus::Cancelled => Err(Error::Failed(String::new())),
        _ => Ok(()),
    }
}

/// Text for people on stderr; a closed stderr is not an error.
fn to_stderr(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stderr().write_all(text.as_bytes());
}
