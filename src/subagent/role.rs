//! A role's text is read from its file when each subagent starts, so an edited body takes
//! effect on the next delegation while the catalog of names stays frozen for the run.

use crate::agent::{AgentDef, AgentDir, AgentParse, parse_agent};
use crate::diag::{Diagnostics, SourceFile};

/// The current role text of `agent`, or `Cannot read PATH: ...`.
pub(crate) fn read_role_text(agent: &AgentDef) -> Result<String, String> {
    let path = agent.path();
    let cannot = |why: String| format!("Cannot read {}: {why}", path.display());
    let text = crate::source::read_source_text(path).map_err(cannot)?;
    let file = SourceFile::new(path, text);
    let mut diags = Diagnostics::default();
    match parse_agent(&file, AgentDir::Other, &mut diags) {
        AgentParse::Agent(fresh) if fresh.name == agent.name => Ok(fresh.body),
        AgentParse::Agent(fresh) => Err(cannot(format!(
            "the file now defines `{}` instead of `{}`",
            fresh.name, agent.name
        ))),
        AgentParse::NotAnAgent => {
            let why = diags.items.first().map_or_else(
                || "it is no longer an agent definition".to_owned(),
                |d| d.message.clone(),
            );
            Err(cannot(why))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent_at(path: &std::path::Path) -> AgentDef {
        let file = SourceFile::new(path, std::fs::read_to_string(path).unwrap());
        match parse_agent(&file, AgentDir::Other, &mut Diagnostics::default()) {
            AgentParse::Agent(agent) => agent,
            AgentParse::NotAnAgent => panic!("not an agent"),
        }
    }

    #[test]
    fn role_text_is_read_when_the_subagent_starts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.md");
        std::fs::write(&path, "---\nname: a\ndescription: d\n---\nfirst\n").unwrap();
        let agent = agent_at(&path);
        std::fs::write(&path, "---\nname: a\ndescription: d\n---\nedited\n").unwrap();
        assert_eq!(read_role_text(&agent).unwrap().trim(), "edited");
        std::fs::write(&path, "no frontmatter any more").unwrap();
        let err = read_role_text(&agent).unwrap_err();
        assert!(
            err.starts_with(&format!("Cannot read {}: ", path.display())),
            "{err}"
        );
        std::fs::remove_file(&path).unwrap();
        let err = read_role_text(&agent).unwrap_err();
        assert!(
            err.starts_with(&format!("Cannot read {}: ", path.display())),
            "{err}"
        );
    }
}
