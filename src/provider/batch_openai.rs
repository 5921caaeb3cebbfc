//! The OpenAI Batch wire format: a JSONL input file (one Chat Completions request per line)
//! uploaded with `purpose=batch`, a batch over it for `/v1/chat/completions` with a 24 h
//! window, the batch object, and the output and error files.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::batch::{BatchCounts, BatchLine, BatchState, BatchStatus, LineResult, transient_status};
use super::error::ProviderError;
use super::openai;

/// Relative to a base URL that ends in `/v1`.
pub(crate) const FILES_PATH: &str = "/files";
pub(crate) const BATCHES_PATH: &str = "/batches";
/// The endpoint every line goes to, as the Batch API names it.
pub(crate) const ENDPOINT: &str = "/v1/chat/completions";
/// The most requests of one batch.
pub(crate) const MAX_LINES: usize = 50_000;

/// The input file: one `{"custom_id", "method", "url", "body"}` line per request.
pub(crate) fn input_file(lines: &[BatchLine]) -> Vec<u8> {
    let mut out = Vec::new();
    for line in lines {
        let entry = json!({
            "custom_id": line.custom_id,
            "method": "POST",
            "url": ENDPOINT,
            "body": openai::request_body(&line.request),
        });
        // Serializing a `Value` cannot fail.
        let _ = serde_json::to_writer(&mut out, &entry);
        out.push(b'\n');
    }
    out
}

/// A `multipart/form-data` upload of `jsonl` with `purpose=batch`: the content type and body.
pub(crate) fn multipart(jsonl: &[u8]) -> (String, Vec<u8>) {
    let mut boundary = format!("summon-{:032x}", rand::random::<u128>());
    while contains(jsonl, boundary.as_bytes()) {
        boundary = format!("summon-{:032x}", rand::random::<u128>());
    }
    let mut body = Vec::with_capacity(jsonl.len() + 400);
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"summon-batch.jsonl\"\r\n\
             Content-Type: application/jsonl\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(jsonl);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The body of `POST /batches`.
pub(crate) fn create_body(input_file_id: &str) -> Value {
    json!({
        "input_file_id": input_file_id,
        "endpoint": ENDPOINT,
        "completion_window": "24h",
        "metadata": {"created_by": "summon"},
    })
}

/// The `id` of a file or batch object.
pub(crate) fn object_id(body: &Value, what: &str) -> Result<String, ProviderError> {
    body.get("id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| ProviderError::Other {
            status: None,
            message: format!("the provider's {what} object has no id: {body}"),
        })
}

