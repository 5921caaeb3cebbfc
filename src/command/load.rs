//! `summon load`: list every source, or print one.
//!
//! The listing and its JSON show the same things: finished background tasks awaiting
//! collection, then the sources, an agent with its `tools` list.
//!
//! Files not read at all (over 1 MiB, a symlink out of its directory, unreadable) are noted
//! on stderr.
//!
//! JSON (`--json`), listing: `{"tasks": [{"id", "description", "status"}], "sources":
//! [{"name", "kind", "description", "path", "scope", "parent", "tools"}], "searched": [PATH],
//! "skipped": [{"path", "reason"}]}`
//! (`parent`: the recipe declaring a subrecipe, else null; `tools`: an agent's list as
//! written, null without one).
//! One source: `{"name", "kind", "path", "description", "content", "parameters": [PARAM],
//! "tools"}` where PARAM is `{"key", "input_type", "requirement", "default", "description",
//! "options"}`.

use serde_json::json;

use super::Ctx;
use crate::cli::LoadArgs;
use crate::delegation::{self, LoadedSource, SourceList, TaskStore};
use crate::diag::render::display_path;
use crate::error::{Error, Result};
use crate::recipe::Parameter;
use crate::source::{Scope, SourceKind};
use crate::store::{TaskId, TaskRecord};

pub(crate) fn run(args: &LoadArgs, ctx: &mut Ctx) -> Result<()> {
    if let Some(name) = args.name.as_deref().filter(|n| TaskId::looks_like(n)) {
        let id: Option<TaskId> = name.parse().ok();
        // A source named like a task id (`.agents/recipes/20260219_1.yaml`) is loaded when no
        // task has that id; `summon validate` warns about such a name.
        let task = match &id {
            Some(id) => task_exists(id, ctx)?,
            None => false,
        };
        if !task && !args.peek && !args.cancel {
            let catalog = ctx.catalog();
            if catalog.get(name).is_some() {
                let source = delegation::load_source(&catalog, name)?;
                return show(&source, args.output.json, ctx);
            }
        }
        let id = id.ok_or_else(|| Error::usage(format!("`{name}` is not a valid task id")))?;
        return super::task_result::run(&id, args, ctx);
    }
    if args.peek || args.cancel {
        return Err(Error::usage(
            "--peek and --cancel apply to a background task id",
        ));
    }
    let catalog = ctx.catalog();
    match &args.name {
        None => {
            let tasks = collectable_tasks(ctx)?;
            list(
                &tasks,
                &delegation::list_sources(&catalog),
                args.output.json,
                ctx,
            )
        }
        Some(name) => {
            let source = delegation::load_source(&catalog, name)?;
            show(&source, args.output.json, ctx)
        }
    }
}

/// Whether the project's store has a task with this id now (an expired one is gone).
fn task_exists(id: &TaskId, ctx: &Ctx) -> Result<bool> {
    let Some(tasks) = TaskStore::open_existing(&ctx.env)? else {
        return Ok(false);
    };
    match delegation::peek(&tasks, id) {
        Ok(_) => Ok(true),
        Err(delegation::CollectError::NotFound(_) | delegation::CollectError::Expired(_)) => {
            Ok(false)
        }
        Err(error) => Err(error.into()),
    }
}

