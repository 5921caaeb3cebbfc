//! YAML scalars for text the user gave: written plain when that is safe, else quoted, so no
//! value can change the structure of the file.

/// Words YAML 1.1 or 1.2 reads as something other than a string.
const SPECIAL: &[&str] = &[
    "true", "false", "yes", "no", "on", "off", "y", "n", "null", "~", ".nan", ".inf", "-.inf",
];

/// `text` as a one-line YAML value: plain when it reads back as the same string, else
/// double-quoted (JSON escapes are valid YAML).
pub(crate) fn scalar(text: &str) -> String {
    if plain_is_safe(text) {
        text.to_owned()
    } else {
        serde_json::to_string(text).unwrap_or_else(|_| "\"\"".to_owned())
    }
}

fn plain_is_safe(text: &str) -> bool {
    let Some(first) = text.chars().next() else {
        return false;
    };
    if text.trim() != text || text.chars().any(char::is_control) {
        return false;
    }
    if "-?:,[]{}#&*!|>'\"%@`".contains(first) {
        return false;
    }
    if text.contains(": ") || text.contains(" #") || text.ends_with(':') {
        return false;
    }
    if SPECIAL.contains(&text.to_ascii_lowercase().as_str()) {
        return false;
    }
    // Numbers, dates and times would not read back as text.
    !text.starts_with(|c: char| c.is_ascii_digit() || c == '.' || c == '+')
}

/// `key: value` for a text that may span lines: a literal block (`|`) indented by `indent`
/// spaces beyond the key's `key_indent`, when the text allows it, else a quoted scalar.
pub(crate) fn field(key_indent: usize, key: &str, text: &str) -> String {
    let pad = " ".repeat(key_indent);
    let body = text.trim_end_matches('\n');
    let block_ok = body.contains('\n')
        && !body.starts_with([' ', '\t'])
        && !body
            .chars()
            .any(|c| c.is_control() && c != '\n' && c != '\t')
        && !body.lines().any(|l| l.trim().is_empty() && !l.is_empty());
    if !block_ok {
        return format!("{pad}{key}: {}\n", scalar(body));
    }
    let inner = " ".repeat(key_indent + 2);
    let mut out = format!("{pad}{key}: |\n");
    for line in body.lines() {
        if line.is_empty() {
            out.push('\n');
        } else {
            out.push_str(&inner);
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_when_safe_quoted_otherwise() {
        let cases = [
            ("Review code", "Review code"),
            ("a, b", "a, b"),
            ("v1.0.0", "v1.0.0"),
            ("read_file, search", "read_file, search"),
            ("", "\"\""),
            ("yes", "\"yes\""),
            ("Null", "\"Null\""),
            ("42", "\"42\""),
            ("1e3", "\"1e3\""),
            ("2026-01-02", "\"2026-01-02\""),
            ("12:30", "\"12:30\""),
            ("key: value", "\"key: value\""),
            ("a #b", "\"a #b\""),
            ("- x", "\"- x\""),
            ("{{ x }}", "\"{{ x }}\""),
            ("*alias", "\"*alias\""),
            (" lead", "\" lead\""),
            ("say \"hi\"", "say \"hi\""),
            ("'q", "\"'q\""),
            ("tab\there", "\"tab\\there\""),
        ];
        for (text, expected) in cases {
            assert_eq!(scalar(text), expected, "{text:?}");
        }
    }

    #[test]
    fn multi_line_text_becomes_a_block() {
        assert_eq!(
            field(0, "prompt", "line one\n\n  indented: yes\n"),
            "prompt: |\n  line one\n\n    indented: yes\n"
        );
        assert_eq!(field(4, "x", "one line"), "    x: one line\n");
        assert_eq!(
            field(0, "x", "  starts indented\nb"),
            "x: \"  starts indented\\nb\"\n"
        );
    }
}
