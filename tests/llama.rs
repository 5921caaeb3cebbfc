//! summon against a real inference server: llama.cpp's `llama-server` with a small GGUF model
//! (Gemma 3 270M, Q4_K_M), started on 127.0.0.1 for each test and stopped by its guard.
//!
//! `.ci/run` builds the server from source, installs the model (both cached outside the
//! checkout, `.ci/llama.sh`) and sets where they are: `SUMMON_LLAMA_SERVER` and
//! `SUMMON_LLAMA_MODEL`. The tests are ignored by a plain `cargo test`, which lists them as
//! ignored with what they need; asked for (`-- --ignored`) without those variables they fail,
//! naming how to get them, as the other tests that need a program from outside do.
//!
//! The model is a tiny base model: the tests check the protocol and the shapes of what summon
//! writes, never the content of an answer, and keep answers short with grammars (a schema),
//! `stop` sequences and small output limits. Where the figures matter (tokens), they are
//! compared with the server's own `usage`, read by a recording proxy between summon and the
//! server.

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Test, read_json, results};

const IGNORED: &str = "needs llama-server; .ci/run builds it";

/// The server and the model, from `.ci/llama.sh`'s variables.
struct Needs {
    server: PathBuf,
    model: PathBuf,
}

/// Where the server and model are; a test asked for without them fails, saying how to get
/// them (a skipped test must not pass as `ok`).
fn needs() -> Needs {
    let server = std::env::var_os("SUMMON_LLAMA_SERVER").map(PathBuf::from);
    let model = std::env::var_os("SUMMON_LLAMA_MODEL").map(PathBuf::from);
    let (Some(server), Some(model)) = (server, model) else {
        panic!(
            "SUMMON_LLAMA_SERVER and SUMMON_LLAMA_MODEL are not set: `eval \"$(bash .ci/llama.sh)\"` \
             builds llama-server and installs the model, and sets them ({IGNORED})"
        );
    };
    assert!(
        server.is_file(),
        "SUMMON_LLAMA_SERVER={} is not a file ({IGNORED})",
        server.display()
    );
    assert!(
        model.is_file(),
        "SUMMON_LLAMA_MODEL={} is not a file ({IGNORED})",
        model.display()
    );
    Needs { server, model }
}

/// One server at a time: each uses both cores, and they would only slow each other down.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A port nobody listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// One plain HTTP/1.1 exchange with `addr` (`Connection: close`): the status and the body.
fn http(addr: &str, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut stream =
        TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(2)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let (status, _, body) = parse_response(&raw)?;
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A whole HTTP/1.1 response: the status, the head, the body (de-chunked).
fn parse_response(raw: &[u8]) -> Option<(u16, String, Vec<u8>)> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let mut body = raw[end + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut plain = Vec::new();
        let mut rest = &body[..];
        while let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") {
            let size = usize::from_str_radix(
                String::from_utf8_lossy(&rest[..line_end])
                    .split(';')
                    .next()?
                    .trim(),
                16,
            )
            .ok()?;
            if size == 0 {
                break;
            }
            let start = line_end + 2;
            plain.extend_from_slice(rest.get(start..start + size)?);
            rest = rest.get(start + size + 2..)?;
        }
        body = plain;
    }
    Some((status, head, body))
}

