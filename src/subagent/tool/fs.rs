//! The file tools: `read_file`, `write_file` and `edit_file`.
//!
//! Every path goes through [`WorkDir::resolve`], and the file it names is then opened beneath the
//! working directory in one step, following no symbolic link ([`crate::safe_fs::open_beneath`]):
//! a folder swapped for a link between the check and the open makes the call fail, never leads
//! outside. Reading streams the file line by line and stops at [`READ_CAP`] bytes, saying how to
//! read further; writing goes to a new temporary file in the same folder that is then renamed
//! over the target, so a reader never sees half a file.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read as _};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{Mode, OFlags};

use serde_json::{Value, json};

use super::args::Args;
use super::workdir::{Access, WorkDir};
use super::{ToolError, blocking, shown, truncate_at_boundary};
use crate::provider::ToolSpec;
use crate::sandbox::Policy;
use crate::sandbox::helper::PROTECTED_NAMES;

/// The most text `read_file` returns at once.
pub(crate) const READ_CAP: usize = 256 * 1024;

/// How much of the start of a file is checked for NUL bytes to tell binary files.
const BINARY_SNIFF: usize = 8 * 1024;

const READ_EXPECTED: &str = r#"{"path": string, "offset"?: integer (1-based first line), "limit"?: integer (number of lines)}"#;
const WRITE_EXPECTED: &str = r#"{"path": string, "content": string}"#;
const EDIT_EXPECTED: &str =
    r#"{"path": string, "old_string": string, "new_string": string, "replace_all"?: boolean}"#;

pub(crate) fn read_file_spec() -> ToolSpec {
    ToolSpec {
        name: "read_file".into(),
        description: format!(
            "Read a UTF-8 text file in the working directory and return its text exactly as \
             stored. `path` is relative to the working directory. For large files pass `offset` \
             (the 1-based line to start at) and `limit` (how many lines). At most {} KiB are \
             returned per call; a note at the end says when the text was cut and which offset \
             continues it. Binary files are refused.",
            READ_CAP / 1024
        ),
        parameters: json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the working directory."},
                "offset": {"type": "integer", "minimum": 1, "description": "1-based line number to start reading at (default 1)."},
                "limit": {"type": "integer", "minimum": 1, "description": "Maximum number of lines to return (default: up to the size cap)."}
            },
            "required": ["path"],
            "additionalProperties": false
        }),
    }
}

pub(crate) fn write_file_spec() -> ToolSpec {
    ToolSpec {
        name: "write_file".into(),
        description: "Create or overwrite a file in the working directory with `content`. \
                      Missing parent folders are created. The whole file is replaced; to change \
                      part of an existing file use edit_file."
            .into(),
        parameters: json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the working directory."},
                "content": {"type": "string", "description": "The complete new text of the file."}
            },
            "required": ["path", "content"],
            "additionalProperties": false
        }),
    }
}

pub(crate) fn edit_file_spec() -> ToolSpec {
    ToolSpec {
        name: "edit_file".into(),
        description: "Replace an exact string in a file in the working directory. `old_string` \
                      must match the file exactly, including whitespace and indentation, and must \
                      occur exactly once unless `replace_all` is true (then every occurrence is \
                      replaced). Read the file first; include enough surrounding lines to make \
                      `old_string` unique."
            .into(),
        parameters: json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the working directory."},
                "old_string": {"type": "string", "description": "The exact text to replace."},
                "new_string": {"type": "string", "description": "The text to put in its place."},
                "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)."}
            },
            "required": ["path", "old_string", "new_string"],
            "additionalProperties": false
        }),
    }
}

/// `read_file {path, offset?, limit?}`.
pub(crate) async fn read_file(args: &Value, wd: &WorkDir) -> Result<String, ToolError> {
    let args = Args::parse("read_file", READ_EXPECTED, args)?;
    let user_path = args.str("path")?;
    let offset = args.opt_u64("offset")?.unwrap_or(1).max(1);
    let limit = args.opt_u64("limit")?;
    if limit == Some(0) {
        return Err(ToolError::Failed("`limit` must be at least 1".into()));
    }
    let path = wd.resolve(user_path, Access::Read)?;
    let shown = wd.display(&path);
    let root = wd.path().to_path_buf();
    blocking(move || read_lines(&root, &path, &shown, offset, limit)).await
}

