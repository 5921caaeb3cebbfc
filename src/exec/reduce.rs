//! Hierarchical synthesis (`reduce: auto`, `chunk_tokens`): when a synthesize step's results do
//! not fit one request, its template is rendered over consecutive chunks of the results that
//! each fit, one task per chunk; the partial answers are synthesized the same way, level by
//! level, until one answer remains.
//!
//! ```text
//! results 0..3000 --chunks--> level 1: 30 tasks --partials--> level 2: 2 tasks --> level 3: 1
//! ```
//!
//! Each level's tasks are journaled as `<step>#<level>` with the chunk's index, so `--resume`
//! repeats only the chunks that did not finish (a chunk's request hash covers its rendered
//! results).

use std::ops::Range;
use std::sync::Arc;

use serde_json::{Value, json};

use super::context::base_context;
use super::step::{Compiled, Rendered, Shared, StepConfig, TaskContext, Tasks, prepare_task};
use super::step_error::StepError;
use crate::event::{RunEvent, TaskDone};
use crate::pipeline::model::{Pipeline, Reduce, Step, StepKind, TaskTemplate};
use crate::provider::{ChatRequest, Message, estimate_tokens};

/// Levels beyond this are a reduction that does not converge.
const MAX_LEVELS: u32 = 32;

/// A synthesis whose size is known before its fan-out runs: the fan-out iterates a literal
/// `items:` list and each of its answers has an output limit.
pub(crate) struct Foreseen {
    /// The fan_out step whose results the synthesis reads.
    pub(crate) over: usize,
    /// The decompose step with the literal items.
    pub(crate) items_step: usize,
    pub(crate) items: Vec<Value>,
    /// The output limit of each of the fan-out's answers (tokens).
    pub(crate) per_item: u32,
}

/// The foreseeable size of synthesize step `step`'s input, when it is knowable in advance.
pub(crate) fn foreseen(pipeline: &Pipeline, step: &Step) -> Option<Foreseen> {
    let over = pipeline.reduced_step(step)?;
    let fan_out = &pipeline.steps[over];
    let StepKind::FanOut(f) = &fan_out.kind else {
        return None;
    };
    let items_step = pipeline.steps.iter().position(|s| s.id == f.over)?;
    let StepKind::Decompose(crate::pipeline::model::Decompose::Items(items)) =
        &pipeline.steps[items_step].kind
    else {
        return None;
    };
    let per_item = crate::compile::StepSettings::layer(
        &crate::compile::Flags::default(),
        fan_out,
        &pipeline.settings,
    )
    .max_output_tokens?;
    Some(Foreseen {
        over,
        items_step,
        items: items.clone(),
        per_item,
    })
}

/// The `steps` context of a synthesis whose fan-out answered the items of `range` at its
/// output limit.
fn foreseen_steps(pipeline: &Pipeline, f: &Foreseen, range: Range<usize>, output: &str) -> Value {
    let mut steps = serde_json::Map::new();
    for s in &pipeline.steps {
        steps.insert(
            s.id.clone(),
            json!({"output": null, "items": null, "results": null, "data": null}),
        );
    }
    let items = &f.items[range];
    let results: Vec<Value> = items
        .iter()
        .map(|item| json!({"item": item, "output": output, "status": "completed", "data": null}))
        .collect();
    let over = &pipeline.steps[f.over].id;
    let items_id = &pipeline.steps[f.items_step].id;
    steps[items_id.as_str()]["items"] = Value::Array(items.to_vec());
    steps[over.as_str()]["items"] = Value::Array(items.to_vec());
    steps[over.as_str()]["results"] = Value::Array(results);
    Value::Object(steps)
}

/// The estimated tokens of a task's first request without results, its output limit
/// included: what every chunk of a reduction, and a whole synthesis, pays before its results.
fn fixed_tokens(prepared: &crate::delegation::Prepared) -> u64 {
    let spec = &prepared.spec;
    estimate_tokens(&ChatRequest {
        model: spec.model.clone(),
        system: spec.system.clone(),
        messages: vec![Message::user(spec.first_message.clone())],
        tools: spec.tools.specs(),
        temperature: None,
        max_tokens: prepared
            .resolved
            .endpoint
            .kind
            .output_limit(spec.max_output_tokens),
        stop: Vec::new(),
        response_format: None,
        cache: Default::default(),
    })
}

