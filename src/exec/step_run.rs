//! One step of a run: its items, its tasks, and whether it succeeded. The dispatcher starts
//! a [`StepRun`] when the steps it depends on have finished; each finished task goes to the
//! run's events, and a [`Tally`] keeps what the step's outcome and later steps need.

use std::sync::Arc;

use indexmap::IndexMap;
use serde_json::{Value, json};

use super::context::{StepData, StepOutputs, base_context};
use super::step::{Shared, StepConfig, TaskContext, Tasks};
use super::step_error::StepError;
use crate::event::{Events, FinalTextBuilder, RunEvent, TaskDone};
use crate::pipeline::items::{Expanded, expand_items, items_of_answer, open_file_items};
use crate::pipeline::model::{
    Backend, Decompose, FanOut, OnError, Pipeline, Step, StepKind, TaskTemplate,
};
use crate::pipeline::shard::Shard;

/// The items a step's tasks run over, read one at a time.
type Items = Box<dyn Iterator<Item = Result<Value, String>> + Send>;

/// What every step of a run shares: the run's state (its events among it), the pipeline,
/// and the steps' outputs so far.
#[derive(Clone)]
pub(super) struct RunContext {
    pub(super) shared: Arc<Shared>,
    pub(super) pipeline: Arc<Pipeline>,
    pub(super) outputs: Arc<StepOutputs>,
    pub(super) params: Arc<IndexMap<String, String>>,
    pub(super) agents: Arc<Value>,
}

/// One step to run.
pub(super) struct StepRun {
    pub(super) run: RunContext,
    pub(super) index: usize,
    /// A later template reads this step's results: keep them in memory.
    pub(super) keep_results: bool,
    /// A later template reads this step's items: a file's are read into memory, not streamed.
    pub(super) keep_items: bool,
    /// This step's text is the run's final output (printed).
    pub(super) prints_text: bool,
    /// The part of the step's tasks this process runs (`--shard`).
    pub(super) shard: Option<Shard>,
}

/// What a step's finished tasks add up to.
struct Tally<'a> {
    events: &'a Events,
    keep_results: bool,
    prints_text: bool,
    fail_fast: bool,
    successes: usize,
    failures: usize,
    first_error: Option<String>,
    /// Each task's result, by item index, when later steps read them.
    results: Vec<(u64, Value)>,
    /// The outputs in item order, when they are only printed.
    final_text: FinalTextBuilder,
    /// The last task's answer (a single-task step's).
    output: Option<String>,
    structured: Option<Value>,
}

impl Tally<'_> {
    /// Records a finished task; answers whether to go on and the task's journal row.
    fn record(&mut self, done: TaskDone) -> (bool, Option<u64>) {
        let ok = done.ok;
        if ok {
            self.successes += 1;
        } else {
            self.failures += 1;
            if self.first_error.is_none() {
                self.first_error = Some(format!(
                    "task {} failed: {}",
                    done.index,
                    done.error_message().unwrap_or_default()
                ));
            }
        }
        if self.prints_text && !self.keep_results {
            self.final_text.push(done.index, &done.output);
        }
        if self.keep_results {
            self.results.push((
                done.index,
                json!({"item": done.item, "output": done.output, "status": if done.ok { "completed" } else { "failed" }, "data": done.structured}),
            ));
        }
        self.output = Some(done.output.clone());
        self.structured.clone_from(&done.structured);
        (!self.fail_fast || ok, self.events.task_finished(done, None))
    }

    fn first_error(&mut self) -> String {
        self.first_error.take().unwrap_or_default()
    }
}

/// `items`, one at a time.
fn listed(items: Vec<Value>) -> Items {
    Box::new(items.into_iter().map(Ok))
}

