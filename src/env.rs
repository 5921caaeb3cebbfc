//! A snapshot of the process environment, passed to everything that reads a variable.
//!
//! Nothing in summon calls `std::env::var` except [`Env::from_process`]; tests build their
//! own `Env`, so home and config directories can point at temporary folders.

use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone, Default)]
pub(crate) struct Env {
    vars: BTreeMap<String, String>,
    /// The working directory summon runs in.
    pub(crate) cwd: PathBuf,
}

impl Env {
    pub(crate) fn from_process() -> std::io::Result<Self> {
        Ok(Self {
            vars: std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect(),
            cwd: std::env::current_dir()?,
        })
    }

    #[cfg(test)]
    pub(crate) fn for_test(cwd: impl Into<PathBuf>, vars: &[(&str, &str)]) -> Self {
        Self {
            vars: vars
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            cwd: cwd.into(),
        }
    }

    /// A variable's value; empty values count as unset.
    pub(crate) fn var(&self, key: &str) -> Option<&str> {
        self.vars
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// Whether a variable is present at all, even empty (`NO_COLOR=`).
    pub(crate) fn is_set(&self, key: &str) -> bool {
        self.vars.contains_key(key)
    }

    pub(crate) fn home(&self) -> Option<PathBuf> {
        self.var("HOME")
            .or_else(|| self.var("USERPROFILE"))
            .map(PathBuf::from)
    }

    /// The user's configuration directory, as goose finds it: `$XDG_CONFIG_HOME`, else
    /// `~/.config`.
    pub(crate) fn config_dir(&self) -> Option<PathBuf> {
        match self.var("XDG_CONFIG_HOME").map(PathBuf::from) {
            Some(dir) if dir.is_absolute() => Some(dir),
            _ => self.home().map(|h| h.join(".config")),
        }
    }

    /// A `:`-separated list of directories (`;` on Windows).
    pub(crate) fn path_list(&self, key: &str) -> Vec<PathBuf> {
        let separator = if cfg!(windows) { ';' } else { ':' };
        self.var(key)
            .map(|v| {
                v.split(separator)
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default()
    }
}
