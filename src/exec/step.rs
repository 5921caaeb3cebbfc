//! Running one step: render each task, skip what the journal already has, run the rest
//! under the global and per-step caps, and report every finished task.

use super::step_error::StepError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::context::item_context;
use super::hash::request_hash;
pub(crate) use crate::compile::{Compiled, Rendered};
use crate::compile::{Flags, StepSettings};
use crate::config::Config;
use crate::delegation::{Request, Resolver, prepare_with};
use crate::env::Env;
use crate::event::{
    Doing, Events, Failure, FailureClass, PROMPT_LIMIT, RunEvent, Spent, TaskDone, TaskTrace,
};
use crate::pipeline::model::{OnExtensionError, PipelineSettings, Step, TaskTemplate};
use crate::provider::{Client, RetryPolicy, Usage};
use crate::recipe::ParamInput;
use crate::recipe::params::Origin;
use crate::source::Catalog;
use crate::store::{FinishedMap, JournalStatus};
use crate::subagent::{SubagentStatus, run_subagent};

/// What every task of a run shares.
pub(crate) struct Shared {
    pub(crate) env: Env,
    pub(crate) config: Config,
    pub(crate) catalog: Catalog,
    pub(crate) resolver: Resolver,
    /// One client per provider and service tier; the tiers of a provider share its limits.
    pub(crate) clients: Mutex<HashMap<String, Client>>,
    pub(crate) global: Arc<Semaphore>,
    pub(crate) settings: PipelineSettings,
    /// Finished tasks of an earlier attempt of this run (`--resume`).
    pub(crate) finished: FinishedMap,
    /// Completed tasks of earlier runs of the pipeline, by request hash, for the steps that
    /// reuse them (`--reuse`, a step's `reuse: true`); empty otherwise.
    pub(crate) reusable: HashMap<String, crate::store::TaskResultRow>,
    /// `--reuse`: every step reuses.
    pub(crate) reuse_all: bool,
    /// Set by the first Ctrl-C: start no new task.
    pub(crate) drain: CancellationToken,
    /// Set by the second Ctrl-C: stop tasks in flight.
    pub(crate) kill: CancellationToken,
    pub(crate) policy: RetryPolicy,
    /// How many journal rows are committed, in record order; updated after each commit.
    pub(crate) committed: tokio::sync::watch::Receiver<u64>,
    /// The run's id in the store (batches are recorded under it).
    pub(crate) run_id: String,
    /// `--batch`: every eligible fan_out step goes through the provider's batch API.
    pub(crate) batch_all: bool,
    /// The run's events: what its outputs and display follow.
    pub(crate) events: Events,
    /// The run span's context for the commands the run starts (`TRACEPARENT`).
    pub(crate) traceparent: Option<String>,
    /// When the run started: tasks' start times are told from it.
    pub(crate) run_started: Instant,
    /// The run's spend cap, when it has one.
    pub(crate) budget: Option<Arc<crate::subagent::budget::Ledger>>,
    /// The provider that refused the key or could not be reached, once one did.
    pub(crate) stopped: std::sync::OnceLock<crate::event::ProviderStopped>,
}

impl Shared {
    /// After a task ended: once the spend cap is reached, no new task starts (as after a
    /// first Ctrl-C) and the run ends "budget reached".
    pub(crate) fn check_budget(&self) {
        if let Some(ledger) = &self.budget
            && ledger.reached()
            && !self.drain.is_cancelled()
        {
            self.events.emit(RunEvent::Interrupted {
                text: format!(
                    "summon: {}: no new task starts; finishing the tasks in flight",
                    ledger.reached_text()
                ),
            });
            self.drain.cancel();
        }
    }

    /// What each provider's limits held back and charged, by provider (the clients of a
    /// provider's service tiers share them); `None` when no request was sent.
    pub(crate) fn rate_limit_stats(
        &self,
    ) -> Option<Vec<(String, crate::provider::AdmissionStats)>> {
        let clients = self.clients.lock().ok()?;
        let mut providers: Vec<(String, crate::provider::AdmissionStats)> = Vec::new();
        for client in clients.values() {
            let name = &client.endpoint().name;
            if !providers.iter().any(|(n, _)| n == name) {
                providers.push((name.clone(), client.admission().stats()));
            }
        }
        providers.sort_by(|a, b| a.0.cmp(&b.0));
        (!providers.is_empty()).then_some(providers)
    }

    /// After a task ended: once a provider refused the key or could not be reached for its
    /// window, no new task starts (as after a first Ctrl-C), and the run ends naming it.
    pub(crate) fn check_providers(&self) {
        if self.stopped.get().is_some() {
            return;
        }
        let stop = self.clients.lock().ok().and_then(|clients| {
            clients.values().find_map(|client| {
                client
                    .stop()
                    .map(|stop| (client.endpoint().name.clone(), stop))
            })
        });
        let Some((name, stop)) = stop else { return };
        let stopped = crate::event::ProviderStopped {
            refused: matches!(stop, crate::provider::ProviderStop::Refused(_)),
            no_server: matches!(stop, crate::provider::ProviderStop::NoServer { .. }),
            text: stop.describe(&name),
        };
        let text = format!(
            "summon: {}; no new task starts; finishing the tasks in flight",
            stopped.text
        );
        if self.stopped.set(stopped).is_ok() {
            self.events.emit(RunEvent::Interrupted { text });
            self.drain.cancel();
        }
    }
}

/// A task's concurrency slots, held until its result is committed to the journal, so that a
/// `kill -9` repeats at most the tasks that hold slots.
pub(super) type Permits = (
    tokio::sync::OwnedSemaphorePermit,
    Option<tokio::sync::OwnedSemaphorePermit>,
);

