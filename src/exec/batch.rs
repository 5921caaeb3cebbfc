//! `backend: batch` (or `summon run --batch`): a fan_out step whose single-turn tasks go
//! through the provider's batch API instead of one live request each.
//!
//! ```text
//! render every item --journal has it--> on_done (resumed)
//!        |--needs tools--> live, as any step (warning naming the step)
//!        |--in a batch recorded by an earlier attempt--> re-attach (no new batch)
//!        '--> submit (one batch per provider) --record--> run_batches
//!                 poll (backing off) --ended--> results by custom_id
//!                     |--succeeded--> on_done (journal, results.jsonl, report at batch price)
//!                     '--failed, expired--> resubmitted in the next batch, a bounded number
//!                                           of times, then failed like a live task
//! ```
//!
//! A task is eligible when one request answers it: no tools (its recipe has no extensions,
//! `developer` included; its agent lists no tools), no goose `retry` checks. A recipe's
//! `response.json_schema` stays in the batch: the answer is validated here, and an invalid one
//! goes back in the next batch with the same correction message a live run sends, at most
//! as many times as live. Batch tasks take no concurrency slot: the provider queues them.
//!
//! The batch is recorded in the store before it is first polled, and marked ended only after
//! its results are committed to the journal, so `--resume` polls a batch still in flight
//! instead of paying for its tasks twice. Polling starts every `SUMMON_BATCH_POLL_MS`
//! (default 10 s), grows by half after each unchanged poll up to 30 times that (at most
//! 10 min), and starts over when a batch ends.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::context::item_context;
use super::step::{
    Compiled, Rendered, Shared, StepConfig, TaskSlot, Tasks, acquire_slot, client_for,
    prepare_task, resumed, run_task,
};
use super::step_error::StepError;
use crate::delegation::Prepared;
use crate::event::{Failure, FailureClass, PROMPT_LIMIT, RunEvent, TaskDone, TaskTrace};
use crate::provider::{
    BatchCounts, BatchLine, BatchState, BatchStatus, ChatRequest, Client, LineResult, Message,
    ProviderError, Usage, retry_transient,
};
use crate::source::SourceDef;
use crate::store::{BatchRecord, BatchTask, Store};

/// The first pause between two polls, when `SUMMON_BATCH_POLL_MS` is not set.
const DEFAULT_POLL: Duration = Duration::from_secs(10);
/// The longest pause between two polls.
const MAX_POLL: Duration = Duration::from_secs(600);
/// How many times a task whose line expired or failed transiently is sent again, at least
/// (a step's `retries` raises it).
const DEFAULT_RESUBMITS: u32 = 2;

/// A task waiting for an answer from a batch.
struct Pending {
    index: u64,
    item: Value,
    hash: String,
    rendered: Rendered,
    custom_id: String,
    request: ChatRequest,
    model: String,
    provider: String,
    schema: Option<Value>,
    schema_asks: u32,
    /// What was wrong with each answer that did not validate.
    schema_errors: Vec<String>,
    schema_retries: u32,
    /// The valid answer was taken from a fenced block or the text around it.
    extracted: bool,
    /// The output limit the request runs under, named when an answer is cut off there.
    output_limit: Option<u32>,
    allow_empty: bool,
    resubmits: u32,
    turns: u32,
    usage: Usage,
    /// The rendered first message, for the outputs.
    prompt: String,
    /// What its request carries beyond its own text (no tools: a batch line has none).
    overhead: crate::event::Overhead,
    /// Held against the spend cap since it was sent (USD), and its batch price.
    held: f64,
    price: Option<crate::config::file::Price>,
}

/// A batch being polled.
struct InFlight {
    id: String,
    provider: String,
    tasks: Vec<Pending>,
    /// The last status and counts shown.
    shown: Option<(String, BatchCounts)>,
}

/// A task that runs live instead.
type LiveTask = (u64, Value, Rendered, String);

/// The pauses between polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PollDelay {
    base: Duration,
    cap: Duration,
}

impl PollDelay {
    fn from_env(env: &crate::env::Env) -> Self {
        let base = env
            .millis("SUMMON_BATCH_POLL_MS")
            .ok()
            .flatten()
            .unwrap_or(DEFAULT_POLL)
            .max(Duration::from_millis(1));
        Self {
            base,
            cap: base.saturating_mul(30).min(MAX_POLL).max(base),
        }
    }

    fn next(self, delay: Duration) -> Duration {
        (delay + delay / 2).min(self.cap)
    }
}

