//! Table `outputs` (docs/pipelines.md, outputs): one row per task of a fan_out step, in item
//! order, as CSV (with a header, quoted by the `csv` crate) or JSONL (one object per row, its
//! columns in order).
//!
//! Rows are streamed: each task is rendered into its row the moment it is recorded, a row
//! that comes in item order goes straight to an unnamed spill file, and one that finishes
//! early waits in a small map for those before it (tasks start in item order, so the map
//! stays about as large as the concurrency). Memory does not grow with the number of rows.
//! When the run succeeds, the spill file is copied to a temporary file beside the table's
//! path and renamed over it, so a table is written whole or not at all. A resumed run or a
//! merge records every task again (from the journal or the shards) and writes the table
//! again.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::Path;

use minijinja::Environment;

use crate::error::{Error, Result};
use crate::event::TaskDone;
use crate::pipeline::model::{OutputBody, Pipeline, Table, TableFormat, Template};

/// Every table of a pipeline's `outputs`, by the entry's position.
pub(crate) struct Tables {
    entries: Vec<Option<TableRows>>,
}

/// The rows of one table so far.
struct TableRows {
    step: usize,
    table: Table,
    /// The column templates, named by their position.
    env: Environment<'static>,
    /// Per column, the variable it is when it is nothing else (`{{ item.id }}`).
    direct: Vec<Option<Direct>>,
    /// The item index the file waits for.
    next: u64,
    /// Rows of tasks that finished before some task ahead of them (`None`: left out).
    early: BTreeMap<u64, Option<Vec<u8>>>,
    file: BufWriter<File>,
    error: Option<Error>,
}

impl Tables {
    /// One spill file per table, in `spill_dir`.
    pub(crate) fn new(pipeline: &Pipeline, spill_dir: &Path) -> io::Result<Self> {
        let mut entries = Vec::new();
        for output in &pipeline.outputs {
            let OutputBody::Table(table) = &output.body else {
                entries.push(None);
                continue;
            };
            let Some(step) = pipeline.steps.iter().position(|s| s.id == table.rows) else {
                entries.push(None);
                continue;
            };
            entries.push(Some(TableRows::new(pipeline, step, table, spill_dir)?));
        }
        Ok(Self { entries })
    }

    /// Adds a finished task to the tables whose rows are its step's tasks.
    pub(crate) fn push(&mut self, done: &TaskDone) {
        for rows in self.entries.iter_mut().flatten() {
            if rows.step == done.step {
                rows.push(done);
            }
        }
    }

    /// Writes the table of `outputs[index]` to `dest`, atomically.
    pub(crate) fn write(&mut self, index: usize, dest: &crate::safe_fs::Dest) -> Result<()> {
        let Some(rows) = self.entries.get_mut(index).and_then(Option::take) else {
            return Err(Error::internal("a table output without its rows"));
        };
        rows.write(dest)
    }
}

impl TableRows {
    fn new(pipeline: &Pipeline, step: usize, table: &Table, spill_dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(spill_dir)?;
        // A failed item has no data: `data.category` is empty rather than an error.
        let mut env = crate::template::lenient_environment(pipeline.file.path().parent());
        let mut error = None;
        for (i, (_, t)) in table.columns.iter().enumerate() {
            if let Err(e) = env.add_template_owned(i.to_string(), t.text.clone()) {
                error.get_or_insert_with(|| Error::usage(t.render_error(&e)));
            }
        }
        let direct = table
            .columns
            .iter()
            .map(|(_, t)| Direct::parse(&t.text))
            .collect();
        let mut rows = Self {
            step,
            table: table.clone(),
            env,
            direct,
            next: 0,
            early: BTreeMap::new(),
            file: BufWriter::with_capacity(64 * 1024, tempfile::tempfile_in(spill_dir)?),
            error,
        };
        if rows.table.format == TableFormat::Csv {
            let names: Vec<String> = rows.table.columns.iter().map(|(n, _)| n.clone()).collect();
            let header = rows.csv_line(&names);
            rows.append(&header);
        }
        Ok(rows)
    }

    fn push(&mut self, done: &TaskDone) {
        if self.error.is_some() {
            return;
        }
        let row = if self.table.only_completed && !done.ok {
            None
        } else {
            match self.render(done) {
                Ok(row) => Some(row),
                Err(e) => {
                    self.error = Some(e);
                    return;
                }
            }
        };
        let index = done.index;
        if index > self.next {
            self.early.insert(index, row);
            return;
        }
        // A task recorded twice (a merge's given tasks are never; kept for safety) is
        // written once, in its place.
        if index < self.next {
            return;
        }
        if let Some(row) = row {
            self.append(&row);
        }
        self.next += 1;
        while let Some(row) = self.early.remove(&self.next) {
            if let Some(row) = row {
                self.append(&row);
            }
            self.next += 1;
        }
    }

