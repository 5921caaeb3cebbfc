//! `summon mcp`: the built binary as an MCP server over stdio, driven by a plain JSON-RPC
//! client in the test (every message as the protocol has it) and, in CI, by the official
//! MCP Python SDK client; the model is the test mock.

use crate::support;

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

pub(crate) const EXPLORER: &str = "---\nname: explorer\ndescription: Reads project files and reports with paths.\ntools: [read_file]\n---\nEXPLORER-ROLE: read only what the task needs.\n";

pub(crate) fn project(server: &MockServer) -> Test {
    Test::new()
        .env("SUMMON_TRUST_PROJECT", "1")
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-key")
        .env("SUMMON_MODEL", "mock-model")
        .write(".agents/agents/explorer.md", EXPLORER)
        .write("notes.md", "three notes\n")
}

/// A JSON-RPC client of `summon mcp` on its stdin and stdout.
pub(crate) struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Value>,
    next: u64,
    /// Notifications received so far.
    notifications: Vec<Value>,
    pub(crate) instructions: String,
}

impl Client {
    pub(crate) fn start(test: &Test) -> Self {
        Self::start_with(test, &[])
    }

    pub(crate) fn start_with(test: &Test, flags: &[&str]) -> Self {
        Self::start_as(test, flags, json!({}))
    }

    /// Starts the server; the client declares `capabilities`.
    pub(crate) fn start_as(test: &Test, flags: &[&str], capabilities: Value) -> Self {
        let mut command = test.command();
        command
            .arg("mcp")
            .args(flags)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = command.spawn().expect("start summon mcp");
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let value: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not JSON-RPC ({e}): {line}"));
                if send.send(value).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut client = Self {
            child,
            stdin,
            lines,
            next: 0,
            notifications: Vec::new(),
            instructions: String::new(),
        };
        let init = client.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": capabilities, "clientInfo": {"name": "test", "version": "1"}}),
        );
        client.instructions = init["result"]["instructions"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        client.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        client
    }

