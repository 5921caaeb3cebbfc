//! A task's templates (`source`, `instructions`, `context`, `parameters`) compiled once and
//! rendered per task, and a render failure as a message that names its line in the pipeline
//! file: the run, its dry run and the checks before it render alike.

use indexmap::IndexMap;
use serde_json::Value;

use super::context::{Known, item_context, named_source};
use crate::diag::Pos;
use crate::pipeline::graph::step_templates;
use crate::pipeline::items::StaticForm;
use crate::pipeline::model::{Decompose, Pipeline, StepKind, TaskTemplate, Template};

/// A task with its templates rendered.
#[derive(Debug, Clone)]
pub(crate) struct Rendered {
    pub(crate) source: Option<String>,
    pub(crate) instructions: Option<String>,
    pub(crate) params: Vec<(String, String)>,
    pub(crate) context: Option<String>,
    pub(crate) extensions: Option<Vec<String>>,
    pub(crate) schema: Option<Value>,
}

/// A step's templates compiled once, rendered per task.
pub(crate) struct Compiled<'env> {
    source: Option<minijinja::Template<'env, 'env>>,
    instructions: Option<minijinja::Template<'env, 'env>>,
    context: Option<minijinja::Template<'env, 'env>>,
    params: Vec<(String, minijinja::Template<'env, 'env>)>,
    extensions: Option<Vec<String>>,
}

/// [`Template::render_error`], naming the keys there are when the template reads a field an object
/// of the context does not have (`item.body` of a CSV row: "the item has id, title, text").
pub(crate) fn render_error_in(
    template: &Template,
    error: &minijinja::Error,
    ctx: &minijinja::Value,
) -> String {
    let message = template.render_error(error);
    match missing_field(template, error, ctx) {
        Some(missing) => format!("{message}; {}", missing.keys()),
        None => message,
    }
}

/// The render failure of a `source:` template: when it reads a key the item lacks (the key
/// a model-chosen role is given by, `{{ item.agent }}`), what each item needs to have.
pub(crate) fn source_error_in(
    template: &Template,
    error: &minijinja::Error,
    ctx: &minijinja::Value,
) -> String {
    match missing_field(template, error, ctx) {
        Some(missing) if missing.base == "item" => format!(
            "line {}: `source:` reads `item.{field}`, which this item does not have ({}); \
             give each item an `{field}`: a subagent's name from the catalog, or null for a \
             general subagent",
            template.error_line(error),
            missing
                .keys()
                .replacen("the keys of `item` are", "its keys are", 1),
            field = missing.field,
        ),
        _ => render_error_in(template, error, ctx),
    }
}

/// A field a template reads that an object of its context does not have.
struct MissingField {
    base: String,
    field: String,
    keys: Vec<String>,
}

impl MissingField {
    fn keys(&self) -> String {
        if self.keys.is_empty() {
            format!("`{}` has no keys", self.base)
        } else {
            format!("the keys of `{}` are: {}", self.base, self.keys.join(", "))
        }
    }
}

fn missing_field(
    template: &Template,
    error: &minijinja::Error,
    ctx: &minijinja::Value,
) -> Option<MissingField> {
    if error.kind() != minijinja::ErrorKind::UndefinedError {
        return None;
    }
    let expr = template.text.get(error.range()?)?.trim();
    let (base, field) = expr.split_once('.')?;
    let field = field.split(['.', '[', ' ', '|']).next()?;
    let value = ctx.get_attr(base.trim()).ok()?;
    if value.kind() != minijinja::value::ValueKind::Map
        || value.get_attr(field).is_ok_and(|v| !v.is_undefined())
    {
        return None;
    }
    Some(MissingField {
        base: base.trim().to_owned(),
        field: field.to_owned(),
        keys: value.try_iter().ok()?.map(|k| k.to_string()).collect(),
    })
}

