//! `summon run` against a mock that injects faults: 429 with and without `Retry-After`,
//! 500/503, dropped connections, stalled responses and truncated JSON, at 5 %, 10 % and 20 % of
//! the requests of a 1,000-task fan-out. Every result must arrive exactly once, no task may be
//! answered successfully twice, retries stay within their bounds and `report.json` counts the
//! retries per class. Quota-exhausted 429s and 401s fail fast instead.
//!
//! With `SUMMON_FIGURES=FILE`, each scenario appends one JSON line of figures to FILE (read
//! by `benches/reliability.py`).

use crate::support;
use crate::support::figure;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use summon_mock_llm::{Api, Fault, FaultPlan, MockConfig, MockServer, Reply};
use support::Test;

const KEY: &str = "sk-test-faults-0123456789abcdef";
const TASKS: usize = 1000;
/// Provider retries per request (the default policy) and task attempts (`retries: 2`).
const MAX_REQUESTS_PER_TASK: usize = (5 + 1) * (2 + 1);

/// A project wired to the mock, with a 5 s request timeout (stalled responses) and a 5 ms
/// retry base (computed backoff). The timeout covers the whole answer: at 1 s a debug build
/// on a loaded machine timed out good answers among the first 64 (the mock had sent them, so
/// an item counted as answered twice), with the answer read whole or a chunk at a time alike.
fn project(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_RETRY_BASE_MS", "5")
        .write(
            "summon.yaml",
            "
            providers:
              openai:
                timeout_secs: 5
            ",
        )
}

fn fan_out(n: usize, concurrency: usize, each_extra: &str) -> String {
    let items: Vec<String> = (0..n).map(|i| format!("item-{i:04}")).collect();
    format!(
        "version: 1\nname: faults\nsettings:\n  concurrency: {concurrency}\nsteps:\n  - id: list\n    decompose:\n      items: [{}]\n  - id: each\n    fan_out:\n      over: list\n      instructions: \"Process {{{{ item }}}}\"\n{each_extra}",
        items.join(", ")
    )
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line ({e}): {l}")))
        .collect()
}

/// The report class a fault is retried under.
fn report_class(fault: Fault) -> &'static str {
    match fault {
        Fault::RateLimited | Fault::RateLimitedRetryAfter => "rate_limited",
        Fault::ServerError | Fault::Unavailable => "server_error",
        Fault::Dropped => "connection",
        Fault::Stalled => "timeout",
        Fault::Truncated => "invalid_response",
    }
}

