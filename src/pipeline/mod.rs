//! Pipelines: the format, its parser and validator, the dependency graph, and item sources.

pub(crate) mod duration;
pub(crate) mod graph;
pub(crate) mod items;
pub(crate) mod model;
pub(crate) mod parse;
pub(crate) mod refs;
pub(crate) mod shard;
