//! Answers the way chat models often give JSON: for a share of first answers, a sentence and a
//! fenced ```` ```json ```` block instead of the bare value. Which requests are fenced is drawn
//! from a hash of the seed and the request's last user message, so the same tasks are fenced
//! in every run with the same seed, whatever order the requests arrive in. A correction turn
//! (a request with an assistant message) is always answered bare.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

use crate::{RecordedRequest, Reply, Rule};

/// Which answers are fenced, and how.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FencePlan {
    /// The share (0..1) of first answers that are fenced.
    pub rate: f64,
    /// Seed of the draw.
    pub seed: u64,
    /// The fenced JSON is written with single quotes, so no JSON parser reads it: every fenced
    /// answer then costs one correction request, as when answers were validated without
    /// lenient extraction.
    pub broken: bool,
}

/// Counts of the answers given.
#[derive(Debug, Default)]
pub struct FenceStats {
    pub first: AtomicU64,
    pub fenced: AtomicU64,
    pub corrections: AtomicU64,
}

impl FencePlan {
    /// Whether the first answer to `text` is fenced.
    pub fn fences(&self, text: &str) -> bool {
        // FNV-1a over the seed and the text, mixed (its high bits alone are poorly spread for
        // texts that differ in their last bytes), then a 53-bit fraction.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.seed.to_le_bytes().iter().chain(text.as_bytes()) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        hash ^= hash >> 33;
        hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
        hash ^= hash >> 33;
        hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        hash ^= hash >> 33;
        ((hash >> 11) as f64 / (1u64 << 53) as f64) < self.rate
    }

    /// `answer` (a JSON text) fenced after a sentence.
    pub fn fence(&self, answer: &str) -> String {
        let inner = if self.broken {
            answer.replace('"', "'")
        } else {
            answer.to_owned()
        };
        format!("Here is the classification you asked for:\n```json\n{inner}\n```")
    }

    /// A rule answering `answer`, fenced as planned, counting into `stats`.
    pub fn rule(self, answer: String, stats: Arc<FenceStats>) -> Rule {
        Arc::new(move |request: &RecordedRequest| {
            let correction = request
                .body
                .get("messages")
                .and_then(Value::as_array)
                .is_some_and(|m| m.iter().any(|m| m["role"] == "assistant"));
            if correction {
                stats.corrections.fetch_add(1, Ordering::Relaxed);
                return Reply::Text(answer.clone());
            }
            stats.first.fetch_add(1, Ordering::Relaxed);
            let text = request.last_user_text().unwrap_or_default();
            if self.fences(&text) {
                stats.fenced.fetch_add(1, Ordering::Relaxed);
                Reply::Text(self.fence(&answer))
            } else {
                Reply::Text(answer.clone())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draw_is_deterministic_and_near_the_rate() {
        let plan = FencePlan {
            rate: 0.3,
            seed: 7,
            broken: false,
        };
        let fenced = (0..10_000)
            .filter(|i| plan.fences(&format!("task {i}")))
            .count();
        assert!((2_800..3_200).contains(&fenced), "{fenced}");
        let again = (0..10_000)
            .filter(|i| plan.fences(&format!("task {i}")))
            .count();
        assert_eq!(fenced, again);
        let other = FencePlan { seed: 8, ..plan };
        assert!(
            (0..100)
                .any(|i| plan.fences(&format!("task {i}")) != other.fences(&format!("task {i}")))
        );
    }

    #[test]
    fn a_broken_fence_holds_no_json() {
        let plan = FencePlan {
            rate: 1.0,
            seed: 0,
            broken: true,
        };
        let text = plan.fence(r#"{"category":"bug"}"#);
        assert!(text.contains("```json\n{'category':'bug'}\n```"), "{text}");
    }
}
