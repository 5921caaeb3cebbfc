//! Tables out: an `outputs` entry with `rows` (a fan_out step) and `columns` writes one row per
//! item, in item order, as CSV (read back with Python's `csv` module) or JSONL; failed items
//! appear with their status and error unless `only: completed`; the table is written again by
//! `--resume` and by `summon merge`, is never half-written, and `validate` checks it.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

fn openai(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
}

/// The text of item `i`: commas, quotes and a line break in every field.
fn item_text(i: usize) -> String {
    format!("note {i}, with \"quotes\"\nand a second line")
}

fn category(id: &str) -> String {
    format!("cat-{id}, \"q\"\nline two")
}

/// `items.jsonl` with `n` items `{id, text}`.
fn items(n: usize) -> String {
    (0..n)
        .map(|i| json!({"id": i, "text": item_text(i)}).to_string() + "\n")
        .collect()
}

/// Classifies `Classify: <id>` with a category holding commas, quotes and a line break; the
/// ids in `fail` are refused.
fn classifier(fail: &'static [&'static str]) -> MockConfig {
    MockConfig::new().rule(move |request| {
        let text = request.last_user_text().unwrap_or_default();
        let id = text.strip_prefix("Classify: ").unwrap_or("?").to_owned();
        if fail.contains(&id.as_str()) {
            return Reply::status(400, r#"{"error":{"message":"refused, item bad"}}"#);
        }
        Reply::text(json!({"category": category(&id)}).to_string())
    })
}

fn pipeline(extra_step: &str, outputs: &str) -> String {
    format!(
        "version: 1
name: tables
settings: {{concurrency: 16}}
steps:
  - id: notes
    decompose:
      file: items.jsonl
  - id: labels
    fan_out:
      over: notes
      instructions: 'Classify: {{{{ item.id }}}}'
      schema:
        type: object
        additionalProperties: false
        required: [category]
        properties:
          category: {{ type: string }}
{extra_step}
outputs:{outputs}
"
    )
}

const CSV_OUTPUT: &str = "
  - path: out/labels.csv
    rows: labels
    columns:
      id: '{{ item.id }}'
      text: '{{ item.text }}'
      category: '{{ data.category }}'
      status: '{{ status }}'
      error: '{{ error or \"\" }}'";

/// The records of a CSV file as Python's `csv` module reads them.
fn python_csv(path: &Path) -> Vec<Vec<String>> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import csv, json, sys\n\
             with open(sys.argv[1], newline='') as f:\n    print(json.dumps(list(csv.reader(f))))",
        ])
        .arg(path)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON from python")
}

fn row(i: usize, status: &str, error: &str) -> Vec<String> {
    let category = if status == "completed" {
        category(&i.to_string())
    } else {
        String::new()
    };
    vec![
        i.to_string(),
        item_text(i),
        category,
        status.to_owned(),
        error.to_owned(),
    ]
}

