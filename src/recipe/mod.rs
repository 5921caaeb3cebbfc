//! goose recipes: the model, the parser, parameter binding and rendering.

mod check;
mod literals;
mod model;
pub(crate) mod params;
mod parse;
mod render;

pub(crate) use check::check_templates;
pub(crate) use model::{
    Extension, ExtensionKind, InputType, Parameter, Recipe, Requirement, RetryConfig, SubRecipe,
};
pub(crate) use params::{Binding, ParamInput, ValueSource, bind_params};
pub(crate) use parse::{
    MAX_STOP_SEQUENCES, Strictness, parse_recipe, read_parameters, stop_sequences,
};
pub(crate) use render::render_recipe;
