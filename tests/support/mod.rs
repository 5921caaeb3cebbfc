//! Shared test helpers: the [`Test`] builder that runs the real binary in a temp project.

#![allow(dead_code, unreachable_pub, unused_imports)]

pub mod mcp;
pub mod test;

pub use test::{Output, Test};

/// Removes common leading indentation, so inputs and expectations can be written indented.
pub fn unindent(text: &str) -> String {
    let lines: Vec<&str> = text.strip_prefix('\n').unwrap_or(text).lines().collect();
    let indent = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let mut out: String = lines
        .iter()
        .map(|l| {
            if l.len() >= indent {
                &l[indent..]
            } else {
                l.trim_start()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    out.push('\n');
    out
}

/// [`unindent`] for expected output: exactly one trailing newline, whatever the indentation
/// of the closing quote.
pub fn expected(text: &str) -> String {
    let mut out = unindent(text).trim_end_matches('\n').to_owned();
    out.push('\n');
    out
}

/// The directory of real third-party files, when present next to the checkout.
pub fn corpus_dir() -> Option<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
    dir.is_dir().then_some(dir)
}
