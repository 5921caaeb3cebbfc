//! OpenTelemetry traces: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, a run's steps, tasks,
//! attempts, model requests and tool calls reach an OTLP/HTTP collector as one tree under
//! `TRACEPARENT`, with the GenAI attributes and no key or prompt text; a collector that
//! refuses or is down costs the run one warning and nothing else.

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::StatusCode;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::{Span, status::StatusCode as SpanStatus};
use prost::Message as _;
use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::{Test, read_json, results};

pub(super) const KEY: &str = "sk-test-0123456789abcdef";
pub(super) const PARENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
pub(super) const PARENT_SPAN: &str = "00f067aa0ba902b7";

/// `alpha` calls a tool, `beta` is refused once by a rate limit, `gamma` is cut off at the
/// output limit (a failure).
pub(super) const PIPELINE: &str = "version: 1
name: traced
steps:
  - id: list
    decompose:
      items: [alpha, beta, gamma]
  - id: each
    fan_out:
      over: list
      instructions: \"Secret prompt text about {{ item }}\"
    on_error: continue
";

pub(super) fn mock() -> MockConfig {
    let limited = Arc::new(AtomicBool::new(false));
    MockConfig::new().rule(move |request| {
        let text = request.body["messages"].to_string();
        let answered_tool = request.body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        if text.contains("alpha") && !answered_tool {
            Reply::tool_call("list_files", json!({}))
        } else if text.contains("beta") && !limited.swap(true, Ordering::SeqCst) {
            Reply::status_with_headers(
                429,
                [("retry-after", "0")],
                "{\"error\":{\"message\":\"slow down\"}}",
            )
        } else if text.contains("gamma") {
            Reply::text("half an ans").finish("length")
        } else {
            Reply::text("fine answer")
        }
    })
}

/// A loopback OTLP/HTTP collector that answers `status` and keeps every request body.
pub(super) struct Collector {
    pub(super) url: String,
    bodies: Arc<Mutex<Vec<Bytes>>>,
    _server: tokio::task::JoinHandle<()>,
}

impl Collector {
    pub(super) async fn start(status: StatusCode) -> Self {
        let bodies: Arc<Mutex<Vec<Bytes>>> = Arc::default();
        let kept = Arc::clone(&bodies);
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: Bytes| {
                let kept = Arc::clone(&kept);
                async move {
                    kept.lock().unwrap().push(body);
                    status
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            url,
            bodies,
            _server: server,
        }
    }

    pub(super) fn spans(&self) -> Vec<Span> {
        self.bodies
            .lock()
            .unwrap()
            .iter()
            .flat_map(|body| {
                ExportTraceServiceRequest::decode(body.as_ref())
                    .expect("an OTLP protobuf body")
                    .resource_spans
            })
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans)
            .collect()
    }

    fn raw(&self) -> Vec<u8> {
        self.bodies.lock().unwrap().concat()
    }
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn attr(span: &Span, key: &str) -> Option<Value> {
    let value = span
        .attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?;
    Some(match value {
        Any::StringValue(s) => json!(s),
        Any::IntValue(i) => json!(i),
        Any::BoolValue(b) => json!(b),
        Any::DoubleValue(d) => json!(d),
        Any::ArrayValue(a) => Value::Array(
            a.values
                .iter()
                .filter_map(|v| match v.value.as_ref()? {
                    Any::StringValue(s) => Some(json!(s)),
                    _ => None,
                })
                .collect(),
        ),
        other => json!(format!("{other:?}")),
    })
}

pub(super) fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

pub(super) fn one<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "spans named {name}: {:?}", names(spans));
    found[0]
}

fn names(spans: &[Span]) -> Vec<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}

fn children<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id)
        .collect()
}

