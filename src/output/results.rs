//! `--out DIR/results.jsonl`: one JSON line per finished task, written as tasks finish.
//!
//! Each line (keys in this order):
//!
//! ```json
//! {"step":"notes","index":3,"item":"api","status":"completed","output":"…","error":null,
//!  "error_class":null,"turns":2,"input_tokens":1200,"output_tokens":340,"duration_ms":5120,"resumed":false,
//!  "reused":false,"extracted":false,"corrections":0,"started_ms":5310,"attempts":1,
//!  "retries":0,"rate_limited":0,"retry_wait_ms":0,
//!  "tools":[{"name":"shell","ok":true,"summary":"src/api"}],"prompt":"Write notes for api",
//!  "overhead_tokens":48,"tool_tokens":0,
//!  "warnings":[],"data":null,
//!  "cache_read_tokens":1000,"cache_write_tokens":0,"role":"explorer"}
//! ```
//!
//! `status` is `completed`, `failed` or `skipped`; `error` is a string for failed tasks, and
//! `error_class` its cause as the end of a run groups failures (`provider: bad_request`,
//! `timeout`, `answer not matching its schema`, ...);
//! `resumed` marks a task that finished before a `--resume` (its line is written again when
//! the interruption lost it; a line an earlier attempt wrote is marked when the file is
//! compacted at the end of the resumed run, its `started_ms` and `waits` taken off); `reused`, one whose answer an earlier run gave (`--reuse`); `extracted`, a structured answer
//! taken from a fenced block or the text around it (not bare JSON); `corrections`, the answers
//! sent back because they did not validate against the response schema. `started_ms` is when
//! the task started, in milliseconds from the start of the run (`null` for a task this run did
//! not send: resumed or reused; after `summon merge`, a shard's task counts from its shard's
//! start); `attempts`, how many times it ran (a step's `retries`); `retries`, the provider
//! requests sent again after a transient failure, `rate_limited` those refused by a rate limit,
//! `retry_wait_ms` the time waited before them; `waits` (only when there were some), each wait
//! with no request on the wire — before a retry, or for a provider still starting — as
//! `[from, ms]`, `from` counted like `started_ms`, so a timeline does not count it in flight; `tools`, the tools called (name, success, the
//! first line of the answer, shortened); `prompt`, the rendered first message sent to the model
//! (at most 16 KiB, then `… [N more bytes]`); `overhead_tokens`, the estimated tokens of its
//! first request beyond its own instructions, context, prompt and role text, and
//! `tool_tokens`, the tool definitions among them (`null` for a task that sent no request in
//! this run; see `crate::event::Overhead`); `warnings`, an agent's listed tools left out
//! and what went wrong with the task's extensions (MCP servers), one string each, such as
//! `` extension `fs` did not start: ... `` (whether that fails the task is the step's
//! `on_extension_error`); `data`, the parsed answer of a task validated against a JSON schema
//! (`null` for a text answer); `cache_read_tokens`
//! and `cache_write_tokens`, the part of `input_tokens` the provider read from or wrote to its
//! prompt cache. Lines are buffered and flushed at least every
//! [`FLUSH_INTERVAL`] (by a small background thread), every [`FLUSH_LINES`] lines, on
//! [`ResultsWriter::flush`] and on drop, so a crash loses at most the last moments; the run's
//! journal holds every finished task, and on resume [`read_results`] tells which of them the
//! file already has, so that it ends up with every task exactly once.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

/// The file name inside the `--out` directory.
pub(crate) const RESULTS_FILE: &str = "results.jsonl";
/// The longest a finished task's line waits in the buffer.
pub(crate) const FLUSH_INTERVAL: Duration = Duration::from_millis(200);
/// Lines written between forced flushes, whatever the time.
pub(crate) const FLUSH_LINES: usize = 256;

