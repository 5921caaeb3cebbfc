//! Prompt caching as the providers document it, so tests can assert exact cache token counts.
//!
//! Tokens are counted the way the rest of the mock counts them: a quarter of the characters of
//! the serialized JSON (of a block, or of the whole body for the request's total), rounded
//! down, so a count is a function of the request alone.
//!
//! Anthropic (Messages): the request is a sequence of blocks in cache order, tools, then
//! system, then each message's content blocks; a block with `cache_control` is a breakpoint
//! (more than 4 are refused with HTTP 400). A request reads the longest cached prefix that ends
//! at a breakpoint or up to 20 blocks before one, and writes the prefix up to its last
//! breakpoint whose prefix reaches the model's minimum (1,024 tokens; 2,048 for Sonnet 4.6 and
//! Haiku 3.x; 4,096 for Opus 4.5/4.6 and Haiku 4.5). Usage reports `cache_read_input_tokens`,
//! `cache_creation_input_tokens` and, as `input_tokens`, the uncached rest.
//!
//! OpenAI (Chat Completions): the tools and then the messages in order, as serialized, form the
//! prefix; prompts of 1,024 tokens or more are cached automatically in 128-token steps and a
//! request reads the longest cached step that is an exact prefix of its own.
//! `usage.prompt_tokens_details.cached_tokens` reports it (included in `prompt_tokens`).
//!
//! Both: an entry becomes readable only when the response that wrote it is sent (requests
//! that arrive together all miss and all write), and lives 5 minutes from its last use
//! ([`crate::MockConfig::cache_ttl`]). Entries are per model.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use crate::Api;

/// The documented default lifetime of an entry.
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);
/// The most `cache_control` breakpoints a request may carry.
pub const MAX_BREAKPOINTS: usize = 4;
/// How many blocks before a breakpoint a read looks back for an earlier entry.
const LOOKBACK: usize = 20;
/// OpenAI's minimum cached prefix and the step it grows in.
pub const OPENAI_MIN: u64 = 1024;
pub const OPENAI_STEP: u64 = 128;

/// Tokens of a piece of text or JSON as the mock counts them.
pub fn tokens(chars: usize) -> u64 {
    chars as u64 / 4
}

/// The smallest prefix Anthropic caches for `model`, in tokens.
pub fn anthropic_min_tokens(model: &str) -> u64 {
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

/// One block of an Anthropic request in cache order.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    /// Tokens of this block and every block before it.
    pub prefix_tokens: u64,
    /// Whether the block carries `cache_control`.
    pub breakpoint: bool,
    /// A hash of the prefix up to and including this block (without the breakpoints).
    hash: u64,
}

/// The blocks of an Anthropic Messages body in cache order: tools, system, message content.
pub fn anthropic_blocks(body: &Value) -> Vec<Block> {
    let mut out = Vec::new();
    let mut hasher = DefaultHasher::new();
    let mut prefix = 0u64;
    let mut push = |kind: &str, block: &Value| {
        let breakpoint = block.get("cache_control").is_some();
        let bare = match block {
            Value::Object(map) => {
                let mut map: Map<String, Value> = map.clone();
                map.remove("cache_control");
                Value::Object(map)
            }
            other => other.clone(),
        };
        let text = bare.to_string();
        kind.hash(&mut hasher);
        text.hash(&mut hasher);
        prefix += tokens(text.len());
        out.push(Block {
            prefix_tokens: prefix,
            breakpoint,
            hash: hasher.finish(),
        });
    };
    for tool in body
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        push("tool", tool);
    }
    match body.get("system") {
        Some(Value::String(text)) => push("system", &json!({"type": "text", "text": text})),
        Some(Value::Array(blocks)) => blocks.iter().for_each(|b| push("system", b)),
        _ => {}
    }
    for message in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        match message.get("content") {
            Some(Value::String(text)) => push(role, &json!({"type": "text", "text": text})),
            Some(Value::Array(blocks)) => blocks.iter().for_each(|b| push(role, b)),
            _ => {}
        }
    }
    out
}

/// The prefix hashes of an OpenAI body at each cacheable step, with the step's tokens.
fn openai_steps(body: &Value) -> Vec<(u64, u64)> {
    let mut canonical = String::new();
    if let Some(tools) = body.get("tools") {
        canonical.push_str(&tools.to_string());
    }
    for message in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        canonical.push_str(&message.to_string());
    }
    let total = tokens(canonical.len());
    let bytes = canonical.as_bytes();
    let mut steps = Vec::new();
    let mut hasher = DefaultHasher::new();
    let mut hashed = 0usize;
    let mut step = OPENAI_MIN;
    while step <= total {
        let end = (step * 4) as usize;
        hasher.write(&bytes[hashed..end]);
        hashed = end;
        steps.push((hasher.finish(), step));
        step += OPENAI_STEP;
    }
    steps
}

