//! `summon new agent|recipe|pipeline NAME`: write a valid, commented definition where summon
//! finds it, checked with the checks of `summon validate` before it is written.
//!
//! Refused, with nothing written: a name that is not a good file stem; a name another source
//! already has (the message names its file); an existing file without `--force`; a file
//! that would not validate. With `--force` the changed lines are shown.
//!
//! JSON (`--json`): `{"kind", "name", "path", "action": "created"|"replaced"|"unchanged",
//! "created_dirs": [PATH], "changes": [{"change": "removed"|"added", "line", "text"}],
//! "diagnostics": [DIAG], "usable": TEXT}` where DIAG is as for `summon validate --json`.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::Ctx;
use super::validate::validate_text;
use crate::agent::{ToolKind, ToolRef};
use crate::cli::{NewArgs, NewKind};
use crate::diag::render::display_path;
use crate::diag::suggestions;
use crate::diag::{Diagnostic, Diagnostics, Pos};
use crate::error::{Error, Result};
use crate::output::write_atomically;
use crate::scaffold::{
    AgentSpec, Change, DiffLine, PipelineSpec, RecipeSpec, agent_text, check_name, line_diff,
    parse_params, pipeline_text, recipe_text, title_from_name,
};
use crate::schema::SchemaKind;
use crate::source::{Catalog, SourceKind};

/// The three kinds of file `summon new` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Agent,
    Recipe,
    Pipeline,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Recipe => "recipe",
            Self::Pipeline => "pipeline",
        }
    }

    /// The folder, relative to the working directory.
    fn dir(self) -> &'static str {
        match self {
            Self::Agent => ".agents/agents",
            Self::Recipe => "recipes",
            Self::Pipeline => "pipelines",
        }
    }

    fn schema(self) -> SchemaKind {
        match self {
            Self::Agent => SchemaKind::Agent,
            Self::Recipe => SchemaKind::Recipe,
            Self::Pipeline => SchemaKind::Pipeline,
        }
    }

    fn extension(self) -> &'static str {
        match self {
            Self::Agent => "md",
            Self::Recipe | Self::Pipeline => "yaml",
        }
    }

    /// Other extensions a file of the same name would have (and so clash).
    fn sibling_extensions(self) -> &'static [&'static str] {
        match self {
            Self::Agent => &[],
            Self::Recipe => &["yml", "json"],
            Self::Pipeline => &["yml"],
        }
    }
}

pub(crate) fn run(args: &NewArgs, ctx: &mut Ctx) -> Result<()> {
    let (kind, common) = match &args.kind {
        NewKind::Agent(a) => (Kind::Agent, &a.common),
        NewKind::Recipe(a) => (Kind::Recipe, &a.common),
        NewKind::Pipeline(a) => (Kind::Pipeline, &a.common),
    };
    check_name(&common.name).map_err(Error::usage)?;
    let name = common.name.as_str();
    let path = ctx
        .env
        .cwd
        .join(kind.dir())
        .join(format!("{name}.{}", kind.extension()));
    let catalog = ctx.catalog();
    check_clash(kind, name, &path, &catalog, &ctx.env.cwd)?;
    let description = common
        .description
        .clone()
        .unwrap_or_else(|| default_description(kind, name));
    let text = match &args.kind {
        NewKind::Agent(a) => {
            let tools = a.tools.as_ref().map(|list| {
                list.iter()
                    .map(|t| t.trim().to_owned())
                    .filter(|t| !t.is_empty())
                    .collect::<Vec<_>>()
            });
            if let Some(tools) = &tools {
                check_tools(tools)?;
            }
            agent_text(&AgentSpec {
                name,
                description: &description,
                tools: tools.as_deref(),
                model: a.model.as_deref(),
                role: a.role.as_deref(),
            })
        }
        NewKind::Recipe(a) => {
            let params = parse_params(&a.params).map_err(Error::usage)?;
            let title = a.title.clone().unwrap_or_else(|| title_from_name(name));
            recipe_text(&RecipeSpec {
                name,
                title: &title,
                description: &description,
                instructions: a.instructions.as_deref(),
                prompt: a.prompt.as_deref(),
                params: &params,
                provider: a.provider.as_deref(),
                model: a.model.as_deref(),
            })
        }
        NewKind::Pipeline(a) => {
            let params = parse_params(&a.params).map_err(Error::usage)?;
            let source = match &a.source {
                Some(source) => Some((source.as_str(), required_params(&catalog, source)?)),
                None => None,
            };
            pipeline_text(&PipelineSpec {
                name,
                description: &description,
                source,
                params: &params,
                model: a.model.as_deref(),
            })
        }
    };
    let text = with_schema_line(kind, &text);
    let old = read_existing(&path)?;
    if old.is_some() && !common.force {
        return Err(Error::from(
            Diagnostic::error(format!(
                "{} already exists; not overwritten",
                display_path(&path, &ctx.env.cwd)
            ))
            .with_hint("pass --force to replace it (the changed lines are shown)"),
        ));
    }
    let diags = validate_text(&path, text.clone());
    if diags.has_errors() {
        ctx.report(&diags.items);
        return Err(Error::usage(format!(
            "{} not written: the {} it would hold does not validate (above)",
            display_path(&path, &ctx.env.cwd),
            kind.name()
        )));
    }
    let created_dirs = missing_dirs(&path, &ctx.env.cwd);
    let changes = old.as_deref().map(|old| line_diff(old, &text));
    let action = match &changes {
        None => "created",
        Some(changes) if changes.is_empty() => "unchanged",
        Some(_) => "replaced",
    };
    write_schema(kind, &ctx.env.cwd)?;
    if action != "unchanged" {
        write_atomically(&path, text.as_bytes()).map_err(|e| {
            Error::usage(format!(
                "cannot write {}: {e}",
                display_path(&path, &ctx.env.cwd)
            ))
        })?;
    }
    let written = Written {
        usable: usable_note(kind, name, &path, ctx),
        kind,
        path,
        action,
        created_dirs,
        changes: changes.unwrap_or_default(),
    };
    if common.output.json {
        print_json(&written, name, &diags, ctx)?;
    } else {
        ctx.report(&diags.items);
        print_human(&written, common.description.is_none(), ctx)?;
    }
    Ok(())
}

