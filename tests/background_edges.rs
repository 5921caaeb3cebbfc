//! Background tasks at their edges: `delegate --async` refuses what the foreground refuses,
//! `load` tells "no result yet" (exit 124) from a result, the store is found from a subfolder
//! and never created by a reader, a finished result is collectable at once, and a subagent
//! cannot switch the nesting guard off by dropping an environment variable.
//!
//! Waiting is polling for a condition with a deadline, never a bare sleep; workers still
//! running when a test ends are killed.

#![cfg(target_os = "linux")]

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

const KEY: &str = "sk-test-0123456789abcdef";
const NESTED: &str = "cannot spawn further delegations";

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

/// A project directory where several commands run in turn; dropping it kills the workers
/// still running in it.
struct Project {
    test: Test,
    dir: PathBuf,
}

impl Project {
    /// A project wired to the mock as an OpenAI-compatible provider with a model.
    fn new(server: &MockServer) -> Self {
        Self::from_test(
            Test::new()
                .env("OPENAI_BASE_URL", &server.url_openai())
                .env("OPENAI_API_KEY", KEY)
                .env("SUMMON_MODEL", "mock-model"),
        )
    }

    fn from_test(test: Test) -> Self {
        let dir = test.path().canonicalize().expect("canonical temp dir");
        Self { test, dir }
    }

    /// Runs `summon ARGS` in `sub` (relative to the project), whatever the exit code.
    fn run_in(&self, sub: &str, args: &[&str]) -> Run {
        let cwd = self.dir.join(sub);
        std::fs::create_dir_all(&cwd).expect("mkdir");
        let started = Instant::now();
        let output = self
            .test
            .command()
            .args(args)
            .current_dir(&cwd)
            .stdin(Stdio::null())
            .output()
            .expect("run summon");
        Run {
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            code: output.status.code().unwrap_or(-1),
            elapsed: started.elapsed(),
        }
    }

    fn run(&self, args: &[&str]) -> Run {
        self.run_in("", args)
    }

    #[track_caller]
    fn expect_in(&self, sub: &str, code: i32, args: &[&str]) -> Run {
        let run = self.run_in(sub, args);
        assert_eq!(
            run.code, code,
            "unexpected exit code for {args:?} in `{sub}`\n--- stdout\n{}\n--- stderr\n{}",
            run.stdout, run.stderr
        );
        run
    }

    #[track_caller]
    fn expect(&self, code: i32, args: &[&str]) -> Run {
        self.expect_in("", code, args)
    }

    /// `delegate --async --json --instructions TEXT`: the task id.
    #[track_caller]
    fn start_in(&self, sub: &str, instructions: &str) -> String {
        let answer = self
            .expect_in(
                sub,
                0,
                &[
                    "delegate",
                    "--async",
                    "--json",
                    "--instructions",
                    instructions,
                ],
            )
            .json();
        answer["task_id"].as_str().expect("task_id").to_owned()
    }

    /// The pids of live `summon __worker` processes whose working directory is in the project.
    fn workers(&self) -> Vec<u32> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let is_worker = cmdline.split(|b| *b == 0).nth(1) == Some(b"__worker".as_slice());
            let cwd = std::fs::read_link(entry.path().join("cwd")).ok();
            if is_worker && cwd.is_some_and(|c| c.starts_with(&self.dir)) {
                found.push(pid);
            }
        }
        found
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        for pid in self.workers() {
            // The worker leads its own process group; take its children with it.
            for target in [format!("-{pid}"), pid.to_string()] {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &target])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

/// Whether a `.summon/` folder exists anywhere in `dir` or below it.
fn any_store_under(dir: &Path) -> Option<PathBuf> {
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in std::fs::read_dir(&current).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_name() == ".summon" {
                return Some(path);
            }
            if path.is_dir() {
                pending.push(path);
            }
        }
    }
    None
}

