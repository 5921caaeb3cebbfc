//! A snapshot of the process environment, passed to everything that reads a variable.
//!
//! Nothing in summon calls `std::env::var` except [`Env::from_process`]; tests build their
//! own `Env`, so home and config directories can point at temporary folders.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Set in the environment of every process a subagent gets.
pub(crate) const NESTED_ENV: &str = "SUMMON_SUBAGENT";

#[derive(Debug, Clone, Default)]
pub(crate) struct Env {
    vars: BTreeMap<String, String>,
    /// The working directory summon runs in.
    pub(crate) cwd: PathBuf,
    /// The span context (a `TRACEPARENT` value) the commands a traced delegation starts run
    /// under; set by the command that exports its trace, never read from the environment.
    pub(crate) trace: Option<String>,
}

/// `SUMMON_TEST_CRASH_AT=POINT[:N]`, read once by [`Env::from_process`]; see [`crash_point`].
static CRASH_AT: std::sync::OnceLock<Option<(String, u64)>> = std::sync::OnceLock::new();
static CRASH_PASSES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A test hook for the crash-and-resume suite (`tests/crash.rs`): with
/// `SUMMON_TEST_CRASH_AT=POINT` (or `POINT:N`) the process sends itself SIGKILL the first (or
/// N-th) time it passes the point named `POINT`. Points: `run-created` (the run is journaled,
/// no task sent), `journal-commit` (rows written inside the open transaction, not committed),
/// `journal-committed` (committed, the runner not yet told), `task-recorded` (a result handed
/// to the journal writer and `results.jsonl`'s buffer) and `steps-done` (every step finished,
/// nothing flushed or written yet). Without the variable this is one atomic load.
pub(crate) fn crash_point(point: &str) {
    let Some(Some((name, nth))) = CRASH_AT.get() else {
        return;
    };
    if name == point && CRASH_PASSES.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == *nth {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

/// A test hook for the step-failure suite (`tests/pipeline_edges.rs`): with
/// `SUMMON_TEST_CRASH_AT=STEP` (or `STEP:N`), where `STEP` is a pipeline step id, that step's
/// task panics the first (or N-th) time it starts, so the scheduler's handling of a crashed
/// step can be tested. Step ids never contain `-` and the [`crash_point`] names all do, so the
/// two never meet. Test-only: without the variable this is one atomic load.
pub(crate) fn step_panic_point(step: &str) {
    let Some(Some((name, nth))) = CRASH_AT.get() else {
        return;
    };
    if name == step && CRASH_PASSES.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == *nth {
        panic!("test hook: step `{step}` panics (SUMMON_TEST_CRASH_AT)");
    }
}

/// summon's variables that goose reads under another name, so a goose user's environment
/// works unchanged: the `SUMMON_*` name is read first, then goose's (docs/providers.md).
pub(crate) const GOOSE_NAMES: [(&str, &str); 5] = [
    ("SUMMON_SUBAGENT_MAX_TURNS", "GOOSE_SUBAGENT_MAX_TURNS"),
    ("SUMMON_SUBAGENT_PROVIDER", "GOOSE_SUBAGENT_PROVIDER"),
    ("SUMMON_SUBAGENT_MODEL", "GOOSE_SUBAGENT_MODEL"),
    ("SUMMON_MAX_BACKGROUND_TASKS", "GOOSE_MAX_BACKGROUND_TASKS"),
    (
        "SUMMON_COMPLETED_TASK_TTL_SECS",
        "GOOSE_COMPLETED_TASK_TTL_SECS",
    ),
];

/// goose's name for a summon variable, if it has one.
pub(crate) fn goose_name(key: &str) -> Option<&'static str> {
    GOOSE_NAMES
        .iter()
        .find(|(summon, _)| *summon == key)
        .map(|(_, goose)| *goose)
}

impl Env {
    pub(crate) fn from_process() -> std::io::Result<Self> {
        CRASH_AT.get_or_init(|| {
            let value = std::env::var("SUMMON_TEST_CRASH_AT").ok()?;
            let (name, nth) = match value.split_once(':') {
                Some((name, n)) => (name, n.parse().ok()?),
                None => (value.as_str(), 1),
            };
            Some((name.to_owned(), nth))
        });
        Ok(Self {
            vars: std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect(),
            cwd: std::env::current_dir()?,
            trace: None,
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
            trace: None,
        }
    }

    /// The same environment, whose delegation's commands run under the span `traceparent`.
    pub(crate) fn traced(mut self, traceparent: Option<String>) -> Self {
        self.trace = traceparent;
        self
    }

    /// The same environment with one more variable (a command-line flag that stands for one).
    pub(crate) fn with_var(mut self, key: &str, value: &str) -> Self {
        self.vars.insert(key.to_owned(), value.to_owned());
        self
    }

    /// A variable holding a whole number of milliseconds: `None` when it is unset, an error
    /// naming it and what it holds when it is anything else.
    pub(crate) fn millis(&self, key: &str) -> Result<Option<std::time::Duration>, String> {
        match self.var(key) {
            None => Ok(None),
            Some(text) => text
                .trim()
                .parse::<u64>()
                .map(|ms| Some(std::time::Duration::from_millis(ms)))
                .map_err(|_| {
                    format!("{key} must be a whole number of milliseconds, found `{text}`")
                }),
        }
    }

    /// A variable's value; empty values count as unset.
    pub(crate) fn var(&self, key: &str) -> Option<&str> {
        self.vars
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// A summon variable that goose users know under goose's name ([`GOOSE_NAMES`]): the
    /// `SUMMON_*` name first, then goose's; the value and the name it was read from.
    pub(crate) fn var_or_goose(&self, key: &'static str) -> Option<(&str, &'static str)> {
        if let Some(value) = self.var(key) {
            return Some((value, key));
        }
        let goose = goose_name(key)?;
        self.var(goose).map(|value| (value, goose))
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

    /// The user's state directory: `$XDG_STATE_HOME`, else `~/.local/state`.
    pub(crate) fn state_dir(&self) -> Option<PathBuf> {
        match self.var("XDG_STATE_HOME").map(PathBuf::from) {
            Some(dir) if dir.is_absolute() => Some(dir),
            _ => self.home().map(|h| h.join(".local").join("state")),
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
