//! Results as data: a schema-validated answer reaches later steps and the outputs as parsed
//! JSON (`r.data`, `data` in results.jsonl), tables of a fan-out's results are written as CSV
//! or JSONL, and a short placeholder key does not garble what summon prints.

mod support;

use serde_json::json;
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