    pub(crate) fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{message}").expect("write to summon mcp");
        stdin.flush().unwrap();
    }

    /// Sends one line as it is (a message no JSON library would write) and returns the
    /// response with id `id`.
    pub(crate) fn send_raw(&mut self, line: &str, id: u64) -> Value {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("write to summon mcp");
        stdin.flush().unwrap();
        self.response(id)
    }

    /// Sends a request and returns its response; notifications meanwhile are kept.
    pub(crate) fn request(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.response(id)
    }

    pub(crate) fn response(&mut self, id: u64) -> Value {
        loop {
            let message = self
                .lines
                .recv_timeout(Duration::from_secs(60))
                .expect("an answer from summon mcp");
            if message["id"] == json!(id) {
                return message;
            }
            self.notifications.push(message);
        }
    }

    /// Calls a tool with a progress token; returns the text and whether it is an error.
    pub(crate) fn call(&mut self, name: &str, arguments: Value) -> (String, bool) {
        let token = format!("p{}", self.next + 1);
        let response = self.request(
            "tools/call",
            json!({"name": name, "arguments": arguments, "_meta": {"progressToken": token}}),
        );
        let result = &response["result"];
        assert!(result.is_object(), "no result: {response}");
        let text = result["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        (text, result["isError"] == json!(true))
    }

    /// The progress messages received so far.
    pub(crate) fn progress(&self) -> Vec<String> {
        self.notifications
            .iter()
            .filter(|n| n["method"] == "notifications/progress")
            .filter_map(|n| n["params"]["message"].as_str().map(str::to_owned))
            .collect()
    }

    pub(crate) fn tool_names(&mut self) -> Vec<String> {
        let response = self.request("tools/list", json!({}));
        response["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Closes stdin and waits for the server to exit.
    pub(crate) fn close(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "summon mcp did not exit after stdin closed"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn tasks_json(test: &Test) -> Vec<Value> {
    let out = Test::command(test)
        .args(["tasks", "--json"])
        .output()
        .unwrap();
    let value: Value = serde_json::from_slice(&out.stdout).unwrap();
    value["tasks"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_catalog_is_in_the_instructions_and_load_lists_and_loads() {
    let server = MockServer::start(MockConfig::new()).await;
    let test = project(&server);
    let mut client = Client::start(&test);
    assert!(
        client
            .instructions
            .contains("Available project subagents (fixed for this session):"),
        "{}",
        client.instructions
    );
    assert!(client.instructions.contains("\"name\":\"explorer\""));
    assert!(client.instructions.contains("\"tools\":[\"read_file\"]"));
    assert!(
        !client.instructions.contains("EXPLORER-ROLE"),
        "the role text is never in the catalog"
    );
    assert_eq!(
        client.tool_names(),
        ["load", "delegate", "spawn_agent", "run_pipeline"]
    );

    let (list, error) = client.call("load", json!({}));
    assert!(!error);
    assert!(
        list.contains("Agents:\n  explorer - Reads project files"),
        "{list}"
    );
    assert!(list.contains("Use delegate(source: name) to run as subagent."));

    let (loaded, error) = client.call("load", json!({"source": "explorer"}));
    assert!(!error);
    assert!(
        loaded.starts_with("# Loaded: explorer (agent)\n"),
        "{loaded}"
    );
    assert!(loaded.contains("EXPLORER-ROLE"));

    let (unknown, error) = client.call("load", json!({"source": "explorr"}));
    assert!(error);
    assert_eq!(
        unknown,
        "Source 'explorr' not found. Did you mean: explorer?"
    );
    // A definition written during the session is not a role until a new session.
    std::fs::write(
        test.path().join(".agents/agents/reviewer.md"),
        EXPLORER.replace("explorer", "reviewer"),
    )
    .unwrap();
    let (spawned, error) = client.call(
        "spawn_agent",
        json!({"tasks": [{"agent": "reviewer", "task": "review"}]}),
    );
    assert!(error);
    assert_eq!(
        spawned,
        "Subagent \"reviewer\" is not in this session's catalog. Use a name from it, or null for a general subagent. The names: explorer."
    );
    assert!(server.requests().is_empty(), "nothing was started");
    assert!(client.close().success());
    // A new session has it.
    let client = Client::start(&test);
    assert!(client.instructions.contains("\"name\":\"reviewer\""));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_project_without_roles_adds_nothing_to_the_instructions() {
    let server = MockServer::start(MockConfig::new()).await;
    let test = Test::new().env("OPENAI_BASE_URL", &server.url_openai());
    let client = Client::start(&test);
    assert!(!client.instructions.contains("Available project subagents"));
    assert!(client.instructions.contains("spawn_agent"));
}

#[tokio::test(flavor = "multi_thread")]
async fn delegate_runs_a_store_task_and_streams_its_tool_calls() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("read_file", json!({"path": "notes.md"})),
        Reply::text("The notes say three."),
    ]))
    .await;
    let test = project(&server);
    let mut client = Client::start(&test);
    let (text, error) = client.call("delegate", json!({"instructions": "summarise notes.md"}));
    assert!(!error, "{text}");
    assert!(text.contains("Status: completed"), "{text}");
    assert!(text.contains("Turns: 2"), "{text}");
    assert!(text.contains("\nCost: no price\n"), "{text}");
    assert!(text.trim_end().ends_with("The notes say three."), "{text}");
    assert_eq!(client.progress(), ["[subagent task] read_file: completed"]);
    // The foreground delegation is a task of the store, with its tokens.
    let tasks = tasks_json(&test);
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    assert_eq!(tasks[0]["status"], "completed");
    assert_eq!(tasks[0]["turns"], 2);
    assert!(text.contains(&format!("Task {}:", tasks[0]["id"].as_str().unwrap())));
    assert!(
        server.requests()[1]
            .body
            .to_string()
            .contains("three notes")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_async_delegation_is_collected_by_a_later_session_and_by_the_cli() {
    let server = MockServer::start(MockConfig::new().reply(Reply::text("background answer"))).await;
    let test = project(&server);
    let mut client = Client::start(&test);
    let (text, error) = client.call("delegate", json!({"instructions": "work", "async": true}));
    assert!(!error, "{text}");
    assert!(text.starts_with("Task started in background: "), "{text}");
    assert!(
        text.contains("Continue with other work. When you need the result, use load(source: \"")
    );
    let id = text["Task started in background: ".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    assert!(client.close().success());
    // Another session neither sees it nor collects it...
    let mut other = Client::start(&test);
    let (listed, _) = other.call("load", json!({}));
    assert!(!listed.contains(&id), "{listed}");
    let (refused, error) = other.call("load", json!({"source": id}));
    assert!(error, "{refused}");
    let (refused, error) = other.call("load", json!({"source": id, "cancel": true}));
    assert!(error && refused.contains(&id), "{refused}");
    drop(other);
    // ...unless the server shares the project's tasks: a later session collects it.
    let mut client = Client::start_with(&test, &["--share-tasks"]);
    let (result, error) = client.call("load", json!({"source": id}));
    assert!(!error, "{result}");
    assert!(result.contains("Status: completed"), "{result}");
    assert!(result.contains("background answer"), "{result}");
    let out = test.command().args(["load", &id]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "background answer\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn load_of_a_running_task_waits_a_bounded_time() {
    let server = MockServer::start(
        MockConfig::new().reply(Reply::text("slow").delayed(Duration::from_secs(30))),
    )
    .await;
    let test = project(&server);
    let mut client = Client::start(&test);
    let (text, _) = client.call("delegate", json!({"instructions": "slow", "async": true}));
    let id = text["Task started in background: ".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    drop(client);
    let mut short = Client::start_with(&test, &["--load-wait", "1", "--share-tasks"]);
    let (waited, error) = short.call("load", json!({"source": id}));
    assert!(!error, "{waited}");
    assert!(waited.contains("is still running"), "{waited}");
    assert!(
        waited.contains(&format!("Call load(source: \"{id}\") again")),
        "{waited}"
    );
    let (stopped, _) = short.call("load", json!({"source": id, "cancel": true}));
    assert!(stopped.contains("Status: cancelled"), "{stopped}");
}

#[tokio::test(flavor = "multi_thread")]
async fn spawn_agent_runs_roles_in_parallel_and_a_removed_role_fails_alone() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("found it"))).await;
    let test = project(&server);
    let mut client = Client::start(&test);
    let (text, error) = client.call(
        "spawn_agent",
        json!({"tasks": [{"agent": "explorer", "task": "read notes"}, {"agent": null, "task": "count"}]}),
    );
    assert!(!error, "{text}");
    assert!(
        text.starts_with("Subagent results: 2 tasks, 2 completed, 0 failed, 0 cancelled.\n"),
        "{text}"
    );
    assert!(
        text.contains("\n[1/2 explorer] completed · task "),
        "{text}"
    );
    assert!(text.contains("\n[2/2] completed · task "), "{text}");
    // The role's subagent got the role text, read from the file.
    let role_requests = server
        .requests()
        .iter()
        .filter(|r| r.body.to_string().contains("EXPLORER-ROLE"))
        .count();
    assert_eq!(role_requests, 1);

    std::fs::remove_file(test.path().join(".agents/agents/explorer.md")).unwrap();
    let (text, error) = client.call(
        "spawn_agent",
        json!({"tasks": [{"agent": "explorer", "task": "read notes"}, {"agent": null, "task": "count"}]}),
    );
    assert!(!error, "{text}");
    assert!(
        text.starts_with("Subagent results: 2 tasks, 1 completed, 1 failed, 0 cancelled.\n"),
        "{text}"
    );
    assert!(
        text.contains("[1/2 explorer] failed · not started · 0 requests, 0 tool calls\nCannot read .agents/agents/explorer.md: "),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_arguments_are_errors_that_name_the_key() {
    let server = MockServer::start(MockConfig::new()).await;
    let test = project(&server);
    // A link planted at `out`'s name (a subagent's commands can write the project).
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), test.path().join("results")).unwrap();
    let mut client = Client::start(&test);
    for (tool, arguments, expected) in [
        (
            "delegate",
            json!({"instructions": "x", "max_turns": "3"}),
            "delegate: argument `max_turns` must be a whole number of at least 1, found a string",
        ),
        (
            "delegate",
            json!({"instructions": "x", "max_turns": 0}),
            "delegate: argument `max_turns` must be a whole number of at least 1, found a number",
        ),
        (
            "delegate",
            json!({"instruction": "x"}),
            "delegate: unknown argument `instruction`",
        ),
        (
            "delegate",
            json!({}),
            "delegate: nothing to do: give `instructions`, `source`, or both",
        ),
        (
            "delegate",
            json!({"instructions": "x", "parameters": {"a": "1"}}),
            "delegate: `parameters` needs `source`",
        ),
        (
            "delegate",
            json!({"source": "nowhere"}),
            "Source 'nowhere' not found.",
        ),
        (
            "spawn_agent",
            json!({"tasks": [{"task": "x"}]}),
            "spawn_agent: `tasks[0]` has no `agent` key: give a subagent name, or null for a general subagent (where null does not reach the server, call delegate with the task as its instructions)",
        ),
        (
            "spawn_agent",
            json!({"tasks": [{"agent": null, "task": "x", "model": "m"}]}),
            "spawn_agent: `tasks[0]` has an unknown key `model`",
        ),
        (
            "spawn_agent",
            json!({"tasks": "x"}),
            "spawn_agent: argument `tasks` must be a list, found a string",
        ),
        (
            "spawn_agent",
            json!({}),
            "spawn_agent: missing argument `tasks`",
        ),
        (
            "load",
            json!({"source": 3}),
            "load: argument `source` must be a string, found a number",
        ),
        (
            "run_pipeline",
            json!({}),
            "run_pipeline: missing argument `path`",
        ),
        // the model's paths stay inside the project
        (
            "run_pipeline",
            json!({"path": "/etc/hostname"}),
            "run_pipeline: `path` must be inside the project, found `/etc/hostname`",
        ),
        (
            "run_pipeline",
            json!({"path": "pipe.yaml", "out": "../elsewhere"}),
            "run_pipeline: `out` must be inside the project, found `../elsewhere`",
        ),
        (
            "run_pipeline",
            json!({"path": "pipe.yaml", "out": "results"}),
            "run_pipeline: `out` must be inside the project, found `results` (it goes through a symbolic link)",
        ),
    ] {
        let (text, error) = client.call(tool, arguments.clone());
        assert!(error, "{tool} {arguments} was accepted: {text}");
        assert!(text.starts_with(expected), "{tool} {arguments}: {text}");
    }
    assert!(server.requests().is_empty(), "nothing ran");
    assert!(tasks_json(&test).is_empty(), "no task was recorded");
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    // The server is still there.
    assert_eq!(client.tool_names().len(), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn inside_a_subagent_only_load_is_offered_and_the_others_are_refused() {
    let server = MockServer::start(MockConfig::new()).await;
    let test = project(&server).env("SUMMON_SUBAGENT", "1");
    let mut client = Client::start(&test);
    assert_eq!(client.tool_names(), ["load"]);
    assert!(!client.instructions.contains("Available project subagents"));
    for tool in ["delegate", "spawn_agent", "run_pipeline"] {
        let (text, error) = client.call(tool, json!({"instructions": "x"}));
        assert!(error);
        assert_eq!(text, "Delegated tasks cannot spawn further delegations");
    }
    let (loaded, error) = client.call("load", json!({"source": "explorer"}));
    assert!(!error && loaded.starts_with("# Loaded: explorer (agent)"));
    assert!(server.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_answer_is_cut_with_its_size_and_the_whole_text_kept() {
    let long = "word ".repeat(20_000);
    let server = MockServer::start(MockConfig::new().reply(Reply::text(long.trim_end()))).await;
    let test = project(&server);
    let mut client = Client::start(&test);
    let (text, error) = client.call("delegate", json!({"instructions": "write a lot"}));
    assert!(!error);
    assert!(text.len() < 41_000, "{} bytes", text.len());
    let note = text.lines().last().unwrap();
    assert!(note.starts_with("[The answer was cut here: it has 99999 characters, about 25000 tokens. The whole text is in "), "{note}");
    let path = note.rsplit(' ').next().unwrap().trim_end_matches(']');
    assert_eq!(std::fs::read_to_string(path).unwrap(), long.trim_end());
}

#[tokio::test(flavor = "multi_thread")]
async fn closing_stdin_cancels_the_foreground_task_and_leaves_async_ones_running() {
    let server = MockServer::start(
        MockConfig::new().default_reply(Reply::text("late").delayed(Duration::from_secs(60))),
    )
    .await;
    let test = project(&server);
    let mut client = Client::start(&test);
    let (text, _) = client.call(
        "delegate",
        json!({"instructions": "background", "async": true}),
    );
    assert!(text.starts_with("Task started in background"), "{text}");
    // A foreground call, left running.
    client.next += 1;
    let id = client.next;
    client.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "delegate", "arguments": {"instructions": "foreground"}}}));
    support::wait_for(
        Duration::from_secs(30),
        "both tasks to ask the model",
        || server.in_flight() == 2,
    );
    assert!(client.close().success());
    let tasks = tasks_json(&test);
    let status = |description: &str| {
        tasks
            .iter()
            .find(|t| t["description"] == description)
            .map(|t| t["status"].as_str().unwrap().to_owned())
    };
    assert_eq!(
        status("foreground").as_deref(),
        Some("cancelled"),
        "{tasks:?}"
    );
    assert_eq!(
        status("background").as_deref(),
        Some("running"),
        "{tasks:?}"
    );
}

/// The official MCP Python SDK client (PyPI `mcp`, installed with the test servers) lists
/// the tools and calls each one.
#[test]
#[ignore = "needs the MCP Python SDK from PyPI (target/mcp-servers/py, installed by .ci/run)"]
fn the_python_sdk_client_lists_and_calls_every_tool() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime.block_on(MockServer::start(MockConfig::new().replies([
        Reply::tool_call("read_file", json!({"path": "notes.md"})),
        Reply::text("delegated answer"),
        Reply::text("spawned answer"),
        Reply::text("pipeline answer"),
    ])));
    let packages = support::mcp::python_packages();
    assert!(
        packages.join("mcp").is_dir(),
        "the MCP Python SDK is missing from {}",
        packages.display()
    );
    let test = project(&server)
        .env("PYTHONPATH", &packages.display().to_string())
        .write("pipe.yaml", "version: 1\nname: one\nsteps:\n  - id: only\n    delegate:\n      instructions: say it\n");
    let script = json!([
        {"list": true},
        {"call": "load", "arguments": {}},
        {"call": "delegate", "arguments": {"instructions": "read notes.md"}, "progress": true},
        {"call": "spawn_agent", "arguments": {"tasks": [{"agent": "explorer", "task": "look"}]}},
        {"call": "run_pipeline", "arguments": {"path": "pipe.yaml", "out": "out"}},
        {"call": "spawn_agent", "arguments": {"tasks": [{"agent": "nobody", "task": "x"}]}},
    ]);
    let driver =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_client/drive.py");
    let command = test.command();
    let output = std::process::Command::new("python3")
        .arg(driver)
        .arg(env!("CARGO_BIN_EXE_summon"))
        .arg(script.to_string())
        .current_dir(test.path())
        .envs(
            command
                .get_envs()
                .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned()))),
        )
        .env("HOME", test.path())
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("PYTHONPATH", &packages)
        .output()
        .expect("run python3");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result: Value = serde_json::from_slice(&output.stdout).unwrap();
    let steps = result["steps"].as_array().unwrap();
    eprintln!("{result:#}");
    assert_eq!(result["server"], "summon");
    assert_eq!(
        steps[0]["tools"],
        json!(["load", "delegate", "spawn_agent", "run_pipeline"])
    );
    assert_eq!(
        steps[0]["schemas"]["spawn_agent"]["properties"]["tasks"]["items"]["required"],
        json!(["agent", "task"])
    );
    assert!(steps[1]["text"].as_str().unwrap().contains("explorer"));
    assert_eq!(
        steps[2]["progress"],
        json!(["[subagent task] read_file: completed"])
    );
    assert!(
        steps[2]["text"]
            .as_str()
            .unwrap()
            .ends_with("delegated answer\n")
    );
    assert!(
        steps[3]["text"]
            .as_str()
            .unwrap()
            .starts_with("Subagent results: 1 tasks, 1 completed, 0 failed, 0 cancelled.")
    );
    let pipeline = steps[4]["text"].as_str().unwrap();
    assert!(pipeline.starts_with("Pipeline run "), "{pipeline}");
    assert!(pipeline.contains("succeeded"), "{pipeline}");
    assert!(pipeline.contains("report.html"), "{pipeline}");
    assert!(
        pipeline.trim_end().ends_with("pipeline answer"),
        "{pipeline}"
    );
    assert_eq!(steps[5]["is_error"], true);
    assert_eq!(
        steps[5]["text"],
        "Subagent \"nobody\" is not in this session's catalog. Use a name from it, or null for a general subagent. The names: explorer."
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_call_cancels_its_task_and_stops_its_worker() {
    let server = MockServer::start(
        MockConfig::new().default_reply(Reply::text("late").delayed(Duration::from_secs(60))),
    )
    .await;
    let test = project(&server);
    let mut client = Client::start(&test);
    client.next += 1;
    let id = client.next;
    client.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "delegate", "arguments": {"instructions": "slow work"}}}));
    support::wait_for(Duration::from_secs(30), "the task to ask the model", || {
        server.in_flight() == 1
    });
    let worker = tasks_json(&test)[0]["id"].as_str().unwrap().to_owned();
    client.send(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": id, "reason": "user"}}));
    support::wait_for(Duration::from_secs(30), "the task to end", || {
        tasks_json(&test)[0]["status"] != "running"
    });
    assert_eq!(tasks_json(&test)[0]["status"], "cancelled");
    support::wait_for(
        Duration::from_secs(30),
        "the model request to be dropped",
        || server.in_flight() == 0,
    );
    // The server goes on serving.
    let (text, error) = client.call("load", json!({"source": worker, "peek": true}));
    assert!(!error, "{text}");
    assert!(text.contains(": cancelled"), "{text}");
}

