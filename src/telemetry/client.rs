//! The OTLP exporter's HTTP client: summon's own reqwest (rustls on ring), so traces bring
//! no second HTTP stack.

use bytes::Bytes;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};

/// Sends the exporter's requests with reqwest, on the export thread's runtime.
#[derive(Debug, Clone)]
pub(super) struct ReqwestClient(pub(super) reqwest::Client);

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
            .await?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await?;
        let mut answer = Response::builder().status(status).body(body)?;
        *answer.headers_mut() = headers;
        Ok(answer)
    }
}
