//! The agent loop: send, run the tool calls, send again, until the model answers without
//! tool calls or `max_turns` requests were made. A turn is one model request.

use crate::event::{Failure, FailureClass};
use std::time::{Duration, Instant};

use super::cache::prefix_is_cacheable;
use super::checks::{run_checks, run_on_failure};
use super::ending::{answer_problem, name_default_limit};
use super::event::SubagentEvent;
use super::redact::Redactor;
use super::structured::check_answer;
use super::tool::{Scratch, ToolOutput, ToolSet, WorkDir};
use crate::mcp::Session;
use crate::provider::{
    CacheHint, ChatRequest, Client, Message, ProviderError, ResponseFormat, RetryPolicy, ToolSpec,
    Usage, estimate_tokens, send_with_retry,
};
use crate::recipe::RetryConfig;

/// Everything one subagent run needs, already resolved.
pub(crate) struct SubagentSpec {
    pub(crate) system: String,
    pub(crate) first_message: String,
    pub(crate) model: String,
    pub(crate) tools: ToolSet,
    pub(crate) workdir: WorkDir,
    pub(crate) max_turns: u32,
    pub(crate) temperature: Option<f64>,
    /// The output limit sent with each request; `None`: the provider's default.
    pub(crate) max_output_tokens: Option<u32>,
    /// Stop sequences sent with each request.
    pub(crate) stop: Vec<String>,
    /// An empty final answer completes the task instead of failing it.
    pub(crate) allow_empty: bool,
    /// The model's context window: a request estimated larger is not sent.
    pub(crate) context_window: Option<u64>,
    pub(crate) response_schema: Option<serde_json::Value>,
    /// The model answers in the schema natively (Anthropic's `output_config.format`).
    pub(crate) native_structured: bool,
    /// How many times a schema-invalid answer is sent back for correction.
    pub(crate) schema_retries: u32,
    pub(crate) retry: Option<RetryConfig>,
    /// MCP servers started for this run and stopped when it ends.
    pub(crate) extensions: Vec<crate::mcp::ServerSpec>,
    /// The concurrency slot the task holds, given back while it waits out a rate limit.
    pub(crate) slot: Option<std::sync::Arc<dyn super::slot::Slot>>,
    /// How the task uses the provider's prompt cache.
    pub(crate) cache: super::cache::TaskCache,
    /// The task's share of a spend cap, when there is one.
    pub(crate) budget: Option<std::sync::Arc<super::budget::TaskBudget>>,
    /// The output limit's learning, shared by the tasks of a step.
    pub(crate) output_cap: std::sync::Arc<super::output_cap::OutputCap>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SubagentStatus {
    Completed,
    /// `max_turns` requests were made without a final answer.
    MaxTurns,
    Failed(Failure),
}

/// What a run produced. `text` is the final answer, or the last text when it failed.
#[derive(Debug, Clone)]
pub(crate) struct SubagentResult {
    pub(crate) status: SubagentStatus,
    pub(crate) text: String,
    pub(crate) structured: Option<serde_json::Value>,
    /// The structured answer was taken from a fenced block or surrounding text.
    pub(crate) extracted: bool,
    /// Answers sent back because they did not validate against the response schema.
    pub(crate) corrections: u32,
    pub(crate) turns: u32,
    pub(crate) tool_calls: u32,
    pub(crate) usage: Usage,
    pub(crate) duration: Duration,
    /// What went wrong with the task's extensions (MCP servers): one that did not start, or
    /// failed during the task. The task may still have completed without their tools.
    pub(crate) warnings: Vec<String>,
    /// The service tier the provider says served the last answer (`default`, `flex`, ...).
    pub(crate) service_tier: Option<String>,
}

impl SubagentResult {
    /// The failure, if the run failed.
    pub(crate) fn error(&self, max_turns: u32) -> Option<Failure> {
        match &self.status {
            SubagentStatus::Completed => None,
            SubagentStatus::MaxTurns => Some(Failure::new(
                FailureClass::MaxTurns,
                format!("max turns ({max_turns}) reached"),
            )),
            SubagentStatus::Failed(failure) => Some(failure.clone()),
        }
    }
}

/// Runs the loop, then goose's `retry` checks (again from scratch while they fail).
pub(crate) async fn run_subagent(
    client: &Client,
    policy: &RetryPolicy,
    spec: &SubagentSpec,
    observer: &mut (dyn FnMut(SubagentEvent) + Send),
) -> SubagentResult {
    let started = Instant::now();
    // The configured API keys and `env_keys` values never reach what the run reports.
    let keys = client.endpoint().api_key.iter();
    let redactor = Redactor::new(
        &spec.extensions,
        keys.chain(spec.tools.command_env().keys()),
    );
    let mut redacting = |event: SubagentEvent| observer(redactor.event(event));
    let observer: &mut (dyn FnMut(SubagentEvent) + Send) = &mut redacting;
    let mut total = Totals::default();
    let mut tools = Tools::start(spec, observer).await;
    if !tools.specs.is_empty() && client.drops_tools().await {
        // The server would answer as if the request had none: not offered, nor listed.
        observer(SubagentEvent::Warning {
            message: format!(
                "provider `{}`: the server's chat template has no tool support; tools were \
                 not offered",
                client.endpoint().name
            ),
        });
        tools.withhold(spec);
    }
    observer(SubagentEvent::Framing {
        system_len: tools.system.len(),
        tool_chars: crate::provider::tool_chars(&tools.specs),
    });
    let result = run_attempts(client, policy, spec, &tools, observer, &mut total).await;
    let warnings = tools.warnings.lock().map(|w| w.clone()).unwrap_or_default();
    tools.session.shutdown().await;
    let mut result = total.finish(result, started);
    result.warnings = warnings;
    redactor.result(result)
}

/// The tools of one run: the built-in set and the MCP servers' tools.
struct Tools {
    session: Session,
    /// Every tool's spec, sent with each request.
    specs: std::sync::Arc<[ToolSpec]>,
    /// The system prompt, naming the MCP tools when there are any.
    system: String,
    /// The task's private TMPDIR, removed when the run ends.
    scratch: Scratch,
    /// The extension warnings so far, for the result.
    warnings: std::sync::Mutex<Vec<String>>,
}

impl Tools {
    async fn start(spec: &SubagentSpec, observer: &mut (dyn FnMut(SubagentEvent) + Send)) -> Self {
        if spec.extensions.is_empty() {
            return Self {
                session: Session::default(),
                specs: spec.tools.specs(),
                system: spec.system.clone(),
                scratch: Scratch::default(),
                warnings: std::sync::Mutex::default(),
            };
        }
        let started = Session::start(
            &spec.extensions,
            spec.workdir.path(),
            spec.tools.command_env(),
        )
        .await;
        for message in &started.warnings {
            observer(SubagentEvent::Warning {
                message: message.clone(),
            });
        }
        let mut system = spec.system.clone();
        if !started.specs.is_empty() {
            let names: Vec<&str> = started.specs.iter().map(|s| s.name.as_str()).collect();
            system.push_str(&format!(
                "\nTools from extensions (MCP servers): {}.\n",
                names.join(", ")
            ));
        }
        let specs: Vec<ToolSpec> = spec
            .tools
            .specs()
            .iter()
            .cloned()
            .chain(started.specs)
            .collect();
        Self {
            session: started.session,
            specs: specs.into(),
            system,
            scratch: Scratch::default(),
            warnings: std::sync::Mutex::new(started.warnings),
        }
    }