#[test]
fn http_on_an_address_that_is_not_loopback_is_refused_without_the_flag() {
    let out = Test::new()
        .args(["mcp", "--http", "0.0.0.0:0"])
        .code(1)
        .run();
    assert!(
        out.stderr
            .contains("--http 0.0.0.0:0: not a loopback address")
            && out.stderr.contains("--allow-remote"),
        "{}",
        out.stderr
    );
}

/// The Python SDK's streamable HTTP client against `summon mcp --http 127.0.0.1:0`.
#[test]
#[ignore = "needs the MCP Python SDK from PyPI (target/mcp-servers/py, installed by .ci/run)"]
fn the_python_sdk_client_reaches_the_http_server() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime.block_on(MockServer::start(MockConfig::new().replies([
        Reply::tool_call("read_file", json!({"path": "notes.md"})),
        Reply::text("over http"),
    ])));
    let packages = support::mcp::python_packages();
    let test = project(&server);
    let mut command = test.command();
    command
        .args(["mcp", "--http", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("summon: serving MCP at ")
        .unwrap_or_else(|| panic!("no address: {line}"))
        .to_owned();
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let token_file = line
        .trim()
        .rsplit_once(" the token in ")
        .unwrap_or_else(|| panic!("no token file: {line}"))
        .1
        .to_owned();
    let script = json!([
        {"list": true},
        {"call": "delegate", "arguments": {"instructions": "read notes.md"}, "progress": true},
    ]);
    let driver =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_client/drive.py");
    let output = std::process::Command::new("python3")
        .arg(driver)
        .arg(&url)
        .arg(script.to_string())
        .current_dir(test.path())
        .env("PYTHONPATH", &packages)
        .env("SUMMON_MCP_TOKEN_FILE", &token_file)
        .output()
        .expect("run python3");
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result: Value = serde_json::from_slice(&output.stdout).unwrap();
    let steps = result["steps"].as_array().unwrap();
    assert_eq!(
        steps[0]["tools"],
        json!(["load", "delegate", "spawn_agent", "run_pipeline"])
    );
    assert_eq!(
        steps[1]["progress"],
        json!(["[subagent task] read_file: completed"])
    );
    assert!(steps[1]["text"].as_str().unwrap().ends_with("over http\n"));
}

/// Claude Code (npm), installed by `.ci/run` under `mcp-clients/` of the target directory.
fn claude_code() -> std::path::PathBuf {
    crate::support::target_dir().join("mcp-clients/node/node_modules/.bin/claude")
}

/// A real agent host: Claude Code registers `summon mcp` as its MCP server and, when the mock
/// scripts its model to, calls `spawn_agent`; the result reaches its model.
#[test]
#[ignore = "needs Claude Code from npm (target/mcp-clients, installed by .ci/run)"]
fn claude_code_calls_spawn_agent_through_summon_mcp() {
    let claude = claude_code();
    assert!(
        claude.exists(),
        "Claude Code is not installed at {}: run .ci/run",
        claude.display()
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime.block_on(MockServer::start(MockConfig::new().rule(|request| {
        let body = request.body.to_string();
        if request.path.ends_with("/chat/completions") {
            // summon's subagent, on the OpenAI-compatible endpoint.
            return Reply::text("SUB-ANSWER: port 8080");
        }
        let offered = request
            .tool_names()
            .iter()
            .any(|t| t == "mcp__summon__spawn_agent");
        if body.contains("Subagent results:") {
            Reply::text("CLAUDE-FINAL: the explorer says port 8080")
        } else if offered {
            Reply::tool_call(
                "mcp__summon__spawn_agent",
                json!({"tasks": [{"agent": "explorer", "task": "find the port"}]}),
            )
        } else {
            Reply::text("ok")
        }
    })));
    let test = project(&server);
    let home = test.path().join(".home");
    std::fs::create_dir_all(&home).unwrap();
    let config = json!({"mcpServers": {"summon": {
        "command": env!("CARGO_BIN_EXE_summon"),
        "args": ["mcp"],
        "env": {
            "OPENAI_BASE_URL": server.url_openai(),
            "OPENAI_API_KEY": "sk-test-key",
            "SUMMON_MODEL": "mock-model",
        },
    }}});
    let output = std::process::Command::new(&claude)
        .args([
            "-p",
            "Ask the explorer which port the server uses.",
            "--mcp-config",
        ])
        .arg(config.to_string())
        .args([
            "--strict-mcp-config",
            "--allowedTools",
            "mcp__summon__spawn_agent",
            "--output-format",
            "json",
        ])
        .current_dir(test.path())
        .env_clear()
        .env("HOME", &home)
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("ANTHROPIC_BASE_URL", server.url_anthropic())
        .env("ANTHROPIC_API_KEY", "sk-ant-test")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("MCP_TIMEOUT", "30000")
        // MCP tools offered with the others, not deferred behind tool search.
        .env("ENABLE_TOOL_SEARCH", "false")
        .output()
        .expect("run claude");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "claude failed:\n{stdout}\n{stderr}"
    );
    let offered: Vec<(String, Vec<String>)> = server
        .requests()
        .iter()
        .map(|r| (r.path.clone(), r.tool_names()))
        .collect();
    assert!(
        stdout.contains("CLAUDE-FINAL: the explorer says port 8080"),
        "{stdout}\n{stderr}\n{offered:?}"
    );
    // What Claude Code's model got back from summon: the results block of the seed.
    let requests = server.requests();
    let back = requests
        .iter()
        .find(|r| {
            r.body
                .to_string()
                .contains("Subagent results: 1 tasks, 1 completed")
        })
        .unwrap_or_else(|| panic!("no request carried the spawn_agent result"));
    assert!(back.body.to_string().contains("SUB-ANSWER: port 8080"));
    // The subagent got its role's text.
    assert!(
        requests
            .iter()
            .any(|r| r.path.ends_with("/chat/completions")
                && r.body.to_string().contains("EXPLORER-ROLE"))
    );
    // The delegation is a task of the project's store.
    assert_eq!(tasks_json(&test)[0]["status"], "completed");
}

/// The MCP Inspector's CLI (npm), installed by `.ci/run` under `mcp-clients/` of the target directory.
fn inspector() -> std::path::PathBuf {
    crate::support::target_dir().join("mcp-clients/inspector/node_modules/.bin/mcp-inspector")
}

/// One `mcp-inspector --cli` call of `summon mcp` in `test`'s project: its stdout as JSON.
fn inspect(test: &Test, server: &MockServer, args: &[&str]) -> Value {
    let output = std::process::Command::new(inspector())
        .arg("--cli")
        .args(["-e", &format!("OPENAI_BASE_URL={}", server.url_openai())])
        .args([
            "-e",
            "OPENAI_API_KEY=sk-test-key",
            "-e",
            "SUMMON_MODEL=mock-model",
            // The user trusts the project's pipelines, which run_pipeline runs only then.
            "-e",
            "SUMMON_TRUST_PROJECT=1",
        ])
        .args([env!("CARGO_BIN_EXE_summon"), "mcp"])
        .args(args)
        .current_dir(test.path())
        .env("HOME", test.path())
        .output()
        .expect("run the inspector");
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

#[test]
#[ignore = "needs the MCP Inspector from npm (target/mcp-clients, installed by .ci/run)"]
fn the_mcp_inspector_cli_lists_and_calls_every_tool() {
    assert!(
        inspector().exists(),
        "the MCP Inspector is not installed at {}: run .ci/run",
        inspector().display()
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // The delegated answer comes late enough that the task is still working when the call
    // returns (an immediate one may finish first, and the call then says `completed`).
    let server = runtime.block_on(MockServer::start(MockConfig::new().replies([
        Reply::text("delegated answer").delayed(Duration::from_secs(2)),
        Reply::text("spawned answer"),
        Reply::text("pipeline answer"),
    ])));
    let test = project(&server).write(
        "pipe.yaml",
        "version: 1\nname: one\nsteps:\n  - id: only\n    delegate:\n      instructions: say it\n",
    );
    let listed = inspect(&test, &server, &["--method", "tools/list"]);
    let names: Vec<_> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["load", "delegate", "spawn_agent", "run_pipeline"]);
    let call = |args: &[&str]| {
        let mut all = vec!["--method", "tools/call"];
        all.extend_from_slice(args);
        inspect(&test, &server, &all)
    };
    let text = |value: &Value| {
        value["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };
    let load = call(&["--tool-name", "load", "--tool-arg", "source=explorer"]);
    assert!(
        text(&load).starts_with("# Loaded: explorer (agent)"),
        "{load}"
    );
    // The Inspector declares the tasks extension: `delegate` comes back as a task of the
    // store, collected here by the command line.
    let delegate = call(&[
        "--tool-name",
        "delegate",
        "--tool-arg",
        "instructions=hello",
    ]);
    assert_eq!(delegate["status"], "working", "{delegate}");
    let id = delegate["taskId"].as_str().unwrap();
    let collected = test.command().args(["load", id]).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&collected.stdout),
        "delegated answer\n"
    );
    let spawn = call(&[
        "--tool-name",
        "spawn_agent",
        "--tool-arg",
        r#"tasks=[{"agent":"explorer","task":"look"}]"#,
    ]);
    assert!(
        text(&spawn).starts_with("Subagent results: 1 tasks, 1 completed, 0 failed, 0 cancelled."),
        "{spawn}"
    );
    let pipeline = call(&[
        "--tool-name",
        "run_pipeline",
        "--tool-arg",
        "path=pipe.yaml",
    ]);
    assert!(text(&pipeline).contains(": succeeded"), "{pipeline}");
    assert!(text(&pipeline).ends_with("pipeline answer\n"), "{pipeline}");
    assert_eq!(
        tasks_json(&test).len(),
        2,
        "each delegation is a store task"
    );
}

/// The tasks extension: a client that declares it gets a `delegate` call back as a task of
/// the store, polled with tasks/get and stopped with tasks/cancel.
#[tokio::test(flavor = "multi_thread")]
async fn a_tasks_client_gets_delegate_as_a_task_it_polls_and_cancels() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::text("task answer"),
        Reply::text("never").delayed(Duration::from_secs(60)),
    ]))
    .await;
    let test = project(&server);
    let tasks_extension = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let mut client = Client::start_as(&test, &[], tasks_extension);
    let created = client.request(
        "tools/call",
        json!({"name": "delegate", "arguments": {"instructions": "as a task"}}),
    );
    let result = &created["result"];
    assert_eq!(result["resultType"], "task", "{created}");
    let id = result["taskId"].as_str().unwrap().to_owned();
    assert_eq!(
        tasks_json(&test)[0]["id"],
        json!(id),
        "the protocol task is the store's"
    );
    let mut status = String::new();
    support::wait_for(Duration::from_secs(30), "the task to complete", || {
        let got = client.request("tasks/get", json!({"taskId": id}));
        status = got["result"]["status"].as_str().unwrap_or("").to_owned();
        if status == "completed" {
            let text = got["result"]["result"]["content"][0]["text"]
                .as_str()
                .unwrap_or("");
            assert!(text.ends_with("task answer\n"), "{got}");
            return true;
        }
        assert_eq!(status, "working", "{got}");
        false
    });

    let created = client.request(
        "tools/call",
        json!({"name": "delegate", "arguments": {"instructions": "slow"}}),
    );
    let id = created["result"]["taskId"].as_str().unwrap().to_owned();
    support::wait_for(Duration::from_secs(30), "the task to ask the model", || {
        server.in_flight() == 1
    });
    let cancelled = client.request("tasks/cancel", json!({"taskId": id}));
    assert!(cancelled.get("error").is_none(), "{cancelled}");
    let got = client.request("tasks/get", json!({"taskId": id}));
    assert_eq!(got["result"]["status"], "cancelled", "{got}");
    let unknown = client.request("tasks/get", json!({"taskId": "nonsense"}));
    assert!(
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown task"),
        "{unknown}"
    );
}

