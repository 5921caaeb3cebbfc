//! The template context of a run: parameters, `steps.<id>.output|items|results|data`, `agents`,
//! and per task `item` and `loop`.

use std::sync::Mutex;

use serde_json::{Map, Value, json};

use crate::pipeline::model::Pipeline;
use crate::source::{Catalog, SourceDef};

/// What finished steps produced, readable by later steps' templates.
#[derive(Debug, Default, Clone)]
pub(crate) struct StepData {
    pub(crate) output: Option<String>,
    pub(crate) items: Option<Vec<Value>>,
    /// `{item, output, status, data}` in item order.
    pub(crate) results: Option<Vec<Value>>,
    /// The parsed answer of a one-task step validated against a JSON schema.
    pub(crate) data: Option<Value>,
    /// Items still in their file, streamed by the fan-out over them (no template reads
    /// `steps.<id>.items`, so they are never held in memory).
    pub(crate) file: Option<std::path::PathBuf>,
}

/// Step outputs by step index, filled as steps finish.
#[derive(Debug, Default)]
pub(crate) struct StepOutputs {
    data: Mutex<Vec<StepData>>,
    /// The last step's text when nothing but stdout reads it: kept aside, never in
    /// `steps.<id>.output`.
    final_text: Mutex<Option<crate::event::FinalText>>,
}

impl StepOutputs {
    pub(crate) fn new(steps: usize) -> Self {
        Self {
            data: Mutex::new(vec![StepData::default(); steps]),
            final_text: Mutex::new(None),
        }
    }

    pub(crate) fn set_final(&self, text: crate::event::FinalText) {
        if let Ok(mut slot) = self.final_text.lock() {
            *slot = Some(text);
        }
    }

    pub(crate) fn take_final(&self) -> Option<crate::event::FinalText> {
        self.final_text.lock().ok()?.take()
    }

    pub(crate) fn set(&self, step: usize, data: StepData) {
        if let Ok(mut all) = self.data.lock() {
            all[step] = data;
        }
    }

    pub(crate) fn get(&self, step: usize) -> StepData {
        self.data
            .lock()
            .map(|all| all[step].clone())
            .unwrap_or_default()
    }

    /// `{"<id>": {"output", "items", "results", "data"}}` for the finished steps.
    pub(crate) fn to_json(&self, pipeline: &Pipeline) -> Value {
        let Ok(all) = self.data.lock() else {
            return json!({});
        };
        let mut steps = Map::new();
        for (step, data) in pipeline.steps.iter().zip(all.iter()) {
            steps.insert(
                step.id.clone(),
                json!({"output": data.output, "items": data.items, "results": data.results, "data": data.data}),
            );
        }
        Value::Object(steps)
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
