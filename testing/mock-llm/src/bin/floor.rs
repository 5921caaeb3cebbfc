//! `summon-load-floor`: the leanest client for `summon-mock-llm`, to measure the physical floor
//! of a benchmark.
//!
//! `benches/fanout.py` quotes summon's wall time against the ideal `ceil(N/C) x L`, which a
//! machine whose CPU the mock server shares with the client may not reach. This binary sends
//! the same N chat requests at the same concurrency C to the same mock, with as little work as
//! an HTTP client can do: one current-thread runtime, C keep-alive HTTP/1.1 connections written
//! by hand on `TcpStream`, and C workers pulling request numbers from a shared counter. Its wall
//! time is the floor that summon can be quoted against besides the ideal.
//!
//! Each request is `POST /v1/chat/completions` with a system message padded so that the body
//! is about `--body-bytes` and the user message `classify row number {i}`. `benches/fanout.py`
//! passes the mean body of summon's requests in the same case, which the lean mock prints when
//! it stops. A response counts as an error unless it is a 200
//! with a JSON body holding `choices`. Prints `{"requests":N,"errors":E,"wall_s":S}` on stdout
//! and exits non-zero if any request failed.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use serde::Deserialize;
use serde::de::IgnoredAny;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const USAGE: &str =
    "usage: summon-load-floor --addr HOST:PORT --requests N --concurrency C [--body-bytes B]";

/// About what summon sends per task in `benches/fanout.py` (a task without tools: its system
/// prompt, the user message, `max_tokens` and `prompt_cache_key`).
const DEFAULT_BODY_BYTES: usize = 340;

/// The part of a chat completion the check needs: `choices` must be there.
#[derive(Deserialize)]
struct Completion {
    #[serde(rename = "choices")]
    _choices: IgnoredAny,
}

fn parse_args() -> Result<(String, u64, u64, usize), String> {
    let (mut addr, mut requests, mut concurrency, mut body) =
        (None, None, None, DEFAULT_BODY_BYTES);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag}: not a number: {value}"))
        };
        match flag.as_str() {
            "--addr" => addr = Some(value.clone()),
            "--requests" => requests = Some(number()?),
            "--concurrency" => concurrency = Some(number()?.max(1)),
            "--body-bytes" => body = number()? as usize,
            other => return Err(format!("unknown argument: {other}")),
        }
    }
    match (addr, requests, concurrency) {
        (Some(a), Some(n), Some(c)) => Ok((a, n, c, body)),
        _ => Err("--addr, --requests and --concurrency are required".into()),
    }
}

/// One request, cut around its row number: `head` ends at `Content-Length: `, and the body
/// is `body_start`, the row number, then `BODY_END`; `fixed` is the body's length without it.
struct Template {
    head: String,
    body_start: String,
    fixed: usize,
}

const BODY_END: &str = r#""}]}"#;

impl Template {
    /// Pads the system message so that the body is `body_bytes` for a 5-digit row number.
    fn new(addr: &str, body_bytes: usize) -> Template {
        let open = r#"{"model":"bench","messages":[{"role":"system","content":""#;
        let user = r#""},{"role":"user","content":"classify row number "#;
        let pad = body_bytes.saturating_sub(open.len() + user.len() + BODY_END.len() + 5);
        let body_start = format!("{open}{}{user}", "x".repeat(pad));
        Template {
            head: format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\n\
                 Content-Type: application/json\r\nAuthorization: Bearer sk-bench\r\n\
                 Content-Length: "
            ),
            fixed: body_start.len() + BODY_END.len(),
            body_start,
        }
    }

    fn write(&self, i: u64, out: &mut Vec<u8>) {
        let row = i.to_string();
        out.clear();
        out.extend_from_slice(self.head.as_bytes());
        out.extend_from_slice((self.fixed + row.len()).to_string().as_bytes());
        out.extend_from_slice(b"\r\n\r\n");
        out.extend_from_slice(self.body_start.as_bytes());
        out.extend_from_slice(row.as_bytes());
        out.extend_from_slice(BODY_END.as_bytes());
    }
}

