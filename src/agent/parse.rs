//! Reads an agent definition (Markdown with YAML frontmatter) into an [`AgentDef`].
//!
//! A file without frontmatter or without `name` is silently not an agent (README.md files
//! live in agent directories). A frontmatter that is not YAML even after recovery is a
//! warning. Wrong field types are errors, and an erroneous definition is not loaded. Keys
//! other than `name`, `description`, `tools` and `model` are kept in
//! [`AgentDef::ignored_keys`] for `summon validate` to note; they are never warnings.
//!
//! Positions are whole-file positions: the frontmatter starts on line 2.

use std::sync::Arc;

use super::frontmatter;
use super::model::AgentDef;
use super::tool_ref::{ToolRef, read_tools};
use crate::diag::{Diagnostics, FileDiags, Pos, SourceFile};
use crate::yaml::{Node, Value};

/// Where the file was found decides how strict the rules are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AgentDir {
    /// `.agents/agents/`: project roles. `name` must equal the file stem, and a definition
    /// that lists the delegation tool is skipped.
    Project,
    /// Every other agent directory: a listed delegation tool is dropped from `tools`.
    Other,
}

/// The outcome of reading one Markdown file from an agent directory.
#[derive(Debug)]
pub(crate) enum AgentParse {
    /// No frontmatter or no `name`, or a definition that was rejected (with a diagnostic).
    NotAnAgent,
    Agent(AgentDef),
}

/// Reads `file` as an agent definition, reporting problems to `diags`.
pub(crate) fn parse_agent(
    file: &Arc<SourceFile>,
    dir: AgentDir,
    diags: &mut Diagnostics,
) -> AgentParse {
    let Some(fm) = frontmatter::split(&file.text) else {
        return AgentParse::NotAnAgent;
    };
    let shift = fm.yaml_line - 1;
    let mut diags = diags.for_file(file);
    let root = match frontmatter::load(fm.yaml) {
        Ok(Some(root)) => root,
        Ok(None) => return AgentParse::NotAnAgent,
        Err(error) => {
            diags.warning(
                error.pos.shifted(shift),
                format!(
                    "the frontmatter is not valid YAML ({}); the file is not loaded as an agent",
                    error.message
                ),
            );
            return AgentParse::NotAnAgent;
        }
    };
    let Some(entries) = root.as_map() else {
        return AgentParse::NotAnAgent;
    };
    let fields = Fields::collect(entries, shift, &mut diags);
    let Some(name_node) = fields.name else {
        return AgentParse::NotAnAgent;
    };

    let mut valid = true;
    let name_pos = name_node.pos.shifted(shift);
    let name = match read_name(name_node) {
        Ok(name) => name,
        Err(message) => {
            diags.error(name_pos, message);
            return AgentParse::NotAnAgent;
        }
    };
    let description = match fields.description {
        None => String::new(),
        Some(node) => match scalar_text(node, "description") {
            Ok(text) => text.trim().to_owned(),
            Err(message) => {
                diags.error(node.pos.shifted(shift), message);
                valid = false;
                String::new()
            }
        },
    };
    let (model, model_pos) = match fields.model {
        None => (None, None),
        Some(node) => match scalar_text(node, "model") {
            Ok(text) => {
                let text = text.trim();
                if text.is_empty() || text.eq_ignore_ascii_case("inherit") {
                    (None, None)
                } else {
                    (Some(text.to_owned()), Some(node.pos.shifted(shift)))
                }
            }
            Err(message) => {
                diags.error(node.pos.shifted(shift), message);
                valid = false;
                (None, None)
            }
        },
    };
    let tools = match fields.tools {
        None => None,
        Some(node) if node.is_null() => {
            diags.warning(
                node.pos.shifted(shift),
                "`tools` is empty, so it is ignored and every tool is available; write \
                 `tools: []` for no tools",
            );
            None
        }
        Some(node) => {
            let tools = read_tools(node, shift, &mut diags);
            valid &= tools.is_some();
            tools
        }
    };
    if !valid {
        return AgentParse::NotAnAgent;
    }

    let tools = match dir {
        AgentDir::Project => {
            if let Some(stem) = file.path().file_stem()
                && stem.to_string_lossy() != name
            {
                let file_name = file
                    .path()
                    .file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
                diags.error(
                    name_pos,
                    format!(
                        "agent name `{name}` does not match the file name `{file_name}`; in \
                         .agents/agents/ the name must equal the file stem"
                    ),
                );
                return AgentParse::NotAnAgent;
            }
            if let Some(delegation) = tools.iter().flatten().find(|t| t.is_delegation()) {
                diags.warning(
                    delegation.pos,
                    format!(
                        "agent `{name}` lists the delegation tool `{}`, which a project role \
                         in .agents/agents/ may not use; the definition is skipped",
                        delegation.raw
                    ),
                );
                return AgentParse::NotAnAgent;
            }
            tools
        }
        AgentDir::Other => tools.map(|tools| drop_delegation(tools, &mut diags)),
    };

    AgentParse::Agent(AgentDef {
        name,
        name_pos,
        description,
        tools,
        model,
        model_pos,
        body: fm.body.to_owned(),
        body_line: fm.body_line,
        ignored_keys: fields.ignored,
        file: Arc::clone(file),
    })
}