/// A subagent whose recipe lists `summon mcp` as an extension gets `load` alone from it: the
/// server started under a subagent knows it is nested.
#[tokio::test(flavor = "multi_thread")]
async fn a_subagent_never_gets_the_delegation_tools() {
    let server = MockServer::start(MockConfig::new().reply(Reply::text("done"))).await;
    let recipe = format!(
        "title: Nested\ndescription: d\nprompt: Try to delegate.\nextensions:\n  - type: stdio\n    name: summon\n    cmd: {}\n    args: [mcp]\n    timeout: 60\n",
        env!("CARGO_BIN_EXE_summon")
    );
    project(&server)
        .write(".agents/recipes/nested.yaml", &recipe)
        .args(["delegate", "--source", "nested"])
        .stdout("done\n")
        .run();
    let offered = server.requests()[0].tool_names();
    let from_summon: Vec<_> = offered.iter().filter(|t| t.contains("summon")).collect();
    assert_eq!(from_summon.len(), 1, "{offered:?}");
    assert!(from_summon[0].ends_with("load"), "{offered:?}");
}

/// A long model turn without tool calls still sends progress, so hosts that abort quiet
/// calls keep waiting.
#[tokio::test(flavor = "multi_thread")]
async fn a_quiet_task_still_sends_progress() {
    let server = MockServer::start(
        MockConfig::new().reply(Reply::text("slow answer").delayed(Duration::from_millis(2500))),
    )
    .await;
    let test = project(&server).env("SUMMON_MCP_PROGRESS_SECS", "1");
    let mut client = Client::start(&test);
    let (text, error) = client.call("delegate", json!({"instructions": "think long"}));
    assert!(!error && text.ends_with("slow answer\n"), "{text}");
    let progress = client.progress();
    assert!(!progress.is_empty(), "no progress in 2.5 s");
    assert!(
        progress
            .iter()
            .all(|line| line.starts_with("[subagent task] working: ")),
        "{progress:?}"
    );
}

