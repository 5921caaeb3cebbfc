//! Recipe `extensions` as MCP servers, end to end: real third-party servers
//! (`@modelcontextprotocol/server-filesystem` from npm, `mcp-server-time` from PyPI) and a
//! small misbehaving server (tests/fixtures/mcp/misbehaving.py) for crashes, hangs and
//! processes that will not stop. The model is the mock server, scripted to call the tools.

use crate::support;

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::mcp::{filesystem_server, fixture, python_packages, still_alive, tool_results};
use support::{Test, unindent};

const KEY: &str = "sk-test-mcp-0123456789SECRET";

fn openai(server: &MockServer) -> Test {
    Test::new()
        .env("SUMMON_TRUST_PROJECT", "1")
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
}

/// A recipe whose only extension is the misbehaving server in `mode`.
fn misbehaving_recipe(mode: &str, timeout: u32, extra: &str) -> String {
    unindent(&format!(
        "
        title: Tools
        description: uses an MCP server
        prompt: Use the tools.
        extensions:
          - type: stdio
            name: bad
            cmd: python3
            args: ['{}', '{mode}']
            timeout: {timeout}
        ",
        fixture("misbehaving.py")
    )) + extra
}

/// The pids a misbehaving server wrote to its PID_FILE.
fn pids(path: &Path) -> Vec<u32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_filesystem_server_from_npm_writes_the_file() {
    let bin = filesystem_server();
    let test = Test::new().env("SUMMON_TRUST_PROJECT", "1");
    let target = test.path().canonicalize().unwrap().join("notes/hello.txt");
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call(
            "fs__write_file",
            json!({"path": target.display().to_string(), "content": "written through MCP\n"}),
        ),
        Reply::text("The file is written."),
    ]))
    .await;
    let out = test
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .write(
            "recipes/files.yaml",
            &format!(
                "
                title: Files
                description: writes files through an MCP server
                prompt: Write notes/hello.txt.
                extensions:
                  - type: stdio
                    name: fs
                    cmd: {}
                    args: ['.']
                    timeout: 60
                ",
                bin.display()
            ),
        )
        .args(["delegate", "--source", "files"])
        .run();
    assert_eq!(out.stdout, "The file is written.\n", "{}", out.stderr);
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "written through MCP\n"
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let tools = requests[0].tool_names();
    for name in ["read_file", "fs__write_file", "fs__list_directory"] {
        assert!(tools.contains(&name.to_owned()), "{name} not in {tools:?}");
    }
    let system = requests[0].body["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(system.contains("fs__write_file"), "{system}");
    let results = tool_results(&requests[1]);
    assert_eq!(results.len(), 1);
    assert!(results[0].contains("hello.txt"), "{results:?}");
    assert!(
        out.stderr.contains("fs__write_file: completed"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_time_server_from_pypi_answers() {
    let packages = python_packages();
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("clock__get_current_time", json!({"timezone": "Asia/Tokyo"})),
        Reply::text("It is late in Tokyo."),
    ]))
    .await;
    let out = openai(&server)
        .write(
            "recipes/clock.yaml",
            &format!(
                "
                title: Clock
                description: tells the time
                prompt: What time is it in Tokyo?
                extensions:
                  - type: stdio
                    name: clock
                    cmd: python3
                    args: ['-m', 'mcp_server_time', '--local-timezone', 'UTC']
                    envs:
                      PYTHONPATH: {}
                    timeout: 60
                ",
                packages.display()
            ),
        )
        .args(["delegate", "--source", "clock"])
        .run();
    assert_eq!(out.stdout, "It is late in Tokyo.\n", "{}", out.stderr);
    let requests = server.requests();
    assert!(
        requests[0]
            .tool_names()
            .contains(&"clock__get_current_time".to_owned())
    );
    let result: Value = serde_json::from_str(&tool_results(&requests[1])[0]).unwrap();
    assert_eq!(result["timezone"], "Asia/Tokyo");
    assert!(result["datetime"].as_str().unwrap().ends_with("+09:00"));
}

