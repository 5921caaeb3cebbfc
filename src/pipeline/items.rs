//! Where a `decompose` step's items come from (SPEC §6): a shell command (one string item per
//! non-empty output line), a file (CSV with a header, JSONL/NDJSON, or a JSON array), or a
//! glob (matching paths, sorted).
//!
//! Files are streamed: [`open_file_items`] returns an iterator that reads one row or line at a
//! time, so a million-row CSV never sits in memory whole (a `.json` array is the exception: it
//! is one document and is read whole).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

/// The extensions [`open_file_items`] reads.
const SUPPORTED: &str = ".csv, .jsonl, .ndjson, .json";

/// The longest line of an items file (CSV, JSONL) or of an items command's output: 16 MiB.
/// A longer line is an error naming it, instead of being read whole into memory.
pub(crate) const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// How many leading and trailing lines of a failed command's stderr go into the error: the
/// first lines usually say what went wrong (`fatal: not a git repository`), the last ones
/// where it stopped.
const STDERR_HEAD_LINES: usize = 5;
const STDERR_TAIL_LINES: usize = 10;

/// Why a step's items could not be produced. Messages name the command, file or pattern, and
/// the line where there is one.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ItemError {
    #[error("items command `{command}` could not start: {source}")]
    CommandStart {
        command: String,
        source: std::io::Error,
    },
    #[error("items command `{command}` {status}{}", stderr_suffix(.stderr))]
    CommandFailed {
        command: String,
        /// "exited with code N" or "was killed by signal N".
        status: String,
        /// The first and the last lines of its stderr.
        stderr: String,
    },
    #[error(
        "items command `{command}`: output line {line} is longer than {} MiB, the limit of an item's line",
        MAX_LINE_BYTES >> 20
    )]
    CommandLine { command: String, line: u64 },
    #[error("items command `{command}` timed out after {}", fmt_secs(*.timeout))]
    CommandTimeout { command: String, timeout: Duration },
    #[error("cannot read items file {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}:{line}: {message}", .path.display())]
    Parse {
        path: PathBuf,
        line: u64,
        message: String,
    },
    #[error(
        "items file {} has an unsupported extension; supported: {SUPPORTED}",
        .path.display()
    )]
    Unsupported { path: PathBuf },
    #[error("glob `{pattern}`: {message}")]
    Glob { pattern: String, message: String },
    #[error(
        "items file `{path}` is outside the working directory {}{why}: an items file stays \
         inside it, as `glob`'s matches do (`outside_project: true` on the step reads it anyway)",
        .cwd.display()
    )]
    Outside {
        path: String,
        cwd: PathBuf,
        why: &'static str,
    },
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!("; stderr:\n{stderr}")
    }
}

fn fmt_secs(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// How long a decompose command may run, in a run and in a dry run alike.
pub(crate) const COMMAND_LIMIT: Duration = Duration::from_secs(600);

/// A decompose step's items that need no model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StaticForm {
    /// One item per non-empty output line, run with `sh -c` in the working directory.
    Command,
    /// Matching paths, sorted; with `gitignore`, paths that `.gitignore`, `.ignore` and
    /// `.git/info/exclude` leave out are left out.
    Glob { gitignore: bool },
    /// A CSV file with a header (one object per row) or JSONL (one value per line), streamed.
    /// Inside the working directory as `glob`'s matches are, unless `outside_project`.
    File { outside_project: bool },
}

impl StaticForm {
    /// `command`, `glob` or `file`, as the pipeline names it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Command => "command",
            Self::Glob { .. } => "glob",
            Self::File { .. } => "file",
        }
    }
}

/// Whether a subagent decompose's answer to `schema` gives items: its root is an array (the
/// answer is the items), or an object whose required `items` property is an array (the items
/// are that property). `Err` says what the schema lacks.
pub(crate) fn items_of_schema(schema: &Value) -> Result<(), String> {
    let is = |node: &Value, kind: &str| node.get("type").and_then(Value::as_str) == Some(kind);
    if is(schema, "array") {
        return Ok(());
    }
    let wants = "its root must be an array (`type: array`), or an object whose required \
                 `items` property is an array";
    if !is(schema, "object") {
        return Err(wants.to_owned());
    }
    let items = schema.get("properties").and_then(|p| p.get("items"));
    let required = schema
        .get("required")
        .and_then(Value::as_array)
        .is_some_and(|r| r.iter().any(|k| k == "items"));
    match items {
        Some(items) if is(items, "array") && required => Ok(()),
        Some(items) if is(items, "array") => Err(format!("{wants}; `items` is not required")),
        _ => Err(wants.to_owned()),
    }
}

/// The items in a subagent decompose's answer: the answer itself when it is an array, else
/// the `items` array of an object ([`items_of_schema`]).
pub(crate) fn items_of_answer(answer: Value) -> Option<Vec<Value>> {
    match answer {
        Value::Array(items) => Some(items),
        Value::Object(mut map) => match map.remove("items") {
            Some(Value::Array(items)) => Some(items),
            _ => None,
        },
        _ => None,
    }
}

/// What a static decompose form produced.
#[derive(Debug)]
pub(crate) enum Expanded {
    Items(Vec<Value>),
    /// A file of items no template reads whole: opened (so it is known to be readable) and
    /// left to be streamed by the fan-out over it.
    File(PathBuf),
}

