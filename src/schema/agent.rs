//! The schema of an agent's YAML frontmatter (Claude Code's format).

use serde_json::{Value, json};

/// The keys summon reads; the others (`color`, `permissionMode`, ...) are Claude Code's and
/// allowed.
pub(super) fn schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": super::id("agent"),
        "title": "summon agent frontmatter",
        "description": "The YAML frontmatter of an agent role (a Markdown file in .agents/agents/, .claude/agents/, ...): the body after it is the system prompt. Keys other than these are kept for other tools and ignored by summon.",
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {
                "description": "The agent's name, used with `summon delegate NAME`; in .agents/agents/ it equals the file name without `.md`.",
                "type": "string",
                "minLength": 1
            },
            "description": {
                "description": "When to use this agent: shown in listings and to a model choosing whom to delegate to.",
                "type": ["string", "number", "boolean"]
            },
            "tools": {
                "description": "The tools the agent may use: a list (`[Read, Grep, Bash(git diff:*)]`) or one comma-separated string; `[]` for none. Absent: every tool.",
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "string"}},
                    {"type": "null"}
                ]
            },
            "model": {
                "description": "The model for this agent (a name or an alias such as `sonnet`); `inherit` or empty for the caller's model.",
                "type": ["string", "null"]
            }
        },
        "additionalProperties": true
    })
}
