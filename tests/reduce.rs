//! Synthesis beyond one context window: every request is checked against the model's context
//! window before it is sent, and a synthesize step with `reduce: auto` or `chunk_tokens`
//! reduces its results level by level (journaled, resumable, shown in the report, JUnit and
//! `--dry-run`). The mock refuses, as the providers do, what exceeds its context window.

use crate::support;
use crate::support::{chats, read_json};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;
use summon_mock_llm::{MockConfig, MockServer, RecordedRequest, Reply, prompt_tokens};
use support::Test;

const KEY: &str = "sk-test-0123456789abcdefSECRET";
const MODEL: &str = "mock-model";

/// A project wired to the mock as an OpenAI-compatible provider.
fn project(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", MODEL)
}

/// Runs `summon ARGS` in the project `t`; (exit code, stdout, stderr).
fn summon(t: &Test, args: &[&str]) -> (i32, String, String) {
    let output = t.command().args(args).output().expect("run summon");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The chat requests whose last user message starts with `prefix`.
fn starting<'a>(requests: &'a [RecordedRequest], prefix: &str) -> Vec<&'a RecordedRequest> {
    requests
        .iter()
        .filter(|r| r.last_user_text().unwrap_or_default().starts_with(prefix))
        .collect()
}

/// `n` notes of 400 characters each, `n0000:aaa...`, one JSON string per line.
fn notes(n: usize) -> String {
    (0..n)
        .map(|i| format!("\"n{i:04}:{}\"\n", "a".repeat(394)))
        .collect()
}

/// The numbers of the notes (`n0123`) and of the covered ranges (`covered n0100-n0199`) in
/// `text`, in order of appearance.
fn note_numbers(text: &str) -> Vec<u32> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    for i in 0..bytes.len().saturating_sub(4) {
        if bytes[i] == b'n' && bytes[i + 1..i + 5].iter().all(u8::is_ascii_digit) {
            out.push(text[i + 1..i + 5].parse().unwrap());
        }
    }
    out
}

/// A synthesis answer naming the notes the request covered, padded to `size` characters.
fn covering(request: &RecordedRequest, size: usize) -> Reply {
    let numbers = note_numbers(&request.last_user_text().unwrap_or_default());
    let (first, last) = (
        numbers.iter().min().copied().unwrap_or(0),
        numbers.iter().max().copied().unwrap_or(0),
    );
    let head = format!("covered n{first:04}-n{last:04} ");
    let pad = size.saturating_sub(head.len());
    Reply::text(format!("{head}{}", "x".repeat(pad)))
}

/// decompose `notes` from notes.jsonl, fan_out `each` echoing each note, synthesize `summary`
/// over the results with `extra` keys.
fn pipeline(extra: &str) -> String {
    format!(
        "version: 1\nname: notes\nsettings:\n  max_output_tokens: 2000\nsteps:\n  - id: notes\n    decompose:\n      file: notes.jsonl\n  - id: each\n    fan_out:\n      over: notes\n      instructions: \"{{{{ item }}}}\"\n  - id: summary\n    synthesize:\n      instructions: |\n        Summarize:\n        {{% for r in steps.each.results %}}{{{{ r.output }}}}\n        {{% endfor %}}\n{extra}"
    )
}

