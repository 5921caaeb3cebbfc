//! What this machine's kernel can enforce, asked once per process.

use super::{Policy, Sandbox};

/// A test hook: with `SUMMON_TEST_NO_LANDLOCK=1` summon acts as on a kernel without
/// Landlock, so the refusal can be tested on kernels that have it.
const NO_LANDLOCK_ENV: &str = "SUMMON_TEST_NO_LANDLOCK";

/// The newest Landlock ABI the kernel supports (and summon knows), or `None` without Landlock.
pub(crate) fn landlock_abi() -> Option<u8> {
    static ABI: std::sync::OnceLock<Option<u8>> = std::sync::OnceLock::new();
    *ABI.get_or_init(|| {
        if std::env::var_os(NO_LANDLOCK_ENV).is_some_and(|v| v == "1") {
            return None;
        }
        probe()
    })
}

/// Whether Landlock on this kernel also restricts TCP connect and bind (ABI 4, Linux 6.7).
pub(crate) fn landlock_tcp() -> bool {
    landlock_abi().is_some_and(|abi| abi >= 4)
}

#[cfg(target_os = "linux")]
fn probe() -> Option<u8> {
    use landlock::{ABI, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr};
    // Creating a ruleset restricts nothing; a hard requirement fails where the kernel lacks
    // the ABI, so the first one that succeeds is the kernel's.
    let abis = [
        (ABI::V6, 6),
        (ABI::V5, 5),
        (ABI::V4, 4),
        (ABI::V3, 3),
        (ABI::V2, 2),
        (ABI::V1, 1),
    ];
    abis.into_iter().find_map(|(abi, n)| {
        let created = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessFs::from_all(abi))
            .and_then(|r| r.create());
        created.is_ok().then_some(n)
    })
}

#[cfg(not(target_os = "linux"))]
fn probe() -> Option<u8> {
    None
}

/// Why `sandbox` cannot be enforced here, or `None` when it can (or is `off`).
pub(crate) fn refusal(sandbox: Sandbox) -> Option<String> {
    if sandbox.policy == Policy::Off {
        return None;
    }
    if !cfg!(target_os = "linux") {
        return Some(format!(
            "refused: the `{}` sandbox needs Linux (Landlock and seccomp), and this is {}; \
             run with `--sandbox off` to let commands run unsandboxed",
            sandbox.policy,
            std::env::consts::OS
        ));
    }
    if landlock_abi().is_none() {
        return Some(format!(
            "refused: the `{}` sandbox needs the kernel's Landlock security module (Linux 5.13 \
             or later, enabled with `lsm=landlock,...`), which this kernel does not provide; run \
             with `--sandbox off` to let commands run unsandboxed",
            sandbox.policy
        ));
    }
    None
}
