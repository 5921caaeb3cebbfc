//! Splitting a pipeline across machines: which shard `I/N` a run is (`--shard I/N`, or the
//! index variables of a Kubernetes Indexed Job, a Slurm job array, GitLab's `parallel:` or an
//! AWS Batch array job), which fan-out items it
//! owns, and what each step does in a sharded or partial run ([`Role`]).
//!
//! **Partition.** A fan-out task belongs to shard `1 + h mod N`, where `h` is the first 64 bits
//! of the content hash of its rendered request (the hash `--resume` uses). Every shard renders
//! every item, so all of them agree on the split without talking to each other, and an item is
//! owned by exactly one shard. The hash depends only on what is sent, so the split is the same
//! on every machine that renders the same inputs.
//!
//! **Roles.** In a shard, a decompose from a command, list, file or glob runs in every shard
//! (it is cheap and must give every shard the same items); a fan-out over items known that way
//! runs its own part; every step that calls a model once (a model decompose, `synthesize`,
//! `delegate`) and everything that needs a whole fan-out's results is left for `summon merge`.
//! A fan-out whose items would come from a model is refused: each shard would ask the model
//! for its own list, so the split would not be a partition. `--until STEP` computes such
//! steps once; `--items-from` hands them to every shard.

use std::fmt;

use super::graph::Graph;
use super::model::{Decompose, Pipeline, StepKind};
use crate::env::Env;

/// Shard `index` of `count`, counting from 1 (as Playwright and Jest do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shard {
    pub(crate) index: u32,
    pub(crate) count: u32,
}

impl Shard {
    /// `I/N` with `1 ≤ I ≤ N`.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let expected = "expected I/N with 1 ≤ I ≤ N, as in `--shard 2/3`";
        let (i, n) = text
            .split_once('/')
            .ok_or_else(|| format!("invalid shard `{text}`: {expected}"))?;
        let number = |part: &str, what: &str| {
            part.trim().parse::<u32>().map_err(|_| {
                format!(
                    "invalid shard `{text}`: {what} `{}` is not a whole number; {expected}",
                    part.trim()
                )
            })
        };
        let index = number(i, "shard index")?;
        let count = number(n, "shard count")?;
        if count == 0 {
            return Err(format!(
                "invalid shard `{text}`: the shard count must be at least 1"
            ));
        }
        if index == 0 {
            return Err(format!(
                "invalid shard `{text}`: shards count from 1 (1/{count} to {count}/{count})"
            ));
        }
        if index > count {
            return Err(format!(
                "invalid shard `{text}`: there is no shard {index} of {count} (1/{count} to {count}/{count})"
            ));
        }
        Ok(Self { index, count })
    }

    /// The shard a scheduler's array job says this process is, when `--shard` is not given
    /// (see [`Shard::from_env_by`]).
    #[cfg(test)]
    pub(crate) fn from_env(env: &Env) -> Result<Option<Self>, String> {
        Ok(Self::from_env_by(env)?.map(|(shard, _)| shard))
    }

    /// The shard a scheduler's index variables select, and the variable that selects it, each
    /// scheduler with its own arithmetic:
    ///
    /// - Kubernetes Indexed Job: `JOB_COMPLETION_INDEX` (from 0, set by Kubernetes) + 1 of
    ///   `JOB_COMPLETIONS` (set in the pod template);
    /// - Slurm job array: (`SLURM_ARRAY_TASK_ID` − `SLURM_ARRAY_TASK_MIN`) /
    ///   `SLURM_ARRAY_TASK_STEP` (1 when unset) + 1 of `SLURM_ARRAY_TASK_COUNT`, for an array
    ///   given as a range (`--array=0-3`, `1-8`, `0-15:5`);
    /// - GitLab `parallel:`: `CI_NODE_INDEX` (from 1) of `CI_NODE_TOTAL`;
    /// - AWS Batch array job: `AWS_BATCH_JOB_ARRAY_INDEX` (from 0) + 1 of
    ///   `AWS_BATCH_JOB_ARRAY_SIZE`.
    ///
    /// `None` when no scheduler's index is set. An index without its count, one out of range,
    /// or two schedulers that disagree is an error naming the variables, since every process
    /// would otherwise run everything or the wrong part.
    pub(crate) fn from_env_by(env: &Env) -> Result<Option<(Self, &'static str)>, String> {
        let found: Vec<(Self, &'static str)> =
            [kubernetes(env)?, slurm(env)?, gitlab(env)?, aws_batch(env)?]
                .into_iter()
                .flatten()
                .collect();
        let Some(&(first, by)) = found.first() else {
            return Ok(None);
        };
        if let Some(&(other, other_by)) = found.iter().find(|(shard, _)| *shard != first) {
            return Err(format!(
                "{by} selects shard {first} but {other_by} selects shard {other}: the variables \
                 of two schedulers are set and disagree; pass `--shard I/N`"
            ));
        }
        Ok(Some((first, by)))
    }

    /// The shard (1-based) that owns a task with this content hash (hex) among `count`.
    pub(crate) fn of(hash: &str, count: u32) -> u32 {
        let prefix = hash.get(..16).unwrap_or(hash);
        let h = u64::from_str_radix(prefix, 16).unwrap_or(0);
        // `count` ≥ 1, so the remainder fits in u32.
        (h % u64::from(count.max(1))) as u32 + 1
    }

    /// Whether this shard runs the task with this content hash.
    pub(crate) fn owns(self, hash: &str) -> bool {
        Self::of(hash, self.count) == self.index
    }
}

