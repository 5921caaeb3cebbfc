//! The last phase of a run: flush what records its tasks, write the report, JUnit, the
//! pipeline's `outputs` and a shard's manifest, then decide and record the run's status.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde_json::{Value, json};

use super::context::{StepData, StepOutputs, base_context};
use super::dispatcher::StepEnd;
use super::plan::Plan;
use super::scheduler::RunOutputs;
use super::step::Shared;
use crate::env::Env;
use crate::error::{Error, Result};
use crate::event::FinalText;
use crate::event::{RunSummary, StepStatus};
use crate::output::WriteError;
use crate::pipeline::graph::Graph;
use crate::pipeline::model::{OutputBody, Pipeline};
use crate::store::{RunStatus, Store};

/// What the finish phase needs of the run.
pub(super) struct Finish<'a> {
    pub(super) env: &'a Env,
    pub(super) pipeline: &'a Pipeline,
    pub(super) graph: &'a Graph,
    pub(super) plan: &'a Plan,
    pub(super) shared: &'a Shared,
    pub(super) outputs: &'a StepOutputs,
    pub(super) params: &'a IndexMap<String, String>,
    pub(super) agents: &'a Value,
    pub(super) out_dir: Option<&'a Path>,
    pub(super) junit: Option<&'a PathBuf>,
    pub(super) resuming: bool,
    pub(super) store: &'a Store,
    pub(super) run_id: &'a str,
    /// The pipeline file, as recorded in the store.
    pub(super) path_text: &'a str,
}

