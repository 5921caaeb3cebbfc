//! `summon mcp` on the hosts' defaults: a bare environment (hosts start servers with PATH and
//! HOME), tools whose annotations tell a host what they do, calls that fit a host's timeout,
//! and the catalog where every host's model sees it. Driven by the JSON-RPC client of
//! tests/mcp_server.rs; the model is the test mock.

use crate::mcp_server::{Client, project};
use crate::support;

use std::os::unix::fs::PermissionsExt as _;

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

const FILE_KEY: &str = "sk-from-the-credentials-file-0123";

/// A project whose user configured the mock as the provider in the config file, the key's
/// variable named there and its value in the credentials file (mode `mode`); nothing in the
/// environment but what the test harness gives every run (PATH, HOME).
fn bare(server: &MockServer, mode: u32) -> Test {
    let test = Test::new()
        .write(
            ".config/summon/config.yaml",
            &format!(
                "default_provider: mine\nproviders:\n  mine:\n    kind: openai\n    base_url: {}\n    api_key_env: MY_PROVIDER_KEY\n    default_model: mock-model\n",
                server.url_openai()
            ),
        )
        .write_raw(
            ".local/state/summon/credentials",
            &format!("# summon's keys\nexport MY_PROVIDER_KEY=\"{FILE_KEY}\"\n"),
        );
    let file = test.path().join(".local/state/summon/credentials");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
    test
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bare_environment_finds_the_key_in_the_credentials_file_and_says_what_to_do_without_it() {
    let server = MockServer::start(
        MockConfig::new()
            .record(true)
            .replies([Reply::text("done")]),
    )
    .await;
    let test = bare(&server, 0o644);
    let file = test.path().join(".local/state/summon/credentials");

    // Others may read the file: nothing is sent, and the call says how to fix it.
    let mut client = Client::start(&test);
    let (text, is_error) = client.call("delegate", json!({"instructions": "Say done."}));
    assert!(is_error, "{text}");
    assert!(
        text.contains("MY_PROVIDER_KEY is not set")
            && text.contains(&format!("run `chmod 600 {}`", file.display())),
        "{text}"
    );
    assert_eq!(support::chat_count(&server), 0);
    drop(client);
    let report = doctor(&test);
    assert!(
        report.contains("may be read by others (mode 0644)")
            && report.contains(&format!("fix: chmod 600 {}", file.display())),
        "{report}"
    );

    // Made private, the same bare environment delegates with the file's key.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut client = Client::start(&test);
    let (text, is_error) = client.call("delegate", json!({"instructions": "Say done."}));
    assert!(!is_error, "{text}");
    assert!(text.contains("done"), "{text}");
    let chats = support::chats(&server);
    assert_eq!(chats.len(), 1);
    let auth = chats[0]
        .headers
        .iter()
        .find(|(name, _)| name == "authorization")
        .map(|(_, value)| value.as_str());
    assert_eq!(auth, Some(format!("Bearer {FILE_KEY}").as_str()));
    let report = doctor(&test);
    assert!(
        report.contains(&format!(
            "MY_PROVIDER_KEY read from {} (the environment does not set it)",
            file.display()
        )) && report.contains("API key set in MY_PROVIDER_KEY, read from"),
        "{report}"
    );
    assert!(!report.contains(FILE_KEY), "{report}");
}

/// `summon doctor --offline`'s whole output.
fn doctor(test: &Test) -> String {
    let out = test
        .command()
        .args(["doctor", "--offline"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn with_no_provider_at_all_the_first_call_names_the_credentials_file() {
    let test = Test::new().env("OLLAMA_HOST", "127.0.0.1:9");
    let mut client = Client::start(&test);
    let (text, is_error) = client.call("delegate", json!({"instructions": "Say done."}));
    assert!(is_error, "{text}");
    let file = test.path().join(".local/state/summon/credentials");
    assert!(
        text.contains("no LLM provider is configured")
            && text.contains(&format!(
                "a line such as `OPENAI_API_KEY=sk-...` in {} (mode 0600)",
                file.display()
            )),
        "{text}"
    );
}

/// Each tool's annotations as tools/list gives them.
fn annotations(client: &mut Client) -> Vec<(String, Value)> {
    let response = client.request("tools/list", json!({}));
    response["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_owned(),
                t["annotations"].clone(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_tool_says_what_it_does_to_the_world() {
    let server = MockServer::start(MockConfig::new()).await;
    let test = project(&server);
    let mut client = Client::start(&test);
    let hints = |read_only: bool, destructive: bool, idempotent: bool, open_world: bool| {
        json!({"readOnlyHint": read_only, "destructiveHint": destructive,
               "idempotentHint": idempotent, "openWorldHint": open_world})
    };
    let mut seen = Vec::new();
    for (name, annotations) in annotations(&mut client) {
        assert!(
            annotations["title"].as_str().is_some_and(|t| !t.is_empty()),
            "{name}: {annotations}"
        );
        let mut annotations = annotations.clone();
        annotations.as_object_mut().unwrap().remove("title");
        let expected = match name.as_str() {
            // cancel: true stops a running task; the project's store and sources only.
            "load" => hints(false, true, true, false),
            // A subagent or a pipeline: the provider, commands, the project's files.
            "delegate" | "spawn_agent" | "run_pipeline" => hints(false, true, false, true),
            other => panic!("an unexpected tool {other}"),
        };
        assert_eq!(annotations, expected, "{name}");
        seen.push(name);
    }
    assert_eq!(seen, ["load", "delegate", "spawn_agent", "run_pipeline"]);
    drop(client);

    // Inside a subagent, load alone, with the same hints.
    let mut nested = Client::start(&test.env("SUMMON_SUBAGENT", "1"));
    let only = annotations(&mut nested);
    assert_eq!(only.len(), 1);
    assert_eq!(only[0].1["readOnlyHint"], json!(false));
    assert_eq!(only[0].1["destructiveHint"], json!(true));
}

/// A host that gives a call a few seconds (`--call-wait 1`): a `delegate` still running
/// then answers with its task, which goes on and is collected with `load`, each `load`
/// answering in time too; the model's request is still unanswered when each call answers.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_longer_than_the_host_waits_goes_on_as_a_task_the_host_collects() {
    let server = MockServer::start(
        MockConfig::new()
            .replies([Reply::text("the long answer").delayed(std::time::Duration::from_secs(6))]),
    )
    .await;
    let test = project(&server);
    let mut client = Client::start_with(&test, &["--call-wait", "1"]);
    let response = client.request(
        "tools/call",
        json!({"name": "delegate", "arguments": {"instructions": "Take long."}}),
    );
    let result = &response["result"];
    let text = result["content"][0]["text"].as_str().unwrap();
    assert_eq!(
        server.in_flight(),
        1,
        "the call answered before the task's end: {text}"
    );
    assert_ne!(result["isError"], json!(true), "{text}");
    let id = result["structuredContent"]["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(result["_meta"]["summon/task_id"], json!(id));
    assert!(
        text.starts_with(&format!(
            "Task {id} (\"Take long.\") is still running after "
        )) && text
            .contains("longer than this host waits for a call, so it goes on in the background.")
            && text.ends_with(&format!(
                "When you need the result, use load(source: \"{id}\")."
            )),
        "{text}"
    );
    // Each load answers within the call's time until the answer is there.
    let mut still = 0;
    let text = loop {
        let (text, is_error) = client.call("load", json!({"source": id}));
        assert!(!is_error, "{text}");
        if !text.starts_with(&format!("Task {id} is still running")) {
            break text;
        }
        assert!(
            text.contains(&format!("Call load(source: \"{id}\") again")),
            "{text}"
        );
        still += 1;
        assert!(still < 60, "the task never ended");
    };
    assert!(still >= 1, "the first load came after the answer");
    assert!(text.contains("the long answer"), "{text}");
    let tasks = crate::mcp_server::tasks_json(&test);
    let task = tasks.iter().find(|t| t["id"] == json!(id)).unwrap();
    assert_eq!(task["status"], "completed");
}

/// Without a flag, the first `load` of a running task answers before the shortest default
/// of a host (the OpenAI Agents SDK gives a call 5 s), saying to call again.
#[tokio::test(flavor = "multi_thread")]
async fn the_first_load_of_a_running_task_answers_before_a_five_second_host_gives_up() {
    let server = MockServer::start(
        MockConfig::new()
            .replies([Reply::text("late").delayed(std::time::Duration::from_secs(30))]),
    )
    .await;
    let test = project(&server);
    let mut client = Client::start(&test);
    let (text, _) = client.call(
        "delegate",
        json!({"instructions": "Take long.", "async": true}),
    );
    let id = text
        .strip_prefix("Task started in background: ")
        .and_then(|t| t.split_whitespace().next())
        .unwrap()
        .to_owned();
    let asked = std::time::Instant::now();
    let (text, is_error) = client.call("load", json!({"source": id}));
    let answered = asked.elapsed();
    assert!(!is_error, "{text}");
    assert!(
        text.starts_with(&format!("Task {id} is still running")),
        "{text}"
    );
    assert!(
        answered < std::time::Duration::from_secs(5),
        "{answered:?}: {text}"
    );
    assert_eq!(server.in_flight(), 1);
    let (text, _) = client.call("load", json!({"source": id, "cancel": true}));
    assert!(text.contains("cancelled"), "{text}");
}

/// The catalog goes in `spawn_agent`'s description (hosts such as the Agents SDK never show
/// the model a server's instructions), bounded: 302 roles, one with a 20,000-character
/// description, give at most 100 entries of at most 500 characters of description in
/// 12,000 bytes, and say how many are left out.
#[tokio::test(flavor = "multi_thread")]
async fn the_catalog_is_in_spawn_agents_description_and_bounded() {
    let server = MockServer::start(MockConfig::new()).await;
    let mut test = project(&server).write(
        ".agents/agents/aaa-long.md",
        &format!(
            "---\nname: aaa-long\ndescription: {}\n---\nLong.\n",
            "word ".repeat(4000).trim()
        ),
    );
    for n in 0..300 {
        test = test.write(
            &format!(".agents/agents/role-{n:03}.md"),
            &format!("---\nname: role-{n:03}\ndescription: Role number {n}.\n---\nRole {n}.\n"),
        );
    }
    let mut client = Client::start(&test);
    let tools = client.request("tools/list", json!({}));
    let spawn = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "spawn_agent")
        .unwrap()["description"]
        .as_str()
        .unwrap()
        .to_owned();
    let block = spawn.split_once("\n\n").map(|(_, b)| b).unwrap();
    assert!(
        block.starts_with("Available project subagents (fixed for this session):\n"),
        "{block}"
    );
    assert!(
        client.instructions.ends_with(block),
        "the same catalog in the instructions"
    );
    let json_line = block.lines().nth(1).unwrap();
    let catalog: Value = serde_json::from_str(json_line).unwrap();
    let entries = catalog["entries"].as_array().unwrap();
    assert!(entries.len() <= 100, "{}", entries.len());
    let entries_bytes: usize = entries.iter().map(|e| e.to_string().len() + 1).sum();
    assert!(entries_bytes <= 12_000, "{entries_bytes}");
    let long = entries.iter().find(|e| e["name"] == "aaa-long").unwrap();
    let description = long["description"].as_str().unwrap();
    assert_eq!(
        description.chars().count(),
        501,
        "500 characters and the ellipsis"
    );
    assert!(description.ends_with('…'));
    let left_out = 302 - entries.len();
    assert!(
        block.ends_with(&format!(
            "\n{left_out} more roles are left out of this list, which holds at most 100 roles and 12000 bytes (each description cut at 500 characters); load() lists them, and spawn_agent takes their names too."
        )),
        "{block}"
    );
    // A role left out of the list is still a name spawn_agent takes; a wrong name lists
    // the names, bounded too.
    let (text, is_error) = client.call(
        "spawn_agent",
        json!({"tasks": [{"agent": "nobody", "task": "x"}]}),
    );
    assert!(is_error);
    assert!(
        text.starts_with("Subagent \"nobody\" is not in this session's catalog. Use a name from it, or null for a general subagent. The names: aaa-long, explorer, role-000, ")
            && text.ends_with(", and 202 more (load() lists them)."),
        "{text}"
    );
}

/// The OpenAI Agents SDK (PyPI `openai-agents`), installed by .ci/run under
/// target/mcp-clients/agents-py.
fn agents_sdk() -> std::path::PathBuf {
    support::target_dir().join("mcp-clients/agents-py")
}

/// A real host on its defaults: the OpenAI Agents SDK starts `summon mcp` as docs/mcp.md's
/// snippet says, with its bare environment (the key comes from the credentials file) and 5 s
/// per call; it connects, lists, lets its model call spawn_agent (the catalog in the tool's
/// description), calls every tool, a call longer than it waits, a cancel, and stops, leaving
/// no task running.
#[test]
#[ignore = "needs the OpenAI Agents SDK from PyPI (target/mcp-clients/agents-py, installed by .ci/run)"]
fn the_openai_agents_sdk_uses_every_tool_on_its_defaults() {
    let sdk = agents_sdk();
    assert!(
        sdk.join("agents").is_dir(),
        "the OpenAI Agents SDK is not installed at {}: run .ci/run",
        sdk.display()
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime.block_on(MockServer::start(MockConfig::new().rule(|request| {
        let body = request.body.to_string();
        let host = request.tool_names().iter().any(|t| t == "spawn_agent");
        let asked = request.last_user_text().unwrap_or_default();
        if host {
            if body.contains("Subagent results:") {
                Reply::text("HOST-FINAL: the explorer says port 8080")
            } else {
                Reply::tool_call(
                    "spawn_agent",
                    json!({"tasks": [{"agent": "explorer", "task": "Find the port."}]}),
                )
            }
        } else if asked.contains("Take long.") {
            Reply::text("LONG-ANSWER").delayed(std::time::Duration::from_secs(10))
        } else if asked.contains("Hang.") {
            Reply::text("never").delayed(std::time::Duration::from_secs(120))
        } else {
            Reply::text("SUB-ANSWER: port 8080")
        }
    })));
    let test = bare(&server, 0o600)
        .write(".agents/agents/explorer.md", crate::mcp_server::EXPLORER)
        .write("notes.md", "three notes\n")
        .write(
            "pipe.yaml",
            "version: 1\nname: one\nsteps:\n  - id: only\n    delegate:\n      instructions: say it\n",
        );
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_summon"))
        .parent()
        .unwrap()
        .to_owned();
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/mcp.md");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/mcp_client/agents_sdk_host.py");
    let output = std::process::Command::new("python3")
        .arg(script)
        .arg(docs)
        .arg(server.url_openai())
        .current_dir(test.path())
        .env_clear()
        .env("HOME", test.path())
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin_dir.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("PYTHONPATH", &sdk)
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the host failed:\n{stdout}\n{stderr}"
    );
    let steps: std::collections::HashMap<String, Value> = stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| (v["step"].as_str().unwrap().to_owned(), v))
        .collect();
    let list = &steps["list"];
    assert_eq!(
        list["names"],
        json!(["load", "delegate", "spawn_agent", "run_pipeline"])
    );
    assert_eq!(
        list["annotations"]["delegate"]["destructiveHint"],
        json!(true),
        "{list}"
    );
    assert_eq!(
        list["annotations"]["load"]["openWorldHint"],
        json!(false),
        "{list}"
    );
    assert!(
        list["spawn_description"].as_str().unwrap().contains("{\"name\":\"explorer\",\"description\":\"Reads project files and reports with paths.\",\"tools\":[\"read_file\"]}"),
        "{list}"
    );
    assert_eq!(
        steps["model"]["final"],
        "HOST-FINAL: the explorer says port 8080"
    );
    // The model of the host got the catalog through the tool's description.
    let host_request = server
        .requests()
        .into_iter()
        .find(|r| r.tool_names().iter().any(|t| t == "spawn_agent"))
        .unwrap();
    assert!(
        host_request
            .body
            .to_string()
            .contains("Available project subagents (fixed for this session)")
    );
    let text = |name: &str| steps[name]["text"].as_str().unwrap().to_owned();
    assert!(text("load").contains("explorer"), "{}", text("load"));
    assert!(
        text("delegate").contains("SUB-ANSWER: port 8080"),
        "{}",
        text("delegate")
    );
    assert_eq!(steps["delegate"]["error"], json!(false));
    assert!(
        text("spawn_agent")
            .starts_with("Subagent results: 1 tasks, 1 completed, 0 failed, 0 cancelled."),
        "{}",
        text("spawn_agent")
    );
    // The host's bare environment does not trust the project: the pipeline is refused.
    assert!(
        text("run_pipeline")
            .starts_with("run_pipeline: pipe.yaml is not run: this project is not trusted."),
        "{}",
        text("run_pipeline")
    );
    let long = &steps["long"];
    let id = long["task"].as_str().unwrap();
    assert!(
        text("long")
            .contains("longer than this host waits for a call, so it goes on in the background."),
        "{long}"
    );
    assert!(
        steps["collected"]["loads"].as_u64().unwrap() >= 2,
        "{}",
        steps["collected"]
    );
    assert!(
        text("collected").contains("LONG-ANSWER"),
        "{}",
        text("collected")
    );
    assert!(text("cancel").contains("cancelled"), "{}", text("cancel"));
    assert!(steps.contains_key("stopped"));
    // Nothing of it is left running, and the key never went through the host.
    let tasks = crate::mcp_server::tasks_json(&test);
    assert!(
        tasks
            .iter()
            .any(|t| t["id"] == json!(id) && t["status"] == "completed")
    );
    let running: Vec<&Value> = tasks
        .iter()
        .filter(|t| !["completed", "failed", "cancelled"].contains(&t["status"].as_str().unwrap()))
        .collect();
    assert!(running.is_empty(), "{running:?}");
}

/// A role whose `tools` lists `spawn_agent` or `run_pipeline` is skipped when the catalog is
/// read, as one listing `delegate`, `Task` or `Agent` is: a subagent cannot delegate.
#[tokio::test(flavor = "multi_thread")]
async fn a_role_listing_spawn_agent_or_run_pipeline_is_skipped() {
    let server = MockServer::start(MockConfig::new()).await;
    let test = project(&server)
        .write(
            ".agents/agents/boss.md",
            "---\nname: boss\ndescription: Spawns more.\ntools: [read_file, spawn_agent]\n---\nBoss.\n",
        )
        .write(
            ".agents/agents/runner.md",
            "---\nname: runner\ndescription: Runs pipelines.\ntools: [run_pipeline]\n---\nRunner.\n",
        );
    let mut client = Client::start(&test);
    assert!(
        client.instructions.contains("\"name\":\"explorer\""),
        "{}",
        client.instructions
    );
    assert!(
        !client.instructions.contains("\"name\":\"boss\""),
        "{}",
        client.instructions
    );
    assert!(
        !client.instructions.contains("\"name\":\"runner\""),
        "{}",
        client.instructions
    );
    let (text, is_error) = client.call(
        "spawn_agent",
        json!({"tasks": [{"agent": "boss", "task": "x"}]}),
    );
    assert!(
        is_error && text.contains("Subagent \"boss\" is not in this session's catalog."),
        "{text}"
    );
    let out = test
        .command()
        .args(["validate", ".agents/agents"])
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("agent `boss` lists the delegation tool `spawn_agent`, which a project role in .agents/agents/ may not use; the definition is skipped")
            && said.contains("agent `runner` lists the delegation tool `run_pipeline`"),
        "{said}"
    );
}

/// A role's listed tools that are not available are left out, and its block of the
/// `spawn_agent` result says so in the seed's words, as every other output does.
#[tokio::test(flavor = "multi_thread")]
async fn spawn_agent_says_which_listed_tools_were_left_out() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("looked"))).await;
    let test = project(&server).write(
        ".agents/agents/reader.md",
        "---\nname: reader\ndescription: Reads and searches docs.\ntools: [read_file, docs__search]\n---\nRead.\n",
    );
    let mut client = Client::start(&test);
    let (text, is_error) = client.call(
        "spawn_agent",
        json!({"tasks": [{"agent": "reader", "task": "Look."}]}),
    );
    assert!(!is_error, "{text}");
    let block = text
        .split_once("\n[1/1 reader] completed · task ")
        .map(|(_, b)| b)
        .unwrap_or_else(|| panic!("{text}"));
    let lines: Vec<&str> = block.lines().collect();
    assert_eq!(
        lines[1], "Listed tools not available, left out: docs__search",
        "{text}"
    );
    assert_eq!(lines[2], "looked", "{text}");
}

