//! The run, in three phases: open (or resume) it, dispatch its steps, finish it. Steps
//! start when the steps they depend on have finished, independent steps run at the same
//! time, and everything that happens goes as one stream of events ([`Events`]) to one
//! consumer, [`RunOutputs`] (journal, `results.jsonl`, tables, report, JUnit, display, and a
//! shard's manifest).
//!
//! ```text
//! OpenRun::open -> Dispatcher (step status, signals) --spawn--> StepRun --> Tasks::run
//!                      |  ^-- step ended --/                        |   (global + step
//!                      +--------------- RunEvent ------------------+     semaphores)
//!                                          v
//!                                     RunOutputs
//!               -> Finish::run (flush, report, outputs, manifest, status)
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use indexmap::IndexMap;
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
use crate::event::{Bus, Consumer, Events, RunEvent, RunSummary};
use crate::output::{DisplayMode, JunitWriter, Outputs, Progress, Recorder, Report};
use crate::pipeline::graph::Graph;
use crate::pipeline::model::{Decompose, Pipeline, StepKind};
use crate::pipeline::shard::Role;
use crate::provider::RetryPolicy;
use crate::source::Catalog;

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
    /// Another consumer of the run's events, beside its outputs.
    pub(crate) watch: Option<Box<dyn Consumer>>,
    /// `--max-cost`: the run's spend cap in USD, over the pipeline's `settings.max_cost` and
    /// the config file's `max_cost`.
    pub(crate) max_cost: Option<f64>,
    /// The trace the run's spans belong to, for `report.json` and `report.html`.
    pub(crate) trace_id: Option<String>,
    /// The run span's context, passed to the commands the run starts as `TRACEPARENT`.
    pub(crate) traceparent: Option<String>,
    /// Cancelled by the caller to stop the run as a first Ctrl-C does: no new task starts,
    /// the tasks in flight finish, and the run ends interrupted (resumable).
    pub(crate) stop: Option<CancellationToken>,
}

/// Default global cap on tasks in flight.
pub(crate) const DEFAULT_CONCURRENCY: usize = 8;

/// The consumer of a run's events: the outputs, and every task for a shard's or `--until`
/// run's manifest.
pub(super) struct RunOutputs {
    pub(super) recorder: Recorder,
    pub(super) tasks: Option<Vec<TaskRef>>,
    step_ids: Vec<String>,
    watch: Option<Box<dyn Consumer>>,
}

impl Consumer for RunOutputs {
    fn on_event(&mut self, event: &RunEvent) {
        if let (Some(tasks), RunEvent::TaskFinished { done, level, .. }) = (&mut self.tasks, event)
        {
            let id = &self.step_ids[done.step];
            tasks.push(TaskRef {
                step: level.map_or_else(|| id.clone(), |l| format!("{id}#{l}")),
                index: done.index,
                hash: done.hash.clone(),
                model: done.model.clone(),
                batch_id: done.batch_id.clone(),
            });
        }
        self.recorder.on_event(event);
        if let Some(watch) = &mut self.watch {
            watch.on_event(event);
        }
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
    let mut report = new_report(&config, &pipeline);
    report.set_trace_id(options.trace_id.clone());
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
        stop,
        results,
        already_written,
        spent_before,
        live: _live,
    } = opened;
    let budget = options
        .max_cost
        .or(pipeline.settings.max_cost)
        .or(config.max_cost)
        .map(|cap| crate::subagent::budget::Ledger::new(cap, spent_before));
    if let Some(ledger) = &budget {
        progress.set_budget(Arc::clone(ledger));
    }
    let agents = Arc::new(agents_json(&catalog));
    let step_ids: Vec<String> = pipeline.steps.iter().map(|s| s.id.clone()).collect();
    let recorder = Recorder::new(Outputs {
        journal,
        results,
        report,
        junit: options
            .junit
            .as_ref()
            .map(|_| JunitWriter::spilling(pipeline.name.clone(), store.dir())),
        progress: Arc::clone(&progress),
        tables: crate::output::Tables::new(&pipeline, store.dir())?,
        step_ids: step_ids.clone(),
        already_written,
        stop: stop.clone(),
        write_error: None,
    });
    let follow_tasks = options.watch.is_some();
    let bus = Arc::new(Mutex::new(Bus::new(RunOutputs {
        recorder,
        tasks: plan.writes_manifest().then(Vec::new),
        step_ids,
        watch: options.watch,
    })));
    let events = Events::new(&bus).follow_tasks(follow_tasks);
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
        drain: options.stop.clone().unwrap_or_default(),
        kill: CancellationToken::new(),
        // A value that is not a whole number was refused by the plan (`plan_for_run`) or by
        // `summon merge` before the run began.
        policy: RetryPolicy::from_env(env).unwrap_or_default(),
        committed,
        run_id: run.run_id.clone(),
        run_started,
        batch_all: options.batch,
        events: events.clone(),
        budget,
        stopped: std::sync::OnceLock::new(),
        traceparent: options.traceparent.clone(),
    });
    let outputs = Arc::new(StepOutputs::new(pipeline.steps.len()));
    let params = Arc::new(options.params);
    let context = RunContext {
        shared: Arc::clone(&shared),
        pipeline: Arc::clone(&pipeline),
        outputs: Arc::clone(&outputs),
        params: Arc::clone(&params),
        agents: Arc::clone(&agents),
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
    // A result that cannot be recorded (a full disk) stops the run as a second Ctrl-C does.
    {
        let shared = Arc::clone(&shared);
        runtime.spawn(async move {
            stop.cancelled().await;
            shared.drain.cancel();
            shared.kill.cancel();
        });
    }
    let graph = Graph::new(&pipeline);
    let ends = runtime.block_on(Dispatcher::new(&graph, &plan, context).run());
    crate::env::crash_point("steps-done");
    if let Some(providers) = shared.rate_limit_stats() {
        events.emit(RunEvent::RateLimits { providers });
    }
    // Every step has ended: the stream is closed and the outputs taken back whole.
    drop(events);
    let outputs_taken = bus
        .lock()
        .map_err(|_| Error::internal("run outputs"))?
        .close()
        .ok_or_else(|| Error::internal("run outputs taken twice"))?;
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
    let ended = finish.run(outputs_taken, ends)?;
    // The connections and the store are closed (the store's last checkpoint) while the page
    // is written; the summary is printed once both are done.
    drop(runtime);
    drop(shared);
    drop(store);
    Ok(ended.tell())
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
    let mut report = Report::new(config.prices());
    for (i, step) in pipeline.steps.iter().enumerate() {
        let level = StepConfig::new(i, step, &pipeline.settings).sandbox();
        let effective = crate::sandbox::Sandbox::pick(&[level, (config.sandbox, config.network)]);
        report.set_sandbox(&step.id, effective);
    }
    report
}
