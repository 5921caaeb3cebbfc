//! Running a pipeline: steps in dependency order, tasks under global and per-step caps,
//! every finished task journaled, results streamed to the outputs.

mod batch;
mod context;
pub(crate) mod dry_run;
mod event;
mod final_text;
pub(crate) mod groups;
mod hash;
pub(crate) mod overhead;
pub(crate) mod reduce;
mod scheduler;
pub(crate) mod shard;
pub(crate) mod source_check;
mod step;
mod step_error;
pub(crate) mod tool_check;

pub(crate) use event::{RunSummary, StepStatus, TaskDone, TaskTrace};
pub(crate) use final_text::FinalText;
pub(crate) use scheduler::{RunOptions, run_pipeline};
pub(crate) use step::render_error;
