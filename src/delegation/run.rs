//! Running one delegation in this process: checked and prepared first ([`ready`]), then the
//! agent loop, reporting each event to the caller's [`Observer`].

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::diag::Diagnostic;
use crate::env::Env;
use crate::error::{Error, Result};
use crate::event::{Failure, FailureClass};
use crate::provider::{Client, RetryPolicy, Usage};
use crate::source::Catalog;
use crate::subagent::{SubagentEvent, SubagentResult, SubagentStatus, run_subagent};

use super::prepare::{PrepareError, Prepared, prepare};
use super::request::DelegationRequest;

/// What a running delegation reports: the task's label (the source name, or `task`) and each
/// event, in order. The foreground and a background worker report the same events.
pub(crate) type Observer<'a> = dyn FnMut(&str, SubagentEvent) + Send + 'a;

/// The provider and model a delegation ran with, and where each was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ModelChoice {
    pub(crate) provider: String,
    pub(crate) provider_from: String,
    pub(crate) model: String,
    pub(crate) model_from: String,
}

/// How a delegation ended.
#[derive(Debug, Clone)]
pub(crate) struct DelegationOutcome {
    pub(crate) status: SubagentStatus,
    /// Why it failed; `None` when it completed.
    pub(crate) error: Option<Failure>,
    /// The final (or, when it failed, the last) text of the model.
    pub(crate) text: String,
    /// The answer that matched the response schema, when there is one.
    pub(crate) structured: Option<serde_json::Value>,
    pub(crate) turns: u32,
    pub(crate) tool_calls: u32,
    pub(crate) usage: Usage,
    pub(crate) duration: Duration,
    /// What went wrong with the task's extensions, one line each.
    pub(crate) warnings: Vec<String>,
    /// Notes from preparing the task: listed tools left out, extensions not started, alias
    /// fallbacks.
    pub(crate) notes: Vec<Diagnostic>,
    pub(crate) model: ModelChoice,
    /// The sandbox of the shell commands, when the task has the shell.
    pub(crate) sandbox: Option<crate::sandbox::Sandbox>,
}

impl DelegationOutcome {
    pub(crate) fn completed(&self) -> bool {
        self.status == SubagentStatus::Completed
    }

    /// The answer: the structured answer as JSON, or the final (or last) text.
    pub(crate) fn answer(&self) -> String {
        match &self.structured {
            Some(value) => serde_json::to_string_pretty(value).unwrap_or_default(),
            None => self.text.clone(),
        }
    }
}

/// A delegation checked and ready to run: everything a foreground delegation refuses has been
/// refused by the time one exists.
pub(crate) struct Ready {
    runtime: tokio::runtime::Runtime,
    prepared: Prepared,
    policy: RetryPolicy,
}

impl Ready {
    /// Runs the agent loop. A cancelled `cancel` token ends it with status failed
    /// (`cancelled`).
    pub(crate) fn run(
        self,
        env: &Env,
        observer: &mut Observer<'_>,
        cancel: Option<CancellationToken>,
    ) -> Result<DelegationOutcome> {
        let Ready {
            runtime,
            mut prepared,
            policy,
        } = self;
        if let Some(traceparent) = &env.trace {
            // A traced delegation: its commands and tool calls join the trace.
            prepared.spec.tools.set_traceparent(traceparent.clone());
        }
        let client = Client::new(prepared.resolved.endpoint.clone())
            .map_err(|e| Error::usage(e.to_string()))?
            .with_limits(prepared.resolved.limits);
        let label = prepared.label.clone();
        let mut events = |event: SubagentEvent| observer(&label, event);
        events(SubagentEvent::Started {
            provider: prepared.resolved.provider_name.clone(),
            model: prepared.resolved.model.clone(),
        });
        let run = run_subagent(&client, &policy, &prepared.spec, &mut events);
        let result = runtime.block_on(async {
            match cancel {
                // The token first: a run cancelled before it starts, or as it ends, is
                // cancelled, whichever branch would be ready.
                Some(token) => tokio::select! {
                    biased;
                    () = token.cancelled() => None,
                    result = run => Some(result),
                },
                None => Some(run.await),
            }
        });
        let result = result.unwrap_or_else(|| SubagentResult {
            status: SubagentStatus::Failed(Failure::new(FailureClass::Cancelled, "cancelled")),
            text: String::new(),
            structured: None,
            extracted: false,
            corrections: 0,
            turns: 0,
            tool_calls: 0,
            usage: Usage::default(),
            duration: Duration::ZERO,
            warnings: Vec::new(),
            service_tier: None,
        });
        let error = result.error(prepared.spec.max_turns);
        let resolved = &prepared.resolved;
        Ok(DelegationOutcome {
            error,
            status: result.status,
            text: result.text,
            structured: result.structured,
            turns: result.turns,
            tool_calls: result.tool_calls,
            usage: result.usage,
            duration: result.duration,
            warnings: prepared.result_warnings().chain(result.warnings).collect(),
            notes: prepared.notes.clone(),
            model: ModelChoice {
                provider: resolved.provider_name.clone(),
                provider_from: resolved.provider_origin.to_string(),
                model: resolved.model.clone(),
                model_from: resolved.model_origin.to_string(),
            },
            sandbox: prepared
                .spec
                .tools
                .has_shell()
                .then(|| prepared.spec.tools.sandbox()),
        })
    }
}

