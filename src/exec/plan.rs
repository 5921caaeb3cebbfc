//! Runs that are part of a whole: a shard (`--shard I/N`), a partial run (`--until STEP`), a
//! run that takes steps computed elsewhere (`--items-from DIR`), and `summon merge`.
//!
//! The [`Plan`] tells the scheduler what each step does (see [`Role`]); steps whose outcome
//! is given are not run: their data is set and, outside a shard, their tasks are written to
//! the outputs as if they had just run.
//!
//! A shard or `--until` run leaves `DIR/manifest.json` next to `results.jsonl` and
//! `report.json` (written atomically when the run ends, also when it fails):
//!
//! ```json
//! {
//!   "format": 1,
//!   "pipeline": {"name": "tickets", "hash": "<sha-256 of the pipeline file>"},
//!   "params": {"since": "v1.0.0"},
//!   "shard": {"index": 2, "count": 3},        // null for --until
//!   "until": null,                             // the STEP of --until
//!   "status": "completed",                     // or "failed", "interrupted"
//!   "steps": [
//!     {"id": "list", "kind": "decompose", "role": "run", "status": "succeeded",
//!      "error": null, "items": ["a", "b"], "digest": "<sha-256>"},
//!     {"id": "each", "kind": "fan_out", "role": "shard", "status": "succeeded",
//!      "error": null, "width": 2},
//!     {"id": "sum", "kind": "synthesize", "role": "merge", "status": "deferred", "error": null}
//!   ],
//!   "tasks": [{"step": "each", "index": 1, "hash": "<sha-256>", "model": "gpt-4o-mini"}]
//! }
//! ```
//!
//! `tasks` lists every task of the run, each with the content hash of its rendered request
//! (the partition key) and its model; `results.jsonl` holds the rest of each task. A step that
//! the run took from `--items-from` carries its data and, in `records`, its tasks, so that the
//! merge can report them once. `digest` lets the merge check that every shard saw the same
//! items and outputs.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::context::{StepData, StepOutputs};
use super::hash::request_hash;
use crate::diag::Diagnostic;
use crate::env::Env;
use crate::event::{CapSummary, StepStatus, TaskDone, TaskTrace};
use crate::pipeline::items::open_file_items;
use crate::pipeline::model::{OnError, Pipeline, Step, StepKind};
use crate::pipeline::shard::{Role, Shard, shard_roles, until_roles};
use crate::provider::Usage;

/// The file name inside the `--out` directory.
pub(crate) const MANIFEST_FILE: &str = "manifest.json";
const FORMAT: u32 = 1;

/// What kind of run this is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum Mode {
    /// The whole pipeline (some steps may be given by `--items-from`).
    #[default]
    Whole,
    Shard(Shard),
    /// `--until STEP`.
    Until(String),
    /// `summon merge`.
    Merge,
}

/// A step's outcome computed elsewhere.
#[derive(Debug, Clone)]
pub(crate) struct Given {
    pub(crate) data: StepData,
    pub(crate) status: StepStatus,
    pub(crate) error: Option<String>,
    /// Its tasks, in item order.
    pub(crate) records: Vec<GivenTask>,
}

/// One finished task as a shard reports it: its `results.jsonl` line, its request hash and
/// its model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct GivenTask {
    pub(crate) step: String,
    pub(crate) index: u64,
    pub(crate) item: Value,
    pub(crate) status: String,
    pub(crate) output: String,
    pub(crate) error: Option<String>,
    pub(crate) turns: u32,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) duration_ms: u64,
    pub(crate) hash: String,
    pub(crate) model: Option<String>,
    /// The provider batch that answered it, if any (priced at the batch rate).
    #[serde(default)]
    pub(crate) batch_id: Option<String>,
    /// The structured answer was taken from text around it.
    #[serde(default)]
    pub(crate) extracted: bool,
    /// Answers sent back for correction.
    #[serde(default)]
    pub(crate) corrections: u32,
    /// Start time, prompt, tools and waits, from the shard's `results.jsonl` (its start time
    /// counts from the start of the shard's run); kept in a manifest's `records` too.
    #[serde(default)]
    pub(crate) trace: TaskTrace,
    /// The parsed answer of a schema-validated task.
    #[serde(default)]
    pub(crate) data: Option<Value>,
    /// The agent role it ran as.
    #[serde(default)]
    pub(crate) role: Option<String>,
    /// Input tokens read from / written to the provider's prompt cache.
    #[serde(default)]
    pub(crate) cache_read_tokens: u64,
    #[serde(default)]
    pub(crate) cache_write_tokens: u64,
}

impl GivenTask {
    /// The record as a finished task of step number `step`.
    pub(crate) fn to_done(&self, step: usize) -> TaskDone {
        TaskDone {
            step,
            index: self.index,
            item: self.item.clone(),
            ok: self.status == "completed",
            output: self.output.clone(),
            structured: self.data.clone(),
            extracted: self.extracted,
            corrections: self.corrections,
            error: self.error.clone().map(crate::event::Failure::other),
            turns: self.turns,
            usage: Usage {
                input_tokens: self.input_tokens,
                output_tokens: self.output_tokens,
                cache_read_tokens: self.cache_read_tokens,
                cache_write_tokens: self.cache_write_tokens,
            },
            duration: Duration::from_millis(self.duration_ms),
            model: self.model.clone(),
            resumed: false,
            reused: false,
            hash: self.hash.clone(),
            batch_id: self.batch_id.clone(),
            trace: self.trace.clone(),
            warnings: Vec::new(),
            role: self.role.clone(),
        }
    }
}