/// A whole number from variable `name`, if set.
fn number(env: &Env, name: &str, what: &str) -> Result<Option<u32>, String> {
    env.var(name)
        .map(|value| {
            value
                .trim()
                .parse::<u32>()
                .map_err(|_| format!("{name}=`{}` is not a whole number{what}", value.trim()))
        })
        .transpose()
}

/// `index` (from 0) of `count`, as a shard, or the error naming `index_name` and `count_name`.
fn zero_based(index: u32, count: u32, index_name: &str, count_name: &str) -> Result<Shard, String> {
    if count == 0 {
        return Err(format!(
            "{count_name}=0: the shard count must be at least 1"
        ));
    }
    if index >= count {
        return Err(format!(
            "{index_name}={index} is out of range for {count_name}={count} (the index counts \
             from 0 to {})",
            count - 1
        ));
    }
    Ok(Shard {
        index: index + 1,
        count,
    })
}

/// A Kubernetes Indexed Job's pod.
fn kubernetes(env: &Env) -> Result<Option<(Shard, &'static str)>, String> {
    let index = number(env, "JOB_COMPLETION_INDEX", " (it counts from 0)")?;
    let count = number(env, "JOB_COMPLETIONS", "")?;
    match (index, count) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(
            "JOB_COMPLETION_INDEX is set but JOB_COMPLETIONS is not: set \
                                JOB_COMPLETIONS to the Job's `completions` in the pod template, \
                                or pass `--shard I/N`"
                .into(),
        ),
        (None, Some(_)) => Err(
            "JOB_COMPLETIONS is set but JOB_COMPLETION_INDEX is not: the Job \
                                needs `completionMode: Indexed`, or pass `--shard I/N`"
                .into(),
        ),
        (Some(index), Some(count)) => Ok(Some((
            zero_based(index, count, "JOB_COMPLETION_INDEX", "JOB_COMPLETIONS")?,
            "JOB_COMPLETION_INDEX",
        ))),
    }
}

/// A task of a Slurm job array (`sbatch --array=MIN-MAX[:STEP]`).
fn slurm(env: &Env) -> Result<Option<(Shard, &'static str)>, String> {
    let Some(id) = number(env, "SLURM_ARRAY_TASK_ID", "")? else {
        return Ok(None);
    };
    let (Some(min), Some(count)) = (
        number(env, "SLURM_ARRAY_TASK_MIN", "")?,
        number(env, "SLURM_ARRAY_TASK_COUNT", "")?,
    ) else {
        return Err("SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_MIN or \
                    SLURM_ARRAY_TASK_COUNT is not (Slurm sets them in every task of an array); \
                    pass `--shard I/N`"
            .into());
    };
    let step = number(env, "SLURM_ARRAY_TASK_STEP", "")?
        .unwrap_or(1)
        .max(1);
    let max = number(env, "SLURM_ARRAY_TASK_MAX", "")?;
    let range = |max: u32| {
        max >= min && (max - min).is_multiple_of(step) && (max - min) / step + 1 == count
    };
    if id < min || !(id - min).is_multiple_of(step) || max.is_some_and(|max| !range(max)) {
        return Err(format!(
            "SLURM_ARRAY_TASK_ID={id} is not one of a range of SLURM_ARRAY_TASK_COUNT={count} \
             tasks from SLURM_ARRAY_TASK_MIN={min} in steps of {step}: give the array as a range \
             (`--array=0-{}`), or pass `--shard I/N`",
            count.saturating_sub(1)
        ));
    }
    Ok(Some((
        zero_based(
            (id - min) / step,
            count,
            "SLURM_ARRAY_TASK_ID",
            "SLURM_ARRAY_TASK_COUNT",
        )?,
        "SLURM_ARRAY_TASK_ID",
    )))
}

