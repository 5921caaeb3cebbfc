//! `backend: batch` and `summon run --batch` against the mock server's batch endpoints: the
//! same results as a live run on both providers, failed and expired lines sent again a
//! bounded number of times, `--resume` polling a batch still in flight (after `kill -9`)
//! instead of creating another, and tasks that need tools running live with a warning.

use crate::support;
use crate::support::{chats, wait_for};

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use summon_mock_llm::{Api, BatchOutcome, MockConfig, MockServer, RecordedRequest, Reply};
use support::Test;

const KEY: &str = "sk-test-0123456789abcdefBATCH";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Provider {
    OpenAi,
    Anthropic,
}

/// A project wired to the mock as `provider`, polling batches every 5 ms.
fn project(server: &MockServer, provider: Provider) -> Test {
    let t = Test::new()
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_BATCH_POLL_MS", "5");
    match provider {
        Provider::OpenAi => t
            .env("OPENAI_BASE_URL", &server.url_openai())
            .env("OPENAI_API_KEY", KEY),
        Provider::Anthropic => t
            .env("SUMMON_PROVIDER", "anthropic")
            .env("ANTHROPIC_BASE_URL", &server.url_anthropic())
            .env("ANTHROPIC_API_KEY", KEY),
    }
}

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
}

fn summon(t: &Test, args: &[&str]) -> Ran {
    let output = t.command().args(args).output().expect("run summon");
    Ran {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `results.jsonl` of `DIR`, by step and index.
fn results(dir: &Path) -> BTreeMap<(String, u64), Value> {
    let Ok(text) = std::fs::read_to_string(dir.join("results.jsonl")) else {
        return BTreeMap::new();
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            let key = (
                v["step"].as_str().unwrap().to_owned(),
                v["index"].as_u64().unwrap(),
            );
            (key, v)
        })
        .collect()
}

/// What must match between two runs: item, status, output, error.
fn comparable(lines: &BTreeMap<(String, u64), Value>) -> Vec<Value> {
    lines
        .values()
        .map(|l| {
            json!([
                l["step"],
                l["index"],
                l["item"],
                l["status"],
                l["output"],
                l["error"]
            ])
        })
        .collect()
}

fn report(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).expect("report"))
        .expect("report JSON")
}

/// Batch create requests (both APIs).
fn creates(server: &MockServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| {
            r.api == Api::Batch
                && r.method == "POST"
                && matches!(r.path.as_str(), "/v1/batches" | "/v1/messages/batches")
        })
        .count()
}