#[tokio::test(flavor = "multi_thread")]
async fn available_tools_and_the_extensions_flag_filter() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let recipe = misbehaving_recipe("ok", 30, "    available_tools: [echo, missing]\n");
    let test = openai(&server).write("recipes/tools.yaml", &recipe);
    let out = test.args(["delegate", "--source", "tools"]).run();
    let offered = server.requests()[0].tool_names();
    assert!(offered.contains(&"bad__echo".to_owned()), "{offered:?}");
    assert!(!offered.contains(&"bad__env".to_owned()), "{offered:?}");
    assert!(
        out.stderr
            .contains("extension `bad` has no tool `missing` (listed in its available_tools)"),
        "{}",
        out.stderr
    );

    // `--extensions` with no value: no extension at all.
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let pid_file = tempfile::NamedTempFile::new().unwrap();
    let out = openai(&server)
        .write("recipes/tools.yaml", &recipe)
        .env("PID_FILE", &pid_file.path().display().to_string())
        .args(["delegate", "--source", "tools", "--extensions", ""])
        .run();
    assert!(
        !server.requests()[0]
            .tool_names()
            .iter()
            .any(|t| t.starts_with("bad__")),
        "{}",
        out.stderr
    );
    assert!(pids(pid_file.path()).is_empty(), "the server was started");

    // Unknown names warn; known ones are kept.
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let out = openai(&server)
        .write("recipes/tools.yaml", &recipe)
        .args(["delegate", "--source", "tools", "--extensions", "bad,nope"])
        .run();
    assert!(
        out.stderr
            .contains("unknown extension `nope` ignored; this source has: bad"),
        "{}",
        out.stderr
    );
    assert!(
        server.requests()[0]
            .tool_names()
            .contains(&"bad__echo".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn env_keys_are_passed_and_other_secrets_are_not() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_calls([
            ("bad__env", json!({"name": "SERVICE_TOKEN"})),
            ("bad__env", json!({"name": "OPENAI_API_KEY"})),
            ("bad__env", json!({"name": "FIXED"})),
        ]),
        Reply::text("done"),
    ]))
    .await;
    let recipe = misbehaving_recipe(
        "ok",
        30,
        "    env_keys: [SERVICE_TOKEN]\n    envs:\n      FIXED: from-recipe\n",
    );
    let _out = openai(&server)
        .write("recipes/tools.yaml", &recipe)
        .env("SERVICE_TOKEN", "tok-123")
        .args(["delegate", "--source", "tools"])
        .stdout("done\n")
        .run();
    assert_eq!(
        tool_results(&server.requests()[1]),
        ["tok-123", "unset", "from-recipe"]
    );

    // A missing env_keys variable is an input error naming it and the entry.
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("unused"))).await;
    let out = openai(&server)
        .write("recipes/tools.yaml", &recipe)
        .args(["delegate", "--source", "tools"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains("recipes/tools.yaml:6:")
            && out.stderr.contains(
                "extension `bad` needs the environment variable `SERVICE_TOKEN` (listed in its \
                 env_keys), which is not set"
            ),
        "{}",
        out.stderr
    );
    assert_eq!(server.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crashing_server_is_a_tool_error_and_a_warning() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("bad__echo", json!({"text": "hi"})),
        Reply::tool_call("bad__echo", json!({"text": "again"})),
        Reply::text("Carried on without it."),
    ]))
    .await;
    let out = openai(&server)
        .write("recipes/tools.yaml", &misbehaving_recipe("crash", 30, ""))
        .args(["delegate", "--source", "tools"])
        .stdout("Carried on without it.\n")
        .run();
    assert!(
        out.stderr
            .contains("extension `bad` failed: the server exited")
            && out.stderr.contains("boom: the server crashed"),
        "{}",
        out.stderr
    );
    let requests = server.requests();
    let first = &tool_results(&requests[1])[0];
    assert!(
        first.contains("extension `bad` failed: the server exited"),
        "{first}"
    );
    let second = &tool_results(&requests[2])[1];
    assert!(
        second.contains("extension `bad` is not available"),
        "{second}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hanging_server_is_bounded_by_its_timeout_and_killed() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("bad__echo", json!({"text": "hi"})),
        Reply::text("Gave up on it."),
    ]))
    .await;
    let pid_file = tempfile::NamedTempFile::new().unwrap();
    let out = openai(&server)
        .write("recipes/tools.yaml", &misbehaving_recipe("hang", 2, ""))
        .env("PID_FILE", &pid_file.path().display().to_string())
        .args(["delegate", "--source", "tools"])
        .stdout("Gave up on it.\n")
        .run();
    assert!(
        out.stderr
            .contains("extension `bad` failed: it did not answer within 2s"),
        "{}",
        out.stderr
    );
    let result = &tool_results(&server.requests()[1])[0];
    assert!(result.contains("did not answer within 2s"), "{result}");
    let pids = pids(pid_file.path());
    assert_eq!(pids.len(), 1);
    assert!(!still_alive(pids[0]), "the hung server still runs");
}

