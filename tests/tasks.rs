//! Background tasks with real processes: `summon delegate --async` starts a detached worker
//! (`summon __worker ID`) that talks to a mock LLM server living in this test process, and
//! later `summon` processes (`tasks`, `load ID`, `--peek`, `--cancel`) read the shared store.
//!
//! Every test runs its commands one after another in ONE project directory ([`Project`]), and
//! kills the workers still running in that directory when it ends (even on panic). Waiting is
//! always polling for a condition with a deadline, never a bare sleep.

#![cfg(target_os = "linux")]

use crate::support;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, RecordedRequest, Reply};
use support::Test;

const KEY: &str = "sk-test-0123456789abcdef";
const REFUSED: &str = "Maximum number of background tasks (5) reached";

/// What one command printed, and how long it took.
#[derive(Debug)]
struct Run {
    stdout: String,
    stderr: String,
    code: i32,
    elapsed: Duration,
}

impl Run {
    #[track_caller]
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\n--- stderr\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

/// A project directory wired to the mock, where several commands run in turn. Dropping it
/// kills the workers still running in it.
struct Project {
    test: Test,
    /// The canonical project path (what `/proc/PID/cwd` of a worker points to).
    dir: PathBuf,
}

impl Project {
    fn new(server: &MockServer) -> Self {
        Self::with_env(server, &[])
    }

    fn with_env(server: &MockServer, env: &[(&str, &str)]) -> Self {
        let mut test = Test::new()
            .env("OPENAI_BASE_URL", &server.url_openai())
            .env("OPENAI_API_KEY", KEY)
            .env("SUMMON_MODEL", "mock-model");
        for (key, value) in env {
            test = test.env(key, value);
        }
        let dir = test.path().canonicalize().expect("canonical temp dir");
        Self { test, dir }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = self.test.command();
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }

    /// Runs `summon ARGS` in the project, whatever the exit code.
    fn run(&self, args: &[&str]) -> Run {
        let started = Instant::now();
        let output = self.command(args).output().expect("run summon");
        Run {
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            code: output.status.code().unwrap_or(-1),
            elapsed: started.elapsed(),
        }
    }

    /// Runs `summon ARGS` and checks the exit code.
    #[track_caller]
    fn expect(&self, code: i32, args: &[&str]) -> Run {
        let run = self.run(args);
        assert_eq!(
            run.code, code,
            "unexpected exit code for {args:?}\n--- stdout\n{}\n--- stderr\n{}",
            run.stdout, run.stderr
        );
        run
    }

    #[track_caller]
    fn ok(&self, args: &[&str]) -> Run {
        self.expect(0, args)
    }

    /// `delegate --async --json` (plus `extra` flags): the answer object.
    #[track_caller]
    fn start_with(&self, instructions: &str, extra: &[&str]) -> Value {
        let mut args = vec![
            "delegate",
            "--async",
            "--json",
            "--instructions",
            instructions,
        ];
        args.extend_from_slice(extra);
        let answer = self.ok(&args).json();
        assert_id(answer["task_id"].as_str().expect("task_id"));
        answer
    }

    /// Starts a task, returns its id.
    #[track_caller]
    fn start(&self, instructions: &str) -> String {
        self.start_with(instructions, &[])["task_id"]
            .as_str()
            .expect("task_id")
            .to_owned()
    }

    /// `summon tasks --json`, checked.
    #[track_caller]
    fn tasks(&self) -> Vec<Value> {
        let answer = self.ok(&["tasks", "--json"]).json();
        answer["tasks"].as_array().expect("tasks array").clone()
    }

    #[track_caller]
    fn task(&self, id: &str) -> Option<Value> {
        self.tasks().into_iter().find(|t| t["id"] == id)
    }

    /// The pids of the live worker processes of this project, with their task ids.
    fn workers(&self) -> Vec<(u32, String)> {
        let mut found = Vec::new();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return found;
        };
        for entry in entries.flatten() {
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
            if args.len() < 3 || args[1] != "__worker" || !args[0].ends_with("summon") {
                continue;
            }
            let cwd = std::fs::read_link(entry.path().join("cwd")).ok();
            if cwd.as_deref() == Some(self.dir.as_path()) && pid_alive(pid) {
                found.push((pid, args[2].clone()));
            }
        }
        found
    }

