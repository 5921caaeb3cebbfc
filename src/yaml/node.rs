//! The positioned YAML tree.

use crate::diag::Pos;

/// How a scalar was written, which decides its type under the YAML 1.2 core schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScalarStyle {
    Plain,
    Quoted,
    Block,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Scalar(String, ScalarStyle),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

/// A node and where it starts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub(crate) pos: Pos,
    pub(crate) value: Value,
}

impl Node {
    pub(crate) fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar(s, ScalarStyle::Plain) if is_null_text(s))
    }

    /// The text of a scalar (of any core type), `None` for collections and null.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar(s, _) if !self.is_null() => Some(s),
            _ => None,
        }
    }

    pub(crate) fn as_seq(&self) -> Option<&[Node]> {
        match &self.value {
            Value::Seq(items) => Some(items),
            _ => None,
        }
    }

    pub(crate) fn as_map(&self) -> Option<&[(Node, Node)]> {
        match &self.value {
            Value::Map(entries) => Some(entries),
            _ => None,
        }
    }

    /// A map entry by key.
    pub(crate) fn get(&self, key: &str) -> Option<&Node> {
        self.as_map()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    /// What kind of node this is, for messages.
    pub(crate) fn kind_name(&self) -> &'static str {
        match &self.value {
            Value::Scalar(..) if self.is_null() => "null",
            Value::Scalar(..) => match self.to_json() {
                serde_json::Value::Bool(_) => "a boolean",
                serde_json::Value::Number(_) => "a number",
                _ => "a string",
            },
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }

    /// The node as JSON, typing plain scalars by the YAML 1.2 core schema.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        match &self.value {
            Value::Scalar(s, ScalarStyle::Plain) => plain_scalar_json(s),
            Value::Scalar(s, _) => serde_json::Value::String(s.clone()),
            Value::Seq(items) => items.iter().map(Node::to_json).collect(),
            Value::Map(entries) => entries
                .iter()
                .map(|(k, v)| (key_text(k), v.to_json()))
                .collect::<serde_json::Map<_, _>>()
                .into(),
        }
    }
}

fn key_text(key: &Node) -> String {
    match &key.value {
        Value::Scalar(s, _) => s.clone(),
        _ => key.to_json().to_string(),
    }
}

fn is_null_text(s: &str) -> bool {
    matches!(s, "" | "~" | "null" | "Null" | "NULL")
}

fn plain_scalar_json(s: &str) -> serde_json::Value {
    if is_null_text(s) {
        return serde_json::Value::Null;
    }
    match s {
        "true" | "True" | "TRUE" => return true.into(),
        "false" | "False" | "FALSE" => return false.into(),
        _ => {}
    }
    if let Some(n) = parse_int(s) {
        return n.into();
    }
    if looks_like_float(s)
        && let Ok(f) = s.parse::<f64>()
        && let Some(n) = serde_json::Number::from_f64(f)
    {
        return serde_json::Value::Number(n);
    }
    serde_json::Value::String(s.to_owned())
}

fn parse_int(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    if digits.is_empty() {
        return None;
    }
    if let Some(hex) = digits.strip_prefix("0x") {
        return i64::from_str_radix(hex, 16).ok();
    }
    if let Some(oct) = digits.strip_prefix("0o") {
        return i64::from_str_radix(oct, 8).ok();
    }
    if digits.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().ok();
    }
    None
}

fn looks_like_float(s: &str) -> bool {
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    !body.is_empty()
        && body.bytes().any(|b| b.is_ascii_digit())
        && body
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(s: &str) -> Node {
        Node {
            pos: Pos::default(),
            value: Value::Scalar(s.into(), ScalarStyle::Plain),
        }
    }

    #[test]
    fn core_schema_typing() {
        assert_eq!(plain("5").to_json(), serde_json::json!(5));
        assert_eq!(plain("-2.5").to_json(), serde_json::json!(-2.5));
        assert_eq!(plain("true").to_json(), serde_json::json!(true));
        assert_eq!(plain("~").to_json(), serde_json::Value::Null);
        assert_eq!(plain("1.0.0").to_json(), serde_json::json!("1.0.0"));
        assert_eq!(plain("e").to_json(), serde_json::json!("e"));
        assert_eq!(plain("v1").to_json(), serde_json::json!("v1"));
    }
}
