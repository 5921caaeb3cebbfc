//! `summon mcp` over HTTP answers its owner only: the bearer token made at start, the
//! UNIX socket only the user can open, the cap on live sessions and the quick end of one
//! that calls no tool. Driven with plain HTTP/1.1 over a socket, every byte as sent.

use crate::support;

use std::io::{BufRead as _, BufReader, Read as _};
use std::os::unix::fs::PermissionsExt as _;
use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use support::Test;

/// One HTTP answer: status, the session id header, and the JSON-RPC messages of its body.
#[derive(Debug)]
struct Answer {
    status: u16,
    session: Option<String>,
    messages: Vec<Value>,
    body: String,
}

/// A keep-alive HTTP/1.1 connection.
struct Connection<S> {
    reader: BufReader<S>,
}

impl<S: std::io::Read + std::io::Write> Connection<S> {
    fn post(&mut self, token: Option<&str>, session: Option<&str>, body: &Value) -> Answer {
        self.post_raw(token, session, &body.to_string())
    }

    /// [`Connection::post`] of a body as it is written.
    fn post_raw(&mut self, token: Option<&str>, session: Option<&str>, body: &str) -> Answer {
        let mut head = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
            body.len()
        );
        if let Some(token) = token {
            head.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        if let Some(session) = session {
            head.push_str(&format!(
                "Mcp-Session-Id: {session}\r\nMcp-Protocol-Version: 2025-06-18\r\n"
            ));
        }
        head.push_str("\r\n");
        head.push_str(body);
        // One write: a request split in two waits for the peer's delayed ACK.
        let stream = self.reader.get_mut();
        stream.write_all(head.as_bytes()).unwrap();
        stream.flush().unwrap();
        self.answer()
    }

    fn answer(&mut self) -> Answer {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .unwrap_or_else(|| panic!("no status line: {line:?}"))
            .parse()
            .unwrap();
        let (mut length, mut chunked, mut session) = (None, false, None);
        loop {
            line.clear();
            self.reader.read_line(&mut line).unwrap();
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap();
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = Some(value.parse::<usize>().unwrap()),
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                "mcp-session-id" => session = Some(value.to_owned()),
                _ => {}
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                line.clear();
                self.reader.read_line(&mut line).unwrap();
                let size = usize::from_str_radix(line.trim(), 16).unwrap();
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk).unwrap();
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        } else if let Some(length) = length {
            body.resize(length, 0);
            self.reader.read_exact(&mut body).unwrap();
        }
        let body = String::from_utf8_lossy(&body).into_owned();
        let messages = body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str(data.trim()).ok())
            .chain(serde_json::from_str::<Value>(&body).ok())
            .collect();
        Answer {
            status,
            session,
            messages,
            body,
        }
    }
}

fn tcp(addr: &str) -> Connection<std::net::TcpStream> {
    let stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_nodelay(true).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    Connection {
        reader: BufReader::new(stream),
    }
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}})
}

fn call_load() -> Value {
    json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "load", "arguments": {}}})
}

fn list_tools() -> Value {
    json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {}})
}

/// A server started with `args`; its stderr lines until it said where it listens.
struct Served {
    child: Child,
    lines: Vec<String>,
}

