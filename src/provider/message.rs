//! Provider-neutral chat types: the request summon sends, the reply it gets back, and token usage.
//!
//! The wire formats of the individual APIs live in `openai.rs` and `anthropic.rs`; everything else
//! in summon talks in these types only.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One chat-completion request, independent of the provider's API.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub(crate) struct ChatRequest {
    /// The model name exactly as the provider knows it.
    pub(crate) model: String,
    /// The system prompt; empty means none.
    pub(crate) system: String,
    /// The conversation so far, oldest first.
    pub(crate) messages: Vec<Message>,
    /// The tools offered to the model; empty means none.
    pub(crate) tools: std::sync::Arc<[ToolSpec]>,
    pub(crate) temperature: Option<f64>,
    /// Upper bound on output tokens; the Anthropic client uses a default when `None`.
    pub(crate) max_tokens: Option<u32>,
    /// Stop sequences: the answer ends before the first of them the model writes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) stop: Vec<String>,
    /// A structured answer asked of the provider's own mechanism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) response_format: Option<super::structured::ResponseFormat>,
    /// What the request asks of the provider's prompt cache.
    #[serde(default, skip_serializing_if = "super::cache::CacheHint::is_off")]
    pub(crate) cache: super::cache::CacheHint,
}

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub(crate) enum Message {
    User {
        text: String,
    },
    Assistant {
        text: Option<String>,
        tool_calls: Vec<ToolCall>,
    },
    ToolResult {
        /// The id of the [`ToolCall`] this answers.
        call_id: String,
        /// The tool's name (OpenAI-compatible servers such as Gemini's want it back).
        name: String,
        content: String,
        is_error: bool,
    },
}

impl Message {
    pub(crate) fn user(text: impl Into<String>) -> Self {
        Self::User { text: text.into() }
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ToolSpec {
    pub(crate) name: String,
    pub(crate) description: String,
    /// JSON Schema of the tool's arguments (an `object` schema).
    pub(crate) parameters: Value,
}

/// A tool call requested by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ToolCall {
    pub(crate) id: String,
    pub(crate) name: String,
    /// The parsed arguments; when the model sent text that is not valid JSON, a
    /// `Value::String` holding that raw text (see [`ToolCall::malformed_arguments`]).
    pub(crate) arguments: Value,
    /// Set for a call summon cannot run (not a function call, such as OpenAI's `custom`
    /// calls): the model is told so, and the call is sent back exactly as it came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) unreadable: Option<Box<UnreadableCall>>,
}

/// A tool call of a type summon does not run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct UnreadableCall {
    /// The call's `type` (`custom`, ...), or `unknown` when it has none.
    pub(crate) kind: String,
    /// The call as the provider sent it.
    pub(crate) raw: Value,
}

impl ToolCall {
    /// The raw argument text when the model's arguments were not valid JSON.
    #[cfg(test)]
    pub(crate) fn malformed_arguments(&self) -> Option<&str> {
        self.arguments.as_str()
    }
}

/// Parses tool arguments sent as a JSON string (the OpenAI wire form).
///
/// Empty or blank text means "no arguments" (`{}`); text that is not valid JSON is kept as a
/// `Value::String` of the raw text so the caller can report malformed arguments to the model.
pub(crate) fn parse_arguments(raw: &str) -> Value {
    if raw.trim().is_empty() {
        return Value::Object(serde_json::Map::new());
    }
    match serde_json::from_str::<Value>(raw) {
        // A JSON string would be indistinguishable from malformed text: keep the raw text.
        Ok(Value::String(_)) | Err(_) => Value::String(raw.to_owned()),
        Ok(value) => value,
    }
}

/// The model's answer to one [`ChatRequest`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub(crate) struct ChatResponse {
    /// The answer text; `None` when the model only called tools.
    pub(crate) text: Option<String>,
    pub(crate) tool_calls: Vec<ToolCall>,
    pub(crate) usage: Usage,
    /// The provider's reason for stopping (`stop`, `tool_calls`, `end_turn`, `max_tokens`, ...).
    pub(crate) stop_reason: Option<String>,
    /// The service tier the provider says served the request (OpenAI's `service_tier`:
    /// `default`, `flex`, `priority`).
    pub(crate) service_tier: Option<String>,
}

