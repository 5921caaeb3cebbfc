//! `summon new agent|recipe|pipeline NAME`: the files written, that they validate and load,
//! the messages, and every refusal (existing file, clash, bad name, bad flags, invalid text).

use crate::support;

use std::path::{Path, PathBuf};

use support::Test;

/// What one run printed.
struct Output {
    stdout: String,
    stderr: String,
    code: i32,
}

impl Output {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

/// A project several commands run in, one after the other.
struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn write(&self, rel: &str, text: &str) {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, support::unindent(text)).expect("write");
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    /// Runs summon here with a clean environment (no colour: stdout is a pipe).
    fn summon(&self, args: &[&str]) -> Output {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_summon"))
            .args(args)
            .current_dir(self.dir.path())
            .env_clear()
            .env("HOME", self.dir.path())
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .output()
            .expect("run summon");
        Output {
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            code: output.status.code().unwrap_or(-1),
        }
    }

    /// Runs summon and expects exit code `code`.
    #[track_caller]
    fn run(&self, args: &[&str], code: i32) -> Output {
        let out = self.summon(args);
        assert_eq!(
            out.code, code,
            "{args:?}\n--- stdout\n{}\n--- stderr\n{}",
            out.stdout, out.stderr
        );
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
        out
    }

    /// `summon validate PATH` finds nothing at all to say.
    #[track_caller]
    fn validates_cleanly(&self, rel: &str) {
        let out = self.run(&["validate", rel], 0);
        assert_eq!(
            out.stderr,
            "summon: checked 1 file(s): 0 error(s), 0 warning(s)\n",
            "{rel}:\n{}",
            self.read(rel)
        );
    }

    /// Every file under the project, relative, sorted.
    fn files(&self) -> Vec<String> {
        fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, root, out);
                } else {
                    let rel = path.strip_prefix(root).expect("inside");
                    out.push(rel.to_string_lossy().into_owned());
                }
            }
        }
        let mut out = Vec::new();
        walk(self.dir.path(), self.dir.path(), &mut out);
        out.sort();
        out
    }
}

