//! Splits a Markdown file into its YAML frontmatter and its body, by lines.
//!
//! The frontmatter starts only at a first line that is `---` (a UTF-8 byte-order mark before
//! it, trailing spaces and a `\r` after it are allowed) and ends at the next line that is
//! `---` in the same sense. The text `---` anywhere else (horizontal rules, table rules in the
//! body) never splits anything.
//!
//! [`load`] then reads the YAML the way Claude Code does: strict first, and when that fails,
//! once more after double-quoting one-line values that strict YAML rejects (an unquoted
//! `: ` in a description is common in real files). Line numbers never change.

use std::fmt::Write as _;

use crate::yaml::{LoadError, Node, parse};

/// The two parts of a Markdown file with frontmatter, borrowed from its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frontmatter<'a> {
    /// The YAML between the two `---` lines, line breaks included.
    pub(crate) yaml: &'a str,
    /// The 1-based line of the file where `yaml` starts (always 2).
    pub(crate) yaml_line: u32,
    /// Everything after the closing `---` line.
    pub(crate) body: &'a str,
    /// The 1-based line of the file where `body` starts.
    pub(crate) body_line: u32,
}

/// Whether `line` (without its `\n`) is a frontmatter delimiter.
fn is_delimiter(line: &str) -> bool {
    line.trim_end_matches([' ', '\t', '\r']) == "---"
}

/// Splits `text` into frontmatter and body; `None` when the file has no opening or no
/// closing `---` line.
pub(crate) fn split(text: &str) -> Option<Frontmatter<'_>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let (first, rest) = match text.split_once('\n') {
        Some((first, rest)) => (first, rest),
        None => (text, ""),
    };
    if !is_delimiter(first) {
        return None;
    }
    let mut offset = 0usize;
    let mut line_no: u32 = 2;
    while offset < rest.len() {
        let line_end = rest[offset..].find('\n').map_or(rest.len(), |i| offset + i);
        let line = &rest[offset..line_end];
        if is_delimiter(line) {
            let body_start = (line_end + 1).min(rest.len());
            return Some(Frontmatter {
                yaml: &rest[..offset],
                yaml_line: 2,
                body: &rest[body_start..],
                body_line: line_no.saturating_add(1),
            });
        }
        offset = line_end + 1;
        line_no = line_no.saturating_add(1);
    }
    None
}

/// Parses frontmatter YAML; when strict YAML fails, retries once with the top-level one-line
/// plain values that hold `: ` or ` #` re-quoted. On failure the error is the retry's when
/// it points at a line the retry left as it was, otherwise the strict one.
pub(crate) fn load(yaml: &str) -> Result<Option<Node>, LoadError> {
    let strict_error = match parse(yaml) {
        Ok(root) => return Ok(root),
        Err(error) => error,
    };
    let Some((requoted, changed_lines)) = requote_values(yaml) else {
        return Err(strict_error);
    };
    parse(&requoted).map_err(|error| {
        if changed_lines.contains(&error.pos.line) {
            strict_error
        } else {
            error
        }
    })
}

/// Rewrites every top-level `key: value` line whose one-line plain value strict YAML would
/// reject or cut (`: `, a trailing `:`, ` #`) as `key: "value"`. Returns the new text and
/// the 1-based numbers of the changed lines, or `None` when no line qualifies.
fn requote_values(yaml: &str) -> Option<(String, Vec<u32>)> {
    let lines: Vec<&str> = yaml.split('\n').collect();
    let mut out = String::with_capacity(yaml.len() + 16);
    let mut changed = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        if index > 0 {
            out.push('\n');
        }
        let continues = lines[index + 1..]
            .iter()
            .map(|l| l.trim_end_matches('\r'))
            .find(|l| !l.trim().is_empty())
            .is_some_and(|l| l.starts_with([' ', '\t']));
        match requote_line(line) {
            Some(new_line) if !continues => {
                out.push_str(&new_line);
                changed.push(u32::try_from(index + 1).unwrap_or(u32::MAX));
            }
            _ => out.push_str(line),
        }
    }
    (!changed.is_empty()).then_some((out, changed))
}

