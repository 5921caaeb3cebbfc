//! MCP servers under real conditions: answers too large for the transport, servers that die
//! or are refused, signals that stop summon mid-call, and what the client tells servers and
//! the model. The servers are `server-filesystem` from npm and small scripted ones
//! (tests/fixtures/mcp/conditions.py, stdio); the model is the mock server.

use crate::support;

use std::path::{Path, PathBuf};

use std::time::Duration;

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::mcp::{alive, filesystem_server, fixture, still_alive, tool_results};
use support::{Test, unindent};

const KEY: &str = "sk-test-mcp-conditions-0123456789";
const MIB: u64 = 1024 * 1024;

fn openai(server: &MockServer) -> Test {
    Test::new()
        .env("SUMMON_TRUST_PROJECT", "1")
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
}

/// A recipe whose only extension is the scripted server `c`, with a call timeout of
/// `timeout` seconds.
fn recipe(timeout: u32) -> String {
    unindent(&format!(
        "
        title: Conditions
        description: uses a scripted MCP server
        prompt: Use the tools.
        extensions:
          - type: stdio
            name: c
            cmd: python3
            args: ['{}']
            timeout: {timeout}
        ",
        fixture("conditions.py")
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_over_16_mib_reaches_the_model_cut_to_size() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("c__big", json!({"size": 17 * MIB})),
        Reply::text("read it"),
    ]))
    .await;
    let out = openai(&server)
        .write("recipes/c.yaml", &recipe(60))
        .args(["delegate", "--source", "c"])
        .run();
    assert_eq!(out.stdout, "read it\n", "{}", out.stderr);
    let result = &tool_results(&server.requests()[1])[0];
    assert!(result.starts_with("BEGINxxx"), "{}", &result[..100]);
    assert!(
        result.ends_with("\n[output truncated: showed the first 100 KiB of 17 MiB]"),
        "{}",
        &result[result.len() - 200..]
    );
    assert!(result.len() < 101 * 1024);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_too_large_to_read_fails_its_call_at_once() {
    // The timeout is long: the call must end because the answer was dropped, not because
    // the wait ran out. The server stays usable for the next call.
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("c__big", json!({"size": 70 * MIB})),
        Reply::tool_call("c__big", json!({"size": 20})),
        Reply::text("carried on"),
    ]))
    .await;
    let out = openai(&server)
        .write("recipes/c.yaml", &recipe(60))
        .args(["delegate", "--source", "c"])
        .run();
    assert_eq!(out.stdout, "carried on\n", "{}", out.stderr);
    let requests = server.requests();
    let first = &tool_results(&requests[1])[0];
    assert_eq!(
        first,
        "Error: extension `c`: its answer is larger than 64 MiB, the most summon reads in one \
         message, and was dropped"
    );
    let second = &tool_results(&requests[2])[1];
    assert_eq!(second, &format!("BEGIN{}", "x".repeat(15)));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_10_mb_file_through_the_filesystem_server_is_shown_in_part() {
    let bin = filesystem_server();
    let test = Test::new().env("SUMMON_TRUST_PROJECT", "1");
    let file = test.path().canonicalize().unwrap().join("big.txt");
    let line = "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456\n";
    let mut text = line.repeat(10_000_000 / line.len() + 1);
    text.truncate(10_000_000);
    std::fs::write(&file, &text).unwrap();
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call(
            "fs__read_text_file",
            json!({"path": file.display().to_string()}),
        ),
        Reply::text("read the file"),
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
                description: reads files through an MCP server
                prompt: Read big.txt.
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
    assert_eq!(out.stdout, "read the file\n", "{}", out.stderr);
    let result = &tool_results(&server.requests()[1])[0];
    assert!(result.starts_with(line), "{}", &result[..200]);
    assert!(
        result.ends_with("[output truncated: showed the first 100 KiB of 9.5 MiB]"),
        "{}",
        &result[result.len() - 200..]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn results_say_sizes_in_bytes_and_empty_errors_in_words() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_calls([
            ("c__image", json!({"size": 3000})),
            ("c__empty_error", json!({})),
        ]),
        Reply::text("done"),
    ]))
    .await;
    let out = openai(&server)
        .write("recipes/c.yaml", &recipe(60))
        .args(["delegate", "--source", "c"])
        .run();
    assert_eq!(out.stdout, "done\n", "{}", out.stderr);
    let requests = server.requests();
    assert_eq!(
        tool_results(&requests[1]),
        [
            "[image: image/png, 3000 bytes]",
            "Error: the tool reported an error with no message"
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_client_introduces_itself_as_summon() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("c__whoami", json!({})),
        Reply::text("done"),
    ]))
    .await;
    let out = openai(&server)
        .write("recipes/c.yaml", &recipe(60))
        .args(["delegate", "--source", "c"])
        .run();
    assert_eq!(out.stdout, "done\n", "{}", out.stderr);
    let info: Value = serde_json::from_str(&tool_results(&server.requests()[1])[0]).unwrap();
    assert_eq!(info["name"], "summon");
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
}

