//! The hidden `summon __sandbox` subcommand: confines its own process, then runs the command,
//! which inherits the confinement with everything it starts.
//!
//! In order: every descriptor above stderr that summon's parent left open is closed; then
//! (where the kernel allows, as root or through a user namespace) the process moves to mount
//! and PID namespaces of its own, where every mount is read-only but the writable folders,
//! and `.git` and `.summon` are read-only again inside them; then no-new-privileges, every
//! capability dropped, Landlock (with ABI 6's signal and abstract-socket scopes) and seccomp.
//! A shell command (`--own-pids`) is then started by a small init, the first process of the
//! PID namespace, which reaps orphans and exits as the command does; the kernel then kills
//! whatever is left in the namespace, so no process the command started outlives it. Without
//! the namespaces the command is executed in place, with Landlock and seccomp only.
//!
//! Running the restrictions in a separate exec of summon keeps them off summon's own threads
//! and needs no unsafe code: the `landlock` and `seccompiler` crates apply them to the calling
//! thread, and `exec` replaces the process with the command.
//!
//! MCP servers go through it too, with `--parent PID`: on Linux it first asks the kernel for
//! SIGKILL when its parent goes (`PR_SET_PDEATHSIG`, kept across `exec`), so a server does not
//! outlive a summon killed with no chance to clean up (`kill -9`). Servers start often and
//! with a bounded start-up, so [`early`] runs this before anything else in `main`: no
//! argument parser, no runtime, no configuration.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::{Policy, Sandbox};

/// The name of the hidden subcommand.
pub(crate) const SUBCOMMAND: &str = "__sandbox";
/// The exit code when the sandbox could not be set up (the command did not run).
pub(crate) const SETUP_FAILED: i32 = 125;

/// A `std::process::Command`-like invocation that runs `program args` under `sandbox`, able to
/// write in `writable` (with `workspace-write`). With `off`, the program itself.
pub(crate) fn command(
    sandbox: Sandbox,
    writable: &[&Path],
    program: &str,
    args: &[&str],
) -> std::io::Result<tokio::process::Command> {
    let limits = super::Limits::from_process()
        .map_err(|why| std::io::Error::new(std::io::ErrorKind::InvalidInput, why))?;
    // Unit tests run commands as themselves: their binary is not summon.
    if sandbox.policy == Policy::Off && cfg!(test) {
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args);
        return Ok(cmd);
    }
    let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
    cmd.arg(SUBCOMMAND)
        .arg("--own-pids")
        .arg("--policy")
        .arg(sandbox.policy.name())
        .arg("--limits")
        .arg(limits.to_arg());
    if sandbox.network {
        cmd.arg("--network");
    }
    for path in hidden() {
        cmd.arg("--hide").arg(path);
    }
    for dir in writable {
        cmd.arg("--write").arg(dir);
    }
    for path in protected(writable) {
        cmd.arg("--protect").arg(path);
    }
    cmd.arg("--").arg(program).args(args);
    Ok(cmd)
}

/// What no model-run command may read or change under any policy: the folder of the key
/// summon signs its store with (`$XDG_STATE_HOME/summon`, else `~/.local/state/summon`).
fn hidden() -> Vec<PathBuf> {
    crate::env::Env::from_process()
        .ok()
        .and_then(|env| env.state_dir())
        .and_then(|dir| crate::store::key_path(&dir).parent().map(Path::to_path_buf))
        .into_iter()
        .collect()
}

/// The names no policy but `off` lets a command write, though they lie in a writable folder:
/// `.git` (its hooks and config run later, outside the sandbox) and `.summon` (the store
/// later commands trust).
pub(crate) const PROTECTED_NAMES: [&str; 2] = [".git", ".summon"];

/// The `.git` and `.summon` of each writable folder and of summon's working directory (the
/// project), which stay read-only to the command.
fn protected(writable: &[&Path]) -> Vec<PathBuf> {
    let project = std::env::current_dir().ok();
    writable
        .iter()
        .map(|dir| dir.to_path_buf())
        .chain(project)
        .flat_map(|dir| PROTECTED_NAMES.map(|name| dir.join(name)))
        .collect()
}

