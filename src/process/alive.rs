//! Whether another process is alive, seen from this one.

/// A process exists and is not a zombie.
pub(crate) fn pid_alive(pid: u32) -> bool {
    let stat = std::path::Path::new("/proc")
        .join(pid.to_string())
        .join("stat");
    match std::fs::read_to_string(&stat) {
        Ok(text) => text
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) if std::path::Path::new("/proc/self").exists() => false,
        Err(_) => std::process::Command::new("kill")
            .args(["-0", &pid.to_string()])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
    }
}
