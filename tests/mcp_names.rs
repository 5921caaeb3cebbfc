//! MCP servers under real conditions: the names tools are offered under (what providers
//! accept, an agent file's `mcp__server__tool`), a project's `.mcp.json` (only the named
//! servers, `timeout`, `${VAR}` values kept out of the output), what `validate` says about
//! extensions, and what users read when a server fails. Servers: the real
//! `@modelcontextprotocol/server-filesystem` from npm, node itself, and small scripted servers
//! (tests/fixtures/mcp/). The model is the mock server, scripted to call the tools.

use crate::support;

use std::path::Path;

use serde_json::json;
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::mcp::{filesystem_server, fixture, tool_results};
use support::{Test, unindent};

const KEY: &str = "sk-test-mcp-names-0123456789";

fn openai(server: &MockServer) -> Test {
    Test::new()
        .env("SUMMON_TRUST_PROJECT", "1")
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
}

/// A stdio extension entry of a recipe running tests/fixtures/mcp/named.py.
fn named_extension(name: &str, label: &str, tools: &[&str]) -> String {
    let mut args = vec![format!("'{}'", fixture("named.py")), format!("'{label}'")];
    args.extend(tools.iter().map(|t| format!("'{t}'")));
    format!(
        "  - type: stdio\n    name: {name}\n    cmd: python3\n    args: [{}]\n    timeout: 30\n",
        args.join(", ")
    )
}

fn recipe_with(extensions: &str) -> String {
    unindent(
        "
        title: Tools
        description: uses MCP servers
        prompt: Use the tools.
        extensions:
        ",
    ) + extensions
}

fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_names_are_sent_valid_and_unique_and_calls_reach_their_tool() {
    let long = format!("fetch_{}", "very_long_".repeat(7));
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_calls([
            ("raw__dotted_name-with-dash", json!({})),
            ("raw__a_b_2", json!({})),
            ("raw__a_b", json!({})),
        ]),
        Reply::text("done"),
    ]))
    .await;
    let recipe = recipe_with(&named_extension(
        "raw",
        "raw",
        &["dotted.name-with-dash", "a.b", "a_b", &long, "plain"],
    ));
    let out = openai(&server)
        .write_raw("recipes/tools.yaml", &recipe)
        .args(["delegate", "--source", "tools"])
        .run();
    assert_eq!(out.stdout, "done\n", "{}", out.stderr);
    let requests = server.requests();
    let offered: Vec<String> = requests[0]
        .tool_names()
        .into_iter()
        .filter(|n| n.starts_with("raw__"))
        .collect();
    assert_eq!(offered.len(), 5, "{offered:?}");
    for name in &offered {
        assert!(valid_tool_name(name), "`{name}` would be refused");
    }
    let distinct: std::collections::HashSet<&String> = offered.iter().collect();
    assert_eq!(distinct.len(), offered.len(), "{offered:?}");
    // Valid names go as they are; the dotted one that now equals `a_b` gets a number.
    assert_eq!(
        offered[..3],
        ["raw__dotted_name-with-dash", "raw__a_b_2", "raw__a_b"]
    );
    assert_eq!(offered[4], "raw__plain");
    assert!(
        offered[3].starts_with("raw__fetch_very_long_"),
        "{offered:?}"
    );
    // Calls to the offered names reach the server's own tools.
    assert_eq!(
        tool_results(&requests[1]),
        [
            "raw ran dotted.name-with-dash",
            "raw ran a.b",
            "raw ran a_b"
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_servers_offering_one_name_get_two_names() {
    // `fs` + `_echo` and `fs_` + `echo` both read `fs___echo`.
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_calls([("fs___echo", json!({})), ("fs___echo_2", json!({}))]),
        Reply::text("done"),
    ]))
    .await;
    let recipe = recipe_with(
        &(named_extension("fs", "first", &["_echo"])
            + &named_extension("fs_", "second", &["echo"])),
    );
    let out = openai(&server)
        .write_raw("recipes/tools.yaml", &recipe)
        .args(["delegate", "--source", "tools"])
        .run();
    assert_eq!(out.stdout, "done\n", "{}", out.stderr);
    let requests = server.requests();
    let offered: Vec<String> = requests[0]
        .tool_names()
        .into_iter()
        .filter(|n| n.starts_with("fs_"))
        .collect();
    assert_eq!(offered, ["fs___echo", "fs___echo_2"]);
    assert_eq!(
        tool_results(&requests[1]),
        ["first ran _echo", "second ran echo"]
    );
}

