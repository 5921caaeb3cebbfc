//! What a new user types and trips over in the first hour: misspelt keys, a recipe given to
//! `run`, a column that is not there, a missing items file in a dry run, and the messages
//! around them.

use crate::support;

use support::Test;

#[test]
fn a_misspelt_key_gets_the_key_it_was_meant_to_be() {
    let out = Test::new()
        .write(
            "p.yaml",
            "
            version: 1
            name: x
            setting:
              concurrency: 2
            steps:
              - id: a
                delegate: {instructions: hi}
                concurency: 4
            ",
        )
        .args(["validate", "p.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr
            .contains("p.yaml:3:1: error: unknown key `setting`; did you mean `settings`?"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(
            "p.yaml:8:5: error: unknown key `steps[0].concurency`; did you mean `concurrency`?"
        ),
        "{}",
        out.stderr
    );
    // Nothing close: no guess.
    let out = Test::new()
        .write(
            "recipes/r.yaml",
            "
            title: T
            description: d
            prompt: p
            flavour: mint
            ",
        )
        .args(["validate", "recipes/r.yaml"])
        .run();
    assert!(
        out.stderr.contains("warning: unknown key `flavour`\n"),
        "{}",
        out.stderr
    );
}

#[test]
fn run_on_a_recipe_or_an_agent_says_how_to_run_it() {
    let t = Test::new()
        .write(
            "recipes/review.yaml",
            "
            title: Review
            description: Reviews a path
            prompt: Review {{ path }}
            parameters:
              - {key: path, input_type: string, requirement: required, description: what}
            ",
        )
        .write(
            ".claude/agents/critic.md",
            "
            ---
            name: code-critic
            description: criticises
            ---
            Be harsh.
            ",
        );
    let out = t
        .command()
        .args(["run", "recipes/review.yaml"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr,
        "recipes/review.yaml: error: this is a goose recipe, not a pipeline; run it with \
         `summon delegate --source review`, or name it in a pipeline step's `source:`\n"
    );
    let out = t
        .command()
        .args(["run", ".claude/agents/critic.md"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains(
            "this is an agent definition, not a pipeline; run it with `summon delegate \
             --source code-critic --instructions \"...\"`"
        ),
        "{stderr}"
    );
}

const MISSING_COLUMN: &str = "
version: 1
name: x
steps:
  - id: rows
    decompose:
      file: tickets.csv
  - id: each
    fan_out:
      over: rows
      instructions: \"Read {{ item.body }}\"
";

#[test]
fn a_missing_column_names_the_columns_there_are() {
    let out = Test::new()
        .write("p.yaml", MISSING_COLUMN)
        .write_raw("tickets.csv", "id,title,text\n1,a,b\n")
        .env("OPENAI_API_KEY", "sk-test")
        .env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
        .env("SUMMON_MODEL", "m")
        .args(["run", "p.yaml", "--dry-run"])
        .code(1)
        .run();
    assert!(
        out.stderr
            .contains("`item.body` is undefined; the keys of `item` are: id, text, title"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_dry_run_with_an_unreadable_items_file_fails_as_the_run_would() {
    let out = Test::new()
        .write("p.yaml", MISSING_COLUMN)
        .args(["run", "p.yaml", "--dry-run"])
        .code(1)
        .run();
    assert!(
        out.stderr
            .contains("p.yaml:4:9: error: step `rows`: cannot read items file")
            && out.stderr.contains("tickets.csv"),
        "{}",
        out.stderr
    );
}

#[test]
fn messages_speak_with_one_voice() {
    let t = Test::new().write("p.yaml", MISSING_COLUMN);
    // One prefix for errors that are about no file.
    let out = t.command().args(["load", "nosuch"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (first, hint) = stderr.split_once('\n').unwrap();
    assert_eq!(
        first,
        "summon: error: Source 'nosuch' not found. Use summon load to see available sources."
    );
    assert!(hint.starts_with("  = hint: looked in /"), "{hint}");
    // --concurrency 0 says what is allowed.
    let out = t
        .command()
        .args(["run", "p.yaml", "--concurrency", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("'--concurrency <N>': must be at least 1"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // --help names the provider variables.
    let help = t.command().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for var in [
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "SUMMON_MODEL",
        "OLLAMA_HOST",
    ] {
        assert!(help.contains(var), "{var} missing from --help:\n{help}");
    }
}

fn command_pipeline(command: &str) -> String {
    format!(
        "version: 1\nname: x\nsteps:\n  - id: areas\n    decompose:\n      command: {command:?}\n  - id: notes\n    fan_out:\n      over: areas\n      instructions: \"{{{{ item }}}}\"\n"
    )
}

#[test]
fn a_failing_stage_of_a_decompose_pipe_fails_its_step_with_its_stderr() {
    let out = Test::new()
        .write_raw(
            "q.yaml",
            &command_pipeline(
                "sh -c 'echo fatal: bad revision >&2; exit 128' | cut -d/ -f1 | sort -u",
            ),
        )
        .env("OPENAI_API_KEY", "sk-test")
        .env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
        .env("SUMMON_MODEL", "m")
        .args(["run", "q.yaml"])
        .code(2)
        .run();
    assert!(
        out.stderr.contains("step `areas` failed: items command")
            && out.stderr.contains("exited with code 128")
            && out.stderr.contains("fatal: bad revision"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stdout, "");
}

#[test]
fn a_fan_out_over_no_items_says_so() {
    let out = Test::new()
        .write_raw("p.yaml", &command_pipeline("true"))
        .env("OPENAI_API_KEY", "sk-test")
        .env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
        .env("SUMMON_MODEL", "m")
        .args(["run", "p.yaml"])
        .run();
    assert!(
        out.stderr.contains(
            "summon: warning: step `notes`: `areas` gave no items, so this step sent nothing"
        ),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_step_is_not_judged_by_min_success_on_the_part_that_ran() {
    use summon_mock_llm::{MockConfig, MockServer, Reply};
    let server = MockServer::start(
        MockConfig::new()
            .latency(std::time::Duration::from_millis(300))
            .rule(|req| {
                if req.last_user_text().unwrap_or_default().ends_with(" 1") {
                    Reply::status(
                        400,
                        r#"{"error":{"message":"bad item","type":"invalid_request_error"}}"#,
                    )
                } else {
                    Reply::Echo
                }
            }),
    )
    .await;
    // `cache: false`: no warm-up, so the first four tasks start together.
    let items: Vec<String> = (0..40).map(|i| format!("\"row {i}\"")).collect();
    let t = Test::new()
        .env("OPENAI_API_KEY", "sk-test")
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("SUMMON_MODEL", "m")
        .write_raw(
            "p.yaml",
            &format!(
                "version: 1\nname: x\nsteps:\n  - id: rows\n    decompose:\n      items: [{}]\n  - id: each\n    fan_out:\n      over: rows\n      instructions: \"{{{{ item }}}}\"\n    on_error: continue\n    min_success: 90%\n    cache: false\n",
                items.join(", ")
            ),
        );
    let child = t
        .command()
        .args(["run", "p.yaml", "--concurrency", "4", "--quiet"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    // The first request goes alone until the provider's model list is given, a moment later:
    // the four go out within the first answer's latency.
    while support::chats(&server).len() < 4 {
        assert!(std::time::Instant::now() < deadline, "no requests");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("step `each` failed: interrupted: 3 of the 4 tasks that ran succeeded"),
        "{stderr}"
    );
    assert!(!stderr.contains("needed"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_key_or_model_stops_the_run_before_its_first_task() {
    use summon_mock_llm::{MockConfig, MockServer};
    let server = MockServer::start(MockConfig::new()).await;
    let pipeline = "version: 1\nname: x\nsteps:\n  - id: rows\n    decompose:\n      items: [a, b, c, d, e]\n  - id: each\n    fan_out:\n      over: rows\n      instructions: \"{{ item }}\"\n";
    // No key for the provider asked for.
    let out = Test::new()
        .write_raw("p.yaml", pipeline)
        .env("SUMMON_PROVIDER", "openai")
        .env("SUMMON_MODEL", "m")
        .args(["run", "p.yaml", "--out", "out"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains(
            "step `each`: provider `openai` needs an API key, but OPENAI_API_KEY is not set"
        ),
        "{}",
        out.stderr
    );
    assert!(!out.dir.join("out/results.jsonl").exists(), "a task ran");
    // No model anywhere.
    let out = Test::new()
        .write_raw("p.yaml", pipeline)
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test")
        .args(["run", "p.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr
            .contains("step `each`: no model configured for provider `openai`; set SUMMON_MODEL"),
        "{}",
        out.stderr
    );
    // The provider lists its models: the error names them.
    assert!(
        out.stderr
            .contains("provider `openai` offers: mock-model (e.g. SUMMON_MODEL=mock-model)"),
        "{}",
        out.stderr
    );
    let chats = server
        .requests()
        .iter()
        .filter(|r| r.api == summon_mock_llm::Api::OpenAi)
        .count();
    assert_eq!(chats, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn items_are_numbered_one_way_and_junit_names_cases_by_their_id_in_item_order() {
    use summon_mock_llm::{MockConfig, MockServer, Reply};
    let server = MockServer::start(MockConfig::new().rule(|req| {
        let text = req.last_user_text().unwrap_or_default();
        if text.contains("first") {
            // Ends last.
            Reply::text("slow").delayed(std::time::Duration::from_millis(300))
        } else if text.contains("second") {
            Reply::status(
                400,
                r#"{"error":{"message":"bad row","type":"invalid_request_error"}}"#,
            )
        } else {
            Reply::Echo
        }
    }))
    .await;
    let out = Test::new()
        .env("OPENAI_API_KEY", "sk-test")
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("SUMMON_MODEL", "m")
        .write_raw("t.csv", "id,title\nT-7,first\nT-8,second\nT-9,third\n")
        .write_raw(
            "p.yaml",
            "version: 1\nname: x\nsteps:\n  - id: rows\n    decompose:\n      file: t.csv\n  - id: each\n    fan_out:\n      over: rows\n      instructions: \"{{ item.title }}\"\n    on_error: continue\n",
        )
        .args(["run", "p.yaml", "--out", "out", "--junit", "out/junit.xml"])
        .run();
    let junit = std::fs::read_to_string(out.dir.join("out/junit.xml")).unwrap();
    let names: Vec<&str> = junit
        .match_indices("<testcase name=\"")
        .map(|(i, m)| {
            let rest = &junit[i + m.len()..];
            &rest[..rest.find('"').unwrap()]
        })
        .collect();
    assert_eq!(names, ["each: T-7", "each: T-8", "each: T-9"], "{junit}");
    // The failed task's number is its index in results.jsonl.
    let lines = std::fs::read_to_string(out.dir.join("out/results.jsonl")).unwrap();
    let failed: serde_json::Value = lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["status"] == "failed")
        .unwrap();
    assert_eq!(failed["index"], 1);
    assert_eq!(failed["item"]["id"], "T-8");
}

/// A pipeline's paths, its sources and its store are the project folder's, from whichever
/// subfolder `summon run` is started: `pipelines/` and `src/` alike.
#[tokio::test(flavor = "multi_thread")]
async fn a_pipeline_runs_the_same_from_any_subfolder_of_the_project() {
    use summon_mock_llm::{MockConfig, MockServer, Reply};
    let server = MockServer::start(MockConfig::new().rule(|_| Reply::text("fine"))).await;
    let pipeline = "
version: 1
name: tickets
parameters:
  - {key: tickets, input_type: string, requirement: optional, default: pipelines/data/t.csv, description: d}
steps:
  - id: rows
    decompose:
      file: '{{ tickets }}'
  - id: docs
    decompose:
      glob: 'docs/*.md'
  - id: label
    fan_out:
      over: rows
      source: label
      parameters: {title: '{{ item.title }}'}
  - id: review
    fan_out:
      over: docs
      instructions: 'Review {{ item }}'
outputs:
  - path: out/labels.txt
    content: '{% for r in steps.label.results %}{{ r.item.title }}={{ r.output }};{% endfor %}{{ steps.docs.items | join(\",\") }}'
";
    let t = Test::new()
        .env("OPENAI_API_KEY", "sk-test")
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("SUMMON_MODEL", "m")
        .write("pipelines/p.yaml", pipeline)
        .write_raw("pipelines/data/t.csv", "id,title\n1,first\n2,second\n")
        .write(
            "recipes/label.yaml",
            "
            title: Label
            description: labels a ticket
            prompt: Label {{ title }}
            parameters:
              - {key: title, input_type: string, requirement: required, description: t}
            ",
        )
        .write("docs/a.md", "# A\n")
        .write("docs/b.md", "# B\n")
        .mkdir("src/deep")
        .mkdir("home");
    let root = t.path().to_path_buf();
    let t = t.env("HOME", &root.join("home").display().to_string());
    for (sub, path) in [
        ("pipelines", "p.yaml"),
        ("src/deep", "../../pipelines/p.yaml"),
    ] {
        let _ = std::fs::remove_dir_all(root.join("out"));
        let out = t
            .command()
            .current_dir(root.join(sub))
            .args(["run", path, "--quiet", "--out", "report"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "from {sub}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "summon: working in the project folder {} (it holds ",
                root.display()
            )),
            "from {sub}: {stderr}"
        );
        // the pipeline's paths are the project folder's, the command line's where it was typed
        assert_eq!(
            std::fs::read_to_string(root.join("out/labels.txt")).unwrap(),
            "first=fine;second=fine;docs/a.md,docs/b.md\n",
            "from {sub}"
        );
        assert!(
            root.join(sub).join("report/report.json").is_file(),
            "from {sub}"
        );
        assert!(root.join(".summon").is_dir(), "from {sub}");
        assert!(!root.join(sub).join(".summon").exists(), "from {sub}");
    }
}

/// `summon load` in a subfolder lists the project's sources, and where it looked when a name
/// is in none of them.
#[test]
fn load_finds_the_project_sources_from_a_subfolder_and_says_where_it_looked() {
    let t = Test::new()
        .write(
            "recipes/label.yaml",
            "
            title: Label
            description: labels a ticket
            prompt: Label it
            ",
        )
        .mkdir("home")
        .mkdir("pipelines/data")
        .current_dir("pipelines/data");
    let home = t.path().join("home").display().to_string();
    let recipe = t.path().join("recipes/label.yaml").display().to_string();
    let out = t.env("HOME", &home).args(["load"]).run();
    assert!(
        out.stdout
            .contains(&format!("  label  labels a ticket  ({recipe})")),
        "{}",
        out.stdout
    );
    let t = Test::new()
        .mkdir("recipes")
        .mkdir("home")
        .mkdir("pipelines/data")
        .current_dir("pipelines/data");
    let home = t.path().join("home").display().to_string();
    let looked = format!(
        "= hint: looked in {}/pipelines/data/, {}/recipes/ (",
        t.path().display(),
        t.path().display()
    );
    let out = t.env("HOME", &home).args(["load", "lable"]).code(1).run();
    assert!(out.stderr.contains(&looked), "{}", out.stderr);
}

#[test]
fn a_pipeline_file_that_is_not_there_gets_the_close_names() {
    let out = Test::new()
        .write(
            "pipelines/release-notes.yaml",
            "version: 1\nname: x\nsteps: []\n",
        )
        .args(["run", "pipelines/release-note.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr
            .contains("= hint: did you mean pipelines/release-notes.yaml?"),
        "{}",
        out.stderr
    );
}