    /// One task's row, as the bytes of its line.
    fn render(&mut self, done: &TaskDone) -> Result<Vec<u8>> {
        // Made only for a column that is more than a variable holding text.
        let mut ctx = None;
        let mut values = Vec::with_capacity(self.table.columns.len());
        for (i, (_, t)) in self.table.columns.iter().enumerate() {
            if let Some(text) = self.direct[i].as_ref().and_then(|d| d.text(done)) {
                values.push(text.to_owned());
                continue;
            }
            let ctx = ctx.get_or_insert_with(|| context(done));
            values.push(render_column(&self.env, i, t, ctx, done.index)?);
        }
        Ok(match self.table.format {
            TableFormat::Csv => {
                if !self.table.keep_formulas {
                    for value in &mut values {
                        neutralise_formula(value);
                    }
                }
                self.csv_line(&values)
            }
            TableFormat::Jsonl => {
                let mut object = serde_json::Map::new();
                for ((name, _), value) in self.table.columns.iter().zip(values) {
                    object.insert(name.clone(), serde_json::Value::String(value));
                }
                let mut line = serde_json::to_vec(&object).unwrap_or_default();
                line.push(b'\n');
                line
            }
        })
    }

    /// One CSV record, quoted as needed (commas, quotes, line breaks).
    fn csv_line<S: AsRef<[u8]>>(&mut self, fields: &[S]) -> Vec<u8> {
        // The writer's own buffer is 8 KiB (zeroed) by default: a row's few hundred bytes are
        // enough, and it flushes into the line when they are not.
        let mut writer = csv::WriterBuilder::new()
            .buffer_capacity(256)
            .from_writer(Vec::with_capacity(128));
        let line = writer
            .write_record(fields)
            .map_err(io::Error::other)
            .and_then(|()| writer.into_inner().map_err(|e| e.into_error()));
        match line {
            Ok(line) => line,
            Err(e) => {
                self.error.get_or_insert(Error::from(e));
                Vec::new()
            }
        }
    }

    fn append(&mut self, bytes: &[u8]) {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self.file.write_all(bytes) {
            self.error = Some(e.into());
        }
    }

    /// Copies the rows to a temporary file beside `path`, then renames it over `path`.
    fn write(mut self, dest: &crate::safe_fs::Dest) -> Result<()> {
        // Rows still waiting for a task that never finished follow in item order.
        for row in std::mem::take(&mut self.early).into_values().flatten() {
            self.append(&row);
        }
        if let Some(error) = self.error {
            return Err(error);
        }
        let mut spill = self
            .file
            .into_inner()
            .map_err(io::IntoInnerError::into_error)?;
        spill.seek(SeekFrom::Start(0))?;
        dest.write_with(|file| io::copy(&mut spill, file).map(drop))?;
        Ok(())
    }
}

/// A CSV cell a spreadsheet would take for a formula (it starts with `=`, `+`, `-`, `@`, a tab
/// or a carriage return) gets a leading `'`, so it is shown as text (OWASP's advice against
/// CSV injection); a plain number (`-5`, `+3.25`) is left as it is.
fn neutralise_formula(cell: &mut String) {
    let risky = cell.starts_with(['=', '+', '-', '@', '\t', '\r']);
    if risky && !is_plain_number(cell) {
        cell.insert(0, '\'');
    }
}

/// `-5`, `+3.25`: a sign, digits, at most one `.` between digits.
fn is_plain_number(cell: &str) -> bool {
    let digits = cell.strip_prefix(['+', '-']).unwrap_or(cell);
    let mut parts = digits.splitn(2, '.');
    let whole = parts.next().unwrap_or_default();
    let fraction = parts.next();
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    all_digits(whole) && fraction.is_none_or(all_digits)
}

/// What a column's template sees of a task.
fn context(done: &TaskDone) -> minijinja::Value {
    minijinja::context! {
        item => minijinja::Value::from(minijinja::value::Serde(&done.item)),
        data => done.structured.as_ref().map(|d| minijinja::Value::from(minijinja::value::Serde(d))),
        output => done.output.as_str(),
        status => if done.ok { "completed" } else { "failed" },
        error => done.error_message(),
    }
}

/// A column whose whole template is one variable, `{{ item.id }}` or `{{ status }}`: read
/// straight from the task instead of rendered, when what it names is text (which the
/// template would print unchanged); anything else goes through the template.
#[derive(Debug, Clone, PartialEq)]
enum Direct {
    Item(Vec<String>),
    Data(Vec<String>),
    Output,
    Status,
    Error,
}

