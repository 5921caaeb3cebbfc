//! Secrets stay secret: a full run — a pipeline whose provider answers 401 and 500 with bodies
//! that echo the API key, and a 400 that echoes what an MCP tool returned, next to successes;
//! `--out`, `--junit`, `--json`; background tasks collected with `load`; an MCP server given a
//! variable through `env_keys` whose value the model reads and repeats — then every byte
//! summon wrote is searched for the API key and the `env_keys` value: stdout, stderr, and
//! every file under the project (which is also `HOME`), the store's SQLite files included.
//!
//! With `SUMMON_FIGURES=FILE`, the test appends `{"kind":"secrets","files_checked":N,
//! "leaks":N}` to FILE (read by `benches/reliability.py`).

use crate::support;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, RecordedRequest, Reply};
use support::Test;

const KEY: &str = "sk-test-secrets-Zq8Wm3Kp0Vb7Xn2L";
const TOKEN: &str = "vault-token-Hq4Ns9Tb2Rf6Yc1P";

/// What to look for: each secret whole, and a distinctive part of it (a cut-off copy leaks
/// too).
const NEEDLES: [&str; 4] = [KEY, "Zq8Wm3Kp0Vb7", TOKEN, "Hq4Ns9Tb2Rf6"];

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/mcp")
        .join(name)
        .display()
        .to_string()
}

fn messages(request: &RecordedRequest) -> &[Value] {
    request.body["messages"]
        .as_array()
        .map_or(&[], Vec::as_slice)
}

/// The mock provider: the first user message decides. `AUTH` gets a 401 and `BOOM` a 500,
/// both echoing the key; `VAULT` calls the MCP server's `env` tool for `VAULT_TOKEN`, then
/// answers (`VAULT`), answers with the token in its text (`SAY`), or gets a 400 that quotes the
/// tool result back (`ECHO`). Anything else is answered.
fn provider(request: &RecordedRequest) -> Reply {
    let messages = messages(request);
    let first = messages
        .get(1)
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_owned();
    let key_body = |what: &str| {
        json!({"error": {"message": format!("{what}: {KEY}"), "type": "invalid_request_error"}})
            .to_string()
    };
    if first.contains("AUTH") {
        return Reply::status(401, key_body("Incorrect API key provided"));
    }
    if first.contains("BOOM") {
        return Reply::status(500, key_body("internal error while serving key"));
    }
    if first.contains("VAULT") {
        let tool_result = messages
            .last()
            .filter(|m| m["role"] == "tool")
            .and_then(|m| m["content"].as_str());
        return match tool_result {
            None => Reply::tool_call("vault__env", json!({"name": "VAULT_TOKEN"})),
            Some(content) if first.contains("ECHO") => Reply::status(
                400,
                json!({"error": {"message": format!("content not allowed: {content}")}})
                    .to_string(),
            ),
            Some(content) if first.contains("SAY") => {
                Reply::text(format!("The token is {content}. Done."))
            }
            Some(_) => Reply::text("vault checked"),
        };
    }
    Reply::text(format!("fine: {}", first.lines().next().unwrap_or("")))
}

const PIPELINE: &str = r#"
version: 1
name: secrets
steps:
  - id: items
    decompose:
      items: ["ok-1", "AUTH", "BOOM", "ok-2"]
  - id: work
    fan_out:
      over: items
      instructions: "Item {{ item }}"
    on_error: continue
  - id: modes
    decompose:
      items: ["VAULT", "VAULT SAY", "VAULT ECHO"]
  - id: vaulted
    fan_out:
      over: modes
      source: vault
      instructions: "{{ item }}"
    on_error: continue
  - id: summary
    synthesize:
      instructions: |
        Summarise {% for r in steps.work.results %}{{ r.item }}={{ r.status }} {{ r.output }}
        {% endfor %}{% for r in steps.vaulted.results %}{{ r.item }}={{ r.status }} {{ r.output }}
        {% endfor %}
"#;

/// Every regular file under `dir`, recursively (symlinks not followed).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
    }
    out.sort();
    out
}

/// The needles found in `bytes`.
fn leaks_in(bytes: &[u8]) -> Vec<&'static str> {
    NEEDLES
        .into_iter()
        .filter(|needle| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
        .collect()
}

