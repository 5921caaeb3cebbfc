//! The template context every task renders with: parameters, `steps.<id>`, `agents`, and per
//! fan-out task `item` and `loop`; and what a rendered `source:` names. The run and the
//! checks before it build it the same way.

use serde_json::{Map, Value, json};

use crate::source::{Catalog, SourceDef};

/// The run's frozen catalog as templates see it: name, kind, description and tools, never
/// the role text.
pub(crate) fn agents_json(catalog: &Catalog) -> Value {
    catalog
        .sources
        .iter()
        .map(|s| {
            let tools = match &s.def {
                SourceDef::Agent(agent) => agent
                    .tools
                    .as_ref()
                    .map(|t| t.iter().map(|r| r.raw.clone()).collect::<Vec<_>>()),
                _ => None,
            };
            json!({"name": s.name, "kind": s.kind.name(), "description": s.description, "tools": tools})
        })
        .collect()
}

/// The context shared by every task of a step.
pub(crate) fn base_context(
    params: &indexmap::IndexMap<String, String>,
    steps: Value,
    agents: &Value,
) -> minijinja::Value {
    let mut map = Map::new();
    for (key, value) in params {
        map.insert(key.clone(), Value::String(value.clone()));
    }
    map.insert("steps".into(), steps);
    map.insert("agents".into(), agents.clone());
    minijinja::Value::from(minijinja::value::Serde(Value::Object(map)))
}

/// The context of one fan-out task: `item` and `loop` over the step's base.
pub(crate) fn item_context(base: &minijinja::Value, item: &Value, index: u64) -> minijinja::Value {
    let local = minijinja::context! {
        item => minijinja::Value::from(minijinja::value::Serde(item)),
        loop => minijinja::context! { index => index + 1, index0 => index },
    };
    minijinja::value::merge_maps([local, base.clone()])
}

/// The source a rendered `source:` names; `None` when it is empty or null (a general
/// subagent).
pub(crate) fn named_source(rendered: &str) -> Option<&str> {
    let name = rendered.trim();
    (!name.is_empty() && !matches!(name, "null" | "none" | "None")).then_some(name)
}
