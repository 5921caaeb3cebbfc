//! MCP servers as subagent tools: goose recipe `extensions` of type `stdio` and
//! `streamable_http` (and the servers of a project's `.mcp.json` that an agent's `tools` list
//! names), offered to the model as `<extension>__<tool>` (`mcp__<server>__<tool>` when an
//! agent names them so), made valid and unique for providers by [`crate::provider::tool_name`].
//!
//! [`ServerSpec`] is resolved when a delegation is prepared; a [`Session`] lives exactly as
//! long as the task that uses it.

mod http;
mod observed;
mod project;
mod record;
mod server;
mod session;
mod size;
mod spawn;
mod stderr;
mod stdio;

pub(crate) use project::{named_project_servers_as_read, project_servers, untrusted_server};
pub(crate) use record::{ServerChange, on_server_change, stop_recorded};
pub(crate) use server::ServerSpec;
pub(crate) use session::Session;

/// Whether a task's warning is about one of its extensions: every warning a [`Session`] gives
/// starts by naming its extension (`` extension `fs` did not start: ... ``).
pub(crate) fn is_extension_warning(message: &str) -> bool {
    message.starts_with("extension `")
}