/// A job of GitLab CI's `parallel:` (`CI_NODE_TOTAL` is set in every job, 1 without it).
fn gitlab(env: &Env) -> Result<Option<(Shard, &'static str)>, String> {
    let Some(index) = number(env, "CI_NODE_INDEX", " (it counts from 1)")? else {
        return Ok(None);
    };
    let Some(count) = number(env, "CI_NODE_TOTAL", "")? else {
        return Err("CI_NODE_INDEX is set but CI_NODE_TOTAL is not; pass `--shard I/N`".into());
    };
    if index == 0 || index > count {
        return Err(format!(
            "CI_NODE_INDEX={index} is out of range for CI_NODE_TOTAL={count} (the index counts \
             from 1 to {count})"
        ));
    }
    Ok(Some((Shard { index, count }, "CI_NODE_INDEX")))
}

/// A child of an AWS Batch array job.
fn aws_batch(env: &Env) -> Result<Option<(Shard, &'static str)>, String> {
    let Some(index) = number(env, "AWS_BATCH_JOB_ARRAY_INDEX", " (it counts from 0)")? else {
        return Ok(None);
    };
    let Some(count) = number(env, "AWS_BATCH_JOB_ARRAY_SIZE", "")? else {
        return Err(
            "AWS_BATCH_JOB_ARRAY_INDEX is set but AWS_BATCH_JOB_ARRAY_SIZE is not; \
                    pass `--shard I/N`"
                .into(),
        );
    };
    Ok(Some((
        zero_based(
            index,
            count,
            "AWS_BATCH_JOB_ARRAY_INDEX",
            "AWS_BATCH_JOB_ARRAY_SIZE",
        )?,
        "AWS_BATCH_JOB_ARRAY_INDEX",
    )))
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// What one step does in a run (in a manifest: `run`, `shard`, `given`, `merge`, `skip`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Role {
    /// Runs here, as in a whole run.
    Run,
    /// A fan-out of which this shard sends only the items it owns.
    Shard,
    /// Its outcome is given: by `--items-from`, or by the shards to `summon merge`.
    Given,
    /// Needs what every shard made: left for `summon merge`.
    Merge,
    /// Not needed for `--until STEP`.
    Skip,
}

impl Role {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Run => "run",
            Self::Shard => "shard",
            Self::Given => "given",
            Self::Merge => "merge",
            Self::Skip => "skip",
        }
    }
}

/// A step that calls a model once: a model decompose, `synthesize` or `delegate`.
fn calls_model_once(kind: &StepKind) -> bool {
    matches!(
        kind,
        StepKind::Decompose(Decompose::Agent(_)) | StepKind::Synthesize(_) | StepKind::Delegate(_)
    )
}

