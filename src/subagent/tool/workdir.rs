//! The subagent's working directory, and the resolution of every path a tool is given.
//!
//! A path is resolved the way the kernel would resolve it: relative paths are joined to the
//! working directory, then the longest prefix that exists is canonicalized (following symlinks
//! and `..`) and must lie inside the working directory; the components after it (a file or
//! folders still to be created) must be plain names. So `../x`, absolute paths elsewhere,
//! `/proc/...`, and symlinks (to files or folders) that lead outside are all refused, while an
//! absolute path inside the working directory is fine.

use std::io;
use std::path::{Component, Path, PathBuf};

use super::{ToolError, shown};

/// The longest path a tool accepts, in bytes (Linux's `PATH_MAX`).
const MAX_PATH_BYTES: usize = 4096;

/// Kernel file systems that are never a tool's business, even below a working directory of `/`.
const SPECIAL_ROOTS: [&str; 3] = ["/proc", "/sys", "/dev"];

/// What a tool means to do with a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    Write,
}

/// The working directory of a subagent: a canonical absolute path to a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkDir {
    root: PathBuf,
}

impl WorkDir {
    /// The working directory at `path`, which must be an existing directory.
    pub(crate) fn new(path: impl AsRef<Path>) -> io::Result<Self> {
        let root = std::fs::canonicalize(path)?;
        if !root.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", root.display()),
            ));
        }
        Ok(Self { root })
    }

    /// The canonical absolute path.
    pub(crate) fn path(&self) -> &Path {
        &self.root
    }

    /// Resolves `user_path` (relative to the working directory, or absolute inside it) to an
    /// absolute path inside the working directory, or says why it cannot be used.
    pub(crate) fn resolve(&self, user_path: &str, access: Access) -> Result<PathBuf, ToolError> {
        let invalid = |reason: &str| ToolError::InvalidPath {
            path: shown(user_path),
            reason: reason.to_owned(),
        };
        let outside = || ToolError::Outside {
            path: shown(user_path),
        };
        if user_path.contains('\0') {
            return Err(invalid("it contains a NUL byte"));
        }
        if user_path.len() > MAX_PATH_BYTES {
            return Err(invalid(&format!(
                "it is longer than {MAX_PATH_BYTES} bytes"
            )));
        }
        let candidate = if user_path.is_empty() {
            self.root.clone()
        } else {
            self.root.join(user_path)
        };
        let (base, rest) = candidate
            .ancestors()
            .find_map(|prefix| {
                let base = std::fs::canonicalize(prefix).ok()?;
                let rest = candidate.strip_prefix(prefix).ok()?.to_path_buf();
                Some((base, rest))
            })
            .ok_or_else(outside)?;
        if !base.starts_with(&self.root) {
            return Err(outside());
        }
        let mut resolved = base;
        let mut depth = 0usize;
        let mut names = Vec::new();
        for component in rest.components() {
            match component {
                Component::CurDir => {}
                Component::Normal(name) => {
                    depth += 1;
                    names.push(name);
                }
                Component::ParentDir => {
                    return Err(if depth == 0 {
                        outside()
                    } else {
                        invalid("`..` follows a folder that does not exist")
                    });
                }
                Component::RootDir | Component::Prefix(_) => return Err(outside()),
            }
        }
        if let Some(first) = names.first() {
            // It does not canonicalize, yet it is there: a dangling or looping symlink (or
            // unreadable); following it could lead anywhere.
            if std::fs::symlink_metadata(resolved.join(first)).is_ok() {
                return Err(invalid(
                    "it goes through a symbolic link that cannot be resolved; refusing to follow it",
                ));
            }
        }
        resolved.extend(names);
        if SPECIAL_ROOTS
            .iter()
            .any(|special| resolved.starts_with(special) && !self.root.starts_with(special))
        {
            return Err(outside());
        }
        if access == Access::Write {
            if resolved == self.root {
                return Err(invalid("it is the working directory itself, not a file"));
            }
            if resolved.is_dir() {
                return Err(invalid("it is a directory, not a file"));
            }
        }
        Ok(resolved)
    }

    /// `abs` relative to the working directory (`.` for the directory itself); other paths as
    /// they are.
    pub(crate) fn display(&self, abs: &Path) -> String {
        match abs.strip_prefix(&self.root) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
            Ok(rel) => rel.display().to_string(),
            Err(_) => abs.display().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subagent::tool::test_support::Sandbox;

    #[test]
    fn inside_paths_resolve() {
        let sb = Sandbox::new();
        sb.write("src/a.txt", "a");
        std::os::unix::fs::symlink(sb.root().join("src"), sb.root().join("src_link")).unwrap();
        let root = sb.root().to_path_buf();
        let abs = root.join("src/a.txt").display().to_string();
        let cases = [
            ("src/a.txt", root.join("src/a.txt")),
            ("./src/a.txt", root.join("src/a.txt")),
            ("src/../src/a.txt", root.join("src/a.txt")),
            (abs.as_str(), root.join("src/a.txt")),
            ("src_link/a.txt", root.join("src/a.txt")),
            ("new/dir/file.txt", root.join("new/dir/file.txt")),
            ("src/./new.txt", root.join("src/new.txt")),
            ("", root.clone()),
            (".", root.clone()),
        ];
        for (input, expected) in cases {
            assert_eq!(
                sb.wd.resolve(input, Access::Read).unwrap(),
                expected,
                "{input:?}"
            );
        }
        assert_eq!(sb.wd.display(&root.join("src/a.txt")), "src/a.txt");
        assert_eq!(sb.wd.display(&root), ".");
        assert_eq!(sb.wd.display(Path::new("/etc")), "/etc");
    }

    #[test]
    fn escapes_are_refused() {
        let sb = Sandbox::new();
        for input in sb.escapes() {
            for access in [Access::Read, Access::Write] {
                let err = sb.wd.resolve(&input, access).unwrap_err();
                let text = err.to_string();
                assert!(
                    matches!(
                        err,
                        ToolError::Outside { .. } | ToolError::InvalidPath { .. }
                    ),
                    "{input:?}: {text}"
                );
                assert!(text.len() < 600, "{text}");
            }
        }
        let text = sb.wd.resolve("../x", Access::Read).unwrap_err().to_string();
        assert!(
            text.starts_with("path `../x` is outside the working directory"),
            "{text}"
        );
        let text = sb.wd.resolve("a\0b", Access::Read).unwrap_err().to_string();
        assert_eq!(text, "invalid path `a\\0b`: it contains a NUL byte");
        let long = "a/".repeat(2500);
        let text = sb.wd.resolve(&long, Access::Read).unwrap_err().to_string();
        assert!(text.contains("longer than 4096 bytes"), "{text}");
    }

    #[test]
    fn tricky_escapes() {
        let sb = Sandbox::new();
        let refused = |input: &str| sb.wd.resolve(input, Access::Write).is_err();
        // `..` after a folder that does not exist, deep enough to leave.
        assert!(refused("nothere/../../outside/x"));
        assert!(refused("nothere/../x"));
        // A dangling symlink pointing outside: writing through it would create the target.
        std::os::unix::fs::symlink(sb.outside.join("made.txt"), sb.root().join("dangling"))
            .unwrap();
        assert!(refused("dangling"));
        assert!(sb.wd.resolve("dangling", Access::Read).is_err());
        // A symlink loop.
        std::os::unix::fs::symlink(sb.root().join("loop"), sb.root().join("loop")).unwrap();
        assert!(refused("loop/x"));
        // Writing the working directory or a folder.
        std::fs::create_dir(sb.root().join("d")).unwrap();
        assert!(refused("."));
        assert!(refused("d"));
        assert!(sb.wd.resolve("d", Access::Read).is_ok());
    }

    #[test]
    fn root_workdir_still_refuses_proc() {
        let wd = WorkDir::new("/").unwrap();
        assert!(wd.resolve("/proc/self/environ", Access::Read).is_err());
        assert!(wd.resolve("proc/self/environ", Access::Read).is_err());
        assert!(wd.resolve("/etc/hostname", Access::Read).is_ok());
    }

    #[test]
    fn new_requires_a_directory() {
        let sb = Sandbox::new();
        sb.write("f", "x");
        assert!(WorkDir::new(sb.root().join("f")).is_err());
        assert!(WorkDir::new(sb.root().join("missing")).is_err());
    }
}
