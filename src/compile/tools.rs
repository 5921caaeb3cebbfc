//! A step's `tools:` checked against what its task has, before anything is sent: an entry
//! naming an extension the task does not have (a misspelt tool name reads as one) is an error
//! at the entry, in `summon validate`, `run --dry-run` and `run`.
//!
//! The task's extensions are known when its `extensions:` are listed, or its source is
//! literal (a recipe's own extensions, an agent's `mcp__server` entries; none for an ad-hoc
//! task). A templated source is checked when the run prepares each task.

use super::context::named_source;
use crate::agent::{BuiltinTool, DEVELOPER, StepTool, ToolKind};
use crate::diag::Pos;
use crate::pipeline::model::{Step, TaskTemplate};
use crate::source::{Catalog, SourceDef};
use crate::subagent::tool::Subset;

/// The first `tools:` entry of `step` its task cannot have, at the entry.
pub(crate) fn check_step(step: &Step, catalog: &Catalog) -> Option<(Pos, String)> {
    let listed = step.tools.as_ref()?;
    let task = super::pipeline::step_task(step)?;
    let extensions = task_extensions(task, catalog)?;
    let raw: Vec<String> = listed.iter().map(|(name, _)| name.clone()).collect();
    let subset = Subset::parse(&raw).ok()?;
    let (index, message) = subset.problem(&raw, &extensions)?;
    Some((listed[index].1, message))
}

/// The names of the extensions a task has, when known before the run.
fn task_extensions(task: &TaskTemplate, catalog: &Catalog) -> Option<Vec<String>> {
    if let Some(listed) = &task.extensions {
        return Some(listed.clone());
    }
    let Some(source) = &task.source else {
        return Some(Vec::new());
    };
    if crate::template::has_template(&source.text) {
        return None;
    }
    let Some(name) = named_source(&source.text) else {
        return Some(Vec::new());
    };
    Some(match &catalog.get(name)?.def {
        SourceDef::Recipe(recipe) | SourceDef::Subrecipe { recipe, .. } => {
            recipe.extensions.iter().map(|e| e.name.clone()).collect()
        }
        SourceDef::Agent(agent) => agent
            .tools
            .iter()
            .flatten()
            .filter_map(|t| match &t.kind {
                ToolKind::Mcp { server, .. } => Some(server.clone()),
                _ => None,
            })
            .collect(),
    })
}

/// What a step's tasks are given, when known before the run: the built-in tools and the MCP
/// extensions (each with the tools the step keeps of it, `None`: all).
struct Granted {
    builtins: Vec<BuiltinTool>,
    extensions: Vec<(String, Option<Vec<String>>)>,
    /// Why a built-in tool is missing, as a hint naming the key that grants it.
    why: Why,
}

/// What keeps a built-in tool from a step's tasks.
enum Why {
    /// An inline step that names no tools (`tools:` would grant the file tools).
    Unnamed,
    /// The step's `tools:` leaves it out.
    Narrowed,
    /// `extensions: []` (the step's, or its recipe's).
    NoExtensions { recipe: bool },
    /// `max_turns: 1` leaves no turn to use a tool.
    OneTurn,
}

