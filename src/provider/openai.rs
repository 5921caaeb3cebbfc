//! The OpenAI-compatible Chat Completions wire format (OpenAI, Ollama, vLLM, llama.cpp, LM Studio,
//! OpenRouter, Groq, ...): request body building and lenient response parsing.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::error::ProviderError;
use super::message::{
    ChatRequest, ChatResponse, Message, ToolCall, UnreadableCall, Usage, parse_arguments,
};
use super::structured::{OpenAiFormat, openai_response_format};

/// The path of the endpoint, relative to a base URL that ends in `/v1`.
pub(crate) const CHAT_PATH: &str = "/chat/completions";
/// The model list, relative to the same base URL.
pub(crate) const MODELS_PATH: &str = "/models";

/// Builds the JSON body of a `POST /chat/completions` request.
pub(crate) fn request_body(req: &ChatRequest) -> Value {
    serde_json::to_value(Body::new(req, OpenAiFormat::JsonSchema)).unwrap_or(Value::Null)
}

/// The body as bytes, serialized straight from the request (no intermediate JSON tree: this
/// runs once per model request).
/// `format` is how far the server supports `response_format`.
#[cfg(test)]
pub(crate) fn request_bytes(req: &ChatRequest, format: OpenAiFormat) -> Vec<u8> {
    request_bytes_tier(req, format, false, None)
}

/// [`request_bytes`], with the output limit as `max_completion_tokens` when `completion` (the
/// name OpenAI's reasoning models take; they refuse `max_tokens`), at a service tier (`flex`,
/// `priority`) when one is asked for.
pub(crate) fn request_bytes_tier(
    req: &ChatRequest,
    format: OpenAiFormat,
    completion: bool,
    service_tier: Option<&str>,
) -> Vec<u8> {
    let mut body = Body::new(req, format);
    body.service_tier = service_tier;
    if completion {
        body.max_completion_tokens = body.max_tokens.take();
    }
    // Sized for the whole body at once: the tools alone are several kilobytes, and growing
    // from empty would copy them again and again.
    let mut out = Vec::with_capacity(body.size_hint());
    match serde_json::to_writer(&mut out, &body) {
        Ok(()) => out,
        Err(_) => Vec::new(),
    }
}

/// The request body, borrowing from the request.
#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<std::sync::Arc<serde_json::value::RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<Value>,
    /// Routes the requests that share a prefix to the same prompt cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_cache_key: Option<&'a str>,
    /// The service tier asked for (`flex`, `priority`); none: the provider's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    service_tier: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum WireMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: &'a str,
    },
    Assistant {
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<Value>,
    },
    Tool {
        tool_call_id: &'a str,
        name: &'a str,
        content: std::borrow::Cow<'a, str>,
    },
}

#[derive(Serialize)]
struct WireTool<'a> {
    r#type: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

impl<'a> Body<'a> {
    /// About the serialized size: every text once, plus room for keys and escapes.
    fn size_hint(&self) -> usize {
        let texts: usize = self
            .messages
            .iter()
            .map(|m| match m {
                WireMessage::System { content } | WireMessage::User { content } => content.len(),
                WireMessage::Assistant {
                    content,
                    tool_calls,
                } => content.map_or(0, str::len) + 256 * tool_calls.len(),
                WireMessage::Tool { content, .. } => content.len(),
            })
            .sum();
        let tools = self.tools.as_ref().map_or(0, |raw| raw.get().len());
        self.model.len() + texts + tools + 64 * self.messages.len() + 256
    }

    fn new(req: &'a ChatRequest, format: OpenAiFormat) -> Self {
        let mut messages = Vec::with_capacity(req.messages.len() + 1);
        if !req.system.is_empty() {
            messages.push(WireMessage::System {
                content: &req.system,
            });
        }
        for message in &req.messages {
            messages.push(match message {
                Message::User { text } => WireMessage::User { content: text },
                Message::Assistant { text, tool_calls } => WireMessage::Assistant {
                    content: text.as_deref(),
                    tool_calls: tool_calls.iter().map(wire_tool_call).collect(),
                },
                Message::ToolResult {
                    call_id,
                    name,
                    content,
                    is_error,
                } => WireMessage::Tool {
                    tool_call_id: call_id,
                    name,
                    // The format has no error flag: say it in the content.
                    content: if *is_error {
                        std::borrow::Cow::Owned(format!("Error: {content}"))
                    } else {
                        std::borrow::Cow::Borrowed(content)
                    },
                },
            });
        }
        Self {
            model: &req.model,
            messages,
            tools: wire_tools(&req.tools),
            temperature: req.temperature,
            max_tokens: req.max_tokens,
            max_completion_tokens: None,
            stop: &req.stop,
            response_format: req
                .response_format
                .as_ref()
                .and_then(|f| openai_response_format(f, format)),
            prompt_cache_key: req.cache.key.as_deref(),
            service_tier: None,
        }
    }
}