/// Like [`command`] for an MCP server: on Linux always through the helper, with `--parent`,
/// so that the server is killed when summon goes, however it goes. The caller must spawn it
/// from a thread that lives as long as summon: the kernel's "parent" is the thread that forks.
pub(crate) fn server_command(
    sandbox: Sandbox,
    writable: &[&Path],
    program: &str,
    args: &[&str],
) -> std::io::Result<tokio::process::Command> {
    if !cfg!(target_os = "linux") {
        return command(sandbox, writable, program, args);
    }
    let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
    cmd.arg(SUBCOMMAND)
        .arg("--parent")
        .arg(std::process::id().to_string())
        .arg("--policy")
        .arg(sandbox.policy.name());
    if sandbox.network {
        cmd.arg("--network");
    }
    if sandbox.policy != Policy::Off {
        for path in hidden() {
            cmd.arg("--hide").arg(path);
        }
        for dir in writable {
            cmd.arg("--write").arg(dir);
        }
        for path in protected(writable) {
            cmd.arg("--protect").arg(path);
        }
    }
    cmd.arg("--").arg(program).args(args);
    Ok(cmd)
}

/// Fails as starting `program` directly would when it cannot be run (not found, not
/// executable), with the same error: through the helper, that failure would come only after
/// the helper started. `dir` is the working directory it starts in, `path` its `PATH`.
pub(crate) fn check_program(
    program: &str,
    dir: &Path,
    path: Option<&std::ffi::OsStr>,
) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |candidate: &Path| {
        std::fs::metadata(candidate)
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let found = if program.contains('/') {
        let candidate = dir.join(program);
        if candidate.exists() && !runnable(&candidate) {
            return Err(std::io::Error::from_raw_os_error(libc::EACCES));
        }
        runnable(&candidate)
    } else {
        path.is_some_and(|path| {
            std::env::split_paths(path).any(|d| runnable(&dir.join(d).join(program)))
        })
    };
    if found {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(libc::ENOENT))
    }
}

/// The helper's arguments, read without the argument parser: `args` are summon's (the
/// program name first). `None` when this is not the helper or the arguments are not the ones
/// [`command`] and [`server_command`] write; the full parser then says what is wrong.
pub(crate) fn early(args: &[OsString]) -> Option<i32> {
    if args.get(1).is_none_or(|a| a != SUBCOMMAND) {
        return None;
    }
    let mut policy = None;
    let mut network = false;
    let mut parent = None;
    let mut writable = Vec::new();
    let mut protect = Vec::new();
    let mut init = false;
    let mut own_pids = false;
    let mut watch = None;
    let mut hide = Vec::new();
    let mut limits = None;
    let mut exec_only = false;
    let mut release = Vec::new();
    let mut rest = args[2..].iter();
    loop {
        let arg = rest.next()?.to_str()?;
        match arg {
            "--policy" => policy = Some(Policy::parse(rest.next()?.to_str()?)?),
            "--network" => network = true,
            "--parent" => parent = Some(rest.next()?.to_str()?.parse().ok()?),
            "--write" => writable.push(PathBuf::from(rest.next()?)),
            "--protect" => protect.push(PathBuf::from(rest.next()?)),
            "--hide" => hide.push(PathBuf::from(rest.next()?)),
            "--limits" => limits = Some(super::Limits::from_arg(rest.next()?.to_str()?)?),
            "--init" => init = true,
            "--own-pids" => own_pids = true,
            "--exec" => exec_only = true,
            "--release" => release.push(PathBuf::from(rest.next()?)),
            "--watch" => watch = Some(rest.next()?.to_str()?.parse().ok()?),
            "--" => break,
            _ => return None,
        }
    }
    let argv: Vec<OsString> = rest.cloned().collect();
    if !release.is_empty() {
        return Some(super::cgroup::release(&release));
    }
    if argv.is_empty() {
        return None;
    }
    if init {
        return Some(init_process(&argv, watch, limits));
    }
    if exec_only {
        let (program, args) = argv.split_first()?;
        if let Err(code) = apply_limits(limits) {
            return Some(code);
        }
        return Some(exec(program, args));
    }
    let paths = Paths {
        writable,
        protect,
        hide,
        limits,
        own_pids,
    };
    Some(run(policy?, network, parent, &paths, &argv))
}

/// Where a confined command may write, and what stays read-only inside that.
#[derive(Debug, Default)]
pub(crate) struct Paths {
    /// Writable with `workspace-write`.
    pub(crate) writable: Vec<PathBuf>,
    /// Read-only even inside `writable` (each, when it exists).
    pub(crate) protect: Vec<PathBuf>,
    /// Neither readable nor writable under any policy (the signing key's folder): an empty
    /// read-only folder is mounted over each in the command's mount namespace, and Landlock's
    /// rules leave each out.
    pub(crate) hide: Vec<PathBuf>,
    /// The command's resource limits (a shell command's; none for an MCP server).
    pub(crate) limits: Option<super::Limits>,
    /// Whether the command gets a PID namespace of its own, whose processes all end with it
    /// (the shell's commands; an MCP server is ended with its process group).
    pub(crate) own_pids: bool,
}

