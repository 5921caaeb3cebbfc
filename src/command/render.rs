//! `summon render --source NAME`: the recipe with its parameters filled in, as YAML (like
//! goose's `--render-recipe`).
//!
//! JSON (`--json`): `{"source", "kind", "title", "description", "instructions", "prompt",
//! "settings": {"provider", "model", "temperature", "max_turns"}, "parameters": {KEY: VALUE},
//! "extensions": [NAME], "sub_recipes": [NAME], "response_schema", "version", "author",
//! "activities"}`; for an agent:
//! `{"source", "kind": "agent", "description", "model", "tools", "instructions"}`.

use indexmap::IndexMap;
use serde_json::json;

use super::Ctx;
use crate::cli::{ParamArgs, SourceArgs};
use crate::error::{Error, Result};
use crate::output::to_yaml;
use crate::recipe::{Binding, ParamInput, Recipe, bind_params, render_recipe};
use crate::source::{Source, SourceDef};

pub(crate) fn run(args: &SourceArgs, ctx: &mut Ctx) -> Result<()> {
    let catalog = ctx.catalog();
    let source = catalog
        .get(&args.source)
        .ok_or_else(|| Error::from(catalog.not_found(&args.source)))?;
    let value = match source.recipe() {
        Some(recipe) => {
            let binding = bind(source, recipe, &args.params, ctx)?;
            if binding.problems.has_errors() {
                return Err(binding.problems.into());
            }
            let values = binding.values();
            let rendered = render_recipe(recipe, &values).map_err(Error::Input)?;
            recipe_json(source, &rendered, &values)
        }
        None => {
            if !args.params.param.is_empty() || args.params.params_file.is_some() {
                return Err(Error::usage(format!(
                    "agent `{}` takes no parameters",
                    source.name
                )));
            }
            agent_json(source)
        }
    };
    if args.output.json {
        ctx.out.json(&value)?;
    } else {
        ctx.out.write(&to_yaml(&without_nulls(value)))?;
    }
    Ok(())
}

/// People do not need to see unset fields.
fn without_nulls(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => map
            .into_iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k, without_nulls(v)))
            .filter(|(_, v)| !matches!(v, serde_json::Value::Object(m) if m.is_empty()))
            .collect::<serde_json::Map<_, _>>()
            .into(),
        other => other,
    }
}

/// Binds the command line's parameters to a recipe source. A subrecipe's `values` that are
/// plain text count as given.
pub(crate) fn bind(
    source: &Source,
    recipe: &Recipe,
    args: &ParamArgs,
    ctx: &Ctx,
) -> Result<Binding> {
    let input = ParamInput::from_args(args.params_file.as_deref(), &args.param, &ctx.env.cwd)?;
    Ok(bind_params(
        &recipe.parameters,
        &input,
        &source.preset_values(),
        Some(&recipe.file),
        &ctx.env.cwd,
    ))
}

fn recipe_json(
    source: &Source,
    recipe: &Recipe,
    values: &IndexMap<String, String>,
) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    out.insert("source".into(), json!(source.name));
    out.insert("kind".into(), json!(source.kind.name()));
    out.insert("title".into(), json!(recipe.title));
    out.insert("description".into(), json!(recipe.description));
    out.insert("instructions".into(), json!(recipe.instructions));
    out.insert("prompt".into(), json!(recipe.prompt));
    let s = &recipe.settings;
    out.insert(
        "settings".into(),
        json!({"provider": s.provider, "model": s.model, "temperature": s.temperature, "max_turns": s.max_turns}),
    );
    out.insert("parameters".into(), json!(values));
    out.insert(
        "extensions".into(),
        json!(
            recipe
                .extensions
                .iter()
                .map(|e| e.name.clone())
                .collect::<Vec<_>>()
        ),
    );
    out.insert(
        "sub_recipes".into(),
        json!(
            recipe
                .sub_recipes
                .iter()
                .map(|s| s.name.clone())
                .collect::<Vec<_>>()
        ),
    );
    out.insert("response_schema".into(), json!(recipe.response_schema));
    out.insert("version".into(), json!(recipe.version));
    out.insert("author".into(), json!(recipe.author));
    out.insert("activities".into(), json!(recipe.activities));
    serde_json::Value::Object(out)
}

fn agent_json(source: &Source) -> serde_json::Value {
    let SourceDef::Agent(agent) = &source.def else {
        return json!({});
    };
    json!({
        "source": source.name,
        "kind": "agent",
        "description": agent.description,
        "model": agent.model,
        "tools": agent.tools.as_ref().map(|t| t.iter().map(|r| r.raw.clone()).collect::<Vec<_>>()),
        "instructions": agent.body.trim(),
    })
}