// 1: everything a foreground delegate refuses, `--async` refuses the same way, before any
// task exists.
#[tokio::test(flavor = "multi_thread")]
async fn async_refuses_what_the_foreground_refuses_without_storing_a_task() {
    let server = MockServer::start(MockConfig::new()).await;
    let recipe = "
        title: Notes
        description: d
        prompt: Notes about {{ area }}.
        parameters:
          - key: area
            input_type: string
            requirement: required
            description: the area
        ";
    let agent = "---\nname: scout\ndescription: maps\n---\nMap the code.\n";
    let cases: [(&str, &[&str], bool); 7] = [
        (
            "unknown source",
            &["--source", "nope", "--instructions", "x"],
            true,
        ),
        ("missing parameter", &["--source", "notes"], true),
        (
            "unknown parameter",
            &[
                "--source",
                "notes",
                "--param",
                "area=a",
                "--param",
                "colour=red",
            ],
            true,
        ),
        (
            "an agent with no role text given no task",
            &["--source", "blank"],
            true,
        ),
        (
            "parameters for an agent",
            &["--source", "scout", "--instructions", "x", "--param", "a=b"],
            true,
        ),
        (
            "working directory outside",
            &["--instructions", "x", "--working-dir", ".."],
            true,
        ),
        ("no model configured", &["--instructions", "x"], false),
    ];
    for (what, args, with_model) in cases {
        let mut test = Test::new()
            .env("OPENAI_BASE_URL", &server.url_openai())
            .env("OPENAI_API_KEY", KEY)
            .write("recipes/notes.yaml", recipe)
            .write(".agents/agents/scout.md", agent)
            .write(
                ".agents/agents/blank.md",
                "---\nname: blank\ndescription: nothing\n---\n",
            );
        if with_model {
            test = test.env("SUMMON_MODEL", "mock-model");
        }
        let p = Project::from_test(test);
        let mut foreground = vec!["delegate"];
        foreground.extend_from_slice(args);
        let mut background = vec!["delegate", "--async"];
        background.extend_from_slice(args);

        let fg = p.expect(1, &foreground);
        assert!(!fg.stderr.trim().is_empty(), "{what}: no message");
        let bg = p.run(&background);
        assert_eq!(
            (bg.code, bg.stderr.as_str(), bg.stdout.as_str()),
            (1, fg.stderr.as_str(), ""),
            "{what}: --async must refuse like the foreground"
        );
        background.push("--json");
        let bg = p.run(&background);
        assert_eq!(
            (bg.code, bg.stderr.as_str(), bg.stdout.as_str()),
            (1, fg.stderr.as_str(), ""),
            "{what}: --async --json must refuse like the foreground"
        );
        assert_eq!(
            any_store_under(&p.dir),
            None,
            "{what}: a refused task leaves no store"
        );
        let tasks = p.expect(0, &["tasks", "--json"]).json();
        assert_eq!(tasks, json!({"tasks": []}), "{what}");
    }
    // No task was sent (the "no model" error asks the provider which models it has).
    let chats = server
        .requests()
        .iter()
        .filter(|r| r.api != summon_mock_llm::Api::Models)
        .count();
    assert_eq!(chats, 0, "nothing was sent");
}

// 2 and SPEC §4: `load ID` prints the answer alone on stdout, metadata on stderr, and a wait
// that runs out while the task still runs exits 124.
#[tokio::test(flavor = "multi_thread")]
async fn a_load_that_stops_waiting_exits_124_and_a_result_is_the_answer_alone() {
    // Long enough that the task still runs after both 1 s waits, on a busy machine too.
    let server = MockServer::start(MockConfig::new().latency(Duration::from_secs(10))).await;
    let p = Project::new(&server);
    let id = p.start_in("", "Summarise the notes");

    let waited = p.expect(124, &["load", &id, "--timeout", "1"]);
    assert_eq!(waited.stdout, "", "no answer yet, so nothing on stdout");
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
    assert_eq!(waited["status"], "running", "{waited}");

    let done = p.expect(0, &["load", &id, "--timeout", "30"]);
    assert_eq!(done.stdout, "echo: Summarise the notes\n");
    for line in [
        format!("Task {id}: Summarise the notes"),
        "Status: completed".to_owned(),
        "Turns: 1".to_owned(),
        "Duration: ".to_owned(),
    ] {
        assert!(done.stderr.contains(&line), "{line}: {}", done.stderr);
    }
    let json = p.expect(0, &["load", &id, "--json"]).json();
    assert_eq!(json["still_running"], false, "{json}");
    assert_eq!(json["output"], "echo: Summarise the notes", "{json}");

    let help = p.expect(0, &["load", "--help"]);
    assert!(help.stdout.contains("124"), "{}", help.stdout);
}

