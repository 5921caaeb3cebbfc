//! A task's `parameters:` against the source it names, before anything is sent: a required
//! recipe parameter the step does not give, a key the recipe does not declare, a literal value
//! its type rejects, or parameters given to an agent fail every task of the step, so each is
//! an error at its position.
//!
//! Only a literal `source:` is checked (a templated one is known per task, when the run
//! prepares it). A value that is a template is rendered per task and checked against its type
//! by the run; a literal one is checked here.

use std::path::Path;

use crate::diag::Pos;
use crate::pipeline::model::TaskTemplate;
use crate::recipe::params::check_value;
use crate::recipe::{InputType, Requirement};
use crate::source::{Source, SourceDef};

/// A problem of a task's parameters: where, what, and how to fix it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ParamProblem {
    pub(crate) pos: Pos,
    pub(crate) message: String,
    pub(crate) hint: Option<String>,
}

/// The problems of `task`'s parameters with `source`, the source its literal `source:` names
/// (at `source_pos`).
pub(crate) fn check_params(
    task: &TaskTemplate,
    source: &Source,
    source_pos: Pos,
) -> Vec<ParamProblem> {
    let recipe = match &source.def {
        SourceDef::Recipe(recipe) | SourceDef::Subrecipe { recipe, .. } => recipe,
        SourceDef::Agent(agent) => {
            let mut problems = Vec::new();
            if let Some((_, value)) = task.parameters.first() {
                problems.push(ParamProblem {
                    pos: value.pos,
                    message: format!("agent `{}` takes no parameters", agent.name),
                    hint: Some("an agent reads only the step's `instructions`".into()),
                });
            }
            // Alone, an agent runs its role text with a fixed task; with no text it has none.
            if task.instructions.is_none() && agent.body.trim().is_empty() {
                problems.push(ParamProblem {
                    pos: source_pos,
                    message: format!("agent `{}` has no role text to run on its own", agent.name),
                    hint: Some("give the step `instructions`".into()),
                });
            }
            return problems;
        }
    };
    let mut problems = Vec::new();
    let declared: Vec<&str> = recipe.parameters.iter().map(|p| p.key.as_str()).collect();
    for (key, value) in &task.parameters {
        if let Some(parameter) = recipe.parameters.iter().find(|p| &p.key == key) {
            // A literal value is what every task sends: its type is checked now (a file
            // parameter is read by the run).
            if !crate::template::has_template(&value.text)
                && parameter.input_type != InputType::File
                && let Err(message) = check_value(parameter, &value.text, Path::new("."))
            {
                problems.push(ParamProblem {
                    pos: value.pos,
                    message,
                    hint: None,
                });
            }
            continue;
        }
        let (message, hint) = if declared.is_empty() {
            (
                format!(
                    "unknown parameter `{key}`: recipe `{}` declares no parameters",
                    source.name
                ),
                None,
            )
        } else {
            (
                format!("unknown parameter `{key}` of recipe `{}`", source.name),
                Some(format!("declared parameters: {}", declared.join(", "))),
            )
        };
        problems.push(ParamProblem {
            pos: value.pos,
            message,
            hint,
        });
    }
    let preset = source.preset_values();
    let missing: Vec<String> = recipe
        .parameters
        .iter()
        .filter(|p| {
            p.requirement != Requirement::Optional
                && p.default.is_none()
                && !task.parameters.contains_key(&p.key)
                && !preset.contains_key(&p.key)
        })
        .map(|p| format!("`{}`", p.key))
        .collect();
    if !missing.is_empty() {
        let noun = if missing.len() == 1 {
            "a required parameter"
        } else {
            "required parameters"
        };
        problems.push(ParamProblem {
            pos: source_pos,
            message: format!(
                "recipe `{}` has {noun} the step does not give: {}",
                source.name,
                missing.join(", ")
            ),
            hint: Some(format!(
                "set {} in the step's `parameters:`",
                if missing.len() == 1 { "it" } else { "them" }
            )),
        });
    }
    problems
}
