//! Structured answers the way models really give them: JSON in a fenced block or after a
//! sentence is taken without a correction request; only an answer with no usable value (or
//! several different ones) is sent back. What each request asks the provider for, also for a
//! schema whose root is not an object (sent wrapped in an object, the answer unwrapped).

use crate::support;
use crate::support::{read_json, results};

use serde_json::{Value, json};
use summon_mock_llm::{Api, MockConfig, MockServer, Reply};
use support::Test;

const KEY: &str = "sk-test-0123456789abcdefSECRET";

/// A project wired to the mock as an OpenAI-compatible provider.
fn openai(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
}

const SCORE_RECIPE: &str = "
    title: Score
    description: d
    instructions: Score it.
    response:
      json_schema:
        type: object
        required: [score]
        properties:
          score: { type: integer }
    ";

/// A one-step pipeline whose model-made item list is the run's output.
const DECOMPOSE: &str = "version: 1\nname: p\nsteps:\n  - id: list\n    decompose:\n      instructions: List the areas.\n";

#[tokio::test(flavor = "multi_thread")]
async fn a_fenced_answer_after_a_sentence_is_taken_without_a_correction() {
    let server = MockServer::start(MockConfig::new().replies([Reply::text(
        "Here you go:\n```json\n[\"api\", \"cli\", \"docs\"]\n```\n",
    )]))
    .await;
    let out = openai(&server)
        .write_raw("p.yaml", DECOMPOSE)
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    assert_eq!(server.request_count(), 1, "{}", out.stderr);
    let lines = results(&out.dir.join("out"));
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["status"], "completed", "{:#}", lines[0]);
    assert_eq!(lines[0]["output"], "[\"api\",\"cli\",\"docs\"]");
    assert_eq!(lines[0]["extracted"], true, "{:#}", lines[0]);
    assert_eq!(lines[0]["corrections"], 0);
    let report = read_json(&out.dir.join("out/report.json"));
    assert_eq!(report["steps"]["list"]["corrections"], 0, "{report:#}");
    assert_eq!(report["total"]["corrections"], 0, "{report:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bare_array_is_accepted_though_it_was_asked_wrapped_and_is_not_marked_extracted() {
    let server =
        MockServer::start(MockConfig::new().replies([Reply::text("[\"api\", \"cli\"]")])).await;
    let out = openai(&server)
        .write_raw("p.yaml", DECOMPOSE)
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "{}", out.stderr);
    assert_eq!(
        requests[0].body["response_format"]["json_schema"]["schema"]["required"],
        json!(["items"])
    );
    let lines = results(&out.dir.join("out"));
    assert_eq!(lines[0]["output"], "[\"api\",\"cli\"]", "{:#}", lines[0]);
    assert_eq!(lines[0]["extracted"], false, "{:#}", lines[0]);
    assert_eq!(lines[0]["corrections"], 0);
}

/// A model-made list of areas, then one task per area.
const DECOMPOSE_THEN_FAN_OUT: &str = "version: 1\nname: p\nsteps:\n  - id: list\n    decompose:\n      instructions: List the areas.\n  - id: each\n    fan_out:\n      over: list\n      instructions: 'Describe {{ item }}'\n";

/// The decompose schema as the providers' mechanisms are sent it.
fn wrapped_array() -> Value {
    json!({"type": "object", "properties": {"items": {"type": "array"}},
        "required": ["items"], "additionalProperties": false})
}

/// The first user texts of the requests after the first, sorted.
fn fan_out_texts(server: &MockServer) -> Vec<String> {
    let mut texts: Vec<String> = server.requests()[1..]
        .iter()
        .map(|r| r.last_user_text().unwrap_or_default())
        .collect();
    texts.sort();
    texts
}

