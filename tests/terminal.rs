//! The live display as a person sees it: `summon run` in a real terminal (a tmux pane),
//! its screen captured while the run goes and after it ends or is interrupted.
//!
//! Needs tmux (`.ci/run` installs it); without it the tests say so and do nothing.

use crate::support;
use crate::support::require;
use crate::support::wait_for;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use summon_mock_llm::{MockConfig, MockServer, Ration, Reply};
use support::Test;

const PIPELINE: &str = r#"version: 1
name: demo
steps:
  - id: rows
    decompose:
      file: rows.csv
  - id: labels
    fan_out:
      over: rows
      instructions: "Label {{ item.text }}"
  - id: summary
    synthesize:
      instructions: "Summarise {{ steps.labels.results | length }} labels"
"#;

/// A tmux session running `summon run` in `dir`; killed on drop.
struct Pane {
    name: String,
}

impl Pane {
    fn start(name: &str, dir: &Path, server: &MockServer) -> Self {
        let summon = env!("CARGO_BIN_EXE_summon");
        let command = format!(
            "cd {dir} && env -i PATH=\"$PATH\" HOME={dir} TERM=xterm-256color \
             OPENAI_BASE_URL={url} OPENAI_API_KEY=sk-test SUMMON_MODEL=mock-model \
             {summon} run p.yaml --concurrency 4 > out.txt; echo $? > exit.tmp; \
             stty -a > stty.txt; mv exit.tmp exit.txt; sleep 120",
            dir = dir.display(),
            url = server.url_openai(),
        );
        Self::shell(name, &command)
    }

    /// A tmux session running `command` in a 120×16 pane.
    fn shell(name: &str, command: &str) -> Self {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", name])
            .output();
        let status = Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-s",
                name,
                "-x",
                "120",
                "-y",
                "16",
                command,
            ])
            .status()
            .expect("tmux new-session");
        assert!(status.success());
        Self {
            name: name.to_owned(),
        }
    }

    fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.name])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &str) {
        Command::new("tmux")
            .args(["send-keys", "-t", &self.name, keys])
            .status()
            .expect("tmux send-keys");
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.name])
            .output();
    }
}

/// A run of [`PIPELINE`] (60 tasks, 4 at a time, the mock answering after 300 ms) in a tmux
/// pane named after `name`, once the mock has seen `requests` requests.
async fn started(name: &str, requests: u64) -> (MockServer, Test, Pane) {
    let server = MockServer::start(MockConfig::new().latency(Duration::from_millis(300))).await;
    let t = project();
    let pane = Pane::start(
        &format!("summon-{name}-{}", std::process::id()),
        t.path(),
        &server,
    );
    wait_for(Duration::from_secs(30), "the first answers", || {
        server.request_count() >= requests
    });
    (server, t, pane)
}