fn traced(server: &MockServer, collector: &str) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_RETRY_BASE_MS", "1")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector)
        .env("OTEL_BSP_SCHEDULE_DELAY", "20")
        .write_raw("p.yaml", PIPELINE)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_is_one_trace_of_steps_tasks_attempts_requests_and_tool_calls() {
    let server = MockServer::start(mock()).await;
    let collector = Collector::start(StatusCode::OK).await;
    let out = traced(&server, &collector.url)
        .env(
            "TRACEPARENT",
            &format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01"),
        )
        // a dollar a token, so a task's cost is its token count
        .write(
            "summon.yaml",
            "prices:\n  mock-model: {input: 1000000, output: 1000000, cached_input: 1000000}\n",
        )
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    assert!(!out.stderr.contains("traces:"), "{}", out.stderr);
    let spans = collector.spans();

    // One trace, the CI job's, and report.json names it.
    assert!(spans.iter().all(|s| hex(&s.trace_id) == PARENT_TRACE));
    let report = read_json(&out.dir.join("out/report.json"));
    assert_eq!(report["trace_id"], PARENT_TRACE);
    let run = one(&spans, "run traced");
    assert_eq!(hex(&run.parent_span_id), PARENT_SPAN);
    // So do report.html and `summon runs show`.
    let page = std::fs::read_to_string(out.dir.join("out/report.html")).unwrap();
    assert!(page.contains(PARENT_TRACE) && page.contains("R.trace_id"));
    let run_id = attr(run, "summon.run.id").expect("the run id");
    let shown = std::process::Command::new(env!("CARGO_BIN_EXE_summon"))
        .args(["runs", "show", run_id.as_str().unwrap()])
        .current_dir(&out.dir)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains(&format!("Trace: {PARENT_TRACE}\n")),
        "{shown}"
    );

    // run → steps → tasks → attempt → model requests and tool calls.
    let steps: Vec<&str> = children(&spans, run)
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert!(steps.contains(&"step list") && steps.contains(&"step each"));
    let each = one(&spans, "step each");
    let tasks = children(&spans, each);
    assert_eq!(tasks.len(), 3, "{:?}", names(&spans));
    let lines = results(&out.dir.join("out"));
    for task in &tasks {
        let item = attr(task, "summon.task.item").expect("item");
        let line = lines
            .iter()
            .find(|l| l["step"] == "each" && l["item"] == item)
            .unwrap_or_else(|| panic!("no line for {item}"));
        let tokens =
            line["input_tokens"].as_f64().unwrap() + line["output_tokens"].as_f64().unwrap();
        let cost = attr(task, "summon.task.cost_usd").and_then(|v| v.as_f64());
        assert!(
            cost.is_some_and(|c| (c - tokens).abs() < 1e-6),
            "{item}: cost {cost:?} for {tokens} tokens"
        );
        let attempts = children(&spans, task);
        assert_eq!(attempts.len(), 1, "{item}");
        assert_eq!(attempts[0].name, "attempt 1");
        let inside = children(&spans, attempts[0]);
        let requests: Vec<&&Span> = inside
            .iter()
            .filter(|s| s.name == "chat mock-model")
            .collect();
        assert!(!requests.is_empty(), "{item}");
        // Token counts: each request's own, adding up to the task's line.
        for key in ["input_tokens", "output_tokens"] {
            let sum: i64 = requests
                .iter()
                .map(|r| {
                    attr(r, &format!("gen_ai.usage.{key}"))
                        .and_then(|v| v.as_i64())
                        .unwrap_or(0)
                })
                .sum();
            assert_eq!(json!(sum), line[key], "{item} {key}");
            assert_eq!(
                attr(task, &format!("gen_ai.usage.{key}")),
                Some(line[key].clone())
            );
        }
        for request in &requests {
            assert_eq!(attr(request, "gen_ai.operation.name"), Some(json!("chat")));
            assert_eq!(attr(request, "gen_ai.provider.name"), Some(json!("openai")));
            assert_eq!(
                attr(request, "gen_ai.request.model"),
                Some(json!("mock-model"))
            );
            assert_eq!(request.kind, 3, "a client span");
        }
        match item.as_str() {
            Some("alpha") => {
                let tool = inside
                    .iter()
                    .find(|s| s.name == "execute_tool list_files")
                    .expect("the tool call's span");
                assert_eq!(attr(tool, "gen_ai.tool.name"), Some(json!("list_files")));
                assert_eq!(
                    attr(tool, "gen_ai.operation.name"),
                    Some(json!("execute_tool"))
                );
                assert_eq!(requests.len(), 2);
                assert_eq!(
                    attr(requests[0], "gen_ai.response.finish_reasons"),
                    Some(json!(["tool_calls"]))
                );
            }
            Some("beta") => {
                let waits: Vec<_> = requests
                    .iter()
                    .flat_map(|r| &r.events)
                    .filter(|e| e.name == "rate_limit_wait")
                    .collect();
                assert_eq!(waits.len(), 1, "the 429's wait");
                assert!(
                    waits[0]
                        .attributes
                        .iter()
                        .any(|kv| kv.key == "summon.retry.wait_ms")
                );
            }
            Some("gamma") => {
                let status = task.status.as_ref().expect("a status");
                assert_eq!(status.code, SpanStatus::Error as i32);
                assert_eq!(attr(task, "error.type"), Some(json!("unusable_answer")));
                assert_eq!(line["status"], "failed");
            }
            other => panic!("unexpected item {other:?}"),
        }
    }

    // No key, and by default no prompt text.
    let raw = String::from_utf8_lossy(&collector.raw()).into_owned();
    assert!(!raw.contains(KEY), "the key was exported");
    assert!(
        !raw.contains("Secret prompt text"),
        "prompt text was exported"
    );
    assert!(!raw.contains("fine answer"), "answer text was exported");
}

