//! How steps and runs end, as the outputs see them.

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StepStatus {
    Succeeded,
    Failed,
    /// Not run: a step it depends on failed, or the run was interrupted.
    Skipped,
    /// Not run here: left for `summon merge` (a shard), or not needed (`--until`).
    Deferred,
}

impl StepStatus {
    /// `succeeded`, `failed`, `skipped` or `deferred`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
            Self::Deferred => "deferred",
        }
    }
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
