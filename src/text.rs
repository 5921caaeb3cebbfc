//! Text cut to a size, and text from outside summon made safe to print on a terminal.

/// `1234567` as `1,234,567`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

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
/// `text` with the user and password of every URL in it (`https://user:secret@host`) shown
/// as `***`: a credential written in a URL is never printed.
pub(crate) fn without_url_credentials(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("://") || !text.contains('@') {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        let end = after
            .find(|c: char| {
                matches!(c, '/' | '?' | '#') || c.is_whitespace() || "'\"`<>)]}".contains(c)
            })
            .unwrap_or(after.len());
        let authority = &after[..end];
        match authority.rfind('@') {
            Some(user_end) if user_end > 0 => {
                out.push_str("***");
                out.push_str(&authority[user_end..]);
            }
            _ => out.push_str(authority),
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

/// `text` without the control characters and escape sequences a terminal would act on: a
/// provider's error body, a path or name the model chose, an MCP server's stderr could set the
/// window title, move the cursor or erase lines. `ESC` sequences (CSI, OSC, DCS and the
/// rest) and C1 controls go whole; other control characters (`\r`, `\x07`, ...) go, except a
/// line break and a tab.
pub(crate) fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    match without_url_credentials(text) {
        std::borrow::Cow::Borrowed(text) => printable_as_is(text),
        std::borrow::Cow::Owned(text) => {
            std::borrow::Cow::Owned(printable_as_is(&text).into_owned())
        }
    }
}

fn printable_as_is(text: &str) -> std::borrow::Cow<'_, str> {
    let safe = |c: char| c == '\n' || c == '\t' || !c.is_control();
    if text.chars().all(safe) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => match chars.next() {
                Some('[') => skip_csi(&mut chars),
                Some(']' | 'P' | 'X' | '^' | '_') => skip_string(&mut chars),
                // A two-character sequence (`ESC c`, `ESC 7`, ...), or an ESC at the end.
                _ => {}
            },
            '\u{9b}' => skip_csi(&mut chars),
            '\u{9d}' | '\u{90}' | '\u{98}' | '\u{9e}' | '\u{9f}' => skip_string(&mut chars),
            c if safe(c) => out.push(c),
            _ => {}
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The rest of a control sequence: parameter and intermediate bytes, then one final byte.
fn skip_csi(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while let Some(&c) = chars.peek() {
        chars.next();
        if ('\u{40}'..='\u{7e}').contains(&c) || !('\u{20}'..='\u{3f}').contains(&c) {
            return;
        }
    }
}

/// The rest of a string sequence (OSC, DCS, ...): up to BEL, `ESC \\` or ST, or the end of
/// the line.
fn skip_string(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while let Some(c) = chars.next() {
        match c {
            '\u{7}' | '\u{9c}' | '\n' => return,
            '\u{1b}' => {
                if chars.peek() == Some(&'\\') {
                    chars.next();
                }
                return;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_urls_are_never_shown() {
        assert_eq!(
            without_url_credentials("to http://user:s3cret@host:8080/v1, and https://t@x.io"),
            "to http://***@host:8080/v1, and https://***@x.io"
        );
        let plain = "mail me@example.com at https://host/a@b";
        assert_eq!(without_url_credentials(plain), plain);
        assert_eq!(printable("`https://a:b@h`\u{1b}[2J"), "`https://***@h`");
    }

    #[test]
    fn printable_drops_what_a_terminal_acts_on() {
        assert!(matches!(
            printable("plain\ttext\n"),
            std::borrow::Cow::Borrowed(_)
        ));
        let hostile = "a\u{1b}]0;title\u{7}b\u{1b}[2Jc\u{1b}[1;31md\u{1b}P+q\u{1b}\\e\u{9b}31mf\rg\u{7}h\u{1b}7i\u{1b}]8;;http://x\u{1b}\\j\u{7f}k";
        assert_eq!(printable(hostile), "abcdefghijk");
        assert_eq!(printable("line\nnext"), "line\nnext");
        assert_eq!(printable("end\u{1b}"), "end");
        assert_eq!(printable("unterminated\u{1b}]0;title"), "unterminated");
    }
}