impl Served {
    fn start(test: &Test, args: &[&str], until: &str) -> Self {
        let mut command = test.command();
        command
            .arg("mcp")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            assert!(
                stderr.read_line(&mut line).unwrap() > 0,
                "summon mcp ended: {lines:?}"
            );
            lines.push(line.trim_end().to_owned());
            if line.contains(until) {
                break;
            }
        }
        Self { child, lines }
    }

    /// The address of `http://ADDR/mcp`.
    fn addr(&self) -> String {
        let line = &self.lines[self.lines.len() - 2];
        line.strip_prefix("summon: serving MCP at http://")
            .and_then(|rest| rest.strip_suffix("/mcp"))
            .unwrap_or_else(|| panic!("{:?}", self.lines))
            .to_owned()
    }

    /// The token file's path.
    fn token_file(&self) -> std::path::PathBuf {
        let line = self.lines.last().unwrap();
        line.rsplit_once(" the token in ")
            .unwrap_or_else(|| panic!("{line}"))
            .1
            .into()
    }

    fn rss_kb(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn http_answers_only_the_bearer_of_the_token_it_made() {
    let test = Test::new();
    let mut served = Served::start(
        &test,
        &["--http", "127.0.0.1:0", "--max-sessions", "2"],
        "Authorization: Bearer",
    );
    let path = served.token_file();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", path.display());
    let token = std::fs::read_to_string(&path).unwrap().trim().to_owned();
    assert_eq!(token.len(), 64, "{token}");
    let addr = served.addr();
    let mut http = tcp(&addr);
    // Without the token, or with another, nothing reaches a session (each refusal closes
    // its connection).
    for wrong in [None, Some("0".repeat(64).as_str()), Some(&token[1..])] {
        let answer = tcp(&addr).post(wrong, None, &initialize());
        assert_eq!(answer.status, 401, "{wrong:?}: {answer:?}");
        assert!(answer.session.is_none());
        assert!(answer.body.contains("answers its owner only"), "{answer:?}");
    }
    // With it, a session; one that calls a tool counts as in use.
    let first = http.post(Some(&token), None, &initialize());
    assert_eq!(first.status, 200, "{first:?}");
    let a = first.session.unwrap();
    let loaded = http.post(Some(&token), Some(&a), &call_load());
    assert_eq!(loaded.status, 200, "{loaded:?}");
    assert!(loaded.body.contains("No sources found"), "{loaded:?}");
    // A session that called no tool gives its place to a new one past the cap.
    let b = http
        .post(Some(&token), None, &initialize())
        .session
        .unwrap();
    let c = http
        .post(Some(&token), None, &initialize())
        .session
        .unwrap();
    assert_eq!(
        tcp(&addr)
            .post(Some(&token), Some(&b), &list_tools())
            .status,
        404
    );
    assert_eq!(http.post(Some(&token), Some(&a), &list_tools()).status, 200);
    assert_eq!(http.post(Some(&token), Some(&c), &call_load()).status, 200);
    // Both live sessions in use: a third is refused.
    let refused = tcp(&addr).post(Some(&token), None, &initialize());
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(refused.body.contains("--max-sessions"), "{refused:?}");
    // The token file goes with the server.
    let status = std::process::Command::new("kill")
        .args(["-TERM", &served.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let ended = served.child.wait().unwrap();
    assert_eq!(ended.code(), Some(143), "{ended}");
    assert!(!path.exists(), "{} is left", path.display());
}

#[test]
fn a_session_that_calls_no_tool_ends_quickly_and_one_that_did_lives_on() {
    let test = Test::new();
    let served = Served::start(
        &test,
        &["--http", "127.0.0.1:0", "--idle-session-secs", "1"],
        "Authorization: Bearer",
    );
    let token = std::fs::read_to_string(served.token_file()).unwrap();
    let token = token.trim();
    let mut http = tcp(&served.addr());
    let used = http.post(Some(token), None, &initialize()).session.unwrap();
    assert_eq!(
        http.post(Some(token), Some(&used), &call_load()).status,
        200
    );
    let idle = http.post(Some(token), None, &initialize()).session.unwrap();
    assert_eq!(
        http.post(Some(token), Some(&idle), &list_tools()).status,
        200
    );
    let addr = served.addr();
    support::wait_for(Duration::from_secs(30), "the idle session to end", || {
        tcp(&addr)
            .post(Some(token), Some(&idle), &list_tools())
            .status
            == 404
    });
    assert_eq!(
        http.post(Some(token), Some(&used), &list_tools()).status,
        200
    );
}

/// 20,000 `initialize` calls (no tool called) leave the server about as large as it was:
/// live sessions are capped and each idle one gives its place to the next.
#[test]
fn twenty_thousand_initializations_do_not_grow_the_server() {
    let test = Test::new();
    let served = Served::start(&test, &["--http", "127.0.0.1:0"], "Authorization: Bearer");
    let token = std::fs::read_to_string(served.token_file()).unwrap();
    let token = token.trim();
    let mut http = tcp(&served.addr());
    let mut start = |n: usize| {
        for _ in 0..n {
            let answer = http.post(Some(token), None, &initialize());
            assert_eq!(answer.status, 200, "{answer:?}");
        }
    };
    start(1_000);
    let before = served.rss_kb();
    start(19_000);
    let after = served.rss_kb();
    eprintln!("RSS after 1,000 sessions: {before} kB; after 20,000: {after} kB");
    // Unbounded, each session kept about 75 kB: 19,000 more would be over 1 GB.
    assert!(
        after < before + 32 * 1024,
        "RSS grew from {before} kB to {after} kB"
    );
}

#[test]
fn a_unix_socket_is_the_users_alone_and_needs_no_token() {
    let test = Test::new();
    let path = test.path().join("mcp.sock");
    let shown = path.display().to_string();
    let _served = Served::start(&test, &["--socket", &shown], "on the socket");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{shown}");
    let stream = std::os::unix::net::UnixStream::connect(&path).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut http = Connection {
        reader: BufReader::new(stream),
    };
    let answer = http.post(None, None, &initialize());
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.messages[0]["result"]["serverInfo"]["name"], "summon");
}

/// Over HTTP too, a call whose arguments write a key twice is refused, in its own session
/// only: another session's call with the same request id runs.
#[test]
fn a_key_written_twice_is_refused_over_http_in_its_session() {
    let test = Test::new();
    let served = Served::start(&test, &["--http", "127.0.0.1:0"], "Authorization: Bearer");
    let token = std::fs::read_to_string(served.token_file()).unwrap();
    let token = token.trim();
    let mut http = tcp(&served.addr());
    let first = http.post(Some(token), None, &initialize()).session.unwrap();
    let second = http.post(Some(token), None, &initialize()).session.unwrap();
    let twice = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"load","arguments":{"source":"a","source":"b"}}}"#;
    let answer = http.post_raw(Some(token), Some(&first), twice);
    let result = &answer.messages[0]["result"];
    assert_eq!(result["isError"], json!(true), "{}", answer.body);
    assert_eq!(
        result["content"][0]["text"],
        "load: the arguments have the key `source` twice; write each key once"
    );
    let answer = http.post(Some(token), Some(&second), &call_load());
    let result = &answer.messages[0]["result"];
    assert_ne!(result["isError"], json!(true), "{}", answer.body);
}
