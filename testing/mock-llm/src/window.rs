//! Context windows: a model given one ([`crate::MockConfig::context_window`]) refuses a
//! request whose prompt and output limit do not fit, with HTTP 400 and the provider's own
//! message, as the real APIs do.
//!
//! The prompt's size is counted the same way every time: the bytes of its text (system prompt,
//! message texts, tool results, tool-call arguments) divided by four, rounded up. Tool
//! definitions are not counted, so a client that counts them errs on the safe side.

use serde_json::{Value, json};

use crate::Api;

/// The prompt tokens of a chat request body, as this server counts them.
pub fn prompt_tokens(body: &Value) -> u64 {
    let mut bytes = 0usize;
    if let Some(system) = body.get("system") {
        bytes += text_bytes(system);
    }
    if let Some(messages) = body.get("messages").and_then(Value::as_array) {
        for message in messages {
            if let Some(content) = message.get("content") {
                bytes += text_bytes(content);
            }
            if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
                bytes += calls.iter().map(text_bytes).sum::<usize>();
            }
        }
    }
    (bytes as u64).div_ceil(4)
}

/// The bytes of every string inside `value` (object keys excluded).
fn text_bytes(value: &Value) -> usize {
    match value {
        Value::String(text) => text.len(),
        Value::Array(items) => items.iter().map(text_bytes).sum(),
        Value::Object(map) => map
            .iter()
            .filter(|(key, _)| !matches!(key.as_str(), "type" | "role" | "id" | "tool_use_id"))
            .map(|(_, v)| text_bytes(v))
            .sum(),
        _ => 0,
    }
}

/// The 400 body the provider answers when `body` does not fit a `window`-token context.
pub(crate) fn refusal(api: Api, body: &Value, window: u64) -> Option<(String, Value)> {
    let prompt = prompt_tokens(body);
    let output = body.get("max_tokens").and_then(Value::as_u64);
    match api {
        Api::Anthropic => {
            let output = output.unwrap_or(0);
            let message = if prompt > window {
                format!("prompt is too long: {prompt} tokens > {window} maximum")
            } else if prompt + output > window {
                format!(
                    "input length and `max_tokens` exceed context limit: {prompt} + {output} > \
                     {window}, decrease input length or `max_tokens` and try again"
                )
            } else {
                return None;
            };
            let body = json!({
                "type": "error",
                "error": {"type": "invalid_request_error", "message": message},
            });
            Some((message, body))
        }
        _ => {
            let message = match output {
                _ if prompt > window => format!(
                    "This model's maximum context length is {window} tokens. However, your \
                     messages resulted in {prompt} tokens. Please reduce the length of the \
                     messages."
                ),
                Some(output) if prompt + output > window => format!(
                    "This model's maximum context length is {window} tokens. However, you \
                     requested {} tokens ({prompt} in the messages, {output} in the completion). \
                     Please reduce the length of the messages or completion.",
                    prompt + output
                ),
                _ => return None,
            };
            let body = json!({
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": "context_length_exceeded",
                },
            });
            Some((message, body))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_is_the_text_bytes_over_four() {
        let body = json!({"model": "m", "system": "abcd", "messages": [
            {"role": "user", "content": "12345678"},
            {"role": "user", "content": [{"type": "text", "text": "x"}]},
        ]});
        assert_eq!(prompt_tokens(&body), 4);
    }

    #[test]
    fn each_provider_refuses_in_its_own_words() {
        let body = json!({"model": "m", "max_tokens": 10, "messages": [
            {"role": "user", "content": "x".repeat(400)},
        ]});
        assert!(refusal(Api::OpenAi, &body, 110).is_none());
        let (message, openai) = refusal(Api::OpenAi, &body, 99).expect("too long");
        assert!(
            message.contains("maximum context length is 99 tokens"),
            "{message}"
        );
        assert_eq!(openai["error"]["code"], "context_length_exceeded");
        let (message, _) = refusal(Api::OpenAi, &body, 105).expect("with the output");
        assert!(
            message
                .contains("you requested 110 tokens (100 in the messages, 10 in the completion)"),
            "{message}"
        );
        let (message, anthropic) = refusal(Api::Anthropic, &body, 99).expect("too long");
        assert_eq!(message, "prompt is too long: 100 tokens > 99 maximum");
        assert_eq!(anthropic["error"]["type"], "invalid_request_error");
    }
}