/// An HTTP/1.1 head (ending with its blank line) with `Connection: close` in place of any
/// `Connection` header.
fn with_connection_close(head: &str) -> String {
    let mut out = String::new();
    for line in head.split("\r\n").filter(|l| !l.is_empty()) {
        if !line.to_ascii_lowercase().starts_with("connection:") {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    out
}

/// A running `llama-server`, killed (by its PID) and reaped on drop.
struct Llama {
    child: Child,
    addr: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Llama {
    /// Starts the server with the model on a free port and waits until `/health` says it is
    /// ready; `extra` is added to its arguments.
    fn start(needs: &Needs, extra: &[&str]) -> Self {
        let server = Self::spawn(needs, extra);
        server.wait_ready();
        server
    }

    /// Starts the server without waiting for it.
    fn spawn(needs: &Needs, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("llama-server.log");
        let port = free_port().to_string();
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(&needs.server)
            .arg("--model")
            .arg(&needs.model)
            .args(["--host", "127.0.0.1", "--port", &port])
            .args(["--ctx-size", "4096", "--parallel", "2", "--threads", "2"])
            .args(["--jinja", "--metrics", "--no-webui"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .expect("start llama-server");
        Self {
            child,
            addr: format!("127.0.0.1:{port}"),
            log,
            _dir: dir,
        }
    }

    /// Polls `/health` until it answers 200 (the model is loaded), for at most two minutes;
    /// fails with the server's log when it exits or never gets ready.
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some((200, _)) = http(&self.addr, "GET", "/health", "") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "llama-server not ready after 2 minutes:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The OpenAI-compatible base URL.
    fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request summon sent through the [`Proxy`] and what the server answered.
#[derive(Debug, Clone)]
struct Exchange {
    path: String,
    request: Value,
    status: u16,
    response: Value,
    /// When the request's head reached the proxy, and when the server's answer did.
    arrived: Instant,
    answered: Instant,
}

/// A recording HTTP proxy on 127.0.0.1 in front of a server: every request is passed on as
/// it is (one upstream connection each) and recorded with the answer. Stopped on drop.
struct Proxy {
    addr: String,
    exchanges: Arc<Mutex<Vec<Exchange>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address").to_string();
        let exchanges = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (upstream, log, stopping) = (upstream.to_owned(), exchanges.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let (upstream, log) = (upstream.clone(), log.clone());
                std::thread::spawn(move || Self::serve(client, &upstream, &log));
            }
        });
        Self {
            addr,
            exchanges,
            stop,
            thread: Some(thread),
        }
    }

    /// Passes on one request of a client connection and its answer, then closes it (the
    /// answer says `Connection: close`, so the client opens a new one for the next).
    fn serve(client: TcpStream, upstream: &str, log: &Mutex<Vec<Exchange>>) {
        let mut reader = BufReader::new(client.try_clone().expect("clone the stream"));
        let mut writer = client;
        let mut head = String::new();
        let mut arrived = None;
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            arrived.get_or_insert_with(Instant::now);
            let blank = line == "\r\n";
            head.push_str(&line);
            if blank {
                break;
            }
        }
        let length = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let path = head
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        let forwarded = with_connection_close(&head);
        let mut answer = Vec::new();
        let sent = TcpStream::connect(upstream).and_then(|mut up| {
            up.write_all(forwarded.as_bytes())?;
            up.write_all(&body)?;
            up.read_to_end(&mut answer)
        });
        let Some((status, head, response)) = sent.ok().and_then(|_| parse_response(&answer)) else {
            let _ = writer.shutdown(Shutdown::Both);
            return;
        };
        log.lock().expect("log").push(Exchange {
            path,
            request: serde_json::from_slice(&body).unwrap_or(Value::Null),
            status,
            response: serde_json::from_slice(&response).unwrap_or(Value::Null),
            arrived: arrived.unwrap_or_else(Instant::now),
            answered: Instant::now(),
        });
        // The body de-chunked, with its length: the client reads exactly one answer.
        let mut head = with_connection_close(&format!("{head}\r\n\r\n"))
            .lines()
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                !l.starts_with("content-length:") && !l.starts_with("transfer-encoding:")
            })
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("\r\n");
        head.push_str(&format!("\r\nContent-Length: {}\r\n\r\n", response.len()));
        let _ = writer.write_all(head.as_bytes());
        let _ = writer.write_all(&response);
        let _ = writer.shutdown(Shutdown::Both);
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The chat completions sent so far, in the order they were answered.
    fn chats(&self) -> Vec<Exchange> {
        self.exchanges
            .lock()
            .expect("log")
            .iter()
            .filter(|e| e.path.ends_with("/chat/completions"))
            .cloned()
            .collect()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A project wired to `base_url` as an OpenAI-compatible provider; the key is a placeholder
/// (the server takes any without `--api-key`), the model name is what the server is sent.
fn project(base_url: &str) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", base_url)
        .env("OPENAI_API_KEY", "sk-local")
        .env("SUMMON_MODEL", "gemma")
        .env("SUMMON_RETRY_BASE_MS", "50")
}

fn u(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not a count: {value}"))
}

/// The text of the answer the server gave in `exchange`.
fn answer_text(exchange: &Exchange) -> &str {
    exchange.response["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {:#}", exchange.response))
}

#[test]
#[ignore = "needs llama-server and a model (CONTRIBUTING.md: .ci/llama.sh builds them)"]
fn delegate_ad_hoc_prints_the_servers_answer_and_its_json_counts_the_servers_tokens() {
    let needs = needs();
    let _one = one_at_a_time();
    let server = Llama::start(&needs, &[]);
    let proxy = Proxy::start(&server.addr);
    let t = project(&proxy.base_url());
    let ask = [
        "delegate",
        "--instructions",
        "Say hello.",
        "--temperature",
        "0",
        // The base model goes on with the conversation in the fallback template's markup.
        "--stop",
        "<|im_end|>",
        "--stop",
        "\n",
        "--max-output-tokens",
        "24",
    ];
    let plain = t.command().args(ask).output().expect("run summon");
    let stderr = String::from_utf8_lossy(&plain.stderr);
    assert_eq!(
        plain.status.code(),
        Some(0),
        "{stderr}\n{}",
        server.log_text()
    );
    let chats = proxy.chats();
    assert_eq!(chats.len(), 1, "{chats:#?}");
    let sent = &chats[0].request;
    assert_eq!(
        sent["stop"],
        serde_json::json!(["<|im_end|>", "\n"]),
        "{sent:#}"
    );
    assert_eq!(sent["max_tokens"], 24, "{sent:#}");
    assert_eq!(sent["temperature"], 0.0, "{sent:#}");
    assert_eq!(chats[0].response["choices"][0]["finish_reason"], "stop");
    let text = answer_text(&chats[0]);
    assert!(!text.trim().is_empty(), "{:#}", chats[0].response);
    assert_eq!(String::from_utf8_lossy(&plain.stdout).trim(), text.trim());

    let json = t
        .command()
        .args(ask)
        .arg("--json")
        .output()
        .expect("run summon");
    assert_eq!(json.status.code(), Some(0));
    let json: Value = serde_json::from_slice(&json.stdout).expect("JSON on stdout");
    let chats = proxy.chats();
    assert_eq!(chats.len(), 2, "{chats:#?}");
    let usage = &chats[1].response["usage"];
    assert_eq!(json["status"], "completed", "{json:#}");
    assert_eq!(
        json["output"].as_str().map(str::trim),
        Some(answer_text(&chats[1]).trim())
    );
    assert_eq!(json["turns"], 1, "{json:#}");
    assert_eq!(json["tokens"]["input"], usage["prompt_tokens"], "{json:#}");
    assert_eq!(
        json["tokens"]["output"], usage["completion_tokens"],
        "{json:#}"
    );
    assert_eq!(json["provider"], "openai", "{json:#}");
    assert_eq!(json["model"], "gemma", "{json:#}");
}

/// A recipe with a parameter whose answer is an object, so the server's grammar bounds it.
const WORD_RECIPE: &str = "
version: 1.0.0
title: Word
description: One word about a topic
instructions: Answer with JSON only.
prompt: 'Topic: {{ topic }}. One word about it.'
parameters:
  - key: topic
    input_type: string
    requirement: required
    description: the topic
settings:
  max_turns: 1
response:
  json_schema:
    type: object
    properties:
      word:
        type: string
        maxLength: 12
    required: [word]
    additionalProperties: false
";

#[test]
#[ignore = "needs llama-server and a model (CONTRIBUTING.md: .ci/llama.sh builds them)"]
fn delegate_with_a_recipe_and_parameters_answers_in_the_schema() {
    let needs = needs();
    let _one = one_at_a_time();
    let server = Llama::start(&needs, &[]);
    let proxy = Proxy::start(&server.addr);
    let t = project(&proxy.base_url()).write("recipes/word.yaml", WORD_RECIPE);
    let out = t
        .args(["delegate", "--source", "word", "--param", "topic=rivers"])
        .args(["--max-output-tokens", "40", "--temperature", "0", "--json"])
        .run();
    let json = out.json();
    assert_eq!(json["status"], "completed", "{json:#}");
    let word = &json["structured"]["word"];
    assert!(word.is_string(), "{json:#}");
    assert!(word.as_str().unwrap().chars().count() <= 12, "{json:#}");
    let chats = proxy.chats();
    assert_eq!(chats.len(), 1, "{chats:#?}");
    let sent = &chats[0].request;
    assert_eq!(sent["response_format"]["type"], "json_schema", "{sent:#}");
    let user = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .unwrap();
    assert!(
        user["content"].as_str().unwrap().contains("Topic: rivers."),
        "{sent:#}"
    );
    let usage = &chats[0].response["usage"];
    assert_eq!(json["tokens"]["input"], usage["prompt_tokens"], "{json:#}");
    assert_eq!(
        json["tokens"]["output"], usage["completion_tokens"],
        "{json:#}"
    );
}

#[test]
#[ignore = "needs llama-server and a model (CONTRIBUTING.md: .ci/llama.sh builds them)"]
fn a_server_still_starting_is_waited_for() {
    let needs = needs();
    let _one = one_at_a_time();
    // Started, not waited for: summon's request finds no listener or a server loading the
    // model; with retries of 1 ms they alone would be spent long before it is ready.
    let server = Llama::spawn(&needs, &[]);
    let out = project(&server.base_url())
        .env("SUMMON_RETRY_BASE_MS", "1")
        // Said to be starting: without it, a server that does not listen yet fails at once.
        .env("SUMMON_STARTUP_WAIT_MS", "180000")
        .args([
            "delegate",
            "--instructions",
            "Say hello.",
            "--temperature",
            "0",
        ])
        .args([
            "--stop",
            "<|im_end|>",
            "--stop",
            "\n",
            "--max-output-tokens",
            "24",
        ])
        .run();
    assert!(
        out.stderr
            .contains("s for it to start (SUMMON_STARTUP_WAIT_MS)"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("] retry "), "{}", out.stderr);
    assert!(!out.stdout.trim().is_empty(), "{}", out.stderr);
}

/// The figures of one `results.jsonl` line a test compares with the server's.
fn line_tokens(line: &Value) -> (u64, u64, u64) {
    (
        u(&line["input_tokens"]),
        u(&line["output_tokens"]),
        u(&line["cache_read_tokens"]),
    )
}

#[test]
#[ignore = "needs llama-server and a model (CONTRIBUTING.md: .ci/llama.sh builds them)"]
fn a_csv_fan_out_at_concurrency_2_counts_the_servers_tokens() {
    let needs = needs();
    let _one = one_at_a_time();
    let server = Llama::start(&needs, &[]);
    let proxy = Proxy::start(&server.addr);
    let mut csv = String::from("id,topic\n");
    for (i, topic) in ["rain", "salt", "iron", "moss", "wind", "clay"]
        .iter()
        .enumerate()
    {
        csv.push_str(&format!("{i},{topic}\n"));
    }
    let pipeline = "
version: 1
name: words
settings:
  max_output_tokens: 40
  temperature: 0
steps:
  - id: rows
    decompose:
      file: rows.csv
  - id: each
    fan_out:
      over: rows
      source: word
      parameters:
        topic: '{{ item.topic }}'
";
    let t = project(&proxy.base_url())
        .write("recipes/word.yaml", WORD_RECIPE)
        .write_raw("rows.csv", &csv)
        .write("p.yaml", pipeline)
        .args([
            "run",
            "p.yaml",
            "--concurrency",
            "2",
            "--out",
            "out",
            "--quiet",
        ]);
    let out = t.run();
    let lines = results(&out.dir.join("out"));
    assert_eq!(lines.len(), 6, "{lines:#?}");
    assert!(
        lines
            .iter()
            .all(|l| l["status"] == "completed" && l["data"]["word"].is_string()),
        "{lines:#?}"
    );
    let chats = proxy.chats();
    assert_eq!(chats.len(), 6, "{chats:#?}");
    // Each task's figures are its request's usage: match them by the topic in the prompt.
    for line in &lines {
        let topic = line["item"]["topic"].as_str().expect("topic");
        let sent: Vec<&Exchange> = chats
            .iter()
            .filter(|c| c.request.to_string().contains(&format!("Topic: {topic}.")))
            .collect();
        assert_eq!(sent.len(), 1, "{topic}: {sent:#?}");
        let usage = &sent[0].response["usage"];
        let cached = usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        assert_eq!(
            line_tokens(line),
            (
                u(&usage["prompt_tokens"]),
                u(&usage["completion_tokens"]),
                cached
            ),
            "{line:#}\n{usage:#}"
        );
    }
    let sum = |key: &str| -> u64 {
        chats
            .iter()
            .map(|c| c.response["usage"][key].as_u64().unwrap_or(0))
            .sum()
    };
    let report = read_json(&out.dir.join("out/report.json"));
    assert_eq!(
        u(&report["total"]["input_tokens"]),
        sum("prompt_tokens"),
        "{report:#}"
    );
    assert_eq!(
        u(&report["total"]["output_tokens"]),
        sum("completion_tokens"),
        "{report:#}"
    );
    let cached: u64 = chats
        .iter()
        .map(|c| {
            c.response["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0)
        })
        .sum();
    assert_eq!(
        u(&report["total"]["cache_read_tokens"]),
        cached,
        "{report:#}"
    );
}

/// Every request summon sent through `proxy` to `path` (`/props`, `/chat/completions`).
fn sent_to(proxy: &Proxy, path: &str) -> Vec<Exchange> {
    proxy
        .exchanges
        .lock()
        .expect("log")
        .iter()
        .filter(|e| e.path.ends_with(path))
        .cloned()
        .collect()
}

/// A recipe whose answer is an array of at most three short words: its root is not an
/// object, so summon sends it wrapped and the server's grammar bounds the array.
const WORDS_RECIPE: &str = "
version: 1.0.0
title: Words
description: A few words about a topic
instructions: Answer with JSON only.
prompt: 'Name a few words about rivers.'
settings:
  max_turns: 1
response:
  json_schema:
    type: array
    maxItems: 3
    items:
      type: string
      maxLength: 10
";

#[test]
#[ignore = "needs llama-server and a model (CONTRIBUTING.md: .ci/llama.sh builds them)"]
fn structured_answers_follow_the_servers_grammar_and_a_refused_schema_falls_back() {
    let needs = needs();
    let _one = one_at_a_time();
    let server = Llama::start(&needs, &[]);
    let proxy = Proxy::start(&server.addr);
    let limits = ["--max-output-tokens", "60", "--temperature", "0", "--json"];

    // An object-rooted schema: sent as it is, the answer validated.
    let t = project(&proxy.base_url()).write("recipes/word.yaml", WORD_RECIPE);
    let json = t
        .command()
        .args(["delegate", "--source", "word", "--param", "topic=salt"])
        .args(limits)
        .output()
        .expect("run summon");
    let json: Value = serde_json::from_slice(&json.stdout).expect("JSON on stdout");
    assert_eq!(json["status"], "completed", "{json:#}");
    assert!(json["structured"]["word"].is_string(), "{json:#}");
    let sent = &proxy.chats()[0].request["response_format"];
    assert_eq!(
        sent["json_schema"]["schema"]["required"],
        serde_json::json!(["word"])
    );

    // An array-rooted schema: sent wrapped in an object's `items`, the answer unwrapped.
    let t = project(&proxy.base_url()).write("recipes/words.yaml", WORDS_RECIPE);
    let json = t
        .command()
        .args(["delegate", "--source", "words"])
        .args(limits)
        .output()
        .expect("run summon");
    let json: Value = serde_json::from_slice(&json.stdout).expect("JSON on stdout");
    assert_eq!(
        json["status"],
        "completed",
        "{json:#}\n{}",
        server.log_text()
    );
    let words = json["structured"].as_array().expect("an array");
    assert!(words.len() <= 3, "{json:#}");
    assert!(
        words
            .iter()
            .all(|w| w.as_str().is_some_and(|w| w.chars().count() <= 10)),
        "{json:#}"
    );
    let chats = proxy.chats();
    let sent = &chats[1].request["response_format"]["json_schema"]["schema"];
    assert_eq!(sent["properties"]["items"]["maxItems"], 3, "{sent:#}");
    assert_eq!(sent["required"], serde_json::json!(["items"]), "{sent:#}");

    // A schema the server's grammar cannot express: refused with a 400, then asked for again
    // in a form it takes; the answer validates, or the task fails saying why.
    let tuple = WORDS_RECIPE.replace(
        "    maxItems: 3\n    items:\n      type: string\n      maxLength: 10\n",
        "    prefixItems:\n      - type: string\n        maxLength: 10\n    items: false\n",
    );
    let t = project(&proxy.base_url()).write("recipes/pair.yaml", &tuple);
    let out = t
        .command()
        .args(["delegate", "--source", "pair", "--max-turns", "2"])
        .args(limits)
        .output()
        .expect("run summon");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let json: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("JSON on stdout ({e}): {stderr}"));
    let chats = proxy.chats();
    let tried = &chats[2..];
    assert_eq!(
        tried[0].status, 400,
        "the server refuses prefixItems: {tried:#?}"
    );
    assert!(
        tried.len() >= 2,
        "asked again after the refusal: {tried:#?}"
    );
    assert_eq!(
        tried[1].status, 200,
        "the second form is taken: {tried:#?}\n{stderr}"
    );
    assert_eq!(tried[0].request["response_format"]["type"], "json_schema");
    assert_ne!(
        tried[1].request["response_format"]["type"], "json_schema",
        "{tried:#?}"
    );
    match json["status"].as_str() {
        Some("completed") => {
            let value = json["structured"].as_array().expect("an array");
            assert!(
                value.len() <= 1 && value.iter().all(Value::is_string),
                "{json:#}"
            );
        }
        _ => {
            let error = json["error"].as_str().unwrap_or_default();
            // Without the grammar the base model writes prose: not a value, or cut off.
            assert!(
                error.contains("schema") || error.contains("JSON") || error.contains("cut off"),
                "a failure says why: {json:#}"
            );
        }
    }
}

#[test]
#[ignore = "needs llama-server and a model (CONTRIBUTING.md: .ci/llama.sh builds them)"]
fn decompose_by_a_model_and_by_a_recipe_gets_a_bounded_list_and_fans_it_out() {
    let needs = needs();
    let _one = one_at_a_time();
    let server = Llama::start(&needs, &[]);
    let proxy = Proxy::start(&server.addr);
    let fan_out = "  - id: each\n    fan_out:\n      over: list\n      instructions: 'Say {{ item }}.'\n    max_output_tokens: 4\n    on_error: continue\n";
    let by_model = format!(
        "version: 1\nname: by-model\nsettings:\n  max_output_tokens: 60\n  temperature: 0\nsteps:\n  - id: list\n    decompose:\n      instructions: List a few rivers as JSON.\n      schema: {{type: array, maxItems: 2, items: {{type: string, maxLength: 8}}}}\n{fan_out}"
    );
    let by_recipe = format!(
        "version: 1\nname: by-recipe\nsettings:\n  max_output_tokens: 60\n  temperature: 0\nsteps:\n  - id: list\n    decompose:\n      source: words\n{fan_out}"
    );
    let t = project(&proxy.base_url())
        .write("recipes/words.yaml", WORDS_RECIPE)
        .write("by-model.yaml", &by_model)
        .write("by-recipe.yaml", &by_recipe);
    for (file, most) in [("by-model.yaml", 2), ("by-recipe.yaml", 3)] {
        let before = proxy.chats().len();
        let out_dir = format!("out-{file}");
        let out = t
            .command()
            .args(["run", file, "--out", &out_dir, "--quiet"])
            .output()
            .expect("run summon");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let chats = proxy.chats()[before..].to_vec();
        assert!(!chats.is_empty(), "{file}: nothing sent: {stderr}");
        let schema = &chats[0].request["response_format"]["json_schema"]["schema"];
        assert_eq!(
            schema["properties"]["items"]["maxItems"], most,
            "{file}: the schema bounds the list: {schema:#}\n{stderr}"
        );
        let lines = results(&t.path().join(&out_dir));
        let list = lines
            .iter()
            .find(|l| l["step"] == "list")
            .unwrap_or_else(|| panic!("{file}: {lines:#?}\n{stderr}"));
        assert_eq!(list["status"], "completed", "{file}: {list:#}\n{stderr}");
        let items: Vec<Value> =
            serde_json::from_str(list["output"].as_str().unwrap()).expect("a JSON list");
        assert!(items.len() <= most, "{file}: {items:?}");
        let each = lines.iter().filter(|l| l["step"] == "each").count();
        assert_eq!(each, items.len(), "{file}: one task per item: {lines:#?}");
        assert_eq!(chats.len(), 1 + items.len(), "{file}: {chats:#?}");
    }
}

#[test]
#[ignore = "needs llama-server and a model (CONTRIBUTING.md: .ci/llama.sh builds them)"]
fn reduce_auto_learns_the_servers_window_and_an_item_beyond_it_fails_before_it_is_sent() {
    let needs = needs();
    let _one = one_at_a_time();
    // --ctx-size 4096 over --parallel 2: each request gets a slot of 2048 tokens.
    let server = Llama::start(&needs, &[]);
    let proxy = Proxy::start(&server.addr);
    let pipeline = |items: &str| {
        format!(
            "version: 1\nname: window\nsettings:\n  temperature: 0\n  stop: [\"\\n\", \"<|im_end|>\"]\nsteps:\n  - id: list\n    decompose:\n      items: [{items}]\n  - id: each\n    fan_out:\n      over: list\n      instructions: 'Say {{{{ item }}}}.'\n    max_output_tokens: 24\n    allow_empty: true\n  - id: all\n    synthesize:\n      instructions: |\n        Join:\n        {{% for r in steps.each.results %}}{{{{ r.output }}}}\n        {{% endfor %}}\n    max_output_tokens: 40\n    allow_empty: true\n    reduce: auto\n"
        )
    };
    // No config file: the window is the server's word.
    let t = project(&proxy.base_url())
        .write("p.yaml", &pipeline("rain, salt"))
        .write(
            "big.yaml",
            &pipeline(&format!("rain, '{}'", "salt ".repeat(2400))),
        );
    let dry = t
        .command()
        .args(["run", "p.yaml", "--dry-run"])
        .output()
        .expect("run summon");
    let stdout = String::from_utf8_lossy(&dry.stdout);
    assert!(
        stdout.contains(&format!(
            "context window 2,048 tokens, from the server: GET http://{}/props",
            proxy.addr
        )),
        "{stdout}\n{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    let props = sent_to(&proxy, "/props");
    assert_eq!(props.len(), 1, "{props:#?}");
    assert_eq!(
        props[0].response["default_generation_settings"]["n_ctx"], 2048,
        "one slot's window: {:#}",
        props[0].response
    );
    let out = t
        .command()
        .args(["run", "p.yaml"])
        .output()
        .expect("run summon");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stderr}\n{}",
        server.log_text()
    );
    assert_eq!(sent_to(&proxy, "/props").len(), 2, "asked once by the run");
    assert_eq!(proxy.chats().len(), 3, "two items and the synthesis");

    // An item of about 3,000 tokens cannot fit a 2048-token slot: its task fails before it
    // is sent, saying so; the other item's task is sent.
    let before = proxy.chats().len();
    let out = t
        .command()
        .args(["run", "big.yaml", "--out", "big", "--quiet"])
        .output()
        .expect("run summon");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let lines = results(&t.path().join("big"));
    let big = lines
        .iter()
        .find(|l| l["step"] == "each" && l["status"] != "completed")
        .unwrap_or_else(|| panic!("{lines:#?}\n{stderr}"));
    let error = big["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("context window") && error.contains("2048"),
        "{big:#}"
    );
    let sent = &proxy.chats()[before..];
    assert!(
        sent.iter()
            .all(|c| !c.request.to_string().contains("salt salt salt")),
        "the item beyond the window never reached the server: {sent:#?}"
    );
    assert!(sent.iter().all(|c| c.status == 200), "{sent:#?}");
}

/// A server in front of the recording proxy that answers the first chat request itself with
/// one call of `tool` (arguments `args`, call id `id`) and passes everything else on: the
/// 270M model follows no tool-call format, and this build of llama-server does not force one
/// (`tool_choice: required` still gets text), so the call is scripted and the rest of the
/// round trip is the real server's.
struct FirstCall {
    addr: String,
    _thread: std::thread::JoinHandle<()>,
}

impl FirstCall {
    fn start(upstream: &str, tool: &str, args: &str, id: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address").to_string();
        let upstream = upstream.to_owned();
        let answer = serde_json::json!({
            "id": "chatcmpl-scripted", "object": "chat.completion", "created": 0,
            "model": "gemma",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null,
                "tool_calls": [{"id": id, "type": "function",
                    "function": {"name": tool, "arguments": args}}]}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })
        .to_string();
        let thread = std::thread::spawn(move || {
            let mut first = true;
            for client in listener.incoming() {
                let Ok(mut client) = client else { return };
                let mut raw = Vec::new();
                let mut buf = [0u8; 8192];
                let (head_end, length) = loop {
                    let Ok(n) = client.read(&mut buf) else { return };
                    if n == 0 {
                        return;
                    }
                    raw.extend_from_slice(&buf[..n]);
                    if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        break (end + 4, length);
                    }
                };
                while raw.len() < head_end + length {
                    let Ok(n) = client.read(&mut buf) else { return };
                    if n == 0 {
                        break;
                    }
                    raw.extend_from_slice(&buf[..n]);
                }
                let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
                if first && head.contains("/chat/completions") {
                    first = false;
                    let _ = write!(
                        client,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                        answer.len()
                    );
                    continue;
                }
                let mut answer = Vec::new();
                let passed = TcpStream::connect(&upstream).and_then(|mut up| {
                    up.write_all(with_connection_close(&head).as_bytes())?;
                    up.write_all(&raw[head_end..])?;
                    up.read_to_end(&mut answer)
                });
                if passed.is_ok() {
                    let _ = client.write_all(&answer);
                }
            }
        });
        Self {
            addr,
            _thread: thread,
        }
    }
}

