//! The providers' batch APIs, in provider-neutral terms: submit many single-turn requests at
//! once, poll the batch, and fetch one result per request, joined back by `custom_id`.
//!
//! ```text
//! submit_batch(lines) --> batch id --> batch_status(id) ... until finished
//!                                  \-> batch_results(status) --> custom_id -> LineResult
//! ```
//!
//! The wire formats live in `batch_openai.rs` (OpenAI Batch: a JSONL file uploaded to
//! `/files`, then `/batches`) and `batch_anthropic.rs` (Anthropic Message Batches). Each call
//! here sends the requests of one step; retrying transient failures is the caller's job, as
//! for [`Client::chat`].

use std::collections::HashMap;

use super::batch_anthropic;
use super::batch_openai;
use super::client::{Client, ProviderKind};
use super::error::ProviderError;
use super::message::{ChatRequest, ChatResponse};

/// One request of a batch.
#[derive(Debug, Clone)]
pub(crate) struct BatchLine {
    /// Unique within the batch; letters, digits, `-` and `_` only (Anthropic's rule).
    pub(crate) custom_id: String,
    pub(crate) request: ChatRequest,
}

/// Where a batch is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BatchState {
    /// Validating, queued, running or finalizing.
    InProgress,
    /// Every request has a result (some may have failed).
    Ended,
    /// The completion window passed: some requests have results, the rest expired.
    Expired,
    /// Cancelled: the requests that ran have results.
    Cancelled,
    /// The provider refused the whole batch (for example an invalid input file).
    Failed(String),
}

/// Request counts, from the batch object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct BatchCounts {
    pub(crate) total: u64,
    pub(crate) succeeded: u64,
    /// Errored, expired and cancelled requests.
    pub(crate) failed: u64,
}

/// What polling a batch tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BatchStatus {
    pub(crate) id: String,
    pub(crate) state: BatchState,
    /// The provider's own word for the state (`in_progress`, `finalizing`, `ended`, ...).
    pub(crate) status_text: String,
    pub(crate) counts: BatchCounts,
    /// Where the results are: OpenAI's output and error file ids, Anthropic's `results_url`.
    pub(crate) results: Vec<String>,
}

impl BatchStatus {
    /// Whether polling can stop.
    pub(crate) fn is_finished(&self) -> bool {
        self.state != BatchState::InProgress
    }
}

/// The result of one request of a batch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LineResult {
    Succeeded(ChatResponse),
    Failed {
        message: String,
        /// Worth sending again: expired, cancelled, rate limited, server error.
        transient: bool,
    },
}

impl Client {
    /// The most requests one batch may hold.
    pub(crate) fn max_batch_lines(&self) -> usize {
        match self.endpoint().kind {
            ProviderKind::OpenAi => batch_openai::MAX_LINES,
            ProviderKind::Anthropic => batch_anthropic::MAX_REQUESTS,
        }
    }

    /// Uploads what a batch of `lines` needs before it can be created: OpenAI's JSONL input
    /// file (its id is returned); nothing for Anthropic, whose batch carries its requests.
    /// Kept apart from [`Client::create_batch`] so that retrying a failed create never uploads
    /// the file again.
    pub(crate) async fn upload_batch_input(
        &self,
        lines: &[BatchLine],
    ) -> Result<Option<String>, ProviderError> {
        match self.endpoint().kind {
            ProviderKind::OpenAi => {
                let jsonl = batch_openai::input_file(lines);
                let (content_type, body) = batch_openai::multipart(&jsonl);
                let upload = self
                    .http()
                    .post(format!("{}{}", self.base_url(), batch_openai::FILES_PATH))
                    .header(reqwest::header::CONTENT_TYPE, content_type)
                    .body(body);
                let file = self.send(upload).await?;
                batch_openai::object_id(&file, "file").map(Some)
            }
            ProviderKind::Anthropic => Ok(None),
        }
    }

