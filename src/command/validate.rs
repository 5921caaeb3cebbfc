//! `summon validate [PATH...]`: every problem as `path:line:col`, exit 1 on any error.
//! Without a path: the catalog's recipes and agents and the pipelines under the project's
//! `pipelines/`; a directory is walked recursively, and its files that are not recipes,
//! agents or pipelines are skipped and named.
//!
//! JSON (`--json`): `{"checked": N, "errors": N, "warnings": N, "diagnostics": [DIAG],
//! "skipped": [PATH]}` where DIAG is `{"severity": "error"|"warning", "message", "path", "line", "column",
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
    let mut skipped = Vec::new();
    let checked = if args.paths.is_empty() {
        // The catalog's recipes and agents, and the project's pipelines.
        let mut checked = validate_catalog(ctx, &mut diags);
        let home = ctx.env.home();
        let root = crate::store::project_root(&ctx.env.cwd, home.as_deref()).0;
        let pipelines = root.join("pipelines");
        if pipelines.is_dir() {
            let mut seen = BTreeSet::new();
            let catalog = LazyCatalog::of(ctx);
            validate_path(&pipelines, &catalog, &mut seen, &mut diags, &mut skipped);
            checked += seen.len() - skipped.len();
        }
        checked
    } else {
        let mut seen = BTreeSet::new();
        let catalog = LazyCatalog::of(ctx);
        for path in &args.paths {
            let path = ctx.env.cwd.join(path);
            validate_path(&path, &catalog, &mut seen, &mut diags, &mut skipped);
        }
        seen.len() - skipped.len()
    };
    sort_by_position(&mut diags);
    let errors = diags.error_count();
    let warnings = diags.warning_count();
    let shown = |p: &PathBuf| {
        p.strip_prefix(&ctx.env.cwd)
            .unwrap_or(p)
            .display()
            .to_string()
    };
    if args.output.json {
        let items: Vec<_> = diags.items.iter().map(diagnostic_json).collect();
        let skipped: Vec<String> = skipped.iter().map(shown).collect();
        ctx.out.json(&json!({
            "checked": checked,
            "errors": errors,
            "warnings": warnings,
            "diagnostics": items,
            "skipped": skipped,
        }))?;
    } else {
        ctx.report(&diags.items);
        let mut stderr = std::io::stderr();
        if !skipped.is_empty() {
            // A closed stderr (`2>&1 | head`) is not an error.
            let mut names: Vec<String> = skipped.iter().take(SKIPPED_SHOWN).map(shown).collect();
            if skipped.len() > SKIPPED_SHOWN {
                names.push("...".to_owned());
            }
            let _ = writeln!(
                stderr,
                "summon: skipped {} file(s) that are not recipes, agents or pipelines: {}",
                skipped.len(),
                names.join(", ")
            );
        }
        let _ = writeln!(
            stderr,
            "summon: checked {checked} file(s): {errors} error(s), {warnings} warning(s)"
        );
    }
    if errors > 0 {
        // Already shown: exit 1 without printing them again.
        return Err(Error::Input(Diagnostics::default()));
    }
    Ok(())
}

/// How many skipped files the note names.
const SKIPPED_SHOWN: usize = 8;

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

/// A file, or every recipe, agent and pipeline in a directory and its subdirectories
/// (`.gitignore` and `.summonignore` respected); files of a candidate extension that are none
/// of those go to `skipped`.
fn validate_path(
    path: &Path,
    catalog: &LazyCatalog<'_>,
    seen: &mut BTreeSet<PathBuf>,
    diags: &mut Diagnostics,
    skipped: &mut Vec<PathBuf>,
) {
    if path.is_dir() {
        for file in candidate_files(path) {
            if seen.contains(&file) {
                continue;
            }
            match read_source_text(&file) {
                Ok(text) if kind_of(&file, &text, false) == Kind::Other => {
                    seen.insert(file.clone());
                    skipped.push(file);
                }
                Ok(_) => validate_file(&file, false, catalog, seen, diags),
                Err(message) => {
                    seen.insert(file.clone());
                    diags.push(Diagnostic::error(message).in_file(&file));
                }
            }
        }
    } else if path.exists() {
        validate_file(path, true, catalog, seen, diags);
    } else {
        diags.push(Diagnostic::error("no such file or directory").in_file(path));
    }
}