/// Where `summon new` puts the JSON Schema of a kind, relative to the working directory: in
/// the store folder, which is not committed, rewritten by each `summon new` so it matches the
/// summon in use (it equals the `schemas/KIND.json` published with summon).
fn schema_path(kind: Kind) -> String {
    format!(
        "{}/schemas/{}.json",
        crate::store::DIR_NAME,
        kind.schema().name()
    )
}

/// The text with the `# yaml-language-server: $schema=...` line that makes editors with the
/// YAML language server complete and check keys: first in a YAML file, first in an agent's
/// frontmatter. The path is relative to the new file, as the language server reads it.
fn with_schema_line(kind: Kind, text: &str) -> String {
    let up = "../".repeat(kind.dir().split('/').count());
    let line = format!(
        "# yaml-language-server: $schema={up}{}\n",
        schema_path(kind)
    );
    match text.strip_prefix("---\n") {
        Some(rest) if kind == Kind::Agent => format!("---\n{line}{rest}"),
        _ => format!("{line}{text}"),
    }
}

/// Writes the schema the new file's first line points at, and the store folder's
/// `.gitignore` when the folder is new.
fn write_schema(kind: Kind, cwd: &Path) -> Result<()> {
    let path = cwd.join(schema_path(kind));
    let ignore = cwd.join(crate::store::DIR_NAME).join(".gitignore");
    let result = write_atomically(&path, kind.schema().text().as_bytes()).and_then(|()| {
        if ignore.exists() {
            Ok(())
        } else {
            std::fs::write(&ignore, "*\n")
        }
    });
    result.map_err(|e| Error::usage(format!("cannot write {}: {e}", display_path(&path, cwd))))
}

/// What was done, for the report.
struct Written {
    kind: Kind,
    path: PathBuf,
    /// `created`, `replaced` or `unchanged`.
    action: &'static str,
    created_dirs: Vec<PathBuf>,
    /// The changed lines of a replaced file.
    changes: Vec<DiffLine>,
    /// When the definition can be used.
    usable: String,
}

/// The description written when none was given.
fn default_description(kind: Kind, name: &str) -> String {
    match kind {
        Kind::Agent => format!("Say here when to use the {name} role."),
        Kind::Recipe => format!("Say here what the {name} recipe does."),
        Kind::Pipeline => format!("Say here what the {name} pipeline produces."),
    }
}

