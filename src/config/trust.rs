//! Trust for a project's own files.
//!
//! A repository can carry `summon.yaml` and `.mcp.json`. Settings there that decide where a
//! credential goes (a provider's `base_url` or `api_key_env`, and so a `default_provider`
//! naming such a provider) and the `.mcp.json` servers an agent names take effect only in a
//! trusted project; everything else (models, prices, limits, aliases) applies without trust.
//!
//! `summon trust` records the project folder with a SHA-256 of each of those files (or that it
//! is absent), and of each recipe file inside the project that starts a `stdio` extension, in
//! `<config dir>/summon/trusted-projects.json`; a later change to any of them needs trust
//! again (a project recipe's `stdio` extension starts only when its file is pinned so). `--trust` on a command or `SUMMON_TRUST_PROJECT=1` trusts the project for
//! that one run (CI, scripts).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::env::Env;

/// The variable that trusts the project for one run (`--trust` sets it too).
pub(crate) const TRUST_ENV: &str = "SUMMON_TRUST_PROJECT";

/// The project files trust covers, in the project folder.
pub(crate) const PROJECT_FILES: [&str; 2] = ["summon.yaml", ".mcp.json"];

/// Whether the project in the working directory is trusted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum Trust {
    /// `--trust` or `SUMMON_TRUST_PROJECT=1`.
    ForThisRun,
    /// Recorded by `summon trust`, and the files are as they were then.
    Recorded { at: String },
    /// Never trusted.
    #[default]
    Never,
    /// Trusted once, but these files changed since (added, edited or removed).
    Changed { files: Vec<String>, at: String },
}

impl Trust {
    pub(crate) fn is_trusted(&self) -> bool {
        matches!(self, Self::ForThisRun | Self::Recorded { .. })
    }

    /// Why the project is not trusted and how to trust it, for an error's hint.
    pub(crate) fn how_to_trust(&self) -> String {
        let what = match self {
            Self::Changed { files, at } => format!(
                "{} changed since this project was trusted ({at}); read it again, then",
                files.join(" and ")
            ),
            _ => "read the project's summon.yaml and .mcp.json, then".to_owned(),
        };
        format!(
            "{what} run `summon trust` to allow it (for one run, as in CI: --trust or {TRUST_ENV}=1)"
        )
    }

    /// One line for `summon doctor`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::ForThisRun => format!("trusted for this run (--trust or {TRUST_ENV})"),
            Self::Recorded { at } => format!("trusted with `summon trust` ({at})"),
            Self::Never => "not trusted".to_owned(),
            Self::Changed { files, at } => format!(
                "not trusted: {} changed since it was trusted ({at})",
                files.join(" and ")
            ),
        }
    }
}

/// What `summon trust` recorded for one project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    /// File name → SHA-256 (hex) of its content, `None` when it did not exist.
    pub(crate) files: BTreeMap<String, Option<String>>,
    /// When, as an RFC 3339 timestamp.
    pub(crate) trusted_at: String,
    /// The project's recipe files that start a command (`stdio` extensions, `retry`
    /// commands) and its pipeline files: path (relative to the project folder) → SHA-256
    /// (hex) of its content when it was trusted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) sources: BTreeMap<String, String>,
}

/// The file of trusted projects.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Store {
    /// Project folder (canonical) → record.
    projects: BTreeMap<PathBuf, Record>,
}

/// `<config dir>/summon/trusted-projects.json`; `None` without a home directory.
pub(crate) fn store_path(env: &Env) -> Option<PathBuf> {
    env.config_dir()
        .map(|dir| dir.join("summon").join("trusted-projects.json"))
}

/// The project folder as recorded: the project root that holds the working directory
/// ([`crate::store::project_root`], as sources and `summon run` find it from any subfolder),
/// canonical when it can be.
pub(crate) fn project_dir(env: &Env) -> PathBuf {
    let (root, _) = crate::store::project_root(&env.cwd, env.home().as_deref());
    std::fs::canonicalize(&root).unwrap_or(root)
}

