//! The run, in three phases: open (or resume) it, dispatch its steps, finish it. Steps
//! start when the steps they depend on have finished, independent steps run at the same
//! time, and one sink owns the outputs (journal, `results.jsonl`, report, JUnit, progress).
//!
//! ```text
//! OpenRun::open -> Dispatcher (step status, signals) --spawn--> StepRun --> Tasks::run
//!                      ^-- step ended --/          finished task --> Sink  (global + step
//!               -> Finish::run (flush, report, outputs, manifest, status)       semaphores)
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use indexmap::IndexMap;
use jiff::Timestamp;
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::context::{StepOutputs, agents_json};
use super::dispatcher::Dispatcher;
use super::finish::Finish;
use super::open::OpenRun;
use super::plan::{Plan, TaskRef};
use super::step::{Shared, StepConfig};
use super::step_run::RunContext;
use crate::config::Config;
use crate::env::Env;
use crate::error::{Error, Result};
use crate::event::{RunSummary, TaskDone};
use crate::output::{DisplayMode, JunitWriter, Progress, Report, ResultLine, ResultsWriter};
use crate::pipeline::graph::Graph;
use crate::pipeline::model::{Decompose, Pipeline, StepKind};
use crate::pipeline::shard::Role;
use crate::provider::RetryPolicy;
use crate::source::Catalog;
use crate::store::{JournalStatus, JournalWriter, TaskResultRow};

/// What `summon run` asks for.
pub(crate) struct RunOptions {
    pub(crate) pipeline: Pipeline,
    pub(crate) params: IndexMap<String, String>,
    pub(crate) concurrency: Option<usize>,
    pub(crate) out_dir: Option<PathBuf>,
    /// `Some(None)`: the last run of this pipeline; `Some(Some(id))`: that run.
    pub(crate) resume: Option<Option<String>>,
    pub(crate) junit: Option<PathBuf>,
    pub(crate) display: DisplayMode,
    /// `--batch`: every eligible fan_out step uses the provider's batch API.
    pub(crate) batch: bool,
    /// A shard, `--until`, `--items-from` or a merge; the default runs every step.
    pub(crate) plan: Plan,
    /// `--reuse`: every step takes the answers of earlier runs to the same requests.
    pub(crate) reuse: bool,
    /// `--wait`: wait for a live run of the same pipeline to end instead of refusing.
    pub(crate) wait: bool,
}

/// Default global cap on tasks in flight.
pub(crate) const DEFAULT_CONCURRENCY: usize = 8;

/// Everything a finished task goes to. One owner; steps send through a mutex.
pub(super) struct Sink {
    pub(super) journal: JournalWriter,
    pub(super) results: Option<ResultsWriter>,
    pub(super) report: Report,
    pub(super) junit: Option<JunitWriter>,
    /// The run's live display, shared with the dispatcher and the tasks.
    pub(super) progress: Arc<Progress>,
    pub(super) step_ids: Vec<String>,
    /// Results already in `results.jsonl` from before a resume.
    already_written: std::collections::HashSet<(String, u64)>,
    /// Journal rows recorded so far; a row's number is its position in commit order.
    recorded: u64,
    /// Every task of the run, for a shard's or `--until` run's manifest.
    pub(super) tasks: Option<Vec<TaskRef>>,
    /// The tasks of each reducing step's levels so far (its progress total).
    levels: HashMap<String, u64>,
    /// The rows of the table `outputs`.
    pub(super) tables: crate::output::Tables,
}

impl Sink {
    /// Records a finished task everywhere; returns its journal row number (none for a
    /// result taken from the journal).
    pub(super) fn record(&mut self, done: &TaskDone) -> Option<u64> {
        self.record_at(done, None)
    }

