//! Runs over time: who holds a live run, the history `summon runs` lists, retention that keeps
//! the store bounded under a schedule, and the completed tasks a `--reuse` run may take.
//!
//! **Holding a run.** A run records its process id when it starts or resumes
//! ([`Store::hold_run`]). In the same immediate transaction, another run of the same pipeline
//! (and the same shard) that is still `running` with a live process refuses it: two schedules
//! that overlap never pay for the same tasks twice. A `running` run whose process is gone was
//! killed: it is marked `interrupted` and the new run goes ahead.
//!
//! **Retention.** [`Store::prune_runs`] keeps, per pipeline, the newest `keep` runs and every
//! run younger than `keep_days`, deletes the others with their journal rows, and gives the
//! space back to the file system ([`Store::reclaim_space`]).

use std::collections::HashMap;
use std::time::Duration;

use rusqlite::{OptionalExtension, params};
use serde_json::Value;

use super::journal::{RESULT_COLUMNS, RUN_COLUMNS, result_row, run_record};
use super::{RunRecord, RunStatus, Store, StoreError, TaskResultRow, now_ms};

/// Another live run holds the pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) run_id: String,
    pub(crate) pid: u32,
    /// A run of the same pipeline (else one writing the same `--out`).
    pub(crate) same_pipeline: bool,
}

/// One run as `summon runs` lists it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RunListing {
    pub(crate) run: RunRecord,
    pub(crate) completed: u64,
    pub(crate) failed: u64,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    /// The report recorded when the run ended (JSON), if it did.
    pub(crate) report: Option<Value>,
}

/// What [`Store::prune_runs`] removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Pruned {
    pub(crate) runs: u64,
    pub(crate) tasks: u64,
}

/// Which runs [`Store::prune_runs`] keeps of each pipeline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Retention {
    /// The newest this many runs.
    pub(crate) keep: usize,
    /// And every run younger than this.
    pub(crate) keep_for: Duration,
}

