//! The run: steps start when the steps they depend on have finished, independent steps run
//! at the same time, and one sink owns the outputs (journal, `results.jsonl`, report, JUnit,
//! progress).
//!
//! ```text
//! ready steps --spawn--> run_step --tasks--> run_tasks (global + step semaphores)
//!                                   \--TaskDone--> Sink (journal, results, report, progress)
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indexmap::IndexMap;
use jiff::Timestamp;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::context::{StepData, StepOutputs, agents_json, base_context};
use super::event::{RunSummary, StepStatus, TaskDone};
use super::final_text::{FinalText, FinalTextBuilder};
use super::shard::{Plan, TaskRef};
use super::step::{Shared, StepConfig, TaskContext, run_tasks};
use super::step_error::StepError;
use crate::config::Config;
use crate::env::Env;
use crate::error::{Error, Result};
use crate::output::{DisplayMode, JunitWriter, Progress, Report, ResultLine, ResultsWriter};
use crate::pipeline::items::{command_items, glob_items, open_file_items};
use crate::pipeline::model::{Backend, Decompose, OnError, OutputBody, Pipeline, StepKind};
use crate::pipeline::shard::Role;
use crate::provider::RetryPolicy;
use crate::source::Catalog;
use crate::store::{JournalStatus, JournalWriter, RunStatus, Store, TaskResultRow, WriterOptions};

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
struct Sink {
    journal: JournalWriter,
    results: Option<ResultsWriter>,
    report: Report,
    junit: Option<JunitWriter>,
    progress: Progress,
    step_ids: Vec<String>,
    /// Results already in `results.jsonl` from before a resume.
    already_written: std::collections::HashSet<(String, u64)>,
    /// Journal rows recorded so far; a row's number is its position in commit order.
    recorded: u64,
    /// Every task of the run, for a shard's or `--until` run's manifest.
    tasks: Option<Vec<TaskRef>>,
    /// The tasks of each reducing step's levels so far (its progress total).
    levels: HashMap<String, u64>,
    /// The rows of the table `outputs`.
    tables: crate::output::Tables,
}

