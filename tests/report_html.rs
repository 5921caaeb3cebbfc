//! `report.html` in every `--out` directory: written by `summon run` (also when the run fails)
//! and `summon merge`, built again by `summon report DIR`, and loaded in a real headless
//! Chromium, where the task count, a failed task's error and the filters are checked through
//! the DOM and a screenshot is saved under `target/report-html/`.
//!
//! The browser test is ignored unless asked for (`cargo test --test suite -- --ignored`, as CI does after
//! installing Chromium); asked for without a Chromium, it fails.

use crate::support;
use crate::support::{read_json, results};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

// ---------------------------------------------------------------------------------------------
// The run.

const KEY: &str = "sk-test-0123456789abcdef";

fn project(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_RETRY_BASE_MS", "20")
}

/// Items of the fan-out: `bad*` fail (HTTP 400), `tool*` call `list_files` once, `busy*` are
/// refused once by a rate limit (HTTP 429) and then answered.
const ITEMS: [&str; 8] = [
    "ok0", "bad1", "ok2", "tool3", "bad4", "busy5", "ok6", "bad7",
];
const FAILED: usize = 3;

fn mock() -> MockConfig {
    let limited = Arc::new(AtomicBool::new(false));
    MockConfig::new().rule(move |req| {
        let text = req.last_user_text().unwrap_or_default();
        let answered_tool = req.body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        if text.starts_with("Check ") && text.contains("bad") {
            Reply::status(
                400,
                r#"{"error":{"message":"this item is bad","type":"invalid_request_error"}}"#,
            )
        } else if text.contains("tool") && !answered_tool {
            Reply::tool_call("list_files", json!({}))
        } else if text.contains("busy") && !limited.swap(true, Ordering::SeqCst) {
            // The wait the provider asks for, so that the recorded wait is known (a computed
            // backoff is jittered and may round to 0 ms).
            Reply::status_with_headers(
                429,
                [("retry-after-ms", "30")],
                r#"{"error":{"message":"slow down","type":"rate_limit_error"}}"#,
            )
        } else {
            Reply::Echo
        }
    })
}

fn pipeline(on_error: &str) -> String {
    format!(
        "version: 1
name: checks
steps:
  - id: list
    decompose:
      items: [{}]
  - id: each
    fan_out:
      over: list
      instructions: \"Check {{{{ item }}}} </script> <b>carefully</b>\"
    tools: [list_files]
    on_error: {on_error}
  - id: sum
    synthesize:
      instructions: \"Sum {{% for r in steps.each.results %}}{{{{ r.status }}}} {{% endfor %}}\"
",
        ITEMS.join(", ")
    )
}

/// The data a page embeds: its summary, with `tasks` gathered from its chunks.
fn embedded(page: &str) -> Value {
    let script = |from: usize| -> Value {
        let start = from + page[from..].find('>').expect("the element") + 1;
        let end = start + page[start..].find("</script>").expect("its end");
        serde_json::from_str(&page[start..end]).expect("the data is JSON")
    };
    let mut data = script(page.find("id=\"summon-data\"").expect("the data element"));
    let mut tasks = Vec::new();
    for (at, _) in page.match_indices("<script type=\"application/json\" class=\"summon-tasks\">") {
        tasks.extend(
            script(at)
                .as_array()
                .expect("a chunk is an array")
                .iter()
                .cloned(),
        );
    }
    data["tasks"] = Value::Array(tasks);
    data
}

