//! Hostile input, end to end: a mock model that calls the built-in tools with paths that try
//! to leave the working directory, calls tools it does not have, sends malformed arguments,
//! a thousand calls in one turn or a multi-megabyte answer; and parameter values and CSV cells
//! that try template injection. Each case asserts what must happen: the refusal the model
//! reads, nothing touched outside, the run finishing, the text staying literal.
//!
//! With `SUMMON_FIGURES=FILE`, each case appends `{"kind":"hostile","case":...,"passed":...}`
//! to FILE (read by `benches/reliability.py`).

use crate::support;

use std::path::Path;

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, RecordedRequest, Reply};
use support::Test;

const KEY: &str = "sk-test-hostile-0123456789abcdef";

/// A value that tries template injection wherever it is substituted.
const INJECTION: &str = "{{ 7*7 }} {% include '/etc/passwd' %} {{ recipe_dir }} {# c #}";

/// A project wired to the mock as an OpenAI-compatible provider.
fn project(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
}

/// Records one hostile case in `$SUMMON_FIGURES` when dropped: passed unless the test is
/// panicking (an assertion failed).
struct Case(&'static str);

impl Drop for Case {
    fn drop(&mut self) {
        let Ok(path) = std::env::var("SUMMON_FIGURES") else {
            return;
        };
        use std::io::Write;
        let line = json!({"kind": "hostile", "case": self.0, "passed": !std::thread::panicking()});
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = file.write_all(format!("{line}\n").as_bytes());
        }
    }
}

/// The tool results of a request, in order, as `(content, is_error)`; OpenAI marks an error
/// with an `Error: ` prefix.
fn tool_results(request: &RecordedRequest) -> Vec<(String, bool)> {
    request.body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            let content = m["content"].as_str().unwrap_or("").to_owned();
            let is_error = content.starts_with("Error: ");
            (content, is_error)
        })
        .collect()
}

