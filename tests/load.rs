//! `summon load`: the listing, loading one source, suggestions, `--json` shapes, closed pipes.

use crate::support;
use support::*;

use serde::Deserialize;

const HINTS: &str = "Use `summon load <name>` to load into context.\n\
                     Use `summon delegate --source <name>` to run as a subagent.\n";

/// A project with one recipe that declares a sub-recipe, and one agent.
fn project() -> Test {
    Test::new()
        .write(
            "recipes/main.yaml",
            "
            title: Main
            description: main recipe
            instructions: use the helper
            prompt: start now
            sub_recipes:
              - name: helper
                path: sub/helper.yaml
                description: the helper, described by the parent
            ",
        )
        .write(
            "recipes/sub/helper.yaml",
            "
            title: Helper
            description: helper itself
            instructions: help with {{ lang }} at {{ level }} {{ n }}
            parameters:
              - key: lang
                input_type: string
                requirement: required
                description: the language
              - key: level
                input_type: select
                requirement: optional
                default: mid
                options: [low, mid, high]
                description: how much
              - key: n
                input_type: number
                requirement: user_prompt
                description: count
            ",
        )
        .write(
            ".claude/agents/scout-file.md",
            "
            ---
            name: scout
            description: Maps the code
            tools: Read, Grep
            ---
            You map the code.
            ",
        )
}

#[test]
fn list_groups_sources_by_kind_with_hints() {
    let out = project().args(["load"]).run();
    let expected = format!(
        "Subrecipes:\n  \
           helper  the helper, described by the parent  (recipes/sub/helper.yaml)\n\
         \n\
         Recipes:\n  \
           main  main recipe  (recipes/main.yaml)\n\
         \n\
         Agents:\n  \
           scout  Maps the code  [tools: Read, Grep]  (.claude/agents/scout-file.md)\n\
         \n\
         {HINTS}"
    );
    assert_eq!(out.stdout, expected);
    assert_eq!(out.stderr, "");
}

#[test]
fn list_aligns_names_within_a_group() {
    let out = Test::new()
        .write(
            "recipes/a.yaml",
            "title: A\ndescription: first\ninstructions: i",
        )
        .write(
            "recipes/longer-name.yaml",
            "title: L\ndescription: second\ninstructions: i",
        )
        .args(["load"])
        .run();
    assert!(
        out.stdout.starts_with(
            "Recipes:\n  \
               a            first  (recipes/a.yaml)\n  \
               longer-name  second  (recipes/longer-name.yaml)\n\n"
        ),
        "{}",
        out.stdout
    );
    assert!(out.stdout.ends_with(HINTS));
}

#[test]
fn list_without_sources_names_the_searched_directories() {
    // a home outside the project, so its directories are shown in full
    let home = tempfile::tempdir().expect("home");
    let out = Test::new()
        .env("HOME", &home.path().display().to_string())
        .args(["load"])
        .run();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], "No sources found. Searched:", "{}", out.stdout);
    for dir in [
        "recipes",
        ".goose/recipes",
        ".agents/recipes",
        ".goose/agents",
        ".claude/agents",
        ".agents/agents",
    ] {
        assert!(
            lines.contains(&format!("  {dir}").as_str()),
            "{dir} missing:\n{}",
            out.stdout
        );
    }
    for dir in [
        ".goose/recipes",
        ".config/summon/recipes",
        ".agents/recipes",
        ".goose/agents",
        ".agents/agents",
        ".config/summon/agents",
        ".claude/agents",
    ] {
        let full = format!("  {}", home.path().join(dir).display());
        assert!(
            lines.contains(&full.as_str()),
            "{full} missing:\n{}",
            out.stdout
        );
    }
}

