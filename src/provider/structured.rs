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
    /// Anthropic: the model answers in the schema natively (`output_config.format`) when the
    /// schema meets its rules ([`anthropic_native_schema`]), instead of through the answer tool.
    #[serde(default)]
    pub(crate) native: bool,
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
            native: false,
        })
    }

    /// The same format, asked natively where the model supports it.
    pub(crate) fn native(mut self, native: bool) -> Self {
        self.native = native;
        self
    }

    /// Whether it goes to Anthropic as `output_config.format`.
    pub(crate) fn anthropic_native(&self) -> bool {
        self.native && anthropic_native_schema(&self.schema)
    }
}

/// The Claude models whose structured outputs are generally available (`output_config.format`
/// with a JSON schema, combined with tools in one request): Opus 4.5 and 4.6, Sonnet 4.5 and
/// 4.6, Haiku 4.5, by id with or without a date. The config file's `models.<id>.
/// structured_outputs` decides for any other.
pub(crate) fn anthropic_native_structured(model: &str) -> bool {
    const GA: [&str; 5] = [
        "claude-opus-4-5",
        "claude-opus-4-6",
        "claude-sonnet-4-5",
        "claude-sonnet-4-6",
        "claude-haiku-4-5",
    ];
    GA.iter().any(|id| {
        model == *id
            || model
                .strip_prefix(id)
                .is_some_and(|rest| rest.starts_with('-') || rest.starts_with('@'))
    })
}

/// Keywords Anthropic's structured outputs refuse or do not enforce: numeric ranges, string
/// and array lengths, and what a grammar cannot express.
const ANTHROPIC_UNSUPPORTED: [&str; 20] = [
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "patternProperties",
    "propertyNames",
    "if",
    "then",
    "else",
    "not",
    "$ref",
    "$defs",
];

