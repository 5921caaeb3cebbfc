//! A provider that refuses the key or stops answering: the run stops starting tasks instead
//! of sending the same failing request once per item.

use crate::support;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::{Test, results, wait_for};

fn openai(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-a-wrong-key-0123456789")
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_RETRY_BASE_MS", "1")
}

/// A decompose of `n` items, a fan-out over them at `concurrency` that goes on after a
/// failed task, and a synthesis.
fn fan_out_and_reduce(n: usize, concurrency: usize) -> String {
    let items: Vec<String> = (0..n).map(|i| format!("i{i:03}")).collect();
    format!(
        "version: 1\nname: refused\nsettings:\n  concurrency: {concurrency}\nsteps:\n  - id: list\n    decompose:\n      items: [{}]\n  - id: each\n    fan_out:\n      over: list\n      instructions: 'Say {{{{ item }}}}.'\n    on_error: continue\n  - id: all\n    synthesize:\n      instructions: 'Join {{{{ steps.each.results | length }}}} answers.'\n",
        items.join(", ")
    )
}

/// [`fan_out_and_reduce`] whose fan-out shares no cacheable prefix (no tools, a short prompt):
/// no warm-up holds its tasks back, so they wait only for the provider's first answer.
fn uncached_fan_out(n: usize, concurrency: usize) -> String {
    fan_out_and_reduce(n, concurrency).replace(
        "    on_error: continue\n",
        "      extensions: []\n    on_error: continue\n",
    )
}

const UNAUTHORIZED: &str =
    r#"{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_key_sends_one_request_and_runs_nothing_after_it() {
    // The key is refused on every path, as by a real provider: the model list a waiting task
    // asks while the first request is in flight does not open the gate.
    let server = MockServer::start(
        MockConfig::new()
            .api_key("sk-the-right-key-0123456789")
            .latency(Duration::from_millis(100)),
    )
    .await;
    let stderr = run_refused(&server);
    assert_eq!(support::chats(&server).len(), 1, "{stderr}");
    assert_eq!(server.request_count(), 2, "the chat and one model list");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_refused_only_for_chats_costs_at_most_one_request_per_slot() {
    // The model list takes the key (as a key allowed to read models only, or a provider
    // whose list needs none) but every chat is refused: the tasks that waited for the first
    // answer went when the list was given, and nothing is sent after the first refusal.
    let server = MockServer::start(
        MockConfig::new()
            .default_reply(Reply::status(401, UNAUTHORIZED))
            .latency(Duration::from_millis(1000)),
    )
    .await;
    let stderr = run_refused(&server);
    let chats = support::chats(&server).len();
    assert!((2..=4).contains(&chats), "{chats} chats: {stderr}");
}

