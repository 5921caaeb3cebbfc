//! The template engine: minijinja with strict undefined, no auto-escaping, a bound on work,
//! and `include`/`extends` confined to one directory.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use minijinja::{Environment, UndefinedBehavior};

/// Template work allowed for one render (instructions executed), so a runaway loop stops.
const FUEL: u64 = 50_000_000;

/// Builds the environment used for every template. `base_dir` is where `include` and
/// `extends` may read files from; without it they fail.
pub(crate) fn environment(base_dir: Option<&Path>) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_fuel(Some(FUEL));
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .keep_trailing_newline(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    let base = base_dir.map(Path::to_path_buf);
    env.set_loader(move |name| load_confined(base.as_deref(), name));
    env
}

/// A lenient environment that renders undefined names as empty: used only to find the
/// structure of recipes whose YAML is itself templated, and what templates pull in.
/// `include` and `extends` read from `base_dir`, as in [`environment`].
pub(crate) fn lenient_environment(base_dir: Option<&Path>) -> Environment<'static> {
    let mut env = environment(base_dir);
    env.set_undefined_behavior(UndefinedBehavior::Chainable);
    env
}

/// Whether a template pulls in other files (`extends`, `include`, `import`, `from`).
pub(crate) fn uses_other_files(text: &str) -> bool {
    text.match_indices("{%").any(|(at, _)| {
        let tag = text[at + 2..].trim_start_matches(['-', '+']).trim_start();
        ["extends", "include", "import", "from"]
            .iter()
            .any(|word| tag.starts_with(word))
    })
}

/// What a template pulls in from `base_dir`, found by rendering it leniently (so a file
/// named only under a condition that is false without values is not seen).
#[derive(Debug, Default)]
pub(crate) struct Pulled {
    /// The text of every file read.
    pub(crate) sources: Vec<String>,
    /// A file that cannot be read: its name as written and why, with the line.
    pub(crate) failure: Option<(String, TemplateError)>,
}

pub(crate) fn pulled_in(text: &str, base_dir: &Path) -> Pulled {
    #[derive(Default)]
    struct Seen {
        sources: Vec<String>,
        failed: Option<String>,
    }
    let seen: std::sync::Arc<std::sync::Mutex<Seen>> = std::sync::Arc::default();
    let mut env = lenient_environment(None);
    let base = base_dir.to_path_buf();
    let main = text.to_owned();
    let record = std::sync::Arc::clone(&seen);
    env.set_loader(move |name| {
        let loaded = load_confined(Some(&base), name);
        let mut seen = record.lock().unwrap_or_else(|e| e.into_inner());
        match &loaded {
            Ok(Some(source)) => seen.sources.push(source.clone()),
            // A name computed from values the lenient render lacks is no finding.
            Ok(None) => {
                let written = quoted_in(&main, name)
                    || seen.sources.iter().any(|source| quoted_in(source, name));
                if seen.failed.is_none() && written {
                    seen.failed = Some(name.to_owned());
                }
            }
            Err(_) => {
                if seen.failed.is_none() {
                    seen.failed = Some(name.to_owned());
                }
            }
        }
        loaded
    });
    let result = env.render_str(text, minijinja::Value::UNDEFINED);
    let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
    let failure = match (result, seen.failed) {
        (Err(error), Some(name)) => Some((name, TemplateError::from(error))),
        _ => None,
    };
    Pulled {
        sources: seen.sources,
        failure,
    }
}

fn load_confined(base: Option<&Path>, name: &str) -> Result<Option<String>, minijinja::Error> {
    let refuse = |why: &str| {
        minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            format!("cannot include `{name}`: {why}"),
        )
    };
    let Some(base) = base else {
        return Err(refuse("includes are not available here"));
    };
    let relative = Path::new(name);
    if relative.is_absolute()
        || relative
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(refuse("the path must stay inside the recipe's directory"));
    }
    let path = base.join(relative);
    let (Ok(real), Ok(real_base)) = (path.canonicalize(), base.canonicalize()) else {
        return Ok(None);
    };
    if !real.starts_with(&real_base) {
        return Err(refuse("the path leaves the recipe's directory"));
    }
    std::fs::read_to_string(&real)
        .map(Some)
        .map_err(|e| refuse(&e.to_string()))
}

