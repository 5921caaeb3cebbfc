//! goose's recipe rules: template inheritance (`extends`/`include` resolved in the recipe's
//! folder by every command that reads recipes), no defaults for file parameters, goose's
//! retry validation, placeholders that are not expressions kept as text, and block scalars
//! at the end of a file read as goose's YAML parser reads them.

mod support;

use support::*;

#[track_caller]
fn assert_has(text: &str, needle: &str) {
    assert!(text.contains(needle), "want: {needle}\n---\n{text}");
}

#[track_caller]
fn assert_lacks(text: &str, needle: &str) {
    assert!(!text.contains(needle), "unwanted: {needle}\n---\n{text}");
}

// ---- a file parameter may not have a default ----

const FILE_DEFAULT: &str = "
    title: t
    description: d
    prompt: 'Summarise {{ doc }}'
    parameters:
      - key: doc
        input_type: file
        requirement: optional
        default: secret.txt
        description: the document
";

#[test]
fn file_parameter_default_is_an_error_at_the_default_key() {
    let out = Test::new()
        .write("recipes/sum.yaml", FILE_DEFAULT)
        .write_raw("secret.txt", "TOPSECRET")
        .args(["--color", "never", "validate", "recipes/sum.yaml"])
        .code(1)
        .run();
    assert_has(
        &out.stderr,
        "recipes/sum.yaml:8:5: error: file parameter `doc` cannot have a default value, to avoid importing sensitive user files",
    );

    assert_has(&out.stderr, "1 error(s), 0 warning(s)");

    // Nothing is read or rendered from such a recipe.
    let out = Test::new()
        .write("recipes/sum.yaml", FILE_DEFAULT)
        .write_raw("secret.txt", "TOPSECRET")
        .args(["render", "--source", "sum"])
        .output();
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert_lacks(&out.stdout, "TOPSECRET");
}

// ---- retry settings goose refuses ----

#[test]
fn retry_settings_goose_refuses_are_errors_at_their_keys() {
    let out = Test::new()
        .write(
            "r.yaml",
            "
            title: t
            description: d
            prompt: p
            retry:
              max_retries: 0
              timeout_seconds: 0
              on_failure_timeout_seconds: 0
              checks:
                - type: shell
                  command: test -f done
            ",
        )
        .args(["--color", "never", "validate", "r.yaml"])
        .code(1)
        .run();
    assert_has(
        &out.stderr,
        "r.yaml:5:3: error: `retry.max_retries` must be greater than 0",
    );
    assert_has(
        &out.stderr,
        "r.yaml:6:3: error: `retry.timeout_seconds` must be greater than 0 if specified",
    );
    assert_has(
        &out.stderr,
        "r.yaml:7:3: error: `retry.on_failure_timeout_seconds` must be greater than 0 if specified",
    );
    assert_has(&out.stderr, "3 error(s)");

    // `checks` is required, and must be a list.
    let out = Test::new()
        .write(
            "r.yaml",
            "title: t\ndescription: d\nprompt: p\nretry:\n  max_retries: 2\n",
        )
        .args(["--color", "never", "validate", "r.yaml"])
        .code(1)
        .run();
    assert_has(
        &out.stderr,
        "r.yaml:5:3: error: `retry` is missing `checks`",
    );
    let out = Test::new()
        .write(
            "r.yaml",
            "title: t\ndescription: d\nprompt: p\nretry:\n  max_retries: 2\n  checks: test -f done\n",
        )
        .args(["--color", "never", "validate", "r.yaml"])
        .code(1)
        .run();
    assert_has(
        &out.stderr,
        "r.yaml:6:3: error: `retry.checks` must be a list",
    );

    // What goose accepts still validates.
    let out = Test::new()
        .write(
            "r.yaml",
            "title: t\ndescription: d\nprompt: p\nretry:\n  max_retries: 1\n  timeout_seconds: 5\n  checks:\n    - type: shell\n      command: 'true'\n",
        )
        .args(["--color", "never", "validate", "r.yaml"])
        .run();
    assert_has(&out.stderr, "0 error(s), 0 warning(s)");
}

// ---- placeholders that are not expressions stay text ----

#[test]
fn placeholder_that_is_not_an_expression_is_kept_literally_with_a_warning() {
    let recipe = "
        title: t
        description: d
        instructions: Use {{ model }} from {{hf model org}}.
        prompt: |
          Hello {{hf model org}}_{{hf model name}}!
          Plain {{ model }} and {{invalid var}}
        parameters:
          - key: model
            input_type: string
            requirement: required
            description: the model
    ";
    let out = Test::new()
        .write("r.yaml", recipe)
        .args(["--color", "never", "validate", "r.yaml"])
        .run();
    assert_has(
        &out.stderr,
        "r.yaml:3:36: warning: `{{hf model org}}` is not a valid template expression; it is kept as text",
    );
    assert_has(
        &out.stderr,
        "r.yaml:5:9: warning: `{{hf model org}}` is not a valid template expression",
    );
    assert_has(&out.stderr, "r.yaml:5:26: warning: `{{hf model name}}`");
    assert_has(&out.stderr, "r.yaml:6:25: warning: `{{invalid var}}`");
    assert_has(&out.stderr, "0 error(s), 4 warning(s)");

    let out = Test::new()
        .write("recipes/hf.yaml", recipe)
        .args([
            "render",
            "--source",
            "hf",
            "--param",
            "model=llama",
            "--json",
        ])
        .run();
    let v = out.json();
    assert_eq!(v["instructions"], "Use llama from {{hf model org}}.");
    assert_eq!(
        v["prompt"],
        "Hello {{hf model org}}_{{hf model name}}!\nPlain llama and {{invalid var}}\n"
    );
}

// ---- block scalars at the end of a file ----

#[test]
fn block_scalar_at_end_of_file_without_newline_gains_none() {
    for (body, want) in [
        ("|\n  hello\n  world", "hello\nworld"),
        ("|+\n  hello\n  world", "hello\nworld"),
        (">\n  hello\n  world", "hello world"),
        ("|\n  hello\n  world\n", "hello\nworld\n"),
        ("|\n  hello\n  ", "hello\n"),
    ] {
        let out = Test::new()
            .write_raw(
                "recipes/eof.yaml",
                &format!("title: t\ndescription: d\nprompt: {body}"),
            )
            .args(["render", "--source", "eof", "--json"])
            .run();
        assert_eq!(out.json()["prompt"], want, "{body:?}");
    }
}
