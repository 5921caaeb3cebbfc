//! The pipeline format, version 1 (docs/pipelines.md): a pipeline names steps; each step
//! delegates one or many subagent tasks. Strings that are rendered later are [`Template`]s
//! that remember where they were written.

use std::sync::Arc;
use std::time::Duration;

use indexmap::IndexMap;

use crate::diag::{Pos, SourceFile};
use crate::recipe::Parameter;

/// A validated pipeline.
#[derive(Debug, Clone)]
pub(crate) struct Pipeline {
    pub(crate) file: Arc<SourceFile>,
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) parameters: Vec<Parameter>,
    pub(crate) settings: PipelineSettings,
    /// In file order; ids are unique.
    pub(crate) steps: Vec<Step>,
    pub(crate) outputs: Vec<OutputFile>,
}

impl Pipeline {
    /// The fan_out step whose `results` the synthesize step's templates read: the results a
    /// reduction chunks. `None` when they read none, or several.
    pub(crate) fn reduced_step(&self, step: &Step) -> Option<usize> {
        let StepKind::Synthesize(task) = &step.kind else {
            return None;
        };
        let mut found: Vec<usize> = Vec::new();
        for template in task
            .instructions
            .iter()
            .chain(task.context.iter())
            .chain(task.parameters.values())
        {
            for r in super::refs::step_refs(&template.text) {
                if r.field.as_deref() != Some("results") {
                    continue;
                }
                if let Some(j) = self.steps.iter().position(|s| s.id == r.id)
                    && matches!(self.steps[j].kind, StepKind::FanOut(_))
                    && !found.contains(&j)
                {
                    found.push(j);
                }
            }
        }
        match found.as_slice() {
            [one] => Some(*one),
            _ => None,
        }
    }
}

/// `settings`: defaults for every step.
#[derive(Debug, Clone, Default)]
pub(crate) struct PipelineSettings {
    pub(crate) provider: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) temperature: Option<f64>,
    pub(crate) max_turns: Option<u32>,
    /// The output limit of every request (`--max-output-tokens` overrides).
    pub(crate) max_output_tokens: Option<u32>,
    /// Stop sequences of every request.
    pub(crate) stop: Vec<String>,
    /// Global cap on tasks in flight (`--concurrency` overrides).
    pub(crate) concurrency: Option<usize>,
    /// The run's spend cap in USD (`--max-cost` overrides).
    pub(crate) max_cost: Option<f64>,
    /// The service tier of every step's requests, and where it is written.
    pub(crate) tier: Option<(crate::config::Tier, Pos)>,
    /// `flex_fallback: standard` for every step.
    pub(crate) flex_fallback: Option<bool>,
    /// The sandbox of the model's shell commands (`--sandbox` / `--network` override).
    pub(crate) sandbox: Option<crate::sandbox::Policy>,
    pub(crate) network: Option<bool>,
}

/// A string rendered with the template context, and where it was written (the line of its
/// first character, for error positions).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Template {
    pub(crate) text: String,
    pub(crate) pos: Pos,
    /// Written as a block scalar (`|`/`>`): the text starts on the line after `pos`.
    pub(crate) block: bool,
}

impl Template {
    /// The file line of the template's first line.
    pub(crate) fn first_line(&self) -> u32 {
        self.pos.line + u32::from(self.block)
    }

    /// The file line a render failure happened on.
    pub(crate) fn error_line(&self, error: &minijinja::Error) -> u32 {
        self.first_line()
            + error
                .line()
                .map_or(0, |l| u32::try_from(l).unwrap_or(1).saturating_sub(1))
    }

