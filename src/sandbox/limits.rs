//! The resource limits of a model-run command: how many processes it may add, how much
//! memory each of its processes may take, and how large a file it may write. They are set
//! as rlimits by the sandbox helper, inherited by everything the command starts, and hold
//! under every policy.
//!
//! Defaults: 512 processes beyond those the user already runs, 2048 MiB of data (heap and
//! private mappings) per process, files of up to 1024 MiB. Where a control group can be made
//! ([`super::cgroup`]), the whole command is also held to 512 processes and 4096 MiB of memory
//! in all. Each is set by a variable of summon's environment (a whole number; `0` lifts that
//! limit): `SUMMON_SHELL_MAX_PROCESSES` (per user and in all), `SUMMON_SHELL_MAX_MEMORY_MB`,
//! `SUMMON_SHELL_MAX_TOTAL_MEMORY_MB`, `SUMMON_SHELL_MAX_FILE_MB`.

/// The variables that set the limits, with their defaults.
pub(crate) const PROCESSES_VAR: &str = "SUMMON_SHELL_MAX_PROCESSES";
pub(crate) const MEMORY_VAR: &str = "SUMMON_SHELL_MAX_MEMORY_MB";
pub(crate) const FILE_VAR: &str = "SUMMON_SHELL_MAX_FILE_MB";
pub(crate) const TOTAL_MEMORY_VAR: &str = "SUMMON_SHELL_MAX_TOTAL_MEMORY_MB";
const DEFAULT_PROCESSES: u64 = 512;
const DEFAULT_MEMORY_MB: u64 = 2048;
const DEFAULT_FILE_MB: u64 = 1024;
const DEFAULT_TOTAL_MEMORY_MB: u64 = 4096;

/// The limits of one command; `0` is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Processes the command may run at once beyond the user's others.
    pub(crate) processes: u64,
    /// Data segment (heap, private writable mappings) of each process, in MiB.
    pub(crate) memory_mb: u64,
    /// Largest file a process may write, in MiB.
    pub(crate) file_mb: u64,
    /// Memory of all the command's processes together, in MiB (held by a control group).
    pub(crate) total_memory_mb: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            processes: DEFAULT_PROCESSES,
            memory_mb: DEFAULT_MEMORY_MB,
            file_mb: DEFAULT_FILE_MB,
            total_memory_mb: DEFAULT_TOTAL_MEMORY_MB,
        }
    }
}

impl Limits {
    /// The limits `var` sets (summon's environment), the default for each unset;
    /// `Err` names a variable that is not a whole number.
    pub(crate) fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let mut limits = Self::default();
        for (name, slot) in [
            (PROCESSES_VAR, &mut limits.processes),
            (MEMORY_VAR, &mut limits.memory_mb),
            (FILE_VAR, &mut limits.file_mb),
            (TOTAL_MEMORY_VAR, &mut limits.total_memory_mb),
        ] {
            if let Some(value) = var(name) {
                *slot = value.trim().parse().map_err(|_| {
                    format!("{name}={value} is not a whole number (0 lifts the limit)")
                })?;
            }
        }
        Ok(limits)
    }

    /// The limits of summon's own environment.
    pub(crate) fn from_process() -> Result<Self, String> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The helper's argument that carries them: `PROCESSES:MEMORY_MB:FILE_MB:TOTAL_MEMORY_MB`.
    pub(crate) fn to_arg(self) -> String {
        format!(
            "{}:{}:{}:{}",
            self.processes, self.memory_mb, self.file_mb, self.total_memory_mb
        )
    }

    pub(crate) fn from_arg(arg: &str) -> Option<Self> {
        let mut parts = arg.split(':').map(|p| p.parse().ok());
        let limits = Self {
            processes: parts.next()??,
            memory_mb: parts.next()??,
            file_mb: parts.next()??,
            total_memory_mb: parts.next()??,
        };
        parts.next().is_none().then_some(limits)
    }

    /// Sets the limits on this process (inherited by what it starts). The process limit counts
    /// the user's processes now: the kernel counts every process of the user.
    #[cfg(target_os = "linux")]
    pub(crate) fn apply(self) -> Result<(), String> {
        use nix::sys::resource::{Resource, setrlimit};
        const MIB: u64 = 1024 * 1024;
        let set = |resource: Resource, what: &str, value: u64| {
            setrlimit(resource, value, value).map_err(|e| format!("cannot limit {what}: {e}"))
        };
        if self.processes > 0 {
            let running = processes_of(nix::unistd::getuid().as_raw());
            set(
                Resource::RLIMIT_NPROC,
                "the number of processes",
                running + self.processes,
            )?;
        }
        if self.memory_mb > 0 {
            set(
                Resource::RLIMIT_DATA,
                "memory",
                self.memory_mb.saturating_mul(MIB),
            )?;
        }
        if self.file_mb > 0 {
            set(
                Resource::RLIMIT_FSIZE,
                "the size of files",
                self.file_mb.saturating_mul(MIB),
            )?;
        }
        Ok(())
    }

    #[cfg(not(target_os = "linux"))]
    pub(crate) fn apply(self) -> Result<(), String> {
        Ok(())
    }
}

/// How many processes (threads count as the kernel counts them: each task) the user `uid` runs.
#[cfg(target_os = "linux")]
fn processes_of(uid: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut count = 0u64;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |key: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(key))
                .map(str::trim)
                .map(str::to_owned)
        };
        let owned = field("Uid:")
            .and_then(|uids| uids.split_whitespace().next().map(str::to_owned))
            .is_some_and(|real| real == uid.to_string());
        if owned {
            count += field("Threads:").and_then(|n| n.parse().ok()).unwrap_or(1);
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_come_from_the_variables_or_the_defaults() {
        let none = Limits::from_vars(|_| None).unwrap();
        assert_eq!(none, Limits::default());
        let set = Limits::from_vars(|name| (name == MEMORY_VAR).then(|| "64".to_owned())).unwrap();
        assert_eq!(set.memory_mb, 64);
        assert_eq!(set.processes, DEFAULT_PROCESSES);
        let error =
            Limits::from_vars(|name| (name == FILE_VAR).then(|| "1G".to_owned())).unwrap_err();
        assert!(error.contains("SUMMON_SHELL_MAX_FILE_MB=1G"), "{error}");
        assert_eq!(Limits::from_arg(&set.to_arg()), Some(set));
        assert_eq!(Limits::from_arg("1:2"), None);
        assert_eq!(Limits::from_arg("1:2:3"), None);
        let total =
            Limits::from_vars(|name| (name == TOTAL_MEMORY_VAR).then(|| "0".to_owned())).unwrap();
        assert_eq!(total.total_memory_mb, 0);
        assert_eq!(total.memory_mb, DEFAULT_MEMORY_MB);
    }
}
