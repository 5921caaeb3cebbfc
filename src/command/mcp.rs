//! `summon mcp`: serve this project to an MCP client over stdio (see [`crate::mcp_server`]).

use std::time::Duration;

use super::Ctx;
use crate::cli::McpArgs;
use crate::error::Result;

pub(crate) fn run(args: &McpArgs, ctx: &mut Ctx) -> Result<()> {
    crate::mcp_server::serve(ctx.env.clone(), Duration::from_secs(args.load_wait))
}