fn results_lines(dir: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("results.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The check before each request.

#[tokio::test(flavor = "multi_thread")]
async fn a_synthesis_that_cannot_fit_fails_before_its_request_is_sent() {
    let server = MockServer::start(MockConfig::new().context_window(MODEL, 8000)).await;
    // 200 notes of about 100 tokens: 20,000 tokens into an 8,000-token window. The items come
    // from a command, so their size is known only once the fan-out has run.
    let mut lines = String::new();
    for i in 0..200 {
        lines.push_str(&format!("n{i:04}:{}\n", "a".repeat(394)));
    }
    let t = project(&server)
        .write("notes.txt", &lines)
        .write(
            "summon.yaml",
            "models:\n  mock-model: { context_window: 8000 }\n",
        )
        .write_raw(
            "p.yaml",
            &pipeline("").replace("file: notes.jsonl", "command: cat notes.txt"),
        );
    let (code, _, stderr) = summon(&t, &["run", "p.yaml", "--quiet"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("summary"), "names the step: {stderr}");
    assert!(
        stderr.contains("context window of `mock-model` is 8000 tokens"),
        "names the window: {stderr}"
    );
    assert!(
        stderr.contains("the request needs about "),
        "gives the estimate: {stderr}"
    );
    let requests = chats(&server);
    assert_eq!(starting(&requests, "n0").len(), 200, "the fan-out ran");
    assert!(
        starting(&requests, "Summarize:").is_empty(),
        "the synthesis request was never sent"
    );
    assert!(requests.iter().all(|r| r.refused.is_none()));

    // The step's own `context_window` overrides the model's (here: none in the config file).
    let server = MockServer::start(MockConfig::new().context_window(MODEL, 8000)).await;
    let t = project(&server).write("notes.txt", &lines).write_raw(
        "p.yaml",
        &pipeline("    context_window: 8000\n")
            .replace("file: notes.jsonl", "command: cat notes.txt"),
    );
    let (code, _, stderr) = summon(&t, &["run", "p.yaml", "--quiet"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("is 8000 tokens; it was not sent"),
        "{stderr}"
    );
    assert!(starting(&chats(&server), "Summarize:").is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_synthesis_known_not_to_fit_fails_before_the_fan_out() {
    // 40 literal items whose answers may each take 2,000 tokens: 80,000 tokens into a
    // 32,000-token window, known before anything is sent.
    let server = MockServer::start(MockConfig::new().context_window(MODEL, 32_000)).await;
    let items: Vec<String> = (0..40).map(|i| format!("n{i:04}")).collect();
    let literal = format!("items: [{}]", items.join(", "));
    let t = project(&server)
        .write(
            "summon.yaml",
            "models:\n  mock-model: { context_window: 32000 }\n",
        )
        .write_raw(
            "p.yaml",
            &pipeline("").replace("file: notes.jsonl", &literal),
        );
    let (code, _, stderr) = summon(&t, &["run", "p.yaml", "--quiet"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("step `summary` cannot fit its context window"),
        "names the step: {stderr}"
    );
    assert!(
        stderr.contains("the 40 results of `each` at their output limit (2000 tokens each)"),
        "{stderr}"
    );
    let estimate: u64 = stderr
        .split("need about ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("gives the estimate: {stderr}"));
    assert!(estimate > 40 * 2000, "{estimate}");
    assert!(
        stderr.contains("the context window of `mock-model` is 32000 tokens"),
        "names the window: {stderr}"
    );
    assert!(stderr.contains("reduce: auto"), "{stderr}");
    assert!(server.requests().is_empty(), "no request was sent");

    // With `reduce: auto` the same pipeline runs.
    let server = MockServer::start(MockConfig::new().context_window(MODEL, 32_000)).await;
    let t = project(&server)
        .write(
            "summon.yaml",
            "models:\n  mock-model: { context_window: 32000 }\n",
        )
        .write_raw(
            "p.yaml",
            &pipeline("    reduce: auto\n").replace("file: notes.jsonl", &literal),
        );
    let (code, _, stderr) = summon(&t, &["run", "p.yaml", "--quiet"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(starting(&chats(&server), "n0").len(), 40);
}

// ---------------------------------------------------------------------------------------------
// Hierarchical reduction.

#[tokio::test(flavor = "multi_thread")]
async fn three_thousand_notes_reduce_into_a_32k_window_in_levels() {
    const WINDOW: u64 = 32_000;
    // Partial answers of 12,000 characters (3,000 tokens): a dozen of them do not fit one
    // request, so the reduction takes three levels.
    let server = MockServer::start(MockConfig::new().context_window(MODEL, WINDOW).rule(|r| {
        if r.last_user_text()
            .unwrap_or_default()
            .starts_with("Summarize:")
        {
            covering(r, 12_000)
        } else {
            Reply::Echo
        }
    }))
    .await;
    let t = project(&server)
        .write("notes.jsonl", &notes(3000))
        .write(
            "summon.yaml",
            "models:\n  mock-model: { context_window: 32000 }\n",
        )
        .write_raw("p.yaml", &pipeline("    reduce: auto\n"));
    let (code, stdout, stderr) = summon(
        &t,
        &[
            "run",
            "p.yaml",
            "--out",
            "out",
            "--junit",
            "junit.xml",
            "--concurrency",
            "32",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.starts_with("covered n0000-n2999 "),
        "one answer over every note: {}",
        &stdout[..stdout.len().min(80)]
    );
    let requests = chats(&server);
    assert!(
        requests.iter().all(|r| r.refused.is_none()),
        "no request exceeded the window"
    );
    let synth = starting(&requests, "Summarize:");
    // Level 1 holds notes; the levels above hold partial answers.
    let (first, upper): (Vec<&RecordedRequest>, Vec<&RecordedRequest>) = synth
        .iter()
        .copied()
        .partition(|r| r.last_user_text().unwrap().contains("echo: n"));
    let mut chunks: Vec<Vec<u32>> = first
        .iter()
        .map(|r| note_numbers(&r.last_user_text().unwrap()))
        .collect();
    chunks.sort();
    // Consecutive chunks in item order, every note exactly once.
    let all: Vec<u32> = chunks.iter().flatten().copied().collect();
    assert_eq!(all, (0..3000).collect::<Vec<_>>());
    let per_chunk = chunks[0].len();
    assert!(
        chunks[..chunks.len() - 1]
            .iter()
            .all(|c| c.len() == per_chunk),
        "chunks are filled in order"
    );
    assert_eq!(chunks.len(), 3000usize.div_ceil(per_chunk));
    // Filled: the first chunk's prompt and output limit use most of the window.
    let opening = first
        .iter()
        .find(|r| note_numbers(&r.last_user_text().unwrap()).first() == Some(&0))
        .unwrap();
    let used = prompt_tokens(&opening.body) + 2000;
    assert!(used <= WINDOW && used > WINDOW * 9 / 10, "{used}");

    // Partials of 3,000 tokens: about nine fit one request at level 2.
    let partial_tokens = 12_001u64.div_ceil(4);
    let per_upper = ((WINDOW - 2000 - 100) / partial_tokens) as usize;
    let level2 = chunks.len().div_ceil(per_upper);
    assert!(level2 > 1, "the test needs three levels");
    assert_eq!(upper.len(), level2 + 1, "level 2 and the top");

    let report = read_json(&t.path().join("out/report.json"));
    let levels = &report["steps"]["summary"]["levels"];
    let tasks: Vec<u64> = levels
        .as_array()
        .expect("levels in report.json")
        .iter()
        .map(|l| l["tasks"].as_u64().unwrap())
        .collect();
    assert_eq!(tasks, [chunks.len() as u64, level2 as u64, 1]);
    assert_eq!(levels[0]["level"], 1);
    assert_eq!(levels[2]["completed"], 1);
    assert_eq!(
        report["steps"]["summary"]["tasks"].as_u64(),
        Some((chunks.len() + level2 + 1) as u64)
    );
    let lines = results_lines(&t.path().join("out"));
    for (level, count) in [(1, chunks.len()), (2, level2), (3, 1)] {
        let step = format!("summary#{level}");
        assert_eq!(
            lines.iter().filter(|l| l["step"] == step.as_str()).count(),
            count,
            "{step} in results.jsonl"
        );
    }
    let junit = std::fs::read_to_string(t.path().join("junit.xml")).unwrap();
    assert!(
        junit.contains("level 1, chunk 0"),
        "{}",
        &junit[..500.min(junit.len())]
    );
    assert!(junit.contains("level 3, chunk 0"));
    assert!(
        stderr.contains("summary: level 2:"),
        "progress shows levels: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn resume_after_a_failed_chunk_repeats_only_the_unfinished_chunks() {
    // Chunk 15 (notes 150-159) fails once; every other answer names what it covered.
    let fail = Arc::new(AtomicBool::new(true));
    let failing = Arc::clone(&fail);
    let server = MockServer::start(MockConfig::new().rule(move |r| {
        let text = r.last_user_text().unwrap_or_default();
        if !text.starts_with("Summarize:") {
            return Reply::Echo;
        }
        if text.contains("echo: n0150:") && failing.swap(false, Ordering::SeqCst) {
            return Reply::status(
                400,
                r#"{"error":{"message":"this chunk is bad","type":"invalid_request_error"}}"#,
            );
        }
        covering(r, 20)
    }))
    .await;
    // 407 bytes (102 tokens) per note: ten notes per 1,020-token chunk, 30 chunks.
    let t = project(&server)
        .write("notes.jsonl", &notes(300))
        .write_raw(
            "p.yaml",
            &pipeline("    chunk_tokens: 1020\n    concurrency: 1\n"),
        );
    let (code, _, stderr) = summon(&t, &["run", "p.yaml", "--out", "out", "--quiet"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("level 1, chunk 15 failed"),
        "names the chunk: {stderr}"
    );
    let first_run = chats(&server).len();
    let level1_first = starting(&chats(&server), "Summarize:").len();
    assert_eq!(level1_first, 16, "chunks 0-15 were sent, the rest never");

    let (code, stdout, stderr) = summon(&t, &["run", "p.yaml", "--resume", "--quiet"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("covered n0000-n0299"), "{stdout}");
    let requests = chats(&server);
    let again = &requests[first_run..];
    let firsts: Vec<u32> = again
        .iter()
        .filter(|r| r.last_user_text().unwrap().contains("echo: n"))
        .map(|r| note_numbers(&r.last_user_text().unwrap())[0])
        .collect();
    assert_eq!(
        firsts,
        (15..30).map(|c| c * 10).collect::<Vec<_>>(),
        "only the chunks that had not finished, in order"
    );
    assert_eq!(
        again.len(),
        15 + 1,
        "no fan-out task again; one task at level 2"
    );
    let lines = results_lines(&t.path().join("out"));
    assert_eq!(
        lines.iter().filter(|l| l["step"] == "summary#1").count(),
        30,
        "each chunk once in results.jsonl"
    );
}

/// Tasks per level of reducing `n` results of `per_result` tokens in chunks of `budget`
/// tokens, partial answers of `per_partial` tokens: the arithmetic the dry run states.
fn expected_levels(n: u64, per_result: u64, per_partial: u64, budget: u64) -> Vec<u64> {
    let mut levels = vec![n.div_ceil(budget / per_result)];
    while *levels.last().unwrap() > 1 {
        let m = *levels.last().unwrap();
        levels.push(m.div_ceil(budget / per_partial));
    }
    levels
}

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_shows_the_expected_levels_and_tasks_of_a_reduction() {
    let server = MockServer::start(MockConfig::new()).await;
    let (n, per_result, per_partial, budget) = (100u64, 100u64, 300u64, 1000u64);
    let items: Vec<String> = (0..n).map(|i| format!("n{i:04}")).collect();
    let p = format!(
        "version: 1\nname: notes\nsteps:\n  - id: notes\n    decompose:\n      items: [{}]\n  - id: each\n    fan_out:\n      over: notes\n      instructions: \"{{{{ item }}}}\"\n    max_output_tokens: {per_result}\n  - id: summary\n    synthesize:\n      instructions: |\n        Summarize:\n        {{% for r in steps.each.results %}}{{{{ r.output }}}}\n        {{% endfor %}}\n    max_output_tokens: {per_partial}\n    chunk_tokens: {budget}\n",
        items.join(", ")
    );
    let t = project(&server).write_raw("p.yaml", &p);
    let expected = expected_levels(n, per_result, per_partial, budget);
    assert!(expected.len() > 2, "{expected:?}");
    let (code, stdout, stderr) = summon(&t, &["run", "p.yaml", "--dry-run"]);
    assert_eq!(code, 0, "{stderr}");
    let counts: Vec<String> = expected.iter().map(u64::to_string).collect();
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("summary (synthesize)"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        line.contains(&format!("{} tasks;", expected.iter().sum::<u64>())),
        "{line}"
    );
    assert!(
        line.contains(&format!(
            "reduce: ~{} levels ({} tasks), chunks of ≤ 1,000 tokens, ~{per_result} tokens per result (its output limit)",
            expected.len(),
            counts.join(", ")
        )),
        "{line}"
    );
    let (code, stdout, stderr) = summon(&t, &["run", "p.yaml", "--dry-run", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let plan: Value = serde_json::from_str(&stdout).unwrap();
    let summary = &plan["steps"][2];
    assert_eq!(summary["levels"]["tasks"], serde_json::json!(expected));
    assert_eq!(summary["levels"]["chunk_tokens"], budget);
    assert_eq!(summary["levels"]["converges"], true);
    assert!(server.requests().is_empty(), "a dry run sends nothing");
}

// ---------------------------------------------------------------------------------------------
// The window from the server.

#[tokio::test(flavor = "multi_thread")]
async fn reduce_auto_learns_the_window_from_the_server_once_before_the_first_request() {
    const WINDOW: u64 = 8000;
    let server = MockServer::start(MockConfig::new().context_window(MODEL, WINDOW).rule(|r| {
        if r.last_user_text()
            .unwrap_or_default()
            .starts_with("Summarize:")
        {
            covering(r, 400)
        } else {
            Reply::Echo
        }
    }))
    .await;
    // No config file: the window is the server's word alone.
    let t = project(&server)
        .write("notes.jsonl", &notes(200))
        .write_raw("p.yaml", &pipeline("    reduce: auto\n"));
    let (code, stdout, stderr) = summon(&t, &["run", "p.yaml", "--dry-run"]);
    assert_eq!(code, 0, "{stderr}");
    let props = format!("GET {}/props", server.url_anthropic());
    assert!(
        stdout.contains(&format!(
            "context window 8,000 tokens, from the server: {props}"
        )),
        "{stdout}"
    );
    assert!(chats(&server).is_empty(), "a dry run sends no chat request");
    let before = server.requests().len();
    let (code, stdout, stderr) = summon(&t, &["run", "p.yaml"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("covered n0000-n0199 "), "{stdout}");
    let requests = &server.requests()[before..];
    let asked: Vec<_> = requests.iter().filter(|r| r.path == "/props").collect();
    assert_eq!(asked.len(), 1, "asked once: {requests:?}");
    assert_eq!(requests[0].path, "/props", "asked before the first request");
    let chats = chats(&server);
    assert!(
        chats.iter().all(|r| r.refused.is_none()),
        "none exceeded the window"
    );
    assert!(
        starting(&chats, "Summarize:").len() > 1,
        "the 200 notes (20,000 tokens) were reduced in chunks"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn reduce_auto_with_no_window_anywhere_fails_before_any_request() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server)
        .write("notes.jsonl", &notes(3))
        .write_raw("p.yaml", &pipeline("    reduce: auto\n"));
    for args in [&["run", "p.yaml"][..], &["run", "p.yaml", "--dry-run"]] {
        let (code, _, stderr) = summon(&t, args);
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "p.yaml:19:5: error: step `summary`: `reduce: auto` needs the context window of \
                 `mock-model`: the config file gives none, and its server at {} does not say \
                 it; nothing was sent",
                server.url_openai()
            )),
            "{args:?}: {stderr}"
        );
        assert!(
            stderr.contains("set `models: {mock-model: {context_window: TOKENS}}` in summon.yaml"),
            "{stderr}"
        );
    }
    assert!(chats(&server).is_empty(), "nothing was sent");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_says_no_window_is_asked_once_per_run() {
    let server = MockServer::start(MockConfig::new()).await;
    // `whole` can use the window (its size is known in advance), `reduced` needs it.
    let p = "version: 1\nname: notes\nsteps:\n  - id: notes\n    decompose:\n      items: [a, b]\n  - id: each\n    fan_out:\n      over: notes\n      instructions: \"{{ item }}\"\n    max_output_tokens: 100\n  - id: whole\n    synthesize:\n      instructions: \"{% for r in steps.each.results %}{{ r.output }}{% endfor %}\"\n  - id: reduced\n    synthesize:\n      instructions: \"{% for r in steps.each.results %}{{ r.output }}{% endfor %}\"\n    reduce: auto\n";
    let t = project(&server).write_raw("p.yaml", p);
    let (code, _, stderr) = summon(&t, &["run", "p.yaml"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("step `reduced`: `reduce: auto` needs the context window"),
        "{stderr}"
    );
    // (`/props` answered 404: counted, not recorded.)
    let paths: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/v1/models", "/api/show"], "asked once");
    assert_eq!(server.props_count(), 1, "asked once");
}
