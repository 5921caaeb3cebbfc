//! A small YAML writer for showing values to people (`summon render`). Multi-line strings
//! become literal blocks; anything a YAML reader could mistype is quoted.

use serde_json::Value;

/// `value` as a YAML document.
pub(crate) fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value, 0);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

fn write_value(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, item) in map {
                if !out.ends_with('\n') && !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(&" ".repeat(indent));
                out.push_str(&scalar(key));
                out.push(':');
                write_child(out, item, indent);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for item in items {
                if !out.ends_with('\n') && !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(&" ".repeat(indent));
                out.push('-');
                match item {
                    Value::Object(map) if !map.is_empty() => {
                        // First key on the dash's line.
                        let mut inner = String::new();
                        write_value(&mut inner, item, indent + 2);
                        out.push(' ');
                        out.push_str(inner.trim_start());
                    }
                    _ => write_child(out, item, indent),
                }
            }
        }
        other => out.push_str(&inline(other)),
    }
}

fn write_child(out: &mut String, item: &Value, indent: usize) {
    match item {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            write_value(out, item, indent + 2);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            write_value(out, item, indent + 2);
        }
        // A literal block keeps the text as it is, except characters a block cannot carry
        // (carriage returns and other controls, which are quoted instead).
        Value::String(s)
            if s.contains('\n') && !s.chars().any(|c| c.is_control() && c != '\n' && c != '\t') =>
        {
            let chomp = if s.ends_with('\n') { "" } else { "-" };
            let keep = if s.ends_with("\n\n") { "+" } else { chomp };
            let lead = if s.starts_with([' ', '\n']) { "2" } else { "" };
            out.push_str(&format!(" |{lead}{keep}\n"));
            let pad = " ".repeat(indent + 2);
            let body = s.trim_end_matches('\n');
            for line in body.split('\n') {
                if !line.is_empty() {
                    out.push_str(&pad);
                    out.push_str(line);
                }
                out.push('\n');
            }
            // `|+` keeps every trailing line break: the ones after the first are empty lines.
            let trailing = s.len() - body.len();
            for _ in 1..trailing {
                out.push('\n');
            }
        }
        other => {
            out.push(' ');
            out.push_str(&inline(other));
        }
    }
}

fn inline(value: &Value) -> String {
    match value {
        Value::String(s) => scalar(s),
        Value::Object(_) => "{}".into(),
        Value::Array(_) => "[]".into(),
        other => other.to_string(),
    }
}

/// A single-line string: plain when that reads back as the same string, else quoted.
fn scalar(s: &str) -> String {
    let safe_chars = s
        .chars()
        .all(|c| c.is_alphanumeric() || " _-./()@+,;=".contains(c));
    let reserved = matches!(
        s.to_ascii_lowercase().as_str(),
        "" | "~" | "null" | "true" | "false" | "yes" | "no" | "on" | "off"
    );
    let numeric = s.parse::<f64>().is_ok();
    let edges = s.starts_with([' ', '-', '?', '@']) || s.ends_with(' ');
    if safe_chars && !reserved && !numeric && !edges {
        s.to_owned()
    } else {
        serde_json::to_string(s).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_back_as_the_same_value() {
        let value = json!({
            "title": "Release notes",
            "n": "5",
            "instructions": "line one\n  indented: yes\n{{ x }}\n",
            "prompt": "no newline\nat end",
            "settings": {"model": "gpt-4o", "temperature": 0.2},
            "list": ["a", "true", {"k": "v", "w": 1}],
            "empty": {}
        });
        let text = to_yaml(&value);
        let back = crate::yaml::parse(&text).unwrap().unwrap().to_json();
        assert_eq!(back, value, "{text}");
    }
}