#[test]
fn list_without_sources_names_the_working_directory() {
    let out = Test::new().env_path("HOME", "home").args(["load"]).run();
    for line in out.stdout.lines().skip(1) {
        assert!(
            !line.trim().is_empty(),
            "blank directory entry:\n{}",
            out.stdout
        );
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Listing {
    /// finished background tasks awaiting collection, as the text listing shows them
    tasks: Vec<serde_json::Value>,
    sources: Vec<ListedSource>,
    searched: Vec<String>,
    /// files not read at all, with why
    skipped: Vec<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListedSource {
    name: String,
    kind: String,
    description: String,
    path: String,
    scope: String,
    /// the recipe declaring a subrecipe, else null
    parent: Option<String>,
    /// an agent's tools list as written, else null
    tools: Option<Vec<String>>,
}

#[test]
fn list_json_shape() {
    let out = project()
        .env_path("HOME", "home")
        .write(
            "home/.goose/recipes/global.yaml",
            "title: G\ndescription: global one\ninstructions: i",
        )
        .args(["load", "--json"])
        .run();
    let listing: Listing = serde_json::from_str(&out.stdout).expect("listing shape");
    let find = |name: &str| {
        listing
            .sources
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("{name} not listed: {listing:?}"))
    };
    let main = find("main");
    assert_eq!(main.kind, "recipe");
    assert_eq!(main.description, "main recipe");
    assert_eq!(main.scope, "local");
    assert_eq!(
        std::path::Path::new(&main.path),
        out.dir.join("recipes/main.yaml")
    );
    assert_eq!(main.parent, None);
    let helper = find("helper");
    assert_eq!(helper.kind, "subrecipe");
    assert_eq!(
        helper.parent.as_deref().map(std::path::Path::new),
        Some(out.dir.join("recipes/main.yaml").as_path())
    );
    assert_eq!(find("scout").kind, "agent");
    assert_eq!(
        find("scout").tools.as_deref(),
        Some(&["Read".to_owned(), "Grep".to_owned()][..])
    );
    assert_eq!(main.tools, None);
    assert!(listing.tasks.is_empty());
    let global = find("global");
    assert_eq!(global.scope, "global");
    assert_eq!(
        std::path::Path::new(&global.path),
        out.dir.join("home/.goose/recipes/global.yaml")
    );
    assert_eq!(listing.sources.len(), 4);
    assert!(
        listing
            .searched
            .contains(&out.dir.join("recipes").display().to_string())
    );
    assert!(
        listing
            .searched
            .contains(&out.dir.join("home/.claude/agents").display().to_string())
    );
}

#[test]
fn list_json_without_sources() {
    let out = Test::new().args(["load", "--json"]).run();
    let listing: Listing = serde_json::from_str(&out.stdout).expect("listing shape");
    assert!(listing.sources.is_empty());
    assert!(!listing.searched.is_empty());
}

#[test]
fn load_recipe_prints_header_content_and_closing_line() {
    let out = Test::new()
        .write(
            "recipes/a.yaml",
            "
            title: A
            description: d
            instructions: |
              Line one.
              Line two with {{ name }} kept raw.
            parameters:
              - key: name
                input_type: string
                requirement: required
                description: n
            ",
        )
        .args(["load", "a"])
        .run();
    assert_eq!(
        out.stdout,
        "# Loaded: a (recipe)\n\
         \n\
         Line one.\n\
         Line two with {{ name }} kept raw.\n\
         \n\
         This knowledge is now available in your context.\n"
    );
}

#[test]
fn load_recipe_with_prompt_shows_both() {
    let out = project().args(["load", "main"]).run();
    assert_eq!(
        out.stdout,
        "# Loaded: main (recipe)\n\
         \n\
         use the helper\n\
         \n\
         ## Prompt\n\
         \n\
         start now\n\
         \n\
         This knowledge is now available in your context.\n"
    );
}

#[test]
fn load_agent_prints_the_body_and_its_tools() {
    let out = project().args(["load", "scout"]).run();
    assert_eq!(
        out.stdout,
        "# Loaded: scout (agent)\n\
         \n\
         You map the code.\n\
         \n\
         ## Tools\n\
         \n\
         Read, Grep\n\
         \n\
         This knowledge is now available in your context.\n"
    );
}

#[test]
fn load_subrecipe_appends_its_parameters() {
    let out = project().args(["load", "helper"]).run();
    assert_eq!(
        out.stdout,
        "# Loaded: helper (subrecipe)\n\
         \n\
         help with {{ lang }} at {{ level }} {{ n }}\n\
         \n\
         ## Parameters\n\
         \n\
         - `lang` (string, required): the language\n\
         - `level` (select, optional, default: mid, options: low, mid, high): how much\n\
         - `n` (number, user_prompt): count\n\
         \n\
         This knowledge is now available in your context.\n"
    );
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Loaded {
    name: String,
    kind: String,
    path: String,
    description: String,
    content: String,
    parameters: Vec<LoadedParameter>,
    tools: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadedParameter {
    key: String,
    input_type: String,
    requirement: String,
    default: Option<String>,
    description: String,
    options: Vec<String>,
}

#[test]
fn load_json_shape() {
    let out = project().args(["load", "helper", "--json"]).run();
    let loaded: Loaded = serde_json::from_str(&out.stdout).expect("loaded shape");
    assert_eq!(loaded.name, "helper");
    assert_eq!(loaded.kind, "subrecipe");
    assert_eq!(loaded.description, "the helper, described by the parent");
    assert_eq!(
        std::path::Path::new(&loaded.path),
        out.dir.join("recipes/sub/helper.yaml")
    );
    assert_eq!(
        loaded.content,
        "help with {{ lang }} at {{ level }} {{ n }}"
    );
    let keys: Vec<&str> = loaded.parameters.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, ["lang", "level", "n"]);
    let level = &loaded.parameters[1];
    assert_eq!(level.input_type, "select");
    assert_eq!(level.requirement, "optional");
    assert_eq!(level.default.as_deref(), Some("mid"));
    assert_eq!(level.description, "how much");
    assert_eq!(level.options, ["low", "mid", "high"]);
    assert_eq!(loaded.parameters[2].requirement, "user_prompt");
    assert_eq!(loaded.parameters[0].default, None);

    let agent: Loaded =
        serde_json::from_str(&project().args(["load", "scout", "--json"]).run().stdout)
            .expect("agent shape");
    assert_eq!(agent.kind, "agent");
    assert_eq!(agent.content, "You map the code.");
    assert!(agent.parameters.is_empty());
    assert_eq!(
        agent.tools.as_deref(),
        Some(&["Read".to_owned(), "Grep".to_owned()][..])
    );
    assert_eq!(loaded.tools, None);
    // The text shows the same list.
    let text = project().args(["load", "scout"]).run().stdout;
    assert!(text.contains("\n## Tools\n\nRead, Grep\n"), "{text}");
}

fn cartography() -> Test {
    let mut test = Test::new();
    for name in [
        "cartographer",
        "cartoon",
        "carton",
        "cart",
        "artist",
        "unrelated",
    ] {
        test = test.write(
            &format!("recipes/{name}.yaml"),
            &format!("title: T\ndescription: about {name}\ninstructions: i"),
        );
    }
    test
}

#[test]
fn unknown_name_suggests_at_most_three() {
    let out = cartography().args(["load", "car"]).code(1).run();
    assert_eq!(
        out.stderr,
        "summon: error: Source 'car' not found. Did you mean: cart, carton, cartoon?\n"
    );
    assert_eq!(out.stdout, "");
}

#[test]
fn unknown_name_suggests_by_substring_either_way() {
    // the query contains a source name
    let out = cartography().args(["load", "cartographerx"]).code(1).run();
    assert!(
        out.stderr.contains("Did you mean: ") && out.stderr.contains("cartographer"),
        "{}",
        out.stderr
    );
    // a source name contains the query
    let out = cartography().args(["load", "artis"]).code(1).run();
    assert_eq!(
        out.stderr,
        "summon: error: Source 'artis' not found. Did you mean: artist?\n"
    );
}

#[test]
fn unknown_name_suggests_close_typos() {
    let out = cartography().args(["load", "cartografer"]).code(1).run();
    let suggestions = out
        .stderr
        .trim_end()
        .strip_prefix("summon: error: Source 'cartografer' not found. Did you mean: ")
        .and_then(|s| s.strip_suffix('?'))
        .unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(
        suggestions.split(", ").any(|s| s == "cartographer"),
        "{suggestions}"
    );
    assert!(suggestions.split(", ").count() <= 3);

    let out = Test::new()
        .write(
            "recipes/release-notes.yaml",
            "title: R\ndescription: d\ninstructions: i",
        )
        .args(["load", "relaese-notes"])
        .code(1)
        .run();
    assert_eq!(
        out.stderr,
        "summon: error: Source 'relaese-notes' not found. Did you mean: release-notes?\n"
    );
}

#[test]
fn unknown_name_without_close_match() {
    let out = cartography().args(["load", "xyzzy"]).code(1).run();
    let (first, hint) = out.stderr.split_once('\n').unwrap();
    assert_eq!(
        first,
        "summon: error: Source 'xyzzy' not found. Use summon load to see available sources."
    );
    assert!(hint.starts_with("  = hint: looked in /"), "{hint}");
    let out = Test::new().args(["load", "anything"]).code(1).run();
    let (first, hint) = out.stderr.split_once('\n').unwrap();
    assert_eq!(
        first,
        "summon: error: Source 'anything' not found. Use summon load to see available sources."
    );
    assert!(hint.starts_with("  = hint: looked in /"), "{hint}");
}

#[test]
fn sources_with_errors_are_left_out_with_a_note() {
    let out = Test::new()
        .write(
            "recipes/good.yaml",
            "title: G\ndescription: d\ninstructions: i",
        )
        .write("recipes/bad.yaml", "title: B\ninstructions: i")
        .args(["load"])
        .stdout_has("  good  d  (recipes/good.yaml)")
        .run();
    assert!(!out.stdout.contains("bad"), "{}", out.stdout);
    assert!(
        out.stderr.contains("1 source file(s) have errors")
            && out.stderr.contains("summon validate"),
        "{}",
        out.stderr
    );
}

#[test]
fn desktop_form_and_json_recipes_load() {
    let out = Test::new()
        .write(
            "recipes/desk.yaml",
            "
            recipe:
              title: Desk
              description: desktop form
              instructions: wrapped
            ",
        )
        .write_raw(
            "recipes/j.json",
            r#"{"title": "J", "description": "json form", "instructions": "from json"}"#,
        )
        .write(
            "recipes/y.yml",
            "title: Y\ndescription: yml form\ninstructions: i",
        )
        .args(["load", "--json"])
        .run();
    let listing: Listing = serde_json::from_str(&out.stdout).expect("listing");
    let mut names: Vec<(&str, &str)> = listing
        .sources
        .iter()
        .map(|s| (s.name.as_str(), s.description.as_str()))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            ("desk", "desktop form"),
            ("j", "json form"),
            ("y", "yml form")
        ]
    );
    let _out = Test::new()
        .write(
            "recipes/desk.yaml",
            "recipe:\n  title: Desk\n  description: desktop form\n  instructions: wrapped",
        )
        .args(["load", "desk"])
        .stdout_has("\nwrapped\n")
        .run();
}

/// `summon load | head -1`: the reader goes away early; summon must exit quietly.
#[test]
fn closed_stdout_pipe_is_not_an_error() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let mut test = Test::new();
    for i in 0..300 {
        test = test.write(
            &format!("recipes/recipe-{i:03}.yaml"),
            &format!(
                "title: T{i}\ndescription: recipe number {i} with a description long enough to fill the pipe quickly\ninstructions: i"
            ),
        );
    }
    for args in [
        vec!["load"],
        vec!["load", "--json"],
        vec!["validate", "--json"],
    ] {
        let mut child = test
            .command()
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut first = String::new();
        stdout.read_line(&mut first).expect("first line");
        assert!(!first.is_empty());
        drop(stdout);
        let output = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
            "{args:?}: {stderr}"
        );
    }
}