    /// The pid of the worker of task `id`, waiting a little for it to appear.
    #[track_caller]
    fn worker_pid(&self, id: &str) -> u32 {
        wait_until(
            &format!("the worker of {id}"),
            Duration::from_secs(5),
            || {
                self.workers()
                    .into_iter()
                    .find(|(_, task)| task == id)
                    .map(|(pid, _)| pid)
            },
        )
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        for (pid, _) in self.workers() {
            // The worker leads its own process group; take its children with it.
            signal("KILL", &format!("-{pid}"));
            signal("KILL", &pid.to_string());
        }
    }
}

/// `kill -SIG -- TARGET`; whether it was delivered.
fn signal(sig: &str, target: &str) -> bool {
    Command::new("kill")
        .args([&format!("-{sig}"), "--", target])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `/proc/PID/stat` fields after the command name: state, ppid, pgrp, session, ...
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// The process exists and is not a zombie.
fn pid_alive(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|f| f[0] != "Z" && f[0] != "X")
}

fn session_of(pid: u32) -> u32 {
    stat_fields(pid).expect("process stat")[3]
        .parse()
        .expect("sid")
}

fn group_of(pid: u32) -> u32 {
    stat_fields(pid).expect("process stat")[2]
        .parse()
        .expect("pgrp")
}

/// Polls `check` (every 50 ms) until it gives a value; panics after `timeout`.
#[track_caller]
fn wait_until<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Today's `YYYYMMDD` in UTC.
fn today() -> String {
    jiff::Timestamp::now().strftime("%Y%m%d").to_string()
}

/// `YYYYMMDD_N` with today's UTC date.
#[track_caller]
fn assert_id(id: &str) {
    let (date, n) = id.split_once('_').unwrap_or_else(|| panic!("bad id {id}"));
    assert!(
        date.len() == 8 && date.bytes().all(|b| b.is_ascii_digit()),
        "bad id {id}"
    );
    assert!(
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()),
        "bad id {id}"
    );
    let before = today();
    assert!(date == before || date == today(), "{id} is not dated today");
}

/// The instructions a request carries (its last user message).
fn instructions_of(request: &RecordedRequest) -> String {
    request.last_user_text().unwrap_or_default()
}

// 1 and 10: the cap, the refusal, the queue, and collecting every result.
#[tokio::test(flavor = "multi_thread")]
async fn five_run_the_sixth_is_refused_and_a_queued_one_waits_for_a_slot() {
    let latency = Duration::from_secs(3);
    let server = MockServer::start(MockConfig::new().latency(latency)).await;
    let p = Project::new(&server);
    let own_session = session_of(std::process::id());

    let mut ids = Vec::new();
    for i in 1..=5 {
        let answer = p.start_with(&format!("job number {i}"), &[]);
        assert_eq!(answer["status"], "running", "{answer}");
        assert_eq!(answer["description"], format!("job number {i}"));
        ids.push(answer["task_id"].as_str().unwrap().to_owned());
    }
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len(), 5, "{ids:?}");

    // Each worker is a separate process leading its own session: the caller (already gone)
    // and a Ctrl-C of the caller's terminal cannot reach it.
    for id in &ids {
        let pid = p.worker_pid(id);
        assert_eq!(
            session_of(pid),
            pid,
            "worker {pid} of {id} leads no session"
        );
        assert_ne!(session_of(pid), own_session);
        assert_eq!(group_of(pid), pid);
    }

    let refused = p.expect(
        1,
        &["delegate", "--async", "--instructions", "job number 6"],
    );
    assert!(refused.stderr.contains(REFUSED), "{}", refused.stderr);
    assert!(refused.stdout.is_empty(), "{}", refused.stdout);
    assert_eq!(p.tasks().len(), 5, "a refused task is not recorded");

    let queued = p.start_with("job number 6", &["--queue"]);
    assert_eq!(queued["status"], "queued", "{queued}");
    let queued_id = queued["task_id"].as_str().unwrap().to_owned();
    assert!(!ids.contains(&queued_id));
    let listed = p.task(&queued_id).expect("queued task listed");
    assert_eq!(listed["status"], "queued");
    ids.push(queued_id.clone());

    // Every result, each the mock's answer to ITS instructions.
    for (i, id) in ids.iter().enumerate() {
        let result = p.ok(&["load", id, "--json", "--timeout", "30"]).json();
        assert_eq!(result["status"], "completed", "{result}");
        assert_eq!(result["still_running"], false);
        assert_eq!(result["output"], format!("echo: job number {}", i + 1));
        assert_eq!(result["turns"], 1);
    }

    // The queued task only reached the model once a slot was free: after a first reply.
    let requests = server.requests();
    let chat: Vec<&RecordedRequest> = requests
        .iter()
        .filter(|r| r.path.ends_with("/chat/completions"))
        .collect();
    assert_eq!(chat.len(), 6, "one model request per task");
    let first = chat.iter().map(|r| r.received_at).min().unwrap();
    let sixth = chat
        .iter()
        .find(|r| instructions_of(r) == "job number 6")
        .expect("request of the queued task");
    assert!(
        sixth.received_at.duration_since(first) >= latency - Duration::from_millis(300),
        "the queued task ran before a slot was free ({:?} after the first request)",
        sixth.received_at.duration_since(first)
    );
    assert!(server.peak_in_flight() <= 5, "{}", server.peak_in_flight());
}