    /// Offers no tool, and says nothing about tools in the system prompt.
    fn withhold(&mut self, spec: &SubagentSpec) {
        self.specs = Vec::new().into();
        let names = spec.tools.names();
        self.system = if names.is_empty() {
            spec.system.clone()
        } else {
            let section = super::prompt::tools_section(spec.workdir.path(), &names);
            spec.system.replacen(&section, "", 1)
        };
    }

    /// The tools to offer now: all of them but those of servers that failed.
    fn offered(&self) -> std::sync::Arc<[ToolSpec]> {
        if self.specs.iter().any(|s| self.session.withdrawn(&s.name)) {
            self.specs
                .iter()
                .filter(|s| !self.session.withdrawn(&s.name))
                .cloned()
                .collect()
        } else {
            std::sync::Arc::clone(&self.specs)
        }
    }

    async fn call(
        &self,
        spec: &SubagentSpec,
        name: &str,
        args: &serde_json::Value,
        observer: &mut (dyn FnMut(SubagentEvent) + Send),
        traceparent: Option<&str>,
    ) -> ToolOutput {
        if spec.tools.contains(name) || !self.session.has(name) {
            if !spec.tools.contains(name) {
                let extra: Vec<&str> = self
                    .specs
                    .iter()
                    .map(|s| s.name.as_str())
                    .filter(|n| !spec.tools.contains(n))
                    .collect();
                return spec.tools.unknown_tool(name, &extra);
            }
            return spec
                .tools
                .call(name, args, &spec.workdir, &self.scratch, traceparent)
                .await;
        }
        let (output, warning) = self.session.call(name, args, traceparent).await;
        if let Some(message) = warning {
            if let Ok(mut warnings) = self.warnings.lock() {
                warnings.push(message.clone());
            }
            observer(SubagentEvent::Warning { message });
        }
        output
    }
}

async fn run_attempts(
    client: &Client,
    policy: &RetryPolicy,
    spec: &SubagentSpec,
    tools: &Tools,
    observer: &mut (dyn FnMut(SubagentEvent) + Send),
    total: &mut Totals,
) -> Outcome {
    let attempts = spec.retry.as_ref().map_or(0, |r| r.max_retries) + 1;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut result = run_once(client, policy, spec, tools, observer, total).await;
        let Some(retry) = spec.retry.as_ref().filter(|r| !r.checks.is_empty()) else {
            return result;
        };
        if result.status != SubagentStatus::Completed {
            return result;
        }
        let Err(reason) = run_checks(retry, spec.workdir.path()).await else {
            return result;
        };
        if attempt >= attempts {
            result.status = SubagentStatus::Failed(Failure::new(
                FailureClass::Check,
                format!("retry checks still failing after {attempt} attempt(s): {reason}"),
            ));
            return result;
        }
        observer(SubagentEvent::CheckRetry {
            attempt,
            reason: reason.clone(),
        });
        if let Some(problem) = run_on_failure(retry, spec.workdir.path()).await {
            observer(SubagentEvent::CheckRetry {
                attempt,
                reason: problem,
            });
        }
    }
}

