//! A fan-out at the key's ceiling: the output limit fits the task (learned from the step's
//! answers, bounded by a schema, or explicit), an answer cut off at a learned limit is sent
//! again whole, and requests wait for the provider's rate limits (its headers and its 429s'
//! words) instead of being sent into 429s, against a mock that rations a key as OpenAI and
//! Anthropic do.

use crate::support;
use crate::support::chats;

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, Ration, Reply};
use support::Test;

const KEY: &str = "sk-test-0123456789abcdefCEIL";

fn openai(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
}

fn anthropic(server: &MockServer) -> Test {
    Test::new()
        .env("SUMMON_PROVIDER", "anthropic")
        .env("ANTHROPIC_BASE_URL", &server.url_anthropic())
        .env("ANTHROPIC_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
}

/// A fan-out of `n` one-line tasks, written inline with no tools.
fn fan_out(n: usize, step_keys: &str) -> String {
    let items: Vec<String> = (0..n).map(|i| format!("ticket {i}")).collect();
    format!(
        "version: 1\nname: p\nsteps:\n  - id: rows\n    decompose:\n      items: {}\n  \
         - id: labels\n    fan_out:\n      over: rows\n      instructions: \"Label {{{{ item }}}}.\"\n      \
         extensions: []\n{step_keys}",
        serde_json::to_string(&items).expect("items")
    )
}

fn report(dir: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(dir.join("out/report.json")).expect("report.json");
    serde_json::from_str(&text).expect("report is JSON")
}

/// The output limit a request carried (either API's name for it).
fn limit_of(body: &Value) -> Option<u64> {
    body.get("max_tokens")
        .or_else(|| body.get("max_completion_tokens"))
        .and_then(Value::as_u64)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fan_out_learns_its_output_limit_from_its_first_answer() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("billing"))).await;
    let out = openai(&server)
        .write_raw("p.yaml", &fan_out(12, ""))
        .args(["run", "p.yaml", "--out", "out", "--concurrency", "1"])
        .run();
    let requests = chats(&server);
    assert_eq!(requests.len(), 12);
    // The first goes with summon's runaway guard for a local server; the others carry what
    // it needed (one token), twice over plus 32, in steps of 16.
    assert_eq!(limit_of(&requests[0].body), Some(4096));
    for request in &requests[1..] {
        assert_eq!(limit_of(&request.body), Some(48), "{:#}", request.body);
    }
    let caps = &report(&out.dir)["output_limits"]["labels"];
    assert_eq!(caps["source"], "learned", "{caps:#}");
    assert_eq!(caps["smallest"], 48);
    assert_eq!(caps["largest"], 4096);
    assert_eq!(caps["resent"], 0);
    assert!(
        out.stderr
            .contains("output limits: labels 48–4,096 tokens (learned"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_explicit_limit_is_sent_as_given_and_nothing_waits_to_learn() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("billing"))).await;
    let out = openai(&server)
        .write_raw("p.yaml", &fan_out(4, "    max_output_tokens: 4000\n"))
        .args(["run", "p.yaml", "--out", "out"])
        .run();
    for request in chats(&server) {
        assert_eq!(limit_of(&request.body), Some(4000));
    }
    assert_eq!(
        report(&out.dir)["output_limits"]["labels"]["source"],
        "explicit"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_schema_that_bounds_the_answer_bounds_the_limit() {
    let server =
        MockServer::start(MockConfig::new().default_reply(Reply::text(r#"{"label": "billing"}"#)))
            .await;
    // The schema goes under `fan_out:`, beside `extensions: []`.
    let pipeline = fan_out(3, "").replace(
        "      extensions: []\n",
        "      extensions: []\n      schema:\n        type: object\n        \
         additionalProperties: false\n        required: [label]\n        properties:\n          \
         label: {enum: [bug, billing, feature-request]}\n",
    );
    let out = openai(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--out", "out"])
        .run();
    // {"label":"feature-request"} is 28 characters: 2 × 28 + 64.
    for request in chats(&server) {
        assert_eq!(limit_of(&request.body), Some(120), "{:#}", request.body);
    }
    assert_eq!(
        report(&out.dir)["output_limits"]["labels"]["source"],
        "schema"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dry_run_says_which_limit_and_why() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = openai(&server)
        .write_raw("p.yaml", &fan_out(3, ""))
        .args(["run", "p.yaml", "--dry-run"])
        .run();
    assert!(
        out.stdout.contains(
            "output limit: 4,096 tokens for the first answer (summon's runaway guard for a \
             local server), then learned from the step's answers"
        ),
        "{}",
        out.stdout
    );
    assert!(chats(&server).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_wait_for_the_providers_request_limit_instead_of_429s() {
    // 600 requests a minute: a minute's burst, then 10 a second. 640 tasks overdraw the
    // burst: the last of them wait for the bucket to refill.
    let server = MockServer::start(
        MockConfig::new()
            .default_reply(Reply::text("ok"))
            .ration(Ration::openai(600, 100_000_000)),
    )
    .await;
    let out = openai(&server)
        .write_raw("p.yaml", &fan_out(640, ""))
        .args(["run", "p.yaml", "--out", "out", "--concurrency", "64"])
        .run();
    let stats = server.ration_stats();
    assert_eq!(stats.admitted, 640, "{stats:?}");
    // Held by the headers' numbers, not sent into 429s: at most 2 % of the requests (a
    // request whose answer refilled the bucket a hair late may still meet one).
    assert!(stats.limited * 50 <= stats.admitted, "{stats:?}");
    let limits = &report(&out.dir)["rate_limits"]["openai"];
    assert_eq!(limits["rate_limited"], json!(stats.limited));
    assert_eq!(
        limits["provider_limits"],
        json!([
            ["requests_per_minute", 600],
            ["tokens_per_minute", 100_000_000]
        ])
    );
    // Whether the tail waits depends on how fast the machine runs the fan-out (the bucket
    // refills 10 a second meanwhile); when it does, the limit is named.
    if limits["held"].as_u64().unwrap_or(0) > 0 {
        assert_eq!(
            limits["binding"], "the provider's requests per minute (600)",
            "{limits:#}"
        );
        assert!(
            out.stderr
                .contains("held by the provider's requests per minute (600) for"),
            "{}",
            out.stderr
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_output_tokens_are_not_held_at_summons_default() {
    // 20,000 output tokens a minute: the first request holds 8,192 until its answer; with
    // 8,192 on every request 19 more would overdraw it nine times over.
    let server = MockServer::start(
        MockConfig::new()
            .default_reply(Reply::text("billing"))
            .ration(Ration::anthropic(10_000, 10_000_000, 20_000)),
    )
    .await;
    let out = anthropic(&server)
        .write_raw("p.yaml", &fan_out(20, ""))
        .args(["run", "p.yaml", "--out", "out", "--concurrency", "20"])
        .run();
    let stats = server.ration_stats();
    assert_eq!(stats.admitted, 20, "{stats:?}");
    assert_eq!(stats.limited, 0, "{stats:?}");
    let requests = chats(&server);
    assert_eq!(limit_of(&requests[0].body), Some(8192));
    assert!(
        requests[1..].iter().all(|r| limit_of(&r.body) == Some(48)),
        "{:?}",
        requests
            .iter()
            .map(|r| limit_of(&r.body))
            .collect::<Vec<_>>()
    );
    assert!(stats.output_held <= 8192 + 19 * 48, "{stats:?}");
    assert_eq!(
        report(&out.dir)["output_limits"]["labels"]["source"],
        "learned"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_configured_limit_that_is_not_a_number_is_refused_at_its_line() {
    let server = MockServer::start(MockConfig::new()).await;
    openai(&server)
        .env("SUMMON_TRUST_PROJECT", "1")
        .write(
            "summon.yaml",
            "
            providers:
              openai:
                output_tokens_per_minute: lots
            ",
        )
        .write_raw("p.yaml", &fan_out(2, ""))
        .args(["run", "p.yaml"])
        .code(1)
        .stderr_has("summon.yaml:3:31: error: `providers.openai.output_tokens_per_minute`")
        .run();
    assert!(chats(&server).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_cut_off_at_a_learned_limit_is_sent_again_and_kept_whole() {
    // The first answer is one token; the others run to 1,500 tokens (6,000 characters), far
    // past the limit the first one taught. The mock cuts an answer at the request's limit.
    let long = "x".repeat(6000);
    let server = MockServer::start(MockConfig::new().cut_at_max_tokens(true).rule(
        move |request| {
            let text = request.last_user_text().unwrap_or_default();
            if text.contains("ticket 0.") {
                Reply::text("ok")
            } else {
                Reply::text(long.clone())
            }
        },
    ))
    .await;
    let out = openai(&server)
        .write_raw("p.yaml", &fan_out(5, ""))
        .args(["run", "p.yaml", "--out", "out", "--concurrency", "1"])
        .run();
    let results = std::fs::read_to_string(out.dir.join("out/results.jsonl")).expect("results");
    let rows: Vec<Value> = results
        .lines()
        .map(|l| serde_json::from_str(l).expect("row"))
        .collect();
    assert_eq!(rows.len(), 5);
    for row in &rows {
        assert_eq!(row["status"], "completed", "{row:#}");
        let output = row["output"].as_str().unwrap_or_default();
        assert!(output == "ok" || output.len() == 6000, "{}", output.len());
    }
    // The second task is cut at 48 and sent again with 4,096; by then the step knows its
    // answers need more, and the later tasks go with a limit that fits them whole.
    let limits: Vec<Option<u64>> = chats(&server).iter().map(|r| limit_of(&r.body)).collect();
    assert_eq!(
        limits[..3],
        [Some(4096), Some(48), Some(4096)],
        "{limits:?}"
    );
    assert!(limits[3..].iter().all(|l| *l == Some(3040)), "{limits:?}");
    let caps = &report(&out.dir)["output_limits"]["labels"];
    assert_eq!(caps["resent"], 1, "{caps:#}");
    assert_eq!(caps["longest_answer"], 1500, "{caps:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shard_gets_its_share_of_a_configured_limit() {
    let config = "
        providers:
          openai:
            requests_per_minute: 600
            tokens_per_minute: 10000
        ";
    let run = |server: &MockServer, config: &str| {
        openai(server)
            .write("summon.yaml", config)
            .write_raw("p.yaml", &fan_out(8, ""))
            .args(["run", "p.yaml", "--out", "out", "--shard", "1/2"])
            .run()
    };
    // One key, two shards: each has half of every configured limit.
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let shared = run(&server, config);
    assert!(!chats(&server).is_empty());
    assert_eq!(
        report(&shared.dir)["rate_limits"]["openai"]["configured_limits"],
        json!([["requests_per_minute", 300], ["tokens_per_minute", 5000]])
    );
    // A key per shard: the whole limits.
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let own = run(
        &server,
        &format!("{}    limits_per: shard\n", support::unindent(config)),
    );
    assert_eq!(
        report(&own.dir)["rate_limits"]["openai"]["configured_limits"],
        json!([["requests_per_minute", 600], ["tokens_per_minute", 10000]])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_output_limit_above_the_keys_whole_minute_is_lowered_to_it() {
    // 4,000 output tokens a minute, below Anthropic's default 8,192: a request asking for
    // 8,192 is refused however long it waits. The first 429 names the limit; from then on
    // every request asks for what the key admits, and the run finishes.
    let server = MockServer::start(
        MockConfig::new()
            .default_reply(Reply::text("billing"))
            .ration(Ration::anthropic(10_000, 10_000_000, 4_000)),
    )
    .await;
    let out = anthropic(&server)
        .env("SUMMON_RETRY_BASE_MS", "1")
        .write_raw("p.yaml", &fan_out(10, ""))
        .args(["run", "p.yaml", "--out", "out", "--concurrency", "10"])
        .run();
    assert_eq!(out.code, 0, "{}", out.stderr);
    let stats = server.ration_stats();
    assert_eq!(stats.admitted, 10, "{stats:?}");
    assert_eq!(stats.limited, 1, "{stats:?}");
    let limits: Vec<Option<u64>> = chats(&server).iter().map(|r| limit_of(&r.body)).collect();
    assert_eq!(limits[0], Some(8192), "{limits:?}");
    assert!(
        limits[1..].iter().all(|l| l.is_some_and(|l| l <= 4000)),
        "{limits:?}"
    );
    assert!(
        out.stderr
            .contains("output limit lowered from 8192 to 4000 tokens"),
        "{}",
        out.stderr
    );

    // OpenAI: an explicit limit above the tokens a minute, less the input.
    let server = MockServer::start(
        MockConfig::new()
            .default_reply(Reply::text("billing"))
            .ration(Ration::openai(10_000, 3_000)),
    )
    .await;
    let out = openai(&server)
        .env("SUMMON_RETRY_BASE_MS", "1")
        .write_raw("p.yaml", &fan_out(3, ""))
        .args(["run", "p.yaml", "--out", "out", "--concurrency", "1"])
        .args(["--max-output-tokens", "5000"])
        .run();
    assert_eq!(out.code, 0, "{}", out.stderr);
    let requests = chats(&server);
    let lowered = requests
        .iter()
        .filter_map(|r| limit_of(&r.body))
        .filter(|l| *l < 3000)
        .count();
    assert_eq!(lowered, requests.len() - 1, "{requests:#?}");
    assert_eq!(server.ration_stats().limited, 1);
}
