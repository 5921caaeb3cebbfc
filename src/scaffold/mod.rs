//! The files `summon new` writes: valid, commented definitions of an agent role, a recipe or
//! a pipeline, built from a few fields; and the checks on what the user gives for them.
//!
//! - [`name`]: which names make good file stems and source names.
//! - [`param_spec`]: `--param KEY[:TYPE][=DEFAULT]`.
//! - [`yaml_text`]: YAML scalars that keep any text as text.
//! - [`agent`], [`recipe`], [`pipeline`]: the three file texts.
//! - [`line_diff`]: what `--force` changes, line by line.

mod agent;
mod line_diff;
mod name;
mod param_spec;
mod pipeline;
mod recipe;
mod yaml_text;

pub(crate) use agent::{AgentSpec, agent_text};
pub(crate) use line_diff::{Change, DiffLine, line_diff};
pub(crate) use name::check_name;
pub(crate) use param_spec::parse_params;
pub(crate) use pipeline::{PipelineSpec, pipeline_text};
pub(crate) use recipe::{RecipeSpec, recipe_text, title_from_name};
