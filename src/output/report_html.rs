//! `--out DIR/report.html`: one self-contained page (inline CSS and script, no network, works
//! from `file://` and as a CI artifact) built from `report.json` and `results.jsonl` alone, so
//! that `summon report DIR` can build it again for any output directory.
//!
//! The page ([`PAGE`]) draws the pipeline graph with each step's counts, a timeline of tasks
//! per step, tokens and cost per step, and a table of every task, filterable by step and status
//! (also from the URL: `report.html#status=failed&step=notes&q=text`), searchable, failed first,
//! each row opening to its prompt, tools and output. The data is JSON in
//! `<script type="application/json">` elements: `{"report": <report.json>, "tasks_total": N,
//! "tasks_held": M}` in `#summon-data`, then the tasks, each `results.jsonl` line as it is, in
//! chunks of [`CHUNK`] (`script.summon-tasks`, each a JSON array), so that no one string in the
//! browser holds them all. The table renders a page of rows at a time.
//!
//! The writer streams: it reads `results.jsonl` line by line into the page's temporary file,
//! so its memory does not grow with the run. A page holds at most [`HELD`] (100,000 tasks,
//! 128 MiB of them): a bigger run's page holds every failed or skipped task, then the
//! first completed ones, and says so; its counts and graph are of every task (they come from
//! `report.json`), and `results.jsonl` beside it has every task.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use super::{REPORT_FILE, RESULTS_FILE};

/// The page's file name inside the `--out` directory.
pub(crate) const HTML_FILE: &str = "report.html";

/// The page, with [`DATA_MARK`] where the data goes.
const PAGE: &str = include_str!("report_page.html");
const DATA_MARK: &str = "__SUMMON_DATA__";

/// Tasks per `script.summon-tasks` element.
const CHUNK: usize = 5_000;
/// How much of the tasks a page holds.
#[derive(Clone, Copy)]
struct Held {
    tasks: u64,
    bytes: u64,
}

/// The most a page holds: 100,000 tasks (a browser opens that in seconds) and 128 MiB of them.
const HELD: Held = Held {
    tasks: 100_000,
    bytes: 128 * 1024 * 1024,
};

/// Why the page could not be built: the file at fault and what is wrong with it.
#[derive(Debug)]
pub(crate) struct HtmlError {
    pub(crate) path: PathBuf,
    pub(crate) message: String,
}

impl std::fmt::Display for HtmlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