/// The `.yaml`, `.yml`, `.json` and `.md` files under `dir`, sorted; `.git` and `.summon`
/// are left out, and what `.gitignore` or `.summonignore` files ignore.
fn candidate_files(dir: &Path) -> Vec<PathBuf> {
    let walker = ignore::WalkBuilder::new(dir)
        .standard_filters(false)
        .git_ignore(true)
        .git_exclude(true)
        .parents(true)
        .require_git(false)
        .add_custom_ignore_filename(".summonignore")
        .follow_links(false)
        .filter_entry(|entry| !matches!(entry.file_name().to_str(), Some(".git" | ".summon")))
        .build();
    let mut files: Vec<PathBuf> = walker
        .flatten()
        .filter(|entry| entry.file_type().is_some_and(|t| t.is_file()))
        .map(ignore::DirEntry::into_path)
        .filter(|file| {
            let extension = file.extension().and_then(|e| e.to_str()).unwrap_or("");
            matches!(extension, "yaml" | "yml" | "json" | "md")
        })
        .collect();
    files.sort();
    files
}

/// What a file is, judged by its extension and top-level keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A recipe, an agent or a pipeline (or a file given by name, checked as one).
    Source,
    /// Something else (`action.yml`, a workflow, a JSON Schema, a README): skipped.
    Other,
}

