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
    assert_eq!(request.tool_names(), ["read_file", "load"]);
    assert!(system_of(request).contains("Your tools: read_file, load."));
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
    assert_eq!(
        server.requests()[0].tool_names(),
        ["read_file", "shell", "load"]
    );
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
    let mut tools: Vec<(String, Vec<String>)> = support::chats(&server)
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
            (
                "lint".to_owned(),
                vec!["read_file".to_owned(), "load".to_owned()]
            ),
            (
                "test".to_owned(),
                vec![
                    "read_file".to_owned(),
                    "shell".to_owned(),
                    "load".to_owned()
                ]
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

// ---------------------------------------------------------------------------------------------
// Model-chosen roles: the catalog's word on an unknown name, and items that name no role.

const CATALOG_ERROR: &str = "Subagent \"ghostwriter\" is not in this run's catalog. Use a name from it, or null for a general subagent.";

/// A pipeline whose fan-out takes each item's role from `item.agent`, over `decompose`.
fn roles_pipeline(decompose: &str) -> String {
    format!(
        "version: 1\nname: roles\nsteps:\n  - id: plan\n    decompose: {decompose}\n  - id: work\n    fan_out:\n      over: plan\n      source: \"{{{{ item.agent }}}}\"\n      instructions: \"{{{{ item.q }}}}\"\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_role_in_literal_items_gets_the_catalog_s_words_in_validate_and_run() {
    let server = MockServer::start(MockConfig::new()).await;
    let pipeline = roles_pipeline(
        "{items: [{agent: runner, q: \"Run.\"}, {agent: ghostwriter, q: \"Write.\"}]}",
    );
    for command in [
        &["validate", "p.yaml"][..],
        &["run", "p.yaml", "--quiet"][..],
    ] {
        let out = project(&server)
            .write_raw("p.yaml", &pipeline)
            .args(command.iter().copied())
            .code(1)
            .run();
        assert!(
            out.stderr
                .contains(&format!("p.yaml:9:15: error: item 1: {CATALOG_ERROR}")),
            "{command:?}: {}",
            out.stderr
        );
        assert!(
            !out.stderr.contains("Source 'ghostwriter'"),
            "{}",
            out.stderr
        );
    }
    assert_eq!(server.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_item_without_its_role_key_is_an_error_naming_the_item() {
    let server = MockServer::start(MockConfig::new()).await;
    // Known before the run: validate says which item lacks the key.
    let out = project(&server)
        .write_raw(
            "p.yaml",
            &roles_pipeline("{items: [{agent: null, q: \"Run.\"}, {q: \"Write.\"}]}"),
        )
        .args(["validate", "p.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains(
            "item 1: line 9: `source:` reads `item.agent`, which this item does not have (its keys are: q); give each item an `agent`: a subagent's name from the catalog, or null for a general subagent"
        ),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("cannot render template"),
        "{}",
        out.stderr
    );
    // Known only during the run: the step fails naming the item, and sends nothing.
    let out = project(&server)
        .write_raw(
            "plan.jsonl",
            "{\"agent\": null, \"q\": \"Run.\"}\n{\"q\": \"Write.\"}\n",
        )
        .write_raw("p.yaml", &roles_pipeline("{file: plan.jsonl}"))
        .args(["run", "p.yaml", "--quiet"])
        .code(2)
        .run();
    assert!(
        out.stderr.contains(
            "step `work` failed: item 1: line 9: `source:` reads `item.agent`, which this item does not have (its keys are: q)"
        ),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("cannot render template"),
        "{}",
        out.stderr
    );
    assert_eq!(server.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_role_missing_from_the_catalog_does_not_suggest_resume() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = project(&server)
        .write_raw(
            "plan.jsonl",
            "{\"agent\": \"ghostwriter\", \"q\": \"Write.\"}\n",
        )
        .write_raw("p.yaml", &roles_pipeline("{file: plan.jsonl}"))
        .args(["run", "p.yaml", "--quiet"])
        .code(2)
        .run();
    assert!(
        out.stderr
            .contains(&format!("step `work` failed: {CATALOG_ERROR}")),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("`--resume` repeats"), "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "a new run picks up new or changed definitions (`--resume` keeps the catalog the run started with)"
        ),
        "{}",
        out.stderr
    );
    assert_eq!(server.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_item_without_a_key_the_task_reads_fails_naming_the_item() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = project(&server)
        .write_raw("plan.jsonl", "{\"agent\": null, \"q\": \"Run.\"}\n")
        .write_raw(
            "p.yaml",
            "version: 1\nname: roles\nsteps:\n  - id: plan\n    decompose: {file: plan.jsonl}\n  - id: work\n    fan_out:\n      over: plan\n      source: \"{{ item.agent }}\"\n      instructions: \"{{ item.task }}\"\n",
        )
        .args(["run", "p.yaml", "--quiet"])
        .code(2)
        .run();
    assert!(
        out.stderr.contains("step `work` failed: item 0: line 10:")
            && out.stderr.contains("the keys of `item` are: agent, q"),
        "{}",
        out.stderr
    );
    assert_eq!(server.request_count(), 0);
}

// ---------------------------------------------------------------------------------------------
// An agent alone: its role text is the work, with a fixed task (README, "Agents").

const ALONE: &str = "Do the work your role above describes, in the working directory, and report what you did and what you found.";

fn alone_message() -> String {
    format!(
        "Subagent role \"runner\", defined by this project in .claude/agents/runner.md:\n\nYou run the tests.\n\nTask:\n{ALONE}"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_runs_alone_with_the_fixed_task_in_delegate_and_async() {
    let server = MockServer::start(MockConfig::new().reply(Reply::text("ran"))).await;
    project(&server)
        .args(["delegate", "--source", "runner"])
        .stdout("ran\n")
        .run();
    assert_eq!(first_user_of(&server.requests()[0]), alone_message());
    // In the background, collected with `load`.
    let t = project(&server);
    let started = t
        .command()
        .args(["delegate", "--source", "runner", "--async", "--json"])
        .output()
        .expect("start");
    assert!(started.status.success(), "{started:?}");
    let id = serde_json::from_slice::<serde_json::Value>(&started.stdout).expect("json")["task_id"]
        .as_str()
        .expect("task id")
        .to_owned();
    let loaded = t.command().args(["load", &id]).output().expect("load");
    assert!(loaded.status.success(), "{loaded:?}");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(first_user_of(&requests[1]), alone_message());
    // An agent with no role text has nothing to do alone.
    project(&server)
        .args(["delegate", "--source", "blank"])
        .code(1)
        .stderr_has("agent `blank` has no role text to run on its own: pass --instructions")
        .run();
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pipeline_step_runs_an_agent_alone_and_validate_agrees() {
    let server = MockServer::start(MockConfig::new()).await;
    let pipeline =
        "version: 1\nname: alone\nsteps:\n  - id: look\n    delegate: {source: runner}\n";
    project(&server)
        .write_raw("p.yaml", pipeline)
        .args(["validate", "p.yaml"])
        .run();
    project(&server)
        .write_raw("p.yaml", pipeline)
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(first_user_of(&requests[0]), alone_message());
}

// A role from a folder outside the project says so, and where it was defined.
#[tokio::test(flavor = "multi_thread")]
async fn a_role_from_the_home_folder_is_not_labelled_the_project_s() {
    let server = MockServer::start(MockConfig::new()).await;
    project(&server)
        .env_path("HOME", "home")
        .write(
            "home/.claude/agents/helper.md",
            "
            ---
            name: helper
            description: helps
            ---
            You help.
            ",
        )
        .args(["delegate", "--source", "helper", "--instructions", "Help."])
        .run();
    assert_eq!(
        first_user_of(&server.requests()[0]),
        "Subagent role \"helper\", defined outside this project in ~/.claude/agents/helper.md:\n\nYou help.\n\nTask:\nHelp."
    );
}

// The result says which listed tools were left out (seed 004), not only stderr: `delegate
// --json`, a background task's `load --json`, `results.jsonl` and `report.json`.
#[tokio::test(flavor = "multi_thread")]
async fn listed_tools_left_out_are_said_in_the_result() {
    const LEFT_OUT: &str =
        "Listed tools not available, left out: Bash — grant it with --extensions developer";
    let server = MockServer::start(MockConfig::new()).await;
    let json = project(&server)
        .args([
            "delegate",
            "--source",
            "runner",
            "--instructions",
            "t",
            "--json",
        ])
        .run()
        .json();
    assert_eq!(json["warnings"], serde_json::json!([LEFT_OUT]), "{json}");

    let t = project(&server);
    let started = t
        .command()
        .args([
            "delegate",
            "--source",
            "runner",
            "--instructions",
            "t",
            "--async",
            "--json",
        ])
        .output()
        .expect("start");
    let id = serde_json::from_slice::<serde_json::Value>(&started.stdout).expect("json")["task_id"]
        .as_str()
        .expect("task id")
        .to_owned();
    let loaded = t
        .command()
        .args(["load", &id, "--json"])
        .output()
        .expect("load");
    let loaded: serde_json::Value = serde_json::from_slice(&loaded.stdout).expect("json");
    assert_eq!(
        loaded["warnings"],
        serde_json::json!([LEFT_OUT]),
        "{loaded}"
    );

    let out = project(&server)
        .write_raw(
            "p.yaml",
            "version: 1\nname: p\nsteps:\n  - id: look\n    delegate: {source: runner, instructions: t}\n",
        )
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let lines = support::results(&out.dir.join("out"));
    assert_eq!(lines[0]["warnings"], serde_json::json!([LEFT_OUT]));
    let report = support::read_json(&out.dir.join("out/report.json"));
    assert_eq!(report["warnings"][0]["message"], LEFT_OUT, "{report}");
}

// Pipeline tasks carry their role, as seed 004 labels its subagents: `role` in
// results.jsonl, the role after the item in a JUnit case name.
#[tokio::test(flavor = "multi_thread")]
async fn pipeline_tasks_carry_their_role() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = project(&server)
        .write_raw(
            "p.yaml",
            "version: 1\nname: p\nsteps:\n  - id: plan\n    decompose:\n      items: [{agent: runner, q: a}, {agent: null, q: b}]\n  - id: work\n    fan_out:\n      over: plan\n      source: \"{{ item.agent }}\"\n      instructions: \"{{ item.q }}\"\n",
        )
        .args(["run", "p.yaml", "--out", "out", "--junit", "junit.xml", "--quiet"])
        .run();
    // results.jsonl is in the order tasks finished: the two run at once.
    let mut lines = support::results(&out.dir.join("out"));
    lines.sort_by_key(|l| l["index"].as_u64());
    let roles: Vec<&serde_json::Value> = lines.iter().map(|l| &l["role"]).collect();
    assert_eq!(
        roles,
        [&serde_json::json!("runner"), &serde_json::Value::Null]
    );
    let junit = std::fs::read_to_string(out.dir.join("junit.xml")).expect("junit");
    assert!(
        junit.contains(r#"<testcase name="work: #0 (runner)""#),
        "{junit}"
    );
    assert!(junit.contains(r#"<testcase name="work: #1""#), "{junit}");
    let page = std::fs::read_to_string(out.dir.join("out/report.html")).expect("report.html");
    assert!(page.contains("<th>item</th><th>role</th>"), "a role column");
}

// A task answered through a provider's batch API carries its role too.
#[tokio::test(flavor = "multi_thread")]
async fn batch_tasks_carry_their_role() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = project(&server)
        .env("SUMMON_BATCH_POLL_MS", "5")
        .write(
            ".claude/agents/critic.md",
            "
            ---
            name: critic
            description: judges a text
            ---
            You judge the text.
            ",
        )
        .write_raw(
            "p.yaml",
            "version: 1\nname: p\nsteps:\n  - id: plan\n    decompose:\n      items: [{agent: critic, q: a}, {agent: null, q: b}]\n  - id: work\n    fan_out:\n      over: plan\n      source: \"{{ item.agent }}\"\n      instructions: \"{{ item.q }}\"\n    backend: batch\n",
        )
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    assert_eq!(server.batches().len(), 1, "both went through the batch");
    let mut lines = support::results(&out.dir.join("out"));
    lines.sort_by_key(|l| l["index"].as_u64());
    let roles: Vec<&serde_json::Value> = lines.iter().map(|l| &l["role"]).collect();
    assert_eq!(
        roles,
        [&serde_json::json!("critic"), &serde_json::Value::Null]
    );
}
