//! MCP servers as subagent tools: goose recipe `extensions` of type `stdio` and
//! `streamable_http` (and the servers of a project's `.mcp.json` that an agent's `tools` list
//! names), offered to the model as `<extension>__<tool>`.
//!
//! [`ServerSpec`] is resolved when a delegation is prepared; a [`Session`] lives exactly as
//! long as the task that uses it.

mod http;
mod observed;
mod project;
mod server;
mod session;
mod size;
mod stdio;

pub(crate) use project::{project_servers, untrusted_server};
pub(crate) use server::ServerSpec;
pub(crate) use session::Session;
