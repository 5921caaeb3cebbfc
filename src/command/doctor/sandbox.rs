//! Whether the commands the model runs with `shell` will be sandboxed here, and what each
//! policy gives on this kernel.

use serde_json::{Value, json};

use super::check::{Check, Section};
use crate::config::file::Config;
use crate::sandbox::support::{landlock_abi, landlock_tcp, refusal};
use crate::sandbox::{Policy, Sandbox};

/// Adds the sandbox findings; returns the `sandbox` object of `--json`.
pub(super) fn check(config: &Config, checks: &mut Vec<Check>) -> Value {
    let default = Sandbox::pick(&[(config.sandbox, config.network)]);
    match refusal(default.policy_if_on()) {
        None => {
            let abi = landlock_abi().unwrap_or(0);
            let tcp = match abi {
                6.. => "files, TCP, signals and abstract sockets",
                4..6 => "files and TCP",
                _ => "files; TCP by the socket filter only",
            };
            checks.push(Check::ok(
                Section::Sandbox,
                format!(
                    "commands are sandboxed: Landlock ABI {abi} ({tcp}) and a seccomp filter \
                     refusing every new socket without --network; default: {}",
                    default.describe()
                ),
            ));
            checks.push(if namespaces() {
                Check::ok(
                    Section::Sandbox,
                    "commands get mount and PID namespaces of their own: read-only mounts but \
                     the writable folders, .git and .summon read-only, nothing outlives a command",
                )
            } else {
                Check::warning(
                    Section::Sandbox,
                    "this kernel or container refuses commands namespaces of their own: .git and \
                     .summon stay writable to the shell, metadata outside the working directory \
                     can change, and a process that leaves the command's group outlives it",
                )
                .fix("allow user namespaces (kernel.apparmor_restrict_unprivileged_userns=0), or run summon as root")
            });
        }
        Some(reason) => checks.push(
            Check::warning(
                Section::Sandbox,
                format!("commands cannot be sandboxed here, so the shell refuses them: {reason}"),
            )
            .fix("use a Linux kernel with Landlock enabled, or choose `--sandbox off` knowingly"),
        ),
    }
    let group = crate::sandbox::cgroup::available();
    checks.push(Check::ok(
        Section::Sandbox,
        match group {
            Some(kind) => {
                let limits = crate::sandbox::Limits::from_process().unwrap_or_default();
                let processes = match limits.processes {
                    0 => "any number of processes".to_owned(),
                    n => format!("{n} processes"),
                };
                let memory = match limits.total_memory_mb {
                    0 => "any memory".to_owned(),
                    n => format!("{n} MiB of memory"),
                };
                format!(
                    "each command is held to its totals by a control group ({kind}): \
                     {processes} (SUMMON_SHELL_MAX_PROCESSES) and {memory} \
                     (SUMMON_SHELL_MAX_TOTAL_MEMORY_MB) in all, beside the rlimits of each process"
                )
            }
            None => "no control group can be made here (it needs root, or a delegated cgroup v2 \
                     subtree): each process of a command has the rlimits alone, so its \
                     processes together may take more than one's limit"
                .to_owned(),
        },
    ));
    for policy in [Policy::WorkspaceWrite, Policy::ReadOnly, Policy::Off] {
        checks.push(Check::ok(
            Section::Sandbox,
            format!("`{policy}`: {}", policy.summary()),
        ));
    }
    json!({
        "sandboxed": refusal(default.policy_if_on()).is_none(),
        "namespaces": refusal(default.policy_if_on()).is_none() && namespaces(),
        "landlock_abi": landlock_abi(),
        "landlock_tcp": landlock_tcp(),
        "limits": group.unwrap_or("rlimits"),
        "default": default.to_json(),
    })
}

/// Whether a sandboxed command gets its own PID namespace here (and so its mount namespace):
/// asked of the sandbox helper, whose shell then has the namespace's init, process 1, as parent.
fn namespaces() -> bool {
    static ANSWER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ANSWER.get_or_init(|| {
        let Ok(exe) = std::env::current_exe() else {
            return false;
        };
        std::process::Command::new(exe)
            .args([
                crate::sandbox::helper::SUBCOMMAND,
                "--own-pids",
                "--policy",
                "read-only",
                "--",
                "sh",
                "-c",
                "echo $PPID",
            ])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .is_ok_and(|out| out.status.success() && out.stdout == b"1\n")
    })
}