/// `summon run` of a 300-item fan-out at concurrency 4 whose key `server` refuses: exit 1, the
/// refusal said with the key's variable (never the key), no synthesis; its stderr.
fn run_refused(server: &MockServer) -> String {
    let out = openai(server)
        .write("p.yaml", &uncached_fan_out(300, 4))
        .args(["run", "p.yaml", "--out", "out"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains("authentication failed (HTTP 401)")
            && out.stderr.contains("check the key in `OPENAI_API_KEY`"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("sk-a-wrong-key"), "{}", out.stderr);
    let lines = results(&out.dir.join("out"));
    assert!(lines.iter().all(|l| l["step"] != "all"), "{lines:#?}");
    out.stderr
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fan_out_does_not_wait_for_the_first_answer_once_the_model_list_is_given() {
    let latency = Duration::from_millis(800);
    let server = MockServer::start(
        MockConfig::new()
            .api_key("sk-test-0123456789")
            .default_reply(Reply::text("ok"))
            .latency(latency),
    )
    .await;
    let out = openai(&server)
        .env("OPENAI_API_KEY", "sk-test-0123456789")
        .write("p.yaml", &uncached_fan_out(4, 4))
        .args(["run", "p.yaml"])
        .run();
    let requests = server.requests();
    let models = requests
        .iter()
        .filter(|r| r.api == summon_mock_llm::Api::Models);
    assert_eq!(models.count(), 1, "{requests:#?}");
    let fan_out: Vec<_> = support::chats(&server)
        .into_iter()
        .filter(|r| r.last_user_text().is_some_and(|t| t.starts_with("Say ")))
        .collect();
    assert_eq!(fan_out.len(), 4, "{}", out.stderr);
    // All four were sent while the first was in flight: one round of the latency, not two.
    let first = fan_out.iter().map(|r| r.received_at).min().expect("first");
    let last = fan_out.iter().map(|r| r.received_at).max().expect("last");
    assert!(
        last.duration_since(first) < latency,
        "the last task was sent {:?} after the first",
        last.duration_since(first)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wait_that_is_not_a_whole_number_of_milliseconds_is_refused_before_anything_is_sent() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = openai(&server)
        .env("SUMMON_RATE_LIMITED_MS", "5m")
        .write("p.yaml", &fan_out_and_reduce(3, 2))
        .args(["run", "p.yaml", "--out", "out"])
        .code(1)
        .run();
    assert!(
        out.stderr
            .contains("SUMMON_RATE_LIMITED_MS must be a whole number of milliseconds, found `5m`"),
        "{}",
        out.stderr
    );
    assert!(
        !out.dir.join("out").exists(),
        "an output directory was made"
    );
    let out = openai(&server)
        .env("SUMMON_STARTUP_WAIT_MS", "3 s")
        .args(["delegate", "--instructions", "Say hi."])
        .code(1)
        .run();
    assert!(
        out.stderr
            .contains("SUMMON_STARTUP_WAIT_MS must be a whole number of milliseconds, found `3 s`"),
        "{}",
        out.stderr
    );
    assert_eq!(server.request_count(), 0, "a request was sent");
}

/// The items of the fan-out tasks a server was asked for, each as often as it was asked.
fn asked_items(server: &MockServer) -> Vec<String> {
    support::chats(server)
        .iter()
        .filter_map(|r| r.last_user_text())
        .filter_map(|text| {
            let item = text.strip_prefix("Say ")?.strip_suffix('.')?;
            Some(item.to_owned())
        })
        .collect()
}

fn completed(lines: &[Value], step: &str) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l["step"] == step && l["status"] == "completed")
        .map(|l| l["item"].as_str().expect("item").to_owned())
        .collect()
}

/// What a run that lost its provider, then its `--resume` after the provider came back, left.
struct Resumed {
    /// `results.jsonl` and `report.json` after the first run, then after the resume.
    first: Vec<Value>,
    first_report: Value,
    lines: Vec<Value>,
    report: Value,
    /// The items the restarted provider was asked for.
    asked_again: Vec<String>,
}

/// A fan-out of 40 items at concurrency 2 whose provider goes away after 6 answers: the run
/// stops within the window (1 s), and `--resume` after the provider came back on the same
/// port finishes it.
async fn stopped_then_resumed() -> Resumed {
    let config = || {
        MockConfig::new()
            .default_reply(Reply::text("ok"))
            .latency(Duration::from_millis(10))
    };
    let server = MockServer::start(config()).await;
    let port = server.port();
    let t = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789")
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_RETRY_BASE_MS", "20")
        .env("SUMMON_UNREACHABLE_MS", "1000")
        .write("p.yaml", &fan_out_and_reduce(40, 2));
    let child = t
        .command()
        .args(["run", "p.yaml", "--out", "out"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start summon");
    wait_for(Duration::from_secs(30), "6 answers", || {
        support::chat_count(&server) >= 6
    });
    server.shutdown().await;
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("summon ran");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    assert!(
        stderr.contains("provider `openai` could not be reached for 1s")
            && stderr.contains("continue the run with `summon run p.yaml --resume`"),
        "{stderr}"
    );
    let dir = t.path().join("out");
    let first = results(&dir);
    let first_report = support::read_json(&dir.join("report.json"));

    let server = MockServer::start_on_port(config(), port)
        .await
        .expect("the port again");
    let again = t
        .command()
        .args(["run", "p.yaml", "--out", "out", "--resume"])
        .output()
        .expect("resume");
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(0), "{stderr}");
    Resumed {
        first,
        first_report,
        lines: results(&dir),
        report: support::read_json(&dir.join("report.json")),
        asked_again: asked_items(&server),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_provider_gone_mid_run_stops_it_and_resume_after_its_restart_finishes_it() {
    let ran = stopped_then_resumed().await;
    let done_first = completed(&ran.first, "each");
    assert!(
        done_first.len() >= 6 && done_first.len() < 40,
        "{:#?}",
        ran.first
    );
    assert!(
        ran.first.iter().all(|l| l["step"] != "all"),
        "{:#?}",
        ran.first
    );
    let each = completed(&ran.lines, "each");
    let unique: BTreeSet<&String> = each.iter().collect();
    assert_eq!((each.len(), unique.len()), (40, 40), "{:#?}", ran.lines);
    assert_eq!(
        ran.lines
            .iter()
            .filter(|l| l["step"] == "all" && l["status"] == "completed")
            .count(),
        1,
        "{:#?}",
        ran.lines
    );
    // What the first run finished is not asked again.
    for item in &done_first {
        assert!(
            !ran.asked_again.contains(item),
            "{item} asked again: {:?}",
            ran.asked_again
        );
    }
}

/// After `--resume`, the tasks the first run finished say so and carry no start time (it was
/// the first run's: report.html's timeline would draw them beside this run's), and the
/// first run's retries still count in `retries_by_class`.
#[tokio::test(flavor = "multi_thread")]
async fn resumed_rows_say_so_and_the_first_runs_retries_still_count() {
    let ran = stopped_then_resumed().await;
    let done_first: BTreeSet<String> = completed(&ran.first, "each").into_iter().collect();
    assert!(!done_first.is_empty());
    for line in ran.lines.iter().filter(|l| l["step"] == "each") {
        let item = line["item"].as_str().expect("item");
        if done_first.contains(item) {
            assert_eq!(line["resumed"], true, "{line:#}");
            assert!(line["started_ms"].is_null(), "{line:#}");
        } else {
            assert_eq!(line["resumed"], false, "{line:#}");
            assert!(line["started_ms"].is_u64(), "{line:#}");
        }
    }
    let each = &ran.report["steps"]["each"];
    assert_eq!(each["resumed"], done_first.len() as u64, "{each:#}");
    let first = ran.first_report["retries_by_class"]["connection"]
        .as_u64()
        .expect("connection retries");
    assert!(first > 0, "{:#}", ran.first_report);
    assert!(
        ran.report["retries_by_class"]["connection"].as_u64() >= Some(first),
        "{:#}",
        ran.report["retries_by_class"]
    );
}

/// A provider that never answered, through its start-up wait and the retries of the first
/// task that tried it, is taken for dead too: the other tasks are not sent, the synthesis
/// does not run.
#[tokio::test(flavor = "multi_thread")]
async fn a_provider_never_reached_stops_the_run_after_the_start_up_wait() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let out = Test::new()
        .env("OPENAI_BASE_URL", &format!("http://127.0.0.1:{port}/v1"))
        .env("OPENAI_API_KEY", "sk-test-0123456789")
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_RETRY_BASE_MS", "1")
        .env("SUMMON_STARTUP_WAIT_MS", "200")
        .write("p.yaml", &fan_out_and_reduce(50, 4))
        .args(["run", "p.yaml", "--out", "out"])
        .code(75)
        .run();
    assert!(
        out.stderr
            .contains("stopped: provider `openai` could not be reached for 0.2s")
            && out.stderr.contains("summon run p.yaml --resume"),
        "{}",
        out.stderr
    );
    let lines = results(&out.dir.join("out"));
    // The tasks that found it dead (at most the 4 in flight); the others were not sent (and
    // `--resume` sends them).
    assert!((1..=4).contains(&lines.len()), "{lines:#?}");
    assert!(lines.iter().all(|l| l["step"] == "each"), "{lines:#?}");
}

/// A provider that answers every request with a 429 is sent one request at a time, each after
/// the wait it asked for, not every waiting task's retry at once; after the window
/// (`SUMMON_RATE_LIMITED_MS`) of nothing but 429s the run stops, resumable.
#[tokio::test(flavor = "multi_thread")]
async fn a_provider_that_only_rate_limits_is_paced_then_stops_the_run() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::status_with_headers(
        429,
        [("retry-after", "1")],
        r#"{"error":{"message":"Rate limit reached for requests","type":"requests"}}"#,
    )))
    .await;
    let out = openai(&server)
        .env("OPENAI_API_KEY", "sk-test-0123456789")
        .env("SUMMON_RATE_LIMITED_MS", "2500")
        .write("p.yaml", &fan_out_and_reduce(200, 16))
        .args(["run", "p.yaml", "--out", "out"])
        .code(75)
        .run();
    assert!(
        out.stderr.contains(
            "stopped: provider `openai` answered every request with a rate limit for 2.5s"
        ) && out.stderr.contains("summon run p.yaml --resume"),
        "{}",
        out.stderr
    );
    // One request a second for about 3 s (each task on its own would have sent its six:
    // 16 at once, then again every second).
    let sent = server.request_count();
    assert!((3..=8).contains(&sent), "{sent} requests\n{}", out.stderr);
    assert_eq!(server.peak_in_flight(), 1, "{}", out.stderr);
    let lines = results(&out.dir.join("out"));
    assert!(lines.iter().all(|l| l["step"] == "each"), "{lines:#?}");
}

/// After a wave of 429s nothing is sent until the wait they asked for has passed, then half
/// as many requests go at once, growing back one per answer: the fan-out finishes, every item
/// once.
#[tokio::test(flavor = "multi_thread")]
async fn a_wave_of_rate_limits_pauses_and_halves_the_fan_out_and_it_finishes() {
    let slow = Duration::from_millis(60);
    let mut replies = vec![Reply::text("first")];
    replies.extend((0..16).map(|_| {
        Reply::status_with_headers(
            429,
            [("retry-after", "0.3")],
            r#"{"error":{"message":"Rate limit reached","type":"requests"}}"#,
        )
        .delayed(slow)
    }));
    let server = MockServer::start(
        MockConfig::new()
            .replies(replies)
            .default_reply(Reply::text("ok").delayed(slow)),
    )
    .await;
    let out = openai(&server)
        .env("OPENAI_API_KEY", "sk-test-0123456789")
        .write("p.yaml", &fan_out_and_reduce(120, 16))
        .args(["run", "p.yaml", "--out", "out"])
        .run();
    let lines = results(&out.dir.join("out"));
    let done: BTreeSet<String> = completed(&lines, "each").into_iter().collect();
    assert_eq!(done.len(), 120, "{}", out.stderr);
    assert_eq!(asked_items(&server).len(), 120 + 16, "{}", out.stderr);
    let requests = crate::support::chats(&server);
    // Requests 1..=16 are the wave (the first went alone), answered 60 ms after they came.
    let wave_answered = requests[16].received_at + slow;
    let after: Vec<_> = requests[17..]
        .iter()
        .map(|r| r.received_at.saturating_duration_since(wave_answered))
        .collect();
    assert!(
        after[0] >= Duration::from_millis(290),
        "the next request came {:?} after the wave's answers, before the 0.3 s asked for",
        after[0]
    );
    // Until the first answers after the pause come back, at most 8 are in flight.
    let first_burst = after
        .iter()
        .filter(|d| **d < after[0] + slow - Duration::from_millis(10))
        .count();
    assert!(
        first_burst <= 8,
        "{first_burst} sent at once after the pause"
    );
}
