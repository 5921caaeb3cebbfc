//! `--out DIR/report.json`: what a run did, per step and in total, and the one-line summary.
//!
//! [`Report`] is fed one finished task at a time ([`Report::record_task`]: O(1), no
//! allocation after a step's first task) and step start/end times. [`Report::write_json`]
//! writes it atomically (a temporary file in the same directory, then a rename). The shape:
//!
//! ```json
//! {
//!   "version": 1,
//!   "started_at": "2025-01-31T12:00:00Z",
//!   "wall_ms": 41000,
//!   "total": STATS,
//!   "steps": { "areas": STATS, "notes": STATS, "summary": STATS },
//!   "retries_by_class": { "rate_limited": 3, "server_error": 1, "connection": 0,
//!                         "timeout": 0, "invalid_response": 0 },
//!   "sandbox": { "areas": { "policy": "workspace-write", "network": false }, ... },
//!   "pipeline": { "name": "release-notes", "run_id": "r-…",
//!                 "steps": [{ "id": "notes", "kind": "fan_out", "needs": ["areas"],
//!                             "status": "succeeded" }, ...] },
//!   "warnings": [ { "step": "notes", "index": 3, "item": "api",
//!                   "message": "extension `fs` did not start: ..." } ]
//! }
//! ```
//!
//! `trace_id` (present when the run exports OpenTelemetry traces) is the 32-hex-digit id of
//! the run's trace.
//!
//! `output_limits` (by step id, for the steps that sent requests) says which output limit
//! (`max_tokens`) the step's requests carried and why: `{"source": "learned", "smallest":
//! 64, "largest": 4096, "longest_answer": 12, "resent": 0}` — `source` is `explicit`
//! (`max_output_tokens`), `schema` (bounded by the answer's schema), `learned` (from the
//! step's answers) or `full`; `smallest`/`largest` are `null` when no limit was sent;
//! `resent` counts answers cut off at a learned or schema bound and sent again with the full
//! limit.
//!
//! `rate_limits` (by provider name) says what the provider's rate limits did to the run:
//! `{"held": 412, "held_max_s": 0.4, "held_total_s": 33.1, "binding": "the provider's tokens
//! per minute (300k)", "rate_limited": 0, "tokens_reserved": 1200000, "tokens_used": 310000,
//! "provider_limits": [["tokens_per_minute", 300000], ["requests_per_minute", 6000]]}` —
//! requests held back before they were sent (and for how long), the limit that held them
//! longest, the answers that were HTTP 429, the tokens the provider held at admission in its
//! own accounting against those the answers used, and the limits its headers gave.
//!
//! `warnings` (present when there are some) lists what went wrong with the tasks' extensions
//! (MCP servers) and an agent's listed tools left out, one entry per warning of a task, in the order the tasks finished; `item` is
//! the item's label (its `id`, its text, or `#index`).
//!
//! `pipeline` is the run's step graph, every step in file order with the steps it depends on
//! and how it ended (`succeeded`, `failed`, `skipped`, `deferred`: left for a merge), so that
//! `report.html` can draw it from the output directory alone.
//!
//! `sandbox` is each step's effective sandbox of the model's `shell` commands (flags over the
//! step over `settings` over the config file).
//!
//! `retries_by_class` counts the provider requests sent again after a transient failure, over
//! the whole run (every attempt of it: after a `--resume`, those of the tasks the earlier
//! attempts journaled are added, also when they were killed; a merge adds its shards'): HTTP 429 (`rate_limited`), 5xx
//! (`server_error`), a connection that failed or closed early (`connection`), no complete
//! answer within the request timeout (`timeout`), a success whose body was not JSON, such as
//! one cut off (`invalid_response`). Every class is always present.
//!
//! `steps` is keyed by step id, in the order the steps started. Each `STATS`:
//!
//! ```json
//! {
//!   "tasks": 12, "completed": 11, "failed": 1, "skipped": 0, "resumed": 3, "reused": 0,
//!   "corrections": 2, "turns": 30, "input_tokens": 2900, "output_tokens": 300,
//!   "duration_ms": { "sum": 120500, "max": 20100 },
//!   "wall_ms": 41000,
//!   "cost_usd": 0.004, "priced": true, "unpriced_tasks": 0,
//!   "cache_read_tokens": 2000, "cache_write_tokens": 500,
//!   "overhead": { "tasks": 12, "tokens": 600, "tool_tokens": 0, "per_task_max": 50,
//!                 "tool_tokens_per_task_max": 0 }
//! }
//! ```
//!
//! - `tasks` = `completed` + `failed` + `skipped`; `resumed` counts those (of any status) that
//!   finished before a `--resume` and were not run again. Their turns, tokens, durations and
//!   cost are included: the report describes the whole run. `reused` counts the completed
//!   tasks whose answer an earlier run gave (`--reuse`): no tokens, no cost. `corrections`
//!   counts the answers sent back to the model because they did not validate against the
//!   response schema (each one a paid request).
//! - `duration_ms` is over tasks (`sum` is task time, `max` the slowest); `wall_ms` is the
//!   step's elapsed time from its start to its end (`null` for a step that never started), and
//!   for `total` the run's.
//! - `cost_usd` is estimated from the configured prices (USD per million input/output tokens)
//!   of each task's model. A task that used tokens with a model missing from the price table
//!   is counted in `unpriced_tasks`, and then `priced` is `false`; `cost_usd` is the sum over
//!   the priced tasks, or `null` when no task could be priced. Input read from the provider's
//!   prompt cache is priced at the model's `cached_input`, input written to it at
//!   `cache_write`, the rest at `input`.
//! - `cache_read_tokens` / `cache_write_tokens`: the part of `input_tokens` read from /
//!   written to the provider's prompt cache.
//! - `overhead`: the estimated tokens each task's first request carries beyond the task's own
//!   instructions, context, prompt and role text (tool definitions, the standard system
//!   prompt, labels; see [`crate::event::Overhead`]), over the tasks that sent a request in
//!   this run: `{"tasks", "tokens", "tool_tokens", "per_task_max",
//!   "tool_tokens_per_task_max"}` (sums, then the largest of one task), `null` when none did.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use indexmap::IndexMap;
use serde::Serialize;