impl StepRun {
    /// Runs the step; `Err` carries why it failed.
    pub(super) async fn run(self) -> Result<(), StepError> {
        let pipeline = &self.run.pipeline;
        let step = &pipeline.steps[self.index];
        crate::env::step_panic_point(&step.id);
        let shared = &self.run.shared;
        let mut config = StepConfig::new(self.index, step, &shared.settings)
            .with_cache(&shared.config, &pipeline.name);
        config.shard = self.shard;
        config.reuse |= shared.reuse_all;
        let base = base_context(
            &self.run.params,
            self.run.outputs.to_json(pipeline),
            &self.run.agents,
        );
        let env = crate::template::environment(pipeline.file.path().parent());
        // The final step's text goes to stdout: keep only the outputs, in order.
        // Spilled text goes beside the run's store, which is open by now.
        let project =
            crate::store::find_project(&shared.env.cwd).unwrap_or_else(|| shared.env.cwd.clone());
        let tally = Tally {
            events: &self.run.shared.events,
            keep_results: self.keep_results,
            prints_text: self.prints_text,
            fail_fast: step.on_error == OnError::FailFast,
            successes: 0,
            failures: 0,
            first_error: None,
            results: Vec::new(),
            final_text: FinalTextBuilder::new(project.join(crate::store::DIR_NAME)),
            output: None,
            structured: None,
        };
        let scope = Scope {
            step,
            config: &config,
            base: &base,
            env: &env,
        };
        match &step.kind {
            StepKind::Decompose(decompose) => self.decompose(&scope, decompose, tally).await,
            StepKind::FanOut(fan_out) => self.fan_out(&scope, fan_out, tally).await,
            StepKind::Synthesize(task) | StepKind::Delegate(task) => {
                self.single(&scope, task, tally).await
            }
        }
    }

    /// A decompose step: its items, for the steps that fan out over them.
    async fn decompose(
        &self,
        scope: &Scope<'_, '_>,
        decompose: &Decompose,
        mut tally: Tally<'_>,
    ) -> Result<(), StepError> {
        let cwd = &self.run.shared.env.cwd;
        let items: Vec<Value> = match decompose {
            Decompose::Items(list) => list.clone(),
            Decompose::Static(form, template) => {
                let form = *form;
                let text = if form == crate::pipeline::items::StaticForm::Command {
                    scope.render_command(template)?
                } else {
                    scope.render(template)?
                };
                let (cwd, keep_items) = (cwd.clone(), self.keep_items);
                let shared = &self.run.shared;
                // The command gets no credential (any provider's key variable, or one named
                // like a key), and runs under the run's span.
                let env = crate::pipeline::items::CommandVars {
                    set: shared
                        .traceparent
                        .iter()
                        .map(|tp| ("TRACEPARENT".to_owned(), tp.clone()))
                        .collect(),
                    withheld: crate::config::presets::key_variables(&shared.env, &shared.config)
                        .into_iter()
                        .map(|(variable, _)| variable)
                        .collect(),
                };
                let started = std::time::Instant::now();
                let expanded = tokio::task::spawn_blocking(move || {
                    expand_items(form, &text, &cwd, keep_items, &env)
                })
                .await
                .map_err(|e| StepError::Failed(e.to_string()))?;
                shared.events.emit(crate::event::RunEvent::Decomposed {
                    step: self.index,
                    form: form.name(),
                    started,
                    items: match &expanded {
                        Ok(Expanded::Items(items)) => Some(items.len()),
                        _ => None,
                    },
                    error: expanded.as_ref().err().map(ToString::to_string),
                });
                let expanded = expanded.map_err(|e| StepError::Items(e.to_string()))?;
                match expanded {
                    Expanded::Items(items) => items,
                    Expanded::File(path) => {
                        // Checked now (it opens), streamed by the fan-out later.
                        self.run.outputs.set(
                            self.index,
                            StepData {
                                file: Some(path),
                                ..StepData::default()
                            },
                        );
                        return Ok(());
                    }
                }
            }
            Decompose::Agent(task) => {
                let mut items = listed(vec![Value::Null]);
                Tasks::new(scope.config, task, scope.base, scope.env)
                    .default_schema(json!({"type": "array"}))
                    .cap(Some(1))
                    .run(&self.run.shared, &mut *items, &mut |done| {
                        tally.record(done)
                    })
                    .await?;
                if tally.failures > 0 {
                    return Err(tally.first_error().into());
                }
                match tally.structured.take().and_then(items_of_answer) {
                    Some(items) => items,
                    None => {
                        return Err(StepError::Failed(
                            "the decompose subagent did not answer with a JSON array (or an \
                             object with an `items` array)"
                                .into(),
                        ));
                    }
                }
            }
        };
        self.run.outputs.set(
            self.index,
            StepData {
                items: Some(items),
                ..StepData::default()
            },
        );
        Ok(())
    }

