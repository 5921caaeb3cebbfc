//! `summon run --shard I/N` and `summon merge` against a mock LLM server in this test process:
//! N shard processes running at once plus a merge give what one whole run gives (results,
//! report counts, stdout, outputs), every item is sent by exactly one shard, the Kubernetes
//! variables select the shard, `--until`/`--items-from` carry a model-made item list to
//! every shard, and bad input is refused before anything is sent or written.

use crate::support;
use crate::support::results;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use summon_mock_llm::{Api, MockConfig, MockServer, Reply};
use support::Test;

/// A project wired to the mock as an OpenAI-compatible provider.
fn project(server: &MockServer) -> Test {
    Test::new()
        .env("OPENAI_BASE_URL", &server.url_openai())
        .env("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        .env("SUMMON_MODEL", "mock-model")
}

/// What one `summon` invocation did.
#[derive(Debug)]
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Ran {
    #[track_caller]
    fn expect(self, code: i32) -> Self {
        assert_eq!(
            self.code, code,
            "unexpected exit code\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout, self.stderr
        );
        self
    }

    #[track_caller]
    fn stderr_has(self, text: &str) -> Self {
        assert!(
            self.stderr.contains(text),
            "stderr lacks {text:?}:\n{}",
            self.stderr
        );
        self
    }
}

fn ran(output: std::process::Output) -> Ran {
    Ran {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Runs `summon ARGS` in the project `t` (built without `.args`).
fn summon(t: &Test, args: &[&str]) -> Ran {
    ran(t.command().args(args).output().expect("run summon"))
}

/// Runs `summon ARGS` once per argument list, all at the same time, and waits for all.
fn summon_at_once(t: &Test, runs: &[Vec<String>]) -> Vec<Ran> {
    let children: Vec<_> = runs
        .iter()
        .map(|args| {
            t.command()
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn summon")
        })
        .collect();
    children
        .into_iter()
        .map(|child| ran(child.wait_with_output().expect("wait")))
        .collect()
}

/// `summon run p.yaml --shard I/N --out sI --quiet` for every I, at once; each must succeed.
fn run_shards(t: &Test, n: u32, extra: &[&str]) {
    let runs: Vec<Vec<String>> = (1..=n)
        .map(|i| {
            let mut args: Vec<String> = [
                "run",
                "p.yaml",
                "--shard",
                &format!("{i}/{n}"),
                "--out",
                &format!("s{i}"),
                "--quiet",
            ]
            .map(str::to_owned)
            .to_vec();
            args.extend(extra.iter().map(|a| (*a).to_owned()));
            args
        })
        .collect();
    for (i, result) in summon_at_once(t, &runs).into_iter().enumerate() {
        let result = result.expect(0);
        assert_eq!(result.stdout, "", "shard {} printed on stdout", i + 1);
        assert!(
            result.stderr.contains("summon merge p.yaml"),
            "shard {} does not say how to merge:\n{}",
            i + 1,
            result.stderr
        );
    }
}

/// The results as a set, without what depends on timing.
fn result_set(dir: &Path) -> BTreeSet<String> {
    let lines = results(dir);
    let set: BTreeSet<String> = lines
        .iter()
        .map(|l| {
            let mut l = l.clone();
            let l = l.as_object_mut().unwrap();
            // Timing, and how much of the input the provider's cache held (which depends on
            // what was sent before), are not part of a task's result.
            for key in [
                "duration_ms",
                "cache_read_tokens",
                "cache_write_tokens",
                "started_ms",
                "retry_wait_ms",
            ] {
                l.remove(key);
            }
            serde_json::Value::Object(l.clone()).to_string()
        })
        .collect();
    assert_eq!(set.len(), lines.len(), "a task is in results.jsonl twice");
    set
}

/// `report.json` without its timing fields: the counts per step and in total.
fn report_counts(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("report.json")).expect("report.json");
    let report: Value = serde_json::from_str(&text).unwrap();
    let counts = |stats: &Value| {
        json!({
            "tasks": stats["tasks"], "completed": stats["completed"], "failed": stats["failed"],
            "skipped": stats["skipped"], "resumed": stats["resumed"], "turns": stats["turns"],
            "input_tokens": stats["input_tokens"], "output_tokens": stats["output_tokens"],
        })
    };
    let steps: BTreeMap<String, Value> = report["steps"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(id, stats)| (id.clone(), counts(stats)))
        .collect();
    json!({"total": counts(&report["total"]), "steps": steps})
}

/// The first user message of every chat request the mock received.
fn sent(server: &MockServer) -> Vec<String> {
    let mut requests: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.api == Api::OpenAi)
        .collect();
    requests.sort_by_key(|r| r.seq);
    requests
        .iter()
        .map(|r| {
            let messages = r.body["messages"].as_array().expect("messages");
            let user = messages.iter().find(|m| m["role"] == "user").expect("user");
            user["content"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}

/// How often each message starting with `prefix` was sent.
fn sent_count(server: &MockServer, prefix: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for message in sent(server) {
        if message.starts_with(prefix) {
            *counts.entry(message).or_default() += 1;
        }
    }
    counts
}

fn items(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("it{i:02}")).collect()
}

/// decompose `list` (a literal list), fan_out `each` over it, synthesize `sum` from every
/// result, and an `outputs` file.
fn pipeline(items: &[String], each_extra: &str) -> String {
    format!(
        "version: 1
name: sharded
parameters:
  - key: tone
    input_type: string
    requirement: optional
    default: plain
steps:
  - id: list
    decompose:
      items: [{}]
  - id: each
    fan_out:
      over: list
      instructions: \"Process {{{{ item }}}} in a {{{{ tone }}}} tone\"
{each_extra}  - id: sum
    synthesize:
      instructions: |
        Merge:
        {{% for r in steps.each.results %}}{{{{ r.item }}}}={{{{ r.output }}}}|{{{{ r.status }}}};
        {{% endfor %}}
outputs:
  - path: out/summary.md
    content: \"{{{{ steps.sum.output }}}}\"
",
        items.join(", ")
    )
}

// ---------------------------------------------------------------------------------------------
// 1. Shards plus merge are one whole run.

#[tokio::test(flavor = "multi_thread")]
async fn three_shards_and_a_merge_give_what_one_whole_run_gives() {
    let items = items(24);
    let text = pipeline(&items, "");

    let whole_server = MockServer::start(MockConfig::new()).await;
    let whole = project(&whole_server).write_raw("p.yaml", &text);
    let whole_run = summon(&whole, &["run", "p.yaml", "--out", "res", "--quiet"]).expect(0);

    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server).write_raw("p.yaml", &text);
    run_shards(&t, 3, &[]);

    // Every item is in exactly one shard, and each shard has some.
    let mut owner: BTreeMap<u64, u32> = BTreeMap::new();
    for i in 1..=3u32 {
        let lines = results(&t.path().join(format!("s{i}")));
        assert!(!lines.is_empty(), "shard {i} ran nothing");
        for line in &lines {
            assert_eq!(line["step"], "each", "a shard ran {line}");
            let index = line["index"].as_u64().unwrap();
            assert!(
                owner.insert(index, i).is_none(),
                "item {index} in two shards"
            );
        }
        assert!(!t.path().join(format!("s{i}/../out/summary.md")).exists());
    }
    assert_eq!(
        owner.keys().copied().collect::<Vec<_>>(),
        (0..24).collect::<Vec<_>>()
    );
    // The mock saw every item exactly once across the shards, and no synthesis yet.
    let per_item = sent_count(&server, "Process ");
    assert_eq!(per_item.len(), 24, "{per_item:?}");
    assert!(per_item.values().all(|&n| n == 1), "{per_item:?}");
    assert!(sent_count(&server, "Merge:").is_empty());

    let merged = summon(
        &t,
        &[
            "merge",
            "p.yaml",
            "s1",
            "s2",
            "s3",
            "--out",
            "res",
            "--junit",
            "junit.xml",
            "--quiet",
        ],
    )
    .expect(0);
    assert_eq!(merged.stdout, whole_run.stdout);
    assert_eq!(sent_count(&server, "Merge:").len(), 1, "one synthesis");
    assert_eq!(
        sent(&server).len(),
        25,
        "no item was sent again by the merge"
    );

    assert_eq!(
        result_set(&t.path().join("res")),
        result_set(&whole.path().join("res"))
    );
    assert_eq!(
        report_counts(&t.path().join("res")),
        report_counts(&whole.path().join("res"))
    );
    assert_eq!(
        std::fs::read_to_string(t.path().join("out/summary.md")).unwrap(),
        std::fs::read_to_string(whole.path().join("out/summary.md")).unwrap()
    );
    let junit = std::fs::read_to_string(t.path().join("junit.xml")).unwrap();
    assert_eq!(junit.matches("<testcase").count(), 25, "{junit}");
}

#[tokio::test(flavor = "multi_thread")]
async fn min_success_is_decided_by_the_merge_over_every_shard() {
    // 3 of 12 items fail; min_success 10 cannot be met overall, although no shard alone
    // could know it.
    let server = MockServer::start(MockConfig::new().rule(|req| {
        if req
            .last_user_text()
            .unwrap_or_default()
            .starts_with("Process bad")
        {
            Reply::status(
                400,
                r#"{"error":{"message":"bad item","type":"invalid_request_error"}}"#,
            )
        } else {
            Reply::Echo
        }
    }))
    .await;
    let mut list = items(9);
    list.extend(["bad1".to_owned(), "bad2".to_owned(), "bad3".to_owned()]);
    let each_extra = "    on_error: continue\n    min_success: 10\n";
    let t = project(&server).write_raw("p.yaml", &pipeline(&list, each_extra));
    run_shards(&t, 3, &[]);
    summon(
        &t,
        &[
            "merge", "p.yaml", "s1", "s2", "s3", "--out", "res", "--quiet",
        ],
    )
    .expect(2)
    .stderr_has("step `each` failed: 9 of 12 tasks succeeded (needed 10)");
    assert!(
        sent_count(&server, "Merge:").is_empty(),
        "nothing after a failed step"
    );
    let lines = results(&t.path().join("res"));
    assert_eq!(lines.iter().filter(|l| l["status"] == "failed").count(), 3);
    assert!(
        !t.path().join("out/summary.md").exists(),
        "no outputs after a failure"
    );

    // With min_success 9 the same shards merge.
    let t2 = project(&server).write_raw(
        "p.yaml",
        &pipeline(&list, "    on_error: continue\n    min_success: 9\n"),
    );
    run_shards(&t2, 3, &[]);
    summon(&t2, &["merge", "p.yaml", "s1", "s2", "s3", "--quiet"]).expect(0);
    assert!(t2.path().join("out/summary.md").exists());
}

// ---------------------------------------------------------------------------------------------
// 2. Choosing the shard.

#[tokio::test(flavor = "multi_thread")]
async fn job_completion_index_selects_the_shard_and_the_flag_wins() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server).write_raw("p.yaml", &pipeline(&items(12), ""));
    summon(
        &t,
        &[
            "run", "p.yaml", "--shard", "2/3", "--out", "flag", "--quiet",
        ],
    )
    .expect(0);
    let by_env = t
        .command()
        .args(["run", "p.yaml", "--out", "env", "--quiet"])
        .env("JOB_COMPLETION_INDEX", "1")
        .env("JOB_COMPLETIONS", "3")
        .output()
        .unwrap();
    ran(by_env).expect(0).stderr_has("shard 2/3");
    assert_eq!(
        result_set(&t.path().join("env")),
        result_set(&t.path().join("flag"))
    );
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(t.path().join("env/manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["shard"], json!({"index": 2, "count": 3}));

    // --shard wins over the variables.
    let flag_wins = t
        .command()
        .args(["run", "p.yaml", "--shard", "1/3", "--out", "one", "--quiet"])
        .env("JOB_COMPLETION_INDEX", "1")
        .env("JOB_COMPLETIONS", "3")
        .output()
        .unwrap();
    ran(flag_wins).expect(0);
    let one: Value =
        serde_json::from_str(&std::fs::read_to_string(t.path().join("one/manifest.json")).unwrap())
            .unwrap();
    assert_eq!(one["shard"]["index"], 1);

    // An index without a count, or out of range, is refused before anything is sent.
    let before = server.request_count();
    for (vars, wanted) in [
        (
            &[("JOB_COMPLETION_INDEX", "0")][..],
            "JOB_COMPLETIONS is not",
        ),
        (
            &[("JOB_COMPLETION_INDEX", "3"), ("JOB_COMPLETIONS", "3")][..],
            "out of range",
        ),
    ] {
        let mut command = t.command();
        command.args(["run", "p.yaml", "--out", "bad", "--quiet"]);
        for (k, v) in vars {
            command.env(k, v);
        }
        ran(command.output().unwrap()).expect(1).stderr_has(wanted);
    }
    assert_eq!(server.request_count(), before);
    assert!(!t.path().join("bad").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_shard_arguments_are_refused_before_anything_runs() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server).write_raw("p.yaml", &pipeline(&items(4), ""));
    for (args, wanted) in [
        (&["--shard", "0/3", "--out", "o"][..], "shards count from 1"),
        (
            &["--shard", "4/3", "--out", "o"][..],
            "there is no shard 4 of 3",
        ),
        (
            &["--shard", "two/3", "--out", "o"][..],
            "shard index `two` is not a whole number",
        ),
        (&["--shard", "1/0", "--out", "o"][..], "at least 1"),
        (&["--shard", "2/3"][..], "`--shard 2/3` needs `--out DIR`"),
        (
            &["--until", "nope", "--out", "o"][..],
            "--until `nope`: the pipeline has no such step",
        ),
        (&["--until", "list"][..], "`--until list` needs `--out DIR`"),
        (
            &["--items-from", "nowhere"][..],
            "`nowhere` is not a directory",
        ),
    ] {
        summon(&t, &[&["run", "p.yaml", "--quiet"][..], args].concat())
            .expect(1)
            .stderr_has(wanted);
    }
    assert_eq!(server.request_count(), 0);
    assert!(!t.path().join("o").exists());
}

// ---------------------------------------------------------------------------------------------
// 3. What the merge refuses.

#[tokio::test(flavor = "multi_thread")]
async fn merge_names_each_mismatch_and_writes_nothing() {
    let server = MockServer::start(MockConfig::new()).await;
    let text = pipeline(&items(9), "");
    let t = project(&server).write_raw("p.yaml", &text);
    run_shards(&t, 3, &[]);
    // The same shard 2 with another parameter, a shard of a 2-way split, and a copy of shard 1.
    summon(
        &t,
        &[
            "run", "p.yaml", "--shard", "2/3", "--out", "other", "--param", "tone=dry", "--quiet",
        ],
    )
    .expect(0);
    summon(
        &t,
        &[
            "run", "p.yaml", "--shard", "1/2", "--out", "half", "--quiet",
        ],
    )
    .expect(0);
    std::fs::create_dir(t.path().join("copy")).unwrap();
    for file in ["manifest.json", "results.jsonl", "report.json"] {
        std::fs::copy(
            t.path().join("s1").join(file),
            t.path().join("copy").join(file),
        )
        .unwrap();
    }
    std::fs::write(t.path().join("p2.yaml"), text.replace("Merge:", "Combine:")).unwrap();
    // A copy of shard 3 whose manifest names a role that does not exist.
    std::fs::create_dir(t.path().join("badrole")).unwrap();
    for file in ["results.jsonl", "report.json"] {
        std::fs::copy(
            t.path().join("s3").join(file),
            t.path().join("badrole").join(file),
        )
        .unwrap();
    }
    let mut manifest: Value =
        serde_json::from_slice(&std::fs::read(t.path().join("s3/manifest.json")).unwrap()).unwrap();
    let sharded = manifest["steps"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|s| s["role"] == "shard")
        .expect("shard 3 has a sharded step");
    sharded["role"] = "sharded".into();
    std::fs::write(
        t.path().join("badrole/manifest.json"),
        serde_json::to_string_pretty(&manifest).unwrap(),
    )
    .unwrap();
    let before = server.request_count();
    let s2_before = std::fs::read(t.path().join("s2/results.jsonl")).unwrap();

    for (args, wanted) in [
        (
            &["p.yaml", "s1", "s2"][..],
            "shard 3/3 is missing (given: 1/3 in `s1`, 2/3 in `s2`)",
        ),
        (
            &["p.yaml", "s1", "s2", "s3", "copy"][..],
            "`s1` and `copy` are both shard 1/3",
        ),
        (
            &["p.yaml", "s1", "other", "s3"][..],
            "`other` ran with other parameters: `params.tone` is `dry` there, `plain` here",
        ),
        (
            &["p.yaml", "s1", "s2", "s3", "--param", "tone=dry"][..],
            "`s1` ran with other parameters",
        ),
        (
            &["p.yaml", "s1", "s2", "half"][..],
            "`half` is shard 1/2, but `s1` is shard 1/3",
        ),
        (
            &["p2.yaml", "s1", "s2", "s3"][..],
            "`s1` was made by another version of pipeline `sharded`",
        ),
        (
            &["p.yaml", "s1", "s2", "badrole"][..],
            "not a summon manifest: unknown variant `sharded`",
        ),
        (
            &["p.yaml", "s1", "s2", "nowhere"][..],
            "`nowhere` is not a directory",
        ),
    ] {
        summon(
            &t,
            &[&["merge"][..], args, &["--out", "merged", "--quiet"][..]].concat(),
        )
        .expect(1)
        .stderr_has(wanted);
    }
    summon(
        &t,
        &[
            "merge", "p.yaml", "s1", "s2", "s3", "--out", "s2", "--quiet",
        ],
    )
    .expect(1)
    .stderr_has("`--out s2` is one of the shard directories");
    assert_eq!(
        std::fs::read(t.path().join("s2/results.jsonl")).unwrap(),
        s2_before,
        "shard 2 is untouched"
    );
    assert_eq!(
        server.request_count(),
        before,
        "a refused merge sends nothing"
    );
    assert!(
        !t.path().join("merged").exists(),
        "a refused merge writes nothing"
    );
    assert!(!t.path().join("out/summary.md").exists());

    // A shard re-run after the pipeline was edited is caught too.
    let edited = project(&server).write_raw("p.yaml", &text);
    run_shards(&edited, 3, &[]);
    std::fs::write(edited.path().join("p.yaml"), pipeline(&items(10), "")).unwrap();
    summon(
        &edited,
        &["run", "p.yaml", "--shard", "3/3", "--out", "s3", "--quiet"],
    )
    .expect(0);
    summon(&edited, &["merge", "p.yaml", "s1", "s2", "s3", "--quiet"])
        .expect(1)
        .stderr_has("another version of pipeline");

    // And the merge of the right set works after all that.
    summon(
        &t,
        &[
            "merge", "p.yaml", "s3", "s1", "s2", "--out", "merged", "--quiet",
        ],
    )
    .expect(0);
    assert_eq!(results(&t.path().join("merged")).len(), 10);
}

// ---------------------------------------------------------------------------------------------
// 4. A model-made item list: --until once, --items-from in every shard.

fn agent_pipeline() -> String {
    "version: 1
name: topics
steps:
  - id: topics
    decompose:
      instructions: List the topics
  - id: each
    fan_out:
      over: topics
      instructions: \"Write about {{ item }}\"
  - id: sum
    synthesize:
      instructions: \"Combine: {% for r in steps.each.results %}{{ r.output }};{% endfor %}\"
"
    .to_owned()
}

fn topics_mock() -> MockConfig {
    MockConfig::new().rule(|req| {
        if req
            .last_user_text()
            .unwrap_or_default()
            .starts_with("List the topics")
        {
            Reply::text(
                json!((0..15).map(|i| format!("topic {i}")).collect::<Vec<_>>()).to_string(),
            )
        } else {
            Reply::Echo
        }
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn until_and_items_from_carry_a_model_made_list_to_every_shard() {
    let whole_server = MockServer::start(topics_mock()).await;
    let whole = project(&whole_server).write_raw("p.yaml", &agent_pipeline());
    let whole_run = summon(&whole, &["run", "p.yaml", "--out", "res", "--quiet"]).expect(0);

    let server = MockServer::start(topics_mock()).await;
    let t = project(&server).write_raw("p.yaml", &agent_pipeline());
    // Without --items-from every shard would ask the model for its own list: refused.
    summon(
        &t,
        &["run", "p.yaml", "--shard", "1/3", "--out", "s1", "--quiet"],
    )
    .expect(1)
    .stderr_has("step `each` cannot be sharded")
    .stderr_has("`summon run p.yaml --until topics --out DIR`");
    assert_eq!(server.request_count(), 0);

    summon(
        &t,
        &[
            "run", "p.yaml", "--until", "topics", "--out", "base", "--quiet",
        ],
    )
    .expect(0)
    .stderr_has("--items-from base");
    assert_eq!(sent(&server).len(), 1, "only the decompose");
    run_shards(&t, 3, &["--items-from", "base"]);
    assert_eq!(
        sent_count(&server, "List the topics").len(),
        1,
        "the list was made once"
    );
    let per_item = sent_count(&server, "Write about ");
    assert_eq!(per_item.len(), 15, "{per_item:?}");
    assert!(
        per_item.values().all(|&n| n == 1),
        "an item was sent twice: {per_item:?}"
    );

    let merged = summon(
        &t,
        &[
            "merge", "p.yaml", "s1", "s2", "s3", "--out", "res", "--quiet",
        ],
    )
    .expect(0);
    assert_eq!(merged.stdout, whole_run.stdout);
    assert_eq!(sent(&server).len(), 1 + 15 + 1);
    assert_eq!(
        result_set(&t.path().join("res")),
        result_set(&whole.path().join("res"))
    );
    assert_eq!(
        report_counts(&t.path().join("res")),
        report_counts(&whole.path().join("res"))
    );

    // --items-from must come from --until of this pipeline.
    std::fs::write(
        t.path().join("p.yaml"),
        agent_pipeline().replace("Combine", "Join"),
    )
    .unwrap();
    summon(
        &t,
        &[
            "run",
            "p.yaml",
            "--shard",
            "1/3",
            "--out",
            "x",
            "--items-from",
            "base",
        ],
    )
    .expect(1)
    .stderr_has("`base` was made by another version of pipeline `topics`");
    std::fs::write(t.path().join("p.yaml"), agent_pipeline()).unwrap();
    summon(
        &t,
        &[
            "run",
            "p.yaml",
            "--shard",
            "1/3",
            "--out",
            "x",
            "--items-from",
            "s2",
        ],
    )
    .expect(1)
    .stderr_has("`s2` is a shard's output");
    assert_eq!(sent(&server).len(), 1 + 15 + 1);
}

// ---------------------------------------------------------------------------------------------
// 5. A shard resumes its own run.

#[tokio::test(flavor = "multi_thread")]
async fn a_shard_resumes_its_own_run_and_sends_nothing_twice() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server).write_raw("p.yaml", &pipeline(&items(12), ""));
    run_shards(&t, 2, &[]);
    let after = server.request_count();
    // The last run of this pipeline is shard 2/2; shard 1/2 still finds its own.
    summon(
        &t,
        &[
            "run", "p.yaml", "--shard", "1/2", "--out", "s1", "--resume", "--quiet",
        ],
    )
    .expect(0);
    assert_eq!(
        server.request_count(),
        after,
        "finished shard tasks are not sent again"
    );
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(t.path().join("s1/manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["shard"]["index"], 1);
    assert_eq!(manifest["status"], "completed");
    summon(
        &t,
        &["merge", "p.yaml", "s1", "s2", "--out", "res", "--quiet"],
    )
    .expect(0);
    assert_eq!(results(&t.path().join("res")).len(), 13);
    // A whole run of the same pipeline does not resume a shard.
    summon(&t, &["run", "p.yaml", "--resume", "--quiet"])
        .expect(1)
        .stderr_has("no earlier run");
}

// ---------------------------------------------------------------------------------------------
// 6. The examples in docs/sharding.md agree with themselves and with the flags.

#[test]
fn the_sharding_docs_examples_are_consistent() {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/sharding.md"))
        .expect("docs/sharding.md");
    let blocks: Vec<&str> = docs
        .split("```yaml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert_eq!(
        blocks.len(),
        3,
        "a GitHub Actions workflow, a Kubernetes Job and a GitLab pipeline"
    );
    let value_after = |text: &str, key: &str| -> String {
        let at = text.find(key).unwrap_or_else(|| panic!("no {key}"));
        text[at + key.len()..]
            .lines()
            .next()
            .unwrap()
            .split('#')
            .next()
            .unwrap()
            .trim()
            .trim_matches('"')
            .to_owned()
    };
    let block = |marker: &str| {
        *blocks
            .iter()
            .find(|b| b.contains(marker))
            .unwrap_or_else(|| panic!("no yaml block with {marker}"))
    };
    // GitHub Actions: one matrix entry per shard, I/N from the matrix.
    let workflow = block("jobs:");
    let shards: usize = value_after(workflow, "SHARDS:").parse().unwrap();
    let matrix = value_after(workflow, "shard: [");
    assert_eq!(matrix.trim_end_matches(']').split(',').count(), shards);
    assert!(workflow.contains("--shard ${{ matrix.shard }}/${{ env.SHARDS }}"));
    assert!(workflow.contains("summon merge pipelines/classify-tickets.yaml shards/shard-*"));
    // Kubernetes: an Indexed Job whose JOB_COMPLETIONS matches its completions.
    let job = block("kind: Job");
    assert_eq!(value_after(job, "completionMode:"), "Indexed");
    let completions = value_after(job, "completions:");
    let set = value_after(&job[job.find("name: JOB_COMPLETIONS").unwrap()..], "value:");
    assert_eq!(set, completions);
    assert!(job.contains("--out /shards/shard-$JOB_COMPLETION_INDEX"));
    assert!(job.contains("summon merge pipelines/classify-tickets.yaml /shards/shard-*"));
    // GitLab: `parallel:` jobs, each with its CI_NODE_INDEX, then a merge.
    let gitlab = block("parallel:");
    assert_eq!(value_after(gitlab, "parallel:"), "4");
    assert!(gitlab.contains("--out \"shards/shard-$CI_NODE_INDEX\" --resume=auto"));
    assert!(gitlab.contains("summon merge pipelines/tickets.yaml shards/shard-*"));
    // Every flag the page uses exists.
    let help = |command: &str| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_summon"))
            .args([command, "--help"])
            .output()
            .unwrap();
        String::from_utf8(output.stdout).unwrap()
    };
    let run_help = help("run");
    for flag in ["--shard", "--until", "--items-from", "--out", "--resume"] {
        assert!(run_help.contains(flag), "summon run has no {flag}");
    }
    let merge_help = help("merge");
    for flag in ["--out", "--junit", "--param", "--concurrency", "--json"] {
        assert!(merge_help.contains(flag), "summon merge has no {flag}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_shard_leaves_no_manifest_until_it_is_resumed() {
    let server =
        MockServer::start(MockConfig::new().latency(std::time::Duration::from_millis(150))).await;
    let t = project(&server).write_raw("p.yaml", &pipeline(&items(16), ""));
    run_shards(&t, 2, &[]);
    assert!(t.path().join("s1/manifest.json").exists());
    // Shard 1 again, killed after its first task: its old manifest must not survive.
    let mut child = t
        .command()
        .args([
            "run",
            "p.yaml",
            "--shard",
            "1/2",
            "--out",
            "s1",
            "--concurrency",
            "1",
            "-q",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // (The first run's manifest and results are there until the new run starts.)
    while t.path().join("s1/manifest.json").exists() || results(&t.path().join("s1")).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the old manifest is still there, or no task finished"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    summon(&t, &["merge", "p.yaml", "s1", "s2", "--quiet"])
        .expect(1)
        .stderr_has("`s1` has no manifest.json")
        .stderr_has("`--resume`");
    summon(
        &t,
        &[
            "run", "p.yaml", "--shard", "1/2", "--out", "s1", "--resume", "-q",
        ],
    )
    .expect(0);
    summon(
        &t,
        &["merge", "p.yaml", "s1", "s2", "--out", "res", "--quiet"],
    )
    .expect(0);
    let lines = results(&t.path().join("res"));
    assert_eq!(lines.len(), 17, "every task once: {lines:#?}");
}

// ---------------------------------------------------------------------------------------------
// 7. Reports stay true after a resume and after a merge.

/// 24 items at concurrency 2 with a fixed output limit (so that every request is the same in
/// every run), a priced model, and a synthesis of every result.
fn priced_pipeline() -> String {
    format!(
        "version: 1
name: priced
settings:
  concurrency: 2
  max_output_tokens: 100
steps:
  - id: list
    decompose:
      items: [{}]
  - id: each
    fan_out:
      over: list
      instructions: \"Process {{{{ item }}}}\"
  - id: sum
    synthesize:
      instructions: |
        Merge:
        {{% for r in steps.each.results %}}{{{{ r.output }}}};{{% endfor %}}
",
        items(24).join(", ")
    )
}

/// A mock whose first request for it00, it04 and it08 fails with HTTP 500, so that the runs
/// meet retries: the same ones in every run against a fresh mock (all among the first 12
/// items, which the killed run journals before it is killed).
async fn flaky_mock() -> MockServer {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    MockServer::start(
        MockConfig::new()
            .latency(std::time::Duration::from_millis(20))
            .rule(move |request| {
                let text = request.last_user_text().unwrap_or_default();
                let fails = text
                    .strip_prefix("Process it")
                    .and_then(|n| n.parse::<u32>().ok())
                    .is_some_and(|n| n % 4 == 0 && n < 12);
                if fails && seen.lock().unwrap().insert(text) {
                    Reply::status(500, r#"{"error": {"message": "overloaded"}}"#)
                } else {
                    Reply::Echo
                }
            }),
    )
    .await
}

fn priced_project(server: &MockServer) -> Test {
    project(server)
        .env("SUMMON_MODEL", "gpt-4o-mini")
        .env("SUMMON_RETRY_BASE_MS", "1")
        .write_raw("p.yaml", &priced_pipeline())
}

/// `value` without what differs between two runs that did the same work: times (and the
/// waits, which are times), ids, and
/// how many tasks came from an earlier attempt (`resumed`). `rate_limits` describes what the
/// provider's limits did to the process that sent the requests, so it is left out too.
fn without_times(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(key, _)| {
                    !matches!(
                        key.as_str(),
                        "started_at"
                            | "wall_ms"
                            | "duration_ms"
                            | "started_ms"
                            | "retry_wait_ms"
                            | "waits"
                            | "run_id"
                            | "resumed"
                            | "rate_limits"
                    )
                })
                .map(|(key, value)| (key.clone(), without_times(value)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_times).collect()),
        other => other.clone(),
    }
}

/// `report.json` and the lines of `results.jsonl` (by step and index) of `dir`, without times.
fn true_report(dir: &Path) -> (Value, BTreeMap<(String, u64), Value>) {
    let report = support::read_json(&dir.join("report.json"));
    let lines = results(dir)
        .iter()
        .map(|line| {
            (
                (
                    line["step"].as_str().unwrap().to_owned(),
                    line["index"].as_u64().unwrap(),
                ),
                without_times(line),
            )
        })
        .collect();
    (without_times(&report), lines)
}

#[tokio::test(flavor = "multi_thread")]
async fn resumed_and_merged_reports_equal_an_uninterrupted_run_field_by_field() {
    // One uninterrupted run.
    let server = flaky_mock().await;
    let whole = priced_project(&server);
    summon(&whole, &["run", "p.yaml", "--out", "res", "--quiet"]).expect(0);
    let (whole_report, whole_lines) = true_report(&whole.path().join("res"));
    assert_eq!(whole_report["total"]["priced"], true, "{whole_report:#}");
    assert!(
        whole_report["total"]["cost_usd"].as_f64().unwrap() > 0.0,
        "{whole_report:#}"
    );
    assert_eq!(
        whole_report["retries_by_class"]["server_error"], 3,
        "{whole_report:#}"
    );
    assert_eq!(whole_lines.len(), 25);

    // Killed with SIGKILL once the journal holds the first 12 items (the retried ones among
    // them), then resumed.
    let server = flaky_mock().await;
    let t = priced_project(&server);
    let mut child = t
        .command()
        .args(["run", "p.yaml", "--out", "res", "--quiet"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn summon run");
    let journaled = |path: &Path| -> i64 {
        let Ok(conn) = rusqlite::Connection::open_with_flags(
            path.join(".summon/state.db"),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        ) else {
            return 0;
        };
        conn.query_row(
            "SELECT COUNT(*) FROM run_tasks WHERE status = 'completed' AND step_id = 'each' \
             AND item_index < 12",
            [],
            |r| r.get(0),
        )
        .unwrap_or(0)
    };
    support::wait_for(
        std::time::Duration::from_secs(30),
        "12 journaled tasks",
        || journaled(t.path()) == 12,
    );
    child.kill().expect("SIGKILL");
    child.wait().expect("wait");
    assert!(
        !t.path().join("res/report.json").exists(),
        "killed before it finished"
    );
    summon(
        &t,
        &["run", "p.yaml", "--out", "res", "--quiet", "--resume"],
    )
    .expect(0);
    let (resumed_report, resumed_lines) = true_report(&t.path().join("res"));
    let resumed = support::read_json(&t.path().join("res/report.json"));
    assert!(
        resumed["total"]["resumed"].as_u64().unwrap() >= 12,
        "the resumed run took the journaled tasks: {resumed:#}"
    );
    assert_eq!(resumed_report, whole_report);
    assert_eq!(resumed_lines, whole_lines);

    // Three shards and a merge.
    let server = flaky_mock().await;
    let t = priced_project(&server);
    run_shards(&t, 3, &[]);
    summon(
        &t,
        &[
            "merge", "p.yaml", "s1", "s2", "s3", "--out", "res", "--quiet",
        ],
    )
    .expect(0);
    let (merged_report, merged_lines) = true_report(&t.path().join("res"));
    assert_eq!(merged_report, whole_report);
    assert_eq!(merged_lines, whole_lines);
}

// ---------------------------------------------------------------------------------------------
// 8. Requeued by a scheduler: SIGTERM, then the same command again.

#[tokio::test(flavor = "multi_thread")]
async fn a_shard_ended_by_sigterm_is_continued_by_resume_auto_which_otherwise_starts() {
    let server =
        MockServer::start(MockConfig::new().latency(std::time::Duration::from_millis(100))).await;
    let t = project(&server).write_raw("p.yaml", &pipeline(&items(16), ""));
    let shard1 = [
        "run",
        "p.yaml",
        "--shard",
        "1/2",
        "--out",
        "s1",
        "--resume=auto",
        "--concurrency",
        "1",
        "-q",
    ];
    // The first attempt: nothing to continue, so it starts.
    let child = t
        .command()
        .args(shard1)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    support::wait_for(
        std::time::Duration::from_secs(30),
        "two finished tasks",
        || results(&t.path().join("s1")).len() >= 2,
    );
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    // SIGTERM ends summon at once (143); every finished task is in the journal, and the
    // manifest is written by the run that continues it.
    let first = ran(child.wait_with_output().unwrap()).expect(143);
    assert!(
        first.stderr.contains("terminated (SIGTERM)"),
        "{}",
        first.stderr
    );
    assert!(!t.path().join("s1/manifest.json").exists());
    let done_before: Vec<String> = results(&t.path().join("s1"))
        .iter()
        .filter(|l| l["status"] == "completed")
        .map(|l| l["item"].as_str().unwrap().to_owned())
        .collect();
    assert!(!done_before.is_empty());

    // The requeue: the same command continues the run and sends no finished task again.
    summon(&t, &shard1)
        .expect(0)
        .stderr_has("--resume=auto: continuing run");
    let sent = sent_count(&server, "Process ");
    for item in &done_before {
        assert_eq!(
            sent[&format!("Process {item} in a plain tone")],
            1,
            "{item} was sent again: {sent:?}"
        );
    }
    let shard2 = [
        "run",
        "p.yaml",
        "--shard",
        "2/2",
        "--out",
        "s2",
        "--resume=auto",
        "-q",
    ];
    let started = summon(&t, &shard2).expect(0);
    assert!(!started.stderr.contains("continuing"), "{}", started.stderr);
    summon(
        &t,
        &["merge", "p.yaml", "s1", "s2", "--out", "res", "--quiet"],
    )
    .expect(0);
    assert_eq!(results(&t.path().join("res")).len(), 17);
    assert_eq!(sent_count(&server, "Process ").len(), 16);

    // A completed run has nothing to continue: the same command starts a new one.
    let before = server.request_count();
    let again = summon(&t, &shard2).expect(0);
    assert!(!again.stderr.contains("continuing"), "{}", again.stderr);
    assert!(server.request_count() > before, "a new run sends its tasks");
}

// ---------------------------------------------------------------------------------------------
// 9. The index variables of Slurm, GitLab and AWS Batch; a dry run of a shard.

#[tokio::test(flavor = "multi_thread")]
async fn slurm_gitlab_and_aws_batch_variables_select_the_shard_and_a_dry_run_honours_it() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server).write_raw("p.yaml", &pipeline(&items(12), ""));
    summon(
        &t,
        &[
            "run", "p.yaml", "--shard", "2/4", "--out", "flag", "--quiet",
        ],
    )
    .expect(0);
    let by_flag = result_set(&t.path().join("flag"));
    assert!(!by_flag.is_empty());
    // Shard 2 of 4 as each scheduler numbers it.
    let schedulers: [(&str, &[(&str, &str)]); 3] = [
        (
            "slurm",
            &[
                ("SLURM_ARRAY_TASK_ID", "6"),
                ("SLURM_ARRAY_TASK_MIN", "5"),
                ("SLURM_ARRAY_TASK_MAX", "8"),
                ("SLURM_ARRAY_TASK_COUNT", "4"),
            ],
        ),
        ("gitlab", &[("CI_NODE_INDEX", "2"), ("CI_NODE_TOTAL", "4")]),
        (
            "aws",
            &[
                ("AWS_BATCH_JOB_ARRAY_INDEX", "1"),
                ("AWS_BATCH_JOB_ARRAY_SIZE", "4"),
            ],
        ),
    ];
    for (name, vars) in schedulers {
        let mut command = t.command();
        command.args(["run", "p.yaml", "--out", name, "--quiet"]);
        for (k, v) in vars {
            command.env(k, v);
        }
        ran(command.output().unwrap()).expect(0);
        assert_eq!(result_set(&t.path().join(name)), by_flag, "{name}");
        let manifest = support::read_json(&t.path().join(format!("{name}/manifest.json")));
        assert_eq!(manifest["shard"], json!({"index": 2, "count": 4}), "{name}");
    }

    // Two schedulers that disagree: refused, naming both, before anything is sent.
    let before = server.request_count();
    let disagree = t
        .command()
        .args(["run", "p.yaml", "--out", "bad", "--quiet"])
        .env("CI_NODE_INDEX", "1")
        .env("CI_NODE_TOTAL", "4")
        .env("AWS_BATCH_JOB_ARRAY_INDEX", "1")
        .env("AWS_BATCH_JOB_ARRAY_SIZE", "4")
        .output()
        .unwrap();
    ran(disagree).expect(1).stderr_has(
        "CI_NODE_INDEX selects shard 1/4 but AWS_BATCH_JOB_ARRAY_INDEX selects shard 2/4",
    );
    assert_eq!(server.request_count(), before);
    assert!(!t.path().join("bad").exists());

    // A dry run of shard 2/4 counts the tasks that shard sends, and leaves the synthesis for
    // the merge; it needs no --out.
    let dry = summon(&t, &["run", "p.yaml", "--shard", "2/4", "--dry-run"]).expect(0);
    let owned = by_flag.len();
    assert!(
        dry.stdout
            .contains(&format!("each (fan_out) after list: {owned} task"))
            || dry
                .stderr
                .contains(&format!("each (fan_out) after list: {owned} task")),
        "{}{}",
        dry.stdout,
        dry.stderr
    );
    assert!(
        (dry.stdout.clone() + &dry.stderr)
            .contains("sum (synthesize) after each: 0 tasks; left for `summon merge`"),
        "{}{}",
        dry.stdout,
        dry.stderr
    );
    assert_eq!(server.request_count(), before, "a dry run sends nothing");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_merge_of_shards_run_with_different_models_says_so_naming_them() {
    let server = MockServer::start(MockConfig::new()).await;
    let t = project(&server).write_raw("p.yaml", &pipeline(&items(8), ""));
    for (i, model) in [(1, "mock-model"), (2, "other-model")] {
        let out = t
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
            .env("SUMMON_MODEL", model)
            .output()
            .unwrap();
        ran(out).expect(0);
    }
    summon(
        &t,
        &["merge", "p.yaml", "s1", "s2", "--out", "res", "--quiet"],
    )
    .expect(0)
    .stderr_has(
        "warning: the shards ran their tasks with different models: `mock-model` in shard \
             1/2 (`s1`); `other-model` in shard 2/2 (`s2`)",
    );
    // Shard 2 again with the same model as shard 1: no warning.
    summon(
        &t,
        &["run", "p.yaml", "--shard", "2/2", "--out", "s2b", "--quiet"],
    )
    .expect(0);
    let same = summon(
        &t,
        &["merge", "p.yaml", "s1", "s2b", "--out", "res2", "--quiet"],
    )
    .expect(0);
    assert!(!same.stderr.contains("different models"), "{}", same.stderr);
}

// ---------------------------------------------------------------------------------------------
// 10. Shards that share a folder: one run at a time, whatever the PID namespace.

/// `summon ARGS` in project `t` inside a PID namespace of its own (`unshare --pid --fork
/// --mount-proc`, as root): its pid there is 1, as is that of every other such process.
fn in_pid_namespace(t: &Test, args: &[&str]) -> std::process::Command {
    let mut base = t.command();
    base.args(args);
    let mut command = std::process::Command::new("unshare");
    command
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(base.get_program())
        .args(base.get_args())
        .current_dir(base.get_current_dir().expect("the project"))
        .env_clear();
    for (key, value) in base.get_envs() {
        if let Some(value) = value {
            command.env(key, value);
        }
    }
    command
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root and unshare (util-linux) for PID namespaces; runs with `cargo test --test suite -- --ignored`"]
async fn two_pid_namespaces_never_both_run_one_shard_into_one_out() {
    let works = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(works, "unshare --pid --fork --mount-proc needs root here");
    let server =
        MockServer::start(MockConfig::new().latency(std::time::Duration::from_millis(100))).await;
    let t = project(&server).write_raw("p.yaml", &pipeline(&items(16), ""));
    let args = [
        "run",
        "p.yaml",
        "--shard",
        "1/1",
        "--out",
        "out",
        "--concurrency",
        "2",
        "-q",
    ];
    let first = in_pid_namespace(&t, &args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    support::wait_for(
        std::time::Duration::from_secs(30),
        "the first run's first request",
        || server.request_count() >= 1,
    );
    // The same shard into the same folder, from another PID namespace: a new run, and a
    // requeue that continues the live one. Both are refused while the first lives.
    let again = ran(in_pid_namespace(&t, &args).output().unwrap()).expect(75);
    assert!(
        again.stderr.contains("still running") || again.stderr.contains("same --out"),
        "{}",
        again.stderr
    );
    let mut requeue: Vec<&str> = args.to_vec();
    requeue.push("--resume=auto");
    ran(in_pid_namespace(&t, &requeue).output().unwrap())
        .expect(75)
        .stderr_has("is already running (host ");
    ran(first.wait_with_output().unwrap()).expect(0);
    // Every item was paid for once.
    let per_item = sent_count(&server, "Process ");
    assert_eq!(per_item.len(), 16, "{per_item:?}");
    assert!(per_item.values().all(|&n| n == 1), "{per_item:?}");
    assert_eq!(results(&t.path().join("out")).len(), 16);
}

// ---------------------------------------------------------------------------------------------
// 11. A real scheduler: the sbatch script of docs/sharding.md on a Slurm cluster of one node.

/// The shell block of docs/sharding.md that starts with `#!/bin/sh` and `#SBATCH`.
fn docs_sbatch_script() -> String {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/sharding.md"))
        .expect("docs/sharding.md");
    docs.split("```sh\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.starts_with("#!/bin/sh\n#SBATCH"))
        .expect("an sbatch script in docs/sharding.md")
        .to_owned()
}

/// A Slurm controller, a node daemon and munge on 127.0.0.1, with a configuration of their
/// own in a temporary folder; stopped (by their pids) when dropped.
struct Slurm {
    dir: tempfile::TempDir,
}

impl Slurm {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_owned();
        let p = |name: &str| root.join(name).display().to_string();
        for sub in ["state", "spool", "munge"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let free_port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap()
            .trim()
            .to_owned();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let conf = format!(
            "ClusterName=summontest\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort={}\n\
             SlurmdPort={}\nAuthType=auth/munge\nCredType=cred/munge\n\
             AuthInfo=socket={munge},cred_expire=5\nSlurmUser=root\nSlurmdUser=root\n\
             StateSaveLocation={state}\nSlurmdSpoolDir={spool}\n\
             SlurmctldPidFile={ctld_pid}\nSlurmdPidFile={d_pid}\n\
             SlurmctldLogFile={ctld_log}\nSlurmdLogFile={d_log}\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
             SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n\
             SchedulerType=sched/builtin\nSchedulerParameters=sched_interval=1\n\
             ReturnToService=2\nMpiDefault=none\n\
             JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n\
             KillWait=10\n\
             NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN\n\
             PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP \
             OverSubscribe=FORCE:4\n",
            free_port(),
            free_port(),
            munge = p("munge/socket"),
            state = p("state"),
            spool = p("spool"),
            ctld_pid = p("slurmctld.pid"),
            d_pid = p("slurmd.pid"),
            ctld_log = p("slurmctld.log"),
            d_log = p("slurmd.log"),
        );
        std::fs::write(dir.path().join("slurm.conf"), conf).unwrap();
        let key: Vec<u8> = (0..1024u32).map(|i| (i * 7919 % 251) as u8).collect();
        std::fs::write(dir.path().join("munge/key"), key).unwrap();
        std::fs::set_permissions(
            dir.path().join("munge/key"),
            std::os::unix::fs::PermissionsExt::from_mode(0o400),
        )
        .unwrap();
        let slurm = Self { dir };
        let run = |program: &str, args: &[String]| {
            let status = std::process::Command::new(program)
                .args(args)
                .env("SLURM_CONF", slurm.conf())
                .status()
                .unwrap_or_else(|e| panic!("{program}: {e}"));
            assert!(status.success(), "{program} {args:?} failed");
        };
        run(
            "munged",
            &[
                format!("--key-file={}", p("munge/key")),
                format!("--socket={}", p("munge/socket")),
                format!("--pid-file={}", p("munge/munged.pid")),
                format!("--log-file={}", p("munge/munged.log")),
                format!("--seed-file={}", p("munge/seed")),
                "--force".to_owned(),
            ],
        );
        run("slurmctld", &[]);
        run("slurmd", &["-N".to_owned(), host]);
        support::wait_for(Duration::from_secs(60), "the Slurm node to be idle", || {
            slurm
                .command("sinfo")
                .args(["-h", "-o", "%t"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle")
        });
        slurm
    }

    fn conf(&self) -> std::path::PathBuf {
        self.dir.path().join("slurm.conf")
    }

    /// A Slurm client command (`sbatch`, `squeue`, ...) against this cluster.
    fn command(&self, program: &str) -> std::process::Command {
        let mut command = std::process::Command::new(program);
        command.env("SLURM_CONF", self.conf());
        command
    }

    /// The array tasks of job `job` still queued or running.
    fn pending(&self, job: &str) -> usize {
        let out = self
            .command("squeue")
            .args(["-h", "-r", "-j", job, "-o", "%i"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        for pid_file in ["slurmd.pid", "slurmctld.pid", "munge/munged.pid"] {
            if let Ok(pid) = std::fs::read_to_string(self.dir.path().join(pid_file)) {
                let _ = std::process::Command::new("kill").arg(pid.trim()).status();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs slurm (slurmctld, slurmd, sbatch: apt-get install slurmctld slurmd slurm-client munge; .ci/run installs them), run as root; runs with `cargo test --test suite -- --ignored`"]
async fn a_slurm_array_killed_and_requeued_then_merged_gives_what_one_run_gives() {
    // sbatch needs a cluster to say its version; slurmd and munged say theirs alone.
    support::require("slurmd");
    support::require("munged");
    let items = items(24);
    // One task at a time in each shard, so that a requeue finds array task 1 halfway.
    let text = pipeline(&items, "    concurrency: 1\n");
    let whole_server = MockServer::start(MockConfig::new()).await;
    let whole = project(&whole_server).write_raw("pipelines/tickets.yaml", &text);
    summon(
        &whole,
        &["run", "pipelines/tickets.yaml", "--out", "res", "--quiet"],
    )
    .expect(0);

    let slurm = Slurm::start();
    let server = MockServer::start(MockConfig::new().latency(Duration::from_millis(700))).await;
    let t = project(&server)
        .write_raw("pipelines/tickets.yaml", &text)
        .write_raw("shards.sh", &docs_sbatch_script());
    // sbatch passes its environment to the job: the project's, with summon on PATH.
    let base = t.command();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_summon"))
        .parent()
        .unwrap()
        .to_owned();
    let mut sbatch = slurm.command("sbatch");
    sbatch
        .args(["--parsable", "--oversubscribe", "shards.sh"])
        .current_dir(t.path());
    for (key, value) in base.get_envs() {
        if let Some(value) = value {
            sbatch.env(key, value);
        }
    }
    sbatch.env(
        "PATH",
        format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
    );
    let submitted = sbatch.output().unwrap();
    assert!(submitted.status.success(), "{submitted:?}");
    let job = String::from_utf8(submitted.stdout)
        .unwrap()
        .trim()
        .to_owned();

    // Once array task 1 has finished a few tasks, requeue it: Slurm stops it (SIGTERM, then
    // SIGKILL after KillWait) and runs it again with the same command.
    let shard = |i: u32| t.path().join(format!("shards/shard-{i}"));
    support::wait_for(
        Duration::from_secs(120),
        "array task 1's first results",
        || results(&shard(1)).len() >= 2,
    );
    let task = format!("{job}_1");
    let requeued = slurm
        .command("scontrol")
        .args(["requeue", &task])
        .status()
        .unwrap();
    assert!(requeued.success());
    // Slurm starts a requeued task again once the credentials of its first attempt have
    // expired (`cred_expire`: 5 s on this cluster, 120 s by default).
    let done = |i: u32| {
        std::fs::read_to_string(shard(i).join("manifest.json"))
            .is_ok_and(|text| text.contains("\"status\": \"completed\""))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(150);
    while slurm.pending(&job) > 0 || !(0..4).all(done) {
        if std::time::Instant::now() > deadline {
            let queue = slurm
                .command("squeue")
                .args(["-r", "-o", "%i %t %r"])
                .output()
                .unwrap();
            let log = |name: &str| {
                std::fs::read_to_string(slurm.dir.path().join(name)).unwrap_or_default()
            };
            panic!(
                "the array did not end:\n{}\n--- slurmctld\n{}\n--- slurmd\n{}",
                String::from_utf8_lossy(&queue.stdout),
                log("slurmctld.log"),
                log("slurmd.log")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    for i in 0..4 {
        let log = std::fs::read_to_string(t.path().join(format!("slurm-{job}_{i}.out")))
            .unwrap_or_default();
        let manifest = support::read_json(&shard(i).join("manifest.json"));
        assert_eq!(manifest["status"], "completed", "shard {i}:\n{log}");
        assert_eq!(manifest["shard"]["index"], i + 1, "shard {i}");
    }
    let log1 = std::fs::read_to_string(t.path().join(format!("slurm-{job}_1.out"))).unwrap();
    assert!(
        log1.contains("terminated (SIGTERM)") && log1.contains("--resume=auto: continuing run"),
        "the requeued task continued its run:\n{log1}"
    );
    // The requeued task sent again at most the tasks in flight when it was stopped.
    let per_item = sent_count(&server, "Process ");
    assert_eq!(per_item.len(), 24, "{per_item:?}");
    let twice = per_item.values().filter(|&&n| n > 1).count();
    assert!(twice <= 1, "{twice} items sent twice: {per_item:?}");

    summon(
        &t,
        &[
            "merge",
            "pipelines/tickets.yaml",
            "shards/shard-0",
            "shards/shard-1",
            "shards/shard-2",
            "shards/shard-3",
            "--out",
            "res",
            "--quiet",
        ],
    )
    .expect(0);
    assert_eq!(
        result_set(&t.path().join("res")),
        result_set(&whole.path().join("res"))
    );
    // The same counts, but for the tasks the requeued shard took from its journal.
    assert_eq!(
        without_times(&report_counts(&t.path().join("res"))),
        without_times(&report_counts(&whole.path().join("res")))
    );
    drop(slurm);
}
