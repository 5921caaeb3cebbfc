//! `summon explain --source NAME`: parameters, the values that would be used and what is
//! missing (like goose's `--explain`). Exit 0 even when something is missing: this is the
//! command that tells you so.
//!
//! JSON (`--json`): `{"source", "kind", "title", "description", "parameters": [PARAM],
//! "missing": [KEY], "problems": [MESSAGE]}` where PARAM is `{"key", "input_type",
//! "requirement", "default", "description", "options", "value", "value_source"}` and
//! `value_source` is `given`, `file`, `default`, `empty` or `missing`.

use serde_json::json;

use super::Ctx;
use super::load::parameter_json;
use crate::cli::SourceArgs;
use crate::error::{Error, Result};
use crate::recipe::{ValueSource, params::Origin};

pub(crate) fn run(args: &SourceArgs, ctx: &mut Ctx) -> Result<()> {
    let catalog = ctx.catalog();
    let source = catalog
        .get(&args.source)
        .ok_or_else(|| Error::from(catalog.not_found(&args.source)))?;
    let Some(recipe) = source.recipe() else {
        let value = json!({
            "source": source.name, "kind": source.kind.name(), "title": source.name,
            "description": source.description, "parameters": [], "missing": [], "problems": [],
        });
        if args.output.json {
            ctx.out.json(&value)?;
        } else {
            ctx.out.write(&format!(
                "{} ({})\n{}\n\nNo parameters: an agent takes its task from --instructions.\n",
                source.name,
                source.kind.name(),
                source.description.trim()
            ))?;
        }
        return Ok(());
    };
    let binding = super::render::bind(source, recipe, &args.params, ctx)?;
    let mut params = Vec::new();
    let mut missing = Vec::new();
    for (parameter, entry) in recipe.parameters.iter().zip(&binding.entries) {
        let origin = match &entry.source {
            ValueSource::Given(Origin::Flag) => "given",
            ValueSource::Given(Origin::File(_)) => "file",
            ValueSource::Default => "default",
            ValueSource::Empty => "empty",
            ValueSource::Missing => {
                missing.push(parameter.key.clone());
                "missing"
            }
        };
        let mut value = parameter_json(parameter);
        value["value"] = json!(entry.value);
        value["value_source"] = json!(origin);
        params.push(value);
    }
    let problems: Vec<String> = binding
        .problems
        .items
        .iter()
        .filter(|d| !d.message.starts_with("missing required"))
        .map(|d| d.message.clone())
        .collect();
    if args.output.json {
        ctx.out.json(&json!({
            "source": source.name,
            "kind": source.kind.name(),
            "title": recipe.title,
            "description": recipe.description,
            "parameters": params,
            "missing": missing,
            "problems": problems,
        }))?;
        return Ok(());
    }
    let mut text = format!(
        "{} ({})\n{}\n\n",
        recipe.title.trim(),
        source.kind.name(),
        recipe.description.trim()
    );
    if recipe.parameters.is_empty() {
        text.push_str("No parameters.\n");
    } else {
        text.push_str("Parameters:\n");
        for (parameter, value) in recipe.parameters.iter().zip(&params) {
            let shown = match value["value"].as_str() {
                Some(v) if v.contains('\n') || v.chars().count() > 60 => {
                    format!("{} chars", v.chars().count())
                }
                Some(v) => format!("{v:?}"),
                None => "-".into(),
            };
            text.push_str(&format!(
                "  {} ({}, {}): {} [{}]\n",
                parameter.key,
                parameter.input_type.name(),
                parameter.requirement.name(),
                shown,
                value["value_source"].as_str().unwrap_or(""),
            ));
            if !parameter.description.is_empty() {
                text.push_str(&format!("      {}\n", parameter.description.trim()));
            }
        }
    }
    if !missing.is_empty() {
        let flags: Vec<String> = missing
            .iter()
            .map(|k| format!("--param {k}=VALUE"))
            .collect();
        text.push_str(&format!(
            "\nMissing: {}\n  add {}\n",
            missing.join(", "),
            flags.join(" ")
        ));
    }
    for problem in &problems {
        text.push_str(&format!("\nProblem: {problem}\n"));
    }
    ctx.out.write(&text)?;
    Ok(())
}