    /// The items a fan-out runs over: streamed from a file, or the list of the step it
    /// fans out over. Every source name they render to is checked first.
    fn fan_out_items(&self, scope: &Scope<'_, '_>, fan_out: &FanOut) -> Result<Items, StepError> {
        let shared = &self.run.shared;
        let over = fan_out
            .over_step
            .ok_or_else(|| StepError::Items(format!("unknown step `{}`", fan_out.over)))?;
        let over_data = self.run.outputs.get(over);
        let (items, total): (Items, usize) = match &over_data.file {
            Some(path) => {
                let first_pass =
                    open_file_items(path).map_err(|e| StepError::Items(e.to_string()))?;
                let total = if has_templated_source(&fan_out.task) {
                    let items: Vec<Value> = first_pass.filter_map(Result::ok).collect();
                    check_sources(shared, scope, &fan_out.task, &items)?;
                    items.len()
                } else {
                    first_pass.count()
                };
                let reader = open_file_items(path).map_err(|e| StepError::Items(e.to_string()))?;
                (
                    Box::new(reader.map(|r| r.map_err(|e| e.to_string()))),
                    total,
                )
            }
            None => {
                let items = over_data.items.unwrap_or_default();
                check_sources(shared, scope, &fan_out.task, &items)?;
                let total = items.len();
                (listed(items), total)
            }
        };
        if self.shard.is_none() {
            shared.events.emit(RunEvent::StepTotal {
                step: self.index,
                total: total as u64,
            });
        }
        Ok(items)
    }

    /// A fan-out step: one task per item, judged by `on_error` and `min_success`.
    async fn fan_out(
        &self,
        scope: &Scope<'_, '_>,
        fan_out: &FanOut,
        mut tally: Tally<'_>,
    ) -> Result<(), StepError> {
        let shared = &self.run.shared;
        let step = scope.step;
        let mut items = self.fan_out_items(scope, fan_out)?;
        let mut on_done = |done: TaskDone| tally.record(done);
        let tasks = Tasks::new(scope.config, &fan_out.task, scope.base, scope.env)
            .contexts(TaskContext::PerItem)
            .cap(step.concurrency);
        if step.backend == Backend::Batch || shared.batch_all {
            tasks.run_batch(shared, &mut *items, &mut on_done).await?;
        } else {
            tasks.run(shared, &mut *items, &mut on_done).await?;
        }
        let (successes, failures) = (tally.successes, tally.failures);
        let total = successes + failures;
        let draining = shared.drain.is_cancelled();
        if total == 0 && self.shard.is_none() && !draining {
            shared.events.warn(
                &step.id,
                &format!(
                    "`{}` gave no items, so this step sent nothing",
                    fan_out.over
                ),
            );
        }
        tally.results.sort_by_key(|(i, _)| *i);
        let needed = match (step.min_success, step.on_error) {
            // A shard has only part of the tasks: `summon merge` counts them all.
            (Some(_), _) if self.shard.is_some() => 0,
            (Some(min), _) => min.required(total),
            // At least one: a step whose every task failed did not do its work
            // (`min_success: 0` says that it may).
            (None, OnError::Continue) => total.min(1),
            (None, OnError::FailFast) => total,
        };
        let ok = successes >= needed
            && !(step.on_error == OnError::FailFast && step.min_success.is_none() && failures > 0);
        // No template reads the text of this step (it keeps its results when one does): it
        // is only printed, from where it is.
        if let Some(text) = tally.final_text.finish().map_err(StepError::KeepText)? {
            self.run.outputs.set_final(text);
        }
        let results = tally.results;
        let first_error = tally.first_error.unwrap_or_default();
        self.run.outputs.set(
            self.index,
            StepData {
                results: self
                    .keep_results
                    .then(|| results.into_iter().map(|(_, v)| v).collect()),
                ..StepData::default()
            },
        );
        if ok && !draining {
            Ok(())
        } else if draining && failures == 0 {
            Err(StepError::interrupted())
        } else if draining {
            // `min_success` is for the whole step: not judged on the part that ran.
            Err(StepError::Interrupted {
                ran: Some((successes, total)),
                first_error,
            })
        } else {
            Err(StepError::TooFewSucceeded {
                succeeded: successes,
                total,
                needed,
                first_error,
            })
        }
    }

