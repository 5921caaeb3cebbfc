//! Pipeline run journals (`summon run`, `--resume`): the `runs` and `run_tasks` tables.
//!
//! A run is created when `summon run` starts ([`Store::create_run`]): its id, the pipeline path
//! and content hash, the parameters and the frozen agent catalog (so `--resume` reuses the
//! catalog instead of scanning again). Every task that ends is recorded as one `run_tasks` row
//! keyed by `(run_id, step_id, item_index)`, with the content hash of its rendered request
//! (`input_hash`: source, parameters, model, messages — computed by the runner, opaque here).
//! Recording a key again replaces the row (a retry, or a task re-run by `--resume`).
//!
//! **Resume.** [`Store::finished`] loads every recorded row of a run in one query; the runner
//! skips a task whose row is `completed` with the same `input_hash` and runs everything else,
//! so an edited item runs again and nothing else does. [`Store::last_run_of_shard`] finds the run to
//! resume when no id is given.
//!
//! **Run ids** are the UTC start time, `YYYYMMDD-HHMMSS` (`20260219-143005`), with `-2`, `-3`,
//! ... appended when several runs start within the same second; they sort by start time and
//! can never be mistaken for a task id (`YYYYMMDD_N`).
//!
//! **Batched writes.** A run with 100k tasks cannot afford one transaction per task, so the
//! runner records through a [`JournalWriter`]: [`JournalWriter::record`] hands the row to a
//! writer thread (a channel send, no I/O on the caller's thread) that owns its own connection
//! and commits whatever has arrived in one transaction as soon as either
//! [`WriterOptions::max_rows`] rows are pending or [`WriterOptions::max_delay`] passed since the
//! first of them. `flush()` commits everything recorded so far and waits; `close()` and `Drop`
//! flush too. Copying the WAL into the database (a checkpoint, two syncs) is not the writer's
//! work: a second thread with its own connection does it when the writer's WAL hook asks
//! ([`CHECKPOINT_ASK`]), so commits go on meanwhile.
//!
//! **Crash safety.** A committed transaction survives `kill -9` (WAL with `synchronous=NORMAL`
//! only risks the last commits on power loss) and a killed writer never leaves a partial batch
//! (SQLite rolls back the uncommitted tail of the WAL). A `kill -9` therefore loses at most the
//! rows recorded in the last `max_delay` (default 20 ms), which `--resume` runs again. A runner
//! that must never re-run a finished task treats a task as finished only once its row is
//! committed: [`WriterOptions::on_commit`] is called on the writer thread with every committed
//! batch (e.g. to append those rows to `results.jsonl`).

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use jiff::tz::TimeZone;
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use rusqlite::{Connection, OptionalExtension, Row, params};
use serde::Serialize;

use super::{
    Fail, Store, StoreError, connect, int, now_ms, opt_timestamp, retry_busy, timestamp, uint,
};
use crate::provider::Usage;

/// The state of a pipeline run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RunStatus {
    Running,
    Completed,
    Failed,
    /// Stopped by Ctrl-C (drained); resumable like a failed run.
    Interrupted,
}

/// The state of one recorded task of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum JournalStatus {
    /// Sent in a provider batch (`backend: batch`, see `batch_id`), no result yet: resume polls
    /// the batch instead of sending the task again.
    Submitted,
    Completed,
    Failed,
    Cancelled,
}

macro_rules! text_enum {
    ($ty:ident, $what:literal, { $($variant:ident => $text:literal),* $(,)? }) => {
        impl $ty {
            pub(crate) fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),* }
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok(Self::$variant),)*
                    other => Err(format!(concat!("unknown ", $what, " '{}'"), other)),
                }
            }
        }
        impl ToSql for $ty {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Ok(ToSqlOutput::from(self.as_str()))
            }
        }
        impl FromSql for $ty {
            fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
                value.as_str()?.parse().map_err(|e: String| FromSqlError::Other(e.into()))
            }
        }
    };
}

text_enum!(RunStatus, "run status", {
    Running => "running",
    Completed => "completed",
    Failed => "failed",
    Interrupted => "interrupted",
});

text_enum!(JournalStatus, "journal status", {
    Submitted => "submitted",
    Completed => "completed",
    Failed => "failed",
    Cancelled => "cancelled",
});

/// One pipeline run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct RunRecord {
    pub(crate) run_id: String,
    /// As given to [`Store::create_run`] (the runner should pass a canonical path).
    pub(crate) pipeline_path: String,
    pub(crate) pipeline_hash: String,
    pub(crate) params_json: String,
    /// The agent catalog frozen when the run started (JSON, opaque to the store).
    pub(crate) catalog_json: String,
    pub(crate) status: RunStatus,
    pub(crate) created_at: Timestamp,
    pub(crate) finished_at: Option<Timestamp>,
    /// Which shard of the pipeline this run is (JSON, opaque), if sharded.
    pub(crate) shard: Option<String>,
    /// The process that runs it (while it runs).
    pub(crate) pid: Option<u32>,
    /// `--out`, as given.
    pub(crate) out_dir: Option<String>,
    /// What the run was started with that `--resume` reuses; `None` when not recorded (or
    /// not readable).
    pub(crate) setup: Option<RunSetup>,
}

/// What a run was started with that `--resume` takes again when not given.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub(crate) struct RunSetup {
    /// `--out`, as given.
    pub(crate) out: Option<String>,
    /// `--junit`, as given.
    pub(crate) junit: Option<String>,
    /// `--concurrency`.
    pub(crate) concurrency: Option<usize>,
    /// `--max-cost`, in millionths of a US dollar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_cost_micro_usd: Option<u64>,
    /// What the run had spent when it last ended, in millionths of a US dollar (a resumed
    /// run's spend cap counts it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) spent_micro_usd: Option<u64>,
}