/// [`Tasks::run_batch`]: a fan_out step's tasks (each with its item's context) through the
/// batch API, the tasks that need tools live.
pub(super) async fn run_batch_tasks(
    shared: &Arc<Shared>,
    tasks: Tasks<'_, '_>,
    items: &mut (dyn Iterator<Item = Result<Value, String>> + Send),
    on_done: &mut (dyn FnMut(TaskDone) -> (bool, Option<u64>) + Send),
) -> Result<(), StepError> {
    let Tasks {
        step,
        task,
        base,
        env,
        cap,
        ..
    } = tasks;
    let started = Instant::now();
    let store = Store::open_for(&shared.env).map_err(|e| StepError::Store(e.to_string()))?;
    let mut run = BatchRun {
        store: std::sync::Mutex::new(store),
        shared,
        step,
        on_done,
        started,
        stop: false,
        last_seq: None,
        clients: HashMap::new(),
        redactors: HashMap::new(),
        live: Vec::new(),
        live_reason: None,
        need_tools: 0,
        waiting: Vec::new(),
        in_flight: Vec::new(),
    };

    // Render every item; what the journal has is done already.
    let fresh = {
        let compiled = Compiled::new(env, task).map_err(StepError::Render)?;
        let mut fresh = Vec::new();
        for (index, next) in (0_u64..).zip(items) {
            let item = next.map_err(StepError::Items)?;
            let ctx = item_context(base, &item, index);
            let rendered = compiled
                .render(task, &ctx)
                .map_err(|e| StepError::Render(format!("item {index}: {e}")))?;
            if let Some(name) = &rendered.source
                && shared.catalog.get(name).is_none()
            {
                return Err(StepError::Source(crate::compile::run_catalog_error(
                    &shared.catalog,
                    name,
                )));
            }
            let hash = step.hash(&rendered);
            // Another shard's task: that shard runs it.
            if !step.owns(&hash) {
                continue;
            }
            let data = super::step::expects_data(&shared.catalog, &rendered);
            match resumed(shared, step, index, &item, &hash, data) {
                Some(done) => {
                    if !(run.on_done)(done).0 {
                        return Ok(());
                    }
                }
                None => fresh.push((index, item, rendered, hash)),
            }
        }
        fresh
    };
    if fresh.is_empty() || shared.drain.is_cancelled() {
        return Ok(());
    }

    for (index, item, rendered, hash) in fresh {
        run.prepare(index, item, rendered, hash).await;
        if run.stop {
            return Ok(());
        }
    }
    run.reattach();
    run.submit().await;
    if !run.live.is_empty() {
        let live = std::mem::take(&mut run.live);
        let tools = std::mem::take(&mut run.need_tools);
        if tools > 0 {
            let (needs, runs) = if tools == 1 {
                ("needs", "runs")
            } else {
                ("need", "run")
            };
            shared.events.warning(format!(
                "step `{}`: {} {needs} tools ({}) and {runs} live, not through the batch API",
                step.id,
                crate::plural::count(tools, "task"),
                run.live_reason.take().unwrap_or_default()
            ));
        }
        run.run_live(live, cap).await?;
    }
    run.poll().await;
    run.wait_for_journal().await;
    Ok(())
}

/// Why a prepared task cannot be answered by one request, if it cannot.
fn needs_tools(shared: &Shared, rendered: &Rendered, prepared: &Prepared) -> Option<String> {
    let spec = &prepared.spec;
    let checks = spec.retry.as_ref().is_some_and(|r| !r.checks.is_empty());
    // Left with no tool (the step's `tools: []`, `max_turns: 1`): one request answers it.
    if spec.tools.names().is_empty() && spec.extensions.is_empty() && !checks {
        return None;
    }
    if rendered.extensions.as_ref().is_some_and(|e| !e.is_empty()) {
        return Some("the step lists extensions".to_owned());
    }
    let source = rendered
        .source
        .as_deref()
        .and_then(|name| shared.catalog.get(name));
    match source.map(|s| (&s.name, &s.def)) {
        Some((name, SourceDef::Agent(agent)))
            if agent.tools.as_ref().is_some_and(|t| !t.is_empty()) =>
        {
            return Some(format!("agent `{name}` lists tools"));
        }
        Some((name, SourceDef::Recipe(recipe) | SourceDef::Subrecipe { recipe, .. }))
            if rendered.extensions.is_none() && !recipe.extensions.is_empty() =>
        {
            return Some(format!("recipe `{name}` has extensions"));
        }
        _ => {}
    }
    if spec.tools.contains("shell") {
        return Some("the developer extension is enabled".to_owned());
    }
    if checks {
        return Some("its recipe has retry checks, which need another run".to_owned());
    }
    None
}