fn header() -> Vec<String> {
    ["id", "text", "category", "status", "error"]
        .map(str::to_owned)
        .to_vec()
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_rows_with_commas_quotes_and_newlines_read_back_identically() {
    let n = 10_000;
    let server = MockServer::start(classifier(&[])).await;
    let out = openai(&server)
        .write_raw("items.jsonl", &items(n))
        .write("p.yaml", &pipeline("", CSV_OUTPUT))
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let records = python_csv(&out.dir.join("out/labels.csv"));
    assert_eq!(records.len(), n + 1);
    assert_eq!(records[0], header());
    for (i, record) in records[1..].iter().enumerate() {
        assert_eq!(record, &row(i, "completed", ""), "row {i}");
    }
    // Nothing but the table is left in its folder.
    let names: Vec<String> = std::fs::read_dir(out.dir.join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["labels.csv"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn jsonl_has_one_object_per_row_with_the_columns_in_order() {
    let server = MockServer::start(classifier(&[])).await;
    let outputs = "
  - path: out/labels.jsonl
    rows: labels
    columns:
      text: '{{ item.text }}'
      category: '{{ data.category }}'
      id: '{{ item.id }}'";
    let out = openai(&server)
        .write_raw("items.jsonl", &items(30))
        .write("p.yaml", &pipeline("", outputs))
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let text = std::fs::read_to_string(out.dir.join("out/labels.jsonl")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 30);
    for (i, line) in lines.iter().enumerate() {
        let value: Value = serde_json::from_str(line).unwrap();
        let keys: Vec<&String> = value.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["text", "category", "id"], "{line}");
        assert_eq!(
            value,
            json!({"text": item_text(i), "category": category(&i.to_string()), "id": i.to_string()})
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_items_appear_with_their_error_unless_only_completed() {
    let server = MockServer::start(classifier(&["3", "7"])).await;
    let outputs = format!(
        "{CSV_OUTPUT}
  - path: out/ok.csv
    rows: labels
    only: completed
    columns:
      id: '{{{{ item.id }}}}'
      status: '{{{{ status }}}}'"
    );
    let out = openai(&server)
        .write_raw("items.jsonl", &items(10))
        .write("p.yaml", &pipeline("    on_error: continue", &outputs))
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let all = python_csv(&out.dir.join("out/labels.csv"));
    assert_eq!(all.len(), 11);
    for (i, record) in all[1..].iter().enumerate() {
        if i == 3 || i == 7 {
            assert_eq!(record[..4], row(i, "failed", "")[..4], "row {i}");
            assert!(
                record[4].contains("refused, item bad"),
                "row {i}: {record:?}"
            );
        } else {
            assert_eq!(record, &row(i, "completed", ""), "row {i}");
        }
    }
    let ok = python_csv(&out.dir.join("out/ok.csv"));
    let ids: Vec<&str> = ok[1..].iter().map(|r| r[0].as_str()).collect();
    assert_eq!(ids, ["0", "1", "2", "4", "5", "6", "8", "9"]);
    assert!(ok[1..].iter().all(|r| r[1] == "completed"));
}

#[tokio::test(flavor = "multi_thread")]
async fn resume_writes_the_table_again_with_the_journaled_rows() {
    // The first run fails at item 4 (nothing is written); the resumed run takes the other
    // rows from the journal and asks only for what did not finish.
    let refused = Arc::new(AtomicBool::new(false));
    let once = Arc::clone(&refused);
    let server = MockServer::start(MockConfig::new().rule(move |request| {
        let text = request.last_user_text().unwrap_or_default();
        let id = text.strip_prefix("Classify: ").unwrap_or("?").to_owned();
        if id == "4" && !once.swap(true, Ordering::SeqCst) {
            return Reply::status(400, r#"{"error":{"message":"no"}}"#);
        }
        Reply::text(json!({"category": category(&id)}).to_string())
    }))
    .await;
    let t = openai(&server)
        .write_raw("items.jsonl", &items(12))
        .write("p.yaml", &pipeline("    concurrency: 1", CSV_OUTPUT));
    let first = t
        .command()
        .args(["run", "p.yaml", "--quiet"])
        .output()
        .unwrap();
    assert_eq!(first.status.code(), Some(2));
    assert!(!t.path().join("out/labels.csv").exists());
    assert!(
        !t.path().join("out").exists()
            || std::fs::read_dir(t.path().join("out")).unwrap().count() == 0,
        "nothing half-written"
    );
    let asked_first = server.requests().len();
    let second = t
        .command()
        .args(["run", "p.yaml", "--quiet", "--resume"])
        .output()
        .unwrap();
    assert_eq!(
        second.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    // Items 0–3 came from the journal.
    assert_eq!(asked_first + 12 - 4, server.requests().len());
    let records = python_csv(&t.path().join("out/labels.csv"));
    assert_eq!(records[0], header());
    assert_eq!(records.len(), 13);
    for (i, record) in records[1..].iter().enumerate() {
        assert_eq!(record, &row(i, "completed", ""), "row {i}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_merge_writes_the_table_of_every_shard() {
    let server = MockServer::start(classifier(&[])).await;
    let n = 40;
    let t = openai(&server)
        .write_raw("items.jsonl", &items(n))
        .write("p.yaml", &pipeline("", CSV_OUTPUT));
    for i in 1..=2 {
        let shard = t
            .command()
            .args([
                "run",
                "p.yaml",
                "--shard",
                &format!("{i}/2"),
                "--out",
                &format!("s{i}"),
                "--quiet",
            ])
            .output()
            .unwrap();
        assert_eq!(
            shard.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&shard.stderr)
        );
        assert!(
            !t.path().join("out/labels.csv").exists(),
            "a shard writes no table"
        );
    }
    let merged = t
        .command()
        .args(["merge", "p.yaml", "s1", "s2", "--quiet"])
        .output()
        .unwrap();
    assert_eq!(
        merged.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&merged.stderr)
    );
    assert_eq!(
        support::chat_count(&server) as usize,
        n,
        "the merge asks nothing again"
    );
    let records = python_csv(&t.path().join("out/labels.csv"));
    assert_eq!(records.len(), n + 1);
    for (i, record) in records[1..].iter().enumerate() {
        assert_eq!(record, &row(i, "completed", ""), "row {i}");
    }
}

/// `summon validate` of a pipeline with these outputs: its stderr, expecting exit 1.
fn invalid(outputs: &str) -> String {
    let out = Test::new()
        .write("items.jsonl", "{}\n")
        .write("p.yaml", &pipeline("", outputs))
        .args(["validate", "p.yaml"])
        .code(1)
        .run();
    out.stderr
}

#[test]
fn validate_checks_rows_columns_extension_and_form_at_their_line() {
    // The outputs start at line 19 of the file (`outputs:` is line 18).
    let unknown = invalid(
        "
  - path: out/a.csv
    rows: lables
    columns: {id: '{{ item.id }}'}",
    );
    assert!(unknown.contains("unknown step `lables`"), "{unknown}");
    assert!(unknown.contains("p.yaml:21:11"), "{unknown}");
    assert!(unknown.contains("did you mean `labels`?"), "{unknown}");

    let not_fan_out = invalid(
        "
  - path: out/a.csv
    rows: notes
    columns: {id: '{{ item.id }}'}",
    );
    assert!(
        not_fan_out.contains("`rows: notes` names a decompose step"),
        "{not_fan_out}"
    );
    assert!(not_fan_out.contains("p.yaml:21:11"), "{not_fan_out}");
    assert!(
        not_fan_out.contains("the fan_out steps are `labels`"),
        "{not_fan_out}"
    );

    let column = invalid(
        "
  - path: out/a.csv
    rows: labels
    columns:
      id: '{{ item.id }}'
      cat: '{{ dta.category }}'",
    );
    assert!(
        column.contains("undefined variable `dta` in a table column"),
        "{column}"
    );
    assert!(column.contains("p.yaml:24:16"), "{column}");
    assert!(column.contains("did you mean `data`?"), "{column}");

    let extension = invalid(
        "
  - path: out/a.txt
    rows: labels
    columns: {id: '{{ item.id }}'}",
    );
    assert!(
        extension.contains("a table's path must end with `.csv` or `.jsonl`"),
        "{extension}"
    );
    assert!(extension.contains("p.yaml:20:11"), "{extension}");

    let both = invalid(
        "
  - path: out/a.csv
    content: x
    rows: labels
    columns: {id: '{{ item.id }}'}",
    );
    assert!(both.contains("has both `content` and `rows`"), "{both}");
    assert!(both.contains("p.yaml:22:11"), "{both}");
}

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_checks_a_table_too() {
    let server = MockServer::start(classifier(&[])).await;
    let out = openai(&server)
        .write_raw("items.jsonl", &items(3))
        .write(
            "p.yaml",
            &pipeline(
                "",
                "
  - path: out/a.csv
    rows: lables
    columns: {id: '{{ item.id }}'}",
            ),
        )
        .args(["run", "p.yaml", "--dry-run"])
        .code(1)
        .run();
    assert!(
        out.stderr.contains("unknown step `lables`"),
        "{}",
        out.stderr
    );
    assert!(server.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_column_that_fails_to_render_writes_nothing() {
    let server = MockServer::start(classifier(&[])).await;
    let outputs = "
  - path: out/labels.csv
    rows: labels
    columns:
      id: '{{ item.id }}'
      bad: '{{ item.id | no_such_filter }}'";
    let out = openai(&server)
        .write_raw("items.jsonl", &items(5))
        .write("p.yaml", &pipeline("", outputs))
        .args(["run", "p.yaml", "--quiet"])
        .code(1)
        .run();
    assert!(out.stderr.contains("line 24"), "{}", out.stderr);
    assert!(out.stderr.contains("no_such_filter"), "{}", out.stderr);
    let left: Vec<_> = std::fs::read_dir(out.dir.join("out"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "nothing half-written: {left:?}");
}

/// Cells a spreadsheet would run as formulas, and cells it would not.
const FORMULAS: [(&str, &str); 10] = [
    (
        "=HYPERLINK(\"http://evil.example/\",\"x\")",
        "'=HYPERLINK(\"http://evil.example/\",\"x\")",
    ),
    ("+1+cmd|' /C calc'!A0", "'+1+cmd|' /C calc'!A0"),
    ("-2+3", "'-2+3"),
    ("@SUM(A1:A2)", "'@SUM(A1:A2)"),
    ("\t=1", "'\t=1"),
    ("\r=1", "'\r=1"),
    ("-5", "-5"),
    ("+3.25", "+3.25"),
    ("plain = text", "plain = text"),
    ("", ""),
];

fn formula_server() -> MockConfig {
    MockConfig::new().rule(|request| {
        let text = request.last_user_text().unwrap_or_default();
        let i: usize = text
            .strip_prefix("Classify: ")
            .unwrap_or("0")
            .parse()
            .unwrap_or(0);
        Reply::text(json!({"category": FORMULAS[i].0}).to_string())
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn csv_cells_that_start_a_formula_are_neutralised_unless_kept() {
    let server = MockServer::start(formula_server()).await;
    let outputs = "
  - path: out/safe.csv
    rows: labels
    columns:
      '=name': '{{ data.category }}'
  - path: out/raw.csv
    rows: labels
    keep_formulas: true
    columns:
      category: '{{ data.category }}'
  - path: out/rows.jsonl
    rows: labels
    columns:
      category: '{{ data.category }}'";
    let out = openai(&server)
        .write_raw("items.jsonl", &items(FORMULAS.len()))
        .write("p.yaml", &pipeline("", outputs))
        .args(["run", "p.yaml", "--quiet"])
        .run();
    let safe = python_csv(&out.dir.join("out/safe.csv"));
    assert_eq!(safe[0], ["=name"], "the author's header is kept");
    let raw = python_csv(&out.dir.join("out/raw.csv"));
    let jsonl = std::fs::read_to_string(out.dir.join("out/rows.jsonl")).unwrap();
    for (i, (cell, neutral)) in FORMULAS.iter().enumerate() {
        assert_eq!(safe[i + 1], [*neutral], "row {i}");
        assert_eq!(raw[i + 1], [*cell], "row {i} kept raw");
        let line: Value = serde_json::from_str(jsonl.lines().nth(i).unwrap()).unwrap();
        assert_eq!(line["category"], *cell, "JSONL is data, unchanged");
    }
}
