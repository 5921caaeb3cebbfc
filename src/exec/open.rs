//! The first phase of a run: open a new run in the store or resume an earlier one, take it
//! for this process, and open what records its tasks (the journal, `results.jsonl`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::scheduler::RunOptions;
use crate::config::Config;
use crate::env::Env;
use crate::error::{Error, Result};
use crate::output::ResultsWriter;
use crate::pipeline::model::Pipeline;
use crate::source::Catalog;
use crate::store::{
    FinishedMap, JournalWriter, RunRecord, RunSetup, RunStatus, Store, TaskResultRow, WriterOptions,
};

/// A run opened (or resumed) and held by this process, with its journal and output files.
pub(super) struct OpenRun {
    pub(super) store: Store,
    pub(super) run: RunRecord,
    /// The pipeline file, as recorded in the store.
    pub(super) path_text: String,
    /// The catalog the run uses: frozen into the journal, thawed on `--resume`.
    pub(super) catalog: Catalog,
    /// Tasks finished by an earlier attempt of this run (`--resume`).
    pub(super) finished: FinishedMap,
    /// Answers of earlier runs a step may reuse, by request hash.
    pub(super) reusable: HashMap<String, TaskResultRow>,
    pub(super) journal: JournalWriter,
    /// How many journal rows are committed, in record order.
    pub(super) committed: tokio::sync::watch::Receiver<u64>,
    /// Cancelled when the journal cannot be written: the run stops.
    pub(super) stop: tokio_util::sync::CancellationToken,
    pub(super) results: Option<ResultsWriter>,
    /// Results already in `results.jsonl` from before a resume.
    pub(super) already_written: Written,
    /// What an earlier attempt of this run spent, USD (`--resume`).
    pub(super) spent_before: f64,
    /// The run's live lock, held until the run ends.
    pub(super) live: crate::store::live::LiveLock,
}

impl OpenRun {
    /// Opens the run `options` ask for.
    pub(super) fn open(
        env: &Env,
        config: &Config,
        catalog: Catalog,
        pipeline: &Pipeline,
        options: &RunOptions,
    ) -> Result<Self> {
        let store = Store::open_for(env)?;
        if let Some(fs) = crate::store::live::network_filesystem(store.dir()) {
            eprintln!(
                "summon: warning: the run journal `{}` is on {fs}, where SQLite is not safe for \
                 processes of different hosts: run each shard from a working directory on \
                 node-local disk and give `--out` a folder on the shared one (docs/sharding.md, \
                 \"Shared folders\")",
                store.dir().display()
            );
        }
        let pipeline_path = pipeline
            .file
            .path()
            .canonicalize()
            .unwrap_or_else(|_| pipeline.file.path().to_path_buf());
        let path_text = pipeline_path.display().to_string();
        let params_json = serde_json::to_string(&options.params).unwrap_or_default();
        // Answers are signed with a key outside the workspace; reuse and --resume take only
        // signed ones.
        let key = match env.state_dir().map(|dir| crate::store::load_key(&dir)) {
            Some(Ok(key)) => Some(key),
            Some(Err(e)) => {
                eprintln!(
                    "summon: warning: cannot read or create the signing key of reused answers \
                     ({e}); this run's answers are not signed, so they will not be reused"
                );
                None
            }
            None => None,
        };
        let (run, finished, catalog) = match &options.resume {
            None => {
                let pipeline_hash = super::hash::request_hash(&[Some(&pipeline.file.text)]);
                // The catalog is frozen into the journal for `--resume`.
                let run = store.create_run(
                    &path_text,
                    &pipeline_hash,
                    &params_json,
                    &crate::source::freeze(&catalog).to_string(),
                    options.plan.journal_tag().as_deref(),
                )?;
                (run, HashMap::new(), catalog)
            }
            Some(wanted) => {
                let (run, catalog) = resume(
                    &store,
                    &path_text,
                    &params_json,
                    wanted.as_deref(),
                    pipeline,
                    options,
                    catalog,
                )?;
                let finished = signed_finished(&store, &run.run_id, key.as_ref())?;
                (run, finished, catalog)
            }
        };
        let defaults = run_defaults(env, config);
        // The absolute --out, so that two runs into one directory are seen as such.
        let out_text = options
            .out_dir
            .as_ref()
            .map(|d| absolute(&env.cwd.join(d)).display().to_string());
        let setup = RunSetup {
            out: options.out_dir.as_ref().map(|d| d.display().to_string()),
            junit: options.junit.as_ref().map(|j| j.display().to_string()),
            concurrency: options.concurrency,
            max_cost_micro_usd: options.max_cost.map(crate::store::micro_usd),
            // A resumed run keeps what it spent before.
            spent_micro_usd: run.setup.as_ref().and_then(|s| s.spent_micro_usd),
        };
        store.set_run_setup(&run.run_id, out_text.as_deref(), &setup, &defaults)?;
        let live = hold(&store, &run, options.resume.is_none(), options.wait)?;
        let reuse_any = options.reuse || pipeline.steps.iter().any(|s| s.reuse);
        let reusable = if reuse_any {
            let reusable = store.reusable(&path_text, &run.run_id, &defaults, key.as_ref())?;
            if reusable.unsigned > 0 {
                eprintln!(
                    "summon: warning: {} of earlier runs {} no valid signature of summon's key \
                     (written by something other than summon, or before answers were signed): \
                     not reused; a task that needs one is asked again",
                    crate::plural::count(reusable.unsigned, "answer"),
                    if reusable.unsigned == 1 {
                        "has"
                    } else {
                        "have"
                    },
                );
            }
            reusable.rows
        } else {
            HashMap::new()
        };
        crate::env::crash_point("run-created");
        let (commit_sender, committed) = tokio::sync::watch::channel(0u64);
        let commit_sender = std::sync::Arc::new(commit_sender);
        let sender = std::sync::Arc::clone(&commit_sender);
        let hook = Box::new(move |rows: &[TaskResultRow]| {
            sender.send_modify(|n| *n += rows.len() as u64);
        });
        // A batch that cannot be written (a full disk) stops the run: no task waits for a
        // commit that will not come.
        let stop = tokio_util::sync::CancellationToken::new();
        let on_failure = {
            let stop = stop.clone();
            Box::new(move |_: &str| {
                stop.cancel();
                commit_sender.send_modify(|n| *n = u64::MAX);
            })
        };
        // Group commit: each commit takes every row recorded while the previous one ran.
        let writer_options = WriterOptions {
            max_rows: 4096,
            max_delay: Duration::ZERO,
            on_commit: Some(hook),
            on_failure: Some(on_failure),
            key,
        };
        let journal = store.journal_writer(&run.run_id, writer_options)?;
        let (results, already_written) = open_results(env, options)?;
        let spent_before = setup.spent_micro_usd.unwrap_or(0) as f64 / 1e6;
        Ok(Self {
            store,
            run,
            path_text,
            catalog,
            finished,
            reusable,
            journal,
            committed,
            stop,
            results,
            already_written,
            spent_before,
            live,
        })
    }
}

