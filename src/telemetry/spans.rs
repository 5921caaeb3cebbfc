//! The run's events as spans: run → step (→ reduce level) → task → attempt → model request
//! (`chat MODEL`, GenAI semantic conventions) and tool call (`execute_tool NAME`). Each span
//! starts and ends at the times the engine saw; retries and rate-limit waits are events of
//! the request they delayed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

use super::Settings;
use super::export::{Counts, Exporting, Tally};
use super::settings::Protocol;
use crate::event::{Activity, Consumer, Doing, FailureClass, RunEvent, TaskDone};

/// The traces of one run: a consumer of its events (through [`RunTraces::consumer`]) and
/// the end of its root span ([`RunTraces::finish`], or a signal's exit).
pub(crate) struct RunTraces {
    inner: Arc<Inner>,
    trace_id: String,
}

/// What the end of the run, or a signal's exit, flushes.
struct Inner {
    state: Arc<Mutex<State>>,
    provider: SdkTracerProvider,
    counts: Arc<Counts>,
    endpoint: String,
    /// The run's span has ended: later ends do nothing.
    ended: std::sync::atomic::AtomicBool,
}

/// The spans still open.
struct State {
    tracer: SdkTracer,
    capture: bool,
    /// The engine's clock against the wall clock.
    anchor: (Instant, SystemTime),
    step_ids: Vec<String>,
    /// The one task of a delegation: its agent's name (`invoke_agent NAME`).
    agent: Option<String>,
    run: Context,
    steps: HashMap<usize, Context>,
    levels: HashMap<usize, Context>,
    tasks: HashMap<(usize, u64), TaskSpans>,
    /// The run's prices, for each task's `summon.task.cost_usd`.
    prices: Option<crate::config::prices::Prices>,
}

/// A running task's open spans.
struct TaskSpans {
    task: Context,
    attempt: Option<Context>,
    request: Option<(Context, String)>,
    tool: Option<Context>,
}

impl RunTraces {
    /// The prices the run's tasks are priced at, for their `summon.task.cost_usd`.
    pub(crate) fn set_prices(&self, prices: crate::config::prices::Prices) {
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .prices = Some(prices);
    }

    /// Starts the run's root span, under `TRACEPARENT` when the environment has one.
    pub(crate) fn start(
        settings: &Settings,
        env: &crate::env::Env,
        pipeline: &str,
        step_ids: Vec<String>,
    ) -> std::io::Result<Self> {
        Self::start_root(
            settings,
            env,
            format!("run {pipeline}"),
            vec![
                KeyValue::new("summon.pipeline", pipeline.to_owned()),
                KeyValue::new("openinference.span.kind", "CHAIN"),
            ],
            step_ids,
        )
    }

    /// Starts a root span named `name`, under `TRACEPARENT` when the environment has one.
    pub(super) fn start_root(
        settings: &Settings,
        env: &crate::env::Env,
        name: String,
        root_attributes: Vec<KeyValue>,
        step_ids: Vec<String>,
    ) -> std::io::Result<Self> {
        let (provider, counts) = tracer_provider(settings, env)?;
        let tracer = provider.tracer("summon");
        let parent = parent_context(env);
        let anchor = (Instant::now(), SystemTime::now());
        let run = tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_attributes(root_attributes)
            .start_with_context(&tracer, &parent);
        let run = parent.with_span(run);
        let trace_id = run.span().span_context().trace_id().to_string();
        let inner = Arc::new(Inner {
            state: Arc::new(Mutex::new(State {
                tracer,
                capture: settings.capture_content,
                anchor,
                step_ids,
                agent: None,
                run,
                steps: HashMap::new(),
                levels: HashMap::new(),
                tasks: HashMap::new(),
                prices: None,
            })),
            provider,
            counts,
            endpoint: settings.endpoint.clone(),
            ended: std::sync::atomic::AtomicBool::new(false),
        });
        let flush: Arc<dyn crate::process::groups::Screen> = inner.clone();
        crate::process::groups::flush_on_exit(Arc::downgrade(&flush));
        Ok(Self { inner, trace_id })
    }