/// Confines this process as asked and runs `argv`: in place (an `exec`), or, with a PID
/// namespace of its own, under an init whose exit code (the command's, or 128 + the signal
/// that ended it) is returned. Otherwise returns only on failure, with the exit code after
/// saying why on stderr. With `parent`, the command is killed when that process (the summon
/// that started this one) ends; if it has already ended, nothing runs.
pub(crate) fn run(
    policy: Policy,
    network: bool,
    parent: Option<u32>,
    paths: &Paths,
    argv: &[OsString],
) -> i32 {
    let Some((program, args)) = argv.split_first() else {
        eprintln!("summon: sandbox: no command given");
        return SETUP_FAILED;
    };
    close_inherited();
    if let Some(parent) = parent
        && let Err(message) = die_with(parent)
    {
        eprintln!("summon: sandbox: {message}");
        return SETUP_FAILED;
    }
    // A shell command's whole process tree is held to its totals by a control group, made and
    // joined while this process may still write the cgroup folders; without one, the rlimits
    // alone hold. The keeper's pipe closes when this process goes, however it goes.
    let _group = paths
        .own_pids
        .then_some(paths.limits)
        .flatten()
        .and_then(super::cgroup::enter);
    let isolated = if policy == Policy::Off {
        let isolated = paths.own_pids && own_processes();
        // A shell command's (an MCP server under `off` is the author's, as written).
        if paths.own_pids
            && let Err(message) = hide_only(&paths.hide)
        {
            eprintln!(
                "summon: sandbox: cannot keep the signing key and keyrings from the command: {message}"
            );
            return SETUP_FAILED;
        }
        isolated
    } else {
        match isolate(policy, paths) {
            Ok(isolated) => isolated,
            Err(message) => {
                eprintln!("summon: sandbox: cannot isolate the command: {message}");
                return SETUP_FAILED;
            }
        }
    };
    // Where the command's mount namespace covers a hidden folder, its path leads only to the
    // empty folder mounted there: Landlock need not leave it out.
    let hide = still_visible(&paths.hide);
    if policy != Policy::Off
        && let Err(message) = confine(policy, network, &paths.writable, &hide)
    {
        eprintln!("summon: sandbox: cannot confine the command: {message}");
        return SETUP_FAILED;
    }
    if !(isolated && paths.own_pids) {
        if let Err(code) = apply_limits(paths.limits) {
            return code;
        }
        return exec(program, args);
    }
    // The first process started now is the init of the new PID namespace: when it ends, the
    // kernel kills every process left in it, however it was started (setsid, double fork).
    // This process and the init stay between the command and summon: like summon, neither
    // lets the command read its memory or environment.
    #[cfg(target_os = "linux")]
    let _ = nix::sys::prctl::set_dumpable(false);
    // This process cannot start a thread any more (it is not in the namespace its children
    // are): the init watches summon instead.
    let summon = std::os::unix::process::parent_id().to_string();
    let spawned = std::env::current_exe().and_then(|exe| {
        let mut init = std::process::Command::new(exe);
        init.args([SUBCOMMAND, "--init", "--watch", &summon]);
        if let Some(limits) = paths.limits {
            init.arg("--limits").arg(limits.to_arg());
        }
        init.arg("--").args(argv).spawn()
    });
    let mut init = match spawned {
        Ok(init) => init,
        Err(e) => {
            eprintln!("summon: sandbox: cannot start the command's init process: {e}");
            return SETUP_FAILED;
        }
    };
    match init.wait() {
        Ok(status) => exit_code(status),
        Err(e) => {
            eprintln!("summon: sandbox: cannot wait for the command: {e}");
            SETUP_FAILED
        }
    }
}

/// Under `off`, as root: a PID namespace only (nothing else changes). `false` when that
/// cannot be had (not root, or no `CAP_SYS_ADMIN`).
#[cfg(target_os = "linux")]
fn own_processes() -> bool {
    nix::unistd::geteuid().is_root()
        && nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWPID).is_ok()
}

#[cfg(not(target_os = "linux"))]
fn own_processes() -> bool {
    false
}

