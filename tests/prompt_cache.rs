//! Prompt caching against the mock's caching rules (breakpoints, minimum length, prefix match,
//! readable once the writing response is sent): Anthropic breakpoints in a fan-out and in an
//! agent loop, OpenAI's stable prefix and `prompt_cache_key`, the warm-up of a fan-out, `cache:
//! false`, and the cache tokens and their cost in every output.

use crate::support;

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use summon_mock_llm::cache::anthropic_blocks;
use summon_mock_llm::{Api, MockConfig, MockServer, RecordedRequest, Reply};
use support::Test;

const KEY: &str = "sk-test-0123456789abcdefSECRET";
const CLAUDE: &str = "claude-sonnet-4-5";
/// The mock's latency in the warm-up tests: long enough to tell "after the first answer" from
/// "together with the first request" on a loaded machine.
const LATENCY: Duration = Duration::from_millis(400);

fn anthropic_project(server: &MockServer) -> Test {
    Test::new()
        .env("ANTHROPIC_BASE_URL", &server.url_anthropic())
        .env("ANTHROPIC_API_KEY", KEY)
        .env("SUMMON_MODEL", CLAUDE)
}

fn openai_project(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
}

/// About 6,000 characters of shared reference text (1,500 tokens as the mock counts).
fn shared_context() -> String {
    (0..100)
        .map(|i| format!("Reference fact {i:03}: the widget ships in blue.\n"))
        .collect()
}

/// A fan-out step `each` over `n` items with the shared context, plus `extra` step keys.
fn fan_out(n: usize, extra: &str) -> String {
    let items: Vec<String> = (0..n).map(|i| format!("item{i:02}")).collect();
    format!(
        "version: 1\nname: cached\nsteps:\n  - id: list\n    decompose:\n      items: [{}]\n  - id: each\n    fan_out:\n      over: list\n      instructions: \"Classify {{{{ item }}}}\"\n      context: {}\n{extra}",
        items.join(", "),
        serde_json::to_string(&shared_context()).unwrap(),
    )
}

/// [`fan_out`] after a first request to the provider (a synthesize the fan-out reads): the
/// first request of a run goes alone until the provider answers, whatever the cache.
fn fan_out_after_hello(n: usize, extra: &str) -> String {
    let items: Vec<String> = (0..n).map(|i| format!("item{i:02}")).collect();
    format!(
        "version: 1\nname: cached\nsteps:\n  - id: hello\n    synthesize:\n      instructions: Hello\n  - id: list\n    decompose:\n      items: [{}]\n  - id: each\n    fan_out:\n      over: list\n      instructions: \"Classify {{{{ item }}}} ({{{{ steps.hello.output | length }}}})\"\n      context: {}\n{extra}",
        items.join(", "),
        serde_json::to_string(&shared_context()).unwrap(),
    )
}

/// The requests of the fan-out of [`fan_out_after_hello`].
fn classified(requests: Vec<RecordedRequest>) -> Vec<RecordedRequest> {
    requests
        .into_iter()
        .filter(|r| {
            r.last_user_text()
                .is_some_and(|text| text.contains("Classify"))
        })
        .collect()
}

fn chats(server: &MockServer, api: Api) -> Vec<RecordedRequest> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.api == api)
        .collect()
}

/// The results of step `step`, in item order.
fn results(dir: &Path, step: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("results.jsonl")).expect("results.jsonl");
    let mut lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .filter(|l: &Value| l["step"] == step)
        .collect();
    lines.sort_by_key(|l| l["index"].as_u64());
    lines
}

fn report(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).expect("report"))
        .expect("report.json is JSON")
}

/// The `cache_control` marks of a request, as (block index in cache order, prefix tokens).
fn breakpoints(request: &RecordedRequest) -> Vec<(usize, u64)> {
    anthropic_blocks(&request.body)
        .iter()
        .enumerate()
        .filter(|(_, b)| b.breakpoint)
        .map(|(i, b)| (i, b.prefix_tokens))
        .collect()
}

/// The number of tool definitions plus system blocks of an Anthropic request.
fn shared_blocks(request: &RecordedRequest) -> usize {
    let tools = request.body["tools"].as_array().map_or(0, Vec::len);
    let system = match &request.body["system"] {
        Value::Array(blocks) => blocks.len(),
        Value::String(_) => 1,
        _ => 0,
    };
    tools + system
}

fn u(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not a count: {value}"))
}

// ---------------------------------------------------------------------------------------------
// Anthropic breakpoints.

