//! Rendering a recipe with bound parameter values.
//!
//! Values are substituted inside string values of the already parsed tree, so a value with
//! newlines, colons, quotes or `{{` can never change the recipe's structure (goose renders
//! the raw text first and breaks on such values). Only recipes whose YAML structure is itself
//! templated are rendered as a whole text before parsing; there each value is written as a
//! placeholder and put back into the parsed tree, so it cannot change the structure either.

use std::sync::Arc;

use indexmap::IndexMap;

use super::Recipe;
use super::literals;
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
        // Values are written as placeholders and put back after the YAML is parsed, so a
        // value with `: `, quotes or newlines stays text and cannot change the structure.
        let outputs: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let mut env = env.clone();
        let recorded = Arc::clone(&outputs);
        env.set_formatter(move |out, _state, value| {
            let text = value.to_string();
            if text.is_empty() {
                return Ok(());
            }
            let mut list = recorded.lock().unwrap_or_else(|e| e.into_inner());
            write!(out, "{PLACEHOLDER_OPEN}{}{PLACEHOLDER_CLOSE}", list.len()).map_err(|e| {
                minijinja::Error::new(minijinja::ErrorKind::WriteFailure, e.to_string())
            })?;
            list.push(text);
            Ok(())
        });
        let text = literals::render(&env, &recipe.file.text, &context)
            .map_err(|e| one(template_diagnostic(&recipe.file, &e, 1)))?;
        let outputs = std::mem::take(&mut *outputs.lock().unwrap_or_else(|e| e.into_inner()));
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
        let mut root = root
            .get("recipe")
            .filter(|r| r.as_map().is_some() && root.get("title").is_none())
            .cloned()
            .unwrap_or(root);
        put_back(&mut root, &outputs);
        return recipe_from_root(&file, root, true, &mut diags).ok_or(diags);
    }
    let mut root = recipe.root.clone();
    render_node(&mut root, true, &env, &context, &recipe.file, &mut diags);
    if diags.has_errors() {
        return Err(diags);
    }
    recipe_from_root(&recipe.file, root, false, &mut diags).ok_or(diags)
}

/// Marks a template output in a structurally templated recipe (private-use characters, which
/// YAML keeps as text in any scalar).
const PLACEHOLDER_OPEN: char = '\u{E000}';
const PLACEHOLDER_CLOSE: char = '\u{E001}';

/// Replaces the placeholders in every scalar (keys included) with the outputs they stand for.
fn put_back(node: &mut Node, outputs: &[String]) {
    match &mut node.value {
        Value::Scalar(text, _) => {
            if text.contains(PLACEHOLDER_OPEN) {
                *text = replace_placeholders(text, outputs);
            }
        }
        Value::Seq(items) => items.iter_mut().for_each(|item| put_back(item, outputs)),
        Value::Map(entries) => {
            for (key, value) in entries {
                put_back(key, outputs);
                put_back(value, outputs);
            }
        }
    }
}

fn replace_placeholders(text: &str, outputs: &[String]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(PLACEHOLDER_OPEN) {
        out.push_str(&rest[..start]);
        let after = &rest[start + PLACEHOLDER_OPEN.len_utf8()..];
        let Some(end) = after.find(PLACEHOLDER_CLOSE) else {
            out.push_str(&rest[start..]);
            return out;
        };
        match after[..end]
            .parse::<usize>()
            .ok()
            .and_then(|i| outputs.get(i))
        {
            Some(value) => out.push_str(value),
            None => out.push_str(&rest[start..start + PLACEHOLDER_OPEN.len_utf8() + end + 1]),
        }
        rest = &after[end + PLACEHOLDER_CLOSE.len_utf8()..];
    }
    out.push_str(rest);
    out
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
                match literals::render(env, text, context) {
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