/// The exit code that reports `status`: the code, or 128 + the signal that ended it.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(SETUP_FAILED)
}

/// The init of a command's PID namespace: starts `argv`, reaps every process that ends in the
/// namespace (orphans come to it), and exits as `argv` did, which ends the namespace and
/// everything still in it. It also goes when the helper that started it goes.
/// Sets the command's resource limits on this process, which starts or becomes the command
/// next (summon itself could not start under them); `Err`: the exit code, after saying why.
fn apply_limits(limits: Option<super::Limits>) -> Result<(), i32> {
    match limits.map(super::Limits::apply) {
        Some(Err(message)) => {
            eprintln!("summon: sandbox: {message}");
            Err(SETUP_FAILED)
        }
        _ => Ok(()),
    }
}

#[cfg(target_os = "linux")]
fn init_process(argv: &[OsString], summon: Option<u32>, limits: Option<super::Limits>) -> i32 {
    use nix::sys::wait::{WaitStatus, wait};
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    let _ = nix::sys::prctl::set_dumpable(false);
    if let Some(summon) = summon {
        watch(summon);
    }
    let Some((program, args)) = argv.split_first() else {
        return SETUP_FAILED;
    };
    // The limits are set by a process of their own, which then becomes the command: this
    // one, under them, could not start it.
    let mut command = match limits {
        Some(limits) => {
            let Ok(exe) = std::env::current_exe() else {
                return SETUP_FAILED;
            };
            let mut command = std::process::Command::new(exe);
            command
                .args([SUBCOMMAND, "--exec", "--limits", &limits.to_arg(), "--"])
                .arg(program)
                .args(args);
            command
        }
        None => {
            let mut command = std::process::Command::new(program);
            command.args(args);
            command
        }
    };
    let child = match command.spawn() {
        Ok(child) => child,
        Err(error) => return cannot_run(program, &error),
    };
    let main = nix::unistd::Pid::from_raw(child.id() as i32);
    loop {
        match wait() {
            Ok(WaitStatus::Exited(pid, code)) if pid == main => return code,
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == main => return 128 + signal as i32,
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return SETUP_FAILED,
        }
    }
}

/// How often a command's init looks whether summon is still there.
#[cfg(target_os = "linux")]
const SUMMON_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// Ends this init, and so its whole PID namespace, when summon (`pid`, as `/proc` numbers it)
/// ends however it ends (`kill -9` included), even while the command runs on: a thread looks
/// at summon's `/proc` entry, whose start time tells it from a later process given its number.
#[cfg(target_os = "linux")]
fn watch(pid: u32) {
    let started = move || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        // After the name: state, then the start time is the 20th field.
        (fields.first() != Some(&"Z")).then(|| fields.get(19).map(|s| s.to_string()))?
    };
    let Some(first) = started() else {
        std::process::exit(SETUP_FAILED);
    };
    std::thread::spawn(move || {
        while started().as_ref() == Some(&first) {
            std::thread::sleep(SUMMON_POLL);
        }
        std::process::exit(128 + libc::SIGKILL);
    });
}

#[cfg(not(target_os = "linux"))]
fn init_process(argv: &[OsString], _summon: Option<u32>, _limits: Option<super::Limits>) -> i32 {
    let Some((program, args)) = argv.split_first() else {
        return SETUP_FAILED;
    };
    exec(program, args)
}

/// Executes `program args` in place of this process; returns only on failure.
fn exec(program: &OsString, args: &[OsString]) -> i32 {
    use std::os::unix::process::CommandExt;
    let error = std::process::Command::new(program).args(args).exec();
    cannot_run(program, &error)
}