/// A task of the run, as `manifest.json` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct TaskRef {
    pub(crate) step: String,
    pub(crate) index: u64,
    pub(crate) hash: String,
    pub(crate) model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) batch_id: Option<String>,
}

/// What each step of a run does, and the outcomes given to it.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub(crate) mode: Mode,
    /// By step index; empty: every step runs.
    roles: Vec<Role>,
    /// By step index; empty: none given.
    given: Vec<Option<Given>>,
    /// Said once the run starts (steps left for the merge).
    pub(crate) notes: Vec<String>,
    /// The provider retries, by class, of the runs that gave steps (a merge's shards).
    pub(crate) given_retries: BTreeMap<String, u64>,
    /// The output limits the requests of the given steps were sent with, by step id.
    pub(crate) given_output_limits: BTreeMap<String, CapSummary>,
}

impl Plan {
    pub(crate) fn role(&self, step: usize) -> Role {
        self.roles.get(step).copied().unwrap_or(Role::Run)
    }

    pub(crate) fn given(&self, step: usize) -> Option<&Given> {
        self.given.get(step).and_then(Option::as_ref)
    }

    /// The shard whose part of step `step` this run sends, if it sends only a part.
    pub(crate) fn step_shard(&self, step: usize) -> Option<Shard> {
        match (&self.mode, self.role(step)) {
            (Mode::Shard(shard), Role::Shard) => Some(*shard),
            _ => None,
        }
    }

    /// What the run journal records about this run (`--resume` continues a run with the
    /// same description).
    pub(crate) fn journal_tag(&self) -> Option<String> {
        match &self.mode {
            Mode::Whole => None,
            Mode::Shard(shard) => Some(json!({ "shard": shard.to_string() }).to_string()),
            Mode::Until(step) => Some(json!({ "until": step }).to_string()),
            Mode::Merge => Some(json!({ "merge": true }).to_string()),
        }
    }

    /// Whether the tasks of given steps go to this run's outputs (a shard leaves them to the
    /// merge).
    pub(crate) fn emits_given(&self) -> bool {
        !matches!(self.mode, Mode::Shard(_))
    }

    pub(crate) fn writes_manifest(&self) -> bool {
        matches!(self.mode, Mode::Shard(_) | Mode::Until(_))
    }

    /// Whether the final step's text goes to stdout (not for a part of a run).
    pub(crate) fn prints_output(&self) -> bool {
        matches!(self.mode, Mode::Whole | Mode::Merge)
    }

    /// The line said when the run is over, for a part of a run.
    pub(crate) fn closing_note(&self, out: &Path, shown: &str) -> Option<String> {
        let out = out.display();
        match &self.mode {
            Mode::Shard(shard) => Some(format!(
                "shard {shard} is in `{out}`; when every shard is done, combine them with \
                 `summon merge {shown} DIR...`"
            )),
            Mode::Until(step) => Some(format!(
                "computed up to `{step}` in `{out}`; give every shard `--items-from {out}`"
            )),
            _ => None,
        }
    }
}

/// The content hash of a pipeline file, as the journal and manifests record it.
pub(crate) fn pipeline_hash(pipeline: &Pipeline) -> String {
    request_hash(&[Some(&pipeline.file.text)])
}

/// What `summon run` asked for beyond a whole run.
#[derive(Debug, Default)]
pub(crate) struct RunRequest<'a> {
    pub(crate) shard: Option<&'a str>,
    pub(crate) until: Option<&'a str>,
    pub(crate) items_from: Option<&'a Path>,
    pub(crate) out: Option<&'a Path>,
    /// The pipeline path as the user wrote it, for hints.
    pub(crate) shown: &'a str,
}

