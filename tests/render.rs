//! `summon render` and `summon explain`: typed parameters, `--params`, injection safety,
//! templated structure, `extends`/`include` confinement, and the `--json` shapes.

use crate::support;
use support::*;

use serde::Deserialize;
use serde_json::{Value, json};

/// A recipe whose instructions and prompt use every parameter type.
const TYPED: &str = "
    title: Typed
    description: typed parameters
    instructions: |
      n={{ n }} b={{ b }} s={{ s }} d={{ d }}
    prompt: 'f={{ f }}'
    parameters:
      - key: n
        input_type: number
        requirement: required
        description: a number
      - key: b
        input_type: boolean
        requirement: required
        description: a flag
      - key: s
        input_type: select
        requirement: required
        options: [x, y]
        description: a choice
      - key: d
        input_type: date
        requirement: required
        description: a day
      - key: f
        input_type: file
        requirement: required
        description: a file
";

fn typed() -> Test {
    Test::new()
        .write("recipes/typed.yaml", TYPED)
        .write_raw("data/input.txt", "FILE CONTENT\nline two\n")
}

const GOOD: [&str; 5] = ["n=3.5", "b=true", "s=x", "d=2024-01-31", "f=data/input.txt"];

fn render_args<'a>(source: &'a str, params: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["render", "--source", source];
    for p in params {
        args.extend(["--param", p]);
    }
    args
}

/// `GOOD` with one parameter replaced.
fn good_but(replace: &str) -> Vec<&str> {
    let key = replace.split('=').next().unwrap();
    GOOD.iter()
        .map(|p| {
            if p.starts_with(&format!("{key}=")) {
                replace
            } else {
                p
            }
        })
        .collect()
}

#[test]
fn typed_parameters_render() {
    let out = typed()
        .args(render_args("typed", &GOOD))
        .args(["--json"])
        .run();
    let v = out.json();
    assert_eq!(v["instructions"], "n=3.5 b=true s=x d=2024-01-31\n");
    assert_eq!(v["prompt"], "f=FILE CONTENT\nline two\n");
    assert_eq!(v["parameters"]["f"], "FILE CONTENT\nline two\n");
    assert_eq!(v["parameters"]["n"], "3.5");
}

#[test]
fn typed_parameter_values_are_checked() {
    for (param, message) in [
        (
            "n=abc",
            "summon: error: parameter `n` must be a number, got `abc`\n",
        ),
        (
            "b=yes",
            "summon: error: parameter `b` must be true or false, got `yes`\n",
        ),
        (
            "s=z",
            "summon: error: parameter `s` must be one of x, y, got `z`\n",
        ),
        (
            "d=31/01/2024",
            "summon: error: parameter `d` must be an ISO-8601 date (YYYY-MM-DD), got `31/01/2024`\n",
        ),
    ] {
        let out = typed()
            .args(render_args("typed", &good_but(param)))
            .code(1)
            .run();
        assert_eq!(out.stderr, message, "{param}");
        assert_eq!(out.stdout, "", "{param}");
    }
    for ok in ["n=-2", "n=1e3", "b=false", "s=y", "d=2024-01-31T10:00:00Z"] {
        typed().args(render_args("typed", &good_but(ok))).run();
    }
}

