//! Whether `run_pipeline` may run a pipeline file: a pipeline can start commands
//! (`decompose.command`) outside any sandbox, so only one the user trusts runs, and never
//! one written or changed while this server runs (a subagent of the session may have
//! written it).
//!
//! The file is read once: its bytes are hashed as read and compared with the trust store
//! (`summon trust`'s pins in `src/config/trust.rs`), and its change time is taken from the
//! same open file.

use std::io::Read as _;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::Shared;
use crate::config::trust;

/// Whether the pipeline at `path` (inside the project, `shown` as the model wrote it) may
/// run: `Err` is the refusal, in words a host can show its user. `Ok` holds the bytes that
/// were judged.
pub(super) fn trusted_pipeline(
    shared: &Shared,
    path: &Path,
    shown: &str,
) -> Result<Vec<u8>, String> {
    let mut file =
        std::fs::File::open(path).map_err(|e| format!("run_pipeline: cannot read {shown}: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("run_pipeline: cannot read {shown}: {e}"))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| format!("run_pipeline: cannot read {shown}: {e}"))?;
    if changed_since(&meta, shared.started) {
        return Err(format!(
            "run_pipeline: {shown} was written or changed after this MCP server started, so it is not run: \
a subagent of this session may have written it. Ask the user to read it; to run it, they trust it \
(`summon trust`) and start a new server."
        ));
    }
    let hash = hex::encode(Sha256::digest(&bytes));
    match pinned(shared, path, &hash) {
        Ok(()) => Ok(bytes),
        Err(why) => Err(format!(
            "run_pipeline: {shown} is not run: {why}. A pipeline can start commands, so run_pipeline runs only \
pipelines the user trusts. Ask the user to read it and trust it (`summon trust`, or start summon mcp with --trust)."
        )),
    }
}

/// Whether the file's content or name changed at or after `since` (its change time, which
/// a write, a rename or a new link sets and no one can set back).
fn changed_since(meta: &std::fs::Metadata, since: std::time::SystemTime) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(since) = since.duration_since(std::time::UNIX_EPOCH) else {
        return true;
    };
    let changed = i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec());
    changed >= i128::try_from(since.as_nanos()).unwrap_or(i128::MAX)
}

/// Whether the user trusts these bytes of the file at `path`: the project trusted for this
/// run (`--trust`, `SUMMON_TRUST_PROJECT=1`), or `summon trust` pinned the file with this
/// hash.
fn pinned(shared: &Shared, path: &Path, hash: &str) -> Result<(), String> {
    let env = &shared.env;
    if env
        .var(trust::TRUST_ENV)
        .is_some_and(|v| matches!(v.trim(), "1" | "true" | "yes"))
    {
        return Ok(());
    }
    let Some(relative) = trust::project_relative(env, path) else {
        return Err("it is not inside the project".to_owned());
    };
    let project = trust::project_dir(env);
    let Some((_, record)) = trust::list(env)
        .into_iter()
        .find(|(dir, _)| *dir == project)
    else {
        return Err("this project is not trusted".to_owned());
    };
    match record.sources.get(&relative) {
        Some(pinned) if pinned == hash => Ok(()),
        Some(_) => Err(format!(
            "it changed since the project was trusted ({})",
            record.trusted_at
        )),
        None => Err(format!(
            "it is not among the files trusted ({})",
            record.trusted_at
        )),
    }
}
