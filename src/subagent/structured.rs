//! Structured output: the final answer must be JSON that validates against the recipe's
//! `response.json_schema`.

use super::extract::{Found, find_json};

/// A valid answer, and whether it had to be taken out of surrounding text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Checked {
    pub(crate) value: serde_json::Value,
    pub(crate) extracted: bool,
}

/// Finds the answer's JSON (bare, in a fenced block, or the single value in the text), takes
/// it out of the object it was asked in when `schema`'s root is not an object, and validates
/// it against `validator` (of `schema`). Returns the value, or the errors to send back to the
/// model.
pub(crate) fn check_answer(
    validator: &jsonschema::Validator,
    schema: &serde_json::Value,
    answer: &str,
) -> Result<Checked, String> {
    let (value, extracted) = match find_json(answer) {
        Found::Bare(value) => (value, false),
        Found::Extracted(value) => (value, true),
        Found::Several(n) => {
            return Err(format!(
                "the answer holds {n} different JSON values; reply with exactly one"
            ));
        }
        Found::Nothing(error) => return Err(format!("the answer is not valid JSON: {error}")),
    };
    let value = crate::provider::unwrap_answer(schema, value);
    let errors = schema_errors(validator, &value);
    if errors.is_empty() {
        Ok(Checked { value, extracted })
    } else {
        Err(errors.join("\n"))
    }
}

/// How much of the last answer a schema failure quotes.
const QUOTED_ANSWER: usize = 300;

/// The error of a task whose answers never matched the schema: the last answer quoted (cut),
/// then what was wrong with each answer, the first one and every correction's, in order.
pub(crate) fn schema_failure(errors_per_answer: &[String], last_answer: &str) -> String {
    let corrections = errors_per_answer.len().saturating_sub(1);
    let mut quoted = last_answer.trim().to_owned();
    let left = quoted.len();
    let quoted = if quoted.is_empty() {
        "an empty answer".to_owned()
    } else if crate::text::truncate_at_boundary(&mut quoted, QUOTED_ANSWER) {
        format!(
            "{} … ({} more bytes)",
            serde_json::Value::String(quoted.clone()),
            left - quoted.len()
        )
    } else {
        serde_json::Value::String(quoted).to_string()
    };
    let mut message = format!(
        "the answer does not match the response schema after {corrections} correction(s); the last answer: {quoted}"
    );
    for (index, errors) in errors_per_answer.iter().enumerate() {
        let which = if index == 0 {
            "answer".to_owned()
        } else {
            format!("correction {index}")
        };
        message.push_str(&format!("\n{which}: {}", errors.replace('\n', "; ")));
    }
    message
}

/// Up to 20 validation errors, each naming where in the value it is.
fn schema_errors(validator: &jsonschema::Validator, value: &serde_json::Value) -> Vec<String> {
    validator
        .iter_errors(value)
        .take(20)
        .map(|e| {
            let at = e.instance_path().to_string();
            if at.is_empty() {
                e.to_string()
            } else {
                format!("at {at}: {e}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_and_explains() {
        let schema = serde_json::json!({"type": "object", "required": ["score"], "properties": {"score": {"type": "integer"}}});
        let validator = jsonschema::validator_for(&schema).unwrap();
        let check_answer = |answer: &str| check_answer(&validator, &schema, answer);
        let bare = check_answer("{\"score\": 3}").unwrap();
        assert_eq!(
            (bare.value["score"].as_i64(), bare.extracted),
            (Some(3), false)
        );
        let fenced = check_answer("```json\n{\"score\": 4}\n```").unwrap();
        assert_eq!(
            (fenced.value["score"].as_i64(), fenced.extracted),
            (Some(4), true)
        );
        assert!(
            check_answer("{\"score\": \"x\"}")
                .unwrap_err()
                .contains("/score")
        );
        assert!(check_answer("nope").unwrap_err().contains("not valid JSON"));
        assert!(
            check_answer("{\"score\": 1} {\"score\": 2}")
                .unwrap_err()
                .contains("2 different JSON values")
        );
    }

    #[test]
    fn an_array_is_taken_wrapped_or_bare() {
        let schema = serde_json::json!({"type": "array", "items": {"type": "string"}});
        let validator = jsonschema::validator_for(&schema).unwrap();
        let want = serde_json::json!(["a", "b"]);
        for answer in [
            "{\"items\": [\"a\", \"b\"]}",
            "[\"a\", \"b\"]",
            "Here:\n```json\n{\"items\": [\"a\", \"b\"]}\n```",
        ] {
            assert_eq!(
                check_answer(&validator, &schema, answer).unwrap().value,
                want,
                "{answer}"
            );
        }
        assert!(
            check_answer(&validator, &schema, "{\"items\": [1]}")
                .unwrap_err()
                .contains("/0")
        );
    }
}