/// Builds `dir/report.html` from `dir/report.json` and `dir/results.jsonl` and writes it
/// atomically (a temporary file and a rename); returns its path.
pub(crate) fn write_html(dir: &Path) -> Result<PathBuf, HtmlError> {
    let path = dir.join(HTML_FILE);
    let dest = crate::safe_fs::Dest::at(&path).map_err(|e| HtmlError {
        path: path.clone(),
        message: format!("cannot write: {e}"),
    })?;
    let mut failure = None;
    let written = dest.write_with(|file| {
        let mut out = BufWriter::with_capacity(256 * 1024, file);
        match write_page(dir, &mut out, HELD) {
            Ok(()) => out.flush(),
            Err(Problem::Input(e)) => {
                failure = Some(e);
                Err(io::Error::other("bad input"))
            }
            Err(Problem::Write(e)) => Err(e),
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    written.map_err(|e| HtmlError {
        path: path.clone(),
        message: format!("cannot write: {e}"),
    })?;
    Ok(path)
}

/// What stopped a page: a file it is made of, or writing it.
enum Problem {
    Input(HtmlError),
    Write(io::Error),
}

impl From<io::Error> for Problem {
    fn from(e: io::Error) -> Self {
        Self::Write(e)
    }
}

impl From<HtmlError> for Problem {
    fn from(e: HtmlError) -> Self {
        Self::Input(e)
    }
}

/// The page for the output directory `dir`, written to `out`.
fn write_page(dir: &Path, out: &mut impl Write, limit: Held) -> Result<(), Problem> {
    let report_path = dir.join(REPORT_FILE);
    let report = std::fs::read_to_string(&report_path).map_err(|e| HtmlError {
        path: report_path.clone(),
        message: read_problem(&e),
    })?;
    let report: serde_json::Value = serde_json::from_str(&report).map_err(|e| HtmlError {
        path: report_path.clone(),
        message: format!("not a summon report ({e})"),
    })?;
    if !report.is_object() || report.get("total").is_none() {
        return Err(HtmlError {
            path: report_path,
            message: "not a summon report (no `total`)".to_owned(),
        }
        .into());
    }
    let results = Results {
        path: dir.join(RESULTS_FILE),
    };
    let (head, tail) = PAGE
        .split_once(DATA_MARK)
        .expect("the page has a data mark");
    // The file's lines and bytes bound the tasks it holds: when they fit, one pass reads,
    // checks and writes every line (a bad line stops the page, whose temporary file is then
    // removed); else a first pass counts the tasks exactly.
    let (lines, size) = results.bounds()?;
    let fits = lines <= limit.tasks && size < limit.bytes;
    let mut total = 0u64;
    let mut bytes = 0u64;
    if !fits {
        results.each(|line, _| {
            total += 1;
            bytes += line.len() as u64 + 1;
            Ok(())
        })?;
    }
    out.write_all(head.as_bytes())?;
    let mut chunks = Chunks {
        out,
        limit,
        in_chunk: 0,
        held: 0,
        bytes: 0,
    };
    if fits || (total <= limit.tasks && bytes <= limit.bytes) {
        results.each(|line, _| chunks.push(line))?;
        total = chunks.held;
    } else {
        // Failed and skipped tasks first, then completed ones, while the page has room.
        results.each(|line, completed| {
            if !completed && chunks.has_room(line) {
                chunks.push(line)?;
            }
            Ok(())
        })?;
        results.each(|line, completed| {
            if completed && chunks.has_room(line) {
                chunks.push(line)?;
            }
            Ok(())
        })?;
    }
    let held = chunks.finish()?;
    // The summary goes after the tasks it counts; the page's script comes after both.
    let data = serde_json::json!({
        "report": report,
        "tasks_total": total,
        "tasks_held": held,
    });
    out.write_all(b"<script type=\"application/json\" id=\"summon-data\">")?;
    write_script_safe(out, data.to_string().as_bytes())?;
    out.write_all(b"</script>")?;
    out.write_all(tail.as_bytes())?;
    Ok(())
}

/// The tasks written as `script.summon-tasks` elements of [`CHUNK`] lines each.
struct Chunks<'a, W: Write> {
    out: &'a mut W,
    limit: Held,
    in_chunk: usize,
    held: u64,
    bytes: u64,
}

impl<W: Write> Chunks<'_, W> {
    fn has_room(&self, line: &str) -> bool {
        self.held < self.limit.tasks && self.bytes + (line.len() as u64) < self.limit.bytes
    }

    fn push(&mut self, line: &str) -> Result<(), Problem> {
        if self.in_chunk == 0 {
            self.out
                .write_all(b"<script type=\"application/json\" class=\"summon-tasks\">[")?;
        } else {
            self.out.write_all(b",")?;
        }
        write_script_safe(self.out, line.as_bytes())?;
        self.in_chunk += 1;
        self.held += 1;
        self.bytes += line.len() as u64 + 1;
        if self.in_chunk == CHUNK {
            self.out.write_all(b"]</script>\n")?;
            self.in_chunk = 0;
        }
        Ok(())
    }

    /// Closes the last chunk; the number of tasks held.
    fn finish(self) -> Result<u64, Problem> {
        if self.in_chunk > 0 {
            self.out.write_all(b"]</script>\n")?;
        }
        Ok(self.held)
    }
}

/// `missing` for a file that is not there, else the error.
fn read_problem(e: &io::Error) -> String {
    if e.kind() == io::ErrorKind::NotFound {
        "missing: not a `summon run --out` directory, or the run has not ended".to_owned()
    } else {
        format!("cannot read: {e}")
    }
}

/// `results.jsonl`, read a line at a time.
struct Results {
    path: PathBuf,
}

/// Of a line, only whether its task completed.
#[derive(serde::Deserialize)]
struct LineStatus<'a> {
    #[serde(borrow, default)]
    status: Option<StatusText<'a>>,
}

/// A line's `status`: its text, or any other JSON value.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum StatusText<'a> {
    Text(#[serde(borrow)] std::borrow::Cow<'a, str>),
    Other(serde::de::IgnoredAny),
}

