//! Traces read back from a real backend: Arize Phoenix (PyPI `arize-phoenix`, pinned in
//! `.ci/run`, which installs it under `target/phoenix`) takes a run's spans over OTLP/HTTP
//! and serves them back over its REST API, where the tree, the GenAI attributes and the token
//! counts are checked against `results.jsonl`, with no key and no prompt text.

use crate::support;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use summon_mock_llm::MockServer;
use support::{Test, read_json, results};

/// The pinned version `.ci/run` installs.
const PHOENIX: &str = "arize-phoenix==20.26.1";

fn phoenix_python() -> PathBuf {
    let python = crate::support::target_dir().join("phoenix/venv/bin/python");
    assert!(
        python.exists(),
        "Arize Phoenix is not installed: run .ci/run, or python3 -m venv target/phoenix/venv && \
         target/phoenix/venv/bin/pip install {PHOENIX}"
    );
    python
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Phoenix server on loopback, its data in a temporary folder; killed (by its PID) when
/// dropped.
struct Phoenix {
    child: Child,
    port: u16,
    /// Its OTLP/gRPC port.
    grpc: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Phoenix {
    fn start() -> Self {
        let python = phoenix_python();
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let grpc = free_port();
        let child = Command::new(python)
            .args(["-m", "phoenix.server.main", "serve"])
            .env("PHOENIX_WORKING_DIR", dir.path())
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", port.to_string())
            .env("PHOENIX_GRPC_PORT", grpc.to_string())
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start Phoenix");
        let phoenix = Self {
            child,
            port,
            grpc,
            _dir: dir,
        };
        support::wait_for(Duration::from_secs(180), "Phoenix to answer", || {
            phoenix
                .get("/healthz")
                .is_some_and(|(status, _)| status == 200)
        });
        phoenix
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A GET on loopback: the status and the body.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .ok()?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).ok()?;
        let response = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = response.split_once("\r\n\r\n")?;
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            unchunk(body)
        } else {
            body.to_owned()
        };
        Some((status, body))
    }

    fn spans(&self) -> Vec<Value> {
        let Some((200, body)) = self.get("/v1/projects/default/spans?limit=1000") else {
            return Vec::new();
        };
        serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v["data"].as_array().cloned())
            .unwrap_or_default()
    }
}

fn unchunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || after.len() < size {
            break;
        }
        out.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    out
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

fn children<'a>(spans: &'a [Value], parent: &Value) -> Vec<&'a Value> {
    spans
        .iter()
        .filter(|s| s["parent_id"] == parent["context"]["span_id"])
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Arize Phoenix from PyPI (.ci/run installs it under target/phoenix)"]
async fn phoenix_shows_the_run_as_one_tree_with_genai_attributes_and_no_secrets() {
    let phoenix = tokio::task::spawn_blocking(Phoenix::start).await.unwrap();
    let server = MockServer::start(super::traces::mock()).await;
    let out = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", super::traces::KEY)
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_RETRY_BASE_MS", "1")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &phoenix.url())
        .write_raw("p.yaml", super::traces::PIPELINE)
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    assert!(!out.stderr.contains("traces:"), "{}", out.stderr);
    let trace_id = read_json(&out.dir.join("out/report.json"))["trace_id"].clone();
    // Phoenix stores what it is sent a moment later: wait for every request's span.
    let phoenix = std::sync::Arc::new(phoenix);
    let reader = std::sync::Arc::clone(&phoenix);
    let spans = tokio::task::spawn_blocking(move || {
        support::wait_for(Duration::from_secs(60), "the trace in Phoenix", || {
            let spans = reader.spans();
            named(&spans, "run traced").len() == 1 && named(&spans, "chat mock-model").len() == 4
        });
        reader.spans()
    })
    .await
    .unwrap();
    assert!(spans.iter().all(|s| s["context"]["trace_id"] == trace_id));
    let run = named(&spans, "run traced")[0];
    assert_eq!(run["parent_id"], Value::Null);
    let each = named(&spans, "step each")[0];
    assert_eq!(each["parent_id"], run["context"]["span_id"]);
    let tasks = children(&spans, each);
    assert_eq!(tasks.len(), 3);
    let lines = results(&out.dir.join("out"));
    for task in tasks {
        let item = &task["attributes"]["summon.task.item"];
        let line = lines
            .iter()
            .find(|l| l["step"] == "each" && &l["item"] == item)
            .expect("its line");
        let attempt = children(&spans, task);
        assert_eq!(attempt.len(), 1);
        let inside = children(&spans, attempt[0]);
        let requests: Vec<&&Value> = inside
            .iter()
            .filter(|s| s["name"] == "chat mock-model")
            .collect();
        for key in ["input_tokens", "output_tokens"] {
            let sum: u64 = requests
                .iter()
                .map(|r| {
                    r["attributes"][format!("gen_ai.usage.{key}")]
                        .as_u64()
                        .unwrap_or(0)
                })
                .sum();
            assert_eq!(json!(sum), line[key], "{item} {key}");
        }
        for request in &requests {
            let a = &request["attributes"];
            assert_eq!(a["gen_ai.operation.name"], "chat");
            assert_eq!(a["gen_ai.provider.name"], "openai");
            assert_eq!(a["gen_ai.request.model"], "mock-model");
        }
        match item.as_str() {
            Some("alpha") => {
                assert!(inside.iter().any(|s| s["name"] == "execute_tool list_files"
                    && s["attributes"]["gen_ai.tool.name"] == "list_files"));
            }
            Some("beta") => {
                let waits: Vec<&Value> = requests
                    .iter()
                    .flat_map(|r| r["events"].as_array().into_iter().flatten())
                    .filter(|e| e["name"] == "rate_limit_wait")
                    .collect();
                assert_eq!(waits.len(), 1, "{requests:?}");
            }
            Some("gamma") => {
                assert_eq!(task["status_code"], "ERROR");
                assert_eq!(task["attributes"]["error.type"], "unusable_answer");
            }
            other => panic!("unexpected item {other:?}"),
        }
    }
    let all = serde_json::to_string(&spans).unwrap();
    assert!(!all.contains(super::traces::KEY), "the key reached Phoenix");
    assert!(
        !all.contains("Secret prompt text"),
        "prompt text reached Phoenix"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Arize Phoenix from PyPI (.ci/run installs it under target/phoenix)"]
async fn phoenix_takes_a_delegation_over_grpc() {
    let phoenix = tokio::task::spawn_blocking(Phoenix::start).await.unwrap();
    let server = MockServer::start(super::traces::mock()).await;
    let out = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", super::traces::KEY)
        .env("SUMMON_MODEL", "mock-model")
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            &format!("http://127.0.0.1:{}", phoenix.grpc),
        )
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .args(["delegate", "--instructions", "say alpha"])
        .run();
    assert!(!out.stderr.contains("traces:"), "{}", out.stderr);
    let phoenix = std::sync::Arc::new(phoenix);
    let reader = std::sync::Arc::clone(&phoenix);
    let spans = tokio::task::spawn_blocking(move || {
        support::wait_for(Duration::from_secs(60), "the trace in Phoenix", || {
            let spans = reader.spans();
            named(&spans, "delegate task").len() == 1
                && named(&spans, "execute_tool list_files").len() == 1
        });
        reader.spans()
    })
    .await
    .unwrap();
    let root = named(&spans, "delegate task")[0];
    let tool = named(&spans, "execute_tool list_files")[0];
    assert_eq!(tool["context"]["trace_id"], root["context"]["trace_id"]);
}
