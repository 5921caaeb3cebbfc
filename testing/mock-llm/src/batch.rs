//! The batch endpoints of both providers.
//!
//! OpenAI Batch: `POST /v1/files` (multipart, `purpose=batch`, a JSONL file of
//! `{custom_id, method, url, body}` lines), `POST /v1/batches` (`endpoint` must be
//! `/v1/chat/completions`, `completion_window` `24h`), `GET /v1/batches/{id}`, and
//! `GET /v1/files/{id}/content` for the output and error files.
//!
//! Anthropic Message Batches: `POST /v1/messages/batches` (`{requests: [{custom_id,
//! params}]}`), `GET /v1/messages/batches/{id}` and `GET /v1/messages/batches/{id}/results`.
//!
//! A batch answers [`BatchConfig::polls`] status requests with `in_progress` (forever while
//! [`MockServer::hold_batches`] is on), then ends: every line is answered, in line order, by
//! the same queue, rule or default reply as a live chat request (delays are not waited out).
//! A reply with a status other than 200 makes the line fail with that status and body. The
//! [`BatchOutcome`]s of [`MockConfig::batch_outcomes`] apply to the batches in creation order:
//! [`BatchOutcome::Expire`] answers only the first `processed` lines and reports the others
//! expired. [`MockConfig::batch_create_failures`] answers the first creates (of either API)
//! with HTTP 500; `DELETE /v1/files/{id}` removes an uploaded file ([`MockServer::batch_files`]
//! lists those left); [`MockConfig::results_base`] puts Anthropic's `results_url` on another
//! origin. Every call to these endpoints is recorded with [`Api::Batch`]; the lines each
//! batch held are in [`MockServer::batches`].

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::{
    Answer, Api, AppState, InFlight, MockConfig, MockServer, RecordedRequest, Reply, Shared,
    contains_echo, json_response, lock, record, success_body,
};

/// How a batch ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BatchOutcome {
    /// Every line is answered.
    #[default]
    Complete,
    /// The completion window passes after `processed` lines were answered; the rest expire.
    Expire { processed: usize },
}

/// How batches behave.
#[derive(Debug, Clone, Default)]
pub struct BatchConfig {
    /// Outcomes of the batches in creation order; later batches complete.
    pub outcomes: Vec<BatchOutcome>,
    /// Status requests answered `in_progress` before a batch ends.
    pub polls: u32,
    /// Batch creates answered with HTTP 500 before one succeeds.
    pub create_failures: u32,
    /// Where Anthropic's `results_url` points instead of this server (`http://host:port`).
    pub results_base: Option<String>,
}

/// A batch as the server received it.
#[derive(Debug, Clone)]
pub struct BatchRecord {
    pub id: String,
    /// [`Api::OpenAi`] or [`Api::Anthropic`].
    pub api: Api,
    pub custom_ids: Vec<String>,
    /// The request body of each line (OpenAI `body`, Anthropic `params`).
    pub lines: Vec<Value>,
    /// Whether it has ended.
    pub ended: bool,
}

/// One line's result once its batch ended.
#[derive(Debug, Clone)]
enum LineOutcome {
    Ok(Value),
    Error(u16, Value),
    Expired,
}

#[derive(Debug)]
struct MockBatch {
    record: BatchRecord,
    outcome: BatchOutcome,
    polls: u32,
    /// Set when the batch ends.
    results: Option<Vec<LineOutcome>>,
    /// OpenAI: the output and error files, once ended.
    output_file: Option<String>,
    error_file: Option<String>,
}

/// The batch endpoints' state.
#[derive(Debug, Default)]
pub(crate) struct BatchState {
    files: HashMap<String, Vec<u8>>,
    batches: Vec<MockBatch>,
    outcomes: VecDeque<BatchOutcome>,
    polls: u32,
    held: bool,
    next: u64,
    create_failures: u32,
    results_base: Option<String>,
}

impl BatchState {
    pub(crate) fn new(config: &BatchConfig) -> Self {
        Self {
            outcomes: config.outcomes.iter().copied().collect(),
            polls: config.polls,
            create_failures: config.create_failures,
            results_base: config.results_base.clone(),
            ..Self::default()
        }
    }

