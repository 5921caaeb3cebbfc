//! `summon trust`: let this project's `summon.yaml` decide where credentials go and its
//! `.mcp.json` start servers (see [`crate::config::trust`]).
//!
//! JSON (`--json`): `{"project", "trusted_at", "files": {NAME: SHA256|null}, "sources": {PATH: SHA256}, "enables": [TEXT]}`
//! for `summon trust`; `{"projects": [{"project", "trusted_at", "files"}]}` for `--list`;
//! `{"project", "revoked": bool}` for `--revoke`.

use serde_json::json;

use super::Ctx;
use crate::cli::TrustArgs;
use crate::config::file::{Scope, load};
use crate::config::trust;
use crate::env::Env;
use crate::error::{Error, Result};

pub(crate) fn run(args: &TrustArgs, ctx: &mut Ctx) -> Result<()> {
    if args.list {
        return list(args.output.json, ctx);
    }
    if args.revoke {
        let revoked = trust::revoke(&ctx.env).map_err(|e| cannot_record(&ctx.env, &e))?;
        let project = trust::project_dir(&ctx.env);
        if args.output.json {
            ctx.out.json(&json!({
                "project": project,
                "revoked": revoked,
            }))?;
            return Ok(());
        }
        ctx.out.line(&if revoked {
            format!("No longer trusted: {}", project.display())
        } else {
            format!("{} was not trusted.", project.display())
        })?;
        return Ok(());
    }
    let enables = enabled_by_trust(&ctx.env);
    let catalog = ctx.catalog();
    let starters = stdio_sources(&ctx.env, &catalog);
    let mut paths: Vec<std::path::PathBuf> = starters.into_iter().map(|(p, _)| p).collect();
    paths.extend(pipeline_sources(&ctx.env).into_iter().map(|(p, _)| p));
    let (project, record) =
        trust::trust(&ctx.env, &paths).map_err(|e| cannot_record(&ctx.env, &e))?;
    if args.output.json {
        ctx.out.json(&json!({
            "project": project,
            "trusted_at": record.trusted_at,
            "files": record.files,
            "sources": record.sources,
            "enables": enables,
        }))?;
        return Ok(());
    }
    let mut text = format!("Trusted {}\n", project.display());
    for (name, hash) in &record.files {
        match hash {
            Some(hash) => text.push_str(&format!("  {name}: sha256 {}\n", &hash[..16])),
            None => text.push_str(&format!("  {name}: absent\n")),
        }
    }
    if enables.is_empty() {
        text.push_str("Its files send no credential anywhere and start nothing.\n");
    } else {
        text.push_str("This allows:\n");
        for line in &enables {
            text.push_str(&format!("  - {line}\n"));
        }
    }
    for (path, hash) in &record.sources {
        text.push_str(&format!("  {path}: sha256 {}\n", &hash[..16]));
    }
    text.push_str("A change to any of these files needs `summon trust` again.\n");
    ctx.out.write(&text)?;
    Ok(())
}

fn list(json: bool, ctx: &mut Ctx) -> Result<()> {
    let projects = trust::list(&ctx.env);
    if json {
        let items: Vec<_> = projects
            .iter()
            .map(|(dir, record)| {
                json!({"project": dir, "trusted_at": record.trusted_at, "files": record.files})
            })
            .collect();
        ctx.out.json(&json!({ "projects": items }))?;
        return Ok(());
    }
    if projects.is_empty() {
        ctx.out
            .line("No trusted projects. Trust the current one with `summon trust`.")?;
        return Ok(());
    }
    let mut text = String::new();
    for (dir, record) in &projects {
        text.push_str(&format!(
            "{}  (since {})\n",
            dir.display(),
            record.trusted_at
        ));
    }
    ctx.out.write(&text)?;
    Ok(())
}

fn cannot_record(env: &Env, e: &std::io::Error) -> Error {
    let path = trust::store_path(env).map_or_else(String::new, |p| format!(" {}", p.display()));
    Error::usage(format!(
        "cannot update the list of trusted projects{path}: {e}"
    ))
}

/// The project's recipes whose `stdio` extensions start a command, with a line saying so.
fn stdio_sources(env: &Env, catalog: &crate::source::Catalog) -> Vec<(std::path::PathBuf, String)> {
    let mut out = Vec::new();
    for source in &catalog.sources {
        let Some(recipe) = source.recipe() else {
            continue;
        };
        let Some(relative) = trust::project_relative(env, &source.path) else {
            continue;
        };
        let mut commands: Vec<String> = recipe
            .extensions
            .iter()
            .filter(|e| matches!(e.kind, crate::recipe::ExtensionKind::Stdio))
            .map(|e| {
                format!(
                    "the extension `{}` ({})",
                    e.name,
                    e.cmd.as_deref().unwrap_or("?")
                )
            })
            .collect();
        if let Some(retry) = &recipe.retry {
            commands.extend(
                retry
                    .checks
                    .iter()
                    .chain(&retry.on_failure)
                    .map(|c| format!("the `retry` command `{c}` (outside the sandbox)")),
            );
        }
        if !commands.is_empty() && !out.iter().any(|(p, _)| *p == source.path) {
            out.push((
                source.path.clone(),
                format!(
                    "{relative} starts {} (pinned to the file as it is now)",
                    commands.join(", ")
                ),
            ));
        }
    }
    out
}

