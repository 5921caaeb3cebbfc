//! `--junit FILE`: one `<testsuite>` per step, one `<testcase>` per task, written by hand.
//!
//! ```xml
//! <?xml version="1.0" encoding="UTF-8"?>
//! <testsuites name="PIPELINE" tests="3" failures="1" errors="0" skipped="1" time="0.500">
//!   <testsuite name="notes" tests="3" failures="1" errors="0" skipped="1" time="0.500">
//!     <testcase name="notes: api" classname="notes" time="0.300"/>
//!     <testcase name="notes: cli" classname="notes" time="0.200">
//!       <failure message="first line of the error" type="failure">the whole error</failure>
//!     </testcase>
//!     <testcase name="notes: docs" classname="notes" time="0.000"><skipped/></testcase>
//!   </testsuite>
//! </testsuites>
//! ```
//!
//! A suite whose tasks read from or wrote to the provider's prompt cache carries
//! `<properties>` with `cache_read_tokens` and `cache_write_tokens` before its cases; under a
//! spend cap every suite has `run_spent_usd` and `run_max_cost_usd` there too.
//!
//! A case is named `STEP: LABEL` (the caller's label for the item, cut at [`LABEL_MAX`]
//! characters), or `STEP` alone for an empty label. Cases are listed in item order (a
//! step's cases after a gap in its items, or recorded twice, last); `time` is the task's duration in seconds, a suite's the sum of its tasks'.
//! Everything is escaped; characters XML 1.0 cannot carry (control characters other than tab
//! and line breaks) become U+FFFD.
//!
//! [`JunitWriter`] renders each case's XML the moment its task is recorded (a failure's error
//! text cut at [`ERROR_MAX`] bytes). A case that comes in item order goes straight to its
//! step's spill (an unnamed file, with [`JunitWriter::spilling`]); one that finishes early
//! waits in a small map for those before it, as a table's rows do, so memory does not grow with
//! the number of cases. The file is written at the end: the counts, then each step's cases.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use indexmap::IndexMap;

/// The longest item label in a case name, in characters.
pub(crate) const LABEL_MAX: usize = 80;
/// The longest error text kept for a failed case, in bytes.
pub(crate) const ERROR_MAX: usize = 4096;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Status {
    Passed,
    Failed,
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "only the tests add skipped tasks yet")
    )]
    Skipped,
}

/// Where a step's cases go, in item order.
enum Spill {
    Memory(Vec<u8>),
    File(BufWriter<File>),
}

impl Spill {
    fn append(&mut self, xml: &[u8]) -> io::Result<()> {
        match self {
            Self::Memory(bytes) => {
                bytes.extend_from_slice(xml);
                Ok(())
            }
            Self::File(file) => file.write_all(xml),
        }
    }

    /// Copies everything appended so far to `out`.
    fn copy_to(&mut self, out: &mut impl Write) -> io::Result<()> {
        match self {
            Self::Memory(bytes) => out.write_all(bytes),
            Self::File(file) => {
                file.flush()?;
                let file = file.get_mut();
                let end = file.stream_position()?;
                file.seek(SeekFrom::Start(0))?;
                io::copy(&mut Read::by_ref(file).take(end), out)?;
                file.seek(SeekFrom::Start(end))?;
                Ok(())
            }
        }
    }
}

struct Suite {
    /// The cases so far, in item order.
    spill: Spill,
    /// The item index the spill waits for.
    next: u64,
    /// Cases that finished before some case ahead of them (and any recorded twice), by item
    /// index and arrival.
    early: BTreeMap<(u64, u64), Box<[u8]>>,
    arrived: u64,
    tests: u64,
    failures: u64,
    skipped: u64,
    time_ms: u64,
    /// Input tokens read from / written to the provider's prompt cache.
    cache_read: u64,
    cache_write: u64,
}

/// Collects test cases as tasks finish; [`JunitWriter::write`] writes the file at the end.
pub(crate) struct JunitWriter {
    /// The `<testsuites>` name: the pipeline's.
    name: String,
    suites: IndexMap<String, Suite>,
    /// Where the steps' spill files go (`None`: in memory).
    spill_dir: Option<PathBuf>,
    /// The first error of a spill file, reported by [`JunitWriter::write`].
    error: Option<io::Error>,
    /// A case's XML, reused.
    buffer: Vec<u8>,
    /// The run's spend and its cap (USD), when it has one.
    budget: Option<(f64, f64)>,
}

