//! A pipeline step's `tools:`: the subset of its task's tools the step sends, so a task is
//! not billed, on every request, for definitions it never uses.
//!
//! Entries are tools as the model sees them (`read_file`, `search`, `shell`, an extension's
//! `fs__read_text_file`) or whole extensions (`developer` for the built-in file and shell
//! tools, `fs` for every tool of the MCP extension `fs`). The list only narrows: `shell` still
//! needs the `developer` extension, an extension's tools need the extension. `[]` sends none.

use crate::agent::{BuiltinTool, DEVELOPER, StepTool};
use crate::mcp::ServerSpec;

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