#[test]
fn file_parameter_is_relative_to_the_working_directory() {
    let out = typed()
        .write_raw("sub/local.txt", "from sub")
        .env_path("SUMMON_RECIPE_PATH", "recipes")
        .current_dir("sub")
        .args(render_args("typed", &good_but("f=local.txt")))
        .args(["--json"])
        .run();
    assert_eq!(out.json()["prompt"], "f=from sub");
    let out = typed()
        .args(render_args("typed", &good_but("f=missing.txt")))
        .code(1)
        .run();
    assert!(
        out.stderr
            .starts_with("summon: error: parameter `f`: cannot read file `"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("missing.txt"), "{}", out.stderr);
}

#[test]
fn all_missing_required_parameters_in_one_error() {
    let out = typed().args(["render", "--source", "typed"]).code(1).run();
    assert_eq!(
        out.stderr,
        "summon: error: missing required parameters: `n`, `b`, `s`, `d`, `f`\n  \
         = hint: add --param n=NUMBER --param b=true|false --param s=x|y --param d=YYYY-MM-DD --param f=PATH\n"
    );
    let out = Test::new()
        .write(
            "recipes/two.yaml",
            "
            title: t
            description: d
            instructions: '{{ a }} {{ b }} {{ c }}'
            parameters:
              - key: a
                input_type: string
                requirement: required
                description: a
              - key: b
                input_type: string
                requirement: required
                description: b
              - key: c
                input_type: string
                requirement: optional
                default: ''
                description: c
            ",
        )
        .args(["render", "--source", "two"])
        .code(1)
        .run();
    assert_eq!(
        out.stderr,
        "summon: error: missing required parameters: `a`, `b`\n  = hint: add --param a=VALUE --param b=VALUE\n"
    );
}

#[test]
fn one_missing_parameter_is_singular() {
    let out = typed().args(render_args("typed", &GOOD[..4])).code(1).run();
    assert_eq!(
        out.stderr,
        "summon: error: missing required parameter: `f`\n  = hint: add --param f=PATH\n"
    );
}

#[test]
fn unknown_parameter_is_named() {
    let mut params = GOOD.to_vec();
    params.push("zz=3");
    let out = typed().args(render_args("typed", &params)).code(1).run();
    assert_eq!(
        out.stderr,
        "summon: error: unknown parameter `zz`\n  = hint: declared parameters: n, b, s, d, f\n"
    );
}

#[test]
fn malformed_param_flag() {
    let out = typed()
        .args(["render", "--source", "typed", "--param", "n"])
        .code(1)
        .run();
    assert_eq!(
        out.stderr,
        "summon: error: invalid --param `n`: expected KEY=VALUE\n"
    );
}

#[test]
fn unknown_source() {
    let out = Test::new()
        .args(["render", "--source", "nope"])
        .code(1)
        .run();
    let (first, hint) = out.stderr.split_once('\n').unwrap();
    assert_eq!(
        first,
        "summon: error: Source 'nope' not found. Use summon load to see available sources."
    );
    assert!(hint.starts_with("  = hint: looked in /"), "{hint}");
}

const AB: &str = "
    title: AB
    description: two strings
    instructions: 'a={{ a }} b={{ b }}'
    parameters:
      - key: a
        input_type: string
        requirement: required
        description: a
      - key: b
        input_type: string
        requirement: required
        description: b
";

#[test]
fn params_file_yaml_and_json_with_flag_override() {
    let test = || {
        Test::new()
            .write("recipes/ab.yaml", AB)
            .write("p.yaml", "a: from-yaml\nb: yaml-b")
            .write_raw("p.json", r#"{"a": "from-json", "b": "json-b"}"#)
    };
    let out = test()
        .args(["render", "--source", "ab", "--params", "p.yaml", "--json"])
        .run();
    assert_eq!(out.json()["instructions"], "a=from-yaml b=yaml-b");
    let out = test()
        .args(["render", "--source", "ab", "--params", "p.json", "--json"])
        .run();
    assert_eq!(out.json()["instructions"], "a=from-json b=json-b");
    let out = test()
        .args([
            "render", "--source", "ab", "--param", "b=flag-b", "--params", "p.yaml", "--json",
        ])
        .run();
    assert_eq!(out.json()["instructions"], "a=from-yaml b=flag-b");
}

#[test]
fn params_file_problems() {
    let out = Test::new()
        .write("recipes/ab.yaml", AB)
        .write("bad.yaml", "a: 1\nb: [1, 2]")
        .args([
            "--color", "never", "render", "--source", "ab", "--params", "bad.yaml",
        ])
        .code(1)
        .run();
    assert!(
        out.stderr.starts_with(
            "bad.yaml:2:4: error: parameter `b` must be a single value, found a list\n"
        ),
        "{}",
        out.stderr
    );
    let out = Test::new()
        .write("recipes/ab.yaml", AB)
        .args(["render", "--source", "ab", "--params", "nope.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains("cannot read parameters file"),
        "{}",
        out.stderr
    );
    let out = Test::new()
        .write("recipes/ab.yaml", AB)
        .write("unknown.yaml", "a: 1\nb: 2\nc: 3")
        .args(["render", "--source", "ab", "--params", "unknown.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains("unknown parameter `c`"),
        "{}",
        out.stderr
    );
}

const NASTY: &str = "line1\nline2: \"quoted\" 'single' {{ b }} {% if true %}x{% endif %}\n- item: [1, 2]\n# not a comment";

#[test]
fn values_are_substituted_verbatim_and_never_rendered() {
    let out = Test::new()
        .write("recipes/ab.yaml", AB)
        .args([
            "render",
            "--source",
            "ab",
            "--param",
            &format!("a={NASTY}"),
            "--param",
            "b=B",
            "--json",
        ])
        .run();
    let v = out.json();
    assert_eq!(v["instructions"], format!("a={NASTY} b=B"));
    assert_eq!(v["parameters"]["a"], NASTY);
    assert_eq!(v["title"], "AB");
    assert_eq!(v["description"], "two strings");
}

// ---- the YAML output parses back to the JSON output ----

/// A small YAML → JSON reader (core schema) to check what `render` prints.
fn yaml_to_json(text: &str) -> Value {
    use granit_parser::{Event, Parser, ScalarStyle};

    fn scalar(value: &str, style: ScalarStyle) -> Value {
        if style != ScalarStyle::Plain {
            return Value::String(value.to_owned());
        }
        match value {
            "" | "~" | "null" | "Null" | "NULL" => Value::Null,
            "true" | "True" | "TRUE" => Value::Bool(true),
            "false" | "False" | "FALSE" => Value::Bool(false),
            _ => {
                if let Ok(i) = value.parse::<i64>() {
                    json!(i)
                } else if value.contains(|c: char| c.is_ascii_digit())
                    && value.parse::<f64>().is_ok()
                {
                    json!(value.parse::<f64>().unwrap())
                } else {
                    Value::String(value.to_owned())
                }
            }
        }
    }

    enum Frame {
        Seq(Vec<Value>),
        Map(serde_json::Map<String, Value>, Option<String>),
    }

    fn push(stack: &mut [Frame], root: &mut Option<Value>, value: Value) {
        match stack.last_mut() {
            None => *root = Some(value),
            Some(Frame::Seq(items)) => items.push(value),
            Some(Frame::Map(map, key)) => match key.take() {
                None => {
                    *key = Some(
                        value
                            .as_str()
                            .map(str::to_owned)
                            .unwrap_or(value.to_string()),
                    )
                }
                Some(k) => {
                    map.insert(k, value);
                }
            },
        }
    }

    let mut stack: Vec<Frame> = Vec::new();
    let mut root = None;
    for event in Parser::new_from_str(text) {
        let (event, _span) =
            event.unwrap_or_else(|e| panic!("render printed invalid YAML ({e:?}):\n{text}"));
        match event {
            Event::Scalar(value, style, _, _) => {
                push(&mut stack, &mut root, scalar(&value, style));
            }
            Event::SequenceStart(..) => stack.push(Frame::Seq(Vec::new())),
            Event::MappingStart(..) => stack.push(Frame::Map(serde_json::Map::new(), None)),
            Event::SequenceEnd | Event::MappingEnd => {
                let value = match stack.pop().expect("balanced") {
                    Frame::Seq(items) => Value::Array(items),
                    Frame::Map(map, _) => Value::Object(map),
                };
                push(&mut stack, &mut root, value);
            }
            Event::Alias(..) => panic!("unexpected alias in render output:\n{text}"),
            _ => {}
        }
    }
    root.unwrap_or(Value::Null)
}

/// Drops nulls, empty objects and empty lists: the YAML form may leave out what is unset.
fn without_unset(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, without_unset(v)))
                .filter(|(_, v)| {
                    !v.is_null()
                        && v.as_object().is_none_or(|o| !o.is_empty())
                        && v.as_array().is_none_or(|a| !a.is_empty())
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_unset).collect()),
        other => other,
    }
}

/// Renders `recipes/ab.yaml` with `a=value` as YAML and as JSON; both must agree.
#[track_caller]
fn yaml_matches_json(value: &str) {
    let run = |json: bool| {
        let mut test = Test::new()
            .write("recipes/ab.yaml", AB)
            .args(["render", "--source", "ab", "--param"])
            .args([format!("a={value}")])
            .args(["--param", "b=B"]);
        if json {
            test = test.args(["--json"]);
        }
        test.run()
    };
    let from_json = run(true).json();
    assert_eq!(from_json["parameters"]["a"], value);
    let yaml = run(false).stdout;
    assert_eq!(
        without_unset(yaml_to_json(&yaml)),
        without_unset(from_json),
        "value {value:?} printed as:\n{yaml}"
    );
}

#[test]
fn yaml_output_round_trips_awkward_values() {
    for value in [
        "plain",
        "",
        "  leading spaces",
        "trailing space ",
        "# hash",
        "- dash",
        "null",
        "true",
        "123",
        "1.5",
        "it's",
        "\"double\"",
        "key: value",
        "x #y",
        "{a: 1}",
        "[1, 2]",
        "@at",
        "%percent",
        "*star",
        "&amp",
        "!bang",
        "|",
        ">",
        "~",
        "a\ttab",
        "é ü 日本",
        "one\ntwo",
        "trailing newline\n",
        "\nleading newline",
        "  indented first\nsecond",
        "a\n b\n  c",
        "x\n\ttab line",
        "---\ndocument marker",
        "a\n---\nb",
        "a\n...",
        "key: value\n- item",
        NASTY,
        "{{ b }}",
        "bell\u{7}",
    ] {
        yaml_matches_json(value);
    }
}

#[test]
fn yaml_output_round_trips_trailing_blank_lines_and_cr() {
    for value in ["two newlines\n\n", "a\n\n\n", "crlf\r\nline"] {
        yaml_matches_json(value);
    }
}

#[test]
fn yaml_output_shows_the_rendered_recipe() {
    let out = Test::new()
        .write(
            "recipes/full.yaml",
            "
            version: 1.0.0
            title: Full
            description: everything
            instructions: do {{ what }}
            prompt: now
            parameters:
              - key: what
                input_type: string
                requirement: required
                description: w
            settings:
              goose_provider: anthropic
              goose_model: claude-x
              temperature: 0.5
              max_turns: 7
            extensions:
              - type: builtin
                name: developer
              - type: stdio
                name: gh
                cmd: gh-mcp
            sub_recipes:
              - name: helper
                path: helper.yaml
            response:
              json_schema:
                type: object
                properties:
                  answer:
                    type: string
                required: [answer]
            ",
        )
        .write(
            "recipes/helper.yaml",
            "title: h\ndescription: d\ninstructions: i",
        )
        .args(["render", "--source", "full", "--param", "what=it"])
        .run();
    let v = without_unset(yaml_to_json(&out.stdout));
    assert_eq!(
        v,
        json!({
            "source": "full",
            "kind": "recipe",
            "title": "Full",
            "description": "everything",
            "instructions": "do it",
            "prompt": "now",
            "settings": {"provider": "anthropic", "model": "claude-x", "temperature": 0.5, "max_turns": 7},
            "parameters": {"what": "it"},
            "extensions": ["developer", "gh"],
            "sub_recipes": ["helper"],
            "version": "1.0.0",
            "response_schema": {
                "type": "object",
                "properties": {"answer": {"type": "string"}},
                "required": ["answer"]
            }
        }),
        "{}",
        out.stdout
    );
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[expect(
    dead_code,
    reason = "a mirror of the JSON output: its fields pin the shape, not all are read"
)]
struct Rendered {
    source: String,
    kind: String,
    title: Option<String>,
    description: String,
    instructions: Option<String>,
    prompt: Option<String>,
    settings: Option<RenderedSettings>,
    parameters: Option<serde_json::Map<String, Value>>,
    extensions: Vec<String>,
    sub_recipes: Vec<String>,
    response_schema: Option<Value>,
    version: Option<String>,
    author: Option<Value>,
    activities: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RenderedAgent {
    source: String,
    kind: String,
    description: String,
    model: Option<String>,
    tools: Option<Vec<String>>,
    instructions: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RenderedSettings {
    provider: Option<String>,
    model: Option<String>,
    temperature: Option<f64>,
    max_turns: Option<u64>,
}

#[test]
fn json_render_shape() {
    let out = Test::new()
        .write(
            "recipes/s.yaml",
            "
            title: S
            description: settings
            instructions: i
            settings:
              provider: openai
              model: gpt-x
              temperature: 0.2
              max_turns: 3
            ",
        )
        .args(["render", "--source", "s", "--json"])
        .run();
    let r: Rendered = serde_json::from_str(&out.stdout).expect("render shape");
    assert_eq!(r.source, "s");
    assert_eq!(r.kind, "recipe");
    let s = r.settings.expect("settings");
    assert_eq!(s.provider.as_deref(), Some("openai"));
    assert_eq!(s.model.as_deref(), Some("gpt-x"));
    assert_eq!(s.temperature, Some(0.2));
    assert_eq!(s.max_turns, Some(3));
    let out = typed()
        .args(render_args("typed", &GOOD))
        .args(["--json"])
        .run();
    let _: Rendered = serde_json::from_str(&out.stdout).expect("render shape");
    let out = Test::new()
        .write(
            "recipes/m.yaml",
            "
            version: 1.0.0
            title: M
            description: metadata
            instructions: i
            activities: [first, second]
            ",
        )
        .args(["render", "--source", "m", "--json"])
        .run();
    let r: Rendered = serde_json::from_str(&out.stdout).expect("render shape");
    assert_eq!(r.version.as_deref(), Some("1.0.0"));
    assert_eq!(r.activities.unwrap_or_default(), ["first", "second"]);
}

#[test]
fn render_an_agent() {
    let test = || {
        Test::new().write(
            ".claude/agents/ag.md",
            "
            ---
            name: ag
            description: agent d
            tools: Read, Grep
            model: sonnet
            ---
            Role text with {{ braces }} kept.
            ",
        )
    };
    let out = test().args(["render", "--source", "ag", "--json"]).run();
    let a: RenderedAgent = serde_json::from_str(&out.stdout).expect("agent shape");
    assert_eq!((a.source.as_str(), a.kind.as_str()), ("ag", "agent"));
    assert_eq!(a.description, "agent d");
    assert_eq!(a.model.as_deref(), Some("sonnet"));
    assert_eq!(a.tools.unwrap_or_default(), ["Read", "Grep"]);
    assert_eq!(
        a.instructions.trim_end(),
        "Role text with {{ braces }} kept."
    );
    let yaml = test().args(["render", "--source", "ag"]).run().stdout;
    assert_eq!(
        without_unset(yaml_to_json(&yaml)),
        without_unset(serde_json::from_str(&out.stdout).unwrap()),
        "{yaml}"
    );
}

#[test]
fn recipe_dir_is_built_in() {
    let out = Test::new()
        .write(
            "recipes/rd.yaml",
            "title: t\ndescription: d\ninstructions: 'dir={{ recipe_dir }}'",
        )
        .args(["render", "--source", "rd", "--json"])
        .run();
    assert_eq!(
        out.json()["instructions"],
        format!("dir={}", out.dir.join("recipes").display())
    );
}

// ---- recipes whose YAML structure is templated ----

const TEMPLATED: &str = "
    title: Templated
    description: structure is templated
    {% if with_prompt == \"yes\" %}
    prompt: Do {{ task }}
    {% endif %}
    instructions: Work on {{ task }}
    parameters:
      - key: task
        input_type: string
        requirement: required
        description: t
      - key: with_prompt
        input_type: string
        requirement: optional
        default: \"yes\"
        description: w
";

#[test]
fn templated_structure_renders() {
    let run = |extra: &[&str]| {
        let mut args = vec!["render", "--source", "tpl", "--param", "task=x", "--json"];
        args.extend(extra);
        Test::new()
            .write("recipes/tpl.yaml", TEMPLATED)
            .args(args)
            .run()
            .json()
    };
    let v = run(&[]);
    assert_eq!(v["instructions"], "Work on x");
    assert_eq!(v["prompt"], "Do x");
    let v = run(&["--param", "with_prompt=no"]);
    assert_eq!(v["instructions"], "Work on x");
    assert_eq!(v["prompt"], Value::Null);
    // and validate accepts it
    Test::new()
        .write("recipes/tpl.yaml", TEMPLATED)
        .args(["validate", "recipes/tpl.yaml"])
        .run();
}

#[test]
fn templated_structure_does_not_render_values_twice() {
    let v = Test::new()
        .write("recipes/tpl.yaml", TEMPLATED)
        .args([
            "render",
            "--source",
            "tpl",
            "--param",
            "task={{ with_prompt }}",
            "--json",
        ])
        .run()
        .json();
    assert_eq!(v["instructions"], "Work on {{ with_prompt }}");
}

#[test]
fn templated_structure_survives_awkward_values() {
    for value in ["a: b", "multi\nline", "\"quoted", "- dash"] {
        let out = Test::new()
            .write("recipes/tpl.yaml", TEMPLATED)
            .args(["render", "--source", "tpl", "--param"])
            .args([format!("task={value}")])
            .args(["--json"])
            .output();
        assert_eq!(out.code, 0, "{value:?}: {}", out.stderr);
        assert_eq!(out.json()["instructions"], format!("Work on {value}"));
    }
}

// ---- include / extends stay inside the recipe's directory ----

fn with_parts() -> Test {
    Test::new()
        .write_raw("recipes/parts/common.md", "shared text")
        .write_raw(
            "recipes/parts/base.txt",
            "Base says {% block body %}default{% endblock %}.",
        )
        .write_raw("outside/secret.md", "secret")
}

#[test]
fn include_and_extends_inside_the_recipe_dir_work() {
    let out = with_parts()
        .write(
            "recipes/inc.yaml",
            "title: t\ndescription: d\ninstructions: \"{% include 'parts/common.md' %} done\"",
        )
        .args(["render", "--source", "inc", "--json"])
        .run();
    assert_eq!(out.json()["instructions"], "shared text done");
    let out = with_parts()
        .write(
            "recipes/ext.yaml",
            "title: t\ndescription: d\ninstructions: \"{% extends 'parts/base.txt' %}{% block body %}child{% endblock %}\"",
        )
        .args(["render", "--source", "ext", "--json"])
        .run();
    assert_eq!(out.json()["instructions"], "Base says child.");
}

#[test]
fn include_and_extends_cannot_leave_the_recipe_dir() {
    for (tag, target) in [
        ("include", "../outside/secret.md".to_owned()),
        ("extends", "../outside/secret.md".to_owned()),
        ("include", "parts/../../outside/secret.md".to_owned()),
    ] {
        let out = with_parts()
            .write(
                "recipes/esc.yaml",
                &format!("title: t\ndescription: d\ninstructions: \"{{% {tag} '{target}' %}}\""),
            )
            .args(["--color", "never", "render", "--source", "esc"])
            .code(1)
            .run();
        assert!(
            out.stderr
                .contains("the path must stay inside the recipe's directory"),
            "{tag} {target}: {}",
            out.stderr
        );
        assert!(!out.stdout.contains("secret"), "{}", out.stdout);
    }
    // an absolute path too
    let t = with_parts();
    let secret = t.path().join("outside/secret.md").display().to_string();
    let out = t
        .write(
            "recipes/esc.yaml",
            &format!("title: t\ndescription: d\ninstructions: \"{{% include '{secret}' %}}\""),
        )
        .args(["render", "--source", "esc"])
        .code(1)
        .run();
    assert!(
        out.stderr
            .contains("the path must stay inside the recipe's directory"),
        "{}",
        out.stderr
    );
}

#[cfg(unix)]
#[test]
fn include_through_a_symlink_cannot_leave_the_recipe_dir() {
    let t = with_parts().write(
        "recipes/esc.yaml",
        "title: t\ndescription: d\ninstructions: \"{% include 'parts/link.md' %}\"",
    );
    std::os::unix::fs::symlink(
        t.path().join("outside/secret.md"),
        t.path().join("recipes/parts/link.md"),
    )
    .expect("symlink");
    let out = t.args(["render", "--source", "esc"]).output();
    assert!(
        !out.stdout.contains("secret"),
        "a symlink let include read outside the recipe dir:\n{}",
        out.stdout
    );
    assert_eq!(out.code, 1, "{}", out.stderr);
}

// ---- explain ----

const REVIEW: &str = "
    title: Code Review
    description: Review a path
    instructions: 'Review {{ path }} at {{ depth }} up to {{ max }}'
    parameters:
      - key: path
        input_type: string
        requirement: required
        description: File or directory to review
      - key: depth
        input_type: select
        requirement: optional
        default: standard
        options: [quick, standard, thorough]
        description: How deep the review goes
      - key: max
        input_type: number
        requirement: optional
        default: '10'
        description: Upper bound
";

#[test]
fn explain_lists_values_sources_and_missing() {
    let out = Test::new()
        .write("recipes/review.yaml", REVIEW)
        .args(["explain", "--source", "review"])
        .run();
    assert_eq!(
        out.stdout,
        expected(
            r#"
            Code Review (recipe)
            Review a path

            Parameters:
              path (string, required): - [missing]
                  File or directory to review
              depth (select, optional): "standard" [default]
                  How deep the review goes
              max (number, optional): "10" [default]
                  Upper bound

            Missing: path
              add --param path=VALUE
            "#
        )
    );
    let out = Test::new()
        .write("recipes/review.yaml", REVIEW)
        .args([
            "explain",
            "--source",
            "review",
            "--param",
            "path=src",
            "--param",
            "depth=quick",
        ])
        .run();
    assert!(
        out.stdout
            .contains("  path (string, required): \"src\" [given]\n")
    );
    assert!(
        out.stdout
            .contains("  depth (select, optional): \"quick\" [given]\n")
    );
    assert!(
        out.stdout
            .contains("  max (number, optional): \"10\" [default]\n")
    );
    assert!(!out.stdout.contains("Missing"), "{}", out.stdout);
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Explained {
    source: String,
    kind: String,
    title: Option<String>,
    description: String,
    parameters: Vec<ExplainedParameter>,
    missing: Vec<String>,
    problems: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExplainedParameter {
    key: String,
    input_type: String,
    requirement: String,
    default: Option<String>,
    description: String,
    options: Vec<String>,
    value: Option<String>,
    value_source: String,
}

#[test]
fn explain_json_shape() {
    let out = Test::new()
        .write("recipes/review.yaml", REVIEW)
        .write("p.yaml", "max: 3")
        .args([
            "explain", "--source", "review", "--params", "p.yaml", "--json",
        ])
        .run();
    let e: Explained = serde_json::from_str(&out.stdout).expect("explain shape");
    assert_eq!(e.source, "review");
    assert_eq!(e.kind, "recipe");
    assert_eq!(e.title.as_deref(), Some("Code Review"));
    assert_eq!(e.description, "Review a path");
    assert_eq!(e.missing, ["path"]);
    assert!(e.problems.is_empty());
    let summary: Vec<(&str, Option<&str>, &str)> = e
        .parameters
        .iter()
        .map(|p| (p.key.as_str(), p.value.as_deref(), p.value_source.as_str()))
        .collect();
    assert_eq!(
        summary,
        [
            ("path", None, "missing"),
            ("depth", Some("standard"), "default"),
            ("max", Some("3"), "file"),
        ]
    );
    let depth = &e.parameters[1];
    assert_eq!(depth.input_type, "select");
    assert_eq!(depth.requirement, "optional");
    assert_eq!(depth.default.as_deref(), Some("standard"));
    assert_eq!(depth.description, "How deep the review goes");
    assert_eq!(depth.options, ["quick", "standard", "thorough"]);
}

#[test]
fn explain_reports_problems_but_exits_zero() {
    let out = Test::new()
        .write("recipes/review.yaml", REVIEW)
        .args([
            "explain", "--source", "review", "--param", "path=x", "--param", "max=lots", "--json",
        ])
        .run();
    let e: Explained = serde_json::from_str(&out.stdout).expect("explain shape");
    assert!(e.missing.is_empty());
    assert_eq!(e.problems, ["parameter `max` must be a number, got `lots`"]);
}

#[test]
fn explain_an_agent() {
    let out = Test::new()
        .write(
            ".claude/agents/a.md",
            "---\nname: ag\ndescription: agent d\n---\nbody\n",
        )
        .args(["explain", "--source", "ag"])
        .run();
    assert_eq!(
        out.stdout,
        "ag (agent)\nagent d\n\nNo parameters: an agent takes its task from --instructions.\n"
    );
}