/// The items of a static decompose form whose template rendered to `text`, as the run and
/// the dry run both produce them: a command runs in `cwd` for at most [`COMMAND_LIMIT`]; a
/// file is read whole only when `keep_items` (a template reads the step's items), else only
/// opened.
pub(crate) fn expand_items(
    form: StaticForm,
    text: &str,
    cwd: &Path,
    keep_items: bool,
    command_env: &CommandVars,
) -> Result<Expanded, ItemError> {
    match form {
        StaticForm::Command => {
            command_items(text, cwd, COMMAND_LIMIT, command_env).map(Expanded::Items)
        }
        StaticForm::Glob { gitignore } => glob_items(text, cwd, gitignore).map(Expanded::Items),
        StaticForm::File { outside_project } => {
            let path = confined_items_file(text, cwd, outside_project)?;
            let reader = open_file_items(&path)?;
            if keep_items {
                reader.collect::<Result<_, _>>().map(Expanded::Items)
            } else {
                Ok(Expanded::File(path))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// command

/// What an items command's environment changes from summon's own: variables set on top (the
/// run's `TRACEPARENT`), and the credentials withheld. Every variable named like a key
/// (`*API_KEY`, `*_AUTH_TOKEN`) is withheld always; `withheld` adds the names the
/// configuration gives keys (any provider's `api_key_env`).
#[derive(Debug, Clone, Default)]
pub(crate) struct CommandVars {
    pub(crate) set: Vec<(String, String)>,
    pub(crate) withheld: Vec<String>,
}

/// Runs `sh -c COMMAND` in `cwd` with stdin closed; one string item per non-empty line of its
/// stdout (a trailing `\r` is dropped). A non-zero exit is an error carrying the exit code and
/// the last lines of stderr; so is running longer than `timeout` (the command's whole process
/// group is killed then). It runs with summon's environment without a credential, and with
/// `env`'s variables set on top.
pub(crate) fn command_items(
    command: &str,
    cwd: &Path,
    timeout: Duration,
    env: &CommandVars,
) -> Result<Vec<Value>, ItemError> {
    use std::os::unix::process::CommandExt;

    let deadline = Instant::now() + timeout;
    // With pipefail, a failing stage of a pipe (`git diff ... | cut ... | sort`) fails the
    // command instead of passing an empty list on; bash has it everywhere summon runs, `sh`
    // stands in where it is missing.
    let withheld: Vec<std::ffi::OsString> = std::env::vars_os()
        .map(|(name, _)| name)
        .filter(|name| {
            name.to_str().is_some_and(|name| {
                crate::sandbox::is_secret_name(name) || env.withheld.iter().any(|w| w == name)
            })
        })
        .collect();
    let spawn = |shell: &str, args: &[&str]| {
        let mut child = Command::new(shell);
        for name in &withheld {
            child.env_remove(name);
        }
        child
            .args(args)
            .arg(command)
            .current_dir(cwd)
            .envs(env.set.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
    };
    let mut child = match spawn("bash", &["-o", "pipefail", "-c"]) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => spawn("sh", &["-c"]),
        other => other,
    }
    .map_err(|source| ItemError::CommandStart {
        command: command.to_owned(),
        source,
    })?;
    let pid = child.id();
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        unreachable!("both pipes were requested");
    };

    // Readers on their own threads so that neither pipe can fill up and stall the command;
    // they report through channels so the wait below can give up at the deadline.
    let (out_tx, out_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = out_tx.send(read_item_lines(stdout));
    });
    let (err_tx, err_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = err_tx.send(read_head_tail(stderr, STDERR_HEAD_LINES, STDERR_TAIL_LINES));
    });

    let timed_out = || {
        kill_group(pid);
        ItemError::CommandTimeout {
            command: command.to_owned(),
            timeout,
        }
    };
    // Wait for the exit, polling with a growing pause (the common case ends in milliseconds).
    let mut pause = Duration::from_millis(1);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(source) => {
                kill_group(pid);
                let _ = child.wait();
                return Err(ItemError::CommandStart {
                    command: command.to_owned(),
                    source,
                });
            }
        }
        let now = Instant::now();
        if now >= deadline {
            let error = timed_out();
            let _ = child.wait();
            return Err(error);
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    };
    // A background process of the command may still hold the pipes open: the deadline applies
    // to reading them to the end too.
    let remaining = deadline.saturating_duration_since(Instant::now());
    let lines = out_rx.recv_timeout(remaining).map_err(|_| timed_out())?;
    let remaining = deadline.saturating_duration_since(Instant::now());
    let stderr = err_rx
        .recv_timeout(remaining.max(Duration::from_millis(100)))
        .unwrap_or_default();
    if !status.success() {
        use std::os::unix::process::ExitStatusExt;
        let status = match (status.code(), status.signal()) {
            (Some(code), _) => format!("exited with code {code}"),
            (None, Some(signal)) => format!("was killed by signal {signal}"),
            (None, None) => "failed".to_owned(),
        };
        return Err(ItemError::CommandFailed {
            command: command.to_owned(),
            status,
            stderr,
        });
    }
    lines.map_err(|line| ItemError::CommandLine {
        command: command.to_owned(),
        line,
    })
}