/// US dollars as millionths, as [`RunSetup`] keeps them.
pub(crate) fn micro_usd(usd: f64) -> u64 {
    (usd * 1e6).round().max(0.0) as u64
}

/// One finished (or batch-submitted) task of a run, as recorded in the journal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct TaskResultRow {
    pub(crate) step_id: String,
    /// The item's position in its step (0 for one-task steps).
    pub(crate) item_index: u64,
    /// Hex content hash of the rendered request.
    pub(crate) input_hash: String,
    pub(crate) status: JournalStatus,
    pub(crate) output: Option<String>,
    /// The item (JSON).
    pub(crate) item_json: Option<String>,
    pub(crate) turns: u32,
    pub(crate) tokens: Usage,
    pub(crate) duration_ms: u64,
    pub(crate) error: Option<String>,
    pub(crate) finished_at: Timestamp,
    pub(crate) batch_id: Option<String>,
    /// What the run knew of the task beyond its answer and counts (JSON, a
    /// [`TaskMeta`](crate::event::TaskMeta)): its model, role, trace and retries, so that a
    /// resumed run reports it as the attempt that ran it did. `None` in rows written before.
    pub(crate) meta: Option<String>,
}

/// `(step_id, item_index)`.
pub(crate) type TaskKey = (String, u64);

/// Every recorded task of a run, by key ([`Store::finished`]).
pub(crate) type FinishedMap = HashMap<TaskKey, TaskResultRow>;

/// Called on the writer thread with each batch right after it was committed.
pub(crate) type CommitHook = Box<dyn FnMut(&[TaskResultRow]) + Send>;

/// Called on the writer thread, once, with the message of the first batch that could not be
/// written (a full disk): every later call of the writer fails too.
pub(crate) type FailureHook = Box<dyn FnMut(&str) + Send>;

/// How a [`JournalWriter`] batches.
pub(crate) struct WriterOptions {
    /// Commit as soon as this many rows are pending.
    pub(crate) max_rows: usize,
    /// Commit at the latest this long after the first pending row was recorded.
    pub(crate) max_delay: Duration,
    pub(crate) on_commit: Option<CommitHook>,
    pub(crate) on_failure: Option<FailureHook>,
    /// The user's signing key: each row's answer is signed with it (reuse checks it).
    pub(crate) key: Option<[u8; 32]>,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            max_rows: 1024,
            max_delay: Duration::from_millis(20),
            on_commit: None,
            on_failure: None,
            key: None,
        }
    }
}

impl fmt::Debug for WriterOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriterOptions")
            .field("max_rows", &self.max_rows)
            .field("max_delay", &self.max_delay)
            .field("on_commit", &self.on_commit.is_some())
            .field("on_failure", &self.on_failure.is_some())
            .finish()
    }
}

/// What a [`JournalWriter`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct WriterStats {
    pub(crate) rows: u64,
    pub(crate) commits: u64,
}

pub(super) const RUN_COLUMNS: &str = "run_id, pipeline_path, pipeline_hash, params, catalog, \
     status, created_at, finished_at, shard, pid, out_dir, options";

pub(super) fn run_record(row: &Row<'_>) -> rusqlite::Result<RunRecord> {
    Ok(RunRecord {
        run_id: row.get(0)?,
        pipeline_path: row.get(1)?,
        pipeline_hash: row.get(2)?,
        params_json: row.get(3)?,
        catalog_json: row.get(4)?,
        status: row.get(5)?,
        created_at: timestamp(row.get(6)?)?,
        finished_at: opt_timestamp(row.get(7)?)?,
        shard: row.get(8)?,
        pid: row
            .get::<_, Option<i64>>(9)?
            .and_then(|p| u32::try_from(p).ok()),
        out_dir: row.get(10)?,
        setup: row
            .get::<_, Option<String>>(11)?
            .and_then(|text| serde_json::from_str(&text).ok()),
    })
}

const UPSERT: &str = "INSERT INTO run_tasks (run_id, step_id, item_index, input_hash, status,
        output, item, turns, input_tokens, output_tokens, duration_ms, error, finished_at,
        batch_id, output_hash, mac, meta)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)
    ON CONFLICT (run_id, step_id, item_index) DO UPDATE SET
        input_hash = excluded.input_hash, status = excluded.status, output = excluded.output,
        item = excluded.item, turns = excluded.turns, input_tokens = excluded.input_tokens,
        output_tokens = excluded.output_tokens, duration_ms = excluded.duration_ms,
        error = excluded.error, finished_at = excluded.finished_at,
        batch_id = excluded.batch_id, output_hash = excluded.output_hash, mac = excluded.mac,
        meta = excluded.meta";

/// An output longer than [`INLINE_OUTPUT`] is stored once per content; the row names it by
/// hash. A stored text that no longer matches its hash (written over by something else) is put
/// right.
const STORE_OUTPUT: &str = "INSERT INTO outputs (hash, text) VALUES (?1, ?2)
    ON CONFLICT (hash) DO UPDATE SET text = excluded.text WHERE text <> excluded.text";

/// The longest output kept in its own row rather than stored once per content: its hash in
/// the row, the `outputs` row and the two index entries take about as much room as it does,
/// and each of those index entries lands on a random page (a SHA-256 key), which a run of many
/// short answers would otherwise write to the WAL again for nearly every row it commits.
pub(super) const INLINE_OUTPUT: usize = 256;