/// Says that `program` could not be started; the exit code a shell would give.
fn cannot_run(program: &OsString, error: &std::io::Error) -> i32 {
    eprintln!(
        "summon: sandbox: cannot run `{}`: {error}",
        program.to_string_lossy()
    );
    if error.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

/// Asks for SIGKILL when the parent ends, then checks that the parent is still `parent`: had it
/// ended before the request, the signal would never come (the process was already adopted).
#[cfg(target_os = "linux")]
fn die_with(parent: u32) -> Result<(), String> {
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("cannot ask for a parent-death signal: {e}"))?;
    if std::os::unix::process::parent_id() != parent {
        return Err(format!("summon (pid {parent}) has already ended"));
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn die_with(_parent: u32) -> Result<(), String> {
    Ok(())
}

/// Closes every descriptor above stderr that this process inherited (a socket or pipe summon's
/// own parent left open), so the command cannot use it: with no network, an inherited socket
/// would be a way out. Runs first, while this process has opened nothing of its own.
fn close_inherited() {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    // The listing's own descriptor, among them, is closed already: that close fails quietly.
    for fd in fds {
        let _ = nix::unistd::close(fd);
    }
}

/// Puts this process in a new mount namespace, and a PID namespace with `own_pids` (and a user
/// namespace when it is not root, which an unprivileged user needs for the others), then makes every mount
/// read-only but the `writable` folders (with `workspace-write`), and the `protect` paths
/// read-only again inside them. `Ok(false)` when the kernel offers no such namespaces here:
/// the command then runs with Landlock and seccomp only.
#[cfg(target_os = "linux")]
fn isolate(policy: Policy, paths: &Paths) -> Result<bool, String> {
    use nix::sched::{CloneFlags, unshare};
    let uid = nix::unistd::geteuid();
    let gid = nix::unistd::getegid();
    let mut base = CloneFlags::CLONE_NEWNS;
    if paths.own_pids {
        base |= CloneFlags::CLONE_NEWPID;
    }
    if !(uid.is_root() && unshare(base).is_ok()) {
        if unshare(base | CloneFlags::CLONE_NEWUSER).is_err() {
            return Ok(false);
        }
        let map = |file: &str, text: String| {
            std::fs::write(format!("/proc/self/{file}"), text)
                .map_err(|e| format!("cannot write /proc/self/{file}: {e}"))
        };
        map("setgroups", "deny".to_owned())?;
        map("uid_map", format!("{uid} {uid} 1"))?;
        map("gid_map", format!("{gid} {gid} 1"))?;
    }
    let cwd = std::env::current_dir().map_err(|e| format!("cannot read the folder: {e}"))?;
    if let Err(message) = read_only_mounts(policy, paths) {
        eprintln!(
            "summon: sandbox: warning: {message}; metadata outside the working directory, .git \
             and .summon are not protected for this command"
        );
    }
    // The working directory was opened on the mount beneath the new ones: open it again.
    std::env::set_current_dir(&cwd).map_err(|e| format!("cannot enter {}: {e}", cwd.display()))?;
    Ok(true)
}

#[cfg(not(target_os = "linux"))]
fn isolate(_policy: Policy, _paths: &Paths) -> Result<bool, String> {
    Ok(false)
}

/// In this process's own mount namespace: every mount read-only (so no `chmod`, `chown`,
/// `utime` or `setxattr` outside the writable folders either, which Landlock does not
/// cover), each writable folder bound writable over itself, and each existing protected path
/// bound read-only over itself.
#[cfg(target_os = "linux")]
fn read_only_mounts(policy: Policy, paths: &Paths) -> Result<(), String> {
    use nix::mount::{MsFlags, mount};
    let none: Option<&str> = None;
    // Nothing done here may reach the mounts outside.
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .map_err(|e| format!("cannot make the mounts private: {e}"))?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    for point in mountinfo.lines().filter_map(mount_point) {
        // A mount hidden under another one cannot be reached by its path, nor by a command.
        let _ = remount(&point, true);
    }
    // An empty read-only folder over each hidden one: the command sees nothing there.
    for path in paths.hide.iter().filter(|p| p.is_dir()) {
        mount(
            Some("tmpfs"),
            path,
            Some("tmpfs"),
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("size=4k,mode=0500"),
        )
        .map_err(|e| format!("cannot hide {}: {e}", path.display()))?;
    }
    if policy != Policy::WorkspaceWrite {
        return Ok(());
    }
    let bind = |path: &Path, read_only: bool| {
        mount(
            Some(path),
            path,
            none,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            none,
        )
        .and_then(|()| remount(path, read_only))
        .map_err(|e| format!("cannot bind {} over itself: {e}", path.display()))
    };
    for dir in &paths.writable {
        bind(dir, false)?;
    }
    for path in paths.protect.iter().filter(|p| p.exists()) {
        bind(path, true)?;
    }
    Ok(())
}

/// Changes whether the mount at `point` is read-only, keeping its other flags (which a user
/// namespace may not change).
#[cfg(target_os = "linux")]
fn remount(point: &Path, read_only: bool) -> nix::Result<()> {
    use nix::mount::{MsFlags, mount};
    use nix::sys::statvfs::{FsFlags, statvfs};
    let had = statvfs(point)?.flags();
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND;
    for (kept, flag) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if had.contains(kept) {
            flags |= flag;
        }
    }
    if read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    let none: Option<&str> = None;
    mount(none, point, none, flags, none)
}

/// The mount point of a line of `/proc/self/mountinfo` (its fifth field, with the octal
/// escapes of spaces, tabs, newlines and backslashes undone).
fn mount_point(line: &str) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let field = line.split(' ').nth(4)?.as_bytes();
    let mut bytes = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let escaped = field
            .get(i + 1..i + 4)
            .filter(|_| field[i] == b'\\')
            .and_then(|digits| u8::from_str_radix(std::str::from_utf8(digits).ok()?, 8).ok());
        match escaped {
            Some(byte) => {
                bytes.push(byte);
                i += 4;
            }
            None => {
                bytes.push(field[i]);
                i += 1;
            }
        }
    }
    Some(PathBuf::from(OsString::from_vec(bytes)))
}