// 2: a failed task's answer so far is on stdout, its error on stderr, exit 2.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_task_loads_with_its_error_on_stderr() {
    let server = MockServer::start(
        MockConfig::new().default_reply(Reply::tool_call("list_files", json!({}))),
    )
    .await;
    let p = Project::new(&server);
    let answer = p
        .expect(
            0,
            &[
                "delegate",
                "--async",
                "--json",
                "--instructions",
                "loop",
                "--max-turns",
                "1",
            ],
        )
        .json();
    let id = answer["task_id"].as_str().expect("id");
    let failed = p.expect(2, &["load", id, "--timeout", "30"]);
    assert!(
        failed.stderr.contains("Status: failed"),
        "{}",
        failed.stderr
    );
    assert!(
        failed.stderr.contains("Error: max turns (1) reached"),
        "{}",
        failed.stderr
    );
    assert!(!failed.stdout.contains("Status:"), "{}", failed.stdout);
}

// 3: the store is found in a parent folder, like git finds `.git`; readers never create one.
#[tokio::test(flavor = "multi_thread")]
async fn the_store_is_found_from_a_subfolder_and_readers_never_create_one() {
    let server = MockServer::start(MockConfig::new()).await;
    let p = Project::new(&server);

    // Readers in a project without a store: answers, and still no store.
    let tasks = p.expect_in("src/deep", 0, &["tasks", "--json"]).json();
    assert_eq!(tasks, json!({"tasks": []}));
    p.expect_in("src/deep", 0, &["tasks"]);
    p.expect_in("src/deep", 0, &["load"]);
    let missing = p.expect_in("src/deep", 1, &["load", "20260101_1"]);
    assert!(missing.stderr.contains("not found"), "{}", missing.stderr);
    p.expect_in("src/deep", 1, &["load", "20260101_1", "--peek"]);
    assert_eq!(any_store_under(&p.dir), None, "readers created a store");

    // A task started at the top is seen from a subfolder.
    let id = p.start_in("", "From the top");
    let listed = p.expect_in("src/deep", 0, &["tasks", "--json"]).json();
    assert_eq!(listed["tasks"][0]["id"], id.as_str(), "{listed}");
    let result = p
        .expect_in("src/deep", 0, &["load", &id, "--json", "--timeout", "30"])
        .json();
    assert_eq!(result["output"], "echo: From the top", "{result}");
    p.expect_in("src/deep", 0, &["load", &id, "--peek"]);

    // A task started in a subfolder goes to the store above, too.
    let second = p.start_in("src", "From below");
    let listed = p.expect(0, &["tasks", "--json"]).json();
    let ids: Vec<&str> = listed["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert!(ids.contains(&second.as_str()), "{listed}");
    p.expect(0, &["load", &second, "--timeout", "30"]);
    assert_eq!(
        any_store_under(&p.dir.join("src")),
        None,
        "no second store below the project's"
    );
    assert!(p.dir.join(".summon/state.db").is_file());
}

// 4: the result is recorded when the task ends, not at the worker's next heartbeat.
#[tokio::test(flavor = "multi_thread")]
async fn a_finished_result_is_collectable_at_once() {
    let server = MockServer::start(MockConfig::new().latency(Duration::from_millis(10))).await;
    let p = Project::new(&server);
    // The quickest of three, so one slow moment of a busy machine does not decide.
    let mut best = Duration::MAX;
    let mut best_task = f64::MAX;
    for i in 0..3 {
        let started = Instant::now();
        let id = p.start_in("", &format!("quick {i}"));
        let result = p
            .expect(0, &["load", &id, "--json", "--timeout", "30"])
            .json();
        best = best.min(started.elapsed());
        assert_eq!(result["status"], "completed", "{result}");
        best_task = best_task.min(result["elapsed_secs"].as_f64().expect("elapsed"));
    }
    eprintln!("async + load: {best:?}; task recorded after {best_task} s");
    // The worker used to hold the finished result back until its next 1 s heartbeat.
    assert!(best_task < 0.5, "task took {best_task} s to record");
}

// 5: a subagent's shell that drops SUMMON_SUBAGENT is still refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_subagent_cannot_switch_the_nesting_guard_off() {
    let summon = env!("CARGO_BIN_EXE_summon");
    let nested = format!(
        "env -u SUMMON_SUBAGENT {summon} delegate --instructions hi; echo code=$?; \
         env -u SUMMON_SUBAGENT sh -c '{summon} delegate --async --instructions hi'; echo code=$?"
    );
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("shell", json!({ "command": nested })),
        Reply::text("done"),
    ]))
    .await;
    let p = Project::new(&server);
    let out = p.expect(
        0,
        &[
            "delegate",
            "--instructions",
            "x",
            "--extensions",
            "developer",
        ],
    );
    assert_eq!(out.stdout, "done\n");
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "the nested calls sent nothing");
    let result = requests[1].body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str())
        .expect("the shell result")
        .to_owned();
    assert_eq!(result.matches(NESTED).count(), 2, "{result}");
    assert_eq!(result.matches("code=1").count(), 2, "{result}");
    assert_eq!(any_store_under(&p.dir), None, "no task was stored");

    // Outside a subagent the same command runs.
    let plain = p.expect(0, &["delegate", "--instructions", "plain"]);
    assert_eq!(plain.stdout, "echo: plain\n");
}

