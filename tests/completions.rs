//! `summon completions SHELL` and `summon man`: scripts the shells accept, completion of
//! commands, source names and task ids through them; colour and a closed pipe.

use crate::support;
use crate::support::require;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

const RECIPE: &str = "title: t\ndescription: Writes the notes\ninstructions: i\n";

/// A project with two recipes and an agent whose names start alike.
fn project() -> Test {
    Test::new()
        .write("recipes/release-notes.yaml", RECIPE)
        .write("recipes/review.yaml", RECIPE)
        .write(
            ".agents/agents/reader.md",
            "---\nname: reader\ndescription: Reads\n---\nRead.\n",
        )
}

/// Runs `shell -c script` in the project; stdout, checked for success.
#[track_caller]
fn shell(test: &Test, shell: &str, script: &str) -> String {
    let output = Command::new(shell)
        .args(["-c", script])
        .current_dir(test.path())
        .env_clear()
        .env("HOME", test.path())
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .expect("run the shell");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{shell} failed\n--- stdout\n{stdout}\n--- stderr\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Writes the completion script of `name` into the project and has `name -n` check it.
#[track_caller]
fn script_is_accepted(name: &str) -> Test {
    let out = Test::new().args(["completions", name]).run();
    assert!(out.stdout.contains("_SUMMON_COMPLETE"), "{}", out.stdout);
    let test = project().write_raw(&format!("summon.{name}"), &out.stdout);
    let checked = Command::new(name)
        .args(["-n", &format!("summon.{name}")])
        .current_dir(test.path())
        .output()
        .expect("run the shell");
    assert!(
        checked.status.success(),
        "{name} -n rejects the script:\n{}\n{}",
        String::from_utf8_lossy(&checked.stderr),
        out.stdout
    );
    test
}

/// The candidates summon offers for `words`, the last being completed, as bash asks.
fn offered(test: Test, words: &[&str]) -> Vec<String> {
    let index = (words.len() - 1).to_string();
    let out = test
        .env("_SUMMON_COMPLETE", "bash")
        .env("_CLAP_COMPLETE_INDEX", &index)
        .args(["--"])
        .args(words.iter().copied())
        .stderr("")
        .run();
    out.stdout
        .split(['\n', '\u{b}'])
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn bash_accepts_the_script_and_completes_through_it() {
    let test = script_is_accepted("bash");
    let completed = shell(
        &test,
        "bash",
        r#"source summon.bash
complete -p summon
COMP_WORDS=(summon delegate --source re); COMP_CWORD=3; COMP_TYPE=9
_clap_complete_summon summon re --source
printf 'source:%s\n' "${COMPREPLY[@]}"
COMP_WORDS=(summon ne); COMP_CWORD=1
_clap_complete_summon summon ne summon
printf 'command:%s\n' "${COMPREPLY[@]}"
"#,
    );
    assert!(
        completed.contains("-F _clap_complete_summon"),
        "{completed}"
    );
    let lines: Vec<&str> = completed.lines().skip(1).collect();
    assert_eq!(
        lines,
        [
            "source:release-notes",
            "source:review",
            "source:reader",
            "command:new"
        ],
        "{completed}"
    );
}

#[test]
#[ignore = "needs zsh (CONTRIBUTING.md); runs with `cargo test --test suite -- --ignored`"]
fn zsh_accepts_the_script() {
    require("zsh");
    let test = script_is_accepted("zsh");
    let loaded = shell(
        &test,
        "zsh",
        "autoload -U compinit && compinit -u -D && source summon.zsh && whence -w _clap_dynamic_completer_summon",
    );
    assert!(loaded.contains("function"), "{loaded}");
}

#[test]
#[ignore = "needs fish (CONTRIBUTING.md); runs with `cargo test --test suite -- --ignored`"]
fn fish_accepts_the_script_and_completes_through_it() {
    require("fish");
    let test = script_is_accepted("fish");
    let completed = shell(
        &test,
        "fish",
        "source summon.fish; complete -C 'summon load rev'",
    );
    assert_eq!(completed, "review\trecipe: Writes the notes\n");
}

#[test]
fn commands_and_flags_complete() {
    let commands = offered(Test::new(), &["summon", "d"]);
    assert_eq!(commands, ["delegate", "doctor"]);
    let kinds = offered(Test::new(), &["summon", "new", ""]);
    for kind in ["agent", "recipe", "pipeline"] {
        assert!(kinds.contains(&kind.to_owned()), "{kinds:?}");
    }
    let flags = offered(Test::new(), &["summon", "doctor", "--o"]);
    assert_eq!(flags, ["--offline"]);
    let shells = offered(Test::new(), &["summon", "completions", ""]);
    assert_eq!(shells[..5], ["bash", "zsh", "fish", "elvish", "powershell"]);
}

#[test]
fn source_names_complete_after_source_and_load() {
    for words in [
        &["summon", "delegate", "--source", "re"][..],
        &["summon", "render", "--source", "re"],
        &["summon", "explain", "--source", "re"],
        &["summon", "new", "pipeline", "p", "--source", "re"],
        &["summon", "load", "re"],
    ] {
        assert_eq!(
            offered(project(), words),
            ["release-notes", "review", "reader"],
            "{words:?}"
        );
    }
    assert_eq!(
        offered(project(), &["summon", "delegate", "--source", "rel"]),
        ["release-notes"]
    );
}

#[test]
fn completing_in_a_project_without_a_store_creates_none() {
    let test = project();
    let dir = test.path().to_path_buf();
    offered(test, &["summon", "load", ""]);
    assert!(!dir.join(".summon").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn task_ids_complete_after_load() {
    let server = MockServer::start(MockConfig::new().reply(Reply::text("done"))).await;
    let test = project()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789")
        .env("SUMMON_MODEL", "mock-model");
    let output = test
        .command()
        .args([
            "delegate",
            "--async",
            "--json",
            "--instructions",
            "say done",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run summon");
    assert!(output.status.success(), "{output:?}");
    let started: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    let id = started["task_id"].as_str().expect("task id").to_owned();
    let offered = offered(test, &["summon", "load", &id[..4]]);
    assert_eq!(offered, [id]);
}

#[test]
fn an_unknown_shell_is_refused() {
    let out = Test::new().args(["completions", "tcsh"]).code(1).run();
    assert!(
        out.stderr.contains("invalid value 'tcsh'"),
        "{}",
        out.stderr
    );
}

#[test]
fn man_page_is_generated_from_the_commands() {
    let out = Test::new().args(["man"]).run();
    assert!(out.stdout.contains(".TH summon 1"), "{}", out.stdout);
    for command in ["load", "delegate", "new", "doctor", "completions"] {
        assert!(
            out.stdout.contains(&format!("summon\\-{command}(1)")),
            "{command}: {}",
            out.stdout
        );
    }
    assert!(!out.stdout.contains("__worker"), "{}", out.stdout);
}

#[test]
fn man_out_writes_one_page_per_command() {
    let out = Test::new().args(["man", "--out", "man"]).run();
    let listed: Vec<&str> = out.stdout.lines().collect();
    for page in [
        "man/summon.1",
        "man/summon-load.1",
        "man/summon-new-agent.1",
        "man/summon-doctor.1",
    ] {
        assert!(listed.contains(&page), "{page}: {listed:?}");
        let text = std::fs::read_to_string(out.dir.join(page)).expect(page);
        assert!(text.contains(".SH NAME"), "{page}");
    }
    assert!(!out.dir.join("man/summon-__worker.1").exists());
    let agent = std::fs::read_to_string(out.dir.join("man/summon-new-agent.1")).unwrap();
    assert!(agent.contains("\\-\\-tools"), "{agent}");
}

/// Starts summon with stdout piped, reads one line, closes the pipe, and waits.
fn read_one_line_then_close(test: &Test, args: &[&str]) -> (Option<i32>, String, String) {
    let mut child = test
        .command()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn summon");
    let mut first = String::new();
    {
        let mut reader = BufReader::new(child.stdout.take().expect("stdout"));
        reader.read_line(&mut first).expect("read a line");
        // Dropping the reader closes the pipe while summon is still writing.
    }
    let output = child.wait_with_output().expect("wait");
    (
        output.status.code(),
        first,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_closed_pipe_ends_quietly() {
    // Far more output than a pipe buffer holds.
    let mut test = Test::new();
    let description = "a description long enough to fill the pipe quickly ".repeat(3);
    for i in 0..2000 {
        test = test.write_raw(
            &format!("recipes/recipe-{i:04}.yaml"),
            &format!("title: t\ndescription: {description}{i}\ninstructions: i\n"),
        );
    }
    for args in [&["load"][..], &["load", "--json"], &["man"]] {
        let (code, first, stderr) = read_one_line_then_close(&test, args);
        assert!(!first.is_empty(), "{args:?}");
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
        assert_eq!(stderr, "", "{args:?}");
    }
}

#[test]
fn a_closed_stderr_ends_quietly_too() {
    // `summon validate 2>&1 | head -1` with many problems.
    let mut test = Test::new();
    for i in 0..1500 {
        test = test.write_raw(
            &format!("recipes/r{i}.yaml"),
            &format!("title: t\ndescription: d\ninstructions: hello {{{{ who{i} }}}}\n"),
        );
    }
    let mut child = test
        .command()
        .args(["validate"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn summon");
    let mut first = String::new();
    {
        let mut reader = BufReader::new(child.stderr.take().expect("stderr"));
        reader.read_line(&mut first).expect("read a line");
    }
    let status = child.wait().expect("wait");
    assert!(first.contains("error: template variable"), "{first}");
    // The problems were found (exit 1); no panic (exit 101) on the closed stream.
    assert_eq!(status.code(), Some(1));
}

#[test]
fn colour_follows_the_flag_no_color_and_the_terminal() {
    let bad = "title: t\ndescription: d\ninstructions: '{{ x }}'\n";
    let piped = Test::new()
        .write_raw("r.yaml", bad)
        .args(["validate", "r.yaml"])
        .code(1)
        .run();
    assert!(!piped.stderr.contains('\x1b'), "{:?}", piped.stderr);
    let forced = Test::new()
        .write_raw("r.yaml", bad)
        .args(["--color", "always", "validate", "r.yaml"])
        .code(1)
        .run();
    assert!(
        forced.stderr.contains("\x1b[1;31merror"),
        "{:?}",
        forced.stderr
    );

    // On a terminal (through `script`), colour is on unless NO_COLOR or --color never.
    require("script");
    let on_terminal = |extra_env: &str, flags: &str| {
        let test = Test::new().write_raw("r.yaml", bad);
        let bin = env!("CARGO_BIN_EXE_summon");
        shell(
            &test,
            "bash",
            &format!("{extra_env} script -qec '{bin} {flags} validate r.yaml' /dev/null || true"),
        )
    };
    assert!(on_terminal("", "").contains("\x1b[1;31merror"));
    assert!(!on_terminal("NO_COLOR=1", "").contains('\x1b'));
    assert!(!on_terminal("", "--color never").contains('\x1b'));
    assert!(on_terminal("NO_COLOR=1", "--color always").contains("\x1b[1;31merror"));
    // clap's own usage errors follow the flag too (on a terminal that has colours).
    let usage = |flags: &str| {
        let test = Test::new();
        let bin = env!("CARGO_BIN_EXE_summon");
        shell(
            &test,
            "bash",
            &format!("TERM=xterm script -qec '{bin} {flags} --no-such-flag' /dev/null || true"),
        )
    };
    assert!(usage("").contains('\x1b'));
    assert!(!usage("--color never").contains('\x1b'));
    assert!(!usage("--color=never").contains('\x1b'));
}

#[test]
fn bash_completion_quotes_a_hostile_source_name() {
    let name = "rev$(touch pwned);touch${IFS}pwned2 `touch pwned3`";
    let test = script_is_accepted("bash").write(
        &format!(".agents/agents/{name}.md"),
        &format!("---\nname: '{name}'\ndescription: Reads\n---\nRead.\n"),
    );
    // Each candidate is inserted into the command line as it is, then the line runs.
    let completed = shell(
        &test,
        "bash",
        r#"source summon.bash
COMP_WORDS=(summon delegate --source rev); COMP_CWORD=3; COMP_TYPE=9
_clap_complete_summon summon rev --source
for candidate in "${COMPREPLY[@]}"; do eval "printf 'arg:%s\n' $candidate"; done
"#,
    );
    for made in ["pwned", "pwned2", "pwned3"] {
        assert!(!test.path().join(made).exists(), "{made}: {completed}");
    }
    let args: Vec<&str> = completed.lines().collect();
    assert_eq!(args, ["arg:review", &format!("arg:{name}")], "{completed}");
}
