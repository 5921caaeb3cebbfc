//! `summon mcp`: serve this project to an MCP client over stdio (see [`crate::mcp_server`]).

use std::time::Duration;

use super::Ctx;
use crate::cli::McpArgs;
use crate::error::Result;

pub(crate) fn run(args: &McpArgs, ctx: &mut Ctx) -> Result<()> {
    let load_wait = Duration::from_secs(args.load_wait);
    match args.http {
        None => crate::mcp_server::serve(ctx.env.clone(), load_wait),
        Some(addr) => {
            if !addr.ip().is_loopback() && !args.allow_remote {
                return Err(crate::error::Error::usage(format!(
                    "--http {addr}: not a loopback address; anyone who reaches it could run subagents with this project's credentials. Use 127.0.0.1 or ::1, or add --allow-remote"
                )));
            }
            crate::process::groups::exit_on_signals(
                crate::process::groups::Handled::TerminateAndInterrupt,
            );
            crate::mcp_server::serve_http(ctx.env.clone(), load_wait, addr)
        }
    }
}
