//! Shared test helpers: the [`Test`] builder that runs the real binary in a temp project.

pub(crate) mod mcp;
pub(crate) mod test;

pub(crate) use test::{Output, Test};

/// Removes common leading indentation, so inputs and expectations can be written indented.
pub(crate) fn unindent(text: &str) -> String {
    let lines: Vec<&str> = text.strip_prefix('\n').unwrap_or(text).lines().collect();
    let indent = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let mut out: String = lines
        .iter()
        .map(|l| {
            if l.len() >= indent {
                &l[indent..]
            } else {
                l.trim_start()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    out.push('\n');
    out
}

/// [`unindent`] for expected output: exactly one trailing newline, whatever the indentation
/// of the closing quote.
pub(crate) fn expected(text: &str) -> String {
    let mut out = unindent(text).trim_end_matches('\n').to_owned();
    out.push('\n');
    out
}

/// Cargo's target directory (`CARGO_TARGET_DIR` when set, else `target/` of the checkout):
/// where the programs the tests install from registries are kept, never elsewhere in the
/// checkout.
pub(crate) fn target_dir() -> std::path::PathBuf {
    let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).to_path_buf()
}

/// The directory of real third-party files: `SUMMON_CORPUS` when set, else
/// `../shared/corpus` beside the checkout, when present.
pub(crate) fn corpus_dir() -> Option<std::path::PathBuf> {
    let dir = match std::env::var_os("SUMMON_CORPUS") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus"),
    };
    dir.is_dir().then_some(dir)
}

/// The lines of `dir/results.jsonl`, in file order (none when the file is absent).
pub(crate) fn results(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let Ok(text) = std::fs::read_to_string(dir.join("results.jsonl")) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line ({e}): {l}")))
        .collect()
}

/// A JSON file, parsed (the test fails naming the file when it is missing or not JSON).
pub(crate) fn read_json(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The chat requests the mock received (either API; batch and other calls left out), in the
/// order they arrived.
pub(crate) fn chats(server: &summon_mock_llm::MockServer) -> Vec<summon_mock_llm::RecordedRequest> {
    let mut requests: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| {
            matches!(
                r.api,
                summon_mock_llm::Api::OpenAi | summon_mock_llm::Api::Anthropic
            )
        })
        .collect();
    requests.sort_by_key(|r| r.seq);
    requests
}

/// How many chat requests the mock received (a task waiting for the provider's first answer
/// may also ask its model list: that is not counted).
pub(crate) fn chat_count(server: &summon_mock_llm::MockServer) -> u64 {
    chats(server).len() as u64
}

/// Polls `cond` until it holds; the test fails naming `what` when `limit` passes first.
pub(crate) fn wait_for(limit: std::time::Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Fails the test, saying what to install, unless `program --version` (tmux: `-V`) runs here. Tests that
/// need a program from outside the project are `#[ignore]`d with the reason and call this
/// first, so that asked for (`-- --ignored`) without it they fail instead of passing.
pub(crate) fn require(program: &str) {
    let flag = if program == "tmux" { "-V" } else { "--version" };
    let runs = std::process::Command::new(program)
        .arg(flag)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        runs,
        "{program} is not installed here (apt-get install {program})"
    );
}

/// Appends one line of figures to `$SUMMON_FIGURES`, when set (the benchmark scripts read
/// them).
pub(crate) fn figure(line: serde_json::Value) {
    use std::io::Write;
    let Ok(path) = std::env::var("SUMMON_FIGURES") else {
        return;
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open the figures file");
    file.write_all(format!("{line}\n").as_bytes())
        .expect("write figures");
}
