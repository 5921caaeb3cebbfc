//! Lenient extraction of a JSON answer from text: chat models often wrap the JSON they were
//! asked for in a sentence or a fenced block. Taking it from there saves a correction request
//! (a paid round trip) for an answer that was right the first time.

use serde_json::Value;

/// The most candidates looked at in one answer; past that the answer is ambiguous anyway.
const MAX_CANDIDATES: usize = 16;

/// Where the JSON of an answer came from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Found {
    /// The whole answer is one JSON value.
    Bare(Value),
    /// One value taken from a fenced block or from the text around it.
    Extracted(Value),
    /// Several different values: which one is meant is the model's to say.
    Several(usize),
    /// No JSON value at all; the parse error of the whole text.
    Nothing(String),
}

/// Finds the answer's JSON: the whole text, else the single fenced `json` (or untagged) block,
/// else the single top-level object or array in the text. Equal values count once.
pub(crate) fn find_json(answer: &str) -> Found {
    let text = answer.trim();
    let error = match serde_json::from_str::<Value>(text) {
        Ok(value) => return Found::Bare(value),
        Err(e) => e.to_string(),
    };
    let mut candidates = fenced_values(text);
    if candidates.is_empty() {
        candidates = embedded_values(text);
    }
    match candidates.len() {
        0 => Found::Nothing(error),
        1 => Found::Extracted(candidates.remove(0)),
        n => Found::Several(n),
    }
}

/// The distinct JSON values of the fenced blocks tagged `json` or untagged.
fn fenced_values(text: &str) -> Vec<Value> {
    let mut values = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(tag) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let tag = tag.trim();
        let mut body = String::new();
        for inner in lines.by_ref() {
            if inner.trim_start().starts_with("```") {
                break;
            }
            body.push_str(inner);
            body.push('\n');
        }
        if !(tag.is_empty() || tag.eq_ignore_ascii_case("json")) {
            continue;
        }
        if let Ok(value) = serde_json::from_str::<Value>(body.trim()) {
            push_distinct(&mut values, value);
        }
    }
    values
}

/// The distinct top-level objects and arrays in prose, left to right.
fn embedded_values(text: &str) -> Vec<Value> {
    let mut values = Vec::new();
    let mut at = 0;
    while at < text.len() && values.len() < MAX_CANDIDATES {
        let Some(offset) = text[at..].find(['{', '[']) else {
            break;
        };
        let start = at + offset;
        let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
        match stream.next() {
            Some(Ok(value)) => {
                push_distinct(&mut values, value);
                at = start + stream.byte_offset();
            }
            _ => at = start + 1,
        }
    }
    values
}

fn push_distinct(values: &mut Vec<Value>, value: Value) {
    if !values.contains(&value) {
        values.push(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bare_fenced_embedded_and_ambiguous() {
        assert_eq!(find_json(" [1, 2] "), Found::Bare(json!([1, 2])));
        assert_eq!(find_json("7"), Found::Bare(json!(7)));
        assert_eq!(
            find_json("Here you go:\n```json\n[\"a\"]\n```\nDone."),
            Found::Extracted(json!(["a"]))
        );
        assert_eq!(
            find_json("```\n{\"k\": 1}\n```"),
            Found::Extracted(json!({"k": 1}))
        );
        assert_eq!(
            find_json("Verdict: {\"k\": [1, {\"x\": \"}\"}]} ok"),
            Found::Extracted(json!({"k": [1, {"x": "}"}]}))
        );
        assert_eq!(find_json("{\"a\": 1} and {\"a\": 2}"), Found::Several(2));
        assert_eq!(
            find_json("{\"a\": 1} and again {\"a\": 1}"),
            Found::Extracted(json!({"a": 1}))
        );
        // A fenced block wins over values in the prose around it.
        assert_eq!(
            find_json("Like [1] but:\n```json\n[2]\n```"),
            Found::Extracted(json!([2]))
        );
        assert!(matches!(find_json("no json here"), Found::Nothing(_)));
        assert!(matches!(find_json("broken {\"a\": "), Found::Nothing(_)));
    }
}
