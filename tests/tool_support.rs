//! A server whose chat template has no tool support (llama.cpp's `/props` says so) would drop
//! the tools of a request silently: summon sends none, lists none in the system prompt, and
//! says so once per run.

use crate::support;

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, RecordedRequest};
use support::Test;

fn project(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789")
        .env("SUMMON_MODEL", "mock-model")
        .write(
            "p.yaml",
            "version: 1\nname: tools\nsteps:\n  - id: list\n    decompose:\n      items: [a, b, c]\n  - id: each\n    fan_out:\n      over: list\n      instructions: 'Look at {{ item }}.'\n    tools: [read_file, list_files]\n",
        )
        .args(["run", "p.yaml"])
}

fn system_of(request: &RecordedRequest) -> String {
    request.body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn caps(supports_tools: bool) -> Value {
    json!({"chat_template_caps": {"supports_tools": supports_tools, "supports_tool_calls": supports_tools, "supports_system_role": true}})
}

const WARNING: &str = "the server's chat template has no tool support; tools were not offered";

#[tokio::test(flavor = "multi_thread")]
async fn a_template_without_tool_support_is_sent_no_tools_and_said_once() {
    let server = MockServer::start(MockConfig::new().props(caps(false))).await;
    let out = project(&server).run();
    let chats = support::chats(&server);
    assert_eq!(chats.len(), 3);
    for request in &chats {
        assert!(request.tool_names().is_empty(), "{:#}", request.body);
        let system = system_of(request);
        assert!(!system.contains("Your tools"), "{system}");
    }
    assert_eq!(out.stderr.matches(WARNING).count(), 1, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("provider `openai`: the server's chat template"),
        "{}",
        out.stderr
    );
    assert_eq!(server.props_count(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_with_tool_support_is_sent_its_tools() {
    let server = MockServer::start(MockConfig::new().props(caps(true))).await;
    let out = project(&server).run();
    let chats = support::chats(&server);
    assert_eq!(chats.len(), 3);
    for request in &chats {
        assert!(request.tool_names().contains(&"read_file".to_owned()));
        assert!(system_of(request).contains("Your tools: read_file"));
    }
    assert!(!out.stderr.contains(WARNING), "{}", out.stderr);
    assert_eq!(server.props_count(), 1);
}
