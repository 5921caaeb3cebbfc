//! Why a task failed: a class that stays with the failure from where it happened (the
//! provider, a timeout, a check...) up to the task's record, and the message the
//! outputs show.

/// What kind of failure ended a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureClass {
    /// The provider failed the request; its class ([`crate::provider::ProviderError::class`]).
    Provider(&'static str),
    /// The answer was unusable: empty, or cut off at the output limit.
    Answer,
    /// The answer did not match the response schema after the corrections allowed.
    Schema,
    /// `max_turns` requests were made without a final answer.
    MaxTurns,
    /// goose `retry` checks kept failing.
    Check,
    /// An extension (MCP server) the task needs failed (`on_extension_error: fail`).
    Extension,
    /// The step's `timeout` ran out.
    Timeout,
    /// Stopped: a second Ctrl-C, or a cancel.
    Cancelled,
    /// The task could not be made ready: an unknown source, a parameter, its provider, or a
    /// request too large for the model.
    Prepare,
    /// The spend cap was reached: the task did not start, or stopped before its next
    /// request.
    Budget,
    /// Anything else, and a failure read back from the journal.
    Other,
}

impl FailureClass {
    /// How the end of a run names the class: `provider: rate_limited`, `timeout`,
    /// `max turns`, ...
    pub(crate) fn label(self) -> String {
        match self {
            Self::Provider(class) => format!("provider: {class}"),
            Self::Answer => "unusable answer".to_owned(),
            Self::Schema => "answer not matching its schema".to_owned(),
            Self::MaxTurns => "max turns".to_owned(),
            Self::Check => "retry checks".to_owned(),
            Self::Extension => "extension".to_owned(),
            Self::Timeout => "timeout".to_owned(),
            Self::Cancelled => "cancelled".to_owned(),
            Self::Prepare => "task not ready".to_owned(),
            Self::Budget => "budget reached".to_owned(),
            Self::Other => "other".to_owned(),
        }
    }
}

/// A task's failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    pub(crate) class: FailureClass,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(class: FailureClass, message: impl Into<String>) -> Self {
        Self {
            class,
            message: message.into(),
        }
    }

    /// A failure whose class is not known (read back from the journal).
    pub(crate) fn other(message: impl Into<String>) -> Self {
        Self::new(FailureClass::Other, message)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}