/// Waits for a step slot (when the step has a cap) and a global slot.
pub(super) async fn acquire_slot(
    global: &Arc<Semaphore>,
    local: Option<&Arc<Semaphore>>,
) -> Option<Permits> {
    let local = match local {
        Some(sem) => Some(Arc::clone(sem).acquire_owned().await.ok()?),
        None => None,
    };
    let global = Arc::clone(global).acquire_owned().await.ok()?;
    Some((global, local))
}

/// The slots of one running task; given back while it waits out a rate limit, said to the
/// run's events so that the display counts in flight only the tasks that hold one.
pub(crate) struct TaskSlot {
    global: Arc<Semaphore>,
    local: Option<Arc<Semaphore>>,
    held: Mutex<Option<Permits>>,
    events: Events,
    step: usize,
}

impl TaskSlot {
    pub(super) fn new(
        shared: &Shared,
        step: usize,
        local: Option<&Arc<Semaphore>>,
        permits: Permits,
    ) -> Arc<Self> {
        Arc::new(Self {
            global: Arc::clone(&shared.global),
            local: local.cloned(),
            held: Mutex::new(Some(permits)),
            events: shared.events.clone(),
            step,
        })
    }

    /// The permits, once the task is done (taken again if it gave them back to wait).
    pub(super) async fn into_permits(self: Arc<Self>) -> Option<Permits> {
        if let Some(permits) = self.held.lock().ok().and_then(|mut h| h.take()) {
            return Some(permits);
        }
        crate::subagent::Slot::reacquire(&*self).await;
        self.held.lock().ok().and_then(|mut h| h.take())
    }
}

impl crate::subagent::Slot for TaskSlot {
    fn release(&self) {
        let given = self.held.lock().is_ok_and(|mut held| held.take().is_some());
        if given {
            self.events.emit(RunEvent::Slot {
                step: self.step,
                given: true,
            });
        }
    }

    fn reacquire(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let Ok(global) = Arc::clone(&self.global).acquire_owned().await else {
                return;
            };
            let local = match &self.local {
                Some(sem) => match Arc::clone(sem).acquire_owned().await {
                    Ok(permit) => Some(permit),
                    Err(_) => return,
                },
                None => None,
            };
            if let Ok(mut held) = self.held.lock() {
                *held = Some((global, local));
            }
            self.events.emit(RunEvent::Slot {
                step: self.step,
                given: false,
            });
        })
    }
}

/// How a step's tasks are run.
#[derive(Clone)]
pub(crate) struct StepConfig {
    pub(crate) index: usize,
    pub(crate) id: String,
    /// Provider, model, temperature, turns, output limit and sandbox: flag > step >
    /// pipeline, as the compile layers them.
    pub(crate) settings: StepSettings,
    pub(crate) allow_empty: bool,
    pub(crate) retries: u32,
    pub(crate) timeout: Option<Duration>,
    /// `--shard I/N`: send only the tasks this shard owns (by request hash).
    pub(crate) shard: Option<crate::pipeline::shard::Shard>,
    /// Take a completed task of an earlier run with the same request instead of sending it.
    pub(crate) reuse: bool,
    /// Whether a task whose extension failed counts as failed.
    pub(crate) on_extension_error: OnExtensionError,
    /// The step's `context_window`, over the model's.
    pub(crate) context_window: Option<u64>,
    /// Prompt caching: on unless the step or the config file says `cache: false`.
    pub(crate) cache: bool,
    /// The step's tasks share their tools and system prompt (a fan-out of more than one).
    pub(crate) cache_shared: bool,
    /// OpenAI's `prompt_cache_key`, the same for every request of the step.
    pub(crate) cache_key: Option<String>,
    /// Fired by the step's first task once its prefix is in the cache (the warm-up).
    pub(crate) warm: Option<Arc<crate::subagent::WarmSignal>>,
    /// The step's `tools:`: the subset of its tasks' tools they are sent (`None`: all).
    pub(crate) tools: Option<Vec<String>>,
    /// A fan-out: its tasks learn their output limit from each other's answers.
    pub(crate) fan_out: bool,
    /// The output limit's learning, shared by the step's tasks (set when they run).
    pub(crate) output_cap: Option<Arc<crate::subagent::output_cap::OutputCap>>,
}

impl StepConfig {
    /// The step's settings as [`StepSettings::layer`] gives them (the run's flags are in the
    /// pipeline the engine runs: [`crate::compile::compile_pipeline`] wrote them there).
    pub(crate) fn new(index: usize, step: &Step, settings: &PipelineSettings) -> Self {
        let layered = StepSettings::layer(&Flags::default(), step, settings);
        Self {
            index,
            id: step.id.clone(),
            allow_empty: step.allow_empty,
            retries: step.retries,
            timeout: step.timeout,
            shard: None,
            reuse: step.reuse,
            on_extension_error: step.on_extension_error,
            context_window: step.context_window,
            cache: step.cache.unwrap_or(true),
            cache_shared: matches!(step.kind, crate::pipeline::model::StepKind::FanOut(_)),
            cache_key: None,
            warm: None,
            fan_out: matches!(step.kind, crate::pipeline::model::StepKind::FanOut(_)),
            output_cap: None,
            tools: step
                .tools
                .as_ref()
                .map(|list| list.iter().map(|(name, _)| name.clone()).collect()),
            settings: layered,
        }
    }

    /// The sandbox of the model's shell commands and whether they may use the network, as
    /// the step's settings give them (`None`: left to the config file).
    pub(crate) fn sandbox(&self) -> (Option<crate::sandbox::Policy>, Option<bool>) {
        (self.settings.sandbox, self.settings.network)
    }