/// The deepest folder below the project folder where pipeline files are looked for.
const PIPELINE_DEPTH: usize = 4;

/// The project's pipeline files (below the project folder, at most [`PIPELINE_DEPTH`] deep,
/// leaving out what `.gitignore` leaves out and hidden folders), with a line saying what each
/// would start: `summon trust` pins them, so `summon mcp`'s `run_pipeline` runs them while
/// their bytes stay as they were.
fn pipeline_sources(env: &Env) -> Vec<(std::path::PathBuf, String)> {
    use crate::pipeline::items::StaticForm;
    use crate::pipeline::model::{Decompose, StepKind};
    let project = trust::project_dir(env);
    let walker = ignore::WalkBuilder::new(&project)
        .max_depth(Some(PIPELINE_DEPTH))
        .require_git(false)
        .follow_links(false)
        .build();
    let mut out = Vec::new();
    for entry in walker.flatten() {
        let path = entry.path();
        let is_yaml = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml"));
        if !is_yaml || !entry.file_type().is_some_and(|t| t.is_file()) {
            continue;
        }
        let Ok(text) = crate::source::read_source_text(path) else {
            continue;
        };
        let is_pipeline = matches!(crate::yaml::parse(&text), Ok(Some(root))
            if crate::pipeline::parse::looks_like_pipeline(&root));
        if !is_pipeline {
            continue;
        }
        let file = crate::diag::SourceFile::new(path, text);
        let mut diags = crate::diag::Diagnostics::default();
        let Some(pipeline) = crate::pipeline::parse::parse_pipeline(&file, &mut diags) else {
            continue;
        };
        let relative =
            trust::project_relative(env, path).unwrap_or_else(|| path.display().to_string());
        let commands: Vec<String> = pipeline
            .steps
            .iter()
            .filter_map(|step| match &step.kind {
                StepKind::Decompose(Decompose::Static(StaticForm::Command, t)) => Some(format!(
                    "the `decompose.command` `{}` of step `{}` (outside the sandbox)",
                    t.text.trim(),
                    step.id
                )),
                _ => None,
            })
            .collect();
        let line = if commands.is_empty() {
            format!("{relative} (a pipeline that starts no command) for run_pipeline")
        } else {
            format!(
                "{relative} starts {} when run_pipeline runs it",
                commands.join(", ")
            )
        };
        out.push((
            path.to_owned(),
            format!("{line} (pinned to the file as it is now)"),
        ));
    }
    out.sort();
    out
}

/// What trusting the project would allow (or allows): each project provider that sets where
/// a credential goes, the project's `traces` endpoint and content capture, each `.mcp.json`
/// server, each recipe that starts a command and each pipeline.
pub(crate) fn enabled_by_trust(env: &Env) -> Vec<String> {
    let mut out = Vec::new();
    let config = load(env).config;
    for provider in config.providers.values() {
        if provider.scope != Scope::Project || provider.routing_pos.is_none() {
            continue;
        }
        let Some(def) = crate::config::presets::lookup(&provider.name, env, &config) else {
            continue;
        };
        let key = match &def.api_key_env {
            Some(var) => format!("the key in {var}"),
            None => "requests".to_owned(),
        };
        out.push(format!(
            "provider `{}` (summon.yaml) sends {key} to {}",
            def.name,
            crate::text::without_url_credentials(&def.base_url)
        ));
    }
    if let Some(traces) = &config.traces
        && traces.value.scope == Some(Scope::Project)
    {
        if let Some(endpoint) = &traces.value.endpoint {
            out.push(format!(
                "`traces` (summon.yaml) sends every run's spans to {}",
                crate::text::without_url_credentials(endpoint)
            ));
        }
        if traces.value.capture_content == Some(true) {
            out.push(
                "`traces.capture_content` (summon.yaml) puts every prompt and answer in those spans"
                    .to_owned(),
            );
        }
    }
    match crate::mcp::project_servers(&trust::project_dir(env), env) {
        Ok(servers) => {
            for server in servers {
                out.push(format!(
                    "server `{}` (.mcp.json) {} when an agent names it",
                    server.name,
                    server.action()
                ));
            }
        }
        Err(diagnostic) => out.push(format!(
            "the servers of .mcp.json (it cannot be read now: {})",
            diagnostic.message
        )),
    }
    let catalog = crate::source::discover(crate::source::search_dirs(env));
    out.extend(
        stdio_sources(env, &catalog)
            .into_iter()
            .map(|(_, line)| line),
    );
    out.extend(pipeline_sources(env).into_iter().map(|(_, line)| line));
    out
}