/// Kills the process group `pid` leads. The `--` matters: procps-ng 4 `kill` reads
/// `-KILL -1234` as `kill(-1, SIGKILL)`, every process of the user.
fn kill_group(pid: u32) {
    if pid <= 1 {
        return;
    }
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Calls `f` with every line of a stream that is not blank (lossy UTF-8, trailing `\r`
/// dropped), reading one line at a time. A line longer than [`MAX_LINE_BYTES`] stops it
/// with `Err(its line number)`, after the rest of the stream was read and dropped (so the
/// writer is not left blocked on a full pipe).
fn for_each_line(pipe: impl Read, mut f: impl FnMut(String)) -> Result<(), u64> {
    let mut reader = BufReader::new(pipe);
    let mut buf = Vec::new();
    let mut number = 0u64;
    loop {
        buf.clear();
        number += 1;
        match (&mut reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut buf)
        {
            Ok(0) | Err(_) => return Ok(()),
            Ok(_) => {}
        }
        if buf.len() > MAX_LINE_BYTES && buf.last() != Some(&b'\n') {
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
            return Err(number);
        }
        let line = trim_eol(&buf);
        if !line.iter().all(u8::is_ascii_whitespace) {
            f(String::from_utf8_lossy(line).into_owned());
        }
    }
}

/// One string item per non-empty line; `Err` with the number of a line that is too long.
fn read_item_lines(pipe: impl Read) -> Result<Vec<Value>, u64> {
    let mut items = Vec::new();
    for_each_line(pipe, |line| items.push(Value::String(line)))?;
    Ok(items)
}

/// The last `keep` non-empty lines of a stream, joined by newlines; memory stays bounded
/// whatever the stream's length.
/// The first `head` and the last `tail` lines of `pipe`, long lines cut, with a line saying
/// how many were left out between them.
fn read_head_tail(pipe: impl Read, head: usize, tail: usize) -> String {
    const MAX_LINE: usize = 500;
    let mut first: Vec<String> = Vec::with_capacity(head);
    let mut last: VecDeque<String> = VecDeque::with_capacity(tail + 1);
    let mut left_out = 0usize;
    // A stderr line past the limit ends what is shown of it.
    let _ = for_each_line(pipe, |mut text| {
        if text.len() > MAX_LINE {
            let mut cut = MAX_LINE;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push('…');
        }
        if first.len() < head {
            first.push(text);
            return;
        }
        last.push_back(text);
        if last.len() > tail {
            last.pop_front();
            left_out += 1;
        }
    });
    if left_out > 0 {
        first.push(format!(
            "… {left_out} more line{} …",
            crate::plural::s(left_out as u64)
        ));
    }
    first.extend(last);
    first.join("\n")
}

fn trim_eol(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

// ---------------------------------------------------------------------------------------------
// file

/// A reader that fails once a line (the bytes between two `\n`) grows past
/// [`MAX_LINE_BYTES`], so no reader above it holds more of one line than that.
pub(crate) struct LineLimit<R> {
    inner: R,
    /// Bytes read since the last `\n`.
    run: usize,
    /// The 1-based number of the line being read.
    line: u64,
}

impl<R> LineLimit<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            run: 0,
            line: 1,
        }
    }
}

impl<R: Read> Read for LineLimit<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        for &byte in &buf[..n] {
            if byte == b'\n' {
                self.line += 1;
                self.run = 0;
            } else {
                self.run += 1;
                if self.run > MAX_LINE_BYTES {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        LineTooLong { line: self.line },
                    ));
                }
            }
        }
        Ok(n)
    }
}

/// The error of a [`LineLimit`].
#[derive(Debug, Clone, Copy)]
struct LineTooLong {
    line: u64,
}

impl std::fmt::Display for LineTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "line {} is longer than {} MiB, the limit of an items line",
            self.line,
            MAX_LINE_BYTES >> 20
        )
    }
}

impl std::error::Error for LineTooLong {}

impl LineTooLong {
    fn of(error: &std::io::Error) -> Option<Self> {
        error.get_ref()?.downcast_ref::<Self>().copied()
    }

    fn error(self, path: &Path) -> ItemError {
        ItemError::Parse {
            path: path.to_owned(),
            line: self.line,
            message: format!(
                "the line is longer than {} MiB, the limit of an items line",
                MAX_LINE_BYTES >> 20
            ),
        }
    }
}

/// Streams the items of a file, one at a time. Returned by [`open_file_items`]. After an error
/// the iterator ends.
pub(crate) struct ItemReader {
    path: PathBuf,
    kind: ReaderKind,
    done: bool,
}

enum ReaderKind {
    Csv {
        reader: csv::Reader<LineLimit<File>>,
        headers: Vec<String>,
        record: csv::StringRecord,
    },
    Lines {
        reader: BufReader<LineLimit<File>>,
        line: u64,
        buf: String,
    },
    Array(std::vec::IntoIter<Value>),
}

/// Whether [`open_file_items`] reads a file of this name: an error for an extension it does
/// not know, decided without the file.
pub(crate) fn check_items_path(path: &Path) -> Result<(), ItemError> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("csv" | "jsonl" | "ndjson" | "json") => Ok(()),
        _ => Err(ItemError::Unsupported {
            path: path.to_owned(),
        }),
    }
}

