//! The HTTP client of a streamable HTTP server, watched: a refused connection, an error page
//! or an answer cut off reaches the call in flight at once (through [`Observed`]) and in
//! words a user reads — the URL and what happened, an HTML page by its title — rather than
//! after the whole timeout, in the transport's type names.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::common::client_side_sse::BoxedSseResponse;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use serde_json::Value;

use super::observed::Observed;

type Error = StreamableHttpError<reqwest::Error>;

/// reqwest's client, reporting what goes wrong with the messages it posts.
#[derive(Clone)]
pub(crate) struct WatchedClient {
    inner: reqwest::Client,
    observed: Arc<Observed>,
}

impl WatchedClient {
    pub(crate) fn new(inner: reqwest::Client, observed: Arc<Observed>) -> Self {
        Self { inner, observed }
    }
}

impl StreamableHttpClient for WatchedClient {
    type Error = reqwest::Error;

    fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<StreamableHttpPostResponse, Error>> + Send + '_ {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
    }

    fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> impl Future<Output = Result<StreamableHttpPostResponse, Error>> + Send + '_ {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let posted = if is_tools_list(&message) {
            self.list_tools(&uri, &message, session_id, auth_header, custom_headers)
                .await
        } else {
            self.inner
                .post_message_with_response_limits(
                    Arc::clone(&uri),
                    message,
                    session_id,
                    auth_header,
                    custom_headers,
                    limits,
                )
                .await
        };
        match posted {
            Err(e) => {
                if let Some(problem) = problem(&uri, &e) {
                    self.observed.raise(problem);
                }
                Err(e)
            }
            Ok(StreamableHttpPostResponse::Sse(stream, session)) => Ok(
                StreamableHttpPostResponse::Sse(self.watch(stream, uri), session),
            ),
            Ok(other) => Ok(other),
        }
    }

    fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<(), Error>> + Send + '_ {
        self.inner
            .delete_session(uri, session_id, auth_header, custom_headers)
    }

    fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<BoxedSseResponse, Error>> + Send + '_ {
        self.inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
    }
}

impl WatchedClient {
    /// Posts a `tools/list` request and reads its answer here rather than in the library,
    /// whose types leave out a tool's `execution`: the tools that only run as tasks are noted
    /// from the raw answer, a JSON body or the event of an event stream that carries it
    /// (returned as a JSON answer; other events of that stream are not needed).
    async fn list_tools(
        &self,
        uri: &str,
        message: &ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Error> {
        use reqwest::header::{ACCEPT, CONTENT_TYPE};
        let id = serde_json::to_value(message)?
            .get("id")
            .cloned()
            .unwrap_or(Value::Null);
        let mut request = self
            .inner
            .post(uri)
            .header(ACCEPT, "application/json, text/event-stream")
            .header(CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(message)?);
        if let Some(token) = auth_header {
            request = request.bearer_auth(token);
        }
        for (name, value) in custom_headers {
            request = request.header(name, value);
        }
        let session_was_attached = session_id.is_some();
        if let Some(session) = session_id {
            request = request.header(SESSION_HEADER, session.as_ref());
        }
        let mut response = request.send().await.map_err(Error::Client)?;
        let status = response.status();
        let session = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let kind = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.to_ascii_lowercase());
        let is = |wanted: &str| {
            kind.as_deref()
                .is_some_and(|k| k.split(';').next().is_some_and(|k| k.trim() == wanted))
        };
        if !status.is_success() {
            if status == reqwest::StatusCode::NOT_FOUND && session_was_attached {
                return Err(Error::SessionExpired);
            }
            let body = read_body(&mut response, ERROR_BODY_LIMIT).await?;
            if is("application/json")
                && let Ok(error @ rmcp::model::JsonRpcMessage::Error(_)) =
                    serde_json::from_slice(&body)
            {
                return Ok(StreamableHttpPostResponse::Json(error, session));
            }
            return Err(Error::UnexpectedServerResponse(
                format!("HTTP {status}: {}", String::from_utf8_lossy(&body)).into(),
            ));
        }
        let answer: Value = if is("application/json") {
            let body = read_body(&mut response, super::stdio::MAX_MESSAGE).await?;
            serde_json::from_slice(&body)?
        } else if is("text/event-stream") {
            answer_in_stream(&mut response, &id).await?
        } else {
            return Err(Error::UnexpectedContentType(kind));
        };
        self.observed.note_task_only_tools(&answer);
        Ok(StreamableHttpPostResponse::Json(
            serde_json::from_value(answer)?,
            session,
        ))
    }