/// The plan of `summon run`: a whole run, a shard (from `--shard` or the Kubernetes
/// variables), or `--until`; with the steps of `--items-from` given.
pub(crate) fn plan_for_run(
    env: &Env,
    pipeline: &Pipeline,
    params: &IndexMap<String, String>,
    request: &RunRequest<'_>,
) -> Result<Plan, Diagnostic> {
    // The provider's waits and windows, refused here rather than halfway through the run.
    crate::provider::RetryPolicy::from_env(env).map_err(Diagnostic::error)?;
    // `--shard` wins over a scheduler's variables.
    let from_env = if request.shard.is_none() {
        Shard::from_env_by(env).map_err(Diagnostic::error)?
    } else {
        None
    };
    let shard = match request.shard {
        Some(text) => Some(Shard::parse(text).map_err(Diagnostic::error)?),
        None => from_env.map(|(shard, _)| shard),
    };
    let mode = match (shard, request.until) {
        (Some(shard), Some(step)) => {
            let how = if let Some((_, by)) = from_env {
                format!("{by} selects shard {shard}")
            } else {
                format!("`--shard {shard}` is given")
            };
            return Err(Diagnostic::error(format!(
                "`--until {step}` computes steps once for every shard, but {how}"
            ))
            .with_hint("run `--until` once, without --shard, then each shard with --items-from"));
        }
        (Some(shard), None) => Mode::Shard(shard),
        (None, Some(step)) => Mode::Until(step.to_owned()),
        (None, None) => Mode::Whole,
    };
    if request.out.is_none() {
        let what = match &mode {
            Mode::Shard(shard) if let Some((_, by)) = from_env => Some(format!(
                "{by} selects shard {shard}, which needs `--out DIR`: `summon merge` combines \
                 the shards from there"
            )),
            Mode::Shard(shard) => Some(format!(
                "`--shard {shard}` needs `--out DIR`: `summon merge` combines the shards from there"
            )),
            Mode::Until(step) => Some(format!(
                "`--until {step}` needs `--out DIR`: the shards take the steps from there \
                 (`--items-from DIR`)"
            )),
            _ => None,
        };
        if let Some(what) = what {
            return Err(Diagnostic::error(what));
        }
    }
    let n = pipeline.steps.len();
    let mut given: Vec<Option<Given>> = vec![None; n];
    if let Some(dir) = request.items_from {
        let loaded = LoadedDir::read(&env.cwd.join(dir), &dir.display().to_string())?;
        loaded.check_same_run(pipeline, params)?;
        if loaded.manifest.until.is_none() {
            return Err(loaded.error(
                "is a shard's output; `--items-from` takes the output of `summon run --until STEP`",
            ));
        }
        if loaded.manifest.status != ManifestStatus::Completed {
            return Err(loaded.error(&format!(
                "holds a run that {}; finish it with `--resume` first",
                if loaded.manifest.status == ManifestStatus::Interrupted {
                    "was interrupted"
                } else {
                    "failed"
                }
            )));
        }
        for (i, step) in pipeline.steps.iter().enumerate() {
            let Some(m) = loaded.step(&step.id) else {
                continue;
            };
            if matches!(m.role, Role::Run | Role::Given) && m.status == StepStatus::Succeeded {
                given[i] = Some(loaded.given_step(step, m));
            }
        }
    }
    let is_given: Vec<bool> = given.iter().map(Option::is_some).collect();
    let (roles, notes) = match &mode {
        Mode::Shard(_) => {
            shard_roles(pipeline, &is_given, request.shown).map_err(Diagnostic::error)?
        }
        Mode::Until(step) => (
            until_roles(pipeline, step, &is_given).map_err(Diagnostic::error)?,
            Vec::new(),
        ),
        _ => (
            is_given
                .iter()
                .map(|&g| if g { Role::Given } else { Role::Run })
                .collect(),
            Vec::new(),
        ),
    };
    Ok(Plan {
        mode,
        roles,
        given,
        notes,
        given_retries: BTreeMap::new(),
        given_output_limits: BTreeMap::new(),
    })
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Manifest {
    format: u32,
    pipeline: ManifestPipeline,
    params: IndexMap<String, String>,
    shard: Option<ManifestShard>,
    until: Option<String>,
    status: ManifestStatus,
    steps: Vec<ManifestStep>,
    tasks: Vec<TaskRef>,
}

/// How the run that wrote a manifest ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ManifestStatus {
    Completed,
    Failed,
    Interrupted,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ManifestPipeline {
    name: String,
    hash: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct ManifestShard {
    index: u32,
    count: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ManifestStep {
    id: String,
    kind: String,
    role: Role,
    status: StepStatus,
    error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    items: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output: Option<String>,
    /// For a sharded fan-out: how many items the whole step has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    width: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    digest: Option<String>,
    /// The tasks of a step given by `--items-from`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    records: Vec<GivenTask>,
}

/// The items of a decompose step's data, read from its file when they were streamed.
fn data_items(data: &StepData) -> std::io::Result<Option<Vec<Value>>> {
    if let Some(items) = &data.items {
        return Ok(Some(items.clone()));
    }
    let Some(path) = &data.file else {
        return Ok(None);
    };
    let reader = open_file_items(path).map_err(|e| std::io::Error::other(e.to_string()))?;
    reader
        .map(|r| r.map_err(|e| std::io::Error::other(e.to_string())))
        .collect::<std::io::Result<Vec<_>>>()
        .map(Some)
}

fn digest_of(value: &Value) -> String {
    request_hash(&[Some(&value.to_string())])
}

/// What the scheduler hands over when a shard or `--until` run ends.
pub(crate) struct Finished<'a> {
    pub(crate) pipeline: &'a Pipeline,
    pub(crate) params: &'a IndexMap<String, String>,
    pub(crate) plan: &'a Plan,
    pub(crate) statuses: &'a [(String, StepStatus, Option<String>)],
    pub(crate) outputs: &'a StepOutputs,
    pub(crate) tasks: &'a [TaskRef],
    pub(crate) interrupted: bool,
}

/// Removes `dir/manifest.json`, if any.
pub(crate) fn remove_manifest(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(dir.join(MANIFEST_FILE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Writes `dir/manifest.json` atomically.
pub(crate) fn write_manifest(dir: &Path, run: &Finished<'_>) -> std::io::Result<()> {
    let Finished { pipeline, plan, .. } = run;
    let mut steps = Vec::with_capacity(pipeline.steps.len());
    for (i, (step, (_, status, error))) in pipeline.steps.iter().zip(run.statuses).enumerate() {
        let role = plan.role(i);
        let data = run.outputs.get(i);
        let mut entry = ManifestStep {
            id: step.id.clone(),
            kind: step.kind.name().to_owned(),
            role,
            status: *status,
            error: error.clone(),
            items: None,
            output: None,
            width: None,
            digest: None,
            // A shard leaves given tasks to the merge; other runs list them in `tasks`.
            records: match (plan.emits_given(), plan.given(i)) {
                (false, Some(given)) => given.records.clone(),
                _ => Vec::new(),
            },
        };
        if *status == StepStatus::Succeeded && matches!(role, Role::Run | Role::Given) {
            match &step.kind {
                StepKind::Decompose(_) => {
                    let items = data_items(&data)?.unwrap_or_default();
                    entry.digest = Some(digest_of(&Value::from(items.clone())));
                    entry.items = Some(items);
                }
                StepKind::FanOut(_) => {
                    entry.digest = data
                        .results
                        .as_ref()
                        .map(|r| digest_of(&Value::from(r.clone())));
                }
                StepKind::Synthesize(_) | StepKind::Delegate(_) => {
                    entry.digest = data.output.as_ref().map(|o| digest_of(&json!(o)));
                    entry.output = data.output;
                }
            }
        }
        if role == Role::Shard
            && let StepKind::FanOut(fan_out) = &step.kind
            && let Some(over) = fan_out.over_step
        {
            let over_data = run.outputs.get(over);
            entry.width = data_items(&over_data)?.map(|items| items.len() as u64);
        }
        steps.push(entry);
    }
    let any_failed = run
        .statuses
        .iter()
        .any(|(_, s, _)| matches!(s, StepStatus::Failed | StepStatus::Skipped));
    let manifest = Manifest {
        format: FORMAT,
        pipeline: ManifestPipeline {
            name: pipeline.name.clone(),
            hash: pipeline_hash(pipeline),
        },
        params: run.params.clone(),
        shard: match plan.mode {
            Mode::Shard(s) => Some(ManifestShard {
                index: s.index,
                count: s.count,
            }),
            _ => None,
        },
        until: match &plan.mode {
            Mode::Until(step) => Some(step.clone()),
            _ => None,
        },
        status: if run.interrupted {
            ManifestStatus::Interrupted
        } else if any_failed {
            ManifestStatus::Failed
        } else {
            ManifestStatus::Completed
        },
        steps,
        tasks: last_of_each(run.tasks),
    };
    let mut bytes = serde_json::to_vec_pretty(&manifest).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    crate::output::write_atomically(&dir.join(MANIFEST_FILE), &bytes)
}

/// One entry per task (the last, for a task that ran again), in first-seen order.
fn last_of_each(tasks: &[TaskRef]) -> Vec<TaskRef> {
    let mut position: HashMap<(&str, u64), usize> = HashMap::new();
    let mut out: Vec<TaskRef> = Vec::with_capacity(tasks.len());
    for task in tasks {
        match position.get(&(task.step.as_str(), task.index)) {
            Some(&at) => out[at] = task.clone(),
            None => {
                position.insert((task.step.as_str(), task.index), out.len());
                out.push(task.clone());
            }
        }
    }
    out
}

/// A shard's or `--until` run's output directory, read back.
struct LoadedDir {
    /// As the user wrote it.
    shown: String,
    manifest_path: PathBuf,
    manifest: Manifest,
    /// Every task of the run (from `tasks` and `results.jsonl`), by step id, in item order.
    records: HashMap<String, Vec<GivenTask>>,
    /// The provider retries by class its `report.json` counts (none without one).
    retries: BTreeMap<String, u64>,
    /// The output limits its steps' requests were sent with, by step id, from `report.json`.
    output_limits: BTreeMap<String, CapSummary>,
}

/// `retries_by_class` and `output_limits` of the `report.json` at `path`; empty when it
/// cannot be read.
fn read_report(path: &Path) -> (BTreeMap<String, u64>, BTreeMap<String, CapSummary>) {
    let Some(report) = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
    else {
        return Default::default();
    };
    let retries = report["retries_by_class"]
        .as_object()
        .map(|classes| {
            classes
                .iter()
                .filter_map(|(class, n)| Some((class.clone(), n.as_u64()?)))
                .collect()
        })
        .unwrap_or_default();
    let limits = report["output_limits"]
        .as_object()
        .map(|steps| {
            steps
                .iter()
                .filter_map(|(step, summary)| {
                    Some((step.clone(), serde_json::from_value(summary.clone()).ok()?))
                })
                .collect()
        })
        .unwrap_or_default();
    (retries, limits)
}

/// The parameters a shard ran with (`summon merge` takes them when given none).
pub(crate) fn shard_params(env: &Env, dir: &Path) -> Result<IndexMap<String, String>, Diagnostic> {
    let (_, manifest) = read_manifest(&env.cwd.join(dir), &dir.display().to_string())?;
    Ok(manifest.params)
}

/// `dir/manifest.json`, and its path.
fn read_manifest(dir: &Path, shown: &str) -> Result<(PathBuf, Manifest), Diagnostic> {
    let manifest_path = dir.join(MANIFEST_FILE);
    if !dir.is_dir() {
        return Err(Diagnostic::error(format!("`{shown}` is not a directory")));
    }
    let text = match std::fs::read_to_string(&manifest_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Diagnostic::error(format!(
                "`{shown}` has no {MANIFEST_FILE}: it is not the `--out` of a finished \
                 `summon run --shard` or `--until`"
            ))
            .with_hint("a run that was killed writes it when it is continued with `--resume`"));
        }
        Err(e) => {
            return Err(Diagnostic::error(format!("cannot read: {e}")).in_file(&manifest_path));
        }
    };
    let manifest: Manifest = serde_json::from_str(&text).map_err(|e| {
        Diagnostic::error(format!(
            "line {}, column {}: not a summon manifest: {e}",
            e.line(),
            e.column()
        ))
        .in_file(&manifest_path)
    })?;
    if manifest.format != FORMAT {
        return Err(Diagnostic::error(format!(
            "`format` is {}; this summon reads format {FORMAT}",
            manifest.format
        ))
        .in_file(&manifest_path));
    }
    Ok((manifest_path, manifest))
}

impl LoadedDir {
    fn read(dir: &Path, shown: &str) -> Result<Self, Diagnostic> {
        let (manifest_path, manifest) = read_manifest(dir, shown)?;
        let results_path = dir.join(crate::output::RESULTS_FILE);
        let mut lines: HashMap<(String, u64), Value> = HashMap::new();
        if !manifest.tasks.is_empty() {
            let results = std::fs::read_to_string(&results_path).map_err(|e| {
                Diagnostic::error(format!("cannot read: {e}")).in_file(&results_path)
            })?;
            for (n, line) in results.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let value: Value = serde_json::from_str(line).map_err(|e| {
                    Diagnostic::error(format!("line {}: not a JSON line: {e}", n + 1))
                        .in_file(&results_path)
                })?;
                let key = (
                    value["step"].as_str().unwrap_or_default().to_owned(),
                    value["index"].as_u64().unwrap_or_default(),
                );
                lines.insert(key, value);
            }
        }
        let mut records: HashMap<String, Vec<GivenTask>> = HashMap::new();
        for task in &manifest.tasks {
            let Some(line) = lines.remove(&(task.step.clone(), task.index)) else {
                return Err(Diagnostic::error(format!(
                    "has no line for task {} of step `{}`, which {MANIFEST_FILE} lists",
                    task.index, task.step
                ))
                .in_file(&results_path));
            };
            let text = |key: &str| line[key].as_str().map(str::to_owned);
            let number = |key: &str| line[key].as_u64().unwrap_or_default();
            records
                .entry(task.step.clone())
                .or_default()
                .push(GivenTask {
                    step: task.step.clone(),
                    index: task.index,
                    item: line["item"].clone(),
                    status: text("status").unwrap_or_default(),
                    output: text("output").unwrap_or_default(),
                    error: text("error"),
                    turns: u32::try_from(number("turns")).unwrap_or(u32::MAX),
                    input_tokens: number("input_tokens"),
                    output_tokens: number("output_tokens"),
                    duration_ms: number("duration_ms"),
                    hash: task.hash.clone(),
                    model: task.model.clone(),
                    batch_id: task.batch_id.clone(),
                    extracted: line["extracted"].as_bool().unwrap_or_default(),
                    corrections: u32::try_from(number("corrections")).unwrap_or(u32::MAX),
                    trace: TaskTrace::from_line(&line),
                    data: Some(line["data"].clone()).filter(|d| !d.is_null()),
                    cache_read_tokens: number("cache_read_tokens"),
                    cache_write_tokens: number("cache_write_tokens"),
                    role: text("role"),
                });
        }
        if let Some(((step, index), _)) = lines.into_iter().next() {
            return Err(Diagnostic::error(format!(
                "task {} of step `{step}` is not in {MANIFEST_FILE}: the two files are from \
                 different runs",
                index
            ))
            .in_file(&results_path));
        }
        for list in records.values_mut() {
            list.sort_by_key(|r| r.index);
        }
        let (retries, output_limits) = read_report(&dir.join(crate::output::REPORT_FILE));
        Ok(Self {
            shown: shown.to_owned(),
            manifest_path,
            manifest,
            records,
            retries,
            output_limits,
        })
    }

    /// An error about this directory: `` `DIR` `` then `what`.
    fn error(&self, what: &str) -> Diagnostic {
        Diagnostic::error(format!("`{}` {what}", self.shown))
    }

    fn shard(&self) -> Option<Shard> {
        self.manifest.shard.map(|s| Shard {
            index: s.index,
            count: s.count,
        })
    }

    fn step(&self, id: &str) -> Option<&ManifestStep> {
        self.manifest.steps.iter().find(|s| s.id == id)
    }

    /// The same pipeline (by content) and the same parameters.
    fn check_same_run(
        &self,
        pipeline: &Pipeline,
        params: &IndexMap<String, String>,
    ) -> Result<(), Diagnostic> {
        let theirs = &self.manifest.pipeline;
        let ours = pipeline_hash(pipeline);
        if theirs.hash != ours {
            let what = if theirs.name == pipeline.name {
                format!("another version of pipeline `{}`", pipeline.name)
            } else {
                format!("pipeline `{}`, not `{}`", theirs.name, pipeline.name)
            };
            return Err(Diagnostic::error(format!(
                "`{}` was made by {what} (`pipeline.hash` {} there, {} here)",
                self.shown,
                short(&theirs.hash),
                short(&ours)
            ))
            .in_file(&self.manifest_path));
        }
        let keys: std::collections::BTreeSet<&String> =
            params.keys().chain(self.manifest.params.keys()).collect();
        for key in keys {
            let (there, here) = (self.manifest.params.get(key), params.get(key));
            if there != here {
                let show = |v: Option<&String>| v.map_or("unset".to_owned(), |v| format!("`{v}`"));
                return Err(Diagnostic::error(format!(
                    "`{}` ran with other parameters: `params.{key}` is {} there, {} here",
                    self.shown,
                    show(there),
                    show(here)
                ))
                .in_file(&self.manifest_path)
                .with_hint("give the same `--param` values to every shard and to the merge"));
            }
        }
        if self.manifest.steps.len() != pipeline.steps.len()
            || self
                .manifest
                .steps
                .iter()
                .zip(&pipeline.steps)
                .any(|(m, s)| m.id != s.id)
        {
            return Err(self
                .error("lists other steps than the pipeline")
                .in_file(&self.manifest_path));
        }
        Ok(())
    }

    /// A step this directory's run computed, as given to another run.
    fn given_step(&self, step: &Step, m: &ManifestStep) -> Given {
        let mut records = m.records.clone();
        records.extend(self.records.get(&step.id).cloned().unwrap_or_default());
        records.sort_by_key(|r| r.index);
        Given {
            data: step_data(step, m.items.clone(), m.output.clone(), &records),
            status: m.status,
            error: m.error.clone(),
            records,
        }
    }
}

fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

/// A step's data as later templates see it.
fn step_data(
    step: &Step,
    items: Option<Vec<Value>>,
    output: Option<String>,
    records: &[GivenTask],
) -> StepData {
    match &step.kind {
        StepKind::Decompose(_) => StepData {
            items,
            ..StepData::default()
        },
        StepKind::FanOut(_) => StepData {
            results: Some(
                records
                    .iter()
                    .map(|r| json!({"item": r.item, "output": r.output, "status": r.status, "data": r.data}))
                    .collect(),
            ),
            ..StepData::default()
        },
        StepKind::Synthesize(_) | StepKind::Delegate(_) => StepData {
            output,
            data: records.first().and_then(|r| r.data.clone()),
            ..StepData::default()
        },
    }
}

/// Whether a whole fan-out's tasks meet its `on_error`/`min_success` rule, as `summon run`
/// decides it; the error when they do not.
fn fan_out_outcome(step: &Step, records: &[GivenTask]) -> (StepStatus, Option<String>) {
    let total = records.len();
    let successes = records.iter().filter(|r| r.status == "completed").count();
    let failures = total - successes;
    let needed = match (step.min_success, step.on_error) {
        (Some(min), _) => min.required(total),
        // At least one (`min_success: 0` says that none may).
        (None, OnError::Continue) => total.min(1),
        (None, OnError::FailFast) => total,
    };
    let ok = successes >= needed
        && !(step.on_error == OnError::FailFast && step.min_success.is_none() && failures > 0);
    if ok {
        return (StepStatus::Succeeded, None);
    }
    let first = records
        .iter()
        .find(|r| r.status != "completed")
        .map(|r| {
            format!(
                "task {} failed: {}",
                r.index,
                r.error.clone().unwrap_or_default()
            )
        })
        .unwrap_or_default();
    (
        StepStatus::Failed,
        Some(format!(
            "{successes} of {total} tasks succeeded (needed {needed}); {first}"
        )),
    )
}

/// The plan of `summon merge`: checks that the directories are the complete, non-overlapping
/// shards of one run of this pipeline with these parameters, and gives the merge what they
/// computed. `dirs` are as the user wrote them (relative to the working directory).
pub(crate) fn plan_for_merge(
    env: &Env,
    pipeline: &Pipeline,
    params: &IndexMap<String, String>,
    dirs: &[PathBuf],
    shown: &str,
) -> Result<Plan, Diagnostic> {
    let mut loaded = Vec::with_capacity(dirs.len());
    for dir in dirs {
        let dir_shown = dir.display().to_string();
        let one = LoadedDir::read(&env.cwd.join(dir), &dir_shown)?;
        one.check_same_run(pipeline, params)?;
        if one.manifest.until.is_some() || one.shard().is_none() {
            return Err(one
                .error("is the output of `summon run --until`, not of a shard")
                .with_hint("give `summon merge` the `--out` directories of the shards"));
        }
        loaded.push(one);
    }
    let Some(first) = loaded.first() else {
        return Err(Diagnostic::error("no shard directory given"));
    };
    let count = first.shard().map_or(1, |s| s.count);
    let mut by_index: BTreeMap<u32, &LoadedDir> = BTreeMap::new();
    for one in &loaded {
        let shard = one.shard().unwrap_or(Shard { index: 1, count: 1 });
        if shard.count != count {
            return Err(Diagnostic::error(format!(
                "`{}` is shard {shard}, but `{}` is shard {}: the shards of one run share N",
                one.shown,
                first.shown,
                first.shard().map_or_else(String::new, |s| s.to_string())
            ))
            .in_file(&one.manifest_path));
        }
        if let Some(other) = by_index.insert(shard.index, one) {
            let same = match (
                other.manifest_path.canonicalize(),
                one.manifest_path.canonicalize(),
            ) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            };
            return Err(Diagnostic::error(if same {
                format!("`{}` is given twice", one.shown)
            } else {
                format!(
                    "`{}` and `{}` are both shard {shard}",
                    other.shown, one.shown
                )
            }));
        }
        if one.manifest.status == ManifestStatus::Interrupted {
            return Err(one
                .error(&format!("(shard {shard}) was interrupted"))
                .with_hint(format!(
                    "finish it with `summon run {shown} --shard {shard} --out {} --resume`",
                    one.shown
                )));
        }
    }
    let missing: Vec<String> = (1..=count)
        .filter(|i| !by_index.contains_key(i))
        .map(|i| format!("{i}/{count}"))
        .collect();
    if !missing.is_empty() {
        let have: Vec<String> = by_index
            .iter()
            .map(|(i, d)| format!("{i}/{count} in `{}`", d.shown))
            .collect();
        return Err(Diagnostic::error(format!(
            "shard{} {} {} missing (given: {})",
            crate::plural::s(missing.len() as u64),
            missing.join(", "),
            if missing.len() == 1 { "is" } else { "are" },
            have.join(", ")
        )));
    }
    let shards: Vec<&LoadedDir> = by_index.values().copied().collect();
    let n = pipeline.steps.len();
    let mut roles = vec![Role::Run; n];
    let mut given: Vec<Option<Given>> = vec![None; n];
    for (i, step) in pipeline.steps.iter().enumerate() {
        let first = &shards[0];
        let role_of = |d: &LoadedDir| d.manifest.steps[i].role;
        let role = role_of(first);
        if let Some(other) = shards.iter().find(|d| role_of(d) != role) {
            return Err(Diagnostic::error(format!(
                "`{}` and `{}` split the pipeline differently: step `{}` is `{}` in one and `{}` \
                 in the other",
                first.shown,
                other.shown,
                step.id,
                role.as_str(),
                role_of(other).as_str()
            ))
            .with_hint("run every shard with the same `--items-from`"));
        }

        // A failed or skipped step in any shard is failed or skipped for the merge.
        let mut worst: Option<(StepStatus, Option<String>)> = None;
        for d in &shards {
            let m = &d.manifest.steps[i];
            let status = m.status;
            let shard = d.shard().map_or_else(String::new, |s| s.to_string());
            match status {
                StepStatus::Failed => {
                    worst = Some((
                        StepStatus::Failed,
                        Some(format!(
                            "shard {shard} (`{}`): {}",
                            d.shown,
                            m.error.clone().unwrap_or_default()
                        )),
                    ));
                    break;
                }
                StepStatus::Skipped if worst.is_none() => worst = Some((StepStatus::Skipped, None)),
                _ => {}
            }
        }
        match role {
            Role::Merge => roles[i] = Role::Run,
            Role::Run | Role::Given => {
                roles[i] = Role::Given;
                let m = &first.manifest.steps[i];
                if worst.is_none()
                    && let Some(other) = shards
                        .iter()
                        .find(|d| d.manifest.steps[i].digest != m.digest)
                {
                    let describe = |d: &LoadedDir| {
                        let m = &d.manifest.steps[i];
                        match &m.items {
                            Some(items) => crate::plural::count(items.len() as u64, "item"),
                            None => format!("digest {}", short(m.digest.as_deref().unwrap_or(""))),
                        }
                    };
                    return Err(Diagnostic::error(format!(
                        "`{}` and `{}` disagree on what step `{}` made ({} in one, {} in the \
                         other): every shard must see the same items",
                        first.shown,
                        other.shown,
                        step.id,
                        describe(first),
                        describe(other)
                    ))
                    .with_hint(
                        "items must come from a deterministic source; compute model-made or \
                         changing ones once with `--until` and give them with `--items-from`",
                    ));
                }
                let mut one = first.given_step(step, m);
                if let Some((status, error)) = worst {
                    one.status = status;
                    one.error = error;
                }
                given[i] = Some(one);
            }
            Role::Shard => {
                roles[i] = Role::Given;
                given[i] = Some(merge_sharded(step, i, &shards, worst)?);
            }
            Role::Skip => {
                return Err(Diagnostic::error(format!(
                    "step `{}` was skipped by every shard; these are not shard outputs",
                    step.id
                ))
                .in_file(&first.manifest_path));
            }
        }
    }
    // Shards that ran their tasks with different models are one run only in name: said,
    // naming the shards and the models.
    let mut notes = Vec::new();
    let mut models: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for d in &shards {
        let shard = d.shard().map_or_else(String::new, |s| s.to_string());
        for model in d
            .manifest
            .tasks
            .iter()
            .filter_map(|t| t.model.as_deref())
            .collect::<std::collections::BTreeSet<_>>()
        {
            models
                .entry(model)
                .or_default()
                .push(format!("{shard} (`{}`)", d.shown));
        }
    }
    if models.len() > 1 {
        let each: Vec<String> = models
            .iter()
            .map(|(model, shards)| format!("`{model}` in shard {}", shards.join(", ")))
            .collect();
        notes.push(format!(
            "the shards ran their tasks with different models: {}; the merged results mix \
             them (run every shard with the same configuration and SUMMON_MODEL)",
            each.join("; ")
        ));
    }
    let mut given_retries: BTreeMap<String, u64> = BTreeMap::new();
    for d in &shards {
        for (class, n) in &d.retries {
            *given_retries.entry(class.clone()).or_default() += n;
        }
    }
    let mut given_output_limits = BTreeMap::new();
    for (i, step) in pipeline.steps.iter().enumerate() {
        if roles[i] != Role::Given {
            continue;
        }
        let parts = shards
            .iter()
            .filter_map(|d| d.output_limits.get(&step.id).cloned());
        if let Some(summary) = CapSummary::combine(parts) {
            given_output_limits.insert(step.id.clone(), summary);
        }
    }
    Ok(Plan {
        mode: Mode::Merge,
        roles,
        given,
        notes,
        given_retries,
        given_output_limits,
    })
}

/// The tasks of a sharded fan-out from every shard: each item in exactly one shard, in the
/// shard that its hash selects.
fn merge_sharded(
    step: &Step,
    i: usize,
    shards: &[&LoadedDir],
    worst: Option<(StepStatus, Option<String>)>,
) -> Result<Given, Diagnostic> {
    let width = shards[0].manifest.steps[i].width;
    if let Some(other) = shards.iter().find(|d| d.manifest.steps[i].width != width) {
        return Err(Diagnostic::error(format!(
            "`{}` and `{}` disagree on how many items step `{}` has ({} and {})",
            shards[0].shown,
            other.shown,
            step.id,
            width.map_or("unknown".into(), |w| w.to_string()),
            other.manifest.steps[i]
                .width
                .map_or("unknown".into(), |w| w.to_string()),
        )));
    }
    let mut owner: BTreeMap<u64, &str> = BTreeMap::new();
    let mut records: Vec<GivenTask> = Vec::new();
    for d in shards {
        let shard = d.shard().unwrap_or(Shard { index: 1, count: 1 });
        for record in d.records.get(&step.id).into_iter().flatten() {
            let belongs = Shard::of(&record.hash, shard.count);
            if belongs != shard.index {
                return Err(Diagnostic::error(format!(
                    "`{}` (shard {shard}) ran task {} of step `{}`, which belongs to shard \
                     {belongs}/{} by the hash of its inputs: the shards rendered different inputs",
                    d.shown, record.index, step.id, shard.count
                ))
                .in_file(&d.manifest_path));
            }
            if let Some(other) = owner.insert(record.index, &d.shown) {
                return Err(Diagnostic::error(format!(
                    "task {} of step `{}` is in both `{other}` and `{}`",
                    record.index, step.id, d.shown
                )));
            }
            records.push(record.clone());
        }
    }
    records.sort_by_key(|r| r.index);
    let (status, error) = match worst {
        Some(worst) => worst,
        None => {
            if let Some(width) = width {
                let missing: Vec<String> = (0..width)
                    .filter(|i| !owner.contains_key(i))
                    .take(5)
                    .map(|i| i.to_string())
                    .collect();
                if !missing.is_empty() || records.len() as u64 != width {
                    return Err(Diagnostic::error(format!(
                        "no shard ran task{} {} of step `{}` ({} of {width} tasks are here)",
                        crate::plural::s(missing.len() as u64),
                        missing.join(", "),
                        step.id,
                        records.len()
                    )));
                }
            }
            fan_out_outcome(step, &records)
        }
    };
    Ok(Given {
        data: step_data(step, None, None, &records),
        status,
        error,
        records,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::{Diagnostics, SourceFile};
    use crate::pipeline::model::MinSuccess;
    use crate::pipeline::parse::parse_pipeline;

    fn read(text: &str) -> Pipeline {
        let file = SourceFile::new(std::path::Path::new("p.yaml"), text.to_owned());
        let mut diags = Diagnostics::default();
        parse_pipeline(&file, &mut diags).expect("a valid pipeline")
    }

    fn record(index: u64, ok: bool) -> GivenTask {
        GivenTask {
            step: "each".into(),
            index,
            item: json!(index),
            status: if ok { "completed" } else { "failed" }.into(),
            output: String::new(),
            error: (!ok).then(|| "boom".into()),
            turns: 1,
            input_tokens: 1,
            output_tokens: 1,
            duration_ms: 1,
            hash: String::new(),
            model: None,
            batch_id: None,
            extracted: false,
            corrections: 0,
            trace: TaskTrace::default(),
            data: None,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
            role: None,
        }
    }

    #[test]
    fn a_merged_fan_out_follows_its_step_rules() {
        let p = read(
            "version: 1\nsteps:\n  - id: list\n    decompose: {items: [a]}\n  - id: each\n    fan_out: {over: list, instructions: x}\n",
        );
        let mut step = p.steps[1].clone();
        let three = [record(0, true), record(1, false), record(2, true)];
        let (status, error) = fan_out_outcome(&step, &three);
        assert_eq!(status, StepStatus::Failed);
        assert_eq!(
            error.as_deref(),
            Some("2 of 3 tasks succeeded (needed 3); task 1 failed: boom")
        );
        step.min_success = Some(MinSuccess::Count(2));
        assert_eq!(fan_out_outcome(&step, &three).0, StepStatus::Succeeded);
        step.min_success = Some(MinSuccess::Percent(80.0));
        assert_eq!(fan_out_outcome(&step, &three).0, StepStatus::Failed);
        step.min_success = None;
        step.on_error = OnError::Continue;
        assert_eq!(fan_out_outcome(&step, &three).0, StepStatus::Succeeded);
    }

    #[test]
    fn journal_tags_tell_runs_apart() {
        let shard = Plan {
            mode: Mode::Shard(Shard { index: 2, count: 3 }),
            ..Plan::default()
        };
        assert_eq!(shard.journal_tag().as_deref(), Some(r#"{"shard":"2/3"}"#));
        assert_eq!(Plan::default().journal_tag(), None);
        assert!(!shard.emits_given() && shard.writes_manifest() && !shard.prints_output());
    }
}
