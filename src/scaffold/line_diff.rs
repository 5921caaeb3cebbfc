//! A line diff of two small texts, for showing what `summon new --force` replaces.

/// Whether a line was removed or added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    Removed,
    Added,
}

/// One changed line: what happened, its 1-based line number (in the old text for a removed
/// line, in the new text for an added one) and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DiffLine {
    pub(crate) change: Change,
    pub(crate) line: usize,
    pub(crate) text: String,
}

/// Above this many cells the diff is not searched for common lines: everything is replaced.
const MAX_CELLS: usize = 4_000_000;

/// The removed and added lines that turn `old` into `new`, in order (a longest common
/// subsequence of lines is kept).
pub(crate) fn line_diff(old: &str, new: &str) -> Vec<DiffLine> {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let (n, m) = (a.len(), b.len());
    let mut out = Vec::new();
    let removed = |i: usize| DiffLine {
        change: Change::Removed,
        line: i + 1,
        text: a[i].to_owned(),
    };
    let added = |j: usize| DiffLine {
        change: Change::Added,
        line: j + 1,
        text: b[j].to_owned(),
    };
    if n.saturating_mul(m) > MAX_CELLS {
        out.extend((0..n).map(removed));
        out.extend((0..m).map(added));
        return out;
    }
    // lcs[i][j]: the longest common subsequence of a[i..] and b[j..].
    let width = m + 1;
    let mut lcs = vec![0u32; (n + 1) * width];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i * width + j] = if a[i] == b[j] {
                lcs[(i + 1) * width + j + 1] + 1
            } else {
                lcs[(i + 1) * width + j].max(lcs[i * width + j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    // A run of changes shows its removed lines first, as diffs do.
    let (mut run_removed, mut run_added) = (Vec::new(), Vec::new());
    fn flush(out: &mut Vec<DiffLine>, removed: &mut Vec<DiffLine>, added: &mut Vec<DiffLine>) {
        out.append(removed);
        out.append(added);
    }
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            flush(&mut out, &mut run_removed, &mut run_added);
            i += 1;
            j += 1;
        } else if j < m && (i == n || lcs[i * width + j + 1] >= lcs[(i + 1) * width + j]) {
            run_added.push(added(j));
            j += 1;
        } else {
            run_removed.push(removed(i));
            i += 1;
        }
    }
    flush(&mut out, &mut run_removed, &mut run_added);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(old: &str, new: &str) -> Vec<String> {
        line_diff(old, new)
            .iter()
            .map(|d| {
                let sign = if d.change == Change::Removed {
                    '-'
                } else {
                    '+'
                };
                format!("{sign}{} {}", d.line, d.text)
            })
            .collect()
    }

    #[test]
    fn same_text_no_change() {
        assert!(show("a\nb\n", "a\nb\n").is_empty());
    }

    #[test]
    fn one_line_replaced() {
        assert_eq!(show("a\nb\nc\n", "a\nB\nc\n"), ["-2 b", "+2 B"]);
    }

    #[test]
    fn insertions_and_deletions() {
        assert_eq!(show("a\nc\n", "a\nb\nc\nd\n"), ["+2 b", "+4 d"]);
        assert_eq!(show("a\nb\nc\n", "c\n"), ["-1 a", "-2 b"]);
        assert_eq!(show("", "x\n"), ["+1 x"]);
    }
}
