//! `summon mcp`: serve this project to an MCP client over stdio, or over streamable HTTP on a
//! loopback address (with a bearer token) or a UNIX socket (see [`crate::mcp_server`]).

use std::time::Duration;

use super::Ctx;
use crate::cli::McpArgs;
use crate::error::Result;
use crate::mcp_server::{Listen, Options};

pub(crate) fn run(args: &McpArgs, ctx: &mut Ctx) -> Result<()> {
    let options = Options {
        load_wait: Duration::from_secs(args.load_wait),
        call_wait: args.call_wait.map(Duration::from_secs),
        share_tasks: args.share_tasks,
        max_spawn: args.max_spawn as usize,
        max_cost: args.max_cost,
        max_sessions: args.max_sessions as usize,
        idle_session: Duration::from_secs(args.idle_session_secs),
    };
    let listen = match (&args.http, &args.socket) {
        (Some(addr), _) => {
            if !addr.ip().is_loopback() && !args.allow_remote {
                return Err(crate::error::Error::usage(format!(
                    "--http {addr}: not a loopback address; anyone who reaches it could run subagents with this project's credentials. Use 127.0.0.1 or ::1, or add --allow-remote"
                )));
            }
            Listen::Tcp(*addr)
        }
        (None, Some(path)) => Listen::Unix(path.clone()),
        (None, None) => return crate::mcp_server::serve(ctx.env.clone(), options),
    };
    crate::mcp_server::serve_http(ctx.env.clone(), options, listen)
}
