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
}

#[cfg(test)]
mod tests {
    use super::*;

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