/// A session scans the sources again once its last scan is older than a minute
/// (`SUMMON_MCP_SOURCES_SECS`, here 0): a recipe written during the session is found, while
/// the roles stay the ones the session started with.
#[tokio::test(flavor = "multi_thread")]
async fn sources_are_scanned_again_while_the_roles_stay_frozen() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ran"))).await;
    let recipe = "title: Late\ndescription: written during the session\nprompt: Say it.\n";
    let role = "---\nname: latecomer\ndescription: Came late.\n---\nLate.\n";

    // Within the minute, the first scan holds.
    let test = project(&server);
    let mut client = Client::start(&test);
    let (text, _) = client.call("load", json!({}));
    assert!(!text.contains("late -"), "{text}");
    std::fs::write(test.path().join("late.yaml"), recipe).unwrap();
    let (text, is_error) = client.call("load", json!({"source": "late"}));
    assert!(
        is_error && text.starts_with("Source 'late' not found"),
        "{text}"
    );
    drop(client);

    let test = project(&server).env("SUMMON_MCP_SOURCES_SECS", "0");
    let mut client = Client::start(&test);
    std::fs::write(test.path().join("late.yaml"), recipe).unwrap();
    std::fs::create_dir_all(test.path().join(".agents/agents")).unwrap();
    std::fs::write(test.path().join(".agents/agents/latecomer.md"), role).unwrap();
    let (text, is_error) = client.call("load", json!({"source": "late"}));
    assert!(
        !is_error && text.starts_with("# Loaded: late (recipe)"),
        "{text}"
    );
    let (text, is_error) = client.call("delegate", json!({"source": "late"}));
    assert!(!is_error && text.contains("ran"), "{text}");
    let (text, _) = client.call("load", json!({}));
    assert!(text.contains("late - written during the session"), "{text}");
    assert!(
        !text.contains("latecomer"),
        "a role written during the session: {text}"
    );
    let (text, is_error) = client.call(
        "spawn_agent",
        json!({"tasks": [{"agent": "latecomer", "task": "x"}]}),
    );
    assert!(
        is_error && text.starts_with("Subagent \"latecomer\" is not in this session's catalog."),
        "{text}"
    );
}

