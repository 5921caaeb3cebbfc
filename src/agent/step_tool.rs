//! One entry of a pipeline step's `tools:`: a tool as the model sees it (`read_file`,
//! `shell`, an extension's `fs__read_text_file`) or a whole extension (`developer` for the
//! built-in file and shell tools, `fs` for every tool of the MCP extension `fs`).

use super::{BuiltinTool, ToolKind};

/// goose's name for summon's built-in tools, as an extension.
pub(crate) const DEVELOPER: &str = "developer";

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
    pub(crate) fn extension(&self) -> Option<&str> {
        match self {
            Self::Builtin(BuiltinTool::Shell) => Some(DEVELOPER),
            Self::Builtin(_) => None,
            Self::Extension { name, .. } => Some(name),
        }
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
}
