//! Prices and the spend cap: the built-in price table (`summon doctor --prices`), the one
//! wording of a model without a price, and `--max-cost` at each of its boundaries with the
//! exact number of requests sent.

use crate::support;

use serde_json::json;
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::{Test, chats, read_json, results};

/// Prices that make the arithmetic exact: input is free and every output token costs
/// $0.001, so an answer of 400 characters (100 tokens at the mock's four bytes a token) at
/// an output limit of 100 tokens costs exactly what was held for it: $0.10.
const OUTPUT_PRICED: &str = "
prices:
  mock-model: {input: 0, output: 1000}
";

/// Five single-turn tasks, all started at once, each held at $0.10.
const FIVE: &str = "
version: 1
name: five
settings:
  max_turns: 1
  max_output_tokens: 100
  concurrency: 5
steps:
  - id: list
    decompose:
      items: [a, b, c, d, e]
  - id: each
    fan_out:
      over: list
      instructions: \"Say something about {{ item }}\"
";

fn answer() -> Reply {
    Reply::text("x".repeat(400))
}

fn project(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
        .write("summon.yaml", OUTPUT_PRICED)
}

/// Runs summon in `t`'s project (again): its exit code and standard error.
fn summon(t: &Test, args: &[&str]) -> (i32, String) {
    let output = t.command().args(args).output().expect("run summon");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!stderr.contains("panicked at"), "{stderr}");
    (output.status.code().unwrap_or(-1), stderr)
}