/// The one request that answers a task: no tools, and nothing about them in the system prompt.
fn batch_request(prepared: &Prepared) -> ChatRequest {
    let spec = &prepared.spec;
    let names = spec.tools.names();
    let system = if names.is_empty() {
        spec.system.clone()
    } else {
        let section = crate::subagent::tools_section(spec.workdir.path(), &names);
        spec.system.replacen(&section, "", 1)
    };
    let mut request = ChatRequest {
        model: spec.model.clone(),
        system,
        messages: vec![Message::user(spec.first_message.clone())],
        tools: Vec::new().into(),
        temperature: spec.temperature,
        max_tokens: spec.max_output_tokens,
        stop: spec.stop.clone(),
        // No tools: the answer can be forced on every request.
        response_format: spec
            .response_schema
            .as_ref()
            .and_then(|s| crate::provider::ResponseFormat::for_schema(s, true)),
        // One request per task: only the prefix the batch's requests share can be read.
        cache: spec.cache.hint(true, false),
    };
    if request.max_tokens.is_none() {
        // summon's default output limit, fitted to what the window leaves.
        let prompt = spec
            .context_window
            .map_or(0, |_| crate::provider::estimate_tokens(&request));
        request.max_tokens = Some(
            prepared
                .resolved
                .endpoint
                .kind
                .default_output_limit(spec.context_window, prompt),
        );
    }
    request
}

/// Whether a failed create request means the provider has no batch API at all.
fn no_batch_api(err: &ProviderError) -> bool {
    matches!(
        err,
        ProviderError::BadRequest {
            status: 404 | 405 | 501,
            ..
        } | ProviderError::Other {
            status: Some(404 | 405 | 501),
            ..
        } | ProviderError::Overloaded { status: 501, .. }
    )
}

/// The state of one batch step.
struct BatchRun<'a> {
    /// Where batches are recorded (locked only for one statement, never across an await).
    store: std::sync::Mutex<Store>,
    shared: &'a Arc<Shared>,
    step: &'a StepConfig,
    on_done: &'a mut (dyn FnMut(TaskDone) -> (bool, Option<u64>) + Send),
    started: Instant,
    /// `on_done` asked to stop (fail_fast).
    stop: bool,
    /// The journal row number of the last result handed to `on_done`.
    last_seq: Option<u64>,
    clients: HashMap<String, Client>,
    /// The secrets each provider's answers are cleaned of: its key and the configured ones.
    redactors: HashMap<String, crate::subagent::Redactor>,
    live: Vec<LiveTask>,
    live_reason: Option<String>,
    /// Of `live`, the tasks that need tools (the rest go live because the provider has no
    /// batch API, which is said on its own).
    need_tools: u64,
    /// Tasks to send in the next batch.
    waiting: Vec<Pending>,
    in_flight: Vec<InFlight>,
}

