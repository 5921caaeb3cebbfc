//! What bounds an answer, as sent with every request: `stop` sequences (a recipe's
//! `settings.stop`, a pipeline's `settings.stop` and a step's `stop`, `delegate --stop`), and
//! the output limit, summon's default when none is set.

use crate::support;

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::{Test, chats};

fn project(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test")
        .env("SUMMON_MODEL", "mock-model")
}

const RECIPE: &str = "
version: 1.0.0
title: Stops
description: d
prompt: Say it.
settings:
  stop: [\"\\n\\n\", END]
";

fn stops(server: &MockServer) -> Vec<Value> {
    chats(server)
        .iter()
        .map(|r| r.body["stop"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_recipes_stop_sequences_are_sent_and_delegate_stop_replaces_them() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let t = project(&server).write("recipes/stops.yaml", RECIPE);
    let run = |args: &[&str]| {
        let output = t.command().args(args).output().expect("run summon");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    run(&["delegate", "--source", "stops"]);
    run(&["delegate", "--source", "stops", "--stop", "STOP"]);
    run(&["delegate", "--instructions", "x"]);
    run(&[
        "delegate",
        "--instructions",
        "x",
        "--stop",
        "a",
        "--stop",
        "b",
    ]);
    assert_eq!(
        stops(&server),
        [
            json!(["\n\n", "END"]),
            json!(["STOP"]),
            Value::Null,
            json!(["a", "b"])
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pipelines_stop_applies_to_every_step_and_a_steps_stop_replaces_it() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let pipeline = "
version: 1
name: p
settings:
  stop: END
steps:
  - id: a
    delegate:
      instructions: first
  - id: b
    delegate:
      instructions: 'second after {{ steps.a.output }}'
    stop: [\"###\", \"\\n\"]
";
    project(&server)
        .write("p.yaml", pipeline)
        .args(["run", "p.yaml", "--quiet"])
        .run();
    assert_eq!(stops(&server), [json!(["END"]), json!(["###", "\n"])]);
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_sequences_are_checked_before_any_request() {
    let server = MockServer::start(MockConfig::new()).await;
    let too_many = [
        "--stop", "a", "--stop", "b", "--stop", "c", "--stop", "d", "--stop", "e",
    ];
    project(&server)
        .args(["delegate", "--instructions", "x"])
        .args(too_many)
        .code(1)
        .stderr_has("providers take at most 4 stop sequences")
        .run();
    project(&server)
        .write(
            "recipes/bad.yaml",
            "version: 1.0.0\ntitle: t\ndescription: d\nprompt: p\nsettings:\n  stop: ['']\n",
        )
        .args(["delegate", "--source", "bad"])
        .code(1)
        .stderr_has("`settings.stop` must not be an empty string")
        .run();
    project(&server)
        .write(
            "p.yaml",
            "version: 1\nname: p\nsteps:\n  - id: a\n    delegate:\n      instructions: x\n    stop: [a, b, c, d, e]\n",
        )
        .args(["run", "p.yaml"])
        .code(1)
        .stderr_has("lists 5 sequences; providers take at most 4")
        .run();
    assert_eq!(server.request_count(), 0);
}

/// Every request carries an output limit: summon's default (4096 for OpenAI-compatible
/// servers) when none is set, lowered to what a known context window leaves.
#[tokio::test(flavor = "multi_thread")]
async fn every_request_has_an_output_limit_fitted_to_a_known_window() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let t = project(&server).write(
        ".config/summon/config.yaml",
        "models:\n  small-model:\n    context_window: 3000\n",
    );
    let run = |args: &[&str]| {
        let output = t.command().args(args).output().expect("run summon");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    run(&["delegate", "--instructions", "x"]);
    run(&["delegate", "--instructions", "x", "--model", "small-model"]);
    run(&[
        "delegate",
        "--instructions",
        "x",
        "--max-output-tokens",
        "9000",
    ]);
    let limits: Vec<Value> = chats(&server)
        .iter()
        .map(|r| r.body["max_tokens"].clone())
        .collect();
    assert_eq!(limits[0], 4096);
    let fitted = limits[1].as_u64().expect("a limit");
    // What the window leaves after the prompt (about 1,000 tokens with the tools).
    assert!(fitted < 2500 && fitted > 1000, "{limits:?}");
    assert_eq!(limits[2], 9000);
}

/// OpenAI's reasoning models refuse `max_tokens` and ask for `max_completion_tokens`: the
/// limit is sent under that name from then on, by every task of the run.
#[tokio::test(flavor = "multi_thread")]
async fn a_provider_that_wants_max_completion_tokens_gets_it() {
    let server = MockServer::start(MockConfig::new().rule(|request| {
        if request.body.get("max_tokens").is_some() {
            Reply::status(
                400,
                r#"{"error":{"message":"Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.","type":"invalid_request_error","param":"max_tokens","code":"unsupported_parameter"}}"#,
            )
        } else {
            Reply::text("{\"label\": \"ok\"}")
        }
    }))
    .await;
    let pipeline = "
version: 1
name: p
steps:
  - id: rows
    decompose:
      items: [a, b, c, d]
  - id: each
    fan_out:
      over: rows
      instructions: 'Label {{ item }}'
";
    let out = project(&server)
        .write("p.yaml", pipeline)
        .args(["run", "p.yaml", "--quiet", "--concurrency", "4"])
        .run();
    let sent = chats(&server);
    let answered: Vec<_> = sent
        .iter()
        .filter(|r| r.body.get("max_tokens").is_none())
        .collect();
    assert_eq!(answered.len(), 4, "{}", out.stderr);
    // Under its new name, with the limit the step had reached: summon's local guard before
    // the first answer, the one learned from it after.
    let limits: Vec<u64> = answered
        .iter()
        .map(|r| r.body["max_completion_tokens"].as_u64().expect("the limit"))
        .collect();
    assert!(limits.contains(&4096), "{limits:?}");
    assert!(limits.iter().all(|l| [4096, 48].contains(l)), "{limits:?}");
    // At most the tasks in flight at the first refusal were refused.
    assert!(sent.len() <= 8, "{}", sent.len());
}

/// An answer larger than summon reads fails the task with the provider and the limit named,
/// is not asked again (the same request would bring the same answer), and nothing of it is
/// printed: 3 MiB against `SUMMON_MAX_RESPONSE_MB=1`; the same answer under the default
/// (64 MiB) is read whole.
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_larger_than_the_limit_fails_naming_the_provider_and_the_limit() {
    let big = "x".repeat(3 * 1024 * 1024);
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text(big.clone()))).await;
    let t = project(&server);
    // A limit that is not a whole number of MiB is refused before any request.
    let output = t
        .command()
        .args(["delegate", "--instructions", "x"])
        .env("SUMMON_MAX_RESPONSE_MB", "1G")
        .output()
        .expect("run summon");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("SUMMON_MAX_RESPONSE_MB must be a whole number of MiB above 0, found `1G`"),
        "{stderr}"
    );
    assert_eq!(chats(&server).len(), 0);
    let output = t
        .command()
        .args(["delegate", "--instructions", "x"])
        .env("SUMMON_MAX_RESPONSE_MB", "1")
        .output()
        .expect("run summon");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("provider `openai`")
            && stderr.contains("larger than 1 MiB")
            && stderr.contains("SUMMON_MAX_RESPONSE_MB"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&output.stdout).contains("xxxx"));
    assert_eq!(
        chats(&server).len(),
        1,
        "the refused answer was asked again"
    );
    let output = t
        .command()
        .args(["delegate", "--instructions", "x"])
        .output()
        .expect("run summon");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains(&big[..1000]));
}