/// Whether `text` names `name` literally after a tag that reads a file
/// (`extends "name"`, `include 'name'`).
fn quoted_in(text: &str, name: &str) -> bool {
    ["extends", "include", "import", "from"].iter().any(|tag| {
        ['"', '\'']
            .iter()
            .any(|q| text.contains(&format!("{tag} {q}{name}{q}")))
    })
}

/// Whether a text contains template syntax at all (plain text renders to itself).
pub(crate) fn has_template(text: &str) -> bool {
    text.contains("{{") || text.contains("{%") || text.contains("{#")
}

/// The top-level variables a template reads, or its syntax error.
pub(crate) fn variables(text: &str) -> Result<BTreeSet<String>, TemplateError> {
    let env = environment(None);
    let template = env.template_from_str(text).map_err(TemplateError::from)?;
    Ok(template.undeclared_variables(false).into_iter().collect())
}

/// A template failure with the line (1-based, within the template) where it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TemplateError {
    pub(crate) message: String,
    pub(crate) line: Option<u32>,
}

impl From<minijinja::Error> for TemplateError {
    fn from(error: minijinja::Error) -> Self {
        let mut message = error.kind().to_string();
        if let Some(detail) = error.detail() {
            message = format!("{message}: {detail}");
        }
        Self {
            message,
            line: error.line().and_then(|l| u32::try_from(l).ok()),
        }
    }
}

/// Renders `text` with `context` in `env`.
pub(crate) fn render(
    env: &Environment<'_>,
    text: &str,
    context: &minijinja::Value,
) -> Result<String, TemplateError> {
    if !has_template(text) {
        return Ok(text.to_owned());
    }
    env.render_str(text, context).map_err(TemplateError::from)
}

/// The directory `{{ recipe_dir }}` names: absolute when it can be.
pub(crate) fn dir_value(dir: &Path) -> PathBuf {
    dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_undefined_is_an_error() {
        let env = environment(None);
        let err = render(&env, "a\n{{ nope }}", &minijinja::context! {}).unwrap_err();
        assert_eq!(err.line, Some(2));
        assert!(err.message.contains("undefined"), "{}", err.message);
    }

    #[test]
    fn values_are_not_escaped_or_re_rendered() {
        let env = environment(None);
        let ctx = minijinja::context! { v => "<b> {{ x }} 'q' \"d\"\nline: two" };
        let out = render(&env, "{{ v }}", &ctx).unwrap();
        assert_eq!(out, "<b> {{ x }} 'q' \"d\"\nline: two");
    }

    #[test]
    fn variables_are_listed() {
        let vars =
            variables("{{ a }} {% for x in items %}{{ x }}{{ loop.index }}{% endfor %}").unwrap();
        assert_eq!(vars, ["a", "items"].into_iter().map(String::from).collect());
    }

    #[test]
    fn includes_stay_inside_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("part.md"), "PART {{ v }}").unwrap();
        let env = environment(Some(dir.path()));
        let ctx = minijinja::context! { v => 1 };
        assert_eq!(
            render(&env, "{% include 'part.md' %}", &ctx).unwrap(),
            "PART 1"
        );
        let err = render(&env, "{% include '../x' %}", &ctx).unwrap_err();
        assert!(err.message.contains("inside the recipe"), "{}", err.message);
        let err = render(&env, "{% include '/etc/passwd' %}", &ctx).unwrap_err();
        assert!(err.message.contains("inside the recipe"), "{}", err.message);
    }

    #[test]
    fn files_pulled_in_are_read_or_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("base.md"),
            "{{ a }} {% block b %}{% endblock %}",
        )
        .unwrap();
        assert!(uses_other_files("x {%- extends 'base.md' %}"));
        assert!(!uses_other_files("{% if included %}{% endif %}"));
        let pulled = pulled_in("{% extends 'base.md' %}", dir.path());
        assert_eq!(pulled.sources, ["{{ a }} {% block b %}{% endblock %}"]);
        assert!(pulled.failure.is_none());
        let pulled = pulled_in("x\n{% include 'gone.md' %}", dir.path());
        let (name, error) = pulled.failure.unwrap();
        assert_eq!((name.as_str(), error.line), ("gone.md", Some(2)));
        // A name the lenient render cannot know is no finding.
        let pulled = pulled_in("{% include 'parts/' ~ kind ~ '.md' %}", dir.path());
        assert!(pulled.failure.is_none());
    }

    #[test]
    fn runaway_loops_stop() {
        let env = environment(None);
        let out = render(
            &env,
            "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
            &minijinja::context! {},
        );
        assert!(out.is_err());
    }
}