impl JunitWriter {
    /// An empty report named `name` (the pipeline's name), its cases held in memory.
    pub(crate) fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            suites: IndexMap::new(),
            spill_dir: None,
            error: None,
            buffer: Vec::new(),
            budget: None,
        }
    }

    /// An empty report whose cases go to unnamed files in `spill_dir`.
    pub(crate) fn spilling(name: impl Into<String>, spill_dir: &Path) -> Self {
        Self {
            spill_dir: Some(spill_dir.to_owned()),
            ..Self::new(name)
        }
    }

    /// The run's spend and its cap, shown in every suite's `<properties>`.
    pub(crate) fn set_budget(&mut self, spent: f64, cap: f64) {
        self.budget = Some((spent, cap));
    }

    /// Adds the finished task `index` of `step`: passed, or failed with `error`.
    pub(crate) fn add_case(
        &mut self,
        step: &str,
        index: u64,
        label: &str,
        ok: bool,
        duration: Duration,
        error: Option<&str>,
    ) {
        let status = if ok { Status::Passed } else { Status::Failed };
        self.push(step, index, label, status, duration, error);
    }

    /// Counts a task's prompt cache reads and writes in its step's `<properties>`.
    pub(crate) fn add_cache(&mut self, step: &str, read: u64, write: u64) {
        let suite = self.suite(step);
        suite.cache_read += read;
        suite.cache_write += write;
    }

    /// Adds a task of `step` that was skipped.
    #[cfg(test)]
    pub(crate) fn add_skipped(&mut self, step: &str, index: u64, label: &str) {
        self.push(step, index, label, Status::Skipped, Duration::ZERO, None);
    }

    fn suite(&mut self, step: &str) -> &mut Suite {
        if !self.suites.contains_key(step) {
            let spill = match &self.spill_dir {
                None => Spill::Memory(Vec::new()),
                Some(dir) => {
                    match std::fs::create_dir_all(dir).and_then(|()| tempfile::tempfile_in(dir)) {
                        Ok(file) => Spill::File(BufWriter::with_capacity(64 * 1024, file)),
                        Err(e) => {
                            self.error.get_or_insert(e);
                            Spill::Memory(Vec::new())
                        }
                    }
                }
            };
            self.suites.insert(
                step.to_owned(),
                Suite {
                    spill,
                    next: 0,
                    early: BTreeMap::new(),
                    arrived: 0,
                    tests: 0,
                    failures: 0,
                    skipped: 0,
                    time_ms: 0,
                    cache_read: 0,
                    cache_write: 0,
                },
            );
        }
        &mut self.suites[step]
    }

    fn push(
        &mut self,
        step: &str,
        order: u64,
        label: &str,
        status: Status,
        duration: Duration,
        error: Option<&str>,
    ) {
        let time_ms = u32::try_from(duration.as_millis()).unwrap_or(u32::MAX);
        let mut xml = std::mem::take(&mut self.buffer);
        xml.clear();
        write_case(&mut xml, step, label, time_ms, status, error)
            .expect("writing to memory does not fail");
        let suite = self.suite(step);
        suite.tests += 1;
        match status {
            Status::Failed => suite.failures += 1,
            Status::Skipped => suite.skipped += 1,
            Status::Passed => {}
        }
        suite.time_ms += u64::from(time_ms);
        suite.arrived += 1;
        let mut result = Ok(());
        if order == suite.next {
            result = suite.spill.append(&xml);
            suite.next += 1;
            while let Some(entry) = suite.early.first_entry() {
                if entry.key().0 != suite.next {
                    break;
                }
                let xml = entry.remove();
                if result.is_ok() {
                    result = suite.spill.append(&xml);
                }
                suite.next += 1;
            }
        } else {
            suite
                .early
                .insert((order, suite.arrived), xml.as_slice().into());
        }
        if let Err(e) = result {
            self.error.get_or_insert(e);
        }
        self.buffer = xml;
    }

    /// Writes the XML to `path` (through a temporary file and a rename).
    pub(crate) fn write(&mut self, path: &Path) -> io::Result<()> {
        crate::safe_fs::refuse_link(path)?;
        crate::safe_fs::Dest::at(path)?.write_with(|file| {
            let mut out = BufWriter::with_capacity(64 * 1024, file);
            self.write_to(&mut out)?;
            out.flush()
        })
    }

    /// Writes the XML document.
    pub(crate) fn write_to(&mut self, out: &mut impl Write) -> io::Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let (mut tests, mut failures, mut skipped, mut time_ms) = (0u64, 0, 0, 0);
        for suite in self.suites.values() {
            tests += suite.tests;
            failures += suite.failures;
            skipped += suite.skipped;
            time_ms += suite.time_ms;
        }
        writeln!(out, r#"<?xml version="1.0" encoding="UTF-8"?>"#)?;
        write!(out, r#"<testsuites name=""#)?;
        escape(
            out,
            if self.name.is_empty() {
                "summon"
            } else {
                &self.name
            },
            true,
        )?;
        writeln!(
            out,
            r#"" tests="{tests}" failures="{failures}" errors="0" skipped="{skipped}" time="{}">"#,
            secs(time_ms)
        )?;
        for (id, suite) in &mut self.suites {
            write!(out, r#"  <testsuite name=""#)?;
            escape(out, id, true)?;
            writeln!(
                out,
                r#"" tests="{}" failures="{}" errors="0" skipped="{}" time="{}">"#,
                suite.tests,
                suite.failures,
                suite.skipped,
                secs(suite.time_ms)
            )?;
            let cached = suite.cache_read > 0 || suite.cache_write > 0;
            if cached || self.budget.is_some() {
                writeln!(out, "    <properties>")?;
                if cached {
                    writeln!(
                        out,
                        "      <property name=\"cache_read_tokens\" value=\"{}\"/>\n      \
                         <property name=\"cache_write_tokens\" value=\"{}\"/>",
                        suite.cache_read, suite.cache_write
                    )?;
                }
                if let Some((spent, cap)) = self.budget {
                    writeln!(
                        out,
                        "      <property name=\"run_spent_usd\" value=\"{spent:.6}\"/>\n      \
                         <property name=\"run_max_cost_usd\" value=\"{cap}\"/>"
                    )?;
                }
                writeln!(out, "    </properties>")?;
            }
            // The cases in item order, then those after a gap (or recorded twice) in theirs.
            suite.spill.copy_to(out)?;
            for xml in suite.early.values() {
                out.write_all(xml)?;
            }
            writeln!(out, "  </testsuite>")?;
        }
        writeln!(out, "</testsuites>")?;
        out.flush()
    }
}

/// One `<testcase>`: `STEP: LABEL` (or `STEP`), its time, and a failure with its error.
fn write_case(
    out: &mut Vec<u8>,
    step: &str,
    label: &str,
    time_ms: u32,
    status: Status,
    error: Option<&str>,
) -> io::Result<()> {
    let mut name = String::new();
    push_name(&mut name, step, label);
    write!(out, r#"    <testcase name=""#)?;
    escape(out, &name, true)?;
    write!(out, r#"" classname=""#)?;
    escape(out, step, true)?;
    write!(out, r#"" time="{}""#, secs(u64::from(time_ms)))?;
    match status {
        Status::Failed => {
            let error = cut(error.unwrap_or("failed"), ERROR_MAX);
            let first = error.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            write!(out, ">\n      <failure message=\"")?;
            escape(out, cut(first, 200), true)?;
            write!(out, "\" type=\"failure\">")?;
            escape(out, error, false)?;
            writeln!(out, "</failure>\n    </testcase>")?;
        }
        Status::Skipped => writeln!(out, "><skipped/></testcase>")?,
        Status::Passed => writeln!(out, "/>")?,
    }
    Ok(())
}

fn secs(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// `STEP: LABEL`, or `STEP` for an empty label.
fn push_name(names: &mut String, step: &str, label: &str) {
    names.push_str(step);
    let label = label.trim();
    if label.is_empty() {
        return;
    }
    names.push_str(": ");
    match label.char_indices().nth(LABEL_MAX) {
        None => names.push_str(label),
        Some((cut, _)) => {
            names.push_str(&label[..cut]);
            names.push('…');
        }
    }
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Writes `text` escaped for XML content, or (`attr`) for a double-quoted attribute value,
/// where line breaks and tabs are kept as character references.
fn escape(out: &mut impl Write, text: &str, attr: bool) -> io::Result<()> {
    let mut plain = 0;
    for (i, c) in text.char_indices() {
        let replacement = match c {
            '&' => "&amp;",
            '<' => "&lt;",
            '>' => "&gt;",
            '"' => "&quot;",
            '\'' => "&apos;",
            '\n' if attr => "&#10;",
            '\t' if attr => "&#9;",
            '\r' => "&#13;",
            '\n' | '\t' => continue,
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => "\u{fffd}",
            _ => continue,
        };
        out.write_all(&text.as_bytes()[plain..i])?;
        out.write_all(replacement.as_bytes())?;
        plain = i + c.len_utf8();
    }
    out.write_all(&text.as_bytes()[plain..])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small well-formedness check: one root element, tags nested and closed, attributes
    /// double-quoted, only known entities, no raw `<`, `&` or control characters in text.
    fn check_well_formed(xml: &str) -> Result<(), String> {
        let body = xml
            .strip_prefix(r#"<?xml version="1.0" encoding="UTF-8"?>"#)
            .ok_or("no declaration")?;
        let check_text = |text: &str| -> Result<(), String> {
            if let Some(c) = text
                .chars()
                .find(|&c| (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r'))
            {
                return Err(format!("control character {:?}", c));
            }
            let mut rest = text;
            while let Some(pos) = rest.find('&') {
                rest = &rest[pos + 1..];
                let end = rest.find(';').ok_or("unterminated entity")?;
                let entity = &rest[..end];
                let ok = matches!(entity, "amp" | "lt" | "gt" | "quot" | "apos")
                    || entity
                        .strip_prefix('#')
                        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
                if !ok {
                    return Err(format!("bad entity &{entity};"));
                }
            }
            if text.contains('>') {
                return Err("raw > in text".into());
            }
            Ok(())
        };
        let mut stack: Vec<&str> = Vec::new();
        let mut roots = 0;
        let mut rest = body;
        while !rest.is_empty() {
            let lt = rest.find('<').unwrap_or(rest.len());
            let text = &rest[..lt];
            if stack.is_empty() && !text.trim().is_empty() {
                return Err("text outside the root".into());
            }
            check_text(text)?;
            rest = &rest[lt..];
            if rest.is_empty() {
                break;
            }
            let gt = rest.find('>').ok_or("unterminated tag")?;
            let tag = &rest[1..gt];
            rest = &rest[gt + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                if stack.pop() != Some(name) {
                    return Err(format!("mismatched </{name}>"));
                }
                continue;
            }
            let (tag, empty) = match tag.strip_suffix('/') {
                Some(t) => (t, true),
                None => (tag, false),
            };
            let (name, mut attrs) = tag.split_once(' ').unwrap_or((tag, ""));
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric()) {
                return Err(format!("bad tag name {name:?}"));
            }
            while !attrs.trim().is_empty() {
                let (key, value) = attrs
                    .trim_start()
                    .split_once("=\"")
                    .ok_or("bad attribute")?;
                if !key.chars().all(|c| c.is_ascii_alphanumeric()) {
                    return Err(format!("bad attribute name {key:?}"));
                }
                let end = value.find('"').ok_or("unterminated attribute")?;
                let value_text = &value[..end];
                if value_text.contains('<') {
                    return Err("< in attribute".into());
                }
                check_text(value_text)?;
                attrs = &value[end + 1..];
            }
            if stack.is_empty() {
                roots += 1;
            }
            if !empty {
                stack.push(name);
            }
        }
        if !stack.is_empty() || roots != 1 {
            return Err(format!("unclosed {stack:?} or {roots} roots"));
        }
        Ok(())
    }

    fn render(junit: &mut JunitWriter) -> String {
        let mut out = Vec::new();
        junit.write_to(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn escapes_everything_and_stays_well_formed() {
        let mut junit = JunitWriter::new("release <notes> & more");
        let nasty = "a<b>&c\"d'e\u{1}\u{1b}[31m\r\nf\tg";
        junit.add_case(
            "st<ep>",
            0,
            r#"{"k":"<v>"}"#,
            true,
            Duration::from_millis(250),
            None,
        );
        junit.add_case(
            "st<ep>",
            1,
            nasty,
            false,
            Duration::from_millis(1500),
            Some(&format!("\n{nasty}\n]]> second line")),
        );
        junit.add_skipped("summary", 0, "");
        let xml = render(&mut junit);
        check_well_formed(&xml).unwrap_or_else(|e| panic!("{e}\n{xml}"));
        assert!(!xml.contains('\u{1}') && !xml.contains('\u{1b}'), "{xml}");
        assert!(xml.contains(
            r#"<testsuites name="release &lt;notes&gt; &amp; more" tests="3" failures="1" errors="0" skipped="1" time="1.750">"#
        ), "{xml}");
        assert!(xml.contains(
            r#"<testsuite name="st&lt;ep&gt;" tests="2" failures="1" errors="0" skipped="0" time="1.750">"#
        ));
        assert!(xml.contains(
            r#"<testcase name="st&lt;ep&gt;: {&quot;k&quot;:&quot;&lt;v&gt;&quot;}" classname="st&lt;ep&gt;" time="0.250"/>"#
        ), "{xml}");
        assert!(xml.contains(
            "name=\"st&lt;ep&gt;: a&lt;b&gt;&amp;c&quot;d&apos;e\u{fffd}\u{fffd}[31m&#13;&#10;f&#9;g\""
        ), "{xml}");
        assert!(xml.contains(
            "<failure message=\"a&lt;b&gt;&amp;c&quot;d&apos;e\u{fffd}\u{fffd}[31m\" type=\"failure\">"
        ), "{xml}");
        assert!(xml.contains("]]&gt; second line</failure>"), "{xml}");
        assert!(xml.contains(
            r#"<testcase name="summary" classname="summary" time="0.000"><skipped/></testcase>"#
        ));
    }

    #[test]
    fn checker_rejects_broken_xml() {
        let decl = r#"<?xml version="1.0" encoding="UTF-8"?>"#;
        for bad in [
            "<a><b></a>",
            "<a>x & y</a>",
            "<a x=\"1\"2\"/>",
            "<a>\u{1}</a>",
            "<a/><b/>",
        ] {
            assert!(check_well_formed(&format!("{decl}{bad}")).is_err(), "{bad}");
        }
    }

    #[test]
    fn long_labels_and_errors_are_cut() {
        let mut junit = JunitWriter::new("");
        let long = "é".repeat(200);
        junit.add_case(
            "s",
            0,
            &long,
            false,
            Duration::from_secs(2),
            Some(&"x".repeat(10_000)),
        );
        let xml = render(&mut junit);
        check_well_formed(&xml).unwrap();
        assert!(xml.contains(r#"<testsuites name="summon" "#), "{xml}");
        let label = format!("s: {}…", "é".repeat(LABEL_MAX));
        assert!(xml.contains(&format!(r#"name="{label}""#)), "{xml}");
        assert!(xml.contains(&format!(">{}</failure>", "x".repeat(ERROR_MAX))));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reports/junit.xml");
        junit.write(&path).unwrap();
        check_well_formed(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1
        );
    }

    #[test]
    fn spilled_cases_come_out_in_item_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut junit = JunitWriter::spilling("p", dir.path());
        let ms = Duration::from_millis(1);
        for index in [2, 0, 7, 1, 3] {
            junit.add_case(
                "s",
                index,
                &format!("i{index}"),
                index != 3,
                ms,
                Some("bad"),
            );
        }
        junit.add_case("t", 0, "t0", true, ms, None);
        let xml = render(&mut junit);
        check_well_formed(&xml).unwrap_or_else(|e| panic!("{e}\n{xml}"));
        let names: Vec<&str> = xml
            .split("<testcase name=\"")
            .skip(1)
            .map(|c| c.split('"').next().unwrap())
            .collect();
        assert_eq!(
            names,
            ["s: i0", "s: i1", "s: i2", "s: i3", "s: i7", "t: t0"]
        );
        assert!(
            xml.contains(
                r#"<testsuite name="s" tests="5" failures="1" errors="0" skipped="0" time="0.005">"#
            ),
            "{xml}"
        );
        // Written again, the same document: the spill is read, not used up.
        assert_eq!(render(&mut junit), xml);
    }
}
