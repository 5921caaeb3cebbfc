//! The example recipes, agents and pipelines shipped in the repository all validate and load.

use crate::support;
use support::*;

use std::path::{Path, PathBuf};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The files of `dir` (one level; relative to the repo root), sorted.
fn files_in(dir: &str) -> Vec<String> {
    let full = repo().join(dir);
    let Ok(entries) = std::fs::read_dir(&full) else {
        return Vec::new();
    };
    let mut files: Vec<String> = entries
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_file())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json" | "md")
            )
        })
        .map(|p: PathBuf| {
            p.strip_prefix(repo())
                .expect("inside the repo")
                .display()
                .to_string()
        })
        .collect();
    files.sort();
    files
}

/// `summon validate FILE` from the repo root, by relative and absolute path: exit 0 and no
/// error. (From the root, as source names resolve against the working directory's catalog.)
#[track_caller]
fn assert_valid(file: &str) {
    let absolute = {
        let mut command = Test::new()
            .args([
                "--color",
                "never",
                "validate",
                &repo().join(file).display().to_string(),
            ])
            .command();
        command.current_dir(repo());
        command.output().expect("run summon")
    };
    // run from the repository root so relative references behave as for a user
    let out_root = {
        let mut command = Test::new()
            .args(["--color", "never", "validate", file])
            .command();
        command.current_dir(repo());
        command.output().expect("run summon")
    };
    let stderr = String::from_utf8_lossy(&out_root.stderr);
    assert_eq!(out_root.status.code(), Some(0), "{file}:\n{stderr}");
    assert!(!stderr.contains(": error:"), "{file}:\n{stderr}");
    assert!(stderr.contains("0 error(s)"), "{file}:\n{stderr}");
    assert_eq!(
        absolute.status.code(),
        Some(0),
        "{file} (absolute path):\n{}",
        String::from_utf8_lossy(&absolute.stderr)
    );
}

#[test]
fn example_recipes_validate() {
    let files = files_in("recipes");
    assert!(
        files.iter().any(|f| f == "recipes/release-notes.yaml"),
        "{files:?}"
    );
    for file in files.iter().chain(files_in("recipes/subrecipes").iter()) {
        assert_valid(file);
    }
}

#[test]
fn example_agents_validate() {
    let files = files_in(".agents/agents");
    assert!(
        files.iter().any(|f| f == ".agents/agents/explorer.md"),
        "{files:?}"
    );
    for file in &files {
        assert_valid(file);
    }
}

#[test]
fn example_pipelines_validate() {
    // filled by a later issue; every file there must validate once it exists
    for file in files_in("pipelines") {
        assert_valid(&file);
    }
}

#[test]
fn whole_repo_validates_from_its_root() {
    let mut command = Test::new().args(["--color", "never", "validate"]).command();
    command.current_dir(repo());
    let out = command.output().expect("run summon");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains(" 0 error(s)"), "{stderr}");
}

fn load_from_repo(args: &[&str]) -> (i32, String, String) {
    let mut command = Test::new().args(args.iter().copied()).command();
    command.current_dir(repo());
    let out = command.output().expect("run summon");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn examples_load_from_the_repo_root() {
    for (name, kind) in [
        ("release-notes", "recipe"),
        ("review", "recipe"),
        ("explorer", "agent"),
    ] {
        let (code, stdout, stderr) = load_from_repo(&["load", name]);
        assert_eq!(code, 0, "{name}: {stderr}");
        assert!(
            stdout.starts_with(&format!("# Loaded: {name} ({kind})\n")),
            "{name}: {stdout}"
        );
        assert!(
            stdout.ends_with("This knowledge is now available in your context.\n"),
            "{name}: {stdout}"
        );
    }
}

#[test]
fn examples_are_listed_from_the_repo_root() {
    let (code, stdout, stderr) = load_from_repo(&["load", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let listing: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    let names: Vec<(&str, &str)> = listing["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .map(|s| (s["name"].as_str().unwrap(), s["kind"].as_str().unwrap()))
        .collect();
    for want in [
        ("release-notes", "recipe"),
        ("review", "recipe"),
        ("explorer", "agent"),
    ] {
        assert!(names.contains(&want), "{want:?} not in {names:?}");
    }
    // the review recipe's sub-recipe is a source too
    assert!(
        names.iter().any(|(_, kind)| *kind == "subrecipe"),
        "{names:?}"
    );
}

#[test]
fn review_example_has_typed_parameters_and_renders() {
    let (code, stdout, stderr) = load_from_repo(&["explain", "--source", "review", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let explained: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    let types: Vec<&str> = explained["parameters"]
        .as_array()
        .expect("parameters")
        .iter()
        .map(|p| p["input_type"].as_str().unwrap())
        .collect();
    assert!(types.iter().any(|t| *t != "string"), "{types:?}");
    // fill every required parameter with a value of its type, then render
    let mut args: Vec<String> = vec!["render".into(), "--source".into(), "review".into()];
    for p in explained["parameters"].as_array().unwrap() {
        if p["requirement"] != "required" {
            continue;
        }
        let value = match p["input_type"].as_str().unwrap() {
            "number" => "3".to_owned(),
            "boolean" => "true".to_owned(),
            "date" => "2024-01-31".to_owned(),
            "select" => p["options"][0].as_str().unwrap().to_owned(),
            "file" => "README.md".to_owned(),
            _ => "src".to_owned(),
        };
        args.push("--param".into());
        args.push(format!("{}={value}", p["key"].as_str().unwrap()));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, stdout, stderr) = load_from_repo(&args);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("title: "), "{stdout}");
}

#[test]
fn explorer_narrows_its_tools() {
    let text = std::fs::read_to_string(repo().join(".agents/agents/explorer.md")).expect("read");
    let frontmatter = text
        .strip_prefix("---\n")
        .and_then(|rest| rest.split("\n---\n").next())
        .expect("frontmatter");
    assert!(
        frontmatter.lines().any(|l| l.starts_with("tools:")),
        "{frontmatter}"
    );
}
