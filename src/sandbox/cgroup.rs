//! A control group for each model-run command, where the machine lets summon make one: the
//! whole command (every process it starts) is then held to a total of memory and of
//! processes, beside the rlimits each of its processes has.
//!
//! cgroup v1 (a writable `memory` and `pids` hierarchy, as root) or cgroup v2 (a writable
//! subtree of summon's own cgroup whose `memory.max` and `pids.max` exist, that is where
//! the controllers are delegated to it). The group is made beneath summon's own group in each
//! hierarchy, named `summon-PID` after the sandbox helper, which moves itself into it before
//! it starts the command, so everything the command starts is in it. A small keeper process,
//! started first and left outside the group, removes the group once the helper has gone
//! (however it went: the command's end, a timeout's kill, `kill -9`) and the group is empty.
//! Where no group can be made, nothing is said and the rlimits alone hold.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::Limits;

const MIB: u64 = 1024 * 1024;
/// The helper, the init of the command's PID namespace and the init's thread that watches
/// summon are in the group too.
const OWN_PROCESSES: u64 = 3;

/// Which kind of group a command gets here: `"cgroup v1"`, `"cgroup v2"`, or `None`
/// (the rlimits alone). Makes and removes a trial group.
pub(crate) fn available() -> Option<&'static str> {
    let made = make(Limits::default())?;
    let kind = made.kind;
    for dir in &made.dirs {
        let _ = std::fs::remove_dir(dir);
    }
    Some(kind)
}

/// The group's folders (one per hierarchy) and its kind.
struct Made {
    dirs: Vec<PathBuf>,
    kind: &'static str,
}

/// Makes a group for `limits` with its limits set, or `None` (nothing left behind).
fn make(limits: Limits) -> Option<Made> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let name = format!("summon-{}", std::process::id());
    let v1 = |controller: &str| -> Option<PathBuf> {
        let mount = mounts.lines().find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.get(2) == Some(&"cgroup")
                && fields
                    .get(3)
                    .is_some_and(|o| o.split(',').any(|o| o == controller)))
            .then(|| PathBuf::from(fields[1]))
        })?;
        let path = own.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _ = parts.next();
            let controllers = parts.next()?;
            controllers
                .split(',')
                .any(|c| c == controller)
                .then(|| parts.next())?
        })?;
        Some(mount.join(path.trim_start_matches('/')).join(&name))
    };
    let memory_bytes = limits.total_memory_mb.saturating_mul(MIB);
    let pids = limits.processes.saturating_add(OWN_PROCESSES);
    if let (Some(memory), Some(processes)) = (v1("memory"), v1("pids")) {
        let made = Made {
            dirs: vec![memory.clone(), processes.clone()],
            kind: "cgroup v1",
        };
        let set = || -> Option<()> {
            std::fs::create_dir(&memory).ok()?;
            std::fs::create_dir(&processes).ok()?;
            if limits.total_memory_mb > 0 {
                write(&memory, "memory.limit_in_bytes", memory_bytes)?;
                // Without swap accounting the file is absent: memory alone is the limit.
                if memory.join("memory.memsw.limit_in_bytes").exists() {
                    write(&memory, "memory.memsw.limit_in_bytes", memory_bytes)?;
                }
            }
            if limits.processes > 0 {
                write(&processes, "pids.max", pids)?;
            }
            Some(())
        };
        if set().is_some() {
            return Some(made);
        }
        for dir in &made.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
    let mount = mounts.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(fields[1]))
    })?;
    let path = own.lines().find_map(|line| line.strip_prefix("0::"))?;
    let dir = mount.join(path.trim_start_matches('/')).join(&name);
    std::fs::create_dir(&dir).ok()?;
    let set = || -> Option<()> {
        if !dir.join("memory.max").exists() || !dir.join("pids.max").exists() {
            return None;
        }
        if limits.total_memory_mb > 0 {
            write(&dir, "memory.max", memory_bytes)?;
            if dir.join("memory.swap.max").exists() {
                write(&dir, "memory.swap.max", 0)?;
            }
        }
        if limits.processes > 0 {
            write(&dir, "pids.max", pids)?;
        }
        Some(())
    };
    if set().is_none() {
        let _ = std::fs::remove_dir(&dir);
        return None;
    }
    Some(Made {
        dirs: vec![dir],
        kind: "cgroup v2",
    })
}

fn write(dir: &Path, file: &str, value: u64) -> Option<()> {
    std::fs::write(dir.join(file), value.to_string()).ok()
}

/// Moves this process (the sandbox helper, before it confines itself) into a new group with
/// `limits`, after starting the keeper that removes the group once this process has gone.
/// `None`: no group could be made (or joined), and none is left; the rlimits alone hold.
/// The returned handle is the keeper's end of the pipe: it must live as long as this process.
pub(crate) fn enter(limits: Limits) -> Option<std::process::ChildStdin> {
    use std::os::unix::process::CommandExt;
    let made = make(limits)?;
    let remove = |made: &Made| {
        for dir in &made.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    };
    let keeper = std::env::current_exe().and_then(|exe| {
        let mut keeper = std::process::Command::new(exe);
        keeper.arg(super::helper::SUBCOMMAND);
        for dir in &made.dirs {
            keeper.arg("--release").arg(dir);
        }
        keeper
            .arg("--")
            .stdin(std::process::Stdio::piped())
            // Outside the command's process group, which is killed when the call ends.
            .process_group(0)
            .spawn()
    });
    let Ok(mut keeper) = keeper else {
        remove(&made);
        return None;
    };
    let pid = std::process::id().to_string();
    for dir in &made.dirs {
        if std::fs::write(dir.join("cgroup.procs"), &pid).is_err() {
            // The keeper sees the pipe close and removes the group.
            return None;
        }
    }
    keeper.stdin.take()
}

/// The keeper: waits until the helper that started it has gone (its stdin closes), then
/// removes `dirs` as soon as they are empty. Exits 0 once they are gone.
pub(crate) fn release(dirs: &[PathBuf]) -> i32 {
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    for dir in dirs {
        let mut pause = std::time::Duration::from_millis(5);
        loop {
            match std::fs::remove_dir(dir) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                // Busy: processes of the command are still being ended by the kernel, or
                // (when the command was executed in place) still run.
                Err(_) if dir.join("cgroup.procs").exists() => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(200));
                }
                Err(_) => return 1,
            }
        }
    }
    0
}
