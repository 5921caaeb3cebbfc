//! The outputs of a run as one consumer of its events ([`crate::event::RunEvent`]): each
//! finished task goes to the journal, `results.jsonl`, the tables, the report, JUnit and the
//! display; steps, totals, retries and notices go to the report and the display.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use jiff::Timestamp;

use super::{DisplayMode, JunitWriter, Progress, Report, ResultLine, ResultsWriter, Tables};
use crate::event::{Consumer, Notice, RunEvent, TaskDone, item_label};
use crate::store::{JournalStatus, JournalWriter, TaskResultRow};

/// Everything a run's events go to: its outputs, and what the events add up to.
pub(crate) struct Recorder {
    pub(crate) out: Outputs,
    /// The tasks of each reducing step's levels so far (its progress total).
    levels: HashMap<usize, u64>,
    /// The warnings shown so far: each is shown once per run.
    warned: HashSet<String>,
    /// Provider retries of the run's tasks, per
    /// [`crate::provider::ProviderError::retry_class`].
    retries: BTreeMap<&'static str, u64>,
    /// The failed tasks, by the label of their failure's class, in the order first seen.
    failures: indexmap::IndexMap<String, FailureGroup>,
    /// The tasks finished before a `--resume` whose line `results.jsonl` has already: marked
    /// resumed when the file is compacted.
    resumed_lines: HashSet<(String, u64)>,
}

/// The failed tasks of one class.
struct FailureGroup {
    count: u64,
    /// The first few, as `step: item`.
    first: Vec<String>,
    /// The first one's message.
    message: String,
}

/// How many failed tasks of a class the end of a run names.
const FAILURES_NAMED: usize = 3;

/// What a [`Recorder`] writes to.
pub(crate) struct Outputs {
    pub(crate) journal: JournalWriter,
    pub(crate) results: Option<ResultsWriter>,
    pub(crate) report: Report,
    pub(crate) junit: Option<JunitWriter>,
    /// The run's live display.
    pub(crate) progress: Arc<Progress>,
    /// The rows of the table `outputs`.
    pub(crate) tables: Tables,
    pub(crate) step_ids: Vec<String>,
    /// Results already in `results.jsonl` from before a resume.
    pub(crate) already_written: HashSet<(String, u64)>,
    /// Cancelled when a result cannot be recorded (the journal or `results.jsonl` on a full
    /// disk): the run starts no new task and stops those in flight.
    pub(crate) stop: tokio_util::sync::CancellationToken,
    /// The first result that could not be recorded: the file and why.
    pub(crate) write_error: Option<WriteError>,
}

/// A run's record that could not be written.
#[derive(Debug)]
pub(crate) enum WriteError {
    Journal(crate::store::StoreError),
    Results {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Journal(e) => e.fmt(f),
            Self::Results { path, source } => {
                write!(f, "cannot write {}: {source}", path.display())
            }
        }
    }
}

impl Outputs {
    /// Records the first write failure, says it once, and stops the run.
    fn fail(&mut self, error: WriteError) {
        if self.write_error.is_none() {
            self.progress.println(
                "summon: a result cannot be recorded; no new task starts, the tasks in flight \
                 are stopped",
            );
            self.write_error = Some(error);
        }
        self.stop.cancel();
    }
}

impl Recorder {
    pub(crate) fn new(out: Outputs) -> Self {
        Self {
            out,
            levels: HashMap::new(),
            warned: HashSet::new(),
            retries: BTreeMap::new(),
            failures: indexmap::IndexMap::new(),
            resumed_lines: HashSet::new(),
        }
    }

    /// The end of a run with failed tasks: a line per class of failure with its count, the
    /// first few tasks and the first message; `None` when no task failed.
    pub(crate) fn failure_summary(&self) -> Option<String> {
        if self.failures.is_empty() {
            return None;
        }
        let mut text = String::from("summon: failed tasks, by cause:");
        for (label, group) in &self.failures {
            let more = group.count.saturating_sub(group.first.len() as u64);
            let mut named = group.first.join(", ");
            if more > 0 {
                named.push_str(&format!(" and {more} more"));
            }
            let message = group.message.lines().next().unwrap_or_default();
            let message = crate::event::TaskTrace::clip(message, 200);
            text.push_str(&format!(
                "\n  {label}: {} ({named}): {message}",
                crate::plural::count(group.count, "task")
            ));
        }
        // Items and messages come from outside: no control sequences on the terminal.
        Some(crate::text::printable(&text).into_owned())
    }

