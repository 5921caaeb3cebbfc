//! Crash and resume: `summon run` is killed with SIGKILL at named points — during start-up,
//! in the middle of the fan-out, inside a journal transaction (a torn write), between a
//! commit and the runner learning of it, during the synthesis and after the last step — and
//! then resumed. Every run must end complete, with no finished result lost, at most the tasks
//! in flight at the kill requested again, and the store's invariants intact (SQLite's
//! integrity check, one journal row per task, one `results.jsonl` line per task).
//!
//! Kills come from outside (`kill -KILL -- PID` once the mock has seen K requests, or once the
//! synthesis request has arrived) or from inside, through the test-only hook
//! `SUMMON_TEST_CRASH_AT=POINT[:N]` (the process sends itself SIGKILL the N-th time it passes
//! POINT). Background workers and the callers waiting on them are killed too.
//!
//! With `SUMMON_FIGURES=FILE`, each test appends one JSON line of figures to FILE.

#![cfg(target_os = "linux")]

use crate::support;
use crate::support::figure;
use crate::support::wait_for;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use summon_mock_llm::{Api, MockConfig, MockServer, Reply};
use support::Test;

const KEY: &str = "sk-test-crash-0123456789abcdef";
const ITEMS: usize = 120;
const CONCURRENCY: usize = 8;
const SYNTHESIS: &str = "Merge the notes";

