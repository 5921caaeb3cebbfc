//! `--out DIR/report.html`: one self-contained page (inline CSS and script, no network, works
//! from `file://` and as a CI artifact) built from `report.json` and `results.jsonl` alone, so
//! that `summon report DIR` can build it again for any output directory.
//!
//! The page ([`PAGE`]) draws the pipeline graph with each step's counts, a timeline of tasks
//! per step, tokens and cost per step, and a table of every task, filterable by step and status
//! (also from the URL: `report.html#status=failed&step=notes&q=text`), searchable, failed first,
//! each row opening to its prompt, tools and output. The data is one JSON document in a
//! `<script type="application/json">` element, `{"report": <report.json>, "tasks": [<each
//! results.jsonl line>]}`, so the file is about the size of the two files together; the table
//! renders a page of rows at a time, so that 100,000 tasks load in a few seconds.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};

use super::{REPORT_FILE, RESULTS_FILE, write_atomically};

/// The page's file name inside the `--out` directory.
pub(crate) const HTML_FILE: &str = "report.html";

/// The page, with [`DATA_MARK`] where the data goes.
const PAGE: &str = include_str!("report_page.html");
const DATA_MARK: &str = "__SUMMON_DATA__";

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
/// atomically; returns its path.
pub(crate) fn write_html(dir: &Path) -> Result<PathBuf, HtmlError> {
    let page = build_page(dir)?;
    let path = dir.join(HTML_FILE);
    write_atomically(&path, page.as_bytes()).map_err(|e| HtmlError {
        path: path.clone(),
        message: format!("cannot write: {e}"),
    })?;
    Ok(path)
}

/// The page for the output directory `dir`.
fn build_page(dir: &Path) -> Result<String, HtmlError> {
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
        });
    }
    let results_path = dir.join(RESULTS_FILE);
    let mut data = String::from("{\"report\":");
    data.push_str(&report.to_string());
    data.push_str(",\"tasks\":[");
    append_results(&results_path, &mut data)?;
    data.push_str("]}");
    let (head, tail) = PAGE
        .split_once(DATA_MARK)
        .expect("the page has a data mark");
    let mut page = String::with_capacity(head.len() + data.len() + tail.len() + 64);
    page.push_str(head);
    push_script_safe(&mut page, &data);
    page.push_str(tail);
    Ok(page)
}

/// `missing` for a file that is not there, else the error.
fn read_problem(e: &io::Error) -> String {
    if e.kind() == io::ErrorKind::NotFound {
        "missing: not a `summon run --out` directory, or the run has not ended".to_owned()
    } else {
        format!("cannot read: {e}")
    }
}

/// Appends each line of `results.jsonl` to `out`, comma-separated, as it is (checked to be a
/// JSON object). A torn last line (a crash mid-write) is left out; any other bad line is an
/// error naming its line.
fn append_results(path: &Path, out: &mut String) -> Result<(), HtmlError> {
    let error = |message: String| HtmlError {
        path: path.to_path_buf(),
        message,
    };
    let file = File::open(path).map_err(|e| error(read_problem(&e)))?;
    let mut reader = BufReader::with_capacity(256 * 1024, file);
    let mut line = String::new();
    let mut number = 0usize;
    let mut first = true;
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
        match serde_json::from_str::<serde::de::IgnoredAny>(text) {
            Ok(_) if text.starts_with('{') => {}
            Ok(_) => return Err(error(format!("line {number}: not a JSON object"))),
            Err(_) if !complete => return Ok(()),
            Err(e) => return Err(error(format!("line {number}: not a JSON line ({e})"))),
        }
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(text);
    }
}

/// Appends JSON text so that it cannot end the `<script>` element it sits in: every `<`
/// (which JSON has only inside strings) becomes `\u003c`, so `</script>` and `<!--` never
/// appear.
fn push_script_safe(out: &mut String, json: &str) {
    let mut rest = json;
    while let Some(at) = rest.find('<') {
        out.push_str(&rest[..at]);
        out.push_str("\\u003c");
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
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

    /// The data document embedded in a page.
    fn embedded(page: &str) -> serde_json::Value {
        let start = page.find("id=\"summon-data\">").unwrap() + "id=\"summon-data\">".len();
        let end = start + page[start..].find("</script>").unwrap();
        serde_json::from_str(&page[start..end]).unwrap()
    }

    #[test]
    fn script_end_inside_data_is_escaped_and_data_round_trips() {
        let output = "</script><script>alert(1)</script><!--";
        let line = serde_json::json!({"step": "s", "index": 0, "output": output}).to_string();
        let dir = dir_with(r#"{"total": {"tasks": 1}}"#, &format!("{line}\n"));
        let page = build_page(dir.path()).unwrap();
        assert_eq!(
            page.matches("</script>").count(),
            2,
            "only the page's own two"
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
