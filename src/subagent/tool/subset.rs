//! A pipeline step's `tools:`: the subset of its task's tools the step sends, so a task is
//! not billed, on every request, for definitions it never uses.
//!
//! Entries are tools as the model sees them (`read_file`, `search`, `shell`, an extension's
//! `fs__read_text_file`) or whole extensions (`developer` for the built-in file and shell
//! tools, `fs` for every tool of the MCP extension `fs`). The list only narrows: `shell` still
//! needs the `developer` extension, an extension's tools need the extension. `[]` sends none.

use crate::agent::{BuiltinTool, ToolKind};
use crate::mcp::ServerSpec;

/// goose's name for summon's built-in tools, as an extension.
const DEVELOPER: &str = "developer";

/// What one entry of a step's `tools:` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StepTool {
    Builtin(BuiltinTool),
    /// An extension (`tool: None`: all of its tools) or one tool of it.
    Extension {
        name: String,
        tool: Option<String>,
    },
}

impl StepTool {
    /// Reads one entry; `Err` says why it names no tool (Claude Code's names, the delegation
    /// tool, text that is no name).
    pub(crate) fn parse(raw: &str) -> Result<Self, String> {
        let name = raw.trim();
        if let Some(tool) = BuiltinTool::from_name(name) {
            return Ok(Self::Builtin(tool));
        }
        if let Some((ext, tool)) = name.split_once("__")
            && ext == DEVELOPER
            && let Some(builtin) = BuiltinTool::from_name(tool)
        {
            return Ok(Self::Builtin(builtin));
        }
        match ToolKind::classify(name) {
            ToolKind::Builtin { tool, .. } => {
                return Err(format!(
                    "`{name}` is not a tool name here: a step lists tools as the model sees \
                     them (`{}`)",
                    tool.name()
                ));
            }
            ToolKind::Delegation => {
                return Err(format!(
                    "`{name}` cannot be offered: a subagent never delegates"
                ));
            }
            _ => {}
        }
        let ident = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        };
        match name.split_once("__") {
            Some((ext, tool)) if ident(ext) && ident(tool) => Ok(Self::Extension {
                name: ext.to_owned(),
                tool: Some(tool.to_owned()),
            }),
            None if ident(name) => Ok(Self::Extension {
                name: name.to_owned(),
                tool: None,
            }),
            _ => Err(format!("`{name}` is not a tool or extension name")),
        }
    }

    /// The extension the entry needs, if any.
    fn extension(&self) -> Option<&str> {
        match self {
            Self::Builtin(BuiltinTool::Shell) => Some(DEVELOPER),
            Self::Builtin(_) => None,
            Self::Extension { name, .. } => Some(name),
        }
    }
}

/// The parsed `tools:` of a step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Subset {
    pub(crate) entries: Vec<StepTool>,
}

impl Subset {
    /// Parses every entry; the first one that names no tool is the error.
    pub(crate) fn parse(names: &[String]) -> Result<Self, String> {
        let entries = names
            .iter()
            .map(|n| StepTool::parse(n))
            .collect::<Result<_, _>>()?;
        Ok(Self { entries })
    }

    /// Whether the step keeps the built-in `tool`.
    pub(crate) fn keeps_builtin(&self, tool: BuiltinTool) -> bool {
        self.entries.iter().any(|entry| match entry {
            StepTool::Builtin(t) => *t == tool,
            StepTool::Extension { name, tool: None } => name == DEVELOPER,
            StepTool::Extension { .. } => false,
        })
    }

    /// Keeps the servers the step lists, each offering only the tools it lists.
    pub(crate) fn narrow_servers(&self, servers: &mut Vec<ServerSpec>) {
        servers.retain_mut(|server| {
            let mut tools: Vec<&str> = Vec::new();
            for entry in &self.entries {
                match entry {
                    StepTool::Extension { name, tool: None } if *name == server.name => {
                        return true;
                    }
                    StepTool::Extension {
                        name,
                        tool: Some(tool),
                    } if *name == server.name => tools.push(tool),
                    _ => {}
                }
            }
            if tools.is_empty() {
                return false;
            }
            let wanted: Vec<String> = tools
                .into_iter()
                .filter(|t| server.allows(t))
                .map(str::to_owned)
                .collect();
            // Listed tools the extension does not offer leave it with none.
            if wanted.is_empty() {
                return false;
            }
            server.allow = wanted;
            true
        });
    }

    /// The first entry that needs an extension the task does not have (`extensions`: the
    /// names of the task's extensions, `developer` included when granted), as (its index, the
    /// error).
    pub(crate) fn problem(&self, raw: &[String], extensions: &[String]) -> Option<(usize, String)> {
        let (index, entry) = self.entries.iter().enumerate().find(|(_, e)| {
            e.extension()
                .is_some_and(|x| !extensions.iter().any(|n| n == x))
        })?;
        let name = raw.get(index).map_or("", |r| r.trim());
        let builtins: Vec<&str> = BuiltinTool::ALL
            .iter()
            .filter(|t| **t != BuiltinTool::Shell)
            .map(BuiltinTool::name)
            .collect();
        let have = if extensions.is_empty() {
            "this task has no extensions".to_owned()
        } else {
            format!("this task's extensions: {}", extensions.join(", "))
        };
        let message = match entry {
            StepTool::Builtin(_) => {
                format!("`tools` lists `{name}`, which needs the `developer` extension; {have}")
            }
            StepTool::Extension { .. } => format!(
                "`tools` lists `{name}`, which is not a tool of this task: the built-in tools \
                 are {} (and `shell` with the `developer` extension); {have}",
                builtins.join(", ")
            ),
        };
        Some((index, message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries() {
        assert_eq!(
            StepTool::parse("read_file"),
            Ok(StepTool::Builtin(BuiltinTool::ReadFile))
        );
        assert_eq!(
            StepTool::parse("developer__shell"),
            Ok(StepTool::Builtin(BuiltinTool::Shell))
        );
        assert_eq!(
            StepTool::parse("fs__read_text_file"),
            Ok(StepTool::Extension {
                name: "fs".into(),
                tool: Some("read_text_file".into())
            })
        );
        assert_eq!(
            StepTool::parse("developer"),
            Ok(StepTool::Extension {
                name: "developer".into(),
                tool: None
            })
        );
        for bad in ["Read", "Bash(git log*)", "Task", "two words", ""] {
            assert!(StepTool::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn problems_name_the_entry() {
        let raw: Vec<String> = ["read_file", "reed_file"].map(String::from).to_vec();
        let subset = Subset::parse(&raw).unwrap();
        let (index, message) = subset.problem(&raw, &[]).unwrap();
        assert_eq!(index, 1);
        assert!(message.contains("`reed_file`"), "{message}");
        assert!(subset.problem(&raw, &["reed_file".into()]).is_none());
        let raw = vec!["shell".to_owned()];
        let subset = Subset::parse(&raw).unwrap();
        assert!(subset.problem(&raw, &[]).unwrap().1.contains("developer"));
        assert!(subset.problem(&raw, &["developer".into()]).is_none());
        assert!(subset.keeps_builtin(BuiltinTool::Shell));
        assert!(!subset.keeps_builtin(BuiltinTool::ReadFile));
    }
}
