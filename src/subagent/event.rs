//! What a running subagent reports while it works.

use std::time::Duration;

/// Sent to the observer of a subagent run, in order.
#[derive(Debug, Clone)]
pub(crate) enum SubagentEvent {
    /// A model request is about to be sent (turn counts from 1).
    Turn { turn: u32 },
    /// A transient provider failure; the request is retried after `delay`.
    Retry {
        attempt: u32,
        delay: Duration,
        reason: String,
        /// [`crate::provider::ProviderError::retry_class`] of the failure.
        class: &'static str,
    },
    /// The provider is still starting; the request is sent again after `delay` (not a retry).
    StartupWait { delay: Duration },
    /// The provider's rate limits (`limit`, as [`crate::provider::Binding::describe`] says
    /// it) hold the request, for `delay` at most, before it is sent (not a retry).
    Held { limit: String, delay: Duration },
    /// The hold said by [`SubagentEvent::Held`] is over after `waited` (tokens given back
    /// can end it early): the request goes.
    HeldFor { waited: Duration },
    /// A tool call finished.
    ToolCall {
        name: String,
        ok: bool,
        summary: String,
    },
    /// The final answer did not match the schema; the model is asked again.
    SchemaRetry { errors: String },
    /// goose `retry` checks failed; the task runs again.
    CheckRetry { attempt: u32, reason: String },
    /// Text the model produced (intermediate or final).
    Text { text: String },
    /// Something the user should know, such as an extension that failed; names its subject.
    Warning { message: String },
    /// What every request of the run carries besides the conversation: the system prompt's
    /// length and the tool definitions' (as `crate::provider::tool_chars` counts them), MCP
    /// tools included. Sent once, before the first request.
    Framing {
        system_len: usize,
        tool_chars: usize,
    },
    /// Token totals of the run so far, after each response.
    Tokens { total: crate::provider::Usage },
    /// A model request ended: with an answer (its own tokens and why the model stopped) or
    /// with the provider's error class, after any retries.
    Response {
        usage: crate::provider::Usage,
        stop_reason: Option<String>,
        error: Option<&'static str>,
    },
    /// A tool call starts.
    ToolStarted {
        name: String,
        /// The call's span id when the run is traced (what the call starts runs under it).
        span: Option<u64>,
        /// The extension (MCP server) whose tool it is, for one of theirs.
        extension: Option<String>,
    },
    /// A delegation starts with this provider and model (sent by the delegation library
    /// before the agent loop's first event).
    Started { provider: String, model: String },
}
