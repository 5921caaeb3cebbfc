//! Colour on terminals only: `--color`, `NO_COLOR` and whether stderr is a terminal.

/// ANSI styling that is a no-op when colour is off.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Palette {
    enabled: bool,
}

/// The user's `--color` choice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ColorChoice {
    #[default]
    Auto,
    Always,
    Never,
}

/// The colour clap uses for help and usage errors, which it prints before summon's own
/// `--color` is known: the flag is looked for in the raw arguments (up to `--`).
pub(crate) fn for_clap(args: &[std::ffi::OsString], no_color_env: bool) -> clap::ColorChoice {
    let mut choice = None;
    let mut words = args.iter().skip(1).map(|a| a.to_str().unwrap_or(""));
    while let Some(word) = words.next() {
        let value = match word {
            "--" => break,
            "--color" => words.next(),
            _ => word.strip_prefix("--color="),
        };
        if let Some(value) = value {
            choice = Some(value);
        }
    }
    match choice {
        Some("always") => clap::ColorChoice::Always,
        Some("never") => clap::ColorChoice::Never,
        _ if no_color_env => clap::ColorChoice::Never,
        _ => clap::ColorChoice::Auto,
    }
}

impl Palette {
    #[cfg(test)]
    pub(crate) fn plain() -> Self {
        Self { enabled: false }
    }

    /// Decides colour from the flag, `NO_COLOR` and whether the stream is a terminal.
    pub(crate) fn resolve(choice: ColorChoice, no_color_env: bool, is_terminal: bool) -> Self {
        let enabled = match choice {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => is_terminal && !no_color_env,
        };
        Self { enabled }
    }

    /// Makes the progress display (drawn by indicatif on stderr) follow this palette, so
    /// `--color never` also holds on a terminal.
    pub(crate) fn apply_to_progress(self) {
        console::set_colors_enabled_stderr(self.enabled);
    }

    fn paint(self, code: &str, text: &str) -> String {
        if self.enabled {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    pub(crate) fn error(self, text: &str) -> String {
        self.paint("1;31", text)
    }

    pub(crate) fn warning(self, text: &str) -> String {
        self.paint("1;33", text)
    }

    pub(crate) fn bold(self, text: &str) -> String {
        self.paint("1", text)
    }

    pub(crate) fn dim(self, text: &str) -> String {
        self.paint("34", text)
    }

    pub(crate) fn caret(self, text: &str) -> String {
        self.paint("1;31", text)
    }

    pub(crate) fn green(self, text: &str) -> String {
        self.paint("32", text)
    }

    pub(crate) fn red(self, text: &str) -> String {
        self.paint("31", text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_colour_follows_the_flag_then_no_color() {
        let args = |list: &[&str]| -> Vec<std::ffi::OsString> {
            std::iter::once("summon")
                .chain(list.iter().copied())
                .map(Into::into)
                .collect()
        };
        let cases: [(&[&str], bool, clap::ColorChoice); 7] = [
            (&["load"], false, clap::ColorChoice::Auto),
            (&["load"], true, clap::ColorChoice::Never),
            (
                &["--color", "always", "load"],
                true,
                clap::ColorChoice::Always,
            ),
            (&["load", "--color=never"], false, clap::ColorChoice::Never),
            (&["--color=auto", "x"], true, clap::ColorChoice::Never),
            (
                &["--color=never", "--color", "always"],
                false,
                clap::ColorChoice::Always,
            ),
            (
                &["delegate", "--", "--color=never"],
                false,
                clap::ColorChoice::Auto,
            ),
        ];
        for (list, no_color, expected) in cases {
            assert_eq!(
                for_clap(&args(list), no_color),
                expected,
                "{list:?} {no_color}"
            );
        }
    }

    #[test]
    fn resolve_table() {
        let cases = [
            (ColorChoice::Auto, false, true, true),
            (ColorChoice::Auto, true, true, false),
            (ColorChoice::Auto, false, false, false),
            (ColorChoice::Always, true, false, true),
            (ColorChoice::Never, false, true, false),
        ];
        for (choice, no_color, tty, expected) in cases {
            assert_eq!(
                Palette::resolve(choice, no_color, tty).enabled,
                expected,
                "{choice:?} no_color={no_color} tty={tty}"
            );
        }
    }
}