/// The frontmatter keys summon reads, in the order of [`Fields`]' slots; every other key is
/// ignored (the agent schema of `summon schema agent` lists exactly these).
pub(crate) const READ_KEYS: [&str; 4] = ["name", "description", "tools", "model"];

/// The frontmatter's keys sorted into the ones summon reads and the ignored ones.
#[derive(Default)]
struct Fields<'a> {
    name: Option<&'a Node>,
    description: Option<&'a Node>,
    tools: Option<&'a Node>,
    model: Option<&'a Node>,
    ignored: Vec<(String, Pos)>,
}

impl<'a> Fields<'a> {
    /// Takes the first of each known key (a repeated one is a warning) and lists the others.
    fn collect(entries: &'a [(Node, Node)], shift: u32, diags: &mut FileDiags<'_>) -> Self {
        let mut fields = Self::default();
        for (key, value) in entries {
            let key_pos = key.pos.shifted(shift);
            let key_text = match &key.value {
                Value::Scalar(text, _) => text.clone(),
                _ => key.to_json().to_string(),
            };
            let Some(index) = READ_KEYS.iter().position(|k| *k == key_text) else {
                fields.ignored.push((key_text, key_pos));
                continue;
            };
            let slots = [
                &mut fields.name,
                &mut fields.description,
                &mut fields.tools,
                &mut fields.model,
            ];
            let Some(slot) = slots.into_iter().nth(index) else {
                continue;
            };
            if slot.is_some() {
                diags.warning(
                    key_pos,
                    format!("duplicate key `{key_text}`; the first one is used"),
                );
            } else {
                *slot = Some(value);
            }
        }
        fields
    }
}

/// `name` as a non-empty string.
fn read_name(node: &Node) -> Result<String, String> {
    match &node.value {
        Value::Scalar(..) if node.is_null() => Err("`name` is empty".to_owned()),
        Value::Scalar(text, _) if node.kind_name() == "a string" => {
            let name = text.trim();
            if name.is_empty() {
                Err("`name` is empty".to_owned())
            } else {
                Ok(name.to_owned())
            }
        }
        _ => Err(format!(
            "`name` must be a string, found {}",
            node.kind_name()
        )),
    }
}

/// The text of a scalar field; null is `""`.
fn scalar_text<'a>(node: &'a Node, field: &str) -> Result<&'a str, String> {
    match &node.value {
        Value::Scalar(..) if node.is_null() => Ok(""),
        Value::Scalar(text, _) => Ok(text),
        _ => Err(format!(
            "`{field}` must be a string, found {}",
            node.kind_name()
        )),
    }
}