/// Token usage of one or more requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub(crate) struct Usage {
    /// All input tokens, those read from and written to the provider's prompt cache included.
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    /// Input tokens read from the prompt cache (billed at the `cached_input` price).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) cache_read_tokens: u64,
    /// Input tokens written to the prompt cache (Anthropic; billed at the `cache_write` price).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) cache_write_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    /// Adds `other` to `self` (saturating).
    pub(crate) fn add(&mut self, other: Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(other.cache_read_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
    }

    /// Input tokens billed at the full input price: neither read from nor written to the cache.
    pub(crate) fn uncached_input(&self) -> u64 {
        self.input_tokens
            .saturating_sub(self.cache_read_tokens)
            .saturating_sub(self.cache_write_tokens)
    }

    pub(crate) fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// A request with tools, two tool calls (one with malformed arguments) and their results.
#[cfg(test)]
pub(crate) fn sample_request() -> ChatRequest {
    ChatRequest {
        model: "gpt-test".into(),
        system: "You are terse.".into(),
        messages: vec![
            Message::user("Read a.txt and b.txt"),
            Message::Assistant {
                text: Some("Reading.".into()),
                tool_calls: vec![
                    ToolCall {
                        id: "call_1".into(),
                        name: "read_file".into(),
                        arguments: serde_json::json!({"path": "a.txt"}),
                        unreadable: None,
                    },
                    ToolCall {
                        id: "call_2".into(),
                        name: "read_file".into(),
                        arguments: serde_json::json!("{\"path\": \"b.txt"),
                        unreadable: None,
                    },
                ],
            },
            Message::ToolResult {
                call_id: "call_1".into(),
                name: "read_file".into(),
                content: "alpha".into(),
                is_error: false,
            },
            Message::ToolResult {
                call_id: "call_2".into(),
                name: "read_file".into(),
                content: "malformed arguments".into(),
                is_error: true,
            },
        ],
        tools: std::sync::Arc::from(vec![ToolSpec {
            name: "read_file".into(),
            description: "Read a file".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        }]),
        temperature: Some(0.2),
        max_tokens: Some(1000),
        stop: Vec::new(),
        response_format: None,
        cache: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_parse_leniently() {
        assert_eq!(
            parse_arguments(r#"{"path":"a.txt"}"#),
            json!({"path": "a.txt"})
        );
        assert_eq!(parse_arguments(""), json!({}));
        assert_eq!(parse_arguments("  "), json!({}));
        assert_eq!(
            parse_arguments(r#"{"path": "a.txt""#),
            json!(r#"{"path": "a.txt""#)
        );
        assert_eq!(parse_arguments(r#""just text""#), json!(r#""just text""#));
        let call = ToolCall {
            id: "c1".into(),
            name: "read_file".into(),
            arguments: parse_arguments("{oops"),
            unreadable: None,
        };
        assert_eq!(call.malformed_arguments(), Some("{oops"));
    }

    #[test]
    fn usage_adds_and_saturates() {
        let mut total = Usage::default();
        total.add(Usage {
            input_tokens: 10,
            output_tokens: 5,
            ..Usage::default()
        });
        total.add(Usage {
            input_tokens: 1,
            output_tokens: 2,
            ..Usage::default()
        });
        assert_eq!(
            total,
            Usage {
                input_tokens: 11,
                output_tokens: 7,
                ..Usage::default()
            }
        );
        assert_eq!(total.total(), 18);
        total.add(Usage {
            input_tokens: u64::MAX,
            output_tokens: 0,
            ..Usage::default()
        });
        assert_eq!(total.input_tokens, u64::MAX);
    }
}

/// The result of one tool call, as it goes back to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolOutput {
    pub(crate) content: String,
    pub(crate) is_error: bool,
}

impl ToolOutput {
    pub(crate) fn ok(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: false,
        }
    }

    pub(crate) fn error(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: true,
        }
    }
}
