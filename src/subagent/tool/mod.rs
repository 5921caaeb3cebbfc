//! The built-in tools of a subagent, confined to its working directory.
//!
//! [`ToolSet`] is what a subagent is offered (narrowed by an agent's `tools` list) and runs the
//! model's calls; [`WorkDir`] resolves every path a tool touches and refuses escapes. Each tool
//! lives in its own module (`fs` for the file tools, `search` for `list_files` and `search`,
//! `shell`) and takes its arguments as the model sent them; malformed arguments become a tool
//! error explaining what was expected, never a panic.

mod args;
mod fs;
mod load;
mod search;
mod set;
mod shell;
mod subset;
mod workdir;

pub(crate) use load::Loader;
pub(crate) use set::ToolSet;
pub(crate) use shell::Scratch;
pub(crate) use subset::Subset;
pub(crate) use workdir::WorkDir;

pub(crate) use crate::provider::ToolOutput;
pub(crate) use crate::text::truncate_at_boundary;

impl From<Result<String, ToolError>> for ToolOutput {
    fn from(result: Result<String, ToolError>) -> Self {
        match result {
            Ok(content) => Self::ok(content),
            Err(e) => Self::error(e.to_string()),
        }
    }
}

/// Why a tool call failed; the text is what the model reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ToolError {
    /// The path resolves outside the working directory.
    #[error(
        "path {path} is outside the working directory; use a path relative to the working \
         directory (or an absolute path inside it)"
    )]
    Outside { path: String },
    /// The path cannot be used at all (NUL byte, too long, dangling link, ...).
    #[error("invalid path {path}: {reason}")]
    InvalidPath { path: String, reason: String },
    /// The arguments do not have the tool's shape.
    #[error("invalid arguments for `{tool}`: {reason}. Expected arguments: {expected}")]
    Arguments {
        tool: &'static str,
        reason: String,
        expected: &'static str,
    },
    /// Anything else, already phrased for the model.
    #[error("{0}")]
    Failed(String),
}

/// `text` shown in an error: quoted, NUL bytes escaped, at most 200 characters.
pub(crate) fn shown(text: &str) -> String {
    const MAX: usize = 200;
    let mut out: String = text.chars().take(MAX).collect();
    if text.chars().nth(MAX).is_some() {
        out.push_str(&format!("... ({} bytes)", text.len()));
    }
    format!("`{}`", out.replace('\0', "\\0"))
}

/// Runs blocking file-system work off the async threads; a panic becomes a tool error.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ToolError> + Send + 'static,
) -> Result<T, ToolError> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(ToolError::Failed(format!(
            "the tool failed unexpectedly: {e}"
        )))
    })
}

#[cfg(test)]
pub(crate) mod test_support {
    //! A temporary working directory with an outside sibling, for the tools' tests.

    use std::path::{Path, PathBuf};

    use super::WorkDir;

    pub(crate) struct Sandbox {
        /// Holds `work/` (the working directory) and `outside/` (a sibling with a secret).
        pub(crate) _dir: tempfile::TempDir,
        pub(crate) wd: WorkDir,
        pub(crate) outside: PathBuf,
    }

    impl Sandbox {
        pub(crate) fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let work = dir.path().join("work");
            let outside = dir.path().join("outside");
            std::fs::create_dir(&work).unwrap();
            std::fs::create_dir(&outside).unwrap();
            std::fs::write(outside.join("secret.txt"), "top secret\n").unwrap();
            std::os::unix::fs::symlink(outside.join("secret.txt"), work.join("link_out")).unwrap();
            std::os::unix::fs::symlink(&outside, work.join("dir_out")).unwrap();
            let wd = WorkDir::new(&work).unwrap();
            Self {
                _dir: dir,
                wd,
                outside,
            }
        }

        pub(crate) fn root(&self) -> &Path {
            self.wd.path()
        }

        pub(crate) fn write(&self, rel: &str, text: &str) {
            let path = self.root().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }

        pub(crate) fn read(&self, rel: &str) -> String {
            std::fs::read_to_string(self.root().join(rel)).unwrap()
        }

        /// Paths that must be refused by every tool; `abs_inside` is not among them.
        pub(crate) fn escapes(&self) -> Vec<String> {
            vec![
                "../outside/secret.txt".into(),
                "../x".into(),
                "sub/../../outside/secret.txt".into(),
                "/etc/passwd".into(),
                self.outside.join("secret.txt").display().to_string(),
                "link_out".into(),
                "dir_out/secret.txt".into(),
                "dir_out/new.txt".into(),
                "/proc/self/environ".into(),
                "a/".repeat(2500),
                "a\0b".into(),
            ]
        }

        /// The content of the outside secret is unchanged.
        pub(crate) fn assert_outside_untouched(&self) {
            assert_eq!(
                std::fs::read_to_string(self.outside.join("secret.txt")).unwrap(),
                "top secret\n"
            );
            let names: Vec<_> = std::fs::read_dir(&self.outside)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, ["secret.txt"]);
        }
    }
}
