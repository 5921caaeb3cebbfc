//! Context windows: how many tokens (prompt and output together) a model accepts in one
//! request. Known models have one built in; the config file's `models.<id>.context_window`
//! overrides or adds one, and a pipeline step's `context_window` overrides both.

use indexmap::IndexMap;

use crate::diag::FileDiags;
use crate::yaml::{MapReader, Node};

/// Built-in context windows, by model id prefix (the first match wins, so longer prefixes
/// come first). Dated snapshots (`gpt-4o-2024-08-06`) share their family's window.
const BUILT_IN: &[(&str, u64)] = &[
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4", 8_192),
    ("gpt-3.5-turbo", 16_385),
    ("gpt-5", 400_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    ("claude-", 200_000),
];

/// The built-in context window of `model`, if it is a known model.
pub(crate) fn built_in(model: &str) -> Option<u64> {
    BUILT_IN
        .iter()
        .find(|(prefix, _)| model.starts_with(prefix))
        .map(|(_, window)| *window)
}

/// `models: { <id>: { context_window: N } }` of one config file.
pub(crate) fn read_models(
    node: &Node,
    d: &mut FileDiags<'_>,
) -> (IndexMap<String, u64>, IndexMap<String, bool>) {
    let mut windows = IndexMap::new();
    let mut native = IndexMap::new();
    let Some(entries) = node.as_map() else {
        d.error(
            node.pos,
            format!(
                "`models` must be a mapping of model ids to `{{ context_window: TOKENS }}`, found {}",
                node.kind_name()
            ),
        );
        return (windows, native);
    };
    for (key, value) in entries {
        let Some(model) = key.as_str().map(str::trim).filter(|m| !m.is_empty()) else {
            d.error(key.pos, "a model id in `models` must be a string");
            continue;
        };
        let path = format!("models.{model}");
        let Some(mut r) = MapReader::new(value, path.clone()) else {
            d.error(
                value.pos,
                format!(
                    "`{path}` must be a mapping such as `{{ context_window: 32000 }}`, found {}",
                    value.kind_name()
                ),
            );
            continue;
        };
        if let Some(node) = r.get("context_window") {
            match node.to_json().as_u64() {
                Some(n) if n >= 1 => {
                    windows.insert(model.to_owned(), n);
                }
                _ => d.error(
                    node.pos,
                    format!("`{path}.context_window` must be a whole number of tokens ≥ 1"),
                ),
            }
        }
        if let Some(node) = r.get("structured_outputs") {
            match node.to_json().as_bool() {
                Some(on) => {
                    native.insert(model.to_owned(), on);
                }
                None => d.error(
                    node.pos,
                    format!("`{path}.structured_outputs` must be true or false"),
                ),
            }
        }
        r.finish(d);
    }
    (windows, native)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_families_have_a_window_and_others_none() {
        assert_eq!(built_in("gpt-4o-mini"), Some(128_000));
        assert_eq!(built_in("gpt-4.1-mini"), Some(1_047_576));
        assert_eq!(built_in("claude-sonnet-4-5"), Some(200_000));
        assert_eq!(built_in("llama3.1:8b"), None);
    }
}