    /// [`Self::record`] for a task of a reduction's `level`: journaled and listed in
    /// `results.jsonl` as `<step>#<level>`, counted in the step's report and progress.
    fn record_at(&mut self, done: &TaskDone, level: Option<u32>) -> Option<u64> {
        let step_id = &self.step_ids[done.step];
        let leveled = level.map(|l| format!("{step_id}#{l}"));
        let step = leveled.as_ref().unwrap_or(step_id);
        let status = if done.ok { "completed" } else { "failed" };
        if let Some(tasks) = &mut self.tasks {
            tasks.push(TaskRef {
                step: step.clone(),
                index: done.index,
                hash: done.hash.clone(),
                model: done.model.clone(),
                batch_id: done.batch_id.clone(),
            });
        }
        let mut seq = None;
        if !done.resumed {
            let row = TaskResultRow {
                step_id: step.clone(),
                item_index: done.index,
                input_hash: done.hash.clone(),
                status: if done.ok {
                    JournalStatus::Completed
                } else {
                    JournalStatus::Failed
                },
                output: Some(done.output.clone()),
                item_json: Some(done.item.to_string()),
                turns: done.turns,
                tokens: done.usage,
                duration_ms: u64::try_from(done.duration.as_millis()).unwrap_or(u64::MAX),
                error: done.error.clone(),
                finished_at: Timestamp::now(),
                batch_id: done.batch_id.clone(),
            };
            if let Err(e) = self.journal.record(row) {
                self.progress
                    .println(&format!("summon: warning: cannot journal a result: {e}"));
            }
            seq = Some(self.recorded);
            self.recorded += 1;
        }
        // A task that ran again after `--resume` gets a new line; the file is compacted to
        // one line per task when the run ends.
        if let Some(results) = &mut self.results
            && !(done.resumed && self.already_written.contains(&(step.clone(), done.index)))
        {
            let line = ResultLine {
                step,
                index: done.index,
                item: &done.item,
                status,
                output: &done.output,
                error: done.error.as_deref(),
                turns: done.turns,
                input_tokens: done.usage.input_tokens,
                output_tokens: done.usage.output_tokens,
                duration_ms: u64::try_from(done.duration.as_millis()).unwrap_or(u64::MAX),
                resumed: done.resumed,
                reused: done.reused,
                extracted: done.extracted,
                corrections: done.corrections,
                trace: &done.trace,
                warnings: &done.warnings,
                data: done.structured.as_ref(),
                cache_read_tokens: done.usage.cache_read_tokens,
                cache_write_tokens: done.usage.cache_write_tokens,
            };
            if let Err(e) = results.write(&line) {
                self.progress
                    .println(&format!("summon: warning: cannot write results.jsonl: {e}"));
            }
        }
        crate::env::crash_point("task-recorded");
        if level.is_none() {
            self.tables.push(done);
        }
        let step = step_id;
        if let Some(level) = level {
            self.report.record_level(step, level, done.ok);
        }
        self.report.record_warnings(
            step,
            done.index,
            &item_label(&done.item, done.index),
            &done.warnings,
        );
        self.report.record_overhead(step, done.trace.overhead());
        let cost = if done.reused {
            self.report.record_reused(step);
            Some(0.0)
        } else {
            self.report.record_task(
                step,
                done.model.as_deref(),
                status,
                done.turns,
                done.usage,
                done.duration,
                done.resumed,
                done.batch_id.is_some(),
                done.corrections,
            )
        };
        if let Some(junit) = &mut self.junit {
            let label = item_label(&done.item, done.index);
            let label = match level {
                Some(level) => format!("level {level}, chunk {}", done.index),
                None => label,
            };
            let label = if done.reused {
                format!("{label} (reused)")
            } else {
                label
            };
            junit.add_case(
                step,
                level.map_or(done.index, |l| (u64::from(l) << 40) + done.index),
                &label,
                done.ok,
                done.duration,
                done.error.as_deref(),
            );
        }
        self.progress
            .task_input(step, done.usage.input_tokens, done.usage.cache_read_tokens);
        if let Some(junit) = &mut self.junit {
            junit.add_cache(
                step,
                done.usage.cache_read_tokens,
                done.usage.cache_write_tokens,
            );
        }
        self.progress.task_finished(
            step,
            done.ok,
            done.usage.input_tokens + done.usage.output_tokens,
            cost,
        );
        seq
    }
}

impl super::reduce::LevelSink for Arc<Mutex<Sink>> {
    fn level_started(&self, step: &str, level: u32, chunks: usize) {
        if let Ok(mut sink) = self.lock() {
            let total = sink.levels.entry(step.to_owned()).or_default();
            *total += chunks as u64;
            let total = *total;
            sink.progress.set_total(step, total);
            if sink.progress.mode() != DisplayMode::Quiet {
                sink.progress.println(&format!(
                    "[summon] {step}: level {level}: {chunks} chunk(s)"
                ));
            }
        }
    }

    fn record(&self, done: &TaskDone, level: u32) -> Option<u64> {
        self.lock()
            .ok()
            .and_then(|mut sink| sink.record_at(done, Some(level)))
    }
}

/// What a batch step tells the run's display.
pub(super) struct SinkReporter<'a>(pub(super) &'a Arc<Mutex<Sink>>);

impl super::batch::BatchReporter for SinkReporter<'_> {
    fn warning(&self, text: &str) {
        if let Ok(sink) = self.0.lock() {
            sink.progress.println(&format!("summon: warning: {text}"));
        }
    }

    fn progress(&self, text: &str) {
        if let Ok(sink) = self.0.lock()
            && sink.progress.mode() != DisplayMode::Quiet
        {
            sink.progress.println(&format!("[summon] {text}"));
        }
    }

    fn tasks_sent(&self, step: &str, count: usize) {
        if let Ok(sink) = self.0.lock() {
            for _ in 0..count {
                sink.progress.task_started(step);
            }
        }
    }
}