/// The `tools` array as JSON, serialized once per distinct tool set: every request of a task,
/// and of a fan-out, carries the same tools.
fn wire_tools(
    tools: &std::sync::Arc<[super::ToolSpec]>,
) -> Option<std::sync::Arc<serde_json::value::RawValue>> {
    use std::sync::{Arc, Mutex, OnceLock, Weak};
    type Cache = Mutex<Vec<(Weak<[super::ToolSpec]>, Arc<serde_json::value::RawValue>)>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    if tools.is_empty() {
        return None;
    }
    let cache = CACHE.get_or_init(Default::default);
    // A weak reference keeps its allocation, so an address still held is the same tool set.
    let held = |weak: &Weak<[super::ToolSpec]>| {
        weak.strong_count() > 0 && std::ptr::addr_eq(weak.as_ptr(), Arc::as_ptr(tools))
    };
    if let Ok(entries) = cache.lock()
        && let Some((_, raw)) = entries.iter().find(|(weak, _)| held(weak))
    {
        return Some(Arc::clone(raw));
    }
    let list: Vec<WireTool<'_>> = tools
        .iter()
        .map(|tool| WireTool {
            r#type: "function",
            function: WireFunction {
                name: &tool.name,
                description: &tool.description,
                parameters: &tool.parameters,
            },
        })
        .collect();
    let raw: Arc<serde_json::value::RawValue> = serde_json::value::to_raw_value(&list).ok()?.into();
    if let Ok(mut entries) = cache.lock() {
        entries.retain(|(weak, _)| weak.strong_count() > 0);
        if entries.len() >= 64 {
            entries.remove(0);
        }
        entries.push((Arc::downgrade(tools), Arc::clone(&raw)));
    }
    Some(raw)
}

fn wire_tool_call(call: &ToolCall) -> Value {
    if let Some(unreadable) = &call.unreadable {
        return unreadable.raw.clone();
    }
    // Arguments that are not a JSON object (malformed text, an array, a scalar) go back as
    // `{}`: servers parse the history's arguments (llama.cpp's refuses every later request
    // otherwise), and the tool's result already tells the model what was wrong with them.
    let arguments = match &call.arguments {
        Value::Object(_) => call.arguments.to_string(),
        _ => "{}".to_owned(),
    };
    json!({
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    })
}

/// Parses a Chat Completions response body, leniently: missing usage counts as zero, `content`
/// may be null, a string or an array of parts, tool arguments may be a string or an object.
pub(crate) fn parse_response(body: &Value) -> Result<ChatResponse, ProviderError> {
    let choice = body.get("choices").and_then(|c| c.get(0)).ok_or_else(|| {
        let detail = body
            .get("error")
            .map(|e| format!(": {}", e.get("message").unwrap_or(e)))
            .unwrap_or_default();
        ProviderError::Other {
            status: None,
            message: format!("the provider's response has no choices{detail}"),
        }
    })?;
    let message = choice.get("message").unwrap_or(&Value::Null);

    let text = content_text(message.get("content"));
    let tool_calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .enumerate()
                .filter_map(|(index, call)| parse_tool_call(index, call))
                .collect()
        })
        .unwrap_or_default();

    let usage = body.get("usage");
    let count = |key: &str| {
        usage
            .and_then(|u| u.get(key))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    Ok(ChatResponse {
        text,
        tool_calls,
        usage: Usage {
            input_tokens: count("prompt_tokens"),
            output_tokens: count("completion_tokens"),
            cache_read_tokens: usage
                .and_then(|u| u.get("prompt_tokens_details"))
                .and_then(|d| d.get("cached_tokens"))
                .and_then(Value::as_u64)
                .unwrap_or(0),
            cache_write_tokens: 0,
        },
        stop_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_owned),
        service_tier: body
            .get("service_tier")
            .and_then(Value::as_str)
            .map(str::to_owned),
    })
}

