//! The text of a new goose recipe, `recipes/NAME.yaml`.

use super::param_spec::ParamSpec;
use super::yaml_text::{field, scalar};

/// What `summon new recipe` was given.
#[derive(Debug, Clone)]
pub(crate) struct RecipeSpec<'a> {
    pub(crate) name: &'a str,
    pub(crate) title: &'a str,
    pub(crate) description: &'a str,
    pub(crate) instructions: Option<&'a str>,
    pub(crate) prompt: Option<&'a str>,
    pub(crate) params: &'a [ParamSpec],
    pub(crate) provider: Option<&'a str>,
    pub(crate) model: Option<&'a str>,
}

/// `release-notes` → `Release notes`.
pub(crate) fn title_from_name(name: &str) -> String {
    let words = name.replace(['-', '_'], " ");
    let mut chars = words.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// The recipe file, every section commented.
pub(crate) fn recipe_text(spec: &RecipeSpec<'_>) -> String {
    let name = spec.name;
    let mut text = format!(
        "# Recipe `{name}` (goose's recipe format): `summon delegate --source {name}`, `summon load\n\
         # {name}`, or `fan_out.source: {name}` in a pipeline. `summon explain --source {name}`\n\
         # shows its parameters; `summon validate` checks it.\n\
         version: 1.0.0\n"
    );
    text.push_str(&format!("title: {}\n", scalar(spec.title)));
    text.push_str(&format!("description: {}\n", scalar(spec.description)));
    text.push_str("# The system prompt: who the subagent is and how it works.\n");
    let instructions = spec.instructions.unwrap_or(
        "You are a careful assistant working in this project.\n\
         Read the files you need with your tools before answering, and answer with the result\n\
         only.",
    );
    text.push_str(&field(0, "instructions", instructions));
    let prompt = spec.prompt.map(str::to_owned).or_else(|| {
        (!spec.params.is_empty()).then(|| {
            let mut prompt = String::from("Do the task with these values:\n");
            for p in spec.params {
                prompt.push_str(&format!("- {}: {{{{ {} }}}}\n", p.key, p.key));
            }
            prompt
        })
    });
    match prompt {
        Some(prompt) => {
            text.push_str(
                "# The task, sent as the first user message; `--instructions` adds to it.\n",
            );
            text.push_str(&field(0, "prompt", &prompt));
        }
        None => text.push_str(
            "# prompt: the task, sent as the first user message (without it, pass the task\n\
             # with `summon delegate --source NAME --instructions \"...\"`).\n",
        ),
    }
    if spec.params.is_empty() {
        text.push_str(
            "# parameters:             # values come from --param KEY=VALUE or --params FILE\n\
             #   - key: path           # used as {{ path }} in the prompt\n\
             #     input_type: string  # string, number, boolean, date, file, select\n\
             #     requirement: required\n\
             #     description: The file or folder to work on\n",
        );
    } else {
        text.push_str(
            "# Values come from --param KEY=VALUE or --params FILE; `{{ KEY }}` inserts one.\n",
        );
        text.push_str(&parameters_yaml(spec.params));
    }
    let settings: Vec<(&str, &str)> = [
        ("goose_provider", spec.provider),
        ("goose_model", spec.model),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k, v)))
    .collect();
    if settings.is_empty() {
        text.push_str(
            "# settings:                # the run's provider and model unless set here\n\
             #   goose_provider: openai\n\
             #   goose_model: gpt-4o-mini\n\
             #   temperature: 0.2\n\
             #   max_turns: 25\n",
        );
    } else {
        text.push_str("settings:\n");
        for (key, value) in settings {
            text.push_str(&format!("  {key}: {}\n", scalar(value)));
        }
    }
    text.push_str(
        "# extensions:              # `developer` gives the subagent the `shell` tool\n\
         #   - type: builtin\n\
         #     name: developer\n",
    );
    text
}

/// A `parameters:` list (recipes and pipelines share the schema).
pub(super) fn parameters_yaml(params: &[ParamSpec]) -> String {
    let mut text = String::from("parameters:\n");
    for p in params {
        text.push_str(&format!("  - key: {}\n", p.key));
        text.push_str(&format!("    input_type: {}\n", p.input_type));
        match &p.default {
            Some(default) => {
                text.push_str("    requirement: optional\n");
                text.push_str(&format!("    default: {}\n", scalar(default)));
            }
            None => text.push_str("    requirement: required\n"),
        }
        if !p.options.is_empty() {
            text.push_str("    options:\n");
            for option in &p.options {
                text.push_str(&format!("      - {}\n", scalar(option)));
            }
        }
        text.push_str(&format!(
            "    description: {}\n",
            scalar(&title_from_name(&p.key))
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles() {
        assert_eq!(title_from_name("release-notes"), "Release notes");
        assert_eq!(title_from_name("a_b"), "A b");
    }
}