async fn fan_out_under_faults(rate: f64, seed: u64) {
    let plan = FaultPlan {
        retry_after: Duration::from_millis(200),
        stall_for: Duration::from_secs(10),
        ..FaultPlan::uniform(rate, seed)
    };
    let server = MockServer::start(MockConfig::new().faults(plan)).await;
    let t = project(&server).write_raw("p.yaml", &fan_out(TASKS, 64, "    retries: 2\n"));
    let started = Instant::now();
    let output = t
        .command()
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .output()
        .expect("run summon");
    let elapsed = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "rate {rate}: {stderr}");

    // Every result exactly once, each the answer to its own item.
    let lines = read_jsonl(&t.path().join("out/results.jsonl"));
    assert_eq!(lines.len(), TASKS, "rate {rate}: one line per task");
    let indexes: BTreeSet<u64> = lines.iter().map(|l| l["index"].as_u64().unwrap()).collect();
    assert_eq!(indexes.len(), TASKS, "rate {rate}: a task has two lines");
    for line in &lines {
        let item = line["item"].as_str().unwrap();
        assert_eq!(line["status"], "completed", "{line}");
        assert_eq!(line["output"], format!("echo: Process {item}"), "{line}");
    }

    // Per item: exactly one successful answer, and a bounded number of requests.
    let mut per_item: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for request in server.requests().iter().filter(|r| r.api == Api::OpenAi) {
        let text = request.last_user_text().unwrap_or_default();
        let item = text.strip_prefix("Process ").expect("a fan-out request");
        let entry = per_item.entry(item.to_owned()).or_default();
        entry.0 += 1;
        entry.1 += usize::from(request.fault.is_none());
    }
    assert_eq!(per_item.len(), TASKS);
    for (item, (requests, answered)) in &per_item {
        assert_eq!(
            *answered, 1,
            "rate {rate}: {item} was answered {answered} times"
        );
        assert!(
            *requests <= MAX_REQUESTS_PER_TASK,
            "rate {rate}: {item} took {requests} requests"
        );
    }

    // The report counts each retry under the class of its fault. A fault that ends a task's
    // attempt (its retries used up, which takes 6 requests) is not retried by the provider
    // layer, so the report may count fewer only then.
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(t.path().join("out/report.json")).expect("report.json"),
    )
    .expect("report JSON");
    let retries = report["retries_by_class"]
        .as_object()
        .expect("retries_by_class");
    let injected = server.faults_injected();
    let mut expected: BTreeMap<&str, u64> = BTreeMap::new();
    for (fault, n) in &injected {
        *expected.entry(report_class(*fault)).or_default() += n;
    }
    let long_tasks = per_item.values().filter(|(r, _)| *r > 6).count() as u64;
    let mut lost_to_exhaustion = 0;
    for (class, want) in &expected {
        let got = retries[*class].as_u64().expect("a count");
        assert!(
            got <= *want,
            "rate {rate}: {class}: {got} retries > {want} faults"
        );
        lost_to_exhaustion += want - got;
    }
    assert!(
        lost_to_exhaustion <= long_tasks,
        "rate {rate}: retries {retries:?} vs faults {expected:?}"
    );
    let total_injected: u64 = injected.values().sum();
    let requests = server.request_count();
    let share = total_injected as f64 / requests as f64;
    assert!(
        (rate * 0.6..rate * 1.4).contains(&share),
        "rate {rate}: {total_injected} faults in {requests} requests"
    );
    for fault in Fault::ALL {
        assert!(
            injected[&fault] > 0,
            "rate {rate}: no {} fault",
            fault.name()
        );
    }
    figure(json!({
        "suite": "faults",
        "rate": rate,
        "tasks": TASKS,
        "requests": requests,
        "injected": injected.iter().map(|(f, n)| (f.name(), *n)).collect::<BTreeMap<_, _>>(),
        "retries_by_class": retries,
        "results_lost": TASKS - lines.len(),
        "completed_twice": per_item.values().filter(|(_, a)| *a > 1).count(),
        "seconds": elapsed.as_secs_f64(),
    }));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_tasks_survive_5_percent_faults() {
    fan_out_under_faults(0.05, 5).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_tasks_survive_10_percent_faults() {
    fan_out_under_faults(0.10, 10).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_tasks_survive_20_percent_faults() {
    fan_out_under_faults(0.20, 20).await;
}

/// A permanent error: the first tasks fail at once, no request is retried, the step stops
/// sending and the message says what to do; the run exits `code`.
async fn fails_fast(reply: Reply, expected: &[&str], code: i32) -> u64 {
    fails_fast_with(MockConfig::new().default_reply(reply), expected, code).await
}

/// [`fails_fast`] against a server configured as `config`; the chat requests it was sent.
async fn fails_fast_with(config: MockConfig, expected: &[&str], code: i32) -> u64 {
    let server = MockServer::start(config).await;
    let t = project(&server).write_raw("p.yaml", &fan_out(200, 4, ""));
    let output = t
        .command()
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .output()
        .expect("run summon");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "{stderr}");
    for text in expected {
        assert!(stderr.contains(text), "`{text}` missing from:\n{stderr}");
    }
    assert!(!stderr.contains(KEY), "the key leaked: {stderr}");
    let requests = support::chat_count(&server);
    assert!(
        requests <= 8,
        "{requests} requests for a permanent error (4 in flight at most)"
    );
    let mut per_item: BTreeMap<String, usize> = BTreeMap::new();
    for request in support::chats(&server) {
        *per_item
            .entry(request.last_user_text().unwrap_or_default())
            .or_default() += 1;
    }
    assert!(per_item.values().all(|n| *n == 1), "retried: {per_item:?}");
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(t.path().join("out/report.json")).expect("report.json"),
    )
    .expect("report JSON");
    let retried: u64 = report["retries_by_class"]
        .as_object()
        .expect("retries_by_class")
        .values()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(retried, 0);
    requests
}

