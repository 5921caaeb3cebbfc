//! Running a pipeline: steps in dependency order, tasks under global and per-step caps,
//! every finished task journaled, results streamed to the outputs.

mod batch;
mod context;
mod dispatcher;
pub(crate) mod dry_run;
mod event;
mod final_text;
mod finish;
pub(crate) mod groups;
mod hash;
mod open;
pub(crate) mod overhead;
pub(crate) mod plan;
pub(crate) mod reduce;
mod scheduler;
mod step;
mod step_error;
mod step_run;

pub(crate) use event::{RunSummary, StepStatus, TaskDone, TaskTrace};
pub(crate) use final_text::FinalText;
pub(crate) use scheduler::{RunOptions, run_pipeline};
pub(crate) use step::render_error;