#[tokio::test(flavor = "multi_thread")]
async fn no_task_starts_that_could_cross_the_cap_and_a_higher_cap_resumes_the_rest() {
    let server = MockServer::start(MockConfig::new().default_reply(answer())).await;
    let t = project(&server).write("p.yaml", FIVE);
    let dir = t.path().join("out");

    // $0.25 holds two tasks at $0.10; the third would cross it and does not start.
    let run = ["run", "p.yaml", "--out", "out", "--quiet"];
    let (code, stderr) = summon(&t, &[&run[..], &["--max-cost", "0.25"]].concat());
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains("budget reached: $0.20 of $0.25"),
        "{stderr}"
    );
    assert!(stderr.contains("--resume --max-cost MORE"), "{stderr}");
    assert!(
        stderr.contains("$0.20 of $0.25 cap"),
        "the summary shows spent / cap: {stderr}"
    );
    assert_eq!(chats(&server).len(), 2, "{stderr}");
    let lines = results(&dir);
    assert_eq!(
        lines.len(),
        2,
        "tasks that did not start are not results: {lines:?}"
    );
    assert!(
        lines.iter().all(|l| l["status"] == "completed"),
        "{lines:?}"
    );
    let report = read_json(&dir.join("report.json"));
    assert_eq!(
        report["budget"],
        json!({"cap_usd": 0.25, "spent_usd": 0.2, "reached": true}),
        "{report:#}"
    );
    let page = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(
        page.contains(r#""budget":{"cap_usd":0.25,"spent_usd":0.2,"reached":true}"#),
        "report.html carries spent / cap"
    );

    // Resumed with the cap it was started with (journaled with the run), nothing more fits:
    // no request.
    let (code, stderr) = summon(&t, &[&run[..], &["--resume"]].concat());
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains("budget reached: $0.20 of $0.25"),
        "{stderr}"
    );
    assert_eq!(chats(&server).len(), 2, "{stderr}");

    // A higher cap continues the run: what it spent before counts, the other three run.
    let (code, stderr) = summon(&t, &[&run[..], &["--resume", "--max-cost", "0.5"]].concat());
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(chats(&server).len(), 5, "{stderr}");
    let report = read_json(&dir.join("report.json"));
    assert_eq!(report["budget"]["reached"], false, "{report:#}");
    assert!(
        (report["budget"]["spent_usd"].as_f64().unwrap() - 0.5).abs() < 1e-9,
        "{report:#}"
    );
    assert_eq!(results(&dir).len(), 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cap_exactly_at_the_worst_case_lets_every_task_run() {
    let server = MockServer::start(MockConfig::new().default_reply(answer())).await;
    // Five tasks at $0.10 each fit $0.50 exactly (the boundary is inclusive).
    project(&server)
        .write("p.yaml", FIVE)
        .args(["run", "p.yaml", "--quiet", "--max-cost", "0.5"])
        .run();
    assert_eq!(chats(&server).len(), 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn settings_max_cost_and_the_config_default_cap_a_run_and_the_flag_overrides_them() {
    let server = MockServer::start(MockConfig::new().default_reply(answer())).await;
    let capped = FIVE.replace("  concurrency: 5\n", "  concurrency: 5\n  max_cost: 0.1\n");
    let t = project(&server).write("p.yaml", &capped);
    // The progress lines (no terminal) show the run's spend against its cap.
    let out = t
        .args(["run", "p.yaml", "--junit", "junit.xml"])
        .code(3)
        .stderr_has("budget reached: $0.10 of $0.10")
        .stderr_has("[summon] spent $0.10 of $0.10 cap")
        .stderr_has("no new task starts; finishing the tasks in flight")
        .run();
    let junit = std::fs::read_to_string(out.dir.join("junit.xml")).unwrap();
    assert!(
        junit.contains(r#"<property name="run_spent_usd" value="0.100000"/>"#)
            && junit.contains(r#"<property name="run_max_cost_usd" value="0.1"/>"#),
        "{junit}"
    );
    assert_eq!(chats(&server).len(), 1);

    let server = MockServer::start(MockConfig::new().default_reply(answer())).await;
    let config = format!("{OUTPUT_PRICED}max_cost: 0.3\n");
    project(&server)
        .write("summon.yaml", &config)
        .write("p.yaml", FIVE)
        .args(["run", "p.yaml", "--quiet"])
        .code(3)
        .stderr_has("budget reached: $0.30 of $0.30")
        .run();
    assert_eq!(chats(&server).len(), 3);

    // The flag is over both.
    let server = MockServer::start(MockConfig::new().default_reply(answer())).await;
    project(&server)
        .write("summon.yaml", &config)
        .write("p.yaml", &capped)
        .args(["run", "p.yaml", "--quiet", "--max-cost", "0.2"])
        .code(3)
        .stderr_has("budget reached: $0.20 of $0.20")
        .run();
    assert_eq!(chats(&server).len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_whose_input_grew_past_the_cap_stops_before_its_next_request() {
    // The model reads a big file, then would answer: the file's 50,000 tokens at $100 per
    // million make the second request cost up to $5, over the $2 cap.
    let server = MockServer::start(MockConfig::new().rule(|request| {
        let answered = request.body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        if answered {
            Reply::text("done")
        } else {
            Reply::tool_call("read_file", json!({"path": "big.txt"}))
        }
    }))
    .await;
    let out = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
        .write(
            "summon.yaml",
            "prices:\n  mock-model: {input: 100, output: 0}\n",
        )
        .write_raw("big.txt", &"word ".repeat(40_000))
        .write(
            "p.yaml",
            "
            version: 1
            name: grows
            settings:
              max_turns: 3
            steps:
              - id: read
                delegate:
                  instructions: Read big.txt and summarise it.
                tools: [read_file]
            ",
        )
        .args([
            "run",
            "p.yaml",
            "--out",
            "out",
            "--quiet",
            "--max-cost",
            "2",
        ])
        .code(3)
        .stderr_has("budget reached: stopped before its next request")
        .run();
    assert_eq!(chats(&server).len(), 1, "{}", out.stderr);
    let lines = results(&out.dir.join("out"));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["status"], "failed", "{lines:?}");
    assert_eq!(
        lines[0]["turns"], 1,
        "the refused request is not a turn: {lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cap_with_a_model_without_a_price_is_refused_before_any_request() {
    let server = MockServer::start(MockConfig::new().default_reply(answer())).await;
    let out = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
        .write("p.yaml", FIVE)
        .args(["run", "p.yaml", "--max-cost", "1"])
        .code(1)
        .stderr_has("step `each`: no price for model `mock-model`, so the spend cap of $1.00 cannot be kept")
        .stderr_has("add it to `prices:` in summon.yaml")
        .run();
    assert!(server.requests().is_empty(), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_without_a_price_says_no_price_once_with_how_to_add_one() {
    let server = MockServer::start(MockConfig::new().default_reply(answer())).await;
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
        .write("p.yaml", FIVE)
        .args(["run", "p.yaml", "--quiet"])
        .stderr_has("tokens, no price, ")
        .stderr_has("summon: no price for `mock-model`: add it to `prices:` in summon.yaml")
        .run();
}

#[test]
fn doctor_shows_the_built_in_price_table_under_the_config_file() {
    // Trusted: an untrusted project's file may not lower gpt-5's price.
    let out = Test::new()
        .env("SUMMON_TRUST_PROJECT", "1")
        .write(
            "summon.yaml",
            "prices:\n  gpt-5: {input: 1, output: 2}\n  local: {input: 0.5, output: 0.5}\n",
        )
        .args(["doctor", "--prices", "--json"])
        .run();
    let table = out.json();
    assert_eq!(table["unit"], "USD per million tokens");
    assert!(
        table["date"].as_str().is_some_and(|d| d.len() == 10),
        "{table:#}"
    );
    assert!(
        table["sources"][0]
            .as_str()
            .unwrap()
            .starts_with("https://")
    );
    let models = &table["models"];
    assert_eq!(models["gpt-5-mini"]["from"], "built-in");
    assert_eq!(models["gpt-5-mini"]["flex"]["output"], 1.0);
    assert_eq!(models["claude-haiku-4-5"]["batch"]["input"], 0.5);
    assert!(
        models["claude-haiku-4-5"].get("flex").is_none(),
        "{table:#}"
    );
    // The config file's entry replaces the built-in standard price, key by key.
    assert_eq!(models["gpt-5"]["from"], "config");
    assert_eq!(models["gpt-5"]["standard"]["output"], 2.0);
    assert_eq!(models["local"]["standard"]["input"], 0.5);

    Test::new()
        .args(["doctor", "--prices"])
        .stdout_has(
            "claude-sonnet-4-5\n  standard  $3 in, $0.3 cached, $3.75 cache write, $15 out\n",
        )
        .stdout_has("  batch     $1.5 in, $0.15 cached, $1.875 cache write, $7.5 out\n")
        .run();

    // The check of the setup names the model's price and where it comes from.
    Test::new()
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "gpt-5-mini-2025-08-07")
        .args(["doctor", "--offline"])
        .stdout_has("price of `gpt-5-mini-2025-08-07`: $0.25 in, $0.025 cached, $2 out per million tokens (from the built-in table of ")
        .run();
}

/// Three single-turn tasks through the provider's batch API (`tier: batch`, which is `backend:
/// batch`), each at an output limit of 100
/// tokens: at batch prices ($0.0005 an output token) the batch is estimated at up to $0.15.
const BATCHED: &str = "
version: 1
name: batched
settings:
  max_output_tokens: 100
steps:
  - id: list
    decompose:
      items: [a, b, c]
  - id: each
    tier: batch
    fan_out:
      over: list
      instructions: \"Say something about {{ item }}\"
";

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_whose_estimate_crosses_the_cap_is_not_sent_and_a_higher_cap_sends_it() {
    let server = MockServer::start(MockConfig::new().default_reply(answer())).await;
    let t = project(&server)
        .env("SUMMON_BATCH_POLL_MS", "5")
        .write("p.yaml", BATCHED);
    let run = ["run", "p.yaml", "--out", "out", "--quiet"];
    let (code, stderr) = summon(&t, &[&run[..], &["--max-cost", "0.1"]].concat());
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains(
            "a batch of 3 tasks estimated at up to $0.15 would cross the spend cap; not sent"
        ),
        "{stderr}"
    );
    assert!(server.requests().is_empty(), "nothing is uploaded or sent");
    assert!(results(&t.path().join("out")).is_empty());

    // Resumed with a cap the estimate fits: the batch goes, at batch prices.
    let (code, stderr) = summon(
        &t,
        &[&run[..], &["--resume", "--max-cost", "0.15"]].concat(),
    );
    assert_eq!(code, 0, "{stderr}");
    let lines = results(&t.path().join("out"));
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines.iter().all(|l| l["status"] == "completed"),
        "{lines:?}"
    );
    assert!(chats(&server).is_empty(), "no live request");
    let report = read_json(&t.path().join("out/report.json"));
    // Each answer is 100 output tokens at $0.0005.
    assert!(
        (report["budget"]["spent_usd"].as_f64().unwrap() - 0.15).abs() < 1e-9,
        "{report:#}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delegation_under_a_cap_starts_only_when_its_worst_case_fits() {
    let server = MockServer::start(MockConfig::new().default_reply(answer())).await;
    // Two turns at 100 output tokens: up to $0.20.
    let delegate = [
        "delegate",
        "--instructions",
        "Say something",
        "--max-turns",
        "2",
        "--max-output-tokens",
        "100",
    ];
    project(&server)
        .args(delegate)
        .args(["--max-cost", "0.15"])
        .code(3)
        .stderr_has("budget reached: not started ($0.00 of $0.15 spent)")
        .run();
    assert!(server.requests().is_empty());
    project(&server)
        .args(delegate)
        .args(["--max-cost", "0.2"])
        .stdout_has(&"x".repeat(400))
        .run();
    assert_eq!(chats(&server).len(), 1);
    // Without a price the cap cannot be kept: refused before any request.
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
        .args(delegate)
        .args(["--max-cost", "1"])
        .code(1)
        .stderr_has("no price for model `mock-model`, so the spend cap of $1.00 cannot be kept")
        .run();
    assert_eq!(chats(&server).len(), 1);
}

/// One task at `tier` (with `fallback`), its answer 400 characters.
fn tiered(tier: &str, fallback: bool) -> String {
    let fallback = if fallback {
        "    flex_fallback: standard\n"
    } else {
        ""
    };
    format!(
        "version: 1\nname: tiered\nsettings:\n  max_output_tokens: 100\nsteps:\n  - id: one\n    delegate:\n      instructions: Say something\n    tier: {tier}\n{fallback}"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flex_step_asks_for_flex_and_is_priced_at_the_tier_that_served_it() {
    let server = MockServer::start(MockConfig::new().default_reply(answer())).await;
    let t = project(&server).write("p.yaml", &tiered("flex", false));
    let (code, stderr) = summon(&t, &["run", "p.yaml", "--out", "out", "--quiet"]);
    assert_eq!(code, 0, "{stderr}");
    let sent = chats(&server);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].body["service_tier"], "flex");
    // 100 output tokens at flex: half of $0.001.
    let report = read_json(&t.path().join("out/report.json"));
    assert!(
        (report["total"]["cost_usd"].as_f64().unwrap() - 0.05).abs() < 1e-9,
        "{report:#}"
    );

    // A standard step sends no tier and is priced at standard.
    let server = MockServer::start(MockConfig::new().default_reply(answer())).await;
    let t = project(&server).write("p.yaml", &tiered("standard", false));
    let (code, stderr) = summon(&t, &["run", "p.yaml", "--out", "out", "--quiet"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(chats(&server)[0].body.get("service_tier").is_none());
    let report = read_json(&t.path().join("out/report.json"));
    assert!(
        (report["total"]["cost_usd"].as_f64().unwrap() - 0.1).abs() < 1e-9,
        "{report:#}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn flex_without_capacity_is_retried_at_flex_or_sent_at_standard_with_the_fallback() {
    let mock = || {
        let mut config = MockConfig::new().default_reply(answer());
        config.flex_unavailable = 1;
        config
    };
    // Retried with backoff, at flex: served flex, priced at flex.
    let server = MockServer::start(mock()).await;
    let t = project(&server)
        .env("SUMMON_RETRY_BASE_MS", "1")
        .write("p.yaml", &tiered("flex", false));
    let (code, stderr) = summon(&t, &["run", "p.yaml", "--out", "out", "--quiet"]);
    assert_eq!(code, 0, "{stderr}");
    let sent = server.requests();
    assert_eq!(sent.len(), 2, "{stderr}");
    assert!(sent.iter().all(|r| r.body["service_tier"] == "flex"));
    let report = read_json(&t.path().join("out/report.json"));
    assert_eq!(report["retries_by_class"]["rate_limited"], 1, "{report:#}");
    assert!((report["total"]["cost_usd"].as_f64().unwrap() - 0.05).abs() < 1e-9);

    // With `flex_fallback: standard`: sent again at once at the standard tier, priced so.
    let server = MockServer::start(mock()).await;
    let t = project(&server).write("p.yaml", &tiered("flex", true));
    let (code, stderr) = summon(&t, &["run", "p.yaml", "--out", "out"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("has no flex capacity now (429); sent at the standard tier"),
        "{stderr}"
    );
    let sent = server.requests();
    assert_eq!(sent.len(), 2, "{stderr}");
    assert_eq!(sent[0].body["service_tier"], "flex");
    assert!(sent[1].body.get("service_tier").is_none());
    let report = read_json(&t.path().join("out/report.json"));
    assert!(
        (report["total"]["cost_usd"].as_f64().unwrap() - 0.1).abs() < 1e-9,
        "{report:#}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tier_the_provider_or_model_refuses_is_an_error_at_its_line_before_the_run() {
    let server = MockServer::start(MockConfig::new().default_reply(answer())).await;
    // gpt-4o is listed without a flex tier.
    project(&server)
        .env("SUMMON_MODEL", "gpt-4o")
        .write("p.yaml", &tiered("flex", false))
        .args(["run", "p.yaml"])
        .code(1)
        .stderr_has(
            "p.yaml:9:11: error: step `one`: model `gpt-4o` is not offered at the `flex` tier",
        )
        .run();
    // Anthropic has no flex or priority service tier.
    Test::new()
        .env("SUMMON_PROVIDER", "anthropic")
        .env("ANTHROPIC_BASE_URL", &server.url_anthropic())
        .env("ANTHROPIC_API_KEY", "sk-ant-test-0123456789abcdef")
        .env("SUMMON_MODEL", "claude-haiku-4-5")
        .write("p.yaml", &tiered("priority", false))
        .args(["run", "p.yaml"])
        .code(1)
        .stderr_has("has no `priority` service tier")
        .run();
    assert!(server.requests().is_empty());
    // A delegation asks for its tier too; batch is not one of them.
    project(&server)
        .args(["delegate", "--instructions", "hi", "--tier", "flex"])
        .run();
    assert_eq!(chats(&server)[0].body["service_tier"], "flex");
    project(&server)
        .args(["delegate", "--instructions", "hi", "--tier", "batch"])
        .code(1)
        .stderr_has("a delegation is one live request at a time")
        .run();
}

#[test]
fn a_tier_is_one_of_four_words_and_batch_only_on_a_fan_out() {
    Test::new()
        .write("p.yaml", &tiered("cheap", false))
        .args(["validate", "p.yaml"])
        .code(1)
        .stderr_has(
            "`steps[0].tier` must be `standard` or `flex` or `priority` or `batch`, found `cheap`",
        )
        .run();
    Test::new()
        .write("p.yaml", &tiered("batch", false))
        .args(["validate", "p.yaml"])
        .code(1)
        .stderr_has("`tier: batch` applies only to fan_out steps; step `one` is a delegate step")
        .run();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dry_run_prices_each_step_at_its_tier_and_says_when_the_estimate_crosses_the_cap() {
    let server = MockServer::start(MockConfig::new().default_reply(answer())).await;
    // Five first requests at 100 output tokens: up to $0.50 at standard, $0.25 at flex.
    let t = project(&server).write("p.yaml", FIVE);
    let out = t
        .args(["run", "p.yaml", "--dry-run", "--max-cost", "0.3"])
        .stdout_has("      cost at the standard tier: ~$0.0000 input, up to $0.5000 output (first requests)\n")
        .stdout_has("Spend cap: $0.30; the estimate already crosses it")
        .run();
    assert!(server.requests().is_empty(), "{}", out.stdout);

    let flex = FIVE.replace("  concurrency: 5\n", "  concurrency: 5\n  tier: flex\n");
    let out = project(&server)
        .write("p.yaml", &flex)
        .args(["run", "p.yaml", "--dry-run", "--json", "--max-cost", "0.3"])
        .run();
    let plan = out.json();
    let each = plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "each")
        .unwrap();
    assert_eq!(each["tier"], "flex", "{plan:#}");
    assert!((each["estimated_cost_usd"]["output_max"].as_f64().unwrap() - 0.25).abs() < 1e-9);
    assert!((plan["estimated_cost_usd"].as_f64().unwrap() - 0.25).abs() < 1e-9);
    assert_eq!(plan["max_cost_usd"], 0.3);
    assert_eq!(plan["estimate_crosses_cap"], false);
    assert!(server.requests().is_empty());
}