/// Parses a batch object.
pub(crate) fn parse_status(body: &Value) -> Result<BatchStatus, ProviderError> {
    let id = object_id(body, "batch")?;
    let status_text = body
        .get("status")
        .and_then(Value::as_str)
        .unwrap_or("in_progress")
        .to_owned();
    let state = match status_text.as_str() {
        "completed" => BatchState::Ended,
        "expired" => BatchState::Expired,
        "cancelled" => BatchState::Cancelled,
        "failed" => BatchState::Failed(batch_errors(body)),
        // validating, in_progress, finalizing, cancelling, and anything new.
        _ => BatchState::InProgress,
    };
    let counts = body.get("request_counts");
    let count = |key: &str| {
        counts
            .and_then(|c| c.get(key))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let results = ["output_file_id", "error_file_id"]
        .iter()
        .filter_map(|key| body.get(*key).and_then(Value::as_str))
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
        .collect();
    Ok(BatchStatus {
        id,
        state,
        status_text,
        counts: BatchCounts {
            total: count("total"),
            succeeded: count("completed"),
            failed: count("failed"),
        },
        results,
    })
}

fn batch_errors(body: &Value) -> String {
    let messages: Vec<String> = body
        .pointer("/errors/data")
        .and_then(Value::as_array)
        .map(|errors| {
            errors
                .iter()
                .filter_map(|e| e.get("message").and_then(Value::as_str))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    if messages.is_empty() {
        "the provider failed the batch".to_owned()
    } else {
        format!("the provider failed the batch: {}", messages.join("; "))
    }
}

/// Adds the lines of an output or error file to `results`.
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
    if let Some(error) = value.get("error").filter(|e| !e.is_null()) {
        let code = error.get("code").and_then(Value::as_str).unwrap_or("");
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("the request failed");
        return LineResult::Failed {
            message: if code.is_empty() {
                message.to_owned()
            } else {
                format!("{code}: {message}")
            },
            transient: matches!(code, "batch_expired" | "batch_cancelled" | "server_error")
                || code.contains("rate_limit"),
        };
    }
    let response = value.get("response").unwrap_or(&Value::Null);
    let status = response
        .get("status_code")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let body = response.get("body").unwrap_or(&Value::Null);
    if status == 200 {
        return match openai::parse_response(body) {
            Ok(parsed) => LineResult::Succeeded(parsed),
            Err(err) => LineResult::Failed {
                message: err.to_string(),
                transient: false,
            },
        };
    }
    let detail = body
        .pointer("/error/message")
        .and_then(Value::as_str)
        .map_or_else(|| body.to_string(), str::to_owned);
    LineResult::Failed {
        message: format!("the provider answered HTTP {status}: {detail}"),
        transient: transient_status(status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::message::{ChatRequest, Message};

    #[test]
    fn input_lines_and_upload_body() {
        let lines = [BatchLine {
            custom_id: "task-0".into(),
            request: ChatRequest {
                model: "gpt-x".into(),
                messages: vec![Message::user("hi")],
                ..ChatRequest::default()
            },
        }];
        let jsonl = input_file(&lines);
        let line: Value = serde_json::from_slice(jsonl.strip_suffix(b"\n").unwrap()).unwrap();
        assert_eq!(
            line,
            json!({"custom_id": "task-0", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}})
        );
        let (content_type, body) = multipart(&jsonl);
        let boundary = content_type.split("boundary=").nth(1).unwrap();
        let text = String::from_utf8(body).unwrap();
        assert!(text.starts_with(&format!("--{boundary}\r\n")));
        assert!(text.contains("name=\"purpose\"\r\n\r\nbatch\r\n"));
        assert!(text.contains("filename=\"summon-batch.jsonl\""));
        assert!(text.ends_with(&format!("--{boundary}--\r\n")));
    }

    #[test]
    fn parses_batch_objects_and_result_lines() {
        let status = parse_status(&json!({
            "id": "batch_1", "status": "expired", "output_file_id": "file-o",
            "error_file_id": "file-e",
            "request_counts": {"total": 5, "completed": 2, "failed": 3}
        }))
        .unwrap();
        assert_eq!(status.state, BatchState::Expired);
        assert_eq!(status.results, ["file-o", "file-e"]);
        assert_eq!(status.counts.failed, 3);
        let failed = parse_status(&json!({"id": "b", "status": "failed",
            "errors": {"data": [{"message": "line 1: bad json"}]}}))
        .unwrap();
        assert!(matches!(failed.state, BatchState::Failed(m) if m.contains("bad json")));

        let mut results = HashMap::new();
        parse_results(
            concat!(
                r#"{"custom_id":"a","response":{"status_code":200,"body":{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}},"error":null}"#,
                "\n",
                r#"{"custom_id":"b","response":null,"error":{"code":"batch_expired","message":"not run in time"}}"#,
                "\n",
                r#"{"custom_id":"c","response":{"status_code":400,"body":{"error":{"message":"nope"}}},"error":null}"#,
                "\nnot json\n"
            ),
            &mut results,
        );
        assert!(
            matches!(&results["a"], LineResult::Succeeded(r) if r.text.as_deref() == Some("hi"))
        );
        assert!(matches!(
            &results["b"],
            LineResult::Failed {
                transient: true,
                ..
            }
        ));
        assert!(
            matches!(&results["c"], LineResult::Failed { transient: false, message } if message.contains("nope"))
        );
    }
}
