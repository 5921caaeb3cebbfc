//! Background tasks at their edges: `delegate --async` refuses what the foreground refuses,
//! `load` tells "no result yet" (exit 124) from a result, the store is found from a subfolder
//! and never created by a reader, a finished result is collectable at once, and a subagent
//! cannot switch the nesting guard off by dropping an environment variable.
//!
//! Waiting is polling for a condition with a deadline, never a bare sleep; workers still
//! running when a test ends are killed.

#![cfg(target_os = "linux")]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer};
use support::Test;

const KEY: &str = "sk-test-0123456789abcdef";

/// What one command printed, and how long it took.
#[derive(Debug)]
struct Run {
    stdout: String,
    stderr: String,
    code: i32,
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
    fn from_test(test: Test) -> Self {
        let dir = test.path().canonicalize().expect("canonical temp dir");
        Self { test, dir }
    }

    /// Runs `summon ARGS` in `sub` (relative to the project), whatever the exit code.
    fn run_in(&self, sub: &str, args: &[&str]) -> Run {
        let cwd = self.dir.join(sub);
        std::fs::create_dir_all(&cwd).expect("mkdir");
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
        ("an agent given no task", &["--source", "scout"], true),
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
            .write(".agents/agents/scout.md", agent);
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
    assert_eq!(server.request_count(), 0, "nothing was sent");
}