/// Where a run is killed.
#[derive(Debug, Clone, Copy)]
enum KillAt {
    /// From outside, once `.summon/state.db` exists (the store is open, nothing sent).
    StoreOpened,
    /// From outside, once the mock has seen this many requests.
    Requests(u64),
    /// From outside, once the synthesis request has arrived (its answer is slow).
    Synthesis,
    /// From inside: `SUMMON_TEST_CRASH_AT`.
    Hook(&'static str),
}

fn pipeline() -> String {
    let items: Vec<String> = (0..ITEMS).map(|i| format!("item-{i:03}")).collect();
    format!(
        "version: 1
name: crash
settings:
  concurrency: {CONCURRENCY}
steps:
  - id: list
    decompose:
      items: [{}]
  - id: notes
    fan_out:
      over: list
      instructions: \"Process {{{{ item }}}}\"
  - id: summary
    synthesize:
      instructions: |
        {SYNTHESIS}:
        {{% for r in steps.notes.results %}}{{{{ r.output }}}}
        {{% endfor %}}
outputs:
  - path: out/summary.md
    content: \"{{{{ steps.summary.output }}}}\"
",
        items.join(", ")
    )
}

async fn mock() -> MockServer {
    MockServer::start(
        MockConfig::new()
            .latency(Duration::from_millis(15))
            .rule(|request| {
                let text = request.last_user_text().unwrap_or_default();
                if text.starts_with(SYNTHESIS) {
                    Reply::text("the summary").delayed(Duration::from_millis(400))
                } else {
                    Reply::Echo
                }
            }),
    )
    .await
}

fn project(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .write_raw("p.yaml", &pipeline())
}

const ARGS: [&str; 5] = ["run", "p.yaml", "--out", "out", "--quiet"];

fn spawn(t: &Test, extra: &[&str], env: &[(&str, &str)]) -> Child {
    let mut command = t.command();
    command
        .args(ARGS)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    command.spawn().expect("spawn summon run")
}

/// `kill -KILL -- PID`.
fn kill_9(pid: u32) {
    let status = Command::new("kill")
        .args(["-KILL", "--", &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .expect("kill");
    assert!(status.success(), "kill -KILL -- {pid} failed");
}

fn db(dir: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open_with_flags(
        dir.join(".summon/state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE,
    )
    .expect("open state.db")
}

/// The `(step, index)` of every task the journal holds as completed.
fn committed(dir: &Path) -> BTreeSet<(String, u64)> {
    if !dir.join(".summon/state.db").exists() {
        return BTreeSet::new();
    }
    let conn = db(dir);
    // Killed while the store was being created: no tables yet.
    let Ok(mut stmt) =
        conn.prepare("SELECT step_id, item_index FROM run_tasks WHERE status = 'completed'")
    else {
        return BTreeSet::new();
    };
    stmt.query_map([], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
    })
    .expect("rows")
    .map(|r| r.expect("row"))
    .collect()
}

/// The task key (`(step, index)`) a chat request belongs to.
fn task_of(text: &str) -> (String, u64) {
    match text.strip_prefix("Process item-") {
        Some(n) => ("notes".to_owned(), n.parse().expect("item number")),
        None => {
            assert!(text.starts_with(SYNTHESIS), "unexpected request: {text}");
            ("summary".to_owned(), 0)
        }
    }
}

/// Requests per task among the chat requests with arrival number in `range`.
fn requests_per_task(
    server: &MockServer,
    range: std::ops::Range<u64>,
) -> BTreeMap<(String, u64), usize> {
    let mut counts = BTreeMap::new();
    for request in server.requests() {
        if request.api == Api::OpenAi && range.contains(&request.seq) {
            *counts
                .entry(task_of(&request.last_user_text().unwrap_or_default()))
                .or_default() += 1;
        }
    }
    counts
}

/// Kills the run started by `child` at `at`; returns the request count at the kill.
fn kill_at(t: &Test, server: &MockServer, mut child: Child, at: KillAt) -> u64 {
    let limit = Duration::from_secs(30);
    match at {
        KillAt::StoreOpened => wait_for(limit, "the store", || {
            t.path().join(".summon/state.db").exists()
        }),
        KillAt::Requests(k) => wait_for(limit, "K requests", || server.request_count() >= k),
        KillAt::Synthesis => wait_for(limit, "the synthesis request", || {
            server.requests().iter().any(|r| {
                r.last_user_text()
                    .is_some_and(|text| text.starts_with(SYNTHESIS))
            })
        }),
        KillAt::Hook(_) => {}
    }
    if !matches!(at, KillAt::Hook(_)) {
        kill_9(child.id());
    }
    let status = child.wait().expect("wait");
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        use std::io::Read;
        let _ = pipe.read_to_string(&mut stderr);
    }
    assert_eq!(
        status.signal(),
        Some(9),
        "{at:?}: the run was not killed ({status:?}): {stderr}"
    );
    server.request_count()
}

/// Checks the store and the outputs of a finished run.
/// Whether the store has journaled a run.
fn has_run(dir: &Path) -> bool {
    dir.join(".summon/state.db").exists()
        && db(dir)
            .query_row("SELECT COUNT(*) FROM runs", [], |r| r.get::<_, i64>(0))
            .is_ok_and(|n| n > 0)
}

fn check_invariants(dir: &Path, label: &str) {
    let conn = db(dir);
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(integrity, "ok", "{label}");
    let dupes: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM (SELECT 1 FROM run_tasks GROUP BY run_id, step_id, item_index \
             HAVING COUNT(*) > 1)",
            [],
            |r| r.get(0),
        )
        .expect("duplicates");
    assert_eq!(dupes, 0, "{label}: two journal rows for one task");
    let (runs, status): (i64, String) = conn
        .query_row("SELECT COUNT(*), MAX(status) FROM runs", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .expect("runs");
    assert_eq!((runs, status.as_str()), (1, "completed"), "{label}");
    let rows: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM run_tasks WHERE status = 'completed'",
            [],
            |r| r.get(0),
        )
        .expect("rows");
    assert_eq!(rows as usize, ITEMS + 1, "{label}: journal rows");

    let text = std::fs::read_to_string(dir.join("out/results.jsonl")).expect("results.jsonl");
    let mut seen = BTreeSet::new();
    for line in text.lines() {
        let value: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{label}: torn line ({e}): {line}"));
        let key = (
            value["step"].as_str().unwrap().to_owned(),
            value["index"].as_u64().unwrap(),
        );
        assert_eq!(value["status"], "completed", "{label}: {line}");
        if key.0 == "notes" {
            assert_eq!(
                value["output"],
                format!("echo: Process item-{:03}", key.1),
                "{label}"
            );
        }
        assert!(
            seen.insert(key.clone()),
            "{label}: {key:?} twice in results.jsonl"
        );
    }
    assert_eq!(seen.len(), ITEMS + 1, "{label}: results.jsonl lines");
    let summary = std::fs::read_to_string(dir.join("out/summary.md")).expect("outputs file");
    assert_eq!(summary, "the summary\n", "{label}");
}

/// One kill point: run, kill, (kill the resume too when `again` is given), resume, check.
async fn crash_and_resume(label: &str, at: KillAt, again: Option<&'static str>) -> Value {
    let server = mock().await;
    let t = project(&server);
    let env: Vec<(&str, &str)> = match at {
        KillAt::Hook(point) => vec![("SUMMON_TEST_CRASH_AT", point)],
        _ => Vec::new(),
    };
    let child = spawn(&t, &[], &env);
    let mut killed_at = kill_at(&t, &server, child, at);
    let mut kills = 1;
    let mut finished = committed(t.path());
    if let Some(point) = again {
        let child = spawn(&t, &["--resume"], &[("SUMMON_TEST_CRASH_AT", point)]);
        killed_at = kill_at(&t, &server, child, KillAt::Hook(point));
        kills += 1;
        let now = committed(t.path());
        assert!(
            finished.is_subset(&now),
            "{label}: the second kill lost results"
        );
        finished = now;
    }
    let before = requests_per_task(&server, 0..killed_at);

    // Killed before the run was journaled: there is nothing to resume, and a new run
    // starts on the store the kill left behind.
    let resume_args: &[&str] = if has_run(t.path()) {
        &["--resume"]
    } else {
        let (code, _, stderr) = summon(&t, &[&ARGS[..], &["--resume"]].concat());
        assert_eq!(code, 1, "{label}: {stderr}");
        assert!(stderr.contains("no earlier run"), "{label}: {stderr}");
        &[]
    };
    let resume = t
        .command()
        .args(ARGS)
        .args(resume_args)
        .output()
        .expect("resume");
    assert_eq!(
        resume.status.code(),
        Some(0),
        "{label}: {}",
        String::from_utf8_lossy(&resume.stderr)
    );
    let after = requests_per_task(&server, killed_at..u64::MAX);

    // No finished task is requested again; every other task is, and at most the tasks in
    // flight at the kill were requested on both sides of it.
    for task in &finished {
        assert!(
            !after.contains_key(task),
            "{label}: {task:?} was committed before the kill and ran again"
        );
    }
    let repeated: Vec<_> = after.keys().filter(|k| before.contains_key(*k)).collect();
    assert!(
        repeated.len() <= CONCURRENCY * kills,
        "{label}: {} tasks repeated: {repeated:?}",
        repeated.len()
    );
    let all: BTreeSet<_> = before.keys().chain(after.keys()).cloned().collect();
    assert_eq!(all.len(), ITEMS + 1, "{label}: every task was requested");
    check_invariants(t.path(), label);
    json!({
        "kill_point": label,
        "kills": kills,
        "finished_before_kill": finished.len(),
        "repeated": repeated.len(),
        "results_lost": 0,
    })
}

macro_rules! kill_point {
    ($name:ident, $label:literal, $at:expr) => {
        kill_point!($name, $label, $at, None);
    };
    ($name:ident, $label:literal, $at:expr, $again:expr) => {
        #[tokio::test(flavor = "multi_thread")]
        async fn $name() {
            let mut line = crash_and_resume($label, $at, $again).await;
            line["suite"] = json!("crash");
            figure(line);
        }
    };
}

kill_point!(
    startup_store_opened,
    "start-up: store opened",
    KillAt::StoreOpened
);
kill_point!(
    startup_run_created,
    "start-up: run journaled",
    KillAt::Hook("run-created")
);
kill_point!(
    fan_out_first_request,
    "fan-out: first request",
    KillAt::Requests(1)
);
kill_point!(
    fan_out_a_third,
    "fan-out: 40 requests",
    KillAt::Requests(40)
);
kill_point!(fan_out_most, "fan-out: 100 requests", KillAt::Requests(100));
kill_point!(
    journal_first_commit_torn,
    "journal: first commit torn",
    KillAt::Hook("journal-commit")
);
kill_point!(
    journal_eighth_commit_torn,
    "journal: 8th commit torn",
    KillAt::Hook("journal-commit:8")
);
kill_point!(
    journal_after_commit,
    "journal: after 5th commit",
    KillAt::Hook("journal-committed:5")
);
kill_point!(
    results_line_buffered,
    "results: 60th line buffered",
    KillAt::Hook("task-recorded:60")
);
kill_point!(
    synthesis_in_flight,
    "synthesis: request in flight",
    KillAt::Synthesis
);
kill_point!(
    after_the_last_step,
    "end: steps done, nothing flushed",
    KillAt::Hook("steps-done")
);
kill_point!(
    twice_torn_then_in_resume,
    "twice: torn commit, then the resume at its 30th result",
    KillAt::Hook("journal-commit:4"),
    Some("task-recorded:30")
);

// ---------------------------------------------------------------------------------------------
// Background workers and their callers.

/// The pid of the `summon __worker ID` process running in `dir`.
fn worker_pid(dir: &Path, id: &str) -> Option<u32> {
    let dir = dir.canonicalize().ok()?;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.len() >= 3
            && args[1] == "__worker"
            && args[2] == id
            && std::fs::read_link(entry.path().join("cwd")).ok().as_deref() == Some(dir.as_path())
        {
            return Some(pid);
        }
    }
    None
}

