//! Template checks on a recipe: every variable used must be a declared parameter (or
//! `recipe_dir`), a declared parameter nobody uses is worth a warning, and files pulled in
//! with `extends`/`include` must be readable from the recipe's folder.

use std::collections::BTreeSet;

use super::Recipe;
use super::literals;
use crate::diag::{Diagnostic, Diagnostics, Pos, Span};
use crate::template;
use crate::yaml::{Node, Value};

/// Names every template may use without declaring them.
pub(crate) const BUILTIN_VARIABLES: &[&str] = &["recipe_dir"];

/// Reports template syntax errors, undeclared variables (errors) and unused parameters
/// (warnings).
pub(crate) fn check_templates(recipe: &Recipe, diags: &mut Diagnostics) {
    let mut used = BTreeSet::new();
    let declared: BTreeSet<&str> = recipe.parameters.iter().map(|p| p.key.as_str()).collect();
    let mut check = |text: &str, base_line: u32, diags: &mut Diagnostics| {
        let (vars, kept) = match literals::variables(text) {
            Ok(found) => found,
            Err(error) => {
                let line = base_line + error.line.unwrap_or(1).saturating_sub(1);
                diags.push(
                    Diagnostic::error(format!("template error: {}", error.message))
                        .at(Span::new(&recipe.file, Pos::new(line, 1, 1))),
                );
                return;
            }
        };
        for literal in kept {
            let pos = find_text(
                &recipe.file.text,
                base_line + literal.line.saturating_sub(1),
                text.lines().count(),
                &literal.text,
            );
            diags.push(
                Diagnostic::warning(format!(
                    "`{}` is not a valid template expression; it is kept as text",
                    literal.text
                ))
                .at(Span::new(&recipe.file, pos)),
            );
        }
        if template::uses_other_files(text) {
            let pulled = template::pulled_in(text, &recipe.dir());
            if let Some((name, error)) = pulled.failure {
                let line = base_line + error.line.unwrap_or(1).saturating_sub(1);
                let pos = find_text(&recipe.file.text, line, text.lines().count(), &name);
                diags.push(
                    Diagnostic::error(format!("template error: {}", error.message))
                        .at(Span::new(&recipe.file, pos)),
                );
            }
            // What the parent or parts read counts as used; it is checked when rendered.
            for source in &pulled.sources {
                if let Ok((names, _)) = literals::variables(source) {
                    used.extend(names);
                }
            }
        }
        for var in vars {
            if !declared.contains(var.as_str()) && !BUILTIN_VARIABLES.contains(&var.as_str()) {
                let pos = find_variable(&recipe.file.text, base_line, text, &var);
                diags.push(
                    Diagnostic::error(format!(
                        "template variable `{var}` is used but not declared in `parameters`"
                    ))
                    .at(Span::new(&recipe.file, pos))
                    .with_hint(format!(
                        "declare it: `- key: {var}` with `input_type` and `requirement`"
                    )),
                );
            }
            used.insert(var);
        }
    };
    if recipe.whole_text_template {
        check(&recipe.file.text, 1, diags);
    } else {
        for_each_template(&recipe.root, false, &mut |text, line| {
            check(text, line, diags)
        });
    }
    for parameter in &recipe.parameters {
        if !used.contains(&parameter.key) {
            diags.push(
                Diagnostic::warning(format!(
                    "parameter `{}` is declared but never used in a template",
                    parameter.key
                ))
                .at(Span::new(&recipe.file, parameter.pos)),
            );
        }
    }
}

/// Calls `f(text, first_line)` for every string holding template syntax, skipping the
/// `parameters` section (its descriptions are not rendered).
fn for_each_template(node: &Node, is_nested: bool, f: &mut dyn FnMut(&str, u32)) {
    match &node.value {
        Value::Scalar(text, _) => {
            if template::has_template(text) {
                let line = node.pos.line;
                f(text, line);
            }
        }
        Value::Seq(items) => {
            for item in items {
                for_each_template(item, is_nested, f);
            }
        }
        Value::Map(entries) => {
            for (key, value) in entries {
                if key.as_str() == Some("parameters") && !is_nested {
                    continue;
                }
                for_each_template(value, true, f);
            }
        }
    }
}

/// Where `var` is used: the first line from `base_line` on that holds template syntax and
/// the name as a word.
fn find_variable(file_text: &str, base_line: u32, text: &str, var: &str) -> Pos {
    let span_lines = text.lines().count().max(1) + 2;
    let start = usize::try_from(base_line.saturating_sub(1)).unwrap_or(0);
    for (offset, line) in file_text.lines().skip(start).take(span_lines).enumerate() {
        if !(line.contains("{{") || line.contains("{%")) {
            continue;
        }
        if let Some(col) = find_word(line, var) {
            let line_no = base_line + u32::try_from(offset).unwrap_or(0);
            let col = u32::try_from(line[..col].chars().count() + 1).unwrap_or(1);
            return Pos::new(
                line_no,
                col,
                u32::try_from(var.chars().count()).unwrap_or(1),
            );
        }
    }
    Pos::new(base_line, 1, 1)
}

/// Where `needle` is written: the first line from `from_line` on (within `span_lines` more
/// lines, a block scalar's text starting one line below its key) that holds it.
fn find_text(file_text: &str, from_line: u32, span_lines: usize, needle: &str) -> Pos {
    let start = usize::try_from(from_line.saturating_sub(1)).unwrap_or(0);
    let len = u32::try_from(needle.chars().count()).unwrap_or(1);
    for (offset, line) in file_text
        .lines()
        .skip(start)
        .take(span_lines + 2)
        .enumerate()
    {
        if let Some(col) = line.find(needle) {
            let line_no = from_line + u32::try_from(offset).unwrap_or(0);
            let col = u32::try_from(line[..col].chars().count() + 1).unwrap_or(1);
            return Pos::new(line_no, col, len);
        }
    }
    Pos::new(from_line, 1, 1)
}

fn find_word(line: &str, word: &str) -> Option<usize> {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    line.match_indices(word).map(|(i, _)| i).find(|&i| {
        let before = line[..i].chars().next_back();
        let after = line[i + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}