/// Opens the regular file `path` (inside `root`) for reading, beneath `root` in one step.
fn open_regular(root: &Path, path: &Path, shown: &str, action: &str) -> Result<File, ToolError> {
    let rel = path.strip_prefix(root).unwrap_or(path);
    let fd = crate::safe_fs::open_dir(root)
        .and_then(|dir| {
            // Non-blocking, so that a FIFO swapped in is refused below instead of waited on.
            crate::safe_fs::open_beneath(dir, rel, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())
        })
        .map_err(|e| io_error(action, shown, &e))?;
    check_regular(&fd, shown, action)?;
    Ok(File::from(fd))
}

/// Reads lines `offset..offset+limit` (1-based) of `path`, at most [`READ_CAP`] bytes.
fn read_lines(
    root: &Path,
    path: &Path,
    shown: &str,
    offset: u64,
    limit: Option<u64>,
) -> Result<String, ToolError> {
    let file = open_regular(root, path, shown, "read")?;
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let head = reader.fill_buf().map_err(|e| io_error("read", shown, &e))?;
    if head[..head.len().min(BINARY_SNIFF)].contains(&0) {
        return Err(ToolError::Failed(format!(
            "{shown} looks like a binary file (it contains NUL bytes); read_file only reads text"
        )));
    }
    let last_wanted = limit.map_or(u64::MAX, |l| offset.saturating_add(l - 1));
    let mut out = String::new();
    let mut line = Vec::new();
    let mut number = 0u64;
    let mut shown_last = 0u64;
    let mut more = false;
    let mut cut_line = false;
    loop {
        let keep = if number + 1 >= offset {
            READ_CAP + 4
        } else {
            0
        };
        let consumed =
            next_line(&mut reader, &mut line, keep).map_err(|e| io_error("read", shown, &e))?;
        if consumed == 0 {
            break;
        }
        number += 1;
        if number < offset {
            continue;
        }
        if number > last_wanted {
            more = true;
            break;
        }
        let partial = line.len() < consumed;
        let text = match std::str::from_utf8(&line) {
            Ok(text) => text,
            // A line cut inside a character: keep the whole characters.
            Err(e) if partial && e.error_len().is_none() => {
                std::str::from_utf8(&line[..e.valid_up_to()]).unwrap_or_default()
            }
            Err(_) => {
                return Err(ToolError::Failed(format!(
                    "{shown} is not valid UTF-8 text (line {number}); read_file only reads text"
                )));
            }
        };
        if out.len() + text.len() > READ_CAP {
            if out.is_empty() {
                let mut piece = text.to_owned();
                truncate_at_boundary(&mut piece, READ_CAP);
                out = piece;
                shown_last = number;
                cut_line = true;
                more = !reader
                    .fill_buf()
                    .map_err(|e| io_error("read", shown, &e))?
                    .is_empty();
            } else {
                more = true;
            }
            break;
        }
        out.push_str(text);
        shown_last = number;
    }
    if shown_last == 0 {
        return Ok(if number == 0 {
            format!("({shown} is empty)")
        } else {
            format!(
                "({shown} has {number} lines; offset {offset} is past the end, nothing to show)"
            )
        });
    }
    if more || cut_line {
        if !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&format!(
            "\n[Truncated: showed lines {offset}-{shown_last} of {shown}."
        ));
        if cut_line {
            out.push_str(&format!(
                " Line {shown_last} is longer than {} KiB; only its start is shown.",
                READ_CAP / 1024
            ));
        }
        if more {
            out.push_str(&format!(
                " More lines follow: call read_file with offset {} to continue.",
                shown_last + 1
            ));
        }
        out.push(']');
    }
    Ok(out)
}

