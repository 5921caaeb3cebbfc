//! What a finished task looks like to the outputs.

use std::time::Duration;

use serde_json::Value;

use crate::provider::Usage;

/// One finished task, as the outputs see it.
#[derive(Debug, Clone, Default)]
pub(crate) struct TaskDone {
    pub(crate) step: usize,
    pub(crate) index: u64,
    pub(crate) item: serde_json::Value,
    pub(crate) ok: bool,
    pub(crate) output: String,
    pub(crate) structured: Option<serde_json::Value>,
    /// The structured answer was taken from a fenced block or the text around it.
    pub(crate) extracted: bool,
    /// Answers sent back for correction because they did not validate.
    pub(crate) corrections: u32,
    pub(crate) error: Option<super::Failure>,
    pub(crate) turns: u32,
    pub(crate) usage: Usage,
    pub(crate) duration: Duration,
    pub(crate) model: Option<String>,
    /// Taken from the journal of an earlier attempt of this run.
    pub(crate) resumed: bool,
    /// Taken from an earlier run that answered the same request (`--reuse`); cost nothing.
    pub(crate) reused: bool,
    /// The content hash of the rendered request.
    pub(crate) hash: String,
    /// The provider batch that answered it (`backend: batch`); priced at the batch rate.
    pub(crate) batch_id: Option<String>,
    /// When it started, what it was asked, the tools it called and the waits it met.
    pub(crate) trace: TaskTrace,
    /// What went wrong with the task's extensions (MCP servers), one line each.
    pub(crate) warnings: Vec<String>,
    /// The agent role the task ran as (its rendered `source:` names an agent), as seed 004
    /// labels its subagents.
    pub(crate) role: Option<String>,
}

impl TaskDone {
    /// Why it failed, as the outputs show it.
    pub(crate) fn error_message(&self) -> Option<&str> {
        self.error.as_ref().map(|failure| failure.message.as_str())
    }

    /// The spend cap, or a provider that refused the key or could not be reached, refused the
    /// task's first request: it sent nothing and is not a result (a resumed run sends it).
    pub(crate) fn not_started(&self) -> bool {
        let Some(error) = &self.error else {
            return false;
        };
        // A request not sent to a stopped provider counts as a turn that spent nothing.
        let refused = error.class == super::FailureClass::Budget && self.turns == 0;
        let not_sent = error.class == super::FailureClass::Provider("not_sent");
        (refused || not_sent) && self.usage.total() == 0
    }
}

/// What the run journal keeps of a finished task beyond its answer and counts (the `meta`
/// column of its row, as JSON): what a resumed run needs to report the task as the attempt
/// that ran it did — its model (and so its price), role, prompt, attempts and retries.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub(crate) struct TaskMeta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) role: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) extracted: bool,
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) corrections: u32,
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub(crate) cache_read_tokens: u64,
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub(crate) cache_write_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) service_tier: Option<String>,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub(crate) retry_classes: std::collections::BTreeMap<String, u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) warnings: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cap: Option<super::CapSummary>,
    pub(crate) trace: TaskTrace,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

impl TaskMeta {
    pub(crate) fn of(done: &TaskDone) -> Self {
        Self {
            model: done.model.clone(),
            role: done.role.clone(),
            extracted: done.extracted,
            corrections: done.corrections,
            cache_read_tokens: done.usage.cache_read_tokens,
            cache_write_tokens: done.usage.cache_write_tokens,
            service_tier: done.trace.service_tier.clone(),
            retry_classes: done.trace.retry_classes.clone(),
            warnings: done.warnings.clone(),
            cap: done.trace.cap.clone(),
            trace: TaskTrace {
                // Times belong to the clock of the attempt that ran it.
                started_ms: None,
                waits: Vec::new(),
                ..done.trace.clone()
            },
        }
    }

    /// Gives `done`, a task taken from the journal, what its attempt knew of it.
    pub(crate) fn restore(self, done: &mut TaskDone) {
        done.model = self.model;
        done.role = self.role;
        done.extracted = self.extracted;
        done.corrections = self.corrections;
        done.usage.cache_read_tokens = self.cache_read_tokens;
        done.usage.cache_write_tokens = self.cache_write_tokens;
        done.warnings = self.warnings;
        done.trace = TaskTrace {
            started_ms: None,
            waits: Vec::new(),
            service_tier: self.service_tier,
            retry_classes: self.retry_classes,
            cap: self.cap,
            in_flight: Spent::default(),
            ..self.trace
        };
    }
}

