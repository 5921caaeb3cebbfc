//! The Anthropic Message Batches wire format: `POST /v1/messages/batches` with one
//! `{custom_id, params}` per request, the batch object, and the JSONL at `results_url`.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::anthropic;
use super::batch::{BatchCounts, BatchLine, BatchState, BatchStatus, LineResult};
use super::error::ProviderError;

/// Relative to a base URL without `/v1`.
pub(crate) const BATCHES_PATH: &str = "/v1/messages/batches";
/// The most requests of one batch.
pub(crate) const MAX_REQUESTS: usize = 100_000;

/// The body of `POST /v1/messages/batches`.
pub(crate) fn create_body(lines: &[BatchLine]) -> Value {
    let requests: Vec<Value> = lines
        .iter()
        .map(|line| {
            json!({
                "custom_id": line.custom_id,
                "params": anthropic::request_body(&line.request),
            })
        })
        .collect();
    json!({ "requests": requests })
}

/// The `id` of a batch object.
pub(crate) fn batch_id(body: &Value) -> Result<String, ProviderError> {
    body.get("id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| ProviderError::Other {
            status: None,
            message: format!("the provider's batch object has no id: {body}"),
        })
}

/// Parses a batch object.
pub(crate) fn parse_status(body: &Value) -> Result<BatchStatus, ProviderError> {
    let id = batch_id(body)?;
    let status_text = body
        .get("processing_status")
        .and_then(Value::as_str)
        .unwrap_or("in_progress")
        .to_owned();
    let counts = body.get("request_counts");
    let count = |key: &str| {
        counts
            .and_then(|c| c.get(key))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let (processing, succeeded) = (count("processing"), count("succeeded"));
    let failed = count("errored") + count("canceled") + count("expired");
    let results_url = body
        .get("results_url")
        .and_then(Value::as_str)
        .filter(|url| !url.is_empty());
    let state = match status_text.as_str() {
        "ended" if results_url.is_some() => BatchState::Ended,
        "ended" => BatchState::Failed("the batch ended without a results_url".to_owned()),
        // in_progress, canceling, and anything new.
        _ => BatchState::InProgress,
    };
    Ok(BatchStatus {
        id,
        state,
        status_text,
        counts: BatchCounts {
            total: processing + succeeded + failed,
            succeeded,
            failed,
        },
        results: results_url.map(str::to_owned).into_iter().collect(),
    })
}

/// Adds the lines of a results file to `results`.
pub(crate) fn parse_results(text: &str, results: &mut HashMap<String, LineResult>) {
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(value) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let Some(custom_id) = value.get("custom_id").and_then(Value::as_str) else {
            continue;
        };
        results.insert(custom_id.to_owned(), line_result(&value));
    }
}

fn line_result(value: &Value) -> LineResult {
    let result = value.get("result").unwrap_or(&Value::Null);
    match result.get("type").and_then(Value::as_str) {
        Some("succeeded") => {
            match anthropic::parse_response(result.get("message").unwrap_or(&Value::Null)) {
                // Batch requests with a response schema force the answer tool.
                Ok(mut parsed) => {
                    super::structured::take_answer_tool(&mut parsed);
                    LineResult::Succeeded(parsed)
                }
                Err(err) => LineResult::Failed {
                    message: err.to_string(),
                    transient: false,
                },
            }
        }
        Some("errored") => {
            // `error` is an error response: `{"type": "error", "error": {"type", "message"}}`.
            let error = result.get("error").unwrap_or(&Value::Null);
            let inner = error.get("error").unwrap_or(error);
            let kind = inner.get("type").and_then(Value::as_str).unwrap_or("error");
            let message = inner
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("the request failed");
            LineResult::Failed {
                message: format!("{kind}: {message}"),
                transient: matches!(
                    kind,
                    "api_error" | "overloaded_error" | "rate_limit_error" | "timeout_error"
                ),
            }
        }
        Some("expired") => LineResult::Failed {
            message: "batch_expired: the batch expired before this request ran".to_owned(),
            transient: true,
        },
        Some("canceled") => LineResult::Failed {
            message: "the batch was canceled before this request ran".to_owned(),
            transient: true,
        },
        other => LineResult::Failed {
            message: format!("unknown batch result type {other:?}"),
            transient: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::message::{ChatRequest, Message};

    #[test]
    fn requests_and_results() {
        let body = create_body(&[BatchLine {
            custom_id: "task-3".into(),
            request: ChatRequest {
                model: "claude-x".into(),
                system: "S".into(),
                messages: vec![Message::user("hi")],
                ..ChatRequest::default()
            },
        }]);
        assert_eq!(body["requests"][0]["custom_id"], "task-3");
        assert_eq!(body["requests"][0]["params"]["system"], "S");
        assert_eq!(body["requests"][0]["params"]["max_tokens"], 8192);

        let status = parse_status(&json!({"id": "msgbatch_1", "processing_status": "ended",
            "results_url": "http://h/r", "request_counts": {"processing": 0, "succeeded": 2,
            "errored": 1, "canceled": 0, "expired": 1}}))
        .unwrap();
        assert_eq!(status.state, BatchState::Ended);
        assert_eq!(
            status.counts,
            BatchCounts {
                total: 4,
                succeeded: 2,
                failed: 2
            }
        );

        let mut results = HashMap::new();
        parse_results(
            concat!(
                r#"{"custom_id":"a","result":{"type":"succeeded","message":{"content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":3,"output_tokens":1}}}}"#,
                "\n",
                r#"{"custom_id":"b","result":{"type":"errored","error":{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}}}"#,
                "\n",
                r#"{"custom_id":"c","result":{"type":"expired"}}"#,
            ),
            &mut results,
        );
        assert!(
            matches!(&results["a"], LineResult::Succeeded(r) if r.text.as_deref() == Some("hi"))
        );
        assert!(
            matches!(&results["b"], LineResult::Failed { transient: false, message } if message.contains("bad"))
        );
        assert!(matches!(
            &results["c"],
            LineResult::Failed {
                transient: true,
                ..
            }
        ));
    }
}
