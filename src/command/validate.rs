//! `summon validate [PATH...]`: every problem as `path:line:col`, exit 1 on any error.
//!
//! JSON (`--json`): `{"checked": N, "errors": N, "warnings": N, "diagnostics": [DIAG]}`
//! where DIAG is `{"severity": "error"|"warning", "message", "path", "line", "column",
//! "hint"}` (`path`, `line`, `column` and `hint` may be null).

use std::cell::OnceCell;
use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::Ctx;
use crate::agent::{AgentDef, AgentDir, AgentParse, parse_agent};
use crate::cli::ValidateArgs;
use crate::compile::{Flags, Inputs, compile_pipeline};
use crate::diag::{Diagnostic, Diagnostics, SourceFile, Span};
use crate::error::{Error, Result};
use crate::pipeline::model::Pipeline;
use crate::recipe::{Recipe, Strictness, check_templates, parse_recipe};
use crate::source::{Catalog, SourceDef, read_source_text};

pub(crate) fn run(args: &ValidateArgs, ctx: &mut Ctx) -> Result<()> {
    let mut diags = Diagnostics::default();
    let checked = if args.paths.is_empty() {
        validate_catalog(ctx, &mut diags)
    } else {
        let mut seen = BTreeSet::new();
        let catalog = LazyCatalog::of(ctx);
        for path in &args.paths {
            let path = ctx.env.cwd.join(path);
            validate_path(&path, &catalog, &mut seen, &mut diags);
        }
        seen.len()
    };
    sort_by_position(&mut diags);
    let errors = diags.error_count();
    let warnings = diags.warning_count();
    if args.output.json {
        let items: Vec<_> = diags.items.iter().map(diagnostic_json).collect();
        ctx.out.json(&json!({
            "checked": checked,
            "errors": errors,
            "warnings": warnings,
            "diagnostics": items,
        }))?;
    } else {
        ctx.report(&diags.items);
        // A closed stderr (`2>&1 | head`) is not an error.
        let _ = writeln!(
            std::io::stderr(),
            "summon: checked {checked} file(s): {errors} error(s), {warnings} warning(s)"
        );
    }
    if errors > 0 {
        // Already shown: exit 1 without printing them again.
        return Err(Error::Input(Diagnostics::default()));
    }
    Ok(())
}

fn validate_catalog(ctx: &Ctx, diags: &mut Diagnostics) -> usize {
    let catalog = ctx.catalog();
    let mut files = BTreeSet::new();
    for d in &catalog.diagnostics.items {
        if let Some(path) = d.file_path() {
            files.insert(path.to_path_buf());
        }
    }
    let mut out = Diagnostics::default();
    let mut catalog = catalog;
    out.extend(std::mem::take(&mut catalog.diagnostics));
    for source in &catalog.sources {
        files.insert(source.path.clone());
        if crate::store::TaskId::looks_like(&source.name) {
            out.push(
                Diagnostic::warning(format!(
                    "{} `{}` is named like a background task id: `summon load {}` loads it only while no task has that id",
                    source.kind.name(),
                    source.name,
                    source.name
                ))
                .in_file(&source.path)
                .with_hint("rename it, so that its name can never mean a task"),
            );
        }
        match &source.def {
            SourceDef::Recipe(recipe) => check_templates(recipe, &mut out),
            SourceDef::Subrecipe { .. } => {}
            SourceDef::Agent(agent) => agent_notes(agent, &mut out),
        }
    }
    for shadowed in &catalog.shadowed {
        files.insert(shadowed.path.clone());
    }
    for warning in catalog.shadow_warnings(&ctx.env.cwd) {
        out.push(warning);
    }
    diags.extend(out);
    files.len()
}

/// Within each file, diagnostics in source order; files in the order they were met.
fn sort_by_position(diags: &mut Diagnostics) {
    let mut files: Vec<Option<PathBuf>> = Vec::new();
    for d in &diags.items {
        let path = d.file_path().map(Path::to_path_buf);
        if !files.contains(&path) {
            files.push(path);
        }
    }
    diags.items.sort_by_key(|d| {
        let path = d.file_path().map(Path::to_path_buf);
        let file = files.iter().position(|f| *f == path).unwrap_or(usize::MAX);
        let (line, col) = d.span.as_ref().map_or((0, 0), |s| (s.pos.line, s.pos.col));
        (file, line, col)
    });
}

/// The catalog pipelines' source names are checked against, discovered when the first
/// pipeline needs it.
struct LazyCatalog<'a> {
    ctx: Option<&'a Ctx>,
    catalog: OnceCell<Catalog>,
}

impl<'a> LazyCatalog<'a> {
    fn of(ctx: &'a Ctx) -> Self {
        Self {
            ctx: Some(ctx),
            catalog: OnceCell::new(),
        }
    }

    /// No catalog: source names are not checked.
    fn none() -> Self {
        Self {
            ctx: None,
            catalog: OnceCell::new(),
        }
    }