    /// Turns caching off when the config file does, and keys the step's cache by the
    /// pipeline's name and the step's id (stable from run to run, nothing per task).
    pub(crate) fn with_cache(mut self, config: &crate::config::Config, pipeline: &str) -> Self {
        self.cache &= config.cache != Some(false);
        self.cache_key = self.cache.then(|| {
            let hash = super::hash::request_hash(&[Some(pipeline), Some(&self.id)]);
            format!("summon-{}", &hash[..16])
        });
        self
    }

    /// Whether this run sends the task with this request hash (another shard sends it
    /// otherwise).
    pub(crate) fn owns(&self, hash: &str) -> bool {
        self.shard.is_none_or(|shard| shard.owns(hash))
    }

    /// The hash of a rendered task under this step's settings.
    pub(crate) fn hash(&self, rendered: &Rendered) -> String {
        let params = serde_json::to_string(&rendered.params).unwrap_or_default();
        let schema = rendered.schema.as_ref().map(Value::to_string);
        let turns = self.settings.max_turns.map(|t| t.to_string());
        let temperature = self.settings.temperature.map(|t| t.to_string());
        let mut parts = vec![
            rendered.source.as_deref(),
            rendered.instructions.as_deref(),
            Some(&params),
            rendered.context.as_deref(),
            self.settings.provider.as_deref(),
            self.settings.model.as_deref(),
            temperature.as_deref(),
            turns.as_deref(),
            schema.as_deref(),
        ];
        // Only when set, so that the hashes of runs without a limit stay what they were.
        let limit = self
            .settings
            .max_output_tokens
            .map(|l| format!("max_output_tokens={l}"));
        if limit.is_some() {
            parts.push(limit.as_deref());
        }
        let stop =
            (!self.settings.stop.is_empty()).then(|| format!("stop={:?}", self.settings.stop));
        if stop.is_some() {
            parts.push(stop.as_deref());
        }
        let tools = self
            .tools
            .as_ref()
            .map(|list| format!("tools={}", list.join(",")));
        if tools.is_some() {
            parts.push(tools.as_deref());
        }
        request_hash(&parts)
    }
}

/// Whether a rendered task's answer is validated against a JSON schema (the step's, or its
/// recipe's `response.json_schema`): its journaled output is then the answer's JSON, parsed
/// again as its data when the task is taken from the journal.
/// The agent role a rendered task runs as: its source, when that is an agent.
pub(crate) fn role_of(catalog: &Catalog, rendered: &Rendered) -> Option<String> {
    let source = catalog.get(rendered.source.as_deref()?)?;
    matches!(source.def, crate::source::SourceDef::Agent(_)).then(|| source.name.clone())
}

pub(crate) fn expects_data(catalog: &Catalog, rendered: &Rendered) -> bool {
    use crate::source::SourceDef;
    if rendered.schema.is_some() {
        return true;
    }
    let Some(source) = rendered
        .source
        .as_deref()
        .and_then(|name| catalog.get(name))
    else {
        return false;
    };
    match &source.def {
        SourceDef::Recipe(recipe) | SourceDef::Subrecipe { recipe, .. } => {
            recipe.response_schema.is_some()
        }
        SourceDef::Agent(_) => false,
    }
}

/// The journaled result of a task whose rendered request has not changed, if any: from an
/// earlier attempt of this run, else (when the step reuses) from an earlier run. `data`: the
/// task's answer is schema-validated JSON ([`expects_data`]).
pub(crate) fn resumed(
    shared: &Shared,
    step: &StepConfig,
    index: u64,
    item: &Value,
    hash: &str,
    data: bool,
) -> Option<TaskDone> {
    let from_this_run = shared
        .finished
        .get(&(step.id.clone(), index))
        .filter(|row| row.input_hash == hash && row.status == JournalStatus::Completed);
    let (row, reused) = match from_this_run {
        Some(row) => (row, false),
        None if step.reuse => (shared.reusable.get(hash)?, true),
        None => return None,
    };
    let output = row.output.clone().unwrap_or_default();
    let mut done = TaskDone {
        step: step.index,
        index,
        item: item.clone(),
        ok: true,
        structured: data.then(|| serde_json::from_str(&output).ok()).flatten(),
        extracted: false,
        corrections: 0,
        output,
        error: None,
        turns: if reused { 0 } else { row.turns },
        // A reused answer costs nothing in this run.
        usage: if reused { Usage::default() } else { row.tokens },
        duration: if reused {
            Duration::ZERO
        } else {
            Duration::from_millis(row.duration_ms)
        },
        model: None,
        resumed: !reused,
        reused,
        hash: hash.to_owned(),
        batch_id: if reused { None } else { row.batch_id.clone() },
        trace: TaskTrace::default(),
        warnings: Vec::new(),
        role: None,
    };
    // A task of this run keeps what its attempt knew: its model (its price), role, prompt,
    // attempts and retries. A reused answer cost nothing here.
    if !reused
        && let Some(meta) = row
            .meta
            .as_deref()
            .and_then(|text| serde_json::from_str::<crate::event::TaskMeta>(text).ok())
    {
        meta.restore(&mut done);
    }
    Some(done)
}

