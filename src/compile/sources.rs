//! The source names a pipeline's tasks ask for, checked against the catalog before anything
//! is sent, so a misspelt or broken source is an error at its `source:` value (with the close
//! names, or the file that has errors) instead of a step failing halfway through the run.
//!
//! A literal `source:` is checked as written. A templated one (`"{{ item.agent }}"`) is
//! rendered with every context known beforehand: in `summon validate` and before `summon run`,
//! the items of a literal `items:` list; in a dry run, every item it expands. Names that only
//! model output decides are checked when the run renders them.

use serde_json::Value;

use super::context::{Known, item_context, named_source};
use super::pipeline::step_task;
use crate::diag::Pos;
use crate::pipeline::model::{Pipeline, StepKind, TaskTemplate};
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
    if !crate::template::has_template(&source.text) {
        // A name written in the file: the close names, as `summon load` gives them.
        let name = named_source(&source.text)?;
        return catalog
            .get(name)
            .is_none()
            .then(|| (source.pos, catalog.not_found(name).message));
    }
    // A name an item chooses: the catalog's word on model-chosen roles, as the run has it.
    let missing = |name: &str| {
        catalog
            .get(name)
            .is_none()
            .then(|| run_catalog_error(catalog, name))
    };
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
/// rendered with what is `known` (each item of a fan-out over a literal list); each problem
/// with the index of its step.
pub(crate) fn check_sources(
    tenv: &minijinja::Environment<'_>,
    pipeline: &Pipeline,
    catalog: &Catalog,
    known: &Known<'_>,
) -> Vec<(usize, Pos, String)> {
    let mut problems = Vec::new();
    for (index, step) in pipeline.steps.iter().enumerate() {
        let Some(task) = step_task(step) else {
            continue;
        };
        let over = match &step.kind {
            StepKind::FanOut(fan_out) => Some(fan_out.over.as_str()),
            _ => None,
        };
        // A source that reads what a step produces during the run is rendered then.
        let reads_known = task
            .source
            .as_ref()
            .is_none_or(|source| known.reads_only_literal_items(&source.text));
        let mut items;
        let contexts = match over {
            _ if !reads_known => Contexts::Unknown,
            None => Contexts::One(&known.base),
            Some(over) => match known.literal_items(over) {
                Some(list) => {
                    items = list.iter().cloned();
                    Contexts::Items(&known.base, &mut items)
                }
                None => Contexts::Unknown,
            },
        };
        if let Some((pos, message)) = check_task(tenv, catalog, task, contexts) {
            problems.push((index, pos, message));
        } else if let StepKind::Decompose(_) = &step.kind
            && let Some(problem) = decompose_schema_problem(catalog, task)
        {
            problems.push((index, problem.0, problem.1));
        }
    }
    problems
}

/// A subagent decompose without a `schema:` of its own, whose literal source's
/// `response.json_schema` cannot give items ([`crate::pipeline::items::items_of_schema`]).
fn decompose_schema_problem(catalog: &Catalog, task: &TaskTemplate) -> Option<(Pos, String)> {
    use crate::source::SourceDef;
    let source = task.source.as_ref().filter(|_| task.schema.is_none())?;
    if crate::template::has_template(&source.text) {
        return None;
    }
    let name = named_source(&source.text)?;
    let (SourceDef::Recipe(recipe) | SourceDef::Subrecipe { recipe, .. }) = &catalog.get(name)?.def
    else {
        return None;
    };
    let schema = recipe.response_schema.as_ref()?;
    let why = crate::pipeline::items::items_of_schema(schema).err()?;
    Some((
        source.pos,
        format!(
            "the `response.json_schema` of `{name}` cannot give a decompose step its items: \
             {why}; give the step a `schema:` that does"
        ),
    ))
}

/// The error of a task whose rendered source the run's catalog lacks (SPEC §6), with the
/// close names when there are some, or whose file is there but could not be read as a source.
pub(crate) fn run_catalog_error(catalog: &Catalog, name: &str) -> String {
    if let Some(problem) = catalog.unusable(name) {
        return format!("Subagent \"{name}\" {CANNOT_BE_USED}{problem}");
    }
    let close = catalog.suggest(name);
    if close.is_empty() {
        format!("Subagent \"{name}\" {NOT_IN_CATALOG}")
    } else {
        format!(
            "Subagent \"{name}\" {NOT_IN_CATALOG} Did you mean: {}?",
            close.join(", ")
        )
    }
}

const NOT_IN_CATALOG: &str =
    "is not in this run's catalog. Use a name from it, or null for a general subagent.";
const CANNOT_BE_USED: &str = "cannot be used: ";

/// Whether a step's error is [`run_catalog_error`]: the run's catalog is frozen, so resuming
/// the run fails the same way; only a new run reads the definitions again.
pub(crate) fn is_catalog_error(message: &str) -> bool {
    message.starts_with("Subagent \"")
        && (message.contains(NOT_IN_CATALOG) || message.contains(CANNOT_BE_USED))
}