/// The roles of a shard's steps, and notes for the user (fan-outs left for the merge). `given`
/// marks the steps whose outcome `--items-from` supplies; `shown` is the pipeline path as the
/// user wrote it, for the hint. A fan-out whose items depend on a model step that is not given
/// is an error.
pub(crate) fn shard_roles(
    pipeline: &Pipeline,
    given: &[bool],
    shown: &str,
) -> Result<(Vec<Role>, Vec<String>), String> {
    let graph = Graph::new(pipeline);
    let n = pipeline.steps.len();
    let mut roles = vec![Role::Merge; n];
    // For a step left for the merge: whether it waits for a sharded fan-out, and the model
    // steps (not given) it waits for.
    let mut after_shard = vec![false; n];
    let mut models: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &i in graph.order() {
        let step = &pipeline.steps[i];
        let deps = graph.deps(i);
        if given.get(i).copied().unwrap_or(false) {
            roles[i] = Role::Given;
            continue;
        }
        let deps_here = deps
            .iter()
            .all(|&d| matches!(roles[d], Role::Run | Role::Given));
        roles[i] = match &step.kind {
            StepKind::Decompose(d) if !matches!(d, Decompose::Agent(_)) && deps_here => Role::Run,
            StepKind::FanOut(_) if deps_here => Role::Shard,
            _ => Role::Merge,
        };
        if roles[i] == Role::Merge {
            for &d in deps {
                after_shard[i] |= roles[d] == Role::Shard || after_shard[d];
                let inherited = models[d].clone();
                models[i].extend(inherited);
            }
            if calls_model_once(&step.kind) {
                models[i].push(i);
            }
            models[i].sort_unstable();
            models[i].dedup();
        }
    }
    let mut notes = Vec::new();
    for (i, step) in pipeline.steps.iter().enumerate() {
        if !matches!(step.kind, StepKind::FanOut(_)) || roles[i] != Role::Merge {
            continue;
        }
        if !after_shard[i] {
            let names: Vec<String> = models[i]
                .iter()
                .map(|&m| format!("`{}`", pipeline.steps[m].id))
                .collect();
            let first = models[i]
                .last()
                .map_or("STEP", |&m| pipeline.steps[m].id.as_str());
            return Err(format!(
                "step `{}` cannot be sharded: what it fans out over depends on {} {}, which a \
                 model computes, and every shard would compute its own; compute it once with \
                 `summon run {shown} --until {first} --out DIR`, then give every shard \
                 `--items-from DIR`",
                step.id,
                if names.len() == 1 { "step" } else { "steps" },
                names.join(", "),
            ));
        }
        notes.push(format!(
            "step `{}` needs every result of a sharded step; it runs whole in `summon merge`",
            step.id
        ));
    }
    if !roles.contains(&Role::Shard) {
        notes.push(
            "no fan_out step of this pipeline can be split: this shard runs no task and every \
             model step runs in `summon merge`"
                .into(),
        );
    }
    Ok((roles, notes))
}

