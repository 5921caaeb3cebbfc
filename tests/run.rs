//! `summon run PIPELINE` against a mock LLM server in this test process: what each task
//! sends, the caps, failures and `min_success`, the journal and `--resume` (after `kill -9`
//! of a real process), `--dry-run`, and the outputs (`results.jsonl`, `report.json`,
//! `--junit`, `outputs`, `--json`).

use crate::support;
use crate::support::{chats, results, wait_for};

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, RecordedRequest, Reply};
use support::Test;

const KEY: &str = "sk-test-0123456789abcdefSECRET";

/// A project wired to the mock as an OpenAI-compatible provider.
fn project(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
}

/// What one `summon` invocation in an existing project did.
#[derive(Debug)]
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Ran {
    #[track_caller]
    fn expect(self, code: i32) -> Self {
        assert_eq!(
            self.code, code,
            "unexpected exit code\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout, self.stderr
        );
        self
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

/// Runs `summon ARGS` in the project `t` (which must have been built without `.args`), so that
/// one project can be run several times.
fn summon(t: &Test, args: &[&str]) -> Ran {
    let output = t.command().args(args).output().expect("run summon");
    Ran {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn step_lines<'a>(lines: &'a [Value], step: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["step"] == step).collect()
}

/// The first user message of a request (after the system prompt).
fn first_user(request: &RecordedRequest) -> String {
    let messages = request.body["messages"].as_array().expect("messages");
    let user = messages
        .iter()
        .find(|m| m["role"] == "user")
        .expect("a user message");
    match &user["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<String>(),
        other => panic!("unexpected content: {other}"),
    }
}

/// The chat requests whose first user message starts with `prefix`.
fn requests_starting(server: &MockServer, prefix: &str) -> Vec<String> {
    chats(server)
        .iter()
        .map(first_user)
        .filter(|m| m.starts_with(prefix))
        .collect()
}

/// A 400 answer: not retried, fails the task.
fn bad_request() -> Reply {
    Reply::status(
        400,
        r#"{"error":{"message":"this item is bad","type":"invalid_request_error"}}"#,
    )
}

/// A YAML flow list of `n` items `prefix00`, `prefix01`, ...
fn item_names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i:02}")).collect()
}

fn yaml_list(items: &[String]) -> String {
    format!("[{}]", items.join(", "))
}

/// decompose `list` over `items`, then fan_out `each` with `instructions`, plus `extra` YAML
/// appended to the `each` step and `tail` appended after it.
fn fan_out_pipeline(items: &[String], instructions: &str, each_extra: &str, tail: &str) -> String {
    format!(
        "version: 1\nname: test\nsteps:\n  - id: list\n    decompose:\n      items: {}\n  - id: each\n    fan_out:\n      over: list\n      instructions: {}\n{each_extra}{tail}",
        yaml_list(items),
        serde_json::to_string(instructions).unwrap(),
    )
}

// ---------------------------------------------------------------------------------------------
// 1. Every result exactly once, in results.jsonl and in the synthesis context.

#[tokio::test(flavor = "multi_thread")]
async fn every_item_appears_exactly_once_in_results_and_in_the_synthesis() {
    // Later items answer sooner, so tasks finish out of item order.
    let server = MockServer::start(MockConfig::new().rule(|req| {
        let text = req.last_user_text().unwrap_or_default();
        match text.strip_prefix("Summarise it") {
            Some(n) => {
                let n: u64 = n.trim().parse().unwrap_or(0);
                Reply::Echo.delayed(Duration::from_millis((39 - n.min(39)) * 4))
            }
            None => Reply::text("the synthesis"),
        }
    }))
    .await;
    let items = item_names("it", 40);
    let pipeline = fan_out_pipeline(
        &items,
        "Summarise {{ item }}",
        "",
        "  - id: sum\n    synthesize:\n      instructions: |\n        Merge:\n        {% for r in steps.each.results %}<{{ r.item }}|{{ r.output }}|{{ r.status }}>\n        {% endfor %}\n",
    );
    let out = project(&server)
        .write_raw("p.yaml", &pipeline)
        .args([
            "run",
            "p.yaml",
            "--out",
            "out",
            "--concurrency",
            "8",
            "--quiet",
        ])
        .stdout("the synthesis\n")
        .run();

    let lines = results(&out.dir.join("out"));
    let each = step_lines(&lines, "each");
    assert_eq!(each.len(), 40, "{lines:#?}");
    let mut by_index = BTreeMap::new();
    for line in &each {
        let index = line["index"].as_u64().expect("index");
        assert!(
            by_index.insert(index, *line).is_none(),
            "index {index} twice"
        );
    }
    assert_eq!(
        by_index.keys().copied().collect::<Vec<_>>(),
        (0..40).collect::<Vec<_>>()
    );
    for (index, line) in &by_index {
        let name = &items[*index as usize];
        assert_eq!(line["item"], json!(name), "{line}");
        assert_eq!(line["status"], "completed", "{line}");
        assert_eq!(line["output"], json!(format!("echo: Summarise {name}")));
        assert_eq!(line["resumed"], false);
    }
    // Completion order was not item order (the test would prove nothing otherwise).
    let order: Vec<u64> = each.iter().map(|l| l["index"].as_u64().unwrap()).collect();
    assert_ne!(order, (0..40).collect::<Vec<_>>());
    assert_eq!(step_lines(&lines, "sum").len(), 1);

    let synth = requests_starting(&server, "Merge:");
    assert_eq!(synth.len(), 1, "one synthesize request");
    let synth = &synth[0];
    let mut last = 0;
    for name in &items {
        let entry = format!("<{name}|echo: Summarise {name}|completed>");
        assert_eq!(synth.matches(&entry).count(), 1, "{entry} in:\n{synth}");
        let at = synth.find(&entry).unwrap();
        assert!(at >= last, "results are in item order:\n{synth}");
        last = at;
    }
    assert_eq!(synth.matches("<it").count(), 40, "{synth}");
    assert_eq!(requests_starting(&server, "Summarise ").len(), 40);
}

// ---------------------------------------------------------------------------------------------
// 2. Concurrency caps.

