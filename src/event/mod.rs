//! What the engine tells its outputs: the stream of a run's events ([`Events`]), a finished
//! task with its trace, how a step and a run ended, the final step's text, and the per-task
//! overhead.

mod activity;
mod bus;
mod failure;
mod final_text;
mod output_limit;
mod overhead;
mod run;
mod task;

pub(crate) use activity::{Activity, Doing};
pub(crate) use bus::{Bus, Consumer, Events};
pub(crate) use failure::{Failure, FailureClass};
pub(crate) use final_text::{FinalText, FinalTextBuilder};
pub(crate) use output_limit::{CapSource, CapSummary};
pub(crate) use overhead::{Overhead, OverheadSum};
pub(crate) use run::{Notice, ProviderStopped, RunEvent, RunSummary, StepStatus};
pub(crate) use task::{PROMPT_LIMIT, Spent, TaskDone, TaskMeta, TaskTrace, item_label};
