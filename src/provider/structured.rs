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
    /// `schema` is the original schema wrapped in an object (its root is not an object).
    #[serde(default)]
    pub(crate) wrapped: bool,
}

impl ResponseFormat {
    /// The format for `schema`. Both mechanisms want an object at the root: any other schema
    /// (an array, a scalar) is sent wrapped in an object with one property (see [`wrap`]),
    /// and the answer is unwrapped before it is validated (see [`unwrap_answer`]).
    pub(crate) fn for_schema(schema: &Value, force: bool) -> Option<Self> {
        Some(Self {
            schema: wrap(schema),
            force,
            wrapped: wrapper_key(schema).is_some(),
        })
    }
}

/// Whether `schema` has an object at its root (`type: object`, alone or among its types).
fn root_is_object(schema: &Value) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(types)) => types.len() == 1 && types[0] == "object",
        _ => false,
    }
}

/// The property a schema whose root is not an object is wrapped in: `items` for an array,
/// `answer` for anything else; `None` for an object, which is sent as it is.
pub(crate) fn wrapper_key(schema: &Value) -> Option<&'static str> {
    if root_is_object(schema) {
        None
    } else if schema.get("type").and_then(Value::as_str) == Some("array") {
        Some("items")
    } else {
        Some("answer")
    }
}

/// `schema` as the providers' mechanisms can carry it: an object schema as it is, any other
/// wrapped as the one required property of a closed object.
pub(crate) fn wrap(schema: &Value) -> Value {
    match wrapper_key(schema) {
        None => schema.clone(),
        Some(key) => json!({
            "type": "object",
            "properties": {key: schema},
            "required": [key],
            "additionalProperties": false,
        }),
    }
}

/// The answer to `schema` out of `value`: the wrapped property when `value` is the wrapping
/// object (one property, the wrapper's), else `value` itself (a model, or a server that
/// ignored the mechanism, may answer the bare value).
pub(crate) fn unwrap_answer(schema: &Value, value: Value) -> Value {
    let Some(key) = wrapper_key(schema) else {
        return value;
    };
    match value {
        Value::Object(mut map) if map.len() == 1 && map.contains_key(key) => {
            map.remove(key).unwrap_or_default()
        }
        other => other,
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
    let sent = wrap(schema);
    let native = match (kind, level) {
        (super::ProviderKind::Anthropic, _) => {
            format!("a `{ANSWER_TOOL}` tool whose input is the answer")
        }
        (_, OpenAiFormat::JsonSchema) => format!(
            "response_format json_schema ({})",
            if strict_allowed(&sent) {
                "strict"
            } else {
                "not strict: the schema does not meet strict mode's rules"
            }
        ),
        (_, OpenAiFormat::JsonObject) if wrapper_key(schema).is_some() => {
            return "the prompt and lenient extraction (json_object cannot say which property \
                    to wrap a schema whose root is not an object in)"
                .to_owned();
        }
        (_, OpenAiFormat::JsonObject) => "response_format json_object".to_owned(),
        (_, OpenAiFormat::None) => return "the prompt and lenient extraction".to_owned(),
    };
    match wrapper_key(schema) {
        None => native,
        Some(key) => format!(
            "{native}; the schema's root is not an object, so it is wrapped as an object's \
             `{key}` and the answer unwrapped"
        ),
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
        // The prompt asks for the bare value, and json_object cannot say which property of
        // the object to put it in: a wrapped schema relies on the prompt here.
        OpenAiFormat::JsonObject if format.wrapped => None,
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

/// Whether a 400 is a server refusing `response_format`: it names the parameter, or the JSON
/// schema or grammar it could not use.
pub(crate) fn refuses_response_format(message: &str) -> bool {
    // llama.cpp's server names neither: "Unable to generate parser for this template ...
    // JSON schema error" (a schema its grammar cannot express, such as `prefixItems`).
    let lower = message.to_lowercase();
    message.contains("response_format")
        || lower.contains("json schema")
        || lower.contains("grammar")
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
/// as required and sets `additionalProperties: false`, every array says what its `items`
/// are, and no unsupported keyword is used.
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
    let is_array = match map.get("type") {
        Some(Value::String(t)) => t == "array",
        Some(Value::Array(types)) => types.iter().any(|t| t == "array"),
        _ => false,
    };
    if is_array && !map.contains_key("items") {
        return false;
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
        let any_items = json!({"type": "array"});
        assert!(!strict_allowed(&any_items));
        assert!(strict_allowed(
            &json!({"type": "array", "items": {"type": "string"}})
        ));
    }

    #[test]
    fn a_root_that_is_not_an_object_is_wrapped_and_unwrapped() {
        let array = json!({"type": "array", "items": {"type": "string"}});
        let format = ResponseFormat::for_schema(&array, true).unwrap();
        assert_eq!(
            format.schema,
            json!({"type": "object", "properties": {"items": array}, "required": ["items"],
                "additionalProperties": false})
        );
        assert!(strict_allowed(&format.schema));
        let scalar = json!({"type": "integer"});
        assert_eq!(wrap(&scalar)["properties"]["answer"], scalar);
        let object = json!({"type": "object", "properties": {"items": {}}});
        assert_eq!(wrap(&object), object);
        // Unwrapped when wrapped; the bare value as it is; an object root never unwrapped.
        assert_eq!(unwrap_answer(&array, json!({"items": ["a"]})), json!(["a"]));
        assert_eq!(unwrap_answer(&array, json!(["a"])), json!(["a"]));
        assert_eq!(
            unwrap_answer(&array, json!({"items": ["a"], "more": 1})),
            json!({"items": ["a"], "more": 1})
        );
        assert_eq!(unwrap_answer(&scalar, json!({"answer": 3})), json!(3));
        assert_eq!(
            unwrap_answer(&object, json!({"items": 1})),
            json!({"items": 1})
        );
    }

    #[test]
    fn the_mechanism_says_when_a_schema_is_wrapped_and_when_it_cannot_be() {
        use super::super::ProviderKind;
        let array = json!({"type": "array", "items": {"type": "string"}});
        assert_eq!(
            mechanism(&array, ProviderKind::OpenAi, OpenAiFormat::JsonSchema),
            "response_format json_schema (strict); the schema's root is not an object, so it \
             is wrapped as an object's `items` and the answer unwrapped"
        );
        assert!(
            mechanism(&array, ProviderKind::OpenAi, OpenAiFormat::JsonObject)
                .starts_with("the prompt and lenient extraction (json_object cannot")
        );
        let format = ResponseFormat::for_schema(&array, false).unwrap();
        assert_eq!(
            openai_response_format(&format, OpenAiFormat::JsonObject),
            None
        );
        let object = json!({"type": "object"});
        assert_eq!(
            mechanism(&object, ProviderKind::OpenAi, OpenAiFormat::JsonObject),
            "response_format json_object"
        );
    }
}