/// The columns of a [`TaskResultRow`] (`t` is `run_tasks`, `o` its joined `outputs` row).
pub(super) const RESULT_COLUMNS: &str = "t.step_id, t.item_index, t.input_hash, t.status,
    coalesce(t.output, o.text), t.item, t.turns, t.input_tokens, t.output_tokens,
    t.duration_ms, t.error, t.finished_at, t.batch_id, t.meta";

/// Writes `rows` of `run_id` in one immediate transaction (retried while busy).
fn write_rows(
    conn: &Connection,
    db_path: &std::path::Path,
    run_id: &str,
    rows: &[TaskResultRow],
    key: Option<&[u8; 32]>,
) -> Result<(), StoreError> {
    retry_busy(db_path, || {
        // BEGIN and COMMIT as cached statements: a batch of a few rows, committed tens of
        // thousands of times in a big run, would otherwise parse both every time.
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        let written = (|| -> Result<(), Fail> {
            let mut stmt = conn.prepare_cached(UPSERT)?;
            let mut store_output = conn.prepare_cached(STORE_OUTPUT)?;
            for r in rows {
                // Short answers stay in the row; others are stored once per content.
                let output_hash = match r.output.as_deref() {
                    Some(text) if text.len() > INLINE_OUTPUT => {
                        let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(text));
                        store_output.execute(params![hash, text])?;
                        Some(hash)
                    }
                    _ => None,
                };
                stmt.execute(params![
                    run_id,
                    r.step_id,
                    int(r.item_index),
                    r.input_hash,
                    r.status,
                    if output_hash.is_some() {
                        None
                    } else {
                        r.output.as_deref()
                    },
                    r.item_json,
                    r.turns,
                    int(r.tokens.input_tokens),
                    int(r.tokens.output_tokens),
                    int(r.duration_ms),
                    r.error,
                    r.finished_at.as_millisecond(),
                    r.batch_id,
                    output_hash,
                    key.map(|key| super::sign::row_mac(
                        key,
                        &r.step_id,
                        &r.input_hash,
                        r.status.as_str(),
                        r.output.as_deref()
                    )),
                    r.meta,
                ])?;
            }
            crate::env::crash_point("journal-commit");
            conn.prepare_cached("COMMIT")?.execute([])?;
            Ok(())
        })();
        if written.is_err() && !conn.is_autocommit() {
            // What was written of the batch is undone; the error says why.
            let _ = conn.execute_batch("ROLLBACK");
        }
        written?;
        crate::env::crash_point("journal-committed");
        Ok(())
    })
}

pub(super) fn result_row(row: &Row<'_>) -> rusqlite::Result<TaskResultRow> {
    Ok(TaskResultRow {
        step_id: row.get(0)?,
        item_index: uint(row.get(1)?),
        input_hash: row.get(2)?,
        status: row.get(3)?,
        output: row.get(4)?,
        item_json: row.get(5)?,
        turns: u32::try_from(row.get::<_, i64>(6)?).unwrap_or(u32::MAX),
        tokens: Usage {
            input_tokens: uint(row.get(7)?),
            output_tokens: uint(row.get(8)?),
            ..Usage::default()
        },
        duration_ms: uint(row.get(9)?),
        error: row.get(10)?,
        finished_at: timestamp(row.get(11)?)?,
        batch_id: row.get(12)?,
        meta: row.get(13)?,
    })
}

