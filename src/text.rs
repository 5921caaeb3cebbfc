//! Text cut to a size.

/// Cuts `text` to at most `max` bytes at a character boundary; says whether it cut.
pub(crate) fn truncate_at_boundary(text: &mut String, max: usize) -> bool {
    if text.len() <= max {
        return false;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    true
}
