//! Writing results: stdout that survives a closed pipe, and YAML for people.

mod stdout;
mod yaml_text;

pub(crate) use stdout::Stdout;
pub(crate) use yaml_text::to_yaml;