const BAD_NAMES: &str = "
    title: t
    description: d
    prompt: p
    extensions:
      - type: stdio
        name: my ext
        cmd: srv
      - type: stdio
        name: fs
        cmd: srv
      - type: streamable_http
        name: fs
        uri: http://127.0.0.1:1/mcp
      - type: sse
        name: old
        uri: http://127.0.0.1:1/sse
    ";

#[test]
fn validate_rejects_invalid_and_duplicate_extension_names_at_their_line() {
    let out = Test::new()
        .env("SUMMON_TRUST_PROJECT", "1")
        .write("recipes/r.yaml", BAD_NAMES)
        .args(["--color", "never", "validate", "recipes/r.yaml"])
        .code(1)
        .run();
    for needle in [
        "recipes/r.yaml:6:11: error: extension name `my ext` cannot start a tool name: use \
         letters, digits, `_` and `-` only, at most 60 of them",
        "recipes/r.yaml:12:11: error: extension `fs` is listed twice (first at line 9): one \
         name per extension",
        "recipes/r.yaml:14:11: warning: extension `old`: `type: sse` is MCP's deprecated \
         HTTP+SSE transport",
        "2 error(s), 1 warning(s)",
    ] {
        assert!(
            out.stderr.contains(needle),
            "want: {needle}\n---\n{}",
            out.stderr
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_recipe_with_a_bad_extension_name_does_not_run() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ran"))).await;
    let out = openai(&server)
        .write("recipes/r.yaml", BAD_NAMES)
        .args(["--color", "never", "delegate", "--source", "r"])
        .output();
    assert_ne!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("extension name `my ext` cannot start a tool name"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stdout, "");
    assert_eq!(server.request_count(), 0, "the task ran");
}

#[test]
fn validate_warns_about_sse_alone() {
    let out = Test::new()
        .env("SUMMON_TRUST_PROJECT", "1")
        .write(
            "recipes/r.yaml",
            "
            title: t
            description: d
            prompt: p
            extensions:
              - type: sse
                name: old
                uri: http://127.0.0.1:1/sse
            ",
        )
        .args(["--color", "never", "validate", "recipes/r.yaml"])
        .run();
    assert!(
        out.stderr.contains(
            "recipes/r.yaml:5:11: warning: extension `old`: `type: sse` is MCP's deprecated \
             HTTP+SSE transport, which summon does not connect to; the extension is left out \
             (use `streamable_http` if the server offers it)"
        ),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_gets_the_tool_under_the_name_its_file_gives() {
    let bin = filesystem_server();
    let test = Test::new().env("SUMMON_TRUST_PROJECT", "1");
    let notes = test.path().canonicalize().unwrap().join("notes.txt");
    std::fs::write(&notes, "read through the agent's own name\n").unwrap();
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call(
            "mcp__fs__read_text_file",
            json!({"path": notes.display().to_string()}),
        ),
        Reply::text("read it"),
    ]))
    .await;
    let out = test
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_TRUST_PROJECT", "1")
        .write(
            ".mcp.json",
            &format!(
                r#"{{"mcpServers": {{"fs": {{"command": "{}", "args": ["."]}}}}}}"#,
                bin.display()
            ),
        )
        .write(
            ".agents/agents/reader.md",
            "
            ---
            name: reader
            description: reads files
            tools: [mcp__fs__read_text_file]
            ---
            You read files.
            ",
        )
        .args([
            "delegate",
            "--source",
            "reader",
            "--instructions",
            "Read notes.txt.",
        ])
        .run();
    assert_eq!(out.stdout, "read it\n", "{}", out.stderr);
    let requests = server.requests();
    assert_eq!(requests[0].tool_names(), ["mcp__fs__read_text_file"]);
    assert_eq!(
        tool_results(&requests[1]),
        ["read through the agent's own name\n"]
    );
    assert!(
        out.stderr.contains("mcp__fs__read_text_file: completed"),
        "{}",
        out.stderr
    );
}

/// `.mcp.json` with `servers` (name, JSON object text), one per line from line 2.
fn mcp_json(servers: &[(&str, String)]) -> String {
    let entries: Vec<String> = servers
        .iter()
        .map(|(name, body)| format!("  \"{name}\": {body}"))
        .collect();
    format!("{{\"mcpServers\": {{\n{}\n}}}}\n", entries.join(",\n"))
}

fn misbehaving(mode: &str, extra: &str) -> String {
    format!(
        r#"{{"command": "python3", "args": ["{}", "{mode}"]{extra}}}"#,
        fixture("misbehaving.py")
    )
}

fn agent(tools: &str) -> String {
    format!("---\nname: helper\ndescription: helps\ntools: {tools}\n---\nYou help.\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_named_servers_are_resolved_and_their_values_are_redacted() {
    const TOKEN: &str = "tok-0123456789-from-the-environment";
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("mcp__bad__env", json!({"name": "SERVICE_TOKEN"})),
        Reply::text(format!("the token is {TOKEN}")),
    ]))
    .await;
    let out = openai(&server)
        .env("SUMMON_TRUST_PROJECT", "1")
        .env("MCP_NAMES_TOKEN", TOKEN)
        .write_raw(
            ".mcp.json",
            &mcp_json(&[
                (
                    "bad",
                    misbehaving("ok", r#", "env": {"SERVICE_TOKEN": "${MCP_NAMES_TOKEN}"}"#),
                ),
                (
                    "other",
                    r#"{"command": "srv", "env": {"KEY": "${MCP_NAMES_NOT_SET}"}}"#.to_owned(),
                ),
            ]),
        )
        .write_raw(".agents/agents/helper.md", &agent("mcp__bad__env"))
        .args(["delegate", "--source", "helper", "--instructions", "Go."])
        .run();
    // The server got the value; nothing summon prints shows it.
    assert_eq!(tool_results(&server.requests()[1]), [TOKEN]);
    assert_eq!(out.stdout, "the token is [redacted]\n", "{}", out.stderr);
    assert!(!out.stderr.contains(TOKEN), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_timeout_in_milliseconds_bounds_its_calls() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("mcp__slow__echo", json!({"text": "x"})),
        Reply::text("gave up"),
    ]))
    .await;
    let out = openai(&server)
        .env("SUMMON_TRUST_PROJECT", "1")
        .write_raw(
            ".mcp.json",
            &mcp_json(&[("slow", misbehaving("hang", r#", "timeout": 1500"#))]),
        )
        .write_raw(".agents/agents/helper.md", &agent("mcp__slow__echo"))
        .args(["delegate", "--source", "helper", "--instructions", "Go."])
        .run();
    assert_eq!(out.stdout, "gave up\n", "{}", out.stderr);
    let results = tool_results(&server.requests()[1]);
    assert!(
        results[0].contains("did not answer within 1.5s"),
        "{results:?}"
    );
}

#[test]
fn a_server_timeout_that_is_not_milliseconds_is_an_error_at_its_line() {
    let out = Test::new()
        .env("SUMMON_TRUST_PROJECT", "1")
        .env("SUMMON_TRUST_PROJECT", "1")
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .write_raw(
            ".mcp.json",
            &mcp_json(&[
                ("fine", misbehaving("ok", "")),
                ("slow", misbehaving("ok", r#", "timeout": "soon""#)),
            ]),
        )
        .write_raw(".agents/agents/helper.md", &agent("mcp__slow__echo"))
        .args([
            "--color",
            "never",
            "delegate",
            "--source",
            "helper",
            "--instructions",
            "Go.",
        ])
        .output();
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains(".mcp.json:3:")
            && out.stderr.contains(
                "error: server `slow`: `timeout` must be a positive number of milliseconds (as in \
             Claude Code), found `soon`"
            ),
        "{}",
        out.stderr
    );
    assert_eq!(out.stdout, "");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_dies_with_a_stack_trace_is_quoted_from_its_error_line() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("fine"))).await;
    let recipe = recipe_with(
        "  - type: stdio\n    name: broken\n    cmd: node\n    \
         args: ['-e', \"require('summon-no-such-module')\"]\n    timeout: 30\n",
    );
    let out = openai(&server)
        .write_raw("recipes/tools.yaml", &recipe)
        .args(["--color", "never", "delegate", "--source", "tools"])
        .stdout("fine\n")
        .run();
    assert!(
        out.stderr.contains("extension `broken` did not start"),
        "{}",
        out.stderr
    );
    // node prints the error, then a dozen stack lines: the error line is kept.
    assert!(
        out.stderr
            .contains("(stderr: Error: Cannot find module 'summon-no-such-module' | … |"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("Node.js v"), "{}", out.stderr);
}

/// A recipe whose extension `bad` exits before the handshake (misbehaving.py `exit`).
fn failing_extension_recipe() -> String {
    recipe_with(&format!(
        "  - type: stdio\n    name: bad\n    cmd: python3\n    args: ['{}', 'exit']\n    \
         timeout: 30\n",
        fixture("misbehaving.py")
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn delegate_json_lists_the_extension_warnings() {
    let server =
        MockServer::start(MockConfig::new().default_reply(Reply::text("did without"))).await;
    let out = openai(&server)
        .write_raw("recipes/tools.yaml", &failing_extension_recipe())
        .args(["delegate", "--source", "tools", "--json"])
        .run();
    let json = out.json();
    assert_eq!(json["status"], "completed");
    let warnings = json["warnings"].as_array().expect("a warnings list");
    assert_eq!(warnings.len(), 1, "{json:#}");
    let warning = warnings[0].as_str().unwrap();
    assert!(
        warning.starts_with("extension `bad` did not start:")
            && warning.contains("cannot start: missing configuration"),
        "{warning}"
    );
}

fn pipeline(on_extension_error: &str) -> String {
    format!(
        "version: 1\nname: p\nsettings:\n  concurrency: 1\nsteps:\n  - id: list\n    \
         decompose:\n      items: [alpha, beta]\n  - id: work\n    fan_out:\n      over: list\n      \
         source: tools\n{on_extension_error}"
    )
}

fn results_lines(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("out/results.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pipeline_task_whose_extension_failed_says_so_everywhere() {
    let server =
        MockServer::start(MockConfig::new().default_reply(Reply::text("did without"))).await;
    let out = openai(&server)
        .write_raw("recipes/tools.yaml", &failing_extension_recipe())
        .write_raw("p.yaml", &pipeline(""))
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    // The warning names the step and the item.
    for item in ["alpha", "beta"] {
        let needle =
            format!("summon: warning: step `work`, item `{item}`: extension `bad` did not start:");
        assert!(
            out.stderr.contains(&needle),
            "{needle}\n---\n{}",
            out.stderr
        );
    }
    let text = std::fs::read_to_string(out.dir.join("out/results.jsonl")).unwrap();
    let first = text.lines().next().unwrap();
    // The trace ends with the task's overhead (`prompt`, `overhead_tokens`, `tool_tokens`).
    let trace_end = first
        .find(r#""prompt":"Use the tools.","overhead_tokens":"#)
        .and_then(|at| first[at..].find(r#","tool_tokens":"#).map(|t| at + t))
        .expect("the trace");
    let after = first[trace_end..]
        .trim_start_matches(r#","tool_tokens":"#)
        .trim_start_matches(|c: char| c.is_ascii_digit());
    assert!(
        after.starts_with(r#","warnings":["extension `bad` did not start:"#),
        "`warnings` follows the task's trace: {first}"
    );
    let lines = results_lines(&out.dir);
    assert_eq!(lines.len(), 2);
    for line in &lines {
        assert_eq!(line["status"], "completed", "{line}");
        assert_eq!(line["warnings"].as_array().unwrap().len(), 1, "{line}");
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.dir.join("out/report.json")).unwrap())
            .unwrap();
    let warnings = report["warnings"].as_array().expect("report warnings");
    let mut items: Vec<&str> = warnings
        .iter()
        .map(|w| w["item"].as_str().unwrap())
        .collect();
    items.sort_unstable();
    assert_eq!(items, ["alpha", "beta"], "{report:#}");
    assert!(warnings.iter().all(|w| {
        w["step"] == "work"
            && w["message"]
                .as_str()
                .unwrap()
                .starts_with("extension `bad` did not start:")
    }));
    assert_eq!(report["total"]["failed"], 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn on_extension_error_fail_fails_the_task() {
    let server =
        MockServer::start(MockConfig::new().default_reply(Reply::text("did without"))).await;
    let out = openai(&server)
        .write_raw("recipes/tools.yaml", &failing_extension_recipe())
        .write_raw("p.yaml", &pipeline("    on_extension_error: fail\n"))
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .code(2)
        .run();
    // The step fails fast: its first task failed, the second never started.
    let lines = results_lines(&out.dir);
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    for line in &lines {
        assert_eq!(line["status"], "failed", "{line}");
        let error = line["error"].as_str().unwrap();
        assert!(
            error.starts_with("extension `bad` did not start:")
                && error.ends_with("(the step sets on_extension_error: fail)"),
            "{error}"
        );
        assert_eq!(line["warnings"].as_array().unwrap().len(), 1, "{line}");
    }
}

#[test]
fn validate_checks_on_extension_error() {
    let out = Test::new()
        .env("SUMMON_TRUST_PROJECT", "1")
        .write_raw("p.yaml", &pipeline("    on_extension_error: maybe\n"))
        .write_raw("recipes/tools.yaml", &failing_extension_recipe())
        .args(["--color", "never", "validate", "p.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains("p.yaml:13:25: error:") && out.stderr.contains("`maybe`"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("warn") && out.stderr.contains("fail"),
        "{}",
        out.stderr
    );
}

/// The per-task overhead counts the MCP tools a task was offered, as sent.
#[tokio::test(flavor = "multi_thread")]
async fn the_per_task_overhead_counts_mcp_tools() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("done"))).await;
    let out = openai(&server)
        .write_raw(
            "recipes/tools.yaml",
            &recipe_with(&named_extension("docs", "docs", &["lookup", "summarize"])),
        )
        .write_raw("p.yaml", &pipeline(""))
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{}", out.stderr);
    let names = requests[0].tool_names();
    assert!(names.iter().any(|n| n == "docs__lookup"), "{names:?}");
    // Name, description and compact parameter schema of each tool sent, as summon counts.
    let tool_bytes: usize = requests[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let f = &t["function"];
            f["name"].as_str().unwrap().len()
                + f["description"].as_str().unwrap_or_default().len()
                + f["parameters"].to_string().len()
        })
        .sum();
    for line in results_lines(&out.dir) {
        assert_eq!(line["tool_tokens"], tool_bytes.div_ceil(4) as u64, "{line}");
        assert!(
            line["overhead_tokens"].as_u64().unwrap() > line["tool_tokens"].as_u64().unwrap(),
            "{line}"
        );
    }
    // The dry run starts no server: it counts the built-in tools alone, and says so.
    let plan = openai(&server)
        .write_raw(
            "recipes/tools.yaml",
            &recipe_with(&named_extension("docs", "docs", &["lookup", "summarize"])),
        )
        .write_raw("p.yaml", &pipeline(""))
        .args(["run", "p.yaml", "--dry-run", "--json"])
        .run()
        .json();
    let planned = plan["steps"][1]["overhead"]["tool_tokens_per_task_max"]
        .as_u64()
        .unwrap();
    assert!(planned < tool_bytes.div_ceil(4) as u64, "{plan:#}");
    assert!(
        plan["steps"][1]["notes"]
            .to_string()
            .contains("are not counted: a dry run starts no MCP server"),
        "{plan:#}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_background_task_whose_extension_failed_says_so_when_loaded() {
    let server =
        MockServer::start(MockConfig::new().default_reply(Reply::text("did without"))).await;
    let t = openai(&server).write_raw("recipes/tools.yaml", &failing_extension_recipe());
    let run = |args: &[&str]| {
        let out = t.command().args(args).output().expect("run summon");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = run(&["delegate", "--source", "tools", "--async", "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let started: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let id = started["task_id"].as_str().expect("a task id").to_owned();

    let (code, stdout, stderr) = run(&["load", &id, "--json", "--timeout", "60"]);
    assert_eq!(code, Some(0), "{stderr}");
    let loaded: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(loaded["status"], "completed", "{loaded}");
    assert_eq!(loaded["output"], "did without", "{loaded}");
    let warnings = loaded["warnings"].as_array().expect("a warnings list");
    assert_eq!(warnings.len(), 1, "{loaded:#}");
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .starts_with("extension `bad` did not start:"),
        "{loaded:#}"
    );

    // Loaded again as text: the answer on stdout, the warning with the task's metadata.
    let (code, stdout, stderr) = run(&["load", &id]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, "did without\n");
    assert!(
        stderr.contains("\nWarning: extension `bad` did not start:"),
        "{stderr}"
    );
}
