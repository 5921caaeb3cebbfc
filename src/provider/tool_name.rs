//! Tool names providers accept. OpenAI and Anthropic both require a tool's name to match
//! `^[a-zA-Z0-9_-]{1,64}$` and to be unique within one request, while MCP servers name their
//! tools freely (`dotted.name`, long names) and two servers may offer the same name. The
//! names an MCP tool is offered under are made valid and unique here; the session keeps the
//! server's own name beside each, so a call to the offered name reaches the right tool.

use std::collections::HashSet;

/// The longest tool name providers accept.
pub(crate) const MAX_LEN: usize = 64;

/// Whether providers accept `name` as a tool name.
pub(crate) fn is_valid(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_LEN && name.bytes().all(is_name_byte)
}

/// Whether `name` may start a tool name (an extension's or a server's name): the allowed
/// characters, and short enough to leave room for a tool's own name.
pub(crate) fn is_valid_prefix(name: &str) -> bool {
    is_valid(name) && name.len() <= MAX_LEN - 4
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Valid, unique names for `wanted`, in order. A name that is valid and not taken by an
/// earlier one (or by `reserved`) is kept as it is; any other has its other characters
/// replaced by `_`, is shortened with a hash of the wanted name when too long, and gets a
/// number when still taken.
pub(crate) fn assign(wanted: &[String], reserved: &[&str]) -> Vec<String> {
    let mut taken: HashSet<String> = reserved.iter().map(|s| (*s).to_owned()).collect();
    // First the names that need no change, so that a renamed one never takes their place.
    let mut out: Vec<Option<String>> = wanted
        .iter()
        .map(|name| (is_valid(name) && taken.insert(name.clone())).then(|| name.clone()))
        .collect();
    for (slot, name) in out.iter_mut().zip(wanted) {
        if slot.is_none() {
            let name = unique(&valid_form(name), name, &taken);
            taken.insert(name.clone());
            *slot = Some(name);
        }
    }
    out.into_iter().flatten().collect()
}

/// `name` with other characters replaced by `_`, cut to [`MAX_LEN`] with a hash of the whole
/// name when longer (so two long names that share their beginning stay apart).
fn valid_form(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii() && is_name_byte(c as u8) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() {
        out.push_str("tool");
    }
    if out.len() > MAX_LEN {
        let hash = format!("_{:08x}", fnv1a(name));
        out.truncate(MAX_LEN - hash.len());
        out.push_str(&hash);
    }
    out
}

/// `base`, or `base` with a number (`_2`, `_3`, ...) that no name in `taken` has.
fn unique(base: &str, original: &str, taken: &HashSet<String>) -> String {
    if !taken.contains(base) {
        return base.to_owned();
    }
    let mut n = 2u64;
    loop {
        let suffix = format!("_{n}");
        let mut name = base.to_owned();
        if name.len() + suffix.len() > MAX_LEN {
            let hash = format!("_{:08x}", fnv1a(original));
            name = valid_form(original);
            name.truncate(MAX_LEN - suffix.len() - hash.len());
            name.push_str(&hash);
        }
        name.push_str(&suffix);
        if !taken.contains(&name) {
            return name;
        }
        n += 1;
    }
}

/// A small stable hash (the same name is always offered under the same shortened name).
fn fnv1a(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5_u32, |hash, b| {
        (hash ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(wanted: &[&str]) -> Vec<String> {
        let wanted: Vec<String> = wanted.iter().map(|s| (*s).to_owned()).collect();
        assign(&wanted, &["read_file"])
    }

    #[test]
    fn valid_unique_names_are_kept() {
        assert_eq!(
            names(&["fs__read", "fs__write", "web__get-page"]),
            ["fs__read", "fs__write", "web__get-page"]
        );
    }

    #[test]
    fn other_characters_become_underscores() {
        assert_eq!(
            names(&["raw__dotted.name-with-dash", "my ext__x"]),
            ["raw__dotted_name-with-dash", "my_ext__x"]
        );
    }

    #[test]
    fn duplicates_and_reserved_names_get_numbers() {
        assert_eq!(
            names(&["a__b", "a__b", "a.b", "a_b", "read_file"]),
            ["a__b", "a__b_2", "a_b_2", "a_b", "read_file_2"]
        );
    }

    #[test]
    fn long_names_are_shortened_and_stay_apart() {
        let long_a = format!("ext__{}a", "x".repeat(80));
        let long_b = format!("ext__{}b", "x".repeat(80));
        let got = names(&[&long_a, &long_b, &long_a]);
        assert!(got.iter().all(|n| is_valid(n)), "{got:?}");
        let distinct: HashSet<&String> = got.iter().collect();
        assert_eq!(distinct.len(), 3, "{got:?}");
        assert_eq!(names(&[&long_a])[0], got[0], "stable");
    }

    #[test]
    fn validity() {
        assert!(is_valid("a-b_C9"));
        assert!(!is_valid(""));
        assert!(!is_valid("a.b"));
        assert!(!is_valid("a b"));
        assert!(!is_valid(&"x".repeat(65)));
        assert!(is_valid(&"x".repeat(64)));
        assert!(is_valid_prefix("github"));
        assert!(!is_valid_prefix(&"x".repeat(61)));
    }
}