impl Finish<'_> {
    /// Ends the run whose steps ended as `ends`.
    pub(super) fn run(self, outputs: RunOutputs, ends: Vec<Option<StepEnd>>) -> Result<Ended> {
        let RunOutputs {
            recorder: mut sink,
            tasks,
            ..
        } = outputs;
        let (env, pipeline) = (self.env, self.pipeline);
        let (store, run_id) = (self.store, self.run_id);
        let interrupted = self.shared.drain.is_cancelled();
        // Flush everything that records results before deciding the outcome.
        sink.out.progress.finish();
        let journaled = sink.out.journal.flush();
        let written = match &sink.out.results {
            Some(results) => results.flush().map_err(|source| Error::Write {
                path: results.path().to_path_buf(),
                source,
            }),
            None => Ok(()),
        };
        drop(sink.out.results.take());
        // A result that could not be recorded (a full disk) fails the run, naming the file;
        // `--resume` runs again what the journal lacks.
        if let Some(error) = sink.out.write_error.take() {
            let _ = store.set_run_status(run_id, RunStatus::Failed);
            return Err(match error {
                WriteError::Journal(e) => Error::Store(e),
                WriteError::Results { path, source } => Error::Write { path, source },
            });
        }
        if let Err(e) = journaled {
            let _ = store.set_run_status(run_id, RunStatus::Failed);
            return Err(e.into());
        }
        if let Err(e) = written {
            let _ = store.set_run_status(run_id, RunStatus::Failed);
            return Err(e);
        }
        let out_dir = self.out_dir.map(|dir| env.cwd.join(dir));
        if let (Some(dir), true) = (&out_dir, self.resuming) {
            compact_results(dir, sink.resumed_lines())?;
        }
        let mut retries = sink.retries().clone();
        if self.resuming {
            // The retries of the run's earlier attempts: those of the tasks they journaled.
            add_earlier_retries(&mut retries, &self.shared.finished, store, run_id);
        }
        // A merge counts the retries its shards made.
        for (class, n) in &self.plan.given_retries {
            if let Some(class) = crate::output::RETRY_CLASSES.iter().find(|c| **c == class) {
                *retries.entry(class).or_default() += n;
            }
        }
        sink.out.report.set_retries(&retries);
        for (step, summary) in &self.plan.given_output_limits {
            sink.out.report.set_output_limit(step, summary.clone());
        }
        let budget = self.shared.budget.as_ref().map(|ledger| {
            let spent = ledger.spent();
            if let Err(e) = store.set_run_spent(run_id, spent) {
                eprintln!("summon: warning: cannot record what the run spent: {e}");
            }
            crate::output::BudgetJson {
                cap_usd: ledger.cap(),
                spent_usd: spent,
                reached: ledger.reached(),
            }
        });
        if let Some(budget) = &budget {
            sink.out.report.set_budget(budget.clone());
            if let Some(junit) = &mut sink.out.junit {
                junit.set_budget(budget.spent_usd, budget.cap_usd);
            }
        }
        // One clock for report.json and the report kept in the run history.
        sink.out.report.finish();
        // The run's status in the words `summon runs`, report.html and the job summary share.
        let ended_ok = ends.iter().all(|end| {
            end.as_ref().is_some_and(|end| {
                matches!(end.status, StepStatus::Succeeded | StepStatus::Deferred)
            })
        });
        let run_status = if interrupted {
            RunStatus::Interrupted
        } else if ended_ok {
            RunStatus::Completed
        } else {
            RunStatus::Failed
        };
        let mut graph = pipeline_graph(pipeline, self.graph, &ends, run_id);
        if let Some(object) = graph.as_object_mut() {
            object.insert("status".to_owned(), run_status.as_str().into());
        }
        sink.out.report.set_pipeline(graph);
        let mut page = None;
        if let Some(dir) = &out_dir {
            sink.out.report.write_json(&dir.join("report.json"))?;
            // A problem with the page does not change the run; a link planted at it does.
            crate::safe_fs::refuse_link(&dir.join(crate::output::HTML_FILE))?;
            // The page is a view of the two files, written while the rest is recorded.
            page = Some(PageWriter::start(dir.clone()));
        }
        if let (Some(junit), Some(path)) = (&mut sink.out.junit, self.junit) {
            junit.write(&env.cwd.join(path))?;
        }
        let steps: Vec<(String, StepStatus, Option<String>)> = pipeline
            .steps
            .iter()
            .zip(ends)
            .map(|(s, end)| {
                let end = end.unwrap_or(StepEnd {
                    status: StepStatus::Skipped,
                    error: None,
                });
                (s.id.clone(), end.status, end.error)
            })
            .collect();
        // A shard leaves steps for the merge, `--until` the steps after it: the run can
        // succeed, but the pipeline's outputs need every step.
        let whole = steps.iter().all(|(_, s, _)| *s == StepStatus::Succeeded);
        // A part of a run (a shard, `--until`) has only some of the rows: the merge writes them.
        if whole && !interrupted && self.plan.prints_output() {
            write_outputs(
                env,
                pipeline,
                self.outputs,
                self.params,
                self.agents,
                &mut sink.out.tables,
            )?;
        }
        if let (true, Some(dir)) = (self.plan.writes_manifest(), &out_dir) {
            let finished = super::plan::Finished {
                pipeline,
                params: self.params,
                plan: self.plan,
                statuses: &steps,
                outputs: self.outputs,
                tasks: tasks.as_deref().unwrap_or_default(),
                interrupted,
            };
            super::plan::write_manifest(dir, &finished)?;
        }
        store.set_run_status(run_id, run_status)?;
        if let Err(e) = store.set_run_report(run_id, &sink.out.report.to_json()) {
            eprintln!("summon: warning: cannot record the run's report: {e}");
        }
        prune(store, &self.shared.config, self.path_text, run_id);
        let last = pipeline.steps.len().saturating_sub(1);
        let final_output = if self.plan.prints_output() {
            self.outputs
                .take_final()
                .or_else(|| outputs_final(&self.outputs.get(last)).map(FinalText::Memory))
        } else {
            None
        };
        let summary_line = sink.out.report.summary_line();
        let mut notes = vec![format!("summon: {summary_line}")];
        notes.extend(
            sink.out
                .report
                .unpriced_hint()
                .map(|hint| format!("summon: {hint}")),
        );
        notes.extend(
            sink.out
                .report
                .limit_notes()
                .into_iter()
                .map(|note| format!("summon: {note}")),
        );
        notes.extend(sink.failure_summary());
        Ok(Ended {
            summary: RunSummary {
                run_id: run_id.to_owned(),
                steps,
                final_output,
                interrupted,
                budget: self
                    .shared
                    .budget
                    .as_ref()
                    .filter(|ledger| ledger.reached())
                    .map(|ledger| ledger.reached_text()),
                provider: self.shared.stopped.get().cloned(),
                report: sink.out.report.to_json(),
                summary_line,
            },
            notes,
            page: page
                .zip(self.out_dir)
                .map(|(writer, dir)| (writer, dir.join(crate::output::HTML_FILE))),
        })
    }
}