/// What one `summon` invocation wrote to its streams.
struct Streams {
    label: String,
    code: i32,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Streams {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

fn summon(t: &Test, args: &[&str]) -> Streams {
    let output = t.command().args(args).output().expect("run summon");
    Streams {
        label: args.join(" "),
        code: output.status.code().unwrap_or(-1),
        stdout: output.stdout,
        stderr: output.stderr,
    }
}

/// The task id in `delegate --async --json` output.
fn task_id(streams: &Streams) -> String {
    let json: Value = serde_json::from_slice(&streams.stdout)
        .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {}", streams.label, streams.text()));
    json["task_id"].as_str().expect("task_id").to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn no_secret_reaches_anything_summon_writes() {
    let server =
        MockServer::start(MockConfig::new().rule(|request: &RecordedRequest| provider(request)))
            .await;
    let t = Test::new()
        .env("SUMMON_TRUST_PROJECT", "1")
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_RETRY_BASE_MS", "1")
        .env("VAULT_TOKEN", TOKEN)
        .write(
            "recipes/vault.yaml",
            &format!(
                "
                title: Vault
                description: reads a token through an MCP server
                prompt: Use the vault.
                extensions:
                  - type: stdio
                    name: vault
                    cmd: python3
                    args: ['{}', 'ok']
                    timeout: 30
                    env_keys: [VAULT_TOKEN]
                ",
                fixture("misbehaving.py")
            ),
        )
        .write_raw("p.yaml", PIPELINE);

    let mut runs = Vec::new();
    // The pipeline, with every kind of output.
    let run = summon(
        &t,
        &["run", "p.yaml", "--out", "out", "--junit", "out/junit.xml"],
    );
    assert_eq!(run.code, 2, "{}", String::from_utf8_lossy(&run.stderr));
    runs.push(run);
    let run = summon(&t, &["run", "p.yaml", "--json", "--out", "out-json"]);
    assert_eq!(run.code, 2, "{}", String::from_utf8_lossy(&run.stderr));
    runs.push(run);
    runs.push(summon(
        &t,
        &["run", "p.yaml", "--resume", "--out", "out-resumed"],
    ));
    // One subagent at a time, in the foreground.
    for instructions in ["AUTH", "BOOM", "VAULT SAY", "VAULT ECHO"] {
        runs.push(summon(
            &t,
            &[
                "delegate",
                "--source",
                "vault",
                "--instructions",
                instructions,
            ],
        ));
        runs.push(summon(
            &t,
            &["delegate", "--instructions", instructions, "--json"],
        ));
    }
    // In the background, collected through the store.
    let mut ids = Vec::new();
    for instructions in ["AUTH", "VAULT SAY", "VAULT ECHO"] {
        let started = summon(
            &t,
            &[
                "delegate",
                "--async",
                "--json",
                "--source",
                "vault",
                "--instructions",
                instructions,
            ],
        );
        assert_eq!(
            started.code,
            0,
            "{}",
            String::from_utf8_lossy(&started.stderr)
        );
        ids.push(task_id(&started));
        runs.push(started);
    }
    for id in &ids {
        runs.push(summon(&t, &["load", id, "--timeout", "60"]));
        runs.push(summon(&t, &["load", id, "--json"]));
        runs.push(summon(&t, &["load", id, "--peek"]));
    }
    runs.push(summon(&t, &["tasks"]));
    runs.push(summon(&t, &["tasks", "--json"]));
    runs.push(summon(&t, &["load"]));

    // The runs did what they were meant to: the errors happened, the secrets went where
    // they belong (the key to the provider, the token to the MCP server and back to the model).
    let requests = server.requests();
    assert!(
        requests
            .iter()
            .all(|r| r.header("authorization") == Some(&format!("Bearer {KEY}"))),
        "every request carries the key"
    );
    let tool_results_with_token = requests
        .iter()
        .filter(|r| {
            messages(r)
                .iter()
                .any(|m| m["role"] == "tool" && m["content"].as_str() == Some(TOKEN))
        })
        .count();
    assert!(tool_results_with_token >= 6, "{tool_results_with_token}");
    let first = &runs[0];
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(
        stderr.contains("OPENAI_API_KEY") || stderr.contains("401"),
        "{stderr}"
    );
    let results = std::fs::read_to_string(t.path().join("out/results.jsonl")).unwrap();
    assert_eq!(results.lines().count(), 8, "{results}");
    assert!(results.contains("[redacted]"), "{results}");
    assert!(t.path().join("out/report.json").is_file());
    assert!(t.path().join("out/junit.xml").is_file());
    assert!(t.path().join(".summon").is_dir());
    let loaded: Vec<&Streams> = runs
        .iter()
        .filter(|r| r.label.starts_with("load 2") && r.label.ends_with("--json"))
        .collect();
    assert_eq!(loaded.len(), 3);
    for streams in &loaded {
        let json: Value = serde_json::from_slice(&streams.stdout)
            .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {}", streams.label, streams.text()));
        assert!(
            json["status"] == "completed" || json["status"] == "failed",
            "{json}"
        );
    }

    // Every byte summon wrote.
    let mut leaks = Vec::new();
    for streams in &runs {
        for (name, bytes) in [("stdout", &streams.stdout), ("stderr", &streams.stderr)] {
            for needle in leaks_in(bytes) {
                leaks.push(format!("{name} of `summon {}`: {needle}", streams.label));
            }
        }
    }
    let files = files_under(t.path());
    let db_files = files
        .iter()
        .filter(|f| f.starts_with(t.path().join(".summon")))
        .count();
    assert!(db_files >= 1, "{files:?}");
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        for needle in leaks_in(&bytes) {
            leaks.push(format!("{}: {needle}", file.display()));
        }
    }
    let streams_checked = runs.len() * 2;
    if let Ok(path) = std::env::var("SUMMON_FIGURES") {
        use std::io::Write;
        let line = json!({
            "kind": "secrets",
            "files_checked": files.len(),
            "streams_checked": streams_checked,
            "leaks": leaks.len(),
        });
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("open the figures file");
        file.write_all(format!("{line}\n").as_bytes())
            .expect("write figures");
    }
    assert!(leaks.is_empty(), "secrets leaked:\n{}", leaks.join("\n"));
}
