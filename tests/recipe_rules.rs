//! goose's recipe rules: template inheritance (`extends`/`include` resolved in the recipe's
//! folder by every command that reads recipes), no defaults for file parameters, goose's
//! retry validation, placeholders that are not expressions kept as text, and block scalars
//! at the end of a file read as goose's YAML parser reads them.

use crate::support;

use serde_json::json;
use summon_mock_llm::{Api, MockConfig, MockServer, RecordedRequest, Reply};
use support::*;

const KEY: &str = "sk-test-0123456789abcdefSECRET";

/// A project wired to the mock as an OpenAI-compatible provider.
fn openai(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
}

/// The first user message of a request (after the system prompt).
fn first_user(request: &RecordedRequest) -> String {
    let messages = request.body["messages"].as_array().expect("messages");
    let user = messages
        .iter()
        .find(|m| m["role"] == "user")
        .expect("a user message");
    match &user["content"] {
        serde_json::Value::String(text) => text.clone(),
        serde_json::Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<String>(),
        other => panic!("unexpected content: {other}"),
    }
}

#[track_caller]
fn assert_has(text: &str, needle: &str) {
    assert!(text.contains(needle), "want: {needle}\n---\n{text}");
}

#[track_caller]
fn assert_lacks(text: &str, needle: &str) {
    assert!(!text.contains(needle), "unwanted: {needle}\n---\n{text}");
}

// ---- template inheritance: `extends` and `include` in the recipe's folder ----

/// goose's `test_template_inheritance` parent recipe.
const PARENT: &str = "
    version: 1.0.0
    title: Parent
    description: Parent recipe
    prompt: |
        show me the news for day: {{ date }}
        {% block prompt -%}
        What is the capital of France?
        {%- endblock %}
        {% if is_enabled %}
            Feature is enabled.
        {% else %}
            Feature is disabled.
        {% endif %}
    parameters:
        - key: date
          input_type: string
          requirement: required
          description: date specified by the user
        - key: is_enabled
          input_type: boolean
          requirement: required
          description: whether the feature is enabled
";

