//! Names for new sources: they become file names and are typed on command lines.

use crate::store::TaskId;

/// Longest name accepted.
const MAX_LEN: usize = 64;

/// Names Windows cannot use as file stems.
const RESERVED: &[&str] = &[
    "con", "prn", "aux", "nul", "com1", "com2", "com3", "com4", "com5", "com6", "com7", "com8",
    "com9", "lpt1", "lpt2", "lpt3", "lpt4", "lpt5", "lpt6", "lpt7", "lpt8", "lpt9",
];

/// `Ok` for a name that is a good file stem and source name: ASCII letters, digits, `-` and
/// `_`, starting with a letter or digit, at most [`MAX_LEN`] characters, not shaped like a
/// background task id. Otherwise why not.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the name is empty".to_owned());
    }
    let bad_char = |c: &char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
    let separator = name.chars().find(|c| matches!(c, '/' | '\\'));
    if let Some(bad) = separator.or_else(|| name.chars().find(bad_char)) {
        let what = match bad {
            '/' | '\\' => "a path separator".to_owned(),
            '.' => "`.` (the extension is added for you)".to_owned(),
            c if c.is_whitespace() => "a space".to_owned(),
            c => format!("`{c}`"),
        };
        return Err(format!(
            "`{name}` is not a valid file name: it contains {what}; use letters, digits, `-` and `_`"
        ));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(format!(
            "`{name}` is not a valid file name: it must start with a letter or a digit"
        ));
    }
    if name.len() > MAX_LEN {
        return Err(format!(
            "`{name}` is too long for a name: at most {MAX_LEN} characters"
        ));
    }
    if RESERVED.contains(&name.to_ascii_lowercase().as_str()) {
        return Err(format!(
            "`{name}` is not a valid file name: Windows reserves it"
        ));
    }
    if TaskId::looks_like(name) {
        return Err(format!(
            "`{name}` looks like a background task id (`YYYYMMDD_N`), so `summon load {name}` \
             would look for a task; choose another name"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_name;

    #[test]
    fn good_names() {
        for name in ["review", "release-notes", "a_b", "2fa-check", "X"] {
            assert_eq!(check_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn bad_names_say_why() {
        let cases = [
            ("", "empty"),
            ("a/b", "path separator"),
            ("../x", "path separator"),
            ("a.b", "`.`"),
            ("notes.yaml", "the extension is added"),
            ("two words", "a space"),
            ("-x", "start with a letter or a digit"),
            ("_x", "start with a letter or a digit"),
            ("naïve", "`ï`"),
            ("nul", "Windows reserves it"),
            ("20260219_1", "task id"),
        ];
        for (name, why) in cases {
            let err = check_name(name).expect_err(name);
            assert!(err.contains(why), "{name}: {err}");
        }
        assert!(check_name(&"a".repeat(65)).is_err());
    }
}
