//! The sandbox of the model's `shell` commands, on this machine's kernel: a subagent driven by
//! the mock's tool calls tries to write and connect where its policy allows and where it does
//! not. And the process groups of those commands: nothing they start outlives the call, the
//! task, a cancel or an interrupted summon.

#![cfg(target_os = "linux")]

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

const KEY: &str = "sk-test-0123456789abcdef";

/// A project wired to the mock, with HOME outside it. The subagent works in `work/`.
struct Project {
    test: Test,
    /// Kept until the test ends.
    _home: tempfile::TempDir,
}

impl Project {
    fn new(server: &MockServer) -> Self {
        let home = tempfile::tempdir().expect("home");
        let test = Test::new()
            .mkdir("work")
            .env("OPENAI_BASE_URL", &server.url_openai())
            .env("OPENAI_API_KEY", KEY)
            .env("SUMMON_MODEL", "mock-model")
            .env("HOME", home.path().to_str().expect("utf-8 home"));
        Self { test, _home: home }
    }

    fn work(&self) -> PathBuf {
        self.test.path().join("work")
    }

    /// `summon delegate` with the shell granted, in `work/`, plus `extra` flags.
    fn delegate(&self, extra: &[&str]) -> Command {
        let mut command = self.test.command();
        command
            .args([
                "delegate",
                "--instructions",
                "try things",
                "--extensions",
                "developer",
                "--working-dir",
                "work",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }
}

/// Fails the test unless this kernel can confine a command (Landlock, Linux 5.13+): the
/// sandbox tests are the product's promise and never pass without having run.
fn require_landlock() {
    let status = Command::new(env!("CARGO_BIN_EXE_summon"))
        .args(["__sandbox", "--policy", "read-only", "--", "true"])
        .stderr(Stdio::piped())
        .output()
        .expect("run summon __sandbox");
    assert!(
        status.status.success(),
        "this kernel cannot confine commands (no Landlock): {}",
        String::from_utf8_lossy(&status.stderr)
    );
}

/// Runs one delegation whose model calls `shell` once per command (in one turn), and
/// returns each call's result text, in order.
async fn shell_results(
    commands: &[String],
    extra: &[&str],
    setup: impl FnOnce(&Project),
) -> Vec<String> {
    let calls: Vec<(&str, Value)> = commands
        .iter()
        .map(|c| ("shell", json!({ "command": c })))
        .collect();
    let server = MockServer::start(
        MockConfig::new().replies([Reply::tool_calls(calls), Reply::text("done")]),
    )
    .await;
    let project = Project::new(&server);
    setup(&project);
    let out = project.delegate(extra).output().expect("run summon");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{stderr}");
    requests[1].body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .collect()
}

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{name}-{}-{nanos}", std::process::id())
}

#[tokio::test(flavor = "multi_thread")]
async fn workspace_write_allows_the_working_directory_only() {
    require_landlock();
    let outside = tempfile::tempdir().expect("outside");
    let in_tmp = std::env::temp_dir().join(unique("summon-sandbox-outside"));
    let link_target = outside.path().to_owned();
    let commands = [
        "echo kept > inside.txt && cat inside.txt".to_owned(),
        "touch \"$HOME/home.txt\"".to_owned(),
        format!("touch {}", in_tmp.display()),
        "touch ../escaped.txt".to_owned(),
        "touch link/through-link.txt".to_owned(),
        "echo scratch > \"$TMPDIR/t\" && cat \"$TMPDIR/t\" && echo \"$TMPDIR\"".to_owned(),
        "echo quiet > /dev/null && echo devnull-ok".to_owned(),
    ];
    let results = shell_results(&commands, &[], |p| {
        std::os::unix::fs::symlink(&link_target, p.work().join("link")).expect("symlink");
    })
    .await;
    assert_eq!(results[0], "exit code: 0\n[stdout]\nkept\n", "{results:?}");
    for (i, what) in [(1, "$HOME"), (2, "/tmp"), (3, ".."), (4, "a symlink")] {
        let result = &results[i];
        assert!(
            result.starts_with("exit code: 1") && result.contains("Permission denied"),
            "writing via {what} was not refused: {result}"
        );
        assert!(
            result.contains("[sandbox: this command ran under the `workspace-write` policy"),
            "no sandbox line for {what}: {result}"
        );
    }
    assert!(!in_tmp.exists());
    assert!(!outside.path().join("through-link.txt").exists());
    let scratch = &results[5];
    assert!(
        scratch.starts_with("exit code: 0\n[stdout]\nscratch\n"),
        "{scratch}"
    );
    let tmpdir = scratch.lines().nth(3).expect("TMPDIR line");
    assert!(tmpdir.contains("summon-tmp-"), "{scratch}");
    assert!(
        !Path::new(tmpdir).exists(),
        "the task's TMPDIR {tmpdir} was left behind"
    );
    assert_eq!(results[6], "exit code: 0\n[stdout]\ndevnull-ok\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn read_only_refuses_writes_even_in_the_working_directory() {
    require_landlock();
    let results = shell_results(
        &[
            "touch inside.txt".to_owned(),
            "cat /etc/hostname > /dev/null && echo read-ok".to_owned(),
        ],
        &["--sandbox", "read-only"],
        |_| {},
    )
    .await;
    assert!(results[0].contains("Permission denied"), "{results:?}");
    assert!(
        results[0].contains("under the `read-only` policy (writes nowhere"),
        "{results:?}"
    );
    assert_eq!(results[1], "exit code: 0\n[stdout]\nread-ok\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn off_allows_everything() {
    let in_tmp = std::env::temp_dir().join(unique("summon-sandbox-off"));
    let results = shell_results(
        &[format!("touch {} && echo made", in_tmp.display())],
        &["--sandbox", "off"],
        |_| {},
    )
    .await;
    assert_eq!(results[0], "exit code: 0\n[stdout]\nmade\n");
    assert!(in_tmp.exists());
    let _ = std::fs::remove_file(in_tmp);
}

/// A Python one-liner connecting to `port` on loopback, then trying a UDP socket.
fn connect(port: u16) -> String {
    format!(
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5); \
         print('tcp-ok'); socket.socket(socket.AF_INET, socket.SOCK_DGRAM); print('udp-ok')\""
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn network_is_refused_unless_granted() {
    require_landlock();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().expect("addr").port();
    let denied = shell_results(&[connect(port)], &[], |_| {}).await;
    assert!(denied[0].starts_with("exit code: 1"), "{denied:?}");
    assert!(!denied[0].contains("tcp-ok"), "{denied:?}");
    assert!(
        denied[0].contains("PermissionError") || denied[0].contains("Operation not permitted"),
        "{denied:?}"
    );
    assert!(denied[0].contains("no network)"), "{denied:?}");

    let granted = shell_results(&[connect(port)], &["--network"], |_| {}).await;
    assert_eq!(granted[0], "exit code: 0\n[stdout]\ntcp-ok\nudp-ok\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn everyday_tools_work_under_the_default() {
    require_landlock();
    // The test's HOME is empty: rustup finds its toolchains where the user's are.
    let real_home = PathBuf::from(std::env::var_os("HOME").expect("HOME"));
    let rustup = std::env::var_os("RUSTUP_HOME").map_or(real_home.join(".rustup"), PathBuf::from);
    let cargo = std::env::var_os("CARGO_HOME").map_or(real_home.join(".cargo"), PathBuf::from);
    let results = shell_results(
        &[
            "git init -q . && git status --short && echo git-ok".to_owned(),
            format!(
                "RUSTUP_HOME={} CARGO_HOME={} cargo --version",
                rustup.display(),
                cargo.display()
            ),
            "python3 -c 'print(6 * 7)'".to_owned(),
        ],
        &[],
        |_| {},
    )
    .await;
    assert!(
        results[0].starts_with("exit code: 0") && results[0].contains("git-ok"),
        "{results:?}"
    );
    assert!(
        results[1].starts_with("exit code: 0\n[stdout]\ncargo "),
        "{results:?}"
    );
    assert_eq!(results[2], "exit code: 0\n[stdout]\n42\n");
}

// ---- Process groups ----

/// The processes whose process group is `pgid`.
fn group_members(pgid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // After the command name: state, ppid, pgrp.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() != Some(&"Z") && fields.get(2) == Some(&pgid.to_string().as_str()) {
            found.push(pid);
        }
    }
    found
}

/// Waits (at most 10 s) until no process of group `pgid` is left.
#[track_caller]
fn assert_group_gone(pgid: u32, case: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = group_members(pgid);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{case}: processes {left:?} of the command's group {pgid} are still running"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (at most 20 s) for the command to write its process group id into `file`.
fn wait_for_pgid(file: &Path) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(text) = std::fs::read_to_string(file)
            && let Ok(pgid) = text.trim().parse()
        {
            return pgid;
        }
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A command that records its group, leaves a background sleep, and (with `then`) goes on.
fn lingering(then: &str) -> String {
    format!("sleep 30 & echo $$ > pgid.tmp && mv pgid.tmp pgid; {then}")
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_outlives_a_call_that_times_out() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call(
            "shell",
            json!({"command": lingering("sleep 30"), "timeout_secs": 1}),
        ),
        Reply::text("done"),
    ]))
    .await;
    let project = Project::new(&server);
    let out = project.delegate(&[]).output().expect("run");
    assert_eq!(out.status.code(), Some(0));
    let pgid = wait_for_pgid(&project.work().join("pgid"));
    assert_group_gone(pgid, "timeout");
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_outlives_the_task() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("shell", json!({"command": lingering("echo ended")})),
        Reply::text("done"),
    ]))
    .await;
    let project = Project::new(&server);
    let out = project.delegate(&[]).output().expect("run");
    assert_eq!(out.status.code(), Some(0));
    let pgid = wait_for_pgid(&project.work().join("pgid"));
    assert_group_gone(pgid, "task ended");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_a_background_task_kills_its_command() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("shell", json!({"command": lingering("sleep 30")})),
        Reply::text("done"),
    ]))
    .await;
    let project = Project::new(&server);
    let started = project
        .delegate(&["--async", "--json"])
        .output()
        .expect("run");
    let answer: Value = serde_json::from_slice(&started.stdout).expect("JSON");
    let id = answer["task_id"].as_str().expect("task_id").to_owned();
    let pgid = wait_for_pgid(&project.work().join("pgid"));
    assert!(!group_members(pgid).is_empty());
    let mut cancel = project.test.command();
    let cancelled = cancel
        .args(["load", &id, "--cancel"])
        .output()
        .expect("cancel");
    assert_eq!(
        cancelled.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&cancelled.stderr)
    );
    assert_group_gone(pgid, "load --cancel");
}

