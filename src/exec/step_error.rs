//! Why a step of a run failed: what a step's task hands back to the loop that decides the
//! step's status, and what the report, the JUnit file and the step summary show.

use std::fmt;

/// How one step ended without succeeding.
#[derive(Debug)]
pub(crate) enum StepError {
    /// One of its tasks failed it (a decompose subagent's, a reduction's chunk), or it could
    /// not run for a reason of its own.
    Failed(String),
    /// A template of the step did not render (its message names the line).
    Render(String),
    /// The step's items could not be produced or read.
    Items(String),
    /// A task names a source missing from the run's catalog.
    Source(String),
    /// The run's store could not be read or written (a batch's records).
    Store(String),
    /// Fewer tasks succeeded than the step needs (`min_success`, `on_error`).
    TooFewSucceeded {
        succeeded: usize,
        total: usize,
        needed: usize,
        first_error: String,
    },
    /// Stopped by Ctrl-C or SIGTERM before every task ran; `ran` counts the tasks that did,
    /// when any failed.
    Interrupted {
        ran: Option<(usize, usize)>,
        first_error: String,
    },
    /// The step's final text could not be kept in its temporary file.
    KeepText(std::io::Error),
    /// The step's task panicked: a bug in summon, failed like any other step so its
    /// dependents are skipped and the run never hangs.
    Panicked,
}

impl StepError {
    /// Stopped before the end, with no task failed.
    pub(crate) fn interrupted() -> Self {
        Self::Interrupted {
            ran: None,
            first_error: String::new(),
        }
    }
}

impl From<String> for StepError {
    fn from(message: String) -> Self {
        Self::Failed(message)
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed(message)
            | Self::Render(message)
            | Self::Items(message)
            | Self::Source(message)
            | Self::Store(message) => f.write_str(message),
            Self::TooFewSucceeded {
                succeeded,
                total,
                needed,
                first_error,
            } => write!(
                f,
                "{succeeded} of {total} tasks succeeded (needed {needed}); {first_error}"
            ),
            Self::Interrupted { ran: None, .. } => f.write_str("interrupted"),
            Self::Interrupted {
                ran: Some((succeeded, total)),
                first_error,
            } => write!(
                f,
                "interrupted: {succeeded} of the {total} tasks that ran succeeded; \
                 `--resume` runs the rest. {first_error}"
            ),
            Self::KeepText(e) => write!(f, "cannot keep the step's text: {e}"),
            Self::Panicked => f.write_str("internal error: step panicked"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_as_before() {
        assert_eq!(StepError::interrupted().to_string(), "interrupted");
        assert_eq!(
            StepError::TooFewSucceeded {
                succeeded: 1,
                total: 3,
                needed: 2,
                first_error: "boom".into()
            }
            .to_string(),
            "1 of 3 tasks succeeded (needed 2); boom"
        );
        assert_eq!(
            StepError::Panicked.to_string(),
            "internal error: step panicked"
        );
    }
}