/// Runs one task to the end: retries on failure, a timeout per attempt.
pub(crate) async fn run_task(
    shared: Arc<Shared>,
    step: StepConfig,
    index: u64,
    item: Value,
    rendered: Rendered,
    hash: String,
    slot: Arc<TaskSlot>,
) -> TaskDone {
    let started = Instant::now();
    let role = role_of(&shared.catalog, &rendered);
    let mut trace = TaskTrace {
        started_ms: Some(
            u64::try_from(started.duration_since(shared.run_started).as_millis())
                .unwrap_or(u64::MAX),
        ),
        ..TaskTrace::default()
    };
    let mut attempt = 0;
    // Warnings of a fan_out task name its item; a single task is the step's own.
    let label = (!item.is_null()).then(|| crate::event::item_label(&item, index));
    // Every attempt is billed, the ones that failed too.
    let mut spent = Spent::default();
    // The task's share of the spend cap, kept over its attempts.
    let mut budget = None;
    loop {
        trace.attempts += 1;
        trace.in_flight = Spent::default();
        let sandbox = crate::sandbox::Sandbox::pick(&[
            step.sandbox(),
            (shared.config.sandbox, shared.config.network),
        ]);
        shared.events.activity(
            step.index,
            index,
            Doing::Attempt {
                attempt: trace.attempts,
                sandbox: sandbox.policy.name(),
            },
        );
        let task = TaskAt {
            index,
            item: label.as_deref(),
        };
        let outcome = tokio::select! {
            outcome = attempt_task(&shared, &step, &rendered, &slot, &mut trace, task, &mut budget) => outcome,
            () = shared.kill.cancelled() => Err(Failure::new(FailureClass::Cancelled, "cancelled")),
        };
        let Attempt {
            mut ok,
            text: output,
            structured,
            mut error,
            turns,
            usage,
            model,
            extracted,
            corrections,
            warnings,
            left_out,
        } = outcome.unwrap_or_else(|error| Attempt::failed(error, trace.in_flight));
        spent.turns += turns;
        spent.usage.add(usage);
        if ok && step.on_extension_error == OnExtensionError::Fail && !warnings.is_empty() {
            ok = false;
            error = Some(Failure::new(
                FailureClass::Extension,
                format!(
                    "{} (the step sets on_extension_error: fail)",
                    warnings.join("; ")
                ),
            ));
        }
        // An answer that its corrections could not bring to the schema is not sent again
        // from the start: the corrections were its retries.
        let corrected_in_vain = !ok
            && corrections > 0
            && error
                .as_ref()
                .is_some_and(|e| e.class == FailureClass::Schema);
        if corrected_in_vain
            && attempt < step.retries
            && let Some(error) = &mut error
        {
            let note = format!(
                " (not retried: its {} were its retries)",
                crate::plural::count(corrections, "correction")
            );
            let end = error.message.find('\n').unwrap_or(error.message.len());
            error.message.insert_str(end, &note);
        }
        // Nothing more goes out when the cap is reached or the provider is stopped.
        let over_budget = error.as_ref().is_some_and(|e| {
            e.class == FailureClass::Budget || e.class == FailureClass::Provider("not_sent")
        });
        if ok
            || corrected_in_vain
            || attempt >= step.retries
            || shared.kill.is_cancelled()
            || over_budget
        {
            return TaskDone {
                step: step.index,
                index,
                item,
                ok,
                output,
                structured,
                extracted,
                corrections,
                error,
                turns: spent.turns,
                usage: spent.usage,
                duration: started.elapsed(),
                model,
                resumed: false,
                reused: false,
                hash,
                batch_id: None,
                trace,
                warnings: left_out.into_iter().chain(warnings).collect(),
                role,
            };
        }
        attempt += 1;
    }
}

/// The task an attempt belongs to: its index and, in a fan_out, its item's label.
#[derive(Clone, Copy)]
struct TaskAt<'a> {
    index: u64,
    item: Option<&'a str>,
}

/// How one attempt at a task ended.
struct Attempt {
    /// The subagent completed (its answer may still fail `on_extension_error`).
    ok: bool,
    /// The answer: the structured value as JSON text, else the text.
    text: String,
    structured: Option<Value>,
    error: Option<Failure>,
    turns: u32,
    usage: Usage,
    /// The model that answered.
    model: Option<String>,
    /// The structured answer was taken from a fenced block or the text around it.
    extracted: bool,
    /// Answers sent back for correction because they did not validate.
    corrections: u32,
    /// What went wrong with the task's extensions, one line each.
    warnings: Vec<String>,
    /// The agent's listed tools that were left out, said in the result with the warnings
    /// (not an extension failure).
    left_out: Vec<String>,
}

impl Attempt {
    /// An attempt that failed before the subagent could answer, or was stopped (a timeout,
    /// a cancel) after spending `spent`.
    fn failed(error: Failure, spent: Spent) -> Self {
        Self {
            ok: false,
            text: String::new(),
            structured: None,
            error: Some(error),
            turns: spent.turns,
            usage: spent.usage,
            model: None,
            extracted: false,
            corrections: 0,
            warnings: Vec::new(),
            left_out: Vec::new(),
        }
    }
}

