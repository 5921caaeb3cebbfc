//! Opening and writing files without following a symlink someone else planted.
//!
//! A model's commands can create symlinks in the working directory (and so in a run's `--out`
//! folder or the store when they live there) while summon works. Checking a path and then
//! opening it by name again leaves a window in which a folder can become a link to anywhere, so
//! the file tools open a path beneath the working directory in one step ([`open_beneath`]:
//! `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, or a walk of `openat` with
//! `O_NOFOLLOW` one name at a time where the kernel has no `openat2`), and every file summon
//! writes for a run (`--out`, tables, `outputs`, JUnit) is created without following a link
//! at its name ([`open_no_follow`], [`write_replacing`]): a link there is refused with
//! [`link_error`]; a background task's log takes its name back ([`create_log`]).

use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Component, Path};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags};

/// How a folder is opened to be a base for other opens.
#[cfg(any(target_os = "linux", target_os = "android"))]
const DIR_FLAGS: OFlags = OFlags::PATH.union(OFlags::DIRECTORY);
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const DIR_FLAGS: OFlags = OFlags::RDONLY.union(OFlags::DIRECTORY);

/// The error for a path that went through a symbolic link where none may be.
pub(crate) fn is_link_error(e: &io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
}

/// Opens the folder at `path` (an absolute, canonical path) as a base for [`open_beneath`].
pub(crate) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        DIR_FLAGS | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The plain names of `rel`; anything else (`..`, a root) is refused.
fn names(rel: &Path) -> io::Result<Vec<&OsStr>> {
    rel.components()
        .filter(|c| *c != Component::CurDir)
        .map(|c| match c {
            Component::Normal(name) => Ok(name),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a plain relative path",
            )),
        })
        .collect()
}

/// Opens `rel` beneath the folder `dir` in one step, following no symbolic link on the way
/// nor at the end, and never leaving `dir` (a link swapped in fails with `ELOOP`).
pub(crate) fn open_beneath(
    dir: impl AsFd,
    rel: &Path,
    flags: OFlags,
    mode: Mode,
) -> io::Result<OwnedFd> {
    let names = names(rel)?;
    let flags = flags | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use rustix::fs::ResolveFlags;
        let resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        let joined: std::path::PathBuf = if names.is_empty() {
            ".".into()
        } else {
            names.iter().collect()
        };
        // EAGAIN: a rename elsewhere raced the resolution; try again, then walk.
        for _ in 0..8 {
            match rustix::fs::openat2(dir.as_fd(), &joined, flags, mode, resolve) {
                Err(rustix::io::Errno::AGAIN) => continue,
                Err(rustix::io::Errno::NOSYS) => break,
                result => return Ok(result?),
            }
        }
    }
    walk(dir.as_fd(), &names, flags, mode)
}

