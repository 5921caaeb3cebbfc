//! Pipeline edges: a step that crashes fails the run (never skipped, never a hang), and source
//! names are checked against the catalog at the `source:` value before anything runs.

use crate::support;

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

// ---------------------------------------------------------------------------------------------
// Source names are checked before anything runs.

const RELEASE_NOTES: &str = "
    version: 1.0.0
    title: Release notes
    description: Notes for the release
    instructions: Write the release notes.
";

/// A recipe with an error: no `description`.
const BROKEN_RECIPE: &str = "
    version: 1.0.0
    title: Classify a ticket
    instructions: Classify it.
";

/// `source: release-note` (one letter short) on line 6, its value at column 15.
const MISSPELT: &str = "
    version: 1
    steps:
      - id: notes
        delegate:
          instructions: Go.
          source: release-note
";

#[test]
fn validate_reports_a_misspelt_source_at_its_value_with_the_close_names() {
    let out = Test::new()
        .write("recipes/release-notes.yaml", RELEASE_NOTES)
        .write("pipelines/p.yaml", MISSPELT)
        .args(["--color", "never", "validate", "pipelines/p.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr.starts_with(
            "pipelines/p.yaml:6:15: error: Source 'release-note' not found. Did you mean: release-notes?\n"
        ),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("1 error(s)"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn run_and_dry_run_refuse_a_misspelt_source_before_any_request() {
    let server = MockServer::start(MockConfig::new()).await;
    for args in [
        &["--color", "never", "run", "p.yaml", "--quiet"][..],
        &["--color", "never", "run", "p.yaml", "--dry-run"][..],
    ] {
        let out = project(&server)
            .write("recipes/release-notes.yaml", RELEASE_NOTES)
            .write("p.yaml", MISSPELT)
            .args(args.iter().copied())
            .code(1)
            .run();
        assert!(
            out.stderr.contains(
                "p.yaml:6:15: error: Source 'release-note' not found. Did you mean: release-notes?"
            ) || out.stderr.contains(
                "p.yaml:6:15: error: step `notes`: Source 'release-note' not found. Did you mean: release-notes?"
            ),
            "{args:?}: {}",
            out.stderr
        );
        assert!(
            !out.dir.join(".summon").exists(),
            "{args:?}: a run was journaled"
        );
    }
    assert_eq!(server.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_templated_source_is_checked_against_each_literal_item() {
    let server = MockServer::start(MockConfig::new()).await;
    // The source value `"{{ item.agent }}"` is on line 11, column 15.
    let pipeline = r#"
        version: 1
        steps:
          - id: plan
            decompose:
              items:
                - {agent: explorer, q: "Find the parser."}
                - {agent: explorr, q: "Count the files."}
          - id: work
            fan_out:
              over: plan
              source: "{{ item.agent }}"
              instructions: "{{ item.q }}"
    "#;
    let explorer = "
        ---
        name: explorer
        description: Explores
        ---
        You explore carefully.
    ";
    let wanted = "p.yaml:11:15: error: item 1: Subagent \"explorr\" is not in this run's catalog. Use a name from it, or null for a general subagent. Did you mean: explorer?";
    let validated = Test::new()
        .write(".claude/agents/explorer.md", explorer)
        .write("p.yaml", pipeline)
        .args(["--color", "never", "validate", "p.yaml"])
        .code(1)
        .run();
    assert!(validated.stderr.contains(wanted), "{}", validated.stderr);
    let ran = project(&server)
        .write(".claude/agents/explorer.md", explorer)
        .write("p.yaml", pipeline)
        .args(["--color", "never", "run", "p.yaml", "--quiet"])
        .code(1)
        .run();
    assert!(ran.stderr.contains(wanted), "{}", ran.stderr);
    assert!(!ran.dir.join(".summon").exists(), "a run was journaled");
    let dry = project(&server)
        .write(".claude/agents/explorer.md", explorer)
        .write("p.yaml", pipeline)
        .args(["--color", "never", "run", "p.yaml", "--dry-run"])
        .code(1)
        .run();
    assert!(
        dry.stderr.contains(
            "p.yaml:11:15: error: step `work`: item 1: Subagent \"explorr\" is not in this run's catalog. Use a name from it, or null for a general subagent. Did you mean: explorer?"
        ),
        "{}",
        dry.stderr
    );
    assert_eq!(server.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_source_whose_file_has_errors_is_reported_as_that_never_as_missing() {
    let server = MockServer::start(MockConfig::new()).await;
    // `source: classify-ticket` on line 5, its value at column 15.
    let pipeline = "
        version: 1
        steps:
          - id: triage
            delegate:
              source: classify-ticket
    ";
    let has_errors = "Source 'classify-ticket' cannot be used: `recipes/classify-ticket.yaml` has errors: run summon validate";
    let project_with_broken = || {
        project(&server)
            .write("recipes/classify-ticket.yaml", BROKEN_RECIPE)
            .write("p.yaml", pipeline)
    };
    for (args, wanted) in [
        (
            &["--color", "never", "validate", "p.yaml"][..],
            format!("p.yaml:5:15: error: {has_errors}"),
        ),
        (
            &["--color", "never", "run", "p.yaml", "--quiet"][..],
            format!("p.yaml:5:15: error: {has_errors}"),
        ),
        (
            &["--color", "never", "run", "p.yaml", "--dry-run"][..],
            format!("p.yaml:5:15: error: step `triage`: {has_errors}"),
        ),
        (
            &[
                "--color",
                "never",
                "delegate",
                "--source",
                "classify-ticket",
                "--instructions",
                "Go.",
            ][..],
            format!("error: {has_errors}"),
        ),
    ] {
        let out = project_with_broken()
            .args(args.iter().copied())
            .code(1)
            .run();
        assert!(out.stderr.contains(&wanted), "{args:?}: {}", out.stderr);
        assert!(
            !out.stderr.contains("not found"),
            "{args:?}: {}",
            out.stderr
        );
    }
    assert_eq!(server.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_source_named_by_model_output_whose_file_has_errors_fails_its_step_as_such() {
    // Items from a file are read when the run gets there: the step checks them then.
    let server = MockServer::start(MockConfig::new()).await;
    let out = project(&server)
        .write("recipes/classify-ticket.yaml", BROKEN_RECIPE)
        .write_raw("plan.jsonl", "{\"agent\": \"classify-ticket\"}\n")
        .write(
            "p.yaml",
            r#"
            version: 1
            steps:
              - id: plan
                decompose: {file: plan.jsonl}
              - id: work
                fan_out: {over: plan, source: "{{ item.agent }}", instructions: "Go."}
            "#,
        )
        .args(["--color", "never", "run", "p.yaml", "--quiet"])
        .code(2)
        .run();
    assert!(
        out.stderr.contains(
            "step `work` failed: Subagent \"classify-ticket\" cannot be used: `recipes/classify-ticket.yaml` has errors: run summon validate"
        ),
        "{}",
        out.stderr
    );
    assert_eq!(server.request_count(), 0);
}

#[test]
fn delegate_names_an_agent_file_whose_frontmatter_is_broken() {
    // Named by its frontmatter, not its file name; the frontmatter does not parse.
    let out = Test::new()
        .write(
            ".claude/agents/rev.md",
            "
            ---
            name: code-reviewer
            description: Reviews
            tools: [Read
            ---
            You review.
            ",
        )
        .args([
            "--color",
            "never",
            "delegate",
            "--source",
            "code-reviewer",
            "--instructions",
            "Go.",
        ])
        .code(1)
        .run();
    assert!(
        out.stderr.contains(
            "error: Source 'code-reviewer' cannot be used: `.claude/agents/rev.md` was skipped: run summon validate"
        ),
        "{}",
        out.stderr
    );
}