async fn attempt_task(
    shared: &Shared,
    step: &StepConfig,
    rendered: &Rendered,
    slot: &Arc<TaskSlot>,
    trace: &mut TaskTrace,
    task: TaskAt<'_>,
    budget: &mut Option<Arc<crate::subagent::budget::TaskBudget>>,
) -> Result<Attempt, Failure> {
    let TaskAt { index, item } = task;
    let mut prepared = prepare_task(shared, step, rendered).await?;
    if let Some(ledger) = &shared.budget {
        if budget.is_none() {
            let model = &prepared.resolved.model;
            let price = shared
                .config
                .prices()
                .model(model)
                .map(|(p, _)| p)
                .ok_or_else(|| {
                    Failure::new(
                        FailureClass::Prepare,
                        format!(
                            "{} for model `{model}`, so the spend cap cannot be kept: {}",
                            crate::config::NO_PRICE,
                            crate::config::prices::no_price_hint(model)
                        ),
                    )
                })?;
            ledger.counted_at(model, shared.config.price_source(model));
            *budget = Some(Arc::new(ledger.task(price, step.settings.tier)));
        }
        prepared.spec.budget.clone_from(budget);
    }
    if trace.prompt.is_none() {
        trace.prompt = Some(TaskTrace::clip(&prepared.spec.first_message, PROMPT_LIMIT));
    }
    let client = client_for(shared, step, &prepared)?;
    if let Some(traceparent) = &shared.traceparent {
        prepared.spec.tools.set_traceparent(traceparent.clone());
    }
    prepared.spec.slot = Some(Arc::clone(slot) as Arc<dyn crate::subagent::Slot>);
    for note in &prepared.notes {
        shared.events.warn(&step.id, &note.message);
    }
    let (first_len, model_len) = (
        prepared.spec.first_message.len(),
        prepared.resolved.model.len(),
    );
    let content_len = prepared.content_len;
    let doing = |what: Doing| shared.events.activity(step.index, index, what);
    let mut observer = |event: crate::subagent::SubagentEvent| match event {
        crate::subagent::SubagentEvent::Framing {
            system_len,
            tool_chars,
        } if trace.overhead_tokens.is_none() => {
            let overhead = crate::event::Overhead::count(
                system_len,
                first_len,
                model_len,
                tool_chars,
                content_len,
            );
            trace.overhead_tokens = Some(overhead.tokens);
            trace.tool_tokens = Some(overhead.tool_tokens);
        }
        crate::subagent::SubagentEvent::Warning { message } => match item {
            Some(item) if crate::mcp::is_extension_warning(&message) => {
                shared
                    .events
                    .warning(format!("step `{}`, item `{item}`: {message}", step.id));
            }
            _ => shared.events.warn(&step.id, &message),
        },
        crate::subagent::SubagentEvent::Retry { class, delay, .. } => {
            trace.retry(class, delay);
            trace.waited(shared.run_started.elapsed(), delay);
            doing(Doing::Retry { class, wait: delay });
            shared.events.emit(RunEvent::Retry {
                step: step.index,
                class,
                wait: delay,
            });
        }
        crate::subagent::SubagentEvent::Held { limit, delay } => {
            shared.events.emit(RunEvent::Held {
                step: step.index,
                limit,
                wait: delay,
            });
        }
        crate::subagent::SubagentEvent::HeldFor { waited } => {
            let now = shared.run_started.elapsed();
            trace.waited(now.saturating_sub(waited), waited);
            shared.events.emit(RunEvent::Held {
                step: step.index,
                limit: String::new(),
                wait: Duration::ZERO,
            });
        }
        crate::subagent::SubagentEvent::StartupWait { delay } => {
            trace.waited(shared.run_started.elapsed(), delay);
            shared.events.emit(RunEvent::Waiting {
                step: step.index,
                wait: delay,
            });
        }
        crate::subagent::SubagentEvent::ToolCall { name, ok, summary } => {
            trace.tool(&name, ok, &summary);
            doing(Doing::ToolEnded { ok });
        }
        crate::subagent::SubagentEvent::ToolStarted {
            name,
            span,
            extension,
        } => {
            doing(Doing::ToolStarted {
                name,
                span,
                extension,
            });
        }
        crate::subagent::SubagentEvent::Response {
            usage,
            stop_reason,
            error,
        } => doing(Doing::Response {
            usage,
            stop_reason,
            error,
        }),
        crate::subagent::SubagentEvent::Turn { turn } => {
            trace.in_flight.turns = turn;
            doing(Doing::Request {
                provider: prepared.resolved.provider_name.clone(),
                model: prepared.resolved.model.clone(),
                turn,
            });
        }
        crate::subagent::SubagentEvent::Tokens { total } => trace.in_flight.usage = total,
        _ => {}
    };
    let run = run_subagent(&client, &shared.policy, &prepared.spec, &mut observer);
    let result = match step.timeout {
        Some(limit) => tokio::time::timeout(limit, run).await.map_err(|_| {
            Failure::new(
                FailureClass::Timeout,
                format!("timed out after {}s", limit.as_secs()),
            )
        })?,
        None => run.await,
    };
    if result.service_tier.is_some() {
        trace.service_tier.clone_from(&result.service_tier);
    }
    let error = result.error(prepared.spec.max_turns);
    let text = match &result.structured {
        Some(value) => value.to_string(),
        None => result.text.clone(),
    };
    Ok(Attempt {
        ok: result.status == SubagentStatus::Completed,
        text,
        structured: result.structured,
        error,
        turns: result.turns,
        usage: result.usage,
        model: Some(prepared.resolved.model.clone()),
        extracted: result.extracted,
        corrections: result.corrections,
        warnings: result.warnings,
        left_out: prepared.result_warnings().collect(),
    })
}

