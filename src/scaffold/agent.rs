//! The text of a new agent role, `.agents/agents/NAME.md`.

use super::yaml_text::scalar;

/// What `summon new agent` was given.
#[derive(Debug, Clone)]
pub(crate) struct AgentSpec<'a> {
    pub(crate) name: &'a str,
    pub(crate) description: &'a str,
    /// `None`: no `tools` line (no narrowing); `Some([])`: `tools: []`.
    pub(crate) tools: Option<&'a [String]>,
    /// `None`: `inherit`.
    pub(crate) model: Option<&'a str>,
    /// The role text; `None`: an outline to fill in.
    pub(crate) role: Option<&'a str>,
}

/// The file: commented frontmatter, then the role text.
pub(crate) fn agent_text(spec: &AgentSpec<'_>) -> String {
    let name = spec.name;
    let mut text = String::from("---\n");
    text.push_str(&format!(
        "# Agent role `{name}`: `summon delegate --source {name} --instructions \"...\"`, or\n\
         # `fan_out.source: {name}` in a pipeline. The text below the frontmatter reaches the\n\
         # subagent as this project's data, next to its task; it never overrides summon's rules.\n"
    ));
    text.push_str(&format!("name: {name}\n"));
    text.push_str(
        "# When to use this role: `summon load` lists it, and pipelines that let the model\n",
    );
    text.push_str("# choose a role read it.\n");
    text.push_str(&format!("description: {}\n", scalar(spec.description)));
    text.push_str(
        "# The tools the role may use; the list only narrows what a run offers. summon's tools:\n\
         # read_file, write_file, edit_file, list_files, search, shell (Claude Code names such as\n\
         # Read, Grep or Bash work too; mcp__SERVER__TOOL names an extension's tool).\n",
    );
    match spec.tools {
        None => {
            text.push_str("# tools: read_file, list_files, search      (no line: every tool)\n")
        }
        Some([]) => text.push_str("tools: []\n"),
        Some(tools) => text.push_str(&format!("tools: {}\n", scalar(&tools.join(", ")))),
    }
    text.push_str(
        "# `inherit` uses the run's model; `sonnet`, `opus` and `haiku` go through the\n\
         # provider's aliases; anything else is sent as the model id.\n",
    );
    text.push_str(&format!(
        "model: {}\n",
        scalar(spec.model.unwrap_or("inherit"))
    ));
    text.push_str("---\n\n");
    match spec.role {
        Some(role) => {
            text.push_str(role.trim_end_matches('\n'));
            text.push('\n');
        }
        None => text.push_str(&outline(name)),
    }
    text
}

/// The role text to start from.
fn outline(name: &str) -> String {
    format!(
        "You are the `{name}` subagent of this project: describe here what you are for.\n\
         \n\
         ## How you work\n\
         \n\
         - Read the files you need before you answer; do not guess what they contain.\n\
         - Keep to the task you are given; say so when something it needs is missing.\n\
         \n\
         ## What you answer\n\
         \n\
         A short report: what you found or changed, with file paths, and anything left open.\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_written_and_quoted() {
        let tools = vec!["read_file".to_owned(), "Bash(git log*)".to_owned()];
        let text = agent_text(&AgentSpec {
            name: "reviewer",
            description: "Reviews: code",
            tools: Some(&tools),
            model: Some("sonnet"),
            role: Some("Be brief.\n"),
        });
        assert!(text.starts_with("---\n"));
        assert!(text.contains("\nname: reviewer\n"));
        assert!(text.contains("\ndescription: \"Reviews: code\"\n"));
        assert!(text.contains("\ntools: read_file, Bash(git log*)\n"));
        assert!(text.contains("\nmodel: sonnet\n"));
        assert!(text.ends_with("---\n\nBe brief.\n"));
    }

    #[test]
    fn no_tools_is_a_comment_and_empty_tools_is_none() {
        let spec = AgentSpec {
            name: "a",
            description: "d",
            tools: None,
            model: None,
            role: None,
        };
        assert!(!agent_text(&spec).contains("\ntools:"));
        assert!(agent_text(&spec).contains("\nmodel: inherit\n"));
        let empty: Vec<String> = Vec::new();
        let spec = AgentSpec {
            tools: Some(&empty),
            ..spec
        };
        assert!(agent_text(&spec).contains("\ntools: []\n"));
    }
}