/// `key: value` → `key: "value"` when the value needs it; `None` otherwise.
fn requote_line(line: &str) -> Option<String> {
    let (line, cr) = match line.strip_suffix('\r') {
        Some(l) => (l, "\r"),
        None => (line, ""),
    };
    let colon = line.find(':')?;
    let key = &line[..colon];
    let mut key_chars = key.chars();
    let key_ok = key_chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key_chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    let after = &line[colon + 1..];
    let value = after.trim_start_matches([' ', '\t']);
    if !key_ok || value.len() == after.len() {
        return None;
    }
    let value = value.trim_end_matches([' ', '\t']);
    let separator = &after[..after.len() - after.trim_start_matches([' ', '\t']).len()];
    // Only values that YAML reads as plain scalars: not quoted, block, flow, anchored, ...
    let indicator = value.starts_with([
        '"', '\'', '|', '>', '[', '{', '&', '*', '!', '#', '%', '@', '`', ',',
    ]) || ["- ", "? ", ": "]
        .iter()
        .any(|p| value.starts_with(p) || value == p.trim_end());
    let plain = !value.is_empty() && !indicator;
    let rejected = value.contains(": ")
        || value.contains(":\t")
        || value.ends_with(':')
        || value.contains(" #")
        || value.contains("\t#");
    if !plain || !rejected {
        return None;
    }
    let mut quoted = String::with_capacity(value.len() + 2);
    quoted.push('"');
    for c in value.chars() {
        match c {
            '\\' => quoted.push_str("\\\\"),
            '"' => quoted.push_str("\\\""),
            c if c.is_control() && c != '\t' => {
                let _ = write!(quoted, "\\u{:04X}", u32::from(c));
            }
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    Some(format!("{key}:{separator}{quoted}{cr}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (label, input, expected (yaml, body, body_line) or `None`)
    type SplitCase = (
        &'static str,
        &'static str,
        Option<(&'static str, &'static str, u32)>,
    );

    #[test]
    fn split_cases() {
        let cases: &[SplitCase] = &[
            (
                "simple",
                "---\nname: a\n---\nbody\n",
                Some(("name: a\n", "body\n", 4)),
            ),
            (
                "body with rules and tables",
                "---\nname: a\n---\nintro\n---\n| a | b |\n|---|---|\n---\n",
                Some(("name: a\n", "intro\n---\n| a | b |\n|---|---|\n---\n", 4)),
            ),
            ("no closing line", "---\nname: a\nbody\n", None),
            ("only an opening line", "---\n", None),
            ("only an opening line, no newline", "---", None),
            ("empty", "", None),
            (
                "--- not on the first line",
                "\n---\nname: a\n---\nbody\n",
                None,
            ),
            (
                "text before the opening line",
                "# Title\n---\nname: a\n---\n",
                None,
            ),
            (
                "CRLF",
                "---\r\nname: a\r\n---\r\nbody\r\n",
                Some(("name: a\r\n", "body\r\n", 4)),
            ),
            (
                "BOM",
                "\u{feff}---\nname: a\n---\nbody",
                Some(("name: a\n", "body", 4)),
            ),
            (
                "trailing spaces on the delimiters",
                "---  \nname: a\n--- \t\nbody",
                Some(("name: a\n", "body", 4)),
            ),
            (
                "closing line is the last, no newline",
                "---\nname: a\n---",
                Some(("name: a\n", "", 4)),
            ),
            ("empty frontmatter", "---\n---\nbody", Some(("", "body", 3))),
            ("---- is not a delimiter", "----\nname: a\n---\n", None),
            (
                "indented --- does not close",
                "---\nname: a\n  ---\n---\nx",
                Some(("name: a\n  ---\n", "x", 5)),
            ),
            (
                "--- inside a value does not close",
                "---\nname: a --- b\n---\nx",
                Some(("name: a --- b\n", "x", 4)),
            ),
        ];
        for (label, input, expected) in cases {
            let got = split(input).map(|f| (f.yaml, f.body, f.body_line));
            assert_eq!(got, *expected, "case: {label}");
            if let Some(f) = split(input) {
                assert_eq!(f.yaml_line, 2, "case: {label}");
            }
        }
    }

    #[test]
    fn never_panics_on_prefixes() {
        let text = "\u{feff}---\r\nname: é\r\n---\r\nbody ü\n---\n";
        for (i, _) in text.char_indices() {
            let _ = split(&text[..i]);
        }
    }

    #[test]
    fn requote_line_cases() {
        let cases: &[(&str, Option<&str>)] = &[
            ("description: a: b", Some("description: \"a: b\"")),
            (
                "description: ends with:",
                Some("description: \"ends with:\""),
            ),
            ("description: a #b", Some("description: \"a #b\"")),
            ("description:\ta: b  ", Some("description:\t\"a: b\"")),
            ("description: a: b\r", Some("description: \"a: b\"\r")),
            (
                "description: a: \\n \"q\"",
                Some("description: \"a: \\\\n \\\"q\\\"\""),
            ),
            (
                "description: a:\u{1} b: c",
                Some("description: \"a:\\u0001 b: c\""),
            ),
            ("permission-mode: x: y", Some("permission-mode: \"x: y\"")),
            ("description: plain text", None),
            ("description: \"a: b\"", None),
            ("description: 'a: b'", None),
            ("description: |", None),
            ("description: >-", None),
            ("description: [a: b]", None),
            ("description: - a: b", None),
            ("description:", None),
            ("  nested: a: b", None),
            ("- item: a: b", None),
            ("key:value: x", None),
            ("# comment: x", None),
            ("\"quoted key\": a: b", None),
        ];
        for (line, expected) in cases {
            assert_eq!(requote_line(line).as_deref(), *expected, "line {line:?}");
        }
    }

    #[test]
    fn load_strict_then_recovered() {
        let doc = load("name: a\ndescription: x: y\ntools: Read\n")
            .unwrap()
            .unwrap();
        assert_eq!(doc.get("description").unwrap().as_str(), Some("x: y"));
        assert_eq!(doc.get("tools").unwrap().pos.line, 3);

        // Valid YAML is read as it is: a comment stays a comment.
        let doc = load("name: a # the name\n").unwrap().unwrap();
        assert_eq!(doc.get("name").unwrap().as_str(), Some("a"));

        // Nothing to re-quote: the strict error.
        let error = load("name: a\ntools: [Read\n").unwrap_err();
        assert!(error.pos.line >= 2);

        // Re-quoting helps one line but another is broken: the remaining error.
        let error = load("name: a\ndescription: x: y\ntools: [Read\nmodel: m\n").unwrap_err();
        assert!(error.pos.line >= 3, "{error:?}");
    }
}