    /// Passes the events of an answer's stream on, and reports a stream that breaks or ends
    /// before the answer came. (A stream whose events have ids can be resumed: the library
    /// reconnects, so its end is no failure.)
    fn watch(&self, stream: BoxedSseResponse, uri: Arc<str>) -> BoxedSseResponse {
        let answered = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&answered);
        let observed = Arc::clone(&self.observed);
        let closed = format!("the connection to {uri} closed before the answer came");
        let on_error = closed.clone();
        let events = stream.inspect(move |item| match item {
            Ok(event) => {
                if event.id.is_some() || event.data.as_deref().is_some_and(is_answer) {
                    seen.store(true, Ordering::SeqCst);
                }
            }
            Err(_) => observed.raise(on_error.clone()),
        });
        let observed = Arc::clone(&self.observed);
        let end = futures::stream::once(async move {
            if !answered.load(Ordering::SeqCst) {
                observed.raise(closed);
            }
        })
        .filter_map(|()| futures::future::ready(None));
        events.chain(end).boxed()
    }
}

/// The header of a streamable HTTP session.
const SESSION_HEADER: &str = "Mcp-Session-Id";
/// The most of an error page read.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

fn is_tools_list(message: &ClientJsonRpcMessage) -> bool {
    matches!(
        message,
        ClientJsonRpcMessage::Request(request)
            if matches!(request.request, rmcp::model::ClientRequest::ListToolsRequest(_))
    )
}

