//! `load`, which a subagent keeps as in goose: list the project's sources and its finished
//! background tasks, load one source into context, collect a background task. It never starts
//! anything; the work is the delegation layer's ([`Loader`]), handed to the tool set.

use serde_json::{Value, json};

use super::{ToolError, ToolOutput};
use crate::provider::ToolSpec;

/// The `load` tool's work: a source's or a task's text for the model, or an error in its
/// words. It blocks (it may wait for a running task).
pub(crate) trait Loader: Send + Sync + std::fmt::Debug {
    fn load(&self, source: Option<&str>, peek: bool, cancel: bool) -> Result<String, String>;
}

pub(super) fn load_spec() -> ToolSpec {
    ToolSpec {
        name: NAME.into(),
        description: "Without `source`: list the project's recipes, agents and finished \
             background tasks. With a source's name: its content. With a background task's \
             id: its result (call again while it runs; `peek`: progress only, `cancel`: stop \
             it). Starts nothing."
            .into(),
        parameters: json!({
            "type": "object",
            "properties": {
                "source": {"type": "string"},
                "peek": {"type": "boolean"},
                "cancel": {"type": "boolean"}
            },
            "additionalProperties": false
        }),
    }
}

/// The tool's name.
pub(super) const NAME: &str = "load";

const EXPECTED: &str = "{\"source\"?: string, \"peek\"?: boolean, \"cancel\"?: boolean}";

/// Runs a call on a blocking thread.
pub(super) async fn load(loader: std::sync::Arc<dyn Loader>, args: &Value) -> ToolOutput {
    let arguments = |reason: String| {
        ToolOutput::from(Err::<String, _>(ToolError::Arguments {
            tool: NAME,
            reason,
            expected: EXPECTED,
        }))
    };
    let map = match args {
        Value::Object(map) => map.clone(),
        Value::Null => serde_json::Map::new(),
        _ => return arguments("expected a JSON object".into()),
    };
    if let Some(key) = map
        .keys()
        .find(|k| !["source", "peek", "cancel"].contains(&k.as_str()))
    {
        return arguments(format!("unknown key `{}`", super::shown(key)));
    }
    let source = match map.get("source") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.trim().is_empty() => None,
        Some(Value::String(s)) => Some(s.trim().to_owned()),
        Some(_) => return arguments("`source` must be a string".into()),
    };
    let flag = |key: &str| match map.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(format!("`{key}` must be true or false")),
    };
    let (peek, cancel) = match (flag("peek"), flag("cancel")) {
        (Ok(peek), Ok(cancel)) => (peek, cancel),
        (Err(e), _) | (_, Err(e)) => return arguments(e),
    };
    let done = tokio::task::spawn_blocking(move || loader.load(source.as_deref(), peek, cancel));
    match done.await {
        Ok(Ok(text)) => ToolOutput::ok(text),
        Ok(Err(message)) => ToolOutput::error(message),
        Err(_) => ToolOutput::error("load: the call ended early".to_owned()),
    }
}