impl Sink {
    /// Records a finished task everywhere; returns its journal row number (none for a
    /// result taken from the journal).
    fn record(&mut self, done: &TaskDone) -> Option<u64> {
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
                eprintln!("summon: warning: cannot journal a result: {e}");
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
                eprintln!("summon: warning: cannot write results.jsonl: {e}");
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
struct SinkReporter<'a>(&'a Arc<Mutex<Sink>>);

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
    let pipeline = Arc::new(options.pipeline);
    let store = Store::open_for(&env.cwd)?;
    let pipeline_path = pipeline
        .file
        .path()
        .canonicalize()
        .unwrap_or_else(|_| pipeline.file.path().to_path_buf());
    let path_text = pipeline_path.display().to_string();
    let params_json = serde_json::to_string(&options.params).unwrap_or_default();
    let pipeline_hash = super::hash::request_hash(&[Some(&pipeline.file.text)]);
    let plan = options.plan;
    let journal_tag = plan.journal_tag();
    let (run, finished, catalog) = match &options.resume {
        None => {
            // The catalog is frozen into the journal for `--resume`.
            let run = store.create_run(
                &path_text,
                &pipeline_hash,
                &params_json,
                &crate::source::freeze(&catalog).to_string(),
                journal_tag.as_deref(),
            )?;
            (run, HashMap::new(), catalog)
        }
        Some(wanted) => {
            let run = match wanted {
                Some(id) => store.get_run(id)?,
                None => store.last_run_of_shard(&path_text, journal_tag.as_deref())?,
            };
            let Some(run) = run else {
                return Err(Error::usage(match wanted {
                    Some(id) if store.was_pruned(id).unwrap_or(false) => format!(
                        "run `{id}` was pruned by retention (store.keep_runs, store.keep_days) \
                         and cannot be resumed; `summon runs` lists the runs kept"
                    ),
                    Some(id) => format!("no run `{id}` to resume; `summon runs` lists the runs"),
                    None => format!(
                        "no earlier run of `{}` to resume",
                        pipeline.file.path().display()
                    ),
                }));
            };
            if run.params_json != params_json {
                return Err(Error::usage(format!(
                    "run {} used other parameters ({}); resume it with the same --param values",
                    run.run_id, run.params_json
                )));
            }
            if run.shard != journal_tag {
                let describe =
                    |tag: Option<&str>| tag.map_or("a whole run".to_owned(), |t| format!("`{t}`"));
                return Err(Error::usage(format!(
                    "run {} is {}, not {}; resume it with the same --shard/--until",
                    run.run_id,
                    describe(run.shard.as_deref()),
                    describe(journal_tag.as_deref())
                )));
            }
            store.set_run_status(&run.run_id, RunStatus::Running)?;
            let finished = store.finished(&run.run_id)?;
            // The run's own catalog, not a new scan.
            let frozen: Value = serde_json::from_str(&run.catalog_json).unwrap_or(Value::Null);
            let catalog = if frozen.is_array() {
                crate::source::thaw(&frozen)
            } else {
                catalog
            };
            (run, finished, catalog)
        }
    };
    let defaults = run_defaults(env, &config);
    // The absolute --out, so that two runs into one directory are seen as such.
    let out_text = options
        .out_dir
        .as_ref()
        .map(|d| absolute(&env.cwd.join(d)).display().to_string());
    let setup = serde_json::json!({
        "out": options.out_dir.as_ref().map(|d| d.display().to_string()),
        "junit": options.junit.as_ref().map(|j| j.display().to_string()),
        "concurrency": options.concurrency,
    });
    store.set_run_setup(
        &run.run_id,
        out_text.as_deref(),
        &setup.to_string(),
        &defaults,
    )?;
    hold(&store, &run, options.resume.is_none(), options.wait)?;
    let reuse_any = options.reuse || pipeline.steps.iter().any(|s| s.reuse);
    let reusable = if reuse_any {
        store.reusable(&path_text, &run.run_id, &defaults)?
    } else {
        HashMap::new()
    };
    crate::env::crash_point("run-created");
    let agents = agents_json(&catalog);
    let (commit_sender, committed) = tokio::sync::watch::channel(0u64);
    let hook = Box::new(move |rows: &[TaskResultRow]| {
        commit_sender.send_modify(|n| *n += rows.len() as u64);
    });
    // Group commit: each commit takes every row recorded while the previous one ran.
    let writer_options = WriterOptions {
        max_rows: 4096,
        max_delay: Duration::ZERO,
        on_commit: Some(hook),
    };
    let journal = store.journal_writer(&run.run_id, writer_options)?;
    let resuming = options.resume.is_some();
    let (results, already_written) = match &options.out_dir {
        Some(dir) => {
            let dir = env.cwd.join(dir);
            std::fs::create_dir_all(&dir)?;
            if plan.writes_manifest() {
                // A manifest describes a finished run: the old one goes until this one ends.
                super::shard::remove_manifest(&dir)?;
            }
            let written = if resuming {
                crate::output::read_results(&dir).unwrap_or_default()
            } else {
                Default::default()
            };
            (Some(ResultsWriter::create(&dir, resuming)?), written)
        }
        None => (None, Default::default()),
    };
    let progress = Progress::new(options.display);
    // Steps that send tasks; a decompose from a command, list, file or glob sends none.
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
    let mut report = Report::new(config_prices(&config));
    for (i, step) in pipeline.steps.iter().enumerate() {
        let level = StepConfig::new(i, step, &pipeline.settings).sandbox;
        let effective = crate::sandbox::Sandbox::pick(&[level, (config.sandbox, config.network)]);
        report.set_sandbox(&step.id, effective);
    }
    let run_started = report.started();
    let sink = Arc::new(Mutex::new(Sink {
        journal,
        results,
        report,
        junit: options
            .junit
            .as_ref()
            .map(|_| JunitWriter::new(pipeline.name.clone())),
        progress,
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
        on_start: {
            // Weak: the sink is taken back whole when the run ends.
            let sink = Arc::downgrade(&sink);
            Box::new(move |step| {
                if let Some(sink) = sink.upgrade()
                    && let Ok(sink) = sink.lock()
                {
                    sink.progress.task_started(&sink.step_ids[step]);
                }
            })
        },
    });
    // One thread drives every task: the work per task is small and mostly waiting, and one
    // thread spends less CPU and memory per task than a work-stealing pool (the journal and
    // `results.jsonl` have their own threads; tools and commands run on the blocking pool).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let graph = crate::pipeline::graph::Graph::new(&pipeline);
    let deps: Vec<Vec<usize>> = (0..pipeline.steps.len())
        .map(|i| graph.deps(i).to_vec())
        .collect();
    let keep_results: Arc<Vec<bool>> = Arc::new(
        (0..pipeline.steps.len())
            .map(|i| graph.results_needed(i))
            .collect(),
    );
    let last_step = pipeline.steps.len().saturating_sub(1);
    let outputs = Arc::new(StepOutputs::new(pipeline.steps.len()));
    let params = Arc::new(options.params.clone());
    let agents = Arc::new(agents);
    if let Err(message) = runtime.block_on(super::reduce::check_foreseen(
        &shared, &pipeline, &params, &agents,
    )) {
        sink.lock()
            .map_err(|_| Error::internal("output sink"))?
            .progress
            .finish();
        store.set_run_status(&run.run_id, RunStatus::Failed)?;
        return Err(Error::Failed(message));
    }
    let statuses = runtime.block_on(async {
        let signals = {
            let shared = Arc::clone(&shared);
            // Weak: the sink is taken back whole when the run ends.
            let sink = Arc::downgrade(&sink);
            tokio::spawn(async move {
                if tokio::signal::ctrl_c().await.is_ok() {
                    // Through the display, so that its bars are drawn once, below the line.
                    let line = "summon: interrupted: finishing the tasks in flight (Ctrl-C again to stop them)";
                    match sink.upgrade() {
                        Some(sink) => match sink.lock() {
                            Ok(sink) => sink.progress.interrupted(line),
                            Err(_) => eprintln!("{line}"),
                        },
                        None => eprintln!("{line}"),
                    }
                    shared.drain.cancel();
                    if tokio::signal::ctrl_c().await.is_ok() {
                        shared.kill.cancel();
                    }
                }
            })
        };
        let n = pipeline.steps.len();
        let mut status: Vec<Option<(StepStatus, Option<String>)>> = vec![None; n];
        let mut started = vec![false; n];
        let mut running = JoinSet::new();
        // The step each task runs: a task that panics is known only by its id.
        let mut step_of: HashMap<tokio::task::Id, usize> = HashMap::new();
        loop {
            let mut progressed = false;
            for i in 0..n {
                if started[i] || !deps[i].iter().all(|d| status[*d].is_some()) {
                    continue;
                }
                started[i] = true;
                progressed = true;
                match plan.role(i) {
                    Role::Given => {
                        status[i] = Some(start_given(&plan, i, &outputs, &sink));
                        continue;
                    }
                    Role::Merge | Role::Skip => {
                        status[i] = Some((StepStatus::Deferred, None));
                        continue;
                    }
                    Role::Run | Role::Shard => {}
                }
                let shard = plan.step_shard(i);
                if deps[i].iter().any(|d| status[*d].as_ref().is_some_and(|(s, _)| *s != StepStatus::Succeeded))
                    || shared.drain.is_cancelled()
                {
                    status[i] = Some((StepStatus::Skipped, None));
                    continue;
                }
                let keep = keep_results[i];
                // The final step's text is kept only to be printed.
                let prints_text = i == last_step && plan.prints_output();
                let (shared, pipeline, outputs, params, agents, sink) = (
                    Arc::clone(&shared),
                    Arc::clone(&pipeline),
                    Arc::clone(&outputs),
                    Arc::clone(&params),
                    Arc::clone(&agents),
                    Arc::clone(&sink),
                );
                if let Ok(mut sink) = sink.lock() {
                    sink.report.step_started(&pipeline.steps[i].id);
                }
                let task = running.spawn(async move {
                    run_step(&shared, &pipeline, i, keep, prints_text, &outputs, &params, &agents, &sink, shard).await
                });
                step_of.insert(task.id(), i);
            }
            if status.iter().all(Option::is_some) {
                break;
            }
            if running.is_empty() {
                // Skips may have unblocked more steps; go round again, unless this round
                // started nothing (then nothing ever will: the steps left are skipped).
                if !progressed || status.iter().zip(&started).all(|(s, st)| s.is_some() || *st) {
                    break;
                }
                continue;
            }
            let Some(joined) = running.join_next_with_id().await else {
                continue;
            };
            let (i, outcome) = step_outcome(joined, &step_of);
            let Some(i) = i else {
                continue;
            };
            status[i] = Some(outcome);
            if let Ok(mut sink) = sink.lock() {
                sink.progress.step_finished(&pipeline.steps[i].id);
                sink.report.step_finished(&pipeline.steps[i].id);
            }
        }
        signals.abort();
        status
    });
    crate::env::crash_point("steps-done");
    let interrupted = shared.drain.is_cancelled();
    // Flush everything that records results before deciding the outcome.
    let mut sink = match Arc::try_unwrap(sink) {
        Ok(sink) => sink
            .into_inner()
            .map_err(|_| Error::internal("output sink"))?,
        Err(_) => return Err(Error::internal("output sink still in use")),
    };
    sink.progress.finish();
    sink.journal.flush()?;
    if let Some(results) = &mut sink.results {
        results.flush()?;
    }
    drop(sink.results.take());
    if let (Some(dir), true) = (&options.out_dir, resuming) {
        compact_results(&env.cwd.join(dir))?;
    }
    if let Ok(retries) = shared.retries.lock() {
        sink.report.set_retries(&retries);
    }
    // One clock for report.json and the report kept in the run history.
    sink.report.finish();
    sink.report
        .set_pipeline(pipeline_graph(&pipeline, &deps, &statuses, &run.run_id));
    if let Some(dir) = &options.out_dir {
        let dir = env.cwd.join(dir);
        sink.report.write_json(&dir.join("report.json"))?;
        // The page is a view of the two files: a problem with it does not change the run.
        if let Err(e) = crate::output::write_html(&dir) {
            eprintln!(
                "summon: warning: cannot write {}: {e}",
                crate::output::HTML_FILE
            );
        }
    }
    if let (Some(junit), Some(path)) = (&sink.junit, &options.junit) {
        junit.write(&env.cwd.join(path))?;
    }
    let steps: Vec<(String, StepStatus, Option<String>)> = pipeline
        .steps
        .iter()
        .zip(statuses)
        .map(|(s, st)| {
            let (status, error) = st.unwrap_or((StepStatus::Skipped, None));
            (s.id.clone(), status, error)
        })
        .collect();
    // A shard leaves steps for the merge, `--until` the steps after it: the run can succeed,
    // but the pipeline's outputs need every step.
    let all_ok = steps
        .iter()
        .all(|(_, s, _)| matches!(s, StepStatus::Succeeded | StepStatus::Deferred));
    let whole = steps.iter().all(|(_, s, _)| *s == StepStatus::Succeeded);
    // A part of a run (a shard, `--until`) has only some of the rows: the merge writes them.
    if whole && !interrupted && plan.prints_output() {
        write_outputs(env, &pipeline, &outputs, &params, &agents, &mut sink.tables)?;
    }
    if let (true, Some(dir)) = (plan.writes_manifest(), &options.out_dir) {
        let finished = super::shard::Finished {
            pipeline: &pipeline,
            params: &params,
            plan: &plan,
            statuses: &steps,
            outputs: &outputs,
            tasks: sink.tasks.as_deref().unwrap_or_default(),
            interrupted,
        };
        super::shard::write_manifest(&env.cwd.join(dir), &finished)?;
    }
    let run_status = if interrupted {
        RunStatus::Interrupted
    } else if all_ok {
        RunStatus::Completed
    } else {
        RunStatus::Failed
    };
    store.set_run_status(&run.run_id, run_status)?;
    if let Err(e) = store.set_run_report(&run.run_id, &sink.report.to_json()) {
        eprintln!("summon: warning: cannot record the run's report: {e}");
    }
    prune(&store, &shared.config, &path_text, &run.run_id);
    let last = pipeline.steps.len().saturating_sub(1);
    let final_output = if plan.prints_output() {
        outputs
            .take_final()
            .or_else(|| outputs_final(&outputs.get(last)).map(FinalText::Memory))
    } else {
        None
    };
    let summary_line = sink.report.summary_line();
    eprintln!("summon: {summary_line}");
    Ok(RunSummary {
        run_id: run.run_id,
        steps,
        final_output,
        interrupted,
        report: sink.report.to_json(),
        summary_line,
    })
}

/// The `pipeline` key of `report.json`: each step with its kind, the steps it depends on
/// and how it ended.
fn pipeline_graph(
    pipeline: &Pipeline,
    deps: &[Vec<usize>],
    statuses: &[Option<(StepStatus, Option<String>)>],
    run_id: &str,
) -> Value {
    let steps: Vec<Value> = pipeline
        .steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let status = statuses
                .get(i)
                .and_then(Option::as_ref)
                .map_or(StepStatus::Skipped, |(s, _)| *s);
            json!({
                "id": step.id,
                "kind": step.kind.name(),
                "needs": deps[i].iter().map(|d| &pipeline.steps[*d].id).collect::<Vec<_>>(),
                "status": status.name(),
            })
        })
        .collect();
    json!({ "name": pipeline.name, "run_id": run_id, "steps": steps })
}