    fn next_id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

impl MockConfig {
    /// Outcomes of the batches, in creation order (later ones complete).
    pub fn batch_outcomes(mut self, outcomes: impl IntoIterator<Item = BatchOutcome>) -> Self {
        self.batch.outcomes.extend(outcomes);
        self
    }

    /// Status requests answered `in_progress` before a batch ends (default 1).
    pub fn batch_polls(mut self, polls: u32) -> Self {
        self.batch.polls = polls;
        self
    }

    /// The first `n` batch creates fail with HTTP 500.
    pub fn batch_create_failures(mut self, n: u32) -> Self {
        self.batch.create_failures = n;
        self
    }

    /// Anthropic's `results_url` points at `base` (`http://host:port`) instead of this server.
    pub fn results_base(mut self, base: impl Into<String>) -> Self {
        self.batch.results_base = Some(base.into());
        self
    }
}

impl MockServer {
    /// The batches created so far, in creation order.
    pub fn batches(&self) -> Vec<BatchRecord> {
        lock(&self.shared.batch)
            .batches
            .iter()
            .map(|b| b.record.clone())
            .collect()
    }

    /// The ids of the uploaded files not deleted, in upload order.
    pub fn batch_files(&self) -> Vec<String> {
        let mut ids: Vec<String> = lock(&self.shared.batch).files.keys().cloned().collect();
        ids.sort_by_key(|id| {
            id.rsplit('-')
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        });
        ids
    }

    /// While on, every batch stays `in_progress`.
    pub fn hold_batches(&self, hold: bool) {
        lock(&self.shared.batch).held = hold;
    }

    /// Status requests received for batches (both APIs).
    pub fn batch_polls(&self) -> usize {
        lock(&self.shared.recorded)
            .iter()
            .filter(|r| r.api == Api::Batch && r.method == "GET" && is_status_path(&r.path))
            .count()
    }
}

fn is_status_path(path: &str) -> bool {
    let rest = path
        .strip_prefix("/v1/messages/batches/")
        .or_else(|| path.strip_prefix("/v1/batches/"));
    rest.is_some_and(|id| !id.contains('/'))
}

/// The routes, to merge into the server's router.
pub(crate) fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/v1/files", post(upload_file))
        .route("/v1/files/{id}/content", get(file_content))
        .route("/v1/files/{id}", axum::routing::delete(delete_file))
        .route("/v1/batches", post(create_openai))
        .route("/v1/batches/{id}", get(get_openai))
        .route("/v1/messages/batches", post(create_anthropic))
        .route("/v1/messages/batches/{id}", get(get_anthropic))
        .route("/v1/messages/batches/{id}/results", get(anthropic_results))
}

fn note(shared: &Shared, method: &str, path: &str, headers: &HeaderMap, body: Value) {
    let (_guard, seq) = InFlight::enter(shared);
    if shared.record {
        lock(&shared.recorded).push(record(seq, Api::Batch, method, path, headers, body));
    }
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    json_response(
        status,
        &json!({"error": {"message": message.into(), "type": "invalid_request_error"}}),
    )
}

fn jsonl_response(text: String) -> Response {
    let mut response = Response::new(Body::from(text));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/binary"),
    );
    response
}

