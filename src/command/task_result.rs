//! `summon load TASK_ID`: wait for a background task and print its result; `--peek` for
//! progress at once; `--cancel` to stop it.
//!
//! Text: the answer alone on stdout; the task, status, duration, turns and any error on
//! stderr. Exit 0 completed, 2 failed or cancelled, 124 when the wait ran out first.
//!
//! JSON (`--json`): `{"id", "status", "description", "source", "elapsed_secs", "turns",
//! "tool_calls", "idle_secs", "recent_tool_calls", "output", "error", "tokens": {"input",
//! "output"}, "provider", "model", "still_running"}`.

use std::time::Duration;

use serde_json::json;

use super::Ctx;
use super::tasks::{format_secs, task_json};
use crate::cli::LoadArgs;
use crate::delegation::{self, CollectError, TaskStore, TaskView};
use crate::error::{Error, Result};
use crate::store::{TaskId, TaskStatus};

pub(crate) fn run(id: &TaskId, args: &LoadArgs, ctx: &mut Ctx) -> Result<()> {
    let Some(tasks) = TaskStore::open_existing(&ctx.env)? else {
        return Err(CollectError::NotFound(*id).into());
    };
    let view = delegation::peek(&tasks, id)?;
    if args.peek {
        return peek(&view, args.output.json, ctx);
    }
    if args.cancel {
        let grace = delegation::cancel_grace(&ctx.env)?;
        let cancelled = delegation::cancel(&tasks, id, grace)?;
        if cancelled.killed {
            ctx.note(&format!(
                "the worker did not stop within {} and was killed",
                format_grace(grace)
            ));
        }
        return show(&cancelled.view, false, args.output.json, ctx);
    }
    let collected = delegation::wait(&tasks, id, Duration::from_secs(args.timeout))?;
    show(
        &collected.view,
        collected.still_running,
        args.output.json,
        ctx,
    )
}

fn peek(view: &TaskView, json: bool, ctx: &mut Ctx) -> Result<()> {
    let task = &view.task;
    if json {
        let mut value = task_json(view);
        value["idle_secs"] = json!((view.idle_secs * 10.0).round() / 10.0);
        value["recent_tool_calls"] = json!(task.recent_tool_calls);
        value["initialising"] = json!(view.initialising());
        ctx.out.json(&value)?;
        return Ok(());
    }
    let text = view.progress_text(&format!("`summon load {}`", task.id));
    ctx.out.write(&text)?;
    Ok(())
}

fn format_grace(grace: Duration) -> String {
    if grace.subsec_millis() == 0 {
        format!("{} s", grace.as_secs())
    } else {
        format!("{} ms", grace.as_millis())
    }
}

/// A task's result: the answer alone on stdout, what it was and how it went on stderr (all of
/// it in `--json`), so `summon load ID > answer.md` keeps only the answer. A wait that ran out
/// exits 124 whatever the format, so a script can tell "no result yet" from a result.
fn show(view: &TaskView, still_running: bool, json: bool, ctx: &mut Ctx) -> Result<()> {
    let task = &view.task;
    if json {
        let mut value = task_json(view);
        value["output"] = json!(task.output);
        value["tokens"] =
            json!({"input": task.tokens.input_tokens, "output": task.tokens.output_tokens});
        value["provider"] = json!(task.provider);
        value["model"] = json!(task.model);
        value["still_running"] = json!(still_running);
        value["recent_tool_calls"] = json!(task.recent_tool_calls);
        value["idle_secs"] = json!((view.idle_secs * 10.0).round() / 10.0);
        value["warnings"] = json!(task.warnings);
        ctx.out.json(&value)?;
    } else if still_running {
        to_stderr(&format!(
            "Task {id} is still running after the wait (elapsed {elapsed}, {turns} turns).\n\
             Wait again with `summon load {id}` (--timeout SECS), check on it with `--peek`, or stop it with `--cancel`.\n",
            id = task.id,
            elapsed = format_secs(view.elapsed_secs),
            turns = task.turns,
        ));
    } else {
        let mut meta = format!(
            "Task {}: {}\nStatus: {}\nDuration: {}\nTurns: {}\n",
            task.id,
            task.description,
            task.status.as_str(),
            format_secs(view.elapsed_secs),
            task.turns
        );
        if let Some(error) = &task.error {
            meta.push_str(&format!("Error: {error}\n"));
        }
        for warning in &task.warnings {
            meta.push_str(&format!("Warning: {warning}\n"));
        }
        to_stderr(&meta);
        let answer = view.answer();
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
