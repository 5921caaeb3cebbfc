//! What a finished task and a finished run look like to the outputs.

use std::time::Duration;

use crate::provider::Usage;

/// One finished task, as the outputs see it.
#[derive(Debug, Clone)]
pub(crate) struct TaskDone {
    pub(crate) step: usize,
    pub(crate) index: u64,
    pub(crate) item: serde_json::Value,
    pub(crate) ok: bool,
    pub(crate) output: String,
    pub(crate) structured: Option<serde_json::Value>,
    /// The structured answer was taken from a fenced block or the text around it.
    pub(crate) extracted: bool,
    /// Answers sent back for correction because they did not validate.
    pub(crate) corrections: u32,
    pub(crate) error: Option<String>,
    pub(crate) turns: u32,
    pub(crate) usage: Usage,
    pub(crate) duration: Duration,
    pub(crate) model: Option<String>,
    /// Taken from the journal of an earlier attempt of this run.
    pub(crate) resumed: bool,
    /// Taken from an earlier run that answered the same request (`--reuse`); cost nothing.
    pub(crate) reused: bool,
    /// The content hash of the rendered request.
    pub(crate) hash: String,
    /// The provider batch that answered it (`backend: batch`); priced at the batch rate.
    pub(crate) batch_id: Option<String>,
    /// What went wrong with the task's extensions (MCP servers), one line each.
    pub(crate) warnings: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepStatus {
    Succeeded,
    Failed,
    /// Not run: a step it depends on failed, or the run was interrupted.
    Skipped,
    /// Not run here: left for `summon merge` (a shard), or not needed (`--until`).
    Deferred,
}

/// The end of a run.
#[derive(Debug)]
pub(crate) struct RunSummary {
    pub(crate) run_id: String,
    pub(crate) steps: Vec<(String, StepStatus, Option<String>)>,
    /// The final step's text.
    pub(crate) final_output: Option<super::FinalText>,
    pub(crate) interrupted: bool,
    /// The run's `report.json` document (counts, tokens, cost per step and in total).
    pub(crate) report: serde_json::Value,
    /// The one-line summary printed at the end (`12 tasks: 11 completed, ...`).
    pub(crate) summary_line: String,
}
