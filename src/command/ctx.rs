//! What every command needs: the environment, output streams and the catalog.

use std::io::{IsTerminal, Write as _};

use crate::color::{ColorChoice, Palette};
use crate::diag::{self, Diagnostic};
use crate::env::Env;
use crate::output::Stdout;
use crate::source::{Catalog, discover, search_dirs};

pub(crate) struct Ctx {
    pub(crate) env: Env,
    pub(crate) out: Stdout,
    /// Styling for stderr.
    pub(crate) err_palette: Palette,
    /// Styling for stdout.
    pub(crate) out_palette: Palette,
}

impl Ctx {
    pub(crate) fn new(env: Env, color: ColorChoice) -> Self {
        let no_color = env.is_set("NO_COLOR");
        Self {
            err_palette: Palette::resolve(color, no_color, std::io::stderr().is_terminal()),
            out_palette: Palette::resolve(color, no_color, std::io::stdout().is_terminal()),
            env,
            out: Stdout::new(),
        }
    }

    /// Discovers every source; the catalog is read once per command and not re-read.
    pub(crate) fn catalog(&self) -> Catalog {
        discover(search_dirs(&self.env))
    }

    /// Prints diagnostics on stderr.
    pub(crate) fn report(&self, diagnostics: &[Diagnostic]) {
        if diagnostics.is_empty() {
            return;
        }
        // A closed stderr (`2>&1 | head`) is not an error: the text is dropped.
        let text = diag::render_all(diagnostics, &self.env.cwd, self.err_palette);
        let _ = std::io::stderr().write_all(text.as_bytes());
    }

    /// A one-line note on stderr, prefixed with the program name.
    pub(crate) fn note(&self, message: &str) {
        let _ = writeln!(std::io::stderr(), "summon: {message}");
    }
}
