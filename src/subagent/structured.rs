//! Structured output: the final answer must be JSON that validates against the recipe's
//! `response.json_schema`.

/// Parses the answer (a bare JSON value, or one inside a ``` fence) and validates it.
/// Returns the value, or the errors to send back to the model.
pub(crate) fn check_answer(
    validator: &jsonschema::Validator,
    answer: &str,
) -> Result<serde_json::Value, String> {
    let text = strip_fence(answer.trim());
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("the answer is not valid JSON: {e}"))?;
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .take(20)
        .map(|e| {
            let at = e.instance_path().to_string();
            if at.is_empty() {
                e.to_string()
            } else {
                format!("at {at}: {e}")
            }
        })
        .collect();
    if errors.is_empty() {
        Ok(value)
    } else {
        Err(errors.join("\n"))
    }
}

fn strip_fence(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else {
        return text;
    };
    let rest = rest.split_once('\n').map_or("", |(_, body)| body);
    rest.trim_end().strip_suffix("```").unwrap_or(rest).trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_and_explains() {
        let schema = serde_json::json!({"type": "object", "required": ["score"], "properties": {"score": {"type": "integer"}}});
        let validator = jsonschema::validator_for(&schema).unwrap();
        assert_eq!(
            check_answer(&validator, "{\"score\": 3}").unwrap()["score"],
            3
        );
        assert_eq!(
            check_answer(&validator, "```json\n{\"score\": 4}\n```").unwrap()["score"],
            4
        );
        assert!(
            check_answer(&validator, "{\"score\": \"x\"}")
                .unwrap_err()
                .contains("/score")
        );
        assert!(
            check_answer(&validator, "nope")
                .unwrap_err()
                .contains("not valid JSON")
        );
    }
}
