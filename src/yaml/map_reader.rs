//! Reads a mapping key by key and reports the keys nobody asked for.

use super::{Node, Value};
use crate::diag::FileDiags;

/// Walks one mapping. Every key looked up with [`MapReader::get`] counts as known; on
/// [`MapReader::finish`] the others become warnings naming their dotted path and line.
pub(crate) struct MapReader<'a> {
    entries: &'a [(Node, Node)],
    used: Vec<bool>,
    path: String,
}

impl<'a> MapReader<'a> {
    /// `path` is the dotted path of this mapping (`""` for the document root).
    pub(crate) fn new(node: &'a Node, path: impl Into<String>) -> Option<Self> {
        match &node.value {
            Value::Map(entries) => Some(Self {
                entries,
                used: vec![false; entries.len()],
                path: path.into(),
            }),
            _ => None,
        }
    }

    /// The value of `key`; null values count as absent.
    pub(crate) fn get(&mut self, key: &str) -> Option<&'a Node> {
        self.get_entry(key).map(|(_, v)| v).filter(|v| !v.is_null())
    }

    /// The key node and value of `key`, null included.
    pub(crate) fn get_entry(&mut self, key: &str) -> Option<(&'a Node, &'a Node)> {
        let index = self
            .entries
            .iter()
            .position(|(k, _)| k.as_str() == Some(key))?;
        self.used[index] = true;
        let (k, v) = &self.entries[index];
        Some((k, v))
    }

    /// Marks keys as known without reading them (keys the format tolerates but ignores).
    pub(crate) fn ignore(&mut self, keys: &[&str]) {
        for key in keys {
            let _ = self.get_entry(key);
        }
    }

    /// The dotted path of a child key.
    pub(crate) fn child_path(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// Warns about every key that was not read, and about keys given twice.
    pub(crate) fn finish(self, diags: &mut FileDiags<'_>) {
        for (index, (key, _)) in self.entries.iter().enumerate() {
            let name = key.as_str().unwrap_or("?");
            let earlier = self.entries[..index]
                .iter()
                .any(|(k, _)| k.as_str() == Some(name));
            if earlier {
                diags.warning(
                    key.pos,
                    format!(
                        "duplicate key `{}`; the first one is used",
                        self.child_path(name)
                    ),
                );
            } else if !self.used[index] {
                diags.warning(key.pos, format!("unknown key `{}`", self.child_path(name)));
            }
        }
    }
}