/// A run that ended, told once the store and the connections are closed: its summary lines
/// and the page's path when the page (written meanwhile) is there.
pub(super) struct Ended {
    summary: RunSummary,
    notes: Vec<String>,
    page: Option<(PageWriter, PathBuf)>,
}

impl Ended {
    /// Prints the run's summary (waiting for its page) and gives it back.
    pub(super) fn tell(self) -> RunSummary {
        let page = self.page.and_then(|(writer, shown)| match writer.wait()? {
            Ok(_) => Some(shown),
            Err(e) => {
                eprintln!(
                    "summon: warning: cannot write {}: {e}",
                    crate::output::HTML_FILE
                );
                None
            }
        });
        for note in &self.notes {
            eprintln!("{note}");
        }
        if let Some(page) = page {
            eprintln!("summon: report: {}", page.display());
        }
        self.summary
    }
}

/// The `pipeline` key of `report.json`: each step with its kind, the steps it depends on
/// and how it ended.
fn pipeline_graph(
    pipeline: &Pipeline,
    graph: &Graph,
    ends: &[Option<StepEnd>],
    run_id: &str,
) -> Value {
    let steps: Vec<Value> = pipeline
        .steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let status = ends
                .get(i)
                .and_then(Option::as_ref)
                .map_or(StepStatus::Skipped, |e| e.status);
            json!({
                "id": step.id,
                "kind": step.kind.name(),
                "needs": graph.deps(i).iter().map(|d| &pipeline.steps[*d].id).collect::<Vec<_>>(),
                "status": status.name(),
            })
        })
        .collect();
    json!({ "name": pipeline.name, "run_id": run_id, "steps": steps })
}

/// `report.html` written on a thread of its own (it reads all of `results.jsonl`), so that
/// JUnit, the outputs and the store are written meanwhile. Waited for when dropped: no run ends
/// with its page half-written.
struct PageWriter {
    writing: Option<std::thread::JoinHandle<PageWritten>>,
    written: Option<PageWritten>,
}

type PageWritten = std::result::Result<PathBuf, crate::output::HtmlError>;

impl PageWriter {
    fn start(dir: PathBuf) -> Self {
        let on_thread = dir.clone();
        match std::thread::Builder::new()
            .name("summon-report-page".into())
            .spawn(move || crate::output::write_html(&on_thread))
        {
            Ok(handle) => Self {
                writing: Some(handle),
                written: None,
            },
            // No thread to be had: written here.
            Err(_) => Self {
                writing: None,
                written: Some(crate::output::write_html(&dir)),
            },
        }
    }

    /// What the page's writer did; `None` when its thread panicked.
    fn wait(mut self) -> Option<PageWritten> {
        match self.writing.take() {
            Some(handle) => handle.join().ok(),
            None => self.written.take(),
        }
    }
}

impl Drop for PageWriter {
    fn drop(&mut self) {
        if let Some(handle) = self.writing.take() {
            let _ = handle.join();
        }
    }
}