/// One finished task, borrowed from the runner's state: serialized straight into the buffer.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct ResultLine<'a> {
    pub(crate) step: &'a str,
    /// The item's position in the step's items (0 for one-task steps).
    pub(crate) index: u64,
    pub(crate) item: &'a Value,
    /// `completed`, `failed` or `skipped`.
    pub(crate) status: &'a str,
    pub(crate) output: &'a str,
    pub(crate) error: Option<&'a str>,
    /// The error's cause, as the end of a run groups failures (`provider: rate_limited`,
    /// `timeout`, ...); `null` for a task that did not fail.
    pub(crate) error_class: Option<&'a str>,
    pub(crate) turns: u32,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) duration_ms: u64,
    pub(crate) resumed: bool,
    /// Answered by an earlier run (`--reuse`).
    pub(crate) reused: bool,
    /// The structured answer was taken from a fenced block or the text around it.
    pub(crate) extracted: bool,
    /// Answers sent back to the model for correction (they did not validate).
    pub(crate) corrections: u32,
    /// Start time, attempts, retries, tools and prompt (keys `started_ms` … `prompt`).
    #[serde(flatten)]
    pub(crate) trace: &'a crate::event::TaskTrace,
    /// What went wrong with the task's extensions, one line each.
    pub(crate) warnings: &'a [String],
    /// The parsed answer of a schema-validated task; `None` (`null`) for a text answer.
    pub(crate) data: Option<&'a Value>,
    /// Input tokens read from / written to the provider's prompt cache (part of
    /// `input_tokens`).
    pub(crate) cache_read_tokens: u64,
    pub(crate) cache_write_tokens: u64,
    /// The agent role the task ran as (`null` for a recipe or ad-hoc task).
    pub(crate) role: Option<&'a str>,
}

struct State {
    out: BufWriter<File>,
    /// Lines in the buffer since the last flush.
    pending: usize,
    /// The first write error of the background flusher, handed to the next caller.
    error: Option<io::Error>,
}

/// Appends [`ResultLine`]s to `DIR/results.jsonl`. Cheap per task: one short mutex hold and a
/// `serde_json::to_writer` into a buffer. Shareable (`&self` methods).
pub(crate) struct ResultsWriter {
    path: std::path::PathBuf,
    state: Arc<Mutex<State>>,
    stop: Option<mpsc::Sender<()>>,
    flusher: Option<JoinHandle<()>>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ResultsWriter {
    /// Creates `dir` if needed and opens `dir/results.jsonl`: truncated, or with `append` (for
    /// `--resume`) kept as it is — except a torn last line (a crash mid-write), which is cut off.
    pub(crate) fn create(dir: &Path, append: bool) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(RESULTS_FILE);
        // Never through a link planted at its name (a model's command, a cloned repository).
        let mut file = crate::safe_fs::open_no_follow(
            OpenOptions::new()
                .create(true)
                .write(true)
                .read(true)
                .truncate(!append),
            &path,
        )?;
        if append {
            cut_torn_line(&mut file)?;
            file.seek(SeekFrom::End(0))?;
        }
        let state = Arc::new(Mutex::new(State {
            out: BufWriter::with_capacity(64 * 1024, file),
            pending: 0,
            error: None,
        }));
        let (stop, stopped) = mpsc::channel::<()>();
        let shared = Arc::clone(&state);
        let flusher = std::thread::Builder::new()
            .name("summon-results-flush".to_owned())
            .spawn(move || {
                loop {
                    match stopped.recv_timeout(FLUSH_INTERVAL) {
                        Err(RecvTimeoutError::Timeout) => {}
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                    }
                    let mut state = lock(&shared);
                    if state.pending > 0 {
                        state.pending = 0;
                        if let Err(e) = state.out.flush() {
                            state.error.get_or_insert(e);
                        }
                    }
                }
            })?;
        Ok(Self {
            path,
            state,
            stop: Some(stop),
            flusher: Some(flusher),
        })
    }