/// Devices every policy may write: sinks, sources and the terminal.
#[cfg(target_os = "linux")]
const DEVICES: [&str; 6] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// Adds Landlock rules granting `access` beneath `root`, but for the `hide` paths: where one
/// lies beneath it, the folders on the way to it get only what lists them and makes entries
/// in them (no file read, removal or rename, which could move a hidden folder out), and
/// every other entry of theirs gets `access`. Landlock judges a file by where it really is,
/// so a link to a hidden path leads nowhere either; a link among the entries is granted
/// only when it leads clear of every hidden path.
#[cfg(target_os = "linux")]
fn grant_except(
    mut created: landlock::RulesetCreated,
    root: &Path,
    access: landlock::BitFlags<landlock::AccessFs>,
    hide: &[PathBuf],
) -> Result<landlock::RulesetCreated, String> {
    use landlock::{AccessFs, PathBeneath, PathFd, RulesetCreatedAttr};
    let err = |e: landlock::RulesetError| e.to_string();
    if hide.iter().any(|h| root.starts_with(h)) {
        return Ok(created);
    }
    let rule = |created: landlock::RulesetCreated, path: &Path, access| {
        match PathFd::new(path) {
            Ok(fd) => created.add_rule(PathBeneath::new(fd, access)).map_err(err),
            // Gone since it was listed, or not ours to open: no rule, no access.
            Err(_) => Ok(created),
        }
    };
    if !hide.iter().any(|h| h.starts_with(root)) {
        return rule(created, root, access);
    }
    let on_the_way = access
        & (AccessFs::ReadDir
            | AccessFs::MakeChar
            | AccessFs::MakeDir
            | AccessFs::MakeReg
            | AccessFs::MakeSock
            | AccessFs::MakeFifo
            | AccessFs::MakeBlock
            | AccessFs::MakeSym);
    created = rule(created, root, on_the_way)?;
    let entries =
        std::fs::read_dir(root).map_err(|e| format!("cannot list {}: {e}", root.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let is_link = entry.file_type().is_ok_and(|t| t.is_symlink());
        if is_link {
            let Ok(real) = std::fs::canonicalize(&path) else {
                continue;
            };
            if hide
                .iter()
                .any(|h| real.starts_with(h) || h.starts_with(&real))
            {
                continue;
            }
        }
        created = grant_except(created, &path, access, hide)?;
    }
    Ok(created)
}

/// Under `off`: only the `hide` paths (Landlock) and the kernel's keyrings (seccomp) are out
/// of reach; everything else as the user may. With no-new-privileges, which both need.
#[cfg(target_os = "linux")]
fn hide_only(hide: &[PathBuf]) -> Result<(), String> {
    use landlock::{ABI, Access, AccessFs, Ruleset, RulesetAttr};
    let abi = ABI::V6;
    let err = |e: landlock::RulesetError| e.to_string();
    let hide = canonical(hide);
    let created = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?
        .create()
        .map_err(err)?;
    let created = grant_except(created, Path::new("/"), AccessFs::from_all(abi), &hide)?;
    created.restrict_self().map_err(err)?;
    deny_syscalls(Policy::Off, true)
}

#[cfg(not(target_os = "linux"))]
fn hide_only(_hide: &[PathBuf]) -> Result<(), String> {
    Ok(())
}

/// The `hide` paths that are not covered by a mount of their own (the empty folder
/// [`read_only_mounts`] puts over each in the command's mount namespace).
fn still_visible(hide: &[PathBuf]) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    hide.iter()
        .filter(|path| {
            let covered = path.parent().is_some_and(|parent| {
                match (std::fs::metadata(path), std::fs::metadata(parent)) {
                    (Ok(own), Ok(above)) => {
                        own.dev() != above.dev()
                            && std::fs::read_dir(path).is_ok_and(|mut d| d.next().is_none())
                    }
                    _ => false,
                }
            });
            !covered
        })
        .cloned()
        .collect()
}

