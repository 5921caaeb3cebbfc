//! The `tools` field of an agent definition: its shapes, its entries and what each names.
//!
//! `tools` is a comma-separated string (`Read, Grep, Bash(git log*)`, split on commas outside
//! parentheses), a flow or block YAML list, or `[]`. Each entry is classified: a Claude Code
//! or summon built-in tool, an MCP / extension tool (`mcp__server__tool`, goose's
//! `ext__tool`), the delegation tool, or something summon does not offer (kept, so the run
//! can say which listed tools were left out).

use crate::diag::{FileDiags, Pos};
use crate::yaml::{Node, ScalarStyle, Value};

/// summon's built-in tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum BuiltinTool {
    ReadFile,
    WriteFile,
    EditFile,
    ListFiles,
    Search,
    Shell,
}

impl BuiltinTool {
    pub(crate) const ALL: [Self; 6] = [
        Self::ReadFile,
        Self::WriteFile,
        Self::EditFile,
        Self::ListFiles,
        Self::Search,
        Self::Shell,
    ];

    /// summon's name for the tool.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::ReadFile => "read_file",
            Self::WriteFile => "write_file",
            Self::EditFile => "edit_file",
            Self::ListFiles => "list_files",
            Self::Search => "search",
            Self::Shell => "shell",
        }
    }

    /// The tool with summon's name `name`.
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|tool| tool.name() == name)
    }

    /// The tool a Claude Code or goose tool name stands for.
    fn from_foreign_name(name: &str) -> Option<Self> {
        Some(match name {
            "Read" => Self::ReadFile,
            "Write" => Self::WriteFile,
            "Edit" | "MultiEdit" => Self::EditFile,
            "Glob" | "LS" => Self::ListFiles,
            "Grep" => Self::Search,
            "Bash" | "developer__shell" => Self::Shell,
            _ => return None,
        })
    }
}

/// Names of the tools that start a subagent (or a pipeline of them), in Claude Code, goose,
/// Mino and summon's MCP server.
const DELEGATION_NAMES: [&str; 9] = [
    "Task",
    "Agent",
    "delegate",
    "summon__delegate",
    "subagent",
    "spawn_agent",
    "summon__spawn_agent",
    "run_pipeline",
    "summon__run_pipeline",
];

/// What a `tools` entry names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolKind {
    /// A built-in tool, with the argument pattern of `Bash(git log*)` when given.
    Builtin {
        tool: BuiltinTool,
        pattern: Option<String>,
    },
    /// A tool of an MCP server / extension; `tool: None` means every tool of the server.
    Mcp {
        server: String,
        tool: Option<String>,
    },
    /// The tool that starts a subagent (`Task`, `Agent`, `delegate`, ...).
    Delegation,
    /// Anything summon does not offer (`WebFetch`, `TodoWrite`, other agents' names, ...).
    Unsupported,
}

impl ToolKind {
    /// Classifies one `tools` entry.
    pub(crate) fn classify(raw: &str) -> Self {
        let (name, pattern) = split_pattern(raw.trim());
        if DELEGATION_NAMES.contains(&name) {
            return Self::Delegation;
        }
        if let Some(tool) = BuiltinTool::from_foreign_name(name).or(BuiltinTool::from_name(name)) {
            return Self::Builtin {
                tool,
                pattern: pattern.map(str::to_owned),
            };
        }
        let extension_tool = match name.strip_prefix("mcp__") {
            Some(rest) => match rest.split_once("__") {
                Some((server, tool)) => Some((server, Some(tool))),
                None => Some((rest, None)),
            },
            None => name.split_once("__").map(|(ext, tool)| (ext, Some(tool))),
        };
        match extension_tool {
            Some((server, tool)) if is_tool_ident(server) && tool.is_none_or(is_tool_ident) => {
                Self::Mcp {
                    server: server.to_owned(),
                    tool: tool.map(str::to_owned),
                }
            }
            _ => Self::Unsupported,
        }
    }
}

/// Splits `Bash(git log*)` into `Bash` and `git log*`; an empty pattern counts as none.
fn split_pattern(raw: &str) -> (&str, Option<&str>) {
    if let Some(inner) = raw.strip_suffix(')')
        && let Some(open) = inner.find('(')
    {
        let pattern = inner[open + 1..].trim();
        return (
            inner[..open].trim_end(),
            (!pattern.is_empty()).then_some(pattern),
        );
    }
    (raw, None)
}

/// A server or tool name: non-empty, no spaces, parentheses or commas.
fn is_tool_ident(s: &str) -> bool {
    !s.is_empty()
        && !s
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '(' | ')' | ','))
}