/// Fails a run before any request when a synthesize step without `reduce` cannot fit its
/// model's context window and its size is knowable in advance ([`foreseen`]): the estimate
/// is the prompt without results and the output limit, plus what each item adds when its
/// answer is at the fan-out's output limit (rendered one item at a time, so memory does not
/// grow with the items). A template that needs what only the run gives, or a model without a
/// known window, is left to the check before the synthesis's own request.
pub(super) async fn check_foreseen(
    shared: &Shared,
    pipeline: &Pipeline,
    params: &indexmap::IndexMap<String, String>,
    agents: &Value,
) -> Result<(), String> {
    let env = crate::template::environment(pipeline.file.path().parent());
    'steps: for (index, step) in pipeline.steps.iter().enumerate() {
        let (StepKind::Synthesize(task), None) = (&step.kind, &step.reduce) else {
            continue;
        };
        let Some(f) = foreseen(pipeline, step) else {
            continue;
        };
        let Ok(compiled) = Compiled::new(&env, task) else {
            continue;
        };
        let output = "x".repeat(f.per_item as usize * 4);
        let render = |range: Range<usize>| {
            let ctx = base_context(params, foreseen_steps(pipeline, &f, range, &output), agents);
            compiled.render(task, &ctx)
        };
        let Ok(empty) = render(0..0) else {
            continue;
        };
        let config = StepConfig::new(index, step, &pipeline.settings);
        let Ok(prepared) = prepare_task(shared, &config, &empty).await else {
            continue;
        };
        let spec = &prepared.spec;
        let Some(window) = spec.context_window else {
            continue;
        };
        let base = rendered_bytes(&empty);
        let mut total = fixed_tokens(&prepared);
        for i in 0..f.items.len() {
            let Ok(one) = render(i..i + 1) else {
                continue 'steps;
            };
            total += rendered_bytes(&one).saturating_sub(base).div_ceil(4);
        }
        if total > window {
            return Err(format!(
                "step `{}` cannot fit its context window: the {} results of `{}` at their output \
                 limit ({} tokens each) need about {total} tokens, but the context window of \
                 `{}` is {window} tokens; nothing was sent. Add `reduce: auto` to the step, or \
                 lower the output limit of `{}`",
                step.id,
                f.items.len(),
                pipeline.steps[f.over].id,
                f.per_item,
                spec.model,
                pipeline.steps[f.over].id,
            ));
        }
    }
    Ok(())
}

/// Consecutive chunks of items with `costs` (tokens), each costing at most `budget` (an item
/// larger than the budget alone makes a chunk of one).
pub(crate) fn pack(costs: &[u64], budget: u64) -> Vec<Range<usize>> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut used = 0u64;
    for (i, &cost) in costs.iter().enumerate() {
        if i > start && used + cost > budget {
            chunks.push(start..i);
            start = i;
            used = 0;
        }
        used += cost;
    }
    if start < costs.len() {
        chunks.push(start..costs.len());
    }
    chunks
}

/// The bytes of a rendered task that vary with its context.
fn rendered_bytes(rendered: &Rendered) -> u64 {
    let params: usize = rendered.params.iter().map(|(_, v)| v.len()).sum();
    (rendered.instructions.as_deref().map_or(0, str::len)
        + rendered.context.as_deref().map_or(0, str::len)
        + params) as u64
}

/// One level of a reduction: the template and what it is rendered over.
struct Level<'a> {
    number: u32,
    task: &'a TaskTemplate,
    /// `{item, output, status}` of the fan-out (level 1) or of the partial answers.
    inputs: Vec<Value>,
}