impl Results {
    /// At most how many tasks and bytes of them the file holds: its lines (a last one
    /// without its newline counted too) and its size.
    fn bounds(&self) -> Result<(u64, u64), Problem> {
        let error = |message: String| HtmlError {
            path: self.path.clone(),
            message,
        };
        let mut file = File::open(&self.path).map_err(|e| error(read_problem(&e)))?;
        let mut block = vec![0u8; 256 * 1024];
        let (mut lines, mut size) = (0u64, 0u64);
        let mut last = b'\n';
        loop {
            let read = match io::Read::read(&mut file, &mut block) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(error(format!("cannot read: {e}")).into()),
            };
            lines += memchr::memchr_iter(b'\n', &block[..read]).count() as u64;
            size += read as u64;
            last = block[read - 1];
        }
        Ok((lines + u64::from(last != b'\n'), size))
    }

    /// Calls `each` with every line of the file (checked to be a JSON object) and whether its
    /// task completed. A torn last line (a crash mid-write) is left out; any other bad line is
    /// an error naming its line.
    fn each(&self, mut each: impl FnMut(&str, bool) -> Result<(), Problem>) -> Result<(), Problem> {
        let error = |message: String| HtmlError {
            path: self.path.clone(),
            message,
        };
        let file = File::open(&self.path).map_err(|e| error(read_problem(&e)))?;
        let mut reader = BufReader::with_capacity(256 * 1024, file);
        let mut line = String::new();
        let mut number = 0usize;
        loop {
            line.clear();
            let read = reader
                .read_line(&mut line)
                .map_err(|e| error(format!("cannot read: {e}")))?;
            if read == 0 {
                return Ok(());
            }
            number += 1;
            let complete = line.ends_with('\n');
            let text = line.trim();
            if text.is_empty() {
                continue;
            }
            if !text.starts_with('{') {
                return match serde_json::from_str::<serde::de::IgnoredAny>(text) {
                    Err(_) if !complete => Ok(()),
                    Err(e) => Err(error(format!("line {number}: not a JSON line ({e})")).into()),
                    Ok(_) => Err(error(format!("line {number}: not a JSON object")).into()),
                };
            }
            let completed = match serde_json::from_str::<LineStatus<'_>>(text) {
                Ok(line) => matches!(line.status, Some(StatusText::Text(s)) if s == "completed"),
                Err(_) if !complete => return Ok(()),
                Err(e) => {
                    return Err(error(format!("line {number}: not a JSON line ({e})")).into());
                }
            };
            each(text, completed)?;
        }
    }
}

