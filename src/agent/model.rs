//! A loaded agent definition: a Markdown file whose frontmatter names a role.

use std::path::Path;
use std::sync::Arc;

#[cfg(test)]
use super::tool_ref::ToolKind;
use super::tool_ref::ToolRef;
use crate::diag::{Pos, SourceFile};

/// One agent definition, with positions (whole-file lines) for later diagnostics.
#[derive(Debug, Clone)]
pub(crate) struct AgentDef {
    /// The frontmatter `name`: the agent's identity (not the file name).
    pub(crate) name: String,
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "positions for messages about the file; only the tests read them yet"
        )
    )]
    pub(crate) name_pos: Pos,
    /// `""` when absent.
    pub(crate) description: String,
    /// `None`: no `tools` key, no narrowing. `Some(vec![])`: `tools: []`, no tools at all.
    pub(crate) tools: Option<Vec<ToolRef>>,
    /// `None` when absent or `inherit`.
    pub(crate) model: Option<String>,
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "positions for messages about the file; only the tests read them yet"
        )
    )]
    pub(crate) model_pos: Option<Pos>,
    /// The role text after the closing `---`.
    pub(crate) body: String,
    /// The 1-based line where `body` starts.
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "positions for messages about the file; only the tests read them yet"
        )
    )]
    pub(crate) body_line: u32,
    /// Frontmatter keys summon does not use (`color`, `permissionMode`, ...), for
    /// `summon validate` to note.
    pub(crate) ignored_keys: Vec<(String, Pos)>,
    pub(crate) file: Arc<SourceFile>,
}

impl AgentDef {
    pub(crate) fn path(&self) -> &Path {
        self.file.path()
    }

    /// The listed tools summon does not offer, as written (for "Listed tools not available,
    /// left out: ...").
    #[cfg(test)]
    pub(crate) fn unsupported_tools(&self) -> Vec<&str> {
        self.tools
            .iter()
            .flatten()
            .filter(|t| t.kind == ToolKind::Unsupported)
            .map(|t| t.raw.as_str())
            .collect()
    }
}
