//! A file's path and text, shared by every span that points into it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A loaded source file. Spans keep an `Arc` to it so a diagnostic can show the line it
/// points at long after parsing finished.
#[derive(Debug)]
pub(crate) struct SourceFile {
    pub(crate) path: PathBuf,
    pub(crate) text: String,
}

impl SourceFile {
    pub(crate) fn new(path: impl Into<PathBuf>, text: impl Into<String>) -> Arc<Self> {
        Arc::new(Self {
            path: path.into(),
            text: text.into(),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The text of 1-based line `line`, without its line break.
    pub(crate) fn line_text(&self, line: u32) -> Option<&str> {
        let index = usize::try_from(line.checked_sub(1)?).ok()?;
        self.text
            .split('\n')
            .nth(index)
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
    }
}