/// A `spawn_agent` task object that writes a key twice is refused, as the seed refuses it
/// (a JSON parser would keep the last value), and nothing starts.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_with_a_key_written_twice_is_refused() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ran"))).await;
    let test = project(&server);
    let mut client = Client::start(&test);
    let response = client.send_raw(
        r#"{"jsonrpc":"2.0","id":900,"method":"tools/call","params":{"name":"spawn_agent","arguments":{"tasks":[{"agent":null,"task":"x"},{"agent":"explorer","task":"y","agent":null}]}}}"#,
        900,
    );
    let result = &response["result"];
    assert_eq!(result["isError"], json!(true), "{response}");
    assert_eq!(
        result["content"][0]["text"],
        "spawn_agent: `tasks[1]` has the key `agent` twice; write each key once"
    );
    assert_eq!(support::chat_count(&server), 0);
    // The same call written once runs.
    let response = client.send_raw(
        r#"{"jsonrpc":"2.0","id":901,"method":"tools/call","params":{"name":"spawn_agent","arguments":{"tasks":[{"agent":null,"task":"x"}]}}}"#,
        901,
    );
    assert_ne!(response["result"]["isError"], json!(true), "{response}");
    assert!(crate::mcp_server::tasks_json(&test).len() == 1);
}

/// `load()` lists as awaiting retrieval only the results the session has not had: a
/// foreground delegation's answer came back with its call, an async one's did not.
#[tokio::test(flavor = "multi_thread")]
async fn load_lists_only_the_results_the_host_has_not_had() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("done"))).await;
    let test = project(&server);
    let mut client = Client::start(&test);
    let (text, is_error) = client.call("delegate", json!({"instructions": "In the foreground."}));
    assert!(!is_error && text.contains("done"), "{text}");
    let (text, _) = client.call(
        "delegate",
        json!({"instructions": "In the background.", "async": true}),
    );
    let id = text
        .strip_prefix("Task started in background: ")
        .and_then(|t| t.split_whitespace().next())
        .unwrap()
        .to_owned();
    support::wait_for(
        std::time::Duration::from_secs(30),
        "the async task to end",
        || {
            crate::mcp_server::tasks_json(&test)
                .iter()
                .any(|t| t["id"] == json!(id) && t["status"] == "completed")
        },
    );
    let (text, _) = client.call("load", json!({}));
    let awaiting = text
        .split_once("Completed tasks awaiting retrieval:\n")
        .map(|(_, rest)| rest.split("\n\n").next().unwrap_or(""))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(awaiting.contains(&id), "{text}");
    assert!(!awaiting.contains("In the foreground."), "{text}");
    assert_eq!(awaiting.lines().count(), 1, "{text}");
}