#[tokio::test(flavor = "multi_thread")]
async fn quota_exhausted_429_fails_fast_with_a_clear_message() {
    let requests = fails_fast(
        Reply::status(
            429,
            r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","code":"insufficient_quota"}}"#,
        ),
        &["no quota or credit left", "check plan and billing"],
        2,
    )
    .await;
    figure(json!({"suite": "fail_fast", "case": "insufficient_quota", "requests": requests}));
}

#[tokio::test(flavor = "multi_thread")]
async fn unauthorized_401_fails_fast_with_a_clear_message() {
    // A key the provider refuses, for its model list as for its chats.
    let requests = fails_fast_with(
        MockConfig::new().api_key("sk-not-the-key-0123456789abcdef"),
        &["authentication failed (HTTP 401)", "OPENAI_API_KEY"],
        1,
    )
    .await;
    // A refused key is sent one request: until the provider's first answer, one at a time.
    assert_eq!(requests, 1);
    figure(json!({"suite": "fail_fast", "case": "unauthorized", "requests": requests}));
}

/// Runs `command` with writes past `limit_kib` KiB per file failing (`ulimit -f`, SIGXFSZ
/// ignored): a disk that fills up, without root. A hang is killed after two minutes.
fn run_with_file_limit(command: &std::process::Command, limit_kib: u64) -> std::process::Output {
    let mut shell = std::process::Command::new("bash");
    shell
        .arg("-c")
        .arg(format!(
            "ulimit -f {limit_kib} && trap '' XFSZ && exec timeout -s KILL 120 \"$0\" \"$@\""
        ))
        .arg(command.get_program())
        .args(command.get_args())
        .env_clear();
    if let Some(dir) = command.get_current_dir() {
        shell.current_dir(dir);
    }
    for (key, value) in command.get_envs() {
        if let Some(value) = value {
            shell.env(key, value);
        }
    }
    shell.output().expect("run summon")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_fails_the_run_with_74_naming_the_file_and_resume_adds_no_duplicate() {
    // Equal answers are stored once in the journal but written out on every line of
    // results.jsonl: with small answers the journal fills its limit first, with large ones
    // results.jsonl does.
    for (answer_kib, limit_kib, file) in [(8, 192, "state.db"), (32, 1024, "results.jsonl")] {
        let answer = "x".repeat(answer_kib * 1024);
        let server = MockServer::start(MockConfig::new().default_reply(Reply::text(answer))).await;
        let tasks = 60;
        let t = project(&server).write("p.yaml", &fan_out(tasks, 4, ""));
        let mut first = t.command();
        first.args(["run", "p.yaml", "--out", "out", "--quiet"]);
        let output = run_with_file_limit(&first, limit_kib);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(74), "{stderr}");
        assert!(
            stderr
                .lines()
                .last()
                .is_some_and(|l| l.starts_with("summon: error: ") && l.contains(file)),
            "the error does not name {file}: {stderr}"
        );
        assert!(
            server.requests().len() < tasks,
            "the run went on after the disk filled"
        );
        // Space again: the resumed run completes every task, each on one line.
        let resumed = t
            .args(["run", "p.yaml", "--out", "out", "--quiet", "--resume"])
            .run();
        let lines = read_jsonl(&resumed.dir.join("out/results.jsonl"));
        let keys: BTreeSet<(String, u64)> = lines
            .iter()
            .map(|l| {
                (
                    l["step"].as_str().unwrap().to_owned(),
                    l["index"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(lines.len(), keys.len(), "a duplicate line ({file})");
        assert_eq!(keys.len(), tasks, "a lost line ({file})");
        assert!(lines.iter().all(|l| l["status"] == "completed"));
    }
}