use crate::config::{Prices, Tier};
use crate::provider::Usage;

/// The report file name inside the `--out` directory.
pub(crate) const REPORT_FILE: &str = "report.json";

/// Counts and sums over a set of tasks.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Stats {
    pub(crate) tasks: u64,
    pub(crate) completed: u64,
    pub(crate) failed: u64,
    pub(crate) skipped: u64,
    pub(crate) resumed: u64,
    /// Answered by an earlier run (`--reuse`), at no cost.
    pub(crate) reused: u64,
    /// Answers sent back for correction (they did not validate against the schema).
    pub(crate) corrections: u64,
    pub(crate) turns: u64,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    /// Input tokens read from / written to the provider's prompt cache (part of `input_tokens`).
    pub(crate) cache_read_tokens: u64,
    pub(crate) cache_write_tokens: u64,
    pub(crate) duration_sum_ms: u64,
    pub(crate) duration_max_ms: u64,
    /// Over the priced tasks, USD.
    pub(crate) cost: f64,
    pub(crate) priced_tasks: u64,
    pub(crate) unpriced_tasks: u64,
    /// The per-task overhead of the tasks that sent a request here.
    pub(crate) overhead: crate::event::OverheadSum,
}

impl Stats {
    fn add(&mut self, task: &Task<'_>, cost: Option<f64>) {
        self.tasks += 1;
        match task.status {
            "completed" => self.completed += 1,
            "skipped" => self.skipped += 1,
            _ => self.failed += 1,
        }
        self.resumed += u64::from(task.resumed);
        self.reused += u64::from(task.reused);
        self.corrections += u64::from(task.corrections);
        self.turns += u64::from(task.turns);
        self.input_tokens += task.usage.input_tokens;
        self.output_tokens += task.usage.output_tokens;
        self.cache_read_tokens += task.usage.cache_read_tokens;
        self.cache_write_tokens += task.usage.cache_write_tokens;
        let ms = millis(task.duration);
        self.duration_sum_ms = self.duration_sum_ms.saturating_add(ms);
        self.duration_max_ms = self.duration_max_ms.max(ms);
        match cost {
            Some(cost) => {
                self.cost += cost;
                self.priced_tasks += 1;
            }
            None => self.unpriced_tasks += 1,
        }
    }

    /// Input plus output tokens.
    pub(crate) fn tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    /// The estimated cost, `None` when no task could be priced.
    pub(crate) fn cost_usd(&self) -> Option<f64> {
        (self.unpriced_tasks == 0 || self.priced_tasks > 0).then_some(self.cost)
    }