/// The roles of `--until STEP`: the step and everything it waits for run (or are given), the
/// rest is skipped.
pub(crate) fn until_roles(
    pipeline: &Pipeline,
    until: &str,
    given: &[bool],
) -> Result<Vec<Role>, String> {
    let Some(target) = pipeline.steps.iter().position(|s| s.id == until) else {
        let ids: Vec<String> = pipeline
            .steps
            .iter()
            .map(|s| format!("`{}`", s.id))
            .collect();
        return Err(format!(
            "--until `{until}`: the pipeline has no such step (its steps: {})",
            ids.join(", ")
        ));
    };
    let graph = Graph::new(pipeline);
    let mut needed = vec![false; pipeline.steps.len()];
    let mut stack = vec![target];
    while let Some(i) = stack.pop() {
        if !needed[i] {
            needed[i] = true;
            stack.extend_from_slice(graph.deps(i));
        }
    }
    Ok(needed
        .iter()
        .enumerate()
        .map(
            |(i, &n)| match (n, given.get(i).copied().unwrap_or(false)) {
                (true, true) => Role::Given,
                (true, false) => Role::Run,
                (false, _) => Role::Skip,
            },
        )
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::parse::tests::read_unchecked;

    #[test]
    fn parse_accepts_i_of_n_and_names_each_mistake() {
        assert_eq!(Shard::parse("2/3"), Ok(Shard { index: 2, count: 3 }));
        assert_eq!(Shard::parse("1/1"), Ok(Shard { index: 1, count: 1 }));
        for (text, wanted) in [
            ("0/3", "shards count from 1"),
            ("4/3", "there is no shard 4 of 3"),
            ("1/0", "at least 1"),
            ("x/3", "shard index `x` is not a whole number"),
            ("2/", "shard count `` is not a whole number"),
            ("3", "expected I/N"),
            ("-1/3", "shard index `-1`"),
        ] {
            let error = Shard::parse(text).unwrap_err();
            assert!(error.contains(wanted), "{text}: {error}");
        }
    }

    #[test]
    fn job_completion_index_counts_from_zero() {
        let env = |vars: &[(&str, &str)]| Env::for_test("/", vars);
        assert_eq!(Shard::from_env(&env(&[])), Ok(None));
        assert_eq!(
            Shard::from_env(&env(&[
                ("JOB_COMPLETION_INDEX", "0"),
                ("JOB_COMPLETIONS", "3")
            ])),
            Ok(Some(Shard { index: 1, count: 3 }))
        );
        assert_eq!(
            Shard::from_env(&env(&[
                ("JOB_COMPLETION_INDEX", "2"),
                ("JOB_COMPLETIONS", "3")
            ])),
            Ok(Some(Shard { index: 3, count: 3 }))
        );
        for (vars, wanted) in [
            (
                &[("JOB_COMPLETION_INDEX", "3"), ("JOB_COMPLETIONS", "3")][..],
                "out of range",
            ),
            (
                &[("JOB_COMPLETION_INDEX", "1")][..],
                "JOB_COMPLETIONS is not",
            ),
            (&[("JOB_COMPLETIONS", "3")][..], "completionMode: Indexed"),
            (
                &[("JOB_COMPLETION_INDEX", "a"), ("JOB_COMPLETIONS", "3")][..],
                "not a whole number",
            ),
        ] {
            let error = Shard::from_env(&env(vars)).unwrap_err();
            assert!(error.contains(wanted), "{vars:?}: {error}");
        }
    }

    #[test]
    fn each_scheduler_has_its_own_arithmetic_and_two_that_disagree_are_refused() {
        let env = |vars: &[(&str, &str)]| Env::for_test("/", vars);
        let shard = |index, count| Ok(Some(Shard { index, count }));
        for (vars, wanted) in [
            // Slurm: --array=0-3 (task 2), --array=1-4 (task 4), --array=0-15:5 (task 10).
            (
                &[
                    ("SLURM_ARRAY_TASK_ID", "2"),
                    ("SLURM_ARRAY_TASK_MIN", "0"),
                    ("SLURM_ARRAY_TASK_MAX", "3"),
                    ("SLURM_ARRAY_TASK_COUNT", "4"),
                ][..],
                shard(3, 4),
            ),
            (
                &[
                    ("SLURM_ARRAY_TASK_ID", "4"),
                    ("SLURM_ARRAY_TASK_MIN", "1"),
                    ("SLURM_ARRAY_TASK_COUNT", "4"),
                ][..],
                shard(4, 4),
            ),
            (
                &[
                    ("SLURM_ARRAY_TASK_ID", "10"),
                    ("SLURM_ARRAY_TASK_MIN", "0"),
                    ("SLURM_ARRAY_TASK_MAX", "15"),
                    ("SLURM_ARRAY_TASK_STEP", "5"),
                    ("SLURM_ARRAY_TASK_COUNT", "4"),
                ][..],
                shard(3, 4),
            ),
            // GitLab counts from 1; CI_NODE_TOTAL alone (every job has it) selects nothing.
            (
                &[("CI_NODE_INDEX", "2"), ("CI_NODE_TOTAL", "3")][..],
                shard(2, 3),
            ),
            (&[("CI_NODE_TOTAL", "1")][..], Ok(None)),
            // AWS Batch counts from 0.
            (
                &[
                    ("AWS_BATCH_JOB_ARRAY_INDEX", "0"),
                    ("AWS_BATCH_JOB_ARRAY_SIZE", "5"),
                ][..],
                shard(1, 5),
            ),
            // Two schedulers that agree.
            (
                &[
                    ("JOB_COMPLETION_INDEX", "1"),
                    ("JOB_COMPLETIONS", "3"),
                    ("CI_NODE_INDEX", "2"),
                    ("CI_NODE_TOTAL", "3"),
                ][..],
                shard(2, 3),
            ),
        ] {
            assert_eq!(Shard::from_env(&env(vars)), wanted, "{vars:?}");
        }
        for (vars, wanted) in [
            (
                &[("SLURM_ARRAY_TASK_ID", "2")][..],
                "SLURM_ARRAY_TASK_MIN or SLURM_ARRAY_TASK_COUNT is not",
            ),
            (
                // --array=1,3,4: not a range.
                &[
                    ("SLURM_ARRAY_TASK_ID", "3"),
                    ("SLURM_ARRAY_TASK_MIN", "1"),
                    ("SLURM_ARRAY_TASK_MAX", "4"),
                    ("SLURM_ARRAY_TASK_COUNT", "3"),
                ][..],
                "give the array as a range",
            ),
            (
                &[("CI_NODE_INDEX", "0"), ("CI_NODE_TOTAL", "3")][..],
                "CI_NODE_INDEX=0 is out of range for CI_NODE_TOTAL=3",
            ),
            (
                &[
                    ("AWS_BATCH_JOB_ARRAY_INDEX", "5"),
                    ("AWS_BATCH_JOB_ARRAY_SIZE", "5"),
                ][..],
                "AWS_BATCH_JOB_ARRAY_INDEX=5 is out of range for AWS_BATCH_JOB_ARRAY_SIZE=5",
            ),
            (
                &[("AWS_BATCH_JOB_ARRAY_INDEX", "1")][..],
                "AWS_BATCH_JOB_ARRAY_SIZE is not",
            ),
            (
                &[
                    ("JOB_COMPLETION_INDEX", "0"),
                    ("JOB_COMPLETIONS", "3"),
                    ("CI_NODE_INDEX", "2"),
                    ("CI_NODE_TOTAL", "3"),
                ][..],
                "JOB_COMPLETION_INDEX selects shard 1/3 but CI_NODE_INDEX selects shard 2/3",
            ),
        ] {
            let error = Shard::from_env(&env(vars)).unwrap_err();
            assert!(error.contains(wanted), "{vars:?}: {error}");
        }
    }

    #[test]
    fn every_hash_has_exactly_one_owner_and_shards_are_balanced() {
        let count = 4;
        let mut per_shard = [0u32; 4];
        for i in 0..4000u32 {
            let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(i.to_string()));
            let owners: Vec<u32> = (1..=count)
                .filter(|&index| Shard { index, count }.owns(&hash))
                .collect();
            assert_eq!(owners.len(), 1, "{hash}");
            per_shard[owners[0] as usize - 1] += 1;
        }
        for n in per_shard {
            assert!((800..1200).contains(&n), "{per_shard:?}");
        }
    }

    const PIPELINE: &str = "version: 1
steps:
  - id: list
    decompose: {items: [a, b]}
  - id: each
    fan_out: {over: list, instructions: 'Do {{ item }}'}
  - id: sum
    synthesize: {instructions: '{{ steps.each.results }}'}
  - id: again
    fan_out: {over: list, instructions: '{{ item }} {{ steps.sum.output }}'}
";

    #[test]
    fn shard_roles_split_fan_outs_and_leave_whole_result_steps_for_the_merge() {
        let p = read_unchecked(PIPELINE);
        let (roles, notes) = shard_roles(&p, &[false; 4], "p.yaml").unwrap();
        assert_eq!(roles, [Role::Run, Role::Shard, Role::Merge, Role::Merge]);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("`again`"), "{notes:?}");
    }

    #[test]
    fn a_fan_out_over_model_made_items_needs_items_from() {
        let text = "version: 1
steps:
  - id: topics
    decompose: {instructions: 'List topics'}
  - id: each
    fan_out: {over: topics, instructions: 'Do {{ item }}'}
";
        let p = read_unchecked(text);
        let error = shard_roles(&p, &[false, false], "p.yaml").unwrap_err();
        assert!(error.contains("step `each` cannot be sharded"), "{error}");
        assert!(
            error.contains("`summon run p.yaml --until topics --out DIR`"),
            "{error}"
        );
        let (roles, _) = shard_roles(&p, &[true, false], "p.yaml").unwrap();
        assert_eq!(roles, [Role::Given, Role::Shard]);
    }

    #[test]
    fn until_runs_the_step_and_what_it_waits_for() {
        let p = read_unchecked(PIPELINE);
        assert_eq!(
            until_roles(&p, "each", &[false; 4]).unwrap(),
            [Role::Run, Role::Run, Role::Skip, Role::Skip]
        );
        assert_eq!(
            until_roles(&p, "list", &[false; 4]).unwrap(),
            [Role::Run, Role::Skip, Role::Skip, Role::Skip]
        );
        let error = until_roles(&p, "nope", &[false; 4]).unwrap_err();
        assert!(error.contains("no such step"), "{error}");
        assert!(error.contains("`list`, `each`, `sum`, `again`"), "{error}");
    }
}
