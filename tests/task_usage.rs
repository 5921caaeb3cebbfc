//! What a task is billed for is what it spent: the tokens of every attempt a step's `retries`
//! made, and of the turns a task finished before its `timeout` stopped it, count in
//! `results.jsonl` and `report.json` (a provider bills them whatever became of the task).

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::{Test, read_json, results};

/// Three items of the same length, so their requests are the same size: `aa01` is cut off
/// at the output limit once and retried, `bb01` is answered at once, `cc01` calls a tool and
/// then waits for an answer that comes too late.
const PIPELINE: &str = "version: 1
name: usage
steps:
  - id: list
    decompose:
      items: [aa01, bb01, cc01]
  - id: each
    fan_out:
      over: list
      instructions: \"Look at {{ item }}\"
    retries: 1
    timeout: 2s
    on_error: continue
";

fn mock() -> MockConfig {
    let cut = Arc::new(AtomicBool::new(false));
    MockConfig::new().rule(move |request| {
        let text = request.body["messages"].to_string();
        let answered_tool = request.body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        if text.contains("aa01") && !cut.swap(true, Ordering::SeqCst) {
            Reply::text("half an ans").finish("length")
        } else if text.contains("cc01") && !answered_tool {
            Reply::tool_call("list_files", json!({}))
        } else if text.contains("cc01") {
            Reply::text("too late").delayed(Duration::from_secs(60))
        } else {
            Reply::text("fine answer")
        }
    })
}

fn line<'a>(lines: &'a [Value], item: &str) -> &'a Value {
    lines
        .iter()
        .find(|l| l["step"] == "each" && l["item"] == item)
        .unwrap_or_else(|| panic!("no line for {item}: {lines:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn retried_and_timed_out_tasks_are_billed_for_what_they_spent() {
    let server = MockServer::start(mock()).await;
    let t = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
        .write_raw("p.yaml", PIPELINE)
        .args(["run", "p.yaml", "--out", "out", "--quiet"]);
    let out = t.run();
    let dir = out.dir.join("out");
    let lines = results(&dir);
    let (retried, once, late) = (
        line(&lines, "aa01"),
        line(&lines, "bb01"),
        line(&lines, "cc01"),
    );
    assert_eq!(once["status"], "completed", "{once}");
    let one_request = once["input_tokens"].as_u64().expect("tokens");
    assert!(one_request > 0, "{once}");

    // Two attempts of the same size: both are billed.
    assert_eq!(retried["status"], "completed", "{retried}");
    assert_eq!(retried["attempts"], 2, "{retried}");
    assert_eq!(
        retried["input_tokens"].as_u64(),
        Some(2 * one_request),
        "{retried}"
    );
    assert!(
        retried["output_tokens"].as_u64() > once["output_tokens"].as_u64(),
        "the cut-off answer's output counts too: {retried} {once}"
    );

    // Timed out after its first turn (both attempts): each first request is billed.
    assert_eq!(late["status"], "failed", "{late}");
    assert!(
        late["error"]
            .as_str()
            .is_some_and(|e| e.contains("timed out after 2s")),
        "{late}"
    );
    assert_eq!(late["attempts"], 2, "{late}");
    assert_eq!(
        late["input_tokens"].as_u64(),
        Some(2 * one_request),
        "{late}"
    );
    assert!(late["output_tokens"].as_u64() > Some(0), "{late}");

    // The report adds up the same.
    let report = read_json(&dir.join("report.json"));
    let total: u64 = lines
        .iter()
        .filter_map(|l| l["input_tokens"].as_u64())
        .sum();
    assert_eq!(
        report["total"]["input_tokens"].as_u64(),
        Some(total),
        "{report}"
    );
}