    /// Creates a batch of `lines` (OpenAI: from the uploaded `input`) and returns its id.
    pub(crate) async fn create_batch(
        &self,
        lines: &[BatchLine],
        input: Option<&str>,
    ) -> Result<String, ProviderError> {
        match (self.endpoint().kind, input) {
            (ProviderKind::OpenAi, Some(file_id)) => {
                let create = self
                    .http()
                    .post(format!("{}{}", self.base_url(), batch_openai::BATCHES_PATH))
                    .json(&batch_openai::create_body(file_id));
                let batch = self.send(create).await?;
                batch_openai::object_id(&batch, "batch")
            }
            (ProviderKind::OpenAi, None) => Err(ProviderError::Other {
                status: None,
                message: "an OpenAI batch needs its uploaded input file".to_owned(),
            }),
            (ProviderKind::Anthropic, _) => {
                let create = self
                    .http()
                    .post(format!(
                        "{}{}",
                        self.base_url(),
                        batch_anthropic::BATCHES_PATH
                    ))
                    .json(&batch_anthropic::create_body(lines));
                let batch = self.send(create).await?;
                batch_anthropic::batch_id(&batch)
            }
        }
    }

    /// Deletes an input file summon uploaded for a batch that was never created.
    pub(crate) async fn delete_batch_input(&self, file_id: &str) -> Result<(), ProviderError> {
        let url = format!("{}{}/{file_id}", self.base_url(), batch_openai::FILES_PATH);
        self.send(self.http().delete(url)).await.map(|_| ())
    }

    /// Polls a batch.
    pub(crate) async fn batch_status(&self, id: &str) -> Result<BatchStatus, ProviderError> {
        let (path, parse): (&str, fn(&serde_json::Value) -> _) = match self.endpoint().kind {
            ProviderKind::OpenAi => (batch_openai::BATCHES_PATH, batch_openai::parse_status),
            ProviderKind::Anthropic => {
                (batch_anthropic::BATCHES_PATH, batch_anthropic::parse_status)
            }
        };
        let url = format!("{}{path}/{id}", self.base_url());
        let body = self.send(self.http().get(url)).await?;
        parse(&body)
    }

    /// The results of a finished batch, by `custom_id`. A request without a line in the
    /// results is missing from the map.
    pub(crate) async fn batch_results(
        &self,
        status: &BatchStatus,
    ) -> Result<HashMap<String, LineResult>, ProviderError> {
        let mut results = HashMap::new();
        for location in &status.results {
            let (url, parse): (String, ParseResults) = match self.endpoint().kind {
                ProviderKind::OpenAi => (
                    format!(
                        "{}{}/{location}/content",
                        self.base_url(),
                        batch_openai::FILES_PATH
                    ),
                    batch_openai::parse_results,
                ),
                ProviderKind::Anthropic => (location.clone(), batch_anthropic::parse_results),
            };
            // A results URL on another host gets no credentials.
            // It holds many answers: read up to 16 times the bound of one.
            let max = super::client::max_response_bytes().saturating_mul(16);
            let body = self
                .send_bytes_within(self.http_for(&url).get(url), None, max)
                .await?;
            parse(&String::from_utf8_lossy(&body), &mut results);
        }
        Ok(results)
    }
}

/// Adds the lines of a results file to the results by `custom_id`.
type ParseResults = fn(&str, &mut HashMap<String, LineResult>);

