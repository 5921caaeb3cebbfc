//! Exit codes of failures that are not the user's input: a corrupt `.summon/` store exits 74
//! with a message naming the database file, never 1 like a typo.

use crate::support;

use summon_mock_llm::{MockConfig, MockServer};
use support::Test;

/// The exit code of a store that cannot be read (sysexits' EX_IOERR).
const STORE: i32 = 74;

/// Bytes that are not an SQLite database.
const GARBAGE: &str = "this is not an SQLite database, just some text where state.db should be\n";

/// A project whose store is garbage.
fn corrupt_project() -> Test {
    Test::new().write_raw(".summon/state.db", &GARBAGE.repeat(100))
}

#[track_caller]
fn assert_names_store(stderr: &str) {
    assert!(
        stderr.starts_with("summon: error: ") && stderr.contains(".summon/state.db"),
        "the message names the store file:\n{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one line:\n{stderr}");
}

#[test]
fn tasks_on_a_corrupt_store_exits_74_naming_the_file() {
    let out = corrupt_project().args(["tasks"]).code(STORE).run();
    assert_names_store(&out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
}

#[test]
fn runs_on_a_corrupt_store_exits_74_naming_the_file() {
    let out = corrupt_project().args(["runs", "--json"]).code(STORE).run();
    assert_names_store(&out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
}

#[tokio::test(flavor = "multi_thread")]
async fn run_on_a_corrupt_store_exits_74_before_any_request() {
    let server = MockServer::start(MockConfig::new()).await;
    let out = corrupt_project()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
        .write(
            "p.yaml",
            "
            version: 1
            name: p
            steps:
              - id: only
                delegate:
                  instructions: say hi
            ",
        )
        .args(["run", "p.yaml", "--out", "out"])
        .code(STORE)
        .run();
    assert_names_store(&out.stderr);
    assert!(
        server.requests().is_empty(),
        "no request reached the provider"
    );
    assert!(
        !out.dir.join("out/results.jsonl").exists(),
        "nothing half-written"
    );
    let db = std::fs::read_to_string(out.dir.join(".summon/state.db")).expect("store kept");
    assert_eq!(
        db,
        GARBAGE.repeat(100),
        "the corrupt store is left as it was"
    );
}