    /// A synthesize or delegate step: one task (or a reduction in levels).
    async fn single(
        &self,
        scope: &Scope<'_, '_>,
        task: &TaskTemplate,
        mut tally: Tally<'_>,
    ) -> Result<(), StepError> {
        let run = &self.run;
        let step = scope.step;
        if let Some(reduce) = &step.reduce {
            let reduction = super::reduce::Reduction {
                shared: &run.shared,
                pipeline: &run.pipeline,
                step,
                config: scope.config,
                task,
                reduce,
                steps: run.outputs.to_json(&run.pipeline),
                params: &run.params,
                agents: &run.agents,
                env: scope.env,
            };
            if let Some(output) = reduction.run().await? {
                run.outputs.set(
                    self.index,
                    StepData {
                        output: Some(output),
                        ..StepData::default()
                    },
                );
                return Ok(());
            }
        }
        let mut items = listed(vec![Value::Null]);
        Tasks::new(scope.config, task, scope.base, scope.env)
            .cap(Some(1))
            .run(&run.shared, &mut *items, &mut |done| tally.record(done))
            .await?;
        run.outputs.set(
            self.index,
            StepData {
                output: tally.output.clone(),
                data: tally.structured.clone(),
                ..StepData::default()
            },
        );
        if tally.failures > 0 {
            Err(tally.first_error().into())
        } else if tally.output.is_none() {
            Err(StepError::interrupted())
        } else {
            Ok(())
        }
    }
}

/// What a step's tasks are rendered with.
struct Scope<'a, 'e> {
    step: &'a Step,
    config: &'a StepConfig,
    base: &'a minijinja::Value,
    env: &'a minijinja::Environment<'e>,
}

impl Scope<'_, '_> {
    /// A template of the step rendered with its base context (no item).
    fn render(&self, template: &crate::pipeline::model::Template) -> Result<String, StepError> {
        self.env
            .render_str(&template.text, self.base)
            .map_err(|e| StepError::Render(template.render_error(&e)))
    }

    /// A shell command template rendered with its base context, every value quoted as data.
    fn render_command(
        &self,
        template: &crate::pipeline::model::Template,
    ) -> Result<String, StepError> {
        crate::template::render_command(self.env, &template.text, self.base)
            .map_err(|e| StepError::Render(template.render_error(&e)))
    }
}

/// Whether the task's `source:` is a template (it can name a different source per item).
fn has_templated_source(task: &TaskTemplate) -> bool {
    task.source
        .as_ref()
        .is_some_and(|s| crate::template::has_template(&s.text))
}

/// Every source name a templated `source:` renders to must be in the run's catalog before
/// any task of the step is sent.
fn check_sources(
    shared: &Shared,
    scope: &Scope<'_, '_>,
    task: &TaskTemplate,
    items: &[Value],
) -> Result<(), StepError> {
    let Some(source) = task.source.as_ref().filter(|_| has_templated_source(task)) else {
        return Ok(());
    };
    let render_error = |e: minijinja::Error| StepError::Render(source.render_error(&e));
    let template = scope
        .env
        .template_from_str(&source.text)
        .map_err(render_error)?;
    for (index, item) in items.iter().enumerate() {
        let ctx = super::context::item_context(scope.base, item, index as u64);
        let name = template.render(&ctx).map_err(|e| {
            StepError::Render(format!(
                "item {index}: {}",
                crate::compile::source_error_in(source, &e, &ctx)
            ))
        })?;
        if let Some(name) = crate::compile::named_source(&name)
            && shared.catalog.get(name).is_none()
        {
            return Err(StepError::Source(crate::compile::run_catalog_error(
                &shared.catalog,
                name,
            )));
        }
    }
    Ok(())
}
