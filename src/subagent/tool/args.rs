//! Reading a tool's arguments as the model sent them.
//!
//! The arguments arrive as a JSON object, or as a `Value::String` when the provider layer could
//! not parse the model's argument text (the text is tried once more here, since some models send
//! a JSON-encoded string). Numbers and booleans sent as strings (`"10"`, `"true"`) are accepted;
//! anything else of the wrong shape is a [`ToolError::Arguments`] that repeats what the tool
//! expects.

use serde_json::{Map, Value};

use super::ToolError;

/// The arguments of one call to `tool`.
pub(crate) struct Args {
    tool: &'static str,
    expected: &'static str,
    map: Map<String, Value>,
}

impl Args {
    /// Reads `value` as an argument object; `expected` describes the arguments for the model.
    pub(crate) fn parse(
        tool: &'static str,
        expected: &'static str,
        value: &Value,
    ) -> Result<Self, ToolError> {
        let error = |reason: String| ToolError::Arguments {
            tool,
            reason,
            expected,
        };
        let map = match value {
            Value::Object(map) => map.clone(),
            Value::Null => Map::new(),
            Value::String(text) if text.trim().is_empty() => Map::new(),
            Value::String(text) => match serde_json::from_str::<Value>(text) {
                Ok(Value::Object(map)) => map,
                Ok(other) => {
                    return Err(error(format!(
                        "the arguments must be a JSON object, got {}",
                        kind(&other)
                    )));
                }
                Err(e) => {
                    return Err(error(format!("the arguments are not valid JSON ({e})")));
                }
            },
            other => {
                return Err(error(format!(
                    "the arguments must be a JSON object, got {}",
                    kind(other)
                )));
            }
        };
        Ok(Self {
            tool,
            expected,
            map,
        })
    }

    fn error(&self, reason: String) -> ToolError {
        ToolError::Arguments {
            tool: self.tool,
            reason,
            expected: self.expected,
        }
    }

    fn wrong_type(&self, field: &str, want: &str, got: &Value) -> ToolError {
        self.error(format!("`{field}` must be {want}, got {}", kind(got)))
    }

    /// A field that is absent or `null` counts as not given.
    fn get(&self, field: &str) -> Option<&Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    pub(crate) fn str(&self, field: &str) -> Result<&str, ToolError> {
        self.opt_str(field)?
            .ok_or_else(|| self.error(format!("missing required field `{field}`")))
    }

    pub(crate) fn opt_str(&self, field: &str) -> Result<Option<&str>, ToolError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.wrong_type(field, "a string", other)),
        }
    }

    pub(crate) fn opt_u64(&self, field: &str) -> Result<Option<u64>, ToolError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_u64()
                .or_else(|| {
                    n.as_f64()
                        .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                        .map(|f| f as u64)
                })
                .map(Some)
                .ok_or_else(|| self.error(format!("`{field}` must be a non-negative integer"))),
            Some(Value::String(s)) => s
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| self.error(format!("`{field}` must be a non-negative integer"))),
            Some(other) => Err(self.wrong_type(field, "a non-negative integer", other)),
        }
    }

    pub(crate) fn opt_bool(&self, field: &str) -> Result<Option<bool>, ToolError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(Value::String(s)) if s == "true" => Ok(Some(true)),
            Some(Value::String(s)) if s == "false" => Ok(Some(false)),
            Some(other) => Err(self.wrong_type(field, "true or false", other)),
        }
    }
}

/// What kind of JSON value `value` is, for messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const EXPECTED: &str = "{path: string, limit?: integer}";

    fn parse(value: Value) -> Result<Args, ToolError> {
        Args::parse("read_file", EXPECTED, &value)
    }

    fn message<T>(result: Result<T, ToolError>) -> String {
        match result {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn object_and_json_text() {
        let args = parse(json!({"path": "a", "limit": 3})).unwrap();
        assert_eq!(args.str("path").unwrap(), "a");
        assert_eq!(args.opt_u64("limit").unwrap(), Some(3));
        let args = parse(json!("{\"path\": \"b\", \"limit\": \"4\"}")).unwrap();
        assert_eq!(args.str("path").unwrap(), "b");
        assert_eq!(args.opt_u64("limit").unwrap(), Some(4));
        let args = parse(Value::Null).unwrap();
        assert_eq!(args.opt_str("path").unwrap(), None);
        let args = parse(json!({"path": "a", "x": null, "b": "true"})).unwrap();
        assert_eq!(args.opt_u64("x").unwrap(), None);
        assert_eq!(args.opt_bool("b").unwrap(), Some(true));
    }

    #[test]
    fn malformed_arguments_explain_the_shape() {
        for (value, reason) in [
            (json!("{\"path\": "), "not valid JSON"),
            (json!("[1]"), "must be a JSON object, got an array"),
            (json!([1]), "must be a JSON object, got an array"),
            (json!(7), "must be a JSON object, got a number"),
        ] {
            let text = message(parse(value));
            assert!(text.contains(reason), "{text}");
            assert!(text.contains("invalid arguments for `read_file`"), "{text}");
            assert!(text.ends_with(EXPECTED), "{text}");
        }
        let args = parse(json!({"path": 3, "limit": -1, "b": "yes"})).unwrap();
        assert!(message(args.str("path")).contains("`path` must be a string, got a number"));
        assert!(message(args.opt_u64("limit")).contains("non-negative integer"));
        assert!(message(args.opt_bool("b")).contains("`b` must be true or false"));
        assert!(message(args.str("missing")).contains("missing required field `missing`"));
    }
}
