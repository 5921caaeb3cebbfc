//! `summon load`: list every source, or print one.
//!
//! JSON (`--json`), listing:
//! `{"sources": [{"name", "kind", "description", "path", "scope", "parent"}], "searched": [PATH]}`
//! (`parent`: the recipe declaring a subrecipe, else null).
//! One source: `{"name", "kind", "path", "description", "content", "parameters": [PARAM]}`
//! where PARAM is `{"key", "input_type", "requirement", "default", "description", "options"}`.

use serde_json::json;

use super::Ctx;
use crate::cli::LoadArgs;
use crate::diag::render::display_path;
use crate::error::{Error, Result};
use crate::recipe::Parameter;
use crate::source::{Catalog, Scope, Source, SourceDef, SourceKind};
use crate::store::TaskId;

pub(crate) fn run(args: &LoadArgs, ctx: &mut Ctx) -> Result<()> {
    if let Some(id) = args.name.as_deref().filter(|n| TaskId::looks_like(n)) {
        let id: TaskId = id
            .parse()
            .map_err(|_| Error::usage(format!("`{id}` is not a valid task id")))?;
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
            list_tasks(args.output.json, ctx)?;
            list(&catalog, args.output.json, ctx)
        }
        Some(name) => {
            let source = catalog
                .get(name)
                .ok_or_else(|| Error::from(catalog.not_found(name)))?;
            show(source, args.output.json, ctx)
        }
    }
}

fn list(catalog: &Catalog, json: bool, ctx: &mut Ctx) -> Result<()> {
    let cwd = ctx.env.cwd.clone();
    if json {
        let sources: Vec<_> = catalog
            .sources
            .iter()
            .map(|s| {
                json!({
                    "name": s.name,
                    "kind": s.kind.name(),
                    "description": s.description,
                    "path": s.path.display().to_string(),
                    "scope": if s.scope == Scope::Local { "local" } else { "global" },
                    "parent": match &s.def {
                        SourceDef::Subrecipe { parent, .. } => Some(parent.path().display().to_string()),
                        _ => None,
                    },
                })
            })
            .collect();
        let searched: Vec<_> = catalog
            .searched
            .iter()
            .map(|d| d.path.display().to_string())
            .collect();
        ctx.out
            .json(&json!({ "sources": sources, "searched": searched }))?;
        return Ok(());
    }
    let problems = catalog.diagnostics.error_count();
    if problems > 0 {
        ctx.note(&format!(
            "{problems} source file(s) have errors and are left out; run `summon validate` to see them"
        ));
    }
    if catalog.sources.is_empty() {
        let mut text = String::from("No sources found. Searched:\n");
        for dir in &catalog.searched {
            let shown = display_path(&dir.path, &cwd);
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
        let group: Vec<&Source> = catalog.sources.iter().filter(|s| s.kind == kind).collect();
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
            text.push_str(&format!(
                "  {:width$}  {}  ({})\n",
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

/// Finished background tasks awaiting collection, listed before the sources (as goose
/// does). Only in the text output, and only when the project has a store.
fn list_tasks(json: bool, ctx: &mut Ctx) -> Result<()> {
    if json {
        return Ok(());
    }
    let Some(tasks) = crate::delegation::TaskStore::open_existing(&ctx.env)? else {
        return Ok(());
    };
    let done = tasks.list(crate::store::TaskFilter::Finished)?;
    if done.is_empty() {
        return Ok(());
    }
    let mut text = format!(
        "{}:
",
        ctx.out_palette.bold("Completed tasks awaiting retrieval")
    );
    for view in done {
        let task = view.task;
        text.push_str(&format!(
            "  {}  {}  ({})\n",
            task.id,
            task.description,
            task.status.as_str()
        ));
    }
    text.push('\n');
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

fn show(source: &Source, json: bool, ctx: &mut Ctx) -> Result<()> {
    let content = content_of(source);
    let parameters: &[Parameter] = match &source.def {
        SourceDef::Subrecipe { recipe, .. } => &recipe.parameters,
        _ => &[],
    };
    if json {
        ctx.out.json(&json!({
            "name": source.name,
            "kind": source.kind.name(),
            "path": source.path.display().to_string(),
            "description": source.description,
            "content": content,
            "parameters": parameters.iter().map(parameter_json).collect::<Vec<_>>(),
        }))?;
        return Ok(());
    }
    let mut text = format!(
        "# Loaded: {} ({})\n\n{}\n",
        source.name,
        source.kind.name(),
        content.trim_end()
    );
    if !parameters.is_empty() {
        text.push_str("\n## Parameters\n\n");
        text.push_str(&format_parameters(parameters));
    }
    text.push_str("\nThis knowledge is now available in your context.\n");
    ctx.out.write(&text)?;
    Ok(())
}

/// The text a source contributes: a recipe's instructions and prompt, an agent's role text.
pub(crate) fn content_of(source: &Source) -> String {
    match &source.def {
        SourceDef::Agent(agent) => agent.body.trim().to_owned(),
        SourceDef::Recipe(recipe) | SourceDef::Subrecipe { recipe, .. } => {
            let mut parts = Vec::new();
            if let Some(instructions) = &recipe.instructions {
                parts.push(instructions.trim_end().to_owned());
            }
            if let Some(prompt) = &recipe.prompt {
                parts.push(format!("## Prompt\n\n{}", prompt.trim_end()));
            }
            parts.join("\n\n")
        }
    }
}

pub(crate) fn format_parameters(parameters: &[Parameter]) -> String {
    let mut text = String::new();
    for p in parameters {
        let mut facts = vec![
            p.input_type.name().to_owned(),
            p.requirement.name().to_owned(),
        ];
        if let Some(default) = &p.default {
            facts.push(format!("default: {default}"));
        }
        if !p.options.is_empty() {
            facts.push(format!("options: {}", p.options.join(", ")));
        }
        text.push_str(&format!("- `{}` ({})", p.key, facts.join(", ")));
        if !p.description.is_empty() {
            text.push_str(&format!(": {}", p.description.trim()));
        }
        text.push('\n');
    }
    text
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
