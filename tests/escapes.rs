//! Text from outside summon reaches the terminal without its control sequences: a provider's
//! error body, a tool path the model chose, an MCP server's stderr. Each carries sequences
//! that set the window title, clear the screen and move the cursor; none may reach stderr.

use crate::support;

use serde_json::json;
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

/// Sets the window title, clears the screen, moves the cursor home, rings the bell; a C1 CSI.
const HOSTILE: &str = "\u{1b}]0;pwned-title\u{7}\u{1b}[2J\u{1b}[H\u{1b}P+q\u{1b}\\\u{9b}31m\r";

fn project(server: &MockServer) -> Test {
    Test::new()
        .env("SUMMON_TRUST_PROJECT", "1")
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
        .args(["--color", "always"])
}

#[track_caller]
fn assert_clean(stderr: &str, visible: &str) {
    let bad: Vec<char> = stderr
        .chars()
        .filter(|c| (c.is_control() && *c != '\n' && *c != '\u{1b}') || *c == '\u{9b}')
        .collect();
    assert!(bad.is_empty(), "control characters {bad:?} in:\n{stderr:?}");
    // The only escapes left are summon's own colours (`ESC [ ... m`).
    for (i, _) in stderr.match_indices('\u{1b}') {
        let rest = &stderr[i + 1..];
        let colour = rest.starts_with('[')
            && rest[1..]
                .find(|c: char| !(c.is_ascii_digit() || c == ';'))
                .is_some_and(|end| rest[1 + end..].starts_with('m'));
        assert!(
            colour,
            "an escape that is not a colour at {i} in:\n{stderr:?}"
        );
    }
    assert!(
        stderr.contains(visible),
        "{visible:?} not shown in:\n{stderr:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_provider_error_body_is_shown_without_its_escapes() {
    let body = json!({"error": {"message": format!("bad request {HOSTILE} pwned-body")}});
    let server =
        MockServer::start(MockConfig::new().rule(move |_| Reply::status(400, body.to_string())))
            .await;
    let out = project(&server)
        .args(["delegate", "--instructions", "hi"])
        .code(2)
        .run();
    assert_clean(&out.stderr, "pwned-body");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_path_the_model_chose_is_shown_without_its_escapes() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("read_file", json!({"path": format!("{HOSTILE}pwned-path")})),
        Reply::text("done"),
    ]))
    .await;
    let out = project(&server)
        .args([
            "delegate",
            "--extensions",
            "developer",
            "--instructions",
            "hi",
        ])
        .run();
    assert_eq!(out.stdout, "done\n");
    assert_clean(&out.stderr, "pwned-path");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_task_of_a_run_is_summed_up_without_escapes() {
    let body = json!({"error": {"message": format!("refused {HOSTILE} pwned-run")}});
    let server =
        MockServer::start(MockConfig::new().rule(move |_| Reply::status(400, body.to_string())))
            .await;
    let out = project(&server)
        .write(
            "p.yaml",
            "version: 1
name: p
steps:
  - id: notes
    decompose:
      items: [a, b]
  - id: work
    fan_out:
      over: notes
      instructions: 'Do {{ item }}'
    on_error: continue
",
        )
        .args(["run", "p.yaml", "--out", "out"])
        // Every task failed: the step fails.
        .code(2)
        .run();
    assert_clean(&out.stderr, "pwned-run");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_server_stderr_is_quoted_without_escapes() {
    let server = MockServer::start(MockConfig::new().rule(|_| Reply::text("done"))).await;
    // The escapes are made by printf: YAML holds no control characters.
    let recipe = r#"title: t
description: d
prompt: Use the tools.
extensions:
  - type: stdio
    name: broken
    cmd: sh
    args: ['-c', 'printf "error: \033]0;pwned-title\007\033[2J\033[H\302\233\061m\r pwned-server\n" >&2; read line; exit 3']
"#;
    let out = project(&server)
        .write("recipes/r.yaml", recipe)
        .args(["delegate", "--source", "r"])
        .run();
    assert_clean(&out.stderr, "pwned-server");
}
