//! The `shell` tool: `sh -c COMMAND` in the working directory, bounded in time and output.
//!
//! The command runs in the task's sandbox (see [`crate::sandbox`]; refused where the kernel
//! cannot confine it), with stdin from `/dev/null`, in a process group of its own, with an
//! environment built from an allowlist (see [`crate::sandbox::environment`]: never a
//! credential) and `TMPDIR` set to the task's private temporary directory. A failure that looks like a sandbox denial gets a line naming the
//! policy. stdout and stderr are captured separately (each capped at [`OUTPUT_CAP`], the
//! rest drained and counted). When the command ends, its timeout passes, or the call is dropped (the task cancelled), the whole process
//! group is killed, so background processes neither outlive the call nor keep it waiting on
//! their open pipes; a timeout is an error that still shows the output so far. An interrupted
//! summon kills the groups still running (see [`crate::process::groups`]).
//!
//! An agent that lists shell only through patterns (`Bash(git log*)`) gets a restricted shell:
//! the command must match one of the patterns (`*` matches anything, a trailing `:*` as in
//! Claude Code means "this command, with or without arguments") and may not contain shell
//! operators that would chain, substitute or redirect.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::args::Args;
use super::workdir::WorkDir;
use super::{ToolError, shown};
use crate::provider::ToolSpec;
use crate::sandbox::{CommandEnv, Policy, Sandbox, helper};

/// The most bytes kept of each of stdout and stderr.
pub(crate) const OUTPUT_CAP: usize = 128 * 1024;
pub(crate) const DEFAULT_TIMEOUT_SECS: u64 = 300;
pub(crate) const MAX_TIMEOUT_SECS: u64 = 3600;
/// How long the output pipes may stay open after the process group was killed.
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// Characters a restricted command may not contain.
const RESTRICTED_CHARS: [char; 9] = [';', '&', '|', '<', '>', '$', '`', '\n', '\r'];

const EXPECTED: &str = r#"{"command": string, "timeout_secs"?: integer (1-3600, default 300)}"#;

pub(crate) fn shell_spec(allowed: Option<&[String]>) -> ToolSpec {
    let mut description = format!(
        "Run a shell command with `sh -c` in the working directory and return its exit code, \
         stdout and stderr (each cut at {} KiB). stdin is empty; nothing is interactive. The \
         command is killed after `timeout_secs` (default {DEFAULT_TIMEOUT_SECS}, at most \
         {MAX_TIMEOUT_SECS}); background processes it starts are killed when it ends. Prefer \
         read_file, list_files and search for looking at files.",
        OUTPUT_CAP / 1024
    );
    if let Some(patterns) = allowed {
        let list: Vec<String> = patterns.iter().map(|p| shown(p)).collect();
        description.push_str(&format!(
            " Restricted: only commands matching one of these patterns are allowed ({}; `*` \
             matches any text), and they may not contain ; & | < > $ ` or line breaks.",
            list.join(", ")
        ));
    }
    ToolSpec {
        name: "shell".into(),
        description,
        parameters: json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The command line, run by `sh -c`."},
                "timeout_secs": {
                    "type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_SECS,
                    "description": format!("Seconds before the command is killed (default {DEFAULT_TIMEOUT_SECS}).")
                }
            },
            "required": ["command"],
            "additionalProperties": false
        }),
    }
}

/// Where a task's shell commands run.
pub(crate) struct Context<'a> {
    pub(crate) workdir: &'a WorkDir,
    /// The task's private temporary directory (TMPDIR).
    pub(crate) scratch: &'a Scratch,
    pub(crate) sandbox: Sandbox,
    /// The variables commands get.
    pub(crate) env: &'a CommandEnv,
    /// The span the command runs under (`TRACEPARENT`), when the run is traced: its tool
    /// call's.
    pub(crate) traceparent: Option<&'a str>,
}

/// A task's private temporary directory: made on its first shell command, TMPDIR of every
/// command, writable under `workspace-write`, and removed with everything in it when the task
/// ends.
#[derive(Debug, Default)]
pub(crate) struct Scratch(std::sync::OnceLock<tempfile::TempDir>);