/// Whether Anthropic can take `schema` natively: every object closed with
/// `additionalProperties: false` and none of [`ANTHROPIC_UNSUPPORTED`] anywhere. Another schema
/// goes through the answer tool, whose input is validated here in full.
pub(crate) fn anthropic_native_schema(schema: &Value) -> bool {
    fn ok(node: &Value) -> bool {
        match node {
            Value::Object(map) => {
                if map
                    .keys()
                    .any(|k| ANTHROPIC_UNSUPPORTED.contains(&k.as_str()))
                {
                    return false;
                }
                let is_object = match map.get("type") {
                    Some(Value::String(t)) => t == "object",
                    Some(Value::Array(types)) => types.iter().any(|t| t == "object"),
                    _ => map.contains_key("properties"),
                };
                if is_object && map.get("additionalProperties") != Some(&Value::Bool(false)) {
                    return false;
                }
                map.iter().all(|(key, value)| match key.as_str() {
                    // names, not schemas
                    "required" | "enum" | "const" | "description" | "title" | "examples"
                    | "default" => true,
                    "properties" => value.as_object().is_none_or(|props| props.values().all(ok)),
                    _ => ok(value),
                })
            }
            Value::Array(items) => items.iter().all(ok),
            _ => true,
        }
    }
    ok(schema)
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
/// `native_model`: the model has Anthropic's structured outputs.
pub(crate) fn mechanism(
    schema: &Value,
    kind: super::ProviderKind,
    level: OpenAiFormat,
    native_model: bool,
) -> String {
    let sent = wrap(schema);
    let native = match (kind, level) {
        (super::ProviderKind::Anthropic, _) if native_model && anthropic_native_schema(&sent) => {
            "output_config.format json_schema (Anthropic's structured outputs)".to_owned()
        }
        (super::ProviderKind::Anthropic, _) if native_model => format!(
            "a `{ANSWER_TOOL}` tool whose input is the answer (the schema does not meet \
             structured outputs' rules: every object closed with additionalProperties: false, \
             no lengths or ranges)"
        ),
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

/// `req` as it is sent at OpenAI support level `level` (Anthropic: `native`, the provider has
/// not refused `output_config`): a request that carries its schema itself (`json_schema`,
/// `output_config`, a forced answer tool) goes as it is; where the mechanism cannot (a server
/// that stepped down to `json_object` or none), the schema is said in the system prompt; an
/// answer tool offered beside the task's tools is named there.
pub(crate) fn prompted(
    req: &super::ChatRequest,
    kind: super::ProviderKind,
    level: OpenAiFormat,
    native: bool,
    local: bool,
) -> std::borrow::Cow<'_, super::ChatRequest> {
    let Some(format) = &req.response_format else {
        return std::borrow::Cow::Borrowed(req);
    };
    let text = match kind {
        // A small local model held to a grammar still needs to read what the schema asks,
        // or it fills the grammar's whitespace until its limit.
        super::ProviderKind::OpenAi if level == OpenAiFormat::JsonSchema && !local => None,
        super::ProviderKind::OpenAi => Some(schema_prompt(format)),
        super::ProviderKind::Anthropic if (native && format.anthropic_native()) || format.force => {
            None
        }
        super::ProviderKind::Anthropic => Some(format!(
            "Give your final answer with the `{ANSWER_TOOL}` tool.\n"
        )),
    };
    match text {
        None => std::borrow::Cow::Borrowed(req),
        Some(text) => {
            // Right after the standard line, before the task's own instructions: a small model
            // reads what its answer must be before what to do.
            let mut req = req.clone();
            match req.system.find('\n') {
                Some(end) => req.system.insert_str(end + 1, &format!("\n{text}")),
                None if req.system.is_empty() => req.system = text,
                None => {
                    req.system.push('\n');
                    req.system.push_str(&text);
                }
            }
            std::borrow::Cow::Owned(req)
        }
    }
}

/// The system prompt's words for a schema the request cannot carry: the schema as the task
/// gave it (unwrapped), since the prompt asks for the bare value.
fn schema_prompt(format: &ResponseFormat) -> String {
    let schema = match wrapper_key_of_wrapped(format) {
        Some(inner) => inner,
        None => &format.schema,
    };
    format!(
        "Your final answer must be one JSON value, with no other text, that validates against \
         this JSON Schema:\n{}\n",
        serde_json::to_string_pretty(schema).unwrap_or_default()
    )
}

/// The original schema inside a wrapped one.
fn wrapper_key_of_wrapped(format: &ResponseFormat) -> Option<&Value> {
    if !format.wrapped {
        return None;
    }
    let properties = format.schema.get("properties")?.as_object()?;
    properties.get("items").or_else(|| properties.get("answer"))
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
            mechanism(
                &array,
                ProviderKind::OpenAi,
                OpenAiFormat::JsonSchema,
                false
            ),
            "response_format json_schema (strict); the schema's root is not an object, so it \
             is wrapped as an object's `items` and the answer unwrapped"
        );
        assert!(
            mechanism(
                &array,
                ProviderKind::OpenAi,
                OpenAiFormat::JsonObject,
                false
            )
            .starts_with("the prompt and lenient extraction (json_object cannot")
        );
        let format = ResponseFormat::for_schema(&array, false).unwrap();
        assert_eq!(
            openai_response_format(&format, OpenAiFormat::JsonObject),
            None
        );
        let object = json!({"type": "object"});
        assert_eq!(
            mechanism(
                &object,
                ProviderKind::OpenAi,
                OpenAiFormat::JsonObject,
                false
            ),
            "response_format json_object"
        );
    }

    #[test]
    fn anthropic_structured_outputs_by_model_and_schema() {
        for model in [
            "claude-sonnet-4-5",
            "claude-sonnet-4-5-20250929",
            "claude-opus-4-6",
            "claude-haiku-4-5@20251001",
        ] {
            assert!(anthropic_native_structured(model), "{model}");
        }
        for model in [
            "claude-sonnet-4",
            "claude-3-5-haiku-latest",
            "claude-sonnet-4-50",
        ] {
            assert!(!anthropic_native_structured(model), "{model}");
        }
        let closed = json!({"type": "object", "additionalProperties": false,
            "properties": {"tags": {"type": "array", "items": {"type": "object",
                "additionalProperties": false, "properties": {"name": {"type": "string"}}}}},
            "required": ["tags"]});
        assert!(anthropic_native_schema(&closed));
        let mut open = closed.clone();
        open["properties"]["tags"]["items"]
            .as_object_mut()
            .unwrap()
            .remove("additionalProperties");
        assert!(!anthropic_native_schema(&open));
        let mut ranged = closed.clone();
        ranged["properties"]["tags"]["maxItems"] = json!(3);
        assert!(!anthropic_native_schema(&ranged));
        // a property named like a keyword is a name, not the keyword
        let named = json!({"type": "object", "additionalProperties": false,
            "properties": {"minimum": {"type": "number"}}});
        assert!(anthropic_native_schema(&named));
    }
}
