//! Diagnostics: positions in source files, errors and warnings, their rendering, and the
//! did-you-mean names a hint offers.

mod diagnostic;
pub(crate) mod render;
mod source_file;
mod span;
mod suggest;

pub(crate) use diagnostic::Severity;
pub(crate) use diagnostic::{Diagnostic, Diagnostics, FileDiags};
pub(crate) use render::render_all;
pub(crate) use source_file::SourceFile;
pub(crate) use span::{Pos, Span};
pub(crate) use suggest::suggestions;
