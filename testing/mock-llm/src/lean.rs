//! The lean server (`summon-mock-llm --lean`): OpenAI-compatible chat completions and a model
//! list, for benchmarks whose client shares the machine with the server.
//!
//! A real provider's CPU is not the client's: in a benchmark on one machine, every microsecond
//! the stand-in spends per request is taken from the runner being measured. This server does
//! as little as a server can: one thread, HTTP/1.1 keep-alive read and written by hand, the
//! request's model and last user message read without building its JSON tree, and the same
//! answer (`echo: <last user message>` or a fixed text) with the same usage as the full mock,
//! sent `latency` after the request arrived by the system clock. No recording, rules or
//! faults: the full server ([`crate::MockServer`]) has those. It rations OpenAI's way when
//! given a [`Ledger`] (the `ration` module): a request is then read whole for its cost, and
//! one over a limit is answered 429 at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::{Api, Ledger, Reply, clock::Timer};

/// The largest request head or body read.
const MAX_REQUEST: usize = 64 * 1024 * 1024;

/// Chat requests answered and the bytes of their bodies, shared with the caller.
#[derive(Debug, Default)]
pub struct LeanStats {
    requests: AtomicU64,
    body_bytes: AtomicU64,
}

impl LeanStats {
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// The mean body of the chat requests answered, in bytes (0 before the first).
    pub fn mean_body_bytes(&self) -> u64 {
        self.body_bytes.load(Ordering::Relaxed) / self.requests().max(1)
    }
}

/// Serves `listener` until the future is dropped. `reply` must be [`Reply::Echo`] or
/// [`Reply::Text`].
pub async fn serve_lean(
    listener: TcpListener,
    reply: Reply,
    latency: Duration,
    stats: Arc<LeanStats>,
    ledger: Option<Arc<Ledger>>,
) -> std::io::Result<()> {
    let fixed: Option<Arc<str>> = match reply {
        Reply::Text(text) => Some(text.into()),
        _ => None,
    };
    let timer = if latency.is_zero() {
        None
    } else {
        Some(Arc::new(Timer::start()?))
    };
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            fixed: fixed.clone(),
            latency,
            timer: timer.clone(),
            stats: Arc::clone(&stats),
            ledger: ledger.clone(),
        };
        tokio::spawn(connection.run(stream));
    }
}

struct Connection {
    fixed: Option<Arc<str>>,
    latency: Duration,
    timer: Option<Arc<Timer>>,
    stats: Arc<LeanStats>,
    ledger: Option<Arc<Ledger>>,
}

/// A request read off the connection.
struct Head {
    post_chat: bool,
    /// `GET .../models`: answered at once with a list of one model.
    get_models: bool,
    body_len: usize,
    /// Where the body starts in the buffer.
    body_at: usize,
    close: bool,
}