impl Scratch {
    fn path(&self) -> std::io::Result<&std::path::Path> {
        if let Some(dir) = self.0.get() {
            return Ok(dir.path());
        }
        let made = tempfile::Builder::new().prefix("summon-tmp-").tempdir()?;
        Ok(self.0.get_or_init(|| made).path())
    }
}

/// `shell {command, timeout_secs?}`; `allowed` restricts the commands to these patterns.
pub(crate) async fn shell(
    args: &Value,
    context: &Context<'_>,
    allowed: Option<&[String]>,
) -> Result<String, ToolError> {
    let args = Args::parse("shell", EXPECTED, args)?;
    let command = args.str("command")?;
    let timeout_secs = args
        .opt_u64("timeout_secs")?
        .unwrap_or(DEFAULT_TIMEOUT_SECS);
    if !(1..=MAX_TIMEOUT_SECS).contains(&timeout_secs) {
        return Err(ToolError::Failed(format!(
            "`timeout_secs` must be between 1 and {MAX_TIMEOUT_SECS}, got {timeout_secs}"
        )));
    }
    if command.trim().is_empty() {
        return Err(ToolError::Failed("`command` is empty".into()));
    }
    if let Some(patterns) = allowed {
        check_allowed(command, patterns)?;
    }
    if let Some(refusal) = crate::sandbox::support::refusal(context.sandbox) {
        return Err(ToolError::Failed(refusal));
    }
    run(command, context, Duration::from_secs(timeout_secs)).await
}

