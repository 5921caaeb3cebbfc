//! What the engine tells its outputs: a finished task with its trace, how a step and a run
//! ended, the final step's text, and the per-task overhead.

mod final_text;
mod overhead;
mod run;
mod task;

pub(crate) use final_text::{FinalText, FinalTextBuilder};
pub(crate) use overhead::{Overhead, OverheadSum};
pub(crate) use run::{RunSummary, StepStatus};
pub(crate) use task::{PROMPT_LIMIT, Spent, TaskDone, TaskTrace};
