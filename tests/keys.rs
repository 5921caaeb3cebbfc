//! The API keys stay out of the model's reach, against a hostile model whose tool calls the
//! mock scripts: the model's `shell` commands cannot read summon's (or an ancestor's)
//! `/proc/PID/environ`, as root or as an unprivileged user; root in the sandbox has no
//! capability left; a key named by a provider's `api_key_env` is never in a command's
//! environment, while a variable the config's `shell_env` adds is (nor in an MCP server's,
//! unless its extension names it); and an answer that repeats a configured key is redacted in
//! `results.jsonl`, the report, the store, `outputs` files and stdout.

#![cfg(target_os = "linux")]

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, RecordedRequest, Reply};
use support::Test;

const KEY: &str = "sk-test-keys-Rv7Lq2Wx9Zt4Mn8P";
/// The value of a key variable whose name does not read as a key (`WORK_LLM_TOKEN`).
const TOKEN: &str = "work-token-Jd3Kf8Hs1Qp6Vb0Y";

/// Fails the test unless this kernel can confine a command (Landlock, Linux 5.13+).
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

/// `id ARGS`, as a number.
fn id(args: &[&str]) -> Option<u32> {
    let out = Command::new("id").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

fn is_root() -> bool {
    id(&["-u"]) == Some(0)
}

/// The uid and gid of an unprivileged user to run summon as: `nobody`, else `summon-test`,
/// made with `useradd` when missing. `None` (the caller then says why it skips) only when
/// this process is not root, so it could not switch users anyway.
fn unprivileged_user() -> Option<(u32, u32)> {
    if !is_root() {
        return None;
    }
    let lookup = |name: &str| Some((id(&["-u", name])?, id(&["-g", name])?));
    if let Some(ids) = lookup("nobody") {
        return Some(ids);
    }
    if lookup("summon-test").is_none() {
        let made = Command::new("useradd")
            .args(["--system", "--no-create-home", "summon-test"])
            .status()
            .expect("run useradd");
        assert!(made.success(), "useradd summon-test failed");
    }
    Some(lookup("summon-test").expect("the user useradd made"))
}

/// `setpriv` running what follows as `uid:gid` with no supplementary groups, keeping the
/// environment, arguments and working directory as they are.
fn setpriv((uid, gid): (u32, u32)) -> Command {
    let mut command = Command::new("setpriv");
    command
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .arg("--");
    command
}

/// The summon binary as `ids` can run it: the built one, or (when the checkout is in a folder
/// that user cannot enter, such as root's home) a copy in `dir`, which the test removes.
fn summon_for(ids: (u32, u32), dir: &Path) -> std::ffi::OsString {
    use std::os::unix::fs::PermissionsExt;
    let built = env!("CARGO_BIN_EXE_summon");
    let runs = setpriv(ids)
        .args([built, "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if runs {
        return built.into();
    }
    let copy = dir.join("summon-bin").join("summon");
    std::fs::create_dir(dir.join("summon-bin")).expect("mkdir");
    std::fs::copy(built, &copy).expect("copy summon");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    copy.into_os_string()
}

/// `command` run as `ids` (see [`setpriv`]), its output captured; the summon binary in it is
/// one that user can run. Gives `dir`, the test's folder, to that user first.
fn as_user(command: &Command, ids: (u32, u32), dir: &Path) -> Command {
    give(dir, ids);
    let summon = summon_for(ids, dir);
    let built = std::ffi::OsStr::new(env!("CARGO_BIN_EXE_summon"));
    let swap = |arg: &std::ffi::OsStr| {
        if arg == built {
            summon.clone()
        } else {
            arg.to_owned()
        }
    };
    let mut wrapped = setpriv(ids);
    wrapped
        .arg(swap(command.get_program()))
        .args(command.get_args().map(swap))
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in command.get_envs() {
        if let Some(value) = value {
            wrapped.env(key, value);
        }
    }
    if let Some(dir) = command.get_current_dir() {
        wrapped.current_dir(dir);
    }
    wrapped
}

/// Gives `dir` and everything in it to `uid:gid`, so summon run as that user can work there.
fn give(dir: &Path, (uid, gid): (u32, u32)) {
    let status = Command::new("chown")
        .args(["-R", &format!("{uid}:{gid}")])
        .arg(dir)
        .status()
        .expect("run chown");
    assert!(status.success(), "chown {}", dir.display());
}

/// The tool results of a request, in order.
fn tool_results(request: &RecordedRequest) -> Vec<String> {
    request.body["messages"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// A hostile model: its first answer calls `shell` with each of `commands`; once it has the
/// results it answers with all of them, as a model that found a key would repeat it.
async fn hostile(commands: &[&str]) -> MockServer {
    let calls: Vec<(String, Value)> = commands
        .iter()
        .map(|c| ("shell".to_owned(), json!({ "command": c })))
        .collect();
    MockServer::start(MockConfig::new().rule(move |request: &RecordedRequest| {
        let results = tool_results(request);
        if results.is_empty() {
            Reply::tool_calls(calls.clone())
        } else {
            Reply::text(format!("Here is what I found:\n{}", results.join("\n")))
        }
    }))
    .await
}

/// A project wired to the mock, its key in `OPENAI_API_KEY`; the subagent works in `work/`.
fn project(server: &MockServer) -> Test {
    Test::new()
        .mkdir("work")
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
}

/// `summon delegate` with the shell granted, in `work/`.
fn delegate(t: &Test) -> Command {
    let mut command = t.command();
    command
        .args([
            "delegate",
            "--instructions",
            "find the key",
            "--extensions",
            "developer",
            "--working-dir",
            "work",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// What a finished summon printed, with its pid.
struct Ran {
    pid: u32,
    stdout: String,
    stderr: String,
}

fn run(mut command: Command) -> Ran {
    let child = command.spawn().expect("start summon");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for summon");
    let ran = Ran {
        pid,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert_eq!(out.status.code(), Some(0), "{}", ran.stderr);
    ran
}

/// Reads the parent's `/proc/PID/environ` (numbered as `/proc` numbers it: the command has a
/// PID namespace of its own, where `$PPID` counts differently) and then walks the parent chain up, saying for each
/// ancestor whether its environment could be read.
const READ_ANCESTORS: &str = "read -r _ _ _ pp _ < /proc/self/stat; \
     echo \"ppid=$pp comm=$(cat /proc/$pp/comm)\"; \
     tr '\\0' '\\n' < /proc/$pp/environ; \
     p=$pp; while [ \"$p\" -gt 1 ]; do \
     if cat /proc/$p/environ > /dev/null 2>&1; then echo \"read $p\"; else echo \"denied $p\"; fi; \
     p=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f2); done";

/// Like [`READ_ANCESTORS`], for summon alone.
const READ_PARENT: &str = "read -r _ _ _ pp _ < /proc/self/stat; \
     echo \"ppid=$pp comm=$(cat /proc/$pp/comm)\"; \
     tr '\\0' '\\n' < /proc/$pp/environ; \
     if cat /proc/$pp/environ > /dev/null 2>&1; then echo \"read $pp\"; \
     else echo \"denied $pp\"; fi";

/// `command` started by a shell that waits for it, as a login shell would: an ancestor of
/// summon that holds the key in its environment. Its output captured.
fn through_shell(command: &Command) -> Command {
    let mut shell = Command::new("sh");
    shell
        .args(["-c", "\"$@\"; status=$?; exit $status", "sh"])
        .arg(command.get_program())
        .args(command.get_args())
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in command.get_envs() {
        if let Some(value) = value {
            shell.env(key, value);
        }
    }
    if let Some(dir) = command.get_current_dir() {
        shell.current_dir(dir);
    }
    shell
}

/// Runs the hostile model's environ reads (`probe`, with summon's `extra` flags) as `user`
/// (or as this process's user), summon started by a shell of that user, and checks that no
/// environment was read: summon's, the shell's (with `ancestors`) or any other ancestor's,
/// and that neither the tool results nor anything summon printed carries the key.
async fn environ_reads_are_refused(
    user: Option<(u32, u32)>,
    probe: &str,
    extra: &[&str],
    ancestors: bool,
) {
    let server = hostile(&[probe]).await;
    let t = project(&server);
    let mut command = delegate(&t);
    command.args(extra);
    let command = through_shell(&command);
    let ran = match user {
        Some(ids) => run(as_user(&command, ids, t.path())),
        None => run(command),
    };
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{}", ran.stderr);
    let result = &tool_results(&requests[1])[0];
    let ppid: u32 = result
        .strip_prefix("exit code: 0\n[stdout]\nppid=")
        .and_then(|rest| rest.split_once(" comm=summon\n"))
        .and_then(|(pid, _)| pid.parse().ok())
        .unwrap_or_else(|| panic!("the command's parent is not summon: {result}"));
    assert!(
        result.contains(&format!("denied {ppid}")),
        "summon's environment was readable: {result}"
    );
    if ancestors {
        // `setpriv` execs the shell: its pid is the one the test started.
        assert!(
            result.contains(&format!("denied {}", ran.pid)),
            "the shell that started summon is not among the ancestors: {result}"
        );
    }
    assert!(
        !result.contains("read "),
        "an ancestor's environment was readable: {result}"
    );
    assert!(!result.contains(KEY), "the key reached the model: {result}");
    assert!(!ran.stdout.contains(KEY), "{}", ran.stdout);
    assert!(!ran.stderr.contains(KEY), "{}", ran.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_shell_cannot_read_the_environment_of_summon_or_its_ancestors_as_root() {
    require_landlock();
    assert!(
        is_root(),
        "this test checks what root can do in the sandbox; run the suite as root (CI does)"
    );
    environ_reads_are_refused(None, READ_ANCESTORS, &[], true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_shell_cannot_read_the_environment_of_summon_or_its_ancestors_unprivileged() {
    require_landlock();
    let Some(user) = unprivileged_user() else {
        eprintln!("skipped: not root, so summon cannot be run as another, unprivileged user");
        environ_reads_are_refused(None, READ_ANCESTORS, &[], true).await;
        return;
    };
    environ_reads_are_refused(Some(user), READ_ANCESTORS, &[], true).await;
}

/// summon is not dumpable: even a command outside the sandbox, run as the same unprivileged
/// user, cannot read its environment.
#[tokio::test(flavor = "multi_thread")]
async fn summons_environment_is_closed_to_its_own_user_without_the_sandbox() {
    let Some(user) = unprivileged_user() else {
        eprintln!("skipped: not root, so summon cannot be run as another, unprivileged user");
        return;
    };
    environ_reads_are_refused(Some(user), READ_PARENT, &["--sandbox", "off"], false).await;
}

/// The capability lines of `/proc/self/status` in the sandbox, then root's powers tried
/// without changing anything: setting the host name to the one it has, giving a file in the
/// working directory to another user, reading a file whose mode lets nobody read it.
const USE_CAPABILITIES: &str = "grep -E '^(CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs)' /proc/self/status; \
     hostname \"$(hostname)\" 2>/dev/null && echo sethostname-ok; \
     touch owned && chown 12345 owned 2>/dev/null && echo chown-ok; \
     echo locked > locked && chmod 000 locked && cat locked 2>/dev/null && echo read-locked-ok";

fn status_line<'a>(result: &'a str, name: &str) -> &'a str {
    result
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name}:")))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {name} line: {result}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn root_in_the_sandbox_has_no_capability_and_gains_none() {
    require_landlock();
    assert!(
        is_root(),
        "this test checks what root can do in the sandbox; run the suite as root (CI does)"
    );
    let server = hostile(&[USE_CAPABILITIES]).await;
    let t = project(&server);
    let ran = run(delegate(&t));
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{}", ran.stderr);
    let result = &tool_results(&requests[1])[0];
    for set in ["CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(
            status_line(result, set).trim_start_matches('0'),
            "",
            "{set}: {result}"
        );
    }
    assert_eq!(status_line(result, "NoNewPrivs"), "1", "{result}");
    for power in ["sethostname-ok", "chown-ok", "read-locked-ok"] {
        assert!(!result.contains(power), "{power}: {result}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unprivileged_command_has_no_capability_and_gains_none() {
    require_landlock();
    let server = hostile(&["grep -E '^(CapPrm|CapEff|CapAmb|NoNewPrivs)' /proc/self/status"]).await;
    let t = project(&server);
    let command = delegate(&t);
    let ran = match unprivileged_user() {
        Some(ids) => run(as_user(&command, ids, t.path())),
        None => {
            eprintln!("not root: checking as this user");
            run(command)
        }
    };
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{}", ran.stderr);
    let result = &tool_results(&requests[1])[0];
    for set in ["CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(
            status_line(result, set).trim_start_matches('0'),
            "",
            "{set}: {result}"
        );
    }
    assert_eq!(status_line(result, "NoNewPrivs"), "1", "{result}");
}

/// A global config with a provider `work` whose key is in `WORK_LLM_TOKEN`, and `extra`
/// appended.
fn work_provider(server: &MockServer, extra: &str) -> Test {
    Test::new()
        .mkdir("work")
        .env("SUMMON_MODEL", "mock-model")
        .env("WORK_LLM_TOKEN", TOKEN)
        .env("OPENAI_API_KEY", KEY)
        .env("PROJECT_SETTING", "visible-setting-42")
        .env("UNLISTED_SETTING", "hidden-setting-43")
        .write_raw(
            ".config/summon/config.yaml",
            &format!(
                "default_provider: work\nproviders:\n  work:\n    kind: openai\n    \
                 base_url: {}\n    api_key_env: WORK_LLM_TOKEN\n{extra}",
                server.url_openai()
            ),
        )
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_get_the_allowlist_and_what_shell_env_adds_never_a_key() {
    require_landlock();
    let server = hostile(&["env"]).await;
    let t = work_provider(&server, "shell_env: [PROJECT_SETTING]\n");
    let ran = run(delegate(&t));
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{}", ran.stderr);
    assert_eq!(
        requests[0].header("authorization"),
        Some(format!("Bearer {TOKEN}").as_str()),
        "the provider gets its key"
    );
    let result = &tool_results(&requests[1])[0];
    assert!(
        result.contains("PROJECT_SETTING=visible-setting-42"),
        "{result}"
    );
    assert!(result.contains("PATH="), "{result}");
    assert!(result.contains("HOME="), "{result}");
    assert!(result.contains("TMPDIR="), "{result}");
    for absent in [
        "WORK_LLM_TOKEN",
        TOKEN,
        "OPENAI_API_KEY",
        KEY,
        "UNLISTED_SETTING",
    ] {
        assert!(!result.contains(absent), "{absent} is there: {result}");
    }
    assert!(!ran.stdout.contains(TOKEN), "{}", ran.stdout);
}

#[tokio::test(flavor = "multi_thread")]
async fn shell_env_may_not_list_a_key() {
    let server = MockServer::start(MockConfig::new()).await;
    for (extra, error) in [
        (
            "shell_env: [PROJECT_SETTING, WORK_LLM_TOKEN]\n",
            "`shell_env` lists WORK_LLM_TOKEN, which holds the API key of provider `work`",
        ),
        // Any provider's key, not only the one in use.
        (
            "  spare:\n    kind: anthropic\n    api_key_env: SPARE_LLM_SECRET\n\
             shell_env: [SPARE_LLM_SECRET]\n",
            "`shell_env` lists SPARE_LLM_SECRET, which holds the API key of provider `spare`",
        ),
        (
            "shell_env: [PROJECT_SETTING, ANTHROPIC_API_KEY]\n",
            "`shell_env[1]` is ANTHROPIC_API_KEY, named like an API key",
        ),
        (
            "shell_env: [GITHUB_AUTH_TOKEN]\n",
            "`shell_env[0]` is GITHUB_AUTH_TOKEN, named like an API key",
        ),
    ] {
        let t = work_provider(&server, extra);
        let out = t
            .command()
            .args(["delegate", "--instructions", "hi"])
            .output();
        let out = out.expect("run summon");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra}: {stderr}");
        assert!(stderr.contains(error), "{extra}: {stderr}");
    }
    let t = work_provider(&server, "shell_env: GOPATH\n");
    let out = t
        .command()
        .args(["delegate", "--instructions", "hi"])
        .output();
    let stderr = String::from_utf8_lossy(&out.expect("run summon").stderr).into_owned();
    assert!(
        stderr.contains("`shell_env` must be a list of environment variable names"),
        "{stderr}"
    );
    assert!(server.requests().is_empty(), "a request was sent");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_projects_shell_env_needs_trust() {
    require_landlock();
    let server = hostile(&["env"]).await;
    let t = work_provider(&server, "").write_raw("summon.yaml", "shell_env: [PROJECT_SETTING]\n");
    let out = delegate(&t).output().expect("run summon");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "`shell_env` in this project's summon.yaml would give the model's shell commands \
             PROJECT_SETTING from your environment, and this project is not trusted"
        ),
        "{stderr}"
    );
    assert!(server.requests().is_empty(), "a request was sent");
    let ran = run({
        let mut command = delegate(&t);
        command.arg("--trust");
        command
    });
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{}", ran.stderr);
    let result = &tool_results(&requests[1])[0];
    assert!(
        result.contains("PROJECT_SETTING=visible-setting-42"),
        "{result}"
    );
}

/// Every regular file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read dir") {
            let entry = entry.expect("entry");
            let kind = entry.file_type().expect("file type");
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
    }
    out
}

fn contains(bytes: &[u8], needle: &str) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

const PIPELINE: &str = r#"
version: 1
name: keys
steps:
  - id: items
    decompose:
      items: ["one", "two"]
  - id: each
    fan_out:
      over: items
      instructions: "Say the key for {{ item }}"
  - id: summary
    synthesize:
      instructions: "Say the key again"
outputs:
  - path: out/answers.md
    content: "{% for r in steps.each.results %}{{ r.output }}\n{% endfor %}{{ steps.summary.output }}"
"#;

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_that_repeats_the_key_is_redacted_everywhere() {
    let server = MockServer::start(MockConfig::new().rule(|_: &RecordedRequest| {
        Reply::text(format!("The key is {KEY}, and the token is {TOKEN}."))
    }))
    .await;
    let t = work_provider(&server, "").write_raw("p.yaml", PIPELINE);
    let pipeline = t
        .command()
        .args(["run", "p.yaml", "--out", "out"])
        .output()
        .expect("run summon");
    let pipeline_stderr = String::from_utf8_lossy(&pipeline.stderr).into_owned();
    assert_eq!(pipeline.status.code(), Some(0), "{pipeline_stderr}");
    let delegated = t
        .command()
        .args(["delegate", "--instructions", "say the key"])
        .output()
        .expect("run summon");
    assert_eq!(delegated.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&delegated.stdout);
    // The run's provider key (in WORK_LLM_TOKEN) and the other configured one (the openai
    // preset's OPENAI_API_KEY) are both redacted.
    assert_eq!(
        stdout,
        "The key is [redacted], and the token is [redacted].\n"
    );

    let results = std::fs::read_to_string(t.path().join("out/results.jsonl")).expect("results");
    assert!(results.contains("[redacted]"), "{results}");
    let answers = std::fs::read_to_string(t.path().join("out/answers.md")).expect("outputs");
    assert!(
        answers.contains("The key is [redacted], and the token is [redacted]."),
        "{answers}"
    );
    for (name, bytes) in [
        ("stdout of run", &pipeline.stdout),
        ("stderr of run", &pipeline.stderr),
        ("stdout of delegate", &delegated.stdout),
        ("stderr of delegate", &delegated.stderr),
    ] {
        for needle in [KEY, TOKEN] {
            assert!(!contains(bytes, needle), "{name} has {needle}");
        }
    }
    let files = files_under(t.path());
    assert!(
        files.iter().any(|f| f.ends_with("report.html")),
        "{files:?}"
    );
    assert!(
        files
            .iter()
            .any(|f| f.starts_with(t.path().join(".summon"))),
        "{files:?}"
    );
    for file in files {
        if file.ends_with(".config/summon/config.yaml") {
            continue;
        }
        let bytes = std::fs::read(&file).expect("read");
        for needle in [KEY, TOKEN] {
            assert!(!contains(&bytes, needle), "{} has {needle}", file.display());
        }
    }
}

/// An MCP server (the fixture's `env` tool reports a variable) gets summon's environment
/// without the providers' key variables, whatever their names, unless its extension names one
/// in `env_keys`.
#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_server_gets_no_key_variable_unless_its_extension_names_it() {
    let asks: Vec<(String, Value)> = ["WORK_LLM_TOKEN", "OPENAI_API_KEY", "UNLISTED_SETTING"]
        .iter()
        .map(|name| ("probe__env".to_owned(), json!({ "name": name })))
        .collect();
    let server = MockServer::start(MockConfig::new().rule(move |request: &RecordedRequest| {
        if tool_results(request).is_empty() {
            Reply::tool_calls(asks.clone())
        } else {
            Reply::text("probed")
        }
    }))
    .await;
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp/misbehaving.py");
    let recipe = |env_keys: &str| {
        format!(
            "title: Probe\ndescription: reads variables through an MCP server\nprompt: Probe.\n\
             extensions:\n  - type: stdio\n    name: probe\n    cmd: python3\n    \
             args: ['{}', 'ok']\n    timeout: 30\n    env_keys: [{env_keys}]\n",
            fixture.display()
        )
    };
    let t = work_provider(&server, "")
        .env("SUMMON_TRUST_PROJECT", "1")
        .write_raw("recipes/probe.yaml", &recipe(""))
        .write_raw("recipes/keyed.yaml", &recipe("WORK_LLM_TOKEN"));
    for (source, token_result) in [("probe", "unset"), ("keyed", TOKEN)] {
        let out = t
            .command()
            .args(["delegate", "--source", source, "--instructions", "probe"])
            .output()
            .expect("run summon");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let requests = server.requests();
        let results = tool_results(requests.last().expect("a request"));
        assert_eq!(
            results,
            [token_result, "unset", "hidden-setting-43"],
            "{source}"
        );
    }
}