impl Direct {
    fn parse(text: &str) -> Option<Self> {
        let inner = text.strip_prefix("{{")?.strip_suffix("}}")?;
        if inner.starts_with(['-', '+']) || inner.ends_with(['-', '+']) {
            return None;
        }
        let mut parts = inner.trim().split('.');
        let root = parts.next()?;
        let path: Vec<String> = parts.map(str::to_owned).collect();
        let identifier = |s: &str| {
            s.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        if !identifier(root) || !path.iter().all(|p| identifier(p)) {
            return None;
        }
        match (root, path.is_empty()) {
            ("item", _) => Some(Self::Item(path)),
            ("data", _) => Some(Self::Data(path)),
            ("output", true) => Some(Self::Output),
            ("status", true) => Some(Self::Status),
            ("error", true) => Some(Self::Error),
            _ => None,
        }
    }

    /// The text the variable holds for `done`, when it holds text.
    fn text<'a>(&self, done: &'a TaskDone) -> Option<&'a str> {
        fn walk<'a>(value: &'a serde_json::Value, path: &[String]) -> Option<&'a str> {
            path.iter()
                .try_fold(value, |v, key| v.as_object()?.get(key))?
                .as_str()
        }
        match self {
            Self::Item(path) => walk(&done.item, path),
            Self::Data(path) => walk(done.structured.as_ref()?, path),
            Self::Output => Some(&done.output),
            Self::Status => Some(if done.ok { "completed" } else { "failed" }),
            Self::Error => done.error_message(),
        }
    }
}

fn render_column(
    env: &Environment<'static>,
    i: usize,
    t: &Template,
    ctx: &minijinja::Value,
    index: u64,
) -> Result<String> {
    let rendered = env
        .get_template(&i.to_string())
        .and_then(|template| template.render(ctx));
    rendered.map_err(|e| {
        Error::usage(format!(
            "{} (a table column, item {index})",
            t.render_error(&e)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What the column's template prints for `done`.
    fn rendered(text: &str, done: &TaskDone) -> String {
        let mut env = crate::template::lenient_environment(None);
        env.add_template_owned("c", text.to_owned())
            .expect("template");
        env.get_template("c")
            .and_then(|t| t.render(context(done)))
            .expect("render")
    }

    #[test]
    fn a_variable_column_reads_the_task_as_its_template_prints_it() {
        let ok = TaskDone {
            item: json!({"id": "7", "n": 3, "deep": {"name": "x, \"y\""}, "none": null}),
            ok: true,
            output: "an answer\nover two lines".into(),
            structured: Some(json!({"category": "bug", "score": 0.5, "tags": ["a"]})),
            ..TaskDone::default()
        };
        let failed = TaskDone {
            item: json!("plain item"),
            error: Some(crate::event::Failure::new(
                crate::event::FailureClass::Answer,
                "provider said no",
            )),
            ..TaskDone::default()
        };
        let columns = [
            "{{ item.id }}",
            "{{item.deep.name}}",
            "{{ item }}",
            "{{ item.n }}",
            "{{ item.none }}",
            "{{ item.missing }}",
            "{{ item.deep }}",
            "{{ data.category }}",
            "{{ data.score }}",
            "{{ data.tags }}",
            "{{ output }}",
            "{{ status }}",
            "{{ error }}",
        ];
        let mut direct = 0;
        for text in columns {
            let d = Direct::parse(text);
            for done in [&ok, &failed] {
                let want = rendered(text, done);
                if let Some(got) = d.as_ref().and_then(|d| d.text(done)) {
                    direct += 1;
                    assert_eq!(got, want, "{text}");
                }
            }
        }
        // Read directly: item.id, item.deep.name, data.category, output and status of the
        // first; item (a string), output, status and error of the second. The numbers, the
        // null, the missing key, the object and the list go through the template.
        assert_eq!(direct, 9);
    }

    #[test]
    fn only_a_lone_variable_is_read_directly() {
        assert_eq!(
            Direct::parse("{{ item.id }}"),
            Some(Direct::Item(vec!["id".into()]))
        );
        assert_eq!(Direct::parse("{{ status }}"), Some(Direct::Status));
        for text in [
            " {{ item.id }}",
            "{{ item.id }}\n",
            "{{- item.id }}",
            "{{ item.id | upper }}",
            "{{ item['id'] }}",
            "{{ item.id }}{{ status }}",
            "{{ output.x }}",
            "{{ steps.a }}",
            "id: {{ item.id }}",
            "{{ item.0 }}",
        ] {
            assert_eq!(Direct::parse(text), None, "{text}");
        }
    }
}