/// SHA-256 (hex) of the bytes of a file as read.
pub(crate) fn hash_bytes(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Why a project file may not start a command or send a credential: the file (relative to
/// the project folder), what is wrong, and how to trust it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Untrusted {
    /// The file, relative to the project folder.
    pub(crate) file: String,
    /// The project folder whose trust was asked.
    pub(crate) project: PathBuf,
    /// "this project is not trusted", "… changed since …", "… was not among …".
    pub(crate) why: String,
}

impl Untrusted {
    /// The hint of an error: the command that trusts the file as it is now.
    pub(crate) fn hint(&self) -> String {
        format!(
            "read {}, then run `summon trust` in {} to allow it (for one run, as in CI: \
             --trust or {TRUST_ENV}=1)",
            self.file,
            self.project.display()
        )
    }
}

impl std::fmt::Display for Untrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// The one rule for a project file that can start a command or send a credential
/// (`summon.yaml`, `.mcp.json`, a recipe with `stdio` extensions or `retry` commands, a
/// pipeline with `decompose.command`s): whether `bytes`, the content of `path` exactly as it
/// was read and parsed, may do so. Always for a file outside the project folder (the user's
/// own); for one inside it, when the project is trusted for this run or `summon trust` pinned
/// the file with these very bytes (so a file swapped after it was parsed, or changed since it
/// was trusted, is refused). The project folder is the root that holds the working
/// directory, from any subfolder.
pub(crate) fn check_file(env: &Env, path: &Path, bytes: &[u8]) -> Result<(), Untrusted> {
    let project = project_dir(env);
    let Some(relative) = relative_to(&project, path) else {
        return Ok(());
    };
    if trusted_for_this_run(env) {
        return Ok(());
    }
    let untrusted = |why: String| Untrusted {
        file: relative.clone(),
        project: project.clone(),
        why,
    };
    let Some(record) = read_store(env).projects.remove(&project) else {
        return Err(untrusted("this project is not trusted".to_owned()));
    };
    let pinned = if PROJECT_FILES.contains(&relative.as_str()) {
        record.files.get(&relative).cloned().flatten()
    } else {
        record.sources.get(&relative).cloned()
    };
    match pinned {
        Some(hash) if hash == hash_bytes(bytes) => Ok(()),
        Some(_) => Err(untrusted(format!(
            "{relative} changed since this project was trusted ({})",
            record.trusted_at
        ))),
        None => Err(untrusted(format!(
            "{relative} was not among the files trusted ({})",
            record.trusted_at
        ))),
    }
}

/// The variable under which `summon run` runs its pipeline only when [`check_pipeline`]
/// allows the bytes it parsed: `summon mcp`'s `run_pipeline` sets it for the run it starts,
/// so a file swapped between the server's check and the run's read is refused too.
pub(crate) const PIPELINE_TRUST_ENV: &str = "SUMMON_PIPELINE_NEEDS_TRUST";

/// The trust rule for a pipeline file that `run_pipeline` (or anything started by someone
/// other than the user at a terminal) would run: its `decompose.command`s start commands, so
/// the file must be pinned by `summon trust` with exactly these `bytes` (the ones parsed),
/// in the one store of pins that [`check_file`] reads.
/// Unlike [`check_file`], a file that is not inside the project (where it really is, through
/// any link) is refused: nothing pins it.
pub(crate) fn check_pipeline(env: &Env, path: &Path, bytes: &[u8]) -> Result<(), Untrusted> {
    let project = project_dir(env);
    if relative_to(&project, path).is_none() && !trusted_for_this_run(env) {
        return Err(Untrusted {
            file: path.display().to_string(),
            project,
            why: "it is not inside the project, so nothing pins it".to_owned(),
        });
    }
    check_file(env, path, bytes)
}

fn trusted_for_this_run(env: &Env) -> bool {
    env.var(TRUST_ENV)
        .is_some_and(|v| matches!(v.trim(), "1" | "true" | "yes"))
}

/// `path` relative to `project`, when it is inside it (judged by where it really is).
fn relative_to(project: &Path, path: &Path) -> Option<String> {
    let real = std::fs::canonicalize(path).ok()?;
    real.strip_prefix(project)
        .ok()
        .map(|r| r.to_string_lossy().into_owned())
}

/// The trust of the project, its `summon.yaml` judged by `config`, the bytes parsed (`Some(None)`:
/// it was absent when read), not by a second read that could find another file.
pub(crate) fn project_trust_as_read(env: &Env, config: Option<Option<&[u8]>>) -> Trust {
    if trusted_for_this_run(env) {
        return Trust::ForThisRun;
    }
    let Some(record) = read_store(env).projects.remove(&project_dir(env)) else {
        return Trust::Never;
    };
    let mut now = fingerprint(&project_dir(env));
    if let Some(config) = config {
        now.insert(PROJECT_FILES[0].to_owned(), config.map(hash_bytes));
    }
    let changed: Vec<String> = PROJECT_FILES
        .iter()
        .filter(|name| now.get(**name) != record.files.get(**name))
        .map(|name| (*name).to_owned())
        .collect();
    if changed.is_empty() {
        Trust::Recorded {
            at: record.trusted_at,
        }
    } else {
        Trust::Changed {
            files: changed,
            at: record.trusted_at,
        }
    }
}

/// Records the project in the working directory as trusted, with its files as they are now
/// and the content of `sources` (its recipe files that start a `stdio` extension or have
/// `retry` commands, and its pipeline files).
pub(crate) fn trust(env: &Env, sources: &[PathBuf]) -> std::io::Result<(PathBuf, Record)> {
    let dir = project_dir(env);
    let mut pinned = BTreeMap::new();
    for path in sources {
        if let (Some(relative), Some(hash)) = (project_relative(env, path), file_hash(path)) {
            pinned.insert(relative, hash);
        }
    }
    let record = Record {
        sources: pinned,
        files: fingerprint(&dir),
        trusted_at: jiff::Timestamp::now()
            .round(jiff::Unit::Second)
            .map_or_else(|_| jiff::Timestamp::now().to_string(), |t| t.to_string()),
    };
    let mut store = read_store(env);
    store.projects.insert(dir.clone(), record.clone());
    write_store(env, &store)?;
    Ok((dir, record))
}

/// `path` relative to the project folder, when it is inside it.
pub(crate) fn project_relative(env: &Env, path: &Path) -> Option<String> {
    relative_to(&project_dir(env), path)
}

fn file_hash(path: &Path) -> Option<String> {
    std::fs::read(path).ok().map(|bytes| hash_bytes(&bytes))
}

/// Forgets the project in the working directory; whether it was trusted.
pub(crate) fn revoke(env: &Env) -> std::io::Result<bool> {
    let mut store = read_store(env);
    let removed = store.projects.remove(&project_dir(env)).is_some();
    if removed {
        write_store(env, &store)?;
    }
    Ok(removed)
}

/// Every trusted project.
pub(crate) fn list(env: &Env) -> Vec<(PathBuf, Record)> {
    read_store(env).projects.into_iter().collect()
}

/// SHA-256 of each project file, `None` for one that does not exist.
fn fingerprint(dir: &Path) -> BTreeMap<String, Option<String>> {
    PROJECT_FILES
        .iter()
        .map(|name| {
            let hash = std::fs::read(dir.join(name))
                .ok()
                .map(|bytes| hash_bytes(&bytes));
            ((*name).to_owned(), hash)
        })
        .collect()
}

/// The store; empty when missing or unreadable (nothing is trusted then).
fn read_store(env: &Env) -> Store {
    store_path(env)
        .and_then(|path| std::fs::read(path).ok())
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// Replaces the store atomically: a reader never sees half of it.
fn write_store(env: &Env, store: &Store) -> std::io::Result<()> {
    let path = store_path(env).ok_or_else(|| {
        std::io::Error::other("no home directory to keep the list of trusted projects in")
    })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut file = tempfile::NamedTempFile::new_in(dir)?;
    serde_json::to_writer_pretty(&mut file, store)?;
    std::io::Write::write_all(&mut file, b"\n")?;
    file.persist(&path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(project: &Path, home: &Path, vars: &[(&str, &str)]) -> Env {
        let home = home.to_string_lossy().into_owned();
        let mut all = vec![("HOME", home.as_str())];
        all.extend_from_slice(vars);
        Env::for_test(project, &all)
    }

    #[test]
    fn trust_follows_the_files() {
        let home = tempfile::tempdir().unwrap();
        let project = tempfile::tempdir().unwrap();
        let env = env(project.path(), home.path(), &[]);
        let project_trust = |env: &Env| project_trust_as_read(env, None);
        assert_eq!(project_trust(&env), Trust::Never);
        std::fs::write(project.path().join("summon.yaml"), "default_model: m\n").unwrap();
        trust(&env, &[]).unwrap();
        assert!(project_trust(&env).is_trusted());
        // An edit, and a file that appears, each undo it.
        std::fs::write(project.path().join("summon.yaml"), "default_model: n\n").unwrap();
        assert!(matches!(
            project_trust(&env),
            Trust::Changed { files, .. } if files == ["summon.yaml"]
        ));
        trust(&env, &[]).unwrap();
        std::fs::write(project.path().join(".mcp.json"), "{}").unwrap();
        assert!(matches!(
            project_trust(&env),
            Trust::Changed { files, .. } if files == [".mcp.json"]
        ));
        assert!(revoke(&env).unwrap());
        let project_trust = |env: &Env| project_trust_as_read(env, None);
        assert_eq!(project_trust(&env), Trust::Never);
        assert!(!revoke(&env).unwrap());
        let forced = super::tests::env(project.path(), home.path(), &[(TRUST_ENV, "1")]);
        assert_eq!(project_trust(&forced), Trust::ForThisRun);
    }

    /// The file is judged by the bytes that were parsed, from any subfolder of the project:
    /// a file swapped after it was read is refused, one outside the project is the user's.
    #[test]
    fn a_file_is_judged_by_the_bytes_parsed_from_any_subfolder() {
        let home = tempfile::tempdir().unwrap();
        let project = tempfile::tempdir().unwrap();
        let root = project.path();
        std::fs::create_dir_all(root.join("recipes")).unwrap();
        std::fs::create_dir_all(root.join("src/deep")).unwrap();
        let recipe = root.join("recipes/x.yaml");
        std::fs::write(&recipe, "trusted\n").unwrap();
        let from_sub = env(&root.join("src/deep"), home.path(), &[]);
        let refused = check_pipeline(&from_sub, &recipe, b"trusted\n").unwrap_err();
        assert_eq!(refused.why, "this project is not trusted");
        assert_eq!(refused.file, "recipes/x.yaml");
        assert!(
            refused.hint().contains("summon trust"),
            "{}",
            refused.hint()
        );
        trust(&from_sub, std::slice::from_ref(&recipe)).unwrap();
        assert_eq!(project_dir(&from_sub), root.canonicalize().unwrap());
        check_file(&from_sub, &recipe, b"trusted\n").unwrap();
        // The same path, other bytes (a file swapped after trust, or between read and check).
        let swapped = check_file(&from_sub, &recipe, b"evil\n").unwrap_err();
        assert!(
            swapped.why.contains("recipes/x.yaml changed since"),
            "{}",
            swapped.why
        );
        // A file outside the project is the user's own.
        let outside = tempfile::tempdir().unwrap();
        let own = outside.path().join("y.yaml");
        std::fs::write(&own, "x").unwrap();
        check_file(&from_sub, &own, b"anything").unwrap();
    }
}