#[derive(Default)]
struct Totals {
    corrections: u32,
    turns: u32,
    tool_calls: u32,
    usage: Usage,
    /// The tier the last answer says served it.
    service_tier: Option<String>,
}

impl Totals {
    fn finish(&self, mut result: Outcome, started: Instant) -> SubagentResult {
        SubagentResult {
            status: std::mem::replace(&mut result.status, SubagentStatus::Completed),
            text: std::mem::take(&mut result.text),
            structured: result.structured.take(),
            extracted: result.extracted,
            corrections: self.corrections,
            turns: self.turns,
            tool_calls: self.tool_calls,
            usage: self.usage,
            duration: started.elapsed(),
            warnings: Vec::new(),
            service_tier: self.service_tier.clone(),
        }
    }
}

struct Outcome {
    status: SubagentStatus,
    text: String,
    structured: Option<serde_json::Value>,
    extracted: bool,
}

impl Outcome {
    /// A run that ends without a structured answer.
    fn plain(status: SubagentStatus, text: String) -> Self {
        Self {
            status,
            text,
            structured: None,
            extracted: false,
        }
    }
}

/// Reports retries to the observer and waits them out without holding the slot.
struct SlotHook<'a> {
    observer: &'a mut (dyn FnMut(SubagentEvent) + Send),
    slot: Option<std::sync::Arc<dyn super::slot::Slot>>,
    /// The task's cache, whose warm-up a wait ends: the answer the step's other tasks would
    /// wait for is not coming soon, and they get the slot this task gives back.
    cache: &'a super::cache::TaskCache,
    /// The next wait is for the provider's rate limits (a hold, or a 429's retry): the
    /// request goes when it ends, and the step's other tasks keep waiting for its answer.
    holding: bool,
}

