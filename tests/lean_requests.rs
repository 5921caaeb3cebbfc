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

/// The bytes of summon's own text a tool-less task may send beyond its instructions, context
/// and role: 20 tokens at four bytes a token.
const OWN_TEXT_BOUND: usize = 80;

#[tokio::test(flavor = "multi_thread")]
async fn a_single_turn_task_is_sent_no_tools_and_a_short_prompt() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    openai(&server)
        .write_raw(
            "p.yaml",
            &fan_out("    max_turns: 1\n").replace(
                "      instructions:",
                "      extensions: [developer]\n      instructions:",
            ),
        )
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let requests = chats(&server);
    assert_eq!(requests.len(), 2);
    for request in &requests {
        assert_tool_free(&request.body);
        // An ad-hoc task's instructions are its user message: the system prompt is summon's.
        let system = system_of(&request.body);
        assert!(
            system.len() <= OWN_TEXT_BOUND,
            "{} bytes: {system}",
            system.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_inline_step_gets_only_the_tools_it_names() {
    // Naming none, it is sent none, and a system prompt within the bound.
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    openai(&server)
        .write_raw("p.yaml", &fan_out(""))
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let requests = chats(&server);
    assert_eq!(requests.len(), 2);
    for request in &requests {
        assert_tool_free(&request.body);
        let system = system_of(&request.body);
        assert!(
            system.len() <= OWN_TEXT_BOUND,
            "{} bytes: {system}",
            system.len()
        );
        assert_eq!(
            request.body["messages"].as_array().unwrap().len(),
            2,
            "{:#}",
            request.body
        );
    }

    // `tools: [read_file]` alone grants that file tool (and `load`, which every subagent
    // with tools keeps).
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    openai(&server)
        .write_raw("p.yaml", &fan_out("    tools: [read_file]\n"))
        .args(["run", "p.yaml", "--quiet"])
        .run();
    for request in chats(&server) {
        assert_eq!(request.tool_names(), ["read_file", "load"]);
        assert!(system_of(&request.body).contains("Your tools: read_file, load."));
    }

    // `extensions: [developer]` grants every built-in tool, `shell` included.
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    openai(&server)
        .write_raw(
            "p.yaml",
            &fan_out("").replace(
                "      instructions:",
                "      extensions: [developer]\n      instructions:",
            ),
        )
        .args(["run", "p.yaml", "--quiet"])
        .run();
    for request in chats(&server) {
        assert_eq!(request.tool_names(), ALL_TOOLS);
    }
}

/// Every built-in tool and `load`, in the order they are sent.
const ALL_TOOLS: [&str; 7] = [
    "read_file",
    "write_file",
    "edit_file",
    "list_files",
    "search",
    "shell",
    "load",
];

#[tokio::test(flavor = "multi_thread")]
async fn a_source_step_and_delegate_keep_what_they_declare() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let project = || {
        openai(&server)
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
            .write(
                "recipes/plain.yaml",
                "
                title: Plain
                description: without extensions, the file tools
                instructions: Look.
                ",
            )
    };
    for source in ["dev", "plain"] {
        project()
            .write_raw(
                "p.yaml",
                &fan_out("").replace(
                    "      instructions:",
                    &format!("      source: {source}\n      instructions:"),
                ),
            )
            .args(["run", "p.yaml", "--quiet"])
            .run();
    }
    // `summon delegate --instructions` keeps its documented default: the file tools.
    project()
        .args(["delegate", "--instructions", "Say ok."])
        .stdout("ok\n")
        .run();
    let requests = chats(&server);
    assert_eq!(requests.len(), 5);
    let file_tools: Vec<&str> = ALL_TOOLS.into_iter().filter(|t| *t != "shell").collect();
    for request in &requests[..2] {
        assert_eq!(request.tool_names(), ALL_TOOLS, "recipe `dev`");
    }
    for request in &requests[2..] {
        assert_eq!(request.tool_names(), file_tools, "{:#}", request.body);
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

/// A fan-out whose inline step names `read_file` on the second line of its instructions
/// (line 12 of the file); `step_keys` are more of the step's keys.
fn naming_read_file(step_keys: &str) -> String {
    format!(
        "version: 1\nname: p\nsteps:\n  - id: rows\n    decompose:\n      items: [a.md]\n  \
         - id: each\n    fan_out:\n      over: rows\n      instructions: |\n        Review {{{{ item }}}}.\n        \
         Read it with read_file first.\n{step_keys}"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_the_instructions_name_but_the_step_lacks_is_warned_at_its_line() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let pipeline = naming_read_file("");
    assert_eq!(
        pipeline.lines().nth(11),
        Some("        Read it with read_file first.")
    );
    let warning = "p.yaml:12:22: warning: step `each`: the instructions name `read_file`, a tool \
                   this step's tasks do not have";
    let hint = "add `tools: [read_file]` to the step";
    let out = openai(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["validate", "p.yaml"])
        .run();
    assert!(out.stderr.contains(warning), "{}", out.stderr);
    assert!(out.stderr.contains(hint), "{}", out.stderr);
    assert_eq!(server.request_count(), 0);
    // `summon run` shows it too, and runs: it is a warning.
    let out = openai(&server)
        .write_raw("p.yaml", &pipeline)
        .args(["run", "p.yaml", "--quiet"])
        .run();
    assert_eq!(out.stderr.matches(warning).count(), 1, "{}", out.stderr);
    assert_eq!(chats(&server).len(), 1);
    assert!(chats(&server)[0].tool_names().is_empty());

    // `extensions: []` takes the tools away: the hint says what grants it instead.
    let out = openai(&server)
        .write_raw("p.yaml", &naming_read_file("      extensions: []\n"))
        .args(["validate", "p.yaml"])
        .run();
    assert!(out.stderr.contains(warning), "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "`extensions: []` gives the step no tools: replace it with `tools: [read_file]`"
        ),
        "{}",
        out.stderr
    );

    // Granted, by `tools:` or by the developer extension, it is not warned of.
    for keys in [
        "    tools: [read_file]\n",
        "      extensions: [developer]\n",
    ] {
        let out = openai(&server)
            .write_raw("p.yaml", &naming_read_file(keys))
            .args(["validate", "p.yaml"])
            .run();
        assert!(!out.stderr.contains("warning:"), "{keys}: {}", out.stderr);
    }
    // `shell` needs the developer extension.
    let out = openai(&server)
        .write_raw(
            "p.yaml",
            &naming_read_file("    tools: [read_file]\n")
                .replace("first.", "first, then `shell` to count its lines."),
        )
        .args(["validate", "p.yaml"])
        .run();
    assert!(
        out.stderr.contains("p.yaml:12:") && out.stderr.contains("name `shell`"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("extensions: [developer]"),
        "{}",
        out.stderr
    );
}

/// A classifier recipe as `recipes/classify-ticket.yaml` has it: instructions, a prompt per
/// row, a JSON Schema answer and no tools.
const CLASSIFY: &str = "
    title: Classify Ticket
    description: Label one support ticket
    instructions: |
      You triage support tickets. Pick the single best category and a priority, and give a
      one-line reason. Answer with JSON only.
    prompt: |
      Ticket title: {{ title }}
      Ticket body:
      {{ body }}
    extensions: []
    parameters:
      - {key: title, input_type: string, requirement: required, description: t}
      - {key: body, input_type: string, requirement: required, description: b}
    response:
      json_schema:
        type: object
        required: [category, priority, reason]
        additionalProperties: false
        properties:
          category: {type: string, enum: [bug, billing, account, feature-request, question]}
          priority: {type: string, enum: [low, normal, high, urgent]}
          reason: {type: string}
    ";

const CLASSIFY_PIPELINE: &str = "version: 1\nname: p\nsteps:\n  - id: rows\n    decompose:\n      \
    items: [{title: Charged twice, body: I was billed twice for March, please refund one charge.}]\n  \
    - id: labels\n    fan_out:\n      over: rows\n      source: classify-ticket\n      \
    parameters: {title: '{{ item.title }}', body: '{{ item.body }}'}\n";

const LABEL: &str = r#"{"category":"billing","priority":"normal","reason":"double charge"}"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_structured_task_sends_its_schema_once_and_little_else() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text(LABEL))).await;
    openai(&server)
        .write_raw("summon.yaml", "providers:\n  openai:\n    local: false\n")
        .write("recipes/classify-ticket.yaml", CLASSIFY)
        .write_raw("p.yaml", CLASSIFY_PIPELINE)
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let requests = chats(&server);
    assert_eq!(requests.len(), 1);
    let body = &requests[0].body;
    assert_tool_free(body);
    assert_eq!(body["response_format"]["type"], "json_schema", "{body:#}");
    // The schema goes natively, not again in the system prompt.
    let system = system_of(body);
    assert!(
        !system.contains("JSON Schema") && !system.contains("\"enum\""),
        "{system}"
    );
    let instructions = "You triage support tickets. Pick the single best category and a \
        priority, and give a\none-line reason. Answer with JSON only.";
    let user = first_user(body);
    assert!(system.contains(instructions), "{system}");
    // What summon adds to the row's own text: at most 20 tokens at four bytes a token.
    let own = system.len() - instructions.len();
    assert!(own <= OWN_TEXT_BOUND, "{own} bytes: {system}");
    // The whole request, against an SDK's bare one for the same row (one user message with
    // the same text, the same response_format), as the mock counts the tokens it bills.
    let bare = json!({
        "model": body["model"],
        "messages": [{"role": "user", "content": format!("{instructions}\n\n{user}")}],
        "response_format": body["response_format"],
    });
    let sent = summon_mock_llm::prompt_tokens(body);
    let sdk = summon_mock_llm::prompt_tokens(&bare);
    assert!(
        sent <= sdk + 25,
        "summon {sent} tokens, a bare request {sdk}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_without_json_schema_gets_the_schema_in_the_prompt() {
    let server = MockServer::start(
        MockConfig::new()
            .refuse_formats(["json_schema"])
            .default_reply(Reply::text(LABEL)),
    )
    .await;
    let out = openai(&server)
        .write_raw("summon.yaml", "providers:\n  openai:\n    local: false\n")
        .write("recipes/classify-ticket.yaml", CLASSIFY)
        .write_raw("p.yaml", CLASSIFY_PIPELINE)
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let requests = chats(&server);
    assert_eq!(requests.len(), 2, "{}", out.stderr);
    let (refused, sent) = (&requests[0].body, &requests[1].body);
    assert_eq!(refused["response_format"]["type"], "json_schema");
    assert!(!system_of(refused).contains("JSON Schema"));
    // Stepped down to json_object, the request cannot carry the schema: the prompt does.
    assert_eq!(sent["response_format"]["type"], "json_object", "{sent:#}");
    let system = system_of(sent);
    assert!(
        system.contains("validates against this JSON Schema:")
            && system.contains("\"low\"")
            && system.contains("\"urgent\""),
        "{system}"
    );
    let results = std::fs::read_to_string(out.dir.join("out/results.jsonl")).unwrap();
    assert!(results.contains("\"status\":\"completed\""), "{results}");
}