/// Resolves a rendered task into a runnable subagent: source, parameters, provider, model.
pub(super) async fn prepare_task(
    shared: &Shared,
    step: &StepConfig,
    rendered: &Rendered,
) -> Result<crate::delegation::Prepared, Failure> {
    let prepare = |message| Failure::new(FailureClass::Prepare, message);
    let source = task_source(&shared.catalog, rendered).map_err(prepare)?;
    let mut prepared = prepare_with(
        &shared.env,
        &shared.config,
        source,
        &task_request(step, rendered),
        &shared.resolver,
    )
    .await
    .map_err(|e| prepare(prepare_message(e)))?;
    // The endpoint is copied only when the step's tier changes it (not for every task).
    let service_tier = step.settings.tier.service_tier();
    if prepared.resolved.endpoint.service_tier != service_tier || service_tier == Some("flex") {
        let resolved = Arc::make_mut(&mut prepared.resolved);
        resolved.endpoint = resolved
            .endpoint
            .clone()
            .at_tier(service_tier, step.settings.flex_fallback);
    }
    let cache = &mut prepared.spec.cache;
    cache.on = step.cache;
    cache.shared = step.cache_shared;
    cache.key.clone_from(&step.cache_key);
    cache.warm.clone_from(&step.warm);
    if let Some(cap) = &step.output_cap {
        prepared.spec.output_cap = Arc::clone(cap);
    }
    Ok(prepared)
}

/// The catalog entry a rendered task names, if it names one.
pub(super) fn task_source<'c>(
    catalog: &'c crate::source::Catalog,
    rendered: &Rendered,
) -> Result<Option<&'c crate::source::Source>, String> {
    match &rendered.source {
        Some(name) => catalog
            .get(name)
            .map(Some)
            .ok_or_else(|| crate::compile::run_catalog_error(catalog, name)),
        None => Ok(None),
    }
}

/// The delegation a rendered task asks for, under its step's settings.
pub(super) fn task_request(step: &StepConfig, rendered: &Rendered) -> Request {
    let mut params = ParamInput::default();
    for (key, value) in &rendered.params {
        params
            .values
            .insert(key.clone(), (value.clone(), Origin::Flag));
    }
    Request {
        instructions: rendered.instructions.clone(),
        params,
        extensions: rendered.extensions.clone(),
        provider: step.settings.provider.clone(),
        model: step.settings.model.clone(),
        temperature: step.settings.temperature,
        max_turns: step.settings.max_turns,
        max_output_tokens: step.settings.max_output_tokens,
        stop: step.settings.stop.clone(),
        allow_empty: step.allow_empty,
        context: rendered.context.clone(),
        working_dir: None,
        response_schema: rendered.schema.clone(),
        sandbox: step.sandbox(),
        context_window: step.context_window,
        tools: step.tools.clone(),
        named_tools_only: true,
        role_tools: None,
    }
}

/// A task's preparation failure as one line.
pub(super) fn prepare_message(error: crate::delegation::PrepareError) -> String {
    match error {
        crate::delegation::PrepareError::Input(diags) => diags
            .items
            .iter()
            .filter(|d| d.is_error())
            .map(|d| d.message.clone())
            .collect::<Vec<_>>()
            .join("; "),
        crate::delegation::PrepareError::Task(message) => message,
    }
}

/// The run's client for the task's provider (one per provider, service tier and run), with
/// its configured limits: under `--shard I/N` the shard's share of them, unless the config
/// says the key is the shard's own (`limits_per: shard`).
pub(super) fn client_for(
    shared: &Shared,
    step: &StepConfig,
    prepared: &crate::delegation::Prepared,
) -> Result<Client, Failure> {
    let mut clients = shared
        .clients
        .lock()
        .map_err(|_| Failure::other("internal error: client cache"))?;
    // One client per provider and service tier (a flex client waits longer).
    let tiered;
    let resolved = &prepared.resolved;
    let key = match resolved.endpoint.service_tier {
        Some(tier) => {
            tiered = format!("{}\u{0}{tier}", resolved.provider_name);
            tiered.as_str()
        }
        None => resolved.provider_name.as_str(),
    };
    if let Some(client) = clients.get(key) {
        return Ok(client.clone());
    }
    let client = Client::new(resolved.endpoint.clone())
        .map_err(|e| Failure::new(FailureClass::Provider(e.class()), e.to_string()))?;
    // The rate limits are the provider's, whatever the tier.
    let client = match clients.get(&resolved.provider_name) {
        Some(other) => client.sharing_limits_of(other),
        None => {
            let shards = match step.shard {
                Some(shard) if !resolved.provider.limits_per_shard => shard.count,
                _ => 1,
            };
            client.with_limits(resolved.limits.shared_by(shards))
        }
    };
    clients.insert(key.to_owned(), client.clone());
    Ok(client)
}

/// The template context of each task of [`run_tasks`].
pub(crate) enum TaskContext<'a> {
    /// The step's base context for every task.
    Shared,
    /// `item` and `loop` over the base (a fan-out).
    PerItem,
    /// A context built from each item (a chunk of a reduction).
    Built(&'a (dyn Fn(&Value) -> Result<minijinja::Value, String> + Send + Sync)),
}

/// Waits until the warm-up signal fires (or its task is gone).
async fn warmed(warming: &mut Option<tokio::sync::watch::Receiver<bool>>) {
    if let Some(receiver) = warming {
        let _ = receiver.wait_for(|warm| *warm).await;
    }
}

/// The tasks of one step over a list of items: what to render, with which context, under
/// which cap. Built with [`Tasks::new`], adjusted, then [`Tasks::run`].
pub(crate) struct Tasks<'a, 'e> {
    pub(super) step: &'a StepConfig,
    pub(super) task: &'a TaskTemplate,
    pub(super) base: &'a minijinja::Value,
    pub(super) env: &'a minijinja::Environment<'e>,
    pub(super) contexts: TaskContext<'a>,
    pub(super) schema: Option<Value>,
    pub(super) cap: Option<usize>,
}

impl<'a, 'e> Tasks<'a, 'e> {
    /// Every task rendered from `task` with the step's `base` context, no cap of its own.
    pub(crate) fn new(
        step: &'a StepConfig,
        task: &'a TaskTemplate,
        base: &'a minijinja::Value,
        env: &'a minijinja::Environment<'e>,
    ) -> Self {
        Self {
            step,
            task,
            base,
            env,
            contexts: TaskContext::Shared,
            schema: None,
            cap: None,
        }
    }