/// Reads the next line (with its `\n`) into `buf`, keeping at most `keep` bytes of it; returns
/// how many bytes the line had (0 at the end of the file).
fn next_line(reader: &mut impl BufRead, buf: &mut Vec<u8>, keep: usize) -> io::Result<usize> {
    buf.clear();
    let mut consumed = 0;
    loop {
        let chunk = reader.fill_buf()?;
        if chunk.is_empty() {
            return Ok(consumed);
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let room = keep.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..take.min(room)]);
        reader.consume(take);
        consumed += take;
        if done {
            return Ok(consumed);
        }
    }
}

/// Refuses every write under the `read-only` sandbox policy.
fn refuse_read_only(tool: &str, policy: Policy) -> Result<(), ToolError> {
    if policy == Policy::ReadOnly {
        return Err(ToolError::Failed(format!(
            "{tool} refused: this task runs under the `read-only` sandbox policy, which lets \
             the model write nowhere; nothing was written"
        )));
    }
    Ok(())
}

/// Refuses, under every policy but `off`, a write to `path` (as resolved, the path the tool
/// then opens without following a link) inside a `.git` or `.summon` folder: hooks and git's
/// config run later outside the sandbox, and later commands trust the store.
fn refuse_protected(
    tool: &str,
    policy: Policy,
    user_path: &str,
    path: &std::path::Path,
    wd: &WorkDir,
) -> Result<(), ToolError> {
    if policy == Policy::Off {
        return Ok(());
    }
    let inside = path.strip_prefix(wd.path()).unwrap_or(path);
    let protected = inside.components().find_map(|part| {
        let name = part.as_os_str().to_str()?;
        PROTECTED_NAMES.contains(&name).then_some(name)
    });
    match protected {
        Some(name) => Err(ToolError::Failed(format!(
            "{tool} refused: {} is inside {name}, which the model may not change under the \
             `{policy}` sandbox policy (only `off` allows it); nothing was written",
            shown(user_path)
        ))),
        None => Ok(()),
    }
}

/// `write_file {path, content}`.
pub(crate) async fn write_file(
    args: &Value,
    wd: &WorkDir,
    policy: Policy,
) -> Result<String, ToolError> {
    let args = Args::parse("write_file", WRITE_EXPECTED, args)?;
    refuse_read_only("write_file", policy)?;
    let user_path = args.str("path")?;
    let content = args.str("content")?.to_owned();
    let path = wd.resolve(user_path, Access::Write)?;
    refuse_protected("write_file", policy, user_path, &path, wd)?;
    let shown = wd.display(&path);
    let root = wd.path().to_path_buf();
    blocking(move || {
        let (dir, name) =
            parent_beneath(&root, &path).map_err(|e| io_error("create folders for", &shown, &e))?;
        crate::safe_fs::write_in(&dir, &name, content.as_bytes(), false)
            .map_err(|e| io_error("write", &shown, &e))?;
        Ok(format!("wrote {} bytes to {shown}", content.len()))
    })
    .await
}

/// `edit_file {path, old_string, new_string, replace_all?}`.
pub(crate) async fn edit_file(
    args: &Value,
    wd: &WorkDir,
    policy: Policy,
) -> Result<String, ToolError> {
    let args = Args::parse("edit_file", EDIT_EXPECTED, args)?;
    refuse_read_only("edit_file", policy)?;
    let user_path = args.str("path")?;
    let old = args.str("old_string")?.to_owned();
    let new = args.str("new_string")?.to_owned();
    let replace_all = args.opt_bool("replace_all")?.unwrap_or(false);
    if old.is_empty() {
        return Err(ToolError::Failed(
            "`old_string` must not be empty; to create a file or replace all of it use write_file"
                .into(),
        ));
    }
    if old == new {
        return Err(ToolError::Failed(
            "`old_string` and `new_string` are identical; nothing to change".into(),
        ));
    }
    let path = wd.resolve(user_path, Access::Write)?;
    refuse_protected("edit_file", policy, user_path, &path, wd)?;
    let shown = wd.display(&path);
    let root = wd.path().to_path_buf();
    blocking(move || {
        let mut bytes = Vec::new();
        open_regular(&root, &path, &shown, "edit")?
            .read_to_end(&mut bytes)
            .map_err(|e| io_error("read", &shown, &e))?;
        let text = String::from_utf8(bytes).map_err(|_| {
            ToolError::Failed(format!(
                "{shown} is not valid UTF-8 text; edit_file only edits text"
            ))
        })?;
        let count = text.matches(old.as_str()).count();
        if count == 0 {
            return Err(ToolError::Failed(format!(
                "`old_string` was not found in {shown}; it must match the file exactly, including \
                 whitespace and indentation (read the file to copy the exact text)"
            )));
        }
        if count > 1 && !replace_all {
            return Err(ToolError::Failed(format!(
                "`old_string` occurs {count} times in {shown}; include more surrounding text to \
                 make it unique, or set `replace_all` to true to replace every occurrence"
            )));
        }
        let edited = if replace_all {
            text.replace(old.as_str(), &new)
        } else {
            text.replacen(old.as_str(), &new, 1)
        };
        let (dir, name) =
            parent_beneath(&root, &path).map_err(|e| io_error("write", &shown, &e))?;
        crate::safe_fs::write_in(&dir, &name, edited.as_bytes(), false)
            .map_err(|e| io_error("write", &shown, &e))?;
        let noun = if count == 1 {
            "occurrence"
        } else {
            "occurrences"
        };
        Ok(format!("replaced {count} {noun} in {shown}"))
    })
    .await
}

