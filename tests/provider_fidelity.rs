//! Requests the real APIs refuse are never sent, and answers that are not a real answer do
//! not count as success: against the strict mock (the default), which refuses with HTTP 400
//! what the providers refuse and can end answers the way real ones end badly.

use crate::support;
use crate::support::{chats, results};

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

const KEY: &str = "sk-test-0123456789abcdefSECRET";

/// A project wired to the mock as an OpenAI-compatible provider.
fn openai(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
}

/// A project wired to the mock as the Anthropic API.
fn anthropic(server: &MockServer) -> Test {
    Test::new()
        .env("ANTHROPIC_BASE_URL", &server.url_anthropic())
        .env("ANTHROPIC_API_KEY", KEY)
        .env("SUMMON_PROVIDER", "anthropic")
        .env("SUMMON_MODEL", "claude-mock")
}

/// Asserts that the mock refused none of the requests.
#[track_caller]
fn none_refused(server: &MockServer) {
    for request in chats(server) {
        assert_eq!(request.refused, None, "refused: {:#}", request.body);
    }
}

/// `delegate --json --instructions TASK` (plus `extra`), expecting `code`.
fn delegate_json(t: Test, task: &str, extra: &[&str], code: i32) -> Value {
    t.args(["delegate", "--json", "--instructions", task])
        .args(extra.iter().copied())
        .code(code)
        .run()
        .json()
}