/// Removes delegation tools, with a warning for each: a subagent cannot delegate.
fn drop_delegation(tools: Vec<ToolRef>, diags: &mut FileDiags<'_>) -> Vec<ToolRef> {
    tools
        .into_iter()
        .filter(|tool| {
            if tool.is_delegation() {
                diags.warning(
                    tool.pos,
                    format!(
                        "the delegation tool `{}` is dropped from `tools`: a subagent cannot \
                         delegate further",
                        tool.raw
                    ),
                );
            }
            !tool.is_delegation()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::OnceLock;

    use proptest::prelude::*;

    use super::*;
    use crate::agent::tool_ref::{BuiltinTool, ToolKind};
    use crate::diag::Severity;

    fn run(path: &str, text: &str, dir: AgentDir) -> (AgentParse, Diagnostics) {
        let file = SourceFile::new(path, text);
        let mut diags = Diagnostics::default();
        let parsed = parse_agent(&file, dir, &mut diags);
        (parsed, diags)
    }

    #[track_caller]
    fn agent(path: &str, text: &str, dir: AgentDir) -> (AgentDef, Diagnostics) {
        match run(path, text, dir) {
            (AgentParse::Agent(def), diags) => (def, diags),
            (AgentParse::NotAnAgent, diags) => panic!("not an agent: {:?}", diags.items),
        }
    }

    /// Each diagnostic as (severity, line, col, message).
    fn diag_list(diags: &Diagnostics) -> Vec<(Severity, u32, u32, String)> {
        diags
            .items
            .iter()
            .map(|d| {
                let pos = d.span.as_ref().map(|s| s.pos).unwrap_or_default();
                (d.severity, pos.line, pos.col, d.message.clone())
            })
            .collect()
    }

    fn raws(def: &AgentDef) -> Option<Vec<&str>> {
        def.tools
            .as_ref()
            .map(|t| t.iter().map(|t| t.raw.as_str()).collect())
    }

    #[test]
    fn reads_every_field() {
        let text = "---\nname: reviewer\ndescription: Reviews code\ntools: Read, Bash(git log*)\n\
                    model: sonnet\ncolor: blue\npermissionMode: plan\n---\nYou review.\n---\nMore.\n";
        let (def, diags) = agent("x/reviewer.md", text, AgentDir::Other);
        assert!(diags.items.is_empty(), "{:?}", diags.items);
        assert_eq!(def.name, "reviewer");
        assert_eq!(def.name_pos, Pos::new(2, 7, 8));
        assert_eq!(def.description, "Reviews code");
        assert_eq!(raws(&def), Some(vec!["Read", "Bash(git log*)"]));
        assert_eq!(
            def.tools.as_ref().unwrap()[1].kind,
            ToolKind::Builtin {
                tool: BuiltinTool::Shell,
                pattern: Some("git log*".into())
            }
        );
        assert_eq!(def.model.as_deref(), Some("sonnet"));
        assert_eq!(def.model_pos.map(|p| (p.line, p.col)), Some((5, 8)));
        assert_eq!(def.body, "You review.\n---\nMore.\n");
        assert_eq!(def.body_line, 9);
        let ignored: Vec<(&str, u32)> = def
            .ignored_keys
            .iter()
            .map(|(k, p)| (k.as_str(), p.line))
            .collect();
        assert_eq!(ignored, [("color", 6), ("permissionMode", 7)]);
        assert_eq!(def.path(), Path::new("x/reviewer.md"));
        assert!(def.unsupported_tools().is_empty());
    }

    #[test]
    fn model_values() {
        let cases = [
            ("model: sonnet\n", Some("sonnet")),
            ("model: inherit\n", None),
            ("model: Inherit\n", None),
            ("model:\n", None),
            ("model: ''\n", None),
            ("", None),
            (
                "model: claude-sonnet-4-20250514\n",
                Some("claude-sonnet-4-20250514"),
            ),
        ];
        for (line, expected) in cases {
            let text = format!("---\nname: a\n{line}---\n");
            let (def, diags) = agent("a.md", &text, AgentDir::Other);
            assert!(diags.items.is_empty(), "{line:?}");
            assert_eq!(def.model.as_deref(), expected, "{line:?}");
            assert_eq!(def.model_pos.is_some(), expected.is_some(), "{line:?}");
        }
    }

    #[test]
    fn description_forms() {
        let cases = [
            ("description: One line\n", "One line"),
            ("description: \"Quoted: yes\"\n", "Quoted: yes"),
            (
                "description: |\n  Line one\n  Line two\n",
                "Line one\nLine two",
            ),
            ("description: >\n  Folded\n  text\n", "Folded text"),
            (
                "description: >-\n  Folded\n  text: with colon\n",
                "Folded text: with colon",
            ),
            ("description:\n", ""),
            ("", ""),
        ];
        for (yaml, expected) in cases {
            let text = format!("---\nname: a\n{yaml}tools: Read\n---\nbody\n");
            let (def, diags) = agent("a.md", &text, AgentDir::Other);
            assert!(diags.items.is_empty(), "{yaml:?}");
            assert_eq!(def.description, expected, "{yaml:?}");
        }
    }

    #[test]
    fn tools_forms() {
        let cases: &[(&str, Option<&[&str]>)] = &[
            ("", None),
            ("tools: []\n", Some(&[])),
            ("tools: Read, Grep\n", Some(&["Read", "Grep"])),
            ("tools: [Read, \"Grep\"]\n", Some(&["Read", "Grep"])),
            (
                "tools:\n  - Read\n  - Bash(a, b)\n",
                Some(&["Read", "Bash(a, b)"]),
            ),
        ];
        for (yaml, expected) in cases {
            let text = format!("---\nname: a\n{yaml}---\n");
            let (def, diags) = agent("a.md", &text, AgentDir::Other);
            assert!(diags.items.is_empty(), "{yaml:?}");
            assert_eq!(raws(&def).as_deref(), *expected, "{yaml:?}");
        }
    }

    #[test]
    fn empty_tools_is_absent_with_a_warning() {
        let (def, diags) = agent("a.md", "---\nname: a\ntools:\n---\n", AgentDir::Other);
        assert_eq!(def.tools, None);
        let list = diag_list(&diags);
        assert_eq!(list.len(), 1);
        assert_eq!((list[0].0, list[0].1), (Severity::Warning, 3));
        assert!(list[0].3.contains("tools: []"));
    }

    #[test]
    fn tools_as_a_mapping_is_an_error() {
        let (parsed, diags) = run(
            "a.md",
            "---\nname: a\ntools:\n  Read: yes\n---\n",
            AgentDir::Other,
        );
        assert!(matches!(parsed, AgentParse::NotAnAgent));
        assert_eq!(
            diag_list(&diags),
            [(
                Severity::Error,
                4,
                3,
                "`tools` must be a list or a comma-separated string, found a mapping".into()
            )]
        );
    }

    #[test]
    fn bad_field_types_are_errors_at_their_position() {
        let cases = [
            (
                "name: 42\n",
                2,
                7,
                "`name` must be a string, found a number",
            ),
            (
                "name: [a, b]\n",
                2,
                7,
                "`name` must be a string, found a list",
            ),
            (
                "name: true\n",
                2,
                7,
                "`name` must be a string, found a boolean",
            ),
            ("name: ''\n", 2, 7, "`name` is empty"),
            ("name:\n", 2, 6, "`name` is empty"),
            (
                "name: a\ndescription: {x: 1}\n",
                3,
                14,
                "`description` must be a string, found a mapping",
            ),
            (
                "name: a\nmodel: [x]\n",
                3,
                8,
                "`model` must be a string, found a list",
            ),
        ];
        for (yaml, line, col, message) in cases {
            let text = format!("---\n{yaml}---\nbody\n");
            let (parsed, diags) = run("a.md", &text, AgentDir::Other);
            assert!(matches!(parsed, AgentParse::NotAnAgent), "{yaml:?}");
            let list = diag_list(&diags);
            assert_eq!(list.len(), 1, "{yaml:?}: {list:?}");
            assert_eq!(list[0].0, Severity::Error, "{yaml:?}");
            assert_eq!((list[0].1, list[0].3.as_str()), (line, message), "{yaml:?}");
            // Null has no width; the column is wherever the parser puts it.
            if !yaml.starts_with("name:\n") {
                assert_eq!(list[0].2, col, "{yaml:?}");
            }
        }
    }

    #[test]
    fn silently_not_an_agent() {
        let cases = [
            ("no frontmatter", "# Title\n\nname: a\n"),
            ("no closing line", "---\nname: a\nbody\n"),
            ("no name", "---\ndescription: README\n---\nbody\n"),
            ("empty frontmatter", "---\n---\nbody\n"),
            (
                "comment-only frontmatter",
                "---\n# just a heading\n---\nbody\n",
            ),
            ("scalar frontmatter", "---\nJust some text\n---\nbody\n"),
            ("list frontmatter", "---\n- a\n- b\n---\n"),
            ("--- not first", "\n---\nname: a\n---\n"),
            ("empty file", ""),
        ];
        for (label, text) in cases {
            let (parsed, diags) = run("README.md", text, AgentDir::Project);
            assert!(matches!(parsed, AgentParse::NotAnAgent), "{label}");
            assert!(diags.items.is_empty(), "{label}: {:?}", diags.items);
        }
    }

    #[test]
    fn crlf_and_bom() {
        let text =
            "\u{feff}---\r\nname: a\r\ndescription: D\r\ntools: Read, Grep\r\n---\r\nBody\r\n";
        let (def, diags) = agent("a.md", text, AgentDir::Project);
        assert!(diags.items.is_empty(), "{:?}", diags.items);
        assert_eq!(def.name, "a");
        assert_eq!(def.description, "D");
        assert_eq!(raws(&def), Some(vec!["Read", "Grep"]));
        assert_eq!(def.tools.as_ref().unwrap()[1].pos, Pos::new(4, 14, 4));
        assert_eq!(def.body, "Body\r\n");
        assert_eq!(def.body_line, 6);
    }

    #[test]
    fn unquoted_colon_is_recovered_with_lines_kept() {
        // The frontmatter of corpus/agents/assumption-mapping.md, verbatim.
        let text = "---\nname: assumption-mapping\ndescription: Use when the user needs to identify \
            and prioritize risky assumptions in a product idea, feature, or strategy. Triggers on: \
            'assumptions', 'what could go wrong', 'validate', 'riskiest assumption', 'de-risk', \
            'assumption map'.\ntools: Read, Write, Edit, Glob, Grep, WebFetch, WebSearch\n---\n\n\
            # Assumption Mapping\n";
        assert!(crate::yaml::parse(frontmatter::split(text).unwrap().yaml).is_err());
        let (def, diags) = agent("assumption-mapping.md", text, AgentDir::Project);
        assert!(diags.items.is_empty(), "{:?}", diags.items);
        assert!(def.description.starts_with("Use when the user"));
        assert!(
            def.description
                .contains("Triggers on: 'assumptions', 'what could go wrong'")
        );
        assert!(def.description.ends_with("'assumption map'."));
        let tools = def.tools.as_ref().unwrap();
        assert_eq!(tools.len(), 7);
        assert_eq!(tools[0].pos, Pos::new(4, 8, 4));
        assert_eq!(tools[6].pos, Pos::new(4, 49, 9));
        assert_eq!(def.unsupported_tools(), ["WebFetch", "WebSearch"]);
        assert_eq!(def.body_line, 6);
    }

    #[test]
    fn recovery_keeps_backslashes_and_quotes_literal() {
        // As in corpus/agents/silent-failure-hunter.md: `\n` written in a plain scalar.
        let text = "---\nname: h\ndescription: Examples:\\n\\n<example>Context: \"x\" here #1</example>\n\
                    model: inherit\ncolor: yellow\n---\nBody\n";
        let (def, diags) = agent("h.md", text, AgentDir::Other);
        assert!(diags.items.is_empty(), "{:?}", diags.items);
        assert_eq!(
            def.description,
            "Examples:\\n\\n<example>Context: \"x\" here #1</example>"
        );
        assert_eq!(def.model, None);
        assert_eq!(def.ignored_keys[0].1.line, 5);
    }

    #[test]
    fn recovery_leaves_valid_and_multi_line_values_alone() {
        // A multi-line plain value with `: ` is not re-quoted, so the error stays.
        let text = "---\nname: a\ndescription: first: line\n  continued\n---\n";
        let (parsed, diags) = run("a.md", text, AgentDir::Other);
        assert!(matches!(parsed, AgentParse::NotAnAgent));
        let list = diag_list(&diags);
        assert_eq!(list.len(), 1);
        assert_eq!((list[0].0, list[0].1), (Severity::Warning, 3));

        // A value ending in `:` is recovered too.
        let text = "---\nname: a\ndescription: Examples:\n---\n";
        let (def, _) = agent("a.md", text, AgentDir::Other);
        assert_eq!(def.description, "Examples:");
    }

    #[test]
    fn yaml_error_after_recovery_is_a_warning_at_its_line() {
        let text =
            "---\nname: a\ndescription: x: y\ntools: [Read, Grep\nmodel: sonnet\n---\nbody\n";
        let (parsed, diags) = run("a.md", text, AgentDir::Other);
        assert!(matches!(parsed, AgentParse::NotAnAgent));
        let list = diag_list(&diags);
        assert_eq!(list.len(), 1, "{list:?}");
        assert_eq!(list[0].0, Severity::Warning);
        assert!((4..=6).contains(&list[0].1), "{list:?}");
        assert!(list[0].3.starts_with("the frontmatter is not valid YAML"));

        let text = "---\nname: a\n\tdescription: tab\n---\n";
        let (parsed, diags) = run("a.md", text, AgentDir::Other);
        assert!(matches!(parsed, AgentParse::NotAnAgent));
        assert_eq!(diag_list(&diags)[0].0, Severity::Warning);
    }

    #[test]
    fn duplicate_keys_warn_and_the_first_wins() {
        let text = "---\nname: a\nmodel: opus\nmodel: haiku\n---\n";
        let (def, diags) = agent("a.md", text, AgentDir::Other);
        assert_eq!(def.model.as_deref(), Some("opus"));
        assert_eq!(
            diag_list(&diags),
            [(
                Severity::Warning,
                4,
                1,
                "duplicate key `model`; the first one is used".into()
            )]
        );
    }

    #[test]
    fn project_dir_name_must_equal_stem() {
        let text = "---\ndescription: d\nname: foo\n---\nbody\n";
        let (parsed, diags) = run("p/.agents/agents/bar.md", text, AgentDir::Project);
        assert!(matches!(parsed, AgentParse::NotAnAgent));
        assert_eq!(
            diag_list(&diags),
            [(
                Severity::Error,
                3,
                7,
                "agent name `foo` does not match the file name `bar.md`; in .agents/agents/ \
                 the name must equal the file stem"
                    .into()
            )]
        );
        assert_eq!(diags.items[0].span.as_ref().unwrap().pos.len, 3);

        // Elsewhere the name is the identity, whatever the file is called.
        let (def, diags) = agent("p/.claude/agents/bar.md", text, AgentDir::Other);
        assert_eq!(def.name, "foo");
        assert!(diags.items.is_empty());

        let (def, _) = agent("p/.agents/agents/foo.md", text, AgentDir::Project);
        assert_eq!(def.name, "foo");
    }

    #[test]
    fn delegation_tool_in_project_dir_skips_the_definition() {
        let text = "---\nname: lead\ntools: Read, Agent, Grep\n---\nbody\n";
        let (parsed, diags) = run(".agents/agents/lead.md", text, AgentDir::Project);
        assert!(matches!(parsed, AgentParse::NotAnAgent));
        let list = diag_list(&diags);
        assert_eq!(list.len(), 1);
        assert_eq!(
            (list[0].0, list[0].1, list[0].2),
            (Severity::Warning, 3, 14)
        );
        assert!(list[0].3.contains("delegation tool `Agent`"), "{list:?}");
        assert!(list[0].3.contains("skipped"));
    }

    #[test]
    fn delegation_tool_elsewhere_is_dropped() {
        let text = "---\nname: lead\ntools:\n  - Read\n  - Task\n  - summon__delegate\n---\nbody\n";
        let (def, diags) = agent(".claude/agents/lead.md", text, AgentDir::Other);
        assert_eq!(raws(&def), Some(vec!["Read"]));
        let list = diag_list(&diags);
        assert_eq!(list.len(), 2);
        assert_eq!((list[0].0, list[0].1, list[0].2), (Severity::Warning, 5, 5));
        assert_eq!(
            list[0].3,
            "the delegation tool `Task` is dropped from `tools`: a subagent cannot delegate further"
        );
        assert_eq!(list[1].1, 6);
    }

    // ---- the corpus ----------------------------------------------------------------------

    fn corpus_dir() -> Option<PathBuf> {
        let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/corpus"));
        if dir.is_dir() {
            Some(dir)
        } else {
            println!("note: {} not found; corpus test skipped", dir.display());
            None
        }
    }

    /// Every `.md` file of the two corpus folders, as (path, text), sorted by path.
    fn corpus_files() -> &'static [(PathBuf, String)] {
        static FILES: OnceLock<Vec<(PathBuf, String)>> = OnceLock::new();
        FILES.get_or_init(|| {
            let Some(dir) = corpus_dir() else {
                return Vec::new();
            };
            let mut files = Vec::new();
            for sub in ["agents", "goose-agents"] {
                let Ok(entries) = std::fs::read_dir(dir.join(sub)) else {
                    continue;
                };
                for entry in entries.flatten() {
                    let path = entry.path();
                    let is_md = path.extension().is_some_and(|e| e == "md");
                    if is_md && path.file_name().is_some_and(|n| n != "README.md") {
                        let text = std::fs::read_to_string(&path).expect("corpus file is UTF-8");
                        files.push((path, text));
                    }
                }
            }
            files.sort();
            files
        })
    }

    /// MANIFEST.tsv rows keyed by file name, each a map from column name to value.
    fn manifest(dir: &Path) -> HashMap<String, HashMap<String, String>> {
        let text = std::fs::read_to_string(dir.join("agents/MANIFEST.tsv")).unwrap();
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split('\t').collect();
        lines
            .filter(|l| !l.is_empty())
            .map(|line| {
                let row: HashMap<String, String> = header
                    .iter()
                    .zip(line.split('\t').chain(std::iter::repeat("")))
                    .map(|(k, v)| ((*k).to_owned(), v.to_owned()))
                    .collect();
                (row["file"].clone(), row)
            })
            .collect()
    }

    #[test]
    fn corpus_loads_as_the_manifest_says() {
        let Some(dir) = corpus_dir() else { return };
        let manifest = manifest(&dir);
        let files = corpus_files();
        assert_eq!(manifest.len(), 76);
        let mut agents = 0;
        let mut project_errors = 0;
        for (path, text) in files {
            let file_name = path.file_name().unwrap().to_string_lossy().into_owned();
            let file = SourceFile::new(path.clone(), text.clone());
            let goose = path.parent().unwrap().ends_with("goose-agents");

            let mut diags = Diagnostics::default();
            let parsed = parse_agent(&file, AgentDir::Other, &mut diags);
            assert!(!diags.has_errors(), "{file_name}: {:?}", diags.items);
            let def = match parsed {
                AgentParse::Agent(def) => Some(def),
                AgentParse::NotAnAgent => None,
            };
            if let Some(def) = &def {
                agents += 1;
                assert!(!def.name.is_empty());
                assert!(!def.body.trim().is_empty(), "{file_name}");
                assert!(text.ends_with(&def.body), "{file_name}");
                let delegating = text
                    .lines()
                    .take_while(|l| !l.is_empty())
                    .any(|l| l.starts_with("tools:") && l.contains("Agent"));
                assert_eq!(
                    diags.items.is_empty(),
                    !delegating,
                    "{file_name}: {:?}",
                    diags.items
                );
            }

            let mut project_diags = Diagnostics::default();
            let _ = parse_agent(&file, AgentDir::Project, &mut project_diags);
            project_errors += project_diags.error_count();

            if goose {
                let def = def.unwrap_or_else(|| panic!("{file_name} is an agent"));
                assert!(diags.items.is_empty(), "{file_name}");
                if file_name == "ralph.md" {
                    assert_eq!(def.name, "Ralph");
                    assert_eq!(def.model.as_deref(), Some("claude-sonnet-4-20250514"));
                    let keys: Vec<&str> =
                        def.ignored_keys.iter().map(|(k, _)| k.as_str()).collect();
                    assert_eq!(keys, ["provider", "avatar"]);
                }
                continue;
            }

            let row = &manifest[&file_name];
            if row["frontmatter"] == "no" {
                assert!(def.is_none(), "{file_name} has no frontmatter");
                assert!(diags.items.is_empty(), "{file_name}");
                continue;
            }
            let def = def.unwrap_or_else(|| panic!("{file_name} is an agent"));
            assert_eq!(def.name, row["name"], "{file_name}");
            match row["model"].as_str() {
                "" | "inherit" => assert_eq!(def.model, None, "{file_name}"),
                model => assert_eq!(def.model.as_deref(), Some(model), "{file_name}"),
            }
            match row["tools"].as_str() {
                "absent" => assert_eq!(def.tools, None, "{file_name}"),
                "empty-list" => assert_eq!(def.tools, Some(Vec::new()), "{file_name}"),
                "string" | "list" => {
                    let tools = def.tools.as_ref().unwrap();
                    assert!(!tools.is_empty(), "{file_name}");
                    for tool in tools {
                        assert_eq!(tool.raw, tool.raw.trim(), "{file_name}");
                        assert!(!tool.raw.contains(['"', ',', '[', ']']), "{file_name}");
                        assert!(tool.pos.line >= 2 && tool.pos.line < def.body_line);
                        assert_ne!(tool.kind, ToolKind::Delegation, "dropped in {file_name}");
                        let line = file.line_text(tool.pos.line).unwrap();
                        let at: String = line
                            .chars()
                            .skip(tool.pos.col as usize - 1)
                            .take(tool.pos.len as usize)
                            .collect();
                        assert_eq!(at, tool.raw, "{file_name}: position of {}", tool.raw);
                    }
                }
                other => panic!("unexpected tools column {other:?}"),
            }
            let strict = crate::yaml::parse(frontmatter::split(text).unwrap().yaml).is_ok();
            assert_eq!(strict, row["strict_yaml"] == "ok", "{file_name}");
            let line = file.line_text(def.name_pos.line).unwrap();
            assert!(line.starts_with("name:"), "{file_name}");
        }
        assert_eq!(files.len(), 81);
        assert_eq!(agents, 73 + 5);
        let mismatched = manifest
            .values()
            .filter(|row| row["name_equals_file_stem"] == "false")
            .count();
        // goose's capitalised names and the two docs examples differ from their stems too.
        assert_eq!(project_errors, mismatched + 5);
    }

    #[test]
    fn corpus_tool_kinds() {
        let Some(dir) = corpus_dir() else { return };
        let read = |name: &str| {
            let path = dir.join("agents").join(name);
            let file = SourceFile::new(&path, std::fs::read_to_string(&path).unwrap());
            match parse_agent(&file, AgentDir::Other, &mut Diagnostics::default()) {
                AgentParse::Agent(def) => def,
                AgentParse::NotAnAgent => panic!("{name}"),
            }
        };
        let kinds = |def: &AgentDef| -> Vec<ToolKind> {
            def.tools.iter().flatten().map(|t| t.kind.clone()).collect()
        };
        let docs = read("docs-lookup.md");
        assert_eq!(
            kinds(&docs)[2],
            ToolKind::Mcp {
                server: "context7".into(),
                tool: Some("resolve-library-id".into())
            }
        );
        let orchestrator = read("codebase-orchestrator.md");
        assert_eq!(
            orchestrator.unsupported_tools(),
            [
                "WebFetch",
                "airis-mcp-gateway",
                "context-manager",
                "error-coordinator",
                "pied-piper",
                "subagent-catalog:search",
                "subagent-catalog:fetch"
            ]
        );
        let lead = read("team-lead.md");
        assert!(!raws(&lead).unwrap().contains(&"Agent"));
        let explorer = read("code-explorer.md");
        assert_eq!(
            kinds(&explorer)[..4],
            [
                ToolKind::Builtin {
                    tool: BuiltinTool::ListFiles,
                    pattern: None
                },
                ToolKind::Builtin {
                    tool: BuiltinTool::Search,
                    pattern: None
                },
                ToolKind::Builtin {
                    tool: BuiltinTool::ListFiles,
                    pattern: None
                },
                ToolKind::Builtin {
                    tool: BuiltinTool::ReadFile,
                    pattern: None
                },
            ]
        );
    }

    // ---- no input panics -----------------------------------------------------------------

    fn parse_both(path: &Path, text: &str) {
        let file = SourceFile::new(path, text);
        for dir in [AgentDir::Project, AgentDir::Other] {
            let mut diags = Diagnostics::default();
            if let AgentParse::Agent(def) = parse_agent(&file, dir, &mut diags) {
                assert!(!def.name.is_empty());
                assert!(text.ends_with(&def.body));
            }
        }
    }

    /// Byte index at or before `i` that is a char boundary of `text`.
    fn floor_boundary(text: &str, i: usize) -> usize {
        let mut i = i.min(text.len());
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    }

    #[test]
    fn corpus_truncated_at_every_frontmatter_line() {
        for (path, text) in corpus_files() {
            let limit = floor_boundary(text, 4000);
            for (i, c) in text[..limit].char_indices() {
                if c == '\n' || c == ':' || c == ',' {
                    parse_both(path, &text[..i]);
                    parse_both(path, &text[..i + 1]);
                }
            }
        }
    }

    const PIECES: [&str; 24] = [
        ":", ": ", "---", "\n---\n", "\"", "'", " #", "\n", "\r\n", "[", "]", "{", "}", "(", ")",
        ",", "|\n", ">-\n", "\t", "\u{feff}", "é", "- ", "&a ", "*a",
    ];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn mutated_corpus_files_never_panic(
            pick in any::<prop::sample::Index>(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), 0..PIECES.len() + 1), 1..8),
            near_start in any::<bool>(),
        ) {
            let files = corpus_files();
            if files.is_empty() {
                return Ok(());
            }
            let (path, original) = &files[pick.index(files.len())];
            let mut text = original.clone();
            for (at, piece) in edits {
                let span = if near_start { text.len().min(1500) } else { text.len() };
                let at = floor_boundary(&text, at.index(span + 1));
                if piece == PIECES.len() {
                    text.truncate(at);
                } else {
                    text.insert_str(at, PIECES[piece]);
                }
            }
            parse_both(path, &text);
        }

        #[test]
        fn token_soup_never_panics(pieces in prop::collection::vec(0..PIECES.len() + 6, 0..60)) {
            const WORDS: [&str; 6] = ["name: a", "tools: ", "model: x", "Read", "description: ", "Bash(x, y)"];
            let text: String = pieces
                .into_iter()
                .map(|i| PIECES.get(i).copied().unwrap_or_else(|| WORDS[i - PIECES.len()]))
                .collect();
            parse_both(Path::new("a.md"), &format!("---\n{text}"));
            parse_both(Path::new("a.md"), &format!("---\n{text}\n---\nbody"));
        }

        #[test]
        fn any_text_never_panics(text in any::<String>()) {
            parse_both(Path::new("a.md"), &text);
            parse_both(Path::new("a.md"), &format!("---\n{text}\n---\n"));
        }
    }
}
