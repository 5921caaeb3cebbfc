//! The goose recipe schema, as real recipes use it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use indexmap::IndexMap;

use crate::diag::{Pos, SourceFile};
use crate::yaml::Node;

/// A parsed recipe. Strings are as written (templates not yet rendered).
#[derive(Debug, Clone)]
pub(crate) struct Recipe {
    pub(crate) file: Arc<SourceFile>,
    pub(crate) title: String,
    pub(crate) description: String,
    pub(crate) instructions: Option<String>,
    pub(crate) prompt: Option<String>,
    pub(crate) activities: Vec<String>,
    pub(crate) author: Option<String>,
    pub(crate) extensions: Vec<Extension>,
    /// `extensions: []` written out: as in goose, no extensions at all, so no tools either
    /// (absent means the defaults).
    pub(crate) no_extensions: bool,
    pub(crate) parameters: Vec<Parameter>,
    /// `response.json_schema`, when structured output is asked for.
    pub(crate) response_schema: Option<serde_json::Value>,
    pub(crate) retry: Option<RetryConfig>,
    pub(crate) settings: Settings,
    pub(crate) sub_recipes: Vec<SubRecipe>,
    pub(crate) version: Option<String>,
    /// The recipe's mapping (inside `recipe:` for the desktop form), for rendering.
    pub(crate) root: Node,
    /// The YAML structure itself is templated: the whole text is rendered before parsing.
    pub(crate) whole_text_template: bool,
}

impl Recipe {
    pub(crate) fn path(&self) -> &Path {
        self.file.path()
    }

    /// The directory holding the recipe, the base of relative paths and `recipe_dir`.
    pub(crate) fn dir(&self) -> PathBuf {
        self.path()
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    /// The name a recipe is known by: its file stem.
    pub(crate) fn stem(&self) -> String {
        self.path()
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InputType {
    String,
    Number,
    Boolean,
    Date,
    File,
    Select,
}

impl InputType {
    pub(crate) const NAMES: &'static str = "string, number, boolean, date, file, select";

    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "string" => Self::String,
            "number" => Self::Number,
            "boolean" => Self::Boolean,
            "date" => Self::Date,
            "file" => Self::File,
            "select" => Self::Select,
            _ => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Number => "number",
            Self::Boolean => "boolean",
            Self::Date => "date",
            Self::File => "file",
            Self::Select => "select",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Requirement {
    Required,
    Optional,
    UserPrompt,
}

impl Requirement {
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "required" => Self::Required,
            "optional" => Self::Optional,
            "user_prompt" => Self::UserPrompt,
            _ => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Required => "required",
            Self::Optional => "optional",
            Self::UserPrompt => "user_prompt",
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Parameter {
    pub(crate) key: String,
    pub(crate) pos: Pos,
    pub(crate) input_type: InputType,
    pub(crate) requirement: Requirement,
    pub(crate) default: Option<String>,
    pub(crate) description: String,
    pub(crate) options: Vec<String>,
}

/// `settings`: goose's names and the short ones.
#[derive(Debug, Clone, Default)]
pub(crate) struct Settings {
    pub(crate) provider: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) temperature: Option<f64>,
    pub(crate) max_turns: Option<u32>,
    /// Stop sequences sent with each request.
    pub(crate) stop: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ExtensionKind {
    Builtin,
    Platform,
    Stdio,
    StreamableHttp,
    Sse,
    InlinePython,
    Frontend,
    Other(String),
}

impl ExtensionKind {
    pub(crate) fn from_name(name: &str) -> Self {
        match name {
            "builtin" => Self::Builtin,
            "platform" => Self::Platform,
            "stdio" => Self::Stdio,
            "streamable_http" => Self::StreamableHttp,
            "sse" => Self::Sse,
            "inline_python" => Self::InlinePython,
            "frontend" => Self::Frontend,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The `type` as written in a recipe.
    pub(crate) fn name(&self) -> &str {
        match self {
            Self::Builtin => "builtin",
            Self::Platform => "platform",
            Self::Stdio => "stdio",
            Self::StreamableHttp => "streamable_http",
            Self::Sse => "sse",
            Self::InlinePython => "inline_python",
            Self::Frontend => "frontend",
            Self::Other(name) => name,
        }
    }
}

/// One `extensions` entry. The connection fields are read when MCP servers are started.
#[derive(Debug, Clone)]
pub(crate) struct Extension {
    pub(crate) name: String,
    pub(crate) pos: Pos,
    pub(crate) kind: ExtensionKind,
    pub(crate) args: Vec<String>,
    pub(crate) available_tools: Vec<String>,
    pub(crate) cmd: Option<String>,
    #[expect(
        dead_code,
        reason = "read from the recipe; the model sees the server's own tool descriptions"
    )]
    pub(crate) description: Option<String>,
    pub(crate) env_keys: Vec<String>,
    pub(crate) envs: IndexMap<String, String>,
    pub(crate) headers: IndexMap<String, String>,
    pub(crate) timeout_secs: Option<u64>,
    pub(crate) uri: Option<String>,
    /// `sandbox:` / `network:` of a stdio server (default: no sandbox).
    pub(crate) sandbox: Option<crate::sandbox::Policy>,
    pub(crate) network: bool,
}

impl Extension {
    /// A goose builtin named on the command line (`--extensions developer`).
    pub(crate) fn builtin(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            pos: Pos::new(1, 1, 1),
            kind: ExtensionKind::Builtin,
            args: Vec::new(),
            available_tools: Vec::new(),
            cmd: None,
            description: None,
            env_keys: Vec::new(),
            envs: IndexMap::new(),
            headers: IndexMap::new(),
            timeout_secs: None,
            uri: None,
            sandbox: None,
            network: false,
        }
    }
}

/// One `sub_recipes` entry; `path` is resolved against the recipe's directory.
#[derive(Debug, Clone)]
pub(crate) struct SubRecipe {
    pub(crate) name: String,
    #[expect(
        dead_code,
        reason = "read from the file; no message points at an entry yet"
    )]
    pub(crate) pos: Pos,
    pub(crate) path: PathBuf,
    pub(crate) description: Option<String>,
    pub(crate) values: IndexMap<String, String>,
}

/// goose's `retry`: shell checks run after the agent loop.
#[derive(Debug, Clone)]
pub(crate) struct RetryConfig {
    pub(crate) max_retries: u32,
    pub(crate) checks: Vec<String>,
    pub(crate) on_failure: Option<String>,
    pub(crate) timeout_secs: Option<u64>,
    pub(crate) on_failure_timeout_secs: Option<u64>,
}