#[tokio::test(flavor = "multi_thread")]
async fn decompose_by_model_on_openai_asks_for_the_array_wrapped_and_fans_out_its_items() {
    let server = MockServer::start(
        MockConfig::new()
            .replies([Reply::text("{\"items\": [\"api\", \"cli\", \"docs\"]}")])
            .default_reply(Reply::text("described")),
    )
    .await;
    let out = openai(&server)
        .write_raw("p.yaml", DECOMPOSE_THEN_FAN_OUT)
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let requests = server.requests();
    // `{"type": "array"}` says nothing of its items: strict mode refuses it.
    assert_eq!(
        requests[0].body["response_format"],
        json!({"type": "json_schema", "json_schema": {
            "name": "structured_answer", "schema": wrapped_array(), "strict": false}}),
        "{}",
        out.stderr
    );
    assert_eq!(
        fan_out_texts(&server),
        ["Describe api", "Describe cli", "Describe docs"]
    );
    let lines = results(&out.dir.join("out"));
    let list = lines.iter().find(|l| l["step"] == "list").unwrap();
    assert_eq!(list["output"], "[\"api\",\"cli\",\"docs\"]", "{list:#}");
    assert_eq!(list["extracted"], false);
    assert_eq!(list["corrections"], 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn decompose_by_model_on_anthropic_gets_its_items_from_the_answer_tool() {
    let server = MockServer::start(
        MockConfig::new()
            .replies([Reply::tool_call(
                "structured_answer",
                json!({"items": ["api", "cli"]}),
            )])
            .default_reply(Reply::text("described")),
    )
    .await;
    let out = Test::new()
        .env("ANTHROPIC_BASE_URL", &server.url_anthropic())
        .env("ANTHROPIC_API_KEY", KEY)
        .env("SUMMON_PROVIDER", "anthropic")
        .env("SUMMON_MODEL", "claude-test")
        .write_raw(
            "p.yaml",
            &DECOMPOSE_THEN_FAN_OUT.replace(
                "List the areas.\n",
                "List the areas.\n    tools: [list_files]\n",
            ),
        )
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "{}", out.stderr);
    let first = &requests[0].body;
    // Not forced, the answer tool is named in the system prompt (its schema is in the tool).
    let system: String = first["system"]
        .as_array()
        .map(|blocks| blocks.iter().filter_map(|b| b["text"].as_str()).collect())
        .or_else(|| first["system"].as_str().map(str::to_owned))
        .unwrap_or_default();
    assert!(
        system.contains("Give your final answer with the `structured_answer` tool."),
        "{system}"
    );
    assert!(!system.contains("JSON Schema"), "{system}");
    let answer = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "structured_answer")
        .unwrap_or_else(|| panic!("no answer tool: {first}"));
    assert_eq!(answer["input_schema"], wrapped_array());
    // The task has tools: the answer tool is offered beside them, not forced.
    assert!(first["tools"].as_array().unwrap().len() > 1, "{first}");
    assert_eq!(first.get("tool_choice"), None, "{first}");
    assert_eq!(fan_out_texts(&server), ["Describe api", "Describe cli"]);
    let lines = results(&out.dir.join("out"));
    let list = lines.iter().find(|l| l["step"] == "list").unwrap();
    assert_eq!(list["output"], "[\"api\",\"cli\"]", "{list:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scalar_schema_is_wrapped_as_answer_and_r_data_is_the_bare_value() {
    let server = MockServer::start(MockConfig::new().rule(|req| {
        match req.last_user_text().unwrap_or_default().as_str() {
            // One model follows the mechanism, one answers the bare value in a fenced block.
            "Count: ab" => Reply::text("{\"answer\": 2}"),
            _ => Reply::text("It has three letters:\n```json\n3\n```"),
        }
    }))
    .await;
    let out = openai(&server)
        .write(
            "p.yaml",
            "
            version: 1
            name: p
            steps:
              - id: words
                decompose: {items: [ab, cde]}
              - id: count
                fan_out:
                  over: words
                  instructions: 'Count: {{ item }}'
                  schema: {type: integer}
              - id: sum
                synthesize:
                  instructions: '{% for r in steps.count.results %}{{ r.data + 1 }};{% endfor %}'
            ",
        )
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let requests = server.requests();
    let count = requests
        .iter()
        .find(|r| r.last_user_text().unwrap_or_default() == "Count: ab")
        .unwrap();
    assert_eq!(
        count.body["response_format"]["json_schema"],
        json!({"name": "structured_answer", "strict": true, "schema": {"type": "object",
            "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
            "additionalProperties": false}})
    );
    let last = requests.last().unwrap().last_user_text().unwrap();
    assert_eq!(last, "3;4;", "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn json_object_cannot_carry_a_wrapped_schema_so_the_prompt_asks_for_it() {
    let server =
        MockServer::start(MockConfig::new().replies([Reply::text("[\"api\", \"cli\"]")])).await;
    let out = openai(&server)
        .write(
            "summon.yaml",
            "providers:\n  openai:\n    structured_output: json_object\n",
        )
        .write_raw("p.yaml", DECOMPOSE)
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let requests = server.requests();
    assert_eq!(requests[0].body.get("response_format"), None);
    let lines = results(&out.dir.join("out"));
    assert_eq!(lines[0]["output"], "[\"api\",\"cli\"]", "{}", out.stderr);
}

/// Two words counted in one batch; the answers follow the mechanism or not.
fn batch_project(server: &MockServer, anthropic: bool) -> Test {
    let t = if anthropic {
        Test::new()
            .env("ANTHROPIC_BASE_URL", &server.url_anthropic())
            .env("ANTHROPIC_API_KEY", KEY)
            .env("SUMMON_PROVIDER", "anthropic")
    } else {
        Test::new()
            .env("OPENAI_BASE_URL", &server.url_openai())
            .env("OPENAI_API_KEY", KEY)
    };
    t.env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_BATCH_POLL_MS", "5")
        .write(
            "p.yaml",
            "
            version: 1
            name: p
            steps:
              - id: words
                decompose: {items: [ab, cde]}
              - id: letters
                backend: batch
                fan_out:
                  over: words
                  instructions: 'Letters: {{ item }}'
                  schema: {type: array, items: {type: string}}
            ",
        )
}

#[tokio::test(flavor = "multi_thread")]
async fn batch_lines_carry_the_wrapped_schema_and_answers_are_unwrapped() {
    for anthropic in [false, true] {
        let server = MockServer::start(MockConfig::new().rule(move |req| {
            let text = req.last_user_text().unwrap_or_default();
            match (text.as_str(), anthropic) {
                ("Letters: ab", true) => {
                    Reply::tool_call("structured_answer", json!({"items": ["a", "b"]}))
                }
                ("Letters: ab", false) => Reply::text("{\"items\": [\"a\", \"b\"]}"),
                // The bare value is taken too.
                _ => Reply::text("[\"c\", \"d\", \"e\"]"),
            }
        }))
        .await;
        let out = batch_project(&server, anthropic)
            .args(["run", "p.yaml", "--out", "out", "--quiet"])
            .run();
        let batches = server.batches();
        assert_eq!(batches.len(), 1, "{}", out.stderr);
        assert_eq!(batches[0].lines.len(), 2);
        let wrapped = json!({"type": "object",
            "properties": {"items": {"type": "array", "items": {"type": "string"}}},
            "required": ["items"], "additionalProperties": false});
        for line in &batches[0].lines {
            if anthropic {
                assert_eq!(batches[0].api, Api::Anthropic);
                assert_eq!(line["tools"][0]["input_schema"], wrapped, "{line}");
                assert_eq!(
                    line["tool_choice"],
                    json!({"type": "tool", "name": "structured_answer"})
                );
            } else {
                assert_eq!(
                    line["response_format"],
                    json!({"type": "json_schema", "json_schema": {
                        "name": "structured_answer", "schema": wrapped, "strict": true}}),
                    "{line}"
                );
            }
        }
        let mut outputs: Vec<(String, String)> = results(&out.dir.join("out"))
            .iter()
            .filter(|l| l["step"] == "letters")
            .map(|l| {
                (
                    l["item"].as_str().unwrap().to_owned(),
                    l["output"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        outputs.sort();
        assert_eq!(
            outputs,
            [
                ("ab".to_owned(), "[\"a\",\"b\"]".to_owned()),
                ("cde".to_owned(), "[\"c\",\"d\",\"e\"]".to_owned())
            ],
            "anthropic: {anthropic}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn prose_around_one_json_value_is_taken_without_a_correction() {
    let server = MockServer::start(MockConfig::new().replies([Reply::text(
        "I read it twice. My verdict: {\"score\": 7} -- hope that helps!",
    )]))
    .await;
    let out = openai(&server)
        .write("recipes/score.yaml", SCORE_RECIPE)
        .args(["delegate", "--source", "score", "--json"])
        .run();
    let json = out.json();
    assert_eq!(json["status"], "completed", "{json:#}");
    assert_eq!(json["structured"], json!({"score": 7}));
    assert_eq!(json["turns"], 1);
    assert_eq!(server.request_count(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_different_json_values_are_sent_back_for_correction() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::text("Either {\"score\": 3} or {\"score\": 4}, depending."),
        Reply::text("{\"score\": 4}"),
    ]))
    .await;
    let t = openai(&server)
        .write("recipes/score.yaml", SCORE_RECIPE)
        .write_raw(
            "p.yaml",
            "version: 1\nname: p\nsteps:\n  - id: score\n    delegate:\n      source: score\n",
        );
    let output = t
        .command()
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let ask = requests[1].last_user_text().unwrap();
    assert!(ask.contains("2 different JSON values"), "{ask}");
    let lines = results(&t.path().join("out"));
    assert_eq!(lines[0]["output"], "{\"score\":4}");
    assert_eq!(lines[0]["extracted"], false);
    assert_eq!(lines[0]["corrections"], 1);
    let report = read_json(&t.path().join("out/report.json"));
    assert_eq!(report["steps"]["score"]["corrections"], 1, "{report:#}");
    assert_eq!(report["total"]["corrections"], 1, "{report:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_value_twice_is_one_answer() {
    let server = MockServer::start(MockConfig::new().replies([Reply::text(
        "{\"score\": 5}\n\nAs JSON:\n```json\n{\"score\": 5}\n```",
    )]))
    .await;
    let out = openai(&server)
        .write("recipes/score.yaml", SCORE_RECIPE)
        .args(["delegate", "--source", "score", "--json"])
        .run();
    let json = out.json();
    assert_eq!(json["structured"], json!({"score": 5}), "{json:#}");
    assert_eq!(server.request_count(), 1);
}

const STRICT_RECIPE: &str = "
    title: Label
    description: d
    instructions: Label it.
    response:
      json_schema:
        type: object
        additionalProperties: false
        required: [label]
        properties:
          label: { type: string, enum: [bug, feature] }
    ";

#[tokio::test(flavor = "multi_thread")]
async fn openai_requests_carry_a_json_schema_response_format_strict_when_the_schema_allows() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::text("{\"label\": \"bug\"}"),
        Reply::text("{\"score\": 2}"),
    ]))
    .await;
    openai(&server)
        .write("recipes/label.yaml", STRICT_RECIPE)
        .args(["delegate", "--source", "label", "--json"])
        .run();
    openai(&server)
        .write("recipes/score.yaml", SCORE_RECIPE)
        .args(["delegate", "--source", "score", "--json"])
        .run();
    let requests = server.requests();
    assert_eq!(
        requests[0].body["response_format"],
        json!({"type": "json_schema", "json_schema": {
            "name": "structured_answer",
            "schema": {"type": "object", "additionalProperties": false, "required": ["label"],
                       "properties": {"label": {"type": "string", "enum": ["bug", "feature"]}}},
            "strict": true,
        }})
    );
    // Not every property required, no `additionalProperties: false`: not strict.
    let format = &requests[1].body["response_format"];
    assert_eq!(format["type"], "json_schema");
    assert_eq!(format["json_schema"]["strict"], false, "{format}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_refusing_json_schema_gets_json_object_after_one_warning() {
    let server = MockServer::start(
        MockConfig::new()
            .refuse_formats(["json_schema"])
            .default_reply(Reply::text("{\"score\": 1}")),
    )
    .await;
    let t = openai(&server)
        .write("recipes/score.yaml", SCORE_RECIPE)
        .write_raw(
            "p.yaml",
            "version: 1\nname: p\nsettings:\n  concurrency: 1\nsteps:\n  - id: list\n    decompose:\n      items: [a, b, c]\n  - id: each\n    fan_out:\n      over: list\n      source: score\n",
        );
    let output = t
        .command()
        .args(["run", "p.yaml", "--out", "out"])
        .env("CI", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let kinds: Vec<String> = server
        .requests()
        .iter()
        .map(|r| {
            r.body["response_format"]["type"]
                .as_str()
                .unwrap_or("none")
                .to_owned()
        })
        .collect();
    assert_eq!(
        kinds,
        ["json_schema", "json_object", "json_object", "json_object"],
        "{stderr}"
    );
    assert_eq!(stderr.matches("response_format").count(), 1, "{stderr}");
    assert!(stderr.contains("json_object"), "{stderr}");
    for line in results(&t.path().join("out")) {
        assert_eq!(line["status"], "completed", "{line}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_is_offered_an_answer_tool_and_forced_to_it_on_a_correction() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::text("A fine piece of work."),
        Reply::tool_call("structured_answer", json!({"score": 9})),
    ]))
    .await;
    let t = Test::new()
        .env("ANTHROPIC_BASE_URL", &server.url_anthropic())
        .env("ANTHROPIC_API_KEY", KEY)
        .env("SUMMON_PROVIDER", "anthropic")
        .env("SUMMON_MODEL", "claude-test")
        .write("recipes/score.yaml", SCORE_RECIPE)
        .write_raw(
            "p.yaml",
            "version: 1\nname: p\nsteps:\n  - id: score\n    delegate:\n      source: score\n",
        );
    let output = t
        .command()
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "{\"score\":9}\n");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    // First turn: offered beside the task's tools, tool use not blocked.
    let first = &requests[0].body;
    assert_eq!(first.get("tool_choice"), None, "{first}");
    let tools = first["tools"].as_array().unwrap();
    assert!(tools.len() > 1, "{tools:?}");
    let answer = tools.last().unwrap();
    assert_eq!(answer["name"], "structured_answer");
    assert_eq!(answer["input_schema"]["required"], json!(["score"]));
    // The correction turn forces it.
    assert_eq!(
        requests[1].body["tool_choice"],
        json!({"type": "tool", "name": "structured_answer"})
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_provider_setting_picks_the_mechanism_before_any_refusal() {
    let server =
        MockServer::start(MockConfig::new().default_reply(Reply::text("{\"score\": 1}"))).await;
    for (setting, want) in [
        ("json_object", json!({"type": "json_object"})),
        ("none", Value::Null),
    ] {
        let out = openai(&server)
            .write("recipes/score.yaml", SCORE_RECIPE)
            .write(
                "summon.yaml",
                &format!("providers:\n  openai:\n    structured_output: {setting}\n"),
            )
            .args(["delegate", "--source", "score"])
            .run();
        let last = server.requests().pop().unwrap();
        assert_eq!(last.body["response_format"], want, "{setting}");
        assert!(!out.stderr.contains("refused"), "{}", out.stderr);
        assert_eq!(out.stdout.trim(), "{\n  \"score\": 1\n}", "{setting}");
    }
    let out = openai(&server)
        .write("recipes/score.yaml", SCORE_RECIPE)
        .write(
            "summon.yaml",
            "providers:\n  openai:\n    structured_output: yaml\n",
        )
        .args(["delegate", "--source", "score"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains(
            "summon.yaml:3:24: error: `providers.openai.structured_output` must be json_schema, json_object or none"
        ),
        "{}",
        out.stderr
    );
}

#[test]
fn the_dry_run_says_how_each_step_asks_for_its_structured_answer() {
    let pipeline = "version: 1\nname: x\nsteps:\n  - id: a\n    delegate:\n      source: score\n  - id: list\n    decompose:\n      instructions: List the areas.\n";
    let wrapped = "; the schema's root is not an object, so it is wrapped as an object's `items` and the answer unwrapped";
    for (provider, key, want, list_want) in [
        (
            "openai",
            "OPENAI_API_KEY",
            "note: structured answers: response_format json_schema (not strict: the schema does not meet strict mode's rules)",
            format!(
                "response_format json_schema (not strict: the schema does not meet strict mode's rules){wrapped}"
            ),
        ),
        (
            "anthropic",
            "ANTHROPIC_API_KEY",
            "note: structured answers: a `structured_answer` tool whose input is the answer",
            format!("a `structured_answer` tool whose input is the answer{wrapped}"),
        ),
    ] {
        let out = Test::new()
            .env("SUMMON_PROVIDER", provider)
            .env(key, "sk-test")
            .env("SUMMON_MODEL", "m")
            .write("recipes/score.yaml", SCORE_RECIPE)
            .write_raw("p.yaml", pipeline)
            .args(["run", "p.yaml", "--dry-run"])
            .run();
        assert!(out.stdout.contains(want), "{provider}:\n{}", out.stdout);
        // A model-made list is an array: it is sent wrapped in an object.
        assert!(
            out.stdout
                .contains(&format!("note: structured answers: {}", list_want)),
            "{}",
            out.stdout
        );
    }
}

/// llama.cpp's server refuses a schema its grammar cannot express with a 400 that names
/// neither `response_format` nor the parameter: "Unable to generate parser for this template
/// ... JSON schema error". The answer is asked for as `json_object` instead, said once.
#[tokio::test(flavor = "multi_thread")]
async fn a_schema_the_server_cannot_compile_falls_back_to_json_object() {
    let server = summon_mock_llm::MockServer::start(summon_mock_llm::MockConfig::new().rule(
        |request| {
            if request.body["response_format"]["type"] == "json_schema" {
                summon_mock_llm::Reply::status(
                    400,
                    r#"{"error":{"code":400,"message":"Unable to generate parser for this template. Automatic parser generation failed: JSON schema error: unsupported keyword prefixItems","type":"invalid_request_error"}}"#,
                )
            } else {
                summon_mock_llm::Reply::text("{\"pair\": [\"a\", 1]}")
            }
        },
    ))
    .await;
    let recipe = "version: 1.0.0\ntitle: t\ndescription: d\nprompt: p\nresponse:\n  json_schema:\n    type: object\n    properties:\n      pair:\n        type: array\n        prefixItems: [{type: string}, {type: integer}]\n    required: [pair]\n";
    let out = crate::support::Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test")
        .env("SUMMON_MODEL", "mock-model")
        .write("recipes/pair.yaml", recipe)
        .args(["delegate", "--source", "pair", "--json"])
        .run();
    assert_eq!(out.json()["structured"]["pair"][1], 1, "{}", out.stderr);
    assert_eq!(
        out.stderr
            .matches("refused the structured-output request")
            .count(),
        1,
        "{}",
        out.stderr
    );
    let formats: Vec<_> = crate::support::chats(&server)
        .iter()
        .map(|r| r.body["response_format"]["type"].clone())
        .collect();
    assert_eq!(formats, ["json_schema", "json_object"]);
}

/// An answer its corrections never bring to the schema: the failure quotes the last answer
/// and what was wrong with each, and the step's `retries` do not start it over (the
/// corrections were its retries).
#[tokio::test(flavor = "multi_thread")]
async fn a_schema_failure_quotes_the_answer_keeps_each_error_and_is_not_retried() {
    let server = MockServer::start(
        MockConfig::new()
            .replies([
                Reply::text("I think the score is high"),
                Reply::text("{\"score\": \"high\"}"),
            ])
            .default_reply(Reply::text(format!("Score: {}", "very ".repeat(100)))),
    )
    .await;
    let t = openai(&server)
        .write("recipes/score.yaml", SCORE_RECIPE)
        .write_raw(
            "p.yaml",
            "version: 1\nname: p\nsteps:\n  - id: score\n    delegate:\n      source: score\n    retries: 3\n",
        );
    let output = t
        .command()
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    // the first answer and its corrections, and no attempt from the start after them
    let requests = server.requests();
    let corrections = requests.len() - 1;
    assert!(corrections >= 1, "{stderr}");
    let lines = results(&t.path().join("out"));
    let error = lines[0]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{:#}", lines[0]));
    let first = error.lines().next().unwrap();
    assert!(
        first.starts_with(&format!(
            "the answer does not match the response schema after {corrections} correction(s); the last answer: \"Score: very very"
        )),
        "{error}"
    );
    assert!(first.contains(" … ("), "the quote is cut: {error}");
    assert!(
        first.ends_with(&format!(
            "(not retried: its {corrections} correction{} were its retries)",
            if corrections == 1 { "" } else { "s" }
        )),
        "{error}"
    );
    let rest: Vec<&str> = error.lines().skip(1).collect();
    assert_eq!(rest.len(), corrections + 1, "{error}");
    assert!(
        rest[0].starts_with("answer: the answer is not valid JSON"),
        "{error}"
    );
    assert!(
        rest[1].starts_with("correction 1: at /score: ") && rest[1].contains("\"high\""),
        "{error}"
    );
    assert!(
        stderr.contains("the last answer: \"Score: very"),
        "{stderr}"
    );
}

/// A closed schema for the native tests: Anthropic takes only objects with
/// `additionalProperties: false`.
const CLOSED_RECIPE: &str = "
    title: Score
    description: d
    instructions: Score it.
    response:
      json_schema:
        type: object
        required: [score]
        additionalProperties: false
        properties:
          score: { type: integer }
    ";

fn anthropic(server: &MockServer, model: &str) -> Test {
    Test::new()
        .env("ANTHROPIC_BASE_URL", &server.url_anthropic())
        .env("ANTHROPIC_API_KEY", KEY)
        .env("SUMMON_PROVIDER", "anthropic")
        .env("SUMMON_MODEL", model)
}

/// On a model with Anthropic's structured outputs, the schema goes as `output_config.format`
/// beside the task's own tools (none forced, no answer tool), and the answer is the text.
#[tokio::test(flavor = "multi_thread")]
async fn anthropic_models_with_structured_outputs_get_output_config_beside_their_tools() {
    let server =
        MockServer::start(MockConfig::new().default_reply(Reply::text("{\"score\": 4}"))).await;
    let out = anthropic(&server, "claude-sonnet-4-5-20250929")
        .write("recipes/score.yaml", CLOSED_RECIPE)
        .args(["delegate", "--source", "score", "--json"])
        .run();
    let json = out.json();
    assert_eq!(json["structured"], json!({"score": 4}), "{json:#}");
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "{}", out.stderr);
    let body = &requests[0].body;
    assert_eq!(
        body["output_config"],
        json!({"format": {"type": "json_schema", "schema": {
            "type": "object", "required": ["score"], "additionalProperties": false,
            "properties": {"score": {"type": "integer"}}}}}),
        "{body:#}"
    );
    let tools = requests[0].tool_names();
    assert!(
        !tools.is_empty(),
        "the task's tools are still offered: {body:#}"
    );
    assert!(!tools.iter().any(|t| t == "structured_answer"), "{tools:?}");
    assert_eq!(body.get("tool_choice"), None, "{body:#}");
}

/// Other models, and schemas Anthropic cannot take natively, keep the answer tool; the config
/// file's `models.<id>.structured_outputs` adds a model.
#[tokio::test(flavor = "multi_thread")]
async fn other_models_and_open_schemas_keep_the_answer_tool_and_the_config_adds_models() {
    let server = MockServer::start(
        MockConfig::new().default_reply(Reply::tool_call("structured_answer", json!({"score": 2}))),
    )
    .await;
    let mechanism = |t: Test| {
        let out = t.args(["delegate", "--source", "score", "--json"]).run();
        assert_eq!(
            out.json()["structured"],
            json!({"score": 2}),
            "{}",
            out.stderr
        );
        let body = server.requests().last().unwrap().body.clone();
        let native = body.get("output_config").is_some();
        let tool = server
            .requests()
            .last()
            .unwrap()
            .tool_names()
            .iter()
            .any(|t| t == "structured_answer");
        assert_ne!(native, tool, "exactly one mechanism: {body:#}");
        native
    };
    // a model without them
    assert!(!mechanism(
        anthropic(&server, "claude-3-5-haiku-latest").write("recipes/score.yaml", CLOSED_RECIPE)
    ));
    // a schema with an open object, on a model with them
    assert!(!mechanism(
        anthropic(&server, "claude-haiku-4-5").write("recipes/score.yaml", SCORE_RECIPE)
    ));
    // the config file adds a model
    server.push_reply(Reply::text("{\"score\": 2}"));
    assert!(mechanism(
        anthropic(&server, "claude-next")
            .write("recipes/score.yaml", CLOSED_RECIPE)
            .write(
                "summon.yaml",
                "models:\n  claude-next: {structured_outputs: true}\n"
            )
    ));
}

/// A 400 refusing `output_config` sends the request again with the answer tool, and every later
/// one; said once.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_output_config_falls_back_to_the_answer_tool() {
    let server = MockServer::start(
        MockConfig::new()
            .replies([Reply::status(
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"output_config.format.schema: this schema is not supported"}}"#,
            )])
            .default_reply(Reply::tool_call("structured_answer", json!({"score": 5}))),
    )
    .await;
    let out = anthropic(&server, "claude-opus-4-6")
        .write("recipes/score.yaml", CLOSED_RECIPE)
        .args(["delegate", "--source", "score", "--json"])
        .run();
    assert_eq!(
        out.json()["structured"],
        json!({"score": 5}),
        "{}",
        out.stderr
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{}", out.stderr);
    assert!(requests[0].body.get("output_config").is_some());
    assert!(requests[1].body.get("output_config").is_none());
    assert!(
        requests[1]
            .tool_names()
            .iter()
            .any(|t| t == "structured_answer")
    );
    assert_eq!(
        out.stderr
            .matches("refused the structured-output request")
            .count(),
        1,
        "{}",
        out.stderr
    );
}

/// `delegate --json` gives the bare value as `output` for a schema sent wrapped, and an
/// answer that misses its schema with no turn left fails as a schema failure, in one request.
#[tokio::test(flavor = "multi_thread")]
async fn delegate_output_is_the_bare_value_and_a_last_turn_miss_is_a_schema_failure() {
    let server = MockServer::start(
        MockConfig::new().default_reply(Reply::text("{\"items\": [\"a\", \"b\"]}")),
    )
    .await;
    let json = openai(&server)
        .write(
            "recipes/list.yaml",
            "title: L\ndescription: d\ninstructions: List.\nresponse:\n  json_schema:\n    type: array\n    items: {type: string}\n",
        )
        .args(["delegate", "--source", "list", "--json"])
        .run()
        .json();
    assert_eq!(json["output"], "[\"a\",\"b\"]", "{json:#}");
    assert_eq!(json["structured"], json!(["a", "b"]));
    let before = server.request_count();
    let out = openai(&server)
        .write(
            "recipes/one.yaml",
            "title: O\ndescription: d\ninstructions: Count.\nsettings: {max_turns: 1}\nresponse:\n  json_schema:\n    type: object\n    required: [n]\n    properties: {n: {type: integer}}\n",
        )
        .args(["delegate", "--source", "one", "--json"])
        .code(2)
        .run();
    let json = out.json();
    assert_eq!(server.request_count() - before, 1, "{}", out.stderr);
    let error = json["error"].as_str().unwrap();
    assert!(
        error.starts_with("the answer does not match the response schema")
            && error.contains("(no turn left to correct it: max_turns is 1)"),
        "{error}"
    );
}

/// A fan-out's own `schema:` is in the dry run as in the run: its mechanism noted, its size in
/// the overhead.
#[test]
fn the_dry_run_notes_a_fan_outs_inline_schema() {
    let pipeline = "version: 1\nname: x\nsteps:\n  - id: rows\n    decompose: {items: [a, b]}\n  - id: each\n    fan_out:\n      over: rows\n      instructions: 'Label {{ item }}'\n      schema: {type: object, required: [label], properties: {label: {type: string}}}\n";
    let out = Test::new()
        .env("OPENAI_API_KEY", "sk-test")
        .env("SUMMON_MODEL", "m")
        .write_raw("p.yaml", pipeline)
        .args(["run", "p.yaml", "--dry-run"])
        .run();
    assert!(
        out.stdout
            .contains("note: structured answers: response_format json_schema"),
        "{}",
        out.stdout
    );
}

/// A recipe that lists at most four areas, each a string.
const AREAS_RECIPE: &str = "
    title: Areas
    description: d
    instructions: List the areas.
    response:
      json_schema:
        type: array
        maxItems: 4
        items: { type: string, maxLength: 20 }
    ";

#[tokio::test(flavor = "multi_thread")]
async fn decompose_by_recipe_asks_for_the_recipes_schema_and_fans_out_its_items() {
    let server = MockServer::start(
        MockConfig::new()
            .replies([Reply::text("{\"items\": [\"api\", \"cli\"]}")])
            .default_reply(Reply::text("described")),
    )
    .await;
    let pipeline = "version: 1\nname: p\nsteps:\n  - id: list\n    decompose:\n      source: areas\n  - id: each\n    fan_out:\n      over: list\n      instructions: 'Describe {{ item }}'\n";
    let out = openai(&server)
        .write("recipes/areas.yaml", AREAS_RECIPE)
        .write_raw("p.yaml", pipeline)
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let requests = server.requests();
    let sent = &requests[0].body["response_format"]["json_schema"]["schema"];
    assert_eq!(
        sent["properties"]["items"],
        json!({"type": "array", "maxItems": 4, "items": {"type": "string", "maxLength": 20}}),
        "{}\n{sent:#}",
        out.stderr
    );
    assert_eq!(fan_out_texts(&server), ["Describe api", "Describe cli"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_decompose_schema_is_sent_over_the_recipes_and_an_object_gives_its_items_array() {
    let server = MockServer::start(
        MockConfig::new()
            .replies([Reply::text(
                "{\"items\": [{\"name\": \"api\"}, {\"name\": \"cli\"}], \"why\": \"two\"}",
            )])
            .default_reply(Reply::text("described")),
    )
    .await;
    let schema = json!({"type": "object", "required": ["items", "why"],
        "properties": {"why": {"type": "string"}, "items": {"type": "array", "maxItems": 3,
            "items": {"type": "object", "required": ["name"],
                "properties": {"name": {"type": "string"}}}}}});
    let pipeline = format!(
        "version: 1\nname: p\nsteps:\n  - id: list\n    decompose:\n      source: areas\n      schema: {schema}\n  - id: each\n    fan_out:\n      over: list\n      instructions: 'Describe {{{{ item.name }}}}'\n"
    );
    let t = openai(&server)
        .write("recipes/areas.yaml", AREAS_RECIPE)
        .write_raw("p.yaml", &pipeline);
    let dry = t
        .command()
        .args(["run", "p.yaml", "--dry-run"])
        .output()
        .unwrap();
    let dry_out = String::from_utf8_lossy(&dry.stdout);
    assert!(
        dry_out.contains("note: items: the answer to the step's `schema:` {"),
        "{dry_out}"
    );
    let out = t.args(["run", "p.yaml", "--out", "out", "--quiet"]).run();
    let requests = server.requests();
    assert_eq!(
        requests[0].body["response_format"]["json_schema"]["schema"]["properties"]["items"]["maxItems"],
        3,
        "{}\n{:#}",
        out.stderr,
        requests[0].body
    );
    assert_eq!(fan_out_texts(&server), ["Describe api", "Describe cli"]);
}

#[test]
fn a_decompose_schema_that_cannot_give_items_is_refused_by_validate() {
    let step_schema = "version: 1\nname: p\nsteps:\n  - id: list\n    decompose:\n      instructions: List.\n      schema: {type: object, properties: {areas: {type: array}}}\n";
    let out = Test::new()
        .write_raw("p.yaml", step_schema)
        .args(["validate", "p.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains(
            "p.yaml:7:15: error: `steps[0].decompose.schema` cannot give the step its items: its root must be an array (`type: array`), or an object whose required `items` property is an array"
        ),
        "{}",
        out.stderr
    );
    let by_recipe =
        "version: 1\nname: p\nsteps:\n  - id: list\n    decompose:\n      source: score\n";
    let out = Test::new()
        .write("recipes/score.yaml", SCORE_RECIPE)
        .write_raw("p.yaml", by_recipe)
        .args(["validate", "p.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains(
            "p.yaml:6:15: error: the `response.json_schema` of `score` cannot give a decompose step its items"
        ),
        "{}",
        out.stderr
    );
}
