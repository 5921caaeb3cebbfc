//! `Test::new().write("recipes/a.yaml", "...").args(["load", "a"]).stdout_has("...").run()`
//!
//! Each test gets a fresh temp directory as its working directory and as `HOME`, and a
//! clean environment: only the variables the test sets are visible to summon (and
//! `SUMMON_LOCAL_MODEL_URL`, pointing nowhere, unless the test sets it).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::unindent;

#[must_use]
pub(crate) struct Test {
    dir: tempfile::TempDir,
    cwd: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    expected_code: i32,
    expected: Vec<Expect>,
}

/// What a run's output must show, checked by [`Test::run`] besides the exit code.
enum Expect {
    Stdout(String),
    StdoutHas(String),
    Stderr(String),
    StderrHas(String),
}

/// What a run printed.
#[derive(Debug)]
pub(crate) struct Output {
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
    pub dir: PathBuf,
    _keep: Option<tempfile::TempDir>,
}

impl Output {
    pub(crate) fn json(&self) -> serde_json::Value {
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
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let cwd = dir.path().to_path_buf();
        Self {
            dir,
            cwd,
            args: Vec::new(),
            env: Vec::new(),
            expected_code: 0,
            expected: Vec::new(),
        }
    }

    /// The temp project directory.
    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file (text unindented), creating folders.
    #[track_caller]
    pub(crate) fn write(self, path: &str, content: &str) -> Self {
        self.write_raw(path, &unindent(content))
    }

    /// Writes a file exactly as given.
    #[track_caller]
    pub(crate) fn write_raw(self, path: &str, content: &str) -> Self {
        let full = self.dir.path().join(path);
        std::fs::create_dir_all(full.parent().expect("parent")).expect("mkdir");
        std::fs::write(&full, content).expect("write");
        self
    }

    pub(crate) fn mkdir(self, path: &str) -> Self {
        std::fs::create_dir_all(self.dir.path().join(path)).expect("mkdir");
        self
    }

    /// Runs in a subdirectory of the project.
    pub(crate) fn current_dir(mut self, sub: &str) -> Self {
        self.cwd = self.dir.path().join(sub);
        std::fs::create_dir_all(&self.cwd).expect("mkdir");
        self
    }

    pub(crate) fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub(crate) fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets `key` to the absolute path of `rel` inside the project; `:`-separated lists work
    /// (`.env_path("SUMMON_RECIPE_PATH", "p1:p2")`).
    pub(crate) fn env_path(self, key: &str, rel: &str) -> Self {
        let value = rel
            .split(':')
            .map(|part| self.dir.path().join(part).to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(":");
        self.env(key, &value)
    }

    /// The exit code expected (default 0).
    pub(crate) fn code(mut self, code: i32) -> Self {
        self.expected_code = code;
        self
    }

    /// stdout must be exactly `text`.
    pub(crate) fn stdout(mut self, text: &str) -> Self {
        self.expected.push(Expect::Stdout(text.into()));
        self
    }

    /// stdout must contain `text`.
    pub(crate) fn stdout_has(mut self, text: &str) -> Self {
        self.expected.push(Expect::StdoutHas(text.into()));
        self
    }

    /// stderr must be exactly `text`.
    pub(crate) fn stderr(mut self, text: &str) -> Self {
        self.expected.push(Expect::Stderr(text.into()));
        self
    }

    /// stderr must contain `text`.
    pub(crate) fn stderr_has(mut self, text: &str) -> Self {
        self.expected.push(Expect::StderrHas(text.into()));
        self
    }

    /// Runs the binary and checks the exit code, the expected output, and that nothing
    /// panicked; returns the output for more checks.
    #[track_caller]
    pub(crate) fn run(self) -> Output {
        let mut output = self.output();
        let context = format!(
            "{:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.args, output.stdout, output.stderr
        );
        assert_eq!(
            output.code, self.expected_code,
            "unexpected exit code for {context}"
        );
        assert!(
            !output.stderr.contains("panicked at"),
            "summon panicked: {context}"
        );
        for expect in &self.expected {
            match expect {
                Expect::Stdout(text) => assert_eq!(&output.stdout, text, "stdout of {context}"),
                Expect::StdoutHas(text) => {
                    assert!(
                        output.stdout.contains(text),
                        "stdout lacks {text:?}: {context}"
                    )
                }
                Expect::Stderr(text) => assert_eq!(&output.stderr, text, "stderr of {context}"),
                Expect::StderrHas(text) => {
                    assert!(
                        output.stderr.contains(text),
                        "stderr lacks {text:?}: {context}"
                    )
                }
            }
        }
        output._keep = Some(self.dir);
        output
    }

    /// The configured command (arguments, working directory, clean environment), not yet
    /// started: for tests that drive the process themselves (pipes, signals).
    pub(crate) fn command(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_summon"));
        command
            .args(&self.args)
            .current_dir(&self.cwd)
            .env_clear()
            .env("HOME", self.dir.path())
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            // With nothing configured, a summon built with the local model fetches it: never
            // from outside in a test (a test that wants the download serves it itself).
            .env(
                "SUMMON_LOCAL_MODEL_URL",
                "http://127.0.0.1:9/no-downloads-in-tests",
            );
        for (k, v) in &self.env {
            command.env(k, v);
        }
        command
    }

    /// Runs the binary and returns what happened, whatever the exit code.
    pub(crate) fn output(&self) -> Output {
        let output = self.command().output().expect("run summon");
        Output {
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            code: output.status.code().unwrap_or(-1),
            dir: self.dir.path().to_path_buf(),
            _keep: None,
        }
    }
}
