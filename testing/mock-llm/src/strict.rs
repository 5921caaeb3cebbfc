//! Strict mode: chat requests that the real APIs refuse are refused here too, with HTTP 400
//! and the provider's error body, so a test cannot pass on a request production would fail.
//!
//! Anthropic Messages refuses: a missing `max_tokens`; no messages; a role other than `user`
//! or `assistant`; two turns of one role in a row; a message with empty content (except a
//! final assistant message); an empty or whitespace-only text block (messages and `system`);
//! `tool_use` ids without `tool_result` blocks at the start of the next user message, and
//! `tool_result` blocks that answer no `tool_use` of the previous message.
//!
//! OpenAI Chat Completions refuses: no messages; a `tool` message without `tool_call_id`, or
//! one that answers no preceding `tool_calls`; an assistant message with `tool_calls` not
//! followed by a tool message for every id; a call whose `function.arguments` is not the text
//! of a JSON object (llama.cpp's server refuses every later request of such a conversation).

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::Api;

/// Why the real API would refuse `body`, in its words; `None` when it would accept it.
pub(crate) fn refusal(api: Api, body: &Value) -> Option<String> {
    match api {
        Api::Anthropic => anthropic(body).err(),
        Api::OpenAi => openai(body).err(),
        _ => None,
    }
}

/// The 400 body the provider sends with `message`.
pub(crate) fn error_body(api: Api, message: &str) -> Value {
    match api {
        Api::Anthropic => json!({
            "type": "error",
            "error": {"type": "invalid_request_error", "message": message},
        }),
        _ => json!({
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": null,
                "code": null,
            },
        }),
    }
}

fn anthropic(body: &Value) -> Result<(), String> {
    if let Some(tier) = body.get("service_tier")
        && !matches!(tier.as_str(), Some("auto" | "standard_only"))
    {
        return Err(format!(
            "service_tier: Input should be 'auto' or 'standard_only', found {tier}"
        ));
    }
    if body.get("max_tokens").and_then(Value::as_u64).is_none() {
        return Err("max_tokens: Field required".into());
    }
    if body.get("output_format").is_some() {
        return Err(
            "output_format: Extra inputs are not permitted (use output_config.format)".into(),
        );
    }
    if let Some(config) = body.get("output_config") {
        output_config(config)?;
    }
    if let Some(Value::Array(blocks)) = body.get("system") {
        for (j, block) in blocks.iter().enumerate() {
            text_block(block, &format!("system.{j}"))?;
        }
    }
    let messages = match body.get("messages").and_then(Value::as_array) {
        Some(messages) if !messages.is_empty() => messages,
        _ => return Err("messages: at least one message is required".into()),
    };
    let mut previous: Option<&str> = None;
    let mut open_calls: BTreeSet<String> = BTreeSet::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        if role != "user" && role != "assistant" {
            return Err(format!(
                "messages.{i}.role: Input should be 'user' or 'assistant'"
            ));
        }
        if previous == Some(role) {
            return Err(format!(
                "messages.{i}: roles must alternate between \"user\" and \"assistant\", but found multiple \"{role}\" roles in a row"
            ));
        }
        previous = Some(role);
        let last = i + 1 == messages.len();
        let blocks = content_blocks(message, i, last && role == "assistant")?;
        answered_calls(&blocks, &mut open_calls, i)?;
        for (j, block) in blocks.iter().enumerate() {
            text_block(block, &format!("messages.{i}.content.{j}"))?;
            if block.get("type").and_then(Value::as_str) == Some("tool_use") {
                let id = block.get("id").and_then(Value::as_str).unwrap_or("");
                open_calls.insert(id.to_owned());
            }
        }
        if role == "assistant" && last && !open_calls.is_empty() {
            return Err(unanswered(i, &open_calls));
        }
    }
    Ok(())
}