    fn json(&self, wall: Option<Duration>) -> StatsJson {
        StatsJson {
            tasks: self.tasks,
            completed: self.completed,
            failed: self.failed,
            skipped: self.skipped,
            resumed: self.resumed,
            reused: self.reused,
            corrections: self.corrections,
            turns: self.turns,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            duration_ms: DurationJson {
                sum: self.duration_sum_ms,
                max: self.duration_max_ms,
            },
            wall_ms: wall.map(millis),
            cost_usd: self.cost_usd().map(|c| (c * 1e6).round() / 1e6),
            priced: self.unpriced_tasks == 0,
            unpriced_tasks: self.unpriced_tasks,
            levels: Vec::new(),
            cache_read_tokens: self.cache_read_tokens,
            cache_write_tokens: self.cache_write_tokens,
            overhead: self.overhead.json(),
        }
    }
}

struct Task<'a> {
    status: &'a str,
    turns: u32,
    usage: Usage,
    duration: Duration,
    resumed: bool,
    reused: bool,
    corrections: u32,
}

#[derive(Debug, Default)]
struct StepEntry {
    stats: Stats,
    /// A reducing step's tasks by level: (tasks, completed, failed).
    levels: std::collections::BTreeMap<u32, (u64, u64, u64)>,
    started: Option<Instant>,
    finished: Option<Instant>,
}

impl StepEntry {
    fn wall(&self, now: Instant) -> Option<Duration> {
        let started = self.started?;
        Some(
            self.finished
                .unwrap_or(now)
                .saturating_duration_since(started),
        )
    }
}

/// The run's aggregate, fed one task at a time.
pub(crate) struct Report {
    prices: Prices,
    started_at: jiff::Timestamp,
    started: Instant,
    finished: Option<Instant>,
    steps: IndexMap<String, StepEntry>,
    total: Stats,
    retries: IndexMap<&'static str, u64>,
    /// Each step's effective sandbox of the model's shell commands.
    sandbox: IndexMap<String, serde_json::Value>,
    /// The step graph and how each step ended.
    pipeline: Option<serde_json::Value>,
    /// The tasks' extension warnings.
    warnings: Vec<TaskWarning>,
    /// The models of tasks that could not be priced.
    unpriced_models: indexmap::IndexSet<String>,
    /// The spend cap, when the run has one.
    budget: Option<BudgetJson>,
    /// The OpenTelemetry trace of the run, when it exports one.
    trace_id: Option<String>,
    /// The output limits each step's requests were sent with, by step id.
    output_limits: IndexMap<String, crate::subagent::output_cap::CapSummary>,
    /// What each provider's rate limits held back and charged, by provider name.
    rate_limits: IndexMap<String, crate::provider::AdmissionStats>,
}

/// `budget` in report.json: the cap, what was spent against it (every request of the run,
/// earlier attempts of a resumed run included), and whether it was reached.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub(crate) struct BudgetJson {
    pub(crate) cap_usd: f64,
    pub(crate) spent_usd: f64,
    pub(crate) reached: bool,
}

/// One extension warning of one task.
#[derive(Serialize)]
struct TaskWarning {
    step: String,
    index: u64,
    item: String,
    message: String,
}

/// The classes of `retries_by_class`, in their order.
pub(crate) const RETRY_CLASSES: [&str; 5] = [
    "rate_limited",
    "server_error",
    "connection",
    "timeout",
    "invalid_response",
];

#[derive(Serialize)]
struct ReportJson<'a> {
    version: u32,
    started_at: String,
    wall_ms: u64,
    total: StatsJson,
    steps: IndexMap<&'a str, StatsJson>,
    retries_by_class: &'a IndexMap<&'static str, u64>,
    #[serde(skip_serializing_if = "IndexMap::is_empty")]
    sandbox: &'a IndexMap<String, serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pipeline: Option<&'a serde_json::Value>,
    #[serde(skip_serializing_if = "<[TaskWarning]>::is_empty")]
    warnings: &'a [TaskWarning],
    #[serde(skip_serializing_if = "Option::is_none")]
    budget: Option<&'a BudgetJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_id: Option<&'a str>,
    #[serde(skip_serializing_if = "IndexMap::is_empty")]
    output_limits: &'a IndexMap<String, crate::subagent::output_cap::CapSummary>,
    #[serde(skip_serializing_if = "IndexMap::is_empty")]
    rate_limits: &'a IndexMap<String, crate::provider::AdmissionStats>,
}

