//! Results as data: a schema-validated answer reaches later steps and the outputs as parsed
//! JSON (`r.data`, `data` in results.jsonl), tables of a fan-out's results are written as CSV
//! or JSONL, and a short placeholder key does not garble what summon prints.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

/// A project wired to the mock as an OpenAI-compatible provider with this key.
fn openai_with_key(server: &MockServer, key: &str) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", key)
        .env("SUMMON_MODEL", "mock-model")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_short_placeholder_key_is_not_cut_out_of_messages() {
    let message = "This model's maximum context length is 8192 tokens; extra text exceeds it";
    let server = MockServer::start(MockConfig::new().default_reply(Reply::status(
        400,
        json!({"error": {"message": message, "type": "invalid_request_error"}}).to_string(),
    )))
    .await;
    let out = openai_with_key(&server, "x")
        .args(["delegate", "--instructions", "Hi.", "--json"])
        .code(2)
        .run();
    let shown = format!("{}{}", out.stdout, out.stderr);
    assert!(shown.contains("maximum context length"), "{shown}");
    assert!(shown.contains("extra text exceeds"), "{shown}");
    assert!(!shown.contains("[redacted]"), "{shown}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_looking_key_is_still_redacted() {
    let key = "local-key-0123456789";
    let server = MockServer::start(MockConfig::new().default_reply(Reply::status(
        400,
        json!({"error": {"message": format!("bad request from {key}")}}).to_string(),
    )))
    .await;
    let out = openai_with_key(&server, key)
        .args(["delegate", "--instructions", "Hi.", "--json"])
        .code(2)
        .run();
    let shown = format!("{}{}", out.stdout, out.stderr);
    assert!(shown.contains("bad request from [redacted]"), "{shown}");
    assert!(!shown.contains(key), "{shown}");
}

const KEY: &str = "sk-test-0123456789abcdefSECRET";

/// A project wired to the mock as an OpenAI-compatible provider.
fn openai(server: &MockServer) -> Test {
    openai_with_key(server, KEY)
}

/// The lines of `results.jsonl`, by step and item.
fn results(dir: &std::path::Path) -> Vec<Value> {
    let mut lines = support::results(dir);
    lines.sort_by_key(|l| (l["step"].as_str().unwrap().to_owned(), l["index"].as_u64()));
    lines
}

const CLASSIFY_RECIPE: &str = "
    title: Classify
    description: d
    instructions: Classify the ticket.
    prompt: 'Classify: {{ text }}'
    parameters:
      - key: text
        input_type: string
        requirement: required
        description: the ticket
    response:
      json_schema:
        type: object
        required: [category, priority]
        properties:
          category: { type: string }
          priority: { type: integer }
    ";

/// Answers a classification with a category taken from the ticket's text, and anything else
/// with `echo: ` and the request's last user message.
fn classifier() -> MockConfig {
    MockConfig::new().rule(|request| {
        let text = request.last_user_text().unwrap_or_default();
        match text.strip_prefix("Classify: ") {
            Some(ticket) => Reply::text(
                json!({"category": format!("cat-{ticket}"), "priority": ticket.len()}).to_string(),
            ),
            None => Reply::text(format!("echo: {text}")),
        }
    })
}

const LABELS_PIPELINE: &str = "
    version: 1
    name: labels
    steps:
      - id: tickets
        decompose:
          items: [ab, cde]
      - id: labels
        fan_out:
          over: tickets
          source: classify
          parameters: { text: '{{ item }}' }
      - id: note
        delegate:
          instructions: Say hi.
      - id: summary
        synthesize:
          instructions: '{% for r in steps.labels.results %}{{ r.item }}={{ r.data.category }}/{{ r.data.priority }};{% endfor %} note data={{ steps.note.data }}'
    ";

#[tokio::test(flavor = "multi_thread")]
async fn a_validated_answer_reaches_a_later_step_as_data() {
    let server = MockServer::start(classifier()).await;
    let out = openai(&server)
        .write("recipes/classify.yaml", CLASSIFY_RECIPE)
        .write("p.yaml", LABELS_PIPELINE)
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    assert_eq!(
        out.stdout.trim(),
        "echo: ab=cat-ab/2;cde=cat-cde/3; note data=None"
    );
    let lines = results(&out.dir.join("out"));
    let labels: Vec<&Value> = lines.iter().filter(|l| l["step"] == "labels").collect();
    assert_eq!(
        labels[0]["data"],
        json!({"category": "cat-ab", "priority": 2})
    );
    assert_eq!(
        labels[1]["data"],
        json!({"category": "cat-cde", "priority": 3})
    );
    // `data` follows the keys that were there before it.
    let raw = std::fs::read_to_string(out.dir.join("out/results.jsonl")).unwrap();
    let first = raw.lines().find(|l| l.contains("cat-ab")).unwrap();
    assert!(
        first.contains(r#","warnings":[],"data":{"category":"cat-ab","priority":2},"#),
        "{first}"
    );
    // A text answer has no data.
    let note = lines.iter().find(|l| l["step"] == "note").unwrap();
    assert_eq!(note["data"], Value::Null);
    assert!(note.as_object().unwrap().contains_key("data"), "{note}");
}

const DELEGATE_DATA_PIPELINE: &str = "
    version: 1
    name: one
    steps:
      - id: one
        delegate:
          source: classify
          parameters: { text: xyz }
      - id: after
        synthesize:
          instructions: 'got {{ steps.one.data.category }} at {{ steps.one.data.priority }}'
    ";

#[tokio::test(flavor = "multi_thread")]
async fn a_delegate_steps_validated_answer_is_its_data() {
    let server = MockServer::start(classifier()).await;
    let out = openai(&server)
        .write("recipes/classify.yaml", CLASSIFY_RECIPE)
        .write("p.yaml", DELEGATE_DATA_PIPELINE)
        .args(["run", "p.yaml", "--quiet"])
        .run();
    assert_eq!(out.stdout.trim(), "echo: got cat-xyz at 3");
}

#[tokio::test(flavor = "multi_thread")]
async fn data_survives_a_resume() {
    // The first run fails at the last step; the resumed run takes the labels from the journal.
    let summaries = Arc::new(AtomicU32::new(0));
    let seen = Arc::clone(&summaries);
    let server = MockServer::start(MockConfig::new().rule(move |request| {
        let text = request.last_user_text().unwrap_or_default();
        match text.strip_prefix("Classify: ") {
            Some(ticket) => Reply::text(
                json!({"category": format!("cat-{ticket}"), "priority": ticket.len()}).to_string(),
            ),
            None if text.contains("note data") && seen.fetch_add(1, Ordering::SeqCst) == 0 => {
                Reply::status(400, r#"{"error":{"message":"no"}}"#)
            }
            None => Reply::text(format!("echo: {text}")),
        }
    }))
    .await;
    let t = openai(&server)
        .write("recipes/classify.yaml", CLASSIFY_RECIPE)
        .write("p.yaml", LABELS_PIPELINE);
    let first = t
        .command()
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .output()
        .unwrap();
    assert_eq!(first.status.code(), Some(2));
    let classified = server
        .requests()
        .iter()
        .filter(|r| {
            r.last_user_text()
                .unwrap_or_default()
                .starts_with("Classify")
        })
        .count();
    assert_eq!(classified, 2);
    let second = t
        .command()
        .args(["run", "p.yaml", "--out", "out", "--quiet", "--resume"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&second.stdout);
    assert_eq!(
        second.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let classified_again = server
        .requests()
        .iter()
        .filter(|r| {
            r.last_user_text()
                .unwrap_or_default()
                .starts_with("Classify")
        })
        .count();
    assert_eq!(classified_again, 2, "the labels come from the journal");
    assert_eq!(
        stdout.trim(),
        "echo: ab=cat-ab/2;cde=cat-cde/3; note data=None"
    );
    let lines = results(&t.path().join("out"));
    assert_eq!(
        lines[0]["data"],
        json!({"category": "cat-ab", "priority": 2})
    );
}

const INLINE_SCHEMA_PIPELINE: &str = "
    version: 1
    name: inline
    steps:
      - id: tickets
        decompose:
          items: [ab, cde]
      - id: labels
        fan_out:
          over: tickets
          instructions: 'Classify: {{ item }}'
          schema:
            type: object
            additionalProperties: false
            required: [category, priority]
            properties:
              category: { type: string }
              priority: { type: integer }
      - id: summary
        synthesize:
          instructions: '{% for r in steps.labels.results %}{{ r.data.category }};{% endfor %}'
    ";

#[tokio::test(flavor = "multi_thread")]
async fn a_fan_out_with_an_inline_schema_asks_for_it_and_gives_data() {
    let server = MockServer::start(classifier()).await;
    let out = openai(&server)
        .write("p.yaml", INLINE_SCHEMA_PIPELINE)
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    assert_eq!(out.stdout.trim(), "echo: cat-ab;cat-cde;");
    let requests = server.requests();
    let classify = requests
        .iter()
        .find(|r| r.last_user_text().unwrap_or_default() == "Classify: ab")
        .expect("a classification request");
    assert_eq!(
        classify.body["response_format"]["json_schema"]["schema"]["required"],
        json!(["category", "priority"])
    );
    assert_eq!(
        classify.body["response_format"]["json_schema"]["strict"],
        true
    );
    let lines = results(&out.dir.join("out"));
    assert_eq!(
        lines[0]["data"],
        json!({"category": "cat-ab", "priority": 2})
    );
}

#[test]
fn a_bad_inline_schema_is_an_error_at_its_line() {
    let out = Test::new()
        .write(
            "p.yaml",
            "
            version: 1
            name: bad
            steps:
              - id: tickets
                decompose:
                  items: [a]
              - id: labels
                fan_out:
                  over: tickets
                  instructions: x
                  schema:
                    type: not-a-type
            ",
        )
        .args(["validate", "p.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains("p.yaml:12:")
            && out
                .stderr
                .contains("`steps[1].fan_out.schema` is not a valid schema"),
        "{}",
        out.stderr
    );
    let out = Test::new()
        .write(
            "p.yaml",
            "version: 1\nname: bad\nsteps:\n  - id: t\n    decompose: {items: [a]}\n  - id: l\n    fan_out: {over: t, instructions: x, schema: [1]}\n",
        )
        .args(["validate", "p.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains("p.yaml:7:") && out.stderr.contains("must be a JSON Schema object"),
        "{}",
        out.stderr
    );
}
