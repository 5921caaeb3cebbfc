//! One finding of `summon doctor` and how it is shown.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::color::Palette;
use crate::diag::Diagnostic;
use crate::diag::render::display_path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Section {
    Provider,
    Environment,
    Config,
    Sources,
    Store,
    Sandbox,
}

impl Section {
    pub(super) const ALL: [Self; 6] = [
        Self::Provider,
        Self::Environment,
        Self::Config,
        Self::Sources,
        Self::Store,
        Self::Sandbox,
    ];

    pub(super) fn title(self) -> &'static str {
        match self {
            Self::Provider => "Provider and model",
            Self::Environment => "Subagent and background-task variables",
            Self::Config => "Config files",
            Self::Sources => "Sources",
            Self::Store => "Store",
            Self::Sandbox => "Sandbox of the model's shell commands",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Self::Provider => "provider",
            Self::Environment => "environment",
            Self::Config => "config",
            Self::Sources => "sources",
            Self::Store => "store",
            Self::Sandbox => "sandbox",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    Ok,
    Warning,
    Error,
}

impl Status {
    fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warning => "warning",
            Self::Error => "error",
        }
    }
}

/// A finding: what, how bad, how to fix it, and where when it is about a file.
#[derive(Debug, Clone)]
pub(super) struct Check {
    pub(super) section: Section,
    pub(super) status: Status,
    pub(super) message: String,
    pub(super) fix: Option<String>,
    pub(super) path: Option<PathBuf>,
    /// Line and column in [`Self::path`].
    pub(super) position: Option<(u32, u32)>,
}

impl Check {
    pub(super) fn new(section: Section, status: Status, message: impl Into<String>) -> Self {
        Self {
            section,
            status,
            message: message.into(),
            fix: None,
            path: None,
            position: None,
        }
    }

    pub(super) fn ok(section: Section, message: impl Into<String>) -> Self {
        Self::new(section, Status::Ok, message)
    }

    pub(super) fn warning(section: Section, message: impl Into<String>) -> Self {
        Self::new(section, Status::Warning, message)
    }

    pub(super) fn error(section: Section, message: impl Into<String>) -> Self {
        Self::new(section, Status::Error, message)
    }

    #[must_use]
    pub(super) fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }

    #[must_use]
    pub(super) fn in_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.path = Some(path.into());
        self
    }

    /// A diagnostic as a finding: its severity, message, position and hint (or `fix`).
    pub(super) fn from_diagnostic(section: Section, d: &Diagnostic, fix: &str) -> Self {
        let status = if d.is_error() {
            Status::Error
        } else {
            Status::Warning
        };
        Self {
            section,
            status,
            message: d.message.clone(),
            fix: Some(d.hint.clone().unwrap_or_else(|| fix.to_owned())),
            path: d.file_path().map(Path::to_path_buf),
            position: d.span.as_ref().map(|s| (s.pos.line, s.pos.col)),
        }
    }

    /// `  ok       message` (a `path:line:col: ` before the message when there is a file),
    /// then `           fix: ...`.
    pub(super) fn render(&self, cwd: &Path, palette: Palette) -> String {
        let label = format!("{:<8}", self.status.name());
        let label = match self.status {
            Status::Ok => palette.green(&label),
            Status::Warning => palette.warning(&label),
            Status::Error => palette.error(&label),
        };
        let mut text = format!("  {label} ");
        if let Some(path) = &self.path {
            text.push_str(&display_path(path, cwd));
            if let Some((line, col)) = self.position {
                text.push_str(&format!(":{line}:{col}"));
            }
            text.push_str(": ");
        }
        // Continuation lines line up under the first.
        text.push_str(&self.message.replace('\n', &format!("\n{:11}", "")));
        text.push('\n');
        if let Some(fix) = &self.fix {
            text.push_str(&format!("{:11}{} {fix}\n", "", palette.bold("fix:")));
        }
        text
    }

    pub(super) fn to_json(&self) -> serde_json::Value {
        json!({
            "section": self.section.key(),
            "status": self.status.name(),
            "message": self.message,
            "fix": self.fix,
            "path": self.path.as_ref().map(|p| p.display().to_string()),
            "line": self.position.map(|(line, _)| line),
            "column": self.position.map(|(_, col)| col),
        })
    }
}