// 2: the caller does not wait for the model.
#[tokio::test(flavor = "multi_thread")]
async fn the_caller_returns_at_once() {
    let server = MockServer::start(MockConfig::new().latency(Duration::from_secs(5))).await;
    let p = Project::new(&server);
    let mut times = Vec::new();
    for i in 0..3 {
        let run = p.ok(&[
            "delegate",
            "--async",
            "--instructions",
            &format!("quick {i}"),
        ]);
        assert!(
            run.stdout.contains("started in background: \"quick"),
            "{}",
            run.stdout
        );
        assert!(run.stdout.contains("summon load "), "{}", run.stdout);
        times.push(run.elapsed);
    }
    // The workers are still busy with the 5 s requests: the callers did not wait for them.
    assert_eq!(p.workers().len(), 3, "{:?}", p.workers());
}

// 3: peek while running, wait with a timeout, then the result, twice.
#[tokio::test(flavor = "multi_thread")]
async fn peek_while_running_then_the_result_can_be_read_twice() {
    // Long enough that the task is still running after the 1 s wait below.
    let server = MockServer::start(MockConfig::new().latency(Duration::from_secs(5))).await;
    let p = Project::new(&server);
    let id = p.start("Summarise the notes");

    let peek = p.ok(&["load", &id, "--peek"]);
    assert!(
        peek.stdout
            .starts_with(&format!("Task {id}: running (\"Summarise the notes\")")),
        "{}",
        peek.stdout
    );
    for line in ["Elapsed: ", "Turns: ", "Idle: "] {
        assert!(peek.stdout.contains(line), "{line}: {}", peek.stdout);
    }
    let peek = p.ok(&["load", &id, "--peek", "--json"]).json();
    assert_eq!(peek["status"], "running", "{peek}");
    assert!(peek["idle_secs"].is_number(), "{peek}");
    assert!(peek["recent_tool_calls"].is_array(), "{peek}");

    // A short wait ends with "still running" on stderr, exit 124, and the ways on.
    let waited = p.expect(124, &["load", &id, "--timeout", "1"]);
    assert!(
        waited
            .stderr
            .contains(&format!("Task {id} is still running")),
        "{}",
        waited.stderr
    );
    assert!(waited.stderr.contains("--cancel"), "{}", waited.stderr);
    assert!(waited.elapsed >= Duration::from_millis(900), "{waited:?}");
    let waited = p
        .expect(124, &["load", &id, "--timeout", "1", "--json"])
        .json();
    assert_eq!(waited["still_running"], true, "{waited}");

    // The answer alone on stdout; the rest on stderr.
    let first = p.ok(&["load", &id, "--timeout", "30"]);
    assert_eq!(first.stdout, "echo: Summarise the notes\n");
    let expected_head = format!("Task {id}: Summarise the notes\nStatus: completed\nDuration: ");
    assert!(first.stderr.starts_with(&expected_head), "{}", first.stderr);
    assert!(first.stderr.ends_with("\nTurns: 1\n"), "{}", first.stderr);
    let second = p.ok(&["load", &id]);
    assert_eq!(second.stdout, first.stdout, "a result reads the same twice");

    let peek = p.ok(&["load", &id, "--peek"]);
    assert!(
        peek.stdout.contains(&format!("Task {id}: completed")),
        "{}",
        peek.stdout
    );
    assert!(!peek.stdout.contains("initialising"), "{}", peek.stdout);
}