impl BatchRun<'_> {
    fn with_store<T>(
        &self,
        f: impl FnOnce(&Store) -> Result<T, crate::store::StoreError>,
    ) -> Result<T, String> {
        let store = self
            .store
            .lock()
            .map_err(|_| "internal error: store lock".to_owned())?;
        f(&store).map_err(|e| e.to_string())
    }

    fn done(&mut self, done: TaskDone) {
        let (go_on, seq) = (self.on_done)(done);
        self.stop |= !go_on;
        if seq.is_some() {
            self.last_seq = seq;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        task: Pending,
        ok: bool,
        output: String,
        structured: Option<Value>,
        mut error: Option<Failure>,
        batch_id: Option<String>,
    ) {
        if let Some(ledger) = &self.shared.budget {
            let cost = task.price.map_or(0.0, |p| p.cost(&task.usage));
            ledger.settle(task.held, cost);
        }
        // A model's answer that repeats a configured key is cleaned as a live task's is.
        let (mut output, mut structured) = (output, structured);
        if let Some(redactor) = self.redactors.get(&task.provider) {
            redactor.answer(&mut output, structured.as_mut());
            if let Some(failure) = &mut error {
                redactor.answer(&mut failure.message, None);
            }
        }
        // A task of an agent's is labelled with its role, as a live one is.
        let role = super::step::role_of(&self.shared.catalog, &task.rendered);
        let done = TaskDone {
            step: self.step.index,
            index: task.index,
            item: task.item,
            ok,
            output,
            structured,
            extracted: task.extracted,
            corrections: task.schema_asks,
            error,
            turns: task.turns,
            usage: task.usage,
            duration: self.started.elapsed(),
            model: Some(task.model),
            resumed: false,
            reused: false,
            hash: task.hash,
            batch_id,
            trace: TaskTrace {
                prompt: Some(task.prompt),
                overhead_tokens: Some(task.overhead.tokens),
                tool_tokens: Some(task.overhead.tool_tokens),
                ..self.trace()
            },
            warnings: Vec::new(),
            role,
        };
        self.done(done);
    }

    fn fail_unprepared(&mut self, index: u64, item: Value, hash: String, error: Failure) {
        self.done(TaskDone {
            step: self.step.index,
            index,
            item,
            ok: false,
            output: String::new(),
            structured: None,
            extracted: false,
            corrections: 0,
            error: Some(error),
            turns: 0,
            usage: Usage::default(),
            duration: self.started.elapsed(),
            model: None,
            resumed: false,
            reused: false,
            hash,
            batch_id: None,
            trace: self.trace(),
            warnings: Vec::new(),
            role: None,
        });
    }

    /// A batch task's trace: it started with the step's batch and ran once.
    fn trace(&self) -> TaskTrace {
        TaskTrace {
            started_ms: Some(
                u64::try_from(
                    self.started
                        .saturating_duration_since(self.shared.run_started)
                        .as_millis(),
                )
                .unwrap_or(u64::MAX),
            ),
            attempts: 1,
            ..TaskTrace::default()
        }
    }

    /// Resolves one task and queues it for a batch, or for a live run when it needs tools.
    async fn prepare(&mut self, index: u64, item: Value, rendered: Rendered, hash: String) {
        let prepared = match prepare_task(self.shared, self.step, &rendered).await {
            Ok(prepared) => prepared,
            Err(error) => return self.fail_unprepared(index, item, hash, error),
        };
        if let Some(reason) = needs_tools(self.shared, &rendered, &prepared) {
            self.live_reason.get_or_insert(reason);
            self.need_tools += 1;
            self.live.push((index, item, rendered, hash));
            return;
        }
        let provider = prepared.resolved.provider_name.clone();
        if !self.clients.contains_key(&provider) {
            match client_for(self.shared, self.step, &prepared) {
                Ok(client) => {
                    let keys = client.endpoint().api_key.iter();
                    let redactor = crate::subagent::Redactor::new(
                        &[],
                        keys.chain(prepared.spec.tools.command_env().keys()),
                    );
                    self.redactors.insert(provider.clone(), redactor);
                    self.clients.insert(provider.clone(), client);
                }
                Err(error) => return self.fail_unprepared(index, item, hash, error),
            }
        }
        let request = batch_request(&prepared);
        let sent_limit = request.max_tokens;
        let overhead = crate::event::Overhead::count(
            request.system.len(),
            prepared.spec.first_message.len(),
            request.model.len(),
            crate::provider::tool_chars(&request.tools),
            prepared.content_len,
        );
        self.waiting.push(Pending {
            index,
            item,
            hash,
            custom_id: format!("task-{index}"),
            prompt: TaskTrace::clip(&prepared.spec.first_message, PROMPT_LIMIT),
            request,
            overhead,
            model: prepared.resolved.model.clone(),
            provider,
            schema: prepared.spec.response_schema.clone(),
            schema_asks: 0,
            schema_errors: Vec::new(),
            schema_retries: prepared.spec.schema_retries,
            extracted: false,
            output_limit: sent_limit,
            allow_empty: prepared.spec.allow_empty,
            resubmits: 0,
            turns: 0,
            usage: Usage::default(),
            held: 0.0,
            price: self
                .shared
                .config
                .prices()
                .at(&prepared.resolved.model, crate::config::Tier::Batch),
            rendered,
        });
    }

    /// Takes the tasks that an earlier attempt of the run already sent, and are still wanted
    /// unchanged, back from the batches it recorded.
    fn reattach(&mut self) {
        let records =
            match self.with_store(|s| s.submitted_batches(&self.shared.run_id, &self.step.id)) {
                Ok(records) => records,
                Err(e) => {
                    self.shared.events.warning(format!(
                        "step `{}`: cannot read the run's batches: {e}",
                        self.step.id
                    ));
                    return;
                }
            };
        for record in records {
            let mut tasks = Vec::new();
            for recorded in &record.tasks {
                let found = self.waiting.iter().position(|p| {
                    p.index == recorded.index
                        && p.hash == recorded.hash
                        && p.provider == record.provider
                });
                if let Some(position) = found {
                    let mut task = self.waiting.swap_remove(position);
                    task.custom_id.clone_from(&recorded.custom_id);
                    tasks.push(task);
                }
            }
            if tasks.is_empty() || !self.clients.contains_key(&record.provider) {
                // Nothing in it is wanted any more (answered, or the task changed).
                let _ = self.with_store(|s| s.end_batch(&self.shared.run_id, &record.batch_id));
                self.waiting.extend(tasks);
                continue;
            }
            self.shared.events.progress(format!(
                "{}: polling batch {} again ({})",
                self.step.id,
                record.batch_id,
                crate::plural::count(tasks.len() as u64, "task")
            ));
            self.shared.events.emit(RunEvent::TasksStarted {
                step: self.step.index,
                count: tasks.len(),
            });
            self.in_flight.push(InFlight {
                id: record.batch_id,
                provider: record.provider,
                tasks,
                shown: None,
            });
        }
        self.waiting.sort_by_key(|p| p.index);
    }

    /// Sends the waiting tasks, one batch per provider (split at the provider's size limit).
    async fn submit(&mut self) {
        if self.stop || self.waiting.is_empty() || self.shared.drain.is_cancelled() {
            return;
        }
        let mut by_provider: Vec<(String, Vec<Pending>)> = Vec::new();
        for task in std::mem::take(&mut self.waiting) {
            match by_provider.iter_mut().find(|(p, _)| *p == task.provider) {
                Some((_, tasks)) => tasks.push(task),
                None => by_provider.push((task.provider.clone(), vec![task])),
            }
        }
        for (provider, mut tasks) in by_provider {
            let Some(client) = self.clients.get(&provider).cloned() else {
                continue;
            };
            while !tasks.is_empty() {
                let rest = tasks.split_off(tasks.len().min(client.max_batch_lines()));
                let chunk = std::mem::replace(&mut tasks, rest);
                self.submit_one(&client, &provider, chunk).await;
            }
        }
    }

    async fn submit_one(&mut self, client: &Client, provider: &str, mut tasks: Vec<Pending>) {
        if let Some(ledger) = &self.shared.budget {
            // The batch's estimate: each line's input and its output limit, at batch prices.
            let estimates: Vec<f64> = tasks
                .iter()
                .map(|t| {
                    let output = t
                        .output_limit
                        .unwrap_or(client.endpoint().kind.default_output_limit(None, 0));
                    t.price.map_or(f64::INFINITY, |p| {
                        (crate::provider::estimate_tokens(&t.request) as f64 * p.input
                            + f64::from(output) * p.output)
                            / 1e6
                    })
                })
                .collect();
            let new: f64 = tasks
                .iter()
                .zip(&estimates)
                .filter(|(t, _)| t.held == 0.0)
                .map(|(_, e)| e)
                .sum();
            if !ledger.hold(new) {
                // Not sent: nothing is recorded, so `--resume` sends them.
                self.shared.events.warning(format!(
                    "step `{}`: a batch of {} estimated at up to {} would cross the spend cap; \
                     not sent",
                    self.step.id,
                    crate::plural::count(tasks.len() as u64, "task"),
                    crate::subagent::budget::usd(new)
                ));
                for task in tasks.iter().filter(|t| t.held > 0.0) {
                    ledger.settle(task.held, 0.0);
                }
                self.stop = true;
                self.shared.check_budget();
                return;
            }
            for (task, estimate) in tasks.iter_mut().zip(estimates) {
                if task.held == 0.0 {
                    task.held = estimate;
                }
            }
        }
        let lines: Vec<BatchLine> = tasks
            .iter()
            .map(|t| BatchLine {
                custom_id: t.custom_id.clone(),
                request: t.request.clone(),
            })
            .collect();
        // The input is uploaded once; only the create is retried, with the same file.
        let uploaded = {
            let mut hook = self.retry_hook("upload the batch input");
            retry_transient(&self.shared.policy, &mut hook, || {
                client.upload_batch_input(&lines)
            })
            .await
        };
        let created = match uploaded {
            Ok(input) => {
                let created = {
                    let mut hook = self.retry_hook("create the batch");
                    retry_transient(&self.shared.policy, &mut hook, || {
                        client.create_batch(&lines, input.as_deref())
                    })
                    .await
                };
                if created.is_err()
                    && let Some(file_id) = &input
                    && let Err(err) = client.delete_batch_input(file_id).await
                {
                    self.shared.events.warning(format!(
                        "step `{}`: cannot delete the unused batch input file {file_id}: {err}",
                        self.step.id
                    ));
                }
                created
            }
            Err(err) => Err(err),
        };
        let id = match created {
            Ok(id) => id,
            Err(err) if no_batch_api(&err) => {
                self.shared.events.warning(format!(
                    "step `{}`: provider `{provider}` has no batch API ({err}); {} run live",
                    self.step.id,
                    crate::plural::count(tasks.len() as u64, "task")
                ));
                self.live.extend(
                    tasks
                        .into_iter()
                        .map(|t| (t.index, t.item, t.rendered, t.hash)),
                );
                return;
            }
            Err(err) => {
                let error = Failure::new(
                    FailureClass::Provider(err.class()),
                    format!("cannot create a batch: {err}"),
                );
                for task in tasks {
                    self.finish(task, false, String::new(), None, Some(error.clone()), None);
                }
                return;
            }
        };
        let record = BatchRecord {
            batch_id: id.clone(),
            step_id: self.step.id.clone(),
            provider: provider.to_owned(),
            tasks: tasks
                .iter()
                .map(|t| BatchTask {
                    index: t.index,
                    hash: t.hash.clone(),
                    custom_id: t.custom_id.clone(),
                })
                .collect(),
        };
        if let Err(e) = self.with_store(|s| s.record_batch(&self.shared.run_id, &record)) {
            self.shared.events.warning(format!(
                "step `{}`: cannot record batch {id}; `--resume` will not find it: {e}",
                self.step.id
            ));
        }
        self.shared.events.progress(format!(
            "{}: sent {} in batch {id}",
            self.step.id,
            crate::plural::count(tasks.len() as u64, "task")
        ));
        self.shared.events.emit(RunEvent::TasksStarted {
            step: self.step.index,
            count: tasks.len(),
        });
        self.in_flight.push(InFlight {
            id,
            provider: provider.to_owned(),
            tasks,
            shown: None,
        });
    }

    /// A retry of a batch call (`what`): a progress line, and counted by class in the run's
    /// `retries_by_class` like a live task's.
    fn retry_hook(
        &self,
        what: &'static str,
    ) -> impl FnMut(&ProviderError, u32, Duration) + use<'_> {
        let (events, step) = (&self.shared.events, self.step);
        move |err: &ProviderError, attempt: u32, delay: Duration| {
            events.emit(RunEvent::Retry {
                step: step.index,
                class: err.retry_class().unwrap_or("other"),
                wait: delay,
            });
            let step = &step.id;
            events.progress(format!(
                "{step}: {what}: retry {attempt} in {:.1}s: {}",
                delay.as_secs_f64(),
                err.headline()
            ));
        }
    }

    /// Runs the tasks that need tools, live, under the run's and the step's caps.
    async fn run_live(
        &mut self,
        tasks: Vec<LiveTask>,
        cap: Option<usize>,
    ) -> Result<(), StepError> {
        let step_cap = cap.map(|c| Arc::new(Semaphore::new(c.max(1))));
        let mut running = JoinSet::new();
        for (index, item, rendered, hash) in tasks {
            let shared = Arc::clone(self.shared);
            let step = self.step.clone();
            let local = step_cap.clone();
            running.spawn(async move {
                let permits = acquire_slot(&shared.global, local.as_ref()).await?;
                if shared.drain.is_cancelled() {
                    return None;
                }
                let slot = TaskSlot::new(&shared, step.index, local.as_ref(), permits);
                let done =
                    run_task(shared, step, index, item, rendered, hash, Arc::clone(&slot)).await;
                drop(slot.into_permits().await);
                Some(done)
            });
        }
        while let Some(joined) = running.join_next().await {
            match joined {
                Ok(Some(done)) if done.not_started() => {
                    self.shared.check_budget();
                    self.shared.check_providers();
                }
                Ok(Some(done)) => {
                    self.done(done);
                    self.shared.check_budget();
                    if self.stop {
                        running.abort_all();
                    }
                }
                Ok(None) => {}
                Err(e) if e.is_cancelled() => {}
                Err(e) => return Err(StepError::Failed(format!("a task crashed: {e}"))),
            }
        }
        Ok(())
    }

    /// Polls the batches in flight until every task is answered, failed, or the run stops.
    async fn poll(&mut self) {
        let delays = PollDelay::from_env(&self.shared.env);
        let mut delay = delays.base;
        while !self.in_flight.is_empty() && !self.stop {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = self.shared.drain.cancelled() => return,
            }
            delay = delays.next(delay);
            let mut i = 0;
            while i < self.in_flight.len() && !self.stop {
                let Some(status) = self.status(i).await else {
                    i += 1;
                    continue;
                };
                if !status.is_finished() {
                    i += 1;
                    continue;
                }
                let batch = self.in_flight.remove(i);
                self.collect(batch, &status).await;
                delay = delays.base;
            }
            if !self.waiting.is_empty() {
                self.shared.events.progress(format!(
                    "{}: sending {} again",
                    self.step.id,
                    crate::plural::count(self.waiting.len() as u64, "task")
                ));
                self.submit().await;
                if !self.live.is_empty() {
                    let live = std::mem::take(&mut self.live);
                    if self.run_live(live, None).await.is_err() {
                        self.stop = true;
                    }
                }
            }
        }
    }

    /// Polls batch `i` once; shows its counts when they changed. `None` when polling failed
    /// (a lasting failure fails the batch's tasks).
    async fn status(&mut self, i: usize) -> Option<BatchStatus> {
        let batch = &self.in_flight[i];
        let client = self.clients.get(&batch.provider)?.clone();
        let id = batch.id.clone();
        let polled = {
            let mut hook = self.retry_hook("poll the batch");
            retry_transient(&self.shared.policy, &mut hook, || client.batch_status(&id)).await
        };
        let status = match polled {
            Ok(status) => status,
            Err(err) if err.is_transient() => {
                self.shared.events.warning(format!(
                    "step `{}`: cannot poll batch {id} (will try again): {err}",
                    self.step.id
                ));
                return None;
            }
            Err(err) => BatchStatus {
                id,
                state: BatchState::Failed(format!("cannot poll the batch: {err}")),
                status_text: "unreachable".to_owned(),
                counts: BatchCounts::default(),
                results: Vec::new(),
            },
        };
        let shown = (status.status_text.clone(), status.counts);
        let batch = &mut self.in_flight[i];
        if batch.shown.as_ref() != Some(&shown) {
            let c = status.counts;
            let total = if c.total > 0 {
                c.total
            } else {
                batch.tasks.len() as u64
            };
            self.shared.events.progress(format!(
                "{}: batch {} {}: {}/{total} done, {} failed",
                self.step.id,
                status.id,
                status.status_text,
                c.succeeded + c.failed,
                c.failed
            ));
            batch.shown = Some(shown);
        }
        Some(status)
    }

    /// Takes the results of a finished batch: answers, resubmissions, failures.
    async fn collect(&mut self, batch: InFlight, status: &BatchStatus) {
        let client = self.clients.get(&batch.provider).cloned();
        let mut results = HashMap::new();
        let mut missing = match &status.state {
            BatchState::Failed(message) => (message.clone(), false),
            _ => (
                format!(
                    "batch {} ({}) has no result for this task",
                    status.id, status.status_text
                ),
                true,
            ),
        };
        if !matches!(status.state, BatchState::Failed(_))
            && let Some(client) = client
        {
            let fetched = {
                let mut hook = self.retry_hook("fetch the batch results");
                retry_transient(&self.shared.policy, &mut hook, || {
                    client.batch_results(status)
                })
                .await
            };
            match fetched {
                Ok(found) => results = found,
                Err(err) => {
                    missing = (
                        format!("cannot fetch the results of batch {}: {err}", status.id),
                        err.is_transient(),
                    );
                }
            }
        }
        let retries = self.step.retries;
        for mut task in batch.tasks {
            let result = results
                .remove(&task.custom_id)
                .unwrap_or_else(|| LineResult::Failed {
                    message: missing.0.clone(),
                    transient: missing.1,
                });
            match result {
                LineResult::Succeeded(response) => {
                    task.turns += 1;
                    task.usage.add(response.usage);
                    let problem = crate::subagent::answer_problem(
                        &response,
                        task.output_limit,
                        task.allow_empty,
                    );
                    let answer = response.text.unwrap_or_default();
                    match problem {
                        None => self.answered(task, answer, &status.id),
                        Some(problem) => self.finish(
                            task,
                            false,
                            answer,
                            None,
                            Some(Failure::new(FailureClass::Answer, problem)),
                            Some(status.id.clone()),
                        ),
                    }
                }
                LineResult::Failed { message, transient } => {
                    let bound = if transient {
                        retries.max(DEFAULT_RESUBMITS)
                    } else {
                        retries
                    };
                    if task.resubmits < bound {
                        task.resubmits += 1;
                        self.waiting.push(task);
                    } else {
                        let tries = task.resubmits + 1;
                        let message = if tries > 1 {
                            format!(
                                "{message} (after {} in batches)",
                                crate::plural::count(tries as u64, "attempt")
                            )
                        } else {
                            message
                        };
                        let error = Failure::new(FailureClass::Provider("batch_line"), message);
                        self.finish(
                            task,
                            false,
                            String::new(),
                            None,
                            Some(error),
                            Some(status.id.clone()),
                        );
                    }
                }
            }
        }
        // The batch is done with only once its results are in the journal.
        self.wait_for_journal().await;
        if let Err(e) = self.with_store(|s| s.end_batch(&self.shared.run_id, &batch.id)) {
            self.shared.events.warning(format!(
                "step `{}`: cannot mark batch {} as ended: {e}",
                self.step.id, batch.id
            ));
        }
    }

    /// A task's answer: checked against its schema, when it has one.
    fn answered(&mut self, mut task: Pending, answer: String, batch_id: &str) {
        let Some(schema) = task.schema.clone() else {
            return self.finish(task, true, answer, None, None, Some(batch_id.to_owned()));
        };
        let checked = match jsonschema::validator_for(&schema) {
            Ok(validator) => crate::subagent::check_answer(&validator, &schema, &answer),
            Err(e) => {
                let error = Failure::new(
                    FailureClass::Prepare,
                    format!("invalid response schema: {e}"),
                );
                return self.finish(
                    task,
                    false,
                    answer,
                    None,
                    Some(error),
                    Some(batch_id.to_owned()),
                );
            }
        };
        match checked {
            Ok(checked) => {
                let text = checked.value.to_string();
                task.extracted = checked.extracted;
                self.finish(
                    task,
                    true,
                    text,
                    Some(checked.value),
                    None,
                    Some(batch_id.to_owned()),
                );
            }
            Err(errors) if task.schema_asks < task.schema_retries => {
                task.schema_asks += 1;
                task.schema_errors.push(errors.clone());
                task.request.messages.push(Message::Assistant {
                    text: Some(answer),
                    tool_calls: Vec::new(),
                });
                task.request.messages.push(Message::user(format!(
                    "Your answer does not validate against the required JSON Schema:\n{errors}\n\n\
                     Reply again with only the corrected JSON value."
                )));
                self.waiting.push(task);
            }
            Err(errors) => {
                task.schema_errors.push(errors);
                let error = Failure::new(
                    FailureClass::Schema,
                    crate::subagent::schema_failure(&task.schema_errors, &answer),
                );
                self.finish(
                    task,
                    false,
                    answer,
                    None,
                    Some(error),
                    Some(batch_id.to_owned()),
                );
            }
        }
    }

    /// Waits (at most 30 s) until every result handed to `on_done` is committed.
    async fn wait_for_journal(&mut self) {
        let Some(seq) = self.last_seq else { return };
        let mut commits = self.shared.committed.clone();
        let _ = tokio::time::timeout(Duration::from_secs(30), commits.wait_for(|n| *n > seq)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_backs_off_to_a_cap_and_reads_the_environment() {
        let env = crate::env::Env::for_test("/", &[("SUMMON_BATCH_POLL_MS", "10")]);
        let delays = PollDelay::from_env(&env);
        assert_eq!(delays.base, Duration::from_millis(10));
        assert_eq!(delays.cap, Duration::from_millis(300));
        let mut delay = delays.base;
        let mut seen = vec![delay];
        for _ in 0..20 {
            delay = delays.next(delay);
            seen.push(delay);
        }
        assert_eq!(seen[1], Duration::from_millis(15));
        assert!(seen.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*seen.last().unwrap(), Duration::from_millis(300));

        let default = PollDelay::from_env(&crate::env::Env::for_test("/", &[]));
        assert_eq!(default.base, DEFAULT_POLL);
        assert_eq!(default.cap, Duration::from_secs(300));
    }

    #[test]
    fn only_a_missing_endpoint_means_no_batch_api() {
        let missing = ProviderError::BadRequest {
            status: 404,
            message: "not found".into(),
        };
        assert!(no_batch_api(&missing));
        let bad = ProviderError::BadRequest {
            status: 400,
            message: "bad".into(),
        };
        assert!(!no_batch_api(&bad));
    }
}
