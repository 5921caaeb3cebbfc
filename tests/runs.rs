//! Scheduled runs: the run history (`summon runs`), retention that keeps the store bounded,
//! `--reuse` that pays only for new requests, and overlapping runs of one pipeline.

use crate::support;
use crate::support::wait_for;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

const PIPELINE: &str = r#"version: 1
name: tickets
steps:
  - id: rows
    decompose:
      file: tickets.csv
  - id: label
    fan_out:
      over: rows
      instructions: "Label ticket {{ item.id }}: {{ item.title }}"
"#;

fn csv(rows: std::ops::Range<u32>) -> String {
    let mut text = "id,title\n".to_owned();
    for i in rows {
        text.push_str(&format!("{i},ticket number {i}\n"));
    }
    text
}

fn project(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test")
        .env("SUMMON_MODEL", "mock-model")
        .write_raw("p.yaml", PIPELINE)
        .write_raw("tickets.csv", &csv(0..3))
        .write(
            "summon.yaml",
            "prices:\n  mock-model: {input: 1000000, output: 1000000}\n",
        )
}

struct Ran {
    stdout: String,
    stderr: String,
    code: i32,
}

impl Ran {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", self.stdout, self.stderr))
    }
}

fn summon(t: &Test, args: &[&str]) -> Ran {
    let output = t.command().args(args).output().expect("run summon");
    Ran {
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        code: output.status.code().unwrap_or(-1),
    }
}

/// Replaces a file of the project between runs.
fn rewrite(t: &Test, path: &str, content: &str) {
    std::fs::write(t.path().join(path), content).expect("write");
}

#[track_caller]
fn ok(ran: Ran) -> Ran {
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    ran
}