/// A delegation's result says what it cost, at its model's price.
#[tokio::test(flavor = "multi_thread")]
async fn a_delegation_says_what_it_cost() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("done"))).await;
    let test = project(&server).write(
        "summon.yaml",
        "prices:\n  mock-model: {input: 1000000, output: 1000000}\n",
    );
    let mut client = Client::start(&test);
    let (text, error) = client.call("delegate", json!({"instructions": "say done"}));
    assert!(!error, "{text}");
    let tokens = text
        .lines()
        .find_map(|l| l.strip_prefix("Tokens: "))
        .unwrap_or_else(|| panic!("{text}"));
    let words: Vec<&str> = tokens.split_whitespace().collect();
    let total: u64 = words[0].parse::<u64>().unwrap() + words[2].parse::<u64>().unwrap();
    // a dollar a token: the cost is the token count
    let cost = text
        .lines()
        .find_map(|l| l.strip_prefix("Cost: $"))
        .unwrap_or_else(|| panic!("{text}"));
    let cost: f64 = cost
        .replace(',', "")
        .parse()
        .unwrap_or_else(|_| panic!("{text}"));
    assert!((cost - total as f64).abs() < 1.0, "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn each_call_is_a_span_under_the_clients_context_and_its_worker_joins_it() {
    use crate::traces::{Collector, PARENT_SPAN, PARENT_TRACE, attr, hex, named, one};
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("read_file", json!({"path": "notes.md"})),
        Reply::text("The notes say three."),
    ]))
    .await;
    let collector = Collector::start(axum::http::StatusCode::OK).await;
    let test = project(&server)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url)
        .env("OTEL_BSP_SCHEDULE_DELAY", "20");
    let mut client = Client::start(&test);
    // The client's context in `_meta` (SEP-414) parents the call.
    let response = client.request(
        "tools/call",
        json!({
            "name": "delegate",
            "arguments": {"instructions": "summarise notes.md"},
            "_meta": {"traceparent": format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01")},
        }),
    );
    assert_ne!(response["result"]["isError"], json!(true), "{response}");
    let (_, error) = client.call("load", json!({"source": "no-such-source"}));
    assert!(error);
    assert!(client.close().success());
    // The worker sends its spans as it exits; the server sent its own as the session ended.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let spans = loop {
        let spans = collector.spans();
        if !named(&spans, "delegate task").is_empty() || std::time::Instant::now() > deadline {
            break spans;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let call = one(&spans, "tools/call delegate");
    assert_eq!(hex(&call.trace_id), PARENT_TRACE);
    assert_eq!(hex(&call.parent_span_id), PARENT_SPAN);
    assert_eq!(call.kind, 2, "a server span");
    assert_eq!(attr(call, "mcp.method.name"), Some(json!("tools/call")));
    assert_eq!(attr(call, "gen_ai.tool.name"), Some(json!("delegate")));
    let worker = one(&spans, "delegate task");
    assert_eq!(worker.trace_id, call.trace_id);
    assert_eq!(
        worker.parent_span_id, call.span_id,
        "the worker runs under the call"
    );
    let tool = one(&spans, "execute_tool read_file");
    assert_eq!(tool.trace_id, call.trace_id);
    // A call without a context is a trace of its own, failed when its reply is an error.
    let load = one(&spans, "tools/call load");
    assert_ne!(load.trace_id, call.trace_id);
    assert!(load.parent_span_id.is_empty());
    assert_eq!(attr(load, "error.type"), Some(json!("tool_error")));
}

/// The processes whose command line is `summon __worker ID`.
fn worker_pids(id: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|line| {
                let words: Vec<&[u8]> = line.split(|b| *b == 0).collect();
                words.len() >= 3 && words[1] == b"__worker" && words[2] == id.as_bytes()
            })
        })
        .collect()
}