/// Runs the checks pipeline into `out`: every item runs (`on_error: continue`), three fail, and
/// the run succeeds.
async fn checked_run() -> (MockServer, support::Output) {
    let server = MockServer::start(mock()).await;
    let out = project(&server)
        .write_raw("p.yaml", &pipeline("continue"))
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    (server, out)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_writes_report_html_and_results_carry_start_prompt_tools_and_retries() {
    let (_server, out) = checked_run().await;
    let dir = out.dir.join("out");
    let lines = results(&dir);
    assert_eq!(lines.len(), ITEMS.len() + 1);
    let keys: Vec<&String> = lines[0].as_object().unwrap().keys().collect();
    let after = keys.iter().position(|k| *k == "corrections").unwrap() + 1;
    assert_eq!(
        keys[after..after + 7],
        [
            "started_ms",
            "attempts",
            "retries",
            "rate_limited",
            "retry_wait_ms",
            "tools",
            "prompt"
        ],
        "the trace follows `corrections`: {keys:?}"
    );
    let by_item = |item: &str| {
        lines
            .iter()
            .find(|l| l["item"] == item)
            .unwrap_or_else(|| panic!("no line for {item}"))
    };
    let report = read_json(&dir.join("report.json"));
    let wall = report["wall_ms"].as_u64().unwrap();
    for line in &lines {
        let started = line["started_ms"].as_u64().expect("a start time");
        let duration = line["duration_ms"].as_u64().unwrap();
        assert!(started + duration <= wall + 5, "{line} within wall {wall}");
        assert_eq!(line["attempts"], 1, "{line}");
    }
    // The synthesis started after every fan-out task ended.
    let sum = lines.iter().find(|l| l["step"] == "sum").unwrap();
    for each in lines.iter().filter(|l| l["step"] == "each") {
        assert!(
            sum["started_ms"].as_u64().unwrap()
                >= each["started_ms"].as_u64().unwrap() + each["duration_ms"].as_u64().unwrap(),
            "{sum} vs {each}"
        );
    }
    assert_eq!(
        by_item("ok2")["prompt"],
        "Check ok2 </script> <b>carefully</b>"
    );
    assert_eq!(by_item("ok2")["tools"], json!([]));
    let tools = by_item("tool3")["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 1, "{tools:?}");
    assert_eq!(tools[0]["name"], "list_files");
    assert_eq!(tools[0]["ok"], true);
    assert_eq!(by_item("busy5")["retries"], 1);
    assert_eq!(by_item("busy5")["rate_limited"], 1);
    // At least the wait the provider asked for (the sleep itself may run a little over).
    let waited = by_item("busy5")["retry_wait_ms"].as_u64().unwrap();
    assert!(waited >= 30, "{waited}");
    assert_eq!(by_item("ok0")["retries"], 0);

    // report.json has the step graph.
    assert_eq!(
        report["pipeline"]["steps"],
        json!([
            {"id": "list", "kind": "decompose", "needs": [], "status": "succeeded"},
            {"id": "each", "kind": "fan_out", "needs": ["list"], "status": "succeeded"},
            {"id": "sum", "kind": "synthesize", "needs": ["each"], "status": "succeeded"},
        ])
    );
    assert_eq!(report["pipeline"]["name"], "checks");

    // The page embeds both files whole; the prompt's `</script>` does not end its script.
    let page = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"));
    let data = embedded(&page);
    assert_eq!(data["report"], report);
    assert_eq!(data["tasks"], Value::Array(lines.clone()));
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_run_still_writes_report_html() {
    let server = MockServer::start(mock()).await;
    let out = project(&server)
        .write_raw("p.yaml", &pipeline("fail_fast"))
        .args([
            "run",
            "p.yaml",
            "--out",
            "out",
            "--quiet",
            "--concurrency",
            "1",
        ])
        .code(2)
        .run();
    let page = std::fs::read_to_string(out.dir.join("out/report.html")).unwrap();
    let data = embedded(&page);
    let steps = &data["report"]["pipeline"]["steps"];
    assert_eq!(steps[1]["status"], "failed", "{steps}");
    assert_eq!(steps[2]["status"], "skipped", "{steps}");
    let failed: Vec<&Value> = data["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["status"] == "failed")
        .collect();
    assert_eq!(failed.len(), 1, "fail_fast stops at the first: {failed:?}");
    assert!(
        failed[0]["error"]
            .as_str()
            .unwrap()
            .contains("this item is bad"),
        "{}",
        failed[0]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_page_that_cannot_be_written_is_a_warning_and_the_run_s_other_files_are_there() {
    let server = MockServer::start(mock()).await;
    let t = project(&server).write_raw("p.yaml", &pipeline("continue"));
    // A folder where the page goes: its temporary file cannot be renamed over it.
    std::fs::create_dir_all(t.path().join("out/report.html/inside")).unwrap();
    let out = t.args(["run", "p.yaml", "--out", "out", "--quiet"]).run();
    let lines: Vec<&str> = out.stderr.lines().collect();
    let warning = lines
        .iter()
        .position(|l| l.starts_with("summon: warning: cannot write report.html: "))
        .unwrap_or_else(|| panic!("{}", out.stderr));
    let summary = lines
        .iter()
        .position(|l| l.starts_with("summon: ") && l.contains(" tasks: "))
        .unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(warning < summary, "{}", out.stderr);
    assert!(
        !out.stderr.contains("summon: report: "),
        "no page to point at: {}",
        out.stderr
    );
    let dir = out.dir.join("out");
    assert!(dir.join("report.html").is_dir());
    assert_eq!(results(&dir).len(), ITEMS.len() + 1);
    assert!(read_json(&dir.join("report.json"))["total"]["tasks"].is_u64());
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(
        leftovers.is_empty(),
        "the page's temporary file is removed: {leftovers:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn merge_writes_report_html() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server).write_raw("p.yaml", &pipeline("continue"));
    for i in 1..=2 {
        let shard = format!("{i}/2");
        let dir = format!("s{i}");
        let ran = t
            .command()
            .args(["run", "p.yaml", "--shard", &shard, "--out", &dir, "--quiet"])
            .output()
            .unwrap();
        assert!(ran.status.success(), "{ran:?}");
        assert!(t.path().join(&dir).join("report.html").is_file());
    }
    let merged = t
        .command()
        .args(["merge", "p.yaml", "s1", "s2", "--out", "merged", "--quiet"])
        .output()
        .unwrap();
    assert!(merged.status.success(), "{merged:?}");
    let page = std::fs::read_to_string(t.path().join("merged/report.html")).unwrap();
    let data = embedded(&page);
    let tasks = data["tasks"].as_array().unwrap();
    assert_eq!(
        tasks.len(),
        ITEMS.len() + 1,
        "every shard's tasks and the merge's"
    );
    // A shard's task keeps what its shard recorded.
    for task in tasks {
        assert!(task["started_ms"].is_u64(), "{task}");
        assert!(task["prompt"].is_string(), "{task}");
    }
    assert_eq!(data["report"]["total"]["tasks"], ITEMS.len() as u64 + 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn summon_report_rebuilds_the_page_and_names_what_is_missing() {
    let (_server, out) = checked_run().await;
    let t = Test::new();
    let dir = t.path().join("copy");
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["results.jsonl", "report.json"] {
        std::fs::copy(out.dir.join("out").join(file), dir.join(file)).unwrap();
    }
    let run = |args: &[&str]| t.command().args(args).output().unwrap();
    let built = run(&["report", "copy"]);
    assert!(built.status.success(), "{built:?}");
    assert_eq!(String::from_utf8_lossy(&built.stdout), "copy/report.html\n");
    assert_eq!(
        std::fs::read_to_string(dir.join("report.html")).unwrap(),
        std::fs::read_to_string(out.dir.join("out/report.html")).unwrap(),
        "the same page as the run wrote"
    );

    let refused = |args: &[&str], says: &[&str]| {
        let ran = run(args);
        let stderr = String::from_utf8_lossy(&ran.stderr).into_owned();
        assert_eq!(ran.status.code(), Some(1), "{stderr}");
        for text in says {
            assert!(stderr.contains(text), "lacks {text:?}: {stderr}");
        }
    };
    refused(&["report", "nowhere"], &["`nowhere` is not a directory"]);
    // A bad line is named; the old page stays as it was.
    let before = std::fs::read_to_string(dir.join("report.html")).unwrap();
    let mut lines = std::fs::read_to_string(dir.join("results.jsonl")).unwrap();
    lines.insert_str(0, "{\"step\": oops}\n");
    std::fs::write(dir.join("results.jsonl"), lines).unwrap();
    refused(
        &["report", "copy"],
        &["`copy`", "copy/results.jsonl: line 1: not a JSON line"],
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("report.html")).unwrap(),
        before
    );
    std::fs::remove_file(dir.join("results.jsonl")).unwrap();
    refused(&["report", "copy"], &["copy/results.jsonl: missing"]);
    std::fs::remove_file(dir.join("report.json")).unwrap();
    refused(&["report", "copy"], &["copy/report.json: missing"]);
}

// ---------------------------------------------------------------------------------------------
// The browser.

/// The Chromium to drive: `SUMMON_CHROMIUM`, else the first of the usual names on PATH.
fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SUMMON_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome", "chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// Runs headless Chromium with `args` (a profile of its own under `profile`) and returns its
/// stdout. Chromium runs in a process group of its own, killed whole (and only it) when it
/// takes longer than a minute.
fn headless(profile: &Path, args: &[String]) -> String {
    use std::os::unix::process::CommandExt;
    let browser = chromium().expect("chromium not found: apt-get install chromium");
    let mut command = Command::new(&browser);
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let child = command.spawn().expect("start chromium");
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match finished.recv_timeout(Duration::from_secs(60)) {
        Ok(output) => {
            let output = output.expect("chromium ran");
            assert!(
                output.status.success(),
                "chromium failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8(output.stdout).expect("UTF-8 DOM")
        }
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &format!("-{pid}")])
                .status();
            panic!("chromium did not finish within 60 s");
        }
    }
}

/// The DOM of `page` (a `file://` URL with a fragment) after its script ran.
fn dom(profile: &Path, url: &str) -> String {
    headless(
        profile,
        &[
            "--virtual-time-budget=10000".to_owned(),
            "--dump-dom".to_owned(),
            url.to_owned(),
        ],
    )
}

/// The `data-status` of each task row of a dumped DOM, in order.
fn row_statuses(dom: &str) -> Vec<String> {
    dom.split("<tr class=\"task\" data-status=\"")
        .skip(1)
        .map(|rest| rest[..rest.find('"').unwrap()].to_owned())
        .collect()
}

/// The text of the element with `id` in a dumped DOM.
fn text_of(dom: &str, id: &str) -> String {
    let open = format!("id=\"{id}\"");
    let at = dom.find(&open).unwrap_or_else(|| panic!("no #{id}"));
    let start = at + dom[at..].find('>').unwrap() + 1;
    let end = start + dom[start..].find('<').unwrap();
    dom[start..end].to_owned()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Chromium (CONTRIBUTING.md); runs with `cargo test --test suite -- --ignored`"]
async fn report_html_in_headless_chromium_counts_filters_and_shows_errors() {
    let (_server, out) = checked_run().await;
    let page = out.dir.join("out/report.html");
    let url = format!("file://{}", page.display());
    let profile = tempfile::tempdir().unwrap();
    let total = ITEMS.len() + 1;

    // Everything: the count, failed tasks first, the error text of a failed task.
    let all = dom(profile.path(), &url);
    assert_eq!(text_of(&all, "task-count"), total.to_string());
    assert_eq!(text_of(&all, "failed-count"), FAILED.to_string());
    // The run succeeded with failed tasks: the badge says so, not a bare "succeeded".
    assert_eq!(
        text_of(&all, "status"),
        format!("completed, {FAILED} failed")
    );
    let statuses = row_statuses(&all);
    assert_eq!(statuses.len(), total, "every row fits on the first page");
    assert!(
        statuses[..FAILED].iter().all(|s| s == "failed")
            && statuses[FAILED..].iter().all(|s| s == "completed"),
        "failed first: {statuses:?}"
    );
    assert!(all.contains("this item is bad"), "a failed task's error");
    assert!(all.contains("data-render-ms="), "the script ran to the end");
    // The failures come first, grouped by cause, with their first items and error.
    let failures = all
        .find("id=\"failure-groups\"")
        .expect("the failures section");
    assert!(
        failures < all.find("id=\"graph\"").unwrap(),
        "the failures are above the pipeline"
    );
    let group = &all[failures..];
    assert!(
        group.contains(&format!("<b>provider: bad_request: {FAILED} tasks</b>")),
        "{}",
        &group[..group.len().min(800)]
    );
    assert!(
        group.contains("each: bad1"),
        "{}",
        &group[..group.len().min(800)]
    );

    // The output limit each step's requests carried, and why.
    let limits = all.find("id=\"limit-list\"").expect("the limits section");
    let limits = &all[limits..];
    assert!(
        limits.contains("<b>output limit of each: </b>") && limits.contains("tokens ("),
        "{}",
        &limits[..limits.len().min(800)]
    );
    assert!(!all.contains("<section id=\"limits\" hidden"), "shown");

    // The status filter, from the URL.
    let failed = dom(profile.path(), &format!("{url}#status=failed"));
    assert_eq!(row_statuses(&failed), vec!["failed"; FAILED]);
    assert_eq!(
        text_of(&failed, "shown"),
        format!("{FAILED} of {total} tasks")
    );
    assert!(failed.contains(&format!("data-matching=\"{FAILED}\"")));

    // The step filter and the search.
    let sum = dom(profile.path(), &format!("{url}#step=sum"));
    assert_eq!(row_statuses(&sum), ["completed"]);
    assert!(sum.contains("data-step=\"sum\""));
    let searched = dom(profile.path(), &format!("{url}#q=TOOL3"));
    assert_eq!(row_statuses(&searched), ["completed"]);
    assert!(searched.contains(">tool3<"), "the row of tool3");
    let retried = dom(profile.path(), &format!("{url}#status=retried"));
    assert_eq!(row_statuses(&retried), ["completed"], "busy5 was retried");

    // A screenshot for a person to look at.
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("report-html");
    std::fs::create_dir_all(&shots).unwrap();
    let png = shots.join("report.png");
    let _ = std::fs::remove_file(&png);
    headless(
        profile.path(),
        &[
            "--virtual-time-budget=10000".to_owned(),
            format!("--screenshot={}", png.display()),
            "--window-size=1280,900".to_owned(),
            url,
        ],
    );
    let bytes = std::fs::read(&png).expect("the screenshot");
    assert!(bytes.starts_with(b"\x89PNG"), "a PNG");
    assert!(bytes.len() > 10_000, "not blank: {} bytes", bytes.len());
}

// A run of more than 100,000 tasks: the page holds its failed tasks, then the first completed
// ones, to 100,000, and says so; the counts are the run's.
#[test]
#[ignore = "needs Chromium (apt-get install chromium); run with --include-ignored"]
fn a_page_of_a_bigger_run_holds_the_failed_tasks_first_and_says_so() {
    let t = Test::new();
    let dir = t.path().join("big");
    std::fs::create_dir_all(&dir).unwrap();
    let total = 100_005u64;
    let failed = |i: u64| i % 20_000 == 19_999;
    let mut lines = String::new();
    for i in 0..total {
        let status = if failed(i) { "failed" } else { "completed" };
        lines.push_str(&format!(
            "{{\"step\":\"work\",\"index\":{i},\"item\":\"row {i}\",\"status\":\"{status}\",\"output\":\"ok\",\"error\":{}}}\n",
            if failed(i) { "\"row is bad\"" } else { "null" }
        ));
    }
    std::fs::write(dir.join("results.jsonl"), lines).unwrap();
    let report =
        serde_json::json!({"total": {"tasks": total, "completed": total - 5, "failed": 5}});
    std::fs::write(dir.join("report.json"), report.to_string()).unwrap();
    let built = t.command().args(["report", "big"]).output().unwrap();
    assert!(built.status.success(), "{built:?}");

    let page = std::fs::read_to_string(dir.join("report.html")).unwrap();
    let data = embedded(&page);
    assert_eq!(data["tasks_total"], total);
    assert_eq!(data["tasks_held"], 100_000);
    let url = format!("file://{}", dir.join("report.html").display());
    let profile = tempfile::tempdir().unwrap();
    let failed_rows = dom(profile.path(), &format!("{url}#status=failed"));
    assert_eq!(row_statuses(&failed_rows), vec!["failed"; 5]);
    assert_eq!(text_of(&failed_rows, "task-count"), total.to_string());
    assert_eq!(text_of(&failed_rows, "failed-count"), "5");
    assert!(
        text_of(&failed_rows, "held")
            .starts_with(&format!("This page holds 100000 of the {total} tasks")),
        "{}",
        text_of(&failed_rows, "held")
    );
}