impl Store {
    /// Starts a run: allocates its id and records what `--resume` needs.
    pub(crate) fn create_run(
        &self,
        pipeline_path: &str,
        pipeline_hash: &str,
        params_json: &str,
        catalog_json: &str,
        shard: Option<&str>,
    ) -> Result<RunRecord, StoreError> {
        let now = now_ms();
        let start = Timestamp::from_millisecond(now)
            .map_err(|_| self.invalid("the system clock is out of range"))?;
        let base = TimeZone::UTC
            .to_datetime(start)
            .strftime("%Y%m%d-%H%M%S")
            .to_string();
        self.write(|tx| {
            let mut run_id = base.clone();
            let mut n = 1;
            while tx
                .query_row(
                    "SELECT 1 FROM runs WHERE run_id = ?1
                     UNION ALL SELECT 1 FROM pruned_runs WHERE run_id = ?1",
                    [&run_id],
                    |_| Ok(()),
                )
                .optional()?
                .is_some()
            {
                n += 1;
                run_id = format!("{base}-{n}");
            }
            tx.execute(
                "INSERT INTO runs (run_id, pipeline_path, pipeline_hash, params, catalog, status,
                                   created_at, shard)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'running', ?6, ?7)",
                params![
                    run_id,
                    pipeline_path,
                    pipeline_hash,
                    params_json,
                    catalog_json,
                    now,
                    shard
                ],
            )?;
            Ok(run_id)
        })
        .and_then(|run_id| {
            self.get_run(&run_id)?
                .ok_or_else(|| self.invalid(format!("run {run_id} vanished")))
        })
    }

    /// Sets the status of a run; a final status sets `finished_at`, `running` (a resume)
    /// clears it. Returns whether the run exists.
    pub(crate) fn set_run_status(
        &self,
        run_id: &str,
        status: RunStatus,
    ) -> Result<bool, StoreError> {
        let finished = (status != RunStatus::Running).then(now_ms);
        self.read(|conn| {
            Ok(conn.execute(
                "UPDATE runs SET status = ?2, finished_at = ?3 WHERE run_id = ?1",
                params![run_id, status, finished],
            )? == 1)
        })
    }

    pub(crate) fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.read(|conn| {
            Ok(conn
                .query_row(
                    &format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?1"),
                    [run_id],
                    run_record,
                )
                .optional()?)
        })
    }

    /// The most recent run of a pipeline (matched by the path text as given to `create_run`)
    /// that is the same part of it: `shard` as given to `create_run` (`None`: a whole run), so
    /// that a shard resumes its own run, not another shard's.
    pub(crate) fn last_run_of_shard(
        &self,
        pipeline_path: &str,
        shard: Option<&str>,
    ) -> Result<Option<RunRecord>, StoreError> {
        self.read(|conn| {
            Ok(conn
                .query_row(
                    &format!(
                        "SELECT {RUN_COLUMNS} FROM runs WHERE pipeline_path = ?1 AND shard IS ?2
                         ORDER BY created_at DESC, rowid DESC LIMIT 1"
                    ),
                    params![pipeline_path, shard],
                    run_record,
                )
                .optional()?)
        })
    }

    /// Every recorded task of a run, in one query.
    pub(crate) fn finished(&self, run_id: &str) -> Result<FinishedMap, StoreError> {
        Ok(self.finished_signed(run_id, None)?.0)
    }

    /// The recorded tasks of a run that `key` signed (all of them without a key), and how
    /// many were left out: a row written by anything but summon (the store is in the
    /// project) is not taken as a finished task by `--resume`.
    pub(crate) fn finished_signed(
        &self,
        run_id: &str,
        key: Option<&[u8; 32]>,
    ) -> Result<(FinishedMap, u64), StoreError> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {RESULT_COLUMNS}, t.mac FROM run_tasks t
                 LEFT JOIN outputs o ON o.hash = t.output_hash WHERE t.run_id = ?1"
            ))?;
            let rows = stmt.query_map([run_id], |row| {
                Ok((result_row(row)?, row.get::<_, Option<String>>(14)?))
            })?;
            let mut map = FinishedMap::new();
            let mut unsigned = 0;
            for row in rows {
                let (row, mac) = row?;
                if key.is_none_or(|key| super::sign::row_signed(key, &row, mac.as_deref())) {
                    map.insert((row.step_id.clone(), row.item_index), row);
                } else {
                    unsigned += 1;
                }
            }
            Ok((map, unsigned))
        })
    }

    /// Records `rows` of a run in one transaction, synchronously (the [`JournalWriter`] does
    /// this in batches on its own thread).
    pub(crate) fn record_results(
        &self,
        run_id: &str,
        rows: &[TaskResultRow],
    ) -> Result<(), StoreError> {
        write_rows(&self.conn, &self.db_path, run_id, rows, None)
    }

    /// A batched writer for the journal of `run_id` (which must exist), with its own
    /// connection and thread.
    pub(crate) fn journal_writer(
        &self,
        run_id: &str,
        options: WriterOptions,
    ) -> Result<JournalWriter, StoreError> {
        if self.get_run(run_id)?.is_none() {
            return Err(self.invalid(format!("no run {run_id} to journal")));
        }
        let mut conn = connect(&self.db_path)?;
        tune_writer(&conn).map_err(|e| self.invalid(format!("cannot tune the journal: {e}")))?;
        let (ask, copying, checkpointer) = self.checkpointer()?;
        conn.wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, frames: i32| {
            if frames >= CHECKPOINT_HERE {
                // What the checkpointer has not copied yet; the next commit starts the WAL
                // over. A checkpoint the checkpointer is running (on a slow disk, its syncs
                // can outlast any number of commits) is waited for: SQLite would refuse a
                // second one, and the WAL would grow without bound meanwhile.
                let _copying = copying.lock().unwrap_or_else(PoisonError::into_inner);
                let _ = wal.checkpoint();
            } else if frames >= CHECKPOINT_ASK {
                let _ = ask.try_send(());
            }
            Ok(())
        }))
        .map_err(|e| self.invalid(format!("cannot tune the journal: {e}")))?;
        let shared = Arc::new(Shared::default());
        let (sender, receiver) = mpsc::channel();
        let worker = Worker {
            checkpointer: Some(checkpointer),
            conn,
            db_path: self.db_path.clone(),
            run_id: run_id.to_owned(),
            receiver,
            options,
            shared: Arc::clone(&shared),
        };
        let thread = std::thread::Builder::new()
            .name("summon-journal".into())
            .spawn(move || worker.run())
            .map_err(|e| self.invalid(format!("cannot start the journal writer: {e}")))?;
        Ok(JournalWriter {
            sender: Some(sender),
            thread: Some(thread),
            shared,
            db_path: self.db_path.clone(),
        })
    }
}

/// WAL frames (4 KiB pages, so 16 MiB) after which the journal's checkpointer thread is asked
/// to copy the WAL into the database: on its own connection, while the writer goes on
/// committing. A checkpoint syncs the WAL and the database, which takes milliseconds to tens of
/// them; on the writer it held every task waiting for its commit (and its slot) that long.
const CHECKPOINT_ASK: i32 = 4096;
/// WAL frames after which the writer copies what is left itself, once a checkpoint the
/// checkpointer is running has ended: the checkpointer's copies cannot start the WAL over
/// while commits keep coming, the writer's can.
const CHECKPOINT_HERE: i32 = 2 * CHECKPOINT_ASK;

/// What asks the checkpointer to copy, the lock it holds while it does, and its thread.
type Checkpointer = (SyncSender<()>, Arc<Mutex<()>>, JoinHandle<()>);

impl Store {
    /// The journal's checkpointer: a thread with its own connection that runs a passive
    /// checkpoint whenever it is asked, until the asking side is dropped. It holds the returned
    /// lock while it copies.
    fn checkpointer(&self) -> Result<Checkpointer, StoreError> {
        let conn = connect(&self.db_path)?;
        let (ask, asked) = mpsc::sync_channel::<()>(1);
        let copying = Arc::new(Mutex::new(()));
        let held = Arc::clone(&copying);
        let thread = std::thread::Builder::new()
            .name("summon-checkpoint".into())
            .spawn(move || {
                while asked.recv().is_ok() {
                    let _copying = held.lock().unwrap_or_else(PoisonError::into_inner);
                    // Failed: the writer copies the rest.
                    let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
                }
            })
            .map_err(|e| self.invalid(format!("cannot start the journal's checkpointer: {e}")))?;
        Ok((ask, copying, thread))
    }
}

