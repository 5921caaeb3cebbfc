//! summon: a declarative batch runner for LLM recipe pipelines.
//!
//! `main` hands the arguments to [`run`]; everything else lives here so tests reach it.

/// `eprintln!` for messages: a closed stderr (`summon run ... 2>&-`, a reader that went away)
/// loses the message instead of ending summon with a panic.
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod agent;
mod candidates;
mod cli;
mod color;
mod command;
mod compile;
mod config;
mod delegation;
mod diag;
mod env;
mod error;
mod event;
mod exec;
#[doc(hidden)]
pub mod fuzzing;
mod local;
mod mcp;
mod mcp_server;
mod output;
mod pipeline;
mod plural;
mod process;
mod provider;
mod recipe;
mod safe_fs;
mod sandbox;
mod scaffold;
mod schema;
mod source;
mod store;
mod subagent;
mod telemetry;
mod template;
mod text;
mod yaml;

use std::io::Write as _;

use clap::{CommandFactory, FromArgMatches};

use crate::error::exit;

/// Runs summon with the given command-line arguments and returns the process exit code.
pub fn run<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    // The helper that starts MCP servers and sandboxed commands runs before anything else.
    if let Some(code) = sandbox::helper::early(&args) {
        return code;
    }
    // Nothing the model runs may read summon's memory or environment (the API keys).
    sandbox::forbid_inspection();
    // The user's credentials file fills what a bare environment (an MCP host's) lacks.
    let env = env::Env::from_process().map(env::Env::with_credentials);
    if let Ok(env) = &env
        && let Some(code) = command::completions::complete_request(&args, env)
    {
        return code;
    }
    let no_color = env.as_ref().is_ok_and(|env| env.is_set("NO_COLOR"));
    let parsed = cli::Cli::command()
        .color(color::for_clap(&args, no_color))
        .try_get_matches_from(&args)
        .and_then(|matches| cli::Cli::from_arg_matches(&matches));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
        }
    };
    let env = match env {
        Ok(env) if cli.trust => env.with_var(config::trust::TRUST_ENV, "1"),
        Ok(env) => env,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "summon: error: cannot read the working directory: {e}"
            );
            return exit::USAGE;
        }
    };
    let mut ctx = command::Ctx::new(env, cli.color);
    ctx.err_palette.apply_to_progress();
    let result = command::execute(cli.command, &mut ctx);
    process::groups::wait_if_ending();
    match result {
        Ok(()) => exit::OK,
        Err(error) => {
            match &error {
                error::Error::Input(diags) => ctx.report(&diags.items),
                // A message can quote a provider's answer or a model's path: shown without the
                // control sequences a terminal would act on.
                error::Error::Failed(message) | error::Error::Busy(message)
                    if !message.is_empty() =>
                {
                    let _ = writeln!(
                        std::io::stderr(),
                        "summon: error: {}",
                        text::printable(message)
                    );
                }
                error::Error::Io(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    let e = e.to_string();
                    let _ = writeln!(std::io::stderr(), "summon: error: {}", text::printable(&e));
                }
                error::Error::Write { path, source } => {
                    let e = error::Error::write_message(path, source);
                    let _ = writeln!(std::io::stderr(), "summon: error: {}", text::printable(&e));
                }
                error::Error::Store(e) => {
                    let e = e.to_string();
                    let _ = writeln!(std::io::stderr(), "summon: error: {}", text::printable(&e));
                }
                error::Error::Internal(message) => {
                    let _ = writeln!(
                        std::io::stderr(),
                        "summon: internal error: {}",
                        text::printable(message)
                    );
                }
                _ => {}
            }
            error.exit_code()
        }
    }
}
