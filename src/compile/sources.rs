//! The source names a pipeline's tasks ask for, checked against the catalog before anything
//! is sent, so a misspelt or broken source is an error at its `source:` value (with the close
//! names, or the file that has errors) instead of a step failing halfway through the run.
//!
//! A literal `source:` is checked as written. A templated one (`"{{ item.agent }}"`) is
//! rendered with every context known beforehand: in `summon validate` and before `summon run`,
//! the items of a literal `items:` list; in a dry run, every item it expands. Names that only
//! model output decides are checked when the run renders them.

use serde_json::{Map, Value, json};

use super::context::{agents_json, base_context, item_context, named_source};
use crate::diag::Pos;
use crate::pipeline::model::{Decompose, Pipeline, StepKind, TaskTemplate};
use crate::pipeline::refs;
use crate::source::Catalog;

/// The contexts a task's source is rendered in to be checked.
pub(crate) enum Contexts<'a> {
    /// None known before the run: only a literal source is checked.
    Unknown,
    /// One task, rendered with this context.
    One(&'a minijinja::Value),
    /// One task per item, over this base context.
    Items(&'a minijinja::Value, &'a mut dyn Iterator<Item = Value>),
}

/// The first source name of `task` that the catalog lacks, at the `source:` value, with the
/// catalog's word on it. A templated source that does not render here is left to the run,
/// which reports it with what it reads.
pub(crate) fn check_task(
    tenv: &minijinja::Environment<'_>,
    catalog: &Catalog,
    task: &TaskTemplate,
    contexts: Contexts<'_>,
) -> Option<(Pos, String)> {
    let source = task.source.as_ref()?;
    let missing = |name: &str| {
        catalog
            .get(name)
            .is_none()
            .then(|| catalog.not_found(name).message)
    };
    if !crate::template::has_template(&source.text) {
        let name = named_source(&source.text)?;
        return missing(name).map(|message| (source.pos, message));
    }
    let template = tenv.template_from_str(&source.text).ok()?;
    let rendered = |ctx: &minijinja::Value| template.render(ctx).ok();
    match contexts {
        Contexts::Unknown => None,
        Contexts::One(ctx) => {
            let name = rendered(ctx)?;
            missing(named_source(&name)?).map(|message| (source.pos, message))
        }
        Contexts::Items(base, items) => {
            for (index, item) in items.enumerate() {
                let name = rendered(&item_context(base, &item, index as u64))?;
                if let Some(message) = named_source(&name).and_then(missing) {
                    return Some((source.pos, format!("item {index}: {message}")));
                }
            }
            None
        }
    }
}

/// Every source name of `pipeline` known before it runs: literal ones, and templated ones
/// rendered with `params` and the items of literal `items:` lists (each item of a fan-out
/// over one); each problem with the index of its step.
pub(crate) fn check_sources(
    pipeline: &Pipeline,
    catalog: &Catalog,
    params: &indexmap::IndexMap<String, String>,
) -> Vec<(usize, Pos, String)> {
    let tenv = crate::template::environment(pipeline.file.path().parent());
    let literal_items = |id: &str| {
        pipeline.steps.iter().find_map(|s| match &s.kind {
            StepKind::Decompose(Decompose::Items(items)) if s.id == id => Some(items),
            _ => None,
        })
    };
    let mut steps = Map::new();
    for step in &pipeline.steps {
        if let Some(items) = literal_items(&step.id) {
            steps.insert(step.id.clone(), json!({ "items": items }));
        }
    }
    let base = base_context(params, Value::Object(steps), &agents_json(catalog));
    let mut problems = Vec::new();
    for (index, step) in pipeline.steps.iter().enumerate() {
        let (task, over) = match &step.kind {
            StepKind::Decompose(Decompose::Agent(task))
            | StepKind::Synthesize(task)
            | StepKind::Delegate(task) => (task, None),
            StepKind::FanOut(fan_out) => (&fan_out.task, Some(fan_out.over.as_str())),
            StepKind::Decompose(_) => continue,
        };
        // A source that reads what a step produces during the run is rendered then.
        let reads_known = task.source.as_ref().is_none_or(|source| {
            refs::whole_steps_uses(&source.text).is_empty()
                && refs::step_refs(&source.text)
                    .iter()
                    .all(|r| r.field.as_deref() == Some("items") && literal_items(&r.id).is_some())
        });
        let mut items;
        let contexts = match over {
            _ if !reads_known => Contexts::Unknown,
            None => Contexts::One(&base),
            Some(over) => match literal_items(over) {
                Some(list) => {
                    items = list.iter().cloned();
                    Contexts::Items(&base, &mut items)
                }
                None => Contexts::Unknown,
            },
        };
        if let Some((pos, message)) = check_task(&tenv, catalog, task, contexts) {
            problems.push((index, pos, message));
        }
    }
    problems
}

/// The error of a task whose rendered source the run's catalog lacks (SPEC §6), or whose
/// file is there but could not be read as a source.
pub(crate) fn run_catalog_error(catalog: &Catalog, name: &str) -> String {
    match catalog.unusable(name) {
        Some(problem) => format!("Subagent \"{name}\" cannot be used: {problem}"),
        None => format!(
            "Subagent \"{name}\" is not in this run's catalog. Use a name from it, or null for a general subagent."
        ),
    }
}
