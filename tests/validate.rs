//! `summon validate`: the compiler-style report, exit codes, `--json`, and one case per rule.

use crate::support;
use support::*;

use serde::Deserialize;

/// Validates one recipe written to `r.yaml`, whatever the exit code.
fn check(yaml: &str) -> Output {
    check_file("r.yaml", yaml)
}

fn check_file(path: &str, text: &str) -> Output {
    Test::new()
        .write(path, text)
        .args(["--color", "never", "validate", path])
        .output()
}

#[track_caller]
fn assert_reports(out: &Output, code: i32, needle: &str) {
    assert_eq!(out.code, code, "{}", out.stderr);
    assert!(
        out.stderr.contains(needle),
        "want: {needle}\n---\n{}",
        out.stderr
    );
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
}

#[test]
fn report_has_location_source_line_carets_and_summary() {
    let out = check(
        "
        title: t
        description: d
        instructions: |
          line one
          hello {{ who }}
        ",
    );
    assert_eq!(out.code, 1);
    assert_eq!(out.stdout, "");
    assert_eq!(
        out.stderr,
        expected(
            "
            r.yaml:5:12: error: template variable `who` is used but not declared in `parameters`
              |
            5 |   hello {{ who }}
              |            ^^^
              = hint: declare it: `- key: who` with `input_type` and `requirement`
            summon: checked 1 file(s): 1 error(s), 0 warning(s)
            "
        )
    );
}

#[test]
fn gutter_widens_for_two_digit_lines() {
    let out = check(
        "
        title: t
        description: d
        instructions: i
        #
        #
        #
        #
        #
        #
        #
        bogus: 1
        ",
    );
    assert_eq!(out.code, 0);
    assert_eq!(
        out.stderr,
        expected(
            "
            r.yaml:11:1: warning: unknown key `bogus`
               |
            11 | bogus: 1
               | ^^^^^
            summon: checked 1 file(s): 0 error(s), 1 warning(s)
            "
        )
    );
}

#[test]
fn clean_file_exits_zero_with_summary() {
    let out = check("title: t\ndescription: d\ninstructions: i");
    assert_eq!(out.code, 0);
    assert_eq!(
        out.stderr,
        "summon: checked 1 file(s): 0 error(s), 0 warning(s)\n"
    );
}