impl Default for Retention {
    /// The last 20 runs and anything from the last 7 days.
    fn default() -> Self {
        Self {
            keep: 20,
            keep_for: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

impl Store {
    /// Takes `run_id` for this process (`pid`), unless another run of the same pipeline and
    /// shard is running in a live process (`alive`): then that run is returned and, when
    /// `drop_if_held`, `run_id` (a run that has not started) is deleted. A `running` run whose
    /// process is gone is marked interrupted.
    pub(crate) fn hold_run(
        &self,
        run_id: &str,
        pid: u32,
        drop_if_held: bool,
        alive: impl Fn(u32) -> bool,
    ) -> Result<Option<Held>, StoreError> {
        // A run whose live lock is there is alive exactly while that lock is held, whatever
        // its pid says in this PID namespace; an older run without one goes by its pid.
        let alive = |other: &str, other_pid: u32| match super::live::held(self.dir(), other) {
            Some(held) => held,
            None => other_pid != pid && other_pid != 0 && alive(other_pid),
        };
        self.write(|tx| {
            // Runs of the same pipeline and shard, and runs writing the same --out.
            let mut stmt = tx.prepare(
                "SELECT other.run_id, other.pid,
                        other.pipeline_path = me.pipeline_path AND other.shard IS me.shard
                 FROM runs AS me JOIN runs AS other
                   ON (other.pipeline_path = me.pipeline_path AND other.shard IS me.shard)
                   OR other.out_dir = me.out_dir
                 WHERE me.run_id = ?1 AND other.run_id <> ?1 AND other.status = 'running'
                   AND other.pid IS NOT NULL",
            )?;
            let others: Vec<(String, i64, bool)> = stmt
                .query_map([run_id], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
                .collect::<Result<_, _>>()?;
            for (other, other_pid, same_pipeline) in others {
                let other_pid = u32::try_from(other_pid).unwrap_or(0);
                if alive(&other, other_pid) {
                    if drop_if_held {
                        tx.execute("DELETE FROM runs WHERE run_id = ?1", [run_id])?;
                    }
                    return Ok(Some(Held {
                        run_id: other,
                        pid: other_pid,
                        same_pipeline,
                    }));
                }
                tx.execute(
                    "UPDATE runs SET status = 'interrupted', finished_at = ?2, pid = NULL
                     WHERE run_id = ?1",
                    params![other, now_ms()],
                )?;
            }
            tx.execute(
                "UPDATE runs SET pid = ?2 WHERE run_id = ?1",
                params![run_id, i64::from(pid)],
            )?;
            Ok(None)
        })
    }

    /// Records where the run writes (`--out`), what else `--resume` reuses, and what picks
    /// its default provider and model.
    pub(crate) fn set_run_setup(
        &self,
        run_id: &str,
        out_dir: Option<&str>,
        setup: &super::RunSetup,
        defaults: &str,
    ) -> Result<(), StoreError> {
        let options = serde_json::to_string(setup).unwrap_or_default();
        self.read(|conn| {
            conn.execute(
                "UPDATE runs SET out_dir = ?2, options = ?3, defaults = ?4 WHERE run_id = ?1",
                params![run_id, out_dir, options, defaults],
            )?;
            Ok(())
        })
    }

    /// Records what the run has spent (USD) in its setup, for a resumed run's spend cap.
    pub(crate) fn set_run_spent(&self, run_id: &str, spent: f64) -> Result<(), StoreError> {
        let micro = i64::try_from(super::journal::micro_usd(spent)).unwrap_or(i64::MAX);
        self.read(|conn| {
            conn.execute(
                "UPDATE runs SET options = json_set(coalesce(options, '{}'), \
                 '$.spent_micro_usd', ?2) WHERE run_id = ?1",
                params![run_id, micro],
            )?;
            Ok(())
        })
    }

    /// The report a run left when it last ended, if any.
    pub(crate) fn run_report(&self, run_id: &str) -> Result<Option<Value>, StoreError> {
        self.read(|conn| {
            let report: Option<Option<String>> = conn
                .query_row(
                    "SELECT report FROM runs WHERE run_id = ?1",
                    params![run_id],
                    |row| row.get(0),
                )
                .optional()?;
            Ok(report
                .flatten()
                .and_then(|text| serde_json::from_str(&text).ok()))
        })
    }

    /// Records the report of a run that ended, and lets go of it.
    pub(crate) fn set_run_report(&self, run_id: &str, report: &Value) -> Result<(), StoreError> {
        let text = report.to_string();
        self.read(|conn| {
            conn.execute(
                "UPDATE runs SET report = ?2, pid = NULL WHERE run_id = ?1",
                params![run_id, text],
            )?;
            Ok(())
        })
    }

    /// The runs of the project, newest first; only those of `pipeline` (its path as recorded)
    /// and with `status`, when given.
    pub(crate) fn list_runs(
        &self,
        pipeline: Option<&str>,
        status: Option<RunStatus>,
    ) -> Result<Vec<RunListing>, StoreError> {
        self.read(|conn| {
            let mut stmt = conn.prepare(&format!(
                "SELECT {RUN_COLUMNS}, report,
                    (SELECT count(*) FROM run_tasks t
                      WHERE t.run_id = runs.run_id AND t.status = 'completed'),
                    (SELECT count(*) FROM run_tasks t
                      WHERE t.run_id = runs.run_id AND t.status IN ('failed', 'cancelled')),
                    (SELECT coalesce(sum(input_tokens), 0) FROM run_tasks t
                      WHERE t.run_id = runs.run_id),
                    (SELECT coalesce(sum(output_tokens), 0) FROM run_tasks t
                      WHERE t.run_id = runs.run_id)
                 FROM runs
                 WHERE (?1 IS NULL OR pipeline_path = ?1) AND (?2 IS NULL OR status = ?2)
                 ORDER BY created_at DESC, rowid DESC"
            ))?;
            let rows = stmt.query_map(params![pipeline, status], |row| {
                let report: Option<String> = row.get(12)?;
                Ok(RunListing {
                    run: run_record(row)?,
                    report: report.and_then(|r| serde_json::from_str(&r).ok()),
                    completed: super::uint(row.get(13)?),
                    failed: super::uint(row.get(14)?),
                    input_tokens: super::uint(row.get(15)?),
                    output_tokens: super::uint(row.get(16)?),
                })
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
    }

    /// One run with its report, by id.
    pub(crate) fn run_listing(&self, run_id: &str) -> Result<Option<RunListing>, StoreError> {
        Ok(self
            .list_runs(None, None)?
            .into_iter()
            .find(|r| r.run.run_id == run_id))
    }

    /// Whether a run with this id was removed by retention.
    pub(crate) fn was_pruned(&self, run_id: &str) -> Result<bool, StoreError> {
        self.read(|conn| {
            Ok(conn
                .query_row(
                    "SELECT 1 FROM pruned_runs WHERE run_id = ?1",
                    [run_id],
                    |_| Ok(()),
                )
                .optional()?
                .is_some())
        })
    }

    /// Deletes the runs of every pipeline (or of `pipeline`) that `retention` does not keep,
    /// with their journal rows; never `except` (the run in progress) nor a run that is live.
    pub(crate) fn prune_runs(
        &self,
        pipeline: Option<&str>,
        retention: Retention,
        except: Option<&str>,
    ) -> Result<Pruned, StoreError> {
        let cutoff = now_ms() - i64::try_from(retention.keep_for.as_millis()).unwrap_or(i64::MAX);
        let keep = i64::try_from(retention.keep).unwrap_or(i64::MAX);
        self.write(|tx| {
            let doomed = "SELECT run_id FROM (
                    SELECT run_id, status, created_at, row_number() OVER (
                        PARTITION BY pipeline_path ORDER BY created_at DESC, rowid DESC) AS n
                    FROM runs WHERE ?1 IS NULL OR pipeline_path = ?1)
                 WHERE n > ?2 AND created_at <= ?3 AND status <> 'running'
                   AND run_id IS NOT ?4";
            let tasks: i64 = tx.query_row(
                &format!("SELECT count(*) FROM run_tasks WHERE run_id IN ({doomed})"),
                params![pipeline, keep, cutoff, except],
                |row| row.get(0),
            )?;
            tx.execute(
                &format!(
                    "INSERT OR IGNORE INTO pruned_runs (run_id, pruned_at)
                     SELECT run_id, {} FROM ({doomed})",
                    now_ms()
                ),
                params![pipeline, keep, cutoff, except],
            )?;
            let runs = tx.execute(
                &format!("DELETE FROM runs WHERE run_id IN ({doomed})"),
                params![pipeline, keep, cutoff, except],
            )?;
            if runs > 0 {
                // Outputs no kept task names any more.
                tx.execute(
                    "DELETE FROM outputs WHERE NOT EXISTS (
                        SELECT 1 FROM run_tasks t WHERE t.output_hash = outputs.hash)",
                    [],
                )?;
            }
            Ok(Pruned {
                runs: runs as u64,
                tasks: super::uint(tasks),
            })
        })
    }

    /// Gives the pages freed by deletions back to the file system: an incremental vacuum, after
    /// a one-time `VACUUM` that switches an older store to incremental auto-vacuum.
    pub(crate) fn reclaim_space(&self) -> Result<(), StoreError> {
        self.read(|conn| {
            let mode: i64 = conn.query_row("PRAGMA auto_vacuum", [], |row| row.get(0))?;
            if mode != 2 {
                conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")?;
            } else {
                conn.execute_batch("PRAGMA incremental_vacuum;")?;
            }
            conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")?;
            Ok(())
        })
    }

    /// The completed tasks of the kept runs of a pipeline (other than `except`) that had the
    /// same `defaults`, by the hash of their rendered request: what a `--reuse` run may take
    /// instead of sending it again. The newest wins when several runs answered the same request.
    pub(crate) fn reusable(
        &self,
        pipeline: &str,
        except: &str,
        defaults: &str,
        key: Option<&[u8; 32]>,
    ) -> Result<Reusable, StoreError> {
        self.read(|conn| {
            let mut stmt = conn.prepare(&format!(
                "SELECT {RESULT_COLUMNS}, t.mac
                 FROM run_tasks t JOIN runs r ON r.run_id = t.run_id
                 LEFT JOIN outputs o ON o.hash = t.output_hash
                 WHERE r.pipeline_path = ?1 AND r.run_id <> ?2 AND r.defaults IS ?3
                   AND t.status = 'completed'
                 ORDER BY t.finished_at"
            ))?;
            let rows = stmt.query_map(params![pipeline, except, defaults], |row| {
                Ok((result_row(row)?, row.get::<_, Option<String>>(14)?))
            })?;
            let mut reusable = Reusable::default();
            for row in rows {
                let (row, mac) = row?;
                // Only an answer summon signed with the user's key is taken.
                let signed =
                    key.is_some_and(|key| super::sign::row_signed(key, &row, mac.as_deref()));
                if signed {
                    reusable.rows.insert(row.input_hash.clone(), row);
                } else {
                    reusable.unsigned += 1;
                }
            }
            Ok(reusable)
        })
    }
}

/// The answers earlier runs recorded that a run may reuse, by request hash.
#[derive(Debug, Default)]
pub(crate) struct Reusable {
    pub(crate) rows: HashMap<String, TaskResultRow>,
    /// Completed rows left out because summon's signature is missing or does not match
    /// (written by something else, or before answers were signed).
    pub(crate) unsigned: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Usage;
    use crate::store::JournalStatus;

    fn row(index: u64, output: &str) -> TaskResultRow {
        TaskResultRow {
            step_id: "s".into(),
            item_index: index,
            input_hash: format!("h{index}"),
            status: JournalStatus::Completed,
            output: Some(output.into()),
            item_json: None,
            turns: 1,
            tokens: Usage::default(),
            duration_ms: 1,
            error: None,
            finished_at: jiff::Timestamp::now(),
            batch_id: None,
            meta: None,
        }
    }

    fn count(store: &Store, table: &str) -> i64 {
        store
            .conn
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn outputs_are_stored_once_and_pruned_with_the_last_run_naming_them() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        // Longer than an answer kept in its row.
        let same = "same answer ".repeat(30);
        let another = "another answer ".repeat(30);
        let mut runs = Vec::new();
        for _ in 0..3 {
            let run = store.create_run("p.yaml", "h", "{}", "[]", None).unwrap();
            store
                .record_results(
                    &run.run_id,
                    &[row(0, &same), row(1, ""), row(2, "a short answer")],
                )
                .unwrap();
            store
                .set_run_status(&run.run_id, RunStatus::Completed)
                .unwrap();
            runs.push(run.run_id);
        }
        let other = store.create_run("p.yaml", "h", "{}", "[]", None).unwrap();
        store
            .record_results(&other.run_id, &[row(0, &another)])
            .unwrap();
        // Short answers stay in their rows: only the two long ones are in `outputs`.
        assert_eq!(count(&store, "outputs"), 2);
        let finished = store.finished(&runs[1]).unwrap();
        assert_eq!(
            finished[&("s".to_owned(), 0)].output.as_deref(),
            Some(same.as_str())
        );
        assert_eq!(finished[&("s".to_owned(), 1)].output.as_deref(), Some(""));
        assert_eq!(
            finished[&("s".to_owned(), 2)].output.as_deref(),
            Some("a short answer")
        );
        // Keep only the newest run: the shared answer goes with the last run that named it.
        let pruned = store
            .prune_runs(
                None,
                Retention {
                    keep: 1,
                    keep_for: Duration::ZERO,
                },
                None,
            )
            .unwrap();
        assert_eq!(pruned, Pruned { runs: 3, tasks: 9 });
        assert_eq!(count(&store, "outputs"), 1);
        // A pruned id is never handed out again, even within the same second.
        for id in &runs {
            assert!(store.was_pruned(id).unwrap());
        }
        let next = store.create_run("p.yaml", "h", "{}", "[]", None).unwrap();
        assert!(!runs.contains(&next.run_id), "{} reused", next.run_id);
        assert!(!store.was_pruned(&next.run_id).unwrap());
        store.reclaim_space().unwrap();
        let reusable = store
            .reusable("p.yaml", "none", "{}", Some(&[7; 32]))
            .unwrap();
        assert!(reusable.rows.is_empty(), "no run recorded these defaults");
    }
}
