//! Golden diagnostics: every `tests/fixtures/invalid/NAME.yaml` (or `.md`) is validated from
//! that folder and its stderr must equal `NAME.stderr` (without the closing summary line).
//!
//! Adding a case = adding two files. `SUMMON_BLESS=1 cargo test --test error_messages` writes
//! the `.stderr` files from the current output (review the diff before keeping it).
//! Files in subfolders are helpers (for example the target of a sub-recipe), not cases.

use crate::support;
use support::*;

use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/invalid")
}

fn cases() -> Vec<PathBuf> {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .expect("fixtures folder")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_file())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json" | "md")
            )
        })
        .collect();
    cases.sort();
    cases
}

/// Runs `summon --color never validate NAME` in the fixtures folder; returns exit code and
/// the stderr without the summary line.
fn diagnose(case: &Path) -> (i32, String, String) {
    let name = case.file_name().unwrap().to_str().unwrap();
    let mut command = Test::new()
        .args(["--color", "never", "validate", name])
        .command();
    command.current_dir(fixtures());
    let out = command.output().expect("run summon");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{name}: {stderr}");
    // a message may name a file by its absolute path; compare it relative to the folder
    let mut stderr = stderr;
    for dir in [
        fixtures(),
        fixtures().canonicalize().expect("fixtures folder"),
    ] {
        stderr = stderr.replace(&format!("{}/", dir.display()), "");
    }
    let (body, summary) = match stderr.trim_end_matches('\n').rsplit_once('\n') {
        Some((body, last)) if last.starts_with("summon: checked ") => {
            (format!("{body}\n"), last.to_owned())
        }
        _ if stderr.starts_with("summon: checked ") => {
            (String::new(), stderr.trim_end().to_owned())
        }
        _ => panic!("{name}: no summary line:\n{stderr}"),
    };
    (out.status.code().unwrap_or(-1), body, summary)
}

#[test]
fn there_are_enough_cases() {
    assert!(cases().len() >= 12, "{:?}", cases());
}

#[test]
fn every_case_matches_its_expected_stderr() {
    let bless = std::env::var_os("SUMMON_BLESS").is_some();
    let mut failures = Vec::new();
    for case in cases() {
        let expected_path = case.with_extension("stderr");
        let (code, actual, summary) = diagnose(&case);
        let errors = actual.lines().filter(|l| l.contains(": error: ")).count();
        let warnings = actual.lines().filter(|l| l.contains(": warning: ")).count();
        // the summary agrees with the diagnostics, and the exit code with the summary
        assert_eq!(
            summary,
            format!("summon: checked 1 file(s): {errors} error(s), {warnings} warning(s)"),
            "{}",
            case.display()
        );
        assert_eq!(code, if errors > 0 { 1 } else { 0 }, "{}", case.display());
        assert!(
            errors + warnings > 0,
            "{}: a fixture must produce a diagnostic",
            case.display()
        );
        if bless {
            std::fs::write(&expected_path, &actual).expect("write .stderr");
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_else(|_| {
            panic!(
                "{} has no {}; run with SUMMON_BLESS=1 to create it",
                case.display(),
                expected_path.display()
            )
        });
        if expected != actual {
            failures.push(format!(
                "--- {}\n--- expected\n{expected}--- actual\n{actual}",
                case.display()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_expected_stderr_has_its_case() {
    for entry in std::fs::read_dir(fixtures()).expect("fixtures folder") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("stderr") {
            continue;
        }
        let has_case = ["yaml", "yml", "json", "md"]
            .iter()
            .any(|ext| path.with_extension(ext).is_file());
        assert!(has_case, "{} has no input file", path.display());
    }
}