/// The parts of a `multipart/form-data` body: `(name, content)`.
fn multipart_parts(headers: &HeaderMap, body: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let content_type = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let boundary = content_type
        .split(';')
        .find_map(|p| p.trim().strip_prefix("boundary="))?
        .trim_matches('"');
    let delimiter = format!("--{boundary}");
    let mut parts = Vec::new();
    let mut rest = body;
    loop {
        let start = find(rest, delimiter.as_bytes())?;
        rest = &rest[start + delimiter.len()..];
        if rest.starts_with(b"--") {
            return Some(parts);
        }
        let rest_start = rest.strip_prefix(b"\r\n")?;
        let end = find(rest_start, delimiter.as_bytes())?;
        let part = &rest_start[..end];
        let split = find(part, b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&part[..split]).into_owned();
        let mut content = &part[split + 4..];
        content = content.strip_suffix(b"\r\n").unwrap_or(content);
        let name = head
            .split(';')
            .find_map(|p| p.trim().strip_prefix("name="))
            .map(|n| {
                n.split(['\r', '\n'])
                    .next()
                    .unwrap_or("")
                    .trim_matches('"')
                    .to_owned()
            })?;
        parts.push((name, content.to_vec()));
        rest = &rest_start[end..];
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

async fn upload_file(State(shared): AppState, headers: HeaderMap, body: Bytes) -> Response {
    let parts = multipart_parts(&headers, &body).unwrap_or_default();
    let part = |name: &str| {
        parts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c.clone())
    };
    let purpose = part("purpose").map(|p| String::from_utf8_lossy(&p).into_owned());
    let file = part("file");
    let lines = file.as_ref().map_or(0, |f| {
        f.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count()
    });
    note(
        &shared,
        "POST",
        "/v1/files",
        &headers,
        json!({"purpose": purpose, "lines": lines}),
    );
    let Some(file) = file else {
        return error(StatusCode::BAD_REQUEST, "no `file` part in the upload");
    };
    if purpose.as_deref() != Some("batch") {
        return error(StatusCode::BAD_REQUEST, "`purpose` must be `batch`");
    }
    let mut state = lock(&shared.batch);
    let id = format!("file-mock-{}", state.next_id());
    let bytes = file.len();
    state.files.insert(id.clone(), file);
    json_response(
        StatusCode::OK,
        &json!({"id": id, "object": "file", "bytes": bytes, "created_at": 0,
                "filename": "batch.jsonl", "purpose": "batch"}),
    )
}

async fn file_content(
    State(shared): AppState,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    note(
        &shared,
        "GET",
        &format!("/v1/files/{id}/content"),
        &headers,
        Value::Null,
    );
    match lock(&shared.batch).files.get(&id) {
        Some(content) => jsonl_response(String::from_utf8_lossy(content).into_owned()),
        None => error(StatusCode::NOT_FOUND, format!("no file `{id}`")),
    }
}

async fn delete_file(
    State(shared): AppState,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    note(
        &shared,
        "DELETE",
        &format!("/v1/files/{id}"),
        &headers,
        Value::Null,
    );
    match lock(&shared.batch).files.remove(&id) {
        Some(_) => json_response(
            StatusCode::OK,
            &json!({"id": id, "object": "file", "deleted": true}),
        ),
        None => error(StatusCode::NOT_FOUND, format!("no file `{id}`")),
    }
}

/// Whether this create is one of the failures asked for; counts it.
fn create_fails(shared: &Shared) -> bool {
    let mut state = lock(&shared.batch);
    if state.create_failures == 0 {
        return false;
    }
    state.create_failures -= 1;
    true
}

fn server_error() -> Response {
    json_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        &json!({"error": {"message": "The server had an error while processing your request.", "type": "server_error"}}),
    )
}

/// Checks the custom ids: present, unique, and (Anthropic) `^[a-zA-Z0-9_-]{1,64}$`.
fn check_ids(ids: &[String], strict: bool) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for id in ids {
        if id.is_empty() || !seen.insert(id) {
            return Err(format!("custom_id `{id}` is empty or not unique"));
        }
        if strict
            && (id.len() > 64
                || !id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        {
            return Err(format!(
                "custom_id `{id}` has characters that are not allowed"
            ));
        }
    }
    Ok(())
}

fn add_batch(shared: &Shared, api: Api, ids: Vec<String>, lines: Vec<Value>) -> String {
    let mut state = lock(&shared.batch);
    let n = state.next_id();
    let id = match api {
        Api::Anthropic => format!("msgbatch_mock_{n}"),
        _ => format!("batch_mock_{n}"),
    };
    let outcome = state.outcomes.pop_front().unwrap_or_default();
    let polls = state.polls;
    state.batches.push(MockBatch {
        record: BatchRecord {
            id: id.clone(),
            api,
            custom_ids: ids,
            lines,
            ended: false,
        },
        outcome,
        polls,
        results: None,
        output_file: None,
        error_file: None,
    });
    id
}