/// One entry of `tools`, as written, where it is in the file, and what it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolRef {
    pub(crate) raw: String,
    pub(crate) pos: Pos,
    pub(crate) kind: ToolKind,
}

impl ToolRef {
    pub(crate) fn new(raw: impl Into<String>, pos: Pos) -> Self {
        let raw = raw.into();
        let kind = ToolKind::classify(&raw);
        Self { raw, pos, kind }
    }

    pub(crate) fn is_delegation(&self) -> bool {
        self.kind == ToolKind::Delegation
    }
}

/// The two shapes a list-like field may take.
enum ListOrString<'a> {
    /// A scalar to split on commas.
    Str(&'a str),
    List(&'a [Node]),
}

/// Sorts a list-like field into its two shapes, or says what was found instead.
fn list_or_string<'a>(node: &'a Node, field: &str) -> Result<ListOrString<'a>, String> {
    match &node.value {
        Value::Seq(items) => Ok(ListOrString::List(items)),
        Value::Scalar(text, _) => Ok(ListOrString::Str(text)),
        Value::Map(_) => Err(format!(
            "`{field}` must be a list or a comma-separated string, found {}",
            node.kind_name()
        )),
    }
}

/// Splits on commas outside parentheses; returns each trimmed, non-empty entry with its
/// byte offset in `text`.
pub(crate) fn split_commas(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0usize;
    let mut push = |start: usize, end: usize| {
        let piece = &text[start..end];
        let trimmed = piece.trim_start();
        let offset = start + (piece.len() - trimmed.len());
        let trimmed = trimmed.trim_end();
        if !trimmed.is_empty() {
            out.push((offset, trimmed));
        }
    };
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                push(start, i);
                start = i + 1;
            }
            _ => {}
        }
    }
    push(start, text.len());
    out
}

/// The 0-based character column where the scalar `node` (text `value`) starts in the file's
/// line, when its text can be found there unchanged (plain, or quoted without escapes).
fn scalar_text_column(node: &Node, value: &str, line_text: Option<&str>) -> Option<usize> {
    if value.contains('\n')
        || !matches!(
            node.value,
            Value::Scalar(_, ScalarStyle::Plain | ScalarStyle::Quoted)
        )
    {
        return None;
    }
    let line = line_text?;
    let start = usize::try_from(node.pos.col.checked_sub(1)?).ok()?;
    // Plain at the node's column; quoted (or re-quoted by recovery) one further.
    [start, start + 1].into_iter().find(|&col| {
        line.char_indices()
            .nth(col)
            .is_some_and(|(byte, _)| line[byte..].starts_with(value))
    })
}

/// Reads a non-null `tools` value. Positions in `node` are relative to the frontmatter and
/// are moved down by `shift` lines. Reports a wrong shape as an error and returns `None`.
pub(crate) fn read_tools(
    node: &Node,
    shift: u32,
    diags: &mut FileDiags<'_>,
) -> Option<Vec<ToolRef>> {
    match list_or_string(node, "tools") {
        Err(message) => {
            diags.error(node.pos.shifted(shift), message);
            None
        }
        Ok(ListOrString::Str(text)) => {
            let entries = split_commas(text)
                .into_iter()
                .map(|(offset, raw)| {
                    ToolRef::new(raw, entry_pos(node, text, offset, raw, shift, diags))
                })
                .collect();
            Some(entries)
        }
        Ok(ListOrString::List(items)) => {
            let mut entries = Vec::new();
            let mut ok = true;
            for item in items {
                match &item.value {
                    Value::Scalar(..) if item.is_null() => {}
                    Value::Scalar(text, _) => {
                        let raw = text.trim();
                        if !raw.is_empty() {
                            let offset = text.len() - text.trim_start().len();
                            let pos = entry_pos(item, text, offset, raw, shift, diags);
                            entries.push(ToolRef::new(raw, pos));
                        }
                    }
                    _ => {
                        diags.error(
                            item.pos.shifted(shift),
                            format!(
                                "`tools` entries must be tool names, found {}",
                                item.kind_name()
                            ),
                        );
                        ok = false;
                    }
                }
            }
            ok.then_some(entries)
        }
    }
}