#[test]
fn warnings_only_exit_zero_errors_exit_one() {
    let test = Test::new()
        .write(
            "warn.yaml",
            "title: t\ndescription: d\ninstructions: i\nextra: 1",
        )
        .write("err.yaml", "title: t\ninstructions: i");
    let out = test.args(["validate", "warn.yaml"]).run();
    assert!(out.stderr.ends_with("0 error(s), 1 warning(s)\n"));
    let out = Test::new()
        .write(
            "warn.yaml",
            "title: t\ndescription: d\ninstructions: i\nextra: 1",
        )
        .write("err.yaml", "title: t\ninstructions: i")
        .args(["validate", "warn.yaml", "err.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr
            .ends_with("summon: checked 2 file(s): 1 error(s), 1 warning(s)\n"),
        "{}",
        out.stderr
    );
}

#[test]
fn paths_are_shown_relative_to_the_working_directory() {
    let out = Test::new()
        .write("project/recipes/r.yaml", "title: t\ninstructions: i")
        .current_dir("project/work")
        .args(["--color", "never", "validate", "../recipes/r.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr
            .starts_with("../recipes/r.yaml:1:1: error: missing required field `description`\n"),
        "{}",
        out.stderr
    );
    let out = Test::new()
        .write("recipes/r.yaml", "title: t\ninstructions: i")
        .args(["--color", "never", "validate"])
        .code(1)
        .run();
    assert!(
        out.stderr
            .starts_with("recipes/r.yaml:1:1: error: missing required field `description`\n"),
        "{}",
        out.stderr
    );
}

#[test]
fn missing_path_is_an_error() {
    let out = Test::new()
        .args(["--color", "never", "validate", "nope.yaml"])
        .code(1)
        .run();
    assert!(
        out.stderr
            .starts_with("nope.yaml: error: no such file or directory\n"),
        "{}",
        out.stderr
    );
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Report {
    checked: usize,
    errors: usize,
    warnings: usize,
    diagnostics: Vec<Diag>,
    /// The files of a walked directory that are not recipes, agents or pipelines.
    skipped: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Diag {
    severity: String,
    message: String,
    path: Option<String>,
    line: Option<usize>,
    column: Option<usize>,
    hint: Option<String>,
}

#[test]
fn json_report_shape() {
    let out = Test::new()
        .write(
            "r.yaml",
            "
            title: t
            description: d
            instructions: |
              line one
              hello {{ who }}
            bogus: 1
            ",
        )
        .args(["validate", "--json", "r.yaml"])
        .code(1)
        .run();
    let report: Report = serde_json::from_str(&out.stdout).expect("report shape");
    assert_eq!((report.checked, report.errors, report.warnings), (1, 1, 1));
    assert_eq!(report.diagnostics.len(), 2);
    let error = report
        .diagnostics
        .iter()
        .find(|d| d.severity == "error")
        .expect("error");
    assert_eq!(
        error.message,
        "template variable `who` is used but not declared in `parameters`"
    );
    assert_eq!((error.line, error.column), (Some(5), Some(12)));
    assert_eq!(
        error.hint.as_deref(),
        Some("declare it: `- key: who` with `input_type` and `requirement`")
    );
    let path = error.path.as_deref().expect("path");
    assert!(path.ends_with("r.yaml"), "{path}");
    let warning = report
        .diagnostics
        .iter()
        .find(|d| d.severity == "warning")
        .expect("warning");
    assert_eq!(warning.message, "unknown key `bogus`");
    assert_eq!((warning.line, warning.column), (Some(6), Some(1)));
    assert_eq!(warning.hint, None);
    // the report replaces the human text; stderr carries no diagnostics
    assert!(!out.stderr.contains("unknown key"), "{}", out.stderr);
}

#[test]
fn json_report_of_a_clean_run() {
    let out = Test::new()
        .write("r.yaml", "title: t\ndescription: d\ninstructions: i")
        .args(["validate", "--json", "r.yaml"])
        .run();
    let report: Report = serde_json::from_str(&out.stdout).expect("report shape");
    assert_eq!((report.checked, report.errors, report.warnings), (1, 0, 0));
    assert!(report.diagnostics.is_empty());
    assert!(report.skipped.is_empty());
}

// ---- one case per rule ----

#[test]
fn rule_missing_title() {
    let out = check("description: d\ninstructions: i");
    assert_reports(&out, 1, "r.yaml:1:1: error: missing required field `title`");
}

#[test]
fn rule_missing_description() {
    let out = check("title: t\ninstructions: i");
    assert_reports(
        &out,
        1,
        "r.yaml:1:1: error: missing required field `description`",
    );
}

#[test]
fn rule_needs_instructions_or_prompt() {
    let out = check("title: t\ndescription: d");
    assert_reports(
        &out,
        1,
        "r.yaml:1:1: error: a recipe needs `instructions` or `prompt`; neither is set",
    );
    // either one is enough
    assert_eq!(check("title: t\ndescription: d\nprompt: p").code, 0);
    assert_eq!(check("title: t\ndescription: d\ninstructions: i").code, 0);
}

#[test]
fn rule_unknown_keys_warn_with_dotted_path_and_line() {
    let out = check(
        "
        title: t
        description: d
        instructions: i {{ a }}
        settings:
          foo: 1
          temperature: 0.1
        parameters:
          - key: a
            input_type: string
            requirement: optional
            default: x
            value: 3
            description: a
        bogus: 1
        ",
    );
    assert_reports(&out, 0, "r.yaml:5:3: warning: unknown key `settings.foo`");
    assert_reports(
        &out,
        0,
        "r.yaml:12:5: warning: unknown key `parameters[0].value`",
    );
    assert_reports(&out, 0, "r.yaml:14:1: warning: unknown key `bogus`");
    assert!(out.stderr.ends_with("0 error(s), 3 warning(s)\n"));
}

#[test]
fn rule_invalid_yaml_is_an_error_with_its_line() {
    let out = check("title: t\ndescription: d\ninstructions: [unclosed\n");
    assert_reports(&out, 1, "r.yaml:3:15: error: invalid YAML");
    let out = check("title: t\n  description: d\ninstructions: i\n");
    assert_reports(&out, 1, "r.yaml:2:");
    assert_reports(&out, 1, ": error: invalid YAML");
}

#[test]
fn invalid_yaml_message_says_what_is_wrong() {
    let out = check("title: t\ndescription: d\ninstructions: [unclosed\n");
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains("invalid YAML"))
        .expect("diagnostic");
    let message = line.split("invalid YAML:").nth(1).unwrap_or("").trim();
    assert!(!message.is_empty(), "{line}");
}

#[test]
fn rule_unknown_input_type_has_a_hint() {
    let out = check(
        "
        title: t
        description: d
        instructions: i {{ a }}
        parameters:
          - key: a
            input_type: color
            requirement: required
            description: a
        ",
    );
    assert_reports(
        &out,
        1,
        "r.yaml:6:17: error: parameter `a`: unknown input type `color`\n  |\n6 |     input_type: color\n  |                 ^^^^^\n  = hint: use one of string, number, boolean, date, file, select\n",
    );
}

#[test]
fn rule_select_needs_options() {
    let out = check(
        "
        title: t
        description: d
        instructions: i {{ a }}
        parameters:
          - key: a
            input_type: select
            requirement: required
            description: a
        ",
    );
    assert_reports(
        &out,
        1,
        "r.yaml:5:10: error: select parameter `a` needs `options`",
    );
}

#[test]
fn rule_select_default_must_be_an_option() {
    let out = check(
        "
        title: t
        description: d
        instructions: i {{ a }}
        parameters:
          - key: a
            input_type: select
            requirement: optional
            default: z
            options: [x, y]
            description: a
        ",
    );
    assert_reports(
        &out,
        1,
        "r.yaml:8:14: error: default `z` of parameter `a` is not one of its options: x, y",
    );
}

#[test]
fn rule_typed_defaults_must_match_their_type() {
    let out = check(
        "
        title: t
        description: d
        instructions: '{{ n }} {{ b }}'
        parameters:
          - key: n
            input_type: number
            requirement: optional
            default: abc
            description: n
          - key: b
            input_type: boolean
            requirement: optional
            default: maybe
            description: b
        ",
    );
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("`n`"), "{}", out.stderr);
    assert!(out.stderr.contains("`b`"), "{}", out.stderr);
}

#[test]
fn rule_undeclared_template_variable_names_it_at_its_position() {
    let out = check(
        "
        title: t
        description: d
        instructions: i
        prompt: |
          first
          second {{ a }} and {{ missing_one }}
        parameters:
          - key: a
            input_type: string
            requirement: required
            description: a
        ",
    );
    assert_reports(
        &out,
        1,
        "r.yaml:6:25: error: template variable `missing_one` is used but not declared in `parameters`\n  |\n6 |   second {{ a }} and {{ missing_one }}\n  |                         ^^^^^^^^^^^\n",
    );
}

#[test]
fn rule_declared_but_unused_parameter_warns() {
    let out = check(
        "
        title: t
        description: d
        instructions: i
        parameters:
          - key: a
            input_type: string
            requirement: required
            description: a
        ",
    );
    assert_reports(
        &out,
        0,
        "r.yaml:5:10: warning: parameter `a` is declared but never used in a template",
    );
}

#[test]
fn rule_parameter_used_only_in_sub_recipe_values_counts_as_used() {
    let out = Test::new()
        .write(
            "r.yaml",
            "
            title: t
            description: d
            instructions: i
            parameters:
              - key: lang
                input_type: string
                requirement: required
                description: l
            sub_recipes:
              - name: helper
                path: helper.yaml
                values:
                  language: '{{ lang }}'
            ",
        )
        .write(
            "helper.yaml",
            "
            title: h
            description: d
            instructions: about {{ language }}
            parameters:
              - key: language
                input_type: string
                requirement: required
                description: l
            ",
        )
        .args(["validate", "r.yaml"])
        .run();
    assert_eq!(
        out.stderr,
        "summon: checked 2 file(s): 0 error(s), 0 warning(s)\n"
    );
}

#[test]
fn rule_missing_sub_recipe_file_names_the_entry_at_the_path_line() {
    let out = check(
        "
        title: t
        description: d
        instructions: i
        sub_recipes:
          - name: helper
            path: ./nope.yaml
        ",
    );
    assert_reports(&out, 1, "r.yaml:6:11: error: sub-recipe `helper`: file `");
    assert_reports(
        &out,
        1,
        "nope.yaml` not found\n  |\n6 |     path: ./nope.yaml\n  |           ^^^^^^^^^^^\n",
    );
}

#[test]
fn rule_recipe_dir_in_sub_recipe_path_resolves() {
    let test = || {
        Test::new()
            .write(
                "recipes/main.yaml",
                "
                title: t
                description: d
                instructions: i
                sub_recipes:
                  - name: helper
                    path: '{{ recipe_dir }}/sub/h.yaml'
                ",
            )
            .write(
                "recipes/sub/h.yaml",
                "title: h\ndescription: d\ninstructions: i",
            )
    };
    let out = test().args(["validate", "recipes/main.yaml"]).run();
    assert_eq!(
        out.stderr,
        "summon: checked 2 file(s): 0 error(s), 0 warning(s)\n"
    );
    // run from elsewhere: still relative to the recipe, not to the working directory
    let out = test()
        .current_dir("elsewhere")
        .args(["load", "helper"])
        .env_path("SUMMON_RECIPE_PATH", "recipes")
        .run();
    assert!(out.stdout.starts_with("# Loaded: helper (subrecipe)"));
}

#[test]
fn rule_duplicate_parameter() {
    let out = check(
        "
        title: t
        description: d
        instructions: i {{ a }}
        parameters:
          - key: a
            input_type: string
            requirement: required
            description: a
          - key: a
            input_type: string
            requirement: required
            description: again
        ",
    );
    assert_reports(
        &out,
        1,
        "r.yaml:9:10: error: parameter `a` is declared twice",
    );
}

#[test]
fn rule_optional_without_default_warns() {
    let out = check(
        "
        title: t
        description: d
        instructions: i {{ a }}
        parameters:
          - key: a
            input_type: string
            requirement: optional
            description: a
        ",
    );
    assert_reports(
        &out,
        0,
        "r.yaml:5:10: warning: optional parameter `a` has no default; it is empty unless given (goose rejects this)",
    );
}

#[test]
fn rule_agent_with_unquoted_colon_in_description_is_recovered() {
    let out = check_file(
        "colon.md",
        "
        ---
        name: colon
        description: Use this agent when: the code needs review
        tools: Read
        ---
        body
        ",
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stderr,
        "summon: checked 1 file(s): 0 error(s), 0 warning(s)\n"
    );
}

#[test]
fn rule_agent_tools_as_a_mapping_is_an_error() {
    let out = check_file(
        "tmap.md",
        "
        ---
        name: tmap
        description: d
        tools:
          Read: true
        ---
        body
        ",
    );
    assert_eq!(
        out.stderr,
        expected(
            "
            tmap.md:5:3: error: `tools` must be a list or a comma-separated string, found a mapping
              |
            5 |   Read: true
              |   ^
            summon: checked 1 file(s): 1 error(s), 0 warning(s)
            "
        )
    );
    assert_eq!(out.code, 1);
}

#[test]
fn rule_agent_tools_in_every_form_are_accepted() {
    for tools in [
        "tools: Read, Grep, Bash(git log:*, git diff)",
        "tools: [Read, Grep]",
        "tools:\n  - Read\n  - mcp__github__search",
        "tools: []",
    ] {
        let out = check_file(
            "a.md",
            &format!("---\nname: a\ndescription: d\n{tools}\nmodel: inherit\n---\nbody\n"),
        );
        assert_eq!(out.code, 0, "{tools}: {}", out.stderr);
        assert!(out.stderr.contains("0 error(s)"), "{tools}: {}", out.stderr);
    }
}

#[test]
fn rule_agent_other_frontmatter_keys_are_noted() {
    let out = check_file(
        "a.md",
        "---\nname: a\ndescription: d\ncolor: blue\n---\nbody\n",
    );
    assert_reports(
        &out,
        0,
        "a.md:4:1: warning: frontmatter key `color` is ignored by summon",
    );
}

#[test]
fn rule_directory_argument_validates_every_recipe_and_agent_file() {
    let out = Test::new()
        .write("d/a.yaml", "title: t\ndescription: d\ninstructions: i")
        .write("d/b.yml", "title: t\ninstructions: i")
        .write("d/c.md", "---\nname: c\ndescription: d\n---\nbody")
        .write(
            "d/e.md",
            "---\nname: e\ndescription: d\ntools:\n  x: 1\n---\nbody",
        )
        .write(
            "d/j.json",
            r#"{"title": "t", "description": "d", "instructions": "{{ nope }}"}"#,
        )
        .write("d/README.md", "# About\n")
        .write("d/notes.txt", "not a source")
        .write(
            "d/action.yml",
            "name: a\ndescription: d\nruns: {using: composite, steps: []}\n",
        )
        .write("d/deeper/z.yaml", "title: t")
        .write("d/deeper/ignored/w.yaml", "title: t")
        .write("d/.summonignore", "deeper/ignored/\n")
        .args(["--color", "never", "validate", "d"])
        .code(1)
        .run();
    let located: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains(": error: ") || l.contains(": warning: "))
        .map(|l| l.split(':').next().unwrap())
        .collect();
    // Subdirectories too; what `.summonignore` names is left out.
    assert_eq!(
        located,
        [
            "d/b.yml",
            "d/deeper/z.yaml",
            "d/deeper/z.yaml",
            "d/e.md",
            "d/j.json"
        ],
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(
            "summon: skipped 2 file(s) that are not recipes, agents or pipelines: d/README.md, d/action.yml\n"
        ),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .ends_with("summon: checked 6 file(s): 5 error(s), 0 warning(s)\n"),
        "{}",
        out.stderr
    );
}

#[test]
fn rule_structure_errors() {
    assert_reports(
        &check("- a\n- b"),
        1,
        "r.yaml:1:1: error: a recipe must be a mapping, found a list",
    );
    assert_reports(&check(""), 1, "r.yaml:1:1: error: the file is empty");
    assert_reports(
        &check("title: t\ndescription: d\ninstructions: i\nparameters: 5"),
        1,
        "r.yaml:4:13: error: `parameters` must be a list, found a number",
    );
    assert_reports(
        &check("title: t\ndescription: d\ninstructions: i\ntitle: again"),
        0,
        "r.yaml:4:1: warning: duplicate key `title`; the first one is used",
    );
}

#[test]
fn rule_settings_are_checked() {
    let out = check(
        "
        title: t
        description: d
        instructions: i
        settings:
          temperature: hot
          max_turns: -1
        ",
    );
    assert_reports(
        &out,
        1,
        "r.yaml:5:16: error: `settings.temperature` must be a number between 0 and 2",
    );
    assert_reports(&out, 1, "r.yaml:6:14: error: `settings.max_turns`");
}

#[test]
fn rule_template_syntax_errors() {
    let out = check("title: t\ndescription: d\ninstructions: '{{ a }'");
    assert_reports(&out, 1, "r.yaml:3:");
    assert_reports(&out, 1, "error: template error: syntax error");
}

#[test]
fn rule_desktop_form_and_json_report_positions() {
    let out = check(
        "
        recipe:
          title: t
          description: d
          instructions: hi {{ who }}
        ",
    );
    assert_reports(
        &out,
        1,
        "r.yaml:4:23: error: template variable `who` is used but not declared",
    );
    let out = check_file(
        "j.json",
        "{\n  \"title\": \"t\",\n  \"description\": \"d\",\n  \"instructions\": \"{{ nope }}\"\n}",
    );
    assert_reports(
        &out,
        1,
        "j.json:4:23: error: template variable `nope` is used but not declared",
    );
}

// ---- colour ----

fn colour_run(args: &[&str], no_color: bool) -> Output {
    let mut test = Test::new().write("r.yaml", "title: t\ninstructions: i\nbogus: 1");
    if no_color {
        test = test.env("NO_COLOR", "1");
    }
    test.args(args.iter().copied()).code(1).run()
}

#[test]
fn colour_only_with_always() {
    let out = colour_run(&["--color", "always", "validate", "r.yaml"], false);
    assert!(out.stderr.contains("\x1b["), "{:?}", out.stderr);
    assert!(out.stderr.contains("error\x1b[0m"), "{:?}", out.stderr);

    for (args, no_color) in [
        (&["validate", "r.yaml"][..], false),
        (&["validate", "r.yaml"][..], true),
        (&["--color", "never", "validate", "r.yaml"][..], false),
        (&["--color", "auto", "validate", "r.yaml"][..], true),
    ] {
        let out = colour_run(args, no_color);
        assert!(
            !out.stderr.contains('\x1b'),
            "{args:?} NO_COLOR={no_color}: {:?}",
            out.stderr
        );
        assert!(
            out.stderr
                .contains("r.yaml:1:1: error: missing required field `description`")
        );
    }
}

#[test]
fn json_is_never_coloured() {
    let out = colour_run(
        &["--color", "always", "validate", "--json", "r.yaml"],
        false,
    );
    assert!(!out.stdout.contains('\x1b'));
    out.json();
}

#[test]
fn diagnostics_of_a_file_come_in_source_order() {
    let out = check(
        "
        title: t
        description: d
        instructions: |
          one {{ zeta }}
          two {{ alpha }}
        settings:
          foo: 1
        parameters:
          - key: a
            input_type: string
            requirement: optional
            default: x
            value: 3
            description: a
        ",
    );
    let positions: Vec<(usize, usize)> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("r.yaml:"))
        .map(|l| {
            let mut parts = l.split(':').skip(1);
            let line = parts.next().unwrap().parse().unwrap();
            let col = parts.next().unwrap().parse().unwrap();
            (line, col)
        })
        .collect();
    let mut sorted = positions.clone();
    sorted.sort();
    assert!(positions.len() >= 4, "{}", out.stderr);
    assert_eq!(positions, sorted, "{}", out.stderr);
}

