//! The Anthropic Messages wire format: request body building and lenient response parsing.

use serde_json::{Map, Value, json};

use super::error::ProviderError;
use super::message::{ChatRequest, ChatResponse, Message, ToolCall, Usage};
use super::structured::anthropic_answer_tool;

/// The path of the endpoint, relative to a base URL without `/v1`.
pub(crate) const MESSAGES_PATH: &str = "/v1/messages";
/// The model list, relative to the same base URL.
pub(crate) const MODELS_PATH: &str = "/v1/models";
/// The `anthropic-version` header value.
pub(crate) const API_VERSION: &str = "2023-06-01";
/// `max_tokens` is required by the API; this is used when the request has none.
pub(crate) const DEFAULT_MAX_TOKENS: u32 = 8192;

/// Builds the JSON body of a `POST /v1/messages` request.
///
/// Consecutive messages of one role are merged into one message (the API wants the roles to
/// alternate), so the results of several tool calls travel in one `user` message.
///
/// Text that is empty or only whitespace is not sent: the API refuses such text blocks (a
/// model often writes `"\n\n"` beside a tool call). An assistant turn left with no content is
/// left out whole, and the user turns around it merge into one.
pub(crate) fn request_body(req: &ChatRequest) -> Value {
    request_body_as(req, true)
}

