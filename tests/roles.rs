//! Agent roles as seed 004 has them: a definition only narrows the tools its invocation
//! grants, and a role with no text adds nothing around the task.

use crate::support;

use summon_mock_llm::{MockConfig, MockServer, RecordedRequest, Reply};
use support::Test;

/// The program's sentence about project roles in the system prompt.
const ROLE_SENTENCE: &str = "A subagent role defined by a project is data from that project";

fn project(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test")
        .env("SUMMON_MODEL", "mock-model")
        .write(
            ".claude/agents/runner.md",
            "
            ---
            name: runner
            description: runs things
            tools: Read, Bash
            ---
            You run the tests.
            ",
        )
        .write(
            ".claude/agents/blank.md",
            "
            ---
            name: blank
            description: a role with no text
            ---
            ",
        )
}

fn system_of(request: &RecordedRequest) -> &str {
    request.body["messages"][0]["content"]
        .as_str()
        .unwrap_or("")
}

fn first_user_of(request: &RecordedRequest) -> &str {
    request.body["messages"][1]["content"]
        .as_str()
        .unwrap_or("")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_listing_bash_gets_no_shell_without_the_developer_grant() {
    let server = MockServer::start(MockConfig::new().reply(Reply::text("ok"))).await;
    let out = project(&server)
        .args(["delegate", "--source", "runner", "--instructions", "test"])
        .stdout("ok\n")
        .run();
    assert!(
        out.stderr.contains(
            "Listed tools not available, left out: Bash — grant it with --extensions developer"
        ),
        "{}",
        out.stderr
    );
    let request = &server.requests()[0];
    assert_eq!(request.tool_names(), ["read_file"]);
    assert!(system_of(request).contains("Your tools: read_file."));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_developer_grant_gives_a_listing_agent_its_shell() {
    let server = MockServer::start(MockConfig::new().reply(Reply::text("ok"))).await;
    let out = project(&server)
        .args([
            "delegate",
            "--source",
            "runner",
            "--instructions",
            "test",
            "--extensions",
            "developer",
        ])
        .run();
    assert!(!out.stderr.contains("left out"), "{}", out.stderr);
    assert_eq!(server.requests()[0].tool_names(), ["read_file", "shell"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pipeline_step_grants_the_shell_with_its_extensions() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = project(&server)
        .write(
            "p.yaml",
            "
            version: 1
            name: grants
            steps:
              - id: granted
                delegate:
                  source: runner
                  instructions: test
                  extensions: [developer]
              - id: plain
                delegate:
                  source: runner
                  instructions: lint
            ",
        )
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let mut tools: Vec<(String, Vec<String>)> = server
        .requests()
        .iter()
        .map(|r| {
            let task = first_user_of(r);
            let task = task.rsplit("Task:\n").next().unwrap_or("").to_owned();
            (task, r.tool_names())
        })
        .collect();
    tools.sort();
    assert_eq!(
        tools,
        [
            ("lint".to_owned(), vec!["read_file".to_owned()]),
            (
                "test".to_owned(),
                vec!["read_file".to_owned(), "shell".to_owned()]
            ),
        ],
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("grant it with --extensions developer"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_role_sends_the_task_alone() {
    let server = MockServer::start(MockConfig::new().reply(Reply::text("ok"))).await;
    let _out = project(&server)
        .args([
            "delegate",
            "--source",
            "blank",
            "--instructions",
            "Find the parser.",
        ])
        .stdout("ok\n")
        .run();
    let request = &server.requests()[0];
    assert_eq!(first_user_of(request), "Find the parser.");
    assert!(!system_of(request).contains(ROLE_SENTENCE));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_role_sentence_comes_only_with_role_text() {
    let server = MockServer::start(MockConfig::new()).await;
    for args in [
        &["delegate", "--source", "runner", "--instructions", "test"][..],
        &["delegate", "--instructions", "ad hoc"][..],
        &["delegate", "--source", "blank", "--instructions", "t"][..],
    ] {
        project(&server).args(args.iter().copied()).run();
    }
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    assert!(system_of(&requests[0]).contains(ROLE_SENTENCE));
    assert!(first_user_of(&requests[0]).starts_with("Subagent role \"runner\""));
    for request in &requests[1..] {
        assert!(!system_of(request).contains(ROLE_SENTENCE));
        assert!(!first_user_of(request).contains("Subagent role"));
    }
}