/// The earlier run `--resume` names (`None`: the last one of this pipeline), checked against
/// this one's parameters and shard, with its finished tasks and its own catalog.
fn resume(
    store: &Store,
    path_text: &str,
    params_json: &str,
    wanted: Option<&str>,
    pipeline: &Pipeline,
    options: &RunOptions,
    catalog: Catalog,
) -> Result<(RunRecord, Catalog)> {
    let journal_tag = options.plan.journal_tag();
    let run = match wanted {
        Some(id) => store.get_run(id)?,
        None => store.last_run_of_shard(path_text, journal_tag.as_deref())?,
    };
    let Some(run) = run else {
        return Err(Error::usage(match wanted {
            Some(id) if store.was_pruned(id).unwrap_or(false) => format!(
                "run `{id}` was pruned by retention (store.keep_runs, store.keep_days) \
                 and cannot be resumed; `summon runs` lists the runs kept"
            ),
            Some(id) => format!("no run `{id}` to resume; `summon runs` lists the runs"),
            None => format!(
                "no earlier run of `{}` to resume",
                pipeline.file.path().display()
            ),
        }));
    };
    if run.params_json != params_json {
        return Err(Error::usage(format!(
            "run {} used other parameters ({}); resume it with the same --param values, or \
             leave out --resume to start a new run with these",
            run.run_id, run.params_json
        )));
    }
    if run.shard != journal_tag {
        let describe =
            |tag: Option<&str>| tag.map_or("a whole run".to_owned(), |t| format!("`{t}`"));
        return Err(Error::usage(format!(
            "run {} is {}, not {}; resume it with the same --shard/--until",
            run.run_id,
            describe(run.shard.as_deref()),
            describe(journal_tag.as_deref())
        )));
    }
    store.set_run_status(&run.run_id, RunStatus::Running)?;
    // The run's own catalog, not a new scan.
    let frozen: Value = serde_json::from_str(&run.catalog_json).unwrap_or(Value::Null);
    let catalog = if frozen.is_array() {
        crate::source::thaw(&frozen)
    } else {
        catalog
    };
    Ok((run, catalog))
}

