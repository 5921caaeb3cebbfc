//! goose's `retry`: shell checks run in the working directory after the agent loop; when one
//! fails, `on_failure` runs and the task starts again, a bounded number of times.

use std::path::Path;
use std::time::Duration;

use crate::recipe::RetryConfig;

/// goose's default timeout for checks and the on-failure command.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs every check in order; the first failure is returned as a reason.
pub(crate) async fn run_checks(retry: &RetryConfig, workdir: &Path) -> Result<(), String> {
    let timeout = retry
        .timeout_secs
        .map_or(DEFAULT_TIMEOUT, Duration::from_secs);
    for check in &retry.checks {
        run_shell(check, workdir, timeout)
            .await
            .map_err(|why| format!("check `{check}` {why}"))?;
    }
    Ok(())
}

/// Runs the `on_failure` command, if any; its failure is reported but does not stop retries.
pub(crate) async fn run_on_failure(retry: &RetryConfig, workdir: &Path) -> Option<String> {
    let command = retry.on_failure.as_deref()?;
    let timeout = retry
        .on_failure_timeout_secs
        .map_or(DEFAULT_TIMEOUT, Duration::from_secs);
    run_shell(command, workdir, timeout)
        .await
        .err()
        .map(|why| format!("on_failure `{command}` {why}"))
}

async fn run_shell(command: &str, workdir: &Path, timeout: Duration) -> Result<(), String> {
    // The author's command gets the environment the model's commands get: no credential.
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .env_clear()
        .envs(crate::sandbox::CommandEnv::default().select(std::env::vars_os()))
        .current_dir(workdir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("could not start: {e}"))?;
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(match status.code() {
            Some(code) => format!("exited with code {code}"),
            None => "was killed by a signal".to_owned(),
        }),
        Ok(Err(e)) => Err(format!("failed: {e}")),
        Err(_) => {
            if let Some(pid) = child.id() {
                let _ = std::process::Command::new("kill")
                    // `--` so the negative pid is read as a process group, not as `-1`.
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .status();
            }
            Err(format!("timed out after {}s", timeout.as_secs()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(checks: &[&str], on_failure: Option<&str>) -> RetryConfig {
        RetryConfig {
            max_retries: 2,
            checks: checks.iter().map(|c| (*c).to_owned()).collect(),
            on_failure: on_failure.map(str::to_owned),
            timeout_secs: Some(5),
            on_failure_timeout_secs: Some(5),
        }
    }

    #[tokio::test]
    async fn checks_pass_and_fail() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            run_checks(&config(&["true"], None), dir.path())
                .await
                .is_ok()
        );
        let err = run_checks(&config(&["true", "test -f missing"], None), dir.path())
            .await
            .unwrap_err();
        assert_eq!(err, "check `test -f missing` exited with code 1");
        assert!(
            run_on_failure(&config(&[], Some("touch cleaned")), dir.path())
                .await
                .is_none()
        );
        assert!(dir.path().join("cleaned").exists());
    }
}