/// Refuses `command` unless it matches one of `patterns` and has no shell operators.
fn check_allowed(command: &str, patterns: &[String]) -> Result<(), ToolError> {
    let list = || {
        patterns
            .iter()
            .map(|p| shown(p))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(c) = command.chars().find(|c| RESTRICTED_CHARS.contains(c)) {
        return Err(ToolError::Failed(format!(
            "command not allowed: it contains {}; this agent's shell only runs single commands \
             matching {} without ; & | < > $ ` or line breaks",
            shown(&c.escape_default().to_string()),
            list()
        )));
    }
    let command = command.trim();
    if patterns.iter().any(|p| pattern_allows(p, command)) {
        Ok(())
    } else {
        Err(ToolError::Failed(format!(
            "command not allowed: this agent's shell only runs commands matching {}",
            list()
        )))
    }
}

/// Whether `pattern` (`*` wildcards; a trailing `:*` means "with or without arguments")
/// matches the whole of `command`.
fn pattern_allows(pattern: &str, command: &str) -> bool {
    let pattern = pattern.trim();
    match pattern.strip_suffix(":*") {
        Some(prefix) => {
            wildcard_match(prefix, command) || wildcard_match(&format!("{prefix} *"), command)
        }
        None => wildcard_match(pattern, command),
    }
}

/// Matches `text` against `pattern`, where `*` stands for any run of characters.
fn wildcard_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Runs `command` and formats what happened.
async fn run(command: &str, context: &Context<'_>, timeout: Duration) -> Result<String, ToolError> {
    let wd = context.workdir.path();
    let tmp = context
        .scratch
        .path()
        .map_err(|e| ToolError::Failed(format!("cannot make the task's TMPDIR: {e}")))?;
    let mut cmd = helper::command(context.sandbox, &[wd, tmp], "sh", &["-c", command])
        .map_err(|e| ToolError::Failed(format!("cannot start the sandbox: {e}")))?;
    cmd.current_dir(wd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .env_clear()
        .envs(context.env.select(std::env::vars_os()))
        .env("TMPDIR", tmp)
        // A `summon delegate` run from here is refused: subagents cannot delegate.
        .env(crate::subagent::NESTED_ENV, "1");
    if let Some(traceparent) = context.traceparent.or(context.env.traceparent()) {
        cmd.env("TRACEPARENT", traceparent);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| ToolError::Failed(format!("cannot start `sh`: {e}")))?;
    // Killed with every process it started when the call ends in any way, including when
    // the task is cancelled and this future dropped.
    let group = child.id().map(ProcessGroup::new);
    let stdout = child.stdout.take().map(|s| tokio::spawn(read_capped(s)));
    let stderr = child.stderr.take().map(|s| tokio::spawn(read_capped(s)));

    let waited = tokio::time::timeout(timeout, child.wait()).await;
    drop(group);
    let status = match waited {
        Ok(Ok(status)) => Some(status),
        Ok(Err(e)) => {
            let _ = child.kill().await;
            return Err(ToolError::Failed(format!(
                "waiting for the command failed: {e}"
            )));
        }
        Err(_) => {
            let _ = child.kill().await;
            None
        }
    };

    let readers: Vec<_> = [&stdout, &stderr]
        .into_iter()
        .flatten()
        .map(|task| task.abort_handle())
        .collect();
    let collect = async {
        let out = match stdout {
            Some(task) => task.await.unwrap_or_default(),
            None => Captured::default(),
        };
        let err = match stderr {
            Some(task) => task.await.unwrap_or_default(),
            None => Captured::default(),
        };
        (out, err)
    };
    let (out, err, incomplete) = match tokio::time::timeout(DRAIN_GRACE, collect).await {
        Ok((out, err)) => (out, err, false),
        // A process that left the group still holds the pipes: stop reading them.
        Err(_) => {
            readers.iter().for_each(tokio::task::AbortHandle::abort);
            (Captured::default(), Captured::default(), true)
        }
    };
    let mut text = match status {
        Some(status) => describe(status),
        None => format!(
            "command timed out after {} s and was killed, with every process it started",
            timeout.as_secs()
        ),
    };
    append_stream(&mut text, "stdout", &out);
    append_stream(&mut text, "stderr", &err);
    if incomplete {
        text.push_str(
            "\n[output not captured: a process that left the command's process group kept it open]",
        );
    }
    if status.is_some_and(|s| !s.success())
        && context.sandbox.policy != Policy::Off
        && let Some(line) = denial_note(context.sandbox, &out, &err)
    {
        text.push('\n');
        text.push_str(&line);
    }
    match status {
        Some(_) => Ok(text),
        None => Err(ToolError::Failed(text)),
    }
}

/// One line saying a failure may be the sandbox's doing, when the output has the errors the
/// sandbox causes, so that a denial is not mistaken for a bug.
fn denial_note(sandbox: Sandbox, out: &Captured, err: &Captured) -> Option<String> {
    const SIGNS: [&str; 3] = [
        "Permission denied",
        "Operation not permitted",
        "Read-only file system",
    ];
    let denied = [out, err].iter().any(|c| {
        let text = String::from_utf8_lossy(&c.bytes);
        SIGNS.iter().any(|sign| text.contains(sign))
    });
    if !denied {
        return None;
    }
    let allowed = match sandbox.policy {
        Policy::ReadOnly => "writes nowhere",
        _ => "writes only in the working directory, not in its .git or .summon, and in $TMPDIR",
    };
    let network = if sandbox.network {
        "network allowed"
    } else {
        "no network"
    };
    Some(format!(
        "[sandbox: this command ran under the `{}` policy ({allowed}, {network}); a \"Permission \
         denied\", \"Operation not permitted\" or \"Read-only file system\" above may be the \
         sandbox refusing]",
        sandbox.policy
    ))
}

/// `exit code: N`, or the signal that ended the command.
fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code: {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "exit status unknown".to_owned(),
    }
}

fn append_stream(text: &mut String, name: &str, captured: &Captured) {
    if captured.total == 0 {
        return;
    }
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!("[{name}]\n"));
    text.push_str(&String::from_utf8_lossy(&captured.bytes));
    if captured.total > captured.bytes.len() as u64 {
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!(
            "[{name} truncated: showed the first {} KiB of {} bytes]",
            OUTPUT_CAP / 1024,
            captured.total
        ));
    }
}