/// The whole-file position of `raw`, found at byte `offset` of the scalar `node`'s text
/// `text`; the scalar's own position when the text cannot be found on its line.
fn entry_pos(
    node: &Node,
    text: &str,
    offset: usize,
    raw: &str,
    shift: u32,
    diags: &FileDiags<'_>,
) -> Pos {
    let node_pos = node.pos.shifted(shift);
    let line_text = diags.file.line_text(node_pos.line);
    let Some(base) = scalar_text_column(node, text, line_text) else {
        return node_pos;
    };
    let col = base + text[..offset].chars().count() + 1;
    Pos::new(
        node_pos.line,
        u32::try_from(col).unwrap_or(node_pos.col),
        u32::try_from(raw.chars().count()).unwrap_or(1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::{Diagnostics, SourceFile};
    use crate::yaml::parse;

    #[test]
    fn classify_table() {
        use BuiltinTool::*;
        let builtin = |tool, pattern: Option<&str>| ToolKind::Builtin {
            tool,
            pattern: pattern.map(str::to_owned),
        };
        let mcp = |server: &str, tool: Option<&str>| ToolKind::Mcp {
            server: server.into(),
            tool: tool.map(str::to_owned),
        };
        let cases = [
            ("Read", builtin(ReadFile, None)),
            ("Write", builtin(WriteFile, None)),
            ("Edit", builtin(EditFile, None)),
            ("MultiEdit", builtin(EditFile, None)),
            ("Glob", builtin(ListFiles, None)),
            ("LS", builtin(ListFiles, None)),
            ("Grep", builtin(Search, None)),
            ("Bash", builtin(Shell, None)),
            ("Bash(git log*)", builtin(Shell, Some("git log*"))),
            ("Bash(git log:*)", builtin(Shell, Some("git log:*"))),
            ("Bash()", builtin(Shell, None)),
            ("read_file", builtin(ReadFile, None)),
            ("write_file", builtin(WriteFile, None)),
            ("edit_file", builtin(EditFile, None)),
            ("list_files", builtin(ListFiles, None)),
            ("search", builtin(Search, None)),
            ("shell", builtin(Shell, None)),
            ("shell(cargo *)", builtin(Shell, Some("cargo *"))),
            ("developer__shell", builtin(Shell, None)),
            (
                "mcp__context7__resolve-library-id",
                mcp("context7", Some("resolve-library-id")),
            ),
            (
                "mcp__meigen__search_gallery",
                mcp("meigen", Some("search_gallery")),
            ),
            ("mcp__github", mcp("github", None)),
            ("github__create_issue", mcp("github", Some("create_issue"))),
            (
                "developer__text_editor",
                mcp("developer", Some("text_editor")),
            ),
            ("mcp__", ToolKind::Unsupported),
            ("mcp____x", ToolKind::Unsupported),
            ("__x", ToolKind::Unsupported),
            ("x__", ToolKind::Unsupported),
            ("Task", ToolKind::Delegation),
            ("Agent", ToolKind::Delegation),
            ("Agent(worker)", ToolKind::Delegation),
            ("delegate", ToolKind::Delegation),
            ("summon__delegate", ToolKind::Delegation),
            ("subagent", ToolKind::Delegation),
            ("TaskList", ToolKind::Unsupported),
            ("WebFetch", ToolKind::Unsupported),
            ("WebSearch", ToolKind::Unsupported),
            ("TodoWrite", ToolKind::Unsupported),
            ("NotebookEdit", ToolKind::Unsupported),
            ("context-manager", ToolKind::Unsupported),
            ("subagent-catalog:search", ToolKind::Unsupported),
            ("read", ToolKind::Unsupported),
            ("", ToolKind::Unsupported),
        ];
        for (raw, expected) in cases {
            assert_eq!(ToolKind::classify(raw), expected, "entry {raw:?}");
        }
    }

    #[test]
    fn builtin_names_round_trip() {
        for tool in BuiltinTool::ALL {
            assert_eq!(BuiltinTool::from_name(tool.name()), Some(tool));
        }
        assert_eq!(BuiltinTool::from_name("Read"), None);
    }

    #[test]
    fn split_commas_outside_parentheses() {
        let cases: &[(&str, &[&str])] = &[
            ("Read, Grep, Glob", &["Read", "Grep", "Glob"]),
            ("Read,Grep", &["Read", "Grep"]),
            (
                "Bash(git log*, git diff*), Read",
                &["Bash(git log*, git diff*)", "Read"],
            ),
            ("Read, , Grep,", &["Read", "Grep"]),
            ("  ", &[]),
            ("", &[]),
            ("a), b", &["a)", "b"]),
            ("Bash((x, y), z", &["Bash((x, y), z"]),
        ];
        for (input, expected) in cases {
            let got: Vec<&str> = split_commas(input).into_iter().map(|(_, e)| e).collect();
            assert_eq!(&got, expected, "input {input:?}");
        }
        let offsets: Vec<usize> = split_commas("Read,  Grep")
            .into_iter()
            .map(|(o, _)| o)
            .collect();
        assert_eq!(offsets, [0, 7]);
    }

    /// Reads `tools` of a frontmatter `yaml` placed at line 2 of a file.
    fn tools_of(yaml: &str) -> (Option<Option<Vec<ToolRef>>>, Diagnostics) {
        let text = format!("---\n{yaml}---\nbody\n");
        let file = SourceFile::new("t.md", text);
        let mut diags = Diagnostics::default();
        let root = parse(yaml).unwrap().unwrap();
        let result = root
            .get("tools")
            .filter(|n| !n.is_null())
            .map(|node| read_tools(node, 1, &mut diags.for_file(&file)));
        (result, diags)
    }

    fn raws(tools: &[ToolRef]) -> Vec<&str> {
        tools.iter().map(|t| t.raw.as_str()).collect()
    }

    #[test]
    fn every_shape_of_tools() {
        let cases: &[(&str, Option<&[&str]>)] = &[
            ("tools: Read, Grep, Glob\n", Some(&["Read", "Grep", "Glob"])),
            ("tools: \"Read, Grep\"\n", Some(&["Read", "Grep"])),
            (
                "tools: 'Read, Bash(git log*, git diff*)'\n",
                Some(&["Read", "Bash(git log*, git diff*)"]),
            ),
            ("tools: [\"Read\", \"Grep\"]\n", Some(&["Read", "Grep"])),
            (
                "tools: [Read, Grep, Glob]\n",
                Some(&["Read", "Grep", "Glob"]),
            ),
            (
                "tools:\n  - Read\n  - Bash(git log*)\n",
                Some(&["Read", "Bash(git log*)"]),
            ),
            ("tools: []\n", Some(&[])),
            ("tools: Read\n", Some(&["Read"])),
            ("tools: >-\n  Read,\n  Grep\n", Some(&["Read", "Grep"])),
            ("name: x\n", None),
            ("tools:\n", None),
        ];
        for (yaml, expected) in cases {
            let (result, diags) = tools_of(yaml);
            assert!(diags.items.is_empty(), "{yaml:?}: {:?}", diags.items);
            let got = result.map(|r| r.unwrap());
            assert_eq!(got.as_deref().map(raws).as_deref(), *expected, "{yaml:?}");
        }
    }

    #[test]
    fn mapping_is_an_error() {
        let (result, diags) = tools_of("name: x\ntools:\n  Read: true\n");
        assert_eq!(result, Some(None));
        assert_eq!(diags.items.len(), 1);
        let d = &diags.items[0];
        assert!(d.is_error());
        assert_eq!(
            d.message,
            "`tools` must be a list or a comma-separated string, found a mapping"
        );
        assert_eq!(d.span.as_ref().unwrap().pos.line, 4);
    }

    #[test]
    fn nested_list_entry_is_an_error() {
        let (result, diags) = tools_of("tools:\n  - Read\n  - [Grep]\n");
        assert_eq!(result, Some(None));
        assert!(diags.items[0].message.contains("found a list"));
        assert_eq!(diags.items[0].span.as_ref().unwrap().pos.line, 4);
    }

    #[test]
    fn entry_positions() {
        let (result, _) = tools_of("name: x\ntools: Read,  Bash(git log*), Grep\n");
        let tools = result.unwrap().unwrap();
        let cols: Vec<(u32, u32, u32)> = tools
            .iter()
            .map(|t| (t.pos.line, t.pos.col, t.pos.len))
            .collect();
        assert_eq!(cols, [(3, 8, 4), (3, 15, 14), (3, 31, 4)]);

        let (result, _) = tools_of("tools: \"Read, Grep\"\n");
        let tools = result.unwrap().unwrap();
        let cols: Vec<(u32, u32)> = tools.iter().map(|t| (t.pos.line, t.pos.col)).collect();
        assert_eq!(cols, [(2, 9), (2, 15)]);

        let (result, _) = tools_of("tools: [Read, \"Grep\"]\n");
        let tools = result.unwrap().unwrap();
        let cols: Vec<(u32, u32)> = tools.iter().map(|t| (t.pos.line, t.pos.col)).collect();
        assert_eq!(cols, [(2, 9), (2, 16)]);

        let (result, _) = tools_of("tools:\n  - Read\n  - Grep\n");
        let tools = result.unwrap().unwrap();
        let cols: Vec<(u32, u32)> = tools.iter().map(|t| (t.pos.line, t.pos.col)).collect();
        assert_eq!(cols, [(3, 5), (4, 5)]);

        // Escapes make the text differ from the source: fall back to the value's position.
        let (result, _) = tools_of("tools: \"Re\\x61d, Grep\"\n");
        let tools = result.unwrap().unwrap();
        assert_eq!(raws(&tools), ["Read", "Grep"]);
        assert!(tools.iter().all(|t| (t.pos.line, t.pos.col) == (2, 8)));
    }
}