impl crate::provider::RetryHook for SlotHook<'_> {
    fn on_retry(&mut self, err: &ProviderError, attempt: u32, delay: Duration) {
        // A 429's wait is the provider's rationing, as a hold is: the answer comes after it,
        // and the step's other tasks keep waiting for it (sent now, they would go with the
        // full output limit, each holding a share of the key's minute).
        if matches!(err, ProviderError::RateLimited { .. }) {
            self.holding = true;
        }
        (self.observer)(SubagentEvent::Retry {
            attempt,
            delay,
            reason: err.headline(),
            class: err.retry_class().unwrap_or("other"),
        });
    }

    fn on_startup_wait(
        &mut self,
        err: &ProviderError,
        budget: Duration,
        delay: Duration,
        first: bool,
    ) {
        (self.observer)(SubagentEvent::StartupWait { delay });
        if !first {
            return;
        }
        let what = if err.is_loading() {
            "the provider is still loading its model (HTTP 503)".to_owned()
        } else {
            format!("the provider does not answer yet ({err})")
        };
        (self.observer)(SubagentEvent::Warning {
            message: format!(
                "{what}: waiting up to {} s for it to start (SUMMON_STARTUP_WAIT_MS)",
                budget.as_secs_f64()
            ),
        });
    }

    fn on_hold(&mut self, binding: &crate::provider::Binding, delay: Duration) {
        self.holding = true;
        (self.observer)(SubagentEvent::Held {
            limit: binding.describe(),
            delay,
        });
    }

    fn wait(&mut self, delay: Duration) -> impl std::future::Future<Output = ()> + Send {
        if !std::mem::take(&mut self.holding) {
            self.cache.fire_warm();
        }
        let slot = self.slot.clone();
        async move {
            if let Some(slot) = &slot {
                slot.release();
            }
            tokio::time::sleep(delay).await;
            if let Some(slot) = &slot {
                slot.reacquire().await;
            }
        }
    }

    fn pause(&mut self, delay: Duration) -> impl std::future::Future<Output = ()> + Send {
        self.cache.fire_warm();
        tokio::time::sleep(delay)
    }

    fn hold<R: std::future::Future<Output = ()> + Send>(
        &mut self,
        ready: R,
    ) -> impl std::future::Future<Output = ()> + Send {
        // A hold keeps the step's other tasks waiting for this one's answer.
        self.holding = false;
        let slot = self.slot.clone();
        let observer = &mut *self.observer;
        async move {
            let start = std::time::Instant::now();
            if let Some(slot) = &slot {
                slot.release();
            }
            ready.await;
            observer(SubagentEvent::HeldFor {
                waited: start.elapsed(),
            });
            if let Some(slot) = &slot {
                slot.reacquire().await;
            }
        }
    }
}

/// Why `request` cannot be sent to a model with the spec's context window: its estimated
/// prompt and output limit together exceed the window. Checked before every request, so a
/// request that cannot fit fails at once instead of being refused by the provider.
fn oversized(
    spec: &SubagentSpec,
    request: &ChatRequest,
    output_limit: Option<u32>,
) -> Option<String> {
    let window = spec.context_window?;
    let output = u64::from(output_limit.unwrap_or(0));
    let total = estimate_tokens(request) - u64::from(request.max_tokens.unwrap_or(0)) + output;
    (total > window).then(|| {
        format!(
            "the request needs about {total} tokens ({} of prompt, {output} of output limit) \
             but the context window of `{}` is {window} tokens; it was not sent",
            total - output,
            spec.model
        )
    })
}