    /// The run's trace id (32 hex digits).
    pub(crate) fn trace_id(&self) -> &str {
        &self.trace_id
    }

    /// The run span's context as a `TRACEPARENT` value, for the commands the run starts.
    pub(crate) fn traceparent(&self) -> String {
        let state = self.lock();
        let span = state.run.span();
        let context = span.span_context();
        format!(
            "00-{}-{}-{:02x}",
            context.trace_id(),
            context.span_id(),
            context.trace_flags().to_u8()
        )
    }

    /// Adds `event` to these traces.
    pub(super) fn emit(&self, event: &RunEvent) {
        self.lock().on_event(event);
    }

    /// Makes the one task of these traces an agent's invocation (`invoke_agent NAME`).
    pub(super) fn set_agent(&self, name: &str) {
        self.lock().agent = Some(name.to_owned());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A consumer of the run's events that adds them to these traces.
    pub(crate) fn consumer(&self) -> Box<dyn Consumer> {
        Box::new(Follow(Arc::clone(&self.inner.state)))
    }

    /// Ends the run's span (`run_id`, and an error status when `failed`), sends what is left
    /// within the flush time, and answers the one warning of a run whose spans did not all
    /// reach the collector.
    pub(crate) fn finish(self, run_id: Option<&str>, failed: Option<&str>) -> Option<String> {
        self.inner.end(run_id, failed)
    }
}

impl Inner {
    fn end(&self, run_id: Option<&str>, failed: Option<&str>) -> Option<String> {
        if self.ended.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return None;
        }
        {
            let mut state = self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = SystemTime::now();
            for (_, spans) in state.tasks.drain() {
                spans.end_all(now, Some("interrupted"));
            }
            for (_, level) in state.levels.drain() {
                level.span().end_with_timestamp(now);
            }
            for (_, step) in state.steps.drain() {
                step.span().end_with_timestamp(now);
            }
            let run = state.run.span();
            if let Some(id) = run_id {
                run.set_attribute(KeyValue::new("summon.run.id", id.to_owned()));
            }
            if let Some(failed) = failed {
                run.set_status(Status::error(failed.to_owned()));
            }
            run.end_with_timestamp(now);
        }
        let _ = self.provider.shutdown();
        warning(&self.endpoint, &self.counts.tally())
    }
}

/// A signal ends summon: the open spans end as interrupted and are sent, within the flush
/// time, before the exit.
impl crate::process::groups::Screen for Inner {
    fn finish(&self) {
        if let Some(warning) = self.end(None, Some("terminated by a signal")) {
            eprintln!("summon: warning: {warning}");
        }
    }
}

/// A tracer provider whose spans go to the export thread, and what became of them.
pub(super) fn tracer_provider(
    settings: &Settings,
    env: &crate::env::Env,
) -> std::io::Result<(SdkTracerProvider, Arc<Counts>)> {
    crate::provider::install_crypto_provider();
    let unreachable = Arc::new(Mutex::new(None));
    let make = {
        let (settings, unreachable) = (settings.clone(), Arc::clone(&unreachable));
        move || exporter(&settings, unreachable)
    };
    let (processor, counts) = Exporting::start(make, settings, unreachable)?;
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource(env))
        .build();
    Ok((provider, counts))
}

