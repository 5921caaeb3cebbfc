//! A run's live lock: `.summon/live/RUN_ID.lock`, held (an exclusive `flock`) by the process
//! running it for as long as that process lives. The kernel drops the lock however the
//! process ends (SIGKILL included), so a run left `running` by a killed process is seen dead at
//! once. Unlike a pid, a lock means the same in every PID namespace (containers, `unshare
//! --pid`), and on NFS on every host (the server's lock manager; the locks of a client that
//! vanished go when its lease expires). The file says who holds it (host, boot id, pid), for
//! the messages.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, flock};

/// A live lock this process holds: released when dropped (the run ended) or when the process
/// ends, however it ends.
#[derive(Debug)]
pub(crate) struct LiveLock {
    _file: File,
}

fn path(dir: &Path, run_id: &str) -> PathBuf {
    dir.join("live").join(format!("{run_id}.lock"))
}

/// What the holder of a lock wrote in it (`host H, boot B, pid P`), or `None`.
fn holder(file: &mut File) -> Option<String> {
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

fn kernel(name: &str) -> String {
    std::fs::read_to_string(Path::new("/proc/sys/kernel").join(name))
        .map(|text| text.trim().to_owned())
        .unwrap_or_else(|_| "?".into())
}

/// Takes the live lock of `run_id`, until the lock is dropped or the process exits.
/// `Ok(Err(holder))` when another run holds it (what its file says, if anything).
pub(crate) fn take(dir: &Path, run_id: &str) -> std::io::Result<Result<LiveLock, String>> {
    let path = path(dir, run_id);
    std::fs::create_dir_all(path.parent().unwrap_or(dir))?;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)?;
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
            return Ok(Err(
                holder(&mut file).unwrap_or_else(|| "another process".into())
            ));
        }
        Err(e) => return Err(e.into()),
    }
    file.set_len(0)?;
    file.rewind()?;
    writeln!(
        file,
        "host {}, boot {}, pid {}",
        kernel("hostname"),
        kernel("random/boot_id"),
        std::process::id()
    )?;
    file.flush()?;
    Ok(Ok(LiveLock { _file: file }))
}

/// Whether a live process holds the lock of `run_id`; `None` when the run has no lock file
/// (started by an older summon) or it cannot be tried.
pub(crate) fn held(dir: &Path, run_id: &str) -> Option<bool> {
    let file = File::open(path(dir, run_id)).ok()?;
    match flock(&file, FlockOperation::NonBlockingLockShared) {
        Ok(()) => {
            let _ = flock(&file, FlockOperation::Unlock);
            Some(false)
        }
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Some(true),
        Err(_) => None,
    }
}

/// The network filesystem `dir` is on, when it is one SQLite's write-ahead log is not safe on
/// for processes of different hosts (it shares its index through memory of one host).
#[cfg(target_os = "linux")]
pub(crate) fn network_filesystem(dir: &Path) -> Option<&'static str> {
    let stat = rustix::fs::statfs(dir).ok()?;
    // The magic numbers of statfs(2).
    #[allow(clippy::unnecessary_cast)] // `f_type`'s width differs between architectures
    let magic = (stat.f_type as i64 as u64 & 0xffff_ffff) as u32;
    Some(match magic {
        0x6969 => "NFS",
        0x517b | 0xff53_4d42 | 0xfe53_4d42 => "SMB/CIFS",
        0x0bd0_0bd0 => "Lustre",
        0x4750_4653 => "GPFS",
        0x00c3_6400 => "CephFS",
        0x1983_0326 => "BeeGFS",
        0x5346_414f => "AFS",
        0x0116_1970 => "GFS2",
        0x7461_636f => "OCFS2",
        _ => return None,
    })
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn network_filesystem(_dir: &Path) -> Option<&'static str> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_is_held_until_it_is_dropped_and_says_who_holds_it() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(held(tmp.path(), "r1"), None, "no lock file yet");
        let lock = take(tmp.path(), "r1").unwrap().unwrap();
        assert_eq!(held(tmp.path(), "r1"), Some(true));
        // Another open file description (as another process would have) cannot take it.
        let holder = take(tmp.path(), "r1").unwrap().unwrap_err();
        assert!(
            holder.contains(&format!("pid {}", std::process::id())),
            "{holder}"
        );
        // Dropped (as at the run's end, or the holder's exit): free.
        drop(lock);
        assert_eq!(held(tmp.path(), "r1"), Some(false));
        drop(take(tmp.path(), "r1").unwrap().unwrap());
    }
}