/// goose's child recipe: nothing but the parent and one block.
const CHILD: &str = "
    {% extends \"parent.yaml\" -%}
    {% block prompt -%}
    What is the capital of Germany?
    {%- endblock %}
";

/// What goose renders for the child with `date=today`, `is_enabled=true`.
const CHILD_PROMPT: &str =
    "show me the news for day: today\nWhat is the capital of Germany?\n\n    Feature is enabled.\n";

fn inheritance(t: Test) -> Test {
    t.write("recipes/parent.yaml", PARENT)
        .write("recipes/child.yaml", CHILD)
}

#[test]
fn extends_resolves_in_the_recipe_folder_for_validate_render_and_load() {
    // From a subdirectory: the parent is found next to the recipe, not in the working dir.
    let out = inheritance(Test::new())
        .args(["--color", "never", "validate", "recipes/child.yaml"])
        .run();
    assert_has(&out.stderr, "checked 1 file(s): 0 error(s), 0 warning(s)");

    let out = inheritance(Test::new())
        .args([
            "render",
            "--source",
            "child",
            "--param",
            "date=today",
            "--param",
            "is_enabled=true",
            "--json",
        ])
        .run();
    let v = out.json();
    assert_eq!(v["title"], "Parent");
    assert_eq!(v["description"], "Parent recipe");
    assert_eq!(v["prompt"], CHILD_PROMPT);
    assert_eq!(
        v["parameters"],
        json!({"date": "today", "is_enabled": "true"})
    );

    let out = inheritance(Test::new()).args(["load", "child"]).run();
    assert_has(&out.stdout, "# Loaded: child (recipe)");
    assert_has(&out.stdout, "What is the capital of Germany?");
    assert_lacks(&out.stdout, "France");
}

#[test]
fn include_of_yaml_parts_resolves_in_the_recipe_folder() {
    let t = Test::new()
        .write(
            "recipes/parts/params.yaml",
            "
            parameters:
              - key: topic
                input_type: string
                requirement: required
                description: what to write about
            ",
        )
        .write(
            "recipes/notes.yaml",
            "
            title: Notes
            description: notes with shared parameters
            prompt: Write notes about {{ topic }}.
            {% include \"parts/params.yaml\" %}
            ",
        )
        .current_dir("work");
    let out = t
        .args(["--color", "never", "validate", "../recipes/notes.yaml"])
        .run();
    assert_has(&out.stderr, "0 error(s), 0 warning(s)");

    let out = Test::new()
        .write(
            "recipes/parts/params.yaml",
            "parameters:\n  - key: topic\n    input_type: string\n    requirement: required\n    description: d\n",
        )
        .write(
            "recipes/notes.yaml",
            "title: Notes\ndescription: d\nprompt: 'Write notes about {{ topic }}: now'\n{% include \"parts/params.yaml\" %}\n",
        )
        .args(["render", "--source", "notes", "--param", "topic=a: b", "--json"])
        .run();
    assert_eq!(out.json()["prompt"], "Write notes about a: b: now");
}

#[test]
fn include_or_extends_outside_the_recipe_folder_is_an_error_naming_the_file() {
    for tag in ["extends", "include"] {
        let out = Test::new()
            .write(
                "secret.yaml",
                "title: Secret\ndescription: s\nprompt: TOPSECRET\n",
            )
            .write(
                "recipes/esc.yaml",
                &format!("title: t\ndescription: d\n{{% {tag} \"../secret.yaml\" %}}\n"),
            )
            .args(["--color", "never", "validate", "recipes/esc.yaml"])
            .code(1)
            .run();
        assert_has(&out.stderr, "recipes/esc.yaml:3:");
        assert_has(&out.stderr, "cannot include `../secret.yaml`");
        assert_has(&out.stderr, "inside the recipe's directory");
        assert_lacks(&out.stderr, "invalid YAML");
        assert_lacks(&out.stderr, "TOPSECRET");
    }
    // A parent that does not exist is named too.
    let out = Test::new()
        .write("recipes/orphan.yaml", "{% extends \"missing.yaml\" %}\n")
        .args(["--color", "never", "validate", "recipes/orphan.yaml"])
        .code(1)
        .run();
    assert_has(&out.stderr, "recipes/orphan.yaml:1:");
    assert_has(&out.stderr, "missing.yaml");
    assert_lacks(&out.stderr, "invalid YAML");
}

#[test]
fn include_in_a_value_outside_the_recipe_folder_fails_validate() {
    let out = Test::new()
        .write_raw("secret.md", "TOPSECRET")
        .write(
            "recipes/esc.yaml",
            "
            title: t
            description: d
            prompt: |
              Intro
              {% include '../secret.md' %}
            ",
        )
        .args(["--color", "never", "validate", "recipes/esc.yaml"])
        .code(1)
        .run();
    assert_has(&out.stderr, "recipes/esc.yaml:5:");
    assert_has(&out.stderr, "cannot include `../secret.md`");
}

#[tokio::test(flavor = "multi_thread")]
async fn inherited_recipe_delegates_with_the_parent_structure() {
    let server = MockServer::start(MockConfig::new().reply(Reply::text("Berlin."))).await;
    let _out = inheritance(openai(&server))
        .args([
            "delegate",
            "--source",
            "child",
            "--param",
            "date=today",
            "--param",
            "is_enabled=true",
        ])
        .stdout("Berlin.\n")
        .run();
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(first_user(&requests[0]), CHILD_PROMPT);
}

#[tokio::test(flavor = "multi_thread")]
async fn inherited_recipe_runs_in_a_pipeline() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let pipeline = r#"version: 1
name: p
steps:
  - id: days
    decompose:
      items: [monday, tuesday]
  - id: news
    fan_out:
      over: days
      source: child
      parameters:
        date: "{{ item }}"
        is_enabled: "true"
"#;
    let out = inheritance(openai(&server))
        .write_raw("p.yaml", pipeline)
        .args(["run", "p.yaml", "--quiet"])
        .run();
    assert_eq!(out.code, 0, "{}", out.stderr);
    let mut sent: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| r.api == Api::OpenAi)
        .map(first_user)
        .collect();
    sent.sort();
    assert_eq!(
        sent,
        [
            CHILD_PROMPT.replace("today", "monday"),
            CHILD_PROMPT.replace("today", "tuesday")
        ]
    );
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
    assert_has(
        &out.stderr,
        "Source 'sum' cannot be used: `recipes/sum.yaml` has errors: run summon validate\n  = hint: recipes/sum.yaml:8:5: file parameter `doc` cannot have a default value",
    );
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
