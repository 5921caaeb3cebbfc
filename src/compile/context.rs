//! The template context every task renders with: parameters, `steps.<id>`, `agents`, and per
//! fan-out task `item` and `loop`; and what a rendered `source:` names. The run and the
//! checks before it build it the same way.

use indexmap::IndexMap;
use serde_json::{Map, Value, json};

use crate::pipeline::model::{Decompose, Pipeline, StepKind};
use crate::pipeline::refs;
use crate::source::{Catalog, SourceDef};

/// What templates can read before the run: the parameters given, `agents`, and the items of
/// the pipeline's literal `items:` lists (`steps.<id>.items`), as one base context.
pub(crate) struct Known<'p> {
    pipeline: &'p Pipeline,
    pub(crate) base: minijinja::Value,
}

impl<'p> Known<'p> {
    pub(crate) fn new(
        pipeline: &'p Pipeline,
        catalog: &Catalog,
        params: &IndexMap<String, String>,
    ) -> Self {
        let mut known = Self {
            pipeline,
            base: minijinja::Value::UNDEFINED,
        };
        let mut steps = Map::new();
        for step in &pipeline.steps {
            if let Some(items) = known.literal_items(&step.id) {
                steps.insert(step.id.clone(), json!({ "items": items }));
            }
        }
        known.base = base_context(params, Value::Object(steps), &agents_json(catalog));
        known
    }

    /// The items of step `id` when they are a literal list.
    pub(crate) fn literal_items(&self, id: &str) -> Option<&'p [Value]> {
        self.pipeline.steps.iter().find_map(|s| match &s.kind {
            StepKind::Decompose(Decompose::Items(items)) if s.id == id => Some(items.as_slice()),
            _ => None,
        })
    }

    /// Whether a template reads no step but the items of literal lists.
    pub(crate) fn reads_only_literal_items(&self, text: &str) -> bool {
        refs::whole_steps_uses(text).is_empty()
            && refs::step_refs(text)
                .iter()
                .all(|r| r.field.as_deref() == Some("items") && self.literal_items(&r.id).is_some())
    }
}

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