/// The paths as they really are (a hidden folder reached through a link is hidden where it
/// is); one that does not exist is kept as written.
fn canonical(paths: &[PathBuf]) -> Vec<PathBuf> {
    paths
        .iter()
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
        .collect()
}

#[cfg(target_os = "linux")]
fn confine(
    policy: Policy,
    network: bool,
    writable: &[PathBuf],
    hide: &[PathBuf],
) -> Result<(), String> {
    give_up_privileges()?;
    use landlock::{
        ABI, Access, AccessFs, AccessNet, PathBeneath, PathFd, Ruleset, RulesetAttr,
        RulesetCreatedAttr, RulesetStatus, Scope,
    };
    // The newest ABI summon knows; on older kernels the crate enforces what the kernel has.
    let abi = ABI::V6;
    let err = |e: landlock::RulesetError| e.to_string();
    // ABI 6 (Linux 6.12): no signal to a process outside the sandbox (summon, the user's
    // other processes) and no connection to an abstract UNIX socket created outside it.
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?
        .scope(Scope::Signal | Scope::AbstractUnixSocket)
        .map_err(err)?;
    if !network {
        ruleset = ruleset
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .map_err(err)?;
    }
    let path_fd =
        |path: &Path| PathFd::new(path).map_err(|e| format!("cannot open {}: {e}", path.display()));
    let hide = canonical(hide);
    let mut created = grant_except(
        ruleset.create().map_err(err)?,
        Path::new("/"),
        AccessFs::from_read(abi),
        &hide,
    )?;
    for device in DEVICES.map(Path::new).into_iter().filter(|d| d.exists()) {
        created = created
            .add_rule(PathBeneath::new(path_fd(device)?, AccessFs::from_file(abi)))
            .map_err(err)?;
    }
    if policy == Policy::WorkspaceWrite {
        for dir in writable {
            // A writable folder that holds a hidden one (the home folder as the workspace, with
            // no mount namespace to cover it): its files stay writable, new ones too, so the
            // folders on the way keep writing files; reading, removing and renaming stay out.
            let path = path_fd(dir)?;
            if hide.iter().any(|h| h.starts_with(dir)) {
                created = grant_except(created, dir, AccessFs::from_all(abi), &hide)?
                    .add_rule(PathBeneath::new(
                        path,
                        AccessFs::WriteFile | AccessFs::Truncate,
                    ))
                    .map_err(err)?;
            } else {
                created = created
                    .add_rule(PathBeneath::new(path, AccessFs::from_all(abi)))
                    .map_err(err)?;
            }
        }
    }
    let status = created.restrict_self().map_err(err)?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err("the kernel does not enforce Landlock".to_owned());
    }
    deny_syscalls(policy, network)
}

/// Sets no-new-privileges and drops every capability: the bounding set (when this process
/// may, that is with `CAP_SETPCAP`), then the ambient, inheritable, effective and permitted
/// sets. With no-new-privileges and nothing permitted, no program the command executes gains
/// a capability, not even as root (the kernel caps an exec's permitted set at the caller's).
///
/// Without `CAP_SYS_PTRACE`, and with fewer capabilities than the processes outside, a
/// command run as root can no longer read their memory or `/proc/PID/environ` (summon's own is
/// also closed by [`super::forbid_inspection`]), nor use root's powers (`sethostname`,
/// mounts, reading files only root's capabilities would open).
#[cfg(target_os = "linux")]
fn give_up_privileges() -> Result<(), String> {
    use caps::{CapSet, Capability};
    nix::sys::prctl::set_no_new_privs()
        .map_err(|e| format!("cannot set no-new-privileges: {e}"))?;
    let fail = |what: &str, e: caps::errors::CapsError| format!("cannot drop {what}: {e}");
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false) {
        caps::clear(None, CapSet::Bounding).map_err(|e| fail("the bounding capabilities", e))?;
    }
    caps::clear(None, CapSet::Ambient).map_err(|e| fail("the ambient capabilities", e))?;
    for (set, what) in [
        (CapSet::Inheritable, "the inheritable capabilities"),
        (CapSet::Effective, "the effective capabilities"),
        (CapSet::Permitted, "the permitted capabilities"),
    ] {
        caps::clear(None, set).map_err(|e| fail(what, e))?;
    }
    let left = caps::read(None, CapSet::Permitted).map_err(|e| fail("capabilities", e))?;
    if !left.is_empty() {
        return Err(format!("{} capabilities are still permitted", left.len()));
    }
    Ok(())
}