/// What the workers share: the address, the request counter, the template and the tally.
struct Shared {
    addr: String,
    n: u64,
    next: AtomicU64,
    answered: AtomicU64,
    reported: AtomicBool,
    template: Template,
}

/// Sends requests on one connection until the counter reaches `n`. A bad answer is counted
/// (the first one is printed) and the connection goes on; a broken connection ends the worker.
async fn worker(shared: Arc<Shared>) -> Result<(), String> {
    let mut stream = TcpStream::connect(&shared.addr)
        .await
        .map_err(|e| format!("connect {}: {e}", shared.addr))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let (mut out, mut buf) = (Vec::new(), Vec::with_capacity(4096));
    loop {
        let i = shared.next.fetch_add(1, Ordering::Relaxed);
        if i >= shared.n {
            return Ok(());
        }
        shared.template.write(i, &mut out);
        stream
            .write_all(&out)
            .await
            .map_err(|e| format!("write: {e}"))?;

        // The head, then exactly Content-Length bytes of body (the mock never sends chunked).
        let head_end = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            read_more(&mut stream, &mut buf).await?;
        };
        let (status, length) = parse_head(&buf[..head_end])?;
        let end = head_end + length;
        while buf.len() < end {
            read_more(&mut stream, &mut buf).await?;
        }
        let body = &buf[head_end..end];
        if status == 200 && serde_json::from_slice::<Completion>(body).is_ok() {
            shared.answered.fetch_add(1, Ordering::Relaxed);
        } else if !shared.reported.swap(true, Ordering::Relaxed) {
            let body = String::from_utf8_lossy(body);
            eprintln!("summon-load-floor: request {i}: status {status}: {body:.300}");
        }
        buf.drain(..end);
    }
}

/// The status and Content-Length of a response head.
fn parse_head(head: &[u8]) -> Result<(u16, usize), String> {
    let head = std::str::from_utf8(head).map_err(|_| "response head is not UTF-8")?;
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok());
    let mut length = None;
    for line in head.split("\r\n").skip(1) {
        let (name, value) = line.split_once(':').unwrap_or((line, ""));
        if name.eq_ignore_ascii_case("content-length") {
            length = value.trim().parse().ok();
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // The mock answers every request with a Content-Length.
            return Err(format!("unsupported Transfer-Encoding:{value}"));
        }
    }
    match (status, length) {
        (Some(status), Some(length)) => Ok((status, length)),
        _ => Err(format!("bad response head: {head:?}")),
    }
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<(), String> {
    buf.reserve(4096);
    match stream.read_buf(buf).await {
        Ok(0) => Err("connection closed by the server".into()),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("read: {e}")),
    }
}

fn main() -> ExitCode {
    let (addr, n, c, body_bytes) = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("summon-load-floor: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("runtime");
    let start = Instant::now();
    let (answered, failures) = runtime.block_on(async {
        let shared = Arc::new(Shared {
            template: Template::new(&addr, body_bytes),
            addr,
            n,
            next: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            reported: AtomicBool::new(false),
        });
        let workers: Vec<_> = (0..c.min(n))
            .map(|_| tokio::spawn(worker(shared.clone())))
            .collect();
        let mut failures = Vec::new();
        for w in workers {
            if let Err(message) = w.await.map_err(|e| e.to_string()).and_then(|r| r) {
                failures.push(message);
            }
        }
        (shared.answered.load(Ordering::Relaxed), failures)
    });
    let wall = start.elapsed().as_secs_f64();
    // Every request not answered well is an error, including those a broken connection lost.
    let errors = n - answered;
    println!(r#"{{"requests":{n},"errors":{errors},"wall_s":{wall:.3}}}"#);
    if let Some(first) = failures.first() {
        eprintln!(
            "summon-load-floor: {} connection(s) failed, first: {first}",
            failures.len()
        );
    }
    if errors > 0 {
        eprintln!("summon-load-floor: {errors} of {n} requests failed");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