#[test]
#[ignore = "needs llama-server and a model (CONTRIBUTING.md: .ci/llama.sh builds them)"]
fn a_tool_call_is_run_and_its_result_goes_back_with_the_call_id_to_a_tool_template() {
    let needs = needs();
    let Some(templates) = std::env::var_os("SUMMON_LLAMA_TEMPLATES").map(PathBuf::from) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "SUMMON_LLAMA_TEMPLATES is not set"
        );
        eprintln!("skipped: SUMMON_LLAMA_TEMPLATES is not set");
        return;
    };
    let _one = one_at_a_time();
    // A template with tools: the server renders the assistant's call and the tool's result.
    let template = templates.join("Qwen-Qwen2.5-7B-Instruct.jinja");
    let template = template.to_str().expect("a UTF-8 path");
    let server = Llama::start(&needs, &["--chat-template-file", template]);
    let proxy = Proxy::start(&server.addr);
    let front = FirstCall::start(
        &proxy.addr,
        "list_files",
        "{\"path\": \".\"}",
        "call_roundtrip_1",
    );
    let out = project(&format!("http://{}/v1", front.addr))
        .write("marker-file.txt", "here\n")
        .args(["delegate", "--instructions", "List the files here."])
        .args(["--temperature", "0", "--max-turns", "3", "--json"])
        .args([
            "--stop",
            "\n",
            "--stop",
            "<tool_call>",
            "--max-output-tokens",
            "16",
        ])
        .run();
    let json = out.json();
    let chats = proxy.chats();
    assert_eq!(chats.len(), 1, "one request after the call: {chats:#?}");
    let sent = &chats[0].request;
    let messages = sent["messages"].as_array().expect("messages");
    let call = messages
        .iter()
        .find(|m| m["role"] == "assistant")
        .unwrap_or_else(|| panic!("the call goes back: {sent:#}"));
    assert_eq!(call["tool_calls"][0]["id"], "call_roundtrip_1", "{sent:#}");
    assert_eq!(call["tool_calls"][0]["function"]["name"], "list_files");
    let result = messages
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap_or_else(|| panic!("the result goes back: {sent:#}"));
    assert_eq!(result["tool_call_id"], "call_roundtrip_1", "{sent:#}");
    assert!(
        result["content"].to_string().contains("marker-file.txt"),
        "summon ran the tool: {result:#}"
    );
    assert!(
        sent["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["function"]["name"] == "list_files")),
        "{sent:#}"
    );
    assert_eq!(
        chats[0].status, 200,
        "the server took the round trip: {:#}",
        chats[0].response
    );
    assert_eq!(json["status"], "completed", "{json:#}\n{}", out.stderr);
    assert_eq!(json["turns"], 2, "{json:#}");
    assert_eq!(
        json["output"].as_str().map(str::trim),
        Some(answer_text(&chats[0]).trim()),
        "the final answer is the server's: {json:#}"
    );
}