// 3: "initialising" while the first model request is still unanswered.
#[tokio::test(flavor = "multi_thread")]

async fn peek_says_initialising_before_the_first_reply() {
    let server = MockServer::start(MockConfig::new().latency(Duration::from_secs(20))).await;
    let p = Project::new(&server);
    let id = p.start("Wait for it");
    wait_until("the first model request", Duration::from_secs(10), || {
        (server.request_count() >= 1).then_some(())
    });
    let peek = p.ok(&["load", &id, "--peek"]);
    assert!(
        peek.stdout
            .contains("Task is initialising (no tool activity yet)."),
        "{}",
        peek.stdout
    );
    assert!(peek.stdout.contains("\nTurns: 0\n"), "{}", peek.stdout);
    let peek = p.ok(&["load", &id, "--peek", "--json"]).json();
    assert_eq!(peek["initialising"], true, "{peek}");
}

/// Starts one task whose model request hangs (the mock answers after 30 s), and waits until
/// the request is in flight. Returns the id and the worker pid.
fn start_hanging(p: &Project, server: &MockServer, instructions: &str) -> (String, u32) {
    let before = server.request_count();
    let id = p.start(instructions);
    wait_until("the model request", Duration::from_secs(10), || {
        (server.request_count() > before).then_some(())
    });
    let pid = p.worker_pid(&id);
    (id, pid)
}

// 4: cancel a running task; the worker stops by itself.
#[tokio::test(flavor = "multi_thread")]
async fn cancel_stops_a_running_task() {
    let server = MockServer::start(MockConfig::new().latency(Duration::from_secs(30))).await;
    let p = Project::new(&server);
    let (id, pid) = start_hanging(&p, &server, "Take your time");

    let cancelled = p.expect(2, &["load", &id, "--cancel"]);
    // It stopped by itself, within the grace: nothing was killed.
    assert!(
        !cancelled.stderr.contains("was killed"),
        "{}",
        cancelled.stderr
    );
    assert!(
        cancelled
            .stderr
            .starts_with(&format!("Task {id}: Take your time\n")),
        "{}",
        cancelled.stderr
    );
    assert!(
        cancelled.stderr.contains("\nStatus: cancelled\n"),
        "{}",
        cancelled.stderr
    );
    // Nothing was answered before the cancel.
    assert_eq!(cancelled.stdout, "");
    let returned = Instant::now();
    wait_until("the worker to exit", Duration::from_secs(3), || {
        (!pid_alive(pid)).then_some(())
    });
    eprintln!(
        "worker gone {:?} after load --cancel returned",
        returned.elapsed()
    );

    let task = p.task(&id).expect("cancelled task still listed");
    assert_eq!(task["status"], "cancelled", "{task}");
    // Still collectable, still cancelled, exit 2.
    let again = p.expect(2, &["load", &id, "--json"]).json();
    assert_eq!(again["status"], "cancelled", "{again}");
    // Cancelling a finished task changes nothing.
    let twice = p.expect(2, &["load", &id, "--cancel"]);
    assert!(
        twice.stderr.contains("\nStatus: cancelled\n"),
        "{}",
        twice.stderr
    );
}