/// Whether `text` is a recipe, an agent or a pipeline: a pipeline has `steps` (and no
/// `title`), a recipe `title`, `instructions`, `prompt` or goose's `recipe` wrapper, an agent
/// frontmatter with a `name`. A file given by `named` that is not a mapping is checked as a
/// recipe (which says what is wrong with it).
fn kind_of(path: &Path, text: &str, named: bool) -> Kind {
    const RECIPE_KEYS: [&str; 4] = ["title", "instructions", "prompt", "recipe"];
    let extension = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if extension == "md" {
        let front = text
            .strip_prefix("---")
            .and_then(|rest| rest.split("\n---").next());
        let named_agent = front.is_some_and(|front| {
            front
                .lines()
                .any(|line| line.trim_start_matches('\u{feff}').starts_with("name:"))
        });
        return if named_agent || named {
            Kind::Source
        } else {
            Kind::Other
        };
    }
    match crate::yaml::parse(text) {
        Ok(Some(root)) => match root.as_map() {
            Some(_) if crate::pipeline::parse::looks_like_pipeline(&root) => Kind::Source,
            Some(_) if root.get("$schema").is_some() => Kind::Other,
            Some(_) if RECIPE_KEYS.iter().any(|key| root.get(key).is_some()) => Kind::Source,
            Some(_) => Kind::Other,
            None if named => Kind::Source,
            None => Kind::Other,
        },
        Ok(None) if named => Kind::Source,
        Ok(None) => Kind::Other,
        // Broken YAML: judged by its top-level keys, so that its error is said.
        Err(_) => {
            let top = |key: &str| {
                text.lines()
                    .any(|line| line.strip_prefix(key).is_some_and(|r| r.starts_with(':')))
            };
            if named || top("steps") || RECIPE_KEYS.iter().any(|key| top(key)) {
                Kind::Source
            } else {
                Kind::Other
            }
        }
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
    if named && kind_of(path, &text, true) == Kind::Other {
        diags.push(
            Diagnostic::warning(
                "not a recipe, agent or pipeline (no `title`, `instructions`, `prompt` or \
                 `steps`): skipped",
            )
            .in_file(path),
        );
        return;
    }
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
        if let Some(pipeline) = &pipeline {
            check_items_files(pipeline, catalog, diags);
            check_command_defaults(pipeline, diags);
        }
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

/// Every `decompose.command` that reads only parameters with defaults, rendered with them as
/// the run renders it: a default that bash arithmetic in the command would run
/// (`a[$(cmd)]` where the command has `(( ))`, `[[ -gt ]]`, `let`, ...) is refused at the
/// command's line, as `--dry-run` and the run refuse it (`summon validate` takes no
/// `--param`; the values given to the run are checked by its dry run and the run).
fn check_command_defaults(pipeline: &Pipeline, diags: &mut Diagnostics) {
    use crate::pipeline::items::StaticForm;
    use crate::pipeline::model::{Decompose, StepKind};
    let defaults: std::collections::BTreeMap<&str, &str> = pipeline
        .parameters
        .iter()
        .filter_map(|p| Some((p.key.as_str(), p.default.as_deref()?)))
        .collect();
    let tenv = crate::template::environment(pipeline.file.path().parent());
    for step in &pipeline.steps {
        let StepKind::Decompose(Decompose::Static(StaticForm::Command, template)) = &step.kind
        else {
            continue;
        };
        let Ok(vars) = crate::template::variables(&template.text) else {
            continue;
        };
        if vars.is_empty() || !vars.iter().all(|v| defaults.contains_key(v.as_str())) {
            continue;
        }
        let context = minijinja::Value::from(minijinja::value::Serde(&defaults));
        let Err(error) = crate::template::render_command(&tenv, &template.text, &context) else {
            continue;
        };
        if !error.to_string().contains("bash evaluates arithmetic") {
            continue;
        }
        diags.push(
            Diagnostic::error(format!(
                "`steps.{}.decompose.command`: {}",
                step.id,
                template.render_error(&error)
            ))
            .at(Span::new(&pipeline.file, template.pos))
            .with_hint(
                "compute with the value in a command that does not interpolate it, or give \
                 the parameter a value without `[` followed by `$` or a backtick",
            ),
        );
    }
}

/// Every `decompose: {file: ...}` whose path is known before the run (literal, or made of
/// parameters with defaults) names a file that exists, relative to the project folder.
fn check_items_files(pipeline: &Pipeline, catalog: &LazyCatalog<'_>, diags: &mut Diagnostics) {
    use crate::pipeline::items::StaticForm;
    use crate::pipeline::model::{Decompose, StepKind};
    let root = match catalog.ctx {
        Some(ctx) => {
            let home = ctx.env.home();
            crate::store::project_root(&ctx.env.cwd, home.as_deref()).0
        }
        None => return,
    };
    let mut tenv = minijinja::Environment::new();
    tenv.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    let defaults: std::collections::BTreeMap<String, String> = pipeline
        .parameters
        .iter()
        .filter_map(|p| Some((p.key.clone(), p.default.clone()?)))
        .collect();
    for step in &pipeline.steps {
        let StepKind::Decompose(Decompose::Static(StaticForm::File { .. }, template)) = &step.kind
        else {
            continue;
        };
        // A path made of parameters without defaults is known only to the run.
        let Ok(rendered) = tenv.render_str(&template.text, &defaults) else {
            continue;
        };
        let rendered = rendered.trim();
        if rendered.is_empty() || root.join(rendered).exists() {
            continue;
        }
        let from_param = template.text.contains("{{");
        diags.push(
            Diagnostic::error(format!(
                "items file `{rendered}` of step `{}` does not exist (relative to the project \
                 folder {})",
                step.id,
                root.display()
            ))
            .at(Span::new(&pipeline.file, template.pos))
            .with_hint(if from_param {
                "create it, or give the parameter another path with `--param KEY=PATH` when \
                 you run the pipeline"
            } else {
                "create it, or correct the path"
            }),
        );
    }
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
