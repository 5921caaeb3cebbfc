//! Provider batches of a run (`backend: batch`): the `run_batches` table.
//!
//! A batch is recorded right after the provider created it, before it is first polled, with
//! the tasks it holds (item index, input hash, custom id). `--resume` reads the batches still
//! `submitted` and polls them again instead of sending their tasks in a new batch; a batch is
//! marked `ended` once the results of its tasks are committed to the journal. A `kill -9`
//! between the provider's answer to the create request and this record loses the batch id:
//! those tasks are sent again on resume.

use rusqlite::params;
use serde::{Deserialize, Serialize};

use super::{Store, StoreError, now_ms};

/// One task of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BatchTask {
    pub(crate) index: u64,
    pub(crate) hash: String,
    pub(crate) custom_id: String,
}

/// A batch still in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BatchRecord {
    pub(crate) batch_id: String,
    pub(crate) step_id: String,
    /// The provider's name in summon's configuration.
    pub(crate) provider: String,
    pub(crate) tasks: Vec<BatchTask>,
}

impl Store {
    /// Records a batch the provider just created, and commits.
    pub(crate) fn record_batch(&self, run_id: &str, batch: &BatchRecord) -> Result<(), StoreError> {
        let tasks = serde_json::to_string(&batch.tasks).unwrap_or_else(|_| "[]".to_owned());
        self.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO run_batches
                     (run_id, batch_id, step_id, provider, status, tasks, created_at)
                 VALUES (?1, ?2, ?3, ?4, 'submitted', ?5, ?6)",
                params![
                    run_id,
                    batch.batch_id,
                    batch.step_id,
                    batch.provider,
                    tasks,
                    now_ms()
                ],
            )?;
            Ok(())
        })
    }

    /// The batches of a step still in flight, oldest first.
    pub(crate) fn submitted_batches(
        &self,
        run_id: &str,
        step_id: &str,
    ) -> Result<Vec<BatchRecord>, StoreError> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT batch_id, step_id, provider, tasks FROM run_batches
                 WHERE run_id = ?1 AND step_id = ?2 AND status = 'submitted'
                 ORDER BY created_at, rowid",
            )?;
            let rows = stmt.query_map(params![run_id, step_id], |row| {
                let tasks: String = row.get(3)?;
                Ok(BatchRecord {
                    batch_id: row.get(0)?,
                    step_id: row.get(1)?,
                    provider: row.get(2)?,
                    tasks: serde_json::from_str(&tasks).unwrap_or_default(),
                })
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
    }

    /// Marks a batch as done with: its results are journaled, or none of its tasks is wanted.
    pub(crate) fn end_batch(&self, run_id: &str, batch_id: &str) -> Result<(), StoreError> {
        self.read(|conn| {
            conn.execute(
                "UPDATE run_batches SET status = 'ended', ended_at = ?3
                 WHERE run_id = ?1 AND batch_id = ?2",
                params![run_id, batch_id, now_ms()],
            )?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_listed_until_they_end() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        let run = store.create_run("p.yaml", "h", "{}", "[]", None).unwrap();
        let batch = BatchRecord {
            batch_id: "batch_1".into(),
            step_id: "each".into(),
            provider: "openai".into(),
            tasks: vec![BatchTask {
                index: 3,
                hash: "abc".into(),
                custom_id: "task-3".into(),
            }],
        };
        store.record_batch(&run.run_id, &batch).unwrap();
        assert_eq!(
            store.submitted_batches(&run.run_id, "each").unwrap(),
            [batch]
        );
        assert!(
            store
                .submitted_batches(&run.run_id, "other")
                .unwrap()
                .is_empty()
        );
        store.end_batch(&run.run_id, "batch_1").unwrap();
        assert!(
            store
                .submitted_batches(&run.run_id, "each")
                .unwrap()
                .is_empty()
        );
    }
}