/// A short label for an item: its `id` (a CSV file's id column, or an `id` key), a short
/// string item itself, else its index (as in `results.jsonl`, from 0).
pub(super) fn item_label(item: &Value, index: u64) -> String {
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

/// Runs the pipeline to the end (or to an interruption).
pub(crate) fn run_pipeline(
    env: &Env,
    config: Config,
    catalog: Catalog,
    options: RunOptions,
) -> Result<RunSummary> {
    let opened = OpenRun::open(env, &config, catalog, &options.pipeline, &options)?;
    let pipeline = Arc::new(options.pipeline);
    let plan = options.plan;
    let progress = Arc::new(Progress::new(options.display));
    let screen: Arc<dyn crate::process::groups::Screen> = progress.clone();
    crate::process::groups::stop_on_exit(Arc::downgrade(&screen));
    add_steps(&progress, &pipeline, &plan);
    let report = new_report(&config, &pipeline);
    let run_started = report.started();
    let OpenRun {
        store,
        run,
        path_text,
        catalog,
        finished,
        reusable,
        journal,
        committed,
        results,
        already_written,
    } = opened;
    let agents = Arc::new(agents_json(&catalog));
    let sink = Arc::new(Mutex::new(Sink {
        journal,
        results,
        report,
        junit: options
            .junit
            .as_ref()
            .map(|_| JunitWriter::new(pipeline.name.clone())),
        progress: Arc::clone(&progress),
        step_ids: pipeline.steps.iter().map(|s| s.id.clone()).collect(),
        already_written,
        recorded: 0,
        tasks: plan.writes_manifest().then(Vec::new),
        levels: HashMap::new(),
        tables: crate::output::Tables::new(&pipeline, store.dir())?,
    }));
    let concurrency = options
        .concurrency
        .or(pipeline.settings.concurrency)
        .unwrap_or(DEFAULT_CONCURRENCY)
        .max(1);
    let shared = Arc::new(Shared {
        env: env.clone(),
        config,
        catalog,
        resolver: crate::delegation::Resolver::default(),
        clients: Mutex::new(HashMap::new()),
        global: Arc::new(Semaphore::new(concurrency)),
        settings: pipeline.settings.clone(),
        finished,
        reusable,
        reuse_all: options.reuse,
        drain: CancellationToken::new(),
        kill: CancellationToken::new(),
        policy: RetryPolicy::from_env(env),
        retries: Mutex::default(),
        committed,
        run_id: run.run_id.clone(),
        run_started,
        batch_all: options.batch,
        display: Arc::clone(&progress),
    });
    let outputs = Arc::new(StepOutputs::new(pipeline.steps.len()));
    let params = Arc::new(options.params);
    let context = RunContext {
        shared: Arc::clone(&shared),
        pipeline: Arc::clone(&pipeline),
        outputs: Arc::clone(&outputs),
        params: Arc::clone(&params),
        agents: Arc::clone(&agents),
        sink: Arc::clone(&sink),
    };
    // One thread drives every task: the work per task is small and mostly waiting, and one
    // thread spends less CPU and memory per task than a work-stealing pool (the journal and
    // `results.jsonl` have their own threads; tools and commands run on the blocking pool).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if let Err(message) = runtime.block_on(super::reduce::check_foreseen(
        &shared, &pipeline, &params, &agents,
    )) {
        progress.finish();
        store.set_run_status(&run.run_id, crate::store::RunStatus::Failed)?;
        return Err(Error::Failed(message));
    }
    let graph = Graph::new(&pipeline);
    let ends = runtime.block_on(Dispatcher::new(&graph, &plan, context, progress).run());
    crate::env::crash_point("steps-done");
    // Every step has ended: the sink is taken back whole.
    let sink = match Arc::try_unwrap(sink) {
        Ok(sink) => sink
            .into_inner()
            .map_err(|_| Error::internal("output sink"))?,
        Err(_) => return Err(Error::internal("output sink still in use")),
    };
    let finish = Finish {
        env,
        pipeline: &pipeline,
        graph: &graph,
        plan: &plan,
        shared: &shared,
        outputs: &outputs,
        params: &params,
        agents: &agents,
        out_dir: options.out_dir.as_deref(),
        junit: options.junit.as_ref(),
        resuming: options.resume.is_some(),
        store: &store,
        run_id: &run.run_id,
        path_text: &path_text,
    };
    finish.run(sink, ends)
}

/// The display's line for every step that sends tasks; a decompose from a command, list,
/// file or glob sends none.
fn add_steps(progress: &Progress, pipeline: &Pipeline, plan: &Plan) {
    for (i, step) in pipeline.steps.iter().enumerate() {
        if matches!(plan.role(i), Role::Run | Role::Shard)
            && !matches!(&step.kind, StepKind::Decompose(d) if !matches!(d, Decompose::Agent(_)))
        {
            // A one-task step's total is known; a fan-out's once its items are.
            let total =
                matches!(step.kind, StepKind::Synthesize(_) | StepKind::Delegate(_)).then_some(1);
            progress.add_step(&step.id, total);
        }
    }
}

/// The run's report, with every step's sandbox.
fn new_report(config: &Config, pipeline: &Pipeline) -> Report {
    let prices = config
        .prices
        .iter()
        .map(|(model, price)| (model.clone(), price.value))
        .collect();
    let mut report = Report::new(prices);
    for (i, step) in pipeline.steps.iter().enumerate() {
        let level = StepConfig::new(i, step, &pipeline.settings).sandbox;
        let effective = crate::sandbox::Sandbox::pick(&[level, (config.sandbox, config.network)]);
        report.set_sandbox(&step.id, effective);
    }
    report
}
