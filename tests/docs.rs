//! The documentation stays true: every link of README, CONTRIBUTING and docs/ leads to a file
//! and heading that exist, and README's Quick start runs as written, against the mock.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use summon_mock_llm::{MockConfig, MockServer, Reply};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, CONTRIBUTING.md and every Markdown file under docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo().join("README.md"), repo().join("CONTRIBUTING.md")];
    let mut dirs = vec![repo().join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// The text of `page` outside fenced code blocks.
fn prose(text: &str) -> String {
    let mut fenced = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The anchors GitHub gives the headings of a Markdown text: lower case, punctuation other than
/// `-` and `_` dropped, spaces made `-`; a repeated one gets `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in prose(text).lines() {
        let Some(title) = line.strip_prefix('#') else {
            continue;
        };
        let title = title.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while found.contains(&unique) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
        found.insert(unique);
    }
    found
}

/// Every `[text](target)` of a Markdown text outside code, as written.
fn links(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut found = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else {
            break;
        };
        let target = &rest[..end];
        if !target.contains(char::is_whitespace) {
            found.push(target.to_owned());
        }
        rest = &rest[end..];
    }
    found
}

#[test]
fn every_link_of_the_readme_and_the_docs_leads_somewhere() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for link in links(&text) {
            if link.starts_with("http://")
                || link.starts_with("https://")
                || link.starts_with("mailto:")
            {
                continue;
            }
            checked += 1;
            let (path, anchor) = match link.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() {
                page.clone()
            } else {
                dir.join(path)
            };
            let shown = page.strip_prefix(repo()).unwrap().display().to_string();
            if !target.exists() {
                broken.push(format!("{shown}: {link}: no such file"));
                continue;
            }
            if let Some(anchor) = anchor
                && target.extension().is_some_and(|e| e == "md")
            {
                let heads = anchors(&std::fs::read_to_string(&target).unwrap());
                if !heads.contains(anchor) {
                    broken.push(format!("{shown}: {link}: no heading with that anchor"));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the parser right?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_anchor_rule_is_githubs() {
    let heads = anchors(
        "# summon\n## Scheduled runs: history, retention, `--reuse`\n### report.html\n## Summon\n```\n# not a heading\n```\n",
    );
    assert_eq!(
        heads.into_iter().collect::<Vec<_>>(),
        [
            "reporthtml",
            "scheduled-runs-history-retention---reuse",
            "summon",
            "summon-1"
        ]
    );
    assert_eq!(
        links("[a](b.md) [c](#d) `[e](f)`\n```\n[g](h)\n```\n"),
        ["b.md", "#d", "f"]
    );
}

/// README stays a page for a newcomer: the reference lives in docs/.
#[test]
fn the_readme_is_short_and_starts_with_the_quick_start() {
    let text = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = text.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines; move reference to docs/"
    );
    let quick = text.find("## Quick start").expect("a Quick start");
    assert!(
        text[..quick].lines().count() < 20,
        "the Quick start is not on the first screen"
    );
}

/// The commands of README's Quick start, as written: the first `sh` block after its heading.
fn quick_start() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let at = text.find("## Quick start").expect("a Quick start");
    let block = &text[at..];
    let start = block.find("```sh\n").expect("a sh block") + "```sh\n".len();
    let end = start + block[start..].find("```").unwrap();
    block[start..end]
        .lines()
        .map(|line| line.split(" #").next().unwrap().trim().to_owned())
        .filter(|line| !line.is_empty())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_quick_start_runs_as_written() {
    let lines = quick_start();
    assert!(
        lines[0].starts_with("cargo install --locked --path ."),
        "{lines:?}"
    );
    let server = MockServer::start(MockConfig::new().models(["llama3.2"]).default_reply(
        Reply::text(r#"{"category": "billing", "priority": "high", "reason": "charged twice"}"#),
    ))
    .await;
    // The example project: its pipelines and recipes, in a folder of its own.
    let project = tempfile::tempdir().unwrap();
    for dir in ["pipelines", "recipes"] {
        copy_dir(&repo().join(dir), &project.path().join(dir));
    }
    let home = tempfile::tempdir().unwrap();
    let mut vars: Vec<(String, String)> = Vec::new();
    let mut ran = Vec::new();
    for line in &lines[1..] {
        if let Some(assignment) = line.strip_prefix("export ") {
            let (key, value) = assignment.split_once('=').unwrap();
            // the server is the mock, wherever the README points
            let value = if key == "OPENAI_BASE_URL" {
                server.url_openai()
            } else {
                value.to_owned()
            };
            vars.push((key.to_owned(), value));
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            words[0], "summon",
            "a Quick start line that is not summon's: {line}"
        );
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_summon"))
            .args(&words[1..])
            .current_dir(project.path())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", home.path())
            .envs(vars.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            output.status.code(),
            Some(0),
            "`{line}` failed:\n{stdout}\n{stderr}"
        );
        ran.push(line.clone());
    }
    assert_eq!(ran.len(), 3, "{ran:?}");
    assert!(vars.iter().any(|(k, _)| k == "SUMMON_MODEL"), "{vars:?}");
    // what the README says to open next, and what it says the run wrote
    let out = project.path().join("out");
    assert!(out.join("report.html").is_file());
    let labels = std::fs::read_to_string(out.join("labels.jsonl")).unwrap();
    assert_eq!(labels.lines().count(), 5, "{labels}");
    assert!(
        labels
            .lines()
            .all(|l| l.contains(r#""label": {"category": "billing""#)),
        "{labels}"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let path = entry.path();
        let dest = to.join(entry.file_name());
        if path.is_dir() {
            copy_dir(&path, &dest);
        } else {
            std::fs::copy(&path, &dest).unwrap();
        }
    }
}
