//! The JSON that `summon run --json` and `summon run --dry-run --json` print, pinned by mirror
//! structs that refuse unknown fields: a key added, renamed or dropped fails here, so the
//! documented shape and the printed one cannot drift apart unnoticed.

use crate::support;

use serde::Deserialize;
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

const PIPELINE: &str = "version: 1
name: shapes
steps:
  - id: list
    decompose:
      items: [a, b, bad]
  - id: each
    fan_out:
      over: list
      instructions: \"Check {{ item }}\"
    min_success: \"50%\"
  - id: sum
    synthesize:
      instructions: \"Sum {% for r in steps.each.results %}{{ r.output }} {% endfor %}\"
";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunJson {
    run_id: String,
    status: String,
    steps: Vec<RunStep>,
    input_tokens: u64,
    output_tokens: u64,
    cache_read_tokens: u64,
    cache_write_tokens: u64,
    output: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunStep {
    id: String,
    status: String,
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DryRunJson {
    steps: Vec<DryRunStep>,
    tasks: u64,
    drafted_tasks: u64,
    estimated_input_tokens: u64,
    estimated_input_cost_usd: f64,
    estimated_cost_usd: f64,
    max_cost_usd: Option<f64>,
    /// Each model's price the cost counts with, and where it came from.
    prices: Vec<String>,
    estimate_crosses_cap: Option<bool>,
    unpriced_models: Vec<String>,
    errors: Vec<DryRunError>,
}

/// A step's drafted first requests priced at its tier (the keys are pinned; the values are
/// checked in `tests/cost.rs`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct StepCost {
    input: f64,
    output_max: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DryRunStep {
    id: String,
    kind: String,
    needs: Vec<String>,
    width: Option<u64>,
    tasks: Option<u64>,
    drafted: u64,
    input_tokens: u64,
    model: Option<String>,
    prompt: Option<String>,
    later: Option<String>,
    notes: Vec<String>,
    output_limit: Option<OutputLimit>,
    overhead: Option<Overhead>,
    levels: Option<Levels>,
    tier: Option<String>,
    estimated_cost_usd: Option<StepCost>,
}

/// The output limit of a step's requests.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct OutputLimit {
    /// `None`: no limit sent (the provider's own).
    tokens: Option<u64>,
    source: String,
    /// The step's later tasks learn theirs from its answers.
    learned: bool,
    default: bool,
}

/// The expected levels of a reducing synthesis.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Levels {
    tasks: Vec<u64>,
    chunk_tokens: u64,
    tokens_per_result: u64,
    from_output_limit: bool,
    tokens_per_partial: u64,
    converges: bool,
    /// `reduce: auto`: the window the chunks fill, and where it comes from.
    context_window: Option<Window>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // read through Debug
struct Window {
    tokens: u64,
    from: String,
}

/// What the tasks of a step send beyond their own text.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Overhead {
    tasks: u64,
    tokens: u64,
    tool_tokens: u64,
    per_task_max: u64,
    tool_tokens_per_task_max: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DryRunError {
    line: u64,
    column: u64,
    message: String,
}

fn project(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_RETRY_BASE_MS", "1")
        .write_raw("p.yaml", PIPELINE)
}