/// Opens a file of items, chosen by extension (case-insensitive): `.csv` (a header row, then
/// one JSON object per row, keys in column order, values strings), `.jsonl`/`.ndjson` (one JSON
/// value per non-empty line) or `.json` (an array, read whole). The header (CSV) or the whole
/// document (JSON) is read here, so their errors come from this call; row errors come from
/// the iterator.
pub(crate) fn open_file_items(path: &Path) -> Result<ItemReader, ItemError> {
    check_items_path(path)?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let io_err = |source| ItemError::Io {
        path: path.to_owned(),
        source,
    };
    let kind = match ext.as_deref() {
        Some("csv") => {
            let file = File::open(path).map_err(io_err)?;
            let mut reader = csv::ReaderBuilder::new()
                .has_headers(true)
                .flexible(false)
                .from_reader(LineLimit::new(file));
            let headers: Vec<String> = reader
                .headers()
                .map_err(|e| csv_error(path, &e))?
                .iter()
                .map(str::to_owned)
                .collect();
            for (i, name) in headers.iter().enumerate() {
                if headers[..i].contains(name) {
                    return Err(ItemError::Parse {
                        path: path.to_owned(),
                        line: 1,
                        message: format!("duplicate column name `{name}` in the header"),
                    });
                }
            }
            ReaderKind::Csv {
                reader,
                headers,
                record: csv::StringRecord::new(),
            }
        }
        Some("jsonl" | "ndjson") => ReaderKind::Lines {
            reader: BufReader::new(LineLimit::new(File::open(path).map_err(io_err)?)),
            line: 0,
            buf: String::new(),
        },
        Some("json") => {
            let reader = BufReader::new(File::open(path).map_err(io_err)?);
            let value: Value = serde_json::from_reader(reader).map_err(|e| {
                if e.is_io() {
                    io_err(e.into())
                } else {
                    ItemError::Parse {
                        path: path.to_owned(),
                        line: e.line() as u64,
                        message: format!("invalid JSON: {e}"),
                    }
                }
            })?;
            let Value::Array(items) = value else {
                return Err(ItemError::Parse {
                    path: path.to_owned(),
                    line: 1,
                    message: format!("expected a JSON array of items, found {}", kind_of(&value)),
                });
            };
            ReaderKind::Array(items.into_iter())
        }
        _ => {
            return Err(ItemError::Unsupported {
                path: path.to_owned(),
            });
        }
    };
    Ok(ItemReader {
        path: path.to_owned(),
        kind,
        done: false,
    })
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn csv_error(path: &Path, error: &csv::Error) -> ItemError {
    let line = error.position().map_or(0, csv::Position::line);
    let message = match error.kind() {
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => format!("row has {len} fields, but the header has {expected_len}"),
        csv::ErrorKind::Utf8 { err, .. } => format!("invalid UTF-8 in field {}", err.field() + 1),
        csv::ErrorKind::Io(e) => {
            if let Some(long) = LineTooLong::of(e) {
                return long.error(path);
            }
            return ItemError::Io {
                path: path.to_owned(),
                source: std::io::Error::new(e.kind(), e.to_string()),
            };
        }
        _ => error.to_string(),
    };
    ItemError::Parse {
        path: path.to_owned(),
        line,
        message,
    }
}

impl ItemReader {
    fn next_item(&mut self) -> Option<Result<Value, ItemError>> {
        match &mut self.kind {
            ReaderKind::Csv {
                reader,
                headers,
                record,
            } => match reader.read_record(record) {
                Ok(false) => None,
                Ok(true) => {
                    let mut row = Map::with_capacity(headers.len());
                    for (name, field) in headers.iter().zip(record.iter()) {
                        row.insert(name.clone(), Value::String(field.to_owned()));
                    }
                    Some(Ok(Value::Object(row)))
                }
                Err(e) => Some(Err(csv_error(&self.path, &e))),
            },
            ReaderKind::Lines { reader, line, buf } => loop {
                buf.clear();
                *line += 1;
                match reader.read_line(buf) {
                    Ok(0) => return None,
                    Ok(_) => {}
                    Err(e) if let Some(long) = LineTooLong::of(&e) => {
                        return Some(Err(long.error(&self.path)));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                        return Some(Err(ItemError::Parse {
                            path: self.path.clone(),
                            line: *line,
                            message: "invalid UTF-8".to_owned(),
                        }));
                    }
                    Err(source) => {
                        return Some(Err(ItemError::Io {
                            path: self.path.clone(),
                            source,
                        }));
                    }
                }
                let text = buf.trim();
                if text.is_empty() {
                    continue;
                }
                return Some(serde_json::from_str(text).map_err(|e| ItemError::Parse {
                    path: self.path.clone(),
                    line: *line,
                    message: format!("invalid JSON: {e}"),
                }));
            },
            ReaderKind::Array(items) => items.next().map(Ok),
        }
    }
}

impl Iterator for ItemReader {
    type Item = Result<Value, ItemError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = self.next_item();
        if matches!(next, None | Some(Err(_))) {
            self.done = true;
        }
        next
    }
}

// ---------------------------------------------------------------------------------------------
// glob

