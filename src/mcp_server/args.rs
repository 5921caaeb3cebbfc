//! A tool call's arguments read by hand, so every error names the key: an unknown key, a
//! missing one, a value of the wrong type (serde's own messages often name neither).

use serde_json::{Map, Value};

pub(super) type Object = Map<String, Value>;

/// The arguments of one call of `tool`.
pub(super) struct Args<'a> {
    tool: &'static str,
    map: &'a Object,
}

impl<'a> Args<'a> {
    /// Refuses any key not in `allowed`.
    pub(super) fn new(
        tool: &'static str,
        map: &'a Object,
        allowed: &[&str],
    ) -> Result<Self, String> {
        if let Some(key) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(format!(
                "{tool}: unknown argument `{}`; the arguments are: {}",
                crate::text::printable(key),
                allowed.join(", ")
            ));
        }
        Ok(Self { tool, map })
    }

    /// The value of `key`; `null` counts as absent.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn wrong(&self, key: &str, expected: &str, found: &Value) -> String {
        format!(
            "{}: argument `{key}` must be {expected}, found {}",
            self.tool,
            kind_of(found)
        )
    }

    pub(super) fn string(&self, key: &str) -> Result<Option<String>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.wrong(key, "a string", other)),
        }
    }

    pub(super) fn required_string(&self, key: &str) -> Result<String, String> {
        self.string(key)?
            .ok_or_else(|| format!("{}: missing argument `{key}` (a string)", self.tool))
    }

    pub(super) fn boolean(&self, key: &str) -> Result<bool, String> {
        match self.get(key) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(self.wrong(key, "true or false", other)),
        }
    }

    /// A whole number of at least 1.
    pub(super) fn count(&self, key: &str) -> Result<Option<u32>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(value) => match value.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(n) if n >= 1 => Ok(Some(n)),
                _ => Err(self.wrong(key, "a whole number of at least 1", value)),
            },
        }
    }

    pub(super) fn number(&self, key: &str) -> Result<Option<f64>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(value) => value
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a number", value)),
        }
    }

    /// A list of strings.
    pub(super) fn strings(&self, key: &str) -> Result<Option<Vec<String>>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(format!(
                        "{}: argument `{key}[{i}]` must be a string, found {}",
                        self.tool,
                        kind_of(other)
                    )),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(other) => Err(self.wrong(key, "a list of strings", other)),
        }
    }

    /// An object of parameter values: strings, numbers or booleans, read as text.
    pub(super) fn values(&self, key: &str) -> Result<Vec<(String, String)>, String> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Object(map)) => map
                .iter()
                .map(|(name, value)| {
                    let text = match value {
                        Value::String(s) => s.clone(),
                        Value::Number(n) => n.to_string(),
                        Value::Bool(b) => b.to_string(),
                        other => {
                            return Err(format!(
                                "{}: argument `{key}.{}` must be a string, a number or true/false, found {}",
                                self.tool,
                                crate::text::printable(name),
                                kind_of(other)
                            ));
                        }
                    };
                    Ok((name.clone(), text))
                })
                .collect(),
            Some(other) => Err(self.wrong(key, "an object of parameter values", other)),
        }
    }

    /// The raw value of `key`, `null` included.
    pub(super) fn raw(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key)
    }
}

/// What a JSON value is, for an error message.
pub(super) fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(value: Value) -> Object {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn errors_name_the_tool_and_the_key() {
        let map =
            object(json!({"max_turns": "3", "extensions": ["a", 1], "parameters": {"n": []}}));
        let args = Args::new("delegate", &map, &["max_turns", "extensions", "parameters"]).unwrap();
        assert_eq!(
            args.count("max_turns").unwrap_err(),
            "delegate: argument `max_turns` must be a whole number of at least 1, found a string"
        );
        assert_eq!(
            args.strings("extensions").unwrap_err(),
            "delegate: argument `extensions[1]` must be a string, found a number"
        );
        assert_eq!(
            args.values("parameters").unwrap_err(),
            "delegate: argument `parameters.n` must be a string, a number or true/false, found a list"
        );
        let unknown = object(json!({"sauce": 1}));
        let Err(error) = Args::new("load", &unknown, &["source", "peek"]) else {
            panic!("an unknown key was accepted");
        };
        assert_eq!(
            error,
            "load: unknown argument `sauce`; the arguments are: source, peek"
        );
    }

    #[test]
    fn zero_turns_and_null_values() {
        let map = object(json!({"max_turns": 0, "source": null}));
        let args = Args::new("delegate", &map, &["max_turns", "source"]).unwrap();
        assert!(args.count("max_turns").is_err());
        assert_eq!(args.string("source").unwrap(), None);
    }
}