    /// How each task's template context is made.
    pub(crate) fn contexts(mut self, contexts: TaskContext<'a>) -> Self {
        self.contexts = contexts;
        self
    }

    /// The JSON schema every answer must follow when neither the task's own `schema:` nor its
    /// source's `response.json_schema` gives one.
    pub(crate) fn default_schema(mut self, schema: Value) -> Self {
        self.schema = Some(schema);
        self
    }

    /// At most `cap` of these tasks at a time (`None`: only the run's cap).
    pub(crate) fn cap(mut self, cap: Option<usize>) -> Self {
        self.cap = cap;
        self
    }

    /// Renders and spawns the tasks over `items` and hands each finished task to `on_done`
    /// (in completion order), which answers whether to go on and the task's journal row.
    pub(crate) async fn run(
        self,
        shared: &Arc<Shared>,
        items: &mut (dyn Iterator<Item = Result<Value, String>> + Send),
        on_done: &mut (dyn FnMut(TaskDone) -> (bool, Option<u64>) + Send),
    ) -> Result<(), StepError> {
        run_tasks(shared, self, items, on_done).await
    }

    /// [`Self::run`] through the provider's batch API (`backend: batch`): every item's task
    /// is rendered first, sent in batches, and the tasks that need tools run live.
    pub(crate) async fn run_batch(
        self,
        shared: &Arc<Shared>,
        items: &mut (dyn Iterator<Item = Result<Value, String>> + Send),
        on_done: &mut (dyn FnMut(TaskDone) -> (bool, Option<u64>) + Send),
    ) -> Result<(), StepError> {
        super::batch::run_batch_tasks(shared, self, items, on_done).await
    }
}

/// What [`run_tasks`] does with one item.
enum ItemTask {
    /// Another shard's task: that shard runs it.
    NotOurs,
    /// Answered already, by an earlier attempt of this run or by an earlier run (`--reuse`).
    Answered(Box<TaskDone>),
    /// To send: the rendered task and its request hash.
    Send(Box<Rendered>, String),
}

impl Tasks<'_, '_> {
    /// Renders the task of item `index` and decides what to do with it.
    fn item_task(
        &self,
        shared: &Shared,
        compiled: &Compiled<'_>,
        index: u64,
        item: &Value,
    ) -> Result<ItemTask, StepError> {
        let ctx = match &self.contexts {
            TaskContext::Shared => self.base.clone(),
            TaskContext::PerItem => item_context(self.base, item, index),
            TaskContext::Built(build) => build(item).map_err(StepError::Render)?,
        };
        let mut rendered = compiled.render(self.task, &ctx).map_err(|e| {
            StepError::Render(match self.contexts {
                TaskContext::PerItem => format!("item {index}: {e}"),
                _ => e,
            })
        })?;
        if self.schema.is_some() && !expects_data(&shared.catalog, &rendered) {
            rendered.schema.clone_from(&self.schema);
        }
        if let Some(name) = &rendered.source
            && shared.catalog.get(name).is_none()
        {
            return Err(StepError::Source(crate::compile::run_catalog_error(
                &shared.catalog,
                name,
            )));
        }
        let hash = self.step.hash(&rendered);
        if !self.step.owns(&hash) {
            return Ok(ItemTask::NotOurs);
        }
        let data = expects_data(&shared.catalog, &rendered);
        Ok(match resumed(shared, self.step, index, item, &hash, data) {
            Some(mut done) => {
                done.role = role_of(&shared.catalog, &rendered);
                ItemTask::Answered(Box::new(done))
            }
            None => ItemTask::Send(Box::new(rendered), hash),
        })
    }
}

/// [`Tasks::run`].
async fn run_tasks(
    shared: &Arc<Shared>,
    tasks: Tasks<'_, '_>,
    items: &mut (dyn Iterator<Item = Result<Value, String>> + Send),
    on_done: &mut (dyn FnMut(TaskDone) -> (bool, Option<u64>) + Send),
) -> Result<(), StepError> {
    let step = tasks.step;
    // The compiled templates borrow `env` and `task`; render synchronously here.
    let compiled = Compiled::new(tasks.env, tasks.task).map_err(StepError::Render)?;
    let mut items = items.peekable();
    // The warm-up: while the first task's prefix is not yet in the provider's cache, no other
    // task starts (they would all miss and all write it); nor while a fan-out without an
    // explicit output limit waits for its first answer to learn one from.
    let learns = step.fan_out
        && step
            .settings
            .max_output_tokens
            .or(shared.config.max_output_tokens)
            .is_none();
    let cap = Arc::new(if learns {
        crate::subagent::output_cap::OutputCap::learning()
    } else {
        crate::subagent::output_cap::OutputCap::solo()
    });
    let mut step_owned = step.clone();
    step_owned.output_cap = Some(Arc::clone(&cap));
    let step = &step_owned;
    let result = run_task_set(shared, step, learns, &tasks, compiled, &mut items, on_done).await;
    if let Some(summary) = cap.summary() {
        shared.events.emit(RunEvent::OutputLimit {
            step: step.index,
            summary,
        });
    }
    result
}