/// The writer's connection: a page cache that holds the outputs' hash indexes of a big run
/// (their keys are random, so every row touches a page of each); its checkpoints are the
/// checkpointer's ([`CHECKPOINT_ASK`]), its own only past [`CHECKPOINT_HERE`].
///
/// The writer skips the tables' CHECK constraints: every value it writes comes from a Rust
/// enum (a row's status), and SQLite checks `status IN (...)` by building a temporary index
/// of the list for every row it inserts.
fn tune_writer(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "PRAGMA cache_size=-8192;
         PRAGMA ignore_check_constraints=ON;",
    )
}

enum Msg {
    Row(Box<TaskResultRow>),
    Flush(SyncSender<()>),
}

#[derive(Default)]
struct Shared {
    rows: AtomicU64,
    commits: AtomicU64,
    /// The first failure; once set, the journal is incomplete and every call reports it.
    error: Mutex<Option<String>>,
}

/// Batched, crash-safe writes to one run's journal; see the module documentation.
/// `record` and `flush` take `&self`, so the writer can be shared (e.g. in an `Arc`).
#[derive(Debug)]
pub(crate) struct JournalWriter {
    sender: Option<Sender<Msg>>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    db_path: PathBuf,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("rows", &self.rows)
            .field("commits", &self.commits)
            .finish_non_exhaustive()
    }
}

impl JournalWriter {
    /// Queues a row; it is committed within `max_delay`. Cheap: no I/O on this thread. Fails
    /// once an earlier batch could not be written.
    pub(crate) fn record(&self, row: TaskResultRow) -> Result<(), StoreError> {
        self.check()?;
        self.send(Msg::Row(Box::new(row)))
    }

    /// Commits every row recorded so far and waits for it.
    pub(crate) fn flush(&self) -> Result<(), StoreError> {
        let (ack, done) = mpsc::sync_channel(1);
        self.send(Msg::Flush(ack))?;
        done.recv().map_err(|_| self.stopped())?;
        self.check()
    }

    /// Rows committed and transactions used so far.
    pub(crate) fn stats(&self) -> WriterStats {
        WriterStats {
            rows: self.shared.rows.load(Ordering::Relaxed),
            commits: self.shared.commits.load(Ordering::Relaxed),
        }
    }

    /// Flushes, stops the writer thread and reports what it did.
    pub(crate) fn close(mut self) -> Result<WriterStats, StoreError> {
        self.shutdown();
        self.check()?;
        Ok(self.stats())
    }

    fn shutdown(&mut self) {
        // Closing the channel makes the thread commit what is pending and exit.
        self.sender.take();
        let panicked = self.thread.take().is_some_and(|t| t.join().is_err());
        if panicked {
            self.fail("the journal writer thread panicked".into());
        }
    }

    fn send(&self, msg: Msg) -> Result<(), StoreError> {
        self.sender
            .as_ref()
            .and_then(|s| s.send(msg).ok())
            .ok_or_else(|| self.stopped())
    }

    fn check(&self) -> Result<(), StoreError> {
        match &*self.shared.error.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(message) => Err(StoreError::Journal {
                path: self.db_path.clone(),
                message: message.clone(),
            }),
            None => Ok(()),
        }
    }

    fn fail(&self, message: String) {
        let mut error = self.shared.error.lock().unwrap_or_else(|e| e.into_inner());
        error.get_or_insert(message);
    }

    fn stopped(&self) -> StoreError {
        self.check().err().unwrap_or_else(|| StoreError::Journal {
            path: self.db_path.clone(),
            message: "the journal writer stopped".into(),
        })
    }
}