/// Everything a reduction of one step reads.
pub(super) struct Reduction<'a> {
    pub(super) shared: &'a Arc<Shared>,
    pub(super) pipeline: &'a Pipeline,
    pub(super) step: &'a Step,
    pub(super) config: &'a StepConfig,
    pub(super) task: &'a TaskTemplate,
    pub(super) reduce: &'a Reduce,
    /// The run's `steps` context.
    pub(super) steps: Value,
    pub(super) params: &'a indexmap::IndexMap<String, String>,
    pub(super) agents: &'a Value,
    pub(super) env: &'a minijinja::Environment<'a>,
}

impl Reduction<'_> {
    /// Runs the reduction to one answer; `Ok(None)` when every result fits one request (the
    /// step then runs as a plain synthesis).
    pub(super) async fn run(mut self) -> Result<Option<String>, StepError> {
        let over = self.pipeline.reduced_step(self.step).ok_or_else(|| {
            StepError::Failed(
                "`reduce` needs the step to read `steps.<id>.results` of exactly one fan_out step"
                    .to_owned(),
            )
        })?;
        let over_id = self.pipeline.steps[over].id.clone();
        let results = match self.steps.get_mut(&over_id).map(|s| s["results"].take()) {
            Some(Value::Array(results)) => results,
            _ => Vec::new(),
        };
        let upper_task = match &self.reduce.instructions {
            Some(instructions) => TaskTemplate {
                instructions: Some(instructions.clone()),
                ..self.task.clone()
            },
            None => self.task.clone(),
        };
        let mut level = Level {
            number: 1,
            task: self.task,
            inputs: results,
        };
        loop {
            let chunks = self.chunks(&level, &over_id).await?;
            if level.number == 1 && chunks.len() <= 1 {
                return Ok(None);
            }
            if level.number > 1 && chunks.len() >= level.inputs.len() {
                return Err(StepError::Failed(format!(
                    "the reduction does not converge: the {} partial answers of level {} do not \
                     fit together in one chunk; shorten them (max_output_tokens, \
                     reduce_instructions) or raise chunk_tokens",
                    level.inputs.len(),
                    level.number - 1
                )));
            }
            self.shared.events.emit(RunEvent::LevelStarted {
                step: self.config.index,
                level: level.number,
                chunks: chunks.len(),
            });
            let partials = self.run_level(&level, &chunks, &over_id).await?;
            if partials.len() == 1 {
                return Ok(partials.into_iter().next());
            }
            if level.number >= MAX_LEVELS {
                return Err(StepError::Failed(format!(
                    "the reduction did not converge in {MAX_LEVELS} levels"
                )));
            }
            level = Level {
                number: level.number + 1,
                task: &upper_task,
                inputs: partials
                    .iter()
                    .map(|p| json!({"item": null, "output": p, "status": "completed"}))
                    .collect(),
            };
            // `steps.<id>.partials` is the list of this level's inputs (all of them).
            if let Some(own) = self.steps.get_mut(&self.step.id) {
                own["partials"] = json!(partials);
            }
        }
    }

    /// The context of a chunk: the step's `steps`, with the reduced step's results (and
    /// `steps.<id>.partials` above level 1) only those of the chunk.
    fn chunk_context(
        &self,
        level: &Level<'_>,
        over_id: &str,
        range: Range<usize>,
    ) -> minijinja::Value {
        let mut steps = self.steps.clone();
        let slice: Vec<Value> = level.inputs[range].to_vec();
        if level.number > 1
            && let Some(own) = steps.get_mut(&self.step.id)
        {
            own["partials"] = Value::Array(slice.iter().map(|r| r["output"].clone()).collect());
        }
        if let Some(target) = steps.get_mut(over_id) {
            target["results"] = Value::Array(slice);
        }
        base_context(self.params, steps, self.agents)
    }

    /// The chunks of a level: consecutive inputs whose rendered share fits the budget.
    async fn chunks(&self, level: &Level<'_>, over_id: &str) -> Result<Vec<Range<usize>>, String> {
        let compiled = Compiled::new(self.env, level.task)?;
        let empty = compiled.render(level.task, &self.chunk_context(level, over_id, 0..0))?;
        let base_bytes = rendered_bytes(&empty);
        let mut costs = Vec::with_capacity(level.inputs.len());
        for i in 0..level.inputs.len() {
            let one = compiled.render(level.task, &self.chunk_context(level, over_id, i..i + 1))?;
            costs.push(rendered_bytes(&one).saturating_sub(base_bytes).div_ceil(4));
        }
        let budget = match self.reduce.chunk_tokens {
            Some(tokens) => tokens,
            None => self.auto_budget(&empty).await?,
        };
        Ok(pack(&costs, budget))
    }

    /// `reduce: auto`: the tokens left for results in a request that fits the model's context
    /// window, once the prompt without results and the output limit are counted.
    async fn auto_budget(&self, empty: &Rendered) -> Result<u64, String> {
        let prepared = prepare_task(self.shared, self.config, empty)
            .await
            .map_err(|f| f.message)?;
        let spec = &prepared.spec;
        let window = spec.context_window.ok_or_else(|| {
            format!(
                "`reduce: auto` needs the context window of `{}`: set `context_window` on the \
                 step or under `models` in summon.yaml, or use `chunk_tokens`",
                spec.model
            )
        })?;
        let fixed = fixed_tokens(&prepared);
        window.checked_sub(fixed).filter(|b| *b > 0).ok_or_else(|| {
            format!(
                "the prompt without results already needs about {fixed} tokens, more than the \
                 context window of `{}` ({window} tokens)",
                spec.model
            )
        })
    }

    /// Runs one task per chunk; the partial answers in chunk order.
    async fn run_level(
        &self,
        level: &Level<'_>,
        chunks: &[Range<usize>],
        over_id: &str,
    ) -> Result<Vec<String>, StepError> {
        let mut config = self.config.clone();
        config.id = format!("{}#{}", self.step.id, level.number);
        let build = |item: &Value| -> Result<minijinja::Value, String> {
            let first = item["first"].as_u64().unwrap_or(0) as usize;
            let end = item["end"].as_u64().unwrap_or(0) as usize;
            Ok(self.chunk_context(level, over_id, first..end.min(level.inputs.len())))
        };
        let items: Vec<Value> = chunks
            .iter()
            .enumerate()
            .map(
                |(c, r)| json!({"level": level.number, "chunk": c, "first": r.start, "end": r.end}),
            )
            .collect();
        let mut iter = items.into_iter().map(Ok);
        let mut partials: Vec<Option<String>> = vec![None; chunks.len()];
        let mut failure: Option<String> = None;
        let mut on_done = |done: TaskDone| -> (bool, Option<u64>) {
            let ok = done.ok;
            let slot = usize::try_from(done.index).ok();
            if ok {
                if let Some(p) = slot.and_then(|i| partials.get_mut(i)) {
                    *p = Some(done.output.clone());
                }
            } else if failure.is_none() {
                failure = Some(format!(
                    "level {}, chunk {} failed: {}",
                    level.number,
                    done.index,
                    done.error_message().unwrap_or_default()
                ));
            }
            (
                ok,
                self.shared.events.task_finished(done, Some(level.number)),
            )
        };
        let base = base_context(self.params, self.steps.clone(), self.agents);
        Tasks::new(&config, level.task, &base, self.env)
            .contexts(TaskContext::Built(&build))
            .cap(self.step.concurrency)
            .run(self.shared, &mut iter, &mut on_done)
            .await?;
        if let Some(failure) = failure {
            return Err(StepError::Failed(failure));
        }
        let done = partials.iter().filter(|p| p.is_some()).count();
        if done < partials.len() {
            return Err(StepError::Failed(format!(
                "interrupted: {done} of the {} chunks of level {} finished; `--resume` runs the rest",
                partials.len(),
                level.number
            )));
        }
        Ok(partials.into_iter().flatten().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_consecutive_and_fill_the_budget() {
        assert_eq!(pack(&[3, 3, 3, 3, 3], 6), [0..2, 2..4, 4..5]);
        assert_eq!(pack(&[1, 9, 1], 5), [0..1, 1..2, 2..3]);
        assert_eq!(pack(&[], 5), Vec::<Range<usize>>::new());
        assert_eq!(
            pack(&[2, 2], 100),
            vec![std::ops::Range { start: 0, end: 2 }]
        );
    }
}
