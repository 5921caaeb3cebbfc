//! The output limit (`max_tokens`) a task's requests carry, and what a step learns of it.
//!
//! Providers count the limit against the key's rate limits whatever the answer uses (OpenAI at
//! admission, Anthropic until the answer ends), so a blanket limit far above what a task writes
//! costs throughput. In order:
//!
//! 1. an explicit `max_output_tokens` (flag, step, pipeline, config) is sent as given;
//! 2. a task without tools whose answer schema bounds its size gets that bound;
//! 3. the tasks of a fan-out learn from the step's answers where there is a full limit to
//!    narrow (Anthropic, a local server): the first go with it, the rest with twice the
//!    longest answer so far plus a margin ([`learned_limit`]). A hosted OpenAI-compatible
//!    provider is sent none: it counts a request as the larger of its limit and its input,
//!    so any limit above a one-line task's input would cost the key's tokens for nothing;
//! 4. otherwise the full limit: none for a hosted OpenAI-compatible provider (the model's
//!    own), summon's runaway guard for a local server (4,096, less where the context window
//!    leaves less), 8,192 for Anthropic, which requires one.
//!
//! A task cut off at a bound of 2 or 3 is sent again once with the full limit: it is never
//! lost, never reported as cut off, and the re-send is counted.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::provider::ProviderKind;

/// summon's runaway guard for a local server, which otherwise writes until its context is
/// full.
pub(crate) const LOCAL_GUARD: u32 = 4096;
/// Anthropic requires a limit: the one sent when nothing narrower is known.
pub(crate) const ANTHROPIC_FULL: u32 = 8192;

pub(crate) use crate::event::{CapSource, CapSummary};

/// The output limit for a request, before any learning: `None` sends none.
pub(crate) fn full_limit(
    kind: ProviderKind,
    local: bool,
    window: Option<u64>,
    prompt: u64,
) -> Option<u32> {
    let left = window.map(|w| w.saturating_sub(prompt).max(1));
    let fit = |limit: u32| {
        Some(left.map_or(limit, |left| {
            u32::try_from(left.min(u64::from(limit))).unwrap_or(limit)
        }))
    };
    match kind {
        ProviderKind::Anthropic => fit(ANTHROPIC_FULL),
        ProviderKind::OpenAi if local => fit(LOCAL_GUARD),
        ProviderKind::OpenAi => None,
    }
}

/// The limit that fits answers of up to `needed` tokens, with a generous margin: twice that
/// plus 32, in steps of 16.
pub(crate) fn learned_limit(needed: u32) -> u32 {
    needed
        .saturating_mul(2)
        .saturating_add(32)
        .div_ceil(16)
        .saturating_mul(16)
}

/// The step's learning, shared by its tasks.
#[derive(Debug, Default)]
pub(crate) struct OutputCap {
    /// The step's tasks learn from each other's answers (a fan-out without an explicit limit).
    learns: bool,
    /// The longest answer (output tokens) of the step that was not cut off; 0: none yet.
    needed: AtomicU32,
    /// An answer has been recorded.
    answered: AtomicBool,
    /// Answers cut off at a learned or schema bound and sent again with the full limit.
    resent: AtomicU64,
    /// The largest limit a request of the step was sent with, and the smallest (u32::MAX:
    /// none yet); 0 in `largest`: none sent with a limit.
    largest: AtomicU32,
    smallest: AtomicU32,
    /// The source of the limits sent, as `CapSource as u8 + 1`: the last one seen (a step's
    /// tasks share it; the first goes with the full limit).
    source: AtomicU32,
}

impl OutputCap {
    /// A step whose tasks learn from each other's answers.
    pub(crate) fn learning() -> Self {
        Self {
            learns: true,
            smallest: AtomicU32::new(u32::MAX),
            ..Self::default()
        }
    }

    /// A task on its own: nothing to learn from.
    pub(crate) fn solo() -> Self {
        Self {
            smallest: AtomicU32::new(u32::MAX),
            ..Self::default()
        }
    }

    /// Whether the step's other tasks should wait for its first answer to learn from.
    pub(crate) fn waits_for_first_answer(&self) -> bool {
        self.learns && !self.answered.load(Ordering::Relaxed)
    }

