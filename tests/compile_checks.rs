//! What `summon run --dry-run` finds before anything is sent, `summon validate` finds too, at
//! the same `file:line:col`, and `summon run` refuses the pipeline before its first request:
//! a recipe's required parameter a step does not give, a parameter the recipe does not
//! declare, a literal value its type rejects, parameters given to an agent, an agent with neither role text nor instructions, an items file no
//! reader knows, a template that fails to render over a literal item; and `summon merge`
//! checks the steps it runs.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::{Output, Test};

/// A recipe with two required parameters and no defaults.
const NOTES: &str = "
    version: 1.0.0
    title: Notes
    description: Notes for one area
    instructions: Write notes for {{ area }} in {{ lang }}.
    parameters:
      - key: area
        input_type: string
        requirement: required
        description: the area
      - key: lang
        input_type: string
        requirement: required
        description: the language
      - key: count
        input_type: number
        requirement: optional
        default: \"3\"
        description: how many
";

const EXPLORER: &str = "
    ---
    name: explorer
    description: Explores
    ---
    You explore carefully.
";

/// A project with the recipe and the agent, wired to the mock as an OpenAI-compatible
/// provider.
fn project(server: &MockServer, pipeline: &str) -> Test {
    Test::new()
        .write("recipes/notes.yaml", NOTES)
        .write(".claude/agents/explorer.md", EXPLORER)
        .write(
            ".claude/agents/blank.md",
            "---\nname: blank\ndescription: no role text\n---\n",
        )
        .write("pipelines/p.yaml", pipeline)
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
}