#[derive(Serialize)]
struct StatsJson {
    tasks: u64,
    completed: u64,
    failed: u64,
    skipped: u64,
    resumed: u64,
    reused: u64,
    corrections: u64,
    turns: u64,
    input_tokens: u64,
    output_tokens: u64,
    duration_ms: DurationJson,
    wall_ms: Option<u64>,
    cost_usd: Option<f64>,
    priced: bool,
    unpriced_tasks: u64,
    cache_read_tokens: u64,
    cache_write_tokens: u64,
    /// The tasks' per-task overhead (`null`: no task sent a request here).
    overhead: serde_json::Value,
    /// A reducing synthesize step's levels, from the first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    levels: Vec<LevelJson>,
}

#[derive(Serialize)]
struct LevelJson {
    level: u32,
    tasks: u64,
    completed: u64,
    failed: u64,
}

#[derive(Serialize)]
struct DurationJson {
    sum: u64,
    max: u64,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Report {
    /// An empty report; `prices` gives a model's USD per million tokens.
    /// The run's wall time starts now.
    pub(crate) fn new(prices: Prices) -> Self {
        Self {
            prices,
            started_at: jiff::Timestamp::now(),
            started: Instant::now(),
            finished: None,
            steps: IndexMap::new(),
            total: Stats::default(),
            retries: RETRY_CLASSES.iter().map(|c| (*c, 0)).collect(),
            sandbox: IndexMap::new(),
            pipeline: None,
            warnings: Vec::new(),
            unpriced_models: indexmap::IndexSet::new(),
            budget: None,
            trace_id: None,
            output_limits: IndexMap::new(),
            rate_limits: IndexMap::new(),
        }
    }

    /// Records the output limits the requests of step `step` were sent with.
    pub(crate) fn set_output_limit(
        &mut self,
        step: &str,
        summary: crate::subagent::output_cap::CapSummary,
    ) {
        self.output_limits.insert(step.to_owned(), summary);
    }

    /// Records what each provider's rate limits held back and charged.
    pub(crate) fn set_rate_limits(
        &mut self,
        providers: Vec<(String, crate::provider::AdmissionStats)>,
    ) {
        self.rate_limits = providers.into_iter().collect();
    }

    /// The summary's lines about output limits and rate limits: `output limits: labels 64
    /// tokens (learned ...)`, and per provider that held requests back or answered 429,
    /// `provider `openai`: 412 requests held by the provider's tokens per minute (300k) for
    /// 33.1s in all, 3 answered 429; 1.2M tokens reserved at admission for 310k used`.
    pub(crate) fn limit_notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if !self.output_limits.is_empty() {
            let steps: Vec<String> = self
                .output_limits
                .iter()
                .map(|(id, cap)| format!("{id} {}", cap.describe()))
                .collect();
            notes.push(format!("output limits: {}", steps.join("; ")));
        }
        for (name, stats) in &self.rate_limits {
            if stats.held == 0 && stats.rate_limited == 0 {
                continue;
            }
            let mut line = format!("provider `{name}`: ");
            if stats.held > 0 {
                line.push_str(&format!(
                    "{} request{} held by {} for {:.1}s in all, ",
                    stats.held,
                    if stats.held == 1 { "" } else { "s" },
                    stats.binding.as_deref().unwrap_or("its rate limits"),
                    stats.held_total_s
                ));
            }
            line.push_str(&format!(
                "{} answered 429; {} tokens reserved at admission for {} used",
                stats.rate_limited,
                fmt_tokens(stats.tokens_reserved),
                fmt_tokens(stats.tokens_used)
            ));
            notes.push(line);
        }
        notes
    }

    /// Sets the run's step graph (the `pipeline` key).
    pub(crate) fn set_pipeline(&mut self, pipeline: serde_json::Value) {
        self.pipeline = Some(pipeline);
    }

    /// Sets the run's provider retries per class (classes outside [`RETRY_CLASSES`] are left
    /// out).
    /// Records the sandbox the model's shell commands of step `step` run in.
    /// The run's trace id (`trace_id` in the document).
    pub(crate) fn set_trace_id(&mut self, trace_id: Option<String>) {
        self.trace_id = trace_id;
    }