/// Interrupts a foreground `delegate` with `signal` while its shell command runs.
async fn interrupt(signal: &str, expected_code: i32, expected_line: &str) {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("shell", json!({"command": lingering("sleep 30")})),
        Reply::text("done"),
    ]))
    .await;
    let project = Project::new(&server);
    let child = project.delegate(&[]).spawn().expect("spawn");
    let pgid = wait_for_pgid(&project.work().join("pgid"));
    let sent = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(expected_code), "{stderr}");
    assert!(stderr.contains(expected_line), "{stderr}");
    assert_group_gone(pgid, signal);
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_kills_the_running_command() {
    interrupt(
        "-INT",
        130,
        "summon: interrupted: killed the running command and every process it started",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_kills_the_running_command() {
    interrupt(
        "-TERM",
        143,
        "summon: terminated (SIGTERM): killed the running command and every process it started",
    )
    .await;
}

// ---- Settings, refusal, doctor ----

#[tokio::test(flavor = "multi_thread")]
async fn without_landlock_the_shell_refuses_and_names_the_way_out() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("shell", json!({"command": "touch made.txt"})),
        Reply::text("done"),
        Reply::tool_call("shell", json!({"command": "touch made.txt"})),
        Reply::text("done"),
    ]))
    .await;
    let project = Project::new(&server);
    let mut command = project.delegate(&[]);
    let out = command
        .env("SUMMON_TEST_NO_LANDLOCK", "1")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0));
    let result = server.requests()[1].body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .expect("tool result");
    assert!(
        result.contains("refused: the `workspace-write` sandbox needs the kernel's Landlock")
            && result.contains("`--sandbox off`"),
        "{result}"
    );
    assert!(!project.work().join("made.txt").exists());

    let mut command = project.delegate(&["--sandbox", "off"]);
    let out = command
        .env("SUMMON_TEST_NO_LANDLOCK", "1")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0));
    assert!(project.work().join("made.txt").exists());
}

