//! Discovery (SPEC §1): directories, precedence, shadowing, the lenient working directory,
//! one level deep, symlinks, size limit, agent identity and the `.agents/agents/` rules.

use crate::support;
use support::*;

fn recipe(description: &str) -> String {
    format!("title: T\ndescription: {description}\ninstructions: i\n")
}

fn agent(name: &str, description: &str) -> String {
    format!("---\nname: {name}\ndescription: {description}\n---\nrole of {name}\n")
}

/// name → description, from `summon load --json`.
fn listed(out: &Output) -> Vec<(String, String, String)> {
    out.json()["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["kind"].as_str().unwrap().to_owned(),
                s["description"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn description_of(out: &Output, name: &str) -> Option<String> {
    listed(out)
        .into_iter()
        .find(|(n, _, _)| n == name)
        .map(|(_, _, d)| d)
}

/// Recipe directories in precedence order (relative to the project; HOME = `home`,
/// XDG_CONFIG_HOME = `xdg`, SUMMON_RECIPE_PATH = `sp1:sp2`, GOOSE_RECIPE_PATH = `gp`).
const RECIPE_DIRS: &[&str] = &[
    "",
    "recipes",
    ".goose/recipes",
    ".agents/recipes",
    "sp1",
    "sp2",
    "gp",
    "home/.goose/recipes",
    "xdg/summon/recipes",
    "home/.agents/recipes",
];

const AGENT_DIRS: &[&str] = &[
    ".goose/agents",
    ".claude/agents",
    ".agents/agents",
    "home/.goose/agents",
    "home/.agents/agents",
    "xdg/summon/agents",
    "home/.claude/agents",
];

fn with_env(test: Test) -> Test {
    test.env_path("HOME", "home")
        .env_path("XDG_CONFIG_HOME", "xdg")
        .env_path("SUMMON_RECIPE_PATH", "sp1:sp2")
        .env_path("GOOSE_RECIPE_PATH", "gp")
}

fn join(dir: &str, file: &str) -> String {
    if dir.is_empty() {
        file.to_owned()
    } else {
        format!("{dir}/{file}")
    }
}

#[test]
fn every_recipe_directory_is_searched() {
    let mut test = with_env(Test::new());
    for (i, dir) in RECIPE_DIRS.iter().enumerate() {
        test = test.write_raw(
            &join(dir, &format!("only{i}.yaml")),
            &recipe(&format!("in [{dir}]")),
        );
    }
    let out = test.args(["load", "--json"]).run();
    for (i, dir) in RECIPE_DIRS.iter().enumerate() {
        assert_eq!(
            description_of(&out, &format!("only{i}")).as_deref(),
            Some(format!("in [{dir}]").as_str()),
            "{}",
            out.stdout
        );
    }
}

#[test]
fn earlier_recipe_directories_win_and_validate_reports_the_shadowed() {
    // `clash{i}` lives in directory i and directory i + 1: directory i must win.
    let mut test = with_env(Test::new());
    for i in 0..RECIPE_DIRS.len() - 1 {
        for dir in &RECIPE_DIRS[i..i + 2] {
            test = test.write_raw(
                &join(dir, &format!("clash{i}.yaml")),
                &recipe(&format!("in [{dir}]")),
            );
        }
    }
    let out = test.args(["load", "--json"]).run();
    for (i, winner) in RECIPE_DIRS[..RECIPE_DIRS.len() - 1].iter().enumerate() {
        assert_eq!(
            description_of(&out, &format!("clash{i}")).as_deref(),
            Some(format!("in [{winner}]").as_str()),
            "{}",
            out.stdout
        );
    }

    let mut test = with_env(Test::new());
    for i in 0..RECIPE_DIRS.len() - 1 {
        for dir in &RECIPE_DIRS[i..i + 2] {
            test = test.write_raw(
                &join(dir, &format!("clash{i}.yaml")),
                &recipe(&format!("in [{dir}]")),
            );
        }
    }
    let out = test.args(["--color", "never", "validate"]).run();
    for i in 0..RECIPE_DIRS.len() - 1 {
        let loser = join(RECIPE_DIRS[i + 1], &format!("clash{i}.yaml"));
        let line = format!("{loser}: warning: recipe `clash{i}` is shadowed by `");
        assert!(out.stderr.contains(&line), "{line}\n{}", out.stderr);
    }
    assert!(
        out.stderr.ends_with(&format!(
            "0 error(s), {} warning(s)\n",
            RECIPE_DIRS.len() - 1
        )),
        "{}",
        out.stderr
    );
}

#[test]
fn every_agent_directory_is_searched_and_earlier_ones_win() {
    let mut test = with_env(Test::new());
    for (i, dir) in AGENT_DIRS.iter().enumerate() {
        // in .agents/agents the file stem must equal the name
        test = test.write_raw(
            &format!("{dir}/only{i}.md"),
            &agent(&format!("only{i}"), &format!("in [{dir}]")),
        );
        if i + 1 < AGENT_DIRS.len() {
            for dir in &AGENT_DIRS[i..i + 2] {
                test = test.write_raw(
                    &format!("{dir}/clash{i}.md"),
                    &agent(&format!("clash{i}"), &format!("in [{dir}]")),
                );
            }
        }
    }
    let out = test.args(["load", "--json"]).run();
    for (i, dir) in AGENT_DIRS.iter().enumerate() {
        assert_eq!(
            description_of(&out, &format!("only{i}")).as_deref(),
            Some(format!("in [{dir}]").as_str()),
            "{}",
            out.stdout
        );
        if i + 1 < AGENT_DIRS.len() {
            assert_eq!(
                description_of(&out, &format!("clash{i}")).as_deref(),
                Some(format!("in [{dir}]").as_str()),
                "{}",
                out.stdout
            );
        }
    }
    assert!(listed(&out).iter().all(|(_, kind, _)| kind == "agent"));
}

#[test]
fn agents_shadowed_are_reported_by_validate() {
    let out = Test::new()
        .write_raw(".goose/agents/x.md", &agent("x", "first"))
        .write_raw(".claude/agents/other-file.md", &agent("x", "second"))
        .args(["--color", "never", "validate"])
        .run();
    assert!(
        out.stderr
            .contains(".claude/agents/other-file.md: warning: agent `x` is shadowed by `"),
        "{}",
        out.stderr
    );
}

#[test]
fn config_directory_defaults_to_home_dot_config() {
    let out = Test::new()
        .env_path("HOME", "home")
        .write_raw(
            "home/.config/summon/recipes/conf.yaml",
            &recipe("config recipe"),
        )
        .write_raw(
            "home/.config/summon/agents/conf-agent.md",
            &agent("conf-agent", "config agent"),
        )
        .args(["load", "--json"])
        .run();
    assert_eq!(
        description_of(&out, "conf").as_deref(),
        Some("config recipe")
    );
    assert_eq!(
        description_of(&out, "conf-agent").as_deref(),
        Some("config agent")
    );
}

#[test]
fn recipe_path_variables_tolerate_missing_and_empty_entries() {
    let out = Test::new()
        .env_path("HOME", "home")
        .env_path("SUMMON_RECIPE_PATH", "missing:p1")
        .env("GOOSE_RECIPE_PATH", "")
        .write_raw("p1/from-path.yaml", &recipe("from the path"))
        .args(["load", "--json"])
        .run();
    assert_eq!(
        description_of(&out, "from-path").as_deref(),
        Some("from the path")
    );
    assert_eq!(out.stderr, "");
}

#[test]
fn working_directory_scan_is_lenient() {
    let test = || {
        Test::new()
            .write_raw(
                "package.json",
                r#"{"name": "app", "version": "1.0.0", "scripts": {"test": "jest"}}"#,
            )
            .write(
                "docker-compose.yml",
                "
                version: '3'
                services:
                  web:
                    image: nginx
                ",
            )
            .write_raw("tsconfig.json", r#"{"compilerOptions": {"strict": true}}"#)
            .write_raw(".github-like.yaml", "on: [push]\njobs: {}\n")
            .write_raw("broken.yaml", "key: [unclosed\n")
            .write_raw("notes.yaml", "title: only a title\n")
            .write_raw("real.yaml", &recipe("a real recipe"))
    };
    let out = test().args(["load", "--json"]).run();
    assert_eq!(
        listed(&out),
        [(
            "real".to_owned(),
            "recipe".to_owned(),
            "a real recipe".to_owned()
        )]
    );
    assert_eq!(out.stderr, "");
    let out = test().args(["load"]).run();
    assert_eq!(out.stderr, "");
    let out = test().args(["validate"]).run();
    assert_eq!(
        out.stderr,
        "summon: checked 1 file(s): 0 error(s), 0 warning(s)\n"
    );
}

#[test]
fn recipes_in_the_working_directory_still_report_errors_in_recipe_dirs() {
    // leniency is for the working directory only: `recipes/` is strict
    let out = Test::new()
        .write_raw("recipes/notes.yaml", "title: only a title\n")
        .args(["--color", "never", "validate"])
        .code(1)
        .run();
    assert!(
        out.stderr
            .contains("recipes/notes.yaml:1:1: error: missing required field `description`"),
        "{}",
        out.stderr
    );
}

#[test]
fn discovery_is_one_level_deep() {
    let out = Test::new()
        .write_raw("recipes/top.yaml", &recipe("top"))
        .write_raw("recipes/sub/deep.yaml", &recipe("deep"))
        .write_raw("recipes/sub/deeper/deepest.yaml", &recipe("deepest"))
        .write_raw(".claude/agents/top-agent.md", &agent("top-agent", "top"))
        .write_raw(
            ".claude/agents/team/deep-agent.md",
            &agent("deep-agent", "deep"),
        )
        .write_raw("sub/cwd-deep.yaml", &recipe("below cwd"))
        .args(["load", "--json"])
        .run();
    let names: Vec<String> = listed(&out).into_iter().map(|(n, _, _)| n).collect();
    assert_eq!(names, ["top", "top-agent"]);
}

#[test]
fn yml_json_and_desktop_forms_are_sources() {
    let out = Test::new()
        .write_raw("recipes/y.yml", &recipe("yml"))
        .write_raw(
            "recipes/j.json",
            r#"{"title": "J", "description": "json", "instructions": "i"}"#,
        )
        .write(
            "recipes/d.yaml",
            "
            recipe:
              title: D
              description: desktop
              instructions: i
            ",
        )
        .write_raw("recipes/ignored.txt", &recipe("not a recipe extension"))
        .args(["load", "--json"])
        .run();
    let mut got = listed(&out);
    got.sort();
    let want: Vec<(String, String, String)> = [("d", "desktop"), ("j", "json"), ("y", "yml")]
        .iter()
        .map(|(n, d)| (n.to_string(), "recipe".to_string(), d.to_string()))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn same_name_twice_in_one_folder_is_reported() {
    let out = Test::new()
        .write_raw("recipes/a.yaml", &recipe("yaml one"))
        .write_raw("recipes/a.yml", &recipe("yml one"))
        .args(["load", "--json"])
        .run();
    let got = listed(&out);
    assert_eq!(got.len(), 1, "{got:?}");
    let winner = &got[0].2;
    let loser = if winner == "yaml one" {
        "a.yml"
    } else {
        "a.yaml"
    };
    let out = Test::new()
        .write_raw("recipes/a.yaml", &recipe("yaml one"))
        .write_raw("recipes/a.yml", &recipe("yml one"))
        .args(["--color", "never", "validate"])
        .run();
    assert!(
        out.stderr.contains(&format!(
            "recipes/{loser}: warning: recipe `a` is shadowed by `"
        )),
        "{}",
        out.stderr
    );
}

#[test]
fn shadowing_warning_names_the_winner_relative_to_cwd() {
    let out = Test::new()
        .write_raw("recipes/a.yaml", &recipe("first"))
        .write_raw(".goose/recipes/a.yaml", &recipe("second"))
        .args(["--color", "never", "validate"])
        .run();
    assert!(
        out.stderr.contains(
            ".goose/recipes/a.yaml: warning: recipe `a` is shadowed by `recipes/a.yaml`, which is found first"
        ),
        "{}",
        out.stderr
    );
}

#[cfg(unix)]
#[test]
fn symlinks_leaving_the_directory_are_skipped_with_a_warning() {
    let test = Test::new()
        .write_raw("outside/o.yaml", &recipe("outside"))
        .write_raw("recipes/in.yaml", &recipe("inside"));
    std::os::unix::fs::symlink("../outside/o.yaml", test.path().join("recipes/leak.yaml"))
        .expect("symlink");
    std::os::unix::fs::symlink("in.yaml", test.path().join("recipes/alias.yaml")).expect("symlink");
    let out = test.args(["load", "--json"]).run();
    let mut names: Vec<String> = listed(&out).into_iter().map(|(n, _, _)| n).collect();
    names.sort();
    assert_eq!(names, ["alias", "in"]);

    let test = Test::new()
        .write_raw("outside/o.yaml", &recipe("outside"))
        .write_raw("recipes/in.yaml", &recipe("inside"));
    std::os::unix::fs::symlink("../outside/o.yaml", test.path().join("recipes/leak.yaml"))
        .expect("symlink");
    let out = test.args(["--color", "never", "validate"]).run();
    assert!(
        out.stderr.contains(
            "recipes/leak.yaml: warning: skipped: symlink leads out of its directory (to `"
        ),
        "{}",
        out.stderr
    );
}

#[test]
fn files_over_one_mib_are_skipped_with_a_warning() {
    const MIB: usize = 1024 * 1024;
    let head = "title: T\ndescription: d\ninstructions: |\n  ";
    let body = |total: usize| format!("{head}{}\n", "x".repeat(total - head.len() - 1));
    let at_limit = body(MIB);
    let over = body(MIB + 1);
    assert_eq!(at_limit.len(), MIB);
    let test = || {
        Test::new()
            .write_raw("recipes/at-limit.yaml", &at_limit)
            .write_raw("recipes/over.yaml", &over)
    };
    let out = test().args(["load", "--json"]).run();
    let names: Vec<String> = listed(&out).into_iter().map(|(n, _, _)| n).collect();
    assert_eq!(names, ["at-limit"]);
    let out = test().args(["--color", "never", "validate"]).run();
    assert!(
        out.stderr.contains(
            "recipes/over.yaml: warning: skipped: 1048577 bytes is over the 1 MiB limit for source files"
        ),
        "{}",
        out.stderr
    );
}

#[test]
fn agent_identity_is_the_frontmatter_name() {
    let test = || {
        Test::new().write_raw(
            ".claude/agents/file-name.md",
            &agent("real-name", "named inside"),
        )
    };
    let out = test().args(["load", "real-name"]).run();
    assert!(out.stdout.starts_with("# Loaded: real-name (agent)\n"));
    assert!(out.stdout.contains("role of real-name"));
    test().args(["load", "file-name"]).code(1).run();
}

#[test]
fn project_roles_must_be_named_after_their_file() {
    let test = || {
        Test::new()
            .write_raw(".agents/agents/mismatch.md", &agent("other", "strict"))
            .write_raw(".agents/agents/good.md", &agent("good", "fine"))
    };
    let out = test().args(["load", "--json"]).run();
    let names: Vec<String> = listed(&out).into_iter().map(|(n, _, _)| n).collect();
    assert_eq!(names, ["good"]);
    let out = test().args(["--color", "never", "validate"]).code(1).run();
    assert_eq!(
        out.stderr,
        expected(
            "
            .agents/agents/mismatch.md:2:7: error: agent name `other` does not match the file name `mismatch.md`; in .agents/agents/ the name must equal the file stem
              |
            2 | name: other
              |       ^^^^^
            summon: checked 2 file(s): 1 error(s), 0 warning(s)
            "
        )
    );
}

#[test]
fn project_roles_listing_the_delegation_tool_are_skipped() {
    let with_tools = |name: &str, tools: &str| {
        format!("---\nname: {name}\ndescription: d\ntools: {tools}\n---\nbody\n")
    };
    let test = || {
        Test::new()
            .write_raw(".agents/agents/t.md", &with_tools("t", "Read, Task"))
            .write_raw(".agents/agents/a.md", &with_tools("a", "[Read, Agent]"))
            .write_raw(".agents/agents/d.md", &with_tools("d", "\n  - delegate"))
            .write_raw(".agents/agents/ok.md", &with_tools("ok", "Read"))
    };
    let out = test().args(["load", "--json"]).run();
    let names: Vec<String> = listed(&out).into_iter().map(|(n, _, _)| n).collect();
    assert_eq!(names, ["ok"]);
    let out = test().args(["--color", "never", "validate"]).run();
    for (file, tool) in [("t", "Task"), ("a", "Agent"), ("d", "delegate")] {
        let expected = format!(
            ": warning: agent `{file}` lists the delegation tool `{tool}`, which a project role in .agents/agents/ may not use; the definition is skipped"
        );
        assert!(
            out.stderr
                .lines()
                .any(|l| l.starts_with(&format!(".agents/agents/{file}.md:"))
                    && l.ends_with(&expected)),
            "{expected}\n{}",
            out.stderr
        );
    }
    assert!(out.stderr.ends_with("0 error(s), 3 warning(s)\n"));
}

#[test]
fn elsewhere_the_delegation_tool_is_dropped_with_a_warning() {
    let test = || {
        Test::new().write_raw(
            ".claude/agents/lead.md",
            "---\nname: lead\ndescription: d\ntools: Read, Task\n---\nbody\n",
        )
    };
    let out = test().args(["load", "lead"]).run();
    assert!(out.stdout.starts_with("# Loaded: lead (agent)"));
    let out = test().args(["--color", "never", "validate"]).run();
    assert_eq!(
        out.stderr,
        expected(
            "
            .claude/agents/lead.md:4:14: warning: the delegation tool `Task` is dropped from `tools`: a subagent cannot delegate further
              |
            4 | tools: Read, Task
              |              ^^^^
            summon: checked 1 file(s): 0 error(s), 1 warning(s)
            "
        )
    );
}

#[test]
fn readme_without_frontmatter_is_silently_ignored() {
    let test = || {
        Test::new()
            .write_raw(
                ".claude/agents/README.md",
                "# Our agents\n\n---\n\nSee the files.\n",
            )
            .write_raw(".agents/agents/README.md", "# Roles\n")
            .write_raw(".claude/agents/ok.md", &agent("ok", "fine"))
    };
    let out = test().args(["load", "--json"]).run();
    let names: Vec<String> = listed(&out).into_iter().map(|(n, _, _)| n).collect();
    assert_eq!(names, ["ok"]);
    assert_eq!(out.stderr, "");
    let out = test().args(["validate"]).run();
    assert_eq!(
        out.stderr,
        "summon: checked 1 file(s): 0 error(s), 0 warning(s)\n"
    );
}

#[test]
fn agent_with_unquoted_colon_in_description_loads() {
    let out = Test::new()
        .write_raw(
            ".claude/agents/colon.md",
            "---\nname: colon\ndescription: Use this agent when: the code needs review\ntools: Read, Grep\n---\nReview.\n",
        )
        .args(["load", "--json"])
        .run();
    assert_eq!(
        description_of(&out, "colon").as_deref(),
        Some("Use this agent when: the code needs review")
    );
}

#[test]
fn discovery_is_relative_to_the_working_directory() {
    let out = Test::new()
        .write_raw("recipes/root.yaml", &recipe("at the root"))
        .write_raw("pkg/recipes/inner.yaml", &recipe("in pkg"))
        .current_dir("pkg")
        .args(["load"])
        .run();
    assert!(
        out.stdout.contains("  inner  in pkg  (recipes/inner.yaml)"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("root"));
}

#[test]
fn a_run_warns_when_a_source_it_uses_is_shadowed() {
    let pipeline = |source: &str| {
        format!("version: 1\nname: p\nsteps:\n  - id: one\n    delegate:\n      source: {source}\n")
    };
    let project = || {
        with_env(Test::new())
            .write_raw("home/.goose/recipes/review.yaml", &recipe("the user's own"))
            .write_raw("recipes/review.yaml", &recipe("the repository's"))
            .write_raw("recipes/other.yaml", &recipe("another"))
            .env("SUMMON_MODEL", "m")
            .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
    };
    let out = project()
        .write_raw("p.yaml", &pipeline("review"))
        .args(["--color", "never", "run", "p.yaml", "--dry-run"])
        .run();
    assert!(
        out.stderr.contains(
            "home/.goose/recipes/review.yaml: warning: recipe `review` is shadowed: this \
             command uses `recipes/review.yaml`, which is found first"
        ),
        "{}",
        out.stderr
    );
    // A source the run does not use is not its concern.
    let out = project()
        .write_raw("p.yaml", &pipeline("other"))
        .args(["--color", "never", "run", "p.yaml", "--dry-run"])
        .run();
    assert!(!out.stderr.contains("shadowed"), "{}", out.stderr);
}
