//! `summon-mock-llm`: runs the mock LLM server on 127.0.0.1 for benchmarks and manual runs.
//!
//! Prints `listening on 127.0.0.1:PORT` as its first stdout line, then serves until
//! `--max-seconds` have passed (default 600), stdin reaches end of file (unless `--no-stdin`),
//! or SIGTERM/SIGINT arrives. On exit it prints the request count, the in-flight peak and the
//! faults injected (`--fault-*`) to stderr; the lean server (`--lean`) prints the request
//! count and the chat requests' mean body size. With `--ration-*` both also print what the
//! rationing did: requests admitted, 429s by limit and tokens charged by dimension.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use summon_mock_llm::{
    Fault, FaultPlan, FencePlan, FenceStats, LeanStats, Ledger, MockConfig, MockServer, Ration,
    RationStats, Reply,
};

const USAGE: &str = "\
usage: summon-mock-llm [--port N] [--latency-ms L] [--reply echo|TEXT] [--max-seconds S]
                       [--lean] [--record] [--strict] [--cache] [--tool-turns N] [--no-stdin]
                       [--fault-rate R] [--fault-CLASS R]...
                       [--fault-seed N] [--retry-after-ms MS] [--stall-ms MS]
                       [--fence-rate R] [--fence-seed N] [--fence-broken]
                       [--ration-openai RPM,TPM] [--ration-anthropic RPM,ITPM,OTPM]

  --port N         port on 127.0.0.1 (default 0: a free port, printed on the first line)
  --latency-ms L   answer L ms after each request arrived, by the system clock (default 0)
  --reply R        `echo` (default): answer `echo: <last user message>`; else answer R
  --max-seconds S  stop after S seconds (default 600)
  --lean           OpenAI chat completions only, on one thread with a hand-written HTTP/1.1
                   server (same answers and usage): the least CPU per request, for
                   benchmarks whose client shares the machine; no --record or faults
  --record         keep every request in memory (off by default: benchmarks)
  --strict         refuse (HTTP 400) requests the real APIs refuse, as the test suite's
                   mock does (off by default: benchmarks read only what they answer)
  --cache          apply the providers' prompt caching rules and report cache tokens in
                   usage, as the test suite's mock does (off by default)
  --tool-turns N   answer a conversation with a `list_files` tool call (arguments `{}`) while
                   it holds fewer than N tool results, then with --reply: an agent loop of
                   N + 1 turns per task (default 0: never call a tool)
  --no-stdin       do not stop at end of standard input (use when stdin is /dev/null,
                   e.g. when started in the background by a script)

  --fault-rate R       inject failures into a share R (0..1) of chat requests, spread evenly
                       over the classes below
  --fault-429 R, --fault-429-retry-after R, --fault-500 R, --fault-503 R, --fault-drop R,
  --fault-stall R, --fault-truncated R
                       the share of one class (after --fault-rate, which they override)
  --fault-seed N       seed of the fault draw (default 0)
  --retry-after-ms MS  the wait a Retry-After 429 asks for (default 1000)
  --stall-ms MS        how long a stalled response hangs before closing (default 30000)

  --fence-rate R       answer a share R (0..1) of first answers (--reply TEXT, a JSON text) as
                       a sentence and a ```json block; correction turns are answered bare.
                       Which tasks is drawn from a hash of the seed and the last user message
  --fence-seed N       seed of the fence draw (default 0)
  --fence-broken       write the fenced JSON with single quotes, so no parser reads it

  --ration-openai RPM,TPM
                       ration chat completions as OpenAI does: requests and tokens per minute
                       (a request costs max(max_tokens, its input estimated from characters /
                       4), at admission); x-ratelimit-* headers on every answer, 429 with
                       \"Please try again in 1.2s\" in the message over a limit
  --ration-anthropic RPM,ITPM,OTPM
                       ration messages as Anthropic does: requests, input tokens and output
                       tokens per minute (max_tokens held until the answer ends);
                       anthropic-ratelimit-* headers, 429 with retry-after over a limit
                       (limits: positive integers; each bucket holds a minute's budget, starts
                       full and refills continuously)";

struct Args {
    port: u16,
    latency: Duration,
    reply: Reply,
    max_seconds: u64,
    record: bool,
    watch_stdin: bool,
    faults: Option<FaultPlan>,
    lean: bool,
    strict: bool,
    cache: bool,
    fence: Option<FencePlan>,
    tool_turns: usize,
    rations: Vec<Ration>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        port: 0,
        latency: Duration::ZERO,
        reply: Reply::Echo,
        max_seconds: 600,
        record: false,
        watch_stdin: true,
        faults: None,
        lean: false,
        strict: false,
        cache: false,
        fence: None,
        tool_turns: 0,
        rations: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match flag.as_str() {
            "--port" => {
                let v = value("--port")?;
                args.port = v.parse().map_err(|_| format!("--port: not a port: {v}"))?;
            }
            "--latency-ms" => {
                let v = value("--latency-ms")?;
                let ms: u64 = v
                    .parse()
                    .map_err(|_| format!("--latency-ms: not a number: {v}"))?;
                args.latency = Duration::from_millis(ms);
            }
            "--reply" => {
                let v = value("--reply")?;
                args.reply = if v == "echo" {
                    Reply::Echo
                } else {
                    Reply::Text(v)
                };
            }
            "--tool-turns" => {
                let v = value("--tool-turns")?;
                args.tool_turns = v
                    .parse()
                    .map_err(|_| format!("--tool-turns: not a number: {v}"))?;
            }
            "--max-seconds" => {
                let v = value("--max-seconds")?;
                args.max_seconds = v
                    .parse()
                    .map_err(|_| format!("--max-seconds: not a number: {v}"))?;
            }
            "--fault-rate" => {
                let rate = rate_value(&flag, value(&flag)?)?;
                let seed = args.faults.as_ref().map_or(0, |p| p.seed);
                args.faults = Some(FaultPlan::uniform(rate, seed));
            }
            "--fault-429"
            | "--fault-429-retry-after"
            | "--fault-500"
            | "--fault-503"
            | "--fault-drop"
            | "--fault-stall"
            | "--fault-truncated" => {
                let rate = rate_value(&flag, value(&flag)?)?;
                let plan = args.faults.get_or_insert_with(FaultPlan::default);
                *match flag.as_str() {
                    "--fault-429" => &mut plan.rate_429,
                    "--fault-429-retry-after" => &mut plan.rate_429_retry_after,
                    "--fault-500" => &mut plan.rate_500,
                    "--fault-503" => &mut plan.rate_503,
                    "--fault-drop" => &mut plan.rate_drop,
                    "--fault-stall" => &mut plan.rate_stall,
                    _ => &mut plan.rate_truncated,
                } = rate;
            }
            "--fault-seed" | "--retry-after-ms" | "--stall-ms" => {
                let v = value(&flag)?;
                let n: u64 = v
                    .parse()
                    .map_err(|_| format!("{flag}: not a number: {v}"))?;
                let plan = args.faults.get_or_insert_with(FaultPlan::default);
                match flag.as_str() {
                    "--fault-seed" => plan.seed = n,
                    "--retry-after-ms" => plan.retry_after = Duration::from_millis(n),
                    _ => plan.stall_for = Duration::from_millis(n),
                }
            }
            "--fence-rate" => {
                let rate = rate_value(&flag, value(&flag)?)?;
                args.fence.get_or_insert_with(FencePlan::default).rate = rate;
            }
            "--fence-seed" => {
                let v = value(&flag)?;
                args.fence.get_or_insert_with(FencePlan::default).seed = v
                    .parse()
                    .map_err(|_| format!("{flag}: not a number: {v}"))?;
            }
            "--fence-broken" => args.fence.get_or_insert_with(FencePlan::default).broken = true,
            "--ration-openai" => {
                let [rpm, tpm] = limits(&flag, &value(&flag)?)?;
                args.rations.push(Ration::openai(rpm, tpm));
            }
            "--ration-anthropic" => {
                let [rpm, itpm, otpm] = limits(&flag, &value(&flag)?)?;
                args.rations.push(Ration::anthropic(rpm, itpm, otpm));
            }
            "--record" => args.record = true,
            "--strict" => args.strict = true,
            "--cache" => args.cache = true,
            "--lean" => args.lean = true,
            "--no-stdin" => args.watch_stdin = false,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument: {other}")),
        }
    }
    if args.lean
        && (args.record
            || args.strict
            || args.cache
            || args.faults.is_some()
            || args.tool_turns > 0)
    {
        return Err(
            "--lean records nothing, refuses nothing, calls no tools and injects no faults".into(),
        );
    }
    if args.lean
        && args
            .rations
            .iter()
            .any(|r| matches!(r, Ration::Anthropic { .. }))
    {
        return Err("--lean serves OpenAI chat completions only: no --ration-anthropic".into());
    }
    if args.fence.is_some() && (args.lean || matches!(args.reply, Reply::Echo)) {
        return Err("--fence-* needs --reply TEXT (a JSON text) and no --lean".into());
    }
    if args.fence.is_some() && args.tool_turns > 0 {
        return Err("--fence-* and --tool-turns cannot be combined".into());
    }
    if let Some(plan) = &args.faults {
        let sum = plan.rate_429
            + plan.rate_429_retry_after
            + plan.rate_500
            + plan.rate_503
            + plan.rate_drop
            + plan.rate_stall
            + plan.rate_truncated;
        if sum > 1.0 + 1e-9 {
            return Err(format!("the fault rates add up to {sum}, more than 1"));
        }
    }
    Ok(args)
}

/// `N` positive integers separated by commas.
fn limits<const N: usize>(flag: &str, v: &str) -> Result<[u64; N], String> {
    let parts: Vec<Option<u64>> = v
        .split(',')
        .map(|part| part.trim().parse::<u64>().ok().filter(|n| *n > 0))
        .collect();
    match <[Option<u64>; N]>::try_from(parts) {
        Ok(parts) if parts.iter().all(Option::is_some) => Ok(parts.map(Option::unwrap_or_default)),
        _ => Err(format!(
            "{flag}: expected {N} positive integers separated by commas, got {v}"
        )),
    }
}

fn rate_value(flag: &str, v: String) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(rate) if (0.0..=1.0).contains(&rate) => Ok(rate),
        _ => Err(format!("{flag}: not a rate between 0 and 1: {v}")),
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) if message.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("summon-mock-llm: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // The lean server runs on one thread: it spends least CPU per request that way.
    let mut builder = if args.lean {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("summon-mock-llm: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(serve(args));
    // Do not wait for the stdin reader thread, which may block forever.
    runtime.shutdown_background();
    code
}

async fn serve(args: Args) -> ExitCode {
    if args.lean {
        return serve_lean(args).await;
    }
    let mut config = MockConfig::new()
        .default_reply(args.reply.clone())
        .latency(args.latency)
        .exact_latency(!args.latency.is_zero())
        .record(args.record)
        .strict(args.strict)
        .cache(args.cache);
    for ration in &args.rations {
        config = config.ration(*ration);
    }
    if let Some(plan) = args.faults {
        config = config.faults(plan);
    }
    let fenced = std::sync::Arc::new(FenceStats::default());
    if let (Some(plan), Reply::Text(answer)) = (args.fence, &config.default_reply) {
        config.rule = Some(plan.rule(answer.clone(), std::sync::Arc::clone(&fenced)));
    } else if args.tool_turns > 0 {
        let (turns, reply) = (args.tool_turns, args.reply);
        config = config.rule(move |request| {
            if tool_results(&request.body) < turns {
                Reply::tool_call("list_files", serde_json::json!({}))
            } else {
                reply.clone()
            }
        });
    }
    let server = match MockServer::start_on_port(config, args.port).await {
        Ok(server) => server,
        Err(err) => {
            eprintln!(
                "summon-mock-llm: cannot bind 127.0.0.1:{}: {err}",
                args.port
            );
            return ExitCode::FAILURE;
        }
    };
    listening(server.addr());
    let reason = stopped(args.watch_stdin, args.max_seconds).await;
    eprintln!(
        "summon-mock-llm: stopping ({reason}): served {} requests, peak in flight {}",
        server.request_count(),
        server.peak_in_flight()
    );
    if !args.rations.is_empty() {
        print_ration(&server.ration_stats());
    }
    if args.fence.is_some() {
        use std::sync::atomic::Ordering::Relaxed;
        eprintln!(
            "summon-mock-llm: first answers {}, fenced {}, correction turns {}",
            fenced.first.load(Relaxed),
            fenced.fenced.load(Relaxed),
            fenced.corrections.load(Relaxed)
        );
    }
    let injected = server.faults_injected();
    if injected.values().any(|n| *n > 0) {
        let list: Vec<String> = Fault::ALL
            .iter()
            .map(|f| format!("{} {}", f.name(), injected.get(f).copied().unwrap_or(0)))
            .collect();
        eprintln!("summon-mock-llm: faults injected: {}", list.join(", "));
    }
    ExitCode::SUCCESS
}

async fn serve_lean(args: Args) -> ExitCode {
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!(
                "summon-mock-llm: cannot bind 127.0.0.1:{}: {err}",
                args.port
            );
            return ExitCode::FAILURE;
        }
    };
    if let Ok(addr) = listener.local_addr() {
        listening(addr);
    }
    let stats = std::sync::Arc::new(LeanStats::default());
    let ledger =
        (!args.rations.is_empty()).then(|| std::sync::Arc::new(Ledger::new(&args.rations)));
    let server = summon_mock_llm::serve_lean(
        listener,
        args.reply,
        args.latency,
        std::sync::Arc::clone(&stats),
        ledger.clone(),
    );
    let reason = tokio::select! {
        reason = stopped(args.watch_stdin, args.max_seconds) => reason.to_owned(),
        Err(err) = server => format!("error: {err}"),
    };
    eprintln!(
        "summon-mock-llm: stopping ({reason}): served {} requests, chat bodies of {} bytes on average",
        stats.requests(),
        stats.mean_body_bytes()
    );
    if let Some(ledger) = &ledger {
        print_ration(&ledger.stats());
    }
    ExitCode::SUCCESS
}

/// The line scripts read what the rationing did from.
fn print_ration(stats: &RationStats) {
    eprintln!(
        "summon-mock-llm: ration: admitted {}, 429s {} (requests {}, tokens {}, output tokens {}); charged: tokens {}, input tokens {}, output tokens {} (held {})",
        stats.admitted,
        stats.limited,
        stats.limited_by_requests,
        stats.limited_by_tokens,
        stats.limited_by_output_tokens,
        stats.tokens,
        stats.input_tokens,
        stats.output_tokens,
        stats.output_held
    );
}

/// The tool results a chat request carries: OpenAI `tool` messages, Anthropic `tool_result`
/// blocks.
fn tool_results(body: &serde_json::Value) -> usize {
    let Some(messages) = body["messages"].as_array() else {
        return 0;
    };
    messages
        .iter()
        .map(|m| {
            if m["role"] == "tool" {
                return 1;
            }
            m["content"].as_array().map_or(0, |blocks| {
                blocks.iter().filter(|b| b["type"] == "tool_result").count()
            })
        })
        .sum()
}

/// The first line of stdout, which scripts wait for.
fn listening(addr: std::net::SocketAddr) {
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "listening on {addr}");
    let _ = stdout.flush();
}

/// Waits for the end of standard input (when watched), the time limit or a signal, and says
/// which.
async fn stopped(watch_stdin: bool, max_seconds: u64) -> &'static str {
    let (eof_tx, eof_rx) = tokio::sync::oneshot::channel::<()>();
    if watch_stdin {
        // A plain thread: it must not keep the process alive at exit.
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            let mut stdin = std::io::stdin();
            while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
            let _ = eof_tx.send(());
        });
    } else {
        // A dropped sender disables the stdin branch below.
        drop(eof_tx);
    }
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(max_seconds)) => "time limit reached",
        Ok(()) = eof_rx => "end of standard input",
        () = terminate() => "signal",
    }
}

#[cfg(unix)]
async fn terminate() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut sigterm) => {
            tokio::select! {
                _ = sigterm.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn terminate() {
    let _ = tokio::signal::ctrl_c().await;
}
