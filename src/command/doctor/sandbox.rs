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
            let tcp = if landlock_tcp() {
                "files and TCP"
            } else {
                "files; TCP by the socket filter only"
            };
            checks.push(Check::ok(
                Section::Sandbox,
                format!(
                    "commands are sandboxed: Landlock ABI {abi} ({tcp}) and a seccomp filter \
                     refusing non-Unix sockets without --network; default: {}",
                    default.describe()
                ),
            ));
        }
        Some(reason) => checks.push(
            Check::warning(
                Section::Sandbox,
                format!("commands cannot be sandboxed here, so the shell refuses them: {reason}"),
            )
            .fix("use a Linux kernel with Landlock enabled, or choose `--sandbox off` knowingly"),
        ),
    }
    for policy in [Policy::WorkspaceWrite, Policy::ReadOnly, Policy::Off] {
        checks.push(Check::ok(
            Section::Sandbox,
            format!("`{policy}`: {}", policy.summary()),
        ));
    }
    json!({
        "sandboxed": refusal(default.policy_if_on()).is_none(),
        "landlock_abi": landlock_abi(),
        "landlock_tcp": landlock_tcp(),
        "default": default.to_json(),
    })
}