/// Takes the run for this process. Another live run of the same pipeline refuses it (or,
/// with `wait`, is waited for); a run left `running` by a killed process is taken over.
fn hold(store: &Store, run: &crate::store::RunRecord, fresh: bool, wait: bool) -> Result<()> {
    let pid = std::process::id();
    let mut told = false;
    loop {
        let held = store.hold_run(
            &run.run_id,
            pid,
            fresh && !wait,
            crate::background::pid_alive,
        )?;
        let Some(held) = held else {
            return Ok(());
        };
        if !wait {
            return Err(Error::Busy(if held.same_pipeline {
                format!(
                    "run {} of this pipeline is still running (pid {}); wait for it with \
                     --wait, or stop it first",
                    held.run_id, held.pid
                )
            } else {
                format!(
                    "run {} (pid {}) is writing the same --out directory; use another \
                     --out, or wait for it with --wait",
                    held.run_id, held.pid
                )
            }));
        }
        if !told {
            eprintln!(
                "summon: waiting for run {} of this pipeline to end (pid {})",
                held.run_id, held.pid
            );
            told = true;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `path` without `.` and `..` components (the directory may not exist yet).
fn absolute(path: &std::path::Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// What picks the default provider and model of a run: answers are reused only from runs
/// where it was the same.
fn run_defaults(env: &Env, config: &Config) -> String {
    let vars = [
        "SUMMON_SUBAGENT_PROVIDER",
        "SUMMON_SUBAGENT_MODEL",
        "SUMMON_PROVIDER",
        "SUMMON_MODEL",
        "OPENAI_BASE_URL",
        "ANTHROPIC_BASE_URL",
        "OLLAMA_HOST",
    ];
    let mut map = serde_json::Map::new();
    for var in vars {
        if let Some(value) = env.var(var) {
            map.insert(var.to_owned(), Value::from(value));
        }
    }
    for (key, value) in [
        ("default_provider", &config.default_provider),
        ("default_model", &config.default_model),
    ] {
        if let Some(value) = value {
            map.insert(key.to_owned(), Value::from(value.value.as_str()));
        }
    }
    Value::Object(map).to_string()
}

/// Drops the runs of this pipeline that the retention settings do not keep, and the space
/// they took. A failure here costs only disk space: a warning.
fn prune(store: &Store, config: &Config, pipeline: &str, run_id: &str) {
    let mut retention = crate::store::Retention::default();
    if let Some(keep) = config.keep_runs {
        retention.keep = usize::try_from(keep).unwrap_or(usize::MAX);
    }
    if let Some(days) = config.keep_days {
        retention.keep_for = Duration::from_secs_f64(days * 86_400.0);
    }
    match store.prune_runs(Some(pipeline), retention, Some(run_id)) {
        Ok(pruned) if pruned.runs > 0 => {
            if let Err(e) = store.reclaim_space() {
                eprintln!("summon: warning: cannot reclaim the store's space: {e}");
            }
        }
        Ok(_) => {}
        Err(e) => eprintln!("summon: warning: cannot prune old runs: {e}"),
    }
}

/// The step a finished step task ran and how it ended. A task that panicked is a failed step
/// (its dependents are skipped like those of any failed step), never one left without a status.
fn step_outcome(
    joined: std::result::Result<
        (tokio::task::Id, std::result::Result<(), StepError>),
        tokio::task::JoinError,
    >,
    step_of: &HashMap<tokio::task::Id, usize>,
) -> (Option<usize>, (StepStatus, Option<String>)) {
    match joined {
        Ok((id, result)) => (
            step_of.get(&id).copied(),
            match result {
                Ok(()) => (StepStatus::Succeeded, None),
                Err(error) => (StepStatus::Failed, Some(error.to_string())),
            },
        ),
        Err(error) => (
            step_of.get(&error.id()).copied(),
            (StepStatus::Failed, Some(StepError::Panicked.to_string())),
        ),
    }
}

/// Keeps the last line of every task in `results.jsonl` (a task that ran again after a
/// resume replaces its earlier line), in first-seen order.
fn compact_results(dir: &std::path::Path) -> Result<()> {
    let path = dir.join(crate::output::RESULTS_FILE);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    let mut order: Vec<(String, u64)> = Vec::new();
    let mut lines: HashMap<(String, u64), &str> = HashMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(value) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let key = (
            value["step"].as_str().unwrap_or_default().to_owned(),
            value["index"].as_u64().unwrap_or_default(),
        );
        if lines.insert(key.clone(), line).is_none() {
            order.push(key);
        }
    }
    let mut out = String::with_capacity(text.len());
    for key in &order {
        out.push_str(lines[key]);
        out.push('\n');
    }
    crate::output::write_atomically(&path, out.as_bytes())?;
    Ok(())
}

/// A step whose outcome is given (`--items-from`, or the shards of a merge): its data for
/// later steps and, unless this is a shard, its tasks in the outputs.
fn start_given(
    plan: &Plan,
    index: usize,
    outputs: &StepOutputs,
    sink: &Mutex<Sink>,
) -> (StepStatus, Option<String>) {
    let Some(given) = plan.given(index) else {
        return (StepStatus::Skipped, None);
    };
    outputs.set(index, given.data.clone());
    if plan.emits_given()
        && let Ok(mut sink) = sink.lock()
    {
        let id = sink.step_ids[index].clone();
        sink.report.step_started(&id);
        for record in &given.records {
            sink.record(&record.to_done(index));
        }
        sink.report.step_finished(&id);
    }
    (given.status, given.error.clone())
}

fn outputs_final(data: &StepData) -> Option<String> {
    if let Some(output) = &data.output {
        return Some(output.clone());
    }
    data.results.as_ref().map(|results| {
        results
            .iter()
            .filter_map(|r| r["output"].as_str())
            .collect::<Vec<_>>()
            .join("\n\n")
    })
}

fn config_prices(config: &Config) -> HashMap<String, crate::config::file::Price> {
    config
        .prices
        .iter()
        .map(|(model, price)| (model.clone(), price.value))
        .collect()
}

/// Whether any template reads `steps.<id>.items`.
pub(super) fn items_read(pipeline: &Pipeline, id: &str) -> bool {
    let text = &pipeline.file.text;
    text.contains(&format!("steps.{id}.items"))
        || text.contains(&format!("steps[\"{id}\"].items"))
        || text.contains(&format!("steps['{id}'].items"))
}

/// Runs one step; `Err` carries why it failed.
#[allow(clippy::too_many_arguments)] // the run's shared state, borrowed for one step
async fn run_step(
    shared: &Arc<Shared>,
    pipeline: &Pipeline,
    index: usize,
    keep_results: bool,
    prints_text: bool,
    outputs: &StepOutputs,
    params: &IndexMap<String, String>,
    agents: &Value,
    sink: &Arc<Mutex<Sink>>,
    shard: Option<crate::pipeline::shard::Shard>,
) -> std::result::Result<(), StepError> {
    let step = &pipeline.steps[index];
    crate::env::step_panic_point(&step.id);
    let mut config =
        StepConfig::new(index, step, &shared.settings).with_cache(&shared.config, &pipeline.name);
    config.shard = shard;
    config.reuse |= shared.reuse_all;
    let base = base_context(params, outputs.to_json(pipeline), agents);
    let env = crate::template::environment(pipeline.file.path().parent());
    let render_plain =
        |t: &crate::pipeline::model::Template| -> std::result::Result<String, String> {
            env.render_str(&t.text, &base)
                .map_err(|e| super::step::render_error(t, &e))
        };
    let cwd = shared.env.cwd.clone();
    let mut failures = 0usize;
    let mut successes = 0usize;
    let mut results: Vec<(u64, Value)> = Vec::new();
    // The final step's text goes to stdout: keep only the outputs, in order.
    // Spilled text goes beside the run's store, which is open by now.
    let project =
        crate::store::find_project(&shared.env.cwd).unwrap_or_else(|| shared.env.cwd.clone());
    let mut final_text = FinalTextBuilder::new(project.join(crate::store::DIR_NAME));
    let mut single_output: Option<String> = None;
    let mut single_structured: Option<Value> = None;
    let fail_fast = step.on_error == OnError::FailFast;
    let mut first_error: Option<String> = None;
    let mut on_done = |done: TaskDone| -> (bool, Option<u64>) {
        let seq = sink.lock().ok().and_then(|mut sink| sink.record(&done));
        if done.ok {
            successes += 1;
        } else {
            failures += 1;
            if first_error.is_none() {
                first_error = Some(format!(
                    "task {} failed: {}",
                    done.index,
                    done.error.clone().unwrap_or_default()
                ));
            }
        }
        if prints_text && !keep_results {
            final_text.push(done.index, &done.output);
        }
        if keep_results {
            results.push((
                done.index,
                json!({"item": done.item, "output": done.output, "status": if done.ok { "completed" } else { "failed" }, "data": done.structured}),
            ));
        }
        single_output = Some(done.output.clone());
        single_structured.clone_from(&done.structured);
        (!fail_fast || done.ok, seq)
    };
    let single =
        |items: Vec<Value>| -> Box<dyn Iterator<Item = std::result::Result<Value, String>> + Send> {
            Box::new(items.into_iter().map(Ok))
        };
    match &step.kind {
        StepKind::Decompose(decompose) => {
            let items: Vec<Value> = match decompose {
                Decompose::Items(list) => list.clone(),
                Decompose::Command(t) => {
                    let command = render_plain(t)?;
                    let cwd = cwd.clone();
                    tokio::task::spawn_blocking(move || {
                        command_items(&command, &cwd, Duration::from_secs(600))
                    })
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?
                }
                Decompose::Glob(t) => {
                    glob_items(&render_plain(t)?, &cwd).map_err(|e| e.to_string())?
                }
                Decompose::File(t) => {
                    let path = cwd.join(render_plain(t)?.trim());
                    let reader = open_file_items(&path).map_err(|e| e.to_string())?;
                    if !items_read(pipeline, &step.id) {
                        // Checked now (it opens), streamed by the fan-out later.
                        drop(reader);
                        outputs.set(
                            index,
                            StepData {
                                file: Some(path),
                                ..StepData::default()
                            },
                        );
                        return Ok(());
                    }
                    reader
                        .map(|r| r.map_err(|e| e.to_string()))
                        .collect::<std::result::Result<_, _>>()?
                }
                Decompose::Agent(task) => {
                    let schema = json!({"type": "array"});
                    let mut iter = single(vec![Value::Null]);
                    run_tasks(
                        shared,
                        &config,
                        task,
                        &base,
                        &mut *iter,
                        TaskContext::Shared,
                        Some(schema),
                        Some(1),
                        &env,
                        &mut on_done,
                    )
                    .await?;
                    if failures > 0 {
                        return Err(first_error.unwrap_or_default().into());
                    }
                    match single_structured.take() {
                        Some(Value::Array(items)) => items,
                        _ => {
                            return Err(StepError::Failed(
                                "the decompose subagent did not answer with a JSON array".into(),
                            ));
                        }
                    }
                }
            };
            outputs.set(
                index,
                StepData {
                    items: Some(items),
                    ..StepData::default()
                },
            );
            Ok(())
        }
        StepKind::FanOut(fan_out) => {
            let over = pipeline
                .steps
                .iter()
                .position(|s| s.id == fan_out.over)
                .ok_or_else(|| format!("unknown step `{}`", fan_out.over))?;
            let over_data = outputs.get(over);
            let mut iter: Box<dyn Iterator<Item = std::result::Result<Value, String>> + Send> =
                match &over_data.file {
                    Some(path) => {
                        let first_pass = open_file_items(path).map_err(|e| e.to_string())?;
                        let mut total = 0usize;
                        let mut names_checked = Ok(());
                        if fan_out
                            .task
                            .source
                            .as_ref()
                            .is_some_and(|s| crate::template::has_template(&s.text))
                        {
                            let items: Vec<Value> =
                                first_pass.filter_map(std::result::Result::ok).collect();
                            total = items.len();
                            names_checked =
                                check_sources(shared, &env, &fan_out.task, &base, &items);
                        } else {
                            total += first_pass.count();
                        }
                        names_checked?;
                        if let (Ok(sink), None) = (sink.lock(), shard) {
                            sink.progress.set_total(&step.id, total as u64);
                        }
                        let reader = open_file_items(path).map_err(|e| e.to_string())?;
                        Box::new(reader.map(|r| r.map_err(|e| e.to_string())))
                    }
                    None => {
                        let items = over_data.items.unwrap_or_default();
                        check_sources(shared, &env, &fan_out.task, &base, &items)?;
                        if let (Ok(sink), None) = (sink.lock(), shard) {
                            sink.progress.set_total(&step.id, items.len() as u64);
                        }
                        single(items)
                    }
                };
            if step.backend == Backend::Batch || shared.batch_all {
                super::batch::run_batch_tasks(
                    shared,
                    &config,
                    &fan_out.task,
                    &base,
                    &mut *iter,
                    step.concurrency,
                    &env,
                    &SinkReporter(sink),
                    &mut on_done,
                )
                .await?;
            } else {
                run_tasks(
                    shared,
                    &config,
                    &fan_out.task,
                    &base,
                    &mut *iter,
                    TaskContext::PerItem,
                    None,
                    step.concurrency,
                    &env,
                    &mut on_done,
                )
                .await?;
            }
            let total = successes + failures;
            if total == 0 && shard.is_none() && !shared.drain.is_cancelled() {
                super::step::warn_once(
                    &step.id,
                    &format!(
                        "`{}` gave no items, so this step sent nothing",
                        fan_out.over
                    ),
                );
            }
            results.sort_by_key(|(i, _)| *i);
            let needed = match (step.min_success, step.on_error) {
                // A shard has only part of the tasks: `summon merge` counts them all.
                (Some(_), _) if shard.is_some() => 0,
                (Some(min), _) => min.required(total),
                (None, OnError::Continue) => 0,
                (None, OnError::FailFast) => total,
            };
            let ok = successes >= needed
                && !(step.on_error == OnError::FailFast
                    && step.min_success.is_none()
                    && failures > 0);
            // No template reads the text of this step (it keeps its results when one
            // does): it is only printed, from where it is.
            if let Some(text) = final_text.finish().map_err(StepError::KeepText)? {
                outputs.set_final(text);
            }
            outputs.set(
                index,
                StepData {
                    results: keep_results.then(|| results.into_iter().map(|(_, v)| v).collect()),
                    ..StepData::default()
                },
            );
            if ok && !shared.drain.is_cancelled() {
                Ok(())
            } else if shared.drain.is_cancelled() && failures == 0 {
                Err(StepError::interrupted())
            } else if shared.drain.is_cancelled() {
                // `min_success` is for the whole step: not judged on the part that ran.
                Err(StepError::Interrupted {
                    ran: Some((successes, total)),
                    first_error: first_error.unwrap_or_default(),
                })
            } else {
                Err(StepError::TooFewSucceeded {
                    succeeded: successes,
                    total,
                    needed,
                    first_error: first_error.unwrap_or_default(),
                })
            }
        }
        StepKind::Synthesize(task) | StepKind::Delegate(task) => {
            if let Some(reduce) = &step.reduce {
                let reduction = super::reduce::Reduction {
                    shared,
                    pipeline,
                    step,
                    config: &config,
                    task,
                    reduce,
                    steps: outputs.to_json(pipeline),
                    params,
                    agents,
                    env: &env,
                };
                if let Some(output) = reduction.run(sink).await? {
                    outputs.set(
                        index,
                        StepData {
                            output: Some(output),
                            ..StepData::default()
                        },
                    );
                    return Ok(());
                }
            }
            let mut iter = single(vec![Value::Null]);
            run_tasks(
                shared,
                &config,
                task,
                &base,
                &mut *iter,
                TaskContext::Shared,
                None,
                Some(1),
                &env,
                &mut on_done,
            )
            .await?;
            outputs.set(
                index,
                StepData {
                    output: single_output.clone(),
                    data: single_structured.clone(),
                    ..StepData::default()
                },
            );
            if failures > 0 {
                Err(first_error.unwrap_or_default().into())
            } else if single_output.is_none() {
                Err(StepError::interrupted())
            } else {
                Ok(())
            }
        }
    }
}

/// Every source name a templated `source:` renders to must be in the run's catalog before
/// any task of the step is sent.
fn check_sources(
    shared: &Shared,
    env: &minijinja::Environment<'_>,
    task: &crate::pipeline::model::TaskTemplate,
    base: &minijinja::Value,
    items: &[Value],
) -> std::result::Result<(), String> {
    let Some(source) = task
        .source
        .as_ref()
        .filter(|s| crate::template::has_template(&s.text))
    else {
        return Ok(());
    };
    let template = env
        .template_from_str(&source.text)
        .map_err(|e| super::step::render_error(source, &e))?;
    for (index, item) in items.iter().enumerate() {
        let ctx = super::context::item_context(base, item, index as u64);
        let name = template
            .render(&ctx)
            .map_err(|e| super::step::render_error(source, &e))?;
        if let Some(name) = super::step::named_source(&name)
            && shared.catalog.get(name).is_none()
        {
            return Err(super::source_check::run_catalog_error(
                &shared.catalog,
                name,
            ));
        }
    }
    Ok(())
}

/// The pipeline's `outputs` files, relative to the working directory.
fn write_outputs(
    env: &Env,
    pipeline: &Pipeline,
    outputs: &StepOutputs,
    params: &IndexMap<String, String>,
    agents: &Value,
    tables: &mut crate::output::Tables,
) -> Result<()> {
    if pipeline.outputs.is_empty() {
        return Ok(());
    }
    let base = base_context(params, outputs.to_json(pipeline), agents);
    let tenv = crate::template::environment(pipeline.file.path().parent());
    for (index, output) in pipeline.outputs.iter().enumerate() {
        let path = tenv
            .render_str(&output.path.text, &base)
            .map_err(|e| Error::usage(super::step::render_error(&output.path, &e)))?;
        let path = env.cwd.join(path.trim());
        let content = match &output.body {
            OutputBody::Table(_) => {
                tables.write(index, &path)?;
                continue;
            }
            OutputBody::Text(content) => content,
        };
        let content = tenv
            .render_str(&content.text, &base)
            .map_err(|e| Error::usage(super::step::render_error(content, &e)))?;
        // A text file ends with exactly one line break, whatever the template left.
        let mut text = content.trim_end_matches(['\n', '\r']).to_owned();
        if !text.is_empty() {
            text.push('\n');
        }
        crate::output::write_atomically(&path, text.as_bytes())?;
    }
    Ok(())
}
