//! What a stdio server wrote on stderr, kept for the message that says why it failed: its
//! last lines, and the first line that reads as an error. A crash's stack trace easily fills
//! the last lines, while the line that says what went wrong (node's `Error: Cannot find
//! module ...`) comes before it.

use std::collections::VecDeque;

/// Last lines kept.
const LINES: usize = 8;
/// The longest line kept, in bytes.
const LINE_LEN: usize = 300;

#[derive(Default)]
pub(crate) struct StderrTail {
    lines: VecDeque<String>,
    /// The first line that reads as an error, kept even once it left `lines`.
    first_error: Option<String>,
    /// The server closed its stderr (it exited): nothing more will come.
    closed: bool,
}

impl StderrTail {
    /// Adds one line (blank lines are skipped).
    pub(crate) fn push(&mut self, line: &str) {
        // Quoted in messages shown on a terminal: without the server's control sequences.
        let mut line = crate::text::printable(line).trim().to_owned();
        if line.is_empty() {
            return;
        }
        crate::text::truncate_at_boundary(&mut line, LINE_LEN);
        if self.first_error.is_none() && reads_as_error(&line) {
            self.first_error = Some(line.clone());
        }
        if self.lines.len() == LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }

    pub(crate) fn close(&mut self) {
        self.closed = true;
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    /// ` (stderr: first error | … | last lines)`, or nothing when the server wrote nothing.
    pub(crate) fn quote(&self) -> String {
        if self.lines.is_empty() {
            return String::new();
        }
        let mut parts: Vec<&str> = Vec::new();
        if let Some(first) = &self.first_error
            && !self.lines.contains(first)
        {
            parts.push(first);
            parts.push("…");
        }
        parts.extend(self.lines.iter().map(String::as_str));
        format!(" (stderr: {})", parts.join(" | "))
    }
}

/// Whether a line says what went wrong rather than where (a stack frame) or nothing much.
fn reads_as_error(line: &str) -> bool {
    let lower = line.to_lowercase();
    [
        "error",
        "exception",
        "fatal",
        "panicked",
        "cannot",
        "not found",
    ]
    .iter()
    .any(|word| lower.contains(word))
        && !lower.starts_with("at ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_error_line_survives_a_stack_trace() {
        let mut tail = StderrTail::default();
        for line in [
            "node:internal/modules/cjs/loader:1210",
            "  throw err;",
            "Error: Cannot find module 'x'",
        ] {
            tail.push(line);
        }
        for n in 0..12 {
            tail.push(&format!("    at frame{n} (node:internal:{n})"));
        }
        let quote = tail.quote();
        assert!(
            quote.starts_with(" (stderr: Error: Cannot find module 'x' | … | at frame4"),
            "{quote}"
        );
        assert!(quote.ends_with("at frame11 (node:internal:11))"), "{quote}");
    }

    #[test]
    fn short_output_is_quoted_whole() {
        let mut tail = StderrTail::default();
        assert_eq!(tail.quote(), "");
        tail.push("error: bad config");
        tail.push("");
        tail.push("bye");
        assert_eq!(tail.quote(), " (stderr: error: bad config | bye)");
    }
}