/// Writes JSON text so that it cannot end the `<script>` element it sits in: every `<`
/// (which JSON has only inside strings) becomes `\u003c`, so `</script>` and `<!--` never
/// appear.
fn write_script_safe(out: &mut impl Write, json: &[u8]) -> io::Result<()> {
    let mut rest = json;
    while let Some(at) = memchr::memchr(b'<', rest) {
        out.write_all(&rest[..at])?;
        out.write_all(b"\\u003c")?;
        rest = &rest[at + 1..];
    }
    out.write_all(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(report: &str, results: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(REPORT_FILE), report).unwrap();
        std::fs::write(dir.path().join(RESULTS_FILE), results).unwrap();
        dir
    }

    fn build_page(dir: &Path) -> Result<String, HtmlError> {
        build_held(dir, HELD)
    }

    fn build_held(dir: &Path, limit: Held) -> Result<String, HtmlError> {
        let mut page = Vec::new();
        match write_page(dir, &mut page, limit) {
            Ok(()) => Ok(String::from_utf8(page).unwrap()),
            Err(Problem::Input(e)) => Err(e),
            Err(Problem::Write(e)) => panic!("{e}"),
        }
    }

    /// The data a page holds: its summary, with `tasks` gathered from its chunks.
    fn embedded(page: &str) -> serde_json::Value {
        let script = |from: usize| {
            let start = from + page[from..].find('>').unwrap() + 1;
            let end = start + page[start..].find("</script>").unwrap();
            serde_json::from_str::<serde_json::Value>(&page[start..end]).unwrap()
        };
        let mut data = script(page.find("id=\"summon-data\"").unwrap());
        let mut tasks = Vec::new();
        for (at, _) in page.match_indices("class=\"summon-tasks\"") {
            let chunk = script(at);
            tasks.extend(chunk.as_array().unwrap().iter().cloned());
        }
        data["tasks"] = serde_json::Value::Array(tasks);
        data
    }

    #[test]
    fn script_end_inside_data_is_escaped_and_data_round_trips() {
        let output = "</script><script>alert(1)</script><!--";
        let line = serde_json::json!({"step": "s", "index": 0, "output": output}).to_string();
        let dir = dir_with(r#"{"total": {"tasks": 1}}"#, &format!("{line}\n"));
        let page = build_page(dir.path()).unwrap();
        assert_eq!(
            page.matches("</script>").count(),
            3,
            "only the page's own: its script, the summary and one chunk"
        );
        assert!(!page.contains("<!--"));
        let data = embedded(&page);
        assert_eq!(data["tasks"][0]["output"], output);
        assert_eq!(data["report"]["total"]["tasks"], 1);
    }

    #[test]
    fn a_torn_last_line_is_left_out_and_a_bad_line_is_named() {
        let dir = dir_with(
            r#"{"total": {}}"#,
            "{\"step\":\"a\",\"index\":0}\n\n{\"step\":\"a\",\"index\":1}\n{\"step\":\"a\",\"ind",
        );
        let data = embedded(&build_page(dir.path()).unwrap());
        assert_eq!(data["tasks"].as_array().unwrap().len(), 2);

        let dir = dir_with(r#"{"total": {}}"#, "{\"step\":\"a\"}\nnot json\n{}\n");
        let e = build_page(dir.path()).unwrap_err();
        assert!(e.path.ends_with(RESULTS_FILE), "{e}");
        assert!(e.message.starts_with("line 2: not a JSON line"), "{e}");
    }

    #[test]
    fn tasks_come_in_chunks_and_a_big_run_holds_failures_first() {
        let mut lines = String::new();
        for i in 0..12_000 {
            let status = if i % 1000 == 999 {
                "failed"
            } else {
                "completed"
            };
            lines.push_str(&format!(
                "{{\"step\":\"a\",\"index\":{i},\"status\":\"{status}\"}}\n"
            ));
        }
        let dir = dir_with(r#"{"total": {"tasks": 12000}}"#, &lines);
        let page = build_page(dir.path()).unwrap();
        assert_eq!(page.matches("class=\"summon-tasks\"").count(), 3);
        let data = embedded(&page);
        assert_eq!(data["tasks"].as_array().unwrap().len(), 12_000);
        assert_eq!(
            (data["tasks_total"].clone(), data["tasks_held"].clone()),
            (12_000.into(), 12_000.into())
        );

        // Room for 100: the 12 failed tasks, then the first 88 completed ones.
        let limit = Held {
            tasks: 100,
            bytes: u64::MAX,
        };
        let data = embedded(&build_held(dir.path(), limit).unwrap());
        let held = data["tasks"].as_array().unwrap();
        assert_eq!(held.len(), 100);
        assert!(held[..12].iter().all(|t| t["status"] == "failed"));
        assert_eq!(held[12]["index"], 0);
        assert_eq!(held[99]["index"], 87);
        assert_eq!(
            (data["tasks_total"].clone(), data["tasks_held"].clone()),
            (12_000.into(), 100.into())
        );
        // And by bytes: each line is about 50 bytes.
        let limit = Held {
            tasks: u64::MAX,
            bytes: 1000,
        };
        let data = embedded(&build_held(dir.path(), limit).unwrap());
        let held = data["tasks"].as_array().unwrap().len();
        assert!((12..25).contains(&held), "{held}");
    }

    #[test]
    fn a_page_read_in_one_pass_is_the_page_the_counting_pass_writes() {
        // Blank lines and a torn last line: the file's bounds (6 lines) are above the tasks
        // it holds (3), so a limit of 3 tasks takes the counting pass and holds them all.
        let lines = "{\"step\":\"a\",\"index\":0,\"output\":\"</script>\"}\n\n\
                     {\"step\":\"a\",\"index\":1}\n\n{\"step\":\"a\",\"index\":2}\n{\"st";
        let dir = dir_with(r#"{"total": {"tasks": 3}}"#, lines);
        let one_pass = build_page(dir.path()).unwrap();
        let counted = build_held(
            dir.path(),
            Held {
                tasks: 3,
                bytes: u64::MAX,
            },
        )
        .unwrap();
        assert_eq!(one_pass, counted);
        let data = embedded(&one_pass);
        assert_eq!(data["tasks"].as_array().unwrap().len(), 3);
        assert_eq!(
            (data["tasks_total"].clone(), data["tasks_held"].clone()),
            (3.into(), 3.into())
        );
        assert_eq!(data["tasks"][0]["output"], "</script>");
    }

    #[test]
    fn a_bad_line_writes_no_page() {
        let dir = dir_with(r#"{"total": {}}"#, "{}\n[1]\n");
        std::fs::write(dir.path().join(HTML_FILE), "old").unwrap();
        let e = write_html(dir.path()).unwrap_err();
        assert_eq!(e.message, "line 2: not a JSON object");
        assert_eq!(
            std::fs::read_to_string(dir.path().join(HTML_FILE)).unwrap(),
            "old"
        );
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            3,
            "no temporary file left"
        );
    }

    #[test]
    fn missing_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = build_page(dir.path()).unwrap_err();
        assert!(e.path.ends_with(REPORT_FILE), "{e}");
        assert!(e.message.starts_with("missing"), "{e}");
        std::fs::write(dir.path().join(REPORT_FILE), "[]").unwrap();
        let e = build_page(dir.path()).unwrap_err();
        assert!(e.message.contains("not a summon report"), "{e}");
        std::fs::write(dir.path().join(REPORT_FILE), r#"{"total": {}}"#).unwrap();
        let e = build_page(dir.path()).unwrap_err();
        assert!(e.path.ends_with(RESULTS_FILE), "{e}");
    }

    #[test]
    fn the_page_is_self_contained() {
        let dir = dir_with(r#"{"total": {}}"#, "");
        let page = build_page(dir.path())
            .unwrap()
            .replace("\"http://www.w3.org/2000/svg\"", "");
        for remote in ["http://", "https://", "src=", "@import", "url("] {
            assert!(!page.contains(remote), "the page loads nothing: {remote}");
        }
        assert!(!page.contains(DATA_MARK));
    }
}