/// `run_pipeline` without `out` reports the run's output tokens too (they were read from
/// the report alone, which is written only with `out`).
#[tokio::test(flavor = "multi_thread")]
async fn run_pipeline_without_out_reports_its_output_tokens() {
    let server =
        MockServer::start(MockConfig::new().default_reply(Reply::text("the pipeline said this")))
            .await;
    let test = project(&server).write(
        "pipe.yaml",
        "version: 1\nname: one\nsteps:\n  - id: only\n    delegate:\n      instructions: say it\n",
    );
    let mut client = Client::start_with(&test, &["--trust"]);
    let (text, is_error) = client.call("run_pipeline", json!({"path": "pipe.yaml"}));
    assert!(!is_error, "{text}");
    let tokens = text
        .lines()
        .find_map(|l| l.strip_prefix("Tokens: "))
        .unwrap_or_else(|| panic!("{text}"));
    let words: Vec<&str> = tokens.split_whitespace().collect();
    let output: u64 = words[2].parse().unwrap();
    assert!(output > 0, "{text}");
    // The same count as the run's own report gives with `out`.
    let (with_out, _) = client.call("run_pipeline", json!({"path": "pipe.yaml", "out": "out"}));
    let again = with_out
        .lines()
        .find_map(|l| l.strip_prefix("Tokens: "))
        .unwrap_or_else(|| panic!("{with_out}"));
    assert_eq!(
        again.split_whitespace().nth(2),
        Some(words[2]),
        "{with_out}"
    );
}