// 4: a worker that does not react (stopped with SIGSTOP) is killed after the grace
// (`SUMMON_CANCEL_GRACE_MS`, 5 s by default).
#[tokio::test(flavor = "multi_thread")]
async fn cancel_kills_a_worker_that_does_not_stop() {
    let server = MockServer::start(MockConfig::new().latency(Duration::from_secs(30))).await;
    let p = Project::with_env(&server, &[("SUMMON_CANCEL_GRACE_MS", "300")]);
    let (id, pid) = start_hanging(&p, &server, "Ignore the cancel");
    assert!(signal("STOP", &pid.to_string()));

    let cancelled = p.expect(2, &["load", &id, "--cancel"]);
    assert!(
        cancelled
            .stderr
            .contains("summon: the worker did not stop within 300 ms and was killed\n"),
        "{}",
        cancelled.stderr
    );
    // It was given its grace first.
    assert!(
        cancelled.elapsed >= Duration::from_millis(300),
        "{:?}",
        cancelled.elapsed
    );
    assert!(
        cancelled.stderr.contains("\nStatus: cancelled\n"),
        "{}",
        cancelled.stderr
    );
    wait_until("the worker to be killed", Duration::from_secs(3), || {
        (!pid_alive(pid)).then_some(())
    });
    assert_eq!(p.task(&id).expect("listed")["status"], "cancelled");
}

// 5: kill -9 of a worker: the next command sees it, the task fails, and its slot is freed.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_worker_fails_its_task_and_frees_its_slot() {
    // "slow" tasks hang for 30 s; the others answer at once.
    let server = MockServer::start(MockConfig::new().rule(|request| {
        if instructions_of(request).contains("slow") {
            Reply::Echo.delayed(Duration::from_secs(30))
        } else {
            Reply::Echo
        }
    }))
    .await;
    let p = Project::with_env(&server, &[("SUMMON_MAX_BACKGROUND_TASKS", "1")]);
    let (id, pid) = start_hanging(&p, &server, "slow work");
    let waiting = p.start_with("quick work", &["--queue"]);
    assert_eq!(waiting["status"], "queued", "{waiting}");
    let waiting = waiting["task_id"].as_str().unwrap().to_owned();

    assert!(signal("KILL", &pid.to_string()));
    wait_until("the worker to die", Duration::from_secs(5), || {
        (!pid_alive(pid)).then_some(())
    });

    // The very next command notices.
    let task = p.task(&id).expect("dead task listed");
    assert_eq!(task["status"], "failed", "{task}");
    let error = task["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("worker died"), "{task}");

    let load = p.expect(2, &["load", &id]);
    assert!(
        load.stderr.contains("\nStatus: failed\n"),
        "{}",
        load.stderr
    );
    assert!(
        load.stderr.contains("Error: worker died"),
        "{}",
        load.stderr
    );

    // The slot the dead worker held goes to the queued task.
    let result = p
        .ok(&["load", &waiting, "--json", "--timeout", "20"])
        .json();
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["output"], "echo: quick work");
}

// 6: results expire after SUMMON_COMPLETED_TASK_TTL_SECS.
#[tokio::test(flavor = "multi_thread")]
async fn a_result_expires_after_its_ttl() {
    let server = MockServer::start(MockConfig::new()).await;
    let p = Project::with_env(&server, &[("SUMMON_COMPLETED_TASK_TTL_SECS", "1")]);
    let id = p.start("Short lived");
    let result = p.ok(&["load", &id, "--json", "--timeout", "20"]).json();
    assert_eq!(result["status"], "completed", "{result}");
    let finished = Instant::now();

    // Time-based by nature: poll until the task is gone from the list.
    wait_until("the result to expire", Duration::from_secs(10), || {
        p.task(&id).is_none().then_some(())
    });
    assert!(
        finished.elapsed() >= Duration::from_millis(500),
        "expired {:?} after completion, TTL is 1 s",
        finished.elapsed()
    );
    let gone = p.expect(1, &["load", &id]);
    assert!(
        gone.stderr
            .contains(&format!("Task '{id}' not found (expired)")),
        "{}",
        gone.stderr
    );
    let listing = p.ok(&["load"]);
    assert!(!listing.stdout.contains(&id), "{}", listing.stdout);
}