#[tokio::test(flavor = "multi_thread")]
async fn progress_notifications_extend_a_call_past_its_timeout() {
    // The call takes 5 s with a 2 s timeout, but reports progress every 0.2 s.
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("c__slow", json!({"seconds": 5})),
        Reply::text("waited"),
    ]))
    .await;
    let out = openai(&server)
        .write("recipes/c.yaml", &recipe(2))
        .args(["delegate", "--source", "c"])
        .run();
    assert_eq!(out.stdout, "waited\n", "{}", out.stderr);
    assert_eq!(tool_results(&server.requests()[1]), ["finished"]);
    assert!(!out.stderr.contains("failed"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn tools_that_run_only_as_tasks_are_not_offered() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let out = openai(&server)
        .write("recipes/c.yaml", &recipe(60))
        .args(["delegate", "--source", "c"])
        .run();
    let offered = server.requests()[0].tool_names();
    assert!(offered.contains(&"c__whoami".to_owned()), "{offered:?}");
    assert!(!offered.contains(&"c__only_task".to_owned()), "{offered:?}");
    assert!(
        out.stderr.contains(
            "extension `c`: tool `only_task` runs only as a task (execution.taskSupport: \
             required), which summon does not support; it is left out"
        ),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_tools_of_a_failed_server_are_not_offered_again() {
    // `hang` outlives its 2 s timeout: the server is stopped, and the next request offers
    // none of its tools (the built-in ones stay).
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("c__hang", json!({})),
        Reply::text("without it"),
    ]))
    .await;
    let out = openai(&server)
        .write("recipes/c.yaml", &recipe(2))
        .args(["delegate", "--source", "c"])
        .run();
    assert_eq!(out.stdout, "without it\n", "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "extension `c` failed: it did not answer within 2s; its tools are no longer offered"
        ),
        "{}",
        out.stderr
    );
    let requests = server.requests();
    let before = requests[0].tool_names();
    assert!(before.contains(&"c__hang".to_owned()), "{before:?}");
    let after = requests[1].tool_names();
    assert!(after.iter().all(|t| !t.starts_with("c__")), "{after:?}");
    assert!(after.contains(&"read_file".to_owned()), "{after:?}");
}

/// A free local port (nothing listens on it once this returns).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The scripted streamable HTTP server, listening once this returns; killed when dropped.
struct HttpServer {
    child: std::process::Child,
    port: u16,
}

impl HttpServer {
    fn start() -> Self {
        Self::start_with(&[])
    }

