//! One delegation, from a request to its result: preparing the subagent, running it in the
//! foreground or as a background task, and collecting a background task's result. Nothing
//! here prints: each operation returns typed values, and a running task reports its events to
//! the caller's [`Observer`].

mod background;
mod collect;
pub(crate) mod loading;
mod prepare;
mod request;
mod run;
mod sources;
mod tasks;
#[cfg(test)]
mod test_support;

pub(crate) use background::{Started, run_worker, start};
pub(crate) use collect::{CollectError, cancel, cancel_grace, peek, wait};
pub(crate) use prepare::{Draft, PrepareError, Prepared, Request, Resolver, draft, prepare_with};
pub(crate) use request::{DelegationRequest, RoleTools};
pub(crate) use run::{DelegationOutcome, Observer, run};
pub(crate) use sources::{
    LoadedSource, SourceList, list as list_sources, load as load_source, tools_line,
};
pub(crate) use tasks::{TaskStore, TaskView, format_secs};
