//! Reads a mapping key by key and reports the keys nobody asked for.

use super::{Node, Value};
use crate::diag::FileDiags;

/// Walks one mapping. Every key looked up with [`MapReader::get`] counts as known; on
/// [`MapReader::finish`] the others become warnings naming their dotted path and line, with
/// the known key they were probably meant to be (`concurency` → `concurrency`).
pub(crate) struct MapReader<'a> {
    entries: &'a [(Node, Node)],
    used: Vec<bool>,
    path: String,
    /// Every key looked up, present or not: the keys this mapping may have.
    known: Vec<String>,
}

impl<'a> MapReader<'a> {
    /// `path` is the dotted path of this mapping (`""` for the document root).
    pub(crate) fn new(node: &'a Node, path: impl Into<String>) -> Option<Self> {
        match &node.value {
            Value::Map(entries) => Some(Self {
                entries,
                used: vec![false; entries.len()],
                path: path.into(),
                known: Vec::new(),
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
        if !self.known.iter().any(|k| k == key) {
            self.known.push(key.to_owned());
        }
        let index = self
            .entries
            .iter()
            .position(|(k, _)| k.as_str() == Some(key))?;
        self.used[index] = true;
        let (k, v) = &self.entries[index];
        Some((k, v))
    }

    /// The key node of `key` when it is present, marked as reported but not as known: for a
    /// key in the wrong place, which its caller warns about in words of its own.
    pub(crate) fn misplaced(&mut self, key: &str) -> Option<&'a Node> {
        let index = self
            .entries
            .iter()
            .position(|(k, _)| k.as_str() == Some(key))?;
        if self.used[index] {
            return None;
        }
        self.used[index] = true;
        Some(&self.entries[index].0)
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
        #[cfg(test)]
        key_log::record(&self.path, &self.known);
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
                let hint = match self.closest(name) {
                    Some(known) => format!("; did you mean `{known}`?"),
                    None => String::new(),
                };
                diags.warning(
                    key.pos,
                    format!("unknown key `{}`{hint}", self.child_path(name)),
                );
            }
        }
    }

    /// The known key `name` is most likely a misspelling of: at most two edits away (one for
    /// short keys), or the same but for case, `-` or `_`.
    fn closest(&self, name: &str) -> Option<&str> {
        let folded = |s: &str| s.to_lowercase().replace(['-', '_'], "");
        self.known
            .iter()
            .filter(|known| !self.entries.iter().any(|(k, _)| k.as_str() == Some(known)))
            .map(|known| {
                let distance = if folded(known) == folded(name) {
                    0
                } else {
                    strsim::damerau_levenshtein(known, name)
                };
                (distance, known.as_str())
            })
            .filter(|(distance, known)| *distance <= if known.len() <= 4 { 1 } else { 2 })
            .min_by_key(|(distance, _)| *distance)
            .map(|(_, known)| known)
    }
}

/// The keys every finished reader knew, by dotted path: what the published JSON Schemas are
/// checked against, so that a key the parser reads cannot be missing from them.
#[cfg(test)]
pub(crate) mod key_log {
    use std::cell::RefCell;
    use std::collections::{BTreeMap, BTreeSet};

    thread_local! {
        static LOG: RefCell<Option<BTreeMap<String, BTreeSet<String>>>> = const { RefCell::new(None) };
    }

    /// Runs `parse` and returns the keys each mapping it read knew, by path with list
    /// indexes written `[]` (`steps[].fan_out`).
    pub(crate) fn collect(parse: impl FnOnce()) -> BTreeMap<String, BTreeSet<String>> {
        LOG.with(|log| *log.borrow_mut() = Some(BTreeMap::new()));
        parse();
        LOG.with(|log| log.borrow_mut().take().unwrap_or_default())
    }

    pub(super) fn record(path: &str, known: &[String]) {
        LOG.with(|log| {
            if let Some(log) = log.borrow_mut().as_mut() {
                log.entry(generic_path(path))
                    .or_default()
                    .extend(known.iter().cloned());
            }
        });
    }

    /// `steps[3].fan_out` → `steps[].fan_out`.
    fn generic_path(path: &str) -> String {
        let mut out = String::new();
        let mut in_index = false;
        for c in path.chars() {
            match c {
                '[' => {
                    in_index = true;
                    out.push_str("[]");
                }
                ']' => in_index = false,
                _ if in_index => {}
                _ => out.push(c),
            }
        }
        out
    }
}
