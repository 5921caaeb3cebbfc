//! Prompt caching: where a request marks Anthropic cache breakpoints, and the OpenAI
//! `prompt_cache_key`.
//!
//! Anthropic caches a prefix only up to a block marked `cache_control` (at most 4 per request),
//! bills a write at 1.25× and a read at 0.1× the input price, and caches nothing below a
//! per-model minimum. So a mark is placed only where a later request can read it and the prefix
//! reaches the minimum: the end of the tools and of the system prompt when other requests share
//! them, and the newest message when a later turn re-sends the conversation. OpenAI caches
//! prefixes of 1,024 tokens or more by itself; a `prompt_cache_key` stable per step routes a
//! step's requests to the same cache.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The smallest prefix OpenAI caches, in tokens.
pub(crate) const OPENAI_MIN_TOKENS: u64 = 1024;

/// What a request asks of the provider's prompt cache. The default asks nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub(crate) struct CacheHint {
    /// Other requests share this request's tools and system prompt: mark their ends.
    #[serde(default)]
    pub(crate) prefix: bool,
    /// A later turn re-sends this conversation: mark its newest message.
    #[serde(default)]
    pub(crate) newest: bool,
    /// OpenAI's `prompt_cache_key`: the same for every request that shares the prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) key: Option<String>,
}

impl CacheHint {
    pub(crate) fn is_off(&self) -> bool {
        *self == Self::default()
    }
}

/// The smallest prefix Anthropic caches for `model`, in tokens (Sonnet 4.6 and Haiku 3.x:
/// 2,048; Opus 4.5/4.6 and Haiku 4.5: 4,096; the other current models: 1,024).
pub(crate) fn anthropic_min_tokens(model: &str) -> u64 {
    let m = model.to_ascii_lowercase();
    let any = |names: &[&str]| names.iter().any(|n| m.contains(n));
    if any(&["opus-4-5", "opus-4-6", "haiku-4-5"]) {
        4096
    } else if any(&["sonnet-4-6", "haiku-3", "3-haiku", "3-5-haiku"]) {
        2048
    } else {
        1024
    }
}

/// Estimated tokens of a JSON value as sent: a quarter of its serialized length.
fn tokens(value: &Value) -> u64 {
    value.to_string().len() as u64 / 4
}

/// Places the `cache_control` marks `hint` asks for in an Anthropic Messages `body`, each only
/// where the prefix it ends reaches the model's minimum.
pub(crate) fn mark_anthropic(body: &mut Map<String, Value>, hint: &CacheHint) {
    if !hint.prefix && !hint.newest {
        return;
    }
    let min = anthropic_min_tokens(body.get("model").and_then(Value::as_str).unwrap_or(""));
    let mark = json!({"type": "ephemeral"});
    let mut prefix = 0u64;
    if let Some(Value::Array(tools)) = body.get_mut("tools") {
        prefix += tools.iter().map(tokens).sum::<u64>();
        if hint.prefix
            && prefix >= min
            && let Some(Value::Object(last)) = tools.last_mut()
        {
            last.insert("cache_control".into(), mark.clone());
        }
    }
    if let Some(system) = body.get_mut("system") {
        // A string is sent as one text block: only a block can carry the mark.
        let mut blocks = match system {
            Value::String(text) => vec![json!({"type": "text", "text": text})],
            Value::Array(blocks) => std::mem::take(blocks),
            _ => Vec::new(),
        };
        prefix += blocks.iter().map(tokens).sum::<u64>();
        if hint.prefix
            && prefix >= min
            && let Some(Value::Object(last)) = blocks.last_mut()
        {
            last.insert("cache_control".into(), mark.clone());
            *system = Value::Array(blocks);
        } else if system.is_array() {
            *system = Value::Array(blocks);
        }
    }
    if !hint.newest {
        return;
    }
    let Some(Value::Array(messages)) = body.get_mut("messages") else {
        return;
    };
    prefix += messages
        .iter()
        .filter_map(|m| m.get("content").and_then(Value::as_array))
        .flatten()
        .map(tokens)
        .sum::<u64>();
    if prefix < min {
        return;
    }
    if let Some(Value::Object(last)) = messages
        .last_mut()
        .and_then(|m| m.get_mut("content"))
        .and_then(Value::as_array_mut)
        .and_then(|blocks| blocks.last_mut())
    {
        last.insert("cache_control".into(), mark);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(system: &str, user: &str) -> Map<String, Value> {
        let Value::Object(map) = json!({
            "model": "claude-sonnet-4-5", "system": system,
            "messages": [{"role": "user", "content": [{"type": "text", "text": user}]}],
        }) else {
            unreachable!()
        };
        map
    }

    fn marks(body: &Map<String, Value>) -> usize {
        Value::Object(body.clone())
            .to_string()
            .matches("cache_control")
            .count()
    }

    #[test]
    fn marks_only_what_is_asked_and_long_enough() {
        let long = "x".repeat(5000);
        let both = CacheHint {
            prefix: true,
            newest: true,
            key: None,
        };
        let mut b = body(&long, "hi");
        mark_anthropic(&mut b, &both);
        assert_eq!(marks(&b), 2);
        assert_eq!(
            b["system"][0]["cache_control"],
            json!({"type": "ephemeral"})
        );

        let mut b = body(&long, "hi");
        mark_anthropic(&mut b, &CacheHint::default());
        assert_eq!(marks(&b), 0);
        assert!(b["system"].is_string(), "left as it was");

        let mut b = body("short", "hi");
        mark_anthropic(&mut b, &both);
        assert_eq!(marks(&b), 0, "below the minimum");

        assert_eq!(anthropic_min_tokens("claude-haiku-4-5-20251001"), 4096);
        assert_eq!(anthropic_min_tokens("claude-sonnet-4-6"), 2048);
        assert_eq!(anthropic_min_tokens("claude-opus-4-1"), 1024);
    }
}