/// The tools a step's tasks get (see `crate::delegation::prepare`), when its source is known
/// before the run: written inline, or a literal recipe (an agent's or a templated source's
/// tools are decided when its tasks are prepared).
fn granted(
    task: &TaskTemplate,
    step: &Step,
    max_turns: Option<u32>,
    catalog: &Catalog,
) -> Option<Granted> {
    let file_tools = || -> Vec<BuiltinTool> {
        BuiltinTool::ALL
            .into_iter()
            .filter(|t| *t != BuiltinTool::Shell)
            .collect()
    };
    let recipe = match &task.source {
        None => None,
        Some(source) if crate::template::has_template(&source.text) => return None,
        Some(source) => match named_source(&source.text) {
            None => None,
            Some(name) => match &catalog.get(name)?.def {
                SourceDef::Recipe(recipe) | SourceDef::Subrecipe { recipe, .. } => Some(recipe),
                SourceDef::Agent(_) => return None,
            },
        },
    };
    let (mut builtins, mut extensions, mut why) = match (&task.extensions, recipe) {
        (Some(listed), _) if listed.is_empty() => {
            (Vec::new(), Vec::new(), Why::NoExtensions { recipe: false })
        }
        (Some(listed), recipe) => {
            let mut builtins = file_tools();
            if listed.iter().any(|name| name == DEVELOPER) {
                builtins.push(BuiltinTool::Shell);
            }
            let mcp = recipe
                .map(|r| mcp_names(r))
                .unwrap_or_default()
                .into_iter()
                .filter(|name| listed.contains(name))
                .collect();
            (builtins, mcp, Why::Narrowed)
        }
        (None, None) if step.tools.is_none() => (Vec::new(), Vec::new(), Why::Unnamed),
        (None, None) => (file_tools(), Vec::new(), Why::Narrowed),
        (None, Some(recipe)) if recipe.no_extensions => {
            (Vec::new(), Vec::new(), Why::NoExtensions { recipe: true })
        }
        (None, Some(recipe)) => {
            let mut builtins = file_tools();
            if recipe.extensions.iter().any(|e| e.name == DEVELOPER) {
                builtins.push(BuiltinTool::Shell);
            }
            (builtins, mcp_names(recipe), Why::Narrowed)
        }
    };
    let mut extensions: Vec<(String, Option<Vec<String>>)> =
        extensions.drain(..).map(|name| (name, None)).collect();
    if let Some(listed) = &step.tools {
        let raw: Vec<String> = listed.iter().map(|(name, _)| name.clone()).collect();
        let subset = Subset::parse(&raw).ok()?;
        builtins.retain(|tool| subset.keeps_builtin(*tool));
        extensions.retain_mut(|(name, allow)| {
            let mut tools = Vec::new();
            for entry in &subset.entries {
                match entry {
                    StepTool::Extension {
                        name: n,
                        tool: None,
                    } if n == name => return true,
                    StepTool::Extension {
                        name: n,
                        tool: Some(tool),
                    } if n == name => tools.push(tool.clone()),
                    _ => {}
                }
            }
            *allow = Some(tools);
            allow.as_ref().is_some_and(|t| !t.is_empty())
        });
    }
    let recipe_turns = recipe.and_then(|r| r.settings.max_turns);
    if max_turns.or(recipe_turns).is_some_and(|turns| turns <= 1) {
        builtins.clear();
        extensions.clear();
        why = Why::OneTurn;
    }
    Some(Granted {
        builtins,
        extensions,
        why,
    })
}

/// The names of a recipe's MCP extensions.
fn mcp_names(recipe: &crate::recipe::Recipe) -> Vec<String> {
    recipe
        .extensions
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                crate::recipe::ExtensionKind::Stdio | crate::recipe::ExtensionKind::StreamableHttp
            )
        })
        .map(|e| e.name.clone())
        .collect()
}

/// A tool named in the instructions of `step` that its tasks do not have, at the line that
/// names it: (position, message, hint). Built-in names count where they are written as names
/// (`read_file` anywhere; `search` and `shell`, ordinary words too, in backticks or before
/// "tool"), and `EXT__TOOL` names of MCP extensions.
pub(crate) fn check_mentions(
    file: &crate::diag::SourceFile,
    step: &Step,
    max_turns: Option<u32>,
    catalog: &Catalog,
) -> Option<(Pos, String, String)> {
    let task = super::pipeline::step_task(step)?;
    let instructions = task.instructions.as_ref()?;
    let granted = granted(task, step, max_turns, catalog)?;
    let text = &instructions.text;
    for (offset, mention) in mentions(text) {
        let missing = match &mention {
            Mention::Builtin(tool) => !granted.builtins.contains(tool),
            Mention::Extension { name, tool } => !granted
                .extensions
                .iter()
                .any(|(n, allow)| n == name && allow.as_ref().is_none_or(|a| a.contains(tool))),
        };
        if !missing {
            continue;
        }
        let name = mention.name();
        let line = text[..offset].matches('\n').count() as u32;
        let pos = if line == 0 && !instructions.block {
            instructions.pos
        } else {
            // The name on its line of the file, when it is there as written.
            let at = instructions.first_line() + line;
            match file.line_text(at).and_then(|l| l.find(name.as_str())) {
                Some(col) => Pos::new(at, col as u32 + 1, name.len() as u32),
                None => Pos::new(at, 1, 0),
            }
        };
        let message =
            format!("the instructions name `{name}`, a tool this step's tasks do not have");
        let hint = hint(&mention, &granted.why, step, task);
        return Some((pos, message, hint));
    }
    None
}