fn list(tasks: &[TaskRecord], listing: &SourceList, json: bool, ctx: &mut Ctx) -> Result<()> {
    let cwd = ctx.env.cwd.clone();
    if json {
        let tasks: Vec<_> = tasks
            .iter()
            .map(|task| {
                json!({
                    "id": task.id.to_string(),
                    "description": task.description,
                    "status": task.status.as_str(),
                })
            })
            .collect();
        let sources: Vec<_> = listing
            .sources
            .iter()
            .map(|s| {
                json!({
                    "name": s.name,
                    "kind": s.kind.name(),
                    "description": s.description,
                    "path": s.path.display().to_string(),
                    "scope": if s.scope == Scope::Local { "local" } else { "global" },
                    "parent": s.parent.as_ref().map(|p| p.display().to_string()),
                    "tools": s.tools,
                })
            })
            .collect();
        let searched: Vec<_> = listing
            .searched
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        let skipped: Vec<_> = listing
            .skipped
            .iter()
            .map(|(path, reason)| json!({"path": path.display().to_string(), "reason": reason}))
            .collect();
        ctx.out.json(&json!({
            "tasks": tasks,
            "sources": sources,
            "searched": searched,
            "skipped": skipped,
        }))?;
        return Ok(());
    }
    for (path, reason) in &listing.skipped {
        ctx.note(&format!("skipped `{}`: {reason}", display_path(path, &cwd)));
    }
    write_tasks(tasks, ctx)?;
    if listing.problems > 0 {
        ctx.note(&format!(
            "{} source file(s) have errors and are left out; run `summon validate` to see them",
            listing.problems
        ));
    }
    if listing.sources.is_empty() {
        let mut text = String::from("No sources found. Searched:\n");
        for dir in &listing.searched {
            let shown = display_path(dir, &cwd);
            text.push_str(&format!(
                "  {}\n",
                if shown.is_empty() { "." } else { &shown }
            ));
        }
        ctx.out.write(&text)?;
        return Ok(());
    }
    let mut text = String::new();
    for (kind, heading) in [
        (SourceKind::Subrecipe, "Subrecipes"),
        (SourceKind::Recipe, "Recipes"),
        (SourceKind::Agent, "Agents"),
    ] {
        let group: Vec<_> = listing.of_kind(kind).collect();
        if group.is_empty() {
            continue;
        }
        text.push_str(&format!("{}:\n", ctx.out_palette.bold(heading)));
        let width = group
            .iter()
            .map(|s| s.name.chars().count())
            .max()
            .unwrap_or(0);
        for source in group {
            let description = one_line(&source.description);
            let tools = source.tools.as_deref().map_or(String::new(), |tools| {
                format!("  [tools: {}]", delegation::tools_line(tools))
            });
            text.push_str(&format!(
                "  {:width$}  {}{tools}  ({})\n",
                source.name,
                description,
                display_path(&source.path, &cwd),
            ));
        }
        text.push('\n');
    }
    text.push_str("Use `summon load <name>` to load into context.\n");
    text.push_str("Use `summon delegate --source <name>` to run as a subagent.\n");
    ctx.out.write(&text)?;
    Ok(())
}

/// Finished background tasks awaiting collection (none when the project has no store).
fn collectable_tasks(ctx: &Ctx) -> Result<Vec<TaskRecord>> {
    let Some(tasks) = TaskStore::open_existing(&ctx.env)? else {
        return Ok(Vec::new());
    };
    let done = tasks.list(crate::store::TaskFilter::Finished)?;
    Ok(done.into_iter().map(|view| view.task).collect())
}

/// The tasks awaiting collection, listed before the sources (as goose does).
fn write_tasks(tasks: &[TaskRecord], ctx: &mut Ctx) -> Result<()> {
    if tasks.is_empty() {
        return Ok(());
    }
    let mut text = format!(
        "{}:\n",
        ctx.out_palette.bold("Completed tasks awaiting retrieval")
    );
    text.push_str(&crate::delegation::loading::awaiting_lines(tasks.iter()));
    ctx.out.write(&text)?;
    Ok(())
}

fn one_line(text: &str) -> String {
    let line = text.trim().lines().next().unwrap_or("").trim();
    if line.chars().count() > 100 {
        let cut: String = line.chars().take(97).collect();
        format!("{cut}...")
    } else {
        line.to_owned()
    }
}

fn show(source: &LoadedSource, json: bool, ctx: &mut Ctx) -> Result<()> {
    if json {
        ctx.out.json(&json!({
            "name": source.name,
            "kind": source.kind.name(),
            "path": source.path.display().to_string(),
            "description": source.description,
            "content": source.content,
            "parameters": source.parameters.iter().map(parameter_json).collect::<Vec<_>>(),
            "tools": source.tools,
        }))?;
        return Ok(());
    }
    ctx.out.write(&source.render())?;
    Ok(())
}

pub(crate) fn parameter_json(p: &Parameter) -> serde_json::Value {
    json!({
        "key": p.key,
        "input_type": p.input_type.name(),
        "requirement": p.requirement.name(),
        "default": p.default,
        "description": p.description,
        "options": p.options,
    })
}