async fn run_once(
    client: &Client,
    policy: &RetryPolicy,
    spec: &SubagentSpec,
    tools: &Tools,
    observer: &mut (dyn FnMut(SubagentEvent) + Send),
    total: &mut Totals,
) -> Outcome {
    let validator = match spec
        .response_schema
        .as_ref()
        .map(|s| jsonschema::validator_for(s).map(|v| (v, s)))
    {
        Some(Ok(v)) => Some(v),
        Some(Err(e)) => {
            return Outcome::plain(
                SubagentStatus::Failed(Failure::new(
                    FailureClass::Prepare,
                    format!("invalid response schema: {e}"),
                )),
                String::new(),
            );
        }
        None => None,
    };
    let mut request = ChatRequest {
        model: spec.model.clone(),
        system: tools.system.clone(),
        messages: vec![Message::user(spec.first_message.clone())],
        tools: tools.offered(),
        temperature: spec.temperature,
        max_tokens: spec.max_output_tokens,
        stop: spec.stop.clone(),
        // Forced (Anthropic) only when no other tool could be called: the answer of an agent
        // loop is forced on its correction turns.
        response_format: spec
            .response_schema
            .as_ref()
            .and_then(|s| ResponseFormat::for_schema(s, tools.specs.is_empty()))
            .map(|f| f.native(spec.native_structured)),
        cache: CacheHint::default(),
    };
    let cap = &spec.output_cap;
    let kind = client.endpoint().kind;
    // A schema bounds the answer of a task that calls no tools.
    let schema_bound = spec
        .response_schema
        .as_ref()
        .filter(|_| tools.specs.is_empty())
        .and_then(super::output_cap::schema_bound);
    // Anthropic holds a request's whole output limit against the key's output tokens per
    // minute until its answer ends: a fan-out's other tasks wait for the first answer to
    // learn a narrower one. An OpenAI-compatible provider's first wave costs no more with
    // the full limit (none to a hosted one; a local server rations nothing).
    let learning_holds = kind == crate::provider::ProviderKind::Anthropic
        && spec.max_output_tokens.is_none()
        && schema_bound.is_none()
        && cap.waits_for_first_answer();
    if (!spec.cache.on || !prefix_is_cacheable(kind, &request)) && !learning_holds {
        // Nothing the other tasks could read or learn: they need not wait for this one.
        spec.cache.fire_warm();
    }
    let local = client.endpoint().is_local();
    let mut last_text = String::new();
    let mut schema_asks = 0;
    // What was wrong with each answer that did not validate, for the failure.
    let mut schema_errors: Vec<String> = Vec::new();
    let mut turns = 0;
    // The request goes again with the full limit: its answer was cut off at a narrower one.
    let mut full_now = false;
    loop {
        if turns >= spec.max_turns {
            return Outcome::plain(SubagentStatus::MaxTurns, last_text);
        }
        turns += 1;
        total.turns += 1;
        observer(SubagentEvent::Turn { turn: turns });
        // The output limit: explicit, bounded by the schema, learned, or the full one
        // (fitted to what the context window leaves).
        request.max_tokens = None;
        let prompt = spec.context_window.map_or(0, |_| estimate_tokens(&request));
        let mut full = super::output_cap::full_limit(kind, local, spec.context_window, prompt);
        if full.is_none() && spec.budget.is_some() {
            // A spend cap needs a bound on what an answer may cost.
            full = Some(super::output_cap::LOCAL_GUARD);
        }
        let (limit, source) = if std::mem::take(&mut full_now) {
            (full, super::output_cap::CapSource::Full)
        } else {
            cap.choose(spec.max_output_tokens, schema_bound, full)
        };
        request.max_tokens = limit;
        let output_limit = kind.output_limit(limit);
        if let Some(problem) = oversized(spec, &request, output_limit) {
            let failure = Failure::new(FailureClass::Prepare, problem);
            return Outcome::plain(SubagentStatus::Failed(failure), last_text);
        }
        request.cache = spec.cache.hint(
            request.messages.len() == 1,
            turns < spec.max_turns && !request.tools.is_empty(),
        );
        if let Some(budget) = &spec.budget {
            // The most the task may still spend: this turn and the ones left, each at the
            // output limit, with this request's input.
            let output = output_limit.unwrap_or(super::output_cap::LOCAL_GUARD);
            let worst = budget.worst(
                estimate_tokens(&request),
                u64::from(output),
                spec.max_turns - turns + 1,
            );
            if let Err(refused) = budget.before_request(worst) {
                // Not sent: not a turn.
                total.turns -= 1;
                let failure = Failure::new(FailureClass::Budget, refused.message);
                return Outcome::plain(SubagentStatus::Failed(failure), last_text);
            }
        }
        let mut hook = SlotHook {
            observer: &mut *observer,
            slot: spec.slot.clone(),
            cache: &spec.cache,
            holding: false,
        };
        let sent = send_with_retry(client, &request, policy, &mut hook).await;
        // Cut off at a bound narrower than the full limit: sent again once with the full
        // limit, not a turn of its own.
        let cut_off = |r: &crate::provider::ChatResponse| {
            matches!(r.stop_reason.as_deref(), Some("length" | "max_tokens"))
        };
        let narrowed = matches!(
            source,
            super::output_cap::CapSource::Learned | super::output_cap::CapSource::Schema
        ) && limit.is_some_and(|l| full.is_none_or(|f| l < f));
        if let Ok(response) = &sent {
            if narrowed && cut_off(response) {
                cap.resend(limit.unwrap_or(0));
                total.usage.add(response.usage);
                if let Some(budget) = &spec.budget {
                    budget.spend(&response.usage, response.service_tier.as_deref());
                }
                observer(SubagentEvent::Response {
                    usage: response.usage,
                    stop_reason: response.stop_reason.clone(),
                    error: None,
                });
                turns -= 1;
                total.turns -= 1;
                full_now = true;
                continue;
            }
            if !cut_off(response) {
                cap.answered(response.usage.output_tokens);
            }
        }
        // The prefix is in the cache once an answer has arrived (or the request failed), and
        // the step has an answer to learn its output limit from.
        spec.cache.fire_warm();
        if let Some(message) = client.take_notice() {
            observer(SubagentEvent::Warning { message });
        }
        let response = match sent {
            Ok(response) => response,
            Err(err) => {
                observer(SubagentEvent::Response {
                    usage: crate::provider::Usage::default(),
                    stop_reason: None,
                    error: Some(err.class()),
                });
                let failure = Failure::new(FailureClass::Provider(err.class()), err.to_string());
                return Outcome::plain(SubagentStatus::Failed(failure), last_text);
            }
        };
        if let Some(budget) = &spec.budget {
            budget.spend(&response.usage, response.service_tier.as_deref());
        }
        if response.service_tier.is_some() {
            total.service_tier.clone_from(&response.service_tier);
        }
        total.usage.add(response.usage);
        observer(SubagentEvent::Response {
            usage: response.usage,
            stop_reason: response.stop_reason.clone(),
            error: None,
        });
        observer(SubagentEvent::Tokens { total: total.usage });
        if let Some(text) = response.text.as_ref().filter(|t| !t.trim().is_empty()) {
            last_text.clone_from(text);
            observer(SubagentEvent::Text { text: text.clone() });
        }
        if let Some(problem) = answer_problem(&response, output_limit, spec.allow_empty).map(|p| {
            name_default_limit(
                p,
                request.max_tokens.or(output_limit),
                spec.max_output_tokens,
            )
        }) {
            // The partial text (of a cut-off answer) stays in the result, and what it called.
            let mut problem = problem;
            if !response.tool_calls.is_empty() {
                let names: Vec<&str> = response
                    .tool_calls
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect();
                problem.push_str(&format!(
                    "; it held {} tool call{} ({}), not run",
                    names.len(),
                    if names.len() == 1 { "" } else { "s" },
                    names.join(", ")
                ));
            }
            let failure = Failure::new(FailureClass::Answer, problem);
            return Outcome::plain(SubagentStatus::Failed(failure), last_text);
        }
        if response.tool_calls.is_empty() {
            let answer = response.text.unwrap_or_default();
            let Some((validator, schema)) = &validator else {
                return Outcome::plain(SubagentStatus::Completed, answer);
            };
            match check_answer(validator, schema, &answer) {
                Ok(checked) => {
                    // A value asked wrapped is the bare value's JSON, as the result's data.
                    let wrapped = request.response_format.as_ref().is_some_and(|f| f.wrapped);
                    return Outcome {
                        status: SubagentStatus::Completed,
                        text: if wrapped {
                            checked.value.to_string()
                        } else {
                            answer
                        },
                        structured: Some(checked.value),
                        extracted: checked.extracted,
                    };
                }
                Err(errors) => {
                    schema_errors.push(errors.clone());
                    if turns >= spec.max_turns && schema_asks < spec.schema_retries {
                        // No turn left for a correction: the schema is what failed.
                        let mut message =
                            super::structured::schema_failure(&schema_errors, &answer);
                        let end = message.find('\n').unwrap_or(message.len());
                        message.insert_str(
                            end,
                            &format!(
                                " (no turn left to correct it: max_turns is {})",
                                spec.max_turns
                            ),
                        );
                        return Outcome::plain(
                            SubagentStatus::Failed(Failure::new(FailureClass::Schema, message)),
                            answer,
                        );
                    }
                    if schema_asks >= spec.schema_retries {
                        return Outcome::plain(
                            SubagentStatus::Failed(Failure::new(
                                FailureClass::Schema,
                                super::structured::schema_failure(&schema_errors, &answer),
                            )),
                            answer,
                        );
                    }
                    schema_asks += 1;
                    total.corrections += 1;
                    if let Some(format) = &mut request.response_format {
                        format.force = true;
                    }
                    observer(SubagentEvent::SchemaRetry {
                        errors: errors.clone(),
                    });
                    request.messages.push(Message::Assistant {
                        text: Some(answer),
                        tool_calls: Vec::new(),
                    });
                    request.messages.push(Message::user(format!(
                        "Your answer does not validate against the required JSON Schema:\n{errors}\n\n\
                         Reply again with only the corrected JSON value."
                    )));
                    continue;
                }
            }
        }
        request.messages.push(Message::Assistant {
            text: response.text.clone(),
            tool_calls: response.tool_calls.clone(),
        });
        for call in &response.tool_calls {
            total.tool_calls += 1;
            let command_env = spec.tools.command_env();
            let span = command_env.new_span_id();
            let extension = (!spec.tools.contains(&call.name))
                .then(|| tools.session.extension_of(&call.name).map(str::to_owned))
                .flatten();
            observer(SubagentEvent::ToolStarted {
                name: call.name.clone(),
                span,
                extension,
            });
            let traceparent = span.and_then(|id| command_env.child_traceparent(id));
            let output = match &call.unreadable {
                Some(unreadable) => unreadable_output(&call.name, &unreadable.kind),
                None => {
                    tools
                        .call(
                            spec,
                            &call.name,
                            &call.arguments,
                            observer,
                            traceparent.as_deref(),
                        )
                        .await
                }
            };
            observer(SubagentEvent::ToolCall {
                name: call.name.clone(),
                ok: !output.is_error,
                summary: output.content.lines().next().unwrap_or("").to_owned(),
            });
            request.messages.push(Message::ToolResult {
                call_id: call.id.clone(),
                name: call.name.clone(),
                content: output.content,
                is_error: output.is_error,
            });
        }
        // A server that failed during these calls takes its tools with it.
        let offered = tools.offered();
        if offered.len() != request.tools.len() {
            request.tools = offered;
        }
    }
}

/// What the model hears about a tool call summon cannot run: not silence, which would leave
/// it waiting for a result, but an error naming the call's type.
fn unreadable_output(name: &str, kind: &str) -> ToolOutput {
    let call = if name.is_empty() {
        "this call".to_owned()
    } else {
        format!("the call to `{name}`")
    };
    ToolOutput {
        content: format!(
            "{call} was not run: summon runs only function tool calls, not calls of type `{kind}`. Call one of your tools as a function."
        ),
        is_error: true,
    }
}