async fn create_openai(State(shared): AppState, headers: HeaderMap, body: Bytes) -> Response {
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    note(&shared, "POST", "/v1/batches", &headers, json.clone());
    if create_fails(&shared) {
        return server_error();
    }
    if json["endpoint"] != "/v1/chat/completions" || json["completion_window"] != "24h" {
        return error(
            StatusCode::BAD_REQUEST,
            "endpoint must be /v1/chat/completions and completion_window 24h",
        );
    }
    let file_id = json["input_file_id"].as_str().unwrap_or_default();
    let Some(file) = lock(&shared.batch).files.get(file_id).cloned() else {
        return error(StatusCode::BAD_REQUEST, format!("no file `{file_id}`"));
    };
    let mut ids = Vec::new();
    let mut lines = Vec::new();
    for (n, line) in String::from_utf8_lossy(&file).lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let Ok(value) = serde_json::from_str::<Value>(line) else {
            return error(StatusCode::BAD_REQUEST, format!("line {}: not JSON", n + 1));
        };
        if value["method"] != "POST" || value["url"] != "/v1/chat/completions" {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "line {}: method must be POST and url /v1/chat/completions",
                    n + 1
                ),
            );
        }
        ids.push(value["custom_id"].as_str().unwrap_or_default().to_owned());
        lines.push(value["body"].clone());
    }
    if let Err(message) = check_ids(&ids, false) {
        return error(StatusCode::BAD_REQUEST, message);
    }
    let id = add_batch(&shared, Api::OpenAi, ids, lines);
    let state = lock(&shared.batch);
    let batch = state.batches.iter().find(|b| b.record.id == id);
    json_response(StatusCode::OK, &openai_object(batch, "validating"))
}

async fn create_anthropic(State(shared): AppState, headers: HeaderMap, body: Bytes) -> Response {
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    note(
        &shared,
        "POST",
        "/v1/messages/batches",
        &headers,
        json.clone(),
    );
    if create_fails(&shared) {
        return server_error();
    }
    let Some(requests) = json["requests"].as_array().filter(|r| !r.is_empty()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "`requests` must be a non-empty list",
        );
    };
    let ids: Vec<String> = requests
        .iter()
        .map(|r| r["custom_id"].as_str().unwrap_or_default().to_owned())
        .collect();
    if let Err(message) = check_ids(&ids, true) {
        return error(StatusCode::BAD_REQUEST, message);
    }
    let lines = requests.iter().map(|r| r["params"].clone()).collect();
    let id = add_batch(&shared, Api::Anthropic, ids, lines);
    let state = lock(&shared.batch);
    let batch = state.batches.iter().find(|b| b.record.id == id);
    json_response(StatusCode::OK, &anthropic_object(batch, &state, &shared))
}

/// Counts a status request; ends the batch when its polls are used up.
fn poll(shared: &Shared, id: &str) -> bool {
    let held = lock(&shared.batch).held;
    let ends = {
        let mut state = lock(&shared.batch);
        let Some(batch) = state.batches.iter_mut().find(|b| b.record.id == id) else {
            return false;
        };
        if batch.results.is_some() || held {
            return true;
        }
        if batch.polls > 0 {
            batch.polls -= 1;
            return true;
        }
        (batch.record.api, batch.record.lines.clone(), batch.outcome)
    };
    let (api, lines, outcome) = ends;
    let processed = match outcome {
        BatchOutcome::Complete => lines.len(),
        BatchOutcome::Expire { processed } => processed.min(lines.len()),
    };
    let results: Vec<LineOutcome> = lines
        .iter()
        .enumerate()
        .map(|(n, body)| {
            if n < processed {
                answer(shared, api, body)
            } else {
                LineOutcome::Expired
            }
        })
        .collect();
    let mut state = lock(&shared.batch);
    let (output, errors) = match api {
        Api::OpenAi => {
            let Some(batch) = state.batches.iter().find(|b| b.record.id == id) else {
                return false;
            };
            openai_files(&batch.record.custom_ids, &results)
        }
        _ => (String::new(), String::new()),
    };
    let output_file = (!output.is_empty()).then(|| {
        let file = format!("file-mock-{}", state.next_id());
        state.files.insert(file.clone(), output.into_bytes());
        file
    });
    let error_file = (!errors.is_empty()).then(|| {
        let file = format!("file-mock-{}", state.next_id());
        state.files.insert(file.clone(), errors.into_bytes());
        file
    });
    if let Some(batch) = state.batches.iter_mut().find(|b| b.record.id == id) {
        batch.results = Some(results);
        batch.record.ended = true;
        batch.output_file = output_file;
        batch.error_file = error_file;
    }
    true
}