/// What the cache did for one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Outcome {
    /// Tokens read from the cache.
    pub(crate) read: u64,
    /// Tokens written to the cache (Anthropic only; OpenAI does not bill writes).
    pub(crate) written: u64,
    /// Entries to make readable when the response is sent.
    pending: Vec<u64>,
    model: String,
}

/// The cache entries of one server.
#[derive(Debug)]
pub(crate) struct PromptCache {
    ttl: Duration,
    /// `(model, prefix hash)` → when the entry expires.
    entries: Mutex<HashMap<(String, u64), Instant>>,
}

impl PromptCache {
    pub(crate) fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the entry is live now; a hit refreshes its lifetime.
    fn hit(&self, entries: &mut HashMap<(String, u64), Instant>, key: (String, u64)) -> bool {
        let now = Instant::now();
        match entries.get_mut(&key) {
            Some(expires) if *expires > now => {
                *expires = now + self.ttl;
                true
            }
            Some(_) => {
                entries.remove(&key);
                false
            }
            None => false,
        }
    }

    /// Looks the request up at its arrival. `Err` is the 400 message of a request the API
    /// refuses (too many breakpoints).
    pub(crate) fn lookup(&self, api: Api, body: &Value) -> Result<Outcome, String> {
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let mut entries = crate::lock(&self.entries);
        match api {
            Api::Anthropic => {
                let blocks = anthropic_blocks(body);
                let breakpoints: Vec<usize> = (0..blocks.len())
                    .filter(|&i| blocks[i].breakpoint)
                    .collect();
                if breakpoints.len() > MAX_BREAKPOINTS {
                    return Err(format!(
                        "A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {}.",
                        breakpoints.len()
                    ));
                }
                let mut read_at: Option<usize> = None;
                for &b in &breakpoints {
                    for p in (b.saturating_sub(LOOKBACK)..=b).rev() {
                        if read_at.is_some_and(|r| r >= p) {
                            break;
                        }
                        if self.hit(&mut entries, (model.clone(), blocks[p].hash)) {
                            read_at = Some(p);
                            break;
                        }
                    }
                }
                let read = read_at.map_or(0, |p| blocks[p].prefix_tokens);
                let min = anthropic_min_tokens(&model);
                let cacheable: Vec<usize> = breakpoints
                    .iter()
                    .copied()
                    .filter(|&b| blocks[b].prefix_tokens >= min)
                    .collect();
                let written = cacheable
                    .iter()
                    .filter(|&&b| read_at.is_none_or(|r| b > r))
                    .map(|&b| blocks[b].prefix_tokens)
                    .max()
                    .map_or(0, |end| end - read);
                Ok(Outcome {
                    read,
                    written,
                    pending: cacheable.iter().map(|&b| blocks[b].hash).collect(),
                    model,
                })
            }
            Api::OpenAi => {
                let steps = openai_steps(body);
                let read = steps
                    .iter()
                    .rev()
                    .find(|(hash, _)| self.hit(&mut entries, (model.clone(), *hash)))
                    .map_or(0, |(_, tokens)| *tokens);
                Ok(Outcome {
                    read,
                    written: 0,
                    pending: steps.iter().map(|(hash, _)| *hash).collect(),
                    model,
                })
            }
            _ => Ok(Outcome::default()),
        }
    }

    /// Makes the entries a request wrote readable: its response is being sent.
    pub(crate) fn commit(&self, outcome: &Outcome) {
        let expires = Instant::now() + self.ttl;
        let mut entries = crate::lock(&self.entries);
        for hash in &outcome.pending {
            entries.insert((outcome.model.clone(), *hash), expires);
        }
    }
}

/// Writes the cache counts into a success body's `usage`; `total` is the request's whole input.
pub(crate) fn report(api: Api, body: &mut Value, outcome: &Outcome, total: u64) {
    let Some(usage) = body.get_mut("usage").and_then(Value::as_object_mut) else {
        return;
    };
    match api {
        Api::Anthropic => {
            let total = total.max(outcome.read + outcome.written);
            usage.insert(
                "input_tokens".into(),
                json!(total - outcome.read - outcome.written),
            );
            usage.insert("cache_creation_input_tokens".into(), json!(outcome.written));
            usage.insert("cache_read_input_tokens".into(), json!(outcome.read));
        }
        _ => {
            usage.insert(
                "prompt_tokens_details".into(),
                json!({"cached_tokens": outcome.read}),
            );
        }
    }
}