fn project() -> Test {
    let mut rows = "id,text\n".to_owned();
    for i in 0..60 {
        rows.push_str(&format!("{i},row {i}\n"));
    }
    Test::new()
        .write_raw("p.yaml", PIPELINE)
        .write_raw("rows.csv", &rows)
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs tmux (CONTRIBUTING.md); runs with `cargo test --test suite -- --ignored`"]
async fn the_bar_says_how_many_requests_a_providers_limit_holds_and_which() {
    require("tmux");
    // 20 requests a minute: the first answer's headers say so, and the rest wait for it.
    let server = MockServer::start(
        MockConfig::new()
            .latency(Duration::from_millis(100))
            .ration(Ration::openai(20, 10_000_000)),
    )
    .await;
    let t = project();
    let pane = Pane::start(
        &format!("summon-held-{}", std::process::id()),
        t.path(),
        &server,
    );
    let mut screen = String::new();
    wait_for(Duration::from_secs(60), "the bar to name the limit", || {
        screen = pane.screen();
        screen.lines().any(|l| {
            l.starts_with("labels [")
                && l.contains(" held by the provider's requests per minute (20), ")
        })
    });
    let bar = screen.lines().find(|l| l.contains(" held by ")).unwrap();
    let held: u64 = bar
        .split(" · ")
        .nth(1)
        .and_then(|m| m.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of held requests: {bar}"));
    assert!((1..=60).contains(&held), "{bar}");
    // Held, not sent into 429s.
    assert_eq!(server.ration_stats().limited, 0, "{screen}");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs tmux (CONTRIBUTING.md); runs with `cargo test --test suite -- --ignored`"]
async fn bars_show_the_run_and_are_cleared_at_the_end() {
    require("tmux");
    let (_server, t, pane) = started("bars", 12).await;
    // Let the display draw the counts it has.
    std::thread::sleep(Duration::from_millis(300));
    let running = pane.screen();
    let bar = running
        .lines()
        .find(|l| l.starts_with("labels ["))
        .unwrap_or_else(|| panic!("no bar for `labels`:\n{running}"));
    for part in [
        "/60 ",
        " in flight, ",
        " failed, ",
        " tokens",
        " · ",
        "ETA ",
    ] {
        assert!(bar.contains(part), "`{part}` missing from the bar: {bar}");
    }
    assert!(
        running.lines().any(|l| l.trim() == "summary waiting"),
        "{running}"
    );
    wait_for(Duration::from_secs(60), "the run to end", || {
        t.path().join("exit.txt").exists()
    });
    let end = pane.screen();
    assert_eq!(
        std::fs::read_to_string(t.path().join("exit.txt"))
            .unwrap()
            .trim(),
        "0",
        "{end}"
    );
    assert!(!end.contains("=>"), "a bar was left on the screen:\n{end}");
    assert_eq!(
        end.matches("[summon] labels: 60/60 done, 0 failed").count(),
        1,
        "{end}"
    );
    assert_eq!(
        end.matches("[summon] summary: 1/1 done").count(),
        1,
        "{end}"
    );
    println!("screen while running:\n{running}\nscreen at the end:\n{end}");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs tmux (CONTRIBUTING.md); runs with `cargo test --test suite -- --ignored`"]
async fn ctrl_c_leaves_one_display_not_two() {
    require("tmux");
    let (_server, t, pane) = started("ctrlc", 8).await;
    pane.keys("C-c");
    wait_for(Duration::from_secs(60), "the run to end", || {
        t.path().join("exit.txt").exists()
    });
    let end = pane.screen();
    assert_eq!(
        std::fs::read_to_string(t.path().join("exit.txt"))
            .unwrap()
            .trim(),
        "130",
        "{end}"
    );
    assert_eq!(
        end.matches("summon: interrupted: finishing the tasks in flight")
            .count(),
        1,
        "{end}"
    );
    // No bar is left on the screen (the terminal's `^C` echo is off while they are drawn, so
    // it cannot shift them), and each step's final line is there once.
    assert!(
        !end.contains("labels ["),
        "a bar was left on the screen:\n{end}"
    );
    assert!(!end.contains("summary waiting"), "{end}");
    assert_eq!(end.matches("[summon] labels: ").count(), 1, "{end}");
    assert!(end.contains("--resume"), "{end}");
    // ... and the echo is back when summon has ended
    assert_eq!(
        std::fs::read_to_string(t.path().join("stty.txt"))
            .unwrap()
            .split_whitespace()
            .filter(|flag| flag.ends_with("echoctl"))
            .collect::<Vec<_>>(),
        ["echoctl"],
        "{end}"
    );
}

/// The PID of the `summon run` started in `dir`.
fn run_pid(dir: &Path) -> Option<u32> {
    let dir = dir.canonicalize().ok()?;
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cwd = std::fs::read_link(entry.path().join("cwd")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let is_run = args.len() > 2
                && args[0].ends_with(b"summon")
                && args[1] == b"run"
                && args[2] == b"p.yaml";
            (is_run && cwd == dir).then_some(pid)
        })
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs tmux (CONTRIBUTING.md); runs with `cargo test --test suite -- --ignored`"]
async fn sigterm_stops_the_display_before_its_exit_line() {
    require("tmux");
    let (_server, t, pane) = started("term", 8).await;
    let pid = run_pid(t.path()).expect("the run's pid");
    let sent = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
    wait_for(Duration::from_secs(60), "the run to end", || {
        t.path().join("exit.txt").exists()
    });
    let end = pane.screen();
    assert_eq!(
        std::fs::read_to_string(t.path().join("exit.txt"))
            .unwrap()
            .trim(),
        "143",
        "{end}"
    );
    assert_eq!(
        end.matches("summon: terminated (SIGTERM)").count(),
        1,
        "{end}"
    );
    // The bars were cleared and each step's last line printed once, above the exit line.
    assert!(!end.contains("labels ["), "{end}");
    assert!(!end.contains("in flight"), "{end}");
    let last = end.find("[summon] labels: ").expect("the step's last line");
    assert!(last < end.find("summon: terminated").unwrap(), "{end}");
    assert_eq!(end.matches("[summon] labels: ").count(), 1, "{end}");
}

/// `summon delegate` on a terminal starts with goose's header and the source it runs;
/// written to a pipe, it does not.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs tmux (CONTRIBUTING.md); runs with `cargo test --test suite -- --ignored`"]
async fn delegate_shows_gooses_header_on_a_terminal() {
    require("tmux");
    let server =
        MockServer::start(MockConfig::new().default_reply(Reply::text("notes drafted"))).await;
    let t = Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test")
        .env("SUMMON_MODEL", "mock-model")
        .write_raw(
            ".agents/recipes/release-notes.yaml",
            "title: Release Notes\ndescription: Draft release notes\nprompt: Draft release notes.\n",
        );
    let command = format!(
        "cd {dir} && env -i PATH=\"$PATH\" HOME={dir} TERM=xterm-256color NO_COLOR=1 \
         OPENAI_BASE_URL={url} OPENAI_API_KEY=sk-test SUMMON_MODEL=mock-model \
         {summon} delegate --source release-notes; echo $? > exit.txt; sleep 120",
        dir = t.path().display(),
        url = server.url_openai(),
        summon = env!("CARGO_BIN_EXE_summon"),
    );
    let pane = Pane::shell(&format!("summon-header-{}", std::process::id()), &command);
    wait_for(Duration::from_secs(30), "the delegation to end", || {
        t.path().join("exit.txt").exists()
    });
    let screen = pane.screen();
    let header = format!(
        "─── delegate | summon {}\nsource: release-notes\n",
        "─".repeat(39)
    );
    assert!(screen.contains(&header), "{screen}");
    assert!(screen.contains("notes drafted"), "{screen}");
    let piped = t
        .command()
        .args(["delegate", "--source", "release-notes"])
        .output()
        .unwrap();
    assert!(piped.status.success(), "{piped:?}");
    let said = String::from_utf8_lossy(&piped.stderr);
    assert!(!said.contains("─── delegate"), "{said}");
}