/// Answers one line like a live chat request.
fn answer(shared: &Shared, api: Api, body: &Value) -> LineOutcome {
    let path = match api {
        Api::Anthropic => "/v1/messages",
        _ => "/v1/chat/completions",
    };
    let request: RecordedRequest = record(0, api, "POST", path, &HeaderMap::new(), body.clone());
    let scripted = lock(&shared.queue).pop_front();
    let mut reply = match (scripted, &shared.rule) {
        (Some(reply), _) => reply,
        (None, Some(rule)) => rule(&request),
        (None, None) => shared.default_reply.clone(),
    };
    if contains_echo(&reply) {
        let echo = format!("echo: {}", request.last_user_text().unwrap_or_default());
        reply = strip(reply, &echo);
    }
    let reply = strip(reply, "");
    let input_tokens = (serde_json::to_vec(body).map_or(0, |b| b.len()) as u64 / 4).max(1);
    let model = request.model().unwrap_or("mock-model").to_owned();
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    if let Some(answer) = Answer::of(&reply) {
        return LineOutcome::Ok(success_body(api, id, &model, &answer, input_tokens));
    }
    match reply {
        Reply::Status {
            code: 200, body, ..
        } => LineOutcome::Ok(serde_json::from_str(&body).unwrap_or(Value::Null)),
        Reply::Status { code, body, .. } => LineOutcome::Error(
            code,
            serde_json::from_str(&body)
                .unwrap_or_else(|_| json!({"error": {"message": body, "type": "api_error"}})),
        ),
        _ => LineOutcome::Ok(success_body(
            api,
            id,
            &model,
            &Answer::default(),
            input_tokens,
        )),
    }
}

/// The reply without delays, `Echo` answered with `echo`.
fn strip(reply: Reply, echo: &str) -> Reply {
    match reply {
        Reply::Delay(_, inner) => strip(*inner, echo),
        Reply::Echo if !echo.is_empty() => Reply::Text(echo.to_owned()),
        Reply::Finish(reason, inner) => Reply::Finish(reason, Box::new(strip(*inner, echo))),
        other => other,
    }
}

/// OpenAI's output and error files.
fn openai_files(ids: &[String], results: &[LineOutcome]) -> (String, String) {
    let mut output = String::new();
    let mut errors = String::new();
    for (n, (id, result)) in ids.iter().zip(results).enumerate() {
        let line = match result {
            LineOutcome::Ok(body) => json!({"id": format!("batch_req_{n}"), "custom_id": id,
                "response": {"status_code": 200, "request_id": format!("req_{n}"), "body": body},
                "error": null}),
            LineOutcome::Error(code, body) => json!({"id": format!("batch_req_{n}"),
                "custom_id": id, "response": {"status_code": code,
                "request_id": format!("req_{n}"), "body": body}, "error": null}),
            LineOutcome::Expired => json!({"id": format!("batch_req_{n}"), "custom_id": id,
                "response": null, "error": {"code": "batch_expired",
                "message": "This request could not be executed before the completion window expired."}}),
        };
        let target = if matches!(result, LineOutcome::Ok(_)) {
            &mut output
        } else {
            &mut errors
        };
        target.push_str(&line.to_string());
        target.push('\n');
    }
    (output, errors)
}

fn counts(batch: &MockBatch) -> (usize, usize, usize, usize) {
    let total = batch.record.lines.len();
    match &batch.results {
        None => (total, 0, 0, 0),
        Some(results) => {
            let ok = results
                .iter()
                .filter(|r| matches!(r, LineOutcome::Ok(_)))
                .count();
            let expired = results
                .iter()
                .filter(|r| matches!(r, LineOutcome::Expired))
                .count();
            (total, ok, total - ok - expired, expired)
        }
    }
}