#[tokio::test(flavor = "multi_thread")]
async fn prompt_and_answer_text_are_exported_only_on_opt_in() {
    let server = MockServer::start(mock()).await;
    let collector = Collector::start(StatusCode::OK).await;
    traced(&server, &collector.url)
        .env("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let spans = collector.spans();
    let beta = spans
        .iter()
        .find(|s| attr(s, "summon.task.item") == Some(json!("beta")))
        .expect("beta's task span");
    let prompt = attr(beta, "gen_ai.input.messages").expect("the prompt");
    assert!(
        prompt
            .as_str()
            .unwrap()
            .contains("Secret prompt text about beta")
    );
    assert_eq!(
        attr(beta, "gen_ai.output.messages"),
        Some(json!("fine answer"))
    );
    assert!(!String::from_utf8_lossy(&collector.raw()).contains(KEY));
}

/// The run, which succeeds with gamma failed (`on_error: continue`), traces or not.
fn run_with(server: &MockServer, endpoint: &str) -> support::Output {
    traced(server, endpoint)
        .env("OTEL_EXPORTER_OTLP_TIMEOUT", "2000")
        .args(["run", "p.yaml", "--out", "out"])
        .code(0)
        .run()
}

fn one_warning(out: &support::Output) {
    let warnings: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("traces:"))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", out.stderr);
    assert!(
        warnings[0].starts_with("summon: warning: traces: "),
        "{}",
        warnings[0]
    );
    assert!(
        warnings[0].contains("spans not exported"),
        "{}",
        warnings[0]
    );
    let lines = results(&out.dir.join("out"));
    assert_eq!(lines.iter().filter(|l| l["step"] == "each").count(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_collector_answering_500_costs_one_warning() {
    let server = MockServer::start(mock()).await;
    let collector = Collector::start(StatusCode::INTERNAL_SERVER_ERROR).await;
    let out = run_with(&server, &collector.url);
    one_warning(&out);
    assert!(out.stderr.contains("500"), "{}", out.stderr);
    assert!(
        !collector.bodies.lock().unwrap().is_empty(),
        "nothing was sent"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_collector_that_is_down_costs_one_warning() {
    let server = MockServer::start(mock()).await;
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = run_with(&server, &format!("http://127.0.0.1:{port}"));
    one_warning(&out);
    assert!(
        out.stderr
            .contains("(cannot reach the collector: Connection refused"),
        "{}",
        out.stderr
    );
}

#[test]
fn an_unknown_protocol_is_refused_before_the_run_with_the_variable_named() {
    Test::new()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
        .write_raw("p.yaml", PIPELINE)
        .args(["run", "p.yaml"])
        .code(1)
        .stderr_has(
            "OTEL_EXPORTER_OTLP_PROTOCOL=\"thrift\": expected http/protobuf, http/json or grpc",
        )
        .run();
}

/// A loopback OTLP/gRPC collector (tonic's server) that keeps every export request.
struct GrpcCollector {
    url: String,
    requests: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
    _server: tokio::task::JoinHandle<()>,
}

struct Keep(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

#[tonic::async_trait]
impl TraceService for Keep {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl GrpcCollector {
    async fn start() -> Self {
        let requests: Arc<Mutex<Vec<ExportTraceServiceRequest>>> = Arc::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let service = TraceServiceServer::new(Keep(Arc::clone(&requests)));
        let server = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await
                .unwrap();
        });
        Self {
            url,
            requests,
            _server: server,
        }
    }

    fn spans(&self) -> Vec<Span> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .flat_map(|r| r.resource_spans.clone())
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans)
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_sends_the_same_tree_to_a_grpc_collector() {
    let server = MockServer::start(mock()).await;
    let collector = GrpcCollector::start().await;
    let out = traced(&server, &collector.url)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .args(["run", "p.yaml", "--out", "out", "--quiet"])
        .run();
    assert!(!out.stderr.contains("not exported"), "{}", out.stderr);
    let spans = collector.spans();
    let run = one(&spans, "run traced");
    assert_eq!(named(&spans, "step each").len(), 1, "{:?}", names(&spans));
    assert_eq!(
        spans
            .iter()
            .filter(|s| s.name.starts_with("task each#"))
            .count(),
        3
    );
    let tool = one(&spans, "execute_tool list_files");
    assert_eq!(tool.trace_id, run.trace_id);
    let report = read_json(&out.dir.join("out/report.json"));
    assert_eq!(report["trace_id"], json!(hex(&run.trace_id)));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_config_file_turns_traces_on_and_a_projects_needs_trust() {
    let server = MockServer::start(mock()).await;
    let collector = Collector::start(StatusCode::OK).await;
    let config = format!(
        "traces:\n  endpoint: {}\n  protocol: http/protobuf\n",
        collector.url
    );
    // The user's own config file: on, no variable needed.
    let test = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_RETRY_BASE_MS", "1")
        .env("OTEL_BSP_SCHEDULE_DELAY", "20")
        .write_raw("p.yaml", PIPELINE)
        .write_raw("home/.config/summon/config.yaml", &config);
    let xdg = test.path().join("home/.config").display().to_string();
    let out = test
        .env("XDG_CONFIG_HOME", &xdg)
        .args(["run", "p.yaml", "--quiet"])
        .run();
    assert!(!out.stderr.contains("traces"), "{}", out.stderr);
    let spans = collector.spans();
    one(&spans, "run traced");
    // A cloned project's summon.yaml may not send the run's spans anywhere by itself.
    let before = collector.spans().len();
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .write_raw("p.yaml", PIPELINE)
        .write_raw("summon.yaml", &config)
        .args(["run", "p.yaml"])
        .code(1)
        .stderr_has("summon.yaml:2:3:")
        .stderr_has("`traces` in this project's summon.yaml would send this run's spans to")
        .stderr_has("this project is not trusted")
        .run();
    assert_eq!(collector.spans().len(), before, "nothing was sent");
    // Trusted, it applies.
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_RETRY_BASE_MS", "1")
        .env("OTEL_BSP_SCHEDULE_DELAY", "20")
        .write_raw("p.yaml", PIPELINE)
        .write_raw("summon.yaml", &config)
        .args(["run", "p.yaml", "--quiet", "--trust"])
        .run();
    assert_eq!(named(&collector.spans(), "run traced").len(), 2);
    // Where the user sends the spans (the variable), a cloned project may not turn on the
    // prompts' and answers' text on them.
    let before = collector.spans().len();
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url)
        .write_raw("p.yaml", PIPELINE)
        .write_raw("summon.yaml", "traces:\n  capture_content: true\n")
        .args(["run", "p.yaml"])
        .code(1)
        .stderr_has("summon.yaml:2:3:")
        .stderr_has("`traces.capture_content` in this project's summon.yaml would put every prompt")
        .stderr_has("this project is not trusted")
        .run();
    assert_eq!(collector.spans().len(), before, "nothing was sent");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_mid_request_still_sends_the_trace_before_the_exit() {
    let server = MockServer::start(
        MockConfig::new()
            .default_reply(Reply::text("late").delayed(std::time::Duration::from_secs(60))),
    )
    .await;
    let collector = Collector::start(StatusCode::OK).await;
    let t = traced(&server, &collector.url).args(["run", "p.yaml", "--out", "out"]);
    let child = t
        .command()
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    support::wait_for(
        std::time::Duration::from_secs(20),
        "a request in flight",
        || server.in_flight() >= 1,
    );
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    let spans = collector.spans();
    let run = one(&spans, "run traced");
    assert_eq!(
        run.status.as_ref().map(|s| s.code),
        Some(SpanStatus::Error as i32)
    );
    let requests = named(&spans, "chat mock-model");
    assert!(!requests.is_empty(), "{:?}", names(&spans));
    assert!(
        requests
            .iter()
            .all(|r| attr(r, "error.type") == Some(json!("interrupted"))),
        "the requests in flight end interrupted"
    );
}

fn tool_then_answer() -> MockConfig {
    MockConfig::new().rule(|request| {
        let answered_tool = request.body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        if answered_tool {
            Reply::text("the summary")
        } else {
            Reply::tool_call("list_files", json!({}))
        }
    })
}

/// `delegate NAME` → `invoke_agent NAME` → attempt → two requests and the tool call between.
fn check_delegation(spans: &[Span], root_name: &str) -> Span {
    let root = one(spans, root_name).clone();
    let agent = children(spans, &root);
    assert_eq!(
        names(&agent.iter().map(|s| (*s).clone()).collect::<Vec<_>>()),
        ["invoke_agent task"]
    );
    assert_eq!(
        attr(agent[0], "gen_ai.operation.name"),
        Some(json!("invoke_agent"))
    );
    let attempt = children(spans, agent[0]);
    assert_eq!(attempt.len(), 1);
    let mut inside: Vec<&str> = children(spans, attempt[0])
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    inside.sort_unstable();
    assert_eq!(
        inside,
        [
            "chat mock-model",
            "chat mock-model",
            "execute_tool list_files"
        ]
    );
    root
}

#[tokio::test(flavor = "multi_thread")]
async fn a_foreground_delegation_is_a_trace_of_its_own() {
    let server = MockServer::start(tool_then_answer()).await;
    let collector = Collector::start(StatusCode::OK).await;
    traced(&server, &collector.url)
        .env(
            "TRACEPARENT",
            &format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01"),
        )
        .args(["delegate", "--instructions", "Summarise the project"])
        .stdout("the summary\n")
        .run();
    let spans = collector.spans();
    let root = check_delegation(&spans, "delegate task");
    assert_eq!(hex(&root.trace_id), PARENT_TRACE);
    assert_eq!(hex(&root.parent_span_id), PARENT_SPAN);
    assert!(!String::from_utf8_lossy(&collector.raw()).contains("Summarise the project"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_background_task_is_traced_by_its_worker() {
    let server = MockServer::start(tool_then_answer()).await;
    let collector = Collector::start(StatusCode::OK).await;
    let t = traced(&server, &collector.url);
    let started = t
        .command()
        .args([
            "delegate",
            "--async",
            "--json",
            "--instructions",
            "Summarise the project",
        ])
        .output()
        .unwrap();
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );
    let id = serde_json::from_slice::<Value>(&started.stdout).unwrap()["task_id"]
        .as_str()
        .expect("the task id")
        .to_owned();
    let loaded = t.command().args(["load", &id]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&loaded.stdout), "the summary\n");
    // The worker sends its trace as it exits, after recording the result.
    support::wait_for(
        std::time::Duration::from_secs(20),
        "the worker's trace",
        || !named(&collector.spans(), "delegate task").is_empty(),
    );
    let spans = collector.spans();
    let root = check_delegation(&spans, "delegate task");
    assert_eq!(attr(&root, "summon.run.id"), Some(json!(id)));
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_the_run_starts_get_its_span_context() {
    let server = MockServer::start(MockConfig::new().rule(|request| {
        let answered_tool = request.body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        if answered_tool {
            Reply::text("done")
        } else {
            Reply::tool_call("shell", json!({"command": "echo \"tp=$TRACEPARENT\""}))
        }
    }))
    .await;
    let collector = Collector::start(StatusCode::OK).await;
    let pipeline = "version: 1
name: commands
steps:
  - id: list
    decompose:
      command: echo \"$TRACEPARENT\"
  - id: each
    fan_out:
      over: list
      instructions: \"Run a command\"
      extensions: [developer]
";
    let out = traced(&server, &collector.url)
        .env(
            "TRACEPARENT",
            &format!("00-{PARENT_TRACE}-{PARENT_SPAN}-01"),
        )
        .write_raw("c.yaml", pipeline)
        .args([
            "run",
            "c.yaml",
            "--out",
            "out",
            "--quiet",
            "--sandbox",
            "off",
        ])
        .run();
    let spans = collector.spans();
    let run = one(&spans, "run commands");
    let expected = format!("00-{PARENT_TRACE}-{}-01", hex(&run.span_id));
    // The decompose command saw the run's context, not the CI job's, and has its span.
    let lines = results(&out.dir.join("out"));
    let item = lines
        .iter()
        .find(|l| l["step"] == "each")
        .expect("the task")["item"]
        .clone();
    assert_eq!(item, json!(expected));
    let decompose = one(&spans, "decompose command");
    assert_eq!(attr(decompose, "summon.decompose.items"), Some(json!(1)));
    assert_eq!(decompose.parent_span_id, one(&spans, "step list").span_id);
    // The model's shell command runs under its tool call's span.
    let tool = one(&spans, "execute_tool shell");
    let under_tool = format!("00-{PARENT_TRACE}-{}-01", hex(&tool.span_id));
    let answers: Vec<String> = support::chats(&server)
        .iter()
        .flat_map(support::mcp::tool_results)
        .collect();
    assert!(
        answers
            .iter()
            .any(|a| a.contains(&format!("tp={under_tool}"))),
        "{answers:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_server_gets_the_span_context_at_start_and_with_each_call() {
    let server = MockServer::start(MockConfig::new().replies([
        Reply::tool_call("bad__env", json!({"name": "TRACEPARENT"})),
        Reply::tool_call("bad__meta", json!({})),
        Reply::text("done"),
    ]))
    .await;
    let collector = Collector::start(StatusCode::OK).await;
    let recipe = format!(
        "title: Tools\ndescription: uses an MCP server\nprompt: Use the tools.\n\
         extensions:\n  - type: stdio\n    name: bad\n    cmd: python3\n    args: ['{}', 'ok']\n",
        support::mcp::fixture("misbehaving.py")
    );
    traced(&server, &collector.url)
        .write_raw("recipes/tools.yaml", &recipe)
        .env("SUMMON_TRUST_PROJECT", "1")
        .args(["delegate", "--source", "tools"])
        .run();
    let spans = collector.spans();
    let root = one(&spans, "delegate tools");
    let trace = hex(&root.trace_id);
    let answers: Vec<String> = support::chats(&server)
        .iter()
        .flat_map(support::mcp::tool_results)
        .collect();
    // The server process started under the delegation's span...
    assert!(
        answers.contains(&format!("00-{trace}-{}-01", hex(&root.span_id))),
        "{answers:?}"
    );
    // ...and each call carries its own span in `_meta` (SEP-414): a client span of the call.
    let call = one(&spans, "execute_tool bad__meta");
    assert_eq!(attr(call, "mcp.method.name"), Some(json!("tools/call")));
    assert_eq!(attr(call, "summon.extension"), Some(json!("bad")));
    assert_eq!(call.kind, 3, "a client span");
    let meta: Value = answers
        .iter()
        .find_map(|a| {
            serde_json::from_str::<Value>(a)
                .ok()
                .filter(|v| v.is_object())
        })
        .expect("the _meta the server got");
    assert_eq!(
        meta["traceparent"],
        json!(format!("00-{trace}-{}-01", hex(&call.span_id)))
    );
}