/// What a stream produced: its first [`OUTPUT_CAP`] bytes and how many there were in all.
#[derive(Debug, Default)]
struct Captured {
    bytes: Vec<u8>,
    total: u64,
}

/// Reads `stream` to its end, keeping the first [`OUTPUT_CAP`] bytes.
async fn read_capped(mut stream: impl AsyncRead + Unpin) -> Captured {
    let mut captured = Captured::default();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return captured,
            Ok(n) => {
                let room = OUTPUT_CAP.saturating_sub(captured.bytes.len());
                captured.bytes.extend_from_slice(&buf[..n.min(room)]);
                captured.total += n as u64;
            }
        }
    }
}

/// A running command's process group, killed (every process of it) when dropped.
struct ProcessGroup(u32);

impl ProcessGroup {
    fn new(pgid: u32) -> Self {
        crate::process::groups::register(pgid);
        Self(pgid)
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        crate::process::groups::kill(self.0);
        crate::process::groups::unregister(self.0);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use serde_json::json;

    use super::*;
    use crate::subagent::tool::test_support::Sandbox;

    /// Unit tests run commands unsandboxed: the test binary is not summon, which the
    /// sandbox starts (the integration tests in tests/sandbox.rs cover it).
    const OFF: crate::sandbox::Sandbox = crate::sandbox::Sandbox {
        policy: Policy::Off,
        network: false,
    };

    async fn sh(sb: &Sandbox, args: Value) -> Result<String, ToolError> {
        let scratch = Scratch::default();
        let context = Context {
            workdir: &sb.wd,
            scratch: &scratch,
            sandbox: OFF,
            env: &CommandEnv::default(),
            traceparent: None,
        };
        shell(&args, &context, None).await
    }

    #[tokio::test]
    async fn exit_code_and_streams() {
        let sb = Sandbox::new();
        let out = sh(&sb, json!({"command": "echo out; echo err >&2; exit 3"}))
            .await
            .unwrap();
        assert_eq!(out, "exit code: 3\n[stdout]\nout\n[stderr]\nerr\n");
        let out = sh(&sb, json!({"command": "pwd"})).await.unwrap();
        assert_eq!(
            out,
            format!("exit code: 0\n[stdout]\n{}\n", sb.root().display())
        );
        // stdin is empty, so `cat` ends at once.
        assert_eq!(
            sh(&sb, json!({"command": "cat"})).await.unwrap(),
            "exit code: 0"
        );
        let out = sh(&sb, json!({"command": "kill -TERM $$"})).await.unwrap();
        assert_eq!(out, "killed by signal 15");
        sh(&sb, json!({"command": "echo made > made.txt"}))
            .await
            .unwrap();
        assert_eq!(sb.read("made.txt"), "made\n");
    }

    #[tokio::test]
    async fn bad_arguments() {
        let sb = Sandbox::new();
        for (args, expected) in [
            (json!({}), "missing required field `command`"),
            (
                json!({"command": "true", "timeout_secs": 0}),
                "between 1 and 3600",
            ),
            (
                json!({"command": "true", "timeout_secs": 3601}),
                "between 1 and 3600",
            ),
            (json!({"command": "  "}), "`command` is empty"),
            (json!("not json"), "not valid JSON"),
        ] {
            let err = sh(&sb, args).await.unwrap_err();
            assert!(err.to_string().contains(expected), "{err}");
        }
    }

    /// Whether process `pid` is gone (or a zombie nobody reaped yet).
    fn is_dead(pid: &str) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        }
    }

    async fn wait_dead(pid: &str) -> bool {
        for _ in 0..50 {
            if is_dead(pid) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    #[tokio::test]
    async fn timeout_kills_the_process_group() {
        let sb = Sandbox::new();
        let started = Instant::now();
        let err = sh(
            &sb,
            json!({"command": "sleep 100 & echo $! > bg.pid; echo partial; sleep 100", "timeout_secs": 1}),
        )
        .await
        .unwrap_err();
        let elapsed = started.elapsed();
        assert!(elapsed < Duration::from_secs(4), "took {elapsed:?}");
        let text = err.to_string();
        assert!(
            text.starts_with("command timed out after 1 s and was killed"),
            "{text}"
        );
        assert!(text.contains("[stdout]\npartial\n"), "{text}");
        let pid = sb.read("bg.pid");
        assert!(
            wait_dead(pid.trim()).await,
            "background sleep {pid} survived"
        );
    }

    #[tokio::test]
    async fn background_processes_do_not_hold_the_call() {
        let sb = Sandbox::new();
        let started = Instant::now();
        let out = sh(
            &sb,
            json!({"command": "sleep 100 & echo $! > bg.pid; echo started"}),
        )
        .await
        .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(out, "exit code: 0\n[stdout]\nstarted\n");
        let pid = sb.read("bg.pid");
        assert!(
            wait_dead(pid.trim()).await,
            "background sleep {pid} survived"
        );
    }

    #[tokio::test]
    async fn output_is_capped() {
        let sb = Sandbox::new();
        let out = sh(
            &sb,
            json!({"command": "head -c 300000 /dev/zero | tr '\\0' a; echo tail >&2"}),
        )
        .await
        .unwrap();
        let (stdout, rest) = out
            .strip_prefix("exit code: 0\n[stdout]\n")
            .unwrap()
            .split_once('\n')
            .unwrap();
        assert_eq!(stdout.len(), OUTPUT_CAP);
        assert_eq!(
            rest,
            "[stdout truncated: showed the first 128 KiB of 300000 bytes]\n[stderr]\ntail\n"
        );
    }

    #[test]
    fn wildcards() {
        for (pattern, text, expected) in [
            ("git log*", "git log", true),
            ("git log*", "git log --oneline -5", true),
            ("git log*", "git status", false),
            ("git log*", "xgit log", false),
            ("*", "anything", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
            ("cargo test", "cargo test", true),
            ("cargo test", "cargo test --all", false),
            ("npm run test:*", "npm run test", true),
            ("npm run test:*", "npm run test -- x", true),
            ("npm run test:*", "npm run testing", false),
            ("é*", "élan", true),
        ] {
            assert_eq!(
                pattern_allows(pattern, text),
                expected,
                "{pattern:?} {text:?}"
            );
        }
    }

    #[tokio::test]
    async fn restricted_shell() {
        let sb = Sandbox::new();
        let allowed = ["echo hi*".to_owned(), "true".to_owned()];
        let run = |command: &str| {
            let args = json!({ "command": command });
            let wd = sb.wd.clone();
            let allowed = allowed.clone();
            async move {
                let scratch = Scratch::default();
                let context = Context {
                    workdir: &wd,
                    scratch: &scratch,
                    sandbox: OFF,
                    env: &CommandEnv::default(),
                    traceparent: None,
                };
                shell(&args, &context, Some(&allowed[..])).await
            }
        };
        assert_eq!(
            run("echo hi there").await.unwrap(),
            "exit code: 0\n[stdout]\nhi there\n"
        );
        assert_eq!(run(" true ").await.unwrap(), "exit code: 0");
        let err = run("echo bye").await.unwrap_err().to_string();
        assert_eq!(
            err,
            "command not allowed: this agent's shell only runs commands matching `echo hi*`, `true`"
        );
        for sneaky in [
            "echo hi; touch x",
            "echo hi && touch x",
            "echo hi | tee x",
            "echo hi > x",
            "echo hi $(touch x)",
            "echo hi `touch x`",
            "echo hi\ntouch x",
        ] {
            let err = run(sneaky).await.unwrap_err().to_string();
            assert!(err.starts_with("command not allowed: it contains"), "{err}");
        }
        assert!(!sb.root().join("x").exists());
        let spec = shell_spec(Some(&allowed[..]));
        assert!(
            spec.description.contains("`echo hi*`, `true`"),
            "{}",
            spec.description
        );
        assert!(!shell_spec(None).description.contains("Restricted"));
    }
}
