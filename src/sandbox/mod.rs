//! The sandbox of commands the model runs through the `shell` tool.
//!
//! A policy says where such a command may write; network access is a separate grant. On Linux
//! summon applies them by starting itself with a hidden subcommand ([`helper`]) that confines
//! its own process (read-only mounts but the writable folders, `.git` and `.summon` read-only;
//! no-new-privileges and no capability, even as root; Landlock; a seccomp filter) and then
//! runs the command in a PID namespace of its own, so the confinement is inherited by
//! everything the command starts and nothing it starts outlives it. summon itself is not dumpable ([`forbid_inspection`]), so no command
//! reads its memory or environment. Where the kernel cannot
//! confine ([`support`]), the shell refuses unless the policy is `off`.

pub(crate) mod cgroup;
pub(crate) mod environment;
pub(crate) mod helper;
mod limits;
mod policy;
pub(crate) mod support;

pub(crate) use environment::{CommandEnv, is_secret_name};
pub(crate) use limits::Limits;
pub(crate) use policy::{Policy, Sandbox};

/// Makes this process non-dumpable (`PR_SET_DUMPABLE` 0): its memory and its
/// `/proc/PID/environ`, which hold the API keys, can then be read only by a process with
/// `CAP_SYS_PTRACE`, which no sandboxed command has, and not by another process of the same
/// user; no core file is written either. summon's own reads of `/proc/self` are unaffected.
/// Called first thing by every summon but the sandbox helper, which executes a command anyway
/// (an exec makes a process dumpable again).
pub(crate) fn forbid_inspection() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("summon: warning: cannot make this process non-dumpable: {e}");
    }
}
