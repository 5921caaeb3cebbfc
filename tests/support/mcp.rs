//! Helpers of the MCP tests: the third-party servers (installed once under
//! `mcp-servers/` of the target directory, as `.ci/run` does), the scripted servers of tests/fixtures/mcp, what
//! the model was told about its tool calls, and whether a server process is still there.

use std::path::{Path, PathBuf};
use std::time::Duration;

use summon_mock_llm::RecordedRequest;

/// The npm filesystem server the tests (and `.ci/run`) install.
pub(crate) const FS_SERVER: &str = "@modelcontextprotocol/server-filesystem@2026.8.31";
/// The PyPI time server the tests (and `.ci/run`) install.
pub(crate) const TIME_SERVER: &str = "mcp-server-time==2026.10.19";
/// The MCP Python SDK (the time server's own dependency, pinned): the client of the
/// `summon mcp` tests.
pub(crate) const PYTHON_SDK: &str = "mcp==2.3.0";

/// Where the third-party servers are installed (once, shared by every test and by CI).
fn servers_root() -> PathBuf {
    super::target_dir().join("mcp-servers")
}

/// Runs `install` unless `ready` exists, one install at a time (`.ci/run` installs them
/// before the tests; this is for a first `cargo test` on a fresh machine).
fn install_once(ready: &Path, what: &str, install: impl FnOnce(&Path) -> std::process::Command) {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    if ready.exists() {
        return;
    }
    let root = servers_root();
    std::fs::create_dir_all(&root).unwrap();
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if !ready.exists() {
        let output = install(&root).output().expect("run the installer");
        assert!(
            output.status.success() && ready.exists(),
            "installing {what} failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// The `mcp-server-filesystem` executable from npm.
pub(crate) fn filesystem_server() -> PathBuf {
    let bin = servers_root().join("node/node_modules/.bin/mcp-server-filesystem");
    install_once(&bin, FS_SERVER, |root| {
        let mut cmd = std::process::Command::new("npm");
        cmd.args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(root.join("node"))
            .arg(FS_SERVER);
        cmd
    });
    bin
}

/// A directory with `mcp-server-time` (and the Python MCP SDK) from PyPI, for PYTHONPATH.
pub(crate) fn python_packages() -> PathBuf {
    let dir = servers_root().join("py");
    install_once(&dir.join("mcp_server_time"), TIME_SERVER, |root| {
        let mut cmd = std::process::Command::new("python3");
        cmd.args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--target",
        ])
        .arg(root.join("py"))
        .args([TIME_SERVER, PYTHON_SDK]);
        cmd
    });
    dir
}

/// The path of a scripted server in tests/fixtures/mcp.
pub(crate) fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/mcp")
        .join(name)
        .display()
        .to_string()
}

/// What the model was told about its tool calls so far (OpenAI format: `tool` messages).
pub(crate) fn tool_results(request: &RecordedRequest) -> Vec<String> {
    request.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// A process exists and is not a zombie (a zombie has ended; it only waits to be reaped).
/// Whether `pid` is still there after it had a moment to die: a SIGKILLed process goes within
/// milliseconds, but on a loaded machine not always before the next line runs. A process that
/// survives stays alive through the whole wait, so this still fails the test.
pub(crate) fn still_alive(pid: u32) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        if std::time::Instant::now() >= deadline {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

pub(crate) fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}