/// Checks and prepares a delegation without contacting the model: the source (looked up in
/// `catalog`), its parameters, an agent's task, the working directory, and the provider and
/// model. A background start runs this before it stores a task, so it refuses exactly what
/// the foreground refuses, with the same message.
pub(crate) fn ready(
    env: &Env,
    config: &Config,
    catalog: &Catalog,
    request: &DelegationRequest,
) -> Result<Ready> {
    let source = match &request.source {
        Some(name) => Some(
            catalog
                .get(name)
                .ok_or_else(|| Error::from(catalog.not_found(name)))?,
        ),
        None => None,
    };
    let policy = RetryPolicy::from_env(env)
        .map_err(|message| Error::from(crate::diag::Diagnostic::error(message)))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut prepared = match runtime.block_on(prepare(env, config, source, &request.to_request())) {
        Ok(prepared) => prepared,
        Err(PrepareError::Input(diags)) => return Err(Error::Input(diags)),
        Err(PrepareError::Task(message)) => return Err(Error::Failed(message)),
    };
    if let Some(tier) = request.tier {
        let resolved = std::sync::Arc::make_mut(&mut prepared.resolved);
        resolved.endpoint = resolved
            .endpoint
            .clone()
            .at_tier(tier.service_tier(), request.flex_fallback);
    }
    if let Some(cap) = request.max_cost.or(config.max_cost) {
        // A cap is kept by pricing every request: a model without a price cannot have one.
        let model = &prepared.resolved.model;
        let price = config
            .prices()
            .model(model)
            .map(|(p, _)| p)
            .ok_or_else(|| {
                Error::from(
                    crate::diag::Diagnostic::error(format!(
                        "{} for model `{model}`, so the spend cap of {} cannot be kept",
                        crate::config::NO_PRICE,
                        crate::subagent::budget::usd(cap)
                    ))
                    .with_hint(crate::config::prices::no_price_hint(model)),
                )
            })?;
        let ledger = crate::subagent::budget::Ledger::new(cap, 0.0);
        ledger.counted_at(model, config.price_source(model));
        let tier = request.tier.unwrap_or_default();
        prepared.spec.budget = Some(std::sync::Arc::new(ledger.task(price, tier)));
    }
    Ok(Ready {
        runtime,
        prepared,
        policy,
    })
}