/// The text of a batch line's last user message (either API).
fn line_text(line: &Value) -> String {
    let last = line["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .expect("a user message");
    match &last["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        other => panic!("content {other}"),
    }
}

/// Six items summarised one by one, then merged; `extra` goes under the fan_out step.
fn pipeline(extra: &str) -> String {
    format!(
        r#"version: 1
name: batch
steps:
  - id: list
    decompose:
      items: [alpha, beta, gamma, delta, epsilon, zeta]
  - id: each
    fan_out:
      over: list
      instructions: "Summarise {{{{ item }}}}"
{extra}  - id: sum
    synthesize:
      instructions: |
        Merge:
        {{% for r in steps.each.results %}}<{{{{ r.item }}}}|{{{{ r.output }}}}>
        {{% endfor %}}
"#
    )
}

const PRICES: &str = "prices:\n  mock-model: { input: 1000000, output: 1000000 }\n";

/// Runs the pipeline live and in a batch (`backend: batch`, or `--batch`) and compares.
async fn same_as_live(provider: Provider, flag: bool) {
    let live_server = MockServer::start(MockConfig::new()).await;
    let live = project(&live_server, provider)
        .write_raw("p.yaml", &pipeline(""))
        .write_raw("summon.yaml", PRICES);
    let live_run = summon(&live, &["run", "p.yaml", "--out", "out", "--quiet"]).expect(0);

    let batch_server = MockServer::start(MockConfig::new()).await;
    let (file, args): (String, &[&str]) = if flag {
        (
            pipeline(""),
            &["run", "p.yaml", "--out", "out", "--quiet", "--batch"],
        )
    } else {
        (
            pipeline("    backend: batch\n"),
            &["run", "p.yaml", "--out", "out", "--quiet"],
        )
    };
    let batch = project(&batch_server, provider)
        .write_raw("p.yaml", &file)
        .write_raw("summon.yaml", PRICES);
    let batch_run = summon(&batch, args).expect(0);

    assert_eq!(batch_run.stdout, live_run.stdout, "{provider:?}");
    assert!(batch_run.stdout.contains("<beta|echo: Summarise beta>"));
    let live_lines = results(&live.path().join("out"));
    let batch_lines = results(&batch.path().join("out"));
    assert_eq!(batch_lines.len(), 7);
    assert_eq!(
        comparable(&batch_lines),
        comparable(&live_lines),
        "{provider:?}"
    );

    // One batch with the six fan_out tasks, no tools; only the synthesis went live.
    assert_eq!(creates(&batch_server), 1, "{provider:?}");
    let batches = batch_server.batches();
    assert_eq!(batches.len(), 1);
    let api = match provider {
        Provider::OpenAi => Api::OpenAi,
        Provider::Anthropic => Api::Anthropic,
    };
    assert_eq!(batches[0].api, api);
    assert_eq!(
        batches[0].custom_ids,
        (0..6).map(|i| format!("task-{i}")).collect::<Vec<_>>()
    );
    let texts: Vec<String> = batches[0].lines.iter().map(line_text).collect();
    assert_eq!(texts[1], "Summarise beta");
    assert!(batches[0].lines.iter().all(|l| l.get("tools").is_none()));
    assert!(batches[0].lines.iter().all(|l| l["model"] == "mock-model"));
    let live_chats = chats(&batch_server);
    assert_eq!(live_chats.len(), 1, "only the synthesis is live");
    assert!(
        live_chats[0]
            .last_user_text()
            .unwrap()
            .starts_with("Merge:")
    );
    // Every batch call carried the key.
    for request in batch_server
        .requests()
        .iter()
        .filter(|r| r.api == Api::Batch)
    {
        let key = request
            .header("authorization")
            .or_else(|| request.header("x-api-key"))
            .unwrap_or_default();
        assert!(key.contains(KEY), "{} {}", request.method, request.path);
    }

    // Tokens are recorded; the batch half of the cost is half price.
    let live_report = report(&live.path().join("out"));
    let batch_report = report(&batch.path().join("out"));
    let tokens = |r: &Value, step: &str| {
        r["steps"][step]["input_tokens"].as_u64().unwrap()
            + r["steps"][step]["output_tokens"].as_u64().unwrap()
    };
    assert!(tokens(&batch_report, "each") > 0);
    let live_cost = live_report["steps"]["each"]["cost_usd"].as_f64().unwrap();
    let batch_cost = batch_report["steps"]["each"]["cost_usd"].as_f64().unwrap();
    let per_token = |cost: f64, r: &Value| cost / tokens(r, "each") as f64;
    assert!(
        (per_token(batch_cost, &batch_report) * 2.0 - per_token(live_cost, &live_report)).abs()
            < 1e-9,
        "batch {batch_cost} for {} tokens, live {live_cost} for {} tokens",
        tokens(&batch_report, "each"),
        tokens(&live_report, "each")
    );
    assert_eq!(batch_report["steps"]["each"]["completed"], 6);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_openai_batch_gives_the_results_of_a_live_run() {
    same_as_live(Provider::OpenAi, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_anthropic_batch_gives_the_results_of_a_live_run() {
    same_as_live(Provider::Anthropic, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_batch_flag_sends_every_fan_out_through_the_batch_api() {
    same_as_live(Provider::OpenAi, true).await;
}

/// Answers `Summarise ITEM` with a 500 the first `n` times for the items in `flaky`.
fn flaky_rule(flaky: &[&str], n: usize) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync {
    let seen: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let flaky: Vec<String> = flaky.iter().map(|s| (*s).to_owned()).collect();
    move |req| {
        let text = req.last_user_text().unwrap_or_default();
        let item = text.strip_prefix("Summarise ").unwrap_or("").to_owned();
        if flaky.contains(&item) {
            let mut seen = seen.lock().unwrap();
            let count = seen.entry(item).or_default();
            *count += 1;
            if *count <= n {
                return Reply::status(
                    500,
                    r#"{"error":{"message":"server hiccup","type":"server_error"}}"#,
                );
            }
        }
        Reply::Echo
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_lines_are_sent_again_and_then_succeed() {
    for provider in [Provider::OpenAi, Provider::Anthropic] {
        let server =
            MockServer::start(MockConfig::new().rule(flaky_rule(&["beta", "zeta"], 1))).await;
        let t = project(&server, provider).write_raw("p.yaml", &pipeline("    backend: batch\n"));
        let ran = summon(&t, &["run", "p.yaml", "--out", "out"]).expect(0);
        assert!(
            ran.stdout.contains("<beta|echo: Summarise beta>"),
            "{ran:?}"
        );
        let batches = server.batches();
        assert_eq!(batches.len(), 2, "{provider:?}");
        assert_eq!(batches[1].custom_ids, ["task-1", "task-5"], "{provider:?}");
        let lines = results(&t.path().join("out"));
        assert!(
            lines.values().all(|l| l["status"] == "completed"),
            "{lines:#?}"
        );
        assert_eq!(
            lines[&("each".to_owned(), 5)]["output"],
            "echo: Summarise zeta"
        );
        // Progress shows the batch's own counts.
        for expected in [
            "each: sent 6 tasks in batch",
            "in_progress: 0/6 done, 0 failed",
            "6/6 done, 2 failed",
            "each: sending 2 tasks again",
            "each: sent 2 tasks in batch",
        ] {
            assert!(
                ran.stderr.contains(expected),
                "{provider:?}: no `{expected}` in\n{}",
                ran.stderr
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_batch_with_failed_lines_sends_the_unfinished_ones_again() {
    for provider in [Provider::OpenAi, Provider::Anthropic] {
        // The first batch answers two lines (one of them a bad request) and expires.
        let server = MockServer::start(
            MockConfig::new()
                .batch_outcomes([BatchOutcome::Expire { processed: 2 }])
                .rule(|req| {
                    if req.last_user_text().as_deref() == Some("Summarise beta") {
                        Reply::status(
                            400,
                            r#"{"error":{"message":"beta is not allowed","type":"invalid_request_error"}}"#,
                        )
                    } else {
                        Reply::Echo
                    }
                }),
        )
        .await;
        let t = project(&server, provider).write_raw(
            "p.yaml",
            &pipeline("    backend: batch\n    on_error: continue\n"),
        );
        summon(&t, &["run", "p.yaml", "--out", "out", "--quiet"]).expect(0);
        let batches = server.batches();
        assert_eq!(batches.len(), 2, "{provider:?}");
        assert_eq!(
            batches[1].custom_ids,
            ["task-2", "task-3", "task-4", "task-5"],
            "only the expired lines are sent again ({provider:?})"
        );
        let lines = results(&t.path().join("out"));
        let beta = &lines[&("each".to_owned(), 1)];
        assert_eq!(beta["status"], "failed");
        assert!(
            beta["error"]
                .as_str()
                .unwrap()
                .contains("beta is not allowed"),
            "{beta}"
        );
        for index in [0, 2, 3, 4, 5] {
            assert_eq!(lines[&("each".to_owned(), index)]["status"], "completed");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn resubmission_is_bounded_and_then_the_task_fails() {
    let server = MockServer::start(MockConfig::new().rule(flaky_rule(&["gamma"], 100))).await;
    let t =
        project(&server, Provider::OpenAi).write_raw("p.yaml", &pipeline("    backend: batch\n"));
    let ran = summon(&t, &["run", "p.yaml", "--out", "out", "--quiet"]).expect(2);
    // The first batch and two resubmissions of `gamma`, then it fails like a live task.
    let batches = server.batches();
    assert_eq!(batches.len(), 3);
    assert_eq!(batches[1].custom_ids, ["task-2"]);
    assert_eq!(batches[2].custom_ids, ["task-2"]);
    let lines = results(&t.path().join("out"));
    let gamma = &lines[&("each".to_owned(), 2)];
    assert_eq!(gamma["status"], "failed");
    let error = gamma["error"].as_str().unwrap();
    assert!(
        error.contains("server hiccup") && error.contains("3 attempts"),
        "{error}"
    );
    assert!(ran.stderr.contains("step `each` failed"), "{}", ran.stderr);
    assert!(chats(&server).is_empty(), "the synthesis is skipped");

    // With `retries: 3` the bound is higher; under `on_error: continue` the run succeeds.
    let server = MockServer::start(MockConfig::new().rule(flaky_rule(&["gamma"], 3))).await;
    let t = project(&server, Provider::OpenAi)
        .write_raw("p.yaml", &pipeline("    backend: batch\n    retries: 3\n"));
    summon(&t, &["run", "p.yaml", "--quiet"]).expect(0);
    assert_eq!(server.batches().len(), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn resume_polls_the_batch_in_flight_instead_of_creating_another() {
    for provider in [Provider::OpenAi, Provider::Anthropic] {
        let server = MockServer::start(MockConfig::new()).await;
        server.hold_batches(true);
        let t = project(&server, provider).write_raw("p.yaml", &pipeline("    backend: batch\n"));
        let args = ["run", "p.yaml", "--out", "out", "--quiet"];
        let child = t
            .command()
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn summon run");
        // The batch is recorded before it is first polled.
        wait_for(Duration::from_secs(30), "the first poll", || {
            server.batch_polls() >= 1
        });
        let pid = child.id().to_string();
        let status = std::process::Command::new("kill")
            .args(["-KILL", "--", &pid])
            .status()
            .expect("kill -KILL");
        assert!(status.success());
        let mut child = child;
        child.wait().expect("wait");
        assert_eq!(creates(&server), 1);
        assert!(results(&t.path().join("out")).is_empty());

        server.hold_batches(false);
        let ran = summon(&t, &[&args[..], &["--resume"][..]].concat()).expect(0);
        assert_eq!(
            creates(&server),
            1,
            "{provider:?}: a second batch was created"
        );
        assert!(
            ran.stdout.contains("<zeta|echo: Summarise zeta>"),
            "{ran:?}"
        );
        let lines = results(&t.path().join("out"));
        assert_eq!(lines.len(), 7);
        assert!(lines.values().all(|l| l["status"] == "completed"));

        // Everything is in the journal now: resuming again sends nothing.
        let before = server.request_count();
        summon(&t, &[&args[..], &["--resume"][..]].concat()).expect(0);
        assert_eq!(server.request_count(), before, "{provider:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tasks_that_need_tools_run_live_with_a_warning() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server, Provider::OpenAi)
        .write(
            ".claude/agents/reader.md",
            "
            ---
            name: reader
            description: Reads files
            tools: Read, Grep
            ---
            You read files.
            ",
        )
        .write(
            ".claude/agents/thinker.md",
            "
            ---
            name: thinker
            description: Thinks
            tools: []
            ---
            You think.
            ",
        )
        .write(
            "p.yaml",
            r#"
            version: 1
            name: mixed
            steps:
              - id: list
                decompose:
                  items:
                    - {agent: reader, q: "Read a.txt"}
                    - {agent: thinker, q: "Think hard"}
                    - {agent: null, q: "Plain question"}
              - id: each
                backend: batch
                fan_out:
                  over: list
                  source: "{{ item.agent }}"
                  instructions: "{{ item.q }}"
            "#,
        );
    let ran = summon(&t, &["run", "p.yaml", "--out", "out", "--quiet"]).expect(0);
    assert!(
        ran.stderr.contains(
            "warning: step `each`: 1 task needs tools (agent `reader` lists tools) and runs live, not through the batch API"
        ),
        "{}",
        ran.stderr
    );
    let batches = server.batches();
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].custom_ids, ["task-1", "task-2"]);
    let live = chats(&server);
    assert_eq!(live.len(), 1);
    assert!(live[0].tool_names().contains(&"read_file".to_owned()));
    let lines = results(&t.path().join("out"));
    assert_eq!(lines.len(), 3);
    assert!(lines.values().all(|l| l["status"] == "completed"));
    // The batch prompt says nothing about tools.
    let system = match &batches[0].lines[0]["messages"][0] {
        m if m["role"] == "system" => m["content"].as_str().unwrap().to_owned(),
        other => panic!("{other}"),
    };
    assert!(!system.to_lowercase().contains("tool"), "{system}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_schema_answer_is_validated_and_corrected_in_the_next_batch() {
    let server = MockServer::start(MockConfig::new().rule(|req| {
        let text = req.last_user_text().unwrap_or_default();
        if text.starts_with("Your answer does not validate") {
            Reply::text(r#"{"score": 7}"#)
        } else {
            Reply::text(r#"{"score": "high"}"#)
        }
    }))
    .await;
    let t = project(&server, Provider::OpenAi)
        .write(
            "recipes/rate.yaml",
            "
            version: 1.0.0
            title: Rate
            description: Rates a thing
            instructions: Rate {{ thing }}.
            parameters:
              - key: thing
                input_type: string
                requirement: required
                description: what to rate
            response:
              json_schema:
                type: object
                required: [score]
                properties:
                  score: {type: integer}
            ",
        )
        .write(
            "p.yaml",
            r#"
            version: 1
            name: rate
            steps:
              - id: list
                decompose:
                  items: [tea, coffee]
              - id: each
                backend: batch
                fan_out:
                  over: list
                  source: rate
                  parameters: {thing: "{{ item }}"}
            "#,
        );
    summon(&t, &["run", "p.yaml", "--out", "out", "--quiet"]).expect(0);
    let batches = server.batches();
    assert_eq!(batches.len(), 2);
    assert_eq!(batches[1].lines[0]["messages"].as_array().unwrap().len(), 4);
    let lines = results(&t.path().join("out"));
    for line in lines.values() {
        assert_eq!(line["output"], r#"{"score":7}"#, "{line}");
        assert_eq!(line["turns"], 2);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_answer_that_repeats_the_key_is_redacted() {
    // A hostile answer for `beta`: the provider key, in text a later step would read.
    let server = MockServer::start(MockConfig::new().rule(|req: &RecordedRequest| {
        if req.last_user_text().unwrap_or_default().contains("beta") {
            Reply::text(format!("the key is {KEY}"))
        } else {
            Reply::Echo
        }
    }))
    .await;
    let t =
        project(&server, Provider::OpenAi).write_raw("p.yaml", &pipeline("    backend: batch\n"));
    let ran = summon(&t, &["run", "p.yaml", "--out", "out", "--quiet"]).expect(0);
    let lines = results(&t.path().join("out"));
    assert_eq!(
        lines[&("each".to_owned(), 1)]["output"],
        "the key is [redacted]"
    );
    assert!(!ran.stdout.contains(KEY), "{}", ran.stdout);
    for file in ["results.jsonl", "report.html"] {
        let text = std::fs::read_to_string(t.path().join("out").join(file)).unwrap();
        assert!(!text.contains(KEY), "{file} holds the key");
    }
    // The synthesis was sent the cleaned answer.
    let sent: Vec<String> = chats(&server)
        .iter()
        .filter_map(|r| r.last_user_text())
        .collect();
    assert!(
        sent.iter().any(|s| s.contains("the key is [redacted]")),
        "{sent:?}"
    );
    assert!(sent.iter().all(|s| !s.contains(KEY)));
}