impl Drop for JournalWriter {
    /// Commits what is pending (errors can only be seen through `close`).
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The writer thread.
struct Worker {
    /// Joined once `conn` (whose WAL hook asks it for checkpoints) is closed.
    checkpointer: Option<JoinHandle<()>>,
    conn: Connection,
    db_path: PathBuf,
    run_id: String,
    receiver: Receiver<Msg>,
    options: WriterOptions,
    shared: Arc<Shared>,
}

impl Worker {
    fn run(mut self) {
        let max_rows = self.options.max_rows.max(1);
        let mut batch: Vec<TaskResultRow> = Vec::with_capacity(max_rows.min(4096));
        let mut acks: Vec<SyncSender<()>> = Vec::new();
        let mut open = true;
        while open {
            match self.receiver.recv() {
                Ok(Msg::Row(row)) => batch.push(*row),
                Ok(Msg::Flush(ack)) => acks.push(ack),
                Err(_) => break,
            }
            // Gather until the batch is full, the delay is up, or someone waits for a flush;
            // past the deadline, still take what is already there.
            let deadline = Instant::now() + self.options.max_delay;
            while acks.is_empty() && batch.len() < max_rows {
                let left = deadline.saturating_duration_since(Instant::now());
                let msg = if left.is_zero() {
                    self.receiver.try_recv().map_err(|e| match e {
                        TryRecvError::Empty => RecvTimeoutError::Timeout,
                        TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
                    })
                } else {
                    self.receiver.recv_timeout(left)
                };
                match msg {
                    Ok(Msg::Row(row)) => batch.push(*row),
                    Ok(Msg::Flush(ack)) => acks.push(ack),
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            self.commit(&mut batch);
            for ack in acks.drain(..) {
                let _ = ack.send(());
            }
        }
        // Closing the connection drops its hook, the checkpointer's only asker.
        let Worker {
            checkpointer, conn, ..
        } = self;
        drop(conn);
        if let Some(thread) = checkpointer {
            let _ = thread.join();
        }
    }

    fn commit(&mut self, batch: &mut Vec<TaskResultRow>) {
        if batch.is_empty() {
            return;
        }
        match write_rows(
            &self.conn,
            &self.db_path,
            &self.run_id,
            batch,
            self.options.key.as_ref(),
        ) {
            Ok(()) => {
                self.shared
                    .rows
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                self.shared.commits.fetch_add(1, Ordering::Relaxed);
                if let Some(hook) = &mut self.options.on_commit {
                    hook(batch);
                }
            }
            Err(error) => {
                let message = format!(
                    "{} rows of run {} were not recorded: {error}",
                    batch.len(),
                    self.run_id
                );
                let first = {
                    let mut slot = self.shared.error.lock().unwrap_or_else(|e| e.into_inner());
                    let first = slot.is_none();
                    slot.get_or_insert(message.clone());
                    first
                };
                if let (true, Some(hook)) = (first, &mut self.options.on_failure) {
                    hook(&message);
                }
            }
        }
        batch.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    fn store() -> (tempfile::TempDir, Store) {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        (tmp, store)
    }

    fn run(store: &Store) -> RunRecord {
        store
            .create_run(
                "pipelines/x.yaml",
                "abc123",
                r#"{"since":"v1"}"#,
                "[]",
                None,
            )
            .unwrap()
    }

    fn row(step: &str, index: u64, hash: &str) -> TaskResultRow {
        TaskResultRow {
            step_id: step.to_owned(),
            item_index: index,
            input_hash: hash.to_owned(),
            status: JournalStatus::Completed,
            output: Some(format!("output of {step}[{index}]")),
            item_json: Some(format!(r#"{{"n":{index}}}"#)),
            turns: 1,
            tokens: Usage {
                input_tokens: 100 + index,
                output_tokens: 20,
                ..Usage::default()
            },
            duration_ms: 1234,
            error: None,
            finished_at: Timestamp::from_millisecond(1_771_500_000_000 + index as i64).unwrap(),
            batch_id: None,
            meta: None,
        }
    }

    fn count(store: &Store, run_id: &str) -> i64 {
        store
            .conn
            .query_row(
                "SELECT count(*) FROM run_tasks WHERE run_id = ?1",
                [run_id],
                |r| r.get(0),
            )
            .unwrap()
    }

    #[test]
    fn the_wal_is_copied_into_the_database_and_started_over_while_rows_are_committed() {
        let (_tmp, store) = store();
        let run = run(&store);
        let writer = store
            .journal_writer(
                &run.run_id,
                WriterOptions {
                    max_rows: 1,
                    max_delay: Duration::ZERO,
                    ..WriterOptions::default()
                },
            )
            .unwrap();
        let wal = PathBuf::from(format!("{}-wal", store.db_path.display()));
        // A commit per row of about six pages (the item overflows into four): some 15,000
        // frames, 60 MiB of WAL if it were never started over.
        let rows = 2500;
        let item = "x".repeat(16 * 1024);
        let mut largest = 0;
        for index in 0..rows {
            let mut row = row("big", index, "h");
            row.item_json = Some(format!(r#"{{"text":"{item}"}}"#));
            writer.record(row).unwrap();
            writer.flush().unwrap();
            largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
        }
        let stats = writer.close().unwrap();
        assert_eq!(stats.rows, rows);
        assert_eq!(count(&store, &run.run_id), rows as i64);
        // Each frame is a 4 KiB page and its 24-byte header. The WAL starts over at the
        // latest once it holds CHECKPOINT_HERE frames (the writer waits for a checkpoint
        // still running, then copies the rest; the WAL starts over at a later commit if a
        // reader held it back).
        let bound = (CHECKPOINT_HERE as u64 + 2048) * (4096 + 24);
        assert!(
            (4096 * 4096..bound).contains(&largest),
            "the WAL grew to {largest} bytes"
        );
    }

    #[test]
    fn runs_are_created_found_and_finished() {
        let (_tmp, store) = store();
        let a = run(&store);
        assert_eq!(a.status, RunStatus::Running);
        assert_eq!(a.params_json, r#"{"since":"v1"}"#);
        assert_eq!(a.catalog_json, "[]");
        assert_eq!(a.finished_at, None);
        assert_eq!(a.run_id.len(), "20260219-143005".len());
        assert!(!crate::store::TaskId::looks_like(&a.run_id));
        let b = run(&store);
        assert_ne!(a.run_id, b.run_id);
        let c = store
            .create_run("pipelines/y.yaml", "h", "{}", "[]", Some(r#"{"shard":1}"#))
            .unwrap();
        assert_eq!(c.shard.as_deref(), Some(r#"{"shard":1}"#));

        assert_eq!(
            store
                .last_run_of_shard("pipelines/x.yaml", None)
                .unwrap()
                .unwrap()
                .run_id,
            b.run_id
        );
        assert_eq!(
            store
                .last_run_of_shard("pipelines/y.yaml", Some(r#"{"shard":1}"#))
                .unwrap()
                .unwrap()
                .run_id,
            c.run_id
        );
        assert_eq!(
            store.last_run_of_shard("pipelines/z.yaml", None).unwrap(),
            None
        );
        // A whole run never resumes a shard.
        assert_eq!(
            store.last_run_of_shard("pipelines/y.yaml", None).unwrap(),
            None
        );

        assert!(
            store
                .set_run_status(&b.run_id, RunStatus::Interrupted)
                .unwrap()
        );
        let b2 = store.get_run(&b.run_id).unwrap().unwrap();
        assert_eq!(b2.status, RunStatus::Interrupted);
        assert!(b2.finished_at.is_some());
        assert!(store.set_run_status(&b.run_id, RunStatus::Running).unwrap());
        assert_eq!(store.get_run(&b.run_id).unwrap().unwrap().finished_at, None);
        assert!(!store.set_run_status("nope", RunStatus::Failed).unwrap());
        assert_eq!(store.get_run("nope").unwrap(), None);
    }

    #[test]
    fn same_second_runs_get_suffixes() {
        let (_tmp, store) = store();
        let ids: Vec<String> = (0..3).map(|_| run(&store).run_id).collect();
        let unique: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), 3, "{ids:?}");
    }

    #[test]
    fn an_answer_up_to_the_inline_size_stays_in_its_row_and_a_longer_one_is_stored_by_hash() {
        let (_tmp, store) = store();
        let r = run(&store);
        let sizes = [0, 1, INLINE_OUTPUT, INLINE_OUTPUT + 1, 4096];
        let rows: Vec<TaskResultRow> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| TaskResultRow {
                output: Some("a".repeat(n)),
                ..row("s", i as u64, "h")
            })
            .collect();
        store.record_results(&r.run_id, &rows).unwrap();
        let inline: Vec<(u64, bool)> = store
            .conn
            .prepare("SELECT item_index, output IS NOT NULL FROM run_tasks ORDER BY item_index")
            .unwrap()
            .query_map([], |row| Ok((uint(row.get(0)?), row.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            inline,
            [(0, true), (1, true), (2, true), (3, false), (4, false)]
        );
        let stored: i64 = store
            .conn
            .query_row("SELECT count(*) FROM outputs", [], |r| r.get(0))
            .unwrap();
        assert_eq!(stored, 2);
        let finished = store.finished(&r.run_id).unwrap();
        for (i, &n) in sizes.iter().enumerate() {
            let output = finished[&("s".to_owned(), i as u64)].output.clone();
            assert_eq!(output, Some("a".repeat(n)), "answer of {n} bytes");
        }
    }

    #[test]
    fn writer_round_trip_and_resume_map() {
        let (_tmp, store) = store();
        let r = run(&store);
        let writer = store
            .journal_writer(&r.run_id, WriterOptions::default())
            .unwrap();
        for i in 0..10 {
            writer.record(row("notes", i, &format!("h{i}"))).unwrap();
        }
        writer.record(row("summary", 0, "hs")).unwrap();
        let mut failed = row("notes", 3, "h3-edited");
        failed.status = JournalStatus::Failed;
        failed.output = None;
        failed.error = Some("timeout".into());
        writer.record(failed.clone()).unwrap();
        let stats = writer.close().unwrap();
        assert_eq!(stats.rows, 12);

        let map = store.finished(&r.run_id).unwrap();
        assert_eq!(map.len(), 11, "the retried key was replaced");
        assert_eq!(map[&("notes".to_owned(), 3)], failed);
        assert_eq!(map[&("notes".to_owned(), 7)], row("notes", 7, "h7"));
        assert_eq!(map[&("summary".to_owned(), 0)].input_hash, "hs");
        // Another run's journal is separate.
        let other = run(&store);
        assert!(store.finished(&other.run_id).unwrap().is_empty());
    }

    #[test]
    fn writer_needs_an_existing_run() {
        let (_tmp, store) = store();
        let err = store
            .journal_writer("nope", WriterOptions::default())
            .unwrap_err();
        assert!(err.to_string().contains("no run nope"), "{err}");
        // A direct write to a missing run is refused by the foreign key.
        assert!(store.record_results("nope", &[row("s", 0, "h")]).is_err());
    }

    #[test]
    fn committed_rows_are_visible_to_other_connections_while_the_writer_is_open() {
        let (tmp, store) = store();
        let r = run(&store);
        let opts = WriterOptions {
            max_delay: Duration::from_secs(3600),
            ..WriterOptions::default()
        };
        let writer = store.journal_writer(&r.run_id, opts).unwrap();
        for i in 0..5 {
            writer.record(row("s", i, "h")).unwrap();
        }
        let reader = Store::open(tmp.path()).unwrap();
        writer.flush().unwrap();
        assert_eq!(count(&reader, &r.run_id), 5);
        writer.record(row("s", 5, "h")).unwrap();
        // Not flushed, long delay: not committed yet.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(count(&reader, &r.run_id), 5);
        drop(writer); // Drop flushes.
        assert_eq!(count(&reader, &r.run_id), 6);
    }

    #[test]
    fn batches_by_size_and_by_delay() {
        let (_tmp, store) = store();
        let r = run(&store);
        let opts = WriterOptions {
            max_rows: 10,
            max_delay: Duration::from_secs(3600),
            on_commit: None,
            on_failure: None,
            key: None,
        };
        let writer = store.journal_writer(&r.run_id, opts).unwrap();
        for i in 0..25 {
            writer.record(row("s", i, "h")).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while writer.stats().rows < 20 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            writer.stats(),
            WriterStats {
                rows: 20,
                commits: 2
            },
            "two full batches"
        );
        assert_eq!(
            writer.close().unwrap(),
            WriterStats {
                rows: 25,
                commits: 3
            }
        );

        let opts = WriterOptions {
            max_rows: 1000,
            max_delay: Duration::from_millis(10),
            on_commit: None,
            on_failure: None,
            key: None,
        };
        let writer = store.journal_writer(&r.run_id, opts).unwrap();
        writer.record(row("t", 0, "h")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while writer.stats().rows < 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(
            writer.stats().rows,
            1,
            "committed after the delay, without a flush"
        );
    }

    #[test]
    fn on_commit_sees_each_committed_batch_in_order() {
        let (_tmp, store) = store();
        let r = run(&store);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let opts = WriterOptions {
            max_rows: 7,
            on_commit: Some(Box::new(move |rows: &[TaskResultRow]| {
                sink.lock()
                    .unwrap()
                    .extend(rows.iter().map(|r| r.item_index));
            })),
            ..WriterOptions::default()
        };
        let writer = store.journal_writer(&r.run_id, opts).unwrap();
        for i in 0..50 {
            writer.record(row("s", i, "h")).unwrap();
        }
        writer.close().unwrap();
        assert_eq!(*seen.lock().unwrap(), (0..50).collect::<Vec<u64>>());
    }

    #[test]
    fn a_failed_batch_is_reported() {
        let (_tmp, store) = store();
        let r = run(&store);
        let writer = store
            .journal_writer(&r.run_id, WriterOptions::default())
            .unwrap();
        // The run disappears under the writer: the foreign key refuses the batch.
        store.conn.execute("DELETE FROM runs", []).unwrap();
        writer.record(row("s", 0, "h")).unwrap();
        let err = writer.flush().unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("state.db") && message.contains("not recorded"),
            "{message}"
        );
        assert!(
            writer.record(row("s", 1, "h")).is_err(),
            "the failure is sticky"
        );
        assert!(writer.close().is_err());
    }

    /// Run by `kill_9_loses_no_committed_row` in a child process: journals forever, printing
    /// how many rows are known committed.
    #[test]
    #[ignore = "helper process for kill_9_loses_no_committed_row"]
    fn crash_child() {
        let (Ok(dir), Ok(run_id)) = (
            std::env::var("SUMMON_STORE_CRASH_DIR"),
            std::env::var("SUMMON_STORE_CRASH_RUN"),
        ) else {
            return;
        };
        let store = Store::open(std::path::Path::new(&dir)).unwrap();
        let opts = WriterOptions {
            max_rows: 64,
            max_delay: Duration::from_millis(1),
            on_commit: None,
            on_failure: None,
            key: None,
        };
        let writer = store.journal_writer(&run_id, opts).unwrap();
        let started = Instant::now();
        let mut n = 0;
        while started.elapsed() < Duration::from_secs(60) {
            for _ in 0..100 {
                writer.record(row("s", n, "h")).unwrap();
                n += 1;
            }
            writer.flush().unwrap();
            println!("committed {n}");
            // And some more in flight when the kill comes.
            for _ in 0..37 {
                writer.record(row("s", n, "h")).unwrap();
                n += 1;
            }
        }
    }

    #[test]
    fn kill_9_loses_no_committed_row() {
        let (tmp, store) = store();
        let r = run(&store);
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "store::journal::tests::crash_child",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("SUMMON_STORE_CRASH_DIR", tmp.path())
            .env("SUMMON_STORE_CRASH_RUN", &r.run_id)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut reported = 0u64;
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        while reported < 5_000 {
            let line = lines
                .next()
                .expect("the child journals until killed")
                .unwrap();
            if let Some(n) = line.strip_prefix("committed ") {
                reported = n.parse().unwrap();
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        let integrity: String = store
            .conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(integrity, "ok");
        let map = store.finished(&r.run_id).unwrap();
        assert!(map.len() as u64 >= reported, "{} < {reported}", map.len());
        for i in 0..reported {
            assert_eq!(map[&("s".to_owned(), i)], row("s", i, "h"));
        }
        // Whatever else landed is whole rows forming a prefix of what was recorded.
        let max = map.keys().map(|k| k.1).max().unwrap();
        assert_eq!(map.len() as u64, max + 1);
    }

    /// `cargo test --release --lib store::journal::tests::bench_journal_writer -- --ignored
    /// --nocapture`
    #[test]
    #[ignore = "benchmark"]
    fn bench_journal_writer() {
        let (_tmp, store) = store();
        let r = run(&store);
        let n = 100_000u64;
        let rows: Vec<TaskResultRow> = (0..n)
            .map(|i| {
                let mut row = row("classify", i, &format!("{:064x}", i * 7919));
                row.output = Some("x".repeat(200));
                row
            })
            .collect();
        let cpu0 = process_cpu();
        let start = Instant::now();
        let writer = store
            .journal_writer(&r.run_id, WriterOptions::default())
            .unwrap();
        for row in rows {
            writer.record(row).unwrap();
        }
        let stats = writer.close().unwrap();
        let wall = start.elapsed();
        let cpu = process_cpu().map(|c| c - cpu0.unwrap_or_default());
        assert_eq!(stats.rows, n);
        println!(
            "journal writer: {n} rows in {:.3} s = {:.0} rows/s, {} commits{}",
            wall.as_secs_f64(),
            n as f64 / wall.as_secs_f64(),
            stats.commits,
            cpu.map(|c| format!(
                ", process CPU {:.2} s = {:.1} µs/row",
                c.as_secs_f64(),
                c.as_secs_f64() * 1e6 / n as f64
            ))
            .unwrap_or_default()
        );
        let start = Instant::now();
        let map = store.finished(&r.run_id).unwrap();
        println!(
            "finished(): {} rows loaded in {:.3} s",
            map.len(),
            start.elapsed().as_secs_f64()
        );
    }

    /// User + system CPU time of this process (Linux), in clock ticks of 10 ms.
    fn process_cpu() -> Option<Duration> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        Some(Duration::from_millis(ticks * 10))
    }
}
