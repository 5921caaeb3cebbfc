//! Per-task overhead: the input tokens a task's first request carries beyond the task's own
//! text (its rendered instructions, context, prompt and role text). That is the tool
//! definitions, summon's standard system prompt and the labels around the task's text (the
//! `# Reference Context` heading, the role label), counted with the estimator of the rest of summon
//! ([`crate::provider::estimate_tokens`]: about four bytes per token, the model name
//! included). Every task of a fan-out pays it, so it is what `--dry-run` and `report.json`
//! show per task.

use serde::{Deserialize, Serialize};

/// The overhead of one task's first request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Overhead {
    /// Every token beyond the task's own text, the tool definitions included.
    pub(crate) tokens: u64,
    /// Of those, the tool definitions (names, descriptions, parameter schemas).
    pub(crate) tool_tokens: u64,
}

impl Overhead {
    /// The overhead of a request whose system prompt is `system_len` bytes, first message
    /// `first_len`, model name `model_len` and tool definitions `tool_chars` (as
    /// [`crate::provider::tool_chars`] counts them), of which `content_len` bytes are the
    /// task's own text.
    pub(crate) fn count(
        system_len: usize,
        first_len: usize,
        model_len: usize,
        tool_chars: usize,
        content_len: usize,
    ) -> Self {
        let framing = (system_len + first_len + model_len).saturating_sub(content_len);
        Self {
            tokens: tokens(framing + tool_chars),
            tool_tokens: tokens(tool_chars),
        }
    }
}

/// Bytes to tokens, rounded up, as [`crate::provider::estimate_tokens`] counts.
fn tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4)
}

/// Overheads added up over a set of tasks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OverheadSum {
    /// Tasks counted.
    pub(crate) tasks: u64,
    pub(crate) tokens: u64,
    pub(crate) tool_tokens: u64,
    /// The largest of one task.
    pub(crate) per_task_max: u64,
    pub(crate) tool_tokens_per_task_max: u64,
}

impl OverheadSum {
    pub(crate) fn add(&mut self, one: Overhead) {
        self.tasks += 1;
        self.tokens += one.tokens;
        self.tool_tokens += one.tool_tokens;
        self.per_task_max = self.per_task_max.max(one.tokens);
        self.tool_tokens_per_task_max = self.tool_tokens_per_task_max.max(one.tool_tokens);
    }

    /// `{"tasks", "tokens", "tool_tokens", "per_task_max", "tool_tokens_per_task_max"}`, or
    /// `null` when no task was counted.
    pub(crate) fn json(&self) -> serde_json::Value {
        if self.tasks == 0 {
            return serde_json::Value::Null;
        }
        serde_json::json!({
            "tasks": self.tasks,
            "tokens": self.tokens,
            "tool_tokens": self.tool_tokens,
            "per_task_max": self.per_task_max,
            "tool_tokens_per_task_max": self.tool_tokens_per_task_max,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_task_text_is_not_overhead_and_tools_are() {
        // 100 bytes of framing around 400 of the task's own, no tools.
        let none = Overhead::count(300, 200, 0, 0, 400);
        assert_eq!(
            none,
            Overhead {
                tokens: 25,
                tool_tokens: 0
            }
        );
        let with_tools = Overhead::count(300, 200, 0, 801, 400);
        assert_eq!(with_tools.tool_tokens, 201);
        assert_eq!(with_tools.tokens, 226);
        let mut sum = OverheadSum::default();
        sum.add(none);
        sum.add(with_tools);
        assert_eq!(sum.json()["per_task_max"], 226);
        assert_eq!(sum.json()["tokens"], 251);
        assert!(OverheadSum::default().json().is_null());
    }
}