// The nesting ban covers every command that starts subagents: `run` and `merge` too.
#[tokio::test(flavor = "multi_thread")]
async fn run_and_merge_are_refused_inside_a_subagent() {
    let server = MockServer::start(MockConfig::new()).await;
    let p = Project::from_test(
        Test::new()
            .env("OPENAI_BASE_URL", &server.url_openai())
            .env("OPENAI_API_KEY", KEY)
            .env("SUMMON_MODEL", "mock-model")
            .env("SUMMON_SUBAGENT", "1")
            .write(
                "p.yaml",
                "version: 1\nsteps:\n  - id: one\n    delegate: {instructions: hi}\n",
            )
            .mkdir("shard"),
    );
    for args in [&["run", "p.yaml"][..], &["merge", "p.yaml", "shard"][..]] {
        let out = p.expect(1, args);
        assert!(
            out.stderr.contains(
                "Delegated tasks cannot spawn further delegations: this command runs inside a subagent"
            ),
            "{args:?}: {}",
            out.stderr
        );
    }
    // A dry run starts no subagent.
    p.expect(0, &["run", "p.yaml", "--dry-run"]);
    assert_eq!(server.request_count(), 0);
    assert_eq!(any_store_under(&p.dir), None, "no run was stored");
}

// From a subagent's shell that drops the variable, `summon run` is still refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_subagent_s_shell_cannot_run_a_pipeline() {
    let summon = env!("CARGO_BIN_EXE_summon");
    let nested = format!("env -u SUMMON_SUBAGENT {summon} run p.yaml; echo code=$?");
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("shell", json!({ "command": nested })),
        Reply::text("done"),
    ]))
    .await;
    let p = Project::from_test(
        Test::new()
            .env("OPENAI_BASE_URL", &server.url_openai())
            .env("OPENAI_API_KEY", KEY)
            .env("SUMMON_MODEL", "mock-model")
            .write(
                "p.yaml",
                "version: 1\nsteps:\n  - id: one\n    delegate: {instructions: grandchild}\n",
            ),
    );
    let out = p.expect(
        0,
        &[
            "delegate",
            "--instructions",
            "x",
            "--extensions",
            "developer",
            "--network",
        ],
    );
    assert_eq!(out.stdout, "done\n");
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "the nested run sent nothing");
    let result = requests[1].body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str())
        .expect("the shell result")
        .to_owned();
    assert!(
        result.contains(NESTED) && result.contains("code=1"),
        "{result}"
    );
}

// `load` and `load --json` list the same finished tasks awaiting collection.
#[tokio::test(flavor = "multi_thread")]
async fn load_and_load_json_list_the_same_collectable_tasks() {
    let server = MockServer::start(MockConfig::new()).await;
    let p = Project::new(&server);
    let id = p.start_in("", "collect me");
    p.expect(0, &["load", &id]);
    let text = p.expect(0, &["load"]);
    assert!(
        text.stdout.contains(&format!(
            "Completed tasks awaiting retrieval:\n  {id}  collect me  (completed)\n"
        )),
        "{}",
        text.stdout
    );
    let json = p.expect(0, &["load", "--json"]).json();
    assert_eq!(
        json["tasks"],
        json!([{ "id": id, "description": "collect me", "status": "completed" }]),
        "{json}"
    );
}
