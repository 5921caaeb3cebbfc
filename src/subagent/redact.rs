//! Keeps the provider's API key and the values of `env_keys` variables out of everything a
//! subagent run reports.
//!
//! An MCP server gets `env_keys` values by design, and a tool result may hand one to the
//! model, which may repeat it in its answer; a provider may quote one back in an error; a model
//! that found the API key somewhere (a file, a command's output) may write it in its answer.
//! Whatever the path, the run's result (final text, failure message, structured answer) and
//! every event it sends to its observer (progress lines, the store, `--out` files, JUnit)
//! carry `[redacted]` instead. What goes to the provider and to the servers is left as it is.

use serde_json::Value;

use super::event::SubagentEvent;
use super::run::{SubagentResult, SubagentStatus};
use crate::mcp::ServerSpec;
use crate::provider::{MIN_KEY_CHARS, Secret};

/// Shorter values are not replaced: a `1` or `true` would be cut out of every text.
const MIN_SECRET_LEN: usize = 6;

const REDACTED: &str = "[redacted]";

/// The secret values of one run, longest first (so a value that contains another goes whole).
/// No `Debug`: it would print them.
pub(crate) struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    /// The secrets of a run: the `env_keys` values of its `servers`, and `keys`, its
    /// provider's and the other configured ones (each when long enough to be a real key, as in
    /// provider errors: see [`crate::provider::redact`]).
    pub(crate) fn new<'a>(
        servers: &'a [ServerSpec],
        keys: impl IntoIterator<Item = &'a Secret>,
    ) -> Self {
        let keys = keys
            .into_iter()
            .map(Secret::expose)
            .filter(|key| key.chars().count() >= MIN_KEY_CHARS);
        Self::of(
            servers
                .iter()
                .flat_map(|server| server.secrets.iter().map(String::as_str))
                .chain(keys)
                .map(str::to_owned),
        )
    }

    fn of(values: impl IntoIterator<Item = String>) -> Self {
        let mut secrets: Vec<String> = values
            .into_iter()
            .filter(|s| s.len() >= MIN_SECRET_LEN)
            .collect();
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        Self { secrets }
    }

    fn in_place(&self, text: &mut String) {
        for secret in &self.secrets {
            if text.contains(secret.as_str()) {
                *text = text.replace(secret.as_str(), REDACTED);
            }
        }
    }

    fn value(&self, value: &mut Value) {
        match value {
            Value::String(text) => self.in_place(text),
            Value::Array(items) => items.iter_mut().for_each(|v| self.value(v)),
            Value::Object(map) => map.values_mut().for_each(|v| self.value(v)),
            _ => {}
        }
    }

    /// `text` and a structured answer with every secret replaced (a batch's answers, which do
    /// not pass through [`Self::result`]).
    pub(crate) fn answer(&self, text: &mut String, structured: Option<&mut Value>) {
        self.in_place(text);
        if let Some(value) = structured {
            self.value(value);
        }
    }

    /// The event with every text it carries redacted.
    pub(crate) fn event(&self, mut event: SubagentEvent) -> SubagentEvent {
        if self.secrets.is_empty() {
            return event;
        }
        match &mut event {
            SubagentEvent::Retry { reason, .. } | SubagentEvent::CheckRetry { reason, .. } => {
                self.in_place(reason);
            }
            SubagentEvent::ToolCall { summary, .. } => self.in_place(summary),
            SubagentEvent::SchemaRetry { errors } => self.in_place(errors),
            SubagentEvent::Text { text } => self.in_place(text),
            SubagentEvent::Warning { message } => self.in_place(message),
            SubagentEvent::Turn { .. }
            | SubagentEvent::StartupWait { .. }
            | SubagentEvent::Held { .. }
            | SubagentEvent::HeldFor { .. }
            | SubagentEvent::Tokens { .. }
            | SubagentEvent::Response { .. }
            | SubagentEvent::ToolStarted { .. }
            | SubagentEvent::Started { .. }
            | SubagentEvent::Framing { .. } => {}
        }
        event
    }

    /// The result with its text, failure message and structured answer redacted.
    pub(crate) fn result(&self, mut result: SubagentResult) -> SubagentResult {
        if self.secrets.is_empty() {
            return result;
        }
        self.in_place(&mut result.text);
        if let SubagentStatus::Failed(failure) = &mut result.status {
            self.in_place(&mut failure.message);
        }
        if let Some(value) = &mut result.structured {
            self.value(value);
        }
        for warning in &mut result.warnings {
            self.in_place(warning);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    #[test]
    fn the_provider_key_goes_when_it_is_long_enough_to_be_a_key() {
        let key = Secret::new("sk-live-0123456789");
        let mut text = "the key is sk-live-0123456789, the model said".to_owned();
        Redactor::new(&[], [&key]).in_place(&mut text);
        assert_eq!(text, "the key is [redacted], the model said");
        // A placeholder such as Ollama's is no secret: the word stays in every answer.
        let mut text = "ask ollama".to_owned();
        Redactor::new(&[], [&Secret::new("ollama")]).in_place(&mut text);
        assert_eq!(text, "ask ollama");
    }

    #[test]
    fn texts_events_and_results_lose_their_secrets() {
        let r =
            Redactor::of(["tok-123456", "tok-123456-long", "abc", "tok-123456"].map(String::from));
        let mut text = "a tok-123456-long and tok-123456, abc stays".to_owned();
        r.in_place(&mut text);
        assert_eq!(text, "a [redacted] and [redacted], abc stays");
        let SubagentEvent::Warning { message } = r.event(SubagentEvent::Warning {
            message: "bad: tok-123456".into(),
        }) else {
            panic!("not a warning")
        };
        assert_eq!(message, "bad: [redacted]");
        let result = r.result(SubagentResult {
            status: SubagentStatus::Failed(crate::event::Failure::other("quoted tok-123456")),
            text: "said tok-123456".into(),
            structured: Some(json!({"k": ["tok-123456", 1]})),
            extracted: false,
            corrections: 0,
            turns: 1,
            tool_calls: 0,
            usage: crate::provider::Usage::default(),
            duration: Duration::ZERO,
            warnings: vec!["server said tok-123456".into()],
            service_tier: None,
        });
        assert_eq!(result.warnings, ["server said [redacted]"]);
        assert_eq!(result.text, "said [redacted]");
        assert_eq!(
            result.status,
            SubagentStatus::Failed(crate::event::Failure::other("quoted [redacted]"))
        );
        assert_eq!(result.structured, Some(json!({"k": ["[redacted]", 1]})));
    }
}
