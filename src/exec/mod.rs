//! Running a pipeline: steps in dependency order, tasks under global and per-step caps,
//! every finished task journaled, results streamed to the outputs.

mod batch;
mod context;
mod dispatcher;
pub(crate) mod dry_run;
mod finish;
mod hash;
mod open;
pub(crate) mod plan;
pub(crate) mod reduce;
#[cfg(test)]
mod run_tests;
mod scheduler;
mod step;
mod step_error;
mod step_run;

pub(crate) use scheduler::{RunOptions, run_pipeline};
