//! One problem found in an input, and the sink that collects them.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Pos, SourceFile, Span};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Severity {
    Error,
    Warning,
}

impl Severity {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warning => "warning",
        }
    }
}

/// An error or a warning, with the place it refers to when there is one.
#[derive(Debug, Clone)]
pub(crate) struct Diagnostic {
    pub(crate) severity: Severity,
    pub(crate) message: String,
    /// Where in a file, when the problem has a position.
    pub(crate) span: Option<Span>,
    /// The file concerned, when the problem has no position inside it.
    pub(crate) path: Option<PathBuf>,
    /// A hint shown on its own line after the source excerpt.
    pub(crate) hint: Option<String>,
}

impl Diagnostic {
    pub(crate) fn error(message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            message: message.into(),
            span: None,
            path: None,
            hint: None,
        }
    }

    pub(crate) fn warning(message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warning,
            ..Self::error(message)
        }
    }

    #[must_use]
    pub(crate) fn at(mut self, span: Span) -> Self {
        self.span = Some(span);
        self
    }

    #[must_use]
    pub(crate) fn in_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.path = Some(path.into());
        self
    }

    #[must_use]
    pub(crate) fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub(crate) fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// The file this diagnostic is about, if any.
    pub(crate) fn file_path(&self) -> Option<&std::path::Path> {
        self.span
            .as_ref()
            .map(|s| s.file.path())
            .or(self.path.as_deref())
    }
}

/// A list of diagnostics collected while working; only hard errors stop the work.
#[derive(Debug, Default)]
pub(crate) struct Diagnostics {
    pub(crate) items: Vec<Diagnostic>,
}

impl Diagnostics {
    pub(crate) fn push(&mut self, diagnostic: Diagnostic) {
        self.items.push(diagnostic);
    }

    pub(crate) fn extend(&mut self, other: Diagnostics) {
        self.items.extend(other.items);
    }

    pub(crate) fn has_errors(&self) -> bool {
        self.items.iter().any(Diagnostic::is_error)
    }

    pub(crate) fn error_count(&self) -> usize {
        self.items.iter().filter(|d| d.is_error()).count()
    }

    pub(crate) fn warning_count(&self) -> usize {
        self.items.len() - self.error_count()
    }

    /// A view that attaches every diagnostic to `file`.
    pub(crate) fn for_file<'a>(&'a mut self, file: &Arc<SourceFile>) -> FileDiags<'a> {
        FileDiags {
            file: Arc::clone(file),
            out: self,
        }
    }
}

/// Diagnostics about one file: each takes a position inside it.
pub(crate) struct FileDiags<'a> {
    pub(crate) file: Arc<SourceFile>,
    pub(crate) out: &'a mut Diagnostics,
}

impl FileDiags<'_> {
    pub(crate) fn span(&self, pos: Pos) -> Span {
        Span::new(&self.file, pos)
    }

    pub(crate) fn error(&mut self, pos: Pos, message: impl Into<String>) {
        let span = self.span(pos);
        self.out.push(Diagnostic::error(message).at(span));
    }

    pub(crate) fn warning(&mut self, pos: Pos, message: impl Into<String>) {
        let span = self.span(pos);
        self.out.push(Diagnostic::warning(message).at(span));
    }

    pub(crate) fn push(&mut self, diagnostic: Diagnostic) {
        self.out.push(diagnostic);
    }

    pub(crate) fn has_errors(&self) -> bool {
        self.out.has_errors()
    }
}
