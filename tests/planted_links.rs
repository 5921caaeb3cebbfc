//! Links planted where summon writes its own files: a model's commands (or a cloned
//! repository) can leave a symlink at `out/results.jsonl`, `report.json`, a table or a
//! background task's log, pointing at a file of the user's. summon refuses to write through
//! it, with an error naming the link, and the file it points at is left as it was.

use crate::support;

use std::path::Path;
use std::process::Output;

use serde_json::json;
use summon_mock_llm::{MockConfig, MockServer, Reply};
use support::Test;

fn project(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
}

const PIPELINE: &str = "version: 1
name: links
steps:
  - id: notes
    decompose:
      file: items.jsonl
  - id: echo
    fan_out:
      over: notes
      instructions: 'Echo {{ item.id }}'
outputs:
  - path: out/table.csv
    rows: echo
    columns:
      id: '{{ item.id }}'
";

fn items() -> String {
    (0..3)
        .map(|i| json!({"id": i}).to_string() + "\n")
        .collect()
}

/// A project with the pipeline and `victim.txt`, a file of the user's outside `out/`.
fn links_project(server: &MockServer) -> Test {
    project(server)
        .write_raw("items.jsonl", &items())
        .write("p.yaml", PIPELINE)
        .write_raw("victim.txt", "the user's file\n")
        .mkdir("out")
}

fn plant(dir: &Path, at: &str) {
    std::os::unix::fs::symlink(dir.join("victim.txt"), dir.join(at)).unwrap();
}

fn summon(t: &Test, args: &[&str]) -> Output {
    t.command().args(args).output().expect("run summon")
}

