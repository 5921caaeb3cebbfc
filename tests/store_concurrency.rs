//! Many `summon` processes on one `.summon/` store at once: three pipeline runs (each with
//! its own `--out`), eight `delegate --async` starts, and readers (`load`, `tasks`) in loops.
//! No `database is locked` may reach the user, no update may be lost (every task and every
//! run ends with its result), and no two tasks may share an id.
//!
//! With `SUMMON_FIGURES=FILE`, the test appends one JSON line of figures to FILE.

#![cfg(target_os = "linux")]

use crate::support;

use std::collections::BTreeSet;
use std::process::{Output, Stdio};
use std::thread;
use std::time::Duration;

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer};
use support::Test;

const KEY: &str = "sk-test-store-0123456789abcdef";
const RUNS: usize = 3;
const STARTS: usize = 8;
const READS: usize = 10;
const ITEMS: usize = 30;

fn pipeline() -> String {
    let items: Vec<String> = (0..ITEMS).map(|i| format!("i{i:02}")).collect();
    format!(
        "version: 1\nname: busy\nsettings:\n  concurrency: 4\nsteps:\n  - id: list\n    decompose:\n      items: [{}]\n  - id: each\n    fan_out:\n      over: list\n      instructions: \"Do {{{{ item }}}}\"\n",
        items.join(", ")
    )
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_starts_and_readers_share_one_store() {
    let server = MockServer::start(MockConfig::new().latency(Duration::from_millis(5))).await;
    let t = std::sync::Arc::new(
        Test::new()
            .env("OPENAI_BASE_URL", &server.url_openai())
            .env("OPENAI_API_KEY", KEY)
            .env("SUMMON_MODEL", "mock-model")
            .env("SUMMON_MAX_BACKGROUND_TASKS", "20")
            // Three pipelines: two live runs of one pipeline are refused.
            .write_raw("p0.yaml", &pipeline())
            .write_raw("p1.yaml", &pipeline())
            .write_raw("p2.yaml", &pipeline()),
    );
    let run = |args: Vec<String>| {
        let t = std::sync::Arc::clone(&t);
        thread::spawn(move || {
            let output = t
                .command()
                .args(&args)
                .stdin(Stdio::null())
                .output()
                .expect("run summon");
            (args, output)
        })
    };
    let mut handles = Vec::new();
    for r in 0..RUNS {
        handles.push(run(vec![
            "run".into(),
            format!("p{r}.yaml"),
            "--out".into(),
            format!("out{r}"),
            "--quiet".into(),
        ]));
    }
    for s in 0..STARTS {
        handles.push(run(vec![
            "delegate".into(),
            "--async".into(),
            "--json".into(),
            "--instructions".into(),
            format!("task number {s}"),
        ]));
    }
    for _ in 0..READS {
        handles.push(run(vec!["tasks".into(), "--json".into()]));
        handles.push(run(vec!["load".into(), "--json".into()]));
    }
    let mut ids = Vec::new();
    let mut commands = 0;
    for handle in handles {
        let (args, output) = handle.join().expect("thread");
        commands += 1;
        let all = text(&output);
        assert!(!all.contains("locked"), "{args:?}: {all}");
        assert_eq!(output.status.code(), Some(0), "{args:?}: {all}");
        if args[0] == "delegate" {
            let answer: Value = serde_json::from_slice(&output.stdout).expect("JSON");
            ids.push((
                answer["task_id"].as_str().expect("task id").to_owned(),
                args[4].clone(),
            ));
        }
    }
    let distinct: BTreeSet<&String> = ids.iter().map(|(id, _)| id).collect();
    assert_eq!(distinct.len(), STARTS, "duplicate task ids: {ids:?}");

    // Every task finishes with its own answer, and every run with all its results.
    for (id, instructions) in &ids {
        let output = t
            .command()
            .args(["load", id, "--json", "--timeout", "30"])
            .output()
            .expect("load");
        assert_eq!(output.status.code(), Some(0), "{}", text(&output));
        let result: Value = serde_json::from_slice(&output.stdout).expect("JSON");
        assert_eq!(result["status"], "completed", "{result}");
        assert_eq!(result["output"], format!("echo: {instructions}"));
    }
    for r in 0..RUNS {
        let lines = std::fs::read_to_string(t.path().join(format!("out{r}/results.jsonl")))
            .expect("results.jsonl");
        let indexes: BTreeSet<u64> = lines
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).expect("line")["index"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(indexes.len(), ITEMS, "run {r}");
        assert_eq!(lines.lines().count(), ITEMS, "run {r}");
    }
    let conn = rusqlite::Connection::open(t.path().join(".summon/state.db")).expect("open");
    let (runs, rows): (i64, i64) = conn
        .query_row(
            "SELECT (SELECT COUNT(*) FROM runs WHERE status = 'completed'), \
             (SELECT COUNT(*) FROM run_tasks WHERE status = 'completed')",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("counts");
    assert_eq!((runs as usize, rows as usize), (RUNS, RUNS * ITEMS));
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity");
    assert_eq!(integrity, "ok");

    if let Ok(path) = std::env::var("SUMMON_FIGURES") {
        use std::io::Write;
        let line = json!({"suite": "store", "processes": commands, "locked_errors": 0,
                          "lost_updates": 0, "duplicate_ids": 0});
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("figures");
        file.write_all(format!("{line}\n").as_bytes())
            .expect("write");
    }
}
