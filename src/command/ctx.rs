//! What every command needs: the environment, output streams and the catalog.

use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;

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

    /// Makes the project folder ([`crate::store::project_root`]) this command's working
    /// directory, so a pipeline's relative paths, its sources and its store are the same from
    /// every subfolder; says so on stderr when that is not where summon was started. Returns
    /// where it was started: the command line's own paths are relative to that.
    pub(crate) fn enter_project(&mut self) -> PathBuf {
        let started = self.env.cwd.clone();
        let home = self.env.home();
        let (root, marker) = crate::store::project_root(&started, home.as_deref());
        if root != started {
            let marker = marker.unwrap_or_default();
            let kind = if root.join(marker).is_dir() { "/" } else { "" };
            self.note(&format!(
                "working in the project folder {} (it holds {marker}{kind}): a pipeline's paths are relative to it",
                root.display()
            ));
            self.env.cwd = root;
        }
        started
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
        let message = crate::text::without_url_credentials(message);
        let _ = writeln!(std::io::stderr(), "summon: {message}");
    }
}