/// How to grant a missing tool.
fn hint(mention: &Mention, why: &Why, step: &Step, task: &TaskTemplate) -> String {
    let name = mention.name();
    if matches!(why, Why::OneTurn) {
        return "with `max_turns: 1` a task cannot call tools: raise `max_turns`, or take the \
                mention out"
            .to_owned();
    }
    let narrowed = step.tools.is_some();
    match mention {
        Mention::Builtin(BuiltinTool::Shell) => {
            let has_developer = task
                .extensions
                .as_ref()
                .is_some_and(|e| e.iter().any(|n| n == DEVELOPER));
            match (has_developer, narrowed) {
                (true, _) => "add `shell` to the step's `tools:`".to_owned(),
                (false, true) => "add `extensions: [developer]` to the step (`shell` comes with \
                                  it) and `shell` to its `tools:`"
                    .to_owned(),
                (false, false) => "add `extensions: [developer]` to the step: `shell` comes \
                                   with it, beside the file tools"
                    .to_owned(),
            }
        }
        Mention::Builtin(_) => match why {
            Why::NoExtensions { recipe: false } if task.source.is_none() => format!(
                "`extensions: []` gives the step no tools: replace it with `tools: [{name}]`"
            ),
            Why::NoExtensions { .. } => format!(
                "{} gives the step no tools: add `extensions: [developer]` and \
                 `tools: [{name}]` to the step",
                if task.extensions.is_some() {
                    "`extensions: []`"
                } else {
                    "its recipe's `extensions: []`"
                }
            ),
            _ if narrowed => format!("add `{name}` to the step's `tools:`"),
            _ => format!(
                "a step written inline gets only the tools it names: add `tools: [{name}]` to \
                 the step"
            ),
        },
        Mention::Extension { name: ext, .. } if narrowed => format!(
            "add `{name}` to the step's `tools:` (its extension `{ext}` must be one of the \
             task's)"
        ),
        Mention::Extension { name: ext, .. } => format!(
            "`{ext}` is not an extension of this step's tasks: use a source recipe that \
             declares it, and list it in the step's `extensions:` if the step lists them"
        ),
    }
}

/// A tool named in instructions.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mention {
    Builtin(BuiltinTool),
    Extension { name: String, tool: String },
}

impl Mention {
    fn name(&self) -> String {
        match self {
            Self::Builtin(tool) => tool.name().to_owned(),
            Self::Extension { name, tool } => format!("{name}__{tool}"),
        }
    }
}

/// The tool names in `text`, with their byte offsets, in order.
fn mentions(text: &str) -> Vec<(usize, Mention)> {
    let is_word = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-');
    let mut found = Vec::new();
    let mut start = None;
    for (i, c) in text
        .char_indices()
        .chain(std::iter::once((text.len(), ' ')))
    {
        match (is_word(c), start) {
            (true, None) => start = Some(i),
            (false, Some(from)) => {
                start = None;
                let word = &text[from..i];
                let before = text[..from].chars().next_back();
                let after = &text[i..];
                if let Some(mention) = mention(word, before, after) {
                    found.push((from, mention));
                }
            }
            _ => {}
        }
    }
    found
}

/// The tool `word` names, if it names one (`before`: the character before it, `after`: the
/// text after it).
fn mention(word: &str, before: Option<char>, after: &str) -> Option<Mention> {
    if let Some(tool) = BuiltinTool::from_name(word) {
        // `search` and `shell` are words too: a name only in backticks or before "tool".
        let named = !matches!(tool, BuiltinTool::Search | BuiltinTool::Shell)
            || (before == Some('`') && after.starts_with('`'))
            || after.trim_start_matches(['`', ' ']).starts_with("tool");
        return named.then_some(Mention::Builtin(tool));
    }
    let rest = word.strip_prefix("mcp__").unwrap_or(word);
    let (ext, tool) = rest.split_once("__")?;
    let starts = |s: &str| s.chars().next().is_some_and(|c| c.is_ascii_alphabetic());
    if !starts(ext) || !starts(tool) {
        return None;
    }
    if ext == DEVELOPER {
        return BuiltinTool::from_name(tool).map(Mention::Builtin);
    }
    Some(Mention::Extension {
        name: ext.to_owned(),
        tool: tool.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(text: &str) -> Vec<String> {
        mentions(text).into_iter().map(|(_, m)| m.name()).collect()
    }

    #[test]
    fn tool_names_are_found_where_they_are_written_as_names() {
        assert_eq!(
            names("Read it with read_file, then `search` it; list_files."),
            ["read_file", "search", "list_files"]
        );
        // `search` and `shell` are words too.
        assert!(names("Search the shell history for it.").is_empty());
        assert_eq!(names("Use the shell tool."), ["shell"]);
        assert_eq!(
            names("Call fs__read_text_file or mcp__git__log; developer__edit_file."),
            ["fs__read_text_file", "git__log", "edit_file"]
        );
        // Dunder names and a file's words are no tools.
        assert!(names("Edit __init__.py and my_read_file_helper.").is_empty());
        let (offset, _) = mentions("one\ntwo read_file")[0].clone();
        assert_eq!(offset, 8);
    }
}
