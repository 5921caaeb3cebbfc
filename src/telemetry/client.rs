//! The OTLP exporter's HTTP client: summon's own reqwest (rustls on ring), so traces bring
//! no second HTTP stack.

use bytes::Bytes;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};

/// Sends the exporter's requests with reqwest, on the export thread's runtime; why the last
/// request could not be sent, in words, goes to the shared slot (the exporter's own error
/// text is a debug dump).
#[derive(Debug, Clone)]
pub(super) struct ReqwestClient(
    pub(super) reqwest::Client,
    pub(super) std::sync::Arc<std::sync::Mutex<Option<String>>>,
);

#[async_trait::async_trait]
impl HttpClient for ReqwestClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let response = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body)
            .send()
            .await
            .map_err(|err| {
                let why = format!("cannot reach the collector: {}", innermost(&err));
                if let Ok(mut slot) = self.1.lock() {
                    *slot = Some(why.clone());
                }
                std::io::Error::other(why)
            })?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await?;
        let mut answer = Response::builder().status(status).body(body)?;
        *answer.headers_mut() = headers;
        Ok(answer)
    }
}

/// The deepest cause of `err` (`Connection refused (os error 111)`, `operation timed out`),
/// which is what a person reading the warning needs.
fn innermost(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = err;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}
