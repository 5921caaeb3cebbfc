//! One delegation, from a request to its result: preparing the subagent, running it in the
//! foreground or as a background task, and collecting a background task's result.

mod background;
mod prepare;

pub(crate) use background::{DelegationRequest, execute, open_existing_store, run_worker, start};
pub(crate) use prepare::{
    Draft, PrepareError, Prepared, Request, Resolver, draft, prepare, prepare_with,
};