/// The whole input of a request as the mock counts it: at least its blocks' tokens.
pub(crate) fn total_tokens(api: Api, body_len: usize, body: &Value) -> u64 {
    // The output limit is a parameter, not input: a request's input does not change with it.
    let limit_bytes: usize = ["max_tokens", "max_completion_tokens"]
        .iter()
        .filter_map(|key| body.get(key).map(|v| key.len() + 4 + v.to_string().len()))
        .sum();
    let whole = tokens(body_len.saturating_sub(limit_bytes)).max(1);
    match api {
        Api::Anthropic => whole.max(anthropic_blocks(body).last().map_or(0, |b| b.prefix_tokens)),
        _ => whole,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize) -> String {
        "x".repeat(n)
    }

    fn anthropic(system_chars: usize, user: &str, breakpoint: bool) -> Value {
        let mut system = json!({"type": "text", "text": text(system_chars)});
        if breakpoint {
            system["cache_control"] = json!({"type": "ephemeral"});
        }
        json!({"model": "claude-sonnet-4-5", "max_tokens": 10, "system": [system],
               "messages": [{"role": "user", "content": user}]})
    }

    #[test]
    fn anthropic_reads_only_after_commit_and_only_above_the_minimum() {
        let cache = PromptCache::new(DEFAULT_TTL);
        let body = anthropic(8000, "a", true);
        let prefix = anthropic_blocks(&body)[0].prefix_tokens;
        let first = cache.lookup(Api::Anthropic, &body).unwrap();
        assert_eq!((first.read, first.written), (0, prefix));
        // Not yet sent: a second request misses too.
        let second = cache
            .lookup(Api::Anthropic, &anthropic(8000, "b", true))
            .unwrap();
        assert_eq!((second.read, second.written), (0, prefix));
        cache.commit(&first);
        let third = cache
            .lookup(Api::Anthropic, &anthropic(8000, "c", true))
            .unwrap();
        assert_eq!((third.read, third.written), (prefix, 0));
        // Below 1,024 tokens: nothing is written.
        let small = cache
            .lookup(Api::Anthropic, &anthropic(400, "a", true))
            .unwrap();
        assert_eq!((small.read, small.written), (0, 0));
        // No breakpoint: nothing read even though the prefix is cached.
        let plain = cache
            .lookup(Api::Anthropic, &anthropic(8000, "d", false))
            .unwrap();
        assert_eq!((plain.read, plain.written), (0, 0));
    }

    #[test]
    fn anthropic_refuses_a_fifth_breakpoint_and_expired_entries_miss() {
        let mark = json!({"type": "ephemeral"});
        let blocks: Vec<Value> = (0..5)
            .map(|i| json!({"type": "text", "text": format!("b{i}"), "cache_control": mark}))
            .collect();
        let body = json!({"model": "m", "system": blocks, "messages": []});
        let cache = PromptCache::new(DEFAULT_TTL);
        assert!(
            cache
                .lookup(Api::Anthropic, &body)
                .unwrap_err()
                .contains("maximum of 4")
        );

        let cache = PromptCache::new(Duration::ZERO);
        let body = anthropic(8000, "a", true);
        let first = cache.lookup(Api::Anthropic, &body).unwrap();
        cache.commit(&first);
        assert_eq!(cache.lookup(Api::Anthropic, &body).unwrap().read, 0);
    }

    #[test]
    fn openai_caches_prefixes_of_1024_tokens_in_128_token_steps() {
        let cache = PromptCache::new(DEFAULT_TTL);
        let body = |system: usize, user: &str| {
            json!({"model": "gpt", "messages": [
                {"role": "system", "content": text(system)},
                {"role": "user", "content": user},
            ]})
        };
        let short = cache.lookup(Api::OpenAi, &body(3000, "a")).unwrap();
        cache.commit(&short);
        assert_eq!(cache.lookup(Api::OpenAi, &body(3000, "b")).unwrap().read, 0);
        let first = cache.lookup(Api::OpenAi, &body(6000, "a")).unwrap();
        assert_eq!(first.read, 0);
        cache.commit(&first);
        // The shared part is the system message and the start of the user message.
        let shared = tokens(
            json!({"role": "system", "content": text(6000)})
                .to_string()
                .len(),
        );
        let expected = OPENAI_MIN + (shared - OPENAI_MIN) / OPENAI_STEP * OPENAI_STEP;
        assert_eq!(
            cache.lookup(Api::OpenAi, &body(6000, "b")).unwrap().read,
            expected
        );
    }
}
