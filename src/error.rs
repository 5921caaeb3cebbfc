//! The top-level error: what went wrong, how it is shown, and the exit code it means.

use crate::diag::{Diagnostic, Diagnostics};
use crate::store::StoreError;

/// Exit codes, in one place (documented in docs/commands.md). A run stopped by SIGTERM or SIGHUP
/// exits 128 + the signal number (143, 129), from the signal handler in `exec::groups`.
pub(crate) mod exit {
    pub(crate) const OK: i32 = 0;
    /// Usage, configuration or validation error.
    pub(crate) const USAGE: i32 = 1;
    /// The task or a pipeline step failed.
    pub(crate) const FAILED: i32 = 2;
    /// summon itself reached a state it should never be in (as sysexits' EX_SOFTWARE).
    pub(crate) const INTERNAL: i32 = 70;
    /// The project's `.summon/` store could not be read or written: corrupt, unreadable, or on
    /// a full disk (as sysexits' EX_IOERR).
    pub(crate) const STORE: i32 = 74;
    /// Another run of the same pipeline is live, the store stayed locked by other summon
    /// processes, or the provider could not be reached (as sysexits' EX_TEMPFAIL: try again
    /// later).
    pub(crate) const BUSY: i32 = 75;
    /// `summon load ID` stopped waiting while the task still runs (as timeout(1) exits).
    pub(crate) const STILL_RUNNING: i32 = 124;
    /// The spend cap was reached: the run or delegation stopped starting work (resumable
    /// with a higher cap).
    pub(crate) const BUDGET: i32 = 3;
    /// Interrupted by Ctrl-C.
    pub(crate) const INTERRUPTED: i32 = 130;
}

#[derive(Debug)]
pub(crate) enum Error {
    /// Problems in the input, already positioned; printed as diagnostics, exit 1.
    Input(Diagnostics),
    /// The work itself failed (exit 2); the message was already shown or is given here.
    Failed(String),
    /// Another live run holds what this one needs (exit 75).
    Busy(String),
    /// A wait ran out before the result was there; what to do next was already shown.
    StillRunning,
    /// Interrupted by the user.
    Interrupted,
    /// The spend cap was reached (exit 3); what happened was already shown.
    Budget,
    /// The provider refused the key (exit 1) or could not be reached (exit 75): the run
    /// started no more tasks; what happened was already shown.
    ProviderStopped { refused: bool },
    /// The `.summon/` store failed (exit 74; 75 when it stayed locked, 1 when it refused a task
    /// over the background limit). Its message names the database file.
    Store(StoreError),
    /// summon reached a state it should never be in (exit 70): a bug, not the user's input.
    Internal(String),
    /// An I/O problem writing output; a closed pipe is not an error.
    Io(std::io::Error),
    /// A run's output file (`results.jsonl`) could not be written, a full disk (exit 74).
    Write {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn exit_code(&self) -> i32 {
        match self {
            Self::Input(_) => exit::USAGE,
            Self::Failed(_) => exit::FAILED,
            Self::Busy(_) => exit::BUSY,
            Self::StillRunning => exit::STILL_RUNNING,
            Self::Interrupted => exit::INTERRUPTED,
            Self::Budget => exit::BUDGET,
            Self::ProviderStopped { refused: true } => exit::USAGE,
            Self::ProviderStopped { refused: false } => exit::BUSY,
            Self::Store(StoreError::Busy { .. }) => exit::BUSY,
            Self::Store(StoreError::TooManyTasks { .. }) => exit::USAGE,
            Self::Store(_) => exit::STORE,
            Self::Internal(_) => exit::INTERNAL,
            Self::Io(e) if e.kind() == std::io::ErrorKind::BrokenPipe => exit::OK,
            Self::Io(_) => exit::USAGE,
            Self::Write { .. } => exit::STORE,
        }
    }

    /// The message of a [`Error::Write`].
    pub(crate) fn write_message(path: &std::path::Path, source: &std::io::Error) -> String {
        format!("cannot write {}: {source}", path.display())
    }

    /// An impossible state in summon itself.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::Internal(message.into())
    }

    /// A single usage or input error.
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self::from(Diagnostic::error(message))
    }
}

impl From<Diagnostic> for Error {
    fn from(diagnostic: Diagnostic) -> Self {
        let mut diags = Diagnostics::default();
        diags.push(diagnostic);
        Self::Input(diags)
    }
}

impl From<Diagnostics> for Error {
    fn from(diags: Diagnostics) -> Self {
        Self::Input(diags)
    }
}

impl From<StoreError> for Error {
    fn from(error: StoreError) -> Self {
        Self::Store(error)
    }
}

impl From<std::io::Error> for Error {
    fn from(error: std::io::Error) -> Self {
        Self::Io(error)
    }
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;
