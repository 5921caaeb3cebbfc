//! Whether this process runs under a subagent, so a nested `summon delegate` is refused even
//! when the marker variable was dropped on the way.
//!
//! summon starts every process a subagent gets (the `shell` tool's `sh`, MCP servers) with
//! `SUMMON_SUBAGENT=1` ([`NESTED_ENV`]) in its environment. Reading our own environment is the
//! fast path, but any process can drop the variable for its children
//! (`env -u SUMMON_SUBAGENT summon delegate ...`). What no process can do is rewrite the
//! environment another process was started with: Linux keeps it readable in
//! `/proc/PID/environ` for that process's whole life. So the parent-process chain is walked
//! (`/proc/PID/stat`, field 4) and each ancestor's start environment read: an ancestor started
//! with the variable is the `sh` (or server) summon gave a subagent, and we descend from it.
//! This marks exactly the subagent's processes, not every child of a summon process: the
//! commands a pipeline runs for its items or a recipe's retry checks do not carry it.
//!
//! Limits, for the record: an ancestor whose environment cannot be read (another user's, or
//! no `/proc`) is skipped; a process that detaches from its parent (a double fork) leaves the
//! chain, though it does not outlive the command: a `shell` command's processes live in a PID
//! namespace of their own, which ends with it.

use std::path::Path;

use crate::env::Env;

use crate::env::NESTED_ENV;

/// How many ancestors are looked at, at most (the chain ends at pid 1 long before).
const MAX_DEPTH: usize = 128;

/// Whether this process runs under a subagent: [`NESTED_ENV`] in our environment, or in the
/// start environment of any ancestor.
pub(crate) fn inside_subagent(env: &Env) -> bool {
    env.var(NESTED_ENV).is_some() || ancestor_marked(Path::new("/proc"), parent())
}

/// This process's parent as `/proc` numbers it: a shell command runs in a PID namespace of
/// its own, where `getppid` counts from that namespace while `/proc` is the host's.
fn parent() -> u32 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| parent_in_stat(&stat))
        .unwrap_or_else(std::os::unix::process::parent_id)
}

/// Walks the parent chain from `pid` up, reading each start environment under `proc`.
fn ancestor_marked(proc: &Path, mut pid: u32) -> bool {
    for _ in 0..MAX_DEPTH {
        if pid <= 1 {
            return false;
        }
        let dir = proc.join(pid.to_string());
        if std::fs::read(dir.join("environ")).is_ok_and(|environ| marked(&environ)) {
            return true;
        }
        match std::fs::read_to_string(dir.join("stat"))
            .ok()
            .and_then(|stat| parent_in_stat(&stat))
        {
            Some(parent) => pid = parent,
            None => return false,
        }
    }
    false
}

/// Whether a `/proc/PID/environ` (NUL-separated `KEY=VALUE`) sets [`NESTED_ENV`] to a
/// non-empty value.
fn marked(environ: &[u8]) -> bool {
    let prefix = format!("{NESTED_ENV}=");
    environ
        .split(|b| *b == 0)
        .any(|entry| entry.len() > prefix.len() && entry.starts_with(prefix.as_bytes()))
}

/// The parent pid in a `/proc/PID/stat` line: the second field after the command name, which
/// is in parentheses and may itself contain spaces and parentheses.
fn parent_in_stat(stat: &str) -> Option<u32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_is_a_set_variable() {
        assert!(marked(b"PATH=/bin\0SUMMON_SUBAGENT=1\0HOME=/h\0"));
        assert!(marked(b"SUMMON_SUBAGENT=yes"));
        assert!(!marked(b"PATH=/bin\0SUMMON_SUBAGENT=\0"));
        assert!(!marked(b"MY_SUMMON_SUBAGENT=1\0SUMMON_SUBAGENTS=1\0"));
        assert!(!marked(b""));
    }

    #[test]
    fn the_parent_comes_after_a_command_name_with_parentheses() {
        assert_eq!(parent_in_stat("42 (sh) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parent_in_stat("42 (a) b (c) R 9 1 1"), Some(9));
        assert_eq!(parent_in_stat("garbage"), None);
    }

    /// A fake `/proc` with processes `(pid, parent, environ)`.
    fn fake_proc(processes: &[(u32, u32, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (pid, parent, environ) in processes {
            let own = dir.path().join(pid.to_string());
            std::fs::create_dir(&own).unwrap();
            std::fs::write(own.join("stat"), format!("{pid} (sh) S {parent} 1 1 0")).unwrap();
            std::fs::write(own.join("environ"), environ.replace(' ', "\0")).unwrap();
        }
        dir
    }

    #[test]
    fn a_marked_ancestor_anywhere_up_the_chain_counts() {
        let proc = fake_proc(&[
            (30, 20, "PATH=/bin"),
            (20, 10, "PATH=/bin SUMMON_SUBAGENT=1"),
            (10, 1, "PATH=/bin"),
        ]);
        assert!(ancestor_marked(proc.path(), 30));
        assert!(!ancestor_marked(proc.path(), 10));
    }

    #[test]
    fn an_unreadable_or_missing_ancestor_ends_the_walk() {
        let proc = fake_proc(&[(30, 99, "PATH=/bin")]);
        assert!(!ancestor_marked(proc.path(), 30));
        assert!(!ancestor_marked(proc.path(), 1));
    }

    #[test]
    fn a_cycle_in_the_chain_ends_the_walk() {
        let proc = fake_proc(&[(30, 20, "A=1"), (20, 30, "B=2")]);
        assert!(!ancestor_marked(proc.path(), 30));
    }
}