impl Connection {
    async fn run(self, mut stream: TcpStream) {
        let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
        let mut out: Vec<u8> = Vec::with_capacity(1024);
        loop {
            let head = loop {
                match parse_head(&buf) {
                    Ok(Some(head)) if buf.len() >= head.body_at + head.body_len => break head,
                    // A whole head with part of its (bounded) body, or part of a head.
                    Ok(Some(_)) => {}
                    Ok(None) if buf.len() < MAX_REQUEST => {}
                    _ => {
                        let _ = stream.write_all(&status(400, "bad request", true)).await;
                        return;
                    }
                }
                if buf.capacity() - buf.len() < 4096 {
                    buf.reserve(buf.len().max(4096));
                }
                match stream.read_buf(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            };
            let arrived = Instant::now();
            let end = head.body_at + head.body_len;
            out.clear();
            if head.post_chat {
                let admitted = self.answer(&buf[head.body_at..end], arrived, &mut out);
                if let (true, Some(timer)) = (admitted, &self.timer) {
                    timer.sleep_until(arrived + self.latency).await;
                }
            } else if head.get_models {
                out.extend_from_slice(MODELS);
            } else {
                out.extend_from_slice(&status(404, "only POST /v1/chat/completions", false));
            }
            buf.drain(..end);
            if stream.write_all(&out).await.is_err() || head.close {
                return;
            }
        }
    }

    /// Writes the whole HTTP answer to a chat request into `out`; false when it is a 429,
    /// sent at once.
    fn answer(&self, body: &[u8], arrived: Instant, out: &mut Vec<u8>) -> bool {
        self.stats
            .body_bytes
            .fetch_add(body.len() as u64, Ordering::Relaxed);
        let id = self.stats.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let request = match &self.ledger {
            Some(_) => serde_json::from_slice(body).unwrap_or(serde_json::Value::Null),
            None => crate::essentials(body),
        };
        let model = request["model"].as_str().unwrap_or("mock-model");
        let verdict = self.ledger.as_ref().and_then(|ledger| {
            ledger.admit_openai(arrived, model, crate::ration::openai_cost(&request))
        });
        let mut headers = String::new();
        for (name, value) in verdict.iter().flat_map(|v| &v.headers) {
            headers.push_str(name);
            headers.push_str(": ");
            headers.push_str(value);
            headers.push_str("\r\n");
        }
        if let Some(refusal) = verdict.as_ref().and_then(|v| v.refusal.as_ref()) {
            let json = refusal.body.to_string();
            out.extend_from_slice(
                format!(
                    "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{headers}\r\n",
                    json.len()
                )
                .as_bytes(),
            );
            out.extend_from_slice(json.as_bytes());
            return false;
        }
        let text = match &self.fixed {
            Some(text) => text.to_string(),
            None => format!(
                "echo: {}",
                crate::last_user_text(&request).unwrap_or_default()
            ),
        };
        let input_tokens = (body.len() as u64 / 4).max(1);
        let json = crate::success_body(
            Api::OpenAi,
            id,
            model,
            &crate::Answer::text(&text),
            input_tokens,
        );
        let json = json.to_string();
        out.extend_from_slice(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{headers}\r\n",
                json.len()
            )
            .as_bytes(),
        );
        out.extend_from_slice(json.as_bytes());
        true
    }
}