/// Runs a delegation in this process: [`ready`], then [`Ready::run`].
pub(crate) fn run(
    env: &Env,
    config: &Config,
    catalog: &Catalog,
    request: &DelegationRequest,
    observer: &mut Observer<'_>,
    cancel: Option<CancellationToken>,
) -> Result<DelegationOutcome> {
    ready(env, config, catalog, request)?.run(env, observer, cancel)
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use summon_mock_llm::{MockConfig, Reply};

    use super::*;
    use crate::delegation::test_support::MockProject;

    fn ad_hoc(task: &str) -> DelegationRequest {
        DelegationRequest {
            instructions: Some(task.into()),
            ..DelegationRequest::default()
        }
    }

    #[test]
    fn a_delegation_reports_its_events_and_returns_its_outcome() {
        let mock = MockProject::start(MockConfig::new().replies([
            Reply::tool_call("read_file", json!({"path": "notes.md"})),
            Reply::text("the summary"),
        ]));
        let mut events = Vec::new();
        let mut observer =
            |label: &str, event: SubagentEvent| events.push((label.to_owned(), event));
        let outcome = run(
            &mock.env,
            &mock.config(),
            &mock.catalog(),
            &ad_hoc("summarise notes.md"),
            &mut observer,
            None,
        )
        .unwrap();
        assert!(outcome.completed());
        assert_eq!(outcome.error, None);
        assert_eq!(outcome.answer(), "the summary");
        assert_eq!((outcome.turns, outcome.tool_calls), (2, 1));
        assert!(outcome.usage.input_tokens > 0 && outcome.usage.output_tokens > 0);
        assert_eq!(outcome.model.model, "mock-model");
        assert_eq!(
            outcome.model.model_from,
            "environment variable SUMMON_MODEL"
        );
        assert_eq!(outcome.sandbox, None, "an ad-hoc task has no shell");
        assert!(outcome.warnings.is_empty());

        assert!(events.iter().all(|(label, _)| label == "task"));
        let tool_calls: Vec<_> = events
            .iter()
            .filter_map(|(_, e)| match e {
                SubagentEvent::ToolCall { name, ok, .. } => Some((name.as_str(), *ok)),
                _ => None,
            })
            .collect();
        assert_eq!(tool_calls, [("read_file", true)]);
        let tokens = events
            .iter()
            .filter(|(_, e)| matches!(e, SubagentEvent::Tokens { .. }))
            .count();
        assert_eq!(tokens, 2, "one token total per response");
        assert!(matches!(
            events.last(),
            Some((_, SubagentEvent::Text { text })) if text == "the summary"
        ));
        // The tool ran in the project: the file's text went back to the model.
        let second = &mock.server.requests()[1];
        assert!(second.body.to_string().contains("three notes"));
    }

    #[test]
    fn running_out_of_turns_is_a_failure_that_keeps_the_last_text() {
        let mock = MockProject::start(
            MockConfig::new().default_reply(Reply::tool_call("list_files", json!({}))),
        );
        let request = DelegationRequest {
            max_turns: Some(2),
            ..ad_hoc("list forever")
        };
        let outcome = run(
            &mock.env,
            &mock.config(),
            &mock.catalog(),
            &request,
            &mut |_: &str, _: SubagentEvent| {},
            None,
        )
        .unwrap();
        assert_eq!(outcome.status, SubagentStatus::MaxTurns);
        assert!(!outcome.completed());
        let error = outcome.error.as_ref().unwrap();
        assert_eq!(error.message, "max turns (2) reached");
        assert_eq!(error.class, FailureClass::MaxTurns);
        assert_eq!(outcome.turns, 2);
    }

    #[test]
    fn a_cancelled_delegation_ends_failed_without_an_answer() {
        let mock = MockProject::start(MockConfig::new().default_reply(Reply::text("late")));
        let cancel = CancellationToken::new();
        cancel.cancel();
        let outcome = run(
            &mock.env,
            &mock.config(),
            &mock.catalog(),
            &ad_hoc("anything"),
            &mut |_: &str, _: SubagentEvent| {},
            Some(cancel),
        )
        .unwrap();
        assert_eq!(
            outcome.status,
            SubagentStatus::Failed(Failure::new(FailureClass::Cancelled, "cancelled"))
        );
        assert_eq!(
            outcome
                .error
                .as_ref()
                .map(|f| (f.class, f.message.as_str())),
            Some((FailureClass::Cancelled, "cancelled"))
        );
        assert_eq!((outcome.answer().as_str(), outcome.turns), ("", 0));
        assert!(mock.server.requests().is_empty(), "the model was asked");
    }

    #[test]
    fn an_unknown_source_is_refused_before_the_model_is_asked() {
        let mock = MockProject::start(MockConfig::new().default_reply(Reply::text("no")));
        let request = DelegationRequest {
            source: Some("nowhere".into()),
            ..DelegationRequest::default()
        };
        let Err(Error::Input(diags)) = ready(&mock.env, &mock.config(), &mock.catalog(), &request)
        else {
            panic!("an unknown source was accepted");
        };
        assert_eq!(
            diags.items[0].message,
            "Source 'nowhere' not found. Use summon load to see available sources."
        );
        assert!(mock.server.requests().is_empty());
    }
}