    pub(crate) fn set_sandbox(&mut self, step: &str, sandbox: crate::sandbox::Sandbox) {
        self.sandbox.insert(step.to_owned(), sandbox.to_json());
    }

    /// Records the extension warnings of task `index` (item label `item`) of `step`.
    pub(crate) fn record_warnings(
        &mut self,
        step: &str,
        index: u64,
        item: &str,
        warnings: &[String],
    ) {
        self.warnings
            .extend(warnings.iter().map(|message| TaskWarning {
                step: step.to_owned(),
                index,
                item: item.to_owned(),
                message: message.clone(),
            }));
    }

    pub(crate) fn set_retries(&mut self, counts: &std::collections::BTreeMap<&'static str, u64>) {
        for (class, n) in counts {
            if let Some(slot) = self.retries.get_mut(class) {
                *slot = *n;
            }
        }
    }

    /// What to do about the models that had no price: one line, `None` when every task was
    /// priced.
    pub(crate) fn unpriced_hint(&self) -> Option<String> {
        let first = self.unpriced_models.first()?;
        let models: Vec<String> = self
            .unpriced_models
            .iter()
            .map(|m| format!("`{m}`"))
            .collect();
        Some(format!(
            "{} for {}: {}",
            crate::config::NO_PRICE,
            models.join(", "),
            crate::config::prices::no_price_hint(first)
        ))
    }

    /// Sets the spend cap and what was spent against it.
    pub(crate) fn set_budget(&mut self, budget: BudgetJson) {
        self.budget = Some(budget);
    }

