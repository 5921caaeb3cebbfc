//! The template engine: minijinja with strict undefined, no auto-escaping, a bound on work,
//! and `include`/`extends` confined to one directory.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use minijinja::{Environment, UndefinedBehavior};

/// Template work allowed for one render, so a runaway loop or text that keeps doubling stops
/// with an error instead of exhausting memory. minijinja charges one unit of fuel for each
/// instruction and for each 64 bytes of text a render makes (output, `~`, `*`, filters): this
/// allows 8 million steps, or 512 MiB of text made in all.
const FUEL: u64 = 8_000_000;

/// What [`FUEL`] allows, in the words of the error when a render runs out of it.
const FUEL_LIMIT: &str = "the template did more work than summon allows for one render (8 million \
                          steps, or 512 MiB of text made): a loop that does not end, or text \
                          that keeps growing";

/// A render failure's message: its kind and detail, or the limit it ran into.
pub(crate) fn describe(error: &minijinja::Error) -> String {
    if error.kind() == minijinja::ErrorKind::OutOfFuel {
        return FUEL_LIMIT.to_owned();
    }
    let message = error.kind().to_string();
    match error.detail() {
        Some(detail) => format!("{message}: {detail}"),
        None => message,
    }
}

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
    // The engine's own functions (`range`, `namespace`, `dict`, ...) are no variables.
    let globals: BTreeSet<&str> = env.globals().map(|(name, _)| name).collect();
    Ok(template
        .undeclared_variables(false)
        .into_iter()
        .filter(|name| !globals.contains(name.as_str()))
        .collect())
}

/// A template failure with the line (1-based, within the template) where it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TemplateError {
    pub(crate) message: String,
    pub(crate) line: Option<u32>,
}

impl From<minijinja::Error> for TemplateError {
    fn from(error: minijinja::Error) -> Self {
        Self {
            message: describe(&error),
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

/// Renders a shell command template (`decompose.command`) so that every value it
/// interpolates reaches the shell as data: each `{{ ... }}` is read back by the shell as
/// exactly the value's text, one word, whatever quotes the template puts around it.
///
/// Values are rendered as unguessable placeholders first; the rendered text (the author's
/// own) is then scanned for the shell quoting at each placeholder, and the value is written
/// in the form that quoting needs: `'v'` bare, `v` with `'` as `'\''` inside single quotes,
/// `"'v'"` (closing and reopening) inside double quotes. Places where no form is safe
/// (backticks, `${...}`, `$((...))`, after a backslash or a here-document) are an error.
pub(crate) fn render_command(
    env: &Environment<'_>,
    text: &str,
    context: &minijinja::Value,
) -> Result<String, minijinja::Error> {
    use std::sync::{Arc, Mutex};

    if !has_template(text) {
        return Ok(text.to_owned());
    }
    let mark = format!("\u{1}{:032x}:", rand::random::<u128>());
    let values: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut env = env.clone();
    {
        let (values, mark) = (Arc::clone(&values), mark.clone());
        env.set_formatter(move |out, _state, value| {
            let mut values = values.lock().unwrap_or_else(|e| e.into_inner());
            let text = if value.is_undefined() {
                String::new()
            } else {
                value.to_string()
            };
            // The captured output of a block or macro holds placeholders: its values are
            // put back as plain text, and the whole is one value.
            let text = expand_marks(&text, &mark, &values);
            values.push(text);
            write!(out, "{mark}{}\u{2}", values.len() - 1)
                .map_err(|_| minijinja::Error::from(minijinja::ErrorKind::WriteFailure))
        });
    }
    let rendered = env.render_str(text, context)?;
    let values = values.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(construct) = arithmetic_construct(&rendered)
        && let Some(value) = values.iter().find(|v| runs_in_arithmetic(v))
    {
        return Err(minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            format!(
                "the value {:?} would run as a command where bash evaluates arithmetic, and this \
                 command has {construct}: bash expands an array subscript in a value it \
                 computes with, whatever quotes it had; values stay data, so it is refused",
                value.chars().take(80).collect::<String>()
            ),
        ));
    }
    shell_substitute(&rendered, &mark, &values).map_err(|why| {
        minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            format!(
                "a value is interpolated {why}, where it cannot be quoted for the shell; \
                 interpolate it as a word of its own (`cmd {{{{ x }}}}`) or inside quotes \
                 (`'{{{{ x }}}}'`, `\"{{{{ x }}}}\"`)"
            ),
        )
    })
}

/// A construct of `command` where bash evaluates a value as arithmetic, directly or through a
/// variable holding it (`(( ))`, `$(( ))`, `$[ ]`, `let`, `declare`/`typeset`/`local` (`-i`),
/// `[[ ]]` (`-eq`, `-gt`, ...), `${s:offset}`, an array subscript `a[...]`), named for the
/// error; `None` when it has none.
fn arithmetic_construct(command: &str) -> Option<&'static str> {
    let words = [
        ("((", "`(( ))`"),
        ("$[", "`$[ ]`"),
        ("[[", "`[[ ]]`"),
        ("let ", "`let`"),
        ("declare ", "`declare`"),
        ("typeset ", "`typeset`"),
        ("local ", "`local`"),
    ];
    if let Some((_, name)) = words.iter().find(|(word, _)| command.contains(word)) {
        return Some(name);
    }
    // `${name:offset}` and `${name[subscript]}`.
    let mut rest = command;
    while let Some(at) = rest.find("${") {
        let inside = &rest[at + 2..];
        let end = inside.find('}').unwrap_or(inside.len());
        if inside[..end].contains([':', '[']) {
            return Some("`${...}` with an offset or a subscript");
        }
        rest = &inside[end..];
    }
    // An array element assigned or read: `name[`.
    let bytes = command.as_bytes();
    let subscript = bytes.iter().enumerate().any(|(i, b)| {
        *b == b'[' && i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_')
    });
    subscript.then_some("an array subscript (`name[...]`)")
}