fn summon(t: &Test, args: &[&str]) -> (i32, String, String) {
    let output = t
        .command()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run summon");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn start(t: &Test, instructions: &str) -> String {
    let (code, stdout, stderr) = summon(
        t,
        &[
            "delegate",
            "--async",
            "--json",
            "--instructions",
            instructions,
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let answer: Value = serde_json::from_str(&stdout).expect("JSON");
    answer["task_id"].as_str().expect("task id").to_owned()
}

fn task_status(t: &Test, id: &str) -> Value {
    let (code, stdout, stderr) = summon(t, &["tasks", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let answer: Value = serde_json::from_str(&stdout).expect("JSON");
    answer["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .find(|task| task["id"] == id)
        .cloned()
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_killed_with_9_fails_its_task_and_a_killed_caller_loses_nothing() {
    let server = MockServer::start(MockConfig::new().rule(|request| {
        let text = request.last_user_text().unwrap_or_default();
        if text.contains("hang") {
            Reply::Echo.delayed(Duration::from_secs(60))
        } else {
            Reply::Echo.delayed(Duration::from_millis(1500))
        }
    }))
    .await;
    let t = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model");

    // The worker dies mid-request: the next command marks its task failed.
    let hanging = start(&t, "hang here");
    let mut pid = None;
    wait_for(Duration::from_secs(10), "the worker's request", || {
        pid = worker_pid(t.path(), &hanging);
        pid.is_some() && server.request_count() >= 1
    });
    let pid = pid.expect("worker pid");
    kill_9(pid);
    // Gone or a zombie, as summon sees it (its command line empties earlier, while it exits).
    wait_for(Duration::from_secs(5), "the worker to die", || {
        !crate::support::mcp::alive(pid)
    });
    let task = task_status(&t, &hanging);
    assert_eq!(task["status"], "failed", "{task}");
    assert!(
        task["error"]
            .as_str()
            .unwrap_or_default()
            .contains("worker died"),
        "{task}"
    );

    // The caller waiting on a task dies: the task goes on, its result is kept.
    let id = start(&t, "steady work");
    let mut waiting = t
        .command()
        .args(["load", &id])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("summon load");
    wait_for(Duration::from_secs(10), "the task's request", || {
        server.request_count() >= 2
    });
    kill_9(waiting.id());
    waiting.wait().expect("wait");
    let (code, stdout, stderr) = summon(&t, &["load", &id, "--json", "--timeout", "20"]);
    assert_eq!(code, 0, "{stderr}");
    let result: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["output"], "echo: steady work");

    // The store is whole, and the ids are distinct.
    let conn = db(t.path());
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity");
    assert_eq!(integrity, "ok");
    assert_ne!(hanging, id);
    figure(
        json!({"suite": "crash", "kill_point": "background: worker and caller", "kills": 2, "results_lost": 0}),
    );
}