// 7: 20 simultaneous `--async --queue` processes: distinct ids, never more than 5 running.
#[tokio::test(flavor = "multi_thread")]
async fn twenty_concurrent_starts_get_distinct_ids_and_respect_the_cap() {
    let server = MockServer::start(MockConfig::new().latency(Duration::from_millis(1000))).await;
    let p = Project::with_env(&server, &[("SUMMON_MAX_BACKGROUND_TASKS", "5")]);
    let children: Vec<_> = (0..20)
        .map(|i| {
            let text = format!("parallel job {i}");
            let child = p
                .command(&[
                    "delegate",
                    "--async",
                    "--queue",
                    "--json",
                    "--instructions",
                    &text,
                ])
                .spawn()
                .expect("spawn summon");
            (text, child)
        })
        .collect();
    let mut by_id: BTreeMap<String, String> = BTreeMap::new();
    for (text, child) in children {
        let output = child.wait_with_output().expect("wait");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{text}: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let answer: Value = serde_json::from_str(&stdout).expect("JSON answer");
        let id = answer["task_id"].as_str().expect("task_id").to_owned();
        assert_id(&id);
        assert!(
            answer["status"] == "running" || answer["status"] == "queued",
            "{answer}"
        );
        assert!(by_id.insert(id.clone(), text).is_none(), "id {id} twice");
    }
    assert_eq!(by_id.len(), 20);

    // Watch the tasks run: never more than 5 at once, until all 20 are done.
    let mut max_running = 0;
    wait_until("20 completed tasks", Duration::from_secs(40), || {
        let tasks = p.tasks();
        let running = tasks.iter().filter(|t| t["status"] == "running").count();
        max_running = max_running.max(running);
        let done = tasks.iter().filter(|t| t["status"] == "completed").count();
        let broken: Vec<_> = tasks
            .iter()
            .filter(|t| t["status"] == "failed" || t["status"] == "cancelled")
            .collect();
        assert!(broken.is_empty(), "{broken:?}");
        (done == 20).then_some(())
    });
    eprintln!(
        "20 tasks: max running seen {max_running}, mock peak in flight {}",
        server.peak_in_flight()
    );
    assert!(max_running <= 5, "{max_running} tasks ran at once");
    assert!(max_running >= 2, "the tasks never ran side by side");
    assert!(server.peak_in_flight() <= 5, "{}", server.peak_in_flight());

    for (id, text) in &by_id {
        let result = p.ok(&["load", id, "--json"]).json();
        assert_eq!(result["output"], format!("echo: {text}"), "{id}");
    }
}

// 8: readers while workers write: no "database is locked", no lost update.
#[tokio::test(flavor = "multi_thread")]
async fn readers_while_workers_write() {
    const CALLS: usize = 12;
    // Each task lists files CALLS times (one progress write per call), then answers.
    let server = MockServer::start(MockConfig::new().latency(Duration::from_millis(40)).rule(
        |request| {
            let tool_results = request.body["messages"]
                .as_array()
                .map_or(0, |m| m.iter().filter(|m| m["role"] == "tool").count());
            if tool_results < CALLS {
                Reply::tool_call("list_files", json!({"pattern": "*.txt"}))
            } else {
                Reply::Echo
            }
        },
    ))
    .await;
    let p = Project::new(&server);
    std::fs::write(p.dir.join("notes.txt"), "x").expect("write");
    let ids: Vec<String> = (0..5).map(|i| p.start(&format!("writer {i}"))).collect();

    let mut saw_tool_calls = false;
    for round in 0..50 {
        let id = &ids[round % ids.len()];
        let run = if round % 2 == 0 {
            p.run(&["tasks", "--json"])
        } else {
            p.run(&["load", id, "--peek", "--json"])
        };
        assert_eq!(run.code, 0, "round {round}: {}\n{}", run.stdout, run.stderr);
        assert!(!run.stderr.contains("locked"), "{}", run.stderr);
        let value = run.json();
        if round % 2 == 0 {
            assert_eq!(value["tasks"].as_array().map(Vec::len), Some(5), "{value}");
        } else {
            assert_eq!(value["id"], id.as_str(), "{value}");
            saw_tool_calls |= value["recent_tool_calls"]
                .as_array()
                .is_some_and(|c| c.iter().any(|l| l == "list_files: completed"));
        }
    }
    for (i, id) in ids.iter().enumerate() {
        let result = p.ok(&["load", id, "--json", "--timeout", "30"]).json();
        assert_eq!(result["status"], "completed", "{result}");
        assert_eq!(result["output"], format!("echo: writer {i}"));
        // Every progress write landed.
        assert_eq!(result["tool_calls"], CALLS, "{result}");
        assert_eq!(result["turns"], CALLS + 1, "{result}");
        saw_tool_calls |= result["recent_tool_calls"]
            .as_array()
            .is_some_and(|c| c.iter().any(|l| l == "list_files: completed"));
    }
    assert!(saw_tool_calls, "no tool call was ever reported");
}