// ---------------------------------------------------------------------------------------------
// Requests the real API refuses

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_whitespace_text_beside_a_tool_call_is_not_sent_back() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::ToolCalls {
            text: Some("\n\n".into()),
            calls: vec![("list_files".into(), json!({}))],
        },
        Reply::text("Two files."),
    ]))
    .await;
    let _out = anthropic(&server)
        .write("a.txt", "a")
        .args(["delegate", "--instructions", "Count the files."])
        .stdout("Two files.\n")
        .run();
    none_refused(&server);
    let requests = chats(&server);
    assert_eq!(requests.len(), 2);
    let replayed = &requests[1].body["messages"][1];
    assert_eq!(replayed["role"], "assistant");
    assert_eq!(
        replayed["content"].as_array().map(|c| c
            .iter()
            .map(|b| b["type"].as_str().unwrap_or(""))
            .collect::<Vec<_>>()),
        Some(vec!["tool_use"]),
        "{replayed:#}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn blank_instructions_are_refused_before_any_request() {
    let server = MockServer::start(MockConfig::new()).await;
    for task in ["", "  \n\t"] {
        for extra in [&[][..], &["--async"][..]] {
            let out = openai(&server)
                .args(["delegate", "--instructions", task])
                .args(extra.iter().copied())
                .code(1)
                .run();
            assert!(
                out.stderr.contains("--instructions is blank"),
                "{extra:?}: {}",
                out.stderr
            );
            assert_eq!(out.stdout, "", "no task id for {extra:?}");
            assert!(
                !out.dir.join(".summon").join("tasks").exists(),
                "no background task for {extra:?}"
            );
        }
    }
    assert_eq!(server.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fan_out_item_with_blank_instructions_fails_without_a_request() {
    let server = MockServer::start(MockConfig::new()).await;
    let pipeline = r#"
        version: 1
        name: blanks
        steps:
          - id: list
            decompose:
              items: ["one", "  ", "three"]
          - id: each
            on_error: continue
            fan_out:
              over: list
              instructions: "{{ item }}"
    "#;
    let out = openai(&server)
        .write("p.yaml", pipeline)
        .args(["run", "p.yaml", "--quiet", "--out", "out"])
        .run();
    let lines = results(&out.dir.join("out"));
    let blank = lines
        .iter()
        .find(|l| l["step"] == "each" && l["item"] == "  ")
        .expect("a result for the blank item");
    assert_eq!(blank["status"], "failed", "{blank}");
    assert!(
        blank["error"]
            .as_str()
            .unwrap_or("")
            .contains("the task's instructions are blank"),
        "{blank}"
    );
    let sent: Vec<String> = chats(&server)
        .iter()
        .map(|r| r.last_user_text().unwrap_or_default())
        .collect();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert!(sent.iter().all(|t| !t.trim().is_empty()), "{sent:?}");
}

// ---------------------------------------------------------------------------------------------
// Answers that must not count as success

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_off_answer_fails_and_keeps_the_partial_text() {
    // OpenAI, no limit set: summon's default is sent, and named with how to raise it.
    let server = MockServer::start(
        MockConfig::new().reply(Reply::text("The first half of").finish("length")),
    )
    .await;
    let out = delegate_json(openai(&server), "Write a story.", &[], 2);
    assert_eq!(out["status"], "failed");
    assert_eq!(out["output"], "The first half of");
    assert_eq!(
        out["error"],
        "the answer was cut off at summon's default output limit (4096 tokens); \
         set max_output_tokens (or --max-output-tokens) to allow more"
    );
    assert_eq!(chats(&server)[0].body["max_tokens"], 4096);

    // OpenAI, `--max-output-tokens`: sent, and named.
    let server =
        MockServer::start(MockConfig::new().reply(Reply::text("Half").finish("length"))).await;
    let out = delegate_json(
        openai(&server),
        "Write a story.",
        &["--max-output-tokens", "50"],
        2,
    );
    assert_eq!(
        out["error"],
        "the answer was cut off at the output limit (50 tokens)"
    );
    assert_eq!(chats(&server)[0].body["max_tokens"], 50);

    // Anthropic: the default limit, then the config file's `max_output_tokens`.
    let server = MockServer::start(MockConfig::new().replies([
        Reply::text("Half").finish("max_tokens"),
        Reply::text("Half").finish("max_tokens"),
    ]))
    .await;
    let out = delegate_json(anthropic(&server), "Write a story.", &[], 2);
    assert_eq!(
        out["error"],
        "the answer was cut off at summon's default output limit (8192 tokens); \
         set max_output_tokens (or --max-output-tokens) to allow more"
    );
    assert_eq!(out["output"], "Half");
    let out = delegate_json(
        anthropic(&server).write("summon.yaml", "max_output_tokens: 300\n"),
        "Write a story.",
        &[],
        2,
    );
    assert_eq!(
        out["error"],
        "the answer was cut off at the output limit (300 tokens)"
    );
    assert_eq!(chats(&server)[1].body["max_tokens"], 300);
    none_refused(&server);
}

/// llama.cpp's server may end an answer with `length` while its tool calls are complete:
/// the failure says what the model called.
#[tokio::test(flavor = "multi_thread")]
async fn a_cut_off_answer_with_tool_calls_names_them() {
    let server = MockServer::start(
        MockConfig::new().reply(
            Reply::tool_calls([
                ("read_file", json!({"path": "a.txt"})),
                ("list_files", json!({"pattern": "*"})),
            ])
            .finish("length"),
        ),
    )
    .await;
    let out = delegate_json(
        openai(&server),
        "Look around.",
        &["--max-output-tokens", "30"],
        2,
    );
    assert_eq!(
        out["error"],
        "the answer was cut off at the output limit (30 tokens); it held 2 tool calls \
         (read_file, list_files), not run"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn max_output_tokens_reaches_each_pipeline_request() {
    let server = MockServer::start(MockConfig::new()).await;
    let pipeline = r#"
        version: 1
        name: limits
        settings:
          max_output_tokens: 40
        steps:
          - id: first
            delegate:
              instructions: "one"
          - id: second
            needs: [first]
            max_output_tokens: 70
            delegate:
              instructions: "two"
    "#;
    openai(&server)
        .write("p.yaml", pipeline)
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let limits: Vec<(String, Value)> = chats(&server)
        .iter()
        .map(|r| {
            (
                r.last_user_text().unwrap_or_default(),
                r.body["max_tokens"].clone(),
            )
        })
        .collect();
    assert_eq!(
        limits,
        [("one".into(), json!(40)), ("two".into(), json!(70))]
    );
    // The flag overrides both.
    let server = MockServer::start(MockConfig::new()).await;
    openai(&server)
        .write("p.yaml", pipeline)
        .args(["run", "p.yaml", "--quiet", "--max-output-tokens", "9"])
        .run();
    for request in chats(&server) {
        assert_eq!(request.body["max_tokens"], 9);
    }
    let out = openai(&server)
        .write("p.yaml", &pipeline.replace("70", "0"))
        .args(["run", "p.yaml", "--quiet"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains("p.yaml:11:24:")
            && out
                .stderr
                .contains("`steps[1].max_output_tokens` must be a whole number ≥ 1"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn filtered_and_refused_answers_fail_with_their_reason() {
    let server =
        MockServer::start(MockConfig::new().reply(Reply::text("I can").finish("content_filter")))
            .await;
    let out = delegate_json(openai(&server), "Say something.", &[], 2);
    assert_eq!(out["status"], "failed");
    assert_eq!(
        out["error"],
        "the provider's content filter stopped the answer (finish_reason: content_filter)"
    );
    assert_eq!(out["output"], "I can");

    let server = MockServer::start(MockConfig::new().reply(Reply::Empty.finish("refusal"))).await;
    let out = delegate_json(anthropic(&server), "Say something.", &[], 2);
    assert_eq!(
        out["error"],
        "the model refused to answer (stop_reason: refusal)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_final_answer_fails_unless_the_step_allows_it() {
    for reply in [Reply::Empty, Reply::text(" \n ")] {
        for anthropic_api in [false, true] {
            let server = MockServer::start(MockConfig::new().reply(reply.clone())).await;
            let t = if anthropic_api {
                anthropic(&server)
            } else {
                openai(&server)
            };
            let out = delegate_json(t, "Say something.", &[], 2);
            assert_eq!(out["status"], "failed", "{reply:?}");
            assert_eq!(out["error"], "the model returned no text", "{reply:?}");
        }
    }

    let server = MockServer::start(MockConfig::new().default_reply(Reply::Empty)).await;
    let pipeline = r#"
        version: 1
        name: quiet
        steps:
          - id: loud
            on_error: continue
            delegate:
              instructions: "must speak"
          - id: quiet
            allow_empty: true
            delegate:
              instructions: "may stay silent"
    "#;
    let out = openai(&server)
        .write("p.yaml", pipeline)
        .args(["run", "p.yaml", "--quiet", "--out", "out"])
        .code(2)
        .run();
    let lines = results(&out.dir.join("out"));
    let status = |step: &str| {
        lines
            .iter()
            .find(|l| l["step"] == step)
            .map(|l| (l["status"].clone(), l["error"].clone()))
    };
    assert_eq!(
        status("loud"),
        Some((json!("failed"), json!("the model returned no text")))
    );
    assert_eq!(status("quiet"), Some((json!("completed"), Value::Null)));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_custom_tool_call_is_answered_with_an_error_naming_its_type() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::custom_tool_call("grep", "needle"),
        Reply::text("Understood."),
    ]))
    .await;
    let _out = openai(&server)
        .args(["delegate", "--instructions", "Find the needle."])
        .stdout("Understood.\n")
        .run();
    none_refused(&server);
    let requests = chats(&server);
    assert_eq!(requests.len(), 2);
    let messages = requests[1].body["messages"].as_array().expect("messages");
    let call = &messages[2]["tool_calls"][0];
    assert_eq!(call["type"], "custom", "replayed as it came: {call}");
    let answer = &messages[3];
    assert_eq!(answer["role"], "tool");
    assert_eq!(answer["tool_call_id"], call["id"]);
    let text = answer["content"].as_str().unwrap_or("");
    assert!(
        text.contains("`custom`") && text.contains("grep"),
        "the error names the type and the call: {text}"
    );
}
