//! Answers the journal records are signed with a key kept outside the workspace, so that a
//! row written by anything but summon (a model's command, a cloned repository: the store is
//! in the writable project) is not reused as an answer.
//!
//! The key is 32 random bytes in the user's state directory (`$XDG_STATE_HOME/summon/key`,
//! else `~/.local/state/summon/key`), created on first use with mode 0600. A row's MAC is
//! HMAC-SHA256 under that key of its request hash, step, status and answer.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The key file under the state directory.
pub(crate) fn key_path(state_dir: &Path) -> PathBuf {
    state_dir.join("summon").join("key")
}

/// The user's signing key, created (0600, in a 0700 folder) when there is none.
pub(crate) fn load_key(state_dir: &Path) -> std::io::Result<[u8; 32]> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let path = key_path(state_dir);
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let mut key = [0u8; 32];
    if !path.exists() {
        // Written whole under a name of its own, then linked into place: a process that
        // starts at the same moment reads either no key or the whole of one, never part.
        let fresh: [u8; 32] = rand::random();
        let temp = path.with_extension(format!(
            "{}.{:x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)?;
        let linked = file
            .write_all(&fresh)
            .and_then(|()| file.sync_all())
            .and_then(|()| std::fs::hard_link(&temp, &path));
        let _ = std::fs::remove_file(&temp);
        match linked {
            Ok(()) => return Ok(fresh),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    let mut file = std::fs::File::open(&path)?;
    if let Some(dir) = path.parent() {
        private(dir, &std::fs::metadata(dir)?)?;
    }
    private(&path, &file.metadata()?)?;
    file.read_exact(&mut key)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    Ok(key)
}

/// Refuses, as ssh refuses such a key, a key file or folder that another user owns or that
/// others may read or write: whoever could read it could sign answers, whoever could write
/// it could choose the key.
fn private(path: &Path, meta: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    let refuse = |why: String| {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} {why}: summon does not use a signing key others could read or replace",
                path.display()
            ),
        ))
    };
    if meta.uid() != me {
        return refuse(format!(
            "is owned by uid {}, not by uid {me} (run `chown {me} {}` as root, or remove it and \
             summon makes a new key)",
            meta.uid(),
            path.display()
        ));
    }
    let open = meta.mode() & 0o077;
    if open != 0 {
        let fix = if meta.is_dir() { "700" } else { "600" };
        return refuse(format!(
            "is open to others (mode {:o}; run `chmod {fix} {}`)",
            meta.mode() & 0o777,
            path.display()
        ));
    }
    Ok(())
}

/// HMAC-SHA256 of `parts` (each length-prefixed, so no two lists sign alike), as hex.
pub(crate) fn mac(key: &[u8; 32], parts: &[&[u8]]) -> String {
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(key);
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let mut inner = Sha256::new();
    inner.update(pad(0x36));
    for part in parts {
        inner.update((part.len() as u64).to_le_bytes());
        inner.update(part);
    }
    let mut outer = Sha256::new();
    outer.update(pad(0x5c));
    outer.update(inner.finalize());
    hex::encode(outer.finalize())
}

/// Whether `mac` is the signature under `key` of the journal row `row`.
pub(crate) fn row_signed(key: &[u8; 32], row: &super::TaskResultRow, mac: Option<&str>) -> bool {
    mac == Some(
        row_mac(
            key,
            &row.step_id,
            &row.input_hash,
            row.status.as_str(),
            row.output.as_deref(),
        )
        .as_str(),
    )
}

/// The MAC of a background task's request, bound to the task's id.
pub(crate) fn task_request_mac(key: &[u8; 32], id: &str, request_json: &str) -> String {
    mac(
        key,
        &[b"task request", id.as_bytes(), request_json.as_bytes()],
    )
}

/// The user's signing key under `env`'s state directory, when there is one to read or make.
pub(crate) fn env_key(env: &crate::env::Env) -> Option<[u8; 32]> {
    env.state_dir().and_then(|dir| load_key(&dir).ok())
}

/// The MAC of a journal row's answer.
pub(crate) fn row_mac(
    key: &[u8; 32],
    step: &str,
    input_hash: &str,
    status: &str,
    output: Option<&str>,
) -> String {
    let output = output.unwrap_or_default();
    mac(
        key,
        &[
            step.as_bytes(),
            input_hash.as_bytes(),
            status.as_bytes(),
            output.as_bytes(),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_made_once_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = load_key(dir.path()).unwrap();
        let mode = std::fs::metadata(key_path(dir.path()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(load_key(dir.path()).unwrap(), key);
    }

    #[test]
    fn a_key_open_to_others_or_owned_by_another_user_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        load_key(dir.path()).unwrap();
        let path = key_path(dir.path());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = load_key(dir.path()).unwrap_err().to_string();
        assert!(error.contains("open to others (mode 644"), "{error}");
        assert!(error.contains("chmod 600"), "{error}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let folder = path.parent().unwrap();
        std::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o755)).unwrap();
        let error = load_key(dir.path()).unwrap_err().to_string();
        assert!(error.contains("chmod 700"), "{error}");
        std::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o700)).unwrap();
        load_key(dir.path()).unwrap();
        // Another owner (only root can give the file away).
        if nix::unistd::geteuid().is_root() {
            nix::unistd::chown(&path, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            let error = load_key(dir.path()).unwrap_err().to_string();
            assert!(error.contains("owned by uid 65534"), "{error}");
            assert!(error.contains("run `chown 0 "), "{error}");
        }
    }

    #[test]
    fn processes_starting_together_all_get_the_one_key() {
        for _ in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let barrier = std::sync::Barrier::new(8);
            let keys: Vec<[u8; 32]> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..8)
                    .map(|_| {
                        scope.spawn(|| {
                            barrier.wait();
                            load_key(dir.path()).unwrap()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");
            // Nothing but the key is left in its folder.
            let names = std::fs::read_dir(dir.path().join("summon"))
                .unwrap()
                .count();
            assert_eq!(names, 1);
        }
    }

    #[test]
    fn the_mac_is_hmac_sha256_of_the_length_prefixed_parts() {
        // Python: hmac.new(b"\x0b" * 32, (1).to_bytes(8, "little") + b"a", "sha256")
        assert_eq!(
            mac(&[0x0b; 32], &[b"a"]),
            "d876c0ea4f7c66b00a64077012457dffc3e29a1f583fbb0c4e50efbf7548e472"
        );
        assert_ne!(mac(&[0x0c; 32], &[b"a"]), mac(&[0x0b; 32], &[b"a"]));
        assert_ne!(
            mac(&[0x0b; 32], &[b"ab", b""]),
            mac(&[0x0b; 32], &[b"a", b"b"])
        );
    }
}