/// Anthropic's structured outputs: `output_config.format`, when there is one (the object has
/// other settings too, such as `effort`), is `{"type": "json_schema", "schema": {...}}`, and
/// every object of the schema is closed (`additionalProperties: false`), as the API requires.
fn output_config(config: &Value) -> Result<(), String> {
    if !config.is_object() {
        return Err("output_config: Input should be a valid dictionary".into());
    }
    let Some(format) = config.get("format") else {
        return Ok(());
    };
    if format.get("type").and_then(Value::as_str) != Some("json_schema") {
        return Err("output_config.format.type: Input should be 'json_schema'".into());
    }
    let schema = format
        .get("schema")
        .filter(|s| s.is_object())
        .ok_or("output_config.format.schema: Input should be a valid dictionary")?;
    fn closed(node: &Value) -> bool {
        match node {
            Value::Object(map) => {
                let object = map.get("type").and_then(Value::as_str) == Some("object")
                    || map.contains_key("properties");
                (!object || map.get("additionalProperties") == Some(&Value::Bool(false)))
                    && map
                        .iter()
                        .all(|(k, v)| k == "required" || k == "enum" || closed(v))
            }
            Value::Array(items) => items.iter().all(closed),
            _ => true,
        }
    }
    if !closed(schema) {
        return Err("output_config.format.schema: For 'object' type, 'additionalProperties' must be explicitly set to false".into());
    }
    Ok(())
}

/// A message's content as blocks (a string is one text block).
fn content_blocks(message: &Value, i: usize, may_be_empty: bool) -> Result<Vec<Value>, String> {
    let blocks = match message.get("content") {
        Some(Value::String(text)) => {
            if text.is_empty() && !may_be_empty {
                return Err(empty_message(i));
            }
            vec![json!({"type": "text", "text": text})]
        }
        Some(Value::Array(blocks)) => blocks.clone(),
        _ => return Err(format!("messages.{i}.content: Field required")),
    };
    if blocks.is_empty() && !may_be_empty {
        return Err(empty_message(i));
    }
    Ok(blocks)
}

fn empty_message(i: usize) -> String {
    format!(
        "messages.{i}: all messages must have non-empty content except for the optional final assistant message"
    )
}

/// Checks that the `tool_result` blocks lead a message and answer exactly the calls of the
/// previous one; clears them.
fn answered_calls(blocks: &[Value], open: &mut BTreeSet<String>, i: usize) -> Result<(), String> {
    let mut answered = BTreeSet::new();
    let mut results_done = false;
    for (j, block) in blocks.iter().enumerate() {
        if block.get("type").and_then(Value::as_str) != Some("tool_result") {
            results_done = true;
            continue;
        }
        let id = block
            .get("tool_use_id")
            .and_then(Value::as_str)
            .unwrap_or("");
        if results_done || !open.contains(id) {
            return Err(format!(
                "messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
            ));
        }
        answered.insert(id.to_owned());
    }
    if !open.is_empty() && answered != *open {
        let missing: BTreeSet<String> = open.difference(&answered).cloned().collect();
        return Err(unanswered(i.saturating_sub(1), &missing));
    }
    open.clear();
    Ok(())
}

fn unanswered(i: usize, ids: &BTreeSet<String>) -> String {
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    format!(
        "messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: {}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
        ids.join(", ")
    )
}

/// A text block must hold non-whitespace text.
fn text_block(block: &Value, at: &str) -> Result<(), String> {
    if block.get("type").and_then(Value::as_str) != Some("text") {
        return Ok(());
    }
    let text = block.get("text").and_then(Value::as_str).unwrap_or("");
    if text.is_empty() {
        return Err(format!("{at}.text: text content blocks must be non-empty"));
    }
    if text.trim().is_empty() {
        return Err(format!(
            "{at}.text: text content blocks must contain non-whitespace text"
        ));
    }
    Ok(())
}

fn openai(body: &Value) -> Result<(), String> {
    // OpenAI's `service_tier` values; Anthropic's API takes `auto` and `standard_only`.
    if let Some(tier) = body.get("service_tier")
        && !matches!(
            tier.as_str(),
            Some("auto" | "default" | "flex" | "priority" | "scale")
        )
    {
        return Err(format!(
            "Invalid value for 'service_tier': {tier}. Supported values are: 'auto', 'default', 'flex', 'scale' and 'priority'."
        ));
    }
    let messages = match body.get("messages").and_then(Value::as_array) {
        Some(messages) if !messages.is_empty() => messages,
        _ => return Err("[] is too short - 'messages'".into()),
    };
    // The ids of the last assistant message's calls that no tool message answered yet.
    let mut open: BTreeSet<String> = BTreeSet::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        if role == "tool" {
            let Some(id) = message.get("tool_call_id").and_then(Value::as_str) else {
                return Err(format!(
                    "Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'. (messages.[{i}])"
                ));
            };
            if !open.remove(id) {
                return Err(format!(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'. (messages.[{i}])"
                ));
            }
            continue;
        }
        if !open.is_empty() {
            return Err(unanswered_openai(&open));
        }
        if role == "assistant"
            && let Some(calls) = message.get("tool_calls").and_then(Value::as_array)
        {
            for (j, call) in calls.iter().enumerate() {
                // llama.cpp's server parses the arguments of every call in the history.
                if let Some(arguments) = call.pointer("/function/arguments") {
                    let parsed = arguments.as_str().map(serde_json::from_str::<Value>);
                    if !matches!(parsed, Some(Ok(Value::Object(_)))) {
                        return Err(format!(
                            "Failed to parse tool call arguments as JSON: messages.[{i}].tool_calls.[{j}]"
                        ));
                    }
                }
                open.insert(
                    call.get("id")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                );
            }
        }
    }
    if !open.is_empty() {
        return Err(unanswered_openai(&open));
    }
    Ok(())
}