fn results(t: &Test, out: &str) -> Vec<Value> {
    std::fs::read_to_string(t.path().join(out).join("results.jsonl"))
        .expect("results.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_lists_the_history_and_shows_a_report() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server);
    ok(summon(&t, &["run", "p.yaml", "--out", "first"]));
    let failing = summon(&t, &["run", "p.yaml", "--out", "second", "--param", "x=1"]);
    assert_eq!(failing.code, 1, "{}", failing.stderr);
    ok(summon(&t, &["run", "p.yaml"]));
    let listed = ok(summon(&t, &["runs", "--json"])).json();
    let runs = listed["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{listed:#}");
    // Newest first.
    assert_eq!(runs[0]["out"], Value::Null);
    assert_eq!(runs[1]["out"], "first");
    assert_eq!(runs[1]["status"], "completed");
    assert_eq!(runs[1]["completed"], 3);
    assert_eq!(runs[1]["failed"], 0);
    assert!(runs[1]["input_tokens"].as_u64().unwrap() > 0);
    assert!(runs[1]["cost_usd"].as_f64().unwrap() > 0.0);
    assert_eq!(runs[1]["pipeline"], "p.yaml");
    let id = runs[1]["run_id"].as_str().unwrap();
    let shown = ok(summon(&t, &["runs", "show", id, "--json"])).json();
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(t.path().join("first/report.json")).unwrap())
            .unwrap();
    assert_eq!(shown["report"]["total"], report["total"]);
    assert_eq!(shown["report"]["steps"], report["steps"]);
    let text = ok(summon(&t, &["runs"])).stdout;
    assert!(text.starts_with("RUN "), "{text}");
    assert!(text.contains(id), "{text}");
    // Filters.
    let completed = ok(summon(&t, &["runs", "--status", "failed", "--json"])).json();
    assert_eq!(completed["runs"].as_array().unwrap().len(), 0);
    let other = ok(summon(&t, &["runs", "--pipeline", "other.yaml", "--json"])).json();
    assert_eq!(other["runs"].as_array().unwrap().len(), 0);
    // A filter that matches nothing says so, and how many runs there are.
    let none = ok(summon(&t, &["runs", "--status", "failed"])).stdout;
    assert_eq!(
        none,
        "No run matches --status failed; `summon runs` lists all 2 runs.\n"
    );
    // A person gets a table, not the report's JSON.
    let human = ok(summon(&t, &["runs", "show", id])).stdout;
    assert!(!human.contains('{'), "{human}");
    assert!(human.contains("Report: first/report.html"), "{human}");
    let row = |name: &str| {
        human
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row `{name}`:\n{human}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(row("label")[1..5], ["succeeded", "3", "3", "0"], "{human}");
    assert_eq!(row("total")[1..4], ["3", "3", "0"], "{human}");
    let missing = summon(&t, &["runs", "show", "20200101-000000"]);
    assert_eq!(missing.code, 1);
    assert!(
        missing.stderr.contains("no run `20200101-000000`"),
        "{}",
        missing.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_keeps_the_store_bounded() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text(
        "a label with enough words to take some room in the journal ".repeat(20),
    )))
    .await;
    let t = project(&server)
        .write_raw("tickets.csv", &csv(0..200))
        .write("summon.yaml", "store: {keep_runs: 2, keep_days: 0}\n");
    let db = t.path().join(".summon/state.db");
    let size = || {
        ["", "-wal"]
            .iter()
            .map(|suffix| {
                std::fs::metadata(format!("{}{suffix}", db.display())).map_or(0, |m| m.len())
            })
            .sum::<u64>()
    };
    let mut ids = Vec::new();
    let mut sizes = Vec::new();
    for _ in 0..8 {
        ok(summon(&t, &["run", "p.yaml"]));
        let listed = ok(summon(&t, &["runs", "--json"])).json();
        ids.push(listed["runs"][0]["run_id"].as_str().unwrap().to_owned());
        sizes.push(size());
    }
    let listed = ok(summon(&t, &["runs", "--json"])).json();
    let kept: Vec<&str> = listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(kept, [ids[7].as_str(), ids[6].as_str()]);
    // Flat after the limit: the eighth run's store is no bigger than the fourth's (+5%).
    assert!(
        sizes[7] <= sizes[3] + sizes[3] / 20,
        "the store grew: {sizes:?}"
    );
    let resumed = summon(&t, &["run", "p.yaml", "--resume", &ids[0]]);
    assert_eq!(resumed.code, 1);
    assert!(resumed.stderr.contains("pruned"), "{}", resumed.stderr);
    // By hand.
    let pruned = ok(summon(
        &t,
        &[
            "runs",
            "prune",
            "--keep",
            "1",
            "--older-than",
            "0d",
            "--json",
        ],
    ))
    .json();
    assert_eq!(pruned["runs"], 1);
    assert_eq!(pruned["tasks"], 200);
    assert_eq!(
        ok(summon(&t, &["runs", "--json"])).json()["runs"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn reuse_sends_only_the_new_rows() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server);
    ok(summon(&t, &["run", "p.yaml", "--out", "a"]));
    assert_eq!(support::chat_count(&server), 3);
    rewrite(&t, "tickets.csv", &csv(0..5));
    let ran = ok(summon(
        &t,
        &[
            "run",
            "p.yaml",
            "--out",
            "b",
            "--reuse",
            "--junit",
            "b/junit.xml",
        ],
    ));
    assert_eq!(
        support::chat_count(&server),
        5,
        "only the two new rows are sent"
    );
    let lines = results(&t, "b");
    assert_eq!(lines.len(), 5);
    let reused: Vec<bool> = lines
        .iter()
        .map(|l| l["reused"].as_bool().unwrap())
        .collect();
    assert_eq!(reused.iter().filter(|r| **r).count(), 3, "{lines:#?}");
    for line in &lines {
        assert_eq!(line["status"], "completed");
        let id = line["item"]["id"].as_str().unwrap();
        assert_eq!(
            line["output"],
            format!("echo: Label ticket {id}: ticket number {id}")
        );
        if line["reused"] == true {
            assert_eq!(line["input_tokens"], 0);
        }
    }
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(t.path().join("b/report.json")).unwrap())
            .unwrap();
    assert_eq!(report["steps"]["label"]["reused"], 3, "{report:#}");
    assert_eq!(report["steps"]["label"]["completed"], 5);
    assert!(ran.stderr.contains("3 reused"), "{}", ran.stderr);
    let junit = std::fs::read_to_string(t.path().join("b/junit.xml")).unwrap();
    assert_eq!(junit.matches("(reused)").count(), 3, "{junit}");

    // A step may ask for it; another default model does not reuse.
    rewrite(
        &t,
        "p.yaml",
        &PIPELINE.replace("    fan_out:", "    reuse: true\n    fan_out:"),
    );
    ok(summon(&t, &["run", "p.yaml"]));
    assert_eq!(support::chat_count(&server), 5);
    let mut other = t.command();
    other
        .args(["run", "p.yaml"])
        .env("SUMMON_MODEL", "other-model");
    assert!(other.status().unwrap().success());
    assert_eq!(support::chat_count(&server), 10);
}