/// The folder of `path` (inside `root`), opened beneath `root` (its missing folders created),
/// and the file's name in it.
fn parent_beneath(root: &Path, path: &Path) -> io::Result<(OwnedFd, std::ffi::OsString)> {
    let rel = path.strip_prefix(root).unwrap_or(path);
    let name = rel
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let folder = rel.parent().unwrap_or(Path::new(""));
    let dir = crate::safe_fs::open_dir(root)
        .and_then(|dir| crate::safe_fs::create_dirs_beneath(dir, folder))?;
    Ok((dir, name.to_owned()))
}

/// Refuses anything but a regular file (a folder, or a FIFO or device that could block).
fn check_regular(fd: &OwnedFd, shown: &str, action: &str) -> Result<(), ToolError> {
    let stat = rustix::fs::fstat(fd).map_err(|e| io_error(action, shown, &e.into()))?;
    let kind = rustix::fs::FileType::from_raw_mode(stat.st_mode);
    if kind == rustix::fs::FileType::Directory {
        return Err(ToolError::Failed(format!(
            "{shown} is a directory, not a file; use list_files to see what it contains"
        )));
    }
    if kind != rustix::fs::FileType::RegularFile {
        return Err(ToolError::Failed(format!(
            "cannot {action} {shown}: it is not a regular file"
        )));
    }
    Ok(())
}

