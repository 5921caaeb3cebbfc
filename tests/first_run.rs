//! The first run on a fresh machine: a provider that is not there or is mistyped fails in
//! seconds with the fix, the first Ctrl-C ends any wait, `summon validate` checks the
//! project's pipelines and skips what is not summon's, a run where every task failed is not
//! green, the advice after a missing items file leads somewhere, and `summon delegate` takes
//! what is piped to it.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use summon_mock_llm::{MockConfig, MockServer, Reply};

use crate::support::{Test, chats, read_json, results, wait_for};

const KEY: &str = "sk-test-0123456789";

/// llama.cpp's answer while it loads the model.
const LOADING: &str =
    r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#;

fn provider(base_url: &str) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", base_url)
        .env("OPENAI_API_KEY", KEY)
        .env("SUMMON_MODEL", "mock-model")
        .env("SUMMON_RETRY_BASE_MS", "1")
}

/// A port nothing listens on (bound, then closed).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `n` items, each a task, under `on_error` and `min_success` as given.
fn fan_out(n: usize, extra: &str) -> String {
    let items: Vec<String> = (0..n).map(|i| format!("\"item {i}\"")).collect();
    format!(
        "version: 1\nname: f\nsteps:\n  - id: items\n    decompose: {{items: [{}]}}\n  - id: each\n    fan_out: {{over: items, instructions: \"Do {{{{ item }}}}\"}}\n    concurrency: 4\n{extra}",
        items.join(", ")
    )
}

