//! A task is sent only what it can use: a task that cannot call a tool (`max_turns: 1`, a
//! batch line, a step or agent with `tools: []`) gets no tool definitions and no prompt text
//! about tools; a step's `tools:` subset is all it is offered; unknown names in `tools:` are
//! errors at their line; the dry run and `report.json` show the per-task overhead.

use crate::support;
use crate::support::chats;

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

const KEY: &str = "sk-test-0123456789abcdefLEAN";

/// A project wired to the mock as an OpenAI-compatible provider.
fn openai(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_BATCH_POLL_MS", "5")
}

/// A project wired to the mock as Anthropic.
fn anthropic(server: &MockServer) -> Test {
    Test::new()
        .env("SUMMON_PROVIDER", "anthropic")
        .env("ANTHROPIC_BASE_URL", &server.url_anthropic())
        .env("ANTHROPIC_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
}

/// A two-item ad-hoc fan-out whose step has `step_keys` (lines indented under the step).
fn fan_out(step_keys: &str) -> String {
    format!(
        "version: 1\nname: p\nsteps:\n  - id: rows\n    decompose:\n      items: [alpha, beta]\n  \
         - id: each\n    fan_out:\n      over: rows\n      instructions: \"Classify {{{{ item }}}}.\"\n{step_keys}"
    )
}

/// The system prompt of a request body, in either API's format.
fn system_of(body: &Value) -> String {
    if let Some(system) = body.get("system") {
        return match system {
            Value::String(text) => text.clone(),
            Value::Array(blocks) => blocks
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join(""),
            _ => String::new(),
        };
    }
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "system"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// No tool definitions, and a system prompt that says nothing about tools or files.
#[track_caller]
fn assert_tool_free(body: &Value) {
    assert!(body.get("tools").is_none(), "tools sent: {body:#}");
    let system = system_of(body);
    assert!(!system.is_empty(), "{body:#}");
    let lower = system.to_lowercase();
    assert!(
        !lower.contains("tool") && !lower.contains("working directory"),
        "the system prompt speaks of tools: {system}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_single_turn_task_is_sent_no_tools_and_a_short_prompt() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    openai(&server)
        .write_raw("p.yaml", &fan_out("    max_turns: 1\n"))
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let requests = chats(&server);
    assert_eq!(requests.len(), 2);
    for request in &requests {
        assert_tool_free(&request.body);
        // The standard prompt alone, as summon's estimator counts it.
        let tokens = system_of(&request.body).len().div_ceil(4);
        assert!(
            tokens <= 60,
            "{tokens} tokens: {}",
            system_of(&request.body)
        );
    }

    // Without the limit the same task may use tools, and gets them.
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    openai(&server)
        .write_raw("p.yaml", &fan_out(""))
        .args(["run", "p.yaml", "--quiet"])
        .run();
    for request in chats(&server) {
        assert_eq!(
            request.tool_names(),
            [
                "read_file",
                "write_file",
                "edit_file",
                "list_files",
                "search",
                "load"
            ]
        );
        assert!(system_of(&request.body).contains("Your tools: read_file"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn delegate_with_one_turn_sends_no_tools() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let _out = openai(&server)
        .args([
            "delegate",
            "--instructions",
            "Say ok.",
            "--max-turns",
            "1",
            "--extensions",
            "developer",
        ])
        .stdout("ok\n")
        .run();
    let requests = chats(&server);
    assert_eq!(requests.len(), 1);
    assert_tool_free(&requests[0].body);
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_keeps_the_forced_answer_tool_of_a_single_turn_structured_task() {
    let server = MockServer::start(
        MockConfig::new().default_reply(Reply::tool_call("structured_answer", json!({"score": 3}))),
    )
    .await;
    let out = anthropic(&server)
        .write(
            "recipes/score.yaml",
            "
            title: Score
            description: d
            instructions: Score it.
            extensions:
              - type: builtin
                name: developer
            response:
              json_schema:
                type: object
                required: [score]
                properties:
                  score: { type: integer }
            ",
        )
        .write_raw(
            "p.yaml",
            "version: 1\nname: p\nsteps:\n  - id: rows\n    decompose:\n      items: [alpha]\n  \
             - id: each\n    fan_out:\n      over: rows\n      source: score\n    max_turns: 1\n",
        )
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let requests = chats(&server);
    assert_eq!(requests.len(), 1, "{}", out.stderr);
    let body = &requests[0].body;
    // The answer mechanism stays; no callable tool is offered.
    assert_eq!(requests[0].tool_names(), ["structured_answer"], "{body:#}");
    assert_eq!(body["tool_choice"]["name"], "structured_answer", "{body:#}");
    let system = system_of(body);
    assert!(
        !system.contains("Your tools") && !system.contains("working directory"),
        "{system}"
    );
    let results = std::fs::read_to_string(out.dir.join("out/results.jsonl")).unwrap();
    assert!(results.contains("\"status\":\"completed\""), "{results}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_step_or_agent_with_no_tools_is_sent_none() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    openai(&server)
        .write_raw("p.yaml", &fan_out("    tools: []\n"))
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let requests = chats(&server);
    assert_eq!(requests.len(), 2);
    for request in &requests {
        assert_tool_free(&request.body);
    }

    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    openai(&server)
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
        .args([
            "delegate",
            "--source",
            "thinker",
            "--instructions",
            "Think.",
        ])
        .run();
    let requests = chats(&server);
    assert_eq!(requests.len(), 1);
    assert_tool_free(&requests[0].body);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_step_tools_subset_is_all_it_is_offered() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    openai(&server)
        .write_raw("p.yaml", &fan_out("    tools: [search, read_file]\n"))
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let requests = chats(&server);
    assert_eq!(requests.len(), 2);
    for request in &requests {
        assert_eq!(request.tool_names(), ["read_file", "search", "load"]);
        assert!(
            system_of(&request.body).contains("Your tools: read_file, search, load."),
            "{}",
            system_of(&request.body)
        );
    }

    // `developer` is the extension's whole set, shell included, when the task has it.
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let pipeline = fan_out("    tools: [developer]\n").replace(
        "      instructions:",
        "      extensions: [developer]\n      instructions:",
    );
    openai(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--quiet"])
        .run();
    for request in chats(&server) {
        assert_eq!(
            request.tool_names(),
            [
                "read_file",
                "write_file",
                "edit_file",
                "list_files",
                "search",
                "shell",
                "load"
            ]
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_tool_names_are_errors_at_their_line() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    // Line 11 of the file: `    tools: [read_file, reed_file]`.
    let pipeline = fan_out("    tools: [read_file, reed_file]\n");
    assert_eq!(
        pipeline.lines().nth(10),
        Some("    tools: [read_file, reed_file]")
    );
    for args in [["validate", "p.yaml"], ["run", "p.yaml"]] {
        let out = openai(&server)
            .write_raw("p.yaml", &pipeline)
            .args(args)
            .code(1)
            .run();
        assert!(
            out.stderr.contains("p.yaml:11:"),
            "{args:?}: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains("`reed_file`") && out.stderr.contains("read_file"),
            "{args:?}: {}",
            out.stderr
        );
    }
    // A name that is no tool at all is refused by the parser, in any task.
    let out = openai(&server)
        .write_raw("p.yaml", &fan_out("    tools:\n      - Read\n"))
        .args(["validate", "p.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains("p.yaml:12:") && out.stderr.contains("`Read`"),
        "{}",
        out.stderr
    );
    assert_eq!(server.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn batch_lines_carry_no_tools_and_no_tool_text() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let out = openai(&server)
        .write_raw("p.yaml", &fan_out("    backend: batch\n"))
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let batches = server.batches();
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].lines.len(), 2);
    for line in &batches[0].lines {
        assert_tool_free(line);
    }
    // A batch line's overhead: its system prompt and model name (the task's text is all of
    // its user message), no tool definitions.
    let results = std::fs::read_to_string(out.dir.join("out/results.jsonl")).unwrap();
    for result in results
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
    {
        let body = batches[0]
            .lines
            .iter()
            .find(|b| first_user(b) == result["prompt"].as_str().unwrap())
            .expect("the task's batch line");
        let framing = system_of(body).len() + body["model"].as_str().unwrap().len();
        assert_eq!(
            result["overhead_tokens"],
            framing.div_ceil(4) as u64,
            "{result}"
        );
        assert_eq!(result["tool_tokens"], 0, "{result}");
    }

    // A recipe with the developer extension whose step sends no tools stays in the batch.
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let out = openai(&server)
        .write(
            "recipes/dev.yaml",
            "
            title: Dev
            description: d
            instructions: Look around.
            extensions:
              - type: builtin
                name: developer
            ",
        )
        .write_raw(
            "p.yaml",
            &fan_out("    backend: batch\n    tools: []\n").replace(
                "      instructions:",
                "      source: dev\n      instructions:",
            ),
        )
        .args(["run", "p.yaml", "--quiet"])
        .run();
    assert!(!out.stderr.contains("live"), "{}", out.stderr);
    assert!(chats(&server).is_empty());
    let batches = server.batches();
    assert_eq!(batches.len(), 1);
    for line in &batches[0].lines {
        assert_tool_free(line);
    }
}

/// The bytes summon's estimator counts for a request's tool definitions: name, description
/// and the compact parameter schema of each (OpenAI format).
fn tool_bytes(body: &Value) -> usize {
    body["tools"].as_array().map_or(0, |tools| {
        tools
            .iter()
            .map(|t| {
                let f = &t["function"];
                f["name"].as_str().unwrap().len()
                    + f["description"].as_str().unwrap().len()
                    + f["parameters"].to_string().len()
            })
            .sum()
    })
}

/// The first user message of an OpenAI-format request.
fn first_user(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap()
        .to_owned()
}

/// A count as the dry run prints it: `1,047`.
fn thousands(n: &Value) -> String {
    let digits = n.as_u64().unwrap().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A fan-out over three items with a shared context; `extra` is more of the task's keys.
fn overhead_pipeline(context: &str, extra: &str) -> String {
    format!(
        "version: 1\nname: p\nsteps:\n  - id: rows\n    decompose:\n      items: [alpha, beta, gamma]\n  \
         - id: each\n    fan_out:\n      over: rows\n      instructions: \"Classify {{{{ item }}}}.\"\n      \
         context: \"{context}\"\n{extra}"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dry_run_and_report_show_the_per_task_overhead() {
    let context = "Sentiment labels: positive, negative, neutral. ".repeat(40);
    let cases = [
        // A single-turn task: no tool definitions, the short standard prompt and labels.
        ("    max_turns: 1\n", false),
        // With the developer extension every tool definition is paid for by every task.
        ("      extensions: [developer]\n    max_turns: 2\n", true),
    ];
    let mut per_task = Vec::new();
    for (extra, tools) in cases {
        let yaml = overhead_pipeline(context.trim_end(), extra);
        let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
        let plan = openai(&server)
            .write_raw("p.yaml", &yaml)
            .args(["run", "p.yaml", "--dry-run", "--json"])
            .run()
            .json();
        let planned = &plan["steps"][1]["overhead"];
        assert_eq!(planned["tasks"], 3, "{plan:#}");
        let text = openai(&server)
            .write_raw("p.yaml", &yaml)
            .args(["run", "p.yaml", "--dry-run"])
            .run()
            .stdout;
        let line = format!(
            "overhead: ~{} tokens per task beyond its instructions, context and role ({} of them tool definitions)",
            thousands(&planned["per_task_max"]),
            thousands(&planned["tool_tokens_per_task_max"])
        );
        assert!(text.contains(&line), "{line}\n{text}");
        assert!(server.requests().is_empty(), "a dry run sends nothing");

        let out = openai(&server)
            .write_raw("p.yaml", &yaml)
            .args(["run", "p.yaml", "--out", "out", "--quiet"])
            .run();
        let requests = chats(&server);
        assert_eq!(requests.len(), 3, "{}", out.stderr);
        let results = std::fs::read_to_string(out.dir.join("out/results.jsonl")).unwrap();
        let lines: Vec<Value> = results
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        for request in &requests {
            let body = &request.body;
            let user = first_user(body);
            let line = lines
                .iter()
                .find(|l| l["prompt"] == user.as_str())
                .expect("a results line per request");
            // Everything sent but the task's own text, as the estimator counts it.
            let own = user.len() + context.trim_end().len();
            let framing =
                system_of(body).len() + user.len() + body["model"].as_str().unwrap().len() - own;
            let tool_bytes = tool_bytes(body);
            assert_eq!(
                line["tool_tokens"],
                tool_bytes.div_ceil(4) as u64,
                "{body:#}"
            );
            assert_eq!(
                line["overhead_tokens"],
                (framing + tool_bytes).div_ceil(4) as u64,
                "{body:#}"
            );
            assert_eq!(tool_bytes > 0, tools, "{body:#}");
        }
        let report: Value = serde_json::from_str(
            &std::fs::read_to_string(out.dir.join("out/report.json")).unwrap(),
        )
        .unwrap();
        let measured = &report["steps"]["each"]["overhead"];
        assert_eq!(measured, planned, "the dry run and the run count alike");
        assert_eq!(report["total"]["overhead"], *measured);
        per_task.push((
            measured["per_task_max"].as_u64().unwrap(),
            measured["tool_tokens_per_task_max"].as_u64().unwrap(),
        ));
    }
    let (single, with_tools) = (per_task[0], per_task[1]);
    assert_eq!(single.1, 0);
    assert!(single.0 > 0 && single.0 <= 100, "{single:?}");
    assert!(with_tools.1 > 300, "{with_tools:?}");
    assert!(with_tools.0 >= single.0 + with_tools.1, "{per_task:?}");
}

// An empty list of extensions means none at all, as in goose: no tools, not even the file
// tools, in `delegate`, a recipe's `extensions: []` and a pipeline step.
#[tokio::test(flavor = "multi_thread")]
async fn an_empty_list_of_extensions_sends_no_tools() {
    let server = MockServer::start(MockConfig::new()).await;
    let project = || {
        openai(&server).write(
            "recipes/bare.yaml",
            "
            title: Bare
            description: no extensions at all
            extensions: []
            prompt: Say ok.
            ",
        )
    };
    project()
        .args(["delegate", "--instructions", "Say ok.", "--extensions", ""])
        .run();
    project().args(["delegate", "--source", "bare"]).run();
    project()
        .write_raw("p.yaml", &fan_out("      extensions: []\n"))
        .args(["run", "p.yaml", "--quiet"])
        .run();
    // The defaults, for contrast: the file tools.
    project()
        .args(["delegate", "--instructions", "Say ok."])
        .run();
    let requests = chats(&server);
    assert_eq!(requests.len(), 5);
    for request in &requests[..4] {
        assert!(
            request.body.get("tools").is_none(),
            "{}",
            request.body["tools"]
        );
    }
    assert!(tool_bytes(&requests[4].body) > 0);
}
