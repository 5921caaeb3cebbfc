//! The providers' own structured-output mechanisms: OpenAI's `response_format` (a JSON Schema,
//! strict when the schema meets the strict-mode rules, or plain `json_object` for servers that
//! know only that) and Anthropic's forced tool whose input is the answer. With them the model
//! cannot answer in prose.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The name of the answer (OpenAI `json_schema.name`, Anthropic's answer tool).
pub(crate) const ANSWER_TOOL: &str = "structured_answer";

/// A structured answer asked of the provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ResponseFormat {
    pub(crate) schema: Value,
    /// Anthropic: the answer tool is forced on this turn (so no other tool can be called):
    /// on every turn of a task without tools, else on correction turns only (before, it is
    /// offered beside the task's tools).
    pub(crate) force: bool,
}

impl ResponseFormat {
    /// The format for `schema`, when a provider mechanism can carry it: both want an object
    /// at the root. Other schemas rely on the prompt and lenient extraction.
    pub(crate) fn for_schema(schema: &Value, force: bool) -> Option<Self> {
        (schema.get("type").and_then(Value::as_str) == Some("object")).then(|| Self {
            schema: schema.clone(),
            force,
        })
    }
}

/// How far an OpenAI-compatible server supports `response_format`: set per provider
/// (`structured_output: json_schema | json_object | none`), or found out from a 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpenAiFormat {
    JsonSchema,
    /// The server refused `json_schema` (HTTP 400).
    JsonObject,
    /// The server refused `json_object` too.
    None,
}

impl OpenAiFormat {
    /// The config file's word for it.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text {
            "json_schema" => Some(Self::JsonSchema),
            "json_object" => Some(Self::JsonObject),
            "none" => Some(Self::None),
            _ => None,
        }
    }
}

/// How a structured answer with `schema` is asked of a provider of `kind` that is sent
/// `level` first: what `summon run --dry-run` shows.
pub(crate) fn mechanism(schema: &Value, kind: super::ProviderKind, level: OpenAiFormat) -> String {
    if ResponseFormat::for_schema(schema, false).is_none() {
        return "the prompt and lenient extraction (a schema whose root is not an object has \
                no native mechanism)"
            .to_owned();
    }
    match (kind, level) {
        (super::ProviderKind::Anthropic, _) => {
            format!("a `{ANSWER_TOOL}` tool whose input is the answer")
        }
        (_, OpenAiFormat::JsonSchema) => format!(
            "response_format json_schema ({})",
            if strict_allowed(schema) {
                "strict"
            } else {
                "not strict: the schema does not meet strict mode's rules"
            }
        ),
        (_, OpenAiFormat::JsonObject) => "response_format json_object".to_owned(),
        (_, OpenAiFormat::None) => "the prompt and lenient extraction".to_owned(),
    }
}

/// OpenAI's `response_format` for `format` at the support level `level`.
pub(crate) fn openai_response_format(
    format: &ResponseFormat,
    level: OpenAiFormat,
) -> Option<Value> {
    match level {
        OpenAiFormat::JsonSchema => Some(json!({
            "type": "json_schema",
            "json_schema": {
                "name": ANSWER_TOOL,
                "schema": format.schema,
                "strict": strict_allowed(&format.schema),
            },
        })),
        OpenAiFormat::JsonObject => Some(json!({"type": "json_object"})),
        OpenAiFormat::None => None,
    }
}

/// Anthropic's answer tool and the `tool_choice` that forces it.
pub(crate) fn anthropic_answer_tool(format: &ResponseFormat) -> (Value, Value) {
    (
        json!({
            "name": ANSWER_TOOL,
            "description": "Give your final answer: its input is the answer.",
            "input_schema": format.schema,
        }),
        json!({"type": "tool", "name": ANSWER_TOOL}),
    )
}

/// Turns a call of the answer tool into the answer's text (its input as JSON), as if the
/// model had answered with the JSON itself; other tool calls of the turn are dropped.
pub(crate) fn take_answer_tool(response: &mut super::ChatResponse) {
    let Some(call) = response.tool_calls.iter().find(|c| c.name == ANSWER_TOOL) else {
        return;
    };
    response.text = Some(call.arguments.to_string());
    response.tool_calls.clear();
    response.stop_reason = Some("end_turn".to_owned());
}

/// Whether a 400 is a server refusing `response_format` (it names the parameter).
pub(crate) fn refuses_response_format(message: &str) -> bool {
    message.contains("response_format")
}

/// Keywords OpenAI's strict mode does not accept.
const UNSUPPORTED: [&str; 12] = [
    "patternProperties",
    "unevaluatedProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "if",
    "then",
    "else",
    "not",
    "dependentRequired",
    "dependentSchemas",
    "allOf",
];

/// Whether `schema` meets OpenAI's strict-mode rules: every object lists all its properties
/// as required and sets `additionalProperties: false`, and no unsupported keyword is used.
pub(crate) fn strict_allowed(schema: &Value) -> bool {
    let Value::Object(map) = schema else {
        return schema.is_boolean();
    };
    if UNSUPPORTED.iter().any(|k| map.contains_key(*k)) {
        return false;
    }
    let is_object = match map.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(types)) => types.iter().any(|t| t == "object"),
        _ => map.contains_key("properties"),
    };
    if is_object {
        if map.get("additionalProperties") != Some(&Value::Bool(false)) {
            return false;
        }
        let properties = map.get("properties").and_then(Value::as_object);
        let required: Vec<&str> = map
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if properties.is_some_and(|p| p.keys().any(|k| !required.contains(&k.as_str()))) {
            return false;
        }
    }
    let nested = ["properties", "$defs", "definitions"]
        .iter()
        .filter_map(|k| map.get(*k).and_then(Value::as_object))
        .flat_map(|m| m.values());
    let listed = ["anyOf", "prefixItems"]
        .iter()
        .filter_map(|k| map.get(*k).and_then(Value::as_array))
        .flatten();
    let items = map.get("items").into_iter();
    nested.chain(listed).chain(items).all(strict_allowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_needs_closed_objects_with_every_property_required() {
        let closed = json!({"type": "object", "additionalProperties": false, "required": ["a"],
            "properties": {"a": {"type": "array", "items": {"type": "object",
                "additionalProperties": false, "required": ["b"], "properties": {"b": {"type": "string"}}}}}});
        assert!(strict_allowed(&closed));
        let mut open_inner = closed.clone();
        open_inner["properties"]["a"]["items"]["additionalProperties"] = json!(true);
        assert!(!strict_allowed(&open_inner));
        let optional = json!({"type": "object", "additionalProperties": false, "required": [],
            "properties": {"a": {"type": "string"}}});
        assert!(!strict_allowed(&optional));
        let unsupported = json!({"type": "object", "additionalProperties": false,
            "properties": {}, "patternProperties": {}});
        assert!(!strict_allowed(&unsupported));
        assert!(ResponseFormat::for_schema(&json!({"type": "array"}), true).is_none());
    }
}
