//! Pipeline edges: a step that crashes fails the run (never skipped, never a hang), and source
//! names are checked against the catalog at the `source:` value before anything runs.

mod support;

use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

/// A project wired to the mock as an OpenAI-compatible provider.
fn project(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
}

/// What a bounded run did.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

/// Runs a started child to its end, failing the test (and killing the child) if it has not
/// ended within `limit`: a run that hangs fails instead of blocking the suite.
fn finish_within(child: std::process::Child, limit: Duration) -> Ran {
    let pid = child.id();
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = send.send(child.wait_with_output());
    });
    match receive.recv_timeout(limit) {
        Ok(output) => {
            let output = output.expect("wait for summon");
            Ran {
                code: output.status.code(),
                stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            }
        }
        Err(_) => {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
            panic!("summon did not finish within {limit:?}: the run hangs");
        }
    }
}

fn spawn(t: &Test, args: &[&str]) -> std::process::Child {
    t.command()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn summon")
}

/// The `steps` of `summon run --json` as `(id, status, error)`.
fn step_statuses(out: &Value) -> Vec<(String, String, Option<String>)> {
    out["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap_or_default().to_owned(),
                s["status"].as_str().unwrap_or_default().to_owned(),
                s["error"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

const PANICKED: &str = "internal error: step panicked";

// ---------------------------------------------------------------------------------------------
// A step that panics fails the run.

#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_step_with_dependents_fails_the_run_and_runs_none_of_them() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server).env("SUMMON_TEST_CRASH_AT", "plan").write(
        "p.yaml",
        r#"
            version: 1
            steps:
              - id: plan
                decompose: {items: [a, b]}
              - id: work
                fan_out: {over: plan, instructions: "Do {{ item }}"}
              - id: sum
                synthesize: {instructions: "{{ steps.work.results | length }}"}
            "#,
    );
    let ran = finish_within(
        spawn(&t, &["run", "p.yaml", "--json", "--quiet"]),
        Duration::from_secs(60),
    );
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert_eq!(
        step_statuses(&ran.json()),
        [
            ("plan".into(), "failed".into(), Some(PANICKED.into())),
            ("work".into(), "skipped".into(), None),
            ("sum".into(), "skipped".into(), None),
        ]
    );
    assert_eq!(ran.json()["status"], "failed");
    assert_eq!(
        server.request_count(),
        0,
        "a dependent of the crashed step ran"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_step_without_dependents_fails_the_run_while_the_others_finish() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("fine"))).await;
    let t = project(&server).env("SUMMON_TEST_CRASH_AT", "lost").write(
        "p.yaml",
        r#"
            version: 1
            steps:
              - id: lost
                delegate: {instructions: "Never sent."}
              - id: kept
                delegate: {instructions: "Sent."}
            "#,
    );
    let ran = finish_within(
        spawn(&t, &["run", "p.yaml", "--quiet"]),
        Duration::from_secs(60),
    );
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(
        ran.stderr
            .contains(&format!("summon: step `lost` failed: {PANICKED}")),
        "{}",
        ran.stderr
    );
    assert!(ran.stderr.contains("run "), "{}", ran.stderr);
    assert_eq!(server.request_count(), 1, "the independent step still ran");
    assert!(
        ran.stdout.is_empty(),
        "a failed run printed output: {}",
        ran.stdout
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_still_interrupts_a_run_with_a_crashed_step() {
    // `slow` is still waiting for its answer when `crash` has crashed: Ctrl-C must reach the
    // run, which drains (`slow` finishes) and ends as interrupted.
    let server = MockServer::start(
        MockConfig::new().default_reply(Reply::text("late").delayed(Duration::from_secs(2))),
    )
    .await;
    let t = project(&server).env("SUMMON_TEST_CRASH_AT", "crash").write(
        "p.yaml",
        r#"
            version: 1
            steps:
              - id: crash
                decompose: {items: [a]}
              - id: after
                fan_out: {over: crash, instructions: "{{ item }}"}
              - id: slow
                delegate: {instructions: "Take your time."}
            "#,
    );
    let child = spawn(&t, &["run", "p.yaml", "--json", "--quiet"]);
    let pid = child.id().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while server.in_flight() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow step's request never arrived"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill -INT");
    assert!(status.success());
    let ran = finish_within(child, Duration::from_secs(20));
    assert_eq!(ran.code, Some(130), "{}", ran.stderr);
    let statuses = step_statuses(&ran.json());
    assert_eq!(
        statuses[0],
        ("crash".into(), "failed".into(), Some(PANICKED.into()))
    );
    assert_eq!(statuses[1], ("after".into(), "skipped".into(), None));
    assert_eq!(server.request_count(), 1);
}
