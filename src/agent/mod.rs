//! Agent definitions: Claude-Code-style Markdown files with YAML frontmatter naming a role.
//!
//! [`frontmatter`] splits a file into frontmatter and body and loads the YAML (with the
//! recovery real files need), [`parse`] turns it into an [`AgentDef`] ([`model`]), and
//! [`tool_ref`] reads and classifies the `tools` field.

// Nothing uses the agent loader yet; remove these once discovery does.

mod frontmatter;
mod model;
mod parse;
mod step_tool;
mod tool_ref;

pub(crate) use model::AgentDef;
#[cfg(test)]
pub(crate) use parse::READ_KEYS as FRONTMATTER_KEYS;
pub(crate) use parse::{AgentDir, AgentParse, parse_agent};
pub(crate) use step_tool::{DEVELOPER, StepTool};
pub(crate) use tool_ref::{BuiltinTool, ToolKind, ToolRef};

/// The task of an agent run on its own (`delegate --source NAME` without `--instructions`,
/// a pipeline task naming an agent without `instructions`): its role text is the work, as
/// goose runs an agent with no instructions. Documented in docs/sources.md.
pub(crate) const AGENT_ALONE_TASK: &str = "Do the work your role above describes, in the working directory, and report what you did and what you found.";