/// A name another file already gives a source (or pipeline), or a file of the same stem
/// beside the target with another extension.
fn check_clash(kind: Kind, name: &str, path: &Path, catalog: &Catalog, cwd: &Path) -> Result<()> {
    let stem = path.with_extension("");
    for extension in kind.sibling_extensions() {
        let sibling = stem.with_extension(extension);
        if sibling.is_file() {
            return Err(clash(
                format!(
                    "{} already defines {} `{name}`",
                    display_path(&sibling, cwd),
                    kind.name()
                ),
                "choose another name, or edit that file",
            ));
        }
    }
    if kind == Kind::Pipeline {
        return Ok(());
    }
    let existing = catalog
        .sources
        .iter()
        .filter(|s| s.name == name)
        .map(|s| (s.kind, s.path.clone()))
        .chain(
            catalog
                .shadowed
                .iter()
                .filter(|s| s.name == name)
                .map(|s| (s.kind, s.path.clone())),
        )
        .find(|(_, other)| other != path);
    if let Some((other_kind, other)) = existing {
        let relation = match catalog.get(name) {
            Some(winner) if winner.path == other => {
                "it is found first, so the new file would be shadowed"
            }
            _ => "the new file would shadow it",
        };
        let subrecipe = if other_kind == SourceKind::Subrecipe {
            " (a subrecipe declared by a recipe's `sub_recipes`)"
        } else {
            ""
        };
        return Err(clash(
            format!(
                "`{name}` is already the name of the {} in {}{subrecipe}; {relation}",
                other_kind.name(),
                display_path(&other, cwd)
            ),
            "choose another name, or rename or remove that file",
        ));
    }
    Ok(())
}

fn clash(message: String, hint: &str) -> Error {
    Error::from(Diagnostic::error(message).with_hint(hint))
}

/// Every listed tool must be one summon offers, and a project role cannot delegate.
fn check_tools(tools: &[String]) -> Result<()> {
    const KNOWN: [&str; 6] = [
        "read_file",
        "write_file",
        "edit_file",
        "list_files",
        "search",
        "shell",
    ];
    for tool in tools {
        match ToolRef::new(tool.as_str(), Pos::new(1, 1, 1)).kind {
            ToolKind::Builtin { .. } | ToolKind::Mcp { .. } => {}
            ToolKind::Delegation => {
                return Err(Error::usage(format!(
                    "--tools: `{tool}` starts subagents, and a project role cannot list it (a \
                     subagent cannot delegate further)"
                )));
            }
            ToolKind::Unsupported => {
                let close = suggestions(tool, KNOWN);
                let hint = if close.is_empty() {
                    String::new()
                } else {
                    format!(" Did you mean: {}?", close.join(", "))
                };
                return Err(Error::usage(format!(
                    "--tools: summon has no tool `{tool}`.{hint} Its tools are {}, and \
                     mcp__SERVER__TOOL names an extension's tool",
                    KNOWN.join(", ")
                )));
            }
        }
    }
    Ok(())
}

/// The required parameters without default of the pipeline's `--source` (which must
/// exist), each with the value the pipeline gives it: the item, or a select's first option.
fn required_params(catalog: &Catalog, name: &str) -> Result<Vec<(String, String)>> {
    let source = catalog
        .get(name)
        .ok_or_else(|| Error::from(catalog.not_found(name)))?;
    Ok(source
        .recipe()
        .map(|recipe| {
            let preset = source.preset_values();
            recipe
                .parameters
                .iter()
                .filter(|p| {
                    p.requirement == crate::recipe::Requirement::Required
                        && p.default.is_none()
                        && !preset.contains_key(&p.key)
                })
                .map(|p| {
                    let value = match p.options.first() {
                        Some(first) if p.input_type == crate::recipe::InputType::Select => {
                            first.clone()
                        }
                        _ => "{{ item }}".to_owned(),
                    };
                    (p.key.clone(), value)
                })
                .collect()
        })
        .unwrap_or_default())
}

fn read_existing(path: &Path) -> Result<Option<String>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::usage(format!("cannot read {}: {e}", path.display()))),
    }
}

/// The folders the write creates, outermost first.
fn missing_dirs(path: &Path, cwd: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = path
        .ancestors()
        .skip(1)
        .take_while(|dir| *dir != cwd && !dir.exists())
        .map(Path::to_path_buf)
        .collect();
    dirs.reverse();
    dirs
}

/// When the new definition can be used, checked against a fresh look at the sources.
fn usable_note(kind: Kind, name: &str, path: &Path, ctx: &Ctx) -> String {
    let shown = display_path(path, &ctx.env.cwd);
    if kind == Kind::Pipeline {
        return format!(
            "Run it with `summon run {shown}` (`--dry-run` first shows the plan and sends nothing)."
        );
    }
    let found = ctx.catalog().get(name).map(|s| s.path.clone());
    match found {
        Some(found) if found == path => format!(
            "Usable at once by new commands and runs: `summon load {name}`, `summon delegate \
             --source {name}`, `fan_out.source: {name}`. A pipeline run already in progress (and \
             its `--resume`) keeps the catalog it started with."
        ),
        _ => format!(
            "Not found by name yet: summon finds {} in `{}`; check it with `summon validate {shown}`.",
            kind.name(),
            kind.dir()
        ),
    }
}