/// The system calls that change a file's metadata, which Landlock does not cover: refused
/// outright under `read-only` (the read-only mounts of [`isolate`] refuse them outside the
/// writable folders under `workspace-write`, where the kernel has the namespaces).
#[cfg(target_os = "linux")]
const METADATA_CALLS: &[libc::c_long] = &[
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_fchown,
    libc::SYS_fchownat,
    libc::SYS_utimensat,
    libc::SYS_setxattr,
    libc::SYS_lsetxattr,
    libc::SYS_fsetxattr,
    libc::SYS_removexattr,
    libc::SYS_lremovexattr,
    libc::SYS_fremovexattr,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_fchmodat2,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_chmod,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_chown,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_lchown,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_utime,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_utimes,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_futimesat,
];

/// Without network: refuses every new socket, UNIX ones included (a named socket such as
/// docker's or D-Bus's is a way out that Landlock does not cover), while `socketpair` still
/// works; and io_uring, which could open sockets without the `socket` system call. Under
/// `read-only`: also the [`METADATA_CALLS`].
#[cfg(target_os = "linux")]
fn deny_syscalls(policy: Policy, network: bool) -> Result<(), String> {
    use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, SeccompRule};
    let mut rules: std::collections::BTreeMap<i64, Vec<SeccompRule>> = Default::default();
    // The kernel's keyrings hold the session's and the user's keys: no policy reads them.
    for call in [libc::SYS_keyctl, libc::SYS_add_key, libc::SYS_request_key] {
        rules.insert(call, vec![]);
    }
    if !network {
        rules.insert(libc::SYS_socket, vec![]);
        rules.insert(libc::SYS_io_uring_setup, vec![]);
    }
    if policy == Policy::ReadOnly {
        for call in METADATA_CALLS {
            rules.insert(*call, vec![]);
        }
    }
    if rules.is_empty() {
        return Ok(());
    }
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    let program: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())?;
    seccompiler::apply_filter(&program).map_err(|e| e.to_string())
}

#[cfg(not(target_os = "linux"))]
fn confine(
    _policy: Policy,
    _network: bool,
    _writable: &[PathBuf],
    _hide: &[PathBuf],
) -> Result<(), String> {
    Err(format!(
        "sandboxing needs Linux, and this is {}",
        std::env::consts::OS
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn only_the_arguments_summon_writes_take_the_early_path() {
        // Each of these is left to the argument parser (which runs or refuses it); none runs
        // a command here.
        for list in [
            &["summon", "run", "p.yaml"][..],
            &["summon"],
            &["summon", SUBCOMMAND, "--help"],
            &["summon", SUBCOMMAND, "--policy", "nowhere", "--", "true"],
            &[
                "summon", SUBCOMMAND, "--parent", "x", "--policy", "off", "--", "true",
            ],
            &["summon", SUBCOMMAND, "--policy", "off", "--"],
            &["summon", SUBCOMMAND, "--network", "--", "true"],
            &["summon", SUBCOMMAND, "--policy", "off", "true"],
        ] {
            assert_eq!(early(&args(list)), None, "{list:?}");
        }
    }

    #[test]
    fn mount_points_are_read_with_their_escapes_undone() {
        let line = "36 27 0:33 / /mnt/with\\040space\\134x rw,relatime - tmpfs tmpfs rw";
        assert_eq!(mount_point(line), Some(PathBuf::from("/mnt/with space\\x")));
        assert_eq!(
            mount_point("27 1 254:0 / / rw - ext4 /dev/vda rw"),
            Some(PathBuf::from("/"))
        );
        assert_eq!(mount_point("short line"), None);
    }

    #[test]
    fn a_missing_program_fails_like_a_direct_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = std::env::var_os("PATH");
        assert!(check_program("sh", dir.path(), path.as_deref()).is_ok());
        let missing =
            check_program("no-such-server-anywhere", dir.path(), path.as_deref()).unwrap_err();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
        std::fs::write(dir.path().join("data.txt"), "x").unwrap();
        let not_runnable = check_program("./data.txt", dir.path(), path.as_deref()).unwrap_err();
        assert_eq!(not_runnable.kind(), std::io::ErrorKind::PermissionDenied);
    }
}