    /// The limit to send and why: `explicit`, else `schema` (a bound of a task without
    /// tools), else what the step learned, else `full`.
    pub(crate) fn choose(
        &self,
        explicit: Option<u32>,
        schema: Option<u32>,
        full: Option<u32>,
    ) -> (Option<u32>, CapSource) {
        let narrower = |bound: u32| full.map_or(bound, |full| bound.min(full));
        let chosen = if let Some(limit) = explicit {
            (Some(limit), CapSource::Explicit)
        } else if let Some(bound) = schema {
            (Some(narrower(bound)), CapSource::Schema)
        } else if self.learns && full.is_some() && self.answered.load(Ordering::Relaxed) {
            let needed = self.needed.load(Ordering::Relaxed);
            (Some(narrower(learned_limit(needed))), CapSource::Learned)
        } else {
            (full, CapSource::Full)
        };
        if let Some(limit) = chosen.0 {
            self.largest.fetch_max(limit, Ordering::Relaxed);
            self.smallest.fetch_min(limit, Ordering::Relaxed);
        }
        self.source.store(chosen.1 as u32 + 1, Ordering::Relaxed);
        chosen
    }

    /// An answer of `output_tokens` that was not cut off.
    pub(crate) fn answered(&self, output_tokens: u64) {
        let tokens = u32::try_from(output_tokens).unwrap_or(u32::MAX);
        self.needed.fetch_max(tokens, Ordering::Relaxed);
        self.answered.store(true, Ordering::Relaxed);
    }

    /// An answer cut off at a bound narrower than the full limit: it is sent again with the
    /// full limit, and the step learns that its answers need more than `limit`.
    pub(crate) fn resend(&self, limit: u32) {
        self.resent.fetch_add(1, Ordering::Relaxed);
        self.needed.fetch_max(limit, Ordering::Relaxed);
    }

