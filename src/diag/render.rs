//! Renders diagnostics the way a compiler does:
//!
//! ```text
//! recipes/a.yaml:3:17: error: unknown input type `nubmer`
//!    |
//!  3 |     input_type: nubmer
//!    |                 ^^^^^^
//!    = hint: use one of string, number, boolean, date, file, select
//! ```

use std::fmt::Write as _;
use std::path::Path;

use super::Diagnostic;
use crate::color::Palette;

/// Renders one diagnostic; paths are shown relative to `cwd` when they are inside it.
pub(crate) fn render(diagnostic: &Diagnostic, cwd: &Path, palette: Palette) -> String {
    let out = render_as_is(diagnostic, cwd, palette);
    crate::text::without_url_credentials(&out).into_owned()
}

fn render_as_is(diagnostic: &Diagnostic, cwd: &Path, palette: Palette) -> String {
    let mut out = String::new();
    let severity = diagnostic.severity.as_str();
    let severity = if diagnostic.is_error() {
        palette.error(severity)
    } else {
        palette.warning(severity)
    };
    let message = palette.bold(&diagnostic.message);
    match &diagnostic.span {
        Some(span) => {
            let path = display_path(span.file.path(), cwd);
            let _ = writeln!(
                out,
                "{path}:{}:{}: {severity}: {message}",
                span.pos.line, span.pos.col
            );
            if let Some(full_line) = span.file.line_text(span.pos.line) {
                let number = span.pos.line.to_string();
                let gutter = " ".repeat(number.len());
                let pipe = palette.dim("|");
                let col = usize::try_from(span.pos.col.max(1) - 1).unwrap_or(0);
                let (line, col) = window(full_line.trim_end(), col);
                let line = line.as_str();
                let _ = writeln!(out, "{gutter} {pipe}");
                let _ = writeln!(out, "{} {pipe} {}", palette.dim(&number), line);
                let prefix: String = line
                    .chars()
                    .take(col)
                    .map(|c| if c == '\t' { '\t' } else { ' ' })
                    .collect();
                let available = line.chars().count().saturating_sub(col).max(1);
                let len = usize::try_from(span.pos.len)
                    .unwrap_or(1)
                    .clamp(1, available);
                let carets = "^".repeat(len);
                let _ = writeln!(out, "{gutter} {pipe} {prefix}{}", palette.caret(&carets));
            }
            if let Some(hint) = &diagnostic.hint {
                let _ = writeln!(
                    out,
                    "{gutter} = hint: {hint}",
                    gutter = " ".repeat(span.pos.line.to_string().len())
                );
            }
        }
        None => {
            match &diagnostic.path {
                Some(path) => {
                    let _ = writeln!(out, "{}: {severity}: {message}", display_path(path, cwd));
                }
                // Not about a file: the program speaks, as in every other message of summon.
                None => {
                    let _ = writeln!(out, "summon: {severity}: {message}");
                }
            }
            if let Some(hint) = &diagnostic.hint {
                let _ = writeln!(out, "  = hint: {hint}");
            }
        }
    }
    out
}

/// Long lines are cut to a window around the column, marked with `...`; returns the shown
/// text and the column inside it.
fn window(line: &str, col: usize) -> (String, usize) {
    const WIDTH: usize = 100;
    let count = line.chars().count();
    if count <= WIDTH + 20 {
        return (line.to_owned(), col);
    }
    // A column past the end of the line (an error at its end) still shows its last part.
    let start = col
        .saturating_sub(WIDTH / 3)
        .min(count.saturating_sub(WIDTH));
    let end = (start + WIDTH).min(count);
    let mut shown: String = line.chars().skip(start).take(end - start).collect();
    let mut col = col - start;
    if start > 0 {
        shown.insert_str(0, "...");
        col += 3;
    }
    if end < count {
        shown.push_str("...");
    }
    (shown, col)
}

/// Renders every diagnostic, errors and warnings in the order they were found.
pub(crate) fn render_all(diagnostics: &[Diagnostic], cwd: &Path, palette: Palette) -> String {
    diagnostics
        .iter()
        .map(|d| render(d, cwd, palette))
        .collect::<Vec<_>>()
        .join("")
}

/// `path` relative to `cwd` when it lies inside it, else as given.
pub(crate) fn display_path(path: &Path, cwd: &Path) -> String {
    path.strip_prefix(cwd).unwrap_or(path).display().to_string()
}

#[cfg(test)]
mod tests {
    use super::window;

    #[test]
    fn long_lines_are_windowed_around_the_column() {
        let line = "x".repeat(300);
        let (shown, col) = window(&line, 150);
        assert!(
            shown.starts_with("...") && shown.ends_with("..."),
            "{shown}"
        );
        assert_eq!(&shown[col..col + 1], "x");
        // A column past the end of the line shows the end of the line.
        for col in [300, 301, 5000] {
            let (shown, at) = window(&line, col);
            assert!(
                shown.starts_with("...") && !shown.ends_with("..."),
                "{shown}"
            );
            assert!(at >= shown.len() - 1, "{at}");
        }
    }
}