/// The files under `cwd` matching `pattern` (globset syntax: `*` and `?` stay within one path
/// component, `**` crosses them, `{a,b}` and `[ab]` work), as `/`-separated paths relative to
/// `cwd`, sorted. With `gitignore`, what `.gitignore` files (in the folders walked and above
/// them), `.ignore` files and `.git/info/exclude` leave out is left out, inside a git
/// repository or not; the user's global excludes are not read, so the items are the same on
/// every machine. A pattern naming one file matches it even when it is ignored. `.git`
/// directories are skipped unless the pattern names `.git`; other hidden files are kept. A pattern may not leave `cwd`: `..` components
/// and absolute paths outside it are refused. Symbolic links to directories are not followed.
pub(crate) fn glob_items(
    pattern: &str,
    cwd: &Path,
    gitignore: bool,
) -> Result<Vec<Value>, ItemError> {
    let fail = |message: String| ItemError::Glob {
        pattern: pattern.to_owned(),
        message,
    };
    let relative = relative_pattern(pattern, cwd).map_err(fail)?;
    if relative.is_empty() {
        return Err(fail("the pattern is empty".to_owned()));
    }
    let matcher = globset::GlobBuilder::new(&relative)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map_err(|e| fail(e.kind().to_string()))?
        .compile_matcher();

    // Walk only below the pattern's literal prefix, and only as deep as it can match.
    let components: Vec<&str> = relative.split('/').collect();
    let literal = components
        .iter()
        .take_while(|c| !c.contains(['*', '?', '[', '{', '\\']))
        .count();
    let rest = &components[literal..];
    let max_depth = if rest.iter().any(|c| c.contains("**") || c.contains('{')) {
        None
    } else {
        Some(rest.len())
    };
    let root = if literal == 0 {
        cwd.to_owned()
    } else {
        cwd.join(components[..literal].join("/"))
    };
    let include_git = relative.contains(".git");

    let mut found = Vec::new();
    if rest.is_empty() {
        // A plain path: it matches itself when it is a file.
        if root.is_file() {
            found.push(relative.clone());
        }
    } else if root.is_dir() {
        let walker = ignore::WalkBuilder::new(&root)
            .standard_filters(false)
            .git_ignore(gitignore)
            .git_exclude(gitignore)
            .ignore(gitignore)
            .parents(gitignore)
            .require_git(false)
            .follow_links(false)
            .max_depth(max_depth)
            .filter_entry(move |entry| include_git || entry.file_name() != ".git")
            .build();
        for entry in walker {
            let entry = entry.map_err(|e| fail(e.to_string()))?;
            let is_file = match entry.file_type() {
                Some(t) if t.is_file() => true,
                Some(t) if t.is_symlink() => entry.path().is_file(),
                _ => false,
            };
            if !is_file {
                continue;
            }
            let Ok(rel) = entry.path().strip_prefix(cwd) else {
                continue;
            };
            let Some(rel) = rel.to_str() else {
                continue;
            };
            if matcher.is_match(rel) {
                found.push(rel.to_owned());
            }
        }
    }
    found.sort_unstable();
    Ok(found.into_iter().map(Value::String).collect())
}

/// The items file that `text` (a rendered `decompose.file`) names, confined as `glob` is:
/// relative to `cwd` with no `..`, or absolute inside it, and where it really is (through any
/// link) inside `cwd` too, so neither `../secret.jsonl` nor a link planted at `items.jsonl`
/// that leads out (a model's commands can write the project) is read. The file is opened
/// beneath `cwd` following no link once resolved. With `outside_project`, the path as given.
pub(crate) fn confined_items_file(
    text: &str,
    cwd: &Path,
    outside_project: bool,
) -> Result<PathBuf, ItemError> {
    let text = text.trim();
    let given = cwd.join(text);
    if outside_project {
        return Ok(given);
    }
    let outside = |why| ItemError::Outside {
        path: text.to_owned(),
        cwd: cwd.to_owned(),
        why,
    };
    let relative = relative_pattern(text, cwd).map_err(|_| outside(""))?;
    if relative.is_empty() {
        return Ok(given);
    }
    let base = cwd.canonicalize().unwrap_or_else(|_| cwd.to_owned());
    let real = match std::fs::canonicalize(base.join(&relative)) {
        Ok(real) => real,
        // Missing: the read that follows says so.
        Err(_) => return Ok(given),
    };
    let Ok(inside) = real.strip_prefix(&base) else {
        return Err(outside(" (through a symbolic link)"));
    };
    let io = |source| ItemError::Io {
        path: given.clone(),
        source,
    };
    let dir = crate::safe_fs::open_dir(&base).map_err(io)?;
    match crate::safe_fs::open_beneath(
        &dir,
        inside,
        rustix::fs::OFlags::RDONLY,
        rustix::fs::Mode::empty(),
    ) {
        Ok(_) => Ok(real),
        Err(e) if crate::safe_fs::is_link_error(&e) => Err(outside(" (through a symbolic link)")),
        Err(e) => Err(io(e)),
    }
}

