//! Provider errors as people read them: a proxy's HTML page summarised once, and a rate limit
//! that asks for a wait in words waited out.

use crate::support;

use std::time::Duration;

use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

fn openai(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test")
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_RETRY_BASE_MS", "1")
}

const PAGE: &str = "<!DOCTYPE html>\n<html>\n<head><title>502 Bad Gateway</title></head>\n\
<body>\n<center><h1>502 Bad Gateway</h1></center>\n<hr><center>nginx/1.25.3</center>\n\
<p>If you are the administrator of this resource, check the error log for details; this \
page is long enough that quoting it whole in every line would drown what matters.</p>\n\
</body>\n</html>\n";

#[tokio::test(flavor = "multi_thread")]
async fn an_html_error_page_is_summarised_once_in_the_final_error() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::status(502, PAGE))).await;
    let out = openai(&server)
        .args(["delegate", "--instructions", "x"])
        .code(2)
        .run();
    // Five retries, then the error.
    assert_eq!(server.request_count(), 6, "{}", out.stderr);
    let retry_lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("] retry "))
        .collect();
    assert_eq!(retry_lines.len(), 5, "{}", out.stderr);
    for line in &retry_lines {
        assert!(
            line.ends_with(": provider overloaded or failing (HTTP 502)"),
            "{line}"
        );
    }
    assert_eq!(
        out.stderr.matches("502 Bad Gateway").count(),
        1,
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("provider overloaded or failing (HTTP 502): 502 Bad Gateway"),
        "{}",
        out.stderr
    );
    for fragment in ["<", "nginx", "administrator"] {
        assert!(!out.stderr.contains(fragment), "{}", out.stderr);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rate_limit_that_asks_for_a_wait_in_words_is_waited_out() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::status(
            429,
            r#"{"error":{"message":"litellm.RateLimitError: Rate limit exceeded. Try again in 1 seconds.","type":"throttling_error","code":"429"}}"#,
        ),
        Reply::text("ok"),
    ]))
    .await;
    let out = openai(&server)
        .args(["delegate", "--instructions", "x"])
        .stdout("ok\n")
        .run();
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains("] retry 1 in "))
        .unwrap_or_else(|| panic!("no retry line: {}", out.stderr));
    assert!(
        line.contains("retry 1 in 1.")
            && line.ends_with("s: rate limited by the provider (HTTP 429)"),
        "{line}"
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let gap = requests[1]
        .received_at
        .duration_since(requests[0].received_at);
    assert!(gap >= Duration::from_millis(950), "retried after {gap:?}");
}

/// llama.cpp's server answers HTTP 500 when it cannot parse the request (the arguments of a
/// tool call in the history): sending the same request again cannot help.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_error_that_cannot_parse_the_request_is_not_retried() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::status(
        500,
        r#"{"error":{"code":500,"message":"Failed to parse tool call arguments as JSON: [json.exception.parse_error.101] parse error","type":"server_error"}}"#,
    )))
    .await;
    let out = openai(&server)
        .args(["delegate", "--instructions", "x"])
        .code(2)
        .run();
    assert_eq!(server.request_count(), 1, "{}", out.stderr);
    assert!(!out.stderr.contains("] retry "), "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "the provider rejected the request (HTTP 500): Failed to parse tool call arguments as JSON"
        ),
        "{}",
        out.stderr
    );
}

const LOADING: &str =
    r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#;

/// A server still loading its model (llama.cpp's 503 "Loading model") is waited for apart
/// from the retries, and said once.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_still_loading_its_model_is_waited_for_apart_from_the_retries() {
    let mut replies: Vec<Reply> = (0..8).map(|_| Reply::status(503, LOADING)).collect();
    replies.push(Reply::text("ready"));
    let server = MockServer::start(MockConfig::new().replies(replies)).await;
    let out = openai(&server)
        .args(["delegate", "--instructions", "x"])
        .stdout("ready\n")
        .run();
    assert_eq!(server.request_count(), 9, "{}", out.stderr);
    assert!(!out.stderr.contains("] retry "), "{}", out.stderr);
    assert_eq!(
        out.stderr
            .matches("the provider is still loading its model (HTTP 503): waiting up to 180 s")
            .count(),
        1,
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_start_up_wait_is_bounded_and_then_the_retries_apply() {
    let server =
        MockServer::start(MockConfig::new().default_reply(Reply::status(503, LOADING))).await;
    let out = openai(&server)
        .env("SUMMON_STARTUP_WAIT_MS", "100")
        .args(["delegate", "--instructions", "x"])
        .code(2)
        .run();
    assert!(
        out.stderr.contains("waiting up to 0.1 s for it to start"),
        "{}",
        out.stderr
    );
    // The start-up polls (100 ms in all), then the five retries.
    assert_eq!(
        out.stderr
            .lines()
            .filter(|l| l.contains("] retry "))
            .count(),
        5,
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("Loading model"), "{}", out.stderr);
}

/// The waits of a task — for a provider still starting, and before a retry — are in its
/// results.jsonl line with when they began, within the task's own time: a timeline does not
/// count them in flight.
#[tokio::test(flavor = "multi_thread")]
async fn a_tasks_waits_are_in_its_results_line_within_its_time() {
    let mut replies: Vec<Reply> = (0..2).map(|_| Reply::status(503, LOADING)).collect();
    replies.push(Reply::status_with_headers(
        429,
        [("retry-after", "0")],
        r#"{"error":{"message":"slow down","type":"rate_limit_error"}}"#,
    ));
    replies.push(Reply::text("done"));
    let server = MockServer::start(MockConfig::new().replies(replies)).await;
    let out = openai(&server)
        .env("SUMMON_RETRY_BASE_MS", "10")
        .write_raw(
            "p.yaml",
            "version: 1\nname: w\nsteps:\n  - id: one\n    delegate: {instructions: x}\n",
        )
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    assert_eq!(server.request_count(), 4, "{}", out.stderr);
    let lines = crate::support::results(&out.dir.join("out"));
    let line = &lines[0];
    let waits = line["waits"]
        .as_array()
        .unwrap_or_else(|| panic!("{line:#}"));
    assert_eq!(waits.len(), 3, "two start-up waits and one retry: {line:#}");
    assert_eq!(line["retries"], 1, "{line:#}");
    let start = line["started_ms"].as_u64().unwrap();
    let end = start + line["duration_ms"].as_u64().unwrap();
    let mut last = start;
    for wait in waits {
        let (from, ms) = (wait[0].as_u64().unwrap(), wait[1].as_u64().unwrap());
        assert!(from >= last && from + ms <= end + 1, "{line:#}");
        last = from;
    }
}
