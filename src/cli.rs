//! The command line, as clap sees it. Values here are raw; commands resolve them once.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::color::ColorChoice;

#[derive(Debug, Parser)]
#[command(
    name = "summon",
    version,
    about = "A declarative batch runner for LLM recipe pipelines",
    long_about = "summon loads reusable task definitions (goose recipes, agent role files, \
                  subrecipes), delegates work to LLM subagents, and runs pipelines that \
                  decompose a job, fan it out under a concurrency cap and synthesize the results."
)]
pub(crate) struct Cli {
    /// When to use colour: auto (on a terminal, unless NO_COLOR is set), always, never.
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto, value_name = "WHEN")]
    pub(crate) color: ColorChoice,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// List every source, or print one source's content.
    Load(LoadArgs),
    /// Check recipes, agents and pipelines; every problem as file:line:col.
    Validate(ValidateArgs),
    /// Print a recipe rendered with its parameters.
    Render(SourceArgs),
    /// List a source's parameters, the values that would be used and what is missing.
    Explain(SourceArgs),
    /// Run one subagent and print its final answer.
    Delegate(DelegateArgs),
    /// List background tasks that are running or can be collected.
    Tasks(TasksArgs),
    /// Run a pipeline: decompose, fan out under a cap, synthesize.
    Run(RunArgs),
    /// The background worker of `delegate --async` (started by summon itself).
    #[command(name = "__worker", hide = true)]
    Worker(WorkerArgs),
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The pipeline file.
    pub(crate) pipeline: PathBuf,
    #[command(flatten)]
    pub(crate) params: ParamArgs,
    /// Global cap on tasks in flight (default: the pipeline's `settings.concurrency`, else 8).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) concurrency: Option<u32>,
    /// Write `results.jsonl` and `report.json` into DIR.
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// Continue the last run of this pipeline (or RUN_ID), repeating only unfinished tasks.
    #[arg(long, value_name = "RUN_ID", num_args = 0..=1, default_missing_value = "")]
    pub(crate) resume: Option<String>,
    /// Render what can be rendered, print the graph and an estimate; send nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Write a JUnit XML report (one test case per task).
    #[arg(long, value_name = "FILE")]
    pub(crate) junit: Option<PathBuf>,
    /// No progress display.
    #[arg(long, short)]
    pub(crate) quiet: bool,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

#[derive(Debug, Args)]
pub(crate) struct TasksArgs {
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    /// The task to run.
    pub(crate) task_id: String,
}

#[derive(Debug, Args)]
pub(crate) struct DelegateArgs {
    /// The task; required without --source, appended after the source's prompt with it.
    #[arg(long, value_name = "TEXT")]
    pub(crate) instructions: Option<String>,
    /// The recipe, agent or subrecipe to run.
    #[arg(long, value_name = "NAME")]
    pub(crate) source: Option<String>,
    #[command(flatten)]
    pub(crate) params: ParamArgs,
    /// Extensions the subagent may use (comma-separated); omitted: the source's own; empty: none.
    #[arg(long, value_name = "A,B", value_delimiter = ',', num_args = 0..=1)]
    pub(crate) extensions: Option<Vec<String>>,
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Most model requests before the task fails (default: recipe, SUMMON_SUBAGENT_MAX_TURNS, 25).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_turns: Option<u32>,
    /// Reference material for the system prompt: TEXT, or @FILE to read it from a file.
    #[arg(long, value_name = "TEXT|@FILE")]
    pub(crate) context: Option<String>,
    /// The subagent's working directory; must be inside the current directory.
    #[arg(long, value_name = "DIR")]
    pub(crate) working_dir: Option<PathBuf>,
    /// Run in the background: print the task id at once and exit; collect with `summon load ID`.
    #[arg(long = "async")]
    pub(crate) r#async: bool,
    /// With --async: when SUMMON_MAX_BACKGROUND_TASKS are running, wait for a free slot
    /// instead of refusing.
    #[arg(long)]
    pub(crate) queue: bool,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

/// Provider and model overrides.
#[derive(Debug, Args, Default, Clone)]
pub(crate) struct ModelArgs {
    /// The provider: openai, anthropic, ollama, or one named in the config file.
    #[arg(long, value_name = "NAME")]
    pub(crate) provider: Option<String>,
    /// The model (or an alias from the config file).
    #[arg(long, value_name = "MODEL")]
    pub(crate) model: Option<String>,
    /// Sampling temperature.
    #[arg(long, value_name = "T")]
    pub(crate) temperature: Option<f64>,
}

#[derive(Debug, Args)]
pub(crate) struct LoadArgs {
    /// A source name (recipe, agent or subrecipe), or a background task id. Omit to list
    /// everything.
    pub(crate) name: Option<String>,
    /// With a task id: report progress at once instead of waiting.
    #[arg(long, conflicts_with = "cancel")]
    pub(crate) peek: bool,
    /// With a task id: stop the task and return what it produced so far.
    #[arg(long)]
    pub(crate) cancel: bool,
    /// With a task id: seconds to wait for the result (default 300).
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub(crate) timeout: u64,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

#[derive(Debug, Args)]
pub(crate) struct ValidateArgs {
    /// Files or directories to check; default: every discovered source.
    pub(crate) paths: Vec<PathBuf>,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

#[derive(Debug, Args)]
pub(crate) struct SourceArgs {
    /// The recipe, agent or subrecipe.
    #[arg(long, value_name = "NAME")]
    pub(crate) source: String,
    #[command(flatten)]
    pub(crate) params: ParamArgs,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

/// Parameter values for a source.
#[derive(Debug, Args, Default, Clone)]
pub(crate) struct ParamArgs {
    /// A parameter value (repeatable).
    #[arg(long = "param", value_name = "KEY=VALUE")]
    pub(crate) param: Vec<String>,
    /// A YAML or JSON file of parameter values; --param flags win over it.
    #[arg(long = "params", value_name = "FILE")]
    pub(crate) params_file: Option<PathBuf>,
}

#[derive(Debug, Args, Default, Clone, Copy)]
pub(crate) struct OutputArgs {
    /// Print machine-readable JSON on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}