fn unanswered_openai(ids: &BTreeSet<String>) -> String {
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    format!(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}",
        ids.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anthropic_body(messages: Value) -> Value {
        json!({"model": "m", "max_tokens": 10, "messages": messages})
    }

    #[test]
    fn anthropic_refusals() {
        let ok = anthropic_body(json!([
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "t1", "name": "read", "input": {}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "x"},
                {"type": "text", "text": "go on"},
            ]},
            {"role": "assistant", "content": []},
        ]));
        assert_eq!(refusal(Api::Anthropic, &ok), None);
        // output_config: other settings alone, or a closed schema; an open one is refused
        let with = |config: serde_json::Value| {
            let mut body = anthropic_body(json!([{"role": "user", "content": "hi"}]));
            body["output_config"] = config;
            refusal(Api::Anthropic, &body)
        };
        assert_eq!(with(json!({"effort": "high"})), None);
        let closed = json!({"type": "object", "additionalProperties": false,
            "properties": {"n": {"type": "integer"}}});
        assert_eq!(
            with(json!({"format": {"type": "json_schema", "schema": closed}})),
            None
        );
        let open = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        assert!(
            with(json!({"format": {"type": "json_schema", "schema": open}}))
                .is_some_and(|r| r.contains("additionalProperties"))
        );
        let cases = [
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
                "max_tokens: Field required",
            ),
            (
                anthropic_body(
                    json!([{"role": "user", "content": [{"type": "text", "text": "\n\n"}]}]),
                ),
                "non-whitespace text",
            ),
            (
                anthropic_body(
                    json!([{"role": "user", "content": [{"type": "text", "text": ""}]}]),
                ),
                "must be non-empty",
            ),
            (
                anthropic_body(
                    json!([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]),
                ),
                "roles must alternate",
            ),
            (
                anthropic_body(json!([
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}]},
                    {"role": "user", "content": "b"},
                ])),
                "without `tool_result` blocks",
            ),
            (
                anthropic_body(json!([
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}]},
                ])),
                "without `tool_result` blocks",
            ),
            (
                anthropic_body(json!([
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "x"}]},
                ])),
                "unexpected `tool_use_id`",
            ),
            (
                anthropic_body(
                    json!([{"role": "user", "content": []}, {"role": "assistant", "content": "x"}]),
                ),
                "non-empty content",
            ),
        ];
        for (body, expected) in cases {
            let message = refusal(Api::Anthropic, &body).unwrap_or_default();
            assert!(message.contains(expected), "{body}: {message}");
        }
    }

    #[test]
    fn openai_refusals() {
        let ok = json!({"model": "m", "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1"}, {"id": "c2"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "x"},
            {"role": "tool", "tool_call_id": "c2", "content": "y"},
        ]});
        assert_eq!(refusal(Api::OpenAi, &ok), None);
        let cases = [
            (
                json!({"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "x"}]}),
                "Missing parameter 'tool_call_id'",
            ),
            (
                json!({"messages": [{"role": "user", "content": "a"}, {"role": "tool", "tool_call_id": "c", "content": "x"}]}),
                "must be a response to a preceeding message",
            ),
            (
                json!({"messages": [
                    {"role": "assistant", "tool_calls": [{"id": "c1"}, {"id": "c2"}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "x"},
                    {"role": "user", "content": "b"},
                ]}),
                "did not have response messages: c2",
            ),
            (
                json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "c1"}]}]}),
                "did not have response messages: c1",
            ),
        ];
        for (body, expected) in cases {
            let message = refusal(Api::OpenAi, &body).unwrap_or_default();
            assert!(message.contains(expected), "{body}: {message}");
        }
    }
}