/// The common shape of an answer, read straight into [`ChatResponse`] without building a
/// JSON tree first (this runs once per model request). `None` for anything else (content
/// parts, fields of unexpected types, an error body), which [`parse_response`] then reads.
pub(crate) fn parse_response_fast(body: &[u8]) -> Option<ChatResponse> {
    let wire: FastResponse<'_> = serde_json::from_slice(body).ok()?;
    let choice = wire.choices.into_iter().next()?;
    let tool_calls = choice
        .message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(index, call)| ToolCall {
            id: call
                .id
                .filter(|id| !id.is_empty())
                .map_or_else(|| format!("call_{index}"), Cow::into_owned),
            name: call.function.name.into_owned(),
            arguments: match call.function.arguments {
                Some(Value::String(raw)) => parse_arguments(&raw),
                Some(Value::Null) | None => Value::Object(Map::new()),
                Some(other) => other,
            },
            unreadable: None,
        })
        .collect();
    let usage = wire.usage.unwrap_or_default();
    Some(ChatResponse {
        text: choice
            .message
            .content
            .filter(|text| !text.is_empty())
            .map(Cow::into_owned),
        tool_calls,
        usage: Usage {
            input_tokens: usage.prompt_tokens.unwrap_or(0),
            output_tokens: usage.completion_tokens.unwrap_or(0),
            cache_read_tokens: usage
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            cache_write_tokens: 0,
        },
        stop_reason: choice.finish_reason.map(Cow::into_owned),
        service_tier: wire.service_tier.map(Cow::into_owned),
    })
}

#[derive(Deserialize)]
struct FastResponse<'a> {
    #[serde(borrow)]
    choices: Vec<FastChoice<'a>>,
    #[serde(default)]
    usage: Option<FastUsage>,
    #[serde(default, borrow)]
    service_tier: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct FastChoice<'a> {
    #[serde(borrow)]
    message: FastMessage<'a>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct FastMessage<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<FastToolCall<'a>>>,
}

#[derive(Deserialize)]
struct FastToolCall<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    function: FastFunction<'a>,
}

#[derive(Deserialize)]
struct FastFunction<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Deserialize, Default)]
struct FastUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<FastPromptDetails>,
}

#[derive(Deserialize, Default)]
struct FastPromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

fn content_text(content: Option<&Value>) -> Option<String> {
    let text = match content? {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|part| match part {
                Value::String(text) => Some(text.as_str()),
                part => part.get("text").and_then(Value::as_str),
            })
            .collect::<Vec<_>>()
            .join(""),
        _ => return None,
    };
    (!text.is_empty()).then_some(text)
}