fn openai_object(batch: Option<&MockBatch>, fresh_status: &str) -> Value {
    let Some(batch) = batch else {
        return Value::Null;
    };
    let (total, ok, errored, expired) = counts(batch);
    let status = match (&batch.results, batch.outcome) {
        (None, _) => fresh_status,
        (Some(_), BatchOutcome::Expire { .. }) => "expired",
        (Some(_), BatchOutcome::Complete) => "completed",
    };
    json!({
        "id": batch.record.id,
        "object": "batch",
        "endpoint": "/v1/chat/completions",
        "errors": null,
        "input_file_id": "file-mock-input",
        "completion_window": "24h",
        "status": status,
        "output_file_id": batch.output_file,
        "error_file_id": batch.error_file,
        "created_at": 0,
        "request_counts": {"total": total, "completed": ok, "failed": errored + expired},
        "metadata": null,
    })
}

fn anthropic_object(batch: Option<&MockBatch>, state: &BatchState, shared: &Shared) -> Value {
    let Some(batch) = batch else {
        return Value::Null;
    };
    let (total, ok, errored, expired) = counts(batch);
    let ended = batch.results.is_some();
    let base = state
        .results_base
        .clone()
        .unwrap_or_else(|| format!("http://{}", shared.addr));
    let results_url =
        ended.then(|| format!("{base}/v1/messages/batches/{}/results", batch.record.id));
    json!({
        "id": batch.record.id,
        "type": "message_batch",
        "processing_status": if ended { "ended" } else { "in_progress" },
        "request_counts": {
            "processing": if ended { 0 } else { total },
            "succeeded": ok, "errored": errored, "canceled": 0, "expired": expired,
        },
        "ended_at": null,
        "created_at": "2025-01-01T00:00:00Z",
        "expires_at": "2025-01-02T00:00:00Z",
        "results_url": results_url,
    })
}

async fn get_openai(
    State(shared): AppState,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    note(
        &shared,
        "GET",
        &format!("/v1/batches/{id}"),
        &headers,
        Value::Null,
    );
    if !poll(&shared, &id) {
        return error(StatusCode::NOT_FOUND, format!("no batch `{id}`"));
    }
    let state = lock(&shared.batch);
    let batch = state.batches.iter().find(|b| b.record.id == id);
    json_response(StatusCode::OK, &openai_object(batch, "in_progress"))
}

async fn get_anthropic(
    State(shared): AppState,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    note(
        &shared,
        "GET",
        &format!("/v1/messages/batches/{id}"),
        &headers,
        Value::Null,
    );
    if !poll(&shared, &id) {
        return error(StatusCode::NOT_FOUND, format!("no batch `{id}`"));
    }
    let state = lock(&shared.batch);
    let batch = state.batches.iter().find(|b| b.record.id == id);
    json_response(StatusCode::OK, &anthropic_object(batch, &state, &shared))
}

async fn anthropic_results(
    State(shared): AppState,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    note(
        &shared,
        "GET",
        &format!("/v1/messages/batches/{id}/results"),
        &headers,
        Value::Null,
    );
    let state = lock(&shared.batch);
    let Some(batch) = state.batches.iter().find(|b| b.record.id == id) else {
        return error(StatusCode::NOT_FOUND, format!("no batch `{id}`"));
    };
    let Some(results) = &batch.results else {
        return error(
            StatusCode::BAD_REQUEST,
            format!("batch `{id}` has not ended"),
        );
    };
    let mut text = String::new();
    for (custom_id, result) in batch.record.custom_ids.iter().zip(results) {
        let result = match result {
            LineOutcome::Ok(message) => json!({"type": "succeeded", "message": message}),
            LineOutcome::Error(code, body) => {
                // Anthropic's error types, from the status (a scripted body may use OpenAI's).
                let mut inner = body.get("error").cloned().unwrap_or_else(|| body.clone());
                let kind = match code {
                    429 => Some("rate_limit_error"),
                    529 => Some("overloaded_error"),
                    500..=599 => Some("api_error"),
                    _ => None,
                };
                if inner.is_object() {
                    match kind {
                        Some(kind) => inner["type"] = json!(kind),
                        None if inner.get("type").is_none() => {
                            inner["type"] = json!("invalid_request_error");
                        }
                        None => {}
                    }
                }
                json!({"type": "errored", "error": {"type": "error", "error": inner}})
            }
            LineOutcome::Expired => json!({"type": "expired"}),
        };
        text.push_str(&json!({"custom_id": custom_id, "result": result}).to_string());
        text.push('\n');
    }
    jsonl_response(text)
}