/// What `results.jsonl` and `report.html` tell about a task beyond its answer: enough to
/// draw it on a timeline and to show what it was asked and what it did.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub(crate) struct TaskTrace {
    /// When it started, in milliseconds from the start of the run that ran it; `None` for a
    /// task not run by this process (resumed, reused).
    pub(crate) started_ms: Option<u64>,
    /// How many times it ran (1, more with a step's `retries`; 0 when it did not run here).
    pub(crate) attempts: u32,
    /// Provider requests sent again after a transient failure.
    pub(crate) retries: u32,
    /// Of those, the ones refused by a rate limit (HTTP 429).
    pub(crate) rate_limited: u32,
    /// Time spent waiting before those retries.
    pub(crate) retry_wait_ms: u64,
    /// When it waited with no request on the wire — before a retry, or for a provider still
    /// starting — as `[from, ms]`, `from` in milliseconds from the start of the run: it was not
    /// in flight then. At most [`WAITS_KEPT`]; no key is written when there were none.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub(crate) waits: Vec<[u64; 2]>,
    /// The tools it called, in call order.
    pub(crate) tools: Vec<ToolUse>,
    /// The service tier the provider says served its last answer (`default`, `flex`,
    /// `priority`); the task is priced at it (not written to `results.jsonl`).
    #[serde(skip)]
    pub(crate) service_tier: Option<String>,
    /// The rendered first message sent to the model, at most [`PROMPT_LIMIT`] bytes.
    pub(crate) prompt: Option<String>,
    /// The estimated tokens of its first request beyond its own text, tool definitions
    /// included ([`super::overhead`](super::Overhead)); `None` when it sent no request here.
    pub(crate) overhead_tokens: Option<u64>,
    /// Of those, the tool definitions.
    pub(crate) tool_tokens: Option<u64>,
    /// What the attempt in flight has spent so far (its turns and tokens), so that an attempt
    /// stopped by its timeout or a cancel is still billed for them.
    #[serde(skip)]
    pub(crate) in_flight: Spent,
    /// Its provider retries by class (`rate_limited`, `server_error`, ...), for the run
    /// report's `retries_by_class` after a `--resume` (not written to `results.jsonl`).
    #[serde(skip)]
    pub(crate) retry_classes: std::collections::BTreeMap<String, u32>,
    /// The output limits its step's requests had been sent with when it ended (journaled,
    /// so that a resumed run goes on from them; not written to `results.jsonl`).
    #[serde(skip)]
    pub(crate) cap: Option<super::CapSummary>,
}

/// Turns taken and tokens billed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Spent {
    pub(crate) turns: u32,
    pub(crate) usage: Usage,
}

/// The most of a prompt kept for the outputs; a synthesis prompt can hold every result of a
/// large fan-out, which `results.jsonl` already has.
pub(crate) const PROMPT_LIMIT: usize = 16 * 1024;

/// The most waits of a task kept for the outputs' timeline.
pub(crate) const WAITS_KEPT: usize = 64;

/// The most of a tool call's summary kept for the outputs.
pub(crate) const TOOL_SUMMARY_LIMIT: usize = 200;

/// One tool call of a task.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ToolUse {
    pub(crate) name: String,
    pub(crate) ok: bool,
    /// The first line of what the tool answered, shortened.
    pub(crate) summary: String,
}

impl TaskTrace {
    /// The trace of a `results.jsonl` line (what it lacks, as for a task not run here).
    pub(crate) fn from_line(line: &serde_json::Value) -> Self {
        let number = |key: &str| line[key].as_u64().unwrap_or_default();
        let small = |key: &str| u32::try_from(number(key)).unwrap_or(u32::MAX);
        Self {
            started_ms: line["started_ms"].as_u64(),
            attempts: small("attempts"),
            retries: small("retries"),
            rate_limited: small("rate_limited"),
            retry_wait_ms: number("retry_wait_ms"),
            waits: serde_json::from_value(line["waits"].clone()).unwrap_or_default(),
            tools: serde_json::from_value(line["tools"].clone()).unwrap_or_default(),
            prompt: line["prompt"].as_str().map(str::to_owned),
            overhead_tokens: line["overhead_tokens"].as_u64(),
            tool_tokens: line["tool_tokens"].as_u64(),
            service_tier: None,
            in_flight: Spent::default(),
            retry_classes: std::collections::BTreeMap::new(),
            cap: None,
        }
    }

    /// Keeps at most `limit` bytes of `text` (cut at a character boundary), saying how much
    /// was left out.
    pub(crate) fn clip(text: &str, limit: usize) -> String {
        if text.len() <= limit {
            return text.to_owned();
        }
        let mut end = limit;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}… [{} more bytes]", &text[..end], text.len() - end)
    }

    /// The overhead of the task's first request, `None` when it sent none here.
    pub(crate) fn overhead(&self) -> Option<super::Overhead> {
        Some(super::Overhead {
            tokens: self.overhead_tokens?,
            tool_tokens: self.tool_tokens.unwrap_or_default(),
        })
    }

    /// Records a tool call.
    pub(crate) fn tool(&mut self, name: &str, ok: bool, summary: &str) {
        self.tools.push(ToolUse {
            name: name.to_owned(),
            ok,
            summary: Self::clip(summary, TOOL_SUMMARY_LIMIT),
        });
    }

    /// Records a wait of `delay` that starts `at` after the start of the run.
    pub(crate) fn waited(&mut self, at: Duration, delay: Duration) {
        if self.waits.len() < WAITS_KEPT {
            let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
            self.waits.push([ms(at), ms(delay)]);
        }
    }

    /// Records a provider retry of `class` after waiting `delay`.
    pub(crate) fn retry(&mut self, class: &str, delay: Duration) {
        self.retries += 1;
        self.rate_limited += u32::from(class == "rate_limited");
        *self.retry_classes.entry(class.to_owned()).or_default() += 1;
        self.retry_wait_ms = self
            .retry_wait_ms
            .saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
    }
}

/// A short label for an item: its `id` (a CSV file's id column, or an `id` key), a short
/// string item itself, else its index (as in `results.jsonl`, from 0).
pub(crate) fn item_label(item: &Value, index: u64) -> String {
    let short = |s: &str| s.chars().count() <= 80;
    match item {
        Value::Object(map) => match map.get("id") {
            Some(Value::String(id)) if short(id) && !id.is_empty() => id.clone(),
            Some(Value::Number(id)) => id.to_string(),
            _ => format!("#{index}"),
        },
        Value::String(s) if short(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => format!("#{index}"),
    }
}