#[test]
#[ignore = "needs llama-server and a model (CONTRIBUTING.md: .ci/llama.sh builds them)"]
fn a_wrong_key_fails_clearly_without_retrying() {
    let needs = needs();
    let _one = one_at_a_time();
    let server = Llama::start(&needs, &["--api-key", "sk-the-right-key-0123456789"]);
    let proxy = Proxy::start(&server.addr);
    let out = project(&proxy.base_url())
        .env("OPENAI_API_KEY", "sk-a-wrong-key-0123456789")
        .args(["delegate", "--instructions", "Say hi.", "--max-turns", "1"])
        .code(2)
        .run();
    assert!(out.stderr.contains("401"), "{}", out.stderr);
    assert!(
        !out.stderr.contains("sk-a-wrong-key-0123456789"),
        "the key leaked: {}",
        out.stderr
    );
    let chats = proxy.chats();
    assert_eq!(chats.len(), 1, "a refused key was retried: {chats:#?}");
    assert_eq!(chats[0].status, 401);
}

// ---------------------------------------------------------------------------------------------
// A refusing or dead server: the helpers of the tests below.

/// A server started on `port` (to be started again on the same one), waited for.
fn llama_on_port(needs: &Needs, port: u16, extra: &[&str]) -> Llama {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("llama-server.log");
    let out = std::fs::File::create(&log).expect("log file");
    let port = port.to_string();
    let child = Command::new(&needs.server)
        .arg("--model")
        .arg(&needs.model)
        .args(["--host", "127.0.0.1", "--port", &port])
        .args(["--ctx-size", "4096", "--parallel", "2", "--threads", "2"])
        .args(["--jinja", "--no-webui"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log file"))
        .stderr(out)
        .spawn()
        .expect("start llama-server");
    let server = Llama {
        child,
        addr: format!("127.0.0.1:{port}"),
        log,
        _dir: dir,
    };
    server.wait_ready();
    server
}

/// A fan-out over `n` topics at concurrency 2 that goes on after a failed task, and a
/// synthesis of its answers; every answer an object the server's grammar keeps short
/// ([`WORD_RECIPE`], at `recipes/word.yaml`).
fn words_and_a_synthesis(n: usize) -> String {
    let topics: Vec<String> = (0..n).map(|i| format!("t{i:02}")).collect();
    format!(
        "version: 1\nname: words\nsettings:\n  concurrency: 2\n  max_output_tokens: 40\n  temperature: 0\nsteps:\n  - id: list\n    decompose:\n      items: [{}]\n  - id: each\n    fan_out:\n      over: list\n      source: word\n      parameters:\n        topic: '{{{{ item }}}}'\n    on_error: continue\n  - id: all\n    synthesize:\n      source: word\n      parameters:\n        topic: '{{{{ steps.each.results | length }}}} words'\n",
        topics.join(", ")
    )
}

/// The complete lines of `results.jsonl` so far (the last may still be being written).
fn lines_so_far(dir: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("results.jsonl")).unwrap_or_default();
    text.split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn completed_items(lines: &[Value], step: &str) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l["step"] == step && l["status"] == "completed")
        .map(|l| l["item"].as_str().unwrap_or_default().to_owned())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// A refusing or dead server: the tests.

#[test]
#[ignore = "needs llama-server and a model (CONTRIBUTING.md: .ci/llama.sh builds them)"]
fn a_run_with_a_wrong_key_sends_one_request_and_no_synthesis() {
    let needs = needs();
    let _one = one_at_a_time();
    let server = Llama::start(&needs, &["--api-key", "sk-the-right-key-0123456789"]);
    let proxy = Proxy::start(&server.addr);
    let out = project(&proxy.base_url())
        .env("OPENAI_API_KEY", "sk-a-wrong-key-0123456789")
        .write("recipes/word.yaml", WORD_RECIPE)
        .write("p.yaml", &words_and_a_synthesis(30))
        .args(["run", "p.yaml", "--out", "out"])
        .code(1)
        .run();
    let chats = proxy.chats();
    assert_eq!(chats.len(), 1, "a refused key was sent again: {chats:#?}");
    assert_eq!(chats[0].status, 401);
    // A task that waited may have asked the model list: llama-server refuses it the key too.
    let log = proxy.exchanges.lock().expect("log").clone();
    assert!(
        log.iter()
            .filter(|e| e.path == "/v1/models")
            .all(|e| e.status == 401),
        "{log:#?}"
    );
    assert!(
        out.stderr.contains("provider `openai` refused the key")
            && out.stderr.contains("check the key in `OPENAI_API_KEY`")
            && out.stderr.contains("summon run p.yaml --resume"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("sk-a-wrong-key"), "{}", out.stderr);
    let lines = results(&out.dir.join("out"));
    assert!(lines.iter().all(|l| l["step"] != "all"), "{lines:#?}");
}

#[test]
#[ignore = "needs llama-server and a model (CONTRIBUTING.md: .ci/llama.sh builds them)"]
fn a_fan_out_goes_out_once_the_server_lists_its_models_to_the_key() {
    let needs = needs();
    let _one = one_at_a_time();
    let server = Llama::start(&needs, &["--api-key", "sk-the-right-key-0123456789"]);
    let proxy = Proxy::start(&server.addr);
    // No tools and a short prompt: no cacheable prefix holds the fan-out back, only the
    // server's first answer, which the model list given meanwhile stands in for.
    let pipeline = "version: 1\nname: listed\nsettings:\n  concurrency: 2\n  max_output_tokens: 8\n  temperature: 0\nsteps:\n  - id: list\n    decompose:\n      items: [rain, salt, iron, moss]\n  - id: each\n    fan_out:\n      over: list\n      instructions: 'One word about {{ item }}.'\n      extensions: []\n    on_error: continue\n    min_success: 0\n";
    let out = project(&proxy.base_url())
        .env("OPENAI_API_KEY", "sk-the-right-key-0123456789")
        .write("p.yaml", pipeline)
        .args(["run", "p.yaml", "--out", "out"])
        .run();
    let log = proxy.exchanges.lock().expect("log").clone();
    let models: Vec<_> = log.iter().filter(|e| e.path == "/v1/models").collect();
    assert_eq!(models.len(), 1, "{log:#?}");
    assert_eq!(models[0].status, 200, "{:#?}", models[0].response);
    let mut chats = proxy.chats();
    assert_eq!(chats.len(), 4, "{}", out.stderr);
    chats.sort_by_key(|e| e.arrived);
    // The second task went while the first was still being answered.
    assert!(
        chats[1].arrived < chats[0].answered,
        "the second request waited for the first answer: {:?} after it",
        chats[1].arrived.duration_since(chats[0].answered)
    );
    assert!(models[0].answered <= chats[1].arrived, "{log:#?}");
}

#[test]
#[ignore = "needs llama-server and a model (CONTRIBUTING.md: .ci/llama.sh builds them)"]
fn a_server_killed_mid_run_stops_it_and_resume_after_a_restart_finishes_it() {
    let needs = needs();
    let _one = one_at_a_time();
    let port = free_port();
    let server = llama_on_port(&needs, port, &[]);
    let t = project(&server.base_url())
        .env("SUMMON_UNREACHABLE_MS", "2000")
        .write("recipes/word.yaml", WORD_RECIPE)
        .write("p.yaml", &words_and_a_synthesis(12));
    let out_dir = t.path().join("out");
    let child = t
        .command()
        .args(["run", "p.yaml", "--out", "out"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start summon");
    support::wait_for(Duration::from_secs(120), "3 answers", || {
        completed_items(&lines_so_far(&out_dir), "each").len() >= 3
    });
    // Killed by its PID and reaped.
    drop(server);
    let out = child.wait_with_output().expect("summon ran");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    assert!(
        stderr.contains("provider `openai` could not be reached for 2s")
            && stderr.contains("continue the run with `summon run p.yaml --resume`"),
        "{stderr}"
    );
    let first = results(&out_dir);
    let done_first = completed_items(&first, "each");
    assert!(done_first.len() >= 3 && done_first.len() < 12, "{first:#?}");
    assert!(first.iter().all(|l| l["step"] != "all"), "{first:#?}");

    let _server = llama_on_port(&needs, port, &[]);
    let again = t
        .command()
        .args(["run", "p.yaml", "--out", "out", "--resume"])
        .output()
        .expect("resume");
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(0), "{stderr}");
    let lines = results(&out_dir);
    let each = completed_items(&lines, "each");
    let unique: std::collections::BTreeSet<&String> = each.iter().collect();
    assert_eq!((each.len(), unique.len()), (12, 12), "{lines:#?}");
    // What the first run finished was not sent again: its lines say so.
    for line in lines.iter().filter(|l| l["step"] == "each") {
        let first_run = done_first.iter().any(|i| line["item"] == i.as_str());
        assert_eq!(line["resumed"], first_run, "{line:#}");
    }
    assert_eq!(
        lines
            .iter()
            .filter(|l| l["step"] == "all" && l["status"] == "completed")
            .count(),
        1,
        "{lines:#?}"
    );
}

// ---------------------------------------------------------------------------------------------
// A chat template without tool support.

/// An ad-hoc delegation (which has the built-in file tools) through a recording proxy in
/// front of a server started with `extra`: the chat request it sent and summon's stderr.
fn delegate_with_tools(needs: &Needs, extra: &[&str]) -> (Exchange, String) {
    let server = Llama::start(needs, extra);
    let proxy = Proxy::start(&server.addr);
    let out = project(&proxy.base_url())
        // Two turns: a task of one turn is sent no tools whatever the server.
        .args(["delegate", "--instructions", "Say hi.", "--max-turns", "2"])
        .args(["--max-output-tokens", "8", "--temperature", "0"])
        .output();
    let chats = proxy.chats();
    assert_eq!(chats.len(), 1, "{}\n{chats:#?}", out.stderr);
    (chats[0].clone(), out.stderr)
}

#[test]
#[ignore = "needs llama-server and a model (CONTRIBUTING.md: .ci/llama.sh builds them)"]
fn a_template_without_tool_support_is_sent_no_tools_and_said() {
    let needs = needs();
    let _one = one_at_a_time();
    // The model's own (Gemma) template: `/props` says `supports_tools: false`.
    let (sent, stderr) = delegate_with_tools(&needs, &[]);
    assert!(sent.request.get("tools").is_none(), "{:#}", sent.request);
    let system = sent.request["messages"][0]["content"].to_string();
    assert!(!system.contains("Your tools"), "{system}");
    assert_eq!(
        stderr
            .matches("the server's chat template has no tool support; tools were not offered")
            .count(),
        1,
        "{stderr}"
    );
    // A template with tool support: the tools are sent, and nothing is said.
    let templates = PathBuf::from(
        std::env::var_os("SUMMON_LLAMA_TEMPLATES").expect("SUMMON_LLAMA_TEMPLATES (.ci/llama.sh)"),
    );
    let qwen = templates.join("Qwen-Qwen2.5-7B-Instruct.jinja");
    let qwen = qwen.to_str().expect("a UTF-8 path");
    let (sent, stderr) = delegate_with_tools(&needs, &["--chat-template-file", qwen]);
    let tools = sent.request["tools"].as_array().expect("tools sent");
    assert!(
        tools.iter().any(|t| t["function"]["name"] == "read_file"),
        "{tools:#?}"
    );
    assert!(!stderr.contains("no tool support"), "{stderr}");
}
