//! Rendering a recipe with bound parameter values.
//!
//! Values are substituted inside string values of the already parsed tree, so a value with
//! newlines, colons, quotes or `{{` can never change the recipe's structure (goose renders
//! the raw text first and breaks on such values). Only recipes whose YAML structure is itself
//! templated are rendered as a whole text before parsing.

use std::sync::Arc;

use indexmap::IndexMap;

use super::Recipe;
use super::parse::recipe_from_root;
use crate::diag::{Diagnostic, Diagnostics, Pos, SourceFile, Span};
use crate::template::{self, TemplateError};
use crate::yaml::{self, Node, ScalarStyle, Value};

/// The template context: every parameter as a string, plus `recipe_dir`.
pub(crate) fn template_context(
    recipe: &Recipe,
    values: &IndexMap<String, String>,
) -> minijinja::Value {
    let mut map = values.clone();
    map.insert(
        "recipe_dir".into(),
        template::dir_value(&recipe.dir()).display().to_string(),
    );
    minijinja::Value::from(minijinja::value::Serde(&map))
}

/// Renders every template in the recipe with `values`; errors point at the template.
pub(crate) fn render_recipe(
    recipe: &Recipe,
    values: &IndexMap<String, String>,
) -> Result<Recipe, Diagnostics> {
    let env = template::environment(Some(&recipe.dir()));
    let context = template_context(recipe, values);
    let mut diags = Diagnostics::default();
    if recipe.whole_text_template {
        let text = template::render(&env, &recipe.file.text, &context)
            .map_err(|e| one(template_diagnostic(&recipe.file, &e, 1)))?;
        let file = SourceFile::new(recipe.path(), text);
        let root = match yaml::parse(&file.text) {
            Ok(Some(root)) => root,
            Ok(None) => {
                return Err(one(
                    Diagnostic::error("the rendered recipe is empty").in_file(recipe.path())
                ));
            }
            Err(e) => {
                return Err(one(Diagnostic::error(format!(
                    "the rendered recipe is not valid YAML: {}",
                    e.message
                ))
                .in_file(recipe.path())));
            }
        };
        let root = root
            .get("recipe")
            .filter(|r| r.as_map().is_some() && root.get("title").is_none())
            .cloned()
            .unwrap_or(root);
        return recipe_from_root(&file, root, true, &mut diags).ok_or(diags);
    }
    let mut root = recipe.root.clone();
    render_node(&mut root, true, &env, &context, &recipe.file, &mut diags);
    if diags.has_errors() {
        return Err(diags);
    }
    recipe_from_root(&recipe.file, root, false, &mut diags).ok_or(diags)
}

fn one(diagnostic: Diagnostic) -> Diagnostics {
    let mut diags = Diagnostics::default();
    diags.push(diagnostic);
    diags
}

fn render_node(
    node: &mut Node,
    is_root: bool,
    env: &minijinja::Environment<'_>,
    context: &minijinja::Value,
    file: &Arc<SourceFile>,
    diags: &mut Diagnostics,
) {
    let pos = node.pos;
    match &mut node.value {
        Value::Scalar(text, style) => {
            if template::has_template(text) {
                let base_line = pos.line;
                match template::render(env, text, context) {
                    Ok(rendered) => {
                        *text = rendered;
                        // A rendered plain scalar is text, never re-typed as a number or null.
                        if *style == ScalarStyle::Plain {
                            *style = ScalarStyle::Quoted;
                        }
                    }
                    Err(e) => diags.push(template_diagnostic(file, &e, base_line)),
                }
            }
        }
        Value::Seq(items) => {
            for item in items {
                render_node(item, false, env, context, file, diags);
            }
        }
        Value::Map(entries) => {
            for (key, value) in entries {
                if is_root && key.as_str() == Some("parameters") {
                    continue;
                }
                render_node(value, false, env, context, file, diags);
            }
        }
    }
}

fn template_diagnostic(
    file: &Arc<SourceFile>,
    error: &TemplateError,
    base_line: u32,
) -> Diagnostic {
    let line = base_line + error.line.unwrap_or(1).saturating_sub(1);
    Diagnostic::error(format!("cannot render template: {}", error.message))
        .at(Span::new(file, Pos::new(line, 1, 1)))
}
