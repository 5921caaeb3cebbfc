//! The JSON Schemas (draft 2020-12) of the files people write: a pipeline, a goose recipe and
//! an agent's frontmatter, for editors that complete and check YAML (`summon schema KIND`,
//! `schemas/KIND.json`, the `# yaml-language-server: $schema=...` line of `summon new`).
//!
//! The parsers read a YAML node tree by hand, so the schemas are written here next to them
//! and kept equal to them by tests: every key a parser reads at every place (the keys its
//! readers look up, recorded while it parses a file that has all of them) must be a property
//! of the schema at that place, and every property of the schema must be a key the parser
//! reads. A key added to a parser without its schema entry, or the other way round, fails
//! `cargo test`.
//!
//! What the schemas accept follows what summon accepts: pipelines are summon's own format, so
//! an unknown key (a warning in `summon validate`) is flagged; recipes and agent frontmatter
//! are formats shared with goose and Claude Code, which ignore keys they do not know, so
//! other keys are allowed there.

mod agent;
mod pipeline;
mod recipe;

#[cfg(test)]
mod coverage;

use serde_json::Value;

/// The kinds of file that have a schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SchemaKind {
    Pipeline,
    Recipe,
    Agent,
}

impl SchemaKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Pipeline => "pipeline",
            Self::Recipe => "recipe",
            Self::Agent => "agent",
        }
    }

    /// The schema as a JSON value.
    pub(crate) fn schema(self) -> Value {
        match self {
            Self::Pipeline => pipeline::schema(),
            Self::Recipe => recipe::schema(),
            Self::Agent => agent::schema(),
        }
    }

    /// The schema as the text `summon schema` prints and `schemas/KIND.json` holds.
    pub(crate) fn text(self) -> String {
        let mut text = serde_json::to_string_pretty(&self.schema()).unwrap_or_default();
        text.push('\n');
        text
    }
}

/// The `$id` of a kind's schema: its file name, as published in `schemas/`.
fn id(kind: &str) -> String {
    format!("summon-{kind}.schema.json")
}