/// [`open_beneath`] one name at a time with `openat` and `O_NOFOLLOW`.
fn walk(dir: impl AsFd, names: &[&OsStr], flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    let Some((last, folders)) = names.split_last() else {
        return Ok(rustix::fs::openat(dir, ".", flags, mode)?);
    };
    let mut current = rustix::fs::openat(dir, ".", DIR_FLAGS | OFlags::CLOEXEC, Mode::empty())?;
    for name in folders {
        current = rustix::fs::openat(
            &current,
            *name,
            DIR_FLAGS | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
    }
    Ok(rustix::fs::openat(&current, *last, flags, mode)?)
}

/// Opens the folder `rel` beneath `dir`, creating the folders that are missing, following no
/// symbolic link.
pub(crate) fn create_dirs_beneath(dir: impl AsFd, rel: &Path) -> io::Result<OwnedFd> {
    let mut current = rustix::fs::openat(dir, ".", DIR_FLAGS | OFlags::CLOEXEC, Mode::empty())?;
    for name in names(rel)? {
        let open = |at: &OwnedFd| {
            rustix::fs::openat(
                at,
                name,
                DIR_FLAGS | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
            )
        };
        current = match open(&current) {
            Err(rustix::io::Errno::NOENT) => {
                match rustix::fs::mkdirat(&current, name, Mode::from_raw_mode(0o777)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                open(&current)?
            }
            result => result?,
        };
    }
    Ok(current)
}

/// A fresh temporary name next to `name`.
fn temp_name(name: &OsStr) -> OsString {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut temp = OsString::from(".");
    temp.push(name);
    temp.push(format!(
        ".{}.{}.summon-tmp",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    temp
}

/// Writes `bytes` to `name` in the folder `dir`: a new temporary file (never an existing one
/// or a link) renamed over `name`, so a reader sees the old file or the new one. An existing
/// regular file's permissions are kept. With `sync`, the data is on disk before the rename.
pub(crate) fn write_in(dir: &OwnedFd, name: &OsStr, bytes: &[u8], sync: bool) -> io::Result<()> {
    write_in_with(dir, name, sync, |file| file.write_all(bytes))
}

/// [`write_in`] with the content written by `fill`.
pub(crate) fn write_in_with(
    dir: &OwnedFd,
    name: &OsStr,
    sync: bool,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let temp = temp_name(name);
    let result = (|| {
        let fd = rustix::fs::openat(
            dir,
            &temp,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o666),
        )?;
        let mut file = File::from(fd);
        fill(&mut file)?;
        if sync {
            file.sync_all()?;
        }
        if let Ok(stat) = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
            && rustix::fs::FileType::from_raw_mode(stat.st_mode)
                == rustix::fs::FileType::RegularFile
        {
            rustix::fs::fchmod(&file, Mode::from_raw_mode(stat.st_mode as _))?;
        }
        drop(file);
        rustix::fs::renameat(dir, &temp, dir, name)?;
        Ok(())
    })();
    if result.is_err() {
        let _ = rustix::fs::unlinkat(dir, &temp, AtFlags::empty());
    }
    result
}

/// Where summon writes one of its files: the folder, open, and the name in it.
pub(crate) struct Dest {
    dir: OwnedFd,
    name: OsString,
    /// The path, for messages.
    path: std::path::PathBuf,
}

impl Dest {
    /// `path`, its missing folders created (folders that are links are followed: the path is
    /// the user's choice).
    pub(crate) fn at(path: &Path) -> io::Result<Self> {
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        std::fs::create_dir_all(dir)?;
        let name = path
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file path"))?;
        Ok(Self {
            dir: rustix::fs::open(dir, DIR_FLAGS | OFlags::CLOEXEC, Mode::empty())?,
            name: name.to_owned(),
            path: path.to_owned(),
        })
    }

    /// `rel` beneath the folder `root` (canonical): its folders opened, or created, one name at
    /// a time without following a link ([`inside`] gives such an `rel`).
    pub(crate) fn beneath(root: &Path, rel: &Path) -> io::Result<Self> {
        let name = rel
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file path"))?;
        let folder = rel.parent().unwrap_or(Path::new(""));
        Ok(Self {
            dir: create_dirs_beneath(open_dir(root)?, folder)?,
            name: name.to_owned(),
            path: root.join(rel),
        })
    }

    /// Writes the file through a new temporary file, synced, and a rename; a symbolic link at
    /// its name is refused.
    pub(crate) fn write_with(
        &self,
        fill: impl FnOnce(&mut File) -> io::Result<()>,
    ) -> io::Result<()> {
        if let Ok(stat) = rustix::fs::statat(&self.dir, &self.name, AtFlags::SYMLINK_NOFOLLOW)
            && rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::Symlink
        {
            return Err(link_error(&self.path));
        }
        write_in_with(&self.dir, &self.name, true, fill)
    }

    pub(crate) fn write(&self, bytes: &[u8]) -> io::Result<()> {
        self.write_with(|file| file.write_all(bytes))
    }
}

/// Why a path is not inside a folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outside {
    /// An absolute path elsewhere.
    Absolute,
    /// `..` leads out.
    Parent,
    /// A symbolic link leads out (or nowhere).
    Link,
}

impl Outside {
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Self::Absolute => "is an absolute path",
            Self::Parent => "goes up with `..`",
            Self::Link => "goes through a symbolic link",
        }
    }
}