    /// When the run's clock started.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    fn entry(&mut self, step: &str) -> &mut StepEntry {
        if !self.steps.contains_key(step) {
            self.steps.insert(step.to_owned(), StepEntry::default());
        }
        &mut self.steps[step]
    }
    pub(crate) fn step_started(&mut self, step: &str) {
        let now = Instant::now();
        self.entry(step).started.get_or_insert(now);
    }
    pub(crate) fn step_finished(&mut self, step: &str) {
        let now = Instant::now();
        let entry = self.entry(step);
        entry.started.get_or_insert(now);
        entry.finished = Some(now);
    }

    /// The estimated cost of a task: `Some(0.0)` when it used no tokens, `None` when its model
    /// has no price.
    pub(crate) fn task_cost(&self, model: Option<&str>, usage: &Usage, tier: Tier) -> Option<f64> {
        if usage.total() == 0 {
            return Some(0.0);
        }
        Some(self.prices.at(model?, tier)?.cost(usage))
    }

    /// Adds one finished task of `step`, run by `model` (for its price), with `status`
    /// `completed`, `failed` or `skipped` (anything else counts as failed); a task answered
    /// at the service `tier` that served it (the batch tier through a provider's batch API). Returns its
    /// estimated cost (as [`Report::task_cost`]), for the progress display.
    #[allow(clippy::too_many_arguments)] // one flat call per task, no intermediate struct
    pub(crate) fn record_task(
        &mut self,
        step: &str,
        model: Option<&str>,
        status: &str,
        turns: u32,
        usage: Usage,
        duration: Duration,
        resumed: bool,
        tier: Tier,
        corrections: u32,
    ) -> Option<f64> {
        debug_assert!(
            matches!(status, "completed" | "failed" | "skipped"),
            "unknown task status {status:?}"
        );
        let cost = self.task_cost(model, &usage, tier);
        if cost.is_none() {
            self.unpriced_models
                .insert(model.unwrap_or("(unknown model)").to_owned());
        }
        let task = Task {
            status,
            turns,
            usage,
            duration,
            resumed,
            reused: false,
            corrections,
        };
        self.entry(step).stats.add(&task, cost);
        self.total.add(&task, cost);
        cost
    }

    /// Adds a completed task of `step` whose answer an earlier run gave (`--reuse`): it cost
    /// nothing in this run.
    /// Counts a task of a reduction's `level` (its stats go to the step as usual).
    pub(crate) fn record_level(&mut self, step: &str, level: u32, ok: bool) {
        let counts = self.entry(step).levels.entry(level).or_default();
        counts.0 += 1;
        if ok {
            counts.1 += 1;
        } else {
            counts.2 += 1;
        }
    }

    /// Adds the overhead of a task of `step` that sent a request (see
    /// [`crate::event::Overhead`]); `None` (resumed, reused) adds nothing.
    pub(crate) fn record_overhead(&mut self, step: &str, overhead: Option<crate::event::Overhead>) {
        if let Some(overhead) = overhead {
            self.entry(step).stats.overhead.add(overhead);
            self.total.overhead.add(overhead);
        }
    }

    pub(crate) fn record_reused(&mut self, step: &str) {
        let task = Task {
            status: "completed",
            turns: 0,
            usage: Usage::default(),
            duration: Duration::ZERO,
            resumed: false,
            reused: true,
            corrections: 0,
        };
        self.entry(step).stats.add(&task, Some(0.0));
        self.total.add(&task, Some(0.0));
    }

    /// Stops the run's clock (otherwise it runs until the report is written).
    pub(crate) fn finish(&mut self) {
        self.finished.get_or_insert_with(Instant::now);
    }

    fn wall(&self) -> Duration {
        self.finished
            .unwrap_or_else(Instant::now)
            .saturating_duration_since(self.started)
    }

    /// The report as JSON (the shape of the module documentation).
    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self.json_doc()).expect("report serializes")
    }

    fn json_doc(&self) -> ReportJson<'_> {
        let now = Instant::now();
        let wall = self.wall();
        ReportJson {
            version: 1,
            started_at: self.started_at.to_string(),
            wall_ms: millis(wall),
            total: self.total.json(Some(wall)),
            steps: self
                .steps
                .iter()
                .map(|(id, e)| {
                    let mut json = e.stats.json(e.wall(now));
                    json.levels = e
                        .levels
                        .iter()
                        .map(|(&level, &(tasks, completed, failed))| LevelJson {
                            level,
                            tasks,
                            completed,
                            failed,
                        })
                        .collect();
                    (id.as_str(), json)
                })
                .collect(),
            retries_by_class: &self.retries,
            budget: self.budget.as_ref(),
            sandbox: &self.sandbox,
            pipeline: self.pipeline.as_ref(),
            warnings: &self.warnings,
            trace_id: self.trace_id.as_deref(),
            output_limits: &self.output_limits,
            rate_limits: &self.rate_limits,
        }
    }

    /// Writes the report to `path` atomically: a temporary file next to it, synced, then
    /// renamed over it.
    pub(crate) fn write_json(&self, path: &Path) -> io::Result<()> {
        let mut bytes = serde_json::to_vec_pretty(&self.json_doc()).map_err(io::Error::other)?;
        bytes.push(b'\n');
        write_atomically(path, &bytes)
    }

    /// `12 tasks: 11 completed, 1 failed, 3.2k tokens, $0.004, 41.0s` — failed, skipped and
    /// resumed only when there are some; the cost as [`cost_text`] says it.
    pub(crate) fn summary_line(&self) -> String {
        let t = &self.total;
        let mut line = format!(
            "{} task{}: {} completed",
            t.tasks,
            if t.tasks == 1 { "" } else { "s" },
            t.completed
        );
        for (n, what) in [
            (t.failed, "failed"),
            (t.skipped, "skipped"),
            (t.resumed, "resumed"),
            (t.reused, "reused"),
        ] {
            if n > 0 {
                line.push_str(&format!(", {n} {what}"));
            }
        }
        line.push_str(&format!(", {} tokens", fmt_tokens(t.tokens())));
        if let Some(share) = cache_share(t.input_tokens, t.cache_read_tokens) {
            line.push_str(&format!(", {share}"));
        }
        match &self.budget {
            Some(b) => line.push_str(&format!(
                ", {} of {} cap",
                crate::subagent::budget::usd(b.spent_usd),
                crate::subagent::budget::usd(b.cap_usd)
            )),
            None => {
                if let Some(cost) = cost_text(t.cost, t.priced_tasks, t.unpriced_tasks) {
                    line.push_str(&format!(", {cost}"));
                }
            }
        }
        line.push_str(&format!(", {}", fmt_duration(self.wall())));
        line
    }
}

/// Writes `bytes` to `path` through a new temporary file in the same directory and a rename, so
/// a reader sees the old file or the new one, never a part; a symbolic link at `path` is
/// refused, never written through.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    crate::safe_fs::write_replacing(path, bytes)
}