#[test]
fn tab_indentation_is_reported_at_the_tab() {
    let out = check("title: t\ndescription: d\ninstructions: i\n\tfoo: 1\n");
    assert_reports(&out, 1, "r.yaml:4:1: error: invalid YAML");
}

#[test]
fn wrong_type_title_is_one_error() {
    let out = check("title: [1, 2]\ndescription: d\ninstructions: i");
    assert_reports(
        &out,
        1,
        "r.yaml:1:8: error: `title` must be a string, found a list",
    );
    assert!(
        !out.stderr.contains("missing required field `title`"),
        "{}",
        out.stderr
    );
}

#[test]
fn parameter_without_key_still_reports_its_other_problems() {
    let out = check(
        "
        title: t
        description: d
        instructions: i
        parameters:
          - input_type: string
            requirement: always
            description: no key
        ",
    );
    assert_reports(
        &out,
        1,
        "r.yaml:5:5: error: `parameters[0]` is missing `key`",
    );
    assert_reports(&out, 1, "unknown requirement `always`");
}

#[test]
fn positions_inside_block_scalars_are_exact() {
    let out = check("title: t\ndescription: d\ninstructions: |\n  hello\n  {{ who }}\n");
    assert_reports(
        &out,
        1,
        "r.yaml:5:6: error: template variable `who` is used but not declared",
    );
    let out = check("title: t\ndescription: d\ninstructions: |\n  {% if %}\n");
    assert_reports(&out, 1, "r.yaml:4:1: error: template error");
}