/// An answer with an error status and a JSON error body.
fn status(code: u16, message: &str, close: bool) -> Vec<u8> {
    let body = serde_json::json!({"error": {"message": message, "type": "mock_error"}}).to_string();
    let reason = if code == 404 {
        "Not Found"
    } else {
        "Bad Request"
    };
    let connection = if close { "connection: close\r\n" } else { "" };
    format!(
        "HTTP/1.1 {code} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{connection}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The answer to `GET /v1/models` (not counted among the requests answered).
const MODELS: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 63\r\n\r\n{\"object\":\"list\",\"data\":[{\"id\":\"mock-model\",\"object\":\"model\"}]}";

/// Parses the request line and headers at the start of `buf`: `Ok(None)` until they are all
/// there, `Err` when they are not HTTP/1.1 this server can answer.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, ()> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let text = std::str::from_utf8(&buf[..end]).map_err(|_| ())?;
    let mut lines = text.split("\r\n");
    let mut request_line = lines.next().ok_or(())?.split(' ');
    let (method, path) = (
        request_line.next().ok_or(())?,
        request_line.next().ok_or(())?,
    );
    let mut body_len = 0;
    let mut close = false;
    for line in lines {
        let (name, value) = line.split_once(':').ok_or(())?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            body_len = value.parse().map_err(|_| ())?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // Chunked bodies are not read here.
            return Err(());
        } else if name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close");
        }
    }
    if body_len > MAX_REQUEST {
        return Err(());
    }
    let path = path.split('?').next().unwrap_or(path);
    Ok(Some(Head {
        post_chat: method == "POST" && path.ends_with("/chat/completions"),
        get_models: method == "GET" && path.ends_with("/models"),
        body_len,
        body_at: end + 4,
        close,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads one response with a `content-length` off `stream`: its status line and body.
    async fn response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> (String, serde_json::Value) {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8(buf[..end].to_vec()).unwrap();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .unwrap()
                    .parse()
                    .unwrap();
                if buf.len() >= end + 4 + len {
                    let body = serde_json::from_slice(&buf[end + 4..end + 4 + len]).unwrap();
                    buf.drain(..end + 4 + len);
                    return (head.lines().next().unwrap().to_owned(), body);
                }
            }
            assert!(stream.read_buf(buf).await.unwrap() > 0, "connection closed");
        }
    }

    #[tokio::test]
    async fn answers_chat_requests_on_one_connection_after_the_latency() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(LeanStats::default());
        let latency = Duration::from_millis(20);
        tokio::spawn(serve_lean(
            listener,
            Reply::Echo,
            latency,
            Arc::clone(&stats),
            None,
        ));
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut buf = Vec::new();
        let mut sent_bytes = 0;
        for text in ["first", "second!"] {
            let body = format!(
                r#"{{"model":"m","messages":[{{"role":"system","content":"s"}},{{"role":"user","content":"{text}"}}]}}"#
            );
            let request = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            sent_bytes += body.len() as u64;
            let sent = Instant::now();
            // Written in two parts, as a client may.
            let (a, b) = request.as_bytes().split_at(40);
            stream.write_all(a).await.unwrap();
            stream.write_all(b).await.unwrap();
            let (status, json) = response(&mut stream, &mut buf).await;
            assert!(sent.elapsed() >= latency);
            assert_eq!(status, "HTTP/1.1 200 OK");
            assert_eq!(
                json["choices"][0]["message"]["content"],
                format!("echo: {text}")
            );
            assert_eq!(json["model"], "m");
            assert_eq!(json["usage"]["prompt_tokens"], body.len() as u64 / 4);
        }
        stream
            .write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let (status, json) = response(&mut stream, &mut buf).await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert_eq!(json["data"][0]["id"], "mock-model");
        stream
            .write_all(b"GET /v1/other HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let (status, _) = response(&mut stream, &mut buf).await;
        assert_eq!(status, "HTTP/1.1 404 Not Found");
        assert_eq!(stats.requests(), 2);
        // The model list is not a chat request: the mean is of the two bodies.
        assert_eq!(stats.mean_body_bytes(), sent_bytes / 2);
    }

    #[tokio::test]
    async fn rations_as_openai_does_when_given_a_ledger() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let ledger = Arc::new(Ledger::new(&[crate::Ration::openai(1, 1000)]));
        tokio::spawn(serve_lean(
            listener,
            Reply::Echo,
            Duration::ZERO,
            Arc::new(LeanStats::default()),
            Some(Arc::clone(&ledger)),
        ));
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut buf = Vec::new();
        let body = r#"{"model":"m","max_tokens":40,"messages":[{"role":"user","content":"hi"}]}"#;
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let (status, json) = response(&mut stream, &mut buf).await;
        assert_eq!(status, "HTTP/1.1 200 OK", "{json}");
        stream.write_all(request.as_bytes()).await.unwrap();
        let (status, json) = response(&mut stream, &mut buf).await;
        assert_eq!(status, "HTTP/1.1 429 Too Many Requests");
        assert_eq!(json["error"]["type"], "requests");
        let stats = ledger.stats();
        assert_eq!((stats.admitted, stats.limited, stats.tokens), (1, 1, 40));
    }

    #[test]
    fn a_head_is_read_once_complete() {
        let request =
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
        assert!(parse_head(&request[..30]).unwrap().is_none());
        let head = parse_head(request).unwrap().unwrap();
        assert!(head.post_chat && !head.close);
        assert_eq!((head.body_at, head.body_len), (request.len() - 2, 2));
        let other = parse_head(b"GET /v1/models HTTP/1.1\r\nconnection: Close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!other.post_chat && other.get_models && other.close);
        assert!(parse_head(b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n").is_err());
        assert!(parse_head(b"POST / HTTP/1.1\r\ncontent-length: x\r\n\r\n").is_err());
    }
}
