//! `summon validate PIPELINE.yaml`: pipelines (SPEC §6) are told from recipes and every rule
//! is reported as `path:line:col` before anything runs.
//!
//! Golden cases: every `tests/fixtures/invalid_pipelines/NAME.yaml` is validated from that
//! folder and its stderr must equal `NAME.stderr` (without the closing summary line).
//! `SUMMON_BLESS=1 cargo test --test pipeline_validate` writes the `.stderr` files from the
//! current output (review the diff before keeping it).

use crate::support;
use support::*;

use std::path::{Path, PathBuf};

/// The SPEC §6 example, verbatim.
const SPEC_EXAMPLE: &str = r#"version: 1
name: release-notes-by-area
description: Notes per area of the code, then one summary
parameters:              # same schema as recipe parameters; --param KEY=VALUE on the command line
  - key: since
    input_type: string
    requirement: optional
    default: v1.0.0
settings:                # all optional: provider, model, temperature, max_turns, concurrency
  concurrency: 8         # global cap on tasks in flight (--concurrency overrides)
steps:
  - id: areas
    decompose:           # exactly one of: command, items, file, glob, source/instructions
      command: "git diff --name-only {{ since }}..HEAD | cut -d/ -f1 | sort -u"
  - id: notes
    fan_out:
      over: areas        # the step whose items to iterate
      source: release-notes          # or instructions only (ad-hoc), or both
      parameters: { area: "{{ item }}" }
    concurrency: 4       # per-step cap
    on_error: continue   # default fail_fast
  - id: summary
    synthesize:
      instructions: |
        Merge these notes into one document:
        {% for r in steps.notes.results %}## {{ r.item }}
        {{ r.output }}
        {% endfor %}
outputs:
  - path: out/release-notes.md
    content: "{{ steps.summary.output }}"
"#;

/// The recipe the SPEC example's `source:` names, with the `area` parameter its step gives
/// (source names and the parameters a step gives its source are checked against the
/// catalog).
const RELEASE_NOTES_RECIPE: &str = "version: 1.0.0\ntitle: Release notes\ndescription: Notes for one area\ninstructions: Write them for {{ area }}.\nparameters:\n  - key: area\n    input_type: string\n    requirement: required\n    description: the area\n";

/// Validates `pipelines/x.yaml` holding `text` (written as is), whatever the exit code.
fn validate(text: &str) -> Output {
    Test::new()
        .write_raw("recipes/release-notes.yaml", RELEASE_NOTES_RECIPE)
        .write_raw("pipelines/x.yaml", text)
        .args(["--color", "never", "validate", "pipelines/x.yaml"])
        .output()
}

#[test]
fn the_spec_example_is_valid() {
    let out = validate(SPEC_EXAMPLE);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stderr,
        "summon: checked 1 file(s): 0 error(s), 0 warning(s)\n"
    );
}

