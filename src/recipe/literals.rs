//! Text that looks like a placeholder but is no template expression (`{{hf model org}}`,
//! common in prompts about model names) is kept as text, as goose keeps it, instead of
//! failing the whole recipe: it is wrapped in `{% raw %}` before the template is compiled.

use std::collections::BTreeSet;

use crate::template::{self, TemplateError};

/// A `{{ ... }}` kept as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Literal {
    /// The line (1-based) of the template text it is on.
    pub(crate) line: u32,
    /// The placeholder as written, braces included.
    pub(crate) text: String,
}

/// `text` with every one-line `{{ ... }}` that does not compile as an expression wrapped in
/// `{% raw %}`, and those placeholders; `None` when there is none. Quoted contents
/// (`{{'{{key}}'}}`, goose's escape) and plain names are left alone, as goose leaves them.
pub(crate) fn keep_literals(text: &str) -> Option<(String, Vec<Literal>)> {
    let mut out = String::with_capacity(text.len() + 32);
    let mut literals = Vec::new();
    let mut rest = text;
    let mut line = 1u32;
    while let Some(open) = rest.find("{{") {
        let after = &rest[open + 2..];
        let Some(close) = after.find("}}").filter(|&c| !after[..c].contains('\n')) else {
            // No closing braces on this line: copy through the opening braces and go on.
            out.push_str(&rest[..open + 2]);
            line += count_lines(&rest[..open + 2]);
            rest = after;
            continue;
        };
        let content = &after[..close];
        let placeholder = &rest[open..open + 2 + close + 2];
        out.push_str(&rest[..open]);
        line += count_lines(&rest[..open]);
        if is_expression(content) {
            out.push_str(placeholder);
        } else {
            out.push_str("{% raw %}");
            out.push_str(placeholder);
            out.push_str("{% endraw %}");
            literals.push(Literal {
                line,
                text: placeholder.to_owned(),
            });
        }
        rest = &rest[open + 2 + close + 2..];
    }
    out.push_str(rest);
    (!literals.is_empty()).then_some((out, literals))
}

fn count_lines(text: &str) -> u32 {
    u32::try_from(text.matches('\n').count()).unwrap_or(u32::MAX)
}

/// Whether `{{content}}` compiles on its own (quoted contents count as expressions).
fn is_expression(content: &str) -> bool {
    let trimmed = content.trim();
    if trimmed.starts_with('\'') || trimmed.starts_with('"') {
        return true;
    }
    let env = minijinja::Environment::new();
    env.template_from_str(&format!("{{{{{content}}}}}")).is_ok()
}

/// Renders `text`; when it does not compile because of placeholders that are no
/// expressions, renders it again with those kept as text.
pub(crate) fn render(
    env: &minijinja::Environment<'_>,
    text: &str,
    context: &minijinja::Value,
) -> Result<String, TemplateError> {
    template::render(env, text, context).or_else(|error| match keep_literals(text) {
        Some((kept, _)) => template::render(env, &kept, context),
        None => Err(error),
    })
}

/// The variables `text` reads and the placeholders kept as text to compile it.
pub(crate) fn variables(text: &str) -> Result<(BTreeSet<String>, Vec<Literal>), TemplateError> {
    match template::variables(text) {
        Ok(vars) => Ok((vars, Vec::new())),
        Err(error) => match keep_literals(text) {
            Some((kept, literals)) => Ok((template::variables(&kept)?, literals)),
            None => Err(error),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render_plain(text: &str, ctx: minijinja::Value) -> String {
        render(&template::environment(None), text, &ctx).unwrap()
    }

    #[test]
    fn goose_spaced_variables_are_kept() {
        let ctx = minijinja::context! { valid_var => "World" };
        assert_eq!(
            render_plain("Hello {{hf model org}}_{{hf model name}}!", ctx.clone()),
            "Hello {{hf model org}}_{{hf model name}}!"
        );
        assert_eq!(
            render_plain("Hello {{hf model org}_{hf model name}}!", ctx.clone()),
            "Hello {{hf model org}_{hf model name}}!"
        );
        assert_eq!(
            render_plain("Hello {{valid_var}}!", ctx.clone()),
            "Hello World!"
        );
        assert_eq!(
            render_plain("{{valid_var}} and {{invalid var}}", ctx.clone()),
            "World and {{invalid var}}"
        );
        assert_eq!(render_plain("{{'{{param_key}}'}}", ctx), "{{param_key}}");
    }

    #[test]
    fn kept_placeholders_are_listed_with_their_lines() {
        let (_, literals) = keep_literals("a {{ x | upper }}\n{{a b}} {{ y }}\n\n{{c d}}").unwrap();
        assert_eq!(
            literals,
            [
                Literal {
                    line: 2,
                    text: "{{a b}}".into()
                },
                Literal {
                    line: 4,
                    text: "{{c d}}".into()
                }
            ]
        );
        assert_eq!(
            keep_literals("{{ fine }} {% if a %}{{ a.b }}{% endif %}"),
            None
        );
    }

    #[test]
    fn other_errors_are_still_errors() {
        let env = template::environment(None);
        let ctx = minijinja::context! {};
        assert!(render(&env, "{{a b}} {{ missing }}", &ctx).is_err());
        assert!(render(&env, "{% if %}", &ctx).is_err());
        assert!(variables("{{ unclosed").is_err());
    }
}