/// Whether bash arithmetic would run part of `value` as a command: a subscript (`[`) followed
/// by an expansion (`$`) or a backtick.
fn runs_in_arithmetic(value: &str) -> bool {
    value
        .find('[')
        .is_some_and(|at| value[at..].contains(['$', '`']))
}

/// `text` with every placeholder of `mark` replaced by its value, unquoted.
fn expand_marks(text: &str, mark: &str, values: &[String]) -> String {
    if !text.contains(mark) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(mark) {
        out.push_str(&rest[..at]);
        let after = &rest[at + mark.len()..];
        match parse_mark(after).and_then(|(n, len)| Some((values.get(n)?, len))) {
            Some((value, len)) => {
                out.push_str(value);
                rest = &after[len..];
            }
            None => {
                out.push_str(&rest[at..at + mark.len()]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The value index of a placeholder whose mark was just read, and the bytes it takes.
fn parse_mark(after: &str) -> Option<(usize, usize)> {
    let end = after.find('\u{2}')?;
    let n = after[..end].parse().ok()?;
    Some((n, end + 1))
}

/// The shell quoting around a point of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quoting {
    /// Outside quotes, at the top or inside `$( )`; `parens` counts open `(`.
    Bare {
        parens: u32,
    },
    Single,
    Double,
    /// `$'...'`.
    AnsiC,
    Backtick,
    /// `${...}`.
    Param,
    /// `$(( ))`; `parens` counts open `(` inside it.
    Arith {
        parens: u32,
    },
}

/// Replaces each placeholder of `mark` in `text` by its value written for the shell quoting
/// it stands in; `Err` names the place where no form is safe.
fn shell_substitute(text: &str, mark: &str, values: &[String]) -> Result<String, &'static str> {
    let single = |v: &str| v.replace('\'', r"'\''");
    let mut out = String::with_capacity(text.len());
    let mut stack = vec![Quoting::Bare { parens: 0 }];
    let (mut escaped, mut comment, mut heredoc) = (false, false, false);
    let mut word_start = true;
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        if let Some(after) = rest.strip_prefix(mark)
            && let Some((n, len)) = parse_mark(after)
            && let Some(value) = values.get(n)
        {
            let top = *stack.last().unwrap_or(&Quoting::Bare { parens: 0 });
            if escaped {
                return Err("right after a backslash");
            }
            if comment {
                out.push_str(&value.replace(['\n', '\r'], " "));
            } else if heredoc {
                return Err("after a here-document (`<<`)");
            } else {
                match top {
                    Quoting::Bare { .. } => {
                        out.push('\'');
                        out.push_str(&single(value));
                        out.push('\'');
                    }
                    Quoting::Single => out.push_str(&single(value)),
                    Quoting::Double => {
                        out.push_str("\"'");
                        out.push_str(&single(value));
                        out.push_str("'\"");
                    }
                    Quoting::AnsiC => {
                        out.push_str("''");
                        out.push_str(&single(value));
                        out.push_str("'$'");
                    }
                    Quoting::Backtick => return Err("inside backticks (use `$( )`)"),
                    Quoting::Param => return Err("inside `${...}`"),
                    Quoting::Arith { .. } => return Err("inside `$(( ))`"),
                }
            }
            word_start = false;
            i += mark.len() + len;
            continue;
        }
        let c = rest.chars().next().unwrap_or_default();
        out.push(c);
        i += c.len_utf8();
        if escaped {
            escaped = false;
            word_start = false;
            continue;
        }
        if comment {
            if c == '\n' {
                comment = false;
                word_start = true;
            }
            continue;
        }
        let next = text[i..].chars().next();
        let take = |s: &str, out: &mut String, i: &mut usize| {
            out.push_str(s);
            *i += s.len();
        };
        let ahead = &text[i..];
        let top = stack.last_mut().expect("the bottom frame is never popped");
        match (*top, c) {
            (Quoting::Single, '\'') => {
                stack.pop();
            }
            (Quoting::Single, _) => {}
            (_, '\\') => escaped = true,
            (Quoting::AnsiC, '\'') => {
                stack.pop();
            }
            (Quoting::AnsiC, _) => {}
            (Quoting::Double, '"') | (Quoting::Backtick, '`') => {
                stack.pop();
            }
            (Quoting::Param, '}') => {
                stack.pop();
            }
            (Quoting::Arith { parens }, '(') => *top = Quoting::Arith { parens: parens + 1 },
            (Quoting::Arith { parens }, ')') => {
                if parens > 0 {
                    *top = Quoting::Arith { parens: parens - 1 };
                } else if next == Some(')') {
                    take(")", &mut out, &mut i);
                    stack.pop();
                }
            }
            (Quoting::Bare { .. } | Quoting::Backtick | Quoting::Param, '\'') => {
                stack.push(Quoting::Single);
            }
            (Quoting::Bare { .. } | Quoting::Backtick | Quoting::Param, '"') => {
                stack.push(Quoting::Double);
            }
            (_, '`') => stack.push(Quoting::Backtick),
            (_, '$') if ahead.starts_with("((") => {
                take("((", &mut out, &mut i);
                stack.push(Quoting::Arith { parens: 0 });
            }
            (_, '$') if next == Some('(') => {
                take("(", &mut out, &mut i);
                stack.push(Quoting::Bare { parens: 0 });
            }
            (_, '$') if next == Some('{') => {
                take("{", &mut out, &mut i);
                stack.push(Quoting::Param);
            }
            (Quoting::Bare { .. }, '$') if next == Some('\'') => {
                take("'", &mut out, &mut i);
                stack.push(Quoting::AnsiC);
            }
            (Quoting::Bare { parens }, '(') => *top = Quoting::Bare { parens: parens + 1 },
            (Quoting::Bare { parens }, ')') => {
                if parens > 0 {
                    *top = Quoting::Bare { parens: parens - 1 };
                } else if stack.len() > 1 {
                    stack.pop();
                }
            }
            (Quoting::Bare { .. }, '#') if word_start => comment = true,
            (Quoting::Bare { .. }, '<') if ahead.starts_with("<<") => take("<<", &mut out, &mut i),
            (Quoting::Bare { .. }, '<') if next == Some('<') => {
                take("<", &mut out, &mut i);
                heredoc = true;
            }
            _ => {}
        }
        word_start = c.is_whitespace() || ";&|()<>".contains(c);
    }
    Ok(out)
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
        // The engine's functions are not variables a template needs to be given.
        let vars = variables(
            "{% set ns = namespace(n=0) %}{% for i in range(3) %}{{ dict(a=i) }}{% endfor %}{{ b }}",
        )
        .unwrap();
        assert_eq!(vars, ["b"].into_iter().map(String::from).collect());
    }

    #[test]
    fn text_that_keeps_doubling_stops_with_the_limit_named() {
        let env = environment(None);
        let doubling = "{% set ns = namespace(s='x') %}{% for i in range(40) %}\
                        {% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}";
        let error = render(&env, doubling, &minijinja::context! {}).unwrap_err();
        assert!(
            error.message.contains("512 MiB of text"),
            "{}",
            error.message
        );
        // Below the limit, the same template renders.
        let small = doubling.replace("range(40)", "range(20)");
        assert_eq!(
            render(&env, &small, &minijinja::context! {}).unwrap(),
            "1048576"
        );
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

#[cfg(test)]
mod command_tests {
    use super::*;

    /// Values that would run `touch pwned` if they were shell text.
    const HOSTILE: [&str; 8] = [
        "'; touch pwned; '",
        "$(touch pwned)",
        "`touch pwned`",
        "\"; touch pwned; \"",
        "a\nb; touch pwned",
        "\\'; touch pwned; #",
        "x' \"$(touch pwned)\" '",
        "",
    ];

    /// Runs the command `template` renders with `v` under bash in a fresh directory: its
    /// stdout, and whether `pwned` exists afterwards.
    fn run(template: &str, v: &str) -> (String, bool) {
        let dir = tempfile::tempdir().unwrap();
        let env = environment(None);
        let ctx =
            minijinja::context! { v => v.to_owned(), list => vec![v.to_owned(), "two".to_owned()] };
        let command = render_command(&env, template, &ctx).unwrap();
        let out = std::process::Command::new("bash")
            .args(["-c", &command])
            .current_dir(dir.path())
            .output()
            .unwrap();
        (
            String::from_utf8(out.stdout).unwrap(),
            dir.path().join("pwned").exists(),
        )
    }

    #[test]
    fn values_reach_the_shell_as_data_in_any_quoting() {
        let forms = [
            ("printf %s {{ v }}", "{}"),
            ("printf %s '{{ v }}'", "{}"),
            ("printf %s \"{{ v }}\"", "{}"),
            ("printf %s $'{{ v }}'", "{}"),
            ("printf %s x{{ v }}y", "x{}y"),
            ("printf %s 'a{{ v }}b'", "a{}b"),
            ("printf %s \"<{{ v }}>\"", "<{}>"),
            ("printf %s \"$(printf %s {{ v }})\"", "{}"),
            ("printf %s {{ v | tojson }}", "json"),
            ("printf %s '{{ v | tojson }}'", "json"),
            ("printf %s {{ v ~ 'tail' }}", "{}tail"),
            ("{% set c %}[{{ v }}]{% endset %}printf %s {{ c }}", "[{}]"),
            ("printf %s {% for x in [v] %}{{ x }}{% endfor %}", "{}"),
            ("# {{ v }}\nprintf %s ok", "ok"),
            ("printf %s \"it's\" {{ v }}", "it's{}"),
        ];
        for v in HOSTILE {
            for (template, expected) in forms {
                let expected = if expected == "json" {
                    let ctx = minijinja::context! { v => v.to_owned() };
                    render(&environment(None), "{{ v | tojson }}", &ctx).unwrap()
                } else {
                    expected.replace("{}", v)
                };
                // `printf %s a b` prints the words run together
                let (out, pwned) = run(template, v);
                assert!(!pwned, "{template:?} with {v:?} ran a command");
                assert_eq!(out, expected, "{template:?} with {v:?}");
            }
        }
    }

    #[test]
    fn each_value_of_a_loop_is_one_word() {
        let (out, _) = run(
            "printf '[%s]' {% for x in list %}{{ x }} {% endfor %}",
            "a b",
        );
        assert_eq!(out, "[a b][two]");
    }

    #[test]
    fn places_no_quoting_makes_safe_are_refused() {
        let env = environment(None);
        let ctx = minijinja::context! { v => "x" };
        for template in [
            "echo `echo {{ v }}`",
            "echo ${HOME:-{{ v }}}",
            "echo $(( {{ v }} + 1 ))",
            "echo \\{{ v }}",
            "echo \"\\{{ v }}\"",
            "cat <<EOF\n{{ v }}\nEOF",
        ] {
            let err = render_command(&env, template, &ctx).unwrap_err();
            assert!(
                err.to_string().contains("cannot be quoted for the shell"),
                "{template:?}: {err}"
            );
        }
        // a here-string is one word
        assert_eq!(
            render_command(&env, "cat <<< {{ v }}", &ctx).unwrap(),
            "cat <<< 'x'"
        );
        // plain text is left alone
        assert_eq!(
            render_command(&env, "git diff --name-only v1..HEAD", &ctx).unwrap(),
            "git diff --name-only v1..HEAD"
        );
        assert_eq!(
            render_command(&env, "git diff {{ v }}..HEAD | sort", &ctx).unwrap(),
            "git diff 'x'..HEAD | sort"
        );
    }

    /// bash arithmetic expands an array subscript in a value it computes with, quoted or not,
    /// directly or through a variable: every such construct is tried with a value that would
    /// run a command there; none renders, and a plain number still does.
    #[test]
    fn a_value_never_runs_in_bash_arithmetic() {
        let templates = [
            "[[ {{ v }} -gt 1 ]] && echo big",
            "[[ '{{ v }}' -eq 1 ]]",
            "(( {{ v }} > 1 )) && echo big",
            "(( \"{{ v }}\" ))",
            "let x={{ v }}",
            "declare -i x={{ v }}",
            "typeset -i x='{{ v }}'",
            "f() { local -i x={{ v }}; }; f",
            "x={{ v }}; (( x > 1 ))",
            "x={{ v }}; [[ $x -gt 1 ]]",
            "x={{ v }}; echo $((x + 1))",
            "x={{ v }}; s=abc; echo ${s:x}",
            "x={{ v }}; a[x]=1",
            "x={{ v }}; a=(1 2); echo ${a[x]}",
            "x={{ v }}; echo $[x]",
            "for (( i = 0; i < {{ v }}; i++ )); do :; done",
        ];
        for v in ["a[$(touch pwned)]", "a[`touch pwned`]", "x[${HOME}]"] {
            for template in templates {
                let env = environment(None);
                let ctx = minijinja::context! { v => v };
                let err = render_command(&env, template, &ctx)
                    .expect_err(&format!("{template:?} with {v:?} rendered"));
                assert!(
                    err.to_string()
                        .contains("would run as a command where bash evaluates arithmetic"),
                    "{template:?}: {err}"
                );
            }
        }
        // Numbers, and text with brackets but nothing to expand, are data as before.
        let (out, pwned) = run("x={{ v }}; (( x > 1 )) && echo big", "5");
        assert_eq!((out.as_str(), pwned), ("big\n", false));
        let (out, _) = run("[[ -n {{ v }} ]] && printf %s {{ v }}", "$HOME and a[1]");
        assert_eq!(out, "$HOME and a[1]");
        // Without arithmetic in the command, such a value is plain data.
        let (out, pwned) = run("printf %s {{ v }}", "a[$(touch pwned)]");
        assert_eq!((out.as_str(), pwned), ("a[$(touch pwned)]", false));
    }
}