#[test]
fn doctor_says_whether_commands_are_sandboxed() {
    let test = Test::new().args(["doctor", "--offline", "--json"]);
    let out = test.output();
    let doctor = out.json();
    let sandbox = &doctor["sandbox"];
    assert_eq!(
        sandbox["default"],
        json!({"policy": "workspace-write", "network": false})
    );
    require_landlock();
    assert_eq!(sandbox["sandboxed"], true, "{sandbox}");
    assert!(
        sandbox["landlock_abi"].as_u64().unwrap_or(0) >= 1,
        "{sandbox}"
    );
    let without = Test::new()
        .env("SUMMON_TEST_NO_LANDLOCK", "1")
        .args(["doctor", "--offline"])
        .output();
    assert!(
        without.stdout.contains(
            "commands cannot be sandboxed here, so the shell refuses them: refused: the \
             `workspace-write` sandbox needs the kernel's Landlock"
        ),
        "{}",
        without.stdout
    );
    assert!(
        without
            .stdout
            .contains("`read-only`: read anywhere, write nowhere")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_most_specific_setting_wins_and_is_reported() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("fine"))).await;
    let test = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_TRUST_PROJECT", "1")
        .write("summon.yaml", "sandbox: read-only\nnetwork: true\n")
        .write(
            "p.yaml",
            "version: 1\nname: p\nsettings:\n  sandbox: workspace-write\nsteps:\n  - id: a\n    \
             delegate:\n      instructions: one\n      extensions: [developer]\n  - id: b\n    \
             sandbox: off\n    needs: [a]\n    delegate:\n      instructions: two\n      \
             extensions: [developer]\n",
        );
    let out = test
        .command()
        .args(["run", "p.yaml", "--out", "out"])
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(test.path().join("out/report.json")).expect("report"),
    )
    .expect("JSON");
    assert_eq!(
        report["sandbox"],
        json!({
            "a": {"policy": "workspace-write", "network": true},
            "b": {"policy": "off", "network": true},
        })
    );
    let out = test
        .command()
        .args(["run", "p.yaml", "--out", "out2", "--sandbox", "read-only"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0));
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(test.path().join("out2/report.json")).expect("report"),
    )
    .expect("JSON");
    assert_eq!(report["sandbox"]["b"]["policy"], "read-only");

    // delegate: the config file's, then the flag.
    for (flags, expected) in [
        (&[][..], json!({"policy": "read-only", "network": true})),
        (
            &["--sandbox", "workspace-write"][..],
            json!({"policy": "workspace-write", "network": true}),
        ),
    ] {
        let out = test
            .command()
            .args([
                "delegate",
                "--instructions",
                "x",
                "--extensions",
                "developer",
                "--json",
            ])
            .args(flags)
            .output()
            .expect("run");
        let answer: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(answer["sandbox"], expected, "{flags:?}");
    }
    let out = test
        .command()
        .args(["delegate", "--instructions", "x", "--json"])
        .output()
        .expect("run");
    let answer: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(answer["sandbox"], Value::Null, "no shell, no sandbox");

    // A project file that loosens the sandbox needs trust, unless a flag decides.
    let out = test
        .command()
        .env_remove("SUMMON_TRUST_PROJECT")
        .args([
            "delegate",
            "--instructions",
            "x",
            "--extensions",
            "developer",
        ])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "summon.yaml:2:10: error: `network` in this project's summon.yaml would let the \
             model's shell commands use the network, and this project is not trusted"
        ),
        "{stderr}"
    );
}