    /// The tasks finished before a `--resume` whose line was written by an earlier attempt.
    pub(crate) fn resumed_lines(&self) -> &HashSet<(String, u64)> {
        &self.resumed_lines
    }

    /// Provider retries so far, per class.
    pub(crate) fn retries(&self) -> &BTreeMap<&'static str, u64> {
        &self.retries
    }

    /// Records a finished task everywhere; a task of a reduction's `level` is journaled and
    /// listed in `results.jsonl` as `<step>#<level>`, counted in the step's report and
    /// progress. `row`: journal it (none for a result taken from the journal).
    fn record(&mut self, done: &TaskDone, level: Option<u32>, row: Option<u64>) {
        let step_id = &self.out.step_ids[done.step].clone();
        let leveled = level.map(|l| format!("{step_id}#{l}"));
        let step = leveled.as_ref().unwrap_or(step_id);
        let status = if done.ok { "completed" } else { "failed" };
        if row.is_some() {
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
                error: done.error_message().map(str::to_owned),
                finished_at: Timestamp::now(),
                batch_id: done.batch_id.clone(),
                meta: serde_json::to_string(&crate::event::TaskMeta::of(done)).ok(),
            };
            if let Err(e) = self.out.journal.record(row) {
                self.out.fail(WriteError::Journal(e));
            }
        }
        // A task that ran again after `--resume` gets a new line; the file is compacted to
        // one line per task when the run ends.
        let written = done.resumed
            && self
                .out
                .already_written
                .contains(&(step.clone(), done.index));
        if written {
            self.resumed_lines.insert((step.clone(), done.index));
        }
        let mut failed = None;
        if let Some(results) = &mut self.out.results
            && !written
        {
            let class = done.error.as_ref().map(|e| e.class.label());
            let line = ResultLine {
                step,
                index: done.index,
                item: &done.item,
                status,
                output: &done.output,
                error: done.error_message(),
                error_class: class.as_deref(),
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
                role: done.role.as_deref(),
            };
            if let Err(source) = results.write(&line) {
                let path = results.path().to_path_buf();
                failed = Some(WriteError::Results { path, source });
            }
        }
        if let Some(error) = failed {
            self.out.fail(error);
        }
        if !done.ok {
            count_failure(&mut self.failures, done, step);
        }
        crate::env::crash_point("task-recorded");
        if level.is_none() {
            self.out.tables.push(done);
        }
        let step = step_id;
        if let Some(level) = level {
            self.out.report.record_level(step, level, done.ok);
        }
        if !done.warnings.is_empty() {
            self.out.report.record_warnings(
                step,
                done.index,
                &item_label(&done.item, done.index),
                &done.warnings,
            );
        }
        self.out.report.record_overhead(step, done.trace.overhead());
        let cost = if done.reused {
            self.out.report.record_reused(step);
            Some(0.0)
        } else {
            self.out.report.record_task(
                step,
                done.model.as_deref(),
                status,
                done.turns,
                done.usage,
                done.duration,
                done.resumed,
                served_tier(done),
                done.corrections,
            )
        };
        if let Some(junit) = &mut self.out.junit {
            let label = item_label(&done.item, done.index);
            let label = match level {
                Some(level) => format!("level {level}, chunk {}", done.index),
                None => label,
            };
            // Labelled with its role, as seed 004 labels its subagents (`Task 1 (explorer)`).
            let label = match &done.role {
                Some(role) => format!("{label} ({role})"),
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
                done.error_message(),
            );
        }
        self.out
            .progress
            .task_input(step, done.usage.input_tokens, done.usage.cache_read_tokens);
        if let Some(junit) = &mut self.out.junit {
            junit.add_cache(
                step,
                done.usage.cache_read_tokens,
                done.usage.cache_write_tokens,
            );
        }
        self.out.progress.task_finished(
            step,
            done.ok,
            done.usage.input_tokens + done.usage.output_tokens,
            cost,
        );
    }
}

