//! The dispatch phase of a run: one [`Dispatcher`] owns every step's status, the set of
//! running steps and the Ctrl-C handling. Steps start when the steps they depend on have
//! finished ([`Graph::ready`]); each running step emits its finished tasks as the run's
//! events and reports its own end to the dispatcher, which emits the step's start and end.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::task::{Id, JoinError, JoinSet};

use super::plan::Plan;
use super::step_error::StepError;
use super::step_run::{RunContext, StepRun};
use crate::event::{RunEvent, StepStatus};
use crate::pipeline::graph::Graph;
use crate::pipeline::shard::Role;

/// How a step ended, and why when it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StepEnd {
    pub(crate) status: StepStatus,
    pub(crate) error: Option<String>,
}

impl StepEnd {
    fn status(status: StepStatus) -> Self {
        Self {
            status,
            error: None,
        }
    }
}

/// Starts steps as they become ready and collects how each ended.
pub(super) struct Dispatcher<'a> {
    graph: &'a Graph,
    plan: &'a Plan,
    run: RunContext,
    /// How each step ended; `None` while it has not.
    ends: Vec<Option<StepEnd>>,
    started: Vec<bool>,
    running: JoinSet<Result<(), StepError>>,
    /// The step each running task runs: a task that panics is known only by its id.
    step_of: HashMap<Id, usize>,
}

impl<'a> Dispatcher<'a> {
    pub(super) fn new(graph: &'a Graph, plan: &'a Plan, run: RunContext) -> Self {
        let n = run.pipeline.steps.len();
        Self {
            graph,
            plan,
            run,
            ends: vec![None; n],
            started: vec![false; n],
            running: JoinSet::new(),
            step_of: HashMap::new(),
        }
    }

    /// Runs every step that can run; answers how each step ended (`None`: never started,
    /// as a step on a dependency cycle).
    pub(super) async fn run(mut self) -> Vec<Option<StepEnd>> {
        let signals = self.watch_signals();
        loop {
            // In file order, each start can make more steps ready (a step that is skipped or
            // given ends at once).
            while let Some(&next) = self.graph.ready(&self.ended(), &self.started).first() {
                self.start(next);
            }
            if self.ends.iter().all(Option::is_some) || self.running.is_empty() {
                // Done, or nothing is running and nothing more can start.
                break;
            }
            if let Some(joined) = self.running.join_next_with_id().await {
                self.finished(joined);
            }
        }
        signals.abort();
        self.ends
    }

    fn ended(&self) -> Vec<bool> {
        self.ends.iter().map(Option::is_some).collect()
    }

    /// Starts step `index`: runs it, or ends it at once (given, deferred or skipped).
    fn start(&mut self, index: usize) {
        self.started[index] = true;
        let end = match self.plan.role(index) {
            Role::Given => Some(self.start_given(index)),
            Role::Merge | Role::Skip => Some(StepEnd::status(StepStatus::Deferred)),
            Role::Run | Role::Shard => {
                let blocked = self.graph.deps(index).iter().any(|d| {
                    self.ends[*d]
                        .as_ref()
                        .is_some_and(|e| e.status != StepStatus::Succeeded)
                });
                (blocked || self.run.shared.drain.is_cancelled())
                    .then(|| StepEnd::status(StepStatus::Skipped))
            }
        };
        if let Some(end) = end {
            self.ends[index] = Some(end);
            return;
        }
        let last = self.run.pipeline.steps.len().saturating_sub(1);
        let step = StepRun {
            run: self.run.clone(),
            index,
            keep_results: self.graph.results_needed(index),
            keep_items: self.graph.items_needed(index),
            // The final step's text is kept only to be printed.
            prints_text: index == last && self.plan.prints_output(),
            shard: self.plan.step_shard(index),
        };
        self.run
            .shared
            .events
            .emit(RunEvent::StepStarted { step: index });
        let task = self.running.spawn(step.run());
        self.step_of.insert(task.id(), index);
    }

    /// A step whose outcome is given (`--items-from`, or the shards of a merge): its data for
    /// later steps and, unless this is a shard, its tasks in the outputs.
    fn start_given(&self, index: usize) -> StepEnd {
        let Some(given) = self.plan.given(index) else {
            return StepEnd::status(StepStatus::Skipped);
        };
        self.run.outputs.set(index, given.data.clone());
        if self.plan.emits_given() {
            // Recorded as if its tasks ran here.
            let events = &self.run.shared.events;
            events.emit(RunEvent::StepStarted { step: index });
            for record in &given.records {
                events.task_finished(record.to_done(index), None);
            }
            events.emit(RunEvent::StepFinished {
                step: index,
                status: given.status,
                error: given.error.clone(),
            });
        }
        StepEnd {
            status: given.status,
            error: given.error.clone(),
        }
    }

    /// A running step ended: its status, and its line on the display and in the report.
    fn finished(&mut self, joined: Result<(Id, Result<(), StepError>), JoinError>) {
        // A task that panicked is a failed step (its dependents are skipped like those of
        // any failed step), never one left without a status.
        let (id, end) = match joined {
            Ok((id, Ok(()))) => (id, StepEnd::status(StepStatus::Succeeded)),
            Ok((id, Err(error))) => (
                id,
                StepEnd {
                    status: StepStatus::Failed,
                    error: Some(error.to_string()),
                },
            ),
            Err(error) => (
                error.id(),
                StepEnd {
                    status: StepStatus::Failed,
                    error: Some(StepError::Panicked.to_string()),
                },
            ),
        };
        let Some(index) = self.step_of.remove(&id) else {
            return;
        };
        self.run.shared.events.emit(RunEvent::StepFinished {
            step: index,
            status: end.status,
            error: end.error.clone(),
        });
        self.ends[index] = Some(end);
    }

    /// The first Ctrl-C drains the run (no new task starts), the second stops the tasks in
    /// flight.
    fn watch_signals(&self) -> tokio::task::JoinHandle<()> {
        let shared = Arc::clone(&self.run.shared);
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                shared.events.emit(RunEvent::Interrupted {
                    text: "summon: interrupted: finishing the tasks in flight (Ctrl-C again to \
                           stop them)"
                        .to_owned(),
                });
                shared.drain.cancel();
                // A task waiting for a provider (starting, unreachable, a retry) stops now.
                crate::provider::end_waits();
                if tokio::signal::ctrl_c().await.is_ok() {
                    shared.kill.cancel();
                }
            }
        })
    }
}
