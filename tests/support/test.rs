//! `Test::new().write("recipes/a.yaml", "...").args(["load", "a"]).stdout_has("...").run()`
//!
//! Each test gets a fresh temp directory as its working directory and as `HOME`, and a
//! clean environment: only the variables the test sets are visible to summon.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::unindent;

#[must_use]
pub struct Test {
    dir: tempfile::TempDir,
    cwd: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    stdin: Option<String>,
    expected_code: i32,
}

/// What a run printed.
#[derive(Debug)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
    pub dir: PathBuf,
    _keep: Option<tempfile::TempDir>,
}

impl Output {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

impl Default for Test {
    fn default() -> Self {
        Self::new()
    }
}

impl Test {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let cwd = dir.path().to_path_buf();
        Self {
            dir,
            cwd,
            args: Vec::new(),
            env: Vec::new(),
            stdin: None,
            expected_code: 0,
        }
    }

    /// The temp project directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file (text unindented), creating folders.
    #[track_caller]
    pub fn write(self, path: &str, content: &str) -> Self {
        self.write_raw(path, &unindent(content))
    }

    /// Writes a file exactly as given.
    #[track_caller]
    pub fn write_raw(self, path: &str, content: &str) -> Self {
        let full = self.dir.path().join(path);
        std::fs::create_dir_all(full.parent().expect("parent")).expect("mkdir");
        std::fs::write(&full, content).expect("write");
        self
    }

    pub fn mkdir(self, path: &str) -> Self {
        std::fs::create_dir_all(self.dir.path().join(path)).expect("mkdir");
        self
    }

    /// Runs in a subdirectory of the project.
    pub fn current_dir(mut self, sub: &str) -> Self {
        self.cwd = self.dir.path().join(sub);
        std::fs::create_dir_all(&self.cwd).expect("mkdir");
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets `key` to the absolute path of `rel` inside the project; `:`-separated lists work
    /// (`.env_path("SUMMON_RECIPE_PATH", "p1:p2")`).
    pub fn env_path(self, key: &str, rel: &str) -> Self {
        let value = rel
            .split(':')
            .map(|part| self.dir.path().join(part).to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(":");
        self.env(key, &value)
    }

    pub fn stdin(mut self, text: &str) -> Self {
        self.stdin = Some(text.into());
        self
    }

    /// The exit code expected (default 0).
    pub fn code(mut self, code: i32) -> Self {
        self.expected_code = code;
        self
    }

    /// Runs the binary and checks the exit code; returns the output for more checks.
    #[track_caller]
    pub fn run(self) -> Output {
        let mut output = self.output();
        assert_eq!(
            output.code, self.expected_code,
            "unexpected exit code for {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.args, output.stdout, output.stderr
        );
        output._keep = Some(self.dir);
        output
    }

    /// The configured command (arguments, working directory, clean environment), not yet
    /// started: for tests that drive the process themselves (pipes, signals).
    pub fn command(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_summon"));
        command
            .args(&self.args)
            .current_dir(&self.cwd)
            .env_clear()
            .env("HOME", self.dir.path())
            .env("PATH", std::env::var("PATH").unwrap_or_default());
        for (k, v) in &self.env {
            command.env(k, v);
        }
        command
    }

    /// Runs the binary and returns what happened, whatever the exit code.
    pub fn output(&self) -> Output {
        let mut command = self.command();
        let output = match &self.stdin {
            Some(input) => {
                use std::io::Write;
                command
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped());
                let mut child = command.spawn().expect("spawn summon");
                child
                    .stdin
                    .take()
                    .expect("stdin")
                    .write_all(input.as_bytes())
                    .expect("write stdin");
                child.wait_with_output().expect("wait")
            }
            None => command.output().expect("run summon"),
        };
        Output {
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            code: output.status.code().unwrap_or(-1),
            dir: self.dir.path().to_path_buf(),
            _keep: None,
        }
    }
}