fn first_user(request: &RecordedRequest) -> String {
    request.body["messages"][1]["content"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

fn system(request: &RecordedRequest) -> String {
    request.body["messages"][0]["content"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

/// Every file name under `dir`, recursively, relative and sorted.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            out.push(path.strip_prefix(dir).unwrap().display().to_string());
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

/// A working directory `work/` with a sibling `outside/` holding a secret, and symlinks from
/// inside to outside. The model's calls run with `--working-dir work`.
fn sandbox(t: Test) -> Test {
    let t = t
        .write_raw("work/inside.txt", "inside\n")
        .write_raw("outside/secret.txt", "top secret\n");
    let root = t.path().to_path_buf();
    std::os::unix::fs::symlink(root.join("outside/secret.txt"), root.join("work/link_out"))
        .unwrap();
    std::os::unix::fs::symlink(root.join("outside"), root.join("work/dir_out")).unwrap();
    std::os::unix::fs::symlink(root.join("outside/made.txt"), root.join("work/dangling")).unwrap();
    t
}

#[tokio::test(flavor = "multi_thread")]
async fn path_escapes_are_refused_by_every_file_tool() {
    let _case = Case("tool_path_escapes");
    let server = MockServer::start(MockConfig::new()).await;
    let t = sandbox(project(&server).env("SECRET_PROBE", "probe-value-42"));
    let root = t.path().to_path_buf();
    let outside_abs = root.join("outside/secret.txt").display().to_string();
    let outside_new = root.join("outside/new.txt").display().to_string();
    let long = "a/".repeat(2500);
    let escapes: Vec<String> = vec![
        "../outside/secret.txt".into(),
        "sub/../../outside/secret.txt".into(),
        "nothere/../../outside/secret.txt".into(),
        outside_abs.clone(),
        outside_new,
        "/etc/passwd".into(),
        "/proc/self/environ".into(),
        "/proc/self/cwd/../outside/secret.txt".into(),
        "link_out".into(),
        "dir_out/secret.txt".into(),
        "dir_out/new.txt".into(),
        "dangling".into(),
        long,
        "inside.txt\0../../outside/secret.txt".into(),
    ];
    let mut calls: Vec<(&str, Value)> = Vec::new();
    for path in &escapes {
        calls.push(("read_file", json!({"path": path})));
        calls.push(("write_file", json!({"path": path, "content": "pwned"})));
        calls.push((
            "edit_file",
            json!({"path": path, "old_string": "top secret", "new_string": "pwned"}),
        ));
        calls.push(("list_files", json!({"path": path})));
        calls.push(("search", json!({"pattern": "secret", "path": path})));
    }
    let refused = calls.len();
    // Folders outside, for the folder tools.
    for path in ["..", "../outside", "/", "/proc/self", "dir_out"] {
        calls.push(("list_files", json!({"path": path})));
        calls.push(("search", json!({"pattern": "top s.cret", "path": path})));
    }
    let refused_folders = calls.len();
    // Inside the working directory, whatever the pattern says, nothing outside is reached.
    calls.push(("list_files", json!({"pattern": "../**"})));
    calls.push(("list_files", json!({"pattern": "/etc/*"})));
    calls.push(("list_files", json!({})));
    calls.push(("search", json!({"pattern": "top s.cret"})));
    calls.push(("search", json!({"pattern": "top s.cret", "glob": "../**"})));
    // A name longer than a file system allows is an error, not a crash.
    calls.push((
        "write_file",
        json!({"path": "x".repeat(300), "content": "long"}),
    ));

    server.push_reply(Reply::tool_calls(calls.clone()));
    server.push_reply(Reply::text("done"));
    let _out = t
        .args([
            "delegate",
            "--instructions",
            "escape",
            "--working-dir",
            "work",
        ])
        .stdout("done\n")
        .run();

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let results = tool_results(&requests[1]);
    assert_eq!(results.len(), calls.len());
    for (i, ((tool, args), (content, is_error))) in calls.iter().zip(&results).enumerate() {
        if i < refused_folders {
            assert!(*is_error, "{tool} {args} was not refused: {content}");
            assert!(
                content.contains("outside the working directory")
                    || content.contains("invalid path"),
                "{tool} {args}: {content}"
            );
        }
        assert!(!content.contains("top secret"), "{tool} {args}: {content}");
        assert!(!content.contains("root:x:0"), "{tool} {args}: {content}");
        assert!(
            !content.contains("probe-value-42"),
            "{tool} {args}: {content}"
        );
        assert!(content.len() < 2000, "{tool}: {} bytes", content.len());
    }
    assert!(refused > 0);
    let listing = &results[refused_folders + 2].0;
    assert!(listing.contains("inside.txt"), "{listing}");
    assert!(!listing.contains("secret.txt"), "{listing}");
    assert!(
        results[refused_folders + 5].1,
        "an over-long name must fail"
    );

    // Nothing outside was touched, nothing new appeared.
    assert_eq!(
        std::fs::read_to_string(root.join("outside/secret.txt")).unwrap(),
        "top secret\n"
    );
    assert_eq!(tree(&root.join("outside")), ["secret.txt"]);
    assert_eq!(
        tree(&root.join("work")),
        ["dangling", "dir_out", "inside.txt", "link_out"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn shell_gets_no_api_key_and_a_restricted_shell_runs_only_its_patterns() {
    let _case = Case("shell_secrets_and_restriction");
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_calls([
            (
                "shell",
                json!({"command": "env; tr '\\0' '\\n' < /proc/self/environ"}),
            ),
            ("shell", json!({"command": "echo $OPENAI_API_KEY"})),
        ]),
        Reply::text("full shell done"),
        Reply::tool_calls([
            ("shell", json!({"command": "cat ../outside/secret.txt"})),
            (
                "shell",
                json!({"command": "git log; cat ../outside/secret.txt"}),
            ),
            (
                "shell",
                json!({"command": "git log $(cat ../outside/secret.txt)"}),
            ),
            (
                "shell",
                json!({"command": "git log\ncat ../outside/secret.txt"}),
            ),
            ("read_file", json!({"path": "inside.txt"})),
        ]),
        Reply::text("restricted done"),
    ]))
    .await;
    let t = sandbox(project(&server))
        .write(
            "recipes/dev.yaml",
            "
            title: Dev
            description: d
            instructions: work
            extensions:
              - type: builtin
                name: developer
            ",
        )
        .write(
            ".claude/agents/logger.md",
            "
            ---
            name: logger
            description: reads the log
            tools: Bash(git log*)
            ---
            Read the log.
            ",
        );
    let out = t
        .command()
        .args(["delegate", "--source", "dev", "--working-dir", "work"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = t
        .command()
        .args([
            "delegate",
            "--source",
            "logger",
            "--instructions",
            "log",
            "--extensions",
            "developer",
            "--working-dir",
            "work",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 4);
    let full = tool_results(&requests[1]);
    assert_eq!(full.len(), 2);
    assert!(full[0].0.contains("PATH="), "{}", full[0].0);
    for (content, _) in &full {
        assert!(
            !content.contains(KEY),
            "the key reached the model: {content}"
        );
    }
    let restricted = tool_results(&requests[3]);
    assert_eq!(restricted.len(), 5);
    for (content, is_error) in &restricted[..4] {
        assert!(is_error, "{content}");
        assert!(content.contains("command not allowed"), "{content}");
    }
    // The restricted agent has no read_file: its call is an unknown tool.
    assert!(
        restricted[4].0.contains("unknown_tool"),
        "{}",
        restricted[4].0
    );
    for (content, _) in restricted {
        assert!(!content.contains("top secret"), "{content}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tools_outside_the_list_run_nothing() {
    let _case = Case("unknown_tool");
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_calls([
            ("shell", json!({"command": "touch pwned"})),
            ("delegate", json!({"instructions": "touch pwned"})),
            ("summon__delegate", json!({"instructions": "x"})),
            ("write_file", json!({"path": "written.txt", "content": "x"})),
            ("../../bin/sh", json!({"command": "touch pwned"})),
            ("", json!({})),
            ("read_file", json!({"path": "inside.txt"})),
        ]),
        Reply::text("done"),
    ]))
    .await;
    let out = sandbox(project(&server))
        .write(
            ".claude/agents/reader.md",
            "
            ---
            name: reader
            description: reads
            tools: Read
            ---
            Read things.
            ",
        )
        .args([
            "delegate",
            "--source",
            "reader",
            "--instructions",
            "read",
            "--working-dir",
            "work",
        ])
        .stdout("done\n")
        .run();
    let results = tool_results(&server.requests()[1]);
    assert_eq!(results.len(), 7);
    for (content, is_error) in &results[..6] {
        assert!(is_error, "{content}");
        assert!(
            content.starts_with("Error: unknown_tool:") && content.contains("nothing was run"),
            "{content}"
        );
        assert!(
            content.contains("Available tools: read_file, load."),
            "{content}"
        );
    }
    assert_eq!(results[6], ("inside\n".to_owned(), false));
    assert!(!out.dir.join("work/pwned").exists());
    assert!(!out.dir.join("pwned").exists());
    assert!(!out.dir.join("work/written.txt").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_tool_arguments_are_tool_errors() {
    let _case = Case("malformed_arguments");
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_calls([
            ("read_file", json!("this is not JSON {")),
            ("read_file", json!([1, 2, 3])),
            ("read_file", json!("[\"inside.txt\"]")),
            ("read_file", json!("\"inside.txt\"")),
            ("write_file", json!({"path": 7, "content": "x"})),
            ("write_file", json!({"path": "w.txt"})),
            (
                "edit_file",
                json!({"path": "inside.txt", "old_string": ["a"]}),
            ),
            ("list_files", json!({"pattern": "[unclosed"})),
            ("search", json!({"pattern": "(unclosed"})),
            ("read_file", json!({"path": "inside.txt", "limit": -3})),
            ("read_file", json!(7)),
        ]),
        Reply::text("survived"),
    ]))
    .await;
    let out = sandbox(project(&server))
        .args(["delegate", "--instructions", "x", "--working-dir", "work"])
        .stdout("survived\n")
        .run();
    let results = tool_results(&server.requests()[1]);
    assert_eq!(results.len(), 11);
    // The history carries every call's arguments as a JSON object (servers parse them); what
    // was wrong with them is in the tool results.
    let replayed = server.requests()[1].body["messages"][2]["tool_calls"].clone();
    let replayed = replayed.as_array().expect("the calls replayed");
    assert_eq!(replayed.len(), 11);
    for call in replayed {
        let arguments = call["function"]["arguments"].as_str().expect("text");
        let parsed: serde_json::Value = serde_json::from_str(arguments).expect("JSON");
        assert!(parsed.is_object(), "{call}");
    }
    let expect = [
        "not valid JSON",
        "must be a JSON object, got an array",
        "must be a JSON object, got an array",
        "must be a JSON object, got a string",
        "`path` must be a string, got a number",
        "missing required field `content`",
        "`old_string` must be a string, got an array",
        "invalid glob pattern",
        "invalid regex",
        "non-negative integer",
        "must be a JSON object, got a number",
    ];
    for ((content, is_error), want) in results.iter().zip(expect) {
        assert!(is_error, "{content}");
        assert!(content.contains(want), "want {want:?}: {content}");
    }
    assert!(!out.dir.join("work/w.txt").exists());
    assert_eq!(
        std::fs::read_to_string(out.dir.join("work/inside.txt")).unwrap(),
        "inside\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_tool_calls_in_one_turn_all_run_and_the_run_ends() {
    let _case = Case("thousand_tool_calls");
    const N: usize = 1000;
    let calls: Vec<(String, Value)> = (0..N)
        .map(|i| {
            (
                "write_file".to_owned(),
                json!({"path": format!("out/f{i:04}.txt"), "content": format!("{i}")}),
            )
        })
        .collect();
    let server = MockServer::start(
        MockConfig::new().replies([Reply::tool_calls(calls), Reply::text("wrote them all")]),
    )
    .await;
    let out = project(&server)
        .args(["delegate", "--instructions", "write", "--json"])
        .run();
    let json = out.json();
    assert_eq!(json["status"], "completed", "{json}");
    assert_eq!(server.request_count(), 2);
    let results = tool_results(&server.requests()[1]);
    assert_eq!(results.len(), N);
    assert!(results.iter().all(|(_, is_error)| !is_error));
    let written = tree(&out.dir.join("out"));
    assert_eq!(written.len(), N);
    assert_eq!(
        std::fs::read_to_string(out.dir.join("out/f0999.txt")).unwrap(),
        "999"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_multi_megabyte_answer_reaches_stdout_whole() {
    let _case = Case("multi_megabyte_answer");
    let line = "ünïcödé line with {{ braces }} and a tab\t and \"quotes\" — 0123456789\n";
    let answer: String = line.repeat(8 * 1024 * 1024 / line.len());
    assert!(answer.len() > 8_000_000);
    let server = MockServer::start(
        MockConfig::new().replies([Reply::text(answer.clone()), Reply::text(answer.clone())]),
    )
    .await;
    let t = project(&server);
    let out = t
        .command()
        .args(["delegate", "--instructions", "big"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.len(), answer.len(), "stdout was cut");
    assert!(stdout == answer || stdout == format!("{}\n", answer.trim_end()));
    let out = t
        .command()
        .args(["delegate", "--instructions", "big", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["output"].as_str().map(str::len), Some(answer.len()));
}

#[tokio::test(flavor = "multi_thread")]
async fn parameter_values_stay_literal_text() {
    let _case = Case("param_template_injection");
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let t = project(&server)
        .write(
            "recipes/review.yaml",
            "
            title: Review
            description: d
            instructions: 'Review {{ target }} carefully.'
            prompt: 'Start with {{ target }}: now'
            parameters:
              - key: target
                input_type: string
                requirement: required
                description: what to review
            ",
        )
        .write_raw("params.yaml", &format!("target: {}\n", json!(INJECTION)));
    let run = |args: &[&str]| {
        let out = t.command().args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let param = format!("target={INJECTION}");
    run(&["delegate", "--source", "review", "--param", &param]);
    run(&["delegate", "--source", "review", "--params", "params.yaml"]);
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    for request in &requests {
        assert!(
            system(request).contains(&format!("Review {INJECTION} carefully.")),
            "{}",
            system(request)
        );
        assert_eq!(first_user(request), format!("Start with {INJECTION}: now"));
        let body = request.body.to_string();
        assert!(!body.contains("root:x:0"), "a value was rendered: {body}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn csv_cells_and_pipeline_parameters_stay_literal_text() {
    let _case = Case("csv_template_injection");
    let server = MockServer::start(MockConfig::new()).await;
    let cells = [
        "{{ 7*7 }}",
        "{% include '/etc/passwd' %}",
        "{{ steps.rows.items }}",
        "{% for x in range(999999999) %}x{% endfor %}",
        "{{ item }} {{ loop.index }}",
        "{% raw %}",
        "{#",
    ];
    let mut csv = String::from("id,text\n");
    for (i, cell) in cells.iter().enumerate() {
        csv.push_str(&format!("{i},\"{}\"\n", cell.replace('"', "\"\"")));
    }
    let out = project(&server)
        .write_raw("rows.csv", &csv)
        .write(
            "recipes/look.yaml",
            "
            title: Look
            description: d
            instructions: Look closely.
            prompt: 'Look at {{ text }}'
            parameters:
              - key: text
                input_type: string
                requirement: required
                description: the text
            ",
        )
        .write(
            "p.yaml",
            r#"
            version: 1
            name: injection
            parameters:
              - key: since
                input_type: string
                requirement: required
                description: a value
            steps:
              - id: rows
                decompose:
                  file: rows.csv
              - id: adhoc
                fan_out:
                  over: rows
                  instructions: "Row {{ item.id }}: {{ item.text }} since {{ since }}"
              - id: sourced
                fan_out:
                  over: rows
                  source: look
                  parameters: { text: "{{ item.text }}" }
            "#,
        )
        .args([
            "run",
            "p.yaml",
            "--param",
            &format!("since={INJECTION}"),
            "--out",
            "out",
            "--quiet",
        ])
        .run();
    let firsts: Vec<String> = support::chats(&server).iter().map(first_user).collect();
    assert_eq!(firsts.len(), 2 * cells.len());
    for (i, cell) in cells.iter().enumerate() {
        let adhoc = format!("Row {i}: {cell} since {INJECTION}");
        assert!(firsts.contains(&adhoc), "missing {adhoc:?} in {firsts:#?}");
        let sourced = format!("Look at {cell}");
        assert!(
            firsts.contains(&sourced),
            "missing {sourced:?} in {firsts:#?}"
        );
    }
    for first in &firsts {
        assert!(!first.contains("root:x:0"), "{first}");
    }
    let lines = std::fs::read_to_string(out.dir.join("out/results.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 2 * cells.len());
}

#[tokio::test(flavor = "multi_thread")]
async fn model_output_in_a_decompose_command_is_data() {
    let _case = Case("decompose_command_injection");
    let answer = "'; touch pwned1; ' $(touch pwned2) `touch pwned3` \"; touch pwned4; \"";
    let server = MockServer::start(
        MockConfig::new()
            .replies([Reply::text(answer)])
            .default_reply(Reply::text("ok")),
    )
    .await;
    let out = project(&server)
        .write(
            "p.yaml",
            r#"
            version: 1
            name: quoting
            steps:
              - id: ask
                delegate: {instructions: "Name a file."}
              - id: bare
                decompose:
                  command: "printf '%s\\n' {{ steps.ask.output }}"
              - id: quoted
                decompose:
                  command: "printf '%s\\n' '{{ steps.ask.output }}' \"{{ steps.ask.output | tojson }}\""
              - id: each
                fan_out:
                  over: bare
                  instructions: "bare: {{ item }}"
              - id: each2
                fan_out:
                  over: quoted
                  instructions: "quoted: {{ item }}"
            "#,
        )
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    for n in 1..=4 {
        assert!(
            !out.dir.join(format!("pwned{n}")).exists(),
            "model output ran as a command: pwned{n}\n{}",
            out.stderr
        );
    }
    let firsts: Vec<String> = server.requests().iter().map(first_user).collect();
    let tojson = serde_json::to_string(answer)
        .unwrap()
        .replace('\'', "\\u0027");
    for expected in [
        format!("bare: {answer}"),
        format!("quoted: {answer}"),
        format!("quoted: {tojson}"),
    ] {
        assert!(
            firsts.contains(&expected),
            "missing {expected:?} in {firsts:#?}"
        );
    }
    assert_eq!(firsts.len(), 4, "{firsts:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_items_line_past_16_mib_is_an_error_naming_its_line() {
    let _case = Case("items_line_limit");
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let over = format!("{{\"text\": \"{}\"}}", "x".repeat(16 * 1024 * 1024));
    let out = project(&server)
        .write_raw("rows.jsonl", &format!("{{\"text\": \"a\"}}\n{over}\n"))
        .write(
            "p.yaml",
            r#"
            version: 1
            name: big
            steps:
              - id: rows
                decompose:
                  file: rows.jsonl
              - id: each
                fan_out:
                  over: rows
                  instructions: "{{ item.text }}"
            "#,
        )
        .args(["run", "p.yaml", "--quiet"])
        .code(2)
        .run();
    assert!(
        out.stderr
            .contains("rows.jsonl:2: the line is longer than 16 MiB, the limit of an items line"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_whose_text_keeps_doubling_stops_naming_the_limit() {
    let _case = Case("rendered_size_limit");
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let out = project(&server)
        .write_raw("rows.jsonl", "{\"text\": \"a\"}\n")
        .write(
            "p.yaml",
            r#"
            version: 1
            name: doubling
            steps:
              - id: rows
                decompose:
                  file: rows.jsonl
              - id: each
                fan_out:
                  over: rows
                  instructions: >-
                    {% set ns = namespace(s=item.text) %}{% for i in range(48) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}
            "#,
        )
        .args(["run", "p.yaml", "--quiet"])
        .code(2)
        .run();
    assert!(
        out.stderr
            .contains("item 0: line 11: cannot render template")
            && out.stderr.contains("512 MiB of text made")
            && !out.stderr.contains("memory allocation"),
        "{}",
        out.stderr
    );
    assert!(server.requests().is_empty(), "a request was sent");
}

/// A `decompose.command` that computes with a value (`(( ))`, `[[ -gt ]]`, `let`, ...) never
/// runs what a value holding `a[$(cmd)]` would make bash run: a parameter's default is refused
/// by `summon validate`, a `--param` by the dry run and the run, each at the command's line
/// and key, and nothing runs (no file made, no request sent).
#[tokio::test(flavor = "multi_thread")]
async fn a_value_bash_arithmetic_would_run_is_refused_at_validate_dry_run_and_run() {
    let _case = Case("arithmetic_value_refused_before_anything_runs");
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let pipeline = |default: &str| {
        format!(
            "version: 1
name: arith
parameters:
  - key: n
    input_type: string
    requirement: optional
    default: '{default}'
steps:
  - id: list
    decompose:
      command: '[[ {{{{ n }}}} -gt 1 ]] && echo big'
  - id: each
    fan_out:
      over: list
      instructions: 'x {{{{ item }}}}'
"
        )
    };
    let attack = "a[$(touch pwned)]";
    let t = project(&server)
        .write_raw("bad.yaml", &pipeline(attack))
        .write_raw("ok.yaml", &pipeline("3"));
    let at = |stderr: &str, file: &str| {
        assert!(
            stderr.contains(&format!("{file}:11:16"))
                && stderr.contains("decompose.command")
                && stderr.contains("would run as a command where bash evaluates arithmetic"),
            "{stderr}"
        );
    };
    let out = t.command().args(["validate", "bad.yaml"]).output().unwrap();
    assert!(!out.status.success());
    at(&String::from_utf8_lossy(&out.stderr), "bad.yaml");
    let out = t.command().args(["validate", "ok.yaml"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for extra in [&["--dry-run"][..], &[]] {
        let param = format!("n={attack}");
        let out = t
            .command()
            .args(["run", "ok.yaml", "--param", &param])
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success());
        at(&String::from_utf8_lossy(&out.stderr), "ok.yaml");
    }
    assert!(!t.path().join("pwned").exists());
    assert_eq!(support::chat_count(&server), 0);
}

/// The author's `decompose.command` gets summon's environment without a credential: no
/// variable named like a key (`OPENAI_API_KEY`) and no provider's configured `api_key_env`
/// (`MY_LLM_SECRET`), in the run as in the dry run; the rest (`PATH`, `LANG`) is there.
#[tokio::test(flavor = "multi_thread")]
async fn a_decompose_command_gets_no_credential() {
    let _case = Case("decompose_command_no_credential");
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let t = project(&server)
        .env("MY_LLM_SECRET", "my-llm-secret-0123456789")
        .env("LANG", "C.UTF-8")
        .write(
            "summon.yaml",
            "providers:\n  other: {kind: openai, base_url: 'http://127.0.0.1:9/v1', api_key_env: MY_LLM_SECRET}\n",
        )
        .write(
            "p.yaml",
            r#"
            version: 1
            name: env
            steps:
              - id: list
                decompose:
                  command: 'echo "k=${OPENAI_API_KEY:-none} m=${MY_LLM_SECRET:-none} lang=${LANG:-none} path=${PATH:+set}"; env | grep -c -e sk-test-hostile -e my-llm-secret || true'
              - id: each
                fan_out:
                  over: list
                  instructions: "env: {{ item }}"
            "#,
        );
    let out = t
        .command()
        .args(["run", "p.yaml", "--out", "out", "--trust"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut firsts: Vec<String> = support::chats(&server).iter().map(first_user).collect();
    firsts.sort();
    assert_eq!(
        firsts,
        ["env: 0", "env: k=none m=none lang=C.UTF-8 path=set"],
        "{firsts:#?}"
    );
}