/// An I/O failure on `shown`, phrased for the model.
fn io_error(action: &str, shown: &str, e: &io::Error) -> ToolError {
    ToolError::Failed(match e.kind() {
        io::ErrorKind::NotFound => format!("cannot {action} {shown}: no such file"),
        io::ErrorKind::NotADirectory => {
            format!("cannot {action} {shown}: a part of the path is a file, not a folder")
        }
        io::ErrorKind::IsADirectory => format!("cannot {action} {shown}: it is a directory"),
        io::ErrorKind::PermissionDenied => format!("cannot {action} {shown}: permission denied"),
        _ if crate::safe_fs::is_link_error(e) => format!(
            "cannot {action} {shown}: a part of the path became a symbolic link while it was \
             used; refusing to follow it"
        ),
        _ => format!("cannot {action} {shown}: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::subagent::tool::test_support::Sandbox;

    async fn read(sb: &Sandbox, args: Value) -> Result<String, ToolError> {
        read_file(&args, &sb.wd).await
    }

    #[tokio::test]
    async fn read_whole_file_and_ranges() {
        let sb = Sandbox::new();
        sb.write("a.txt", "one\ntwo\nthree\nfour\n");
        assert_eq!(
            read(&sb, json!({"path": "a.txt"})).await.unwrap(),
            "one\ntwo\nthree\nfour\n"
        );
        let abs = sb.root().join("a.txt").display().to_string();
        assert_eq!(
            read(&sb, json!({"path": abs})).await.unwrap(),
            "one\ntwo\nthree\nfour\n"
        );
        let part = read(&sb, json!({"path": "a.txt", "offset": 2, "limit": 2}))
            .await
            .unwrap();
        assert_eq!(
            part,
            "two\nthree\n\n[Truncated: showed lines 2-3 of a.txt. More lines follow: call \
             read_file with offset 4 to continue.]"
        );
        assert_eq!(
            read(&sb, json!({"path": "a.txt", "offset": 4, "limit": 5}))
                .await
                .unwrap(),
            "four\n"
        );
        let past = read(&sb, json!({"path": "a.txt", "offset": 9}))
            .await
            .unwrap();
        assert!(
            past.contains("has 4 lines; offset 9 is past the end"),
            "{past}"
        );
        sb.write("empty", "");
        assert_eq!(
            read(&sb, json!({"path": "empty"})).await.unwrap(),
            "(empty is empty)"
        );
        sb.write("no_newline", "x\ny");
        assert_eq!(
            read(&sb, json!({"path": "no_newline"})).await.unwrap(),
            "x\ny"
        );
    }

    #[tokio::test]
    async fn read_caps_and_refusals() {
        let sb = Sandbox::new();
        let line = format!("{}\n", "é".repeat(50));
        let big = line.repeat(5000);
        sb.write("big.txt", &big);
        let out = read(&sb, json!({"path": "big.txt"})).await.unwrap();
        let (text, note) = out.split_once("\n\n[Truncated").unwrap();
        assert!(text.len() <= READ_CAP);
        let lines = text.lines().count();
        assert!(
            note.contains(&format!("offset {} to continue", lines + 1)),
            "{note}"
        );
        let next = read(&sb, json!({"path": "big.txt", "offset": lines + 1}))
            .await
            .unwrap();
        assert_eq!(format!("{text}\n{next}"), big);

        let huge_line = "é".repeat(READ_CAP);
        sb.write("one_line.txt", &huge_line);
        let out = read(&sb, json!({"path": "one_line.txt"})).await.unwrap();
        assert!(
            out.contains("Line 1 is longer than 256 KiB"),
            "{}",
            &out[out.len() - 200..]
        );
        assert!(out.starts_with("éé"));

        std::fs::write(sb.root().join("bin"), b"\x7fELF\0\0\x01").unwrap();
        let err = read(&sb, json!({"path": "bin"})).await.unwrap_err();
        assert!(err.to_string().contains("binary"), "{err}");
        std::fs::write(sb.root().join("latin1"), b"caf\xe9\n").unwrap();
        let err = read(&sb, json!({"path": "latin1"})).await.unwrap_err();
        assert!(err.to_string().contains("not valid UTF-8"), "{err}");
        let err = read(&sb, json!({"path": "missing"})).await.unwrap_err();
        assert_eq!(err.to_string(), "cannot read missing: no such file");
        let err = read(&sb, json!({"path": "."})).await.unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");
        let fifo = sb.root().join("fifo");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let err = read(&sb, json!({"path": "fifo"})).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot read fifo: it is not a regular file"
        );
        let err = edit_file(
            &json!({"path": "fifo", "old_string": "a", "new_string": "b"}),
            &sb.wd,
            Policy::WorkspaceWrite,
        )
        .await
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot edit fifo: it is not a regular file"
        );
        let err = read(&sb, json!({"file": "a"})).await.unwrap_err();
        assert!(
            err.to_string().contains("missing required field `path`"),
            "{err}"
        );
        let err = read(&sb, json!("{not json")).await.unwrap_err();
        assert!(err.to_string().contains("not valid JSON"), "{err}");
    }

    #[tokio::test]
    async fn git_and_the_store_are_refused_even_through_a_link() {
        let sb = Sandbox::new();
        std::fs::create_dir_all(sb.root().join(".git/hooks")).unwrap();
        std::fs::create_dir_all(sb.root().join("sub/.summon")).unwrap();
        std::os::unix::fs::symlink(".git", sb.root().join("g")).unwrap();
        for path in [
            ".git/hooks/pre-commit",
            "g/config",
            "sub/.summon/x",
            "./.git/x",
        ] {
            let err = write_file(
                &json!({"path": path, "content": "x"}),
                &sb.wd,
                Policy::WorkspaceWrite,
            )
            .await
            .unwrap_err()
            .to_string();
            assert!(
                err.contains("write_file refused: ")
                    && err.contains("which the model may not change under the `workspace-write`"),
                "{path}: {err}"
            );
        }
        assert_eq!(
            std::fs::read_dir(sb.root().join(".git/hooks"))
                .unwrap()
                .count(),
            0
        );
        let err = edit_file(
            &json!({"path": "a.txt", "old_string": "a", "new_string": "b"}),
            &sb.wd,
            Policy::ReadOnly,
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("edit_file refused: this task runs under the `read-only`"),
            "{err}"
        );
        write_file(
            &json!({"path": ".git/hooks/pre-commit", "content": "x"}),
            &sb.wd,
            Policy::Off,
        )
        .await
        .unwrap();
        assert_eq!(sb.read(".git/hooks/pre-commit"), "x");
    }

    #[tokio::test]
    async fn write_creates_folders_atomically() {
        let sb = Sandbox::new();
        let out = write_file(
            &json!({"path": "new/deep/f.txt", "content": "héllo"}),
            &sb.wd,
            Policy::WorkspaceWrite,
        )
        .await
        .unwrap();
        assert_eq!(out, "wrote 6 bytes to new/deep/f.txt");
        assert_eq!(sb.read("new/deep/f.txt"), "héllo");
        write_file(
            &json!({"path": "new/deep/f.txt", "content": "again"}),
            &sb.wd,
            Policy::WorkspaceWrite,
        )
        .await
        .unwrap();
        assert_eq!(sb.read("new/deep/f.txt"), "again");
        let names: Vec<_> = std::fs::read_dir(sb.root().join("new/deep"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["f.txt"], "no temporary file left behind");

        use std::os::unix::fs::PermissionsExt;
        sb.write("run.sh", "#!/bin/sh\n");
        std::fs::set_permissions(
            sb.root().join("run.sh"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        write_file(
            &json!({"path": "run.sh", "content": "#!/bin/sh\ntrue\n"}),
            &sb.wd,
            Policy::WorkspaceWrite,
        )
        .await
        .unwrap();
        let mode = std::fs::metadata(sb.root().join("run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);

        sb.write("file", "x");
        let err = write_file(
            &json!({"path": "file/inner", "content": "x"}),
            &sb.wd,
            Policy::WorkspaceWrite,
        )
        .await
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot create folders for file/inner"),
            "{err}"
        );
        let err = write_file(&json!({"path": "x"}), &sb.wd, Policy::WorkspaceWrite)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("missing required field `content`"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn edit_replaces_exact_strings() {
        let sb = Sandbox::new();
        sb.write("e.txt", "a = 1\nb = 1\nc = 2\n");
        let edit = |args: Value| {
            let wd = sb.wd.clone();
            async move { edit_file(&args, &wd, Policy::WorkspaceWrite).await }
        };
        let out = edit(json!({"path": "e.txt", "old_string": "c = 2", "new_string": "c = 3"}))
            .await
            .unwrap();
        assert_eq!(out, "replaced 1 occurrence in e.txt");
        assert_eq!(sb.read("e.txt"), "a = 1\nb = 1\nc = 3\n");

        let err = edit(json!({"path": "e.txt", "old_string": "= 1", "new_string": "= 9"}))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("occurs 2 times in e.txt"), "{err}");
        assert_eq!(sb.read("e.txt"), "a = 1\nb = 1\nc = 3\n");

        let err = edit(json!({"path": "e.txt", "old_string": "zzz", "new_string": "y"}))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("was not found in e.txt"), "{err}");

        let out = edit(json!({
            "path": "e.txt", "old_string": "= 1", "new_string": "= 9", "replace_all": true
        }))
        .await
        .unwrap();
        assert_eq!(out, "replaced 2 occurrences in e.txt");
        assert_eq!(sb.read("e.txt"), "a = 9\nb = 9\nc = 3\n");

        for (args, expected) in [
            (
                json!({"path": "e.txt", "old_string": "", "new_string": "x"}),
                "must not be empty",
            ),
            (
                json!({"path": "e.txt", "old_string": "a", "new_string": "a"}),
                "identical",
            ),
            (
                json!({"path": "missing", "old_string": "a", "new_string": "b"}),
                "no such file",
            ),
            (
                json!({"path": "e.txt", "old_string": "a", "new_string": 3}),
                "must be a string",
            ),
            (
                json!({"path": "e.txt", "old_string": "a", "new_string": "b", "replace_all": 2}),
                "true or false",
            ),
        ] {
            let err = edit(args).await.unwrap_err();
            assert!(err.to_string().contains(expected), "{err}");
        }
    }

    #[tokio::test]
    async fn every_file_tool_refuses_escapes() {
        let sb = Sandbox::new();
        for path in sb.escapes() {
            let err = read(&sb, json!({"path": path})).await.unwrap_err();
            assert!(
                matches!(
                    err,
                    ToolError::Outside { .. } | ToolError::InvalidPath { .. }
                ),
                "read {path:?}: {err}"
            );
            let err = write_file(
                &json!({"path": path, "content": "pwned"}),
                &sb.wd,
                Policy::WorkspaceWrite,
            )
            .await
            .unwrap_err();
            assert!(
                matches!(
                    err,
                    ToolError::Outside { .. } | ToolError::InvalidPath { .. }
                ),
                "write {path:?}: {err}"
            );
            let err = edit_file(
                &json!({"path": path, "old_string": "top", "new_string": "pwned"}),
                &sb.wd,
                Policy::WorkspaceWrite,
            )
            .await
            .unwrap_err();
            assert!(
                matches!(
                    err,
                    ToolError::Outside { .. } | ToolError::InvalidPath { .. }
                ),
                "edit {path:?}: {err}"
            );
        }
        sb.assert_outside_untouched();
    }
}

#[cfg(test)]
mod race_tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use serde_json::json;

    use super::*;
    use crate::subagent::tool::test_support::Sandbox;

    /// How many times each tool is called while a folder is swapped for a symlink to the
    /// outside and back.
    const CALLS: usize = 600;

    /// Exchanges `work/a` (a folder) with `work/a.link` (a symlink to `outside/`) atomically,
    /// over and over, until `stop` is set or a bound is reached; leaves the folder at `a`.
    fn swapper(sb: &Sandbox, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
        let root = sb.root().to_path_buf();
        std::os::unix::fs::symlink(&sb.outside, root.join("a.link")).unwrap();
        std::thread::spawn(move || {
            let exchange = || {
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    root.join("a"),
                    rustix::fs::CWD,
                    root.join("a.link"),
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
            };
            for _ in 0..1_000_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                exchange();
                exchange();
            }
        })
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_folder_swapped_for_a_symlink_never_leads_outside() {
        let sb = Sandbox::new();
        sb.write("a/secret.txt", "inside\n");
        let stop = Arc::new(AtomicBool::new(false));
        let swap = swapper(&sb, stop.clone());
        let mut leaked = Vec::new();
        for i in 0..CALLS {
            let _ = write_file(
                &json!({"path": "a/made.txt", "content": format!("pwned {i}")}),
                &sb.wd,
                Policy::WorkspaceWrite,
            )
            .await;
            if let Ok(text) = read_file(&json!({"path": "a/secret.txt"}), &sb.wd).await
                && text.contains("top secret")
            {
                leaked.push(format!("read_file read outside/secret.txt (call {i})"));
            }
            let _ = edit_file(
                &json!({"path": "a/secret.txt", "old_string": "secret", "new_string": "pwned"}),
                &sb.wd,
                Policy::WorkspaceWrite,
            )
            .await;
            let _ = edit_file(
                &json!({"path": "a/secret.txt", "old_string": "inside", "new_string": "inside"}),
                &sb.wd,
                Policy::WorkspaceWrite,
            )
            .await;
        }
        stop.store(true, Ordering::Relaxed);
        swap.join().unwrap();
        assert!(leaked.is_empty(), "{leaked:?}");
        sb.assert_outside_untouched();
    }
}