/// Up to `limit` bytes of a response's body; a longer JSON answer is an error.
async fn read_body(response: &mut reqwest::Response, limit: usize) -> Result<Vec<u8>, Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(Error::Client)? {
        let room = limit - body.len();
        if chunk.len() > room {
            if limit == ERROR_BODY_LIMIT {
                body.extend_from_slice(&chunk[..room]);
                break;
            }
            return Err(Error::ResponseBodyTooLarge { max_size: limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Reads an event stream until the event whose data answers the request `id`.
async fn answer_in_stream(response: &mut reqwest::Response, id: &Value) -> Result<Value, Error> {
    let mut line = Vec::new();
    let mut data = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(Error::Client)? {
        for byte in chunk {
            if byte != b'\n' {
                line.push(byte);
                if line.len() > super::stdio::MAX_MESSAGE {
                    return Err(Error::ResponseBodyTooLarge {
                        max_size: super::stdio::MAX_MESSAGE,
                    });
                }
                continue;
            }
            let text = line.strip_suffix(b"\r").unwrap_or(&line);
            if text.is_empty() {
                // The end of an event.
                if let Ok(message) = serde_json::from_slice::<Value>(&data)
                    && message.get("id") == Some(id)
                    && (message.get("result").is_some() || message.get("error").is_some())
                {
                    return Ok(message);
                }
                data.clear();
            } else if let Some(value) = text.strip_prefix(b"data:") {
                if !data.is_empty() {
                    data.push(b'\n');
                }
                data.extend_from_slice(value.strip_prefix(b" ").unwrap_or(value));
                if data.len() > super::stdio::MAX_MESSAGE {
                    return Err(Error::ResponseBodyTooLarge {
                        max_size: super::stdio::MAX_MESSAGE,
                    });
                }
            }
            line.clear();
        }
    }
    // A last event the stream ended without closing.
    match serde_json::from_slice::<Value>(&data) {
        Ok(message) if message.get("id") == Some(id) => Ok(message),
        _ => Err(Error::UnexpectedEndOfStream),
    }
}

/// Whether an event's data is a JSON-RPC answer (a result or an error for a request).
fn is_answer(data: &str) -> bool {
    serde_json::from_str::<Value>(data).is_ok_and(|message| {
        message.get("id").is_some_and(|id| !id.is_null())
            && (message.get("result").is_some() || message.get("error").is_some())
    })
}

/// What went wrong with a POST, in words naming the URL; `None` for what the library recovers
/// from by itself (an expired session, authorization).
fn problem(uri: &str, error: &Error) -> Option<String> {
    match error {
        StreamableHttpError::Client(e) => Some(client_problem(uri, e)),
        StreamableHttpError::Io(_)
        | StreamableHttpError::Sse(_)
        | StreamableHttpError::UnexpectedEndOfStream => Some(format!(
            "the connection to {uri} closed before the answer came"
        )),
        StreamableHttpError::HttpStatus(status) => {
            Some(format!("HTTP {} from {uri}", status.status))
        }
        StreamableHttpError::UnexpectedServerResponse(text) => Some(response_problem(uri, text)),
        StreamableHttpError::UnexpectedContentType(kind) => Some(format!(
            "{uri} answered with content of type {}, not MCP",
            kind.as_deref().unwrap_or("(none)")
        )),
        _ => None,
    }
}

fn client_problem(uri: &str, error: &reqwest::Error) -> String {
    let io = std::iter::successors(Some(error as &(dyn std::error::Error + 'static)), |e| {
        e.source()
    })
    .find_map(|e| e.downcast_ref::<std::io::Error>());
    if error.is_connect() {
        return match io.map(std::io::Error::kind) {
            Some(std::io::ErrorKind::ConnectionRefused) => format!("connection refused to {uri}"),
            _ => format!("cannot connect to {uri}: {}", innermost(error)),
        };
    }
    if error.is_timeout() {
        return format!("{uri} did not answer in time");
    }
    format!("the connection to {uri} closed before the answer came")
}

/// The last error of a chain: the one that says what happened.
fn innermost(error: &(dyn std::error::Error + 'static)) -> String {
    let mut last = error;
    while let Some(source) = last.source() {
        last = source;
    }
    last.to_string()
}

/// `HTTP 404 Not Found: <html>...` as `HTTP 404 from URI: <the page's title>`.
fn response_problem(uri: &str, text: &str) -> String {
    let Some(rest) = text.strip_prefix("HTTP ") else {
        return format!("{uri} answered: {}", excerpt(text));
    };
    let (status, body) = rest.split_once(": ").unwrap_or((rest, ""));
    let code = status.split_whitespace().next().unwrap_or(status);
    let what = title(body).unwrap_or_else(|| excerpt(body));
    if what.is_empty() {
        format!("HTTP {status} from {uri}")
    } else {
        format!("HTTP {code} from {uri}: {what}")
    }
}

/// An HTML page's `<title>`, its whitespace collapsed.
fn title(body: &str) -> Option<String> {
    let lower = body.to_ascii_lowercase();
    let start = lower.find("<title")?;
    let open_end = start + lower[start..].find('>')? + 1;
    let close = open_end + lower[open_end..].find("</title")?;
    let text = body[open_end..close]
        .replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'");
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    (!text.is_empty()).then_some(text)
}

/// The first line of a body, at most 200 bytes.
fn excerpt(body: &str) -> String {
    let mut line = body.trim().lines().next().unwrap_or("").to_owned();
    crate::text::truncate_at_boundary(&mut line, 200);
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_pages_are_summarised() {
        let uri = "http://h/mcp";
        assert_eq!(
            response_problem(
                uri,
                "HTTP 404 Not Found: <html><head><TITLE>\n  Gone &amp; away </TITLE></head>"
            ),
            "HTTP 404 from http://h/mcp: Gone & away"
        );
        assert_eq!(
            response_problem(uri, "HTTP 502 Bad Gateway: upstream down\nmore"),
            "HTTP 502 from http://h/mcp: upstream down"
        );
        assert_eq!(
            response_problem(uri, "HTTP 500 Internal Server Error: "),
            "HTTP 500 Internal Server Error from http://h/mcp"
        );
        assert!(is_answer(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#));
        assert!(!is_answer(
            r#"{"jsonrpc":"2.0","method":"notifications/progress"}"#
        ));
    }
}