fn spawn_run(t: &Test, extra: &[&str]) -> Child {
    let mut command: Command = t.command();
    command
        .args(["run", "p.yaml"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command.spawn().expect("spawn summon run")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_overlapping_run_is_refused_waited_for_or_takes_over_a_dead_one() {
    let server = MockServer::start(
        MockConfig::new().default_reply(Reply::text("slow").delayed(Duration::from_secs(60))),
    )
    .await;
    let t = project(&server).write_raw("tickets.csv", &csv(0..1));
    let mut first = spawn_run(&t, &[]);
    wait_for(Duration::from_secs(30), "the first run's request", || {
        support::chat_count(&server) >= 1
    });
    let refused = summon(&t, &["run", "p.yaml"]);
    assert_eq!(refused.code, 75, "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains(&format!("is still running (pid {})", first.id())),
        "{}",
        refused.stderr
    );
    assert_eq!(
        support::chat_count(&server),
        1,
        "the refused run sent nothing"
    );
    let listed = ok(summon(&t, &["runs", "--json"])).json();
    assert_eq!(listed["runs"].as_array().unwrap().len(), 1, "{listed:#}");

    // A killed run leaves its lock; the next run takes it over.
    Command::new("kill")
        .args(["-KILL", &first.id().to_string()])
        .status()
        .unwrap();
    first.wait().unwrap();
    server.push_reply(Reply::text("quick"));
    let took_over = ok(summon(&t, &["run", "p.yaml"]));
    assert_eq!(took_over.stdout, "quick\n");
    let listed = ok(summon(&t, &["runs", "--json"])).json();
    let statuses: Vec<&str> = listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["completed", "interrupted"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn wait_starts_when_the_live_run_ends() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::text("first").delayed(Duration::from_millis(1500)),
        Reply::text("second"),
    ]))
    .await;
    let t = project(&server).write_raw("tickets.csv", &csv(0..1));
    let first = spawn_run(&t, &[]);
    wait_for(Duration::from_secs(30), "the first run's request", || {
        support::chat_count(&server) >= 1
    });
    let second = ok(summon(&t, &["run", "p.yaml", "--wait"]));
    assert!(
        second.stderr.contains("waiting for run"),
        "{}",
        second.stderr
    );
    assert_eq!(second.stdout, "second\n");
    let first = first.wait_with_output().unwrap();
    assert!(first.status.success());
    assert_eq!(String::from_utf8_lossy(&first.stdout), "first\n");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    // The second run sent its request only after the first had its answer.
    let gap = requests[1]
        .received_at
        .duration_since(requests[0].received_at);
    assert!(gap >= Duration::from_millis(1400), "{gap:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn resume_continues_with_what_the_run_was_started_with() {
    // The second row fails once, then answers.
    let failed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = std::sync::Arc::clone(&failed);
    let server = MockServer::start(MockConfig::new().rule(move |req| {
        let text = req.last_user_text().unwrap_or_default();
        if text.contains("ticket 1:") && !flag.swap(true, std::sync::atomic::Ordering::SeqCst) {
            Reply::status(
                400,
                r#"{"error":{"message":"bad row","type":"invalid_request_error"}}"#,
            )
        } else {
            Reply::Echo
        }
    }))
    .await;
    let t = project(&server).write_raw(
        "p.yaml",
        &PIPELINE
            .replace(
                "steps:",
                "parameters:\n  - {key: tone, input_type: string, requirement: required}\nsteps:",
            )
            .replace("Label ticket", "{{ tone }}: label ticket"),
    );
    let first = summon(
        &t,
        &[
            "run",
            "p.yaml",
            "--param",
            "tone=terse",
            "--out",
            "out",
            "--concurrency",
            "2",
        ],
    );
    assert_eq!(first.code, 2, "{}", first.stderr);
    assert!(first.stderr.contains("--resume"), "{}", first.stderr);
    assert!(failed.load(std::sync::atomic::Ordering::SeqCst));
    // A value given that differs is refused, naming what the run used.
    let other = summon(&t, &["run", "p.yaml", "--resume", "--out", "elsewhere"]);
    assert_eq!(other.code, 1, "{}", other.stderr);
    assert!(
        other
            .stderr
            .contains("was started with --out out, not elsewhere"),
        "{}",
        other.stderr
    );
    // As the hint says: no parameters, no --out.
    let resumed = ok(summon(&t, &["run", "p.yaml", "--resume"]));
    let sent = |needle: &str| {
        server
            .requests()
            .iter()
            .filter(|r| r.last_user_text().unwrap_or_default().contains(needle))
            .count()
    };
    assert_eq!(sent("ticket 0:"), 1, "a finished row ran again");
    assert_eq!(sent("ticket 1:"), 2);
    assert!(
        resumed.stdout.contains("terse: label ticket 1"),
        "{}",
        resumed.stdout
    );
    let lines = results(&t, "out");
    assert_eq!(lines.len(), 3);
    assert!(
        lines.iter().all(|l| l["status"] == "completed"),
        "{lines:#?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_run_into_the_same_out_directory_is_refused() {
    let server = MockServer::start(
        MockConfig::new().default_reply(Reply::text("slow").delayed(Duration::from_secs(60))),
    )
    .await;
    let t = project(&server)
        .write_raw("tickets.csv", &csv(0..1))
        .write_raw("q.yaml", &PIPELINE.replace("name: tickets", "name: other"));
    let mut first = spawn_run(&t, &["--out", "shared"]);
    wait_for(Duration::from_secs(30), "the first run's request", || {
        support::chat_count(&server) >= 1
    });
    let refused = summon(&t, &["run", "q.yaml", "--out", "./shared/"]);
    assert_eq!(refused.code, 75, "{}", refused.stderr);
    assert!(
        refused.stderr.contains(&format!(
            "(pid {}) is writing the same --out directory",
            first.id()
        )),
        "{}",
        refused.stderr
    );
    assert_eq!(
        support::chat_count(&server),
        1,
        "the refused run sent nothing"
    );
    Command::new("kill")
        .args(["-KILL", &first.id().to_string()])
        .status()
        .unwrap();
    first.wait().unwrap();
    server.push_reply(Reply::text("quick"));
    let took_over = ok(summon(&t, &["run", "q.yaml", "--out", "shared"]));
    assert_eq!(took_over.stdout, "quick\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn reuse_takes_no_answer_written_into_the_store_by_something_else() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server);
    ok(summon(&t, &["run", "p.yaml", "--out", "a"]));
    assert_eq!(support::chat_count(&server), 3);
    // Anything that can write the workspace can write the store: forge every answer.
    let db = rusqlite::Connection::open(t.path().join(".summon/state.db")).unwrap();
    // Short answers are kept in their rows, longer ones once per content in `outputs`.
    let forged = db
        .execute("UPDATE outputs SET text = 'forged answer'", [])
        .unwrap()
        + db.execute(
            "UPDATE run_tasks SET output = 'forged answer' WHERE output IS NOT NULL",
            [],
        )
        .unwrap();
    assert_eq!(forged, 3);
    drop(db);
    let ran = ok(summon(&t, &["run", "p.yaml", "--out", "b", "--reuse"]));
    assert_eq!(
        support::chat_count(&server),
        6,
        "every forged answer is asked again"
    );
    for line in results(&t, "b") {
        assert_eq!(line["reused"], false, "{line}");
        assert_ne!(line["output"], "forged answer", "{line}");
    }
    assert_eq!(
        ran.stderr
            .matches("3 answers of earlier runs have no valid signature")
            .count(),
        1,
        "{}",
        ran.stderr
    );
    // What summon itself wrote is reused.
    ok(summon(&t, &["run", "p.yaml", "--out", "c", "--reuse"]));
    assert_eq!(support::chat_count(&server), 6);
}

#[tokio::test(flavor = "multi_thread")]
async fn resume_takes_no_task_written_into_the_store_by_something_else() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server).write_raw("tickets.csv", &csv(0..4));
    ok(summon(&t, &["run", "p.yaml", "--out", "a"]));
    assert_eq!(support::chat_count(&server), 4);
    // Forge two finished answers, as anything that can write the workspace could.
    let db = rusqlite::Connection::open(t.path().join(".summon/state.db")).unwrap();
    // Short answers are kept in their rows, longer ones once per content in `outputs`.
    let forged = db
        .execute(
            "UPDATE outputs SET text = 'forged answer' WHERE hash IN \
             (SELECT output_hash FROM run_tasks WHERE item_index < 2)",
            [],
        )
        .unwrap()
        + db.execute(
            "UPDATE run_tasks SET output = 'forged answer' \
             WHERE output IS NOT NULL AND item_index < 2",
            [],
        )
        .unwrap();
    assert_eq!(forged, 2);
    drop(db);
    let ran = ok(summon(&t, &["run", "p.yaml", "--resume", "--out", "a"]));
    assert_eq!(
        support::chat_count(&server),
        6,
        "the two forged tasks run again, the two signed ones do not"
    );
    assert!(!ran.stdout.contains("forged answer"), "{}", ran.stdout);
    assert_eq!(
        ran.stderr.matches("2 recorded tasks of run ").count(),
        1,
        "{}",
        ran.stderr
    );
    assert!(ran.stderr.contains("not taken as done"), "{}", ran.stderr);
}

/// A signing key others may read, in a folder others may read, or owned by another user is
/// not used, as ssh refuses such keys: the run says so with the path and the fix (`chmod 600`,
/// `chmod 700`, `chown`), signs nothing and `--reuse` takes nothing; once it is private again
/// the answers it signed are reused.
#[tokio::test(flavor = "multi_thread")]
async fn a_signing_key_open_to_others_or_owned_by_another_user_is_not_used() {
    use std::os::unix::fs::PermissionsExt as _;
    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server);
    ok(summon(&t, &["run", "p.yaml", "--out", "a"]));
    assert_eq!(support::chat_count(&server), 3);
    let key = t.path().join(".local/state/summon/key");
    let folder = key.parent().unwrap().to_owned();
    let mode = |path: &std::path::Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let mut sent = 3;
    let mut refused = |fix: String, out: &str| {
        let ran = ok(summon(&t, &["run", "p.yaml", "--out", out, "--reuse"]));
        assert!(
            ran.stderr.contains("cannot read or create the signing key")
                && ran.stderr.contains(&fix),
            "{fix}: {}",
            ran.stderr
        );
        sent += 3;
        assert_eq!(
            support::chat_count(&server),
            sent,
            "{fix}: an answer was reused"
        );
    };
    mode(&key, 0o644);
    refused(format!("run `chmod 600 {}`", key.display()), "b");
    mode(&key, 0o600);
    mode(&folder, 0o755);
    refused(format!("run `chmod 700 {}`", folder.display()), "c");
    mode(&folder, 0o700);
    if nix::unistd::geteuid().is_root() {
        nix::unistd::chown(&key, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        refused(
            format!(
                "is owned by uid 65534, not by uid 0 (run `chown 0 {}`",
                key.display()
            ),
            "d",
        );
        nix::unistd::chown(&key, Some(nix::unistd::Uid::from_raw(0)), None).unwrap();
    }
    // Private again: what was signed with it is reused.
    ok(summon(&t, &["run", "p.yaml", "--out", "e", "--reuse"]));
    assert_eq!(support::chat_count(&server), sent);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_with_tasks_that_have_no_price_never_shows_zero_dollars() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server)
        .write_raw(
            "all-unpriced.yaml",
            "version: 1\nname: unpriced\nsteps:\n  - id: one\n    delegate:\n      \
             instructions: Say hi\n    model: unpriced-model\n",
        )
        .write_raw(
            "mixed.yaml",
            "version: 1\nname: mixed\nsteps:\n  - id: one\n    delegate:\n      \
             instructions: Say hi\n  - id: two\n    delegate:\n      instructions: Say bye\n    \
             model: unpriced-model\n",
        );
    ok(summon(&t, &["run", "all-unpriced.yaml"]));
    ok(summon(&t, &["run", "mixed.yaml"]));
    let listed = ok(summon(&t, &["runs", "--json"])).json();
    let runs = listed["runs"].as_array().unwrap();
    let of = |pipeline: &str| {
        runs.iter()
            .find(|r| r["pipeline"] == pipeline)
            .unwrap_or_else(|| panic!("{listed:#}"))
    };
    assert_eq!(of("all-unpriced.yaml")["priced"], false, "{listed:#}");
    assert_eq!(of("mixed.yaml")["priced"], false, "{listed:#}");
    assert!(
        of("mixed.yaml")["cost_usd"].as_f64().unwrap() > 0.0,
        "{listed:#}"
    );
    let text = ok(summon(&t, &["runs"])).stdout;
    let line = |pipeline: &str| {
        text.lines()
            .find(|l| l.ends_with(pipeline))
            .unwrap_or_else(|| panic!("{text}"))
            .to_owned()
    };
    assert!(line("all-unpriced.yaml").contains("no price"), "{text}");
    assert!(!line("all-unpriced.yaml").contains('$'), "{text}");
    assert!(line("mixed.yaml").contains(" + ?"), "{text}");
}