impl Consumer for Recorder {
    fn on_event(&mut self, event: &RunEvent) {
        match event {
            RunEvent::StepStarted { step } => {
                self.out.report.step_started(&self.out.step_ids[*step])
            }
            RunEvent::StepTotal { step, total } => {
                self.out
                    .progress
                    .set_total(&self.out.step_ids[*step], *total);
            }
            RunEvent::LevelStarted {
                step,
                level,
                chunks,
            } => {
                let id = &self.out.step_ids[*step];
                let total = self.levels.entry(*step).or_default();
                *total += *chunks as u64;
                self.out.progress.set_total(id, *total);
                if self.out.progress.mode() != DisplayMode::Quiet {
                    self.out
                        .progress
                        .println(&format!("[summon] {id}: level {level}: {chunks} chunk(s)"));
                }
            }
            RunEvent::TasksStarted { step, count } => {
                for _ in 0..*count {
                    self.out.progress.task_started(&self.out.step_ids[*step]);
                }
            }
            RunEvent::Retry { step, class, wait } => {
                *self.retries.entry(*class).or_default() += 1;
                self.out.progress.retry(&self.out.step_ids[*step], *wait);
            }
            RunEvent::Waiting { step, wait } => {
                self.out.progress.retry(&self.out.step_ids[*step], *wait);
            }
            RunEvent::Held { step, limit, wait } => {
                self.out
                    .progress
                    .held(&self.out.step_ids[*step], limit, *wait);
            }
            RunEvent::OutputLimit { step, summary } => {
                let id = &self.out.step_ids[*step];
                self.out.report.set_output_limit(id, summary.clone());
            }
            RunEvent::RateLimits { providers } => {
                self.out.report.set_rate_limits(providers.clone());
            }
            RunEvent::Slot { step, given } => {
                self.out.progress.slot(&self.out.step_ids[*step], *given);
            }
            RunEvent::TaskFinished { done, level, row } => self.record(done, *level, *row),
            RunEvent::Activity(_) | RunEvent::Decomposed { .. } => {}
            RunEvent::Notice {
                kind: Notice::Warning,
                text,
            } => {
                if self.warned.insert(text.clone()) {
                    self.out
                        .progress
                        .println(&format!("summon: warning: {text}"));
                }
            }
            RunEvent::Notice {
                kind: Notice::Progress,
                text,
            } => {
                if self.out.progress.mode() != DisplayMode::Quiet {
                    self.out.progress.println(&format!("[summon] {text}"));
                }
            }
            RunEvent::Interrupted { text } => self.out.progress.interrupted(text),
            RunEvent::StepFinished { step, .. } => {
                let id = &self.out.step_ids[*step];
                self.out.progress.step_finished(id);
                self.out.report.step_finished(id);
            }
        }
    }
}

/// Counts a failed task under its class.
fn count_failure(
    failures: &mut indexmap::IndexMap<String, FailureGroup>,
    done: &TaskDone,
    step: &str,
) {
    let (label, message) = match &done.error {
        Some(failure) => (failure.class.label(), failure.message.as_str()),
        None => (crate::event::FailureClass::Other.label(), ""),
    };
    let group = failures.entry(label).or_insert_with(|| FailureGroup {
        count: 0,
        first: Vec::new(),
        message: message.to_owned(),
    });
    group.count += 1;
    if group.first.len() < FAILURES_NAMED {
        group
            .first
            .push(format!("{step}: {}", item_label(&done.item, done.index)));
    }
}

/// The tier a task is priced at: the batch tier through a provider's batch API, else the one
/// its last answer says served it (standard when it did not say).
pub(crate) fn served_tier(done: &crate::event::TaskDone) -> crate::config::Tier {
    if done.batch_id.is_some() {
        return crate::config::Tier::Batch;
    }
    done.trace
        .service_tier
        .as_deref()
        .and_then(crate::config::Tier::parse)
        .unwrap_or_default()
}
