//! The trace of one delegation (`summon delegate`, a background task's worker): a root span
//! `delegate NAME`, its agent's invocation (`invoke_agent NAME`), the model requests and tool
//! calls, from the delegation's own events.

use std::time::Instant;

use opentelemetry::KeyValue;

use super::{RunTraces, Settings};
use crate::event::{Activity, Doing, Failure, RunEvent, TaskDone};
use crate::provider::Usage;
use crate::subagent::SubagentEvent;

/// A delegation's trace, fed its events.
pub(crate) struct DelegationTraces {
    traces: RunTraces,
    provider: String,
    model: String,
    attempt_started: bool,
    usage: Usage,
    turns: u32,
    started: Instant,
}

/// How a delegation ended, as its trace tells it.
pub(crate) struct Ended<'a> {
    pub(crate) error: Option<&'a Failure>,
    /// The task id of a background task.
    pub(crate) task: Option<&'a str>,
    /// The answer, exported only when content capture is on.
    pub(crate) output: &'a str,
}

impl DelegationTraces {
    /// Starts the trace of the delegation `label` (its source name, or `task`).
    pub(crate) fn start(
        settings: &Settings,
        env: &crate::env::Env,
        label: &str,
    ) -> std::io::Result<Self> {
        let traces = RunTraces::start_root(
            settings,
            env,
            format!("delegate {label}"),
            vec![KeyValue::new("openinference.span.kind", "CHAIN")],
            Vec::new(),
        )?;
        traces.set_agent(label);
        Ok(Self {
            traces,
            provider: String::new(),
            model: String::new(),
            attempt_started: false,
            usage: Usage::default(),
            turns: 0,
            started: Instant::now(),
        })
    }

    /// The delegation's span context as a `TRACEPARENT` value, for what it starts.
    pub(crate) fn traceparent(&self) -> String {
        self.traces.traceparent()
    }

    fn doing(&self, what: Doing) {
        self.traces.emit(&RunEvent::Activity(Activity {
            step: 0,
            index: 0,
            at: Instant::now(),
            what,
        }));
    }

    /// Adds one of the delegation's events.
    pub(crate) fn observe(&mut self, event: &SubagentEvent) {
        match event {
            SubagentEvent::Started { provider, model } => {
                self.provider.clone_from(provider);
                self.model.clone_from(model);
            }
            SubagentEvent::Turn { turn } => {
                if !self.attempt_started {
                    self.attempt_started = true;
                    self.doing(Doing::Attempt {
                        attempt: 1,
                        sandbox: "",
                    });
                }
                self.turns = *turn;
                self.doing(Doing::Request {
                    provider: self.provider.clone(),
                    model: self.model.clone(),
                    turn: *turn,
                });
            }
            SubagentEvent::Response {
                usage,
                stop_reason,
                error,
            } => self.doing(Doing::Response {
                usage: *usage,
                stop_reason: stop_reason.clone(),
                error: *error,
            }),
            SubagentEvent::Retry { class, delay, .. } => self.doing(Doing::Retry {
                class,
                wait: *delay,
            }),
            SubagentEvent::ToolStarted {
                name,
                span,
                extension,
            } => {
                self.doing(Doing::ToolStarted {
                    name: name.clone(),
                    span: *span,
                    extension: extension.clone(),
                });
            }
            SubagentEvent::ToolCall { ok, .. } => self.doing(Doing::ToolEnded { ok: *ok }),
            SubagentEvent::Tokens { total } => self.usage = *total,
            SubagentEvent::SchemaRetry { .. }
            | SubagentEvent::CheckRetry { .. }
            | SubagentEvent::Text { .. }
            | SubagentEvent::StartupWait { .. }
            | SubagentEvent::Held { .. }
            | SubagentEvent::HeldFor { .. }
            | SubagentEvent::Warning { .. }
            | SubagentEvent::Framing { .. } => {}
        }
    }

    /// Ends the trace as the delegation ended, sends it within the flush time, and answers
    /// the one warning of a trace that did not all reach the collector.
    pub(crate) fn finish(self, ended: &Ended<'_>) -> Option<String> {
        if !self.attempt_started {
            // It failed before its first request: the invocation still gets its span.
            self.doing(Doing::Attempt {
                attempt: 1,
                sandbox: "",
            });
        }
        let done = TaskDone {
            ok: ended.error.is_none(),
            error: ended.error.cloned(),
            output: ended.output.to_owned(),
            turns: self.turns,
            usage: self.usage,
            duration: self.started.elapsed(),
            model: (!self.model.is_empty()).then(|| self.model.clone()),
            trace: crate::event::TaskTrace {
                attempts: 1,
                ..crate::event::TaskTrace::default()
            },
            item: ended
                .task
                .map_or(serde_json::Value::Null, |id| serde_json::json!(id)),
            ..TaskDone::default()
        };
        self.traces.emit(&RunEvent::TaskFinished {
            done: Box::new(done),
            level: None,
            row: None,
        });
        let failed = ended.error.map(|failure| failure.class.label());
        self.traces.finish(ended.task, failed.as_deref())
    }
}