/// A source named like a task id is loaded as a source while no task has that id, and
/// `validate` warns about the name.
#[test]
fn a_source_named_like_a_task_id_loads_while_no_task_has_it() {
    let recipe = "
        title: Dated
        description: named like a task
        instructions: the dated recipe
    ";
    let out = Test::new()
        .write(".agents/recipes/20260219_1.yaml", recipe)
        .args(["load", "20260219_1"])
        .run();
    assert!(
        out.stdout.starts_with("# Loaded: 20260219_1 (recipe)"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("the dated recipe"), "{}", out.stdout);
    Test::new()
        .write(".agents/recipes/20260219_1.yaml", recipe)
        .args(["validate"])
        .stderr_has(
            "warning: recipe `20260219_1` is named like a background task id: `summon load 20260219_1` loads it only while no task has that id",
        )
        .run();
    // Without such a source, the name is a task id still.
    Test::new()
        .args(["load", "20260219_1"])
        .code(1)
        .stderr_has("Task '20260219_1' not found")
        .run();
}

/// Files discovery did not read (too large, a symlink out of their folder) are said by
/// `load`, as `validate` says them, and listed in `--json`.
#[test]
fn load_says_which_files_it_skipped() {
    let outside = tempfile::tempdir().expect("outside");
    std::fs::write(
        outside.path().join("far.yaml"),
        "title: F\ndescription: far\ninstructions: i",
    )
    .unwrap();
    let big = format!(
        "title: B\ndescription: big\ninstructions: {}\n",
        "x".repeat(1_100_000)
    );
    let t = project().write_raw("recipes/big.yaml", &big);
    std::os::unix::fs::symlink(
        outside.path().join("far.yaml"),
        t.path().join("recipes/far.yaml"),
    )
    .unwrap();
    let out = t.args(["load"]).run();
    assert!(
        out.stderr.contains(&format!(
            "summon: skipped `recipes/big.yaml`: {} bytes is over the 1 MiB limit for source files",
            big.len()
        )),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("summon: skipped `recipes/far.yaml`: symlink leads out of its directory"),
        "{}",
        out.stderr
    );
    let t = project().write_raw("recipes/big.yaml", &big);
    let listing: Listing =
        serde_json::from_str(&t.args(["load", "--json"]).run().stdout).expect("listing shape");
    assert_eq!(listing.skipped.len(), 1, "{:?}", listing.skipped);
    assert!(
        listing.skipped[0]["reason"]
            .as_str()
            .is_some_and(|r| r.ends_with("over the 1 MiB limit for source files")),
        "{:?}",
        listing.skipped
    );
}

/// A subagent keeps `load` (as in goose): it lists the project's sources and loads one; it
/// starts no task, so it reads, collects and cancels none: another caller's finished task is
/// not listed and reads as unknown, and its cancel of a running one stops nothing. A
/// subagent without tools gets no `load`.
#[tokio::test(flavor = "multi_thread")]
async fn a_subagent_lists_and_loads_sources_but_reaches_no_other_callers_task() {
    use summon_mock_llm::{MockConfig, MockServer, Reply};
    let ids = std::sync::Arc::new(std::sync::Mutex::new((String::new(), String::new())));
    let ids_for_model = std::sync::Arc::clone(&ids);
    let server = MockServer::start(MockConfig::new().rule(move |request| {
        let messages = request.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let first = messages
            .iter()
            .find(|m| m["role"] == "user")
            .map(|m| m["content"].to_string())
            .unwrap_or_default();
        if first.contains("background job") {
            return Reply::text("BG-ANSWER: forty-two");
        }
        if first.contains("slow job") {
            return Reply::text("SLOW").delayed(std::time::Duration::from_secs(120));
        }
        let results = messages.iter().filter(|m| m["role"] == "tool").count();
        let (done, slow) = ids_for_model.lock().unwrap().clone();
        match results {
            0 => Reply::tool_call("load", serde_json::json!({})),
            1 => Reply::tool_call("load", serde_json::json!({"source": "main"})),
            2 => Reply::tool_call("load", serde_json::json!({"source": done})),
            3 => Reply::tool_call("load", serde_json::json!({"source": slow, "cancel": true})),
            _ => Reply::text("looked"),
        }
    }))
    .await;
    let test = project()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-key")
        .env("SUMMON_MODEL", "mock-model");
    let start = |what: &str| {
        let started = test
            .command()
            .args(["delegate", "--async", "--json", "--instructions", what])
            .output()
            .unwrap();
        let started: serde_json::Value = serde_json::from_slice(&started.stdout).unwrap();
        started["task_id"].as_str().unwrap().to_owned()
    };
    let done = start("background job");
    let slow = start("slow job");
    *ids.lock().unwrap() = (done.clone(), slow.clone());
    // The first ends by itself, unread (`--peek` waits for nothing and reads nothing out).
    support::wait_for(
        std::time::Duration::from_secs(30),
        "the task to end",
        || {
            let out = test
                .command()
                .args(["load", &done, "--peek"])
                .output()
                .unwrap();
            !String::from_utf8_lossy(&out.stdout).contains("running")
        },
    );
    let tasks_before = test.command().args(["tasks", "--json"]).output().unwrap();
    let out = test
        .command()
        .args(["delegate", "--instructions", "look around"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "looked");
    let chats: Vec<_> = support::chats(&server)
        .into_iter()
        .filter(|r| r.body["messages"].to_string().contains("look around"))
        .collect();
    assert!(
        chats[0].tool_names().contains(&"load".to_owned()),
        "{:?}",
        chats[0].tool_names()
    );
    assert!(!chats[0].tool_names().iter().any(|n| n == "delegate"));
    let results = support::mcp::tool_results(chats.last().unwrap());
    assert_eq!(results.len(), 4, "{results:?}");
    // The listing: the sources, no task of another caller, no way to start one.
    assert!(
        results[0].contains("Recipes:\n  main - main recipe"),
        "{}",
        results[0]
    );
    assert!(results[0].contains("Agents:"), "{}", results[0]);
    assert!(!results[0].contains(&done), "{}", results[0]);
    assert!(!results[0].contains("awaiting retrieval"), "{}", results[0]);
    assert!(!results[0].contains("delegate("), "{}", results[0]);
    // A source's content.
    assert!(
        results[1].starts_with("# Loaded: main (recipe)"),
        "{}",
        results[1]
    );
    assert!(results[1].contains("use the helper"), "{}", results[1]);
    // Another caller's task reads as unknown, and its answer stays uncollected.
    assert!(!results[2].contains("BG-ANSWER"), "{}", results[2]);
    assert!(results[2].contains("not found"), "{}", results[2]);
    // Its cancel reaches nothing: the slow task still runs.
    assert!(!results[3].contains("cancelled"), "{}", results[3]);
    let peek = test
        .command()
        .args(["load", &slow, "--peek"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&peek.stdout).contains("running"),
        "{peek:?}"
    );
    // Nothing was started by the subagent.
    let tasks_after = test.command().args(["tasks", "--json"]).output().unwrap();
    let count = |out: &std::process::Output| {
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["tasks"]
            .as_array()
            .map_or(0, Vec::len)
    };
    assert_eq!(count(&tasks_before), count(&tasks_after));
    let collected = test.command().args(["load", &done]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&collected.stdout).contains("BG-ANSWER: forty-two"),
        "{collected:?}"
    );
    test.command()
        .args(["load", &slow, "--cancel"])
        .output()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_subagent_without_tools_gets_no_load() {
    use summon_mock_llm::{MockConfig, MockServer, Reply};
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    project()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-key")
        .env("SUMMON_MODEL", "mock-model")
        .args(["delegate", "--instructions", "think", "--extensions", ""])
        .run();
    assert!(server.requests()[0].tool_names().is_empty());
}