/// The cost of `priced` tasks that came to `usd` beside `unpriced` tasks whose model has no
/// price, in the one wording every output uses: `$0.21`, `$0.21 + no price for 3 tasks`, `no
/// price`; `None` before any task.
pub(crate) fn cost_text(usd: f64, priced: u64, unpriced: u64) -> Option<String> {
    let no_price = crate::config::NO_PRICE;
    match (priced, unpriced) {
        (0, 0) => None,
        (0, _) => Some(no_price.to_owned()),
        (_, 0) => Some(fmt_cost(usd)),
        (_, n) => Some(format!(
            "{} + {no_price} for {n} task{}",
            fmt_cost(usd),
            if n == 1 { "" } else { "s" }
        )),
    }
}

/// `950`, `3.2k`, `52.1k`, `1.3M`.
pub(crate) fn fmt_tokens(n: u64) -> String {
    if n < 1000 {
        n.to_string()
    } else if n < 999_950 {
        format!("{:.1}k", n as f64 / 1e3)
    } else {
        format!("{:.1}M", n as f64 / 1e6)
    }
}

/// `62% of input from cache`, when some input was read from the provider's prompt cache.
pub(crate) fn cache_share(input_tokens: u64, cache_read_tokens: u64) -> Option<String> {
    (cache_read_tokens > 0 && input_tokens > 0).then(|| {
        let percent = (cache_read_tokens as f64 * 100.0 / input_tokens as f64).round();
        format!("{percent:.0}% of input from cache")
    })
}

/// `$0`, `$0.004`, `$0.21`, `$12.35`; `<$0.001` for a nonzero cost below a tenth of a cent.
pub(crate) fn fmt_cost(usd: f64) -> String {
    if usd <= 0.0 {
        "$0".to_owned()
    } else if usd < 0.001 {
        "<$0.001".to_owned()
    } else if usd < 0.1 {
        format!("${usd:.3}")
    } else {
        format!("${usd:.2}")
    }
}