#[test]
fn each_rule_is_reported_with_its_position() {
    // (pipeline, expected first line of the diagnostic)
    let cases: &[(&str, &str)] = &[
        (
            "steps:\n  - id: a\n    delegate: {instructions: x}\n",
            "pipelines/x.yaml:1:1: error: missing `version: 1`",
        ),
        (
            "version: 1\nsteps:\n  - id: a\n    delegate: {instructions: x}\n    fan_out: {over: a, instructions: y}\n",
            "pipelines/x.yaml:5:5: error: step `a` has both `delegate` and `fan_out`; a step has exactly one of `decompose`, `fan_out`, `synthesize`, `delegate`",
        ),
        (
            "version: 1\nsteps:\n  - id: a\n    needs: []\n",
            "pipelines/x.yaml:3:9: error: step `a` has no kind: set exactly one of `decompose`, `fan_out`, `synthesize`, `delegate`",
        ),
        (
            "version: 1\nsteps:\n  - id: a\n    delegate: {instructions: \"{{ steps.b.output }}\"}\n",
            "pipelines/x.yaml:4:40: error: unknown step `b`",
        ),
        (
            "version: 1\nsteps:\n  - id: a\n    decompose: {items: [1]}\n  - id: b\n    fan_out: {over: a, instructions: x}\n  - id: c\n    fan_out: {over: b, instructions: y}\n",
            "pipelines/x.yaml:8:21: error: `over: b` names a fan_out step; only decompose steps have items",
        ),
        (
            "version: 1\nsteps:\n  - id: b\n    fan_out: {over: nothing, instructions: y}\n",
            "pipelines/x.yaml:4:21: error: unknown step `nothing`",
        ),
        (
            "version: 1\nsteps:\n  - id: a\n    delegate: {instructions: x}\n    needs: [zz]\n",
            "pipelines/x.yaml:5:13: error: unknown step `zz`",
        ),
        (
            "version: 1\nsteps:\n  - id: a\n    delegate: {instructions: \"{{ steps.b.output }}\"}\n  - id: b\n    delegate: {instructions: \"{{ steps.a.output }}\"}\n",
            "pipelines/x.yaml:3:9: error: dependency cycle: a -> b -> a",
        ),
        (
            "version: 1\nsteps:\n  - id: a\n    delegate: {instructions: x}\n  - id: a\n    delegate: {instructions: y}\n",
            "pipelines/x.yaml:5:9: error: duplicate step id `a`: line 3 already has it",
        ),
        (
            "version: 1\nsteps:\n  - id: a b\n    delegate: {instructions: x}\n",
            "pipelines/x.yaml:3:9: error: step id `a b` is not a name templates can use",
        ),
        (
            "version: 1\nsteps:\n  - id: a\n    delegate: {instructions: x}\n    timeout: 10 minutes\n",
            "pipelines/x.yaml:5:14: error: `steps[0].timeout`: `10 minutes` is not a duration",
        ),
        (
            "version: 1\nsteps:\n  - id: a\n    delegate:\n      instructions: |\n        line one\n        {{ oops\n",
            "pipelines/x.yaml:7:9: error: template error: syntax error",
        ),
        (
            "version: 1\nsteps:\n  - id: a\n    delegate: {instructions: \"{{ topic }}\"}\n",
            "pipelines/x.yaml:4:34: error: undefined variable `topic`",
        ),
        (
            "version: 1\nsteps:\n  - id: a\n    delegate: {instructions: \"{{ item }}\"}\n",
            "pipelines/x.yaml:4:34: error: `item` is only defined in a fan_out step's templates",
        ),
        (
            "version: 1\nsteps:\n  - id: a\n    delegate: {instructions: x}\noutputs:\n  - {path: a.md, content: \"{{ steps.q.output }}\"}\n",
            "pipelines/x.yaml:6:37: error: unknown step `q`",
        ),
    ];
    let mut failures = Vec::new();
    for (text, wanted) in cases {
        let out = validate(text);
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
        if out.code != 1 || !out.stderr.lines().any(|l| l.starts_with(wanted)) {
            failures.push(format!(
                "want: {wanted}\n--- input\n{text}--- stderr (exit {})\n{}",
                out.code, out.stderr
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_full_report_with_source_line_and_hint() {
    let out = validate(
        "version: 1\nsteps:\n  - id: notes\n    delegate: {instructions: x}\n  - id: summary\n    synthesize:\n      instructions: |\n        Merge:\n        {{ steps.nots.output }}\n",
    );
    assert_eq!(out.code, 1);
    assert_eq!(
        out.stderr,
        expected(
            "
            pipelines/x.yaml:9:18: error: unknown step `nots`
              |
            9 |         {{ steps.nots.output }}
              |                  ^^^^
              = hint: did you mean `notes`?
            summon: checked 1 file(s): 1 error(s), 0 warning(s)
            "
        )
    );
}

#[test]
fn a_kind_key_written_beside_the_step_says_where_it_goes() {
    let out = validate(
        "version: 1\nsteps:\n  - id: list\n    decompose: {items: [a]}\n  - id: each\n    \
         extensions: [developer]\n    fan_out: {over: list, instructions: x}\n    \
         concurency: 3\n",
    );
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.starts_with(
            "pipelines/x.yaml:6:5: error: `steps[1].extensions` is not a step key; it goes \
             under the step's kind: `steps[1].fan_out.extensions`\n"
        ),
        "{}",
        out.stderr
    );
    // Said once, and other unknown keys keep their own error.
    assert_eq!(
        out.stderr.matches("extensions`").count(),
        2,
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("error: unknown key `steps[1].concurency`; did you mean `concurrency`?"),
        "{}",
        out.stderr
    );
}

#[test]
fn warnings_alone_exit_zero() {
    let out = validate(
        "version: 1\nparameters:\n  - {key: unused, input_type: string, requirement: optional, default: x}\nsteps:\n  - id: a\n    delegate: {instructions: x}\n",
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.starts_with(
            "pipelines/x.yaml:3:11: warning: parameter `unused` is declared but never used"
        ),
        "{}",
        out.stderr
    );
}

#[test]
fn an_unknown_key_is_an_error() {
    let out =
        validate("version: 1\nsteps:\n  - id: a\n    delegate: {instructions: x, colour: red}\n");
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr
            .starts_with("pipelines/x.yaml:4:33: error: unknown key `steps[0].delegate.colour`"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_recipe_with_a_steps_key_is_still_a_recipe() {
    let out = Test::new()
        .write(
            "r.yaml",
            "
            title: t
            description: d
            instructions: i
            steps: [a]
            ",
        )
        .args(["--color", "never", "validate", "r.yaml"])
        .run();
    assert!(
        out.stderr.contains("warning: unknown key `steps`"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_folder_of_pipelines_and_json_output() {
    let out = Test::new()
        .write_raw("recipes/release-notes.yaml", RELEASE_NOTES_RECIPE)
        .write_raw("pipelines/good.yml", SPEC_EXAMPLE)
        .write_raw(
            "pipelines/bad.yaml",
            "version: 1\nsteps:\n  - id: a\n    delegate: {instructions: x}\n    needs: b\n",
        )
        .args(["validate", "--json", "pipelines"])
        .code(1)
        .run();
    let json = out.json();
    assert_eq!(json["checked"], 2);
    assert_eq!(json["errors"], 1);
    let diagnostic = &json["diagnostics"][0];
    assert_eq!(diagnostic["message"], "unknown step `b`");
    assert_eq!(diagnostic["line"], 5);
    assert_eq!(diagnostic["column"], 12);
    assert!(
        diagnostic["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("bad.yaml")),
        "{diagnostic}"
    );
}

// ---------------------------------------------------------------------------------------
// Golden cases

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/invalid_pipelines")
}

fn cases() -> Vec<PathBuf> {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .expect("fixtures folder")
        .map(|e| e.expect("entry").path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    cases.sort();
    cases
}

/// Runs `summon --color never validate NAME` in the fixtures folder; returns the exit code,
/// the stderr without the summary line, and the summary line.
fn diagnose(case: &Path) -> (i32, String, String) {
    let name = case.file_name().unwrap().to_str().unwrap();
    let mut command = Test::new()
        .args(["--color", "never", "validate", name])
        .command();
    command.current_dir(fixtures());
    let out = command.output().expect("run summon");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{name}: {stderr}");
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
    assert!(cases().len() >= 10, "{:?}", cases());
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
        assert!(
            path.with_extension("yaml").is_file(),
            "{} has no input file",
            path.display()
        );
    }
}

#[test]
fn a_command_that_reads_a_step_output_is_a_warning() {
    let out = validate(
        "version: 1\nsteps:\n  - id: ask\n    delegate: {instructions: x}\n  - id: list\n    \
         decompose: {command: \"ls {{ steps.ask.output }}\"}\n  - id: files\n    \
         decompose: {command: \"ls {{ 'src' }}\"}\n",
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.starts_with(
            "pipelines/x.yaml:6:26: warning: `steps[1].decompose.command` reads another \
             step's output (`steps.ask`): every value reaches the shell as one quoted word"
        ),
        "{}",
        out.stderr
    );
    assert_eq!(out.stderr.matches("warning:").count(), 1, "{}", out.stderr);
}