/// Drops the runs of this pipeline that the retention settings do not keep, and the space
/// they took. A failure here costs only disk space: a warning.
fn prune(store: &Store, config: &crate::config::Config, pipeline: &str, run_id: &str) {
    let mut retention = crate::store::Retention::default();
    if let Some(keep) = config.keep_runs {
        retention.keep = usize::try_from(keep).unwrap_or(usize::MAX);
    }
    if let Some(days) = config.keep_days {
        retention.keep_for = std::time::Duration::from_secs_f64(days * 86_400.0);
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

/// Keeps the last line of every task in `results.jsonl` (a task that ran again after a
/// resume replaces its earlier line), in first-seen order.
/// Adds to `retries` those of the earlier attempts of `run_id`: the retries of every task
/// they journaled (`finished`), also of those killed before they could write a report. A
/// journal written before tasks kept their retries falls back on the report the earlier
/// attempt left.
fn add_earlier_retries(
    retries: &mut BTreeMap<&'static str, u64>,
    finished: &crate::store::FinishedMap,
    store: &Store,
    run_id: &str,
) {
    // From the journal: also the attempts killed before they wrote a report.
    let mut journaled: BTreeMap<&'static str, u64> = BTreeMap::new();
    for row in finished.values() {
        let Some(meta) = row
            .meta
            .as_deref()
            .and_then(|text| serde_json::from_str::<crate::event::TaskMeta>(text).ok())
        else {
            continue;
        };
        for (class, n) in &meta.retry_classes {
            if let Some(class) = crate::output::RETRY_CLASSES.iter().find(|c| **c == class) {
                *journaled.entry(class).or_default() += u64::from(*n);
            }
        }
    }
    // From the report the last attempt left: also the retries of tasks it never journaled
    // (a provider that stopped answering). Each class counts the larger of the two.
    let mut reported: BTreeMap<&'static str, u64> = BTreeMap::new();
    if let Ok(Some(report)) = store.run_report(run_id)
        && let Some(earlier) = report["retries_by_class"].as_object()
    {
        for class in crate::output::RETRY_CLASSES {
            if let Some(n) = earlier.get(class).and_then(Value::as_u64) {
                reported.insert(class, n);
            }
        }
    }
    for class in crate::output::RETRY_CLASSES {
        let n = journaled
            .get(class)
            .copied()
            .unwrap_or(0)
            .max(reported.get(class).copied().unwrap_or(0));
        if n > 0 {
            *retries.entry(class).or_default() += n;
        }
    }
}

fn compact_results(dir: &Path, resumed: &HashSet<(String, u64)>) -> Result<()> {
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
        match resumed
            .contains(key)
            .then(|| mark_resumed(lines[key]))
            .flatten()
        {
            Some(line) => out.push_str(&line),
            None => out.push_str(lines[key]),
        }
        out.push('\n');
    }
    crate::output::write_atomically(&path, out.as_bytes())?;
    Ok(())
}

/// A line written by an earlier attempt of the run, for a task this attempt resumed:
/// `resumed: true`, and no start time (nor waits counted from it), which belonged to the
/// earlier attempt's clock.
fn mark_resumed(line: &str) -> Option<String> {
    let mut value: Value = serde_json::from_str(line).ok()?;
    let object = value.as_object_mut()?;
    object.insert("resumed".to_owned(), Value::Bool(true));
    if object.contains_key("started_ms") {
        object.insert("started_ms".to_owned(), Value::Null);
    }
    object.shift_remove("waits");
    serde_json::to_string(&value).ok()
}

/// The final step's text when it was not kept apart: its output, or its results' outputs.
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
            .map_err(|e| Error::usage(output.path.render_error(&e)))?;
        let dest = output_dest(env, path.trim(), index, output.outside_project)?;
        let content = match &output.body {
            OutputBody::Table(_) => {
                tables.write(index, &dest)?;
                continue;
            }
            OutputBody::Text(content) => content,
        };
        let content = tenv
            .render_str(&content.text, &base)
            .map_err(|e| Error::usage(content.render_error(&e)))?;
        // A text file ends with exactly one line break, whatever the template left.
        let mut text = content.trim_end_matches(['\n', '\r']).to_owned();
        if !text.is_empty() {
            text.push('\n');
        }
        dest.write(text.as_bytes())?;
    }
    Ok(())
}

/// Where `outputs[index]` goes: its rendered `path` inside the project (the working
/// directory), opened beneath it without following a link, unless the entry says
/// `outside_project: true`.
fn output_dest(
    env: &Env,
    path: &str,
    index: usize,
    outside_project: bool,
) -> Result<crate::safe_fs::Dest> {
    if outside_project {
        return Ok(crate::safe_fs::Dest::at(&env.cwd.join(path))?);
    }
    let root = std::fs::canonicalize(&env.cwd)?;
    let rel = crate::safe_fs::inside(&root, Path::new(path)).map_err(|why| {
        Error::usage(format!(
            "outputs[{index}]: the path `{}` {} and leads outside the project ({}); an output is \
             written inside the project unless its entry sets `outside_project: true`",
            path.escape_debug(),
            why.reason(),
            env.cwd.display()
        ))
    })?;
    Ok(crate::safe_fs::Dest::beneath(&root, &rel)?)
}