/// A process that exists and is not a zombie (a zombie means no one reaped it).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// A host that stops the server mid-call (closes stdin, sends SIGTERM or SIGINT) leaves no
/// subagent behind: the worker of the foreground task is gone, reaped, within a second, and
/// the task is not `running`; an `async` task keeps running.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_server_leaves_no_foreground_work_within_a_second() {
    for how in ["stdin", "SIGTERM", "SIGINT"] {
        let server = MockServer::start(
            MockConfig::new().default_reply(Reply::text("late").delayed(Duration::from_secs(60))),
        )
        .await;
        let test = project(&server);
        let mut client = Client::start(&test);
        let (text, error) = client.call(
            "delegate",
            json!({"instructions": "background", "async": true}),
        );
        assert!(!error, "{text}");
        client.next += 1;
        let id = client.next;
        client.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "delegate", "arguments": {"instructions": "foreground"}}}));
        support::wait_for(
            Duration::from_secs(30),
            "both tasks to ask the model",
            || server.in_flight() == 2,
        );
        let tasks = tasks_json(&test);
        let id_of = |description: &str| {
            tasks
                .iter()
                .find(|t| t["description"] == description)
                .and_then(|t| t["id"].as_str())
                .unwrap()
                .to_owned()
        };
        let (foreground, background) = (id_of("foreground"), id_of("background"));
        let workers = worker_pids(&foreground);
        assert_eq!(workers.len(), 1, "{how}: no worker of {foreground}");
        let server_pid = client.child.id();
        let stopped = std::time::Instant::now();
        match how {
            "stdin" => drop(client.stdin.take()),
            signal => {
                let status = std::process::Command::new("kill")
                    .args([&format!("-{}", &signal[3..]), &server_pid.to_string()])
                    .status()
                    .unwrap();
                assert!(status.success());
            }
        }
        // Polled, not slept: the worker is gone (reaped, not a zombie) within the bound.
        let gone = loop {
            let alive: Vec<u32> = workers
                .iter()
                .copied()
                .filter(|pid| process_state(*pid).is_some())
                .collect();
            if alive.is_empty() {
                break stopped.elapsed();
            }
            assert!(
                stopped.elapsed() < Duration::from_secs(10),
                "{how}: the worker is still there after 10 s: {:?}",
                alive
                    .iter()
                    .map(|p| (p, process_state(*p)))
                    .collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(
            gone < Duration::from_secs(1),
            "{how}: the worker lived {gone:?} after the host stopped"
        );
        let status = client.child.wait().unwrap();
        match how {
            "stdin" => assert!(status.success(), "{status}"),
            _ => assert!(!status.success(), "{status}"),
        }
        let tasks = tasks_json(&test);
        let status = |id: &str| {
            tasks
                .iter()
                .find(|t| t["id"] == id)
                .map(|t| t["status"].as_str().unwrap().to_owned())
        };
        assert_eq!(status(&foreground).as_deref(), Some("cancelled"), "{how}");
        assert_eq!(status(&background).as_deref(), Some("running"), "{how}");
        assert!(!worker_pids(&background).is_empty(), "{how}");
        // The background task is the test's to end.
        test.command()
            .args(["load", &background, "--cancel"])
            .output()
            .unwrap();
        // Its worker, no longer the server's child, is reaped by init when it gets to it.
        support::wait_for(
            Duration::from_secs(10),
            "the background worker to go",
            || worker_pids(&background).is_empty(),
        );
    }
}

