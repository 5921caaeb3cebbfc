//! Compiling a pipeline before it runs: one pass from the parsed file, its parameters, the
//! run's flags and the source catalog to each step's settings, source and items, and every
//! problem certain before a task is rendered. `summon validate`, `summon run` (its dry run,
//! its checks before the first request, `--resume`) and `summon merge` start from it; the
//! engine (`exec`) reads the template context and the source checks from here.

mod context;
mod params;
mod pipeline;
mod render;
mod settings;
mod sources;
mod tools;

pub(crate) use context::{agents_json, base_context, item_context, named_source};
pub(crate) use pipeline::{
    Check, CompiledPipeline, Inputs, ItemSource, ModelChoice, compile_pipeline,
};
pub(crate) use render::{Compiled, Rendered, source_error_in};
pub(crate) use settings::{Flags, StepSettings};
pub(crate) use sources::{Contexts, check_task, is_catalog_error, run_catalog_error};
