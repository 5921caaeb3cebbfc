//! summon: a declarative batch runner for LLM recipe pipelines.
//!
//! `main` hands the arguments to [`run`]; everything else lives here so tests reach it.

mod agent;
mod background;
mod cli;
mod color;
mod command;
mod config;
mod delegation;
mod diag;
mod env;
mod error;
mod exec;
mod mcp;
mod output;
mod pipeline;
mod provider;
mod recipe;
mod source;
mod store;
mod subagent;
mod template;
mod yaml;

use clap::Parser;

use crate::error::exit;

/// Runs summon with the given command-line arguments and returns the process exit code.
pub fn run<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match cli::Cli::try_parse_from(args) {
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
    let env = match env::Env::from_process() {
        Ok(env) => env,
        Err(e) => {
            eprintln!("summon: error: cannot read the working directory: {e}");
            return exit::USAGE;
        }
    };
    let mut ctx = command::Ctx::new(env, cli.color);
    match command::execute(cli.command, &mut ctx) {
        Ok(()) => exit::OK,
        Err(error) => {
            match &error {
                error::Error::Input(diags) => ctx.report(&diags.items),
                error::Error::Failed(message) if !message.is_empty() => {
                    eprintln!("summon: error: {message}");
                }
                error::Error::Io(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    eprintln!("summon: error: {e}");
                }
                _ => {}
            }
            error.exit_code()
        }
    }
}