/// `path` (relative to `root`, or absolute) as a path relative to `root` (a canonical folder)
/// with no link and no `..` in it, when its folder stays inside `root` as the kernel would
/// resolve it: the part that exists is canonicalized (links inside `root` are fine) and must be
/// inside `root`, the rest must be plain names. The file name is kept as it is (a link there is
/// refused when the file is written).
pub(crate) fn inside(root: &Path, path: &Path) -> Result<std::path::PathBuf, Outside> {
    let Some(name) = path.file_name() else {
        return Err(if path.is_absolute() && !path.starts_with(root) {
            Outside::Absolute
        } else {
            Outside::Parent
        });
    };
    let mut rel = folder_inside(root, path.parent().unwrap_or(Path::new("")))?;
    rel.push(name);
    Ok(rel)
}

/// [`inside`] for the folder `path`.
fn folder_inside(root: &Path, path: &Path) -> Result<std::path::PathBuf, Outside> {
    let lexical_escape = || {
        let mut depth = 0i64;
        for c in path.components() {
            match c {
                Component::ParentDir => depth -= 1,
                Component::Normal(_) => depth += 1,
                _ => {}
            }
            if depth < 0 {
                return true;
            }
        }
        false
    };
    let outside = || {
        if path.is_absolute() && !path.starts_with(root) {
            Outside::Absolute
        } else if lexical_escape() {
            Outside::Parent
        } else {
            Outside::Link
        }
    };
    let candidate = root.join(path);
    let (base, rest) = candidate
        .ancestors()
        .find_map(|prefix| {
            let base = std::fs::canonicalize(prefix).ok()?;
            Some((base, candidate.strip_prefix(prefix).ok()?.to_path_buf()))
        })
        .ok_or_else(outside)?;
    let Ok(within) = base.strip_prefix(root) else {
        return Err(outside());
    };
    let mut rel = within.to_path_buf();
    let mut first = true;
    for c in rest.components() {
        match c {
            Component::CurDir => {}
            Component::Normal(name) => {
                // It exists yet did not canonicalize: a dangling or looping link.
                if first && std::fs::symlink_metadata(base.join(name)).is_ok() {
                    return Err(Outside::Link);
                }
                first = false;
                rel.push(name);
            }
            Component::ParentDir => return Err(Outside::Parent),
            _ => return Err(outside()),
        }
    }
    Ok(rel)
}

/// An error when `path` is a symbolic link: summon writes its own files, never through a link
/// someone planted at their name.
pub(crate) fn refuse_link(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => Err(link_error(path)),
        _ => Ok(()),
    }
}

/// The error for a symbolic link where summon writes a file.
pub(crate) fn link_error(path: &Path) -> io::Error {
    io::Error::other(format!(
        "{} is a symbolic link; summon does not write through a link (remove it, or choose \
         another path)",
        path.display()
    ))
}

/// Opens `path` with `options`, never following a symbolic link at its name: a link there is
/// refused with [`link_error`].
pub(crate) fn open_no_follow(options: &mut OpenOptions, path: &Path) -> io::Result<File> {
    options
        .custom_flags(OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(|e| {
            if is_link_error(&e) {
                link_error(path)
            } else {
                e
            }
        })
}

/// Creates the file `path` afresh for summon alone (a background task's log): whatever is at
/// its name — a link, a hard link, a file — is removed first (the name, never what it points
/// at), then the file is created with `O_EXCL | O_NOFOLLOW`. Something planted again in
/// between makes it fail with an error naming the file.
pub(crate) fn create_log(path: &Path) -> io::Result<File> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot create {}: {e}", path.display())))
}

