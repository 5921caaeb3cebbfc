//! The command line, as clap sees it. Values here are raw; commands resolve them once.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use clap_complete::ArgValueCandidates;

use crate::candidates as completions;
use crate::color::ColorChoice;

/// The variables that pick a provider, shown under `summon --help`.
const PROVIDER_HELP: &str = "\
Providers (environment; `summon doctor` shows what is used and where it came from):
  OPENAI_API_KEY, OPENAI_BASE_URL   OpenAI or any OpenAI-compatible server (base URL with /v1)
  ANTHROPIC_API_KEY                 Anthropic
  OLLAMA_HOST                       a local Ollama (tried when nothing else is configured)
  SUMMON_PROVIDER, SUMMON_MODEL     which provider and model (or the config file:
                                    ~/.config/summon/config.yaml, ./summon.yaml)";

#[derive(Debug, Parser)]
#[command(
    name = "summon",
    version,
    about = "A declarative batch runner for LLM recipe pipelines",
    long_about = "summon loads reusable task definitions (goose recipes, agent role files, \
                  subrecipes), delegates work to LLM subagents, and runs pipelines that \
                  decompose a job, fan it out under a concurrency cap and synthesize the results.",
    after_help = PROVIDER_HELP
)]
pub(crate) struct Cli {
    /// When to use colour: auto (on a terminal, unless NO_COLOR is set), always, never.
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto, value_name = "WHEN")]
    pub(crate) color: ColorChoice,

    /// Trust this project's summon.yaml and .mcp.json for this run (as SUMMON_TRUST_PROJECT=1).
    #[arg(long, global = true)]
    pub(crate) trust: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Clone, Subcommand)]
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
    /// The runs of this project: list them, show one's report, prune old ones.
    Runs(RunsArgs),
    /// Combine the `--out` directories of `summon run --shard` and run the remaining steps.
    Merge(MergeArgs),
    /// Build `report.html` again from an output directory (`results.jsonl`, `report.json`).
    Report(ReportArgs),
    /// Write a new agent, recipe or pipeline, checked as `summon validate` checks it.
    New(NewArgs),
    /// Check the setup: provider and model, config files, sources, the store.
    Doctor(DoctorArgs),
    /// Trust this project's summon.yaml and .mcp.json: where they send credentials, what they
    /// start.
    Trust(TrustArgs),
    /// Print the shell completion script for bash, zsh, fish, elvish or powershell.
    #[command(after_help = COMPLETIONS_HELP)]
    Completions(CompletionsArgs),
    /// Print the man page, or write one page per command into a directory.
    Man(ManArgs),
    /// Print the JSON Schema of a pipeline, a recipe or an agent's frontmatter, for editors.
    Schema(SchemaArgs),
    /// Serve this project to an MCP client over stdio: the tools load, delegate, spawn_agent
    /// and run_pipeline.
    Mcp(McpArgs),
    /// The background worker of `delegate --async` (started by summon itself).
    #[command(name = "__worker", hide = true)]
    Worker(WorkerArgs),
    /// Confines itself as asked and runs a model's shell command (started by summon itself).
    #[command(name = "__sandbox", hide = true)]
    Sandbox(SandboxHelperArgs),
}

#[derive(Debug, Clone, Args)]
pub(crate) struct SandboxHelperArgs {
    #[arg(long, value_enum)]
    pub(crate) policy: crate::sandbox::Policy,
    #[arg(long)]
    pub(crate) network: bool,
    /// Kill the command when this process (the summon that started it) ends.
    #[arg(long, value_name = "PID")]
    pub(crate) parent: Option<u32>,
    /// A directory the command may write in (with workspace-write).
    #[arg(long, value_name = "DIR")]
    pub(crate) write: Vec<PathBuf>,
    /// A path that stays read-only inside those directories (when it exists).
    #[arg(long, value_name = "PATH")]
    pub(crate) protect: Vec<PathBuf>,
    /// A path the command may neither read nor write under any policy.
    #[arg(long, value_name = "PATH")]
    pub(crate) hide: Vec<PathBuf>,
    /// The command's resource limits: PROCESSES:MEMORY_MB:FILE_MB.
    #[arg(long, value_name = "LIMITS", value_parser = |s: &str| crate::sandbox::Limits::from_arg(s).ok_or("expected PROCESSES:MEMORY_MB:FILE_MB"))]
    pub(crate) limits: Option<crate::sandbox::Limits>,
    /// Run the command in a PID namespace of its own, whose processes all end with it.
    #[arg(long)]
    pub(crate) own_pids: bool,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    pub(crate) command: Vec<std::ffi::OsString>,
}