#[tokio::test(flavor = "multi_thread")]
async fn servers_that_do_not_start_are_left_out_with_a_warning() {
    for (mode, expected) in [
        ("exit", "cannot start: missing configuration"),
        ("silent", "no answer within 2s"),
    ] {
        let server = MockServer::start(MockConfig::new().default_reply(Reply::text("fine"))).await;
        let pid_file = tempfile::NamedTempFile::new().unwrap();
        let out = openai(&server)
            .write("recipes/tools.yaml", &misbehaving_recipe(mode, 2, ""))
            .env("PID_FILE", &pid_file.path().display().to_string())
            .args(["delegate", "--source", "tools"])
            .run();
        assert_eq!(out.stdout, "fine\n", "{mode}");
        assert!(
            out.stderr.contains("extension `bad` did not start:")
                && out.stderr.contains(expected)
                && out.stderr.contains("its tools are left out"),
            "{mode}: {}",
            out.stderr
        );
        let offered = server.requests()[0].tool_names();
        assert!(
            !offered.iter().any(|t| t.starts_with("bad__")),
            "{offered:?}"
        );
        for pid in pids(pid_file.path()) {
            assert!(!still_alive(pid), "{mode}: server {pid} still runs");
        }
    }
    // A command that does not exist.
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("fine"))).await;
    let out = openai(&server)
        .write(
            "recipes/tools.yaml",
            "title: T\ndescription: d\nprompt: p\nextensions:\n  - {type: stdio, name: gone, cmd: /nonexistent/server}\n",
        )
        .args(["delegate", "--source", "tools"])
        .run();
    assert!(
        out.stderr
            .contains("extension `gone` did not start: cannot run `/nonexistent/server`"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn no_server_process_outlives_its_task() {
    // The server ignores SIGTERM and end of input and has a child of its own.
    let server = MockServer::start(
        MockConfig::new().replies([Reply::tool_call("bad__pid", json!({})), Reply::text("done")]),
    )
    .await;
    let pid_file = tempfile::NamedTempFile::new().unwrap();
    let _out = openai(&server)
        .write(
            "recipes/tools.yaml",
            &misbehaving_recipe("stubborn", 30, ""),
        )
        .env("PID_FILE", &pid_file.path().display().to_string())
        .args(["delegate", "--source", "tools"])
        .stdout("done\n")
        .run();
    let pids = pids(pid_file.path());
    assert_eq!(pids.len(), 2, "server and its child");
    assert_eq!(tool_results(&server.requests()[1])[0], pids[0].to_string());
    for pid in &pids {
        assert!(!still_alive(*pid), "process {pid} outlived its task");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_cancelled_by_its_step_timeout_stops_its_servers() {
    // The model never answers the second request; the step's timeout cancels the task.
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("bad__pid", json!({})),
        Reply::text("late").delayed(Duration::from_secs(60)),
    ]))
    .await;
    let pid_file = tempfile::NamedTempFile::new().unwrap();
    let out = openai(&server)
        .write(
            "recipes/tools.yaml",
            &misbehaving_recipe("stubborn", 30, ""),
        )
        .write(
            "pipelines/p.yaml",
            "
            version: 1
            name: p
            steps:
              - id: only
                delegate:
                  source: tools
                timeout: 3s
            ",
        )
        .env("PID_FILE", &pid_file.path().display().to_string())
        .args(["run", "pipelines/p.yaml", "--out", "out"])
        .code(2)
        .stderr_has("timed out")
        .run();
    let pids = pids(pid_file.path());
    assert_eq!(pids.len(), 2, "{}", out.stderr);
    for pid in &pids {
        assert!(
            !still_alive(*pid),
            "process {pid} outlived its cancelled task"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn goose_builtins_other_than_developer_are_warnings() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ran"))).await;
    let out = openai(&server)
        .write(
            "recipes/b.yaml",
            "
            title: B
            description: d
            prompt: p
            extensions:
              - {type: builtin, name: developer}
              - {type: builtin, name: memory}
              - {type: platform, name: summon}
              - {type: builtin, name: computercontroller}
            ",
        )
        .args(["delegate", "--source", "b"])
        .stdout("ran\n")
        .run();
    for name in ["memory", "summon", "computercontroller"] {
        assert!(
            out.stderr.contains(&format!(
                "goose extension `{name}` has no equivalent in summon and is left out"
            )),
            "{name}: {}",
            out.stderr
        );
    }
    assert!(
        server.requests()[0]
            .tool_names()
            .contains(&"shell".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_names_mcp_tools_of_the_project_servers() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("mcp__bad__echo", json!({"text": "from the agent"})),
        Reply::text("echoed"),
    ]))
    .await;
    let out = openai(&server)
        .env("SUMMON_TRUST_PROJECT", "1")
        .write(
            ".mcp.json",
            &format!(
                r#"{{"mcpServers": {{"bad": {{"command": "python3", "args": ["{}", "ok"]}}}}}}"#,
                fixture("misbehaving.py")
            ),
        )
        .write(
            ".agents/agents/helper.md",
            "
            ---
            name: helper
            description: echoes
            tools: Read, mcp__bad__echo, mcp__other__thing
            ---
            You echo things.
            ",
        )
        .args(["delegate", "--source", "helper", "--instructions", "Echo."])
        .stdout("echoed\n")
        .run();
    assert_eq!(
        server.requests()[0].tool_names(),
        ["read_file", "load", "mcp__bad__echo"]
    );
    assert_eq!(tool_results(&server.requests()[1]), ["from the agent"]);
    assert!(
        out.stderr
            .contains("Listed tools not available, left out: mcp__other__thing"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_streamable_http_server_gets_its_headers() {
    let packages = python_packages();
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut child = std::process::Command::new("python3")
        .arg(fixture("http_server.py"))
        .arg(port.to_string())
        .env("PYTHONPATH", &packages)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The server prints `ready` on stderr once it listens.
    {
        use std::io::BufRead;
        let stderr = child.stderr.take().unwrap();
        let mut lines = std::io::BufReader::new(stderr).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("Uvicorn running") => break,
                Some(Ok(_)) => continue,
                other => panic!("the HTTP server did not start: {other:?}"),
            }
        }
        std::thread::spawn(move || for _ in lines {});
    }
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("web__shout", json!({"text": "quiet"})),
        Reply::text("shouted"),
    ]))
    .await;
    let recipe = |key: &str| {
        format!(
            "
            title: Web
            description: d
            prompt: p
            extensions:
              - type: streamable_http
                name: web
                uri: http://127.0.0.1:{port}/mcp
                headers:
                  X-Test-Key: {key}
                timeout: 30
            "
        )
    };
    let out = openai(&server)
        .write("recipes/web.yaml", &recipe("letmein"))
        .args(["delegate", "--source", "web"])
        .run();
    assert_eq!(out.stdout, "shouted\n", "{}", out.stderr);
    assert_eq!(tool_results(&server.requests()[1]), ["QUIET"]);

    // The wrong header: the server refuses, the extension is left out.
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("fine"))).await;
    let out = openai(&server)
        .write("recipes/web.yaml", &recipe("wrong"))
        .args(["delegate", "--source", "web"])
        .run();
    assert!(
        out.stderr.contains("extension `web` did not start"),
        "{}",
        out.stderr
    );
    let _ = child.kill();
    let _ = child.wait();
}