#[tokio::test(flavor = "multi_thread")]
async fn the_global_cap_is_never_exceeded() {
    let server = MockServer::start(MockConfig::new().latency(Duration::from_millis(200))).await;
    let pipeline = fan_out_pipeline(&item_names("c", 30), "Cap {{ item }}", "", "");
    let out = project(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--concurrency", "4", "--quiet"])
        .run();
    assert_eq!(support::chat_count(&server), 30, "{}", out.stderr);
    let peak = server.peak_in_flight();
    assert!(peak <= 4, "peak {peak} > --concurrency 4");
    assert!(peak >= 2, "peak {peak}: the tasks did not run in parallel");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_waiting_out_retry_after_gives_its_slot_back() {
    // With one slot, the first task is told to retry after 2 s; while it waits, the second
    // task must get the slot and be sent.
    let first_seen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = std::sync::Arc::clone(&first_seen);
    let server = MockServer::start(MockConfig::new().rule(move |req: &RecordedRequest| {
        let text = req.last_user_text().unwrap_or_default();
        if text.contains("slow-one") && !seen.swap(true, std::sync::atomic::Ordering::SeqCst) {
            Reply::status_with_headers(
                429,
                [("retry-after", "2")],
                "{\"error\":{\"message\":\"slow down\"}}",
            )
        } else {
            Reply::Echo
        }
    }))
    .await;
    let items = vec!["slow-one".to_owned(), "quick-two".to_owned()];
    let pipeline = fan_out_pipeline(&items, "Wait {{ item }}", "", "");
    let out = project(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--concurrency", "1", "--quiet"])
        .run();
    let order: Vec<String> = chats(&server)
        .iter()
        .map(|r| r.last_user_text().unwrap_or_default())
        .collect();
    assert_eq!(
        order,
        ["Wait slow-one", "Wait quick-two", "Wait slow-one"],
        "the second task ran during the first one's Retry-After wait\n{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_step_cap_below_the_global_cap_holds() {
    let server = MockServer::start(MockConfig::new().latency(Duration::from_millis(150))).await;
    let pipeline = fan_out_pipeline(
        &item_names("s", 10),
        "Step cap {{ item }}",
        "    concurrency: 2\n",
        "",
    );
    project(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--concurrency", "8", "--quiet"])
        .run();
    assert_eq!(support::chat_count(&server), 10);
    assert_eq!(server.peak_in_flight(), 2, "per-step concurrency: 2");
}

#[tokio::test(flavor = "multi_thread")]
async fn independent_steps_run_together_under_the_settings_cap() {
    // Two fan-outs over the same items, each capped at 2, under a global 3: both run at once
    // (peak 3 > 2) and together never exceed 3.
    let server = MockServer::start(MockConfig::new().latency(Duration::from_millis(150))).await;
    let pipeline = format!(
        "version: 1\nname: two\nsettings:\n  concurrency: 3\nsteps:\n  - id: list\n    decompose:\n      items: {}\n  - id: left\n    fan_out:\n      over: list\n      instructions: \"L {{{{ item }}}}\"\n    concurrency: 2\n  - id: right\n    fan_out:\n      over: list\n      instructions: \"R {{{{ item }}}}\"\n    concurrency: 2\n",
        yaml_list(&item_names("x", 8))
    );
    project(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--quiet"])
        .run();
    assert_eq!(chats(&server).len(), 16);
    assert_eq!(
        server.peak_in_flight(),
        3,
        "settings.concurrency 3 caps both steps together, and both steps ran at once"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. on_error and min_success.

/// Fails every fan_out request whose item contains "bad".
fn failing_mock() -> MockConfig {
    MockConfig::new().rule(|req| {
        let text = req.last_user_text().unwrap_or_default();
        if text.starts_with("Check ") && text.contains("bad") {
            bad_request()
        } else {
            Reply::Echo
        }
    })
}

fn ten_with_three_bad() -> Vec<String> {
    [
        "ok0", "bad1", "ok2", "bad3", "ok4", "ok5", "bad6", "ok7", "ok8", "ok9",
    ]
    .map(String::from)
    .to_vec()
}

const SYNTH_TAIL: &str = "  - id: sum\n    synthesize:\n      instructions: \"Sum {% for r in steps.each.results %}{{ r.status }} {% endfor %}\"\n";

#[tokio::test(flavor = "multi_thread")]
async fn on_error_continue_meets_a_min_success_count() {
    let server = MockServer::start(failing_mock()).await;
    let pipeline = fan_out_pipeline(
        &ten_with_three_bad(),
        "Check {{ item }}",
        "    on_error: continue\n    min_success: 7\n",
        SYNTH_TAIL,
    );
    let out = project(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let lines = results(&out.dir.join("out"));
    let each = step_lines(&lines, "each");
    assert_eq!(each.len(), 10);
    let failed: BTreeSet<&str> = each
        .iter()
        .filter(|l| l["status"] == "failed")
        .map(|l| l["item"].as_str().unwrap())
        .collect();
    assert_eq!(failed, BTreeSet::from(["bad1", "bad3", "bad6"]));
    for line in each.iter().filter(|l| l["status"] == "failed") {
        let error = line["error"].as_str().expect("failed lines carry an error");
        assert!(error.contains("400") || error.contains("bad"), "{error}");
    }
    // A 400 is not retried: one request per item.
    assert_eq!(requests_starting(&server, "Check ").len(), 10);
    // The synthesis saw every result, the failed ones included.
    let synth = requests_starting(&server, "Sum ");
    assert_eq!(synth.len(), 1);
    assert_eq!(synth[0].matches("failed").count(), 3, "{}", synth[0]);
    assert_eq!(synth[0].matches("completed").count(), 7, "{}", synth[0]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_that_succeeds_with_failed_tasks_names_them_by_cause_and_the_report() {
    let server = MockServer::start(failing_mock()).await;
    let pipeline = fan_out_pipeline(
        &ten_with_three_bad(),
        "Check {{ item }}",
        "    on_error: continue\n",
        SYNTH_TAIL,
    );
    let out = project(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .code(0)
        .run();
    let failures = out
        .stderr
        .split_once("summon: failed tasks, by cause:\n")
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("no failures named:\n{}", out.stderr));
    let first = failures.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("  provider: bad_request: 3 tasks (each: "),
        "{failures}"
    );
    // The three, in the order they finished.
    for item in ["each: bad1", "each: bad3", "each: bad6"] {
        assert!(first.contains(item), "{first}");
    }
    assert!(failures.contains("this item is bad"), "{failures}");
    assert!(
        out.stderr
            .lines()
            .any(|l| l == "summon: report: out/report.html"),
        "{}",
        out.stderr
    );
    assert!(out.dir.join("out/report.html").is_file());
}

#[tokio::test(flavor = "multi_thread")]
async fn on_error_continue_below_a_min_success_percentage_fails_the_step() {
    let server = MockServer::start(failing_mock()).await;
    let pipeline = fan_out_pipeline(
        &ten_with_three_bad(),
        "Check {{ item }}",
        "    on_error: continue\n    min_success: 80%\n",
        SYNTH_TAIL,
    );
    let out = project(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .code(2)
        .stderr_has("step `each` failed")
        .run();
    assert!(out.stderr.contains("7 of 10"), "{}", out.stderr);
    assert_eq!(out.stdout, "", "no final text for a failed run");
    // on_error: continue ran every item despite the failures.
    assert_eq!(requests_starting(&server, "Check ").len(), 10);
    assert!(requests_starting(&server, "Sum ").is_empty());
    let lines = results(&out.dir.join("out"));
    assert_eq!(step_lines(&lines, "each").len(), 10);
}

#[tokio::test(flavor = "multi_thread")]
async fn fail_fast_stops_the_step_and_skips_what_follows() {
    let server = MockServer::start(failing_mock()).await;
    let items: Vec<String> = ["bad0", "ok1", "ok2", "ok3", "ok4"]
        .map(String::from)
        .to_vec();
    let pipeline = fan_out_pipeline(&items, "Check {{ item }}", "", SYNTH_TAIL);
    let out = project(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--concurrency", "1", "--json"])
        .code(2)
        .run();
    let json = out.json();
    assert_eq!(json["status"], "failed");
    let steps = json["steps"].as_array().unwrap();
    assert_eq!(steps[1]["id"], "each");
    assert_eq!(steps[1]["status"], "failed");
    assert!(
        steps[1]["error"].as_str().unwrap().contains("bad"),
        "{}",
        steps[1]
    );
    assert_eq!(steps[2]["id"], "sum");
    assert_eq!(steps[2]["status"], "skipped");
    assert!(requests_starting(&server, "Sum ").is_empty());
    // One at a time, the first failure stops the step: nothing after it is started.
    assert_eq!(requests_starting(&server, "Check "), ["Check bad0"]);
}

// ---------------------------------------------------------------------------------------------
// 4. Journal and resume.

/// Fan-out requests per item (`Process ITEM`).
fn requests_per_item(server: &MockServer) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for message in requests_starting(server, "Process ") {
        *counts
            .entry(message["Process ".len()..].to_owned())
            .or_default() += 1;
    }
    counts
}

/// The items `results.jsonl` lines show as completed.
fn completed_items(lines: &[Value]) -> BTreeSet<String> {
    lines
        .iter()
        .filter(|l| l["status"] == "completed")
        .map(|l| l["item"].as_str().unwrap().to_owned())
        .collect()
}

/// The items the project's journal holds as completed (committed rows only).
fn journaled_items(project: &std::path::Path) -> BTreeSet<String> {
    let path = project.join(".summon/state.db");
    let Ok(conn) =
        rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
    else {
        return BTreeSet::new();
    };
    let Ok(mut stmt) = conn.prepare("SELECT item FROM run_tasks WHERE status = 'completed'") else {
        return BTreeSet::new();
    };
    let rows = stmt.query_map([], |r| r.get::<_, Option<String>>(0));
    rows.map(|rows| {
        rows.filter_map(|r| r.ok().flatten())
            .filter_map(|item| serde_json::from_str::<Value>(&item).ok())
            .filter_map(|item| item.as_str().map(str::to_owned))
            .collect()
    })
    .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn resume_after_kill_9_requests_no_finished_task_again() {
    let server = MockServer::start(MockConfig::new().latency(Duration::from_millis(300))).await;
    let items = item_names("item-", 60);
    let pipeline = fan_out_pipeline(&items, "Process {{ item }}", "", "");
    let t = project(&server).write_raw("p.yaml", &pipeline);
    let out_dir = t.path().join("out");
    let args = [
        "run",
        "p.yaml",
        "--concurrency",
        "4",
        "--out",
        "out",
        "--quiet",
    ];

    let mut child = t
        .command()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn summon run");
    wait_for(Duration::from_secs(30), "12 finished tasks", || {
        results(&out_dir).len() >= 12
    });
    // Kill between two waves of requests, once no request has started for a while and the
    // journal holds every task `results.jsonl` shows (the two are written by threads of
    // their own, and a loaded machine commits late): then exactly the tasks in flight may be
    // requested again.
    let mut seen = support::chat_count(&server);
    let mut since = Instant::now();
    wait_for(Duration::from_secs(30), "a quiet moment", || {
        let now = support::chat_count(&server);
        if now != seen {
            seen = now;
            since = Instant::now();
        }
        since.elapsed() >= Duration::from_millis(100) && {
            let shown = completed_items(&results(&out_dir));
            shown.is_subset(&journaled_items(t.path()))
        }
    });
    child.kill().expect("kill -9");
    child.wait().expect("wait");
    let first_run = support::chat_count(&server);
    assert!(
        first_run < 60,
        "the run was killed before it finished ({first_run} requests)"
    );
    let in_flight = server.in_flight().min(4);
    let finished_before = completed_items(&results(&out_dir));
    assert!(finished_before.len() >= 12);

    summon(&t, &[&args[..], &["--resume"][..]].concat()).expect(0);

    let per_item = requests_per_item(&server);
    assert_eq!(
        per_item.keys().cloned().collect::<BTreeSet<_>>(),
        items.iter().cloned().collect(),
        "every item was requested"
    );
    let total: usize = per_item.values().sum();
    assert!(
        total <= 60 + 4,
        "{total} fan_out requests for 60 items: finished tasks were requested again ({in_flight} were in flight)"
    );
    let repeated: Vec<&String> = per_item
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(item, _)| item)
        .collect();
    assert!(repeated.len() <= 4, "requested twice: {repeated:?}");
    for item in &repeated {
        assert!(
            !finished_before.contains(*item),
            "{item} was in results.jsonl before the kill, and was requested again"
        );
    }

    let lines = results(&out_dir);
    assert_eq!(lines.len(), 60, "every task exactly once: {lines:#?}");
    let indexes: BTreeSet<u64> = lines.iter().map(|l| l["index"].as_u64().unwrap()).collect();
    assert_eq!(indexes, (0..60).collect());
    for line in &lines {
        let index = line["index"].as_u64().unwrap() as usize;
        assert_eq!(line["item"], json!(items[index]));
        assert_eq!(line["status"], "completed");
    }

    // Editing one item re-runs that item only.
    let before = support::chat_count(&server);
    let mut edited = items.clone();
    edited[7] = "item-07-edited".to_owned();
    std::fs::write(
        t.path().join("p.yaml"),
        fan_out_pipeline(&edited, "Process {{ item }}", "", ""),
    )
    .unwrap();
    summon(&t, &[&args[..], &["--resume"][..]].concat()).expect(0);
    assert_eq!(
        support::chat_count(&server),
        before + 1,
        "only the edited item"
    );
    assert_eq!(requests_per_item(&server).get("item-07-edited"), Some(&1));
}

#[tokio::test(flavor = "multi_thread")]
async fn resume_replaces_the_results_line_of_a_task_that_ran_again() {
    let fixed = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&fixed);
    let server = MockServer::start(MockConfig::new().rule(move |req| {
        let text = req.last_user_text().unwrap_or_default();
        if text.contains("bad") && !flag.load(Ordering::SeqCst) {
            bad_request()
        } else {
            Reply::Echo
        }
    }))
    .await;
    let items: Vec<String> = ["a", "bad", "c"].map(String::from).to_vec();
    let pipeline = fan_out_pipeline(
        &items,
        "Check {{ item }}",
        "    on_error: continue\n    min_success: 100%\n",
        "",
    );
    let t = project(&server).write_raw("p.yaml", &pipeline);
    let args = ["run", "p.yaml", "--out", "out", "--quiet"];
    summon(&t, &args).expect(2);
    assert_eq!(support::chat_count(&server), 3);

    fixed.store(true, Ordering::SeqCst);
    summon(&t, &[&args[..], &["--resume"][..]].concat()).expect(0);
    assert_eq!(
        support::chat_count(&server),
        4,
        "only the failed task ran again"
    );
    let lines = results(&t.path().join("out"));
    assert_eq!(lines.len(), 3, "every task exactly once: {lines:#?}");
    let bad = lines.iter().find(|l| l["index"] == 1).unwrap();
    assert_eq!(bad["status"], "completed", "{bad}");
    assert_eq!(bad["output"], "echo: Check bad");

    // An edited item: its line shows the new item and output.
    let edited: Vec<String> = ["a", "bad", "c-edited"].map(String::from).to_vec();
    std::fs::write(
        t.path().join("p.yaml"),
        fan_out_pipeline(
            &edited,
            "Check {{ item }}",
            "    on_error: continue\n    min_success: 100%\n",
            "",
        ),
    )
    .unwrap();
    summon(&t, &[&args[..], &["--resume"][..]].concat()).expect(0);
    assert_eq!(support::chat_count(&server), 5);
    let lines = results(&t.path().join("out"));
    assert_eq!(lines.len(), 3, "{lines:#?}");
    let third = lines.iter().find(|l| l["index"] == 2).unwrap();
    assert_eq!(third["item"], "c-edited", "{third}");
    assert_eq!(third["output"], "echo: Check c-edited", "{third}");
}

#[tokio::test(flavor = "multi_thread")]
async fn resume_refuses_other_parameters_and_a_missing_run() {
    let server = MockServer::start(MockConfig::new()).await;
    let pipeline = "version: 1\nname: p\nparameters:\n  - key: who\n    input_type: string\n    requirement: optional\n    default: me\nsteps:\n  - id: one\n    delegate:\n      instructions: \"Hi {{ who }}\"\n";
    let t = project(&server).write_raw("p.yaml", pipeline);
    let none = summon(&t, &["run", "p.yaml", "--resume"]).expect(1);
    assert!(none.stderr.contains("resume"), "{}", none.stderr);
    assert_eq!(support::chat_count(&server), 0);
    summon(&t, &["run", "p.yaml", "--param", "who=you"]).expect(0);
    let other = summon(&t, &["run", "p.yaml", "--resume", "--param", "who=them"]).expect(1);
    assert!(other.stderr.contains("parameters"), "{}", other.stderr);
    assert_eq!(support::chat_count(&server), 1);
    // Same parameters: nothing to do again.
    let same = summon(&t, &["run", "p.yaml", "--resume", "--param", "who=you"]).expect(0);
    assert_eq!(same.stdout, "echo: Hi you\n");
    assert_eq!(support::chat_count(&server), 1);
}

// ---------------------------------------------------------------------------------------------
// 5. and 6. Nothing is sent by --dry-run or for an invalid pipeline.

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_sends_nothing_and_prints_the_widths() {
    let server = MockServer::start(MockConfig::new()).await;
    let pipeline = fan_out_pipeline(
        &["a", "b", "c"].map(String::from),
        "Look at {{ item }}",
        "",
        SYNTH_TAIL,
    );
    let t = project(&server).write_raw("p.yaml", &pipeline);
    let text = summon(&t, &["run", "p.yaml", "--dry-run", "--out", "out"]).expect(0);
    assert!(text.stdout.contains("3 tasks"), "{}", text.stdout);
    for id in ["list", "each", "sum"] {
        assert!(text.stdout.contains(id), "{}", text.stdout);
    }
    let json = summon(&t, &["run", "p.yaml", "--dry-run", "--json"]).expect(0);
    let json = json.json();
    let steps = json["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3);
    assert_eq!(steps[1]["id"], "each");
    assert_eq!(steps[1]["width"], 3);
    assert_eq!(steps[1]["needs"], json!(["list"]));
    assert_eq!(support::chat_count(&server), 0, "--dry-run sent a request");
    assert!(!t.path().join("out").exists(), "--dry-run wrote --out");
    // With a price for the model, the estimate has a cost.
    assert_eq!(json["unpriced_models"], json!(["mock-model"]));
    std::fs::write(
        t.path().join("summon.yaml"),
        "prices:\n  mock-model: { input: 1000000, output: 0 }\n",
    )
    .unwrap();
    let priced = summon(&t, &["run", "p.yaml", "--dry-run", "--json"])
        .expect(0)
        .json();
    let tokens = priced["estimated_input_tokens"].as_f64().unwrap();
    assert!(tokens > 0.0);
    assert_eq!(priced["estimated_input_cost_usd"].as_f64().unwrap(), tokens);
    assert_eq!(priced["unpriced_models"], json!([]));
    assert_eq!(support::chat_count(&server), 0);
}

/// What the token estimate counts of a recorded first request: system prompt, first user
/// message, model and tool specs, about four bytes per token.
fn estimated_tokens(request: &RecordedRequest) -> u64 {
    let messages = request.body["messages"].as_array().expect("messages");
    let system = messages
        .iter()
        .find(|m| m["role"] == "system")
        .and_then(|m| m["content"].as_str())
        .map_or(0, str::len);
    let tools: usize = request.body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| {
                    let f = &t["function"];
                    f["name"].as_str().unwrap().len()
                        + f["description"].as_str().unwrap().len()
                        + f["parameters"].to_string().len()
                })
                .sum()
        })
        .unwrap_or(0);
    let chars = system + first_user(request).len() + request.model().unwrap().len() + tools;
    (chars as u64).div_ceil(4)
}

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_drafts_each_request_as_the_run_sends_it() {
    let server =
        MockServer::start(MockConfig::new().default_reply(Reply::text("{\"label\": \"ok\"}")))
            .await;
    let recipe = "version: 1.0.0\ntitle: Label\ndescription: Label one row\ninstructions: Label the row.\nprompt: |\n  Row {{ id }}: {{ text }}\nparameters:\n  - key: id\n    input_type: string\n    requirement: required\n    description: id\n  - key: text\n    input_type: string\n    requirement: required\n    description: text\n";
    let mut csv = String::from("id,text\n");
    for i in 0..7 {
        csv.push_str(&format!("{i},row {} says {}\n", i, "x".repeat(i * 40)));
    }
    let pipeline = r#"version: 1
name: p
steps:
  - id: rows
    decompose:
      file: rows.csv
  - id: label
    fan_out:
      over: rows
      source: label
      parameters:
        id: "{{ item.id }}"
        text: "{{ item.text }}"
  - id: sum
    synthesize:
      instructions: "Sum up {{ steps.label.results | length }} labels"
"#;
    let t = project(&server)
        .write_raw("recipes/label.yaml", recipe)
        .write_raw("rows.csv", &csv)
        .write_raw("p.yaml", pipeline);
    let plan = summon(&t, &["run", "p.yaml", "--dry-run", "--json"])
        .expect(0)
        .json();
    assert_eq!(support::chat_count(&server), 0, "--dry-run sent a request");
    assert!(
        !t.path().join(".summon").exists(),
        "--dry-run wrote the store"
    );
    let label = &plan["steps"][1];
    assert_eq!(label["width"], 7, "{plan:#}");
    assert_eq!(label["drafted"], 7, "{plan:#}");
    assert_eq!(label["model"], "mock-model", "{plan:#}");
    let sum = &plan["steps"][2];
    assert_eq!(sum["drafted"], 0, "{plan:#}");
    assert!(
        sum["later"].as_str().unwrap().contains("`label`"),
        "{plan:#}"
    );
    assert_eq!(
        (plan["tasks"].as_u64(), plan["drafted_tasks"].as_u64()),
        (Some(8), Some(7))
    );

    // The real run sends what the dry run drafted: the same first message, and requests
    // whose estimate adds up to the dry run's.
    summon(&t, &["run", "p.yaml", "--quiet"]).expect(0);
    let sent: Vec<RecordedRequest> = chats(&server)
        .into_iter()
        .filter(|r| first_user(r).starts_with("Row "))
        .collect();
    assert_eq!(sent.len(), 7);
    let first = sent
        .iter()
        .find(|r| first_user(r).starts_with("Row 0:"))
        .unwrap();
    assert_eq!(label["prompt"].as_str(), Some(first_user(first).as_str()));
    let tokens: u64 = sent.iter().map(estimated_tokens).sum();
    assert_eq!(label["input_tokens"].as_u64(), Some(tokens), "{plan:#}");
    assert_eq!(plan["estimated_input_tokens"].as_u64(), Some(tokens));
}

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_reports_a_template_the_run_would_fail_on_at_its_step() {
    let server = MockServer::start(MockConfig::new()).await;
    let pipeline = "version: 1\nname: p\nsteps:\n  - id: list\n    decompose:\n      items: [{\"n\": 1}]\n  - id: each\n    fan_out:\n      over: list\n      instructions: \"Look at {{ item.missing.deeper }}\"\n";
    let t = project(&server).write_raw("p.yaml", pipeline);
    let ran = summon(&t, &["run", "p.yaml", "--dry-run"]).expect(1);
    assert!(ran.stderr.contains("p.yaml:7:9"), "{}", ran.stderr);
    assert!(ran.stderr.contains("item.missing"), "{}", ran.stderr);
    assert!(
        ran.stdout.contains("each (fan_out) after list: 1 task"),
        "{}",
        ran.stdout
    );
    assert_eq!(support::chat_count(&server), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn cycles_and_unknown_references_are_rejected_before_anything_runs() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server)
        .write(
            "cycle.yaml",
            r#"
            version: 1
            name: cycle
            steps:
              - id: first
                delegate:
                  instructions: "start"
              - id: a
                synthesize:
                  instructions: "{{ steps.b.output }}"
              - id: b
                synthesize:
                  instructions: "{{ steps.a.output }}"
            "#,
        )
        .write(
            "unknown.yaml",
            r#"
            version: 1
            name: unknown
            steps:
              - id: first
                delegate:
                  instructions: "start"
              - id: b
                fan_out:
                  over: nope
                  instructions: "{{ item }}"
              - id: c
                synthesize:
                  instructions: "{{ steps.ghost.output }}"
            "#,
        );
    let cycle = summon(&t, &["run", "cycle.yaml", "--out", "out"]).expect(1);
    assert!(
        cycle.stderr.contains("cycle.yaml:") && cycle.stderr.contains("cycle"),
        "{}",
        cycle.stderr
    );
    let unknown = summon(&t, &["run", "unknown.yaml", "--out", "out"]).expect(1);
    assert!(
        unknown.stderr.contains("unknown.yaml:"),
        "{}",
        unknown.stderr
    );
    assert!(unknown.stderr.contains("`nope`"), "{}", unknown.stderr);
    assert!(unknown.stderr.contains("`ghost`"), "{}", unknown.stderr);
    assert_eq!(support::chat_count(&server), 0, "a request was sent");
    assert!(!t.path().join("out").exists());
}

// ---------------------------------------------------------------------------------------------
// 7. Model-chosen roles.

const EXPLORER: &str = "
    ---
    name: explorer
    description: explores
    ---

    You explore carefully.
    ";

#[tokio::test(flavor = "multi_thread")]
async fn a_fan_out_source_template_picks_a_role_per_item() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = project(&server)
        .write(".agents/agents/explorer.md", EXPLORER)
        .write(
            "p.yaml",
            r#"
            version: 1
            name: roles
            steps:
              - id: plan
                decompose:
                  items:
                    - {agent: explorer, q: "Find the parser."}
                    - {agent: null, q: "Count the files."}
              - id: work
                fan_out:
                  over: plan
                  source: "{{ item.agent }}"
                  instructions: "{{ item.q }}"
            "#,
        )
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let messages: BTreeSet<String> = chats(&server).iter().map(first_user).collect();
    assert_eq!(
        messages,
        BTreeSet::from([
            "Subagent role \"explorer\", defined by this project in .agents/agents/explorer.md:\n\nYou explore carefully.\n\nTask:\nFind the parser.".to_owned(),
            "Count the files.".to_owned(),
        ]),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_role_fails_the_step_and_sends_nothing() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = project(&server)
        .write(".agents/agents/explorer.md", EXPLORER)
        .write_raw("plan.jsonl", "{\"agent\": \"ghost\", \"q\": \"Haunt.\"}\n")
        .write(
            "p.yaml",
            r#"
            version: 1
            name: roles
            steps:
              - id: plan
                decompose: {file: plan.jsonl}
              - id: work
                fan_out:
                  over: plan
                  source: "{{ item.agent }}"
                  instructions: "{{ item.q }}"
            "#,
        )
        .args(["run", "p.yaml", "--quiet"])
        .code(2)
        .run();
    assert!(
        out.stderr.contains(
            "Subagent \"ghost\" is not in this run's catalog. Use a name from it, or null for a general subagent."
        ),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("step `work` failed"), "{}", out.stderr);
    assert_eq!(support::chat_count(&server), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_role_after_known_ones_still_sends_nothing() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = project(&server)
        .write(".agents/agents/explorer.md", EXPLORER)
        .write_raw("plan.jsonl", "{\"agent\": \"explorer\", \"q\": \"Explore.\"}\n{\"agent\": null, \"q\": \"General.\"}\n{\"agent\": \"ghost\", \"q\": \"Haunt.\"}\n")
        .write(
            "p.yaml",
            r#"
            version: 1
            name: roles
            steps:
              - id: plan
                decompose: {file: plan.jsonl}
              - id: work
                fan_out:
                  over: plan
                  source: "{{ item.agent }}"
                  instructions: "{{ item.q }}"
            "#,
        )
        .args(["run", "p.yaml", "--concurrency", "1", "--quiet"])
        .code(2)
        .run();
    assert!(
        out.stderr
            .contains("Subagent \"ghost\" is not in this run's catalog"),
        "{}",
        out.stderr
    );
    assert_eq!(
        support::chat_count(&server),
        0,
        "every source name is checked before any task of the step is sent"
    );
}

// ---------------------------------------------------------------------------------------------
// 8. decompose from a CSV file, a command and a glob.

#[tokio::test(flavor = "multi_thread")]
async fn decompose_from_csv_command_and_glob() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = project(&server)
        .write_raw(
            "data/rows.csv",
            "id,text\n1,plain\n2,\"has, a comma\nand a newline\"\n3,last\n",
        )
        .write_raw("docs/b.md", "b")
        .write_raw("docs/c.md", "c")
        .write_raw("docs/a.md", "a")
        .write_raw("docs/skip.txt", "x")
        .write(
            "p.yaml",
            r#"
            version: 1
            name: decompose
            steps:
              - id: rows
                decompose:
                  file: data/rows.csv
              - id: per_row
                fan_out:
                  over: rows
                  instructions: "Row {{ item.id }} ({{ loop.index }}): {{ item.text }}"
              - id: lines
                decompose:
                  command: "printf 'a\\nb\\n\\nc\\n'"
              - id: files
                decompose:
                  glob: "docs/*.md"
              - id: show
                synthesize:
                  instructions: "Items {{ steps.lines.items | tojson }} {{ steps.files.items | tojson }}"
                needs: [per_row]
            "#,
        )
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let mut rows = requests_starting(&server, "Row ");
    rows.sort();
    assert_eq!(
        rows,
        [
            "Row 1 (1): plain",
            "Row 2 (2): has, a comma\nand a newline",
            "Row 3 (3): last"
        ]
    );
    let show = requests_starting(&server, "Items ");
    assert_eq!(
        show,
        [r#"Items ["a", "b", "c"] ["docs/a.md", "docs/b.md", "docs/c.md"]"#]
    );
    let lines = results(&out.dir.join("out"));
    let per_row = step_lines(&lines, "per_row");
    assert_eq!(per_row.len(), 3);
    let second = per_row.iter().find(|l| l["index"] == 1).unwrap();
    assert_eq!(
        second["item"],
        json!({"id": "2", "text": "has, a comma\nand a newline"})
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn decompose_from_jsonl() {
    let server = MockServer::start(MockConfig::new()).await;
    project(&server)
        .write_raw("rows.jsonl", "{\"n\": 1}\n\"two\"\n[3]\n")
        .write(
            "p.yaml",
            r#"
            version: 1
            name: jsonl
            steps:
              - id: rows
                decompose:
                  file: rows.jsonl
              - id: show
                synthesize:
                  instructions: "Items {{ steps.rows.items | tojson }}"
            "#,
        )
        .args(["run", "p.yaml", "--quiet"])
        .run();
    assert_eq!(
        requests_starting(&server, "Items "),
        [r#"Items [{"n": 1}, "two", [3]]"#]
    );
}

// ---------------------------------------------------------------------------------------------
// 9. Ad-hoc tasks: the rendered instructions, verbatim.

#[tokio::test(flavor = "multi_thread")]
async fn ad_hoc_fan_out_sends_the_rendered_instructions_verbatim() {
    let server = MockServer::start(MockConfig::new()).await;
    let instructions = "  Indented {{ item }}:\n\tkeep {braces} and: colons\n\n";
    let pipeline = fan_out_pipeline(&["x".to_owned()], instructions, "", "");
    project(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let requests = chats(&server);
    assert_eq!(requests.len(), 1);
    assert_eq!(
        first_user(&requests[0]),
        "  Indented x:\n\tkeep {braces} and: colons\n\n"
    );
    let messages = requests[0].body["messages"].as_array().unwrap();
    assert_eq!(
        messages.iter().filter(|m| m["role"] == "user").count(),
        1,
        "nothing is added around the instructions: {messages:#?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_block_scalar_synthesis_is_sent_as_rendered() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = project(&server)
        .write(
            "p.yaml",
            r#"
            version: 1
            name: block
            parameters:
              - key: topic
                input_type: string
                requirement: required
            steps:
              - id: one
                synthesize:
                  instructions: |
                    About {{ topic }}:
                      - indented line
                    last line
            "#,
        )
        .args(["run", "p.yaml", "--param", "topic=cats", "--quiet"])
        .run();
    assert_eq!(
        first_user(&chats(&server)[0]),
        "About cats:\n  - indented line\nlast line\n"
    );
    assert_eq!(
        out.stdout,
        "echo: About cats:\n  - indented line\nlast line\n"
    );
}

// ---------------------------------------------------------------------------------------------
// 10. report.json, --junit and outputs.

#[tokio::test(flavor = "multi_thread")]
async fn report_junit_and_outputs_agree_with_the_results() {
    let server = MockServer::start(failing_mock()).await;
    let items: Vec<String> = ["one", "bad-two", "three", "four", "five"]
        .map(String::from)
        .to_vec();
    let tail = "  - id: sum\n    synthesize:\n      instructions: \"Sum {% for r in steps.each.results %}{% if r.status == 'completed' %}{{ r.item }} {% endif %}{% endfor %}\"\noutputs:\n  - path: \"reports/{{ 'final' }}.md\"\n    content: \"{{ steps.sum.output }}\"\n";
    let pipeline = fan_out_pipeline(&items, "Check {{ item }}", "    on_error: continue\n", tail);
    let out = project(&server)
        .write_raw("p.yaml", &pipeline)
        .args([
            "run",
            "p.yaml",
            "--out",
            "out",
            "--junit",
            "junit.xml",
            "--quiet",
        ])
        .run();
    let synthesis = "echo: Sum one three four five ";
    assert_eq!(out.stdout, format!("{}\n", synthesis.trim_end()));
    // A file summon writes ends with exactly one line break.
    assert_eq!(
        std::fs::read_to_string(out.dir.join("reports/final.md")).unwrap(),
        format!("{synthesis}\n")
    );

    let lines = results(&out.dir.join("out"));
    assert_eq!(lines.len(), 6);
    let sum = |key: &str| -> u64 { lines.iter().map(|l| l[key].as_u64().unwrap()).sum() };
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.dir.join("out/report.json")).unwrap())
            .unwrap();
    let total = &report["total"];
    assert_eq!(total["tasks"], 6, "{report:#}");
    assert_eq!(total["completed"], 5);
    assert_eq!(total["failed"], 1);
    assert_eq!(total["skipped"], 0);
    assert_eq!(total["resumed"], 0);
    assert_eq!(total["input_tokens"], sum("input_tokens"));
    assert_eq!(total["output_tokens"], sum("output_tokens"));
    assert_eq!(total["turns"], sum("turns"));
    // Durations: the same per-task milliseconds, give or take rounding.
    let durations = total["duration_ms"]["sum"].as_u64().unwrap();
    assert!(durations.abs_diff(sum("duration_ms")) <= 6, "{report:#}");
    assert!(total["input_tokens"].as_u64().unwrap() > 0);
    let each = &report["steps"]["each"];
    assert_eq!(each["tasks"], 5);
    assert_eq!(each["failed"], 1);
    assert_eq!(report["steps"]["sum"]["tasks"], 1);

    let junit = std::fs::read_to_string(out.dir.join("junit.xml")).unwrap();
    assert_eq!(junit.matches("<testcase ").count(), 6, "{junit}");
    assert_eq!(junit.matches("<failure").count(), 1, "{junit}");
    assert!(
        junit.contains(r#"<testcase name="each: bad-two""#),
        "{junit}"
    );
    assert!(junit.contains(r#"tests="6" failures="1""#), "{junit}");
}

#[tokio::test(flavor = "multi_thread")]
async fn outputs_are_not_written_when_a_step_fails() {
    let server = MockServer::start(failing_mock()).await;
    let tail = "outputs:\n  - path: out.md\n    content: \"{{ steps.each.results | length }}\"\n";
    let pipeline = fan_out_pipeline(&["bad".to_owned()], "Check {{ item }}", "", tail);
    let out = project(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--junit", "j.xml", "--quiet"])
        .code(2)
        .run();
    assert!(!out.dir.join("out.md").exists());
    let junit = std::fs::read_to_string(out.dir.join("j.xml")).unwrap();
    assert_eq!(junit.matches("<failure").count(), 1, "{junit}");
}

/// Answers of about 40 kB for `Item NN`, later items sooner: 40 of them are more text than
/// summon keeps in memory, and they finish out of item order.
fn large_late_answers() -> MockConfig {
    MockConfig::new().rule(|req| {
        let text = req.last_user_text().unwrap_or_default();
        let n: u64 = text.trim_start_matches("Item ").trim().parse().unwrap_or(0);
        Reply::text(large_answer(n)).delayed(Duration::from_millis((39 - n.min(39)) * 3))
    })
}

fn large_answer(n: u64) -> String {
    format!("answer {n:02}: {}\n", "é-".repeat(13_000 + n as usize))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fan_out_s_large_final_text_is_printed_whole_in_item_order() {
    let server = MockServer::start(large_late_answers()).await;
    let items: Vec<String> = (0..40).map(|i| format!("{i:02}")).collect();
    let pipeline = fan_out_pipeline(&items, "Item {{ item }}", "    concurrency: 8\n", "");
    let expected: String = (0..40).map(large_answer).collect::<Vec<_>>().join("\n\n");
    assert!(
        expected.len() > 1 << 20,
        "the text must be larger than what stays in memory"
    );
    let t = project(&server).write_raw("p.yaml", &pipeline);
    let text = summon(&t, &["run", "p.yaml", "--quiet"]).expect(0);
    assert_eq!(text.stdout.len(), expected.trim_end().len() + 1);
    assert!(
        text.stdout == format!("{}\n", expected.trim_end()),
        "stdout differs"
    );
    let json = summon(&t, &["run", "p.yaml", "--quiet", "--json"])
        .expect(0)
        .json();
    assert!(json["output"] == expected, "--json output differs");
    // The text waited in a file with no name: nothing is left behind.
    let store: Vec<String> = std::fs::read_dir(t.path().join(".summon"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with("state.db") && name != ".gitignore" && name != "live")
        .collect();
    assert!(store.iter().all(|name| name == "tasks"), "{store:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn report_json_times_every_step() {
    let server = MockServer::start(MockConfig::new()).await;
    let pipeline = fan_out_pipeline(&["a".to_owned(), "b".to_owned()], "Do {{ item }}", "", "");
    let out = project(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.dir.join("out/report.json")).unwrap())
            .unwrap();
    let steps = report["steps"].as_object().unwrap();
    assert_eq!(
        steps.keys().collect::<Vec<_>>(),
        ["list", "each"],
        "{report:#}"
    );
    assert!(steps["each"]["wall_ms"].is_u64(), "{report:#}");
    assert!(steps["list"]["wall_ms"].is_u64(), "{report:#}");
}

// ---------------------------------------------------------------------------------------------
// 11. --json.

#[tokio::test(flavor = "multi_thread")]
async fn json_summary_shape() {
    let server = MockServer::start(MockConfig::new()).await;
    let pipeline = fan_out_pipeline(
        &["a".to_owned()],
        "Look {{ item }}",
        "",
        "  - id: sum\n    synthesize:\n      instructions: \"Total {{ steps.each.results | length }}\"\n",
    );
    let out = project(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--json"])
        .run();
    let json = out.json();
    let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "run_id",
            "status",
            "steps",
            "input_tokens",
            "output_tokens",
            "cache_read_tokens",
            "cache_write_tokens",
            "output"
        ]
    );
    assert!(
        json["run_id"].as_str().is_some_and(|id| !id.is_empty()),
        "{json}"
    );
    assert_eq!(json["status"], "succeeded");
    assert_eq!(json["output"], "echo: Total 1");
    assert_eq!(
        json["steps"],
        json!([
            {"id": "list", "status": "succeeded", "error": null},
            {"id": "each", "status": "succeeded", "error": null},
            {"id": "sum", "status": "succeeded", "error": null},
        ])
    );
}

// ---------------------------------------------------------------------------------------------
// Ctrl-C drains.

#[tokio::test(flavor = "multi_thread")]
async fn first_interrupt_drains_and_resume_finishes_without_repeats() {
    let server = MockServer::start(MockConfig::new().latency(Duration::from_millis(300))).await;
    let items = item_names("item-", 16);
    let pipeline = fan_out_pipeline(&items, "Process {{ item }}", "", "");
    let t = project(&server).write_raw("p.yaml", &pipeline);
    let args = [
        "run",
        "p.yaml",
        "--concurrency",
        "4",
        "--out",
        "out",
        "--quiet",
    ];
    let child = t
        .command()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn summon run");
    wait_for(Duration::from_secs(20), "the first requests", || {
        support::chat_count(&server) >= 4
    });
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(status.success());
    let output = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    let first = support::chat_count(&server);
    assert!(
        first < 16,
        "drained: no new task after Ctrl-C ({first} requests)"
    );
    // The tasks in flight finished and were written.
    let lines = results(&t.path().join("out"));
    assert_eq!(lines.len() as u64, first, "{lines:#?}");

    summon(&t, &[&args[..], &["--resume"][..]].concat()).expect(0);
    assert_eq!(support::chat_count(&server), 16, "a drained task ran again");
    let lines = results(&t.path().join("out"));
    let indexes: BTreeSet<u64> = lines.iter().map(|l| l["index"].as_u64().unwrap()).collect();
    assert_eq!(lines.len(), 16);
    assert_eq!(indexes, (0..16).collect());
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_right_after_a_wave_finishes_repeats_only_the_tasks_in_flight() {
    let server = MockServer::start(MockConfig::new().latency(Duration::from_millis(300))).await;
    let items = item_names("item-", 40);
    let pipeline = fan_out_pipeline(&items, "Process {{ item }}", "", "");
    let t = project(&server).write_raw("p.yaml", &pipeline);
    let args = [
        "run",
        "p.yaml",
        "--concurrency",
        "4",
        "--out",
        "out",
        "--quiet",
    ];
    let mut child = t
        .command()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn summon run");
    // Third wave in flight; kill as soon as the fourth starts: the third has finished (its
    // tasks gave their slots to the fourth) and only the fourth is in flight.
    wait_for(Duration::from_secs(30), "the third wave", || {
        support::chat_count(&server) >= 12
    });
    wait_for(Duration::from_secs(30), "the fourth wave", || {
        support::chat_count(&server) > 12
    });
    std::thread::sleep(Duration::from_millis(2));
    child.kill().expect("kill -9");
    child.wait().expect("wait");
    let first = support::chat_count(&server);
    assert!(first <= 16, "{first}");
    summon(&t, &[&args[..], &["--resume"][..]].concat()).expect(0);
    let total = support::chat_count(&server);
    assert!(
        total <= 40 + 4,
        "{total} requests for 40 tasks: finished tasks ran again (killed with {first} sent)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn resume_uses_the_run_s_frozen_catalog() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server)
        .write(".agents/agents/explorer.md", EXPLORER)
        .write_raw("plan.jsonl", "{\"agent\": \"explorer\", \"q\": \"Find the parser.\"}\n{\"agent\": \"newbie\", \"q\": \"Count the files.\"}\n")
        .write(
            "p.yaml",
            r#"
            version: 1
            name: roles
            steps:
              - id: plan
                decompose: {file: plan.jsonl}
              - id: work
                fan_out:
                  over: plan
                  source: "{{ item.agent }}"
                  instructions: "{{ item.q }}"
            "#,
        );
    let first = summon(&t, &["run", "p.yaml", "--quiet"]).expect(2);
    assert!(
        first
            .stderr
            .contains("Subagent \"newbie\" is not in this run's catalog"),
        "{}",
        first.stderr
    );
    // A definition added after the run started is not in its frozen catalog...
    std::fs::write(
        t.path().join(".agents/agents/newbie.md"),
        "---\nname: newbie\ndescription: new\n---\nYou are new.\n",
    )
    .unwrap();
    let resumed = summon(&t, &["run", "p.yaml", "--resume", "--quiet"]).expect(2);
    assert!(
        resumed
            .stderr
            .contains("Subagent \"newbie\" is not in this run's catalog"),
        "{}",
        resumed.stderr
    );
    assert_eq!(support::chat_count(&server), 0);
    // ...but a new run sees it.
    summon(&t, &["run", "p.yaml", "--quiet"]).expect(0);
    assert_eq!(support::chat_count(&server), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_closed_stderr_does_not_end_the_run() {
    // Warnings, progress and the summary go to stderr; nobody reads it.
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("fine"))).await;
    let t = project(&server).write(
        "p.yaml",
        "
        version: 1
        name: p
        steps:
          - id: list
            decompose:
              items: [a, b, c]
          - id: each
            fan_out:
              over: list
              instructions: \"Look at {{ item }}\"
              extensions: [developer]
        ",
    );
    let mut child = t
        .command()
        .args(["run", "p.yaml", "--out", "out"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn summon");
    drop(child.stderr.take());
    let output = child.wait_with_output().expect("wait");
    assert_eq!(
        output.status.code(),
        Some(0),
        "no panic (101) on the closed stream"
    );
    assert_eq!(support::chat_count(&server), 3);
    let results = std::fs::read_to_string(t.path().join("out/results.jsonl")).unwrap();
    assert_eq!(results.lines().count(), 3);
}