/// The pattern made relative to `cwd`, with `.` components dropped; refuses `..` and absolute
/// paths outside `cwd`.
fn relative_pattern(pattern: &str, cwd: &Path) -> Result<String, String> {
    let outside = || "the pattern must stay inside the working directory".to_owned();
    let mut pattern = pattern.to_owned();
    if Path::new(&pattern).is_absolute() {
        let cwd_canon = cwd.canonicalize().unwrap_or_else(|_| cwd.to_owned());
        let stripped = [cwd, cwd_canon.as_path()].into_iter().find_map(|base| {
            let base = base.to_str()?.trim_end_matches('/');
            let rest = pattern.strip_prefix(base)?;
            (rest.is_empty() || rest.starts_with('/')).then(|| rest.trim_start_matches('/'))
        });
        pattern = stripped.ok_or_else(outside)?.to_owned();
    }
    let mut parts = Vec::new();
    for part in pattern.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(outside()),
            _ => parts.push(part),
        }
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, text).unwrap();
        path
    }

    fn collect(path: &Path) -> Result<Vec<Value>, ItemError> {
        open_file_items(path)?.collect()
    }

    #[test]
    fn a_file_is_read_whole_only_when_its_items_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "in.jsonl", "1\n2\n");
        let kept = expand_items(
            StaticForm::File {
                outside_project: false,
            },
            " in.jsonl\n",
            dir.path(),
            true,
            &CommandVars::default(),
        )
        .unwrap();
        assert!(
            matches!(&kept, Expanded::Items(items) if *items == [json!(1), json!(2)]),
            "{kept:?}"
        );
        let streamed = expand_items(
            StaticForm::File {
                outside_project: false,
            },
            "in.jsonl",
            dir.path(),
            false,
            &CommandVars::default(),
        )
        .unwrap();
        assert!(
            matches!(&streamed, Expanded::File(path) if *path == dir.path().join("in.jsonl")),
            "{streamed:?}"
        );
        // Missing, it is an error either way.
        assert!(
            expand_items(
                StaticForm::File {
                    outside_project: false
                },
                "no.jsonl",
                dir.path(),
                false,
                &CommandVars::default()
            )
            .is_err()
        );
        let lines = expand_items(
            StaticForm::Command,
            "printf 'a\\n\\nb\\n'",
            dir.path(),
            false,
            &CommandVars::default(),
        );
        assert!(
            matches!(&lines, Ok(Expanded::Items(items)) if *items == [json!("a"), json!("b")]),
            "{lines:?}"
        );
    }

    #[test]
    fn csv_rows_become_objects_in_column_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "in.csv",
            "name,text,n\r\nalpha,\"a, b\",1\n\"be\"\"ta\",\"two\nlines\",2\n\ngamma,,3\n",
        );
        let items = collect(&path).unwrap();
        assert_eq!(
            items,
            vec![
                json!({"name": "alpha", "text": "a, b", "n": "1"}),
                json!({"name": "be\"ta", "text": "two\nlines", "n": "2"}),
                json!({"name": "gamma", "text": "", "n": "3"}),
            ]
        );
        let keys: Vec<&String> = items[0].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["name", "text", "n"]);
    }

    #[test]
    fn csv_bom_and_uppercase_extension() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "IN.CSV", "\u{feff}id,v\n1,x\n");
        assert_eq!(collect(&path).unwrap(), vec![json!({"id": "1", "v": "x"})]);
    }

    #[test]
    fn ragged_csv_row_names_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "in.csv", "a,b\n1,2\n\"x\ny\",3\n4,5,6\n7,8\n");
        let mut reader = open_file_items(&path).unwrap();
        assert!(reader.next().unwrap().is_ok());
        assert!(reader.next().unwrap().is_ok());
        let error = reader.next().unwrap().unwrap_err().to_string();
        assert!(error.contains("in.csv:5:"), "{error}");
        assert!(
            error.contains("row has 3 fields, but the header has 2"),
            "{error}"
        );
        assert!(reader.next().is_none(), "the reader stops after an error");
    }

    #[test]
    fn csv_duplicate_header_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "in.csv", "a,b,a\n1,2,3\n");
        let error = open_file_items(&path).err().unwrap().to_string();
        assert!(
            error.contains("in.csv:1: duplicate column name `a`"),
            "{error}"
        );
    }

    #[test]
    fn jsonl_skips_empty_lines_and_names_a_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "in.jsonl",
            "{\"a\": 1}\n\n  \r\n\"text\"\r\n[1,2]\n{bad\n3\n",
        );
        let mut reader = open_file_items(&path).unwrap();
        assert_eq!(reader.next().unwrap().unwrap(), json!({"a": 1}));
        assert_eq!(reader.next().unwrap().unwrap(), json!("text"));
        assert_eq!(reader.next().unwrap().unwrap(), json!([1, 2]));
        let error = reader.next().unwrap().unwrap_err().to_string();
        assert!(error.contains("in.jsonl:6: invalid JSON"), "{error}");
        assert!(reader.next().is_none());

        let path = write(dir.path(), "ok.ndjson", "1\n2");
        assert_eq!(collect(&path).unwrap(), vec![json!(1), json!(2)]);
    }

    #[test]
    fn json_array_and_non_array() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "in.json", "[\"a\", {\"b\": 2}]");
        assert_eq!(collect(&path).unwrap(), vec![json!("a"), json!({"b": 2})]);
        let path = write(dir.path(), "obj.json", "{\"a\": 1}");
        let error = open_file_items(&path).err().unwrap().to_string();
        assert!(
            error.contains("expected a JSON array of items, found an object"),
            "{error}"
        );
        let path = write(dir.path(), "bad.json", "[1,\n2,\n}");
        let error = open_file_items(&path).err().unwrap().to_string();
        assert!(error.contains("bad.json:3: invalid JSON"), "{error}");
    }

    #[test]
    fn unsupported_extension_and_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "in.txt", "a\n");
        let error = open_file_items(&path).err().unwrap().to_string();
        assert!(error.contains("in.txt"), "{error}");
        assert!(error.contains(".csv, .jsonl, .ndjson, .json"), "{error}");
        let error = open_file_items(&dir.path().join("none.csv"))
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("cannot read items file") && error.contains("none.csv"));
    }

    #[test]
    fn a_line_past_the_limit_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let at_limit = format!("\"{}\"", "x".repeat(MAX_LINE_BYTES - 2));
        let over = format!("\"{}\"", "x".repeat(MAX_LINE_BYTES - 1));
        // A line of exactly the limit is read; one byte more is not.
        let path = write(dir.path(), "ok.jsonl", &format!("1\n{at_limit}\n"));
        assert_eq!(collect(&path).unwrap().len(), 2);
        let path = write(dir.path(), "big.jsonl", &format!("1\n{over}\n3\n"));
        let mut reader = open_file_items(&path).unwrap();
        assert_eq!(reader.next().unwrap().unwrap(), json!(1));
        let error = reader.next().unwrap().unwrap_err().to_string();
        assert!(
            error.contains("big.jsonl:2: the line is longer than 16 MiB"),
            "{error}"
        );
        assert!(reader.next().is_none());

        let path = write(dir.path(), "big.csv", &format!("id,text\n1,a\n2,{over}\n"));
        let error = collect(&path).unwrap_err().to_string();
        assert!(
            error.contains("big.csv:3: the line is longer than 16 MiB"),
            "{error}"
        );

        // A command's output line too; the command is not left blocked on its pipe.
        let error = command_items(
            &format!(
                "head -c {} /dev/zero | tr '\\0' x; echo; echo more",
                MAX_LINE_BYTES + 1
            ),
            dir.path(),
            Duration::from_secs(60),
            &CommandVars::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("output line 1 is longer than 16 MiB"),
            "{error}"
        );
    }

    #[test]
    fn command_lines_become_items() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "marker", "");
        let items = command_items(
            "printf 'a\\r\\n\\n  \\nb c\\n'; ls; printf last",
            dir.path(),
            Duration::from_secs(10),
            &CommandVars::default(),
        )
        .unwrap();
        assert_eq!(
            items,
            vec![json!("a"), json!("b c"), json!("marker"), json!("last")]
        );
    }

    #[test]
    fn command_failure_carries_code_and_stderr_tail() {
        let dir = tempfile::tempdir().unwrap();
        let error = command_items(
            "echo out; for i in $(seq 1 30); do echo err$i >&2; done; exit 3",
            dir.path(),
            Duration::from_secs(10),
            &CommandVars::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("exited with code 3"), "{error}");
        // the first lines (what went wrong) and the last (where it stopped), the rest counted
        let stderr = error.split_once("stderr:\n").unwrap().1;
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(
            lines[..5],
            ["err1", "err2", "err3", "err4", "err5"],
            "{error}"
        );
        assert_eq!(lines[5], "… 15 more lines …", "{error}");
        assert_eq!(
            lines[6..],
            (21..=30).map(|i| format!("err{i}")).collect::<Vec<_>>()[..]
        );
        // short stderr is shown whole
        let error = command_items(
            "echo one >&2; echo two >&2; exit 1",
            dir.path(),
            Duration::from_secs(10),
            &CommandVars::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(error.ends_with("stderr:\none\ntwo"), "{error}");
    }

    #[test]
    fn command_timeout_kills_it() {
        let dir = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let error = command_items(
            "echo one; sleep 30; echo two",
            dir.path(),
            Duration::from_millis(300),
            &CommandVars::default(),
        )
        .unwrap_err();
        assert!(matches!(error, ItemError::CommandTimeout { .. }), "{error}");
        assert!(
            error.to_string().contains("timed out after 0.3s"),
            "{error}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn command_background_child_holding_stdout_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let error = command_items(
            "sleep 30 & echo x",
            dir.path(),
            Duration::from_millis(300),
            &CommandVars::default(),
        )
        .unwrap_err();
        assert!(matches!(error, ItemError::CommandTimeout { .. }), "{error}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn glob_matches_sorted_relative_paths() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for name in [
            "b.md",
            "a.md",
            "notes.txt",
            "docs/z.md",
            "docs/deep/x.md",
            "docs/deep/y.txt",
            ".git/info.md",
            ".hidden.md",
        ] {
            write(root, name, "");
        }
        write(root, ".gitignore", "*.md\n");
        let glob = |p: &str| -> Vec<String> {
            glob_items(p, root, false)
                .unwrap()
                .into_iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(glob("*.md"), [".hidden.md", "a.md", "b.md"]);
        assert_eq!(
            glob("**/*.md"),
            [".hidden.md", "a.md", "b.md", "docs/deep/x.md", "docs/z.md"]
        );
        assert_eq!(glob("docs/**/*.md"), ["docs/deep/x.md", "docs/z.md"]);
        assert_eq!(glob("./docs/*"), ["docs/z.md"]);
        assert_eq!(
            glob("docs/{deep/y.txt,z.md}"),
            ["docs/deep/y.txt", "docs/z.md"]
        );
        assert_eq!(glob("notes.txt"), ["notes.txt"]);
        assert_eq!(glob(".git/*.md"), [".git/info.md"]);
        assert!(glob("nothing/**").is_empty());
        let absolute = format!("{}/docs/*.md", root.display());
        assert_eq!(glob(&absolute), ["docs/z.md"]);
    }

    #[test]
    fn glob_leaves_out_what_ignore_files_leave_out_unless_told_not_to() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for name in [
            "README.md",
            "docs/guide.md",
            "docs/draft.md",
            "docs/keep.md",
            "node_modules/pkg/README.md",
            "docs/node_modules/x/README.md",
            "build/out.md",
            "notes/private.md",
            "notes/public.md",
            "local.md",
        ] {
            write(root, name, "");
        }
        write(root, ".gitignore", "node_modules/\n/build\n");
        write(root, "docs/.gitignore", "*.md\n!keep.md\n!guide.md\n");
        write(root, "notes/.ignore", "private.md\n");
        write(root, ".git/info/exclude", "local.md\n");
        let glob = |p: &str, gitignore: bool| -> Vec<String> {
            glob_items(p, root, gitignore)
                .unwrap()
                .into_iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(
            glob("**/*.md", true),
            [
                "README.md",
                "docs/guide.md",
                "docs/keep.md",
                "notes/public.md"
            ]
        );
        // the walk starts below `docs/`, and the root's `.gitignore` still applies there
        assert_eq!(
            glob("docs/**/*.md", true),
            ["docs/guide.md", "docs/keep.md"]
        );
        // a file named outright is matched though ignored
        assert_eq!(glob("build/out.md", true), ["build/out.md"]);
        assert_eq!(glob("**/*.md", false).len(), 10);
    }

    /// `decompose.file` is confined as `glob` is: `..`, an absolute path elsewhere and a link
    /// planted at the file's name that leads out are refused, naming the file; a link that
    /// stays inside is read; `outside_project` reads the path as given.
    #[test]
    fn an_items_file_stays_inside_the_working_directory() {
        let top = tempfile::tempdir().unwrap();
        let cwd = top.path().join("project");
        std::fs::create_dir_all(cwd.join("data")).unwrap();
        std::fs::write(top.path().join("secret.jsonl"), "\"key\"\n").unwrap();
        std::fs::write(cwd.join("data/in.jsonl"), "1\n").unwrap();
        std::os::unix::fs::symlink(top.path().join("secret.jsonl"), cwd.join("items.jsonl"))
            .unwrap();
        std::os::unix::fs::symlink(top.path(), cwd.join("up")).unwrap();
        std::os::unix::fs::symlink("data/in.jsonl", cwd.join("near.jsonl")).unwrap();
        let secret = top.path().join("secret.jsonl");
        let file = |outside_project| StaticForm::File { outside_project };
        for text in [
            "../secret.jsonl",
            "data/../../secret.jsonl",
            secret.to_str().unwrap(),
            "items.jsonl",
            "up/secret.jsonl",
        ] {
            let error = expand_items(file(false), text, &cwd, true, &CommandVars::default())
                .unwrap_err()
                .to_string();
            assert!(
                error.starts_with(&format!("items file `{text}`"))
                    && error.contains("is outside the working directory")
                    && error.contains("outside_project: true"),
                "{text}: {error}"
            );
            let Expanded::Items(items) =
                expand_items(file(true), text, &cwd, true, &CommandVars::default()).unwrap()
            else {
                panic!("kept")
            };
            assert_eq!(items, [json!("key")], "{text}");
        }
        for text in ["near.jsonl", "./data/in.jsonl"] {
            let Expanded::Items(items) =
                expand_items(file(false), text, &cwd, true, &CommandVars::default()).unwrap()
            else {
                panic!("kept")
            };
            assert_eq!(items, [json!(1)], "{text}");
        }
    }

    #[test]
    fn glob_refuses_to_leave_the_working_directory() {
        let dir = tempfile::tempdir().unwrap();
        for pattern in ["../*", "docs/../../x", "/etc/*", "/**/*.md"] {
            let error = glob_items(pattern, dir.path(), true)
                .unwrap_err()
                .to_string();
            assert!(error.contains("must stay inside"), "{pattern}: {error}");
        }
        let error = glob_items("[", dir.path(), true).unwrap_err().to_string();
        assert!(error.starts_with("glob `[`:"), "{error}");
    }

    fn rss_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// A million-row CSV is streamed: iterating it barely moves the process's RSS.
    #[test]
    #[ignore = "~5 s in debug, and it measures the whole process's RSS: run alone with --ignored"]
    fn million_row_csv_streams_in_bounded_memory() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.csv");
        {
            let mut out = std::io::BufWriter::new(File::create(&path).unwrap());
            writeln!(out, "id,name,text").unwrap();
            for i in 0..1_000_000u32 {
                writeln!(out, "{i},item-{i},\"some text, with a comma {i}\"").unwrap();
            }
        }
        let size = std::fs::metadata(&path).unwrap().len();
        let before = rss_kib();
        let started = Instant::now();
        let mut count = 0u64;
        let mut peak = before;
        for item in open_file_items(&path).unwrap() {
            let item = item.unwrap();
            assert!(item.get("text").is_some());
            count += 1;
            if count.is_multiple_of(50_000) {
                peak = peak.max(rss_kib());
            }
        }
        let after = rss_kib();
        peak = peak.max(after);
        eprintln!(
            "1M-row CSV ({} MiB): {count} items in {:.2}s; VmRSS before {} KiB, peak {} KiB, after {} KiB, growth {} KiB",
            size / (1 << 20),
            started.elapsed().as_secs_f64(),
            before,
            peak,
            after,
            peak.saturating_sub(before)
        );
        assert_eq!(count, 1_000_000);
        assert!(peak.saturating_sub(before) < 30 * 1024, "RSS grew too much");
    }
}