#[test]
fn a_bad_policy_names_the_file_line_and_key() {
    let out = Test::new()
        .write(
            "p.yaml",
            "version: 1\nname: p\nsteps:\n  - id: a\n    sandbox: none\n    delegate:\n      \
             instructions: one\n",
        )
        .args(["validate", "p.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains("p.yaml:5:") && out.stderr.contains("sandbox"),
        "{}",
        out.stderr
    );
    let out = Test::new()
        .write("summon.yaml", "sandbox: maybe\n")
        .args(["doctor", "--offline"])
        .code(1)
        .output();
    assert!(
        out.stdout.contains("summon.yaml:1:") || out.stderr.contains("summon.yaml:1:"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
}

// ---- MCP stdio servers ----

/// A recipe with the test MCP server, with `extra` lines in its extension entry.
fn server_recipe(extra: &str) -> String {
    let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp/misbehaving.py");
    format!(
        "title: Tools\ndescription: uses an MCP server\nprompt: Use the tools.\nextensions:\n  \
         - type: builtin\n    name: developer\n  - type: stdio\n    name: srv\n    cmd: python3\n    \
         args: ['{}', 'ok']\n{extra}",
        server.display()
    )
}

/// The `Seccomp:` and `NoNewPrivs:` lines of the server process's status, as the server
/// reported its pid.
async fn server_confinement(extra: &str) -> String {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("srv__pid", json!({})),
        // The server lives as long as the task: this call holds it while the test looks.
        Reply::tool_call("shell", json!({"command": "sleep 3"})),
        Reply::text("done"),
    ]))
    .await;
    let test = Test::new()
        .env("SUMMON_TRUST_PROJECT", "1")
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .write("recipes/tools.yaml", &server_recipe(extra));
    let child = test
        .command()
        .args(["delegate", "--source", "tools"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(request) = server.requests().get(1) {
            let pid = request.body["messages"]
                .as_array()
                .expect("messages")
                .iter()
                .find(|m| m["role"] == "tool")
                .and_then(|m| m["content"].as_str())
                .expect("the pid")
                .to_owned();
            break std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        }
        assert!(Instant::now() < deadline, "no second request");
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().expect("wait");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    status
        .lines()
        .filter(|l| l.starts_with("Seccomp:") || l.starts_with("NoNewPrivs:"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_server_is_sandboxed_only_when_its_extension_asks() {
    require_landlock();
    assert_eq!(
        server_confinement("    sandbox: workspace-write\n").await,
        "NoNewPrivs: 1, Seccomp: 2"
    );
    assert_eq!(server_confinement("").await, "NoNewPrivs: 0, Seccomp: 0");
}

#[test]
fn a_bad_extension_sandbox_names_the_line() {
    let out = Test::new()
        .write("recipes/tools.yaml", &server_recipe("    sandbox: tight\n"))
        .args(["validate", "recipes/tools.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains("tools.yaml:11:")
            && out.stderr.contains(
                "`extensions[1].sandbox` must be `workspace-write`, `read-only` or `off`"
            ),
        "{}",
        out.stderr
    );
}

/// A pipeline whose one task's model runs `command` in the shell.
async fn pipeline_running(command: &str) -> (MockServer, Test) {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("shell", json!({ "command": command })),
        Reply::text("done"),
    ]))
    .await;
    let test = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .write(
            "p.yaml",
            "version: 1\nname: p\nsteps:\n  - id: a\n    delegate:\n      instructions: one\n      \
             extensions: [developer]\n",
        );
    (server, test)
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_stops_a_run_and_its_commands() {
    let (_server, test) = pipeline_running(&lingering("sleep 30")).await;
    let child = test
        .command()
        .args(["run", "p.yaml"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pgid = wait_for_pgid(&test.path().join("pgid"));
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    assert!(
        stderr.contains("summon: terminated (SIGTERM): killed the running command"),
        "{stderr}"
    );
    assert_group_gone(pgid, "run, SIGTERM");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_ctrl_c_stops_a_run_and_its_commands() {
    use std::io::BufRead;
    let (_server, test) = pipeline_running(&lingering("sleep 30")).await;
    let mut child = test
        .command()
        .args(["run", "p.yaml"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pgid = wait_for_pgid(&test.path().join("pgid"));
    let pid = child.id().to_string();
    let interrupt = || {
        let sent = Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .expect("kill");
        assert!(sent.success());
    };
    interrupt();
    // The first Ctrl-C lets the task finish; the second, once the first was seen, stops it.
    let mut stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        let n = stderr.read_line(&mut line).expect("read stderr");
        assert!(
            n > 0,
            "summon ended before saying it was interrupted:\n{seen}"
        );
        seen.push_str(&line);
        if line.contains("interrupted: finishing the tasks in flight") {
            break;
        }
    }
    assert!(
        !group_members(pgid).is_empty(),
        "the first Ctrl-C lets the command run"
    );
    interrupt();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).expect("read stderr");
    let status = child.wait().expect("wait");
    assert_ne!(status.code(), Some(0), "{seen}{rest}");
    assert_group_gone(pgid, "run, Ctrl-C twice");
}