fn assert_refused(out: &Output, link: &str, dir: &Path) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(link) && stderr.contains("is a symbolic link"),
        "{link}: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.join("victim.txt")).unwrap(),
        "the user's file\n",
        "written through {link}"
    );
    assert!(
        std::fs::symlink_metadata(dir.join(link))
            .unwrap()
            .file_type()
            .is_symlink(),
        "{link} was replaced"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_link_at_any_file_of_out_is_refused() {
    let server = MockServer::start(MockConfig::new().rule(|_| Reply::text("ok"))).await;
    for link in [
        "out/results.jsonl",
        "out/report.json",
        "out/report.html",
        "out/junit.xml",
        "out/table.csv",
    ] {
        let t = links_project(&server);
        plant(t.path(), link);
        let out = summon(
            &t,
            &[
                "run",
                "p.yaml",
                "--out",
                "out",
                "--junit",
                "out/junit.xml",
                "--quiet",
            ],
        );
        assert_refused(&out, link, t.path());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn resume_refuses_a_link_at_results_jsonl() {
    let server = MockServer::start(MockConfig::new().rule(|_| Reply::text("ok"))).await;
    let t = links_project(&server);
    let first = summon(&t, &["run", "p.yaml", "--out", "out", "--quiet"]);
    assert_eq!(
        first.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let results = t.path().join("out/results.jsonl");
    std::fs::remove_file(&results).unwrap();
    plant(t.path(), "out/results.jsonl");
    let out = summon(
        &t,
        &["run", "p.yaml", "--out", "out", "--resume", "--quiet"],
    );
    assert_refused(&out, "out/results.jsonl", t.path());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_next_background_task_log_is_never_written_through_a_link() {
    let server = MockServer::start(MockConfig::new().rule(|_| Reply::text("done"))).await;
    let t = links_project(&server);
    let start = |what: &str| {
        let out = summon(
            &t,
            &["delegate", "--async", "--json", "--instructions", what],
        );
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_str(&stdout).expect(&stdout);
        json["task_id"].as_str().expect("task_id").to_owned()
    };
    let collect = |id: &str| {
        let out = summon(&t, &["load", id, "--timeout", "60"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let first = start("first");
    collect(&first);
    // The next id is the same day's next number.
    let (day, seq) = first.split_once('_').expect("DAY_SEQ");
    let next = format!("{day}_{}", seq.parse::<u64>().unwrap() + 1);
    let log = format!(".summon/tasks/{next}.log");
    plant(t.path(), &log);
    let second = start("second");
    assert_eq!(second, next);
    collect(&second);
    assert_eq!(
        std::fs::read_to_string(t.path().join("victim.txt")).unwrap(),
        "the user's file\n",
        "the worker's log went through the link"
    );
    let meta = std::fs::symlink_metadata(t.path().join(&log)).unwrap();
    assert!(meta.file_type().is_file(), "the log is a file of its own");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_output_path_that_leaves_the_project_is_refused() {
    let server = MockServer::start(MockConfig::new().rule(|_| Reply::text("ok"))).await;
    for chosen in [
        "../escape.txt",
        "{ABS}",
        "linked/escape.txt",
        "out/../../escape.txt",
    ] {
        let t = project(&server)
            .write_raw("items.jsonl", &items())
            .write_raw("victim.txt", "the user's file\n")
            .mkdir("work")
            .current_dir("work");
        let root = t.path().to_path_buf();
        std::os::unix::fs::symlink(&root, root.join("work/linked")).unwrap();
        let chosen = chosen.replace("{ABS}", &root.join("escape.txt").display().to_string());
        let pipeline = format!(
            "version: 1
name: chosen
steps:
  - id: notes
    decompose:
      items: ['{chosen}']
  - id: echo
    fan_out:
      over: notes
      instructions: 'Echo {{{{ item }}}}'
outputs:
  - path: '{{{{ steps.notes.items[0] }}}}'
    content: 'pwned'
"
        );
        std::fs::write(root.join("work/p.yaml"), pipeline).unwrap();
        let out = summon(&t, &["run", "p.yaml", "--quiet"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{chosen}: {stderr}");
        assert!(
            stderr.contains("outputs[0]") && stderr.contains("outside the project"),
            "{chosen}: {stderr}"
        );
        assert!(!root.join("escape.txt").exists(), "{chosen} was written");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn outside_project_lets_an_output_leave_and_validate_says_so() {
    let server = MockServer::start(MockConfig::new().rule(|_| Reply::text("ok"))).await;
    let t = project(&server).mkdir("work").current_dir("work");
    let root = t.path().to_path_buf();
    std::fs::write(
        root.join("work/p.yaml"),
        "version: 1
name: out
steps:
  - id: one
    delegate:
      instructions: 'hi'
outputs:
  - path: ../shared/notes.md
    content: '{{ steps.one.output }}'
    outside_project: true
",
    )
    .unwrap();
    let validate = summon(&t, &["validate", "p.yaml"]);
    let stderr = String::from_utf8_lossy(&validate.stderr).into_owned()
        + &String::from_utf8_lossy(&validate.stdout);
    assert!(
        stderr.contains("outside_project") && stderr.contains("outside the project"),
        "{stderr}"
    );
    let out = summon(&t, &["run", "p.yaml", "--quiet"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(root.join("shared/notes.md")).unwrap(),
        "ok\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn resume_takes_no_forged_out_or_junit_from_the_store() {
    let server = MockServer::start(MockConfig::new().rule(|_| Reply::text("ok"))).await;
    let elsewhere = tempfile::tempdir().unwrap();
    let outside = elsewhere.path().join("written-here");
    let outside = outside.to_str().unwrap();
    for (flag, forged, why) in [
        ("out", outside.to_owned(), "leaves the project"),
        (
            "junit",
            format!("{outside}/junit.xml"),
            "leaves the project",
        ),
        ("out", "../escaped".to_owned(), "leaves the project"),
        ("out", "linked/out".to_owned(), "goes through a link"),
    ] {
        let t = links_project(&server);
        std::os::unix::fs::symlink(elsewhere.path(), t.path().join("linked")).unwrap();
        let first = summon(&t, &["run", "p.yaml", "--out", "out", "--quiet"]);
        assert_eq!(
            first.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&first.stderr)
        );
        // Anything that can write the workspace can write the store.
        let db = rusqlite::Connection::open(t.path().join(".summon/state.db")).unwrap();
        let changed = db
            .execute(
                &format!("UPDATE runs SET options = json_set(options, '$.{flag}', ?1)"),
                [&forged],
            )
            .unwrap();
        assert_eq!(changed, 1);
        drop(db);
        let out = summon(&t, &["run", "p.yaml", "--resume", "--quiet"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{forged}: {stderr}");
        assert!(
            stderr.contains(&format!("recorded --{flag} {forged}, which {why}"))
                && stderr.contains(&format!("give --{flag} again")),
            "{forged}: {stderr}"
        );
        assert_eq!(
            std::fs::read_dir(elsewhere.path()).unwrap().count(),
            0,
            "{forged}: written outside the project"
        );
        assert!(!t.path().join("../escaped").exists());
    }
}

/// `decompose.file` is confined as `glob` is: an items file reached with `..`, or through a
/// link planted at its name (a model's commands can write the project) that leads to a file
/// of the user's, is refused naming the file, before any request; `summon validate` refuses
/// the `..` at its line; `outside_project: true` reads it.
#[tokio::test(flavor = "multi_thread")]
async fn an_items_file_outside_the_project_is_refused_as_glob_refuses_it() {
    let server = MockServer::start(MockConfig::new().default_reply(Reply::text("ok"))).await;
    let secret = tempfile::tempdir().unwrap();
    std::fs::write(
        secret.path().join("keys.jsonl"),
        "{\"id\": \"sk-secret-of-the-user\"}\n",
    )
    .unwrap();
    let t = project(&server)
        .write("p.yaml", PIPELINE)
        .mkdir("data")
        .write_raw("data/keep.jsonl", &items());
    std::os::unix::fs::symlink(
        secret.path().join("keys.jsonl"),
        t.path().join("items.jsonl"),
    )
    .unwrap();
    let out = summon(&t, &["run", "p.yaml"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("items file `items.jsonl` is outside the working directory")
            && stderr.contains("(through a symbolic link)")
            && stderr.contains("outside_project: true"),
        "{stderr}"
    );
    let out = summon(&t, &["run", "p.yaml", "--dry-run"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("(through a symbolic link)"));

    // `..` out of the project: refused at its line by validate, the dry run and the run.
    let climbing = PIPELINE.replace("file: items.jsonl", "file: ../keys.jsonl");
    let t = t.write("up.yaml", &climbing);
    for args in [
        &["validate", "up.yaml"][..],
        &["run", "up.yaml", "--dry-run"],
        &["run", "up.yaml"],
    ] {
        let out = summon(&t, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert!(
            stderr.contains("up.yaml:6:13")
                && stderr
                    .contains("items file `../keys.jsonl` climbs out of the working directory"),
            "{args:?}: {stderr}"
        );
    }
    assert_eq!(support::chat_count(&server), 0);
    assert!(
        !server
            .requests()
            .iter()
            .any(|r| r.body.to_string().contains("sk-secret-of-the-user"))
    );

    // The author's opt-out reads it, and a link that stays inside needs none.
    let opted = PIPELINE.replace(
        "file: items.jsonl",
        "file: items.jsonl\n      outside_project: true",
    );
    let t = t.write("opted.yaml", &opted);
    let out = summon(&t, &["validate", "opted.yaml"]);
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("the items file may be read outside the project")
    );
    let out = summon(&t, &["run", "opted.yaml"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(t.path().join("items.jsonl")).unwrap();
    std::os::unix::fs::symlink("data/keep.jsonl", t.path().join("items.jsonl")).unwrap();
    let out = summon(&t, &["run", "p.yaml"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