    /// With `["sse"]`, the server answers with event streams.
    fn start_with(options: &[&str]) -> Self {
        use std::io::BufRead;
        let port = free_port();
        let mut child = std::process::Command::new("python3")
            .arg(fixture("http_conditions.py"))
            .arg(port.to_string())
            .args(options)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "the HTTP server did not start");
        Self { child, port }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_recipe(uri: &str) -> String {
    unindent(&format!(
        "
        title: Web
        description: uses an MCP server over HTTP
        prompt: Use the tools.
        extensions:
          - type: streamable_http
            name: web
            uri: {uri}
            timeout: 60
        "
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http_server_that_dies_mid_call_fails_the_call_at_once() {
    for tool in ["die_midway", "die"] {
        let web = HttpServer::start();
        let url = web.url("/mcp");
        let server = MockServer::start(MockConfig::new().replies([
            Reply::tool_call("web__echo", json!({"text": "alive"})),
            Reply::tool_call(format!("web__{tool}"), json!({})),
            Reply::text("the server is gone"),
        ]))
        .await;
        let out = openai(&server)
            .write("recipes/web.yaml", &http_recipe(&url))
            .args(["delegate", "--source", "web"])
            .run();
        assert_eq!(out.stdout, "the server is gone\n", "{tool}: {}", out.stderr);
        let requests = server.requests();
        assert_eq!(tool_results(&requests[1]), ["alive"], "{tool}");
        let result = &tool_results(&requests[2])[1];
        let expected = format!(
            "extension `web` failed: the connection to {url} closed before the answer came"
        );
        assert!(result.contains(&expected), "{tool}: {result}");
        assert!(out.stderr.contains(&expected), "{tool}: {}", out.stderr);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http_server_that_cannot_be_reached_is_named_in_plain_words() {
    let web = HttpServer::start();
    let refused = format!("http://127.0.0.1:{}/mcp", free_port());
    let missing = web.url("/missing");
    for (uri, expected) in [
        (refused.clone(), format!("connection refused to {refused}")),
        (
            missing.clone(),
            format!("HTTP 404 from {missing}: 404 Not Found - nothing lives here"),
        ),
    ] {
        let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
        let out = openai(&server)
            .write("recipes/web.yaml", &http_recipe(&uri))
            .args(["delegate", "--source", "web"])
            .run();
        assert!(
            out.stderr.contains(&format!(
                "extension `web` did not start: {expected}; its tools are left out"
            )),
            "{}",
            out.stderr
        );
        assert!(!out.stderr.contains("<html"), "{}", out.stderr);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn http_tools_that_run_only_as_tasks_are_not_offered() {
    // The answer to tools/list comes as JSON, then as an event stream with a notification
    // before it.
    for options in [&[][..], &["sse"][..]] {
        let web = HttpServer::start_with(options);
        let server = MockServer::start(MockConfig::new().replies([
            Reply::tool_call("web__echo", json!({"text": "listed"})),
            Reply::text("done"),
        ]))
        .await;
        let out = openai(&server)
            .write("recipes/web.yaml", &http_recipe(&web.url("/mcp")))
            .args(["delegate", "--source", "web"])
            .run();
        assert_eq!(out.stdout, "done\n", "{options:?}: {}", out.stderr);
        let requests = server.requests();
        let offered = requests[0].tool_names();
        assert!(
            offered.contains(&"web__echo".to_owned()),
            "{options:?}: {offered:?}"
        );
        assert!(
            !offered.contains(&"web__only_task".to_owned()),
            "{options:?}: {offered:?}"
        );
        assert_eq!(tool_results(&requests[1]), ["listed"], "{options:?}");
        assert!(
            out.stderr.contains(
                "extension `web`: tool `only_task` runs only as a task (execution.taskSupport: \
                 required), which summon does not support; it is left out"
            ),
            "{options:?}: {}",
            out.stderr
        );
    }
}

/// Waits (at most 60 s) until `path` has a line, and returns the first.
fn first_line(path: &Path) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(line) = text.lines().next() {
            return line.to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} stayed empty",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts summon with `args` on a task whose server hangs in a call and would outlive the end
/// of its input, signals summon once the call is under way, and returns summon's exit code,
/// its stderr and the server's pid.
async fn signal_mid_call(args: &[&str], signal: &str) -> (Option<i32>, String, u32) {
    let server = MockServer::start(
        MockConfig::new().replies([Reply::tool_call("c__hang", json!({})), Reply::text("never")]),
    )
    .await;
    let pid_file = tempfile::NamedTempFile::new().unwrap();
    let calls = PathBuf::from(format!("{}.calls", pid_file.path().display()));
    let test = openai(&server)
        .write("recipes/c.yaml", &recipe(600))
        .write(
            "pipelines/p.yaml",
            "
            version: 1
            name: p
            steps:
              - id: only
                delegate:
                  source: c
            ",
        )
        .env("PID_FILE", &pid_file.path().display().to_string())
        .env("LINGER", "1")
        .args(args.iter().copied());
    let child = test
        .command()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    first_line(&calls);
    let pid: u32 = first_line(pid_file.path()).parse().unwrap();
    let sent = std::process::Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let _ = std::fs::remove_file(&calls);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        pid,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn signals_to_delegate_stop_its_servers() {
    for (signal, code, line) in [
        (
            "-INT",
            Some(130),
            "summon: interrupted: stopped the MCP server",
        ),
        (
            "-TERM",
            Some(143),
            "summon: terminated (SIGTERM): stopped the MCP server",
        ),
    ] {
        let (exit, stderr, pid) = signal_mid_call(&["delegate", "--source", "c"], signal).await;
        assert_eq!(exit, code, "{signal}: {stderr}");
        assert!(stderr.contains(line), "{signal}: {stderr}");
        assert!(!still_alive(pid), "{signal}: server {pid} outlived summon");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_to_run_stops_its_servers() {
    let (exit, stderr, pid) =
        signal_mid_call(&["run", "pipelines/p.yaml", "--out", "out"], "-TERM").await;
    assert_eq!(exit, Some(143), "{stderr}");
    assert!(
        stderr.contains("summon: terminated (SIGTERM): stopped the MCP server"),
        "{stderr}"
    );
    assert!(!still_alive(pid), "server {pid} outlived summon");
}

#[tokio::test(flavor = "multi_thread")]
async fn servers_die_with_a_summon_killed_without_warning() {
    // SIGKILL leaves summon no moment to stop its servers, and `LINGER` keeps the server
    // running after its input ends: only the parent-death signal can end it.
    for args in [
        &["delegate", "--source", "c"][..],
        &["run", "pipelines/p.yaml", "--out", "out"][..],
    ] {
        let (exit, stderr, pid) = signal_mid_call(args, "-KILL").await;
        assert_eq!(exit, None, "{args:?}: {stderr}");
        assert!(!still_alive(pid), "{args:?}: server {pid} outlived summon");
    }
}

/// The parent of a process, from /proc.
fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(')').unwrap();
    rest.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Kills the scripted server's own process when the test ends, however it ends, if it is
/// still that process (its command line names the fixture's loop).
struct StrayChild(u32);

impl Drop for StrayChild {
    fn drop(&mut self) {
        let cmdline = std::fs::read_to_string(format!("/proc/{}/cmdline", self.0));
        if cmdline.is_ok_and(|c| c.contains("SIGTERM, signal.SIG_IGN")) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &self.0.to_string()])
                .status();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_background_worker_has_its_servers_stopped_by_the_next_command() {
    // The server starts a process of its own that ignores SIGTERM and the end of its input:
    // the parent-death signal ends the server with its worker, but not that one. The next
    // command that finds the worker dead stops the server's whole process group.
    let server = MockServer::start(
        MockConfig::new().replies([Reply::tool_call("c__hang", json!({})), Reply::text("never")]),
    )
    .await;
    let pid_file = tempfile::NamedTempFile::new().unwrap();
    let calls = PathBuf::from(format!("{}.calls", pid_file.path().display()));
    let child_file = PathBuf::from(format!("{}.child", pid_file.path().display()));
    let test = openai(&server)
        .write("recipes/c.yaml", &recipe(600))
        .env("PID_FILE", &pid_file.path().display().to_string())
        .env("LINGER", "1")
        .env("CHILD", "1");
    let started = test
        .command()
        .args(["delegate", "--async", "--json", "--source", "c"])
        .output()
        .unwrap();
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );
    let answer: Value = serde_json::from_slice(&started.stdout).unwrap();
    let id = answer["task_id"].as_str().unwrap().to_owned();
    first_line(&calls);
    let server_pid: u32 = first_line(pid_file.path()).parse().unwrap();
    let child_pid: u32 = first_line(&child_file).parse().unwrap();
    let _stray = StrayChild(child_pid);
    let worker = parent_of(server_pid);
    let cmdline = std::fs::read_to_string(format!("/proc/{worker}/cmdline")).unwrap();
    assert!(cmdline.contains("__worker"), "{cmdline:?}");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &worker.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(!still_alive(worker), "the worker {worker} survived SIGKILL");
    assert!(
        !still_alive(server_pid),
        "server {server_pid} outlived its worker"
    );
    assert!(
        alive(child_pid),
        "the server's own process ended before any command ran"
    );
    let tasks = test.command().args(["tasks"]).output().unwrap();
    let _ = std::fs::remove_file(&calls);
    let _ = std::fs::remove_file(&child_file);
    let listed = String::from_utf8_lossy(&tasks.stdout);
    assert!(
        listed.contains(&id) && listed.contains("failed"),
        "{listed}\n{}",
        String::from_utf8_lossy(&tasks.stderr)
    );
    assert!(
        !still_alive(child_pid),
        "the server's process {child_pid} outlived the command that found its worker dead"
    );
}