/// Whether an HTTP status of a failed request is worth sending again.
pub(super) fn transient_status(status: u64) -> bool {
    status == 408 || status == 429 || status >= 500
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::message::Message;
    use crate::provider::{ProviderEndpoint, Secret};
    use summon_mock_llm::{Api, BatchOutcome, MockConfig, MockServer, Reply};

    fn lines(n: usize) -> Vec<BatchLine> {
        (0..n)
            .map(|i| BatchLine {
                custom_id: format!("task-{i}"),
                request: ChatRequest {
                    model: "mock-model".into(),
                    system: "Be brief.".into(),
                    messages: vec![Message::user(format!("line {i}"))],
                    ..ChatRequest::default()
                },
            })
            .collect()
    }

    fn client(kind: ProviderKind, server: &MockServer) -> Client {
        let url = match kind {
            ProviderKind::OpenAi => server.url_openai(),
            ProviderKind::Anthropic => server.url_anthropic(),
        };
        Client::new(
            ProviderEndpoint::new("mock", kind, url)
                .with_api_key(Secret::new("sk-batch-key"), None),
        )
        .expect("client")
    }

    async fn submit(client: &Client, lines: &[BatchLine]) -> String {
        let input = client.upload_batch_input(lines).await.expect("upload");
        client
            .create_batch(lines, input.as_deref())
            .await
            .expect("create")
    }

    async fn finish(client: &Client, id: &str) -> BatchStatus {
        for _ in 0..100 {
            let status = client.batch_status(id).await.expect("status");
            if status.is_finished() {
                return status;
            }
        }
        panic!("batch {id} never finished");
    }

    #[tokio::test]
    async fn both_apis_round_trip_and_join_by_custom_id() {
        for kind in [ProviderKind::OpenAi, ProviderKind::Anthropic] {
            let server =
                MockServer::start(MockConfig::new().rule(
                    |req| match req.last_user_text().as_deref() {
                        Some("line 1") => Reply::status(
                            400,
                            r#"{"error":{"message":"bad line","type":"invalid_request_error"}}"#,
                        ),
                        Some("line 2") => Reply::status(500, r#"{"error":{"message":"boom"}}"#),
                        _ => Reply::Echo,
                    },
                ))
                .await;
            let client = client(kind, &server);
            let id = submit(&client, &lines(4)).await;
            let status = finish(&client, &id).await;
            assert_eq!(status.state, BatchState::Ended, "{kind:?}");
            assert_eq!(
                status.counts,
                BatchCounts {
                    total: 4,
                    succeeded: 2,
                    failed: 2
                },
                "{kind:?}"
            );
            let results = client.batch_results(&status).await.expect("results");
            assert_eq!(results.len(), 4, "{kind:?}");
            for i in [0, 3] {
                let LineResult::Succeeded(response) = &results[&format!("task-{i}")] else {
                    panic!("{kind:?} task-{i}: {:?}", results[&format!("task-{i}")]);
                };
                assert_eq!(
                    response.text.as_deref(),
                    Some(format!("echo: line {i}").as_str())
                );
                assert!(response.usage.input_tokens > 0);
            }
            assert!(matches!(
                &results["task-1"],
                LineResult::Failed { message, transient: false } if message.contains("bad line")
            ));
            assert!(matches!(
                &results["task-2"],
                LineResult::Failed {
                    transient: true,
                    ..
                }
            ));
            let batch_calls = server
                .requests()
                .into_iter()
                .filter(|r| r.api == Api::Batch)
                .count();
            assert!(batch_calls >= 3, "{kind:?}");
            let lines = &server.batches()[0].lines;
            assert_eq!(lines.len(), 4);
            assert!(lines.iter().all(|l| l.get("tools").is_none()));
        }
    }

    #[tokio::test]
    async fn an_expired_batch_reports_the_unfinished_lines_as_transient() {
        for kind in [ProviderKind::OpenAi, ProviderKind::Anthropic] {
            let server = MockServer::start(
                MockConfig::new().batch_outcomes([BatchOutcome::Expire { processed: 2 }]),
            )
            .await;
            let client = client(kind, &server);
            let id = submit(&client, &lines(5)).await;
            let status = finish(&client, &id).await;
            let results = client.batch_results(&status).await.expect("results");
            let ok = results
                .values()
                .filter(|r| matches!(r, LineResult::Succeeded(_)))
                .count();
            let expired = results
                .values()
                .filter(|r| matches!(r, LineResult::Failed { transient: true, message } if message.contains("expired")))
                .count();
            assert_eq!((ok, expired), (2, 3), "{kind:?}: {results:?}");
            assert_eq!(status.counts.failed, 3, "{kind:?}");
        }
    }
}
