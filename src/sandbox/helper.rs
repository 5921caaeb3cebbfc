//! The hidden `summon __sandbox` subcommand: confines its own process (no-new-privileges,
//! every capability dropped, Landlock, seccomp), then executes the command, which inherits the
//! confinement with everything it starts.
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
    if sandbox.policy == Policy::Off {
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args);
        return Ok(cmd);
    }
    let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
    cmd.arg(SUBCOMMAND)
        .arg("--policy")
        .arg(sandbox.policy.name());
    if sandbox.network {
        cmd.arg("--network");
    }
    for dir in writable {
        cmd.arg("--write").arg(dir);
    }
    cmd.arg("--").arg(program).args(args);
    Ok(cmd)
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
        for dir in writable {
            cmd.arg("--write").arg(dir);
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
    let mut rest = args[2..].iter();
    loop {
        let arg = rest.next()?.to_str()?;
        match arg {
            "--policy" => policy = Some(Policy::parse(rest.next()?.to_str()?)?),
            "--network" => network = true,
            "--parent" => parent = Some(rest.next()?.to_str()?.parse().ok()?),
            "--write" => writable.push(PathBuf::from(rest.next()?)),
            "--" => break,
            _ => return None,
        }
    }
    let argv: Vec<OsString> = rest.cloned().collect();
    if argv.is_empty() {
        return None;
    }
    Some(run(policy?, network, parent, &writable, &argv))
}

/// Confines this process as asked and executes `argv`; returns only on failure, with the exit
/// code after saying why on stderr. With `parent`, the command is killed when that process
/// (the summon that started this one) ends; if it has already ended, nothing runs.
pub(crate) fn run(
    policy: Policy,
    network: bool,
    parent: Option<u32>,
    writable: &[PathBuf],
    argv: &[OsString],
) -> i32 {
    let Some((program, args)) = argv.split_first() else {
        eprintln!("summon: sandbox: no command given");
        return SETUP_FAILED;
    };
    if let Some(parent) = parent
        && let Err(message) = die_with(parent)
    {
        eprintln!("summon: sandbox: {message}");
        return SETUP_FAILED;
    }
    if policy != Policy::Off
        && let Err(message) = confine(policy, network, writable)
    {
        eprintln!("summon: sandbox: cannot confine the command: {message}");
        return SETUP_FAILED;
    }
    use std::os::unix::process::CommandExt;
    let error = std::process::Command::new(program).args(args).exec();
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

#[cfg(target_os = "linux")]
fn confine(policy: Policy, network: bool, writable: &[PathBuf]) -> Result<(), String> {
    give_up_privileges()?;
    use landlock::{
        ABI, Access, AccessFs, AccessNet, PathBeneath, PathFd, Ruleset, RulesetAttr,
        RulesetCreatedAttr, RulesetStatus,
    };
    // The newest ABI summon knows; on older kernels the crate enforces what the kernel has.
    let abi = ABI::V6;
    let err = |e: landlock::RulesetError| e.to_string();
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?;
    if !network {
        ruleset = ruleset
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .map_err(err)?;
    }
    let path_fd =
        |path: &Path| PathFd::new(path).map_err(|e| format!("cannot open {}: {e}", path.display()));
    let mut created = ruleset
        .create()
        .map_err(err)?
        .add_rule(PathBeneath::new(
            path_fd(Path::new("/"))?,
            AccessFs::from_read(abi),
        ))
        .map_err(err)?;
    for device in DEVICES.map(Path::new).into_iter().filter(|d| d.exists()) {
        created = created
            .add_rule(PathBeneath::new(path_fd(device)?, AccessFs::from_file(abi)))
            .map_err(err)?;
    }
    if policy == Policy::WorkspaceWrite {
        for dir in writable {
            created = created
                .add_rule(PathBeneath::new(path_fd(dir)?, AccessFs::from_all(abi)))
                .map_err(err)?;
        }
    }
    let status = created.restrict_self().map_err(err)?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err("the kernel does not enforce Landlock".to_owned());
    }
    if !network {
        deny_sockets()?;
    }
    Ok(())
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

/// Refuses every new socket but Unix ones (so UDP and raw sockets too, which Landlock does not
/// cover), and io_uring, which could open sockets without the `socket` system call.
#[cfg(target_os = "linux")]
fn deny_sockets() -> Result<(), String> {
    use seccompiler::{
        BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule,
    };
    let not_unix = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Ne,
        libc::AF_UNIX as u64,
    )
    .map_err(|e| e.to_string())?;
    let rules = [
        (
            libc::SYS_socket,
            vec![SeccompRule::new(vec![not_unix]).map_err(|e| e.to_string())?],
        ),
        (libc::SYS_io_uring_setup, vec![]),
    ];
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())?;
    let filter = SeccompFilter::new(
        rules.into_iter().collect(),
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
fn confine(_policy: Policy, _network: bool, _writable: &[PathBuf]) -> Result<(), String> {
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
