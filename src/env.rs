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
    /// The user's credentials file, when there is one ([`Env::with_credentials`]).
    pub(crate) credentials: Option<Credentials>,
}

/// The user's credentials file, `<state dir>/summon/credentials`: `NAME=value` lines that
/// summon reads when its environment does not set `NAME`, so a process started with a bare
/// environment (an MCP host starts its servers with PATH and HOME) still finds the keys the
/// user configured. Only a file of the user's own that nobody else may read is used. It lies
/// in the folder of the store's signing key, which no command a model runs can see (the
/// sandbox mounts an empty folder over it).
#[derive(Debug, Clone, Default)]
pub(crate) struct Credentials {
    pub(crate) path: PathBuf,
    /// The names it gave values to (those the environment did not set).
    pub(crate) used: Vec<String>,
    /// Why it was not read, or which lines were skipped: the file is named, a value never.
    pub(crate) problem: Option<String>,
}

/// The credentials file's name in summon's state folder.
pub(crate) const CREDENTIALS_FILE: &str = "credentials";

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
            credentials: None,
        })
    }

    /// The credentials file's path: `<state dir>/summon/credentials` (`$XDG_STATE_HOME`, else
    /// `~/.local/state`).
    pub(crate) fn credentials_path(&self) -> Option<PathBuf> {
        self.state_dir()
            .map(|dir| dir.join("summon").join(CREDENTIALS_FILE))
    }

    /// The same environment with the variables of the user's credentials file that it does
    /// not set itself. A file that others may read, or that is not the user's, gives nothing
    /// and says why ([`Credentials::problem`]). The values stay in summon: the commands,
    /// servers and workers it starts take their environment from the process, never from here.
    pub(crate) fn with_credentials(mut self) -> Self {
        let Some(path) = self.credentials_path() else {
            return self;
        };
        let mut credentials = Credentials {
            path: path.clone(),
            ..Credentials::default()
        };
        match read_credentials(&path) {
            Ok(None) => return self,
            Ok(Some((pairs, skipped))) => {
                for (name, value) in pairs {
                    if name == NESTED_ENV || self.vars.contains_key(&name) {
                        continue;
                    }
                    credentials.used.push(name.clone());
                    self.vars.insert(name, value);
                }
                if !skipped.is_empty() {
                    let lines: Vec<String> = skipped.iter().map(ToString::to_string).collect();
                    credentials.problem = Some(format!(
                        "{}: line {} is not NAME=value, so it is skipped",
                        path.display(),
                        lines.join(", ")
                    ));
                }
            }
            Err(problem) => credentials.problem = Some(problem),
        }
        self.credentials = Some(credentials);
        self
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
            credentials: None,
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

    /// Where a variable's value comes from the credentials file: that file.
    pub(crate) fn credentials_file_of(&self, key: &str) -> Option<&std::path::Path> {
        self.credentials
            .as_ref()
            .filter(|c| c.used.iter().any(|n| n == key))
            .map(|c| c.path.as_path())
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

/// A credentials file's `NAME=value` pairs and the numbers of its lines that are not pairs.
type CredentialLines = (Vec<(String, String)>, Vec<usize>);

/// The pairs of a credentials file and the numbers of the lines that are not `NAME=value`;
/// `None` when there is no file; an error when it may not be used (it is not the user's own
/// regular file, or others may read it) or cannot be read.
fn read_credentials(path: &std::path::Path) -> Result<Option<CredentialLines>, String> {
    let shown = path.display();
    // Checked by its handle once open: what is checked is what is read.
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {shown}: {e}")),
    };
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    {
        use std::os::unix::fs::MetadataExt as _;
        if !meta.is_file() {
            return Err(format!("{shown} is not a regular file, so it is not read"));
        }
        if meta.uid() != nix::unistd::geteuid().as_raw() {
            return Err(format!(
                "{shown} belongs to another user, so it is not read: it must be your own file (mode 0600)"
            ));
        }
        let mode = meta.mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "{shown} may be read by others (mode {mode:04o}), so it is not read: run `chmod 600 {shown}`"
            ));
        }
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(&mut file, 1 << 20), &mut text)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    let mut pairs = Vec::new();
    let mut skipped = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").map_or(line, str::trim_start);
        let pair = line.split_once('=').and_then(|(name, value)| {
            let name = name.trim();
            let valid = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            valid.then(|| (name.to_owned(), unquote(value.trim()).to_owned()))
        });
        match pair {
            Some(pair) => pairs.push(pair),
            None => skipped.push(index + 1),
        }
    }
    Ok(Some((pairs, skipped)))
}

/// A value without the one pair of quotes around it, as a shell would read it.
fn unquote(value: &str) -> &str {
    for quote in ['"', '\''] {
        if let Some(inner) = value
            .strip_prefix(quote)
            .and_then(|v| v.strip_suffix(quote))
        {
            return inner;
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn home_with(text: &str, mode: u32) -> tempfile::TempDir {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join(".local/state/summon");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(CREDENTIALS_FILE);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        home
    }

    #[test]
    fn the_credentials_file_fills_what_the_environment_lacks() {
        let home = home_with(
            "# keys\nexport OPENAI_API_KEY=\"sk-file\"\nANTHROPIC_API_KEY=sk-ant\nnot a pair\nSUMMON_SUBAGENT=1\n",
            0o600,
        );
        let env = Env::for_test(
            "/",
            &[
                ("HOME", home.path().to_str().unwrap()),
                ("ANTHROPIC_API_KEY", "sk-env"),
            ],
        )
        .with_credentials();
        assert_eq!(env.var("OPENAI_API_KEY"), Some("sk-file"));
        assert_eq!(
            env.var("ANTHROPIC_API_KEY"),
            Some("sk-env"),
            "the environment wins"
        );
        assert_eq!(
            env.var(NESTED_ENV),
            None,
            "the nesting marker is never read from it"
        );
        assert!(env.credentials_file_of("OPENAI_API_KEY").is_some());
        assert!(env.credentials_file_of("ANTHROPIC_API_KEY").is_none());
        let problem = env.credentials.unwrap().problem.unwrap();
        assert!(
            problem.ends_with("line 4 is not NAME=value, so it is skipped"),
            "{problem}"
        );
    }

    #[test]
    fn a_credentials_file_others_may_read_gives_nothing_and_says_how_to_fix_it() {
        let home = home_with("OPENAI_API_KEY=sk-file\n", 0o644);
        let env = Env::for_test("/", &[("HOME", home.path().to_str().unwrap())]).with_credentials();
        assert_eq!(env.var("OPENAI_API_KEY"), None);
        let problem = env.credentials.unwrap().problem.unwrap();
        assert!(
            problem.contains("(mode 0644)") && problem.contains("chmod 600"),
            "{problem}"
        );
    }

    #[test]
    fn no_credentials_file_is_no_problem() {
        let home = tempfile::tempdir().unwrap();
        let env = Env::for_test("/", &[("HOME", home.path().to_str().unwrap())]).with_credentials();
        assert!(env.credentials.is_none());
    }
}
