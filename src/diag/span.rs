//! Positions inside a source file.

use std::fmt;
use std::sync::Arc;

use super::SourceFile;

/// A position in a text: 1-based line and column (in characters), and a length in
/// characters (at least 1 when rendered).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pos {
    pub(crate) line: u32,
    pub(crate) col: u32,
    pub(crate) len: u32,
}

impl Pos {
    pub(crate) fn new(line: u32, col: u32, len: u32) -> Self {
        Self { line, col, len }
    }

    /// The same position moved down by `lines` lines (for text embedded after a header).
    pub(crate) fn shifted(self, lines: u32) -> Self {
        Self {
            line: self.line + lines,
            ..self
        }
    }
}

/// A position in a particular file.
#[derive(Debug, Clone)]
pub(crate) struct Span {
    pub(crate) file: Arc<SourceFile>,
    pub(crate) pos: Pos,
}

/// Two spans are equal when they point at the same place of the same file.
impl PartialEq for Span {
    fn eq(&self, other: &Self) -> bool {
        self.pos == other.pos && self.file.path == other.file.path
    }
}

impl Span {
    pub(crate) fn new(file: &Arc<SourceFile>, pos: Pos) -> Self {
        Self {
            file: Arc::clone(file),
            pos,
        }
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}",
            self.file.path.display(),
            self.pos.line,
            self.pos.col
        )
    }
}
