//! `summon tasks`: background tasks that are running or can still be collected.
//!
//! JSON (`--json`): `{"tasks": [TASK]}` where TASK is `{"id", "status", "description",
//! "source", "elapsed_secs", "turns", "tool_calls", "error"}`.

use serde_json::json;

use super::Ctx;
use crate::cli::TasksArgs;
use crate::delegation::{TaskStore, TaskView};
use crate::error::Result;
use crate::store::TaskFilter;

pub(crate) fn run(args: &TasksArgs, ctx: &mut Ctx) -> Result<()> {
    let tasks = match TaskStore::open_existing(&ctx.env)? {
        Some(tasks) => tasks.list(TaskFilter::All)?,
        None => Vec::new(),
    };
    if args.output.json {
        let items: Vec<_> = tasks.iter().map(task_json).collect();
        ctx.out.json(&json!({ "tasks": items }))?;
        return Ok(());
    }
    if tasks.is_empty() {
        ctx.out
            .line("No background tasks. Start one with `summon delegate --async ...`.")?;
        return Ok(());
    }
    let mut text = format!(
        "{:<14} {:<10} {:>8} {:>6}  {}\n",
        "ID", "STATUS", "ELAPSED", "TURNS", "TASK"
    );
    for view in &tasks {
        let task = &view.task;
        text.push_str(&format!(
            "{:<14} {:<10} {:>8} {:>6}  {}\n",
            task.id.to_string(),
            task.status.as_str(),
            format_secs(view.elapsed_secs),
            task.turns,
            task.description
        ));
    }
    ctx.out.write(&text)?;
    Ok(())
}

pub(crate) use crate::delegation::format_secs;

pub(crate) fn task_json(view: &TaskView) -> serde_json::Value {
    let task = &view.task;
    json!({
        "id": task.id.to_string(),
        "status": task.status.as_str(),
        "description": task.description,
        "source": task.source,
        "elapsed_secs": (view.elapsed_secs * 10.0).round() / 10.0,
        "turns": task.turns,
        "tool_calls": task.tool_calls,
        "error": task.error,
    })
}