    /// Goes on from what an earlier attempt of the step had sent (a task it journaled, at the
    /// time it ended): every figure only grows, so the last one of them wins.
    pub(crate) fn seed(&self, earlier: &CapSummary) {
        if let Some(smallest) = earlier.smallest {
            self.smallest.fetch_min(smallest, Ordering::Relaxed);
        }
        if let Some(largest) = earlier.largest {
            self.largest.fetch_max(largest, Ordering::Relaxed);
        }
        if let Some(longest) = earlier.longest_answer {
            self.needed.fetch_max(longest, Ordering::Relaxed);
            self.answered.store(true, Ordering::Relaxed);
        }
        self.resent.fetch_max(earlier.resent, Ordering::Relaxed);
        // The source of the limits sent since then, if any, is the later one.
        let _ = self.source.compare_exchange(
            0,
            earlier.source as u32 + 1,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// What the step's requests were sent with, for the report; `None` when none was sent.
    pub(crate) fn summary(&self) -> Option<CapSummary> {
        if self.source.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let smallest = self.smallest.load(Ordering::Relaxed);
        let largest = self.largest.load(Ordering::Relaxed);
        let source = match self.source.load(Ordering::Relaxed) {
            1 => CapSource::Explicit,
            2 => CapSource::Schema,
            3 => CapSource::Learned,
            _ => CapSource::Full,
        };
        let needed = self.needed.load(Ordering::Relaxed);
        Some(CapSummary {
            source,
            smallest: (smallest != u32::MAX).then_some(smallest),
            largest: (largest > 0).then_some(largest),
            longest_answer: self.answered.load(Ordering::Relaxed).then_some(needed),
            resent: self.resent.load(Ordering::Relaxed),
        })
    }
}

/// The most tokens an answer that validates against `schema` can take, when the schema bounds
/// it: every string an `enum`/`const` or with `maxLength`, every array with `maxItems`, no
/// reference. Counted as one token per character, doubled, plus 64 for whitespace and the
/// provider's own framing.
pub(crate) fn schema_bound(schema: &serde_json::Value) -> Option<u32> {
    let chars = max_chars(schema, 0)?;
    u32::try_from(chars.saturating_mul(2).saturating_add(64)).ok()
}

fn max_chars(schema: &serde_json::Value, depth: u32) -> Option<u64> {
    use serde_json::Value;
    if depth > 16 {
        return None;
    }
    let Value::Object(map) = schema else {
        // `true` (anything) is unbounded; `false` admits nothing.
        return (schema == &Value::Bool(false)).then_some(0);
    };
    if map.contains_key("$ref") || map.contains_key("additionalItems") {
        return None;
    }
    if let Some(values) = map.get("enum").and_then(Value::as_array) {
        return values.iter().map(|v| v.to_string().len() as u64).max();
    }
    if let Some(value) = map.get("const") {
        return Some(value.to_string().len() as u64);
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(options) = map.get(key).and_then(Value::as_array) {
            return options
                .iter()
                .map(|o| max_chars(o, depth + 1))
                .try_fold(0, |acc, n| n.map(|n| acc.max(n)));
        }
    }
    let types: Vec<&str> = match map.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => return None,
    };
    types
        .into_iter()
        .map(|t| match t {
            "null" => Some(4),
            "boolean" => Some(5),
            "integer" => Some(20),
            "number" => Some(24),
            "string" => map
                .get("maxLength")
                .and_then(Value::as_u64)
                // Escapes may double a character.
                .map(|n| n.saturating_mul(2).saturating_add(2)),
            "array" => {
                let items = map
                    .get("items")
                    .map_or(Some(0), |i| max_chars(i, depth + 1))?;
                let count = map.get("maxItems").and_then(Value::as_u64)?;
                Some(
                    count
                        .saturating_mul(items.saturating_add(2))
                        .saturating_add(2),
                )
            }
            "object" => {
                if map
                    .get("additionalProperties")
                    .is_some_and(|a| a != &Value::Bool(false))
                {
                    return None;
                }
                let properties = map.get("properties").and_then(Value::as_object);
                properties.map_or(Some(2), |properties| {
                    properties.iter().try_fold(2u64, |acc, (name, value)| {
                        let value = max_chars(value, depth + 1)?;
                        Some(acc + name.len() as u64 + 4 + value)
                    })
                })
            }
            _ => None,
        })
        .try_fold(0, |acc, n| n.map(|n| acc.max(n)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_full_limit_depends_on_the_provider() {
        assert_eq!(full_limit(ProviderKind::OpenAi, false, None, 0), None);
        assert_eq!(full_limit(ProviderKind::OpenAi, true, None, 0), Some(4096));
        assert_eq!(
            full_limit(ProviderKind::OpenAi, true, Some(2048), 1000),
            Some(1048)
        );
        assert_eq!(
            full_limit(ProviderKind::Anthropic, false, None, 0),
            Some(8192)
        );
    }

    #[test]
    fn a_step_learns_from_its_answers() {
        let cap = OutputCap::learning();
        assert!(cap.waits_for_first_answer());
        assert_eq!(
            cap.choose(None, None, Some(4096)),
            (Some(4096), CapSource::Full)
        );
        cap.answered(12);
        assert!(!cap.waits_for_first_answer());
        assert_eq!(
            cap.choose(None, None, Some(4096)),
            (Some(64), CapSource::Learned)
        );
        // A hosted OpenAI-compatible provider's full limit is none, and it is sent none: a
        // learned one would count against its tokens per minute above the input.
        assert_eq!(cap.choose(None, None, None), (None, CapSource::Full));
        cap.answered(1500);
        assert_eq!(cap.choose(None, None, Some(4096)).0, Some(3040));
        cap.resend(3040);
        assert_eq!(cap.choose(None, None, Some(4096)).0, Some(4096));
        // An explicit limit always wins, a schema bound before learning.
        assert_eq!(
            cap.choose(Some(77), Some(50), Some(4096)),
            (Some(77), CapSource::Explicit)
        );
        assert_eq!(
            cap.choose(None, Some(50), Some(4096)),
            (Some(50), CapSource::Schema)
        );
        let summary = cap.summary().expect("requests were sent");
        assert_eq!(summary.resent, 1);
        assert_eq!(summary.smallest, Some(50));
        assert_eq!(summary.largest, Some(4096));
        assert_eq!(summary.longest_answer, Some(3040));
    }

    #[test]
    fn a_solo_task_goes_with_the_full_limit() {
        let cap = OutputCap::solo();
        assert_eq!(cap.summary(), None);
        assert!(!cap.waits_for_first_answer());
        cap.answered(10);
        assert_eq!(cap.choose(None, None, None), (None, CapSource::Full));
        assert_eq!(
            cap.summary().expect("sent").describe(),
            "none sent (the full limit)"
        );
    }

    #[test]
    fn schemas_that_bound_their_answers() {
        let label = json!({"type": "object", "additionalProperties": false,
            "properties": {"label": {"enum": ["bug", "billing", "feature-request"]}},
            "required": ["label"]});
        // {"label":"feature-request"}: 2 + 5 + 4 + 17 = 28 characters.
        assert_eq!(schema_bound(&label), Some(28 * 2 + 64));
        let bounded = json!({"type": "array", "maxItems": 3,
            "items": {"type": "string", "maxLength": 10}});
        assert_eq!(schema_bound(&bounded), Some((3 * 24 + 2) * 2 + 64));
        for open in [
            json!({"type": "string"}),
            json!({"type": "array", "items": {"type": "integer"}}),
            json!({"type": "object", "additionalProperties": true}),
            json!({"$ref": "#/definitions/x"}),
            json!({"type": "object", "properties": {"a": {"type": "string"}}}),
            json!(true),
        ] {
            assert_eq!(schema_bound(&open), None, "{open}");
        }
    }
}
