//! Did-you-mean: close names among the known ones.

/// At most three names close to `wanted`: names containing it or contained in it (as goose
/// matches), then names within a small edit distance (typos such as `cartografer`).
pub(crate) fn suggestions<'a>(
    wanted: &str,
    names: impl IntoIterator<Item = &'a str>,
) -> Vec<&'a str> {
    let wanted_lower = wanted.to_lowercase();
    let mut scored: Vec<(usize, usize, &str)> = names
        .into_iter()
        .filter_map(|name| {
            let lower = name.to_lowercase();
            let distance = strsim::damerau_levenshtein(&wanted_lower, &lower);
            if !wanted_lower.is_empty()
                && (lower.contains(&wanted_lower) || wanted_lower.contains(&lower))
            {
                Some((0, distance, name))
            } else if distance <= max_distance(wanted_lower.chars().count()) {
                Some((1, distance, name))
            } else {
                None
            }
        })
        .collect();
    scored.sort();
    scored.dedup_by(|a, b| a.2 == b.2);
    scored
        .into_iter()
        .take(3)
        .map(|(_, _, name)| name)
        .collect()
}

fn max_distance(len: usize) -> usize {
    match len {
        0..=3 => 1,
        4..=7 => 2,
        _ => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typo_and_substring_matches() {
        let names = [
            "cartographer",
            "code-reviewer",
            "release-notes",
            "reviewer",
            "x",
        ];
        assert_eq!(suggestions("cartografer", names), ["cartographer"]);
        assert_eq!(suggestions("review", names), ["reviewer", "code-reviewer"]);
        assert_eq!(suggestions("release-notes-v2", names), ["release-notes"]);
        assert!(suggestions("zzzzzzzz", names).is_empty());
    }

    #[test]
    fn at_most_three() {
        let names = ["a1", "a2", "a3", "a4"];
        assert_eq!(suggestions("a", names).len(), 3);
    }
}