    /// The file written.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one line.
    pub(crate) fn write(&self, line: &ResultLine<'_>) -> io::Result<()> {
        let mut state = lock(&self.state);
        if let Some(e) = state.error.take() {
            return Err(e);
        }
        serde_json::to_writer(&mut state.out, line).map_err(io::Error::from)?;
        state.out.write_all(b"\n")?;
        state.pending += 1;
        if state.pending >= FLUSH_LINES {
            state.pending = 0;
            state.out.flush()?;
        }
        Ok(())
    }

    /// Writes the buffer out to the file.
    pub(crate) fn flush(&self) -> io::Result<()> {
        let mut state = lock(&self.state);
        if let Some(e) = state.error.take() {
            return Err(e);
        }
        state.pending = 0;
        state.out.flush()
    }
}

impl Drop for ResultsWriter {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.join();
        }
        let _ = lock(&self.state).out.flush();
    }
}

/// Truncates `file` after its last `\n`, dropping a partial line left by a crash.
fn cut_torn_line(file: &mut File) -> io::Result<()> {
    let len = file.seek(SeekFrom::End(0))?;
    if len == 0 {
        return Ok(());
    }
    let mut keep = len;
    let mut buf = [0u8; 4096];
    loop {
        let start = keep.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(keep - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(chunk)?;
        if let Some(pos) = chunk.iter().rposition(|&b| b == b'\n') {
            keep = start + pos as u64 + 1;
            break;
        }
        if start == 0 {
            keep = 0;
            break;
        }
        keep = start;
    }
    if keep != len {
        file.set_len(keep)?;
    }
    Ok(())
}

/// The `(step, index)` of every task already in `dir/results.jsonl` (none when the file does
/// not exist). Unreadable lines — a torn last line — are skipped.
pub(crate) fn read_results(dir: &Path) -> io::Result<HashSet<(String, u64)>> {
    #[derive(serde::Deserialize)]
    struct Key {
        step: String,
        index: u64,
    }
    let file = match File::open(dir.join(RESULTS_FILE)) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(HashSet::new()),
        Err(e) => return Err(e),
    };
    let mut reader = BufReader::new(file);
    let mut seen = HashSet::new();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        if let Ok(key) = serde_json::from_slice::<Key>(&buf) {
            seen.insert((key.step, key.index));
        }
    }
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    static TRACE: std::sync::LazyLock<crate::event::TaskTrace> =
        std::sync::LazyLock::new(|| crate::event::TaskTrace {
            started_ms: Some(7),
            attempts: 1,
            retries: 2,
            rate_limited: 1,
            retry_wait_ms: 1500,
            tools: Vec::new(),
            prompt: None,
            overhead_tokens: Some(50),
            tool_tokens: Some(0),
            ..crate::event::TaskTrace::default()
        });

    fn line<'a>(step: &'a str, index: u64, item: &'a Value, resumed: bool) -> ResultLine<'a> {
        ResultLine {
            step,
            index,
            item,
            status: if index.is_multiple_of(2) {
                "completed"
            } else {
                "failed"
            },
            output: "out \"quoted\"\nline",
            error: (index % 2 == 1).then_some("boom"),
            error_class: (index % 2 == 1).then_some("timeout"),
            turns: 2,
            input_tokens: 100 + index,
            output_tokens: 10,
            duration_ms: 1234,
            resumed,
            reused: false,
            extracted: true,
            corrections: 1,
            trace: &TRACE,
            warnings: &[],
            role: None,
            data: None,
            cache_read_tokens: 60,
            cache_write_tokens: 0,
        }
    }

    fn lines(dir: &Path) -> Vec<Value> {
        std::fs::read_to_string(dir.join(RESULTS_FILE))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn round_trip_keys_and_values() {
        let dir = tempfile::tempdir().unwrap();
        let item = json!({"area": "api", "n": 1});
        {
            let writer = ResultsWriter::create(&dir.path().join("out"), false).unwrap();
            writer.write(&line("notes", 0, &item, false)).unwrap();
            writer.write(&line("notes", 1, &json!("x"), false)).unwrap();
        }
        let got = lines(&dir.path().join("out"));
        assert_eq!(got.len(), 2);
        let keys: Vec<&String> = got[0].as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "step",
                "index",
                "item",
                "status",
                "output",
                "error",
                "error_class",
                "turns",
                "input_tokens",
                "output_tokens",
                "duration_ms",
                "resumed",
                "reused",
                "extracted",
                "corrections",
                "started_ms",
                "attempts",
                "retries",
                "rate_limited",
                "retry_wait_ms",
                "tools",
                "prompt",
                "overhead_tokens",
                "tool_tokens",
                "warnings",
                "data",
                "cache_read_tokens",
                "cache_write_tokens",
                "role"
            ]
        );
        assert_eq!(
            got[0],
            json!({"step": "notes", "index": 0, "item": {"area": "api", "n": 1},
                   "status": "completed", "output": "out \"quoted\"\nline", "error": null,
                   "error_class": null, "turns": 2, "input_tokens": 100, "output_tokens": 10, "duration_ms": 1234,
                   "resumed": false, "reused": false, "extracted": true, "corrections": 1,
                   "started_ms": 7, "attempts": 1, "retries": 2, "rate_limited": 1,
                   "retry_wait_ms": 1500, "tools": [], "prompt": null,
                   "overhead_tokens": 50, "tool_tokens": 0, "warnings": [], "data": null,
                   "cache_read_tokens": 60, "cache_write_tokens": 0, "role": null})
        );
        assert_eq!(got[1]["status"], "failed");
        assert_eq!(got[1]["error"], "boom");
        let seen = read_results(&dir.path().join("out")).unwrap();
        assert_eq!(
            seen,
            HashSet::from([("notes".to_owned(), 0), ("notes".to_owned(), 1)])
        );
    }

    #[test]
    fn append_keeps_lines_and_cuts_a_torn_one() {
        let dir = tempfile::tempdir().unwrap();
        let item = json!("a");
        {
            let writer = ResultsWriter::create(dir.path(), false).unwrap();
            writer.write(&line("s", 0, &item, false)).unwrap();
        }
        // A crash in the middle of a line.
        let mut file = OpenOptions::new()
            .append(true)
            .open(dir.path().join(RESULTS_FILE))
            .unwrap();
        file.write_all(b"{\"step\":\"s\",\"ind").unwrap();
        drop(file);
        assert_eq!(read_results(dir.path()).unwrap().len(), 1);
        {
            let writer = ResultsWriter::create(dir.path(), true).unwrap();
            writer.write(&line("s", 1, &item, true)).unwrap();
        }
        let got = lines(dir.path());
        assert_eq!(got.len(), 2);
        assert_eq!(got[1]["resumed"], true);
        // Without append the file starts over.
        drop(ResultsWriter::create(dir.path(), false).unwrap());
        assert!(read_results(dir.path()).unwrap().is_empty());
    }

    #[test]
    fn torn_line_without_any_newline_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(RESULTS_FILE), "x".repeat(10_000)).unwrap();
        drop(ResultsWriter::create(dir.path(), true).unwrap());
        assert_eq!(
            std::fs::read(dir.path().join(RESULTS_FILE)).unwrap().len(),
            0
        );
    }

    #[test]
    fn missing_file_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_results(dir.path()).unwrap().is_empty());
    }

    #[test]
    fn lines_reach_the_file_within_the_flush_interval() {
        let dir = tempfile::tempdir().unwrap();
        let writer = ResultsWriter::create(dir.path(), false).unwrap();
        let item = json!(1);
        writer.write(&line("s", 0, &item, false)).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while read_results(dir.path()).unwrap().is_empty() {
            assert!(std::time::Instant::now() < deadline, "never flushed");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Without waiting: every full batch is flushed at once.
        let more = 2 * FLUSH_LINES as u64;
        for i in 1..=more {
            writer.write(&line("s", i, &item, false)).unwrap();
        }
        assert!(read_results(dir.path()).unwrap().len() > FLUSH_LINES);
        writer.flush().unwrap();
        assert_eq!(read_results(dir.path()).unwrap().len() as u64, more + 1);
    }
}
