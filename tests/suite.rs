//! The integration suite, one test binary: each module drives the built `summon` binary
//! (`CARGO_BIN_EXE_summon`) in a temporary project, most of them against the test mock LLM
//! server (`summon_mock_llm`) on 127.0.0.1. Shared helpers live once in `support`.
//!
//! Tests that need something from outside the project (zsh, fish, tmux, Chromium, Landlock,
//! `../shared/corpus`, llama.cpp's `llama-server` and a model) are `#[ignore]`d with the reason, so a plain `cargo test` shows them
//! as ignored rather than passing without having run; `cargo test --test suite -- --ignored` (what
//! CI runs, after `.ci/run` installs them) runs them and fails when the thing is missing.

mod support;

mod background_edges;
mod batch;
mod batch_calls;
mod compile_checks;
mod completions;
mod corpus;
mod cost;
mod crash;
mod delegate;
mod discovery;
mod docs;
mod doctor;
mod error_messages;
mod escapes;
mod examples;
mod exit_codes;
mod faults;
mod first_hour;
mod first_run;
mod fuzz_regressions;
mod hostile;
mod json_outputs;
mod keys;
mod lean_requests;
mod llama;
mod load;
// The built-in model's tests exist only in a summon built with `--features local`.
#[cfg(feature = "local")]
mod local;
mod mcp;
mod mcp_conditions;
mod mcp_defaults;
mod mcp_names;
mod mcp_owner;
mod mcp_server;
mod new;
mod pipeline_edges;
mod pipeline_validate;
mod planted_links;
mod prompt_cache;
mod provider_ceiling;
mod provider_down;
mod provider_errors;
mod provider_fidelity;
mod recipe_rules;
mod reduce;
mod render;
mod report_html;
mod request_limits;
mod roles;
mod run;
mod runs;
mod sandbox;
mod schemas;
mod secrets;
mod shard;
mod store_concurrency;
mod structured_answers;
mod structured_data;
mod tables_out;
mod task_usage;
mod tasks;
mod terminal;
mod tool_support;
mod traces;
mod traces_phoenix;
mod trust;
mod validate;

/// Cargo builds only this file's modules (`autotests = false`): a test file left out of the
/// list above would never be compiled, let alone run.
#[test]
fn every_test_file_is_a_module_of_the_suite() {
    let this = include_str!("suite.rs");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("tests/") {
        let path = entry.expect("entry").path();
        let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().is_some_and(|e| e == "rs")
            && name != "suite"
            && !this.contains(&format!("\nmod {name};\n"))
        {
            missing.push(name.to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "not modules of tests/suite.rs: {missing:?}"
    );
}
