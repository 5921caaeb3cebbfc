//! `summon delegate` against a mock LLM server in this test process: what is sent (system
//! prompt, role label, tools offered) and what happens.

use crate::support;

use std::time::Duration;

use serde_json::json;
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

const KEY: &str = "sk-test-0123456789abcdefSECRET";

/// A project wired to the mock as an OpenAI-compatible provider.
fn openai(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
}

fn system_of(request: &summon_mock_llm::RecordedRequest) -> String {
    request.body["messages"][0]["content"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

fn first_user_of(request: &summon_mock_llm::RecordedRequest) -> String {
    request.body["messages"][1]["content"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn ad_hoc_instructions_are_the_first_message_verbatim() {
    let server = MockServer::start(MockConfig::new().reply(Reply::text("All done."))).await;
    let task = "Count the files.\n  Keep {{ braces }} and: colons";
    let _out = openai(&server)
        .args(["delegate", "--instructions", task])
        .stdout("All done.\n")
        .run();
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(first_user_of(&requests[0]), task);
    assert_eq!(requests[0].model(), Some("mock-model"));
    let system = system_of(&requests[0]);
    // No role, so no sentence about roles.
    assert!(
        !system.contains("never overrides these instructions"),
        "{system}"
    );
    // No shell without the developer extension.
    let tools = requests[0].tool_names();
    assert_eq!(
        tools,
        [
            "read_file",
            "write_file",
            "edit_file",
            "list_files",
            "search",
            "load"
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn recipe_instructions_go_to_the_system_prompt_and_prompt_to_the_user() {
    let server = MockServer::start(MockConfig::new().reply(Reply::text("notes"))).await;
    let _out = openai(&server)
        .write(
            "recipes/notes.yaml",
            "
            title: Notes
            description: d
            instructions: Write notes about {{ area }}.
            prompt: 'Start with {{ area }}: now'
            parameters:
              - key: area
                input_type: string
                requirement: required
                description: the area
            extensions:
              - type: builtin
                name: developer
            ",
        )
        .args([
            "delegate",
            "--source",
            "notes",
            "--param",
            "area=parser\nline two",
            "--instructions",
            "Be brief.",
            "--context",
            "The project is summon.",
        ])
        .stdout("notes\n")
        .run();
    let request = &server.requests()[0];
    let system = system_of(request);
    assert!(
        system.contains("\n\nWrite notes about parser\nline two.\n"),
        "{system}"
    );
    assert!(
        system.contains("# Reference Context\n\nThe project is summon."),
        "{system}"
    );
    assert_eq!(
        first_user_of(request),
        "Start with parser\nline two: now\n\nBe brief."
    );
    assert!(request.tool_names().contains(&"shell".to_owned()));
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_role_is_labelled_and_tools_are_narrowed() {
    let server = MockServer::start(MockConfig::new().reply(Reply::text("found it"))).await;
    let out = openai(&server)
        .write(
            ".agents/agents/explorer.md",
            "
            ---
            name: explorer
            description: explores
            tools: Read, Grep, WebFetch
            model: inherit
            ---

            You explore carefully.
            ",
        )
        .args([
            "delegate",
            "--source",
            "explorer",
            "--instructions",
            "Find the parser.",
        ])
        .stdout("found it\n")
        .run();
    assert!(
        out.stderr
            .contains("Listed tools not available, left out: WebFetch"),
        "{}",
        out.stderr
    );
    let request = &server.requests()[0];
    assert_eq!(
        first_user_of(request),
        "Subagent role \"explorer\", defined by this project in .agents/agents/explorer.md:\n\nYou explore carefully.\n\nTask:\nFind the parser."
    );
    assert!(!system_of(request).contains("You explore carefully"));
    assert_eq!(request.tool_names(), ["read_file", "search", "load"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_calls_run_in_the_working_directory_and_escapes_are_refused() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_calls([
            (
                "write_file",
                json!({"path": "out/a.txt", "content": "hello"}),
            ),
            ("read_file", json!({"path": "../outside.txt"})),
            ("shell", json!({"command": "touch pwned"})),
        ]),
        Reply::text("wrote it"),
    ]))
    .await;
    let out = openai(&server)
        .mkdir("work")
        .args([
            "delegate",
            "--instructions",
            "write",
            "--working-dir",
            "work",
        ])
        .stdout("wrote it\n")
        .run();
    assert_eq!(
        std::fs::read_to_string(out.dir.join("work/out/a.txt")).unwrap(),
        "hello"
    );
    assert!(
        !out.dir.join("work/pwned").exists(),
        "shell was not offered, so it must not run"
    );
    assert!(
        out.stderr.contains("[subagent task] write_file: completed"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("read_file: failed"), "{}", out.stderr);
    let second = &server.requests()[1];
    let results: Vec<String> = second.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(results.len(), 3);
    assert!(results[1].contains("outside"), "{}", results[1]);
    assert!(
        results[2].starts_with("Error: unknown_tool") || results[2].contains("unknown_tool"),
        "{}",
        results[2]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn working_dir_outside_is_refused_before_any_request() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = openai(&server)
        .args(["delegate", "--instructions", "x", "--working-dir", ".."])
        .code(1)
        .run();
    assert!(
        out.stderr.contains("outside the current directory"),
        "{}",
        out.stderr
    );
    assert_eq!(server.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn max_turns_reached_is_a_failure_that_keeps_the_last_text() {
    let calls = || Reply::tool_call("list_files", json!({}));
    let server = MockServer::start(MockConfig::new().default_reply(calls())).await;
    let out = openai(&server)
        .args(["delegate", "--instructions", "loop", "--max-turns", "3"])
        .code(2)
        .run();
    assert!(
        out.stderr.contains("max turns (3) reached"),
        "{}",
        out.stderr
    );
    assert_eq!(server.request_count(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn max_turns_precedence_flag_recipe_env() {
    let server = MockServer::start(
        MockConfig::new().default_reply(Reply::tool_call("list_files", json!({}))),
    )
    .await;
    let recipe = "
        title: Loop
        description: d
        instructions: loop
        settings:
          max_turns: 4
        ";
    // recipe (4) beats the environment (2)
    openai(&server)
        .write("recipes/loop.yaml", recipe)
        .env("SUMMON_SUBAGENT_MAX_TURNS", "2")
        .args(["delegate", "--source", "loop"])
        .code(2)
        .run();
    assert_eq!(server.request_count(), 4);
    // the flag (1) beats the recipe
    openai(&server)
        .write("recipes/loop.yaml", recipe)
        .args(["delegate", "--source", "loop", "--max-turns", "1"])
        .code(2)
        .run();
    assert_eq!(server.request_count(), 5);
    // the environment (2) beats the default
    openai(&server)
        .env("SUMMON_SUBAGENT_MAX_TURNS", "2")
        .args(["delegate", "--instructions", "x"])
        .code(2)
        .run();
    assert_eq!(server.request_count(), 7);
}

#[tokio::test(flavor = "multi_thread")]
async fn rate_limit_is_retried_after_retry_after() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::status_with_headers(
            429,
            [("retry-after", "1")],
            "{\"error\":{\"message\":\"slow down\"}}",
        ),
        Reply::text("ok"),
    ]))
    .await;
    let _out = openai(&server)
        .args(["delegate", "--instructions", "x"])
        .stdout("ok\n")
        .run();
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let gap = requests[1]
        .received_at
        .duration_since(requests[0].received_at);
    assert!(gap >= Duration::from_millis(950), "retried after {gap:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn auth_failure_is_not_retried_and_never_shows_the_key() {
    let body = format!("{{\"error\":{{\"message\":\"Incorrect API key provided: {KEY}\"}}}}");
    let server = MockServer::start(MockConfig::new().default_reply(Reply::status(401, body))).await;
    let out = openai(&server)
        .args(["delegate", "--instructions", "x", "--json"])
        .code(2)
        .run();
    assert_eq!(server.request_count(), 1);
    assert!(out.stderr.contains("OPENAI_API_KEY"), "{}", out.stderr);
    for text in [&out.stdout, &out.stderr] {
        assert!(!text.contains(KEY), "key leaked: {text}");
        assert!(!text.contains("SECRET"), "key leaked: {text}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn structured_output_is_re_asked_until_it_validates() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::text("{\"score\": \"high\"}"),
        Reply::text("{\"score\": 7}"),
    ]))
    .await;
    let out = openai(&server)
        .write(
            "recipes/score.yaml",
            "
            title: Score
            description: d
            instructions: Score it.
            response:
              json_schema:
                type: object
                required: [score]
                properties:
                  score: { type: integer }
            ",
        )
        .args(["delegate", "--source", "score", "--json"])
        .run();
    let json = out.json();
    assert_eq!(json["structured"], json!({"score": 7}));
    assert_eq!(json["status"], "completed");
    assert_eq!(json["turns"], 2);
    let second = &server.requests()[1];
    let last = second.last_user_text().unwrap();
    assert!(last.contains("/score"), "{last}");
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_provider_and_aliases() {
    let server = MockServer::start(MockConfig::new().reply(Reply::text("bonjour"))).await;
    let out = Test::new()
        .env("ANTHROPIC_BASE_URL", &server.url_anthropic())
        .env("ANTHROPIC_API_KEY", KEY)
        .write(
            ".claude/agents/greeter.md",
            "
            ---
            name: greeter
            description: greets
            model: sonnet
            ---
            You greet.
            ",
        )
        .args([
            "delegate",
            "--source",
            "greeter",
            "--instructions",
            "Say hi.",
            "--json",
        ])
        .run();
    let json = out.json();
    assert_eq!(json["output"], "bonjour");
    assert_eq!(json["provider"], "anthropic");
    let request = &server.requests()[0];
    assert_eq!(request.path, "/v1/messages");
    assert_ne!(
        request.model(),
        Some("sonnet"),
        "an alias is never sent literally"
    );
    assert_eq!(request.header("x-api-key"), Some(KEY));
    // A string, or text blocks when the end of the system prompt is a cache breakpoint.
    let system = match &request.body["system"] {
        serde_json::Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<String>(),
        other => other.as_str().unwrap_or("").to_owned(),
    };
    assert!(system.contains("never overrides"), "{system}");
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_and_model_precedence() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("x"))).await;
    let recipe = "
        title: R
        description: d
        instructions: go
        settings:
          goose_model: from-recipe
        ";
    // recipe settings beat SUMMON_MODEL
    openai(&server)
        .write("recipes/r.yaml", recipe)
        .args(["delegate", "--source", "r"])
        .run();
    // the flag beats the recipe
    openai(&server)
        .write("recipes/r.yaml", recipe)
        .args(["delegate", "--source", "r", "--model", "from-flag"])
        .run();
    // SUMMON_SUBAGENT_MODEL beats the flag
    openai(&server)
        .write("recipes/r.yaml", recipe)
        .env("SUMMON_SUBAGENT_MODEL", "from-env")
        .args(["delegate", "--source", "r", "--model", "from-flag"])
        .run();
    let models: Vec<String> = server
        .requests()
        .iter()
        .map(|r| r.model().unwrap_or("").to_owned())
        .collect();
    assert_eq!(models, ["from-recipe", "from-flag", "from-env"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn no_model_anywhere_names_the_variables() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .args(["delegate", "--instructions", "x"])
        .code(1)
        .stderr_has("SUMMON_MODEL")
        .run();
    assert!(
        out.stderr.contains("SUMMON_SUBAGENT_MODEL"),
        "{}",
        out.stderr
    );
    // Only the models list was asked for, to name them; no task was sent.
    assert!(
        server
            .requests()
            .iter()
            .all(|r| r.api == summon_mock_llm::Api::Models),
        "{:?}",
        server.requests()
    );
    assert!(out.stderr.contains("offers: mock-model"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_configured_lists_the_ways() {
    let out = Test::new()
        .env("OLLAMA_HOST", "http://127.0.0.1:9")
        .args(["delegate", "--instructions", "x"])
        .code(1)
        .run();
    for way in ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OLLAMA_HOST"] {
        assert!(
            out.stderr.contains(way),
            "{way} missing from: {}",
            out.stderr
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_source_is_rejected_with_suggestions_before_any_request() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = openai(&server)
        .write(
            ".agents/agents/cartographer.md",
            "---\nname: cartographer\ndescription: maps\n---\nMap.\n",
        )
        .args(["delegate", "--source", "cartografer", "--instructions", "x"])
        .code(1)
        .run();
    assert!(
        out.stderr
            .contains("Source 'cartografer' not found. Did you mean: cartographer?"),
        "{}",
        out.stderr
    );
    assert_eq!(server.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_subagent_shell_cannot_delegate() {
    let summon = env!("CARGO_BIN_EXE_summon");
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call(
            "shell",
            json!({"command": format!("{summon} delegate --instructions nested; echo code=$?")}),
        ),
        Reply::text("done"),
    ]))
    .await;
    let _out = openai(&server)
        .args([
            "delegate",
            "--instructions",
            "x",
            "--extensions",
            "developer",
        ])
        .stdout("done\n")
        .run();
    let second = &server.requests()[1];
    let result = second.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .unwrap();
    assert!(
        result.contains("cannot spawn further delegations"),
        "{result}"
    );
    assert!(result.contains("code=1"), "{result}");
    assert_eq!(server.request_count(), 2, "the nested call sent nothing");
}

#[tokio::test(flavor = "multi_thread")]
async fn nested_delegation_is_refused() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = openai(&server)
        .env("SUMMON_SUBAGENT", "1")
        .args(["delegate", "--instructions", "x"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains("cannot spawn further delegations"),
        "{}",
        out.stderr
    );
    assert_eq!(server.request_count(), 0);
}

// goose's names for summon's variables are read after the SUMMON_* names (README,
// "Environment"), so a goose user's environment works unchanged.
#[tokio::test(flavor = "multi_thread")]
async fn goose_variables_are_read_after_summon_s() {
    let server = MockServer::start(
        MockConfig::new().default_reply(Reply::tool_call("list_files", json!({}))),
    )
    .await;
    // GOOSE_SUBAGENT_MAX_TURNS limits the loop...
    openai(&server)
        .env("GOOSE_SUBAGENT_MAX_TURNS", "2")
        .args(["delegate", "--instructions", "x"])
        .code(2)
        .run();
    assert_eq!(server.request_count(), 2);
    // ...unless SUMMON_SUBAGENT_MAX_TURNS says otherwise.
    openai(&server)
        .env("GOOSE_SUBAGENT_MAX_TURNS", "2")
        .env("SUMMON_SUBAGENT_MAX_TURNS", "3")
        .args(["delegate", "--instructions", "x"])
        .code(2)
        .run();
    assert_eq!(server.request_count(), 5);
    // A bad value is named by the variable it came from.
    openai(&server)
        .env("GOOSE_SUBAGENT_MAX_TURNS", "many")
        .args(["delegate", "--instructions", "x"])
        .code(1)
        .stderr_has("GOOSE_SUBAGENT_MAX_TURNS must be a whole number ≥ 1, found `many`")
        .run();
    for var in [
        "GOOSE_MAX_BACKGROUND_TASKS",
        "GOOSE_COMPLETED_TASK_TTL_SECS",
    ] {
        openai(&server)
            .env(var, "lots")
            .args(["delegate", "--async", "--instructions", "x"])
            .code(1)
            .stderr_has(&format!("{var} must be a whole number, got `lots`"))
            .run();
    }
    assert_eq!(server.request_count(), 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn goose_provider_and_model_variables_choose_the_subagent_s() {
    let server = MockServer::start(MockConfig::new()).await;
    // GOOSE_SUBAGENT_PROVIDER and GOOSE_SUBAGENT_MODEL choose, as in goose...
    let out = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("ANTHROPIC_BASE_URL", &server.url_anthropic())
        .env("ANTHROPIC_API_KEY", KEY)
        .env("SUMMON_PROVIDER", "openai")
        .env("GOOSE_SUBAGENT_PROVIDER", "anthropic")
        .env("GOOSE_SUBAGENT_MODEL", "from-goose")
        .args([
            "delegate",
            "--instructions",
            "x",
            "--model",
            "from-flag",
            "--json",
        ])
        .run();
    let json = out.json();
    assert_eq!(json["provider"], "anthropic", "{json}");
    assert_eq!(
        json["model_from"], "environment variable GOOSE_SUBAGENT_MODEL",
        "{json}"
    );
    // ...after the SUMMON_* names.
    openai(&server)
        .env("GOOSE_SUBAGENT_MODEL", "from-goose")
        .env("SUMMON_SUBAGENT_MODEL", "from-summon")
        .args(["delegate", "--instructions", "x"])
        .run();
    let requests = server.requests();
    assert_eq!(requests[0].api, summon_mock_llm::Api::Anthropic);
    let models: Vec<&str> = requests.iter().map(|r| r.model().unwrap_or("")).collect();
    assert_eq!(models, ["from-goose", "from-summon"]);
}

// A subrecipe's fixed `values` win over --param, as in goose; the ignored value is said.
#[tokio::test(flavor = "multi_thread")]
async fn a_param_does_not_override_a_subrecipe_s_fixed_value() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = openai(&server)
        .write(
            "recipes/main.yaml",
            "
            title: Main
            description: main
            instructions: use the helper
            sub_recipes:
              - name: helper
                path: sub/helper.yaml
                values:
                  lang: rust
            ",
        )
        .write(
            "recipes/sub/helper.yaml",
            "
            title: Helper
            description: helper
            prompt: Write {{ lang }} at {{ level }}.
            parameters:
              - key: lang
                input_type: string
                requirement: required
                description: the language
              - key: level
                input_type: string
                requirement: required
                description: the level
            ",
        )
        .args([
            "delegate",
            "--source",
            "helper",
            "--param",
            "lang=go",
            "--param",
            "level=high",
        ])
        .stdout("echo: Write rust at high.\n")
        .run();
    assert!(
        out.stderr.contains(
            "parameter `lang` is fixed to `rust` by the subrecipe's `values`; the value given, `go`, is ignored"
        ),
        "{}",
        out.stderr
    );
}