    /// A render failure, positioned in the pipeline file.
    pub(crate) fn render_error(&self, error: &minijinja::Error) -> String {
        let line = self.error_line(error);
        let message = crate::template::describe(error);
        format!("line {line}: cannot render template: {message}")
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub(crate) id: String,
    pub(crate) pos: Pos,
    pub(crate) kind: StepKind,
    /// Extra dependencies, beyond what the step's templates reference.
    pub(crate) needs: Vec<(String, Pos)>,
    /// Per-step cap on tasks in flight.
    pub(crate) concurrency: Option<usize>,
    pub(crate) on_error: OnError,
    /// For fan_out: how many tasks must succeed for the step to succeed (default: all, or
    /// at least one under `on_error: continue`).
    pub(crate) min_success: Option<MinSuccess>,
    /// Extra attempts for a failed task.
    pub(crate) retries: u32,
    /// Bound on one task's run.
    pub(crate) timeout: Option<Duration>,
    pub(crate) provider: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) temperature: Option<f64>,
    pub(crate) max_turns: Option<u32>,
    pub(crate) max_output_tokens: Option<u32>,
    /// Stop sequences over the settings' (`None`: the settings').
    pub(crate) stop: Option<Vec<String>>,
    /// An empty final answer completes the task instead of failing it.
    pub(crate) allow_empty: bool,
    pub(crate) backend: Backend,
    /// `tier`: the service tier of the step's requests, and where it is written (`batch`
    /// is `backend: batch`).
    pub(crate) tier: Option<(crate::config::Tier, Pos)>,
    /// `flex_fallback: standard`: a flex request the provider has no capacity for is sent
    /// at the standard tier.
    pub(crate) flex_fallback: Option<bool>,
    /// Take the answer of an earlier run to the same request instead of sending it.
    pub(crate) reuse: bool,
    /// The sandbox of the model's shell commands, over the settings'.
    pub(crate) sandbox: Option<crate::sandbox::Policy>,
    pub(crate) network: Option<bool>,
    /// `tools:`: the subset of its tasks' tools the step sends, each entry where it is
    /// written (`None`: all of them; empty: none).
    pub(crate) tools: Option<Vec<(String, Pos)>>,
    /// `cache: false` turns prompt caching off for the step (breakpoints, key, warm-up).
    pub(crate) cache: Option<bool>,
    /// Whether a task whose extension (MCP server) failed counts as failed.
    pub(crate) on_extension_error: OnExtensionError,
    /// The model's context window for this step's requests, over the config file's and the
    /// built-in one.
    pub(crate) context_window: Option<u64>,
    /// A synthesize step's hierarchical reduction, when it has one.
    pub(crate) reduce: Option<Reduce>,
}

/// `reduce` / `chunk_tokens` / `reduce_instructions` of a synthesize step: its results are
/// synthesized in chunks that each fit, then the partial answers likewise, until one answer
/// remains.
#[derive(Debug, Clone)]
pub(crate) struct Reduce {
    /// `chunk_tokens`: the most tokens of results one chunk holds; `None` (`reduce: auto`):
    /// as many as fit the model's context window.
    pub(crate) chunk_tokens: Option<u64>,
    /// The instructions of the upper levels, over `steps.<id>.partials`; `None`: the step's
    /// own instructions over the partial answers as its results.
    pub(crate) instructions: Option<Template>,
    /// Where the reduction was asked for.
    pub(crate) pos: Pos,
}

#[derive(Debug, Clone)]
pub(crate) enum StepKind {
    Decompose(Decompose),
    FanOut(FanOut),
    Synthesize(TaskTemplate),
    Delegate(TaskTemplate),
}

impl StepKind {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Decompose(_) => "decompose",
            Self::FanOut(_) => "fan_out",
            Self::Synthesize(_) => "synthesize",
            Self::Delegate(_) => "delegate",
        }
    }
}

/// The keys of a decompose step's item sources besides a subagent's `source`/`instructions`,
/// in the order they are documented.
pub(crate) const DECOMPOSE_FORMS: [&str; 4] = ["command", "items", "file", "glob"];

/// The keys that make a decompose step a subagent one.
pub(crate) const DECOMPOSE_AGENT_KEYS: [&str; 2] = ["source", "instructions"];

/// [`DECOMPOSE_FORMS`] and the subagent form, as messages list them.
pub(crate) fn decompose_forms_text() -> String {
    let forms: Vec<String> = DECOMPOSE_FORMS.iter().map(|f| format!("`{f}`")).collect();
    let agent: Vec<String> = DECOMPOSE_AGENT_KEYS
        .iter()
        .map(|k| format!("`{k}`"))
        .collect();
    format!("{}, or {} (a subagent)", forms.join(", "), agent.join("/"))
}

