//! Stdio servers recorded outside summon's memory, so that they can be stopped after summon
//! was killed: a background worker writes each server's process group to the task store as it
//! starts and stops it ([`on_server_change`]); the command that later finds the worker dead
//! stops what is left of them ([`stop_recorded`]).
//!
//! The parent-death signal (`sandbox::helper`) ends the server itself with its worker, but not
//! the processes the server started (`npx` and `uvx` start the real server as a child): they
//! stay in the server's process group, which is what is recorded and killed.

use std::sync::OnceLock;

/// A stdio server started or stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServerChange {
    /// Its process group and its leader's start time (see [`start_time`]).
    Started {
        pgid: u32,
        started: u64,
    },
    Stopped {
        pgid: u32,
    },
}

type Hook = Box<dyn Fn(ServerChange) + Send + Sync>;

static HOOK: OnceLock<Hook> = OnceLock::new();

/// Has `hook` told of every stdio server this process starts and stops from now on (once per
/// process: a background worker runs one task).
pub(crate) fn on_server_change(hook: Hook) {
    let _ = HOOK.set(hook);
}

pub(super) fn started(pgid: u32) {
    if let Some(hook) = HOOK.get()
        && let Some(started) = start_time(pgid)
    {
        hook(ServerChange::Started { pgid, started });
    }
}

pub(super) fn stopped(pgid: u32) {
    if let Some(hook) = HOOK.get() {
        hook(ServerChange::Stopped { pgid });
    }
}

/// What `/proc/PID/stat` says about a process.
struct Stat {
    pgrp: u32,
    session: u32,
    /// Clock ticks after boot: with the pid, it names one process for good.
    start: u64,
}

fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses; the fields after it do not.
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `fields[0]` is field 3 (state): field N is at N - 3.
    Some(Stat {
        pgrp: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

/// A process's start time, in clock ticks after boot (`None` without /proc).
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    stat(pid).map(|s| s.start)
}

/// Kills the process group `pgid` of a server recorded with the leader's start time `started`
/// by the worker `worker` (whose session the server's group is in), if it is still that
/// group: never a group that only reuses the number. Returns whether it was killed.
///
/// While the leader runs (or is a zombie), its start time must be the recorded one. Once it
/// is gone (the parent-death signal ended it) the number cannot be handed out again while the
/// group has members, so the members are checked instead: every one must be in the worker's
/// session and have started after the leader.
pub(crate) fn stop_recorded(pgid: u32, started: u64, worker: u32) -> bool {
    if pgid <= 1 {
        return false;
    }
    let ours = match stat(pgid) {
        Some(leader) => leader.start == started && leader.pgrp == pgid,
        None => {
            let members = group_members(pgid);
            !members.is_empty()
                && members
                    .iter()
                    .all(|m| m.session == worker && m.start >= started)
        }
    };
    if ours {
        crate::process::groups::kill(pgid);
    }
    ours
}

/// The processes of the group `pgid`.
fn group_members(pgid: u32) -> Vec<Stat> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(stat)
        .filter(|s| s.pgrp == pgid)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_pid_is_not_signalled() {
        // This process is no recorded server: its group is the test runner's, and a start
        // time that does not match refuses it.
        let me = std::process::id();
        let start = start_time(me).unwrap();
        assert!(start > 0);
        assert!(!stop_recorded(me, start + 1, me));
        assert!(!stop_recorded(1, 0, me));
    }
}
