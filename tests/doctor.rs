//! `summon doctor`: the provider and model with where each came from, one models request to
//! the mock server (the key never shown), a dead port, config file problems at file:line,
//! shadowed sources, the store, `--json` and the exit code.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use summon_mock_llm::{Api, MockConfig, MockServer};
use support::Test;

const KEY: &str = "sk-test-0123456789abcdefSECRET";

/// A project wired to `base` as an OpenAI-compatible provider.
fn openai(base: &str) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", base)
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "m-1")
}

/// A port nothing listens on.
fn dead_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

#[track_caller]
fn assert_no_key(out: &support::Output) {
    assert!(!out.stdout.contains("SECRET"), "{}", out.stdout);
    assert!(!out.stderr.contains("SECRET"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn reports_provider_model_and_origins_after_one_models_request() {
    let server = MockServer::start(MockConfig::new().models(["m-1", "m-2"])).await;
    let out = openai(&server.url_openai()).args(["doctor"]).run();
    let expected_lines = [
        "Provider and model\n",
        "  ok       provider `openai` (from auto-detected: OPENAI_API_KEY is set)\n",
        &format!(
            "  ok       OpenAI-compatible API at {} (from environment variable OPENAI_BASE_URL)\n",
            server.url_openai()
        ),
        "  ok       model `m-1` (from environment variable SUMMON_MODEL)\n",
        "  ok       API key set in OPENAI_API_KEY (not shown)\n",
        "Config files\n",
        "Sources\n",
        "  ok       no recipes or agents found\n",
        "Store\n",
        "  ok       no store yet: .summon/ is made by the first background task or pipeline run\n",
        "\nsummon doctor: 0 errors, 0 warnings\n",
    ];
    for line in expected_lines {
        assert!(
            out.stdout.contains(line),
            "missing {line:?} in\n{}",
            out.stdout
        );
    }
    assert!(
        out.stdout
            .contains("  ok       the provider answers: 2 model(s) listed in "),
        "{}",
        out.stdout
    );
    assert_no_key(&out);
    let requests = server.requests();
    assert_eq!(requests[0].api, Api::Models, "{requests:?}");
    assert_eq!(requests[0].method, "GET");
    // Then the window is asked of the server (llama.cpp, vLLM, Ollama), which says none.
    // (`/props` answered 404: counted, not recorded.)
    let paths: Vec<&str> = requests[1..].iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, ["/v1/models", "/api/show"], "{requests:?}");
    assert_eq!(server.props_count(), 1);
    assert!(
        out.stdout.contains(
            "  ok       context window of `m-1`: unknown; requests are not checked against it"
        ),
        "{}",
        out.stdout
    );
    // The key was sent to the provider, and only there.
    for request in &requests {
        assert_eq!(
            request.header("authorization"),
            Some(format!("Bearer {KEY}").as_str())
        );
    }
    // Nothing was created by looking.
    assert!(!out.dir.join(".summon").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_context_window_comes_from_the_config_file_or_else_the_server() {
    let server = MockServer::start(
        MockConfig::new()
            .models(["m-1"])
            .context_window("m-1", 8192),
    )
    .await;
    let out = openai(&server.url_openai()).args(["doctor"]).run();
    assert!(
        out.stdout.contains(&format!(
            "  ok       context window of `m-1`: 8192 tokens (from the server: GET {}/props)\n",
            server.url_anthropic()
        )),
        "{}",
        out.stdout
    );
    let out = openai(&server.url_openai())
        .write("summon.yaml", "models:\n  m-1: { context_window: 4000 }\n")
        .args(["doctor"])
        .run();
    assert!(
        out.stdout.contains(
            "  ok       context window of `m-1`: 4000 tokens (from the config file's `models.m-1.context_window`)\n"
        ),
        "{}",
        out.stdout
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn flags_override_and_say_so() {
    let server = MockServer::start(MockConfig::new().models(["m-1", "m-2"])).await;
    let out = openai(&server.url_anthropic())
        .env("ANTHROPIC_BASE_URL", &server.url_anthropic())
        .env("ANTHROPIC_API_KEY", KEY)
        .args(["doctor", "--provider", "anthropic", "--model", "m-2"])
        .run();
    assert!(
        out.stdout
            .contains("  ok       provider `anthropic` (from command-line flag)\n"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("  ok       model `m-2` (from command-line flag)\n"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("Anthropic API at"), "{}", out.stdout);
    assert_no_key(&out);
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].header("x-api-key"), Some(KEY));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_the_provider_does_not_list_is_a_warning_with_the_choices() {
    let server = MockServer::start(MockConfig::new().models(["m-1", "m-2"])).await;
    let out = openai(&server.url_openai())
        .env("SUMMON_MODEL", "gpt-typo")
        .args(["doctor"])
        .run();
    assert!(
        out.stdout.contains(
            "  warning  model `gpt-typo` is not among the models the provider lists\n\
             \x20          fix: use one it lists (SUMMON_MODEL, --model or `default_model`): m-1, m-2\n"
        ),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("summon doctor: 0 errors, 1 warning\n"),
        "{}",
        out.stdout
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn json_output_has_the_provider_model_and_every_check() {
    let server = MockServer::start(MockConfig::new().models(["m-1"])).await;
    let out = openai(&server.url_openai())
        .args(["doctor", "--json"])
        .run();
    assert_no_key(&out);
    let json = out.json();
    assert_eq!(json["ok"], true);
    assert_eq!(json["errors"], 0);
    assert_eq!(json["provider"]["name"], "openai");
    assert_eq!(json["provider"]["kind"], "openai");
    assert_eq!(
        json["provider"]["from"],
        "auto-detected: OPENAI_API_KEY is set"
    );
    assert_eq!(json["provider"]["base_url"], server.url_openai());
    assert_eq!(
        json["provider"]["base_url_from"],
        "environment variable OPENAI_BASE_URL"
    );
    assert_eq!(json["provider"]["key_env"], "OPENAI_API_KEY");
    assert_eq!(json["provider"]["key_set"], true);
    assert_eq!(json["provider"]["answers"], true);
    assert_eq!(json["provider"]["models"], 1);
    assert_eq!(json["model"]["name"], "m-1");
    assert_eq!(json["model"]["from"], "environment variable SUMMON_MODEL");
    let checks = json["checks"].as_array().expect("checks");
    assert!(checks.iter().all(|c| c["status"] == "ok"), "{checks:?}");
    for section in ["provider", "config", "sources", "store"] {
        assert!(
            checks.iter().any(|c| c["section"] == section),
            "{section}: {checks:?}"
        );
    }
    assert_eq!(json["config_files"][1]["scope"], "project");
    assert_eq!(json["config_files"][1]["found"], false);
}

#[test]
fn a_dead_port_is_an_error_with_the_fix_and_exit_1() {
    let base = format!("http://127.0.0.1:{}/v1", dead_port());
    let out = openai(&base).args(["doctor"]).code(1).run();
    assert!(
        out.stdout
            .contains("  error    the provider does not answer: "),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(&format!(
            "           fix: start the server at {base}, or point summon at one that runs\n"
        )),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("summon doctor: 1 error, 0 warnings\n"),
        "{}",
        out.stdout
    );
    assert_no_key(&out);

    let json = openai(&base)
        .args(["doctor", "--json"])
        .code(1)
        .run()
        .json();
    assert_eq!(json["ok"], false);
    assert_eq!(json["provider"]["answers"], false);
}

#[test]
fn offline_sends_nothing() {
    let base = format!("http://127.0.0.1:{}/v1", dead_port());
    let out = openai(&base).args(["doctor", "--offline"]).run();
    assert!(
        out.stdout
            .contains("not asked whether the provider answers (--offline)"),
        "{}",
        out.stdout
    );
}

/// Serves every connection with `401` and a body that echoes the key, as some servers do.
fn refusing_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}/v1", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let body = format!(
                r#"{{"error":{{"message":"Incorrect API key provided: {KEY}","type":"invalid_request_error"}}}}"#
            );
            let _ = write!(
                stream,
                "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    base
}

#[test]
fn a_refused_key_is_an_error_naming_the_variable_never_the_key() {
    let base = refusing_server();
    let out = openai(&base).args(["doctor"]).code(1).run();
    assert!(
        out.stdout
            .contains("  error    the provider refused the request: "),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("           fix: check the key in OPENAI_API_KEY\n"),
        "{}",
        out.stdout
    );
    assert_no_key(&out);
    let json_out = openai(&base).args(["doctor", "--json"]).code(1).run();
    assert_no_key(&json_out);
}

#[test]
fn no_provider_at_all_is_an_error_listing_the_ways_to_configure_one() {
    let out = Test::new()
        .env("OLLAMA_HOST", &format!("http://127.0.0.1:{}", dead_port()))
        .args(["doctor"])
        .code(1)
        .run();
    assert!(
        out.stdout
            .contains("  error    no LLM provider is configured"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("set OPENAI_API_KEY"), "{}", out.stdout);
    // The other sections are still checked.
    assert!(out.stdout.contains("\nStore\n"), "{}", out.stdout);
}

#[tokio::test(flavor = "multi_thread")]
async fn config_files_are_listed_with_their_problems_at_file_line() {
    let server = MockServer::start(MockConfig::new().models(["small"])).await;
    let out = Test::new()
        .env("WORK_KEY", KEY)
        .env("SUMMON_TRUST_PROJECT", "1")
        .write(
            "summon.yaml",
            &format!(
                "
                default_provider: work
                providers:
                  work:
                    kind: openai
                    base_url: {}
                    api_key_env: WORK_KEY
                    default_model: small
                    colour: blue
                ",
                server.url_openai()
            ),
        )
        .args(["doctor"])
        .run();
    assert!(
        out.stdout
            .contains("  ok       summon.yaml: read, 1 problem (below)\n"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("  warning  summon.yaml:8:5: "),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("colour"), "{}", out.stdout);
    assert!(
        out.stdout
            .contains("  ok       provider `work` (from config file "),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("; defined in ") && out.stdout.contains("summon.yaml"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("  ok       API key set in WORK_KEY (not shown)\n"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("  ok       model `small` (from "),
        "{}",
        out.stdout
    );
    assert_no_key(&out);
}

#[test]
fn a_broken_config_file_is_an_error_at_its_line() {
    let out = Test::new()
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "m")
        .write(
            "summon.yaml",
            "
            default_model: m
            providers: [not, a, mapping]
            ",
        )
        .args(["doctor", "--offline"])
        .code(1)
        .run();
    assert!(
        out.stdout.contains("  error    summon.yaml:2:"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("           fix: "), "{}", out.stdout);
}

#[test]
fn shadowed_sources_and_broken_ones_are_warnings() {
    let recipe = "title: t\ndescription: d\ninstructions: i\n";
    let out = Test::new()
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "m")
        .write("recipes/notes.yaml", recipe)
        .write(".agents/recipes/notes.yaml", recipe)
        .write("recipes/broken.yaml", "title: t\ninstructions: i\n")
        .args(["doctor", "--offline"])
        .run();
    assert!(
        out.stdout.contains(
            "  warning  .agents/recipes/notes.yaml: recipe `notes` is shadowed by \
             recipes/notes.yaml, which is found first\n"
        ),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("  warning  recipes/broken.yaml:"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("fix: `summon validate recipes/broken.yaml` shows every problem"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("  ok       1 found: 1 recipe\n"),
        "{}",
        out.stdout
    );
}

#[test]
fn the_store_schema_version_is_reported() {
    // `summon tasks` makes the database in an existing `.summon/` (it creates no folder).
    let test = Test::new().mkdir(".summon");
    let made = std::process::Command::new(env!("CARGO_BIN_EXE_summon"))
        .arg("tasks")
        .current_dir(test.path())
        .env_clear()
        .env("HOME", test.path())
        .output()
        .expect("run");
    assert!(made.status.success(), "{made:?}");
    let out = test
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "m")
        .args(["doctor", "--offline"])
        .run();
    assert!(
        out.stdout
            .contains("  ok       .summon/state.db: schema version "),
        "{}",
        out.stdout
    );
}

#[test]
fn a_store_from_a_newer_summon_is_an_error() {
    let test = Test::new().mkdir(".summon");
    let db = test.path().join(".summon/state.db");
    let conn = rusqlite::Connection::open(&db).expect("open");
    conn.pragma_update(None, "user_version", 9999)
        .expect("version");
    drop(conn);
    let out = test
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "m")
        .args(["doctor", "--offline"])
        .code(1)
        .run();
    assert!(
        out.stdout.contains("  error    .summon/state.db: ")
            && out.stdout.contains("written by a newer version of summon"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("fix: upgrade summon to the version that wrote it"),
        "{}",
        out.stdout
    );
}

#[test]
fn colour_only_when_asked_or_on_a_terminal() {
    let plain = Test::new()
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "m")
        .args(["doctor", "--offline"])
        .run();
    assert!(!plain.stdout.contains('\x1b'), "{:?}", plain.stdout);
    let coloured = Test::new()
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "m")
        .args(["--color", "always", "doctor", "--offline"])
        .run();
    assert!(
        coloured.stdout.contains("\x1b[32mok      \x1b[0m"),
        "{:?}",
        coloured.stdout
    );
}

/// Polls `check` every 50 ms until it gives a value; panics after `timeout`.
#[track_caller]
fn wait_until<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pid of the `summon __worker ID` process of the project in `dir`, if it runs (other
/// projects' tasks may have the same id).
fn worker_of(id: &str, dir: &std::path::Path) -> Option<u32> {
    let dir = dir.canonicalize().ok()?;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args.len() >= 3
            && args[1] == b"__worker"
            && args[2] == id.as_bytes()
            && std::fs::read_link(entry.path().join("cwd")).is_ok_and(|cwd| cwd == dir)
        {
            return Some(pid);
        }
    }
    None
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_running_task_whose_worker_died_is_a_warning() {
    let server = MockServer::start(MockConfig::new().latency(Duration::from_secs(30))).await;
    let test = openai(&server.url_openai());
    let run = |args: &[&str]| {
        let mut command = test.command();
        command.args(args).stdin(std::process::Stdio::null());
        let output = command.output().expect("run summon");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    let (code, started) = run(&["delegate", "--async", "--json", "--instructions", "hang"]);
    assert_eq!(code, Some(0), "{started}");
    let started: serde_json::Value = serde_json::from_str(&started).expect("json");
    let id = started["task_id"].as_str().expect("task id").to_owned();
    let pid = wait_until("the worker", Duration::from_secs(10), || {
        worker_of(&id, test.path())
    });
    wait_until("the model request", Duration::from_secs(10), || {
        (server.request_count() > 0).then_some(())
    });

    let (code, healthy) = run(&["doctor", "--offline"]);
    assert_eq!(code, Some(0), "{healthy}");
    assert!(
        healthy.contains("  ok       1 background task(s) running or queued\n"),
        "{healthy}"
    );

    assert!(
        std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success())
    );
    wait_until("the worker to die", Duration::from_secs(5), || {
        (!alive(pid)).then_some(())
    });
    let (code, report) = run(&["doctor", "--offline"]);
    assert_eq!(code, Some(0), "{report}");
    assert!(
        report.contains(&format!(
            "  warning  task {id} is marked running but its worker (pid {pid}) is gone"
        )),
        "{report}"
    );
    assert!(
        report.contains("fix: `summon tasks` marks it failed; its log is .summon/tasks/"),
        "{report}"
    );
    // Doctor only looks; the next ordinary command cleans up, and then all is well.
    let (code, _) = run(&["tasks"]);
    assert_eq!(code, Some(0));
    let (_, after) = run(&["doctor", "--offline"]);
    assert!(!after.contains("is gone"), "{after}");
    assert!(
        after.contains("summon doctor: 0 errors, 0 warnings"),
        "{after}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_local_ollama_is_found_but_not_looked_for_offline() {
    let server = MockServer::start(MockConfig::new().models(["m-1"])).await;
    let ollama = || {
        Test::new()
            .env("OLLAMA_HOST", &server.url_anthropic())
            .env("SUMMON_MODEL", "m-1")
    };
    let offline = ollama().args(["doctor", "--offline"]).code(1).run();
    assert!(
        offline
            .stdout
            .contains("(--offline: a local Ollama was not looked for)"),
        "{}",
        offline.stdout
    );
    assert_eq!(server.request_count(), 0);

    let online = ollama().args(["doctor"]).run();
    assert!(
        online.stdout.contains(&format!(
            "  ok       provider `ollama` (from auto-detected: a local Ollama answered at {})\n",
            server.url_anthropic()
        )),
        "{}",
        online.stdout
    );
    assert!(
        online.stdout.contains("  ok       no API key needed\n"),
        "{}",
        online.stdout
    );
}

#[test]
fn doctor_shows_which_name_of_a_variable_is_used() {
    let out = openai("http://127.0.0.1:9/v1")
        .env("GOOSE_SUBAGENT_MAX_TURNS", "7")
        .env("SUMMON_MAX_BACKGROUND_TASKS", "3")
        .env("GOOSE_MAX_BACKGROUND_TASKS", "9")
        .args(["doctor", "--offline"])
        .run();
    assert!(
        out.stdout
            .contains("GOOSE_SUBAGENT_MAX_TURNS=7 is used (SUMMON_SUBAGENT_MAX_TURNS is not set)"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(
            "SUMMON_MAX_BACKGROUND_TASKS=3 is used; GOOSE_MAX_BACKGROUND_TASKS=9 is ignored"
        ),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("COMPLETED_TASK_TTL"), "{}", out.stdout);
}
