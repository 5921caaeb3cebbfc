//! Counted nouns in messages: `1 task`, `3 tasks`.

/// `n` and the noun, with an `s` unless `n` is 1.
pub(crate) fn count(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    format!("{n} {noun}{}", s(n))
}

/// `"s"` unless `n` is 1: the end of a regular plural.
pub(crate) fn s(n: impl Into<u64>) -> &'static str {
    if n.into() == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(super::count(1u64, "task"), "1 task");
        assert_eq!(super::count(0u64, "task"), "0 tasks");
        assert_eq!(super::count(12u64, "line"), "12 lines");
        assert_eq!(super::s(2u64), "s");
    }
}