/// [`request_body`]; with `native` (the provider has not refused it), a structured answer the
/// model and schema allow is asked as `output_config.format` instead of the answer tool.
pub(crate) fn request_body_as(req: &ChatRequest, native: bool) -> Value {
    let mut messages: Vec<(&str, Vec<Value>)> = Vec::with_capacity(req.messages.len());
    for message in &req.messages {
        let (role, blocks) = match message {
            Message::User { text } => ("user", text_block(text).into_iter().collect()),
            Message::Assistant { text, tool_calls } => {
                let mut blocks = Vec::with_capacity(tool_calls.len() + 1);
                blocks.extend(text.as_deref().and_then(text_block));
                for call in tool_calls {
                    // `input` must be an object; malformed arguments cannot be sent back as is.
                    let input = match &call.arguments {
                        Value::Object(_) => call.arguments.clone(),
                        _ => Value::Object(Map::new()),
                    };
                    blocks.push(json!({
                        "type": "tool_use", "id": call.id, "name": call.name, "input": input,
                    }));
                }
                ("assistant", blocks)
            }
            Message::ToolResult {
                call_id,
                content,
                is_error,
                ..
            } => {
                let mut block = json!({
                    "type": "tool_result", "tool_use_id": call_id, "content": content,
                });
                if *is_error {
                    block["is_error"] = Value::Bool(true);
                }
                ("user", vec![block])
            }
        };
        if blocks.is_empty() {
            // An empty turn is refused by the API and says nothing.
            continue;
        }
        match messages.last_mut() {
            Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
            _ => messages.push((role, blocks)),
        }
    }

    let mut body = Map::new();
    body.insert("model".into(), req.model.clone().into());
    body.insert(
        "max_tokens".into(),
        json!(req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
    );
    if !req.system.is_empty() {
        body.insert("system".into(), req.system.clone().into());
    }
    if !req.stop.is_empty() {
        body.insert("stop_sequences".into(), json!(req.stop));
    }
    let messages = messages
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    body.insert("messages".into(), Value::Array(messages));
    let mut tools: Vec<Value> = req
        .tools
        .iter()
        .map(|tool| {
            json!({
                "name": tool.name,
                "description": tool.description,
                "input_schema": tool.parameters,
            })
        })
        .collect();
    match &req.response_format {
        // Natively: the final text is the answer, and every tool stays callable.
        Some(format) if native && format.anthropic_native() => {
            body.insert(
                "output_config".into(),
                json!({"format": {"type": "json_schema", "schema": format.schema}}),
            );
        }
        // Else the answer tool is always offered; forced, no other tool can be called.
        Some(format) => {
            let (tool, choice) = anthropic_answer_tool(format);
            tools.push(tool);
            if format.force {
                body.insert("tool_choice".into(), choice);
            }
        }
        None => {}
    }
    if !tools.is_empty() {
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(temperature) = req.temperature {
        body.insert("temperature".into(), json!(temperature));
    }
    super::cache::mark_anthropic(&mut body, &req.cache);
    Value::Object(body)
}

/// A text block, or none for text the API would refuse as blank.
fn text_block(text: &str) -> Option<Value> {
    (!text.trim().is_empty()).then(|| json!({"type": "text", "text": text}))
}

/// Parses a Messages response body: text and `tool_use` blocks of `content`, `usage` (cache
/// reads and writes count as input) and `stop_reason`.
pub(crate) fn parse_response(body: &Value) -> Result<ChatResponse, ProviderError> {
    let Some(blocks) = body.get("content").and_then(Value::as_array) else {
        let detail = body
            .get("error")
            .and_then(|e| e.get("message"))
            .and_then(Value::as_str)
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        return Err(ProviderError::Other {
            status: None,
            message: format!("the provider's response has no content{detail}"),
        });
    };

    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for (index, block) in blocks.iter().enumerate() {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => {
                let Some(name) = block.get("name").and_then(Value::as_str) else {
                    continue;
                };
                let id = block
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|id| !id.is_empty())
                    .map_or_else(|| format!("toolu_{index}"), str::to_owned);
                let arguments = match block.get("input") {
                    None | Some(Value::Null) => Value::Object(Map::new()),
                    Some(input) => input.clone(),
                };
                tool_calls.push(ToolCall {
                    id,
                    name: name.to_owned(),
                    arguments,
                    unreadable: None,
                });
            }
            // thinking, redacted_thinking, server tool blocks: not part of the answer.
            _ => {}
        }
    }

    let usage = body.get("usage");
    let count = |key: &str| {
        usage
            .and_then(|u| u.get(key))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    Ok(ChatResponse {
        text: (!text.is_empty()).then_some(text),
        tool_calls,
        usage: Usage {
            input_tokens: count("input_tokens")
                + count("cache_creation_input_tokens")
                + count("cache_read_input_tokens"),
            output_tokens: count("output_tokens"),
            cache_read_tokens: count("cache_read_input_tokens"),
            cache_write_tokens: count("cache_creation_input_tokens"),
        },
        stop_reason: body
            .get("stop_reason")
            .and_then(Value::as_str)
            .map(str::to_owned),
        service_tier: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::message::sample_request;

    #[test]
    fn request_wire_format() {
        assert_eq!(
            request_body(&sample_request()),
            json!({
                "model": "gpt-test",
                "max_tokens": 1000,
                "system": "You are terse.",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "Read a.txt and b.txt"}]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Reading."},
                        {"type": "tool_use", "id": "call_1", "name": "read_file", "input": {"path": "a.txt"}},
                        {"type": "tool_use", "id": "call_2", "name": "read_file", "input": {}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "call_1", "content": "alpha"},
                        {"type": "tool_result", "tool_use_id": "call_2", "content": "malformed arguments", "is_error": true},
                    ]},
                ],
                "tools": [{
                    "name": "read_file",
                    "description": "Read a file",
                    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
                }],
                "temperature": 0.2,
            })
        );
    }

    #[test]
    fn stop_sequences_are_sent_when_set() {
        let req = ChatRequest {
            model: "claude-test".into(),
            messages: vec![Message::user("one")],
            stop: vec!["END".into()],
            ..ChatRequest::default()
        };
        assert_eq!(request_body(&req)["stop_sequences"], json!(["END"]));
        let req = ChatRequest {
            stop: Vec::new(),
            ..req
        };
        assert!(request_body(&req).get("stop_sequences").is_none());
    }

    #[test]
    fn defaults_and_merging() {
        let req = ChatRequest {
            model: "claude-test".into(),
            messages: vec![
                Message::user("one"),
                Message::Assistant {
                    text: Some(String::new()),
                    tool_calls: vec![],
                },
                Message::user("two"),
            ],
            ..ChatRequest::default()
        };
        assert_eq!(
            request_body(&req),
            json!({
                "model": "claude-test",
                "max_tokens": DEFAULT_MAX_TOKENS,
                "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "one"}, {"type": "text", "text": "two"}
                ]}],
            })
        );
    }

    #[test]
    fn blank_text_is_never_sent() {
        let call = ToolCall {
            id: "toolu_1".into(),
            name: "list_files".into(),
            arguments: json!({}),
            unreadable: None,
        };
        let req = ChatRequest {
            model: "claude-test".into(),
            messages: vec![
                Message::user("Answer in JSON."),
                Message::Assistant {
                    text: Some("\n\n".into()),
                    tool_calls: vec![call],
                },
                Message::ToolResult {
                    call_id: "toolu_1".into(),
                    name: "list_files".into(),
                    content: "a.txt".into(),
                    is_error: false,
                },
                // A structured-output correction after a blank answer.
                Message::Assistant {
                    text: Some("\n".into()),
                    tool_calls: vec![],
                },
                Message::user("Reply again with only the corrected JSON value."),
            ],
            ..ChatRequest::default()
        };
        assert_eq!(
            request_body(&req)["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "Answer in JSON."}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "list_files", "input": {}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
                    {"type": "text", "text": "Reply again with only the corrected JSON value."},
                ]},
            ])
        );
    }

    #[test]
    fn parses_text_and_tool_use() {
        let body = json!({
            "id": "msg_1", "type": "message", "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_a", "name": "read_file", "input": {"path": "a.txt"}},
                {"type": "tool_use", "name": "list_files"},
                {"type": "tool_use", "id": "toolu_x"},
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 100, "cache_read_input_tokens": 20, "cache_creation_input_tokens": 5, "output_tokens": 30}
        });
        let response = parse_response(&body).expect("parse");
        assert_eq!(response.text.as_deref(), Some("Let me look."));
        assert_eq!(response.stop_reason.as_deref(), Some("tool_use"));
        assert_eq!(
            response.usage,
            Usage {
                input_tokens: 125,
                output_tokens: 30,
                cache_read_tokens: 20,
                cache_write_tokens: 5,
            }
        );
        assert_eq!(response.tool_calls.len(), 2);
        assert_eq!(response.tool_calls[0].id, "toolu_a");
        assert_eq!(response.tool_calls[0].arguments, json!({"path": "a.txt"}));
        assert_eq!(response.tool_calls[1].id, "toolu_3");
        assert_eq!(response.tool_calls[1].arguments, json!({}));
    }

    #[test]
    fn lenient_about_missing_usage_and_reports_missing_content() {
        let body = json!({"content": [{"type": "text", "text": "ok"}]});
        let response = parse_response(&body).expect("parse");
        assert_eq!(response.usage, Usage::default());
        assert_eq!(response.stop_reason, None);
        let err = parse_response(&json!({"type": "error", "error": {"message": "nope"}}))
            .expect_err("no content");
        assert!(err.to_string().contains("nope"));
    }
}
