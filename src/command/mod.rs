//! One small module per subcommand; shared set-up lives in [`Ctx`].

pub(crate) mod completions;
mod ctx;
mod delegate;
mod doctor;
mod explain;
mod load;
mod mcp;
mod merge;
mod new;
mod render;
mod report;
mod run;
mod runs;
mod schema;
mod task_result;
mod tasks;
mod trust;
mod validate;

pub(crate) use ctx::Ctx;

use crate::cli::Command;
use crate::error::Result;

/// Runs a parsed command.
pub(crate) fn execute(command: Command, ctx: &mut Ctx) -> Result<()> {
    use crate::process::groups::{Handled, exit_on_signals};
    // Commands that run the model's shell commands kill them when summon is stopped.
    match &command {
        Command::Delegate(args) if !args.r#async => {
            exit_on_signals(Handled::TerminateAndInterrupt);
        }
        Command::Run(_) | Command::Merge(_) | Command::Worker(_) => {
            exit_on_signals(Handled::Terminate);
        }
        _ => {}
    }
    refuse_inside_subagent(&command, ctx)?;
    match command {
        Command::Load(args) => load::run(&args, ctx),
        Command::Validate(args) => validate::run(&args, ctx),
        Command::Render(args) => render::run(&args, ctx),
        Command::Explain(args) => explain::run(&args, ctx),
        Command::Delegate(args) => delegate::run(&args, ctx),
        Command::Tasks(args) => tasks::run(&args, ctx),
        Command::Run(args) => run::run(&args, ctx),
        Command::Runs(args) => runs::run(&args, ctx),
        Command::Merge(args) => merge::run(&args, ctx),
        Command::Report(args) => report::run(&args, ctx),
        Command::New(args) => new::run(&args, ctx),
        Command::Doctor(args) => doctor::run(&args, ctx),
        Command::Trust(args) => trust::run(&args, ctx),
        Command::Completions(args) => completions::run_completions(&args, ctx),
        Command::Man(args) => completions::run_man(&args, ctx),
        Command::Schema(args) => schema::run(&args, ctx),
        Command::Mcp(args) => mcp::run(&args, ctx),
        Command::Worker(args) => delegate::worker(&args.task_id, ctx),
        Command::Sandbox(args) => std::process::exit(crate::sandbox::helper::run(
            args.policy,
            args.network,
            args.parent,
            &crate::sandbox::helper::Paths {
                writable: args.write.clone(),
                protect: args.protect.clone(),
                hide: args.hide.clone(),
                limits: args.limits,
                own_pids: args.own_pids,
            },
            &args.command,
        )),
    }
}

/// A command that starts subagents (`delegate`, `run`, `merge`) is refused inside a subagent:
/// one level only, as the seeds have it. Inside means the variable every subagent process
/// gets, or an ancestor started with it ([`crate::subagent::inside_subagent`]). A dry run
/// starts none and is left alone.
fn refuse_inside_subagent(command: &Command, ctx: &Ctx) -> Result<()> {
    let starts_subagents = match command {
        Command::Delegate(_) | Command::Merge(_) => true,
        Command::Run(args) => !args.dry_run,
        _ => false,
    };
    if starts_subagents && crate::subagent::inside_subagent(&ctx.env) {
        return Err(crate::error::Error::usage(NESTED));
    }
    Ok(())
}

/// The refusal of a nested delegation (seed 000's words, then why).
const NESTED: &str =
    "Delegated tasks cannot spawn further delegations: this command runs inside a subagent";
