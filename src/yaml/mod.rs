//! A YAML (and JSON) document as a tree of nodes that keep their positions.
//!
//! Parsing builds [`Node`]s from the parser's events; models are then read from the tree by
//! [`MapReader`], which reports unknown keys with their dotted path and line.

mod load;
mod map_reader;
mod node;

pub(crate) use load::{LoadError, parse};
pub(crate) use map_reader::MapReader;
#[cfg(test)]
pub(crate) use map_reader::key_log;
pub(crate) use node::{Node, ScalarStyle, Value};