fn print_human(written: &Written, no_description: bool, ctx: &mut Ctx) -> Result<()> {
    let cwd = ctx.env.cwd.clone();
    let shown = display_path(&written.path, &cwd);
    let kind = written.kind.name();
    let mut text = String::new();
    for dir in &written.created_dirs {
        text.push_str(&format!("Created folder {}/\n", display_path(dir, &cwd)));
    }
    match written.action {
        "unchanged" => text.push_str(&format!(
            "{shown} already holds this {kind}; nothing to change.\n"
        )),
        "replaced" => {
            text.push_str(&format!("Replaced {kind} {shown}:\n"));
            text.push_str(&diff_text(&written.changes, ctx.out_palette));
        }
        _ => text.push_str(&format!("Created {kind} {shown}\n")),
    }
    text.push_str(&written.usable);
    text.push('\n');
    if no_description {
        text.push_str(
            "No --description given: edit the `description` line, which `summon load` shows.\n",
        );
    }
    ctx.out.write(&text)?;
    Ok(())
}

/// `@@ -4,2 +4,2 @@` headers, then `-old` and `+new` lines; and a count.
fn diff_text(changes: &[DiffLine], palette: crate::color::Palette) -> String {
    let mut text = String::new();
    let mut k = 0;
    while k < changes.len() {
        // One hunk: removed lines with consecutive numbers, then added ones.
        let mut end = k;
        while end + 1 < changes.len() && same_hunk(&changes[end], &changes[end + 1]) {
            end += 1;
        }
        let hunk = &changes[k..=end];
        let range = |change: Change| {
            let lines: Vec<usize> = hunk
                .iter()
                .filter(|d| d.change == change)
                .map(|d| d.line)
                .collect();
            match (lines.first(), lines.len()) {
                (Some(first), n) => format!("{first},{n}"),
                (None, _) => "0,0".to_owned(),
            }
        };
        text.push_str(&palette.dim(&format!(
            "@@ -{} +{} @@",
            range(Change::Removed),
            range(Change::Added)
        )));
        text.push('\n');
        for d in hunk {
            let line = match d.change {
                Change::Removed => palette.red(&format!("-{}", d.text)),
                Change::Added => palette.green(&format!("+{}", d.text)),
            };
            text.push_str(&line);
            text.push('\n');
        }
        k = end + 1;
    }
    let removed = changes
        .iter()
        .filter(|d| d.change == Change::Removed)
        .count();
    let added = changes.len() - removed;
    text.push_str(&format!(
        "{} removed, {} added.\n",
        crate::plural::count(removed as u64, "line"),
        crate::plural::count(added as u64, "line")
    ));
    text
}

/// Whether `y` continues the hunk of `x`: consecutive removals, a removal followed by
/// additions, or consecutive additions.
fn same_hunk(x: &DiffLine, y: &DiffLine) -> bool {
    match (x.change, y.change) {
        (Change::Removed, Change::Removed) | (Change::Added, Change::Added) => y.line == x.line + 1,
        (Change::Removed, Change::Added) => true,
        (Change::Added, Change::Removed) => false,
    }
}

fn print_json(written: &Written, name: &str, diags: &Diagnostics, ctx: &mut Ctx) -> Result<()> {
    let changes: Vec<_> = written
        .changes
        .iter()
        .map(|d| {
            json!({
                "change": if d.change == Change::Removed { "removed" } else { "added" },
                "line": d.line,
                "text": d.text,
            })
        })
        .collect();
    let diagnostics: Vec<_> = diags
        .items
        .iter()
        .map(|d| {
            json!({
                "severity": d.severity.as_str(),
                "message": d.message,
                "path": d.file_path().map(|p| p.display().to_string()),
                "line": d.span.as_ref().map(|s| s.pos.line),
                "column": d.span.as_ref().map(|s| s.pos.col),
                "hint": d.hint,
            })
        })
        .collect();
    let created_dirs: Vec<String> = written
        .created_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    ctx.out.json(&json!({
        "kind": written.kind.name(),
        "name": name,
        "path": written.path.display().to_string(),
        "action": written.action,
        "created_dirs": created_dirs,
        "changes": changes,
        "diagnostics": diagnostics,
        "usable": written.usable,
    }))?;
    Ok(())
}
