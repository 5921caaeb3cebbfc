//! Whether `run_pipeline` may run a pipeline file: a pipeline can start commands
//! (`decompose.command`) outside any sandbox, so only one the user trusts runs, and never
//! one written or changed while this server runs (a subagent of the session may have
//! written it).
//!
//! The file is read once: its bytes are judged by the one trust rule of project files
//! ([`trust::check_pipeline`], `summon trust`'s pins), and its change time is taken from the
//! same open file. The run it starts judges the bytes it parses by the same rule again
//! ([`trust::PIPELINE_TRUST_ENV`]), so a file swapped in between is refused.

use std::io::Read as _;
use std::path::Path;

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
    match trust::check_pipeline(&shared.env, path, &bytes) {
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
