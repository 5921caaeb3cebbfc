//! The template context of a run: parameters, `steps.<id>.output|items|results|data`, `agents`,
//! and per task `item` and `loop`. What finished steps produced is kept here; the context is
//! built as the checks before the run build it ([`crate::compile`]'s builders, re-exported).

use std::sync::Mutex;

use serde_json::{Map, Value, json};

pub(crate) use crate::compile::{agents_json, base_context, item_context};
use crate::pipeline::model::Pipeline;

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