/// The OTLP exporter `settings` ask for: over HTTP with summon's own reqwest, or over gRPC
/// (TLS with the system's roots for an `https` endpoint).
fn exporter(
    settings: &Settings,
    unreachable: Arc<Mutex<Option<String>>>,
) -> Result<opentelemetry_otlp::SpanExporter, String> {
    use opentelemetry_otlp::{Protocol as Otlp, WithExportConfig as _};
    let built = match settings.protocol {
        Protocol::Grpc => {
            let builder = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(settings.url.clone())
                .with_timeout(settings.timeout);
            let builder = if settings.url.starts_with("https://") {
                opentelemetry_otlp::WithTonicConfig::with_tls_config(
                    builder,
                    opentelemetry_otlp::tonic_types::transport::ClientTlsConfig::new()
                        .with_native_roots(),
                )
            } else {
                builder
            };
            builder.build()
        }
        Protocol::HttpProtobuf | Protocol::HttpJson => {
            let client = reqwest::Client::builder()
                .timeout(settings.timeout)
                .build()
                .map_err(|e| format!("cannot start the trace exporter: {e}"))?;
            opentelemetry_otlp::WithHttpConfig::with_http_client(
                opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_protocol(if settings.protocol == Protocol::HttpJson {
                        Otlp::HttpJson
                    } else {
                        Otlp::HttpBinary
                    })
                    .with_endpoint(settings.url.clone())
                    .with_timeout(settings.timeout),
                super::client::ReqwestClient(client, unreachable),
            )
            .build()
        }
    };
    built.map_err(|e| format!("cannot start the trace exporter: {e}"))
}

/// The one warning of a run whose spans did not all reach the collector.
pub(super) fn warning(endpoint: &str, tally: &Tally) -> Option<String> {
    (tally.dropped > 0).then(|| {
        format!(
            "traces: {} of {} spans not exported to {endpoint} ({})",
            tally.dropped,
            tally.ended,
            tally
                .error
                .as_deref()
                .unwrap_or("the end of the run came first")
        )
    })
}

/// `service.name` is `summon` unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names
/// one; the rest of `OTEL_RESOURCE_ATTRIBUTES` is read by the SDK.
fn resource(env: &crate::env::Env) -> opentelemetry_sdk::Resource {
    let named = env
        .var("OTEL_SERVICE_NAME")
        .is_some_and(|v| !v.trim().is_empty())
        || env.var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|v| {
            v.split(',')
                .any(|kv| kv.trim().starts_with("service.name="))
        });
    let builder = opentelemetry_sdk::Resource::builder();
    let builder = if named {
        builder
    } else {
        builder.with_service_name("summon")
    };
    builder
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build()
}

/// The context `TRACEPARENT` (and `TRACESTATE`) carry, or none.
pub(super) fn parent_context(env: &crate::env::Env) -> Context {
    use opentelemetry::propagation::TextMapPropagator as _;
    let mut carrier = HashMap::new();
    for (key, header) in [("TRACEPARENT", "traceparent"), ("TRACESTATE", "tracestate")] {
        if let Some(value) = env.var(key) {
            carrier.insert(header.to_owned(), value.trim().to_owned());
        }
    }
    if carrier.is_empty() {
        return Context::new();
    }
    opentelemetry_sdk::propagation::TraceContextPropagator::new()
        .extract_with_context(&Context::new(), &carrier)
}

/// The `error.type` of a task's failure.
fn error_type(class: FailureClass) -> &'static str {
    match class {
        FailureClass::Provider(class) => class,
        FailureClass::Answer => "unusable_answer",
        FailureClass::Schema => "schema",
        FailureClass::MaxTurns => "max_turns",
        FailureClass::Check => "checks",
        FailureClass::Extension => "extension",
        FailureClass::Timeout => "timeout",
        FailureClass::Cancelled => "cancelled",
        FailureClass::Prepare => "prepare",
        FailureClass::Budget => "budget",
        FailureClass::Other => "_OTHER",
    }
}

pub(super) fn failed(cx: &Context, error: &str) {
    let span = cx.span();
    span.set_attribute(KeyValue::new("error.type", error.to_owned()));
    span.set_status(Status::error(error.to_owned()));
}

/// The GenAI token counts of `usage`, cache reads and writes included.
fn usage_attributes(usage: &crate::provider::Usage) -> [KeyValue; 4] {
    [
        KeyValue::new("gen_ai.usage.input_tokens", count(usage.input_tokens)),
        KeyValue::new("gen_ai.usage.output_tokens", count(usage.output_tokens)),
        KeyValue::new(
            "gen_ai.usage.cache_read.input_tokens",
            count(usage.cache_read_tokens),
        ),
        KeyValue::new(
            "gen_ai.usage.cache_creation.input_tokens",
            count(usage.cache_write_tokens),
        ),
    ]
}