impl<'env> Compiled<'env> {
    pub(crate) fn new(
        env: &'env minijinja::Environment<'env>,
        task: &'env TaskTemplate,
    ) -> Result<Self, String> {
        let compile = |t: &'env Template| {
            env.template_from_str(&t.text)
                .map_err(|e| t.render_error(&e))
        };
        Ok(Self {
            source: task.source.as_ref().map(compile).transpose()?,
            instructions: task.instructions.as_ref().map(compile).transpose()?,
            context: task.context.as_ref().map(compile).transpose()?,
            params: task
                .parameters
                .iter()
                .map(|(k, t)| Ok((k.clone(), compile(t)?)))
                .collect::<Result<_, String>>()?,
            extensions: task.extensions.clone(),
        })
    }

    pub(crate) fn render(
        &self,
        task: &TaskTemplate,
        ctx: &minijinja::Value,
    ) -> Result<Rendered, String> {
        let render = |t: &minijinja::Template<'_, '_>, src: &Template| {
            t.render(ctx).map_err(|e| render_error_in(src, &e, ctx))
        };
        let source = match (&self.source, &task.source) {
            (Some(t), Some(src)) => {
                let name = t.render(ctx).map_err(|e| source_error_in(src, &e, ctx))?;
                named_source(&name).map(str::to_owned)
            }
            _ => None,
        };
        let instructions = match (&self.instructions, &task.instructions) {
            (Some(t), Some(src)) => Some(render(t, src)?),
            _ => None,
        };
        let context = match (&self.context, &task.context) {
            (Some(t), Some(src)) => Some(render(t, src)?),
            _ => None,
        };
        let mut params = Vec::with_capacity(self.params.len());
        for ((key, t), (_, src)) in self.params.iter().zip(&task.parameters) {
            params.push((key.clone(), render(t, src)?));
        }
        Ok(Rendered {
            source,
            instructions,
            params,
            context,
            extensions: self.extensions.clone(),
            schema: task.schema.as_deref().cloned(),
        })
    }
}

/// Every task template of `pipeline` that reads only what is `known` before the run (the
/// parameters given, `agents`, and the items of literal `items:` lists, with `item` and
/// `loop` over one), rendered as the run renders it: the first failure of each step, at the
/// step, as the dry run words it (`item 1: line 12: cannot render template: ...`).
pub(crate) fn check_renders(
    tenv: &minijinja::Environment<'_>,
    pipeline: &Pipeline,
    known: &Known<'_>,
    params: &IndexMap<String, String>,
) -> Vec<(usize, Pos, String)> {
    let declared: Vec<&str> = pipeline.parameters.iter().map(|p| p.key.as_str()).collect();
    let reads_known = |template: &Template| {
        known.reads_only_literal_items(&template.text)
            && crate::template::variables(&template.text).is_ok_and(|vars| {
                vars.iter()
                    .all(|v| !declared.contains(&v.as_str()) || params.contains_key(v))
            })
    };
    let base = &known.base;
    let mut problems = Vec::new();
    for (index, step) in pipeline.steps.iter().enumerate() {
        if !step_templates(step).into_iter().all(reads_known) {
            continue;
        }
        // A static form's failure is at its key (`decompose.command` ...), not at the step.
        let mut at = step.pos;
        let problem = match &step.kind {
            StepKind::Decompose(Decompose::Items(_)) => None,
            StepKind::Decompose(Decompose::Static(form, template)) => {
                at = template.pos;
                if *form == StaticForm::Command {
                    crate::template::render_command(tenv, &template.text, base)
                } else {
                    tenv.render_str(&template.text, base)
                }
                .err()
                .map(|e| format!("`decompose.{}`: {}", form.name(), template.render_error(&e)))
            }
            StepKind::Decompose(Decompose::Agent(task))
            | StepKind::Synthesize(task)
            | StepKind::Delegate(task) => Compiled::new(tenv, task)
                .and_then(|compiled| compiled.render(task, base))
                .err(),
            StepKind::FanOut(fan_out) => known.literal_items(&fan_out.over).and_then(|items| {
                let compiled = match Compiled::new(tenv, &fan_out.task) {
                    Ok(compiled) => compiled,
                    Err(message) => return Some(message),
                };
                items.iter().enumerate().find_map(|(i, item)| {
                    let ctx = item_context(base, item, i as u64);
                    compiled
                        .render(&fan_out.task, &ctx)
                        .err()
                        .map(|e| format!("item {i}: {e}"))
                })
            }),
        };
        if let Some(message) = problem {
            problems.push((index, at, message));
        }
    }
    problems
}