/// `run_pipeline` runs a pipeline only when the user trusts it, and never one written after
/// the server started (a subagent of the session may have written it), trusted or not.
#[tokio::test(flavor = "multi_thread")]
async fn run_pipeline_refuses_untrusted_pipelines_and_ones_written_during_the_session() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ran"))).await;
    let pipe =
        "version: 1\nname: one\nsteps:\n  - id: only\n    delegate:\n      instructions: say it\n";
    let untrusted = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-key")
        .env("SUMMON_MODEL", "mock-model")
        .write("pipe.yaml", pipe);
    let mut client = Client::start(&untrusted);
    let (text, error) = client.call("run_pipeline", json!({"path": "pipe.yaml"}));
    assert!(error, "{text}");
    assert_eq!(
        text,
        "run_pipeline: pipe.yaml is not run: this project is not trusted. A pipeline can start commands, so run_pipeline runs only pipelines the user trusts. Ask the user to read it and trust it (`summon trust`, or start summon mcp with --trust)."
    );
    drop(client);
    let trusted = project(&server).write("pipe.yaml", pipe);
    let mut client = Client::start(&trusted);
    let (text, error) = client.call("run_pipeline", json!({"path": "pipe.yaml"}));
    assert!(!error, "{text}");
    assert!(text.trim_end().ends_with("ran"), "{text}");
    // Written during the session, as a subagent's write_file would.
    std::fs::write(trusted.path().join("evil.yaml"), pipe).unwrap();
    let (text, error) = client.call("run_pipeline", json!({"path": "evil.yaml"}));
    assert!(error, "{text}");
    assert!(
        text.starts_with("run_pipeline: evil.yaml was written or changed after this MCP server started, so it is not run"),
        "{text}"
    );
    // Renamed over a file that was there: its change time is new too.
    std::fs::rename(
        trusted.path().join("evil.yaml"),
        trusted.path().join("pipe.yaml"),
    )
    .unwrap();
    let (text, error) = client.call("run_pipeline", json!({"path": "pipe.yaml"}));
    assert!(error && text.contains("written or changed after"), "{text}");
}