#[test]
fn new_agent_writes_a_valid_role_that_loads_at_once() {
    let p = Project::new();
    let out = p.run(
        &[
            "new",
            "agent",
            "reviewer",
            "--description",
            "Reviews diffs: style and bugs",
            "--tools",
            "read_file,search,Bash(git log*)",
            "--model",
            "sonnet",
        ],
        0,
    );
    assert!(
        out.stdout.starts_with(
            "Created folder .agents/\nCreated folder .agents/agents/\n\
             Created agent .agents/agents/reviewer.md\n"
        ),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("Usable at once by new commands and runs")
            && out.stdout.contains("keeps the catalog it started with"),
        "{}",
        out.stdout
    );
    let text = p.read(".agents/agents/reviewer.md");
    assert!(text.starts_with("---\n"), "{text}");
    for line in [
        "\nname: reviewer\n",
        "\ndescription: \"Reviews diffs: style and bugs\"\n",
        "\ntools: read_file, search, Bash(git log*)\n",
        "\nmodel: sonnet\n",
        "\n---\n\nYou are the `reviewer` subagent",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    p.validates_cleanly(".agents/agents/reviewer.md");
    let loaded = p.run(&["load", "reviewer"], 0);
    assert!(
        loaded.stdout.starts_with("# Loaded: reviewer (agent)\n"),
        "{}",
        loaded.stdout
    );
    let listed = p.run(&["load", "--json"], 0).json();
    assert_eq!(
        listed["sources"][0]["description"],
        "Reviews diffs: style and bugs"
    );
}

#[test]
fn agent_without_tools_is_not_narrowed_and_empty_tools_means_none() {
    let p = Project::new();
    p.run(&["new", "agent", "free", "--description", "d"], 0);
    let text = p.read(".agents/agents/free.md");
    assert!(!text.contains("\ntools:"), "{text}");
    assert!(text.contains("\nmodel: inherit\n"), "{text}");
    p.validates_cleanly(".agents/agents/free.md");

    p.run(
        &["new", "agent", "none", "--description", "d", "--tools"],
        0,
    );
    assert!(p.read(".agents/agents/none.md").contains("\ntools: []\n"));
    p.validates_cleanly(".agents/agents/none.md");
}

#[test]
fn agent_role_text_is_the_body() {
    let p = Project::new();
    p.run(
        &[
            "new",
            "agent",
            "tester",
            "--description",
            "d",
            "--role",
            "Write tests.\n\n---\n\nNever skip one.",
        ],
        0,
    );
    let text = p.read(".agents/agents/tester.md");
    assert!(
        text.ends_with("\n---\n\nWrite tests.\n\n---\n\nNever skip one.\n"),
        "{text}"
    );
    let loaded = p.run(&["load", "tester"], 0);
    assert!(
        loaded.stdout.contains("Never skip one."),
        "{}",
        loaded.stdout
    );
}

#[test]
fn new_recipe_declares_and_uses_its_parameters() {
    let p = Project::new();
    let out = p.run(
        &[
            "new",
            "recipe",
            "review",
            "--description",
            "Review a path",
            "--param",
            "path",
            "--param",
            "depth:number=2",
            "--param",
            "level:select=low,high",
            "--model",
            "gpt-4o-mini",
        ],
        0,
    );
    assert!(
        out.stdout
            .starts_with("Created folder recipes/\nCreated recipe recipes/review.yaml\n"),
        "{}",
        out.stdout
    );
    let text = p.read("recipes/review.yaml");
    for line in [
        "\ntitle: Review\n",
        "\ndescription: Review a path\n",
        "\n  - path: {{ path }}\n",
        "\n  - key: depth\n    input_type: number\n    requirement: optional\n    default: \"2\"\n",
        "\n  - key: level\n    input_type: select\n    requirement: required\n    options:\n      - low\n      - high\n",
        "\nsettings:\n  goose_model: gpt-4o-mini\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    p.validates_cleanly("recipes/review.yaml");
    let explained = p.run(&["explain", "--source", "review"], 0);
    assert!(
        explained.stdout.contains("Missing: path, level"),
        "{}",
        explained.stdout
    );
    let rendered = p.run(
        &[
            "render",
            "--source",
            "review",
            "--param",
            "path=src/: the core",
            "--param",
            "level=low",
        ],
        0,
    );
    assert!(
        rendered.stdout.contains("- path: \"src/: the core\"")
            || rendered.stdout.contains("- path: src/: the core"),
        "{}",
        rendered.stdout
    );
}

#[test]
fn recipe_text_that_yaml_would_misread_is_quoted() {
    let p = Project::new();
    p.run(
        &[
            "new",
            "recipe",
            "tricky",
            "--title",
            "yes",
            "--description",
            "#1: [draft] {x}",
            "--instructions",
            "First line: with colon\n  indented line\n\n# not a comment",
            "--prompt=- starts like a list item",
        ],
        0,
    );
    p.validates_cleanly("recipes/tricky.yaml");
    let json = p.run(&["load", "tricky", "--json"], 0).json();
    assert_eq!(json["description"], "#1: [draft] {x}");
    let rendered = p.run(&["render", "--source", "tricky", "--json"], 0).json();
    let text = rendered.to_string();
    assert!(
        text.contains("First line: with colon\\n  indented line\\n\\n# not a comment"),
        "{text}"
    );
    assert!(text.contains("- starts like a list item"), "{text}");
    assert!(text.contains("\"title\":\"yes\""), "{text}");
}

#[test]
fn new_pipeline_validates_and_fills_the_sources_required_parameters() {
    let p = Project::new();
    p.write(
        "recipes/summarize.yaml",
        "
        title: Summarize
        description: Summarize one thing
        prompt: Summarize {{ topic }} at {{ level }} detail.
        parameters:
          - key: topic
            input_type: string
            requirement: required
          - key: level
            input_type: select
            requirement: required
            options: [short, long]
        ",
    );
    let out = p.run(
        &[
            "new",
            "pipeline",
            "digest",
            "--description",
            "One digest of everything",
            "--source",
            "summarize",
            "--param",
            "since:string=v1.0",
        ],
        0,
    );
    assert!(
        out.stdout.starts_with(
            "Created folder pipelines/\nCreated pipeline pipelines/digest.yaml\n\
             Run it with `summon run pipelines/digest.yaml`"
        ),
        "{}",
        out.stdout
    );
    let text = p.read("pipelines/digest.yaml");
    for line in [
        "\nversion: 1\nname: digest\n",
        "\n      source: summarize\n",
        "\n        topic: \"{{ item }}\"\n        level: short\n",
        "\n        since: {{ since }}\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    p.validates_cleanly("pipelines/digest.yaml");
}

#[test]
fn new_pipeline_without_source_is_ad_hoc_and_valid() {
    let p = Project::new();
    p.run(&["new", "pipeline", "plain", "--description", "d"], 0);
    let text = p.read("pipelines/plain.yaml");
    assert!(!text.contains("source:"), "{text}");
    p.validates_cleanly("pipelines/plain.yaml");
}

#[test]
fn pipeline_source_must_exist() {
    let p = Project::new();
    p.write(
        "recipes/summarize.yaml",
        "title: t\ndescription: d\ninstructions: i\n",
    );
    let out = p.run(&["new", "pipeline", "x", "--source", "sumarize"], 1);
    assert!(
        out.stderr
            .contains("Source 'sumarize' not found. Did you mean: summarize?"),
        "{}",
        out.stderr
    );
    assert!(!p.path("pipelines").exists());
}

#[test]
fn an_existing_file_is_not_overwritten_without_force() {
    let p = Project::new();
    p.run(&["new", "recipe", "notes", "--description", "Old"], 0);
    let before = p.read("recipes/notes.yaml");
    let out = p.run(&["new", "recipe", "notes", "--description", "New"], 1);
    assert_eq!(out.stdout, "");
    assert!(
        out.stderr
            .contains("error: recipes/notes.yaml already exists; not overwritten"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("pass --force to replace it"),
        "{}",
        out.stderr
    );
    assert_eq!(p.read("recipes/notes.yaml"), before);
}

#[test]
fn force_replaces_and_shows_the_changed_lines() {
    let p = Project::new();
    p.run(
        &[
            "new",
            "agent",
            "helper",
            "--description",
            "Old words",
            "--model",
            "haiku",
        ],
        0,
    );
    let out = p.run(
        &[
            "new",
            "agent",
            "helper",
            "--description",
            "New words",
            "--model",
            "haiku",
            "--force",
        ],
        0,
    );
    assert!(
        out.stdout
            .starts_with("Replaced agent .agents/agents/helper.md:\n@@ -"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(
            "\n-description: Old words\n+description: New words\n1 line removed, 1 line added.\n"
        ),
        "{}",
        out.stdout
    );
    assert!(
        p.read(".agents/agents/helper.md")
            .contains("\ndescription: New words\n")
    );
    p.validates_cleanly(".agents/agents/helper.md");

    let again = p.run(
        &[
            "new",
            "agent",
            "helper",
            "--description",
            "New words",
            "--model",
            "haiku",
            "--force",
        ],
        0,
    );
    assert!(
        again
            .stdout
            .starts_with(".agents/agents/helper.md already holds this agent; nothing to change.\n"),
        "{}",
        again.stdout
    );
}

#[test]
fn force_diff_is_coloured_only_when_asked() {
    let p = Project::new();
    p.run(&["new", "recipe", "r", "--description", "a"], 0);
    let plain = p.run(&["new", "recipe", "r", "--description", "b", "--force"], 0);
    assert!(!plain.stdout.contains('\x1b'), "{:?}", plain.stdout);
    let coloured = p.run(
        &[
            "--color",
            "always",
            "new",
            "recipe",
            "r",
            "--description",
            "c",
            "--force",
        ],
        0,
    );
    assert!(
        coloured.stdout.contains("\x1b[31m-description: b\x1b[0m")
            && coloured.stdout.contains("\x1b[32m+description: c\x1b[0m"),
        "{:?}",
        coloured.stdout
    );
}

#[test]
fn a_name_another_source_has_is_refused_naming_its_file() {
    let p = Project::new();
    p.write(
        ".claude/agents/code-review.md",
        "
        ---
        name: review
        description: Reviews code
        ---
        Review it.
        ",
    );
    let out = p.run(&["new", "recipe", "review"], 1);
    assert!(
        out.stderr.contains(
            "error: `review` is already the name of the agent in .claude/agents/code-review.md"
        ),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("choose another name"), "{}", out.stderr);
    assert!(!p.path("recipes").exists());

    // Agents clash with recipes too, and a global source counts.
    p.write(
        ".config/summon/recipes/release.yaml",
        "title: t\ndescription: d\ninstructions: i\n",
    );
    let out = p.run(&["new", "agent", "release"], 1);
    assert!(
        out.stderr
            .contains("`release` is already the name of the recipe in")
            && out.stderr.contains(".config/summon/recipes/release.yaml"),
        "{}",
        out.stderr
    );
    assert!(!p.path(".agents").exists());
}

#[test]
fn a_file_of_the_same_name_with_another_extension_clashes() {
    let p = Project::new();
    p.write(
        "recipes/notes.yml",
        "title: t\ndescription: d\ninstructions: i\n",
    );
    let out = p.run(&["new", "recipe", "notes", "--force"], 1);
    assert!(
        out.stderr
            .contains("error: recipes/notes.yml already defines recipe `notes`"),
        "{}",
        out.stderr
    );
    assert!(!p.path("recipes/notes.yaml").exists());
}

#[test]
fn bad_names_are_refused_and_nothing_is_written() {
    let cases = [
        ("../escape", "contains a path separator"),
        ("notes.yaml", "the extension is added for you"),
        ("two words", "contains a space"),
        ("-flaglike", "must start with a letter or a digit"),
        ("20260219_1", "looks like a background task id"),
    ];
    for (name, why) in cases {
        let p = Project::new();
        let out = p.run(&["new", "recipe", "--", name], 1);
        assert!(out.stderr.contains(why), "{name}: {}", out.stderr);
        assert!(out.stderr.contains("error:"), "{}", out.stderr);
        assert!(p.files().is_empty(), "{name}: {:?}", p.files());
    }
}

#[test]
fn tools_must_exist_and_a_role_cannot_delegate() {
    let p = Project::new();
    let out = p.run(&["new", "agent", "x", "--tools", "read_file,serch"], 1);
    assert!(
        out.stderr
            .contains("--tools: summon has no tool `serch`. Did you mean: search?"),
        "{}",
        out.stderr
    );
    let out = p.run(&["new", "agent", "x", "--tools", "Read,Task"], 1);
    assert!(
        out.stderr.contains("--tools: `Task` starts subagents"),
        "{}",
        out.stderr
    );
    // Claude Code names and extension tools are fine.
    p.run(
        &[
            "new",
            "agent",
            "x",
            "--description",
            "d",
            "--tools",
            "Read, Grep,mcp__github__search",
        ],
        0,
    );
    p.validates_cleanly(".agents/agents/x.md");
}

#[test]
fn bad_params_name_the_flag() {
    let cases = [
        ("x:text", "--param `x:text`: unknown type `text`"),
        (
            "my-key",
            "--param `my-key`: `my-key` cannot be used in a template",
        ),
        (
            "n:number=lots",
            "--param `n:number=lots`: the default `lots` is not a number",
        ),
        ("level:select", "a select lists its options after `=`"),
    ];
    for (spec, message) in cases {
        let p = Project::new();
        let out = p.run(&["new", "recipe", "r", "--param", spec], 1);
        assert!(out.stderr.contains(message), "{spec}: {}", out.stderr);
        assert!(p.files().is_empty());
    }
}

#[test]
fn a_definition_that_would_not_validate_is_not_written() {
    let p = Project::new();
    let out = p.run(
        &[
            "new",
            "recipe",
            "broken",
            "--prompt",
            "Use {{ undeclared }}.",
        ],
        1,
    );
    assert!(
        out.stderr.contains(
            "recipes/broken.yaml:14:16: error: template variable `undeclared` is used but not declared"
        ),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(
            "recipes/broken.yaml not written: the recipe it would hold does not validate"
        ),
        "{}",
        out.stderr
    );
    assert!(p.files().is_empty(), "{:?}", p.files());
}

#[test]
fn warnings_are_shown_and_the_file_is_written() {
    let p = Project::new();
    let out = p.run(
        &[
            "new",
            "recipe",
            "r",
            "--param",
            "unused",
            "--prompt",
            "No parameter here.",
        ],
        0,
    );
    assert!(
        out.stderr
            .contains("warning: parameter `unused` is declared but never used in a template"),
        "{}",
        out.stderr
    );
    assert!(p.path("recipes/r.yaml").is_file());
}

#[test]
fn json_output_describes_what_was_done() {
    let p = Project::new();
    let json = p
        .run(&["new", "recipe", "r", "--description", "a", "--json"], 0)
        .json();
    assert_eq!(json["kind"], "recipe");
    assert_eq!(json["name"], "r");
    assert_eq!(json["action"], "created");
    assert!(json["path"].as_str().unwrap().ends_with("recipes/r.yaml"));
    assert_eq!(json["created_dirs"].as_array().unwrap().len(), 1);
    assert_eq!(json["changes"], serde_json::json!([]));
    assert_eq!(json["diagnostics"], serde_json::json!([]));

    let json = p
        .run(
            &[
                "new",
                "recipe",
                "r",
                "--description",
                "b",
                "--json",
                "--force",
            ],
            0,
        )
        .json();
    assert_eq!(json["action"], "replaced");
    let changes = json["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 2);
    assert_eq!(changes[0]["change"], "removed");
    assert_eq!(changes[0]["text"], "description: a");
    assert_eq!(changes[1]["change"], "added");
    assert_eq!(changes[1]["text"], "description: b");
    assert_eq!(changes[0]["line"], changes[1]["line"]);
}

#[test]
fn the_new_command_is_documented_in_help() {
    let out = Test::new().args(["new", "recipe", "--help"]).run();
    for flag in ["--description", "--param", "--force", "--model", "--prompt"] {
        assert!(out.stdout.contains(flag), "{flag}: {}", out.stdout);
    }
}