fn with(t: &Test, args: &[&str]) -> Output {
    t.command()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run summon")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The status `summon runs` gives the project's last run.
fn last_run_status(t: &Test) -> String {
    let out = with(t, &["runs", "--json"]);
    let listed: Value = serde_json::from_slice(&out.stdout).expect("runs --json");
    listed["runs"][0]["status"]
        .as_str()
        .unwrap_or_else(|| panic!("{listed:#}"))
        .to_owned()
}

#[test]
fn nothing_listening_fails_the_run_at_once_with_the_ways_to_configure_a_provider() {
    let base = format!("http://127.0.0.1:{}/v1", closed_port());
    let out = provider(&base)
        .write("p.yaml", &fan_out(20, ""))
        .args(["run", "p.yaml", "--out", "out"])
        .code(1)
        .run();
    for wanted in [
        "summon: error: run ",
        "nothing answers there: start the server, or set OPENAI_BASE_URL",
        "SUMMON_STARTUP_WAIT_MS (e.g. 180000) to wait for it",
        &format!("({base}/chat/completions)"),
        "summon run p.yaml --resume",
    ] {
        assert!(out.stderr.contains(wanted), "{wanted}: {}", out.stderr);
    }
    // Not taken for a server starting: no wait, no retries, and no task after the first.
    assert!(!out.stderr.contains("waiting up to"), "{}", out.stderr);
    assert!(!out.stderr.contains("] retry "), "{}", out.stderr);
    assert!(results(&out.dir.join("out")).len() <= 1);

    let out = provider(&base)
        .args(["delegate", "--instructions", "hi"])
        .code(2)
        .run();
    assert!(
        out.stderr.contains("nothing answers there") && !out.stderr.contains("waiting up to"),
        "{}",
        out.stderr
    );
}

/// Named as starting (`SUMMON_STARTUP_WAIT_MS`), a server that does not listen yet is waited
/// for: the wait is said, then the run stops after it.
#[test]
fn a_server_said_to_be_starting_is_waited_for() {
    let base = format!("http://127.0.0.1:{}/v1", closed_port());
    let out = provider(&base)
        .env("SUMMON_STARTUP_WAIT_MS", "300")
        .args(["delegate", "--instructions", "hi"])
        .code(2)
        .run();
    assert!(
        out.stderr
            .contains("waiting up to 0.3 s for it to start (SUMMON_STARTUP_WAIT_MS)"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("nothing answers there"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn https_to_a_plain_http_server_is_said_as_such_at_once() {
    let server = MockServer::start(MockConfig::new()).await;
    let plain = server.url_openai();
    let tls = plain.replacen("http://", "https://", 1);
    let out = provider(&tls)
        .args(["delegate", "--instructions", "hi"])
        .code(2)
        .run();
    assert!(
        out.stderr
            .contains("TLS handshake failed: the server speaks plain HTTP")
            && out.stderr.contains(&format!(
                "the URL starts with https:// but the server answers in plain HTTP: use {plain}/chat/completions"
            )),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("waiting up to"), "{}", out.stderr);
    assert!(!out.stderr.contains("] retry "), "{}", out.stderr);
    assert_eq!(server.request_count(), 0, "no HTTP request reached it");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_404_names_the_url_and_suggests_v1() {
    let server = MockServer::start(MockConfig::new()).await;
    // The server's root, without `/v1`: POST /chat/completions is not found.
    let root = server.url_anthropic();
    let out = provider(&root)
        .args(["delegate", "--instructions", "hi"])
        .code(2)
        .run();
    assert!(
        out.stderr.contains(&format!("at {root}/chat/completions"))
            && out.stderr.contains(&format!(
                "is the base URL right? OpenAI-compatible servers answer under `/v1`: try {root}/v1"
            )),
        "{}",
        out.stderr
    );
    // A 404 about the model is about the model, not the URL.
    let server = MockServer::start(MockConfig::new().default_reply(Reply::status(
        404,
        r#"{"error":{"message":"The model `mock-model` does not exist","type":"invalid_request_error","code":"model_not_found"}}"#,
    )))
    .await;
    let out = provider(&server.url_openai())
        .args(["delegate", "--instructions", "hi"])
        .code(2)
        .run();
    assert!(
        out.stderr.contains("The model `mock-model` does not exist")
            && !out.stderr.contains("is the base URL"),
        "{}",
        out.stderr
    );
}

/// A run waiting for a server that loads its model (for up to 10 minutes) stops at the first
/// Ctrl-C, exits 130, and says `interrupted` in `summon runs`, report.json (which report.html
/// shows) and the job summary alike.
#[tokio::test(flavor = "multi_thread")]
async fn the_first_ctrl_c_ends_a_wait_and_every_output_says_interrupted() {
    let server =
        MockServer::start(MockConfig::new().default_reply(Reply::status(503, LOADING))).await;
    let t = provider(&server.url_openai())
        .env("SUMMON_STARTUP_WAIT_MS", "600000")
        .env_path("GITHUB_STEP_SUMMARY", "summary.md")
        .write("p.yaml", &fan_out(4, ""));
    let mut child = t
        .command()
        .args(["run", "p.yaml", "--out", "out"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn summon run");
    wait_for(Duration::from_secs(20), "the first try", || {
        server.request_count() >= 1
    });
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(status.success());
    let mut ended = None;
    wait_for(
        Duration::from_secs(30),
        "summon to stop after Ctrl-C",
        || {
            ended = child.try_wait().expect("try_wait");
            ended.is_some()
        },
    );
    let stderr = {
        use std::io::Read as _;
        let mut text = String::new();
        let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut text));
        text
    };
    assert_eq!(ended.and_then(|s| s.code()), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let report = read_json(&t.path().join("out/report.json"));
    assert_eq!(report["pipeline"]["status"], "interrupted", "{report:#}");
    assert_eq!(last_run_status(&t), "interrupted");
    let summary = std::fs::read_to_string(t.path().join("summary.md")).expect("job summary");
    assert!(
        summary.starts_with("### summon run `f`: interrupted\n"),
        "{summary}"
    );
}

/// `on_error: continue` lets tasks fail, not all of them: with none succeeded the step and
/// the run fail, in every output, unless `min_success: 0` allows it.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_where_every_task_failed_is_not_green() {
    let refused = Reply::status(
        400,
        r#"{"error":{"message":"bad input","type":"invalid_request_error"}}"#,
    );
    let server = MockServer::start(MockConfig::new().default_reply(refused)).await;
    let t = provider(&server.url_openai())
        .env_path("GITHUB_STEP_SUMMARY", "summary.md")
        .write("p.yaml", &fan_out(3, "    on_error: continue\n"))
        .write(
            "allowed.yaml",
            &fan_out(3, "    on_error: continue\n    min_success: 0\n"),
        );
    let out = with(&t, &["run", "p.yaml", "--out", "out"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("0 of 3 tasks succeeded (needed 1)"),
        "{stderr}"
    );
    assert_eq!(last_run_status(&t), "failed");
    let report = read_json(&t.path().join("out/report.json"));
    assert_eq!(report["pipeline"]["status"], "failed", "{report:#}");
    let summary = std::fs::read_to_string(t.path().join("summary.md")).expect("job summary");
    assert!(
        summary.starts_with("### summon run `f`: failed\n"),
        "{summary}"
    );

    let out = with(&t, &["run", "allowed.yaml", "--out", "allowed"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(last_run_status(&t), "completed");
    let report = read_json(&t.path().join("allowed/report.json"));
    assert_eq!(report["pipeline"]["status"], "completed", "{report:#}");
    let summary = std::fs::read_to_string(t.path().join("summary.md")).expect("job summary");
    assert!(
        summary.contains("### summon run `f`: completed\n"),
        "{summary}"
    );
}

const ITEMS_PIPELINE: &str = "version: 1
name: rows
parameters:
  - {key: rows, input_type: string, requirement: optional, default: data/rows.csv}
steps:
  - id: rows
    decompose: {file: \"{{ rows }}\"}
  - id: each
    fan_out: {over: rows, instructions: \"Say {{ item.name }}\"}
";

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_items_file_says_how_to_go_on_and_a_corrected_param_runs() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = provider(&server.url_openai())
        .write("pipelines/rows.yaml", ITEMS_PIPELINE)
        .write("data/rows.csv", "name\na\nb\n");
    let out = with(
        &t,
        &[
            "run",
            "pipelines/rows.yaml",
            "--param",
            "rows=data/none.csv",
        ],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot read items file")
            && stderr.contains(
                "put the file in place and continue with `--resume`, or start a new run with \
                 a corrected --param (`--resume` keeps this run's parameters)"
            ),
        "{stderr}"
    );
    // `--resume` with another value says what to do instead.
    let out = with(
        &t,
        &[
            "run",
            "pipelines/rows.yaml",
            "--resume",
            "--param",
            "rows=data/rows.csv",
        ],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("leave out --resume to start a new run with these"),
        "{stderr}"
    );
    // And that new run works.
    let out = with(
        &t,
        &[
            "run",
            "pipelines/rows.yaml",
            "--param",
            "rows=data/rows.csv",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(chats(&server).len(), 2);
}

#[test]
fn validate_walks_the_pipelines_and_skips_what_is_not_summons() {
    let broken = "version: 1\nname: b\nsteps:\n  - id: a\n    decompose: {items: [x]}\n  - id: b\n    fan_out: {over: a, instructions: \"{{ item }}\"}\n    on_eror: continue\n";
    let action =
        "name: summon run\ndescription: Runs a pipeline\nruns:\n  using: composite\n  steps: []\n";
    let t = Test::new()
        .write("pipelines/nightly/broken.yaml", broken)
        .write("pipelines/rows.yaml", ITEMS_PIPELINE)
        .write("action.yml", action)
        .write("recipes/r.yaml", "title: R\ndescription: d\nprompt: p\n");
    for args in [&["validate"][..], &["validate", "."][..]] {
        let out = with(&t, args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        for wanted in [
            "pipelines/nightly/broken.yaml:8:5: error: unknown key `steps[1].on_eror`; did you mean `on_error`?",
            "pipelines/rows.yaml:7:23: error: items file `data/rows.csv` of step `rows` does not exist",
            "2 error(s)",
        ] {
            assert!(stderr.contains(wanted), "{args:?}: {wanted}: {stderr}");
        }
        assert!(!stderr.contains("missing required field"), "{stderr}");
    }
    // A walk says what it skipped.
    let out = with(&t, &["validate", "."]);
    assert!(
        text(&out.stderr).contains(
            "summon: skipped 1 file(s) that are not recipes, agents or pipelines: action.yml"
        ),
        "{}",
        text(&out.stderr)
    );
    // Fixed, it passes.
    std::fs::write(
        t.path().join("pipelines/nightly/broken.yaml"),
        broken.replace("on_eror", "on_error"),
    )
    .unwrap();
    std::fs::create_dir_all(t.path().join("data")).unwrap();
    std::fs::write(t.path().join("data/rows.csv"), "name\na\n").unwrap();
    let out = with(&t, &["validate", "."]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("summon: checked 3 file(s): 0 error(s)"),
        "{}",
        text(&out.stderr)
    );
}

/// `summon validate .` in summon's own checkout: its pipelines, recipes and agents pass,
/// `action.yml`, the workflows and the schemas are skipped, the deliberately broken test
/// fixtures are left out by `.summonignore`.
#[test]
fn validate_passes_on_summons_own_checkout() {
    let t = Test::new();
    let out = t
        .command()
        .args(["--color", "never", "validate", "."])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .expect("run summon");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("action.yml"), "{stderr}");
    let checked: usize = stderr
        .split("summon: checked ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stderr}"));
    // pipelines/ (3), recipes/ (3 and a subrecipe), .agents/agents (1) at least.
    assert!(checked >= 8, "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn delegate_takes_what_is_piped_to_it_as_context() {
    let server =
        MockServer::start(MockConfig::new().default_reply(Reply::text("looks fine"))).await;
    let t = provider(&server.url_openai());
    let mut child = t
        .command()
        .args(["delegate", "--instructions", "Review this diff."])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn summon delegate");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(b"diff --git a/src/x.rs b/src/x.rs\n+let marker_41 = 1;\n")
            .expect("write stdin");
    }
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "looks fine");
    let sent = chats(&server);
    assert_eq!(sent.len(), 1);
    assert!(
        sent[0].body.to_string().contains("+let marker_41 = 1;"),
        "{:#}",
        sent[0].body
    );
    // Nothing piped (stdin is /dev/null, as in CI): no context, and it runs.
    let out = with(&t, &["delegate", "--instructions", "Say hi."]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!chats(&server)[1].body.to_string().contains("marker_41"));
}

/// The fenced block of `lang` that follows the line holding `after` in `text`.
fn block_after(text: &str, after: &str, lang: &str) -> String {
    let from = text
        .find(after)
        .unwrap_or_else(|| panic!("no `{after}` in the guide"));
    let rest = &text[from..];
    let open = format!("```{lang}\n");
    let start = rest.find(&open).expect("a block") + open.len();
    let end = rest[start..].find("```").expect("a closed block") + start;
    rest[start..end].to_owned()
}

/// docs/guide.md's nightly job as written: its pipeline, its `~/.summon-env` and its crontab
/// line, run by `sh` with cron's bare environment (HOME, a `PATH` without summon), against
/// the mock; only the provider's URL and the project's folder are put in. Each night gets a
/// folder of its own with the report and the pipeline's `outputs`.
#[tokio::test(flavor = "multi_thread")]
async fn the_guides_nightly_cron_job_runs_as_written() {
    let server = MockServer::start(
        MockConfig::new().default_reply(Reply::text(r#"{"priority": "urgent", "reason": "down"}"#)),
    )
    .await;
    let guide = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/guide.md"),
    )
    .unwrap();
    let pipeline = block_after(&guide, "For tickets in a CSV:", "yaml");
    let env_file = block_after(&guide, "`~/.summon-env`", "sh");
    let cron = block_after(&guide, "`crontab -e`", "sh");
    let line = cron.trim();
    let command = line
        .strip_prefix("0 3 * * * ")
        .unwrap_or_else(|| panic!("{line}"));
    // cron passes the line to sh with `\%` made `%`.
    let command = command.replace("\\%", "%");

    let t = Test::new().write("pipelines/triage.yaml", &pipeline).write(
        "data/tickets.csv",
        "title,body\nDown,The site is down\nSlow,Pages are slow\n",
    );
    let home = t.path().join("home");
    std::fs::create_dir_all(home.join(".cargo/bin")).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_summon"), home.join(".cargo/bin/summon"))
        .unwrap();
    let env_file = env_file.replace("http://localhost:11434/v1", &server.url_openai());
    assert!(env_file.contains(&server.url_openai()), "{env_file}");
    std::fs::write(home.join(".summon-env"), env_file).unwrap();
    let project = t.path().display().to_string();
    let command = command.replace("/srv/support", &project);
    let out = Command::new("sh")
        .arg("-c")
        .arg(&command)
        .env_clear()
        .env("HOME", &home)
        .env("PATH", "/usr/bin:/bin")
        .output()
        .expect("run the cron line");
    let log = std::fs::read_to_string(home.join("triage.log")).unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "{command}\n{log}");
    let day = String::from_utf8(
        Command::new("date")
            .arg("+%F")
            .output()
            .expect("date")
            .stdout,
    )
    .unwrap();
    let night = t.path().join("out").join(day.trim());
    for file in ["urgent.md", "report.html", "junit.xml", "results.jsonl"] {
        assert!(
            night.join(file).is_file(),
            "{file} in {}: {log}",
            night.display()
        );
    }
    assert!(!t.path().join("out/urgent.md").exists(), "{log}");
    assert_eq!(chats(&server).len(), 3, "{log}");
}
