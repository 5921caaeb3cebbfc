//! Diagnostics: positions in source files, errors and warnings, and their rendering.

mod diagnostic;
pub(crate) mod render;
mod source_file;
mod span;

pub(crate) use diagnostic::{Diagnostic, Diagnostics, FileDiags, Severity};
pub(crate) use render::{render, render_all};
pub(crate) use source_file::SourceFile;
pub(crate) use span::{Pos, Span};