/// [`run_tasks`] once the step's output limit is set up.
async fn run_task_set(
    shared: &Arc<Shared>,
    step: &StepConfig,
    learns: bool,
    tasks: &Tasks<'_, '_>,
    compiled: Compiled<'_>,
    items: &mut std::iter::Peekable<&mut (dyn Iterator<Item = Result<Value, String>> + Send)>,
    on_done: &mut (dyn FnMut(TaskDone) -> (bool, Option<u64>) + Send),
) -> Result<(), StepError> {
    let mut warm_up = (step.cache && step.cache_shared) || learns;
    let mut warming: Option<tokio::sync::watch::Receiver<bool>> = None;
    let gated = |warming: &Option<tokio::sync::watch::Receiver<bool>>| {
        warming.as_ref().is_some_and(|w| !*w.borrow())
    };
    let step_cap = tasks.cap.map(|c| Arc::new(Semaphore::new(c.max(1))));
    // A task's future and its result are boxed: the set's own cells, moved on every spawn and
    // join, stay a few words.
    let mut running: JoinSet<(Box<TaskDone>, Option<Permits>)> = JoinSet::new();
    let mut pending: std::collections::VecDeque<(u64, Option<Permits>)> =
        std::collections::VecDeque::new();
    let mut commits = shared.committed.clone();
    // Slots taken while waiting, used by the next launch.
    let mut ready: Option<Permits> = None;
    let mut index: u64 = 0;
    let mut exhausted = false;
    let mut stop = false;
    loop {
        // Launch while there is room and work.
        while !exhausted && !stop && !shared.drain.is_cancelled() && !gated(&warming) {
            let (global, local) = match ready.take() {
                Some(permits) => permits,
                None => {
                    let Ok(global) = shared.global.clone().try_acquire_owned() else {
                        break;
                    };
                    let local = match &step_cap {
                        Some(sem) => match sem.clone().try_acquire_owned() {
                            Ok(permit) => Some(permit),
                            Err(_) => break,
                        },
                        None => None,
                    };
                    (global, local)
                }
            };
            let Some(next) = items.next() else {
                exhausted = true;
                break;
            };
            let item = next.map_err(StepError::Items)?;
            let this = index;
            index += 1;
            let (rendered, hash) = match tasks.item_task(shared, &compiled, this, &item)? {
                ItemTask::NotOurs => continue,
                ItemTask::Answered(done) => {
                    // The step learns its output limit from the answers of an earlier
                    // attempt too, as it did from them then.
                    if let Some(cap) = &step.output_cap {
                        if learns && done.ok {
                            cap.answered(done.usage.output_tokens);
                        }
                        if let Some(summary) = &done.trace.cap {
                            cap.seed(summary);
                        }
                    }
                    stop |= !on_done(*done).0;
                    continue;
                }
                ItemTask::Send(rendered, hash) => (*rendered, hash),
            };
            shared.events.emit(RunEvent::TasksStarted {
                step: step.index,
                count: 1,
            });
            let shared = Arc::clone(shared);
            let mut step = step.clone();
            if warm_up {
                warm_up = false;
                if items.peek().is_some() {
                    let (signal, receiver) = crate::subagent::WarmSignal::new();
                    step.warm = Some(signal);
                    warming = Some(receiver);
                } else {
                    // A fan-out of one task shares its prefix with nothing.
                    step.cache_shared = this > 0;
                }
            }
            let slot = TaskSlot::new(&shared, step.index, step_cap.as_ref(), (global, local));
            running.spawn(async move {
                let done = Box::pin(run_task(
                    shared,
                    step,
                    this,
                    item,
                    rendered,
                    hash,
                    Arc::clone(&slot),
                ))
                .await;
                (Box::new(done), slot.into_permits().await)
            });
        }
        let committed = *commits.borrow_and_update();
        let mut released = false;
        while pending.front().is_some_and(|(seq, _)| *seq < committed) {
            pending.pop_front();
            released = true;
        }
        if released && !exhausted && !stop {
            continue;
        }
        if running.is_empty() {
            if exhausted || stop || shared.drain.is_cancelled() {
                return Ok(());
            }
            if !pending.is_empty() {
                // Slots come back when the journal commits the results holding them.
                let _ = commits.changed().await;
                continue;
            }
            // Nothing running and no permit: wait for one to free up elsewhere.
            let permit = shared
                .global
                .clone()
                .acquire_owned()
                .await
                .map_err(|e| e.to_string())?;
            drop(permit);
            continue;
        }
        // Wait for a task to finish, a commit to free held slots, or a slot given back by a
        // task that waits out a rate limit.
        let is_gated = gated(&warming);
        let can_launch = !exhausted && !stop && !shared.drain.is_cancelled() && !is_gated;
        let joined = tokio::select! {
            joined = running.join_next() => joined,
            _ = warmed(&mut warming), if is_gated => continue,
            _ = commits.changed(), if !pending.is_empty() => continue,
            permits = acquire_slot(&shared.global, step_cap.as_ref()), if can_launch => {
                ready = permits;
                continue;
            }
        };
        match joined {
            Some(Ok((mut done, permits))) => {
                // What the step's requests were sent with so far, journaled with the task: a
                // resumed run starts its step's output limits from there.
                done.trace.cap = step.output_cap.as_ref().and_then(|cap| cap.summary());
                if done.not_started() {
                    // Refused by the spend cap, or not sent to a stopped provider, before its
                    // first request: not recorded, so that `--resume` runs it.
                    drop(permits);
                    shared.check_budget();
                    shared.check_providers();
                    continue;
                }
                let (go_on, seq) = on_done(*done);
                shared.check_budget();
                shared.check_providers();
                stop |= !go_on;
                match seq {
                    Some(seq) => pending.push_back((seq, permits)),
                    None => drop(permits),
                }
            }
            Some(Err(e)) => return Err(StepError::Failed(format!("a task crashed: {e}"))),
            None => {}
        }
    }
}