/// Writes `bytes` to `path` through a new temporary file in the same folder (created if
/// missing), synced, and a rename, so a reader sees the old file or the new one; refuses when
/// `path` is a symbolic link.
pub(crate) fn write_replacing(path: &Path, bytes: &[u8]) -> io::Result<()> {
    refuse_link(path)?;
    Dest::at(path)?.write(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_beneath_and_refuses_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("d")).unwrap();
        std::fs::write(root.join("d/f"), "x").unwrap();
        std::os::unix::fs::symlink(root.join("d"), root.join("link")).unwrap();
        std::os::unix::fs::symlink("f", root.join("d/rel")).unwrap();
        let base = open_dir(root).unwrap();
        let read = |rel: &str| open_beneath(&base, Path::new(rel), OFlags::RDONLY, Mode::empty());
        assert!(read("d/f").is_ok());
        assert!(read("./d/f").is_ok());
        assert!(read("").is_ok());
        assert!(is_link_error(&read("link/f").unwrap_err()));
        assert!(is_link_error(&read("d/rel").unwrap_err()));
        assert!(read("../x").is_err());
        assert!(read("/etc/passwd").is_err());
        // The walk refuses the same.
        let walked = |rel: &str| {
            walk(
                &base,
                &names(Path::new(rel)).unwrap(),
                OFlags::RDONLY | OFlags::NOFOLLOW,
                Mode::empty(),
            )
        };
        assert!(walked("d/f").is_ok());
        assert!(walked("link/f").is_err());
        assert!(walked("d/rel").is_err());

        let made = create_dirs_beneath(&base, Path::new("n/m")).unwrap();
        write_in(&made, OsStr::new("g"), b"hi", false).unwrap();
        assert_eq!(std::fs::read_to_string(root.join("n/m/g")).unwrap(), "hi");
        assert!(create_dirs_beneath(&base, Path::new("link/x")).is_err());
        assert!(!root.join("d/x").exists());
    }

    #[test]
    fn writes_refuse_a_link_at_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        let link = dir.path().join("out.jsonl");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        for append in [false, true] {
            let mut options = OpenOptions::new();
            options.create(true).append(append).write(!append);
            let err = open_no_follow(&mut options, &link).unwrap_err();
            assert!(err.to_string().contains("is a symbolic link"), "{err}");
        }
        let err = write_replacing(&link, b"x").unwrap_err();
        assert!(err.to_string().contains("is a symbolic link"), "{err}");
        // A log takes its name back: the link goes, its target stays.
        create_log(&link).unwrap().write_all(b"log").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().is_file());
        std::fs::hard_link(&target, dir.path().join("hard")).unwrap();
        create_log(&dir.path().join("hard"))
            .unwrap()
            .write_all(b"log")
            .unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        write_replacing(&dir.path().join("new/plain"), b"ok").unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("new/plain")).unwrap(),
            "ok"
        );
    }

    #[test]
    fn inside_tells_why_a_path_leaves() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap().join("p");
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::os::unix::fs::symlink(root.join("d"), root.join("in")).unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("up")).unwrap();
        std::os::unix::fs::symlink("/nowhere/x", root.join("dangling")).unwrap();
        let rel = |p: &str| inside(&root, Path::new(p));
        assert_eq!(rel("out/a.md"), Ok("out/a.md".into()));
        assert_eq!(rel("in/a.md"), Ok("d/a.md".into()));
        assert_eq!(rel("d/../x"), Ok("x".into()));
        assert_eq!(rel(&root.join("x").display().to_string()), Ok("x".into()));
        assert_eq!(rel("../x"), Err(Outside::Parent));
        assert_eq!(rel("new/../../x"), Err(Outside::Parent));
        assert_eq!(rel("/etc/x"), Err(Outside::Absolute));
        assert_eq!(rel("up/x"), Err(Outside::Link));
        assert_eq!(rel("dangling/x"), Err(Outside::Link));
        assert_eq!(
            rel("in"),
            Ok("in".into()),
            "a link at the name is the writer's to refuse"
        );
        let dest = Dest::beneath(&root, Path::new("new/deep/f")).unwrap();
        dest.write(b"x").unwrap();
        assert_eq!(
            std::fs::read_to_string(root.join("new/deep/f")).unwrap(),
            "x"
        );
    }
}