fn mock() -> MockConfig {
    MockConfig::new().rule(|request| {
        let text = request.last_user_text().unwrap_or_default();
        if text.contains("Check bad") {
            Reply::status(
                400,
                r#"{"error":{"message":"this item is bad","type":"invalid_request_error"}}"#,
            )
        } else {
            Reply::Echo
        }
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn run_json_has_exactly_its_documented_keys() {
    let server = MockServer::start(mock()).await;
    let out = project(&server)
        .args(["run", "p.yaml", "--json", "--out", "out"])
        .run();
    let json: RunJson = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("run --json ({e}):\n{}", out.stdout));
    assert_eq!(json.status, "succeeded", "{json:?}");
    assert!(!json.run_id.is_empty());
    let steps: Vec<(&str, &str)> = json
        .steps
        .iter()
        .map(|s| (s.id.as_str(), s.status.as_str()))
        .collect();
    assert_eq!(
        steps,
        [
            ("list", "succeeded"),
            ("each", "succeeded"),
            ("sum", "succeeded")
        ]
    );
    assert!(json.steps.iter().all(|s| s.error.is_none()), "{json:?}");
    assert!(json.input_tokens > 0, "{json:?}");
    assert!(json.cache_read_tokens <= json.input_tokens, "{json:?}");
    assert!(json.output_tokens > 0, "{json:?}");
    let _ = json.cache_write_tokens;
    let output = json.output.expect("the synthesis answer");
    assert!(
        output.starts_with("echo: Sum echo: Check a echo: Check b"),
        "{output}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_run_json_names_the_step_and_its_error() {
    let server = MockServer::start(mock()).await;
    let out = project(&server)
        .write_raw(
            "p.yaml",
            &PIPELINE.replace("min_success: \"50%\"", "min_success: \"100%\""),
        )
        .args(["run", "p.yaml", "--json", "--out", "out"])
        .code(2)
        .run();
    let json: RunJson = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("run --json ({e}):\n{}", out.stdout));
    assert_eq!(json.status, "failed");
    assert_eq!(json.steps[1].status, "failed", "{json:?}");
    assert!(json.steps[1].error.is_some(), "{json:?}");
    assert_eq!(json.steps[2].status, "skipped", "{json:?}");
    assert_eq!(json.output, None);
}

#[test]
fn dry_run_json_has_exactly_its_documented_keys() {
    let out = Test::new()
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
        .write_raw("p.yaml", PIPELINE)
        .args(["run", "p.yaml", "--dry-run", "--json"])
        .run();
    let json: DryRunJson = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("--dry-run --json ({e}):\n{}", out.stdout));
    let ids: Vec<&str> = json.steps.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["list", "each", "sum"]);
    assert_eq!(json.steps[1].needs, ["list"]);
    assert_eq!(json.steps[1].tasks, Some(3), "{json:?}");
    assert_eq!(json.tasks, 4, "three checks and the synthesis: {json:?}");
    assert!(json.estimated_input_tokens > 0, "{json:?}");
    assert!(json.errors.is_empty(), "{json:?}");
    // mock-model has no price to count with.
    assert!(json.prices.is_empty(), "{json:?}");
    let each = &json.steps[1];
    assert_eq!(each.kind, "fan_out");
    assert_eq!(each.width, Some(3));
    assert_eq!(each.drafted, 3);
    assert!(each.input_tokens > 0, "{each:?}");
    assert_eq!(each.model.as_deref(), Some("mock-model"));
    assert_eq!(each.prompt.as_deref(), Some("Check a"));
    assert!(each.later.is_none() && each.notes.is_empty(), "{each:?}");
    // OpenAI itself: no limit, first answer or later (a learned one would cost the key's tokens).
    assert_eq!(
        each.output_limit,
        Some(OutputLimit {
            tokens: None,
            source: "full".to_owned(),
            learned: false,
            default: true
        })
    );
    let overhead = each.overhead.as_ref().expect("the fan-out's overhead");
    assert_eq!(overhead.tasks, 3);
    assert!(overhead.tool_tokens <= overhead.tokens, "{overhead:?}");
    assert!(
        overhead.tool_tokens_per_task_max <= overhead.per_task_max,
        "{overhead:?}"
    );
    assert_eq!(overhead.tokens, 3 * overhead.per_task_max, "{overhead:?}");
    assert!(json.steps[0].overhead.is_none() && json.steps[2].overhead.is_none());
    assert!(json.steps.iter().all(|s| s.levels.is_none()), "{json:?}");
    // mock-model has no price: no step is priced, and there is no cap to cross.
    assert!(
        json.steps
            .iter()
            .all(|s| s.estimated_cost_usd.is_none() && s.tier.is_none()),
        "{json:?}"
    );
    assert_eq!(json.estimated_cost_usd, 0.0);
    assert_eq!((json.max_cost_usd, json.estimate_crosses_cap), (None, None));
    let sum = &json.steps[2];
    assert_eq!(
        sum.later.as_deref(),
        Some("rendered once `each` has run"),
        "{sum:?}"
    );
    assert_eq!(json.drafted_tasks, 3);
    assert_eq!(json.unpriced_models, ["mock-model"]);
    assert_eq!(json.estimated_input_cost_usd, 0.0);
}

#[test]
fn dry_run_json_lists_errors_with_line_and_column() {
    let out = Test::new()
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
        .write_raw(
            "p.yaml",
            &PIPELINE.replace(
                "      over: list\n",
                "      over: list\n      source: revieww\n",
            ),
        )
        .args(["run", "p.yaml", "--dry-run", "--json"])
        .code(1)
        .run();
    let json: DryRunJson = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("--dry-run --json ({e}):\n{}", out.stdout));
    let error = json.errors.first().expect("an error");
    assert_eq!((error.line, error.column), (10, 15), "{error:?}");
    assert!(error.message.contains("revieww"), "{error:?}");
}

#[test]
fn dry_run_json_gives_the_levels_of_a_reducing_synthesis() {
    let pipeline = PIPELINE.replace(
        "  - id: sum\n",
        "  - id: sum\n    reduce: auto\n    chunk_tokens: 1200\n",
    );
    assert_ne!(pipeline, PIPELINE);
    let out = Test::new()
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--dry-run", "--json"])
        .run();
    let json: DryRunJson = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("--dry-run --json ({e}):\n{}", out.stdout));
    let levels = json.steps[2]
        .levels
        .as_ref()
        .expect("the synthesis's levels");
    assert_eq!(
        levels.tasks,
        [2, 1],
        "two results a chunk, then one: {levels:?}"
    );
    assert_eq!(levels.chunk_tokens, 1200, "{levels:?}");
    assert!(
        levels.context_window.is_none(),
        "chunk_tokens needs no window: {levels:?}"
    );
    assert!(levels.converges, "{levels:?}");
    assert!(
        !levels.from_output_limit,
        "no output limit is set: {levels:?}"
    );
    assert!(levels.tokens_per_result > 0 && levels.tokens_per_partial > 0);
}
