//! The top-level error: what went wrong, how it is shown, and the exit code it means.

use crate::diag::{Diagnostic, Diagnostics};

/// Exit codes, in one place (documented in the README).
pub(crate) mod exit {
    pub(crate) const OK: i32 = 0;
    /// Usage, configuration or validation error.
    pub(crate) const USAGE: i32 = 1;
    /// The task or a pipeline step failed.
    pub(crate) const FAILED: i32 = 2;
    /// Another run of the same pipeline is live (as sysexits' EX_TEMPFAIL: try again later).
    pub(crate) const BUSY: i32 = 75;
    /// `summon load ID` stopped waiting while the task still runs (as timeout(1) exits).
    pub(crate) const STILL_RUNNING: i32 = 124;
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
    /// An I/O problem writing output; a closed pipe is not an error.
    Io(std::io::Error),
}

impl Error {
    pub(crate) fn exit_code(&self) -> i32 {
        match self {
            Self::Input(_) => exit::USAGE,
            Self::Failed(_) => exit::FAILED,
            Self::Busy(_) => exit::BUSY,
            Self::StillRunning => exit::STILL_RUNNING,
            Self::Interrupted => exit::INTERRUPTED,
            Self::Io(e) if e.kind() == std::io::ErrorKind::BrokenPipe => exit::OK,
            Self::Io(_) => exit::USAGE,
        }
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

impl From<std::io::Error> for Error {
    fn from(error: std::io::Error) -> Self {
        Self::Io(error)
    }
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;
