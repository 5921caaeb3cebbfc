//! What a task does while it runs, for the consumers that follow it live (traces): its
//! attempts, its model requests and their answers, the provider's retries and the tools it
//! calls. The outputs that only need a finished task read [`super::TaskDone`] instead.

use std::time::{Duration, Instant};

use crate::provider::Usage;

/// One thing a running task did, at `at`.
#[derive(Debug, Clone)]
pub(crate) struct Activity {
    pub(crate) step: usize,
    /// The task's index in its step (its chunk's index in a reduction level).
    pub(crate) index: u64,
    pub(crate) at: Instant,
    pub(crate) what: Doing,
}

/// What a running task did.
#[derive(Debug, Clone)]
pub(crate) enum Doing {
    /// An attempt starts (1, then more with the step's `retries`), under this sandbox policy.
    Attempt { attempt: u32, sandbox: &'static str },
    /// A model request is about to be sent to `provider` for `model`.
    Request {
        provider: String,
        model: String,
        turn: u32,
    },
    /// The request in flight ended: an answer with its tokens and stop reason, or the
    /// provider's error class once its retries are spent.
    Response {
        usage: Usage,
        stop_reason: Option<String>,
        error: Option<&'static str>,
    },
    /// The request in flight is sent again after `wait` (`class`: `rate_limited`, ...).
    Retry { class: &'static str, wait: Duration },
    /// A tool call starts.
    ToolStarted {
        name: String,
        /// The span id the call chose, when the run is traced.
        span: Option<u64>,
        /// The extension (MCP server) whose tool it is, for one of theirs.
        extension: Option<String>,
    },
    /// The tool call in flight ended.
    ToolEnded { ok: bool },
}
