//! A step's `tools:` checked against what its task has, before anything is sent: an entry
//! naming an extension the task does not have (a misspelt tool name reads as one) is an error
//! at the entry, in `summon validate`, `run --dry-run` and `run`.
//!
//! The task's extensions are known when its `extensions:` are listed, or its source is
//! literal (a recipe's own extensions, an agent's `mcp__server` entries; none for an ad-hoc
//! task). A templated source is checked when the run prepares each task.

use super::context::named_source;
use crate::agent::ToolKind;
use crate::diag::Pos;
use crate::pipeline::model::{Step, TaskTemplate};
use crate::source::{Catalog, SourceDef};
use crate::subagent::tool::Subset;

/// The first `tools:` entry of `step` its task cannot have, at the entry.
pub(crate) fn check_step(step: &Step, catalog: &Catalog) -> Option<(Pos, String)> {
    let listed = step.tools.as_ref()?;
    let task = super::pipeline::step_task(step)?;
    let extensions = task_extensions(task, catalog)?;
    let raw: Vec<String> = listed.iter().map(|(name, _)| name.clone()).collect();
    let subset = Subset::parse(&raw).ok()?;
    let (index, message) = subset.problem(&raw, &extensions)?;
    Some((listed[index].1, message))
}

/// The names of the extensions a task has, when known before the run.
fn task_extensions(task: &TaskTemplate, catalog: &Catalog) -> Option<Vec<String>> {
    if let Some(listed) = &task.extensions {
        return Some(listed.clone());
    }
    let Some(source) = &task.source else {
        return Some(Vec::new());
    };
    if crate::template::has_template(&source.text) {
        return None;
    }
    let Some(name) = named_source(&source.text) else {
        return Some(Vec::new());
    };
    Some(match &catalog.get(name)?.def {
        SourceDef::Recipe(recipe) | SourceDef::Subrecipe { recipe, .. } => {
            recipe.extensions.iter().map(|e| e.name.clone()).collect()
        }
        SourceDef::Agent(agent) => agent
            .tools
            .iter()
            .flatten()
            .filter_map(|t| match &t.kind {
                ToolKind::Mcp { server, .. } => Some(server.clone()),
                _ => None,
            })
            .collect(),
    })
}