// 9: unknown ids; finished tasks listed first by `summon load`; the `tasks` table.
#[tokio::test(flavor = "multi_thread")]
async fn unknown_ids_and_the_listings() {
    let server = MockServer::start(MockConfig::new()).await;
    let p = Project::new(&server);
    std::fs::create_dir_all(p.dir.join("recipes")).unwrap();
    std::fs::write(
        p.dir.join("recipes/alpha.yaml"),
        "title: Alpha\ndescription: the alpha recipe\ninstructions: Do alpha.\n",
    )
    .unwrap();

    // No store yet.
    let missing = p.expect(1, &["load", "20990101_1"]);
    assert!(missing.stderr.contains("not found"), "{}", missing.stderr);
    assert!(
        missing.stderr.contains("Task '20990101_1'"),
        "{}",
        missing.stderr
    );
    let tasks = p.ok(&["tasks"]);
    assert!(
        tasks.stdout.contains("No background tasks"),
        "{}",
        tasks.stdout
    );

    let id = p.start("Collect me");
    p.ok(&["load", &id, "--timeout", "20"]);
    let missing = p.expect(1, &["load", "20990101_1", "--peek"]);
    assert!(missing.stderr.contains("not found"), "{}", missing.stderr);

    let listing = p.ok(&["load"]);
    let head = "Completed tasks awaiting retrieval:";
    let at = listing
        .stdout
        .find(head)
        .unwrap_or_else(|| panic!("{}", listing.stdout));
    let task_at = listing.stdout.find(&id).expect("task listed");
    let recipe_at = listing.stdout.find("alpha").expect("recipe listed");
    assert!(at < task_at && task_at < recipe_at, "{}", listing.stdout);

    let table = p.ok(&["tasks"]);
    let mut lines = table.stdout.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["ID", "STATUS", "ELAPSED", "TURNS", "TASK"]);
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(row[0], id);
    assert_eq!(row[1], "completed");
    assert_eq!(row[3], "1");
    assert_eq!(&row[4..], ["Collect", "me"]);

    let json = p.task(&id).unwrap();
    for key in [
        "id",
        "status",
        "description",
        "source",
        "elapsed_secs",
        "turns",
        "tool_calls",
        "error",
    ] {
        assert!(json.get(key).is_some(), "{key} missing: {json}");
    }
}

// 10: the task outlives its caller, even when the caller's process group is signalled.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_survives_signals_to_its_callers_group() {
    use std::os::unix::process::CommandExt;
    let server = MockServer::start(MockConfig::new().latency(Duration::from_secs(2))).await;
    let p = Project::new(&server);
    let mut caller = p.command(&["delegate", "--async", "--json", "--instructions", "Outlive"]);
    caller.process_group(0);
    let child = caller.spawn().expect("spawn");
    let caller_pid = child.id();
    let output = child.wait_with_output().expect("wait");
    assert_eq!(output.status.code(), Some(0));
    let answer: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let id = answer["task_id"].as_str().unwrap().to_owned();
    let pid = p.worker_pid(&id);
    assert_ne!(
        group_of(pid),
        caller_pid,
        "the worker is in its caller's group"
    );

    // What a terminal's Ctrl-C or hang-up does to the caller's group.
    signal("INT", &format!("-{caller_pid}"));
    signal("HUP", &format!("-{caller_pid}"));
    let result = p.ok(&["load", &id, "--json", "--timeout", "20"]).json();
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["output"], "echo: Outlive");
}