/// `validate` (of the file, and of the folder that holds it), `run --dry-run` and `run` all
/// exit 1 with `wanted` on stderr, and nothing is sent or journaled.
async fn every_command_reports(pipeline: &str, wanted: &str) {
    let server = MockServer::start(MockConfig::new()).await;
    let commands: [&[&str]; 4] = [
        &["validate", "pipelines/p.yaml"],
        &["validate", "pipelines"],
        &["run", "pipelines/p.yaml", "--dry-run"],
        &["run", "pipelines/p.yaml", "--quiet"],
    ];
    for args in commands {
        let out: Output = project(&server, pipeline)
            .args(["--color", "never"])
            .args(args.iter().copied())
            .output();
        assert_eq!(out.code, 1, "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains(wanted),
            "{args:?}: want {wanted}\n---\n{}",
            out.stderr
        );
        assert!(
            !out.dir.join(".summon").exists(),
            "{args:?}: a run was journaled"
        );
    }
    assert_eq!(server.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fan_out_without_a_required_recipe_parameter_is_an_error_at_its_source() {
    // `source: notes` on line 10, its value at column 15.
    let pipeline = r#"
        version: 1
        name: p
        steps:
          - id: areas
            decompose:
              items: [parser, lexer]
          - id: notes
            fan_out:
              over: areas
              source: notes
              parameters: { area: "{{ item }}" }
    "#;
    every_command_reports(
        pipeline,
        "pipelines/p.yaml:10:15: error: step `notes`: recipe `notes` has a required parameter \
         the step does not give: `lang`",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_parameter_the_recipe_does_not_declare_is_an_error_at_its_value() {
    // `langauge: en` on line 7, its value at column 55.
    let pipeline = r#"
        version: 1
        name: p
        steps:
          - id: notes
            delegate:
              source: notes
              parameters: { area: parser, lang: en, langauge: en }
    "#;
    every_command_reports(
        pipeline,
        "pipelines/p.yaml:7:55: error: step `notes`: unknown parameter `langauge` of recipe `notes`",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_literal_value_the_parameter_type_rejects_is_an_error_at_the_value() {
    // `count: many` on line 7, its value at column 52.
    let pipeline = r#"
        version: 1
        name: p
        steps:
          - id: notes
            delegate:
              source: notes
              parameters: { area: parser, lang: en, count: many }
    "#;
    every_command_reports(
        pipeline,
        "pipelines/p.yaml:7:52: error: step `notes`: parameter `count` must be a number, got `many`",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn parameters_given_to_an_agent_are_an_error() {
    let pipeline = r#"
        version: 1
        name: p
        steps:
          - id: look
            delegate:
              source: explorer
              instructions: Find the parser.
              parameters: { area: parser }
    "#;
    every_command_reports(
        pipeline,
        "pipelines/p.yaml:8:27: error: step `look`: agent `explorer` takes no parameters",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_with_no_role_text_and_no_instructions_is_an_error_at_its_source() {
    // An agent with role text runs alone (tests/roles.rs); one without has nothing to do.
    let pipeline = r#"
        version: 1
        name: p
        steps:
          - id: look
            delegate:
              source: blank
    "#;
    every_command_reports(
        pipeline,
        "pipelines/p.yaml:6:15: error: step `look`: agent `blank` has no role text to run on its own",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_items_file_no_reader_knows_is_an_error_at_its_name() {
    let pipeline = r#"
        version: 1
        name: p
        steps:
          - id: rows
            decompose:
              file: tickets.txt
          - id: each
            fan_out:
              over: rows
              instructions: "Read {{ item }}"
    "#;
    every_command_reports(
        pipeline,
        "pipelines/p.yaml:6:13: error: step `rows`: items file tickets.txt has an unsupported \
         extension; supported: .csv, .jsonl, .ndjson, .json",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_that_fails_over_a_literal_item_is_an_error_at_its_step() {
    // `- id: each` on line 7, the id at column 9; the instructions on line 10.
    let pipeline = r#"
        version: 1
        name: p
        steps:
          - id: list
            decompose:
              items: [{title: a, text: x}, {title: b}]
          - id: each
            fan_out:
              over: list
              instructions: "Read {{ item.text | upper }}"
    "#;
    every_command_reports(
        pipeline,
        "pipelines/p.yaml:7:9: error: step `each`: item 1: line 10: cannot render template: \
         undefined value",
    )
    .await;
}

#[test]
fn a_step_that_gives_every_required_parameter_validates() {
    let pipeline = r#"
        version: 1
        name: p
        steps:
          - id: notes
            delegate:
              source: notes
              parameters: { area: parser, lang: en }
    "#;
    Test::new()
        .write("recipes/notes.yaml", NOTES)
        .write("pipelines/p.yaml", pipeline)
        .args(["--color", "never", "validate", "pipelines/p.yaml"])
        .code(0)
        .stderr("summon: checked 1 file(s): 0 error(s), 0 warning(s)\n")
        .run();
}

/// A fan-out over four items, each task from the `worker` recipe, then a synthesis from the
/// `summary` recipe (its `source:` value on line 14, column 15).
const SHARDED: &str = r#"
    version: 1
    name: sharded
    steps:
      - id: list
        decompose:
          items: [a, b, c, d]
      - id: each
        fan_out:
          over: list
          source: worker
          parameters: { item: "{{ item }}" }
      - id: sum
        synthesize:
          source: summary
          instructions: "{% for r in steps.each.results %}{{ r.output }} {% endfor %}"
"#;

const WORKER: &str = "
    version: 1.0.0
    title: Worker
    description: One item
    instructions: Process {{ item }}.
    parameters:
      - key: item
        input_type: string
        requirement: required
        description: the item
";

const SUMMARY: &str = "
    version: 1.0.0
    title: Summary
    description: All of them
    instructions: Merge the answers.
";

#[tokio::test(flavor = "multi_thread")]
async fn merge_checks_the_steps_it_runs_before_any_request() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = Test::new()
        .write("p.yaml", SHARDED)
        .write("recipes/worker.yaml", WORKER)
        .write("recipes/summary.yaml", SUMMARY)
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model");
    for (shard, out) in [("1/2", "s1"), ("2/2", "s2")] {
        let ran = t
            .command()
            .args(["run", "p.yaml", "--shard", shard, "--out", out, "--quiet"])
            .output()
            .unwrap();
        assert_eq!(
            ran.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&ran.stderr)
        );
    }
    let sent = server.request_count();
    assert_eq!(sent, 4, "one request per item");
    // The shards' step is given to the merge: its recipe may be gone. The synthesis the merge
    // runs now names a recipe with a required parameter the step does not give.
    std::fs::remove_file(t.path().join("recipes/worker.yaml")).unwrap();
    let summary = format!(
        "{}parameters:\n  - key: tone\n    input_type: string\n    requirement: required\n    \
         description: the tone\n",
        support::unindent(SUMMARY)
    );
    std::fs::write(t.path().join("recipes/summary.yaml"), summary).unwrap();
    let merged = t
        .command()
        .args(["--color", "never", "merge", "p.yaml", "s1", "s2", "--quiet"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&merged.stderr);
    assert_eq!(merged.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "p.yaml:14:15: error: step `sum`: recipe `summary` has a required parameter the step \
             does not give: `tone`"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("worker"), "{stderr}");
    assert_eq!(server.request_count(), sent, "the merge sent a request");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_run_is_checked_against_the_catalog_it_was_started_with() {
    let fixed = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&fixed);
    let server = MockServer::start(MockConfig::new().rule(move |req| {
        let text = req.last_user_text().unwrap_or_default();
        if text.contains("Process b.") && !flag.load(Ordering::SeqCst) {
            Reply::status(
                400,
                r#"{"error":{"message":"this item is bad","type":"invalid_request_error"}}"#,
            )
        } else {
            Reply::Echo
        }
    }))
    .await;
    let pipeline = r#"
        version: 1
        name: p
        steps:
          - id: list
            decompose:
              items: [a, b, c]
          - id: each
            fan_out:
              over: list
              source: worker
              parameters: { item: "{{ item }}" }
            on_error: continue
            min_success: 100%
    "#;
    let t = Test::new()
        .write("p.yaml", pipeline)
        .write("recipes/worker.yaml", WORKER)
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model");
    let run = |extra: &[&str]| {
        let out = t
            .command()
            .args(["--color", "never", "run", "p.yaml", "--quiet"])
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = run(&[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(server.request_count(), 3);
    // A recipe added since is not in the catalog the run was started with: the resumed run
    // is refused at the `source:` value, before any request; a new run takes it.
    fixed.store(true, Ordering::SeqCst);
    std::fs::write(
        t.path().join("recipes/other.yaml"),
        support::unindent(WORKER).replace("Worker", "Other"),
    )
    .unwrap();
    std::fs::write(
        t.path().join("p.yaml"),
        support::unindent(pipeline).replace("source: worker", "source: other"),
    )
    .unwrap();
    let (code, stderr) = run(&["--resume"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("p.yaml:10:15: error: Source 'other' not found."),
        "{stderr}"
    );
    assert_eq!(server.request_count(), 3, "the resumed run sent a request");
    let (code, stderr) = run(&[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(server.request_count(), 6);
}
