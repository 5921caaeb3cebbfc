//! The batch backend's own calls under trouble: a create retried without uploading its input
//! again, retries shown and counted like live ones, an abandoned batch's upload deleted, and
//! the provider's credentials kept off a results URL on another host.

use crate::support;

use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode, Uri, header::LOCATION};
use serde_json::Value;
use summon_mock_llm::{Api, MockConfig, MockServer, RecordedRequest};
use support::Test;

const KEY: &str = "sk-test-0123456789abcdefCALLS";

const PIPELINE: &str = r#"version: 1
name: batch
steps:
  - id: list
    decompose:
      items: [alpha, beta, gamma]
  - id: each
    fan_out:
      over: list
      instructions: "Summarise {{ item }}"
    backend: batch
"#;

fn openai(server: &MockServer) -> Test {
    Test::new()
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_BATCH_POLL_MS", "5")
        .env("SUMMON_RETRY_BASE_MS", "1")
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .write_raw("p.yaml", PIPELINE)
}

fn batch_calls(server: &MockServer, method: &str, path: &str) -> Vec<RecordedRequest> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.api == Api::Batch && r.method == method && r.path == path)
        .collect()
}

fn report(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("out/report.json")).expect("report"))
        .expect("report JSON")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retried_create_uploads_its_input_once_and_shows_each_retry() {
    let server = MockServer::start(MockConfig::new().batch_create_failures(3)).await;
    let out = openai(&server)
        .args(["run", "p.yaml", "--out", "out"])
        .run();
    assert_eq!(batch_calls(&server, "POST", "/v1/files").len(), 1);
    assert_eq!(batch_calls(&server, "POST", "/v1/batches").len(), 4);
    let created = batch_calls(&server, "POST", "/v1/batches");
    let inputs: Vec<&Value> = created.iter().map(|r| &r.body["input_file_id"]).collect();
    assert!(inputs.iter().all(|id| *id == inputs[0]), "{inputs:?}");
    for attempt in 1..=3 {
        assert!(
            out.stderr
                .contains(&format!("each: create the batch: retry {attempt} in ")),
            "{}",
            out.stderr
        );
    }
    assert!(
        out.stderr
            .contains("s: provider overloaded or failing (HTTP 500)"),
        "{}",
        out.stderr
    );
    let report = report(&out.dir);
    assert_eq!(report["retries_by_class"]["server_error"], 3, "{report:#}");
    assert_eq!(
        out.stdout,
        "echo: Summarise alpha\n\necho: Summarise beta\n\necho: Summarise gamma\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_abandoned_batch_deletes_the_file_it_uploaded() {
    let server = MockServer::start(MockConfig::new().batch_create_failures(100)).await;
    let out = openai(&server)
        .args(["run", "p.yaml", "--out", "out"])
        .code(2)
        .run();
    assert_eq!(batch_calls(&server, "POST", "/v1/files").len(), 1);
    // The first try and five retries.
    assert_eq!(batch_calls(&server, "POST", "/v1/batches").len(), 6);
    let deleted = batch_calls(&server, "DELETE", "/v1/files/file-mock-1");
    assert_eq!(deleted.len(), 1, "{}", out.stderr);
    assert!(
        server.batch_files().is_empty(),
        "{:?}",
        server.batch_files()
    );
    assert!(
        out.stderr.contains("cannot create a batch"),
        "{}",
        out.stderr
    );
    let report = report(&out.dir);
    assert_eq!(report["retries_by_class"]["server_error"], 5, "{report:#}");
}

/// A server on another origin that records each request's path and headers and redirects
/// it to `target` (set once that server is up).
async fn other_host(target: Arc<Mutex<String>>) -> (String, Arc<Mutex<Vec<(String, HeaderMap)>>>) {
    let seen: Arc<Mutex<Vec<(String, HeaderMap)>>> = Arc::default();
    let record = Arc::clone(&seen);
    let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap| {
        let record = Arc::clone(&record);
        let target = Arc::clone(&target);
        async move {
            record
                .lock()
                .unwrap()
                .push((uri.path().to_owned(), headers));
            let to = format!("{}{}", target.lock().unwrap(), uri.path());
            (StatusCode::TEMPORARY_REDIRECT, [(LOCATION, to)])
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), seen)
}

#[tokio::test(flavor = "multi_thread")]
async fn credentials_never_go_to_a_results_url_on_another_host() {
    let target = Arc::new(Mutex::new(String::new()));
    let (elsewhere, seen) = other_host(Arc::clone(&target)).await;
    let server = MockServer::start(MockConfig::new().results_base(&elsewhere)).await;
    *target.lock().unwrap() = format!("http://{}", server.addr());
    let out = Test::new()
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_BATCH_POLL_MS", "5")
        .env("SUMMON_PROVIDER", "anthropic")
        .env("ANTHROPIC_BASE_URL", &server.url_anthropic())
        .env("ANTHROPIC_API_KEY", KEY)
        .write_raw("p.yaml", PIPELINE)
        .args(["run", "p.yaml"])
        .run();
    assert_eq!(
        out.stdout, "echo: Summarise alpha\n\necho: Summarise beta\n\necho: Summarise gamma\n",
        "{}",
        out.stderr
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].0.ends_with("/results"), "{seen:?}");
    for name in ["x-api-key", "authorization"] {
        assert!(seen[0].1.get(name).is_none(), "{name} sent to another host");
    }
    // Followed back from there without the key too; every call to the provider had it.
    for request in server.requests() {
        let key = request.header("x-api-key");
        if request.path.ends_with("/results") {
            assert_eq!(key, None, "{}", request.path);
        } else {
            assert_eq!(key, Some(KEY), "{}", request.path);
        }
    }
}