    fn get(&self) -> Option<&Catalog> {
        let ctx = self.ctx?;
        Some(self.catalog.get_or_init(|| ctx.catalog()))
    }
}

/// A file, or every recipe and agent file directly inside a directory.
fn validate_path(
    path: &Path,
    catalog: &LazyCatalog<'_>,
    seen: &mut BTreeSet<PathBuf>,
    diags: &mut Diagnostics,
) {
    if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map(|entries| entries.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        for file in files {
            let extension = file.extension().and_then(|e| e.to_str()).unwrap_or("");
            if file.is_file() && matches!(extension, "yaml" | "yml" | "json" | "md") {
                validate_file(&file, false, catalog, seen, diags);
            }
        }
    } else if path.exists() {
        validate_file(path, true, catalog, seen, diags);
    } else {
        diags.push(Diagnostic::error("no such file or directory").in_file(path));
    }
}

/// Checks `text` as `summon validate PATH` would check it were it the content of `path`
/// (for `summon new`, before the file is written).
pub(super) fn validate_text(path: &Path, text: String) -> Diagnostics {
    let mut diags = Diagnostics::default();
    let mut seen = BTreeSet::from([path.to_path_buf()]);
    validate_source_file(
        path,
        text,
        true,
        &LazyCatalog::none(),
        &mut seen,
        &mut diags,
    );
    sort_by_position(&mut diags);
    diags
}

fn validate_file(
    path: &Path,
    named: bool,
    catalog: &LazyCatalog<'_>,
    seen: &mut BTreeSet<PathBuf>,
    diags: &mut Diagnostics,
) {
    if !seen.insert(path.to_path_buf()) {
        return;
    }
    let text = match read_source_text(path) {
        Ok(text) => text,
        Err(message) => {
            diags.push(Diagnostic::error(message).in_file(path));
            return;
        }
    };
    validate_source_file(path, text, named, catalog, seen, diags);
}

fn validate_source_file(
    path: &Path,
    text: String,
    named: bool,
    catalog: &LazyCatalog<'_>,
    seen: &mut BTreeSet<PathBuf>,
    diags: &mut Diagnostics,
) {
    let file = SourceFile::new(path, text);
    let extension = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if extension == "md" {
        let dir = if path.parent().is_some_and(|p| p.ends_with(".agents/agents")) {
            AgentDir::Project
        } else {
            AgentDir::Other
        };
        match parse_agent(&file, dir, diags) {
            AgentParse::Agent(agent) => agent_notes(&agent, diags),
            AgentParse::NotAnAgent => {
                if named && !diags.items.iter().any(|d| d.file_path() == Some(path)) {
                    diags.push(
                        Diagnostic::warning(
                            "not an agent definition: no frontmatter with a `name`",
                        )
                        .in_file(path),
                    );
                }
            }
        }
        return;
    }
    if matches!(extension, "yaml" | "yml")
        && let Some(pipeline) = crate::pipeline::parse::validate_if_pipeline(&file, diags)
    {
        if let (Some(pipeline), Some(catalog)) = (pipeline, catalog.get()) {
            check_compiled(pipeline, catalog, diags);
        }
        return;
    }
    if let Some(recipe) = parse_recipe(&file, Strictness::Strict, diags) {
        check_recipe(&recipe, catalog, seen, diags);
    }
}

/// What compiling a valid pipeline against the catalog finds, as `summon run` and its dry
/// run find it before anything is sent (parameters are not known: a source that reads one
/// is checked by the run).
fn check_compiled(pipeline: Pipeline, catalog: &Catalog, diags: &mut Diagnostics) {
    let inputs = Inputs {
        params: &indexmap::IndexMap::new(),
        flags: Flags::default(),
        catalog,
    };
    diags.extend(compile_pipeline(pipeline, &inputs).diagnostics(|_| true));
}

/// Template checks, and the sub-recipes a recipe refers to.
fn check_recipe(
    recipe: &Recipe,
    catalog: &LazyCatalog<'_>,
    seen: &mut BTreeSet<PathBuf>,
    diags: &mut Diagnostics,
) {
    check_templates(recipe, diags);
    for sub in &recipe.sub_recipes {
        validate_file(&sub.path, true, catalog, seen, diags);
    }
}

/// Frontmatter keys that are read by other tools and ignored here.
fn agent_notes(agent: &AgentDef, diags: &mut Diagnostics) {
    for (key, pos) in &agent.ignored_keys {
        diags.push(
            Diagnostic::warning(format!("frontmatter key `{key}` is ignored by summon"))
                .at(Span::new(&agent.file, *pos)),
        );
    }
}

fn diagnostic_json(d: &Diagnostic) -> serde_json::Value {
    json!({
        "severity": d.severity.as_str(),
        "message": d.message,
        "path": d.file_path().map(|p| p.display().to_string()),
        "line": d.span.as_ref().map(|s| s.pos.line),
        "column": d.span.as_ref().map(|s| s.pos.col),
        "hint": d.hint,
    })
}