/// Where a decompose step's items come from.
#[derive(Debug, Clone)]
pub(crate) enum Decompose {
    /// A literal list (any JSON values).
    Items(Vec<serde_json::Value>),
    /// A command, glob or file, its template rendered when the step runs
    /// ([`super::items::expand_items`]).
    Static(super::items::StaticForm, Template),
    /// A subagent whose final answer must be a JSON array.
    Agent(TaskTemplate),
}

#[derive(Debug, Clone)]
pub(crate) struct FanOut {
    /// The step whose items to iterate, and where it was named.
    pub(crate) over: String,
    pub(crate) over_pos: Pos,
    /// The index of the `over` step, resolved once the file is read (`None`: no such step,
    /// which validation reports).
    pub(crate) over_step: Option<usize>,
    pub(crate) task: TaskTemplate,
}

/// One subagent task, before rendering: a source and/or instructions.
#[derive(Debug, Clone, Default)]
pub(crate) struct TaskTemplate {
    /// May itself be a template (`{{ item.agent }}`); rendered empty or `null` means a
    /// general (ad-hoc) subagent.
    pub(crate) source: Option<Template>,
    pub(crate) instructions: Option<Template>,
    /// Parameter values for the source, each a template.
    pub(crate) parameters: IndexMap<String, Template>,
    pub(crate) context: Option<Template>,
    /// `None`: the source's own; `Some(empty)`: none.
    pub(crate) extensions: Option<Vec<String>>,
    /// A fan-out's `schema:`: the JSON Schema every answer must match (as a recipe's
    /// `response.json_schema`, over the source's own); its answers are then data.
    pub(crate) schema: Option<Box<serde_json::Value>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum OnError {
    #[default]
    FailFast,
    Continue,
}

/// `on_extension_error`: what a task whose extension did not start or failed during the task
/// comes to. Either way the task's result lists the extension's warnings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum OnExtensionError {
    /// The task keeps the status its answer gives it (the model did without the tools).
    #[default]
    Warn,
    /// The task fails (and is retried under `retries`).
    Fail,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum MinSuccess {
    Count(usize),
    /// 0–100.
    Percent(f64),
}

impl MinSuccess {
    /// The number of successes needed out of `total`.
    pub(crate) fn required(self, total: usize) -> usize {
        match self {
            Self::Count(n) => n.min(total),
            Self::Percent(p) => {
                let needed = (p / 100.0 * total as f64).ceil();
                (needed.max(0.0) as usize).min(total)
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Backend {
    #[default]
    Live,
    Batch,
}

/// An `outputs` entry: a file written (relative to the working directory) when the run
/// succeeds.
#[derive(Debug, Clone)]
pub(crate) struct OutputFile {
    pub(crate) path: Template,
    pub(crate) body: OutputBody,
    /// `outside_project: true`: the rendered path may leave the working directory (`..`, an
    /// absolute path, a link); without it such a path is refused.
    pub(crate) outside_project: bool,
}

/// What an `outputs` file holds.
#[derive(Debug, Clone)]
pub(crate) enum OutputBody {
    /// `content:`, rendered once with the run's context.
    Text(Template),
    /// `rows:` / `columns:`: one row per task of a fan_out step, in item order.
    Table(Table),
}

/// A table `outputs` entry (docs/pipelines.md, outputs).
#[derive(Debug, Clone)]
pub(crate) struct Table {
    /// The fan_out step whose tasks are the rows, and where it was named.
    pub(crate) rows: String,
    pub(crate) rows_pos: Pos,
    /// In order: the column's name and its template over `item`, `data`, `output`,
    /// `status`, `error`.
    pub(crate) columns: Vec<(String, Template)>,
    /// `only: completed`: failed items are left out.
    pub(crate) only_completed: bool,
    /// `keep_formulas: true`: CSV cells that start like a formula (`=`, `+`, `-`, `@`, tab,
    /// carriage return) are written as they are instead of behind a `'`.
    pub(crate) keep_formulas: bool,
    pub(crate) format: TableFormat,
}

/// A table's file format, from the path's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TableFormat {
    Csv,
    Jsonl,
}

/// The variables of a table's column templates.
pub(crate) const TABLE_VARIABLES: [&str; 5] = ["item", "data", "output", "status", "error"];