/// The sandbox of the commands the model runs with the `shell` tool.
#[derive(Debug, Clone, Args, Default)]
pub(crate) struct SandboxArgs {
    /// Where the model's shell commands may write: workspace-write (default: the working
    /// directory and a private TMPDIR), read-only, or off (no sandbox).
    #[arg(long, value_enum, value_name = "POLICY")]
    pub(crate) sandbox: Option<crate::sandbox::Policy>,
    /// Let the model's shell commands use the network (off by default).
    #[arg(long)]
    pub(crate) network: bool,
}

impl SandboxArgs {
    /// The flags as one level of settings (an absent flag leaves the decision to others).
    pub(crate) fn level(&self) -> (Option<crate::sandbox::Policy>, Option<bool>) {
        (self.sandbox, self.network.then_some(true))
    }
}

#[derive(Debug, Clone, Args)]
pub(crate) struct RunArgs {
    /// The pipeline file.
    pub(crate) pipeline: PathBuf,
    #[command(flatten)]
    pub(crate) params: ParamArgs,
    /// Global cap on tasks in flight (default: the pipeline's `settings.concurrency`, else 8).
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub(crate) concurrency: Option<u32>,
    /// Write `results.jsonl`, `report.json` and `report.html` into DIR.
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// Continue the last run of this pipeline (or RUN_ID), repeating only unfinished tasks;
    /// `--resume=auto` continues it when it did not complete and otherwise starts a new run
    /// (one command for a scheduler's first attempt and every requeue).
    #[arg(long, value_name = "RUN_ID|auto", num_args = 0..=1, default_missing_value = "")]
    pub(crate) resume: Option<String>,
    /// Take the answer of an earlier run to the same request instead of sending it again.
    #[arg(long)]
    pub(crate) reuse: bool,
    /// Wait for a live run of the same pipeline to end instead of refusing to start.
    #[arg(long)]
    pub(crate) wait: bool,
    /// Render what can be rendered, print the graph and an estimate; send nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Write a JUnit XML report (one test case per task).
    #[arg(long, value_name = "FILE")]
    pub(crate) junit: Option<PathBuf>,
    /// The most output tokens of each model request, over the pipeline's
    /// `max_output_tokens` (default: the config file's, else one that fits the task: a bound
    /// the answer's schema implies, or one a fan-out learns from its answers; see
    /// docs/providers.md).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_output_tokens: Option<u32>,
    /// Send every fan_out step's single-turn tasks through the provider's batch API (half
    /// price, results within 24 h), as `backend: batch` does for one step.
    #[arg(long)]
    pub(crate) batch: bool,
    /// A spend cap in US dollars: no task starts that could cross it (over the pipeline's
    /// `settings.max_cost` and the config file's `max_cost`); at the cap the run ends
    /// "budget reached" (exit 3), resumable with a higher cap.
    #[arg(long, value_name = "USD", value_parser = usd)]
    pub(crate) max_cost: Option<f64>,
    /// No progress display.
    #[arg(long, short)]
    pub(crate) quiet: bool,
    /// Run only shard I of N (1-based) of every fan_out, for `summon merge`; needs --out.
    /// Without it, a scheduler's index variables select the shard: Kubernetes'
    /// JOB_COMPLETION_INDEX/JOB_COMPLETIONS, Slurm's SLURM_ARRAY_TASK_*, GitLab's
    /// CI_NODE_INDEX/CI_NODE_TOTAL, AWS Batch's AWS_BATCH_JOB_ARRAY_INDEX/_SIZE.
    #[arg(long, value_name = "I/N")]
    pub(crate) shard: Option<String>,
    /// Compute STEP and the steps it needs, once, into --out, for every shard's --items-from.
    #[arg(long, value_name = "STEP", conflicts_with = "shard")]
    pub(crate) until: Option<String>,
    /// Take the steps a `--until` run computed from its --out DIR instead of running them.
    #[arg(long, value_name = "DIR")]
    pub(crate) items_from: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) sandbox: SandboxArgs,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct MergeArgs {
    /// The pipeline file the shards ran.
    pub(crate) pipeline: PathBuf,
    /// The `--out` directories of every shard (`summon run --shard I/N --out DIR`).
    #[arg(value_name = "DIR", required = true)]
    pub(crate) dirs: Vec<PathBuf>,
    /// Parameters; they must be the shards' (default: the shards' own).
    #[command(flatten)]
    pub(crate) params: ParamArgs,
    /// Global cap on tasks in flight for the remaining steps.
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub(crate) concurrency: Option<u32>,
    /// Write the combined `results.jsonl`, `report.json` and `report.html` into DIR.
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// Write a JUnit XML report (one test case per task of every shard and of the merge).
    #[arg(long, value_name = "FILE")]
    pub(crate) junit: Option<PathBuf>,
    /// A spend cap in US dollars for the remaining steps (exit 3 when reached).
    #[arg(long, value_name = "USD", value_parser = usd)]
    pub(crate) max_cost: Option<f64>,
    /// No progress display.
    #[arg(long, short)]
    pub(crate) quiet: bool,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct TasksArgs {
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct McpArgs {
    /// The longest a `load` of a running task waits in one call, in seconds, before it
    /// answers that the task is still running (the first waits 4 s, each next one twice as
    /// long, as the host keeps waiting).
    #[arg(long, value_name = "SECS", default_value_t = 50, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub(crate) load_wait: u64,
    /// The longest a `delegate` call (without `async`) keeps the host waiting, in seconds:
    /// a task still running then goes on in the background and the call answers with its
    /// id, to collect with `load` (for hosts that give a tool call a few seconds).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub(crate) call_wait: Option<u64>,
    /// Serve streamable HTTP at `http://ADDR/mcp` instead of stdio (ADDR: `127.0.0.1:8765`);
    /// every request needs `Authorization: Bearer TOKEN`, the token written at start to a file
    /// only the user can read, whose path is printed.
    #[arg(long, value_name = "ADDR")]
    pub(crate) http: Option<std::net::SocketAddr>,
    /// With --http: allow an address that is not loopback. Anyone who reaches it can run
    /// subagents with this project's credentials.
    #[arg(long, requires = "http")]
    pub(crate) allow_remote: bool,
    /// Serve streamable HTTP on a UNIX socket at PATH (made readable and writable by its owner
    /// only) instead of stdio; no token is needed there.
    #[arg(long, value_name = "PATH", conflicts_with = "http")]
    pub(crate) socket: Option<std::path::PathBuf>,
    /// Let every session see, collect and cancel all of the project's background tasks, not
    /// only the ones it started.
    #[arg(long)]
    pub(crate) share_tasks: bool,
    /// The most tasks one `spawn_agent` call may run.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) max_spawn: u32,
    /// The spend cap in USD of each session, every call's tasks together (default: the config
    /// file's `max_cost`).
    #[arg(long, value_name = "USD", value_parser = usd)]
    pub(crate) max_cost: Option<f64>,
    /// With --http or --socket: the most sessions alive at once.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub(crate) max_sessions: u32,
    /// With --http or --socket: a session that has called no tool ends after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub(crate) idle_session_secs: u64,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct WorkerArgs {
    /// The task to run.
    pub(crate) task_id: String,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct DelegateArgs {
    /// The task; required without --source, appended after the source's prompt with it.
    #[arg(long, value_name = "TEXT")]
    pub(crate) instructions: Option<String>,
    /// The recipe, agent or subrecipe to run.
    #[arg(long, value_name = "NAME", add = ArgValueCandidates::new(completions::source_names))]
    pub(crate) source: Option<String>,
    #[command(flatten)]
    pub(crate) params: ParamArgs,
    /// Extensions the subagent may use (comma-separated); omitted: the source's own; empty: none.
    #[arg(long, value_name = "A,B", value_delimiter = ',', num_args = 0..=1)]
    pub(crate) extensions: Option<Vec<String>>,
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Most model requests before the task fails (default: recipe, SUMMON_SUBAGENT_MAX_TURNS, 25).
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub(crate) max_turns: Option<u32>,
    /// The most output tokens of each model request; an answer cut off there fails the task
    /// (default: the config file's `max_output_tokens`, else none for a hosted
    /// OpenAI-compatible provider, 4096 for a local server, 8192 for Anthropic).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_output_tokens: Option<u32>,
    /// A stop sequence: the answer ends before the model writes it (repeatable, at most 4;
    /// over the recipe's `settings.stop`).
    #[arg(long, value_name = "TEXT", value_parser = non_empty_stop)]
    pub(crate) stop: Vec<String>,
    /// Reference material for the system prompt: TEXT, or @FILE to read it from a file.
    /// Without it, what is piped to stdin (`git diff | summon delegate ...`) is the context.
    #[arg(long, value_name = "TEXT|@FILE")]
    pub(crate) context: Option<String>,
    /// The subagent's working directory; must be inside the current directory.
    #[arg(long, value_name = "DIR")]
    pub(crate) working_dir: Option<PathBuf>,
    /// A spend cap in US dollars (over the config file's `max_cost`): the task does not start
    /// when its worst case could cross it, and stops before a request that could (exit 3).
    #[arg(long, value_name = "USD", value_parser = usd)]
    pub(crate) max_cost: Option<f64>,
    /// The service tier of its requests: standard, flex (OpenAI: batch prices, slower, a 429
    /// when capacity is short) or priority (OpenAI: faster, dearer).
    #[arg(long, value_name = "TIER", value_parser = live_tier)]
    pub(crate) tier: Option<crate::config::Tier>,
    /// With --tier flex: a request the provider has no flex capacity for is sent at once at
    /// the standard tier (and priced so) instead of waiting.
    #[arg(long)]
    pub(crate) flex_fallback: bool,
    /// Run in the background: print the task id at once and exit; collect with `summon load ID`.
    #[arg(long = "async")]
    pub(crate) r#async: bool,
    /// With --async: when SUMMON_MAX_BACKGROUND_TASKS are running, wait for a free slot
    /// instead of refusing.
    #[arg(long)]
    pub(crate) queue: bool,
    #[command(flatten)]
    pub(crate) sandbox: SandboxArgs,
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

#[derive(Debug, Clone, Args)]
pub(crate) struct LoadArgs {
    /// A source name (recipe, agent or subrecipe), or a background task id. Omit to list
    /// everything.
    #[arg(add = ArgValueCandidates::new(completions::source_names_and_task_ids))]
    pub(crate) name: Option<String>,
    /// With a task id: report progress at once instead of waiting.
    #[arg(long, conflicts_with = "cancel")]
    pub(crate) peek: bool,
    /// With a task id: stop the task and return what it produced so far.
    #[arg(long)]
    pub(crate) cancel: bool,
    /// With a task id: seconds to wait for the result (default 300). When the wait runs out
    /// with the task still running, summon exits 124 (as timeout(1) does).
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub(crate) timeout: u64,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct ValidateArgs {
    /// Files or directories to check; default: every discovered source.
    pub(crate) paths: Vec<PathBuf>,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct SourceArgs {
    /// The recipe, agent or subrecipe.
    #[arg(long, value_name = "NAME", add = ArgValueCandidates::new(completions::source_names))]
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

#[derive(Debug, Clone, Args)]
pub(crate) struct NewArgs {
    #[command(subcommand)]
    pub(crate) kind: NewKind,
}

#[derive(Debug, Clone, Subcommand)]
pub(crate) enum NewKind {
    /// An agent role: `.agents/agents/NAME.md`.
    Agent(NewAgentArgs),
    /// A goose recipe: `recipes/NAME.yaml`.
    Recipe(NewRecipeArgs),
    /// A pipeline: `pipelines/NAME.yaml`.
    Pipeline(NewPipelineArgs),
}

/// What every `summon new` takes.
#[derive(Debug, Clone, Args)]
pub(crate) struct NewCommonArgs {
    /// The name, which is also the file name: letters, digits, `-` and `_`.
    pub(crate) name: String,
    /// One line saying what it is for (shown by `summon load`).
    #[arg(long, value_name = "TEXT")]
    pub(crate) description: Option<String>,
    /// Replace an existing file, showing what changes.
    #[arg(long)]
    pub(crate) force: bool,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct NewAgentArgs {
    #[command(flatten)]
    pub(crate) common: NewCommonArgs,
    /// The tools the role may use (comma-separated): read_file, write_file, edit_file,
    /// list_files, search, shell, Claude Code names (Read, Grep, Bash, ...) or
    /// mcp__SERVER__TOOL. Omitted: every tool the run offers; empty: none.
    #[arg(long, value_name = "A,B", value_delimiter = ',', num_args = 0..=1)]
    pub(crate) tools: Option<Vec<String>>,
    /// The model: `inherit` (the default), `sonnet`, `opus`, `haiku` or a model id.
    #[arg(long, value_name = "MODEL")]
    pub(crate) model: Option<String>,
    /// The role text (the Markdown body); default: an outline to fill in.
    #[arg(long, value_name = "TEXT")]
    pub(crate) role: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct NewRecipeArgs {
    #[command(flatten)]
    pub(crate) common: NewCommonArgs,
    /// The title (default: the name, capitalised).
    #[arg(long, value_name = "TEXT")]
    pub(crate) title: Option<String>,
    /// The system prompt: who the subagent is and how it works.
    #[arg(long, value_name = "TEXT")]
    pub(crate) instructions: Option<String>,
    /// The task, sent as the first user message.
    #[arg(long, value_name = "TEXT")]
    pub(crate) prompt: Option<String>,
    /// A parameter (repeatable): KEY, KEY:TYPE, or KEY:TYPE=DEFAULT for an optional one.
    /// TYPE is string (the default), number, boolean, date, file or select; a select
    /// lists its options after `=`: `level:select=low,medium,high`.
    #[arg(long = "param", value_name = "KEY[:TYPE][=DEFAULT]")]
    pub(crate) params: Vec<String>,
    /// The provider (`settings.goose_provider`).
    #[arg(long, value_name = "NAME")]
    pub(crate) provider: Option<String>,
    /// The model (`settings.goose_model`).
    #[arg(long, value_name = "MODEL")]
    pub(crate) model: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct NewPipelineArgs {
    #[command(flatten)]
    pub(crate) common: NewCommonArgs,
    /// The recipe or agent each item is given to; default: ad-hoc instructions.
    #[arg(long, value_name = "NAME", add = ArgValueCandidates::new(completions::source_names))]
    pub(crate) source: Option<String>,
    /// A pipeline parameter (repeatable), as for `summon new recipe`.
    #[arg(long = "param", value_name = "KEY[:TYPE][=DEFAULT]")]
    pub(crate) params: Vec<String>,
    /// The model every step uses (`settings.model`).
    #[arg(long, value_name = "MODEL")]
    pub(crate) model: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct RunsArgs {
    #[command(subcommand)]
    pub(crate) action: Option<RunsAction>,
    /// Only the runs of this pipeline file.
    #[arg(long, value_name = "FILE")]
    pub(crate) pipeline: Option<PathBuf>,
    /// Only the runs with this status.
    #[arg(long, value_parser = ["running", "completed", "failed", "interrupted"])]
    pub(crate) status: Option<String>,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

#[derive(Debug, Clone, Subcommand)]
pub(crate) enum RunsAction {
    /// One run's report (as report.json) and where its --out went.
    Show {
        /// The run id (`summon runs` lists them).
        run_id: String,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Delete old runs from the store and give their space back.
    Prune {
        /// Keep the newest N runs of each pipeline (default: `store.keep_runs`, else 20).
        #[arg(long, value_name = "N")]
        keep: Option<usize>,
        /// Keep runs younger than this too (`7d`, `12h`; default: `store.keep_days`, else 7d).
        #[arg(long, value_name = "AGE")]
        older_than: Option<String>,
        /// Only the runs of this pipeline file.
        #[arg(long, value_name = "FILE")]
        pipeline: Option<PathBuf>,
        #[command(flatten)]
        output: OutputArgs,
    },
}

#[derive(Debug, Clone, Args)]
pub(crate) struct TrustArgs {
    /// List the trusted projects instead.
    #[arg(long, conflicts_with = "revoke")]
    pub(crate) list: bool,
    /// Stop trusting this project.
    #[arg(long)]
    pub(crate) revoke: bool,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct DoctorArgs {
    /// Check this provider instead of the one that would be chosen.
    #[arg(long, value_name = "NAME")]
    pub(crate) provider: Option<String>,
    /// Check this model instead of the one that would be chosen.
    #[arg(long, value_name = "MODEL")]
    pub(crate) model: Option<String>,
    /// Send no request: skip the check that the provider answers.
    #[arg(long)]
    pub(crate) offline: bool,
    /// Print the price table (built-in, dated, with its sources, under the config file's
    /// `prices:`) and check nothing.
    #[arg(long)]
    pub(crate) prices: bool,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

/// How to install the completion script, shown by `summon completions --help`.
const COMPLETIONS_HELP: &str = "\
Install (the script asks summon itself for names, so it stays up to date):
  bash:  echo 'source <(summon completions bash)' >> ~/.bashrc
  zsh:   echo 'source <(summon completions zsh)' >> ~/.zshrc
  fish:  summon completions fish > ~/.config/fish/completions/summon.fish

Besides commands and flags, source names complete after `--source` and `summon load`,
and background task ids after `summon load`.";

#[derive(Debug, Clone, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub(crate) shell: completions::Shell,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct ReportArgs {
    /// The `--out` directory of a run or a merge.
    #[arg(value_hint = clap::ValueHint::DirPath)]
    pub(crate) dir: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct SchemaArgs {
    /// Which file's schema.
    #[arg(value_enum)]
    pub(crate) kind: SchemaFile,
}

/// The files `summon schema` describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum SchemaFile {
    /// A pipeline (`pipelines/*.yaml`).
    Pipeline,
    /// A goose recipe.
    Recipe,
    /// An agent's YAML frontmatter.
    Agent,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct ManArgs {
    /// Write `summon.1` and one page per command (`summon-load.1`, ...) into DIR instead of
    /// printing `summon.1`.
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
}

/// A whole number ≥ 1 (`--concurrency`, `--max-turns`), with a message that says so.
fn non_empty_stop(text: &str) -> Result<String, String> {
    if text.is_empty() {
        Err("a stop sequence cannot be empty".to_owned())
    } else {
        Ok(text.to_owned())
    }
}

/// A service tier a live request can ask for (`--tier`).
fn live_tier(text: &str) -> Result<crate::config::Tier, String> {
    use crate::config::Tier;
    match Tier::parse(text.trim()) {
        Some(Tier::Batch) => Err("`batch` is a pipeline's fan_out steps' tier (`backend: batch`); a delegation is one live request at a time"
            .to_owned()),
        Some(tier) if text.trim() == tier.name() => Ok(tier),
        _ => Err(format!("`{text}` is not a tier: standard, flex or priority")),
    }
}

/// A number of US dollars above 0 (`--max-cost`).
fn usd(text: &str) -> Result<f64, String> {
    match text.trim().trim_start_matches('$').parse::<f64>() {
        Ok(n) if n > 0.0 && n.is_finite() => Ok(n),
        _ => Err(format!("`{text}` is not a number of US dollars above 0")),
    }
}

fn at_least_one(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{text}` is not a whole number (at least 1)")),
    }
}