#[tokio::test(flavor = "multi_thread")]
async fn an_anthropic_fan_out_writes_the_shared_prefix_once_and_reads_it_in_every_later_task() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = anthropic_project(&server)
        .write_raw("p.yaml", &fan_out(5, "    concurrency: 1\n"))
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let requests = chats(&server, Api::Anthropic);
    assert_eq!(requests.len(), 5);
    // The end of the system prompt (instructions and context) is marked in every request, and
    // nothing after it in a task's first turn of a fan-out.
    let mut prefix = None;
    for request in &requests {
        let marks = breakpoints(request);
        assert!(!marks.is_empty() && marks.len() <= 4, "{marks:?}");
        let (last, tokens) = *marks.last().unwrap();
        assert_eq!(
            last + 1,
            shared_blocks(request),
            "the system block is the last mark"
        );
        assert!(tokens >= 1024, "the marked prefix can be cached: {tokens}");
        assert_eq!(*prefix.get_or_insert(tokens), tokens, "the same prefix");
        let system = request.body["system"].as_array().expect("system blocks");
        assert_eq!(
            system.last().unwrap()["cache_control"],
            json!({"type": "ephemeral"})
        );
        assert!(
            system.last().unwrap()["text"]
                .as_str()
                .unwrap()
                .contains("Reference fact 099")
        );
    }
    let prefix = prefix.unwrap();
    let lines = results(&out.dir.join("out"), "each");
    assert_eq!(lines.len(), 5);
    assert_eq!(u(&lines[0]["cache_write_tokens"]), prefix);
    assert_eq!(u(&lines[0]["cache_read_tokens"]), 0);
    for line in &lines[1..] {
        assert_eq!(u(&line["cache_read_tokens"]), prefix, "{line}");
        assert_eq!(u(&line["cache_write_tokens"]), 0, "{line}");
        assert!(
            u(&line["input_tokens"]) > prefix,
            "the input counts the cached part"
        );
    }
    let report = report(&out.dir.join("out"));
    for stats in [&report["steps"]["each"], &report["total"]] {
        assert_eq!(u(&stats["cache_read_tokens"]), 4 * prefix, "{stats}");
        assert_eq!(u(&stats["cache_write_tokens"]), prefix, "{stats}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_short_prefix_or_a_single_one_turn_request_carries_no_breakpoint() {
    let server = MockServer::start(MockConfig::new()).await;
    // One task, one turn possible: nothing would ever read the cache.
    anthropic_project(&server)
        .write(
            "p.yaml",
            &format!(
                "version: 1\nname: one\nsteps:\n  - id: once\n    delegate:\n      instructions: Answer.\n      context: {}\n    max_turns: 1\n",
                serde_json::to_string(&shared_context()).unwrap()
            ),
        )
        .args(["run", "p.yaml", "--quiet"])
        .run();
    // A fan-out whose shared prefix is below the model's minimum.
    anthropic_project(&server)
        .write_raw(
            "p.yaml",
            "version: 1\nname: short\nsteps:\n  - id: list\n    decompose:\n      items: [a, b, c]\n  - id: each\n    fan_out:\n      over: list\n      instructions: \"Say {{ item }}\"\n    max_turns: 1\n",
        )
        .env("SUMMON_MODEL", "claude-haiku-4-5")
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let requests = chats(&server, Api::Anthropic);
    assert_eq!(requests.len(), 4);
    for request in &requests {
        assert_eq!(breakpoints(request), Vec::new(), "{}", request.body);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_loop_reads_the_conversation_so_far_from_the_cache_every_turn() {
    agent_loop_reads_its_conversation("").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_last_turn_a_loop_may_take_reads_the_conversation_from_the_cache() {
    // Its fourth request is the last `max_turns` allows: no turn follows it, but it re-sends
    // what the third wrote and must carry a mark to read it.
    agent_loop_reads_its_conversation("    max_turns: 4\n").await;
}

/// A four-request agent loop of a delegate step with `step_keys`: every request marks its
/// newest message and reads everything the request before it marked.
async fn agent_loop_reads_its_conversation(step_keys: &str) {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("list_files", json!({"path": "."})),
        Reply::tool_call("read_file", json!({"path": "notes.txt"})),
        Reply::tool_call("read_file", json!({"path": "notes.txt"})),
        Reply::text("done"),
    ]))
    .await;
    let out = anthropic_project(&server)
        .write("notes.txt", &"a note worth reading twice\n".repeat(40))
        .write(
            "p.yaml",
            &format!(
                "version: 1\nname: loop\nsteps:\n  - id: work\n    delegate:\n      instructions: Read the notes.\n      context: {}\n    tools: [list_files, read_file]\n{step_keys}",
                serde_json::to_string(&shared_context()).unwrap()
            ),
        )
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let requests = chats(&server, Api::Anthropic);
    assert_eq!(requests.len(), 4);
    let mut expected_read = 0;
    let mut previous_end = 0;
    for (turn, request) in requests.iter().enumerate() {
        let marks = breakpoints(request);
        assert!(marks.len() <= 4, "{marks:?}");
        let blocks = anthropic_blocks(&request.body);
        // The newest message's last block is marked: the next turn reads up to it.
        assert_eq!(
            marks.last().map(|m| m.0),
            Some(blocks.len() - 1),
            "turn {turn}"
        );
        expected_read += previous_end;
        previous_end = blocks.last().unwrap().prefix_tokens;
    }
    let line = &results(&out.dir.join("out"), "work")[0];
    assert_eq!(u(&line["cache_read_tokens"]), expected_read, "{line}");
    // Each turn writes only what the previous one did not: the whole last prefix once.
    assert_eq!(u(&line["cache_write_tokens"]), previous_end, "{line}");
}

// ---------------------------------------------------------------------------------------------
// OpenAI: shared content first, a stable `prompt_cache_key` per step.

#[tokio::test(flavor = "multi_thread")]
async fn openai_requests_share_a_stable_prefix_and_a_cache_key_per_step() {
    let server = MockServer::start(MockConfig::new()).await;
    let pipeline = format!(
        "{}  - id: again\n    needs: [each]\n    fan_out:\n      over: list\n      instructions: \"Rate {{{{ item }}}}\"\n      context: {}\n    concurrency: 2\n",
        fan_out(4, "    concurrency: 2\n"),
        serde_json::to_string(&shared_context()).unwrap(),
    );
    let out = openai_project(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let requests = chats(&server, Api::OpenAi);
    assert_eq!(requests.len(), 8);
    let key_of = |prefix: &str| -> Vec<String> {
        requests
            .iter()
            .filter(|r| r.last_user_text().unwrap().starts_with(prefix))
            .map(|r| {
                r.body["prompt_cache_key"]
                    .as_str()
                    .expect("prompt_cache_key")
                    .to_owned()
            })
            .collect()
    };
    let each_keys = key_of("Classify");
    let again = key_of("Rate");
    assert_eq!(each_keys.len(), 4);
    assert!(
        each_keys.iter().all(|k| *k == each_keys[0]),
        "{each_keys:?}"
    );
    assert!(again.iter().all(|k| *k == again[0]), "{again:?}");
    assert_ne!(each_keys[0], again[0]);
    for request in &requests {
        let messages = request.body["messages"].as_array().unwrap();
        assert_eq!(messages[0]["role"], "system");
        assert!(
            messages[0]["content"]
                .as_str()
                .unwrap()
                .contains("Reference fact 099")
        );
        assert_eq!(messages.last().unwrap()["role"], "user");
    }
    // Every task after the first reads the shared prefix from the cache; the second step
    // shares the first's tools, system prompt and context, so all of its tasks read them.
    let each = results(&out.dir.join("out"), "each");
    let read: Vec<u64> = each.iter().map(|l| u(&l["cache_read_tokens"])).collect();
    assert_eq!(read[0], 0, "{read:?}");
    assert!(read[1..].iter().all(|r| *r >= 1024), "{read:?}");
    let again = results(&out.dir.join("out"), "again");
    assert!(
        again.iter().all(|l| u(&l["cache_read_tokens"]) >= 1024),
        "{again:?}"
    );
    // The same pipeline run again sends the same keys.
    let first = each_keys[0].clone();
    openai_project(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let requests = chats(&server, Api::OpenAi);
    assert_eq!(
        requests[8].body["prompt_cache_key"].as_str(),
        Some(first.as_str())
    );
}

// ---------------------------------------------------------------------------------------------
// Warm-up: the first task alone until its answer arrives, then full concurrency.

#[tokio::test(flavor = "multi_thread")]
async fn a_fan_out_sends_its_first_task_alone_then_the_rest_together() {
    let server = MockServer::start(MockConfig::new().latency(LATENCY)).await;
    let out = anthropic_project(&server)
        .write_raw("p.yaml", &fan_out(7, "    concurrency: 3\n"))
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let requests = chats(&server, Api::Anthropic);
    assert_eq!(requests.len(), 7);
    let first = requests[0].received_at;
    for request in &requests[1..] {
        assert!(
            request.received_at.duration_since(first) >= LATENCY,
            "request {} was sent before the first answer",
            request.seq
        );
    }
    assert_eq!(server.peak_in_flight(), 3, "then at full concurrency");
    let lines = results(&out.dir.join("out"), "each");
    let writes = lines
        .iter()
        .filter(|l| u(&l["cache_write_tokens"]) > 0)
        .count();
    assert_eq!(writes, 1, "the prefix is written once: {lines:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cache_false_sends_no_breakpoints_no_key_and_no_warm_up() {
    let server = MockServer::start(MockConfig::new().latency(LATENCY)).await;
    anthropic_project(&server)
        .write_raw(
            "p.yaml",
            // An explicit output limit: nothing waits to learn one either.
            &fan_out_after_hello(
                3,
                "    concurrency: 3\n    cache: false\n    max_output_tokens: 64\n",
            ),
        )
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let requests = classified(chats(&server, Api::Anthropic));
    assert_eq!(requests.len(), 3);
    assert!(requests.iter().all(|r| breakpoints(r).is_empty()));
    assert!(
        requests[2]
            .received_at
            .duration_since(requests[0].received_at)
            < LATENCY,
        "sent together"
    );

    // The config file's `cache: false` turns it off for every step.
    let server = MockServer::start(MockConfig::new().latency(LATENCY)).await;
    openai_project(&server)
        .write("summon.yaml", "cache: false\n")
        .write_raw("p.yaml", &fan_out_after_hello(3, "    concurrency: 3\n"))
        .args(["run", "p.yaml", "--quiet", "--trust"])
        .run();
    let requests = classified(chats(&server, Api::OpenAi));
    assert_eq!(requests.len(), 3);
    assert!(
        requests
            .iter()
            .all(|r| r.body.get("prompt_cache_key").is_none())
    );
    assert!(
        requests[2]
            .received_at
            .duration_since(requests[0].received_at)
            < LATENCY
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_cache_value_is_an_error_at_its_line() {
    let out = Test::new()
        .write_raw("p.yaml", &fan_out(2, "    cache: maybe\n"))
        .args(["run", "p.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains("p.yaml:12:12")
            && out
                .stderr
                .contains("`steps[1].cache` must be true or false"),
        "{}",
        out.stderr
    );
}

// ---------------------------------------------------------------------------------------------
// Accounting: every output counts the cache, every cost prices it.

#[tokio::test(flavor = "multi_thread")]
async fn cache_tokens_reach_every_output_and_the_cost_prices_them() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = anthropic_project(&server)
        .write(
            "summon.yaml",
            "prices:\n  claude-sonnet-4-5: { input: 3, output: 15 }\n",
        )
        .write_raw("p.yaml", &fan_out(4, "    concurrency: 2\n"))
        .args([
            "run",
            "p.yaml",
            "--out",
            "out",
            "--junit",
            "junit.xml",
            "--json",
        ])
        .run();
    let lines = results(&out.dir.join("out"), "each");
    let sum = |key: &str| lines.iter().map(|l| u(&l[key])).sum::<u64>();
    let (read, write) = (sum("cache_read_tokens"), sum("cache_write_tokens"));
    let (input, output) = (sum("input_tokens"), sum("output_tokens"));
    assert!(read > 0 && write > 0, "{lines:#?}");
    // Claude's defaults: reads at 0.1×, writes at 1.25× the input price.
    let expected = ((input - read - write) as f64 * 3.0
        + read as f64 * 0.3
        + write as f64 * 3.75
        + output as f64 * 15.0)
        / 1e6;
    let report = report(&out.dir.join("out"));
    let cost = report["steps"]["each"]["cost_usd"].as_f64().unwrap();
    assert!((cost - expected).abs() < 2e-6, "{cost} vs {expected}");
    let uncached = (input + output * 5) as f64 * 3.0 / 1e6;
    assert!(cost < uncached, "caching is cheaper: {cost} vs {uncached}");

    let json = out.json();
    assert_eq!(u(&json["cache_read_tokens"]), read);
    assert_eq!(u(&json["cache_write_tokens"]), write);
    let junit = std::fs::read_to_string(out.dir.join("junit.xml")).unwrap();
    assert!(
        junit.contains(&format!(
            r#"<property name="cache_read_tokens" value="{read}"/>"#
        )),
        "{junit}"
    );
    let percent = (read as f64 * 100.0 / u(&report["total"]["input_tokens"]) as f64).round();
    assert!(
        out.stderr
            .contains(&format!("{percent:.0}% of input from cache")),
        "{}",
        out.stderr
    );
}