/// One entry of `tool_calls`; a call without a `function` (a `custom` call, or a type this
/// reader does not know) is kept as unreadable so the model hears that it was not run.
fn parse_tool_call(index: usize, call: &Value) -> Option<ToolCall> {
    let id = call
        .get("id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map_or_else(|| format!("call_{index}"), str::to_owned);
    let Some(function) = call.get("function").filter(|f| f.is_object()) else {
        return Some(unreadable_call(id, call));
    };
    let name = function.get("name").and_then(Value::as_str)?.to_owned();
    let arguments = match function.get("arguments") {
        Some(Value::String(raw)) => parse_arguments(raw),
        Some(Value::Null) | None => Value::Object(Map::new()),
        Some(other) => other.clone(),
    };
    Some(ToolCall {
        id,
        name,
        arguments,
        unreadable: None,
    })
}

/// A call summon cannot run, named by its type and (for `custom` calls) its tool name.
fn unreadable_call(id: String, call: &Value) -> ToolCall {
    let kind = call
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_owned();
    let name = call
        .get(&kind)
        .and_then(|inner| inner.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let mut raw = call.clone();
    // Sent back under the id it is answered with.
    if let Some(fields) = raw.as_object_mut() {
        fields.insert("id".into(), Value::String(id.clone()));
    }
    ToolCall {
        id,
        name,
        arguments: Value::Object(Map::new()),
        unreadable: Some(Box::new(UnreadableCall { kind, raw })),
    }
}

/// Parses the model list (`{"data": [{"id": ...}]}`).
pub(crate) fn parse_models(body: &Value) -> Vec<String> {
    body.get("data")
        .and_then(Value::as_array)
        .map(|models| {
            models
                .iter()
                .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
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
                "messages": [
                    {"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Read a.txt and b.txt"},
                    {"role": "assistant", "content": "Reading.", "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}},
                        {"id": "call_2", "type": "function", "function": {"name": "read_file", "arguments": "{}"}},
                    ]},
                    {"role": "tool", "tool_call_id": "call_1", "name": "read_file", "content": "alpha"},
                    {"role": "tool", "tool_call_id": "call_2", "name": "read_file", "content": "Error: malformed arguments"},
                ],
                "tools": [{"type": "function", "function": {
                    "name": "read_file",
                    "description": "Read a file",
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
                }}],
                "temperature": 0.2,
                "max_tokens": 1000,
            })
        );
    }

    #[test]
    fn tools_are_serialized_once_per_tool_set() {
        let req = sample_request();
        let first = wire_tools(&req.tools).unwrap();
        let again = wire_tools(&req.tools).unwrap();
        assert!(std::sync::Arc::ptr_eq(&first, &again));
        assert_eq!(
            request_bytes(&req, OpenAiFormat::JsonSchema),
            request_bytes(&req.clone(), OpenAiFormat::JsonSchema)
        );
        // Another set with other content gets its own JSON, even at a reused address.
        let mut other = req.clone();
        let mut specs = other.tools.to_vec();
        specs[0].name = "write_file".into();
        other.tools = specs.into();
        let json: Value = serde_json::from_str(wire_tools(&other.tools).unwrap().get()).unwrap();
        assert_eq!(json[0]["function"]["name"], "write_file");
        drop(req);
        let fresh: std::sync::Arc<[crate::provider::ToolSpec]> = other.tools.to_vec().into();
        let json: Value = serde_json::from_str(wire_tools(&fresh).unwrap().get()).unwrap();
        assert_eq!(json[0]["function"]["name"], "write_file");
    }

    #[test]
    fn minimal_request_omits_optional_fields() {
        let req = ChatRequest {
            model: "llama3".into(),
            messages: vec![
                Message::user("hi"),
                Message::Assistant {
                    text: None,
                    tool_calls: vec![],
                },
            ],
            ..ChatRequest::default()
        };
        assert_eq!(
            request_body(&req),
            json!({"model": "llama3", "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": null},
            ]})
        );
    }

    #[test]
    fn stop_sequences_are_sent_when_set() {
        let req = ChatRequest {
            model: "llama3".into(),
            messages: vec![Message::user("hi")],
            stop: vec!["\n".into(), "END".into()],
            ..ChatRequest::default()
        };
        assert_eq!(request_body(&req)["stop"], json!(["\n", "END"]));
    }

    #[test]
    fn parses_text_answers() {
        let body = json!({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
        });
        let response = parse_response(&body).expect("parse");
        assert_eq!(response.text.as_deref(), Some("Hello"));
        assert!(response.tool_calls.is_empty());
        assert_eq!(
            response.usage,
            Usage {
                input_tokens: 12,
                output_tokens: 3,
                ..Usage::default()
            }
        );
        assert_eq!(response.stop_reason.as_deref(), Some("stop"));
    }

    #[test]
    fn parses_tool_calls_including_malformed_arguments() {
        let body = json!({
            "choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}},
                {"id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": oops"}},
                {"type": "function", "function": {"name": "list_files", "arguments": {"dir": "."}}},
                {"id": "call_d", "type": "function", "function": {"name": "now"}},
                {"id": "broken"}
            ]}, "finish_reason": "tool_calls"}]
        });
        let response = parse_response(&body).expect("parse");
        assert_eq!(response.text, None);
        assert_eq!(response.usage, Usage::default());
        let calls = &response.tool_calls;
        assert_eq!(calls.len(), 5);
        let unreadable = calls[4].unreadable.as_deref().expect("kept, not dropped");
        assert_eq!(
            (calls[4].id.as_str(), unreadable.kind.as_str()),
            ("broken", "unknown")
        );
        assert_eq!(wire_tool_call(&calls[4]), json!({"id": "broken"}));
        assert_eq!(calls[0].arguments, json!({"path": "a.txt"}));
        assert_eq!(calls[1].malformed_arguments(), Some("{\"path\": oops"));
        assert_eq!(
            (calls[2].id.as_str(), &calls[2].arguments),
            ("call_2", &json!({"dir": "."}))
        );
        assert_eq!(calls[3].arguments, json!({}));
    }

    #[test]
    fn custom_calls_are_kept_and_sent_back_as_they_came() {
        let call = json!({"id": "call_c", "type": "custom", "custom": {"name": "grep", "input": "needle"}});
        let body = json!({"choices": [{"message": {"content": null, "tool_calls": [call.clone()]}, "finish_reason": "tool_calls"}]});
        let bytes = serde_json::to_vec(&body).expect("json");
        assert_eq!(
            parse_response_fast(&bytes),
            None,
            "left to the lenient reader"
        );
        let response = parse_response(&body).expect("parse");
        let parsed = &response.tool_calls[0];
        assert_eq!(
            (parsed.id.as_str(), parsed.name.as_str()),
            ("call_c", "grep")
        );
        assert_eq!(
            parsed.unreadable.as_ref().map(|u| u.kind.as_str()),
            Some("custom")
        );
        assert_eq!(wire_tool_call(parsed), call);
    }

    #[test]
    fn parses_content_parts_and_rejects_empty_choices() {
        let body = json!({"choices": [{"message": {"content": [
            {"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}
        ]}}]});
        assert_eq!(
            parse_response(&body).expect("parse").text.as_deref(),
            Some("Hello")
        );
        let body = json!({"choices": [{"message": {"content": ""}}]});
        assert_eq!(parse_response(&body).expect("parse").text, None);
        let err = parse_response(&json!({"choices": []})).expect_err("no choices");
        assert_eq!(err.code(), "other");
        let err = parse_response(&json!({"error": {"message": "boom"}})).expect_err("error");
        assert!(err.to_string().contains("boom"), "{err}");
    }

    #[test]
    fn the_fast_reader_agrees_with_the_lenient_one_or_leaves_the_body_to_it() {
        let read = |body: &Value| {
            let bytes = serde_json::to_vec(body).expect("json");
            (parse_response_fast(&bytes), parse_response(body).ok())
        };
        let agreeing = [
            json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hel\"lo\n"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 12, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}}}),
            json!({"choices": [{"message": {"content": ""}}], "usage": null}),
            json!({"choices": [{"message": {"content": null, "tool_calls": [
                {"id": "call_a", "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}},
                {"id": "", "function": {"name": "read_file", "arguments": "{\"path\": oops"}},
                {"function": {"name": "list_files", "arguments": {"dir": "."}}},
                {"id": "call_d", "function": {"name": "now", "arguments": null}},
            ]}, "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": null, "completion_tokens": 7}}),
        ];
        for body in &agreeing {
            let (fast, lenient) = read(body);
            assert!(fast.is_some(), "{body}");
            assert_eq!(fast, lenient, "{body}");
        }
        // Shapes only the lenient reader handles: the fast one must not guess.
        let unusual = [
            json!({"choices": [{"message": {"content": [{"type": "text", "text": "Hi"}]}}]}),
            json!({"choices": [{"message": {"content": "Hi"}}], "usage": {"prompt_tokens": 1.5}}),
            json!({"choices": [{"message": {"tool_calls": [{"id": "broken"}]}}]}),
            json!({"choices": []}),
            json!({"error": {"message": "boom"}}),
        ];
        for body in &unusual {
            assert_eq!(read(body).0, None, "{body}");
        }
    }

    #[test]
    fn parses_model_lists() {
        let body = json!({"object": "list", "data": [{"id": "gpt-a"}, {"id": "gpt-b"}, {"x": 1}]});
        assert_eq!(parse_models(&body), ["gpt-a", "gpt-b"]);
        assert!(parse_models(&json!({})).is_empty());
    }
}
