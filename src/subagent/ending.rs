//! Whether a model's answer counts: one cut off at the output limit, stopped by a content
//! filter, refused, or empty is a failed task, not a result, however politely the provider
//! answered (HTTP 200).

use crate::provider::ChatResponse;

/// A cut-off answer's problem, naming summon's default output limit when that is the one the
/// request ran under (`sent`; nothing was `set`), and how to raise it.
pub(crate) fn name_default_limit(problem: String, sent: Option<u32>, set: Option<u32>) -> String {
    match sent {
        Some(limit) if set.is_none() && problem.starts_with("the answer was cut off") => format!(
            "the answer was cut off at summon's default output limit ({limit} tokens); \
             set max_output_tokens (or --max-output-tokens) to allow more"
        ),
        _ => problem,
    }
}

/// Why `response` is not an answer the task can end or go on with, if it is not.
///
/// `limit` is the output limit the request ran under (the provider's default when the request
/// set none and the provider has one); without it the answer's own output count is named.
/// A turn that called tools needs no text; a final answer does, unless `allow_empty`.
pub(crate) fn answer_problem(
    response: &ChatResponse,
    limit: Option<u32>,
    allow_empty: bool,
) -> Option<String> {
    match response.stop_reason.as_deref() {
        // OpenAI `length`, Anthropic `max_tokens`.
        Some("length" | "max_tokens") => {
            let tokens = limit.map_or(response.usage.output_tokens, u64::from);
            return Some(format!(
                "the answer was cut off at the output limit ({tokens} tokens)"
            ));
        }
        Some(reason @ "content_filter") => {
            return Some(format!(
                "the provider's content filter stopped the answer (finish_reason: {reason})"
            ));
        }
        Some(reason @ "refusal") => {
            return Some(format!(
                "the model refused to answer (stop_reason: {reason})"
            ));
        }
        _ => {}
    }
    let blank = response.text.as_deref().is_none_or(|t| t.trim().is_empty());
    if response.tool_calls.is_empty() && blank && !allow_empty {
        return Some("the model returned no text".to_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{ToolCall, Usage};

    fn answer(text: Option<&str>, stop: &str) -> ChatResponse {
        ChatResponse {
            text: text.map(str::to_owned),
            tool_calls: Vec::new(),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 77,
                ..Usage::default()
            },
            stop_reason: Some(stop.to_owned()),
            service_tier: None,
        }
    }

    #[test]
    fn bad_endings_are_named() {
        let cut = "the answer was cut off at the output limit";
        assert_eq!(
            answer_problem(&answer(Some("half"), "length"), Some(50), false),
            Some(format!("{cut} (50 tokens)"))
        );
        assert_eq!(
            answer_problem(&answer(Some("half"), "max_tokens"), None, true),
            Some(format!("{cut} (77 tokens)"))
        );
        assert!(
            answer_problem(&answer(None, "content_filter"), None, true)
                .unwrap()
                .contains("content filter")
        );
        assert!(
            answer_problem(&answer(None, "refusal"), None, true)
                .unwrap()
                .contains("refused")
        );
    }

    #[test]
    fn only_a_final_answer_needs_text() {
        let empty = "the model returned no text";
        for text in [None, Some(""), Some(" \n")] {
            assert_eq!(
                answer_problem(&answer(text, "stop"), None, false).as_deref(),
                Some(empty)
            );
            assert_eq!(answer_problem(&answer(text, "stop"), None, true), None);
        }
        let mut calling = answer(None, "tool_calls");
        calling.tool_calls.push(ToolCall {
            id: "c".into(),
            name: "read_file".into(),
            arguments: serde_json::json!({}),
            unreadable: None,
        });
        assert_eq!(answer_problem(&calling, None, false), None);
        assert_eq!(
            answer_problem(&answer(Some("fine"), "end_turn"), None, false),
            None
        );
    }
}