/// `41.0s`, `2m03s`, `1h05m`.
pub(crate) fn fmt_duration(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        format!("{secs:.1}s")
    } else if secs < 3600.0 {
        let s = d.as_secs();
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        let m = d.as_secs() / 60;
        format!("{}h{:02}m", m / 60, m % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::collections::HashMap;

    /// 1000 input and 100 output tokens in 2 turns.
    fn record(report: &mut Report, step: &str, model: &str, status: &str, ms: u64) {
        report.record_task(
            step,
            Some(model),
            status,
            2,
            usage(1000, 100),
            Duration::from_millis(ms),
            false,
            Tier::Standard,
            0,
        );
    }

    fn prices() -> Prices {
        Prices::only(HashMap::from([(
            "cheap".to_owned(),
            crate::config::file::Price::with_cache_defaults("cheap", 0.15, 0.60),
        )]))
    }

    fn usage(input: u64, output: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            ..Usage::default()
        }
    }

    fn keys(value: &Value) -> Vec<&str> {
        value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect()
    }

    #[test]
    fn json_shape_is_pinned_and_cost_comes_from_prices() {
        let mut report = Report::new(prices());
        report.step_started("areas");
        record(&mut report, "areas", "cheap", "completed", 100);
        let overhead = |tokens, tool_tokens| crate::event::Overhead {
            tokens,
            tool_tokens,
        };
        report.record_overhead("areas", Some(overhead(40, 0)));
        report.record_overhead("areas", Some(overhead(900, 850)));
        // A task that sent nothing here (resumed) adds nothing.
        report.record_overhead("areas", None);
        report.step_finished("areas");
        report.step_started("notes");
        record(&mut report, "notes", "cheap", "completed", 300);
        let resumed_cost = report.record_task(
            "notes",
            Some("cheap"),
            "failed",
            2,
            usage(1000, 100),
            Duration::from_millis(200),
            true,
            Tier::Standard,
            0,
        );
        assert!((resumed_cost.unwrap() - 0.00021).abs() < 1e-12);
        let skipped_cost = report.record_task(
            "notes",
            Some("unknown"),
            "skipped",
            0,
            Usage::default(),
            Duration::ZERO,
            false,
            Tier::Standard,
            0,
        );
        assert_eq!(skipped_cost, Some(0.0), "no tokens, no cost");
        record(&mut report, "other", "unknown", "completed", 5);
        report.finish();

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out").join(REPORT_FILE);
        report.write_json(&path).unwrap();
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            keys(&doc),
            [
                "version",
                "started_at",
                "wall_ms",
                "total",
                "steps",
                "retries_by_class"
            ]
        );
        assert_eq!(
            doc["retries_by_class"],
            json!({"rate_limited": 0, "server_error": 0, "connection": 0, "timeout": 0,
                   "invalid_response": 0})
        );
        assert_eq!(doc["version"], 1);
        assert!(doc["started_at"].as_str().unwrap().ends_with('Z'));
        assert_eq!(keys(&doc["steps"]), ["areas", "notes", "other"]);
        let stats_keys = [
            "tasks",
            "completed",
            "failed",
            "skipped",
            "resumed",
            "reused",
            "corrections",
            "turns",
            "input_tokens",
            "output_tokens",
            "duration_ms",
            "wall_ms",
            "cost_usd",
            "priced",
            "unpriced_tasks",
            "cache_read_tokens",
            "cache_write_tokens",
            "overhead",
        ];
        assert_eq!(keys(&doc["total"]), stats_keys);
        assert_eq!(keys(&doc["steps"]["notes"]), stats_keys);

        // 1000 in × 0.15/M + 100 out × 0.60/M = 0.00021 per task.
        let mut notes = doc["steps"]["notes"].clone();
        assert!(notes["wall_ms"].is_u64());
        notes["wall_ms"] = json!(0);
        assert_eq!(
            notes,
            json!({
                "tasks": 3, "completed": 1, "failed": 1, "skipped": 1, "resumed": 1,
                "reused": 0, "corrections": 0, "turns": 4, "input_tokens": 2000, "output_tokens": 200,
                "duration_ms": {"sum": 500, "max": 300}, "wall_ms": 0,
                "cost_usd": 0.00042, "priced": true, "unpriced_tasks": 0,
                "cache_read_tokens": 0, "cache_write_tokens": 0, "overhead": null
            })
        );
        let other = &doc["steps"]["other"];
        assert_eq!(other["cost_usd"], Value::Null);
        assert_eq!(other["priced"], false);
        assert_eq!(other["wall_ms"], Value::Null, "never started");
        let overhead = json!({"tasks": 2, "tokens": 940, "tool_tokens": 850,
                               "per_task_max": 900, "tool_tokens_per_task_max": 850});
        assert_eq!(doc["steps"]["areas"]["overhead"], overhead);
        assert_eq!(doc["total"]["overhead"], overhead);
        let total = &doc["total"];
        assert_eq!(total["tasks"], 5);
        assert_eq!(total["cost_usd"], json!(0.00063));
        assert_eq!(total["priced"], false);
        assert_eq!(total["unpriced_tasks"], 1);
        // No temporary file is left behind.
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1
        );
    }

    #[test]
    fn the_cached_share_of_input_is_shown_when_there_is_one() {
        assert_eq!(cache_share(1000, 0), None);
        assert_eq!(
            cache_share(1000, 620).as_deref(),
            Some("62% of input from cache")
        );
    }

    #[test]
    fn summary_line() {
        let mut report = Report::new(prices());
        for i in 0..11 {
            record(&mut report, "s", "cheap", "completed", i);
        }
        record(&mut report, "s", "cheap", "failed", 1);
        report.finish();
        let line = report.summary_line();
        assert!(
            line.starts_with("12 tasks: 11 completed, 1 failed, 13.2k tokens, $0.003, "),
            "{line}"
        );
        assert!(line.ends_with('s'), "{line}");

        let mut report = Report::new(Prices::only(HashMap::new()));
        record(&mut report, "s", "x", "completed", 1);
        assert!(
            report
                .summary_line()
                .starts_with("1 task: 1 completed, 1.1k tokens, no price, 0."),
            "{}",
            report.summary_line()
        );
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_tokens(950), "950");
        assert_eq!(fmt_tokens(3210), "3.2k");
        assert_eq!(fmt_tokens(52_140), "52.1k");
        assert_eq!(fmt_tokens(999_999), "1.0M");
        assert_eq!(fmt_tokens(1_260_000), "1.3M");
        assert_eq!(fmt_cost(0.0), "$0");
        assert_eq!(fmt_cost(0.0004), "<$0.001");
        assert_eq!(fmt_cost(0.004), "$0.004");
        assert_eq!(fmt_cost(0.2149), "$0.21");
        assert_eq!(fmt_cost(12.346), "$12.35");
        assert_eq!(fmt_duration(Duration::from_millis(41_040)), "41.0s");
        assert_eq!(fmt_duration(Duration::from_secs(123)), "2m03s");
        assert_eq!(fmt_duration(Duration::from_secs(3900)), "1h05m");
    }
}