fn millis(wait: Duration) -> i64 {
    i64::try_from(wait.as_millis()).unwrap_or(i64::MAX)
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl TaskSpans {
    /// Ends every open span, the open ones marked failed with `error`.
    fn end_all(self, at: SystemTime, error: Option<&str>) {
        for cx in [self.tool, self.request.map(|(cx, _)| cx), self.attempt]
            .into_iter()
            .flatten()
        {
            if let Some(error) = error {
                failed(&cx, error);
            }
            cx.span().end_with_timestamp(at);
        }
        if let Some(error) = error {
            failed(&self.task, error);
        }
        self.task.span().end_with_timestamp(at);
    }
}

impl State {
    fn time(&self, at: Instant) -> SystemTime {
        match at.checked_duration_since(self.anchor.0) {
            Some(after) => self.anchor.1 + after,
            None => self.anchor.1 - self.anchor.0.saturating_duration_since(at),
        }
    }

    fn child(
        &self,
        parent: &Context,
        name: String,
        kind: SpanKind,
        at: SystemTime,
        attributes: Vec<KeyValue>,
    ) -> Context {
        self.child_with_id(parent, name, kind, at, attributes, None)
    }

    /// A child span whose id is `id` when the engine chose one (what it started runs
    /// under it).
    fn child_with_id(
        &self,
        parent: &Context,
        name: String,
        kind: SpanKind,
        at: SystemTime,
        attributes: Vec<KeyValue>,
        id: Option<u64>,
    ) -> Context {
        let mut builder = self
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_start_time(at)
            .with_attributes(attributes);
        if let Some(id) = id.filter(|id| *id != 0) {
            builder = builder.with_span_id(opentelemetry::trace::SpanId::from(id));
        }
        let span = builder.start_with_context(&self.tracer, parent);
        parent.with_span(span)
    }

    /// A span under the task's attempt in flight (its task's, before the first attempt), or
    /// none for a task not followed.
    fn in_attempt(
        &self,
        task: (usize, u64),
        name: String,
        kind: SpanKind,
        at: SystemTime,
        attributes: Vec<KeyValue>,
    ) -> Option<Context> {
        self.in_attempt_with_id(task, name, kind, at, attributes, None)
    }

    fn in_attempt_with_id(
        &self,
        task: (usize, u64),
        name: String,
        kind: SpanKind,
        at: SystemTime,
        attributes: Vec<KeyValue>,
        id: Option<u64>,
    ) -> Option<Context> {
        let task = self.tasks.get(&task)?;
        let parent = task.attempt.as_ref().unwrap_or(&task.task);
        Some(self.child_with_id(parent, name, kind, at, attributes, id))
    }

    /// The span a task of `step` starts under: its reduction level's, else its step's.
    fn task_parent(&self, step: usize) -> Context {
        self.levels
            .get(&step)
            .or_else(|| self.steps.get(&step))
            .unwrap_or(&self.run)
            .clone()
    }

    fn open_task(&mut self, step: usize, index: u64, at: SystemTime) -> &mut TaskSpans {
        if !self.tasks.contains_key(&(step, index)) {
            let parent = self.task_parent(step);
            let (name, attributes) = match &self.agent {
                Some(agent) => (
                    format!("invoke_agent {agent}"),
                    vec![
                        KeyValue::new("gen_ai.operation.name", "invoke_agent"),
                        KeyValue::new("gen_ai.agent.name", agent.clone()),
                        KeyValue::new("openinference.span.kind", "AGENT"),
                    ],
                ),
                None => {
                    let id = self.step_ids.get(step).cloned().unwrap_or_default();
                    (
                        format!("task {id}#{index}"),
                        vec![
                            KeyValue::new("summon.step", id),
                            KeyValue::new("summon.task.index", count(index)),
                            KeyValue::new("openinference.span.kind", "AGENT"),
                        ],
                    )
                }
            };
            let task = self.child(&parent, name, SpanKind::Internal, at, attributes);
            self.tasks.insert(
                (step, index),
                TaskSpans {
                    task,
                    attempt: None,
                    request: None,
                    tool: None,
                },
            );
        }
        self.tasks
            .get_mut(&(step, index))
            .expect("the task was just opened")
    }

    fn activity(&mut self, activity: &Activity) {
        let at = self.time(activity.at);
        let (step, index) = (activity.step, activity.index);
        match &activity.what {
            Doing::Attempt { attempt, sandbox } => {
                let task = self.open_task(step, index, at);
                if let Some(previous) = task.attempt.take() {
                    // A step's `retries` start another attempt only after one failed.
                    failed(&previous, "attempt_failed");
                    previous.span().end_with_timestamp(at);
                }
                let parent = task.task.clone();
                if !sandbox.is_empty() {
                    parent
                        .span()
                        .set_attribute(KeyValue::new("summon.sandbox.policy", *sandbox));
                }
                let attempt_cx = self.child(
                    &parent,
                    format!("attempt {attempt}"),
                    SpanKind::Internal,
                    at,
                    vec![KeyValue::new("summon.attempt", i64::from(*attempt))],
                );
                if let Some(task) = self.tasks.get_mut(&(step, index)) {
                    task.attempt = Some(attempt_cx);
                }
            }
            Doing::Request {
                provider,
                model,
                turn,
            } => {
                let Some(request) = self.in_attempt(
                    (step, index),
                    format!("chat {model}"),
                    SpanKind::Client,
                    at,
                    vec![
                        KeyValue::new("gen_ai.operation.name", "chat"),
                        KeyValue::new("openinference.span.kind", "LLM"),
                        KeyValue::new("gen_ai.provider.name", provider.clone()),
                        KeyValue::new("gen_ai.request.model", model.clone()),
                        KeyValue::new("summon.turn", i64::from(*turn)),
                    ],
                ) else {
                    return;
                };
                if let Some(task) = self.tasks.get_mut(&(step, index)) {
                    task.request = Some((request, model.clone()));
                }
            }
            Doing::Response {
                usage,
                stop_reason,
                error,
            } => {
                let Some((request, model)) = self
                    .tasks
                    .get_mut(&(step, index))
                    .and_then(|task| task.request.take())
                else {
                    return;
                };
                let span = request.span();
                match error {
                    Some(error) => failed(&request, error),
                    None => {
                        span.set_attribute(KeyValue::new("gen_ai.response.model", model));
                        span.set_attributes(usage_attributes(usage));
                        if let Some(reason) = stop_reason {
                            span.set_attribute(KeyValue::new(
                                "gen_ai.response.finish_reasons",
                                Value::Array(Array::String(vec![StringValue::from(
                                    reason.clone(),
                                )])),
                            ));
                        }
                    }
                }
                span.end_with_timestamp(at);
            }
            Doing::Retry { class, wait } => {
                let Some(task) = self.tasks.get(&(step, index)) else {
                    return;
                };
                let on = task
                    .request
                    .as_ref()
                    .map(|(cx, _)| cx)
                    .or(task.attempt.as_ref())
                    .unwrap_or(&task.task);
                let name = if *class == "rate_limited" {
                    "rate_limit_wait"
                } else {
                    "retry"
                };
                on.span().add_event_with_timestamp(
                    name,
                    at,
                    vec![
                        KeyValue::new("summon.retry.class", *class),
                        KeyValue::new("summon.retry.wait_ms", millis(*wait)),
                    ],
                );
            }
            Doing::ToolStarted {
                name,
                span,
                extension,
            } => {
                let mut attributes = vec![
                    KeyValue::new("gen_ai.operation.name", "execute_tool"),
                    KeyValue::new("openinference.span.kind", "TOOL"),
                    KeyValue::new("gen_ai.tool.name", name.clone()),
                ];
                if let Some(extension) = extension {
                    // A call to an MCP server: the MCP semantic conventions' method, and
                    // the extension it went to.
                    attributes.push(KeyValue::new("mcp.method.name", "tools/call"));
                    attributes.push(KeyValue::new("summon.extension", extension.clone()));
                }
                let Some(tool) = self.in_attempt_with_id(
                    (step, index),
                    format!("execute_tool {name}"),
                    if extension.is_some() {
                        SpanKind::Client
                    } else {
                        SpanKind::Internal
                    },
                    at,
                    attributes,
                    *span,
                ) else {
                    return;
                };
                if let Some(task) = self.tasks.get_mut(&(step, index)) {
                    task.tool = Some(tool);
                }
            }
            Doing::ToolEnded { ok } => {
                if let Some(tool) = self
                    .tasks
                    .get_mut(&(step, index))
                    .and_then(|task| task.tool.take())
                {
                    if !ok {
                        failed(&tool, "tool_error");
                    }
                    tool.span().end_with_timestamp(at);
                }
            }
        }
    }

    fn task_finished(&mut self, done: &TaskDone, level: Option<u32>) {
        if done.resumed {
            // Finished in an earlier process of this run, whose trace has it.
            return;
        }
        let now = SystemTime::now();
        let start = now.checked_sub(done.duration).unwrap_or(now);
        let spans = match self.tasks.remove(&(done.step, done.index)) {
            Some(spans) => spans,
            None => {
                // Not followed live (a batch answer, a reused one): one span for the task.
                self.open_task(done.step, done.index, start);
                self.tasks
                    .remove(&(done.step, done.index))
                    .expect("the task was just opened")
            }
        };
        let label = crate::event::item_label(&done.item, done.index);
        let mut attributes = vec![
            KeyValue::new("summon.task.item", label),
            KeyValue::new(
                "summon.task.status",
                if done.ok { "completed" } else { "failed" },
            ),
            KeyValue::new("summon.task.turns", i64::from(done.turns)),
            KeyValue::new("summon.task.attempts", i64::from(done.trace.attempts)),
        ];
        attributes.extend(usage_attributes(&done.usage));
        if let Some(role) = &done.role {
            attributes.push(KeyValue::new("summon.task.role", role.clone()));
            attributes.push(KeyValue::new("gen_ai.agent.name", role.clone()));
        }
        if let Some(model) = &done.model {
            attributes.push(KeyValue::new("gen_ai.request.model", model.clone()));
        }
        // priced as the report prices it: at the tier that served it
        let cost = if done.reused || done.usage.total() == 0 {
            Some(0.0)
        } else {
            self.prices.as_ref().and_then(|prices| {
                let price = prices.at(done.model.as_deref()?, crate::output::served_tier(done))?;
                Some(price.cost(&done.usage))
            })
        };
        if let Some(cost) = cost {
            attributes.push(KeyValue::new("summon.task.cost_usd", cost));
        }
        if let Some(level) = level {
            attributes.push(KeyValue::new("summon.reduce.level", i64::from(level)));
        }
        if done.reused {
            attributes.push(KeyValue::new("summon.task.reused", true));
        }
        if let Some(batch) = &done.batch_id {
            attributes.push(KeyValue::new("summon.task.batch_id", batch.clone()));
        }
        if self.capture {
            if let Some(prompt) = &done.trace.prompt {
                attributes.push(KeyValue::new("gen_ai.input.messages", prompt.clone()));
            }
            attributes.push(KeyValue::new("gen_ai.output.messages", done.output.clone()));
        }
        spans.task.span().set_attributes(attributes);
        let error = done.error.as_ref().map(|failure| error_type(failure.class));
        if let Some(error) = error {
            spans.task.span().set_status(Status::error(
                done.error
                    .as_ref()
                    .map(|f| f.class.label())
                    .unwrap_or_default(),
            ));
            spans
                .task
                .span()
                .set_attribute(KeyValue::new("error.type", error));
        }
        let TaskSpans {
            task,
            attempt,
            request,
            tool,
        } = spans;
        for cx in [tool, request.map(|(cx, _)| cx)].into_iter().flatten() {
            if let Some(error) = error {
                failed(&cx, error);
            }
            cx.span().end_with_timestamp(now);
        }
        if let Some(attempt) = attempt {
            if let Some(error) = error {
                failed(&attempt, error);
            }
            attempt.span().end_with_timestamp(now);
        }
        task.span().end_with_timestamp(now);
    }

    fn on_event(&mut self, event: &RunEvent) {
        let now = SystemTime::now();
        match event {
            RunEvent::StepStarted { step } => {
                let id = self.step_ids.get(*step).cloned().unwrap_or_default();
                let run = self.run.clone();
                let cx = self.child(
                    &run,
                    format!("step {id}"),
                    SpanKind::Internal,
                    now,
                    vec![
                        KeyValue::new("summon.step", id),
                        KeyValue::new("openinference.span.kind", "CHAIN"),
                    ],
                );
                self.steps.insert(*step, cx);
            }
            RunEvent::StepTotal { step, total } => {
                if let Some(cx) = self.steps.get(step) {
                    cx.span()
                        .set_attribute(KeyValue::new("summon.step.tasks", count(*total)));
                }
            }
            RunEvent::LevelStarted {
                step,
                level,
                chunks,
            } => {
                if let Some(previous) = self.levels.remove(step) {
                    previous.span().end_with_timestamp(now);
                }
                let Some(parent) = self.steps.get(step).cloned() else {
                    return;
                };
                let cx = self.child(
                    &parent,
                    format!("reduce level {level}"),
                    SpanKind::Internal,
                    now,
                    vec![
                        KeyValue::new("summon.reduce.level", i64::from(*level)),
                        KeyValue::new("summon.reduce.chunks", count(*chunks as u64)),
                    ],
                );
                self.levels.insert(*step, cx);
            }
            RunEvent::Activity(activity) => self.activity(activity),
            RunEvent::Decomposed {
                step,
                form,
                started,
                items,
                error,
            } => {
                let Some(parent) = self.steps.get(step).cloned() else {
                    return;
                };
                let mut attributes = vec![KeyValue::new("summon.decompose.form", *form)];
                if let Some(items) = items {
                    attributes.push(KeyValue::new(
                        "summon.decompose.items",
                        count(*items as u64),
                    ));
                }
                let start = self.time(*started);
                let cx = self.child(
                    &parent,
                    format!("decompose {form}"),
                    SpanKind::Internal,
                    start,
                    attributes,
                );
                if error.is_some() {
                    failed(&cx, "decompose_failed");
                }
                cx.span().end_with_timestamp(now);
            }
            RunEvent::TaskFinished { done, level, .. } => self.task_finished(done, *level),
            RunEvent::Interrupted { .. } => {
                self.run
                    .span()
                    .add_event_with_timestamp("interrupted", now, Vec::new());
            }
            RunEvent::StepFinished {
                step,
                status,
                error,
            } => {
                if let Some(level) = self.levels.remove(step) {
                    level.span().end_with_timestamp(now);
                }
                if let Some(cx) = self.steps.remove(step) {
                    let span = cx.span();
                    span.set_attribute(KeyValue::new("summon.step.status", status.name()));
                    if let Some(error) = error {
                        span.set_status(Status::error(error.clone()));
                    }
                    span.end_with_timestamp(now);
                }
            }
            RunEvent::TasksStarted { .. }
            | RunEvent::Retry { .. }
            | RunEvent::Waiting { .. }
            | RunEvent::Held { .. }
            | RunEvent::OutputLimit { .. }
            | RunEvent::RateLimits { .. }
            | RunEvent::Slot { .. }
            | RunEvent::Notice { .. } => {}
        }
    }
}

/// The consumer handed to the engine.
struct Follow(Arc<Mutex<State>>);

impl Consumer for Follow {
    fn on_event(&mut self, event: &RunEvent) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .on_event(event);
    }
}