/// `max_cost` holds for a whole `spawn_agent` call: its tasks share the cap, so four tasks
/// whose worst case fits the cap one at a time do not start together; and a running task
/// holds the session's cap until it ends.
#[tokio::test(flavor = "multi_thread")]
async fn max_cost_holds_for_a_whole_spawn_agent_call_and_for_the_session() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("done"))).await;
    // $0.001 a token: a task's worst case (25 turns of its input and 1,000 output tokens)
    // is $40-60, within the $120 cap, but not within a quarter of it.
    let test = project(&server).write(
        "summon.yaml",
        "prices:\n  mock-model: {input: 1000, output: 1000}\nmax_output_tokens: 1000\nmax_cost: 120\n",
    );
    let mut client = Client::start(&test);
    let four: Vec<Value> = (0..4)
        .map(|i| json!({"agent": null, "task": format!("part {i}")}))
        .collect();
    let (text, _) = client.call("spawn_agent", json!({"tasks": four}));
    assert!(
        text.starts_with("Subagent results: 4 tasks, 0 completed, 4 failed, 0 cancelled."),
        "{text}"
    );
    assert!(text.contains("budget reached"), "{text}");
    assert_eq!(server.request_count(), 0, "a request was sent past the cap");
    let (text, error) = client.call(
        "spawn_agent",
        json!({"tasks": [{"agent": null, "task": "whole"}]}),
    );
    assert!(!error, "{text}");
    assert!(text.contains("1 completed"), "{text}");
    // The number of tasks in one call is bounded.
    let mut bounded = Client::start_with(&test, &["--max-spawn", "2"]);
    let three: Vec<Value> = (0..3)
        .map(|i| json!({"agent": null, "task": format!("part {i}")}))
        .collect();
    let (text, error) = bounded.call("spawn_agent", json!({"tasks": three}));
    assert!(error, "{text}");
    assert_eq!(
        text,
        "spawn_agent: 3 tasks in one call; the most is 2 (summon mcp --max-spawn). Split the work over several calls."
    );
}

/// A role's `tools` are the session's: a read-only role rewritten during the session to
/// list `write_file` still cannot write.
#[tokio::test(flavor = "multi_thread")]
async fn a_roles_tools_stay_as_the_session_saw_them() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("write_file", json!({"path": "planted.txt", "content": "x"})),
        Reply::text("tried"),
    ]))
    .await;
    let test = project(&server);
    let mut client = Client::start(&test);
    std::fs::write(
        test.path().join(".agents/agents/explorer.md"),
        EXPLORER.replace("tools: [read_file]", "tools: [read_file, write_file]"),
    )
    .unwrap();
    let (text, error) = client.call(
        "spawn_agent",
        json!({"tasks": [{"agent": "explorer", "task": "write it"}]}),
    );
    assert!(!error, "{text}");
    assert!(text.contains("1 completed"), "{text}");
    assert!(
        !test.path().join("planted.txt").exists(),
        "the rewritten role wrote a file: {text}"
    );
    // The subagent's next request says so in the seed's words.
    let results = support::mcp::tool_results(support::chats(&server).last().unwrap());
    assert!(
        results
            .iter()
            .any(|r| r.contains("Unknown tool `write_file`: it is not one of your tools")),
        "{results:?}"
    );
    // A new session takes the new list.
    drop(client);
    assert!(
        Client::start(&test)
            .instructions
            .contains("\"tools\":[\"read_file\",\"write_file\"]")
    );
}

/// An async result carries its task id where hosts read data, not only in its text; a
/// `spawn_agent` call whose every task failed is an error.
#[tokio::test(flavor = "multi_thread")]
async fn an_async_result_carries_its_task_id_and_an_all_failed_spawn_is_an_error() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("done"))).await;
    let test = project(&server);
    let mut client = Client::start(&test);
    let response = client.request(
        "tools/call",
        json!({"name": "delegate", "arguments": {"instructions": "later", "async": true}}),
    );
    let result = &response["result"];
    let text = result["content"][0]["text"].as_str().unwrap();
    let id = result["structuredContent"]["task_id"].as_str().unwrap();
    assert!(
        text.starts_with(&format!("Task started in background: {id} ")),
        "{text}"
    );
    assert_eq!(result["_meta"]["summon/task_id"], id);
    std::fs::remove_file(test.path().join(".agents/agents/explorer.md")).unwrap();
    let (text, error) = client.call(
        "spawn_agent",
        json!({"tasks": [{"agent": "explorer", "task": "a"}, {"agent": "explorer", "task": "b"}]}),
    );
    assert!(error, "{text}");
    assert!(
        text.starts_with("Subagent results: 2 tasks, 0 completed, 2 failed, 0 cancelled."),
        "{text}"
    );
}

/// `summon trust` pins the project's pipelines and says what each would start (as `summon
/// doctor` does); `run_pipeline` runs a pinned one, refuses it once its bytes changed since
/// (until it is trusted again), and the run it starts judges the bytes it parses by the same
/// rule, so a file swapped between the server's check and the run's read does not run.
#[tokio::test(flavor = "multi_thread")]
async fn run_pipeline_runs_a_pipeline_that_summon_trust_pinned() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ran"))).await;
    let pipe = |word: &str| {
        format!(
            "version: 1\nname: one\nsteps:\n  - id: list\n    decompose:\n      command: echo {word}\n  - id: each\n    fan_out:\n      over: list\n      instructions: 'say {{{{ item }}}}'\n"
        )
    };
    let t = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-key")
        .env("SUMMON_MODEL", "mock-model")
        .write("pipelines/pipe.yaml", &pipe("a"));
    let starts = "pipelines/pipe.yaml starts the `decompose.command` `echo a` of step `list` (outside the sandbox)";
    let doctor = t.command().arg("doctor").output().unwrap();
    assert!(
        String::from_utf8_lossy(&doctor.stdout).contains(starts),
        "{}",
        String::from_utf8_lossy(&doctor.stdout)
    );
    let trust = |t: &Test| {
        let out = t.command().arg("trust").output().unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let trusted = trust(&t);
    assert!(trusted.contains(starts), "{trusted}");
    let mut client = Client::start(&t);
    let (text, error) = client.call("run_pipeline", json!({"path": "pipelines/pipe.yaml"}));
    assert!(!error, "{text}");
    assert!(text.contains("ran"), "{text}");
    drop(client);

    // Changed after it was trusted: refused, naming the file, until it is trusted again.
    std::fs::write(t.path().join("pipelines/pipe.yaml"), pipe("b")).unwrap();
    let mut client = Client::start(&t);
    let (text, error) = client.call("run_pipeline", json!({"path": "pipelines/pipe.yaml"}));
    assert!(
        error && text.contains("pipelines/pipe.yaml changed since this project was trusted"),
        "{text}"
    );
    drop(client);
    let requests = support::chat_count(&server);
    // The run run_pipeline starts refuses bytes the rule does not allow, whatever the server saw.
    let run = t
        .command()
        .args(["run", "pipelines/pipe.yaml"])
        .env("SUMMON_PIPELINE_NEEDS_TRUST", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "this pipeline is not run: pipelines/pipe.yaml changed since this project was trusted"
        ) && stderr.contains("summon trust"),
        "{stderr}"
    );
    assert_eq!(support::chat_count(&server), requests);
    assert!(trust(&t).contains("`echo b`"));
    let mut client = Client::start(&t);
    let (text, error) = client.call("run_pipeline", json!({"path": "pipelines/pipe.yaml"}));
    assert!(!error, "{text}");
}