/// The tasks a resumed run finished, as far as summon's signature says: a row written into
/// the store by anything else runs again, with one warning counting them.
fn signed_finished(store: &Store, run_id: &str, key: Option<&[u8; 32]>) -> Result<FinishedMap> {
    let (finished, unsigned) = store.finished_signed(run_id, key)?;
    if unsigned > 0 {
        eprintln!(
            "summon: warning: {} of run {} {} no valid signature of summon's key (written by \
             something other than summon, or before answers were signed): not taken as done; \
             {} again",
            crate::plural::count(unsigned, "recorded task"),
            run_id,
            if unsigned == 1 { "has" } else { "have" },
            if unsigned == 1 { "it runs" } else { "they run" },
        );
    }
    Ok(finished)
}

/// The `(step, index)` of each task a `results.jsonl` lists.
type Written = HashSet<(String, u64)>;

/// `results.jsonl` in `--out` (appended to on a resume, with the tasks it already lists).
fn open_results(env: &Env, options: &RunOptions) -> Result<(Option<ResultsWriter>, Written)> {
    let Some(dir) = &options.out_dir else {
        return Ok((None, HashSet::new()));
    };
    let resuming = options.resume.is_some();
    let dir = env.cwd.join(dir);
    std::fs::create_dir_all(&dir)?;
    // A link planted at a file the run writes is refused now, before any request.
    for name in [crate::output::REPORT_FILE, crate::output::HTML_FILE] {
        crate::safe_fs::refuse_link(&dir.join(name))?;
    }
    if let Some(junit) = &options.junit {
        crate::safe_fs::refuse_link(&env.cwd.join(junit))?;
    }
    if options.plan.writes_manifest() {
        // A manifest describes a finished run: the old one goes until this one ends.
        super::plan::remove_manifest(&dir)?;
    }
    let written = if resuming {
        crate::output::read_results(&dir).unwrap_or_default()
    } else {
        HashSet::new()
    };
    Ok((Some(ResultsWriter::create(&dir, resuming)?), written))
}

/// Takes the run for this process. Another live run of the same pipeline refuses it (or,
/// with `wait`, is waited for); a run left `running` by a killed process is taken over.
fn hold(
    store: &Store,
    run: &RunRecord,
    fresh: bool,
    wait: bool,
) -> Result<crate::store::live::LiveLock> {
    let pid = std::process::id();
    let mut told = false;
    // The run's live lock first: two processes that resume one run (the same shard requeued
    // twice, in two containers or on two hosts sharing the folder) never both run it.
    let live = loop {
        match crate::store::live::take(store.dir(), &run.run_id)? {
            Ok(live) => break live,
            Err(holder) if !wait => {
                return Err(Error::Busy(format!(
                    "run {} is already running ({holder}); two processes never run one run: \
                     wait for it with --wait, or stop it first",
                    run.run_id
                )));
            }
            Err(holder) => {
                if !told {
                    eprintln!("summon: waiting for run {} to end ({holder})", run.run_id);
                    told = true;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        }
    };
    loop {
        let held = store.hold_run(&run.run_id, pid, fresh && !wait, crate::process::pid_alive)?;
        let Some(held) = held else {
            return Ok(live);
        };
        if !wait {
            return Err(Error::Busy(if held.same_pipeline {
                format!(
                    "run {} of this pipeline is still running (pid {}); wait for it with \
                     --wait, or stop it first",
                    held.run_id, held.pid
                )
            } else {
                format!(
                    "run {} (pid {}) is writing the same --out directory; use another \
                     --out, or wait for it with --wait",
                    held.run_id, held.pid
                )
            }));
        }
        if !told {
            // Before the run's display starts: nothing to tear.
            eprintln!(
                "summon: waiting for run {} of this pipeline to end (pid {})",
                held.run_id, held.pid
            );
            told = true;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `path` without `.` and `..` components (the directory may not exist yet).
fn absolute(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// What picks the default provider and model of a run: answers are reused only from runs
/// where it was the same.
fn run_defaults(env: &Env, config: &Config) -> String {
    let vars = [
        "SUMMON_SUBAGENT_PROVIDER",
        "SUMMON_SUBAGENT_MODEL",
        "GOOSE_SUBAGENT_PROVIDER",
        "GOOSE_SUBAGENT_MODEL",
        "SUMMON_PROVIDER",
        "SUMMON_MODEL",
        "OPENAI_BASE_URL",
        "ANTHROPIC_BASE_URL",
        "OLLAMA_HOST",
    ];
    let mut map = serde_json::Map::new();
    for var in vars {
        if let Some(value) = env.var(var) {
            map.insert(var.to_owned(), Value::from(value));
        }
    }
    for (key, value) in [
        ("default_provider", &config.default_provider),
        ("default_model", &config.default_model),
    ] {
        if let Some(value) = value {
            map.insert(key.to_owned(), Value::from(value.value.as_str()));
        }
    }
    Value::Object(map).to_string()
}
