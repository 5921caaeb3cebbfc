//! Background tasks (`summon delegate --async`): the `tasks` table and its life cycle.
//!
//! ```text
//!            create_task (slot free)                       finish / cancel / mark_dead_workers
//!   ┌──────────────────────────────────────► running ─────────────────────► completed | failed | cancelled
//!   │                                          ▲                                  │
//!   │ create_task (full, queue)   claim_slot   │                                  │ expire (ttl after finish)
//!   └──────────────────────────► queued ───────┘                                  ▼
//!                                  │  request_cancel / cancel / mark_dead_workers     row deleted, id kept in
//!                                  └───────────────────────────► cancelled | failed   `expired_tasks` (7 days)
//! ```
//!
//! # Invariants
//!
//! - **The cap.** `running` tasks are exactly the ones holding a slot. A task becomes `running`
//!   only inside a `BEGIN IMMEDIATE` transaction that counted the slots first (`create_task`,
//!   `claim_slot`), so concurrent starts from any number of processes never exceed the cap.
//! - **FIFO queue.** A queued task (ordered by `seq`) gets a slot only when
//!   `running + queued ahead of it < cap`, and a new task is queued (or refused) while
//!   `running + queued >= cap`: later tasks never overtake waiting ones.
//! - **Ids.** `task_counters` is bumped in the transaction that inserts the row; counters are
//!   never deleted, so an id is never handed out twice, even after its task expired.
//! - **Terminal states are final.** `finish`, `cancel` and the dead-worker sweep change the
//!   status only of a `queued`/`running` task (compare-and-set in the `WHERE` clause): a worker
//!   that finishes late cannot overwrite a cancellation or a "worker died" verdict. (It may still
//!   fill in the output of such a task when none was recorded, so `load --cancel` shows what it
//!   produced.)
//! - **No task stays `running` forever.** The worker heartbeats (`heartbeat`,
//!   `record_progress`; a queued waiter's `claim_slot` counts too). `mark_dead_workers` fails a
//!   `running`/`queued` task whose heartbeat is older than `stale_after` *and* whose worker the
//!   caller's liveness check says is gone; it is meant to run before counting slots and before
//!   listing tasks.
//!
//! # Who writes what
//!
//! - the `--async` caller: `create_task`, then `set_pid` once it spawned the worker;
//! - the worker: `claim_slot` (while queued), `set_model`, `heartbeat`, `record_progress`, and
//!   `finish`; `heartbeat`/`record_progress`/`claim_slot` answer [`Control::Stop`] once a
//!   cancel was requested or the task was ended by someone else;
//! - `load --cancel`: `request_cancel`, then `cancel` if the worker did not stop in time;
//! - any process: `mark_dead_workers`, `expire`, reads.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use rusqlite::{Connection, OptionalExtension, Row, params};
use serde::Serialize;

use super::{
    Fail, Store, StoreError, TaskId, duration_ms, int, now_ms, opt_timestamp, timestamp, uint,
};
use crate::provider::Usage;

/// How many recent tool-call lines a task keeps.
pub(crate) const RECENT_TOOL_CALLS: usize = 20;
/// Longest tool-call line kept, in bytes (longer lines are cut at a character boundary).
const TOOL_CALL_LINE_MAX: usize = 500;
/// How long the ids of expired tasks are remembered.
const EXPIRED_MEMORY: Duration = Duration::from_secs(7 * 24 * 3600);

/// The state of a background task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum TaskStatus {
    /// Waiting for a slot (`--queue`).
    Queued,
    /// Holding a slot; the worker is starting or working.
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl TaskStatus {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Completed, failed or cancelled: the task will not change any more.
    pub(crate) fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TaskStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "queued" => Self::Queued,
            "running" => Self::Running,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            other => return Err(format!("unknown task status '{other}'")),
        })
    }
}

impl ToSql for TaskStatus {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

impl FromSql for TaskStatus {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        value
            .as_str()?
            .parse()
            .map_err(|e: String| FromSqlError::Other(e.into()))
    }
}

/// One background task as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct TaskRecord {
    pub(crate) id: TaskId,
    pub(crate) status: TaskStatus,
    pub(crate) description: String,
    pub(crate) source: Option<String>,
    /// The delegation request (JSON), as given to [`Store::create_task`].
    pub(crate) request_json: String,
    /// Its signature ([`Store::sign_task_request`]); `None`: unsigned.
    pub(crate) request_mac: Option<String>,
    pub(crate) pid: Option<u32>,
    pub(crate) cancel_requested: bool,
    pub(crate) created_at: Timestamp,
    /// When the task took a slot.
    pub(crate) started_at: Option<Timestamp>,
    pub(crate) finished_at: Option<Timestamp>,
    /// Last progress ([`Store::record_progress`]); `None`: nothing happened yet (initialising).
    pub(crate) last_activity_at: Option<Timestamp>,
    /// Last sign of life of the worker (creation time until the first heartbeat).
    pub(crate) heartbeat_at: Timestamp,
    pub(crate) turns: u32,
    /// How many tool calls the task made in total.
    pub(crate) tool_calls: u64,
    /// The last [`RECENT_TOOL_CALLS`] tool-call lines, oldest first.
    pub(crate) recent_tool_calls: Vec<String>,
    pub(crate) output: Option<String>,
    pub(crate) error: Option<String>,
    pub(crate) tokens: Usage,
    pub(crate) provider: Option<String>,
    pub(crate) model: Option<String>,
    /// What went wrong with the task's extensions, one line each.
    pub(crate) warnings: Vec<String>,
}

/// The answer to "what is task ID?".
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TaskLookup {
    Found(Box<TaskRecord>),
    /// It existed, finished, and was removed after its TTL.
    Expired,
    NotFound,
}

/// Which tasks [`Store::list`] returns (always in creation order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskFilter {
    All,
    /// Queued or running.
    Active,
    /// Completed, failed or cancelled, not yet expired: results that can be collected.
    Finished,
    Status(TaskStatus),
}

/// The answer of [`Store::claim_slot`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The task now holds a slot (or already did): start working.
    Claimed,
    /// No slot for this task yet (full, or tasks queued ahead of it): wait and try again.
    Full,
    /// The task is no longer waiting (cancelled, failed, or missing): stop waiting.
    Gone(Option<TaskStatus>),
}

/// What a worker should do after reporting to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    Continue,
    /// A cancel was requested, or the task was ended by someone else: stop and `finish`.
    Stop,
}

const COLUMNS: &str = "id, status, description, source, request, pid, cancel_requested, \
     created_at, started_at, finished_at, last_activity_at, heartbeat_at, turns, tool_calls, \
     recent_tool_calls, output, error, input_tokens, output_tokens, provider, model, warnings, \
     request_mac";

fn record(row: &Row<'_>) -> rusqlite::Result<TaskRecord> {
    let recent: String = row.get(14)?;
    let recent_tool_calls = serde_json::from_str(&recent).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(14, rusqlite::types::Type::Text, Box::new(e))
    })?;
    Ok(TaskRecord {
        id: row.get(0)?,
        status: row.get(1)?,
        description: row.get(2)?,
        source: row.get(3)?,
        request_json: row.get(4)?,
        pid: row
            .get::<_, Option<i64>>(5)?
            .and_then(|p| u32::try_from(p).ok()),
        cancel_requested: row.get(6)?,
        created_at: timestamp(row.get(7)?)?,
        started_at: opt_timestamp(row.get(8)?)?,
        finished_at: opt_timestamp(row.get(9)?)?,
        last_activity_at: opt_timestamp(row.get(10)?)?,
        heartbeat_at: timestamp(row.get(11)?)?,
        turns: u32::try_from(row.get::<_, i64>(12)?).unwrap_or(u32::MAX),
        tool_calls: uint(row.get(13)?),
        recent_tool_calls,
        output: row.get(15)?,
        error: row.get(16)?,
        tokens: Usage {
            input_tokens: uint(row.get(17)?),
            output_tokens: uint(row.get(18)?),
            ..Usage::default()
        },
        provider: row.get(19)?,
        model: row.get(20)?,
        warnings: match row.get::<_, Option<String>>(21)? {
            None => Vec::new(),
            Some(text) => serde_json::from_str(&text).map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(
                    21,
                    rusqlite::types::Type::Text,
                    Box::new(e),
                )
            })?,
        },
        request_mac: row.get(22)?,
    })
}

fn get_in(conn: &Connection, id: &TaskId) -> rusqlite::Result<Option<TaskRecord>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM tasks WHERE id = ?1"))?
        .query_row([id], record)
        .optional()
}

/// Cuts `line` to at most [`TOOL_CALL_LINE_MAX`] bytes at a character boundary.
fn clip(line: &str) -> &str {
    if line.len() <= TOOL_CALL_LINE_MAX {
        return line;
    }
    let mut end = TOOL_CALL_LINE_MAX;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}

impl Store {
    /// Creates a background task and allocates its id, in one transaction. With a free slot
    /// (`running + queued < cap`) the task is `running` (it holds the slot); otherwise it is
    /// `queued` when `queue` is set, else refused with [`StoreError::TooManyTasks`] (no id is
    /// used up). Call [`Store::mark_dead_workers`] first so dead tasks do not hold slots.
    pub(crate) fn create_task(
        &self,
        description: &str,
        source: Option<&str>,
        request_json: &str,
        cap: usize,
        queue: bool,
    ) -> Result<TaskRecord, StoreError> {
        self.create_task_at(now_ms(), description, source, request_json, cap, queue)
    }

    /// Records the signature of a task's request (made with the user's key, outside the
    /// workspace), which its worker checks before running it.
    pub(crate) fn sign_task_request(&self, id: &TaskId, mac: &str) -> Result<(), StoreError> {
        self.write(|tx| {
            tx.execute(
                "UPDATE tasks SET request_mac = ?2 WHERE id = ?1",
                params![id, mac],
            )?;
            Ok(())
        })
    }

    fn create_task_at(
        &self,
        now: i64,
        description: &str,
        source: Option<&str>,
        request_json: &str,
        cap: usize,
        queue: bool,
    ) -> Result<TaskRecord, StoreError> {
        let now_ts = Timestamp::from_millisecond(now)
            .map_err(|_| self.invalid("the system clock is out of range"))?;
        let date = TimeZone::UTC.to_datetime(now_ts).date();
        let day = TaskId::day_key(date);
        self.write(|tx| {
            let (running, queued): (i64, i64) = tx.query_row(
                "SELECT count(*) FILTER (WHERE status = 'running'),
                        count(*) FILTER (WHERE status = 'queued')
                 FROM tasks WHERE status IN ('running', 'queued')",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            let full = uint(running + queued) >= cap as u64;
            if full && !queue {
                return Err(StoreError::TooManyTasks {
                    running: uint(running) as usize,
                    cap,
                }
                .into());
            }
            let status = if full {
                TaskStatus::Queued
            } else {
                TaskStatus::Running
            };
            let seq: i64 = tx.query_row(
                "INSERT INTO task_counters (day, last) VALUES (?1, 1)
                 ON CONFLICT (day) DO UPDATE SET last = last + 1
                 RETURNING last",
                [&day],
                |r| r.get(0),
            )?;
            let id = TaskId::new(date, uint(seq));
            tx.execute(
                "INSERT INTO tasks (id, status, description, source, request, created_at,
                                    started_at, heartbeat_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?6)",
                params![
                    id,
                    status,
                    description,
                    source,
                    request_json,
                    now,
                    (status == TaskStatus::Running).then_some(now),
                ],
            )?;
            get_in(tx, &id)?.ok_or_else(|| Fail::Db(rusqlite::Error::QueryReturnedNoRows))
        })
    }

    /// Moves a queued task to `running` if a slot is free for it (FIFO: tasks queued before it
    /// go first). Also counts as the waiter's heartbeat.
    pub(crate) fn claim_slot(&self, id: &TaskId, cap: usize) -> Result<Claim, StoreError> {
        let now = now_ms();
        self.write(|tx| {
            let row: Option<(i64, TaskStatus)> = tx
                .query_row("SELECT seq, status FROM tasks WHERE id = ?1", [id], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()?;
            let seq = match row {
                None => return Ok(Claim::Gone(None)),
                Some((_, TaskStatus::Running)) => return Ok(Claim::Claimed),
                Some((_, status)) if status != TaskStatus::Queued => {
                    return Ok(Claim::Gone(Some(status)));
                }
                Some((seq, _)) => seq,
            };
            let (running, ahead): (i64, i64) = tx.query_row(
                "SELECT count(*) FILTER (WHERE status = 'running'),
                        count(*) FILTER (WHERE status = 'queued' AND seq < ?1)
                 FROM tasks WHERE status IN ('running', 'queued')",
                [seq],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            if uint(running + ahead) < cap as u64 {
                tx.execute(
                    "UPDATE tasks SET status = 'running', started_at = ?2, heartbeat_at = ?2
                     WHERE seq = ?1",
                    params![seq, now],
                )?;
                Ok(Claim::Claimed)
            } else {
                tx.execute(
                    "UPDATE tasks SET heartbeat_at = ?2 WHERE seq = ?1",
                    params![seq, now],
                )?;
                Ok(Claim::Full)
            }
        })
    }

    /// Records the worker process of a task. Returns whether the task exists.
    pub(crate) fn set_pid(&self, id: &TaskId, pid: u32) -> Result<bool, StoreError> {
        self.read(|conn| {
            Ok(conn.execute("UPDATE tasks SET pid = ?2 WHERE id = ?1", params![id, pid])? == 1)
        })
    }

    /// Records an MCP server the task's worker started: its process group and its leader's
    /// start time.
    pub(crate) fn add_server(
        &self,
        id: &TaskId,
        pgid: u32,
        started: u64,
    ) -> Result<(), StoreError> {
        self.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO task_servers (task_id, pgid, started) VALUES (?1, ?2, ?3)",
                params![id, pgid, started as i64],
            )?;
            Ok(())
        })
    }

    /// Forgets an MCP server the task's worker stopped.
    pub(crate) fn remove_server(&self, id: &TaskId, pgid: u32) -> Result<(), StoreError> {
        self.write(|tx| {
            tx.execute(
                "DELETE FROM task_servers WHERE task_id = ?1 AND pgid = ?2",
                params![id, pgid],
            )?;
            Ok(())
        })
    }

    /// Takes (returns and forgets) the MCP servers recorded for a task: `(pgid, started)`.
    pub(crate) fn take_servers(&self, id: &TaskId) -> Result<Vec<(u32, u64)>, StoreError> {
        self.write(|tx| {
            let servers = tx
                .prepare_cached(
                    "DELETE FROM task_servers WHERE task_id = ?1 RETURNING pgid, started",
                )?
                .query_map([id], |r| {
                    Ok((r.get::<_, u32>(0)?, r.get::<_, i64>(1)? as u64))
                })?
                .collect::<Result<_, _>>()?;
            Ok(servers)
        })
    }

    /// Records the provider and model the worker resolved. Returns whether the task exists.
    pub(crate) fn set_model(
        &self,
        id: &TaskId,
        provider: &str,
        model: &str,
    ) -> Result<bool, StoreError> {
        self.read(|conn| {
            Ok(conn.execute(
                "UPDATE tasks SET provider = ?2, model = ?3 WHERE id = ?1",
                params![id, provider, model],
            )? == 1)
        })
    }

    /// Records what went wrong with a task's extensions (nothing when `warnings` is empty).
    pub(crate) fn set_warnings(&self, id: &TaskId, warnings: &[String]) -> Result<(), StoreError> {
        if warnings.is_empty() {
            return Ok(());
        }
        let text = serde_json::to_string(warnings).map_err(|e| self.invalid(e.to_string()))?;
        self.read(|conn| {
            conn.execute(
                "UPDATE tasks SET warnings = ?2 WHERE id = ?1",
                params![id, text],
            )?;
            Ok(())
        })
    }

    /// The worker is alive. [`Control::Stop`] when it should stop (cancel requested, or the task
    /// was ended by someone else or is gone).
    pub(crate) fn heartbeat(&self, id: &TaskId) -> Result<Control, StoreError> {
        let now = now_ms();
        self.read(|conn| {
            let cancel: Option<bool> = conn
                .prepare_cached(
                    "UPDATE tasks SET heartbeat_at = ?2
                     WHERE id = ?1 AND status IN ('queued', 'running')
                     RETURNING cancel_requested",
                )?
                .query_row(params![id, now], |r| r.get(0))
                .optional()?;
            Ok(match cancel {
                Some(false) => Control::Continue,
                _ => Control::Stop,
            })
        })
    }

    /// Records progress of a running task: the turns and token totals so far, and (if given)
    /// one more tool call, kept in the ring of recent lines. Also a heartbeat.
    pub(crate) fn record_progress(
        &self,
        id: &TaskId,
        turns: u32,
        tool_call_line: Option<&str>,
        tokens: Usage,
    ) -> Result<Control, StoreError> {
        let now = now_ms();
        self.write(|tx| {
            let row: Option<(bool, String)> = tx
                .query_row(
                    "SELECT cancel_requested, recent_tool_calls FROM tasks
                     WHERE id = ?1 AND status IN ('queued', 'running')",
                    [id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let Some((cancel, recent)) = row else {
                return Ok(Control::Stop);
            };
            let recent = match tool_call_line {
                None => recent,
                Some(line) => {
                    let mut lines: Vec<String> = serde_json::from_str(&recent).unwrap_or_default();
                    lines.push(clip(line).to_owned());
                    let excess = lines.len().saturating_sub(RECENT_TOOL_CALLS);
                    lines.drain(..excess);
                    serde_json::to_string(&lines).expect("strings serialize")
                }
            };
            tx.execute(
                "UPDATE tasks SET turns = ?2, input_tokens = ?3, output_tokens = ?4,
                    tool_calls = tool_calls + ?5, recent_tool_calls = ?6,
                    last_activity_at = ?7, heartbeat_at = ?7
                 WHERE id = ?1",
                params![
                    id,
                    turns,
                    int(tokens.input_tokens),
                    int(tokens.output_tokens),
                    i64::from(tool_call_line.is_some()),
                    recent,
                    now,
                ],
            )?;
            Ok(if cancel {
                Control::Stop
            } else {
                Control::Continue
            })
        })
    }

    /// Records the end of a task. `status` must be terminal. Compare-and-set: only a `queued` or
    /// `running` task is changed, and the answer says whether it was. A task already ended by
    /// someone else (cancelled, marked dead) keeps its status and error; its output, turns and
    /// tokens are filled in only if it has no output yet.
    pub(crate) fn finish(
        &self,
        id: &TaskId,
        status: TaskStatus,
        output: Option<&str>,
        error: Option<&str>,
        tokens: Usage,
        turns: u32,
    ) -> Result<bool, StoreError> {
        if !status.is_terminal() {
            return Err(self.invalid(format!(
                "cannot finish task {id} as '{status}': not a final status"
            )));
        }
        let now = now_ms();
        let (input, out) = (int(tokens.input_tokens), int(tokens.output_tokens));
        self.write(|tx| {
            let changed = tx.execute(
                "UPDATE tasks SET status = ?2, output = ?3, error = ?4, input_tokens = ?5,
                    output_tokens = ?6, turns = ?7, finished_at = ?8, heartbeat_at = ?8
                 WHERE id = ?1 AND status IN ('queued', 'running')",
                params![id, status, output, error, input, out, turns, now],
            )?;
            if changed == 0 && output.is_some() {
                tx.execute(
                    "UPDATE tasks SET output = ?2, input_tokens = ?3, output_tokens = ?4,
                        turns = ?5
                     WHERE id = ?1 AND status IN ('cancelled', 'failed') AND output IS NULL",
                    params![id, output, input, out, turns],
                )?;
            }
            Ok(changed == 1)
        })
    }

    /// Asks the worker of a task to stop (it sees [`Control::Stop`] at its next report). A
    /// queued task holds no slot and is cancelled at once. Returns the status afterwards
    /// (`None`: no such task).
    pub(crate) fn request_cancel(&self, id: &TaskId) -> Result<Option<TaskStatus>, StoreError> {
        let now = now_ms();
        self.write(|tx| {
            let status: Option<TaskStatus> = tx
                .query_row("SELECT status FROM tasks WHERE id = ?1", [id], |r| r.get(0))
                .optional()?;
            match status {
                Some(TaskStatus::Queued) => {
                    tx.execute(
                        "UPDATE tasks SET status = 'cancelled', cancel_requested = 1,
                            finished_at = ?2
                         WHERE id = ?1",
                        params![id, now],
                    )?;
                    Ok(Some(TaskStatus::Cancelled))
                }
                Some(TaskStatus::Running) => {
                    tx.execute("UPDATE tasks SET cancel_requested = 1 WHERE id = ?1", [id])?;
                    Ok(Some(TaskStatus::Running))
                }
                other => Ok(other),
            }
        })
    }

    /// Marks a queued or running task cancelled (after the worker was stopped, or did not stop
    /// in time). Returns whether it changed the task.
    pub(crate) fn cancel(&self, id: &TaskId) -> Result<bool, StoreError> {
        let now = now_ms();
        self.read(|conn| {
            Ok(conn.execute(
                "UPDATE tasks SET status = 'cancelled', cancel_requested = 1, finished_at = ?2
                 WHERE id = ?1 AND status IN ('queued', 'running')",
                params![id, now],
            )? == 1)
        })
    }

    /// The task, if it exists (not expired).
    pub(crate) fn get(&self, id: &TaskId) -> Result<Option<TaskRecord>, StoreError> {
        self.read(|conn| Ok(get_in(conn, id)?))
    }

    /// The task, or whether it expired or never existed.
    pub(crate) fn lookup(&self, id: &TaskId) -> Result<TaskLookup, StoreError> {
        self.read(|conn| {
            if let Some(task) = get_in(conn, id)? {
                return Ok(TaskLookup::Found(Box::new(task)));
            }
            let expired = conn
                .query_row(
                    "SELECT 1 FROM expired_tasks WHERE id = ?1",
                    [id],
                    |_| Ok(()),
                )
                .optional()?;
            Ok(match expired {
                Some(()) => TaskLookup::Expired,
                None => TaskLookup::NotFound,
            })
        })
    }

    /// Tasks matching `filter`, oldest first.
    pub(crate) fn list(&self, filter: TaskFilter) -> Result<Vec<TaskRecord>, StoreError> {
        let (condition, status) = match filter {
            TaskFilter::All => ("1", None),
            TaskFilter::Active => ("status IN ('queued', 'running')", None),
            TaskFilter::Finished => ("status IN ('completed', 'failed', 'cancelled')", None),
            TaskFilter::Status(status) => ("status = ?1", Some(status)),
        };
        let sql = format!("SELECT {COLUMNS} FROM tasks WHERE {condition} ORDER BY seq");
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows: rusqlite::Result<Vec<TaskRecord>> = match status {
                Some(status) => stmt.query_map([status], record)?.collect(),
                None => stmt.query_map([], record)?.collect(),
            };
            Ok(rows?)
        })
    }

    /// How many tasks hold a slot.
    pub(crate) fn running_count(&self) -> Result<usize, StoreError> {
        self.read(|conn| {
            let n: i64 = conn.query_row(
                "SELECT count(*) FROM tasks WHERE status = 'running'",
                [],
                |r| r.get(0),
            )?;
            Ok(uint(n) as usize)
        })
    }

    /// Fails every queued or running task whose heartbeat is older than `stale_after` and whose
    /// worker `is_alive` says is gone (it checks the pid, a lock file, ...), with the error
    /// `worker died (no heartbeat since …)`. Returns the tasks it failed. `is_alive` should
    /// count a task without a pid yet (its worker is being spawned) as alive; `stale_after`
    /// should be a few heartbeat intervals.
    pub(crate) fn mark_dead_workers(
        &self,
        is_alive: impl Fn(&TaskRecord) -> bool,
        stale_after: Duration,
    ) -> Result<Vec<TaskId>, StoreError> {
        self.mark_dead_workers_at(now_ms(), is_alive, stale_after)
    }

    fn mark_dead_workers_at(
        &self,
        now: i64,
        is_alive: impl Fn(&TaskRecord) -> bool,
        stale_after: Duration,
    ) -> Result<Vec<TaskId>, StoreError> {
        let cutoff = now.saturating_sub(duration_ms(stale_after));
        let stale: Vec<TaskRecord> = self.read(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM tasks
                 WHERE status IN ('queued', 'running') AND heartbeat_at <= ?1 ORDER BY seq"
            ))?;
            let rows = stmt.query_map([cutoff], record)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })?;
        // The liveness checks run outside any transaction; the update below only applies if the
        // heartbeat did not move meanwhile.
        let dead: Vec<TaskRecord> = stale.into_iter().filter(|t| !is_alive(t)).collect();
        if dead.is_empty() {
            return Ok(Vec::new());
        }
        self.write(|tx| {
            let mut marked = Vec::new();
            for task in &dead {
                let since = Timestamp::from_second(task.heartbeat_at.as_second())
                    .unwrap_or(task.heartbeat_at);
                let pid = task.pid.map(|p| format!(", pid {p}")).unwrap_or_default();
                let error = format!("worker died (no heartbeat since {since}{pid})");
                let changed = tx.execute(
                    "UPDATE tasks SET status = 'failed', error = ?2, finished_at = ?3
                     WHERE id = ?1 AND status IN ('queued', 'running') AND heartbeat_at = ?4",
                    params![task.id, error, now, task.heartbeat_at.as_millisecond()],
                )?;
                if changed == 1 {
                    marked.push(task.id);
                }
            }
            Ok(marked)
        })
    }

    /// Deletes finished tasks whose `finished_at` is at least `ttl` ago (and their log files),
    /// remembering their ids so [`Store::lookup`] answers [`TaskLookup::Expired`]; forgets
    /// expired ids after 7 days. Returns the expired tasks.
    pub(crate) fn expire(&self, ttl: Duration) -> Result<Vec<TaskId>, StoreError> {
        self.expire_at(now_ms(), ttl)
    }

    fn expire_at(&self, now: i64, ttl: Duration) -> Result<Vec<TaskId>, StoreError> {
        let cutoff = now.saturating_sub(duration_ms(ttl));
        let forget = now.saturating_sub(duration_ms(EXPIRED_MEMORY));
        let expired = self.write(|tx| {
            let ids: Vec<TaskId> = tx
                .prepare_cached(
                    "DELETE FROM tasks
                     WHERE status IN ('completed', 'failed', 'cancelled') AND finished_at <= ?1
                     RETURNING id",
                )?
                .query_map([cutoff], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            let mut remember = tx.prepare_cached(
                "INSERT OR REPLACE INTO expired_tasks (id, expired_at) VALUES (?1, ?2)",
            )?;
            let mut servers = tx.prepare_cached("DELETE FROM task_servers WHERE task_id = ?1")?;
            for id in &ids {
                remember.execute(params![id, now])?;
                servers.execute([id])?;
            }
            tx.execute("DELETE FROM expired_tasks WHERE expired_at < ?1", [forget])?;
            Ok(ids)
        })?;
        for id in &expired {
            let _ = std::fs::remove_file(self.task_log_path(id));
        }
        Ok(expired)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Barrier;

    const HOUR_MS: i64 = 3_600_000;

    fn store() -> (tempfile::TempDir, Store) {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        (tmp, store)
    }

    fn usage(input: u64, output: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            ..Usage::default()
        }
    }

    #[test]
    fn create_allocates_per_day_ids_and_records_the_request() {
        let (_tmp, store) = store();
        // 2026-02-19T23:00:00Z and one hour later (the next UTC day).
        let day1 = 1_771_542_000_000;
        let a = store
            .create_task_at(day1, "first", Some("review"), r#"{"x":1}"#, 5, false)
            .unwrap();
        let b = store
            .create_task_at(day1 + 1, "second", None, "{}", 5, false)
            .unwrap();
        let c = store
            .create_task_at(day1 + HOUR_MS, "third", None, "{}", 5, false)
            .unwrap();
        assert_eq!(a.id.to_string(), "20260219_1");
        assert_eq!(b.id.to_string(), "20260219_2");
        assert_eq!(c.id.to_string(), "20260220_1");
        assert_eq!(a.status, TaskStatus::Running);
        assert_eq!(a.description, "first");
        assert_eq!(a.source.as_deref(), Some("review"));
        assert_eq!(a.request_json, r#"{"x":1}"#);
        assert_eq!(a.started_at, Some(a.created_at));
        assert_eq!(a.heartbeat_at, a.created_at);
        assert_eq!(a.last_activity_at, None);
        assert_eq!((a.turns, a.tool_calls, a.pid), (0, 0, None));
        assert_eq!(store.get(&a.id).unwrap().unwrap(), a);
        assert_eq!(store.running_count().unwrap(), 3);
    }

    #[test]
    fn refused_creation_uses_no_id_and_says_how_to_proceed() {
        let (_tmp, store) = store();
        store.create_task("a", None, "{}", 1, false).unwrap();
        let err = store.create_task("b", None, "{}", 1, false).unwrap_err();
        assert!(matches!(
            err,
            StoreError::TooManyTasks { running: 1, cap: 1 }
        ));
        assert_eq!(
            err.to_string(),
            "Maximum number of background tasks (1) reached. Wait for a task to finish, use \
             `summon load TASK_ID` to collect one, or run without --async (synchronously)."
        );
        let queued = store.create_task("c", None, "{}", 1, true).unwrap();
        assert_eq!(queued.status, TaskStatus::Queued);
        assert_eq!(queued.id.seq(), 2, "the refused task used no id");
        assert_eq!(queued.started_at, None);
    }

    fn concurrent_creates(queue: bool) -> (tempfile::TempDir, Vec<Result<TaskRecord, StoreError>>) {
        let tmp = tempfile::tempdir().unwrap();
        Store::open(tmp.path()).unwrap();
        let barrier = Barrier::new(20);
        let results = std::thread::scope(|s| {
            let handles: Vec<_> = (0..20)
                .map(|i| {
                    let (barrier, dir) = (&barrier, tmp.path());
                    s.spawn(move || {
                        let store = Store::open(dir).unwrap();
                        barrier.wait();
                        store.create_task(&format!("task {i}"), None, "{}", 5, queue)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        (tmp, results)
    }

    #[test]
    fn twenty_concurrent_creates_respect_the_cap() {
        let (tmp, results) = concurrent_creates(false);
        let ok: Vec<&TaskRecord> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(ok.len(), 5);
        assert!(ok.iter().all(|t| t.status == TaskStatus::Running));
        for err in results.iter().filter_map(|r| r.as_ref().err()) {
            assert!(
                matches!(err, StoreError::TooManyTasks { cap: 5, .. }),
                "{err}"
            );
        }
        let ids: HashSet<String> = ok.iter().map(|t| t.id.to_string()).collect();
        assert_eq!(ids.len(), 5);
        let store = Store::open(tmp.path()).unwrap();
        assert_eq!(store.running_count().unwrap(), 5);
    }

    #[test]
    fn twenty_concurrent_queued_creates_get_distinct_ids() {
        let (tmp, results) = concurrent_creates(true);
        let tasks: Vec<TaskRecord> = results.into_iter().map(Result::unwrap).collect();
        let ids: HashSet<TaskId> = tasks.iter().map(|t| t.id).collect();
        assert_eq!(ids.len(), 20);
        let mut seqs: Vec<u64> = ids.iter().map(TaskId::seq).collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=20).collect::<Vec<_>>(), "no gaps, no duplicates");
        let running = tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Running)
            .count();
        let queued = tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Queued)
            .count();
        assert_eq!((running, queued), (5, 15));
        let store = Store::open(tmp.path()).unwrap();
        assert_eq!(store.list(TaskFilter::Active).unwrap().len(), 20);
    }

    #[test]
    fn claim_slot_is_first_in_first_out() {
        let (_tmp, store) = store();
        let cap = 2;
        let r1 = store.create_task("r1", None, "{}", cap, false).unwrap();
        let r2 = store.create_task("r2", None, "{}", cap, false).unwrap();
        let q1 = store.create_task("q1", None, "{}", cap, true).unwrap();
        let q2 = store.create_task("q2", None, "{}", cap, true).unwrap();
        assert_eq!(store.claim_slot(&q1.id, cap).unwrap(), Claim::Full);
        assert_eq!(store.claim_slot(&q2.id, cap).unwrap(), Claim::Full);

        // One slot frees: only the oldest waiter gets it, even if the younger asks first.
        assert!(
            store
                .finish(
                    &r1.id,
                    TaskStatus::Completed,
                    Some("ok"),
                    None,
                    usage(1, 1),
                    1
                )
                .unwrap()
        );
        assert_eq!(store.claim_slot(&q2.id, cap).unwrap(), Claim::Full);
        // A new task does not jump the queue either.
        assert!(matches!(
            store.create_task("late", None, "{}", cap, false),
            Err(StoreError::TooManyTasks { .. })
        ));
        assert_eq!(store.claim_slot(&q1.id, cap).unwrap(), Claim::Claimed);
        assert_eq!(
            store.claim_slot(&q1.id, cap).unwrap(),
            Claim::Claimed,
            "idempotent"
        );
        assert_eq!(store.claim_slot(&q2.id, cap).unwrap(), Claim::Full);
        let q1_now = store.get(&q1.id).unwrap().unwrap();
        assert_eq!(q1_now.status, TaskStatus::Running);
        assert!(q1_now.started_at.is_some());

        // A cancelled waiter stops waiting, and its place is given up.
        assert_eq!(
            store.request_cancel(&q2.id).unwrap(),
            Some(TaskStatus::Cancelled)
        );
        assert_eq!(
            store.claim_slot(&q2.id, cap).unwrap(),
            Claim::Gone(Some(TaskStatus::Cancelled))
        );
        assert!(
            store
                .finish(
                    &r2.id,
                    TaskStatus::Failed,
                    None,
                    Some("boom"),
                    usage(0, 0),
                    0
                )
                .unwrap()
        );
        let late = store.create_task("late", None, "{}", cap, false).unwrap();
        assert_eq!(late.status, TaskStatus::Running);
        let missing: TaskId = "20000101_1".parse().unwrap();
        assert_eq!(store.claim_slot(&missing, cap).unwrap(), Claim::Gone(None));
    }

    #[test]
    fn concurrent_claims_never_exceed_the_cap() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        let cap = 3;
        let ids: Vec<TaskId> = (0..12)
            .map(|i| {
                store
                    .create_task(&i.to_string(), None, "{}", 0, true)
                    .unwrap()
                    .id
            })
            .collect();
        let barrier = Barrier::new(ids.len());
        let claimed = std::thread::scope(|s| {
            let handles: Vec<_> = ids
                .iter()
                .map(|id| {
                    let (barrier, dir) = (&barrier, tmp.path());
                    s.spawn(move || {
                        let store = Store::open(dir).unwrap();
                        barrier.wait();
                        store.claim_slot(id, cap).unwrap() == Claim::Claimed
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .filter(|&c| c)
                .count()
        });
        assert_eq!(claimed, cap, "FIFO: exactly the first {cap} get a slot");
        assert_eq!(store.running_count().unwrap(), claimed);
    }

    #[test]
    fn progress_heartbeat_and_tool_call_ring() {
        let (_tmp, store) = store();
        let task = store.create_task("t", None, "{}", 5, false).unwrap();
        assert!(store.set_pid(&task.id, 4242).unwrap());
        assert!(store.set_model(&task.id, "openai", "gpt-x").unwrap());
        assert_eq!(store.heartbeat(&task.id).unwrap(), Control::Continue);
        for i in 0..25 {
            let line = format!("call {i}");
            let control = store
                .record_progress(&task.id, i / 5, Some(&line), usage(10 * u64::from(i), 1))
                .unwrap();
            assert_eq!(control, Control::Continue);
        }
        store
            .record_progress(&task.id, 6, None, usage(300, 7))
            .unwrap();
        let long = "é".repeat(400);
        store
            .record_progress(&task.id, 6, Some(&long), usage(300, 7))
            .unwrap();
        let t = store.get(&task.id).unwrap().unwrap();
        assert_eq!(t.pid, Some(4242));
        assert_eq!(
            (t.provider.as_deref(), t.model.as_deref()),
            (Some("openai"), Some("gpt-x"))
        );
        assert_eq!(t.turns, 6);
        assert_eq!(t.tool_calls, 26);
        assert_eq!(t.tokens, usage(300, 7));
        assert_eq!(t.recent_tool_calls.len(), RECENT_TOOL_CALLS);
        assert_eq!(t.recent_tool_calls[0], "call 6");
        assert_eq!(t.recent_tool_calls[18], "call 24");
        assert_eq!(
            t.recent_tool_calls[19].len(),
            500,
            "clipped at a char boundary"
        );
        assert!(t.last_activity_at.is_some());
        assert!(t.heartbeat_at >= t.created_at);
    }

    #[test]
    fn cancel_request_reaches_the_worker_and_finish_is_compare_and_set() {
        let (_tmp, store) = store();
        let task = store.create_task("t", None, "{}", 5, false).unwrap();
        assert_eq!(
            store.request_cancel(&task.id).unwrap(),
            Some(TaskStatus::Running)
        );
        assert_eq!(store.heartbeat(&task.id).unwrap(), Control::Stop);
        assert_eq!(
            store
                .record_progress(&task.id, 1, None, usage(1, 1))
                .unwrap(),
            Control::Stop
        );
        // The worker did not stop in time: the canceller marks it.
        assert!(store.cancel(&task.id).unwrap());
        assert!(!store.cancel(&task.id).unwrap());
        // The worker's late finish does not overwrite the cancellation, but its output is kept.
        let applied = store
            .finish(
                &task.id,
                TaskStatus::Completed,
                Some("partial"),
                None,
                usage(5, 6),
                2,
            )
            .unwrap();
        assert!(!applied);
        let t = store.get(&task.id).unwrap().unwrap();
        assert_eq!(t.status, TaskStatus::Cancelled);
        assert_eq!(t.output.as_deref(), Some("partial"));
        assert_eq!((t.turns, t.tokens), (2, usage(5, 6)));
        assert!(t.finished_at.is_some());
        // A second late finish changes nothing.
        store
            .finish(
                &task.id,
                TaskStatus::Completed,
                Some("other"),
                None,
                usage(9, 9),
                9,
            )
            .unwrap();
        assert_eq!(
            store.get(&task.id).unwrap().unwrap().output.as_deref(),
            Some("partial")
        );
        assert_eq!(store.heartbeat(&task.id).unwrap(), Control::Stop);

        let done = store.create_task("d", None, "{}", 5, false).unwrap();
        assert!(
            store
                .finish(
                    &done.id,
                    TaskStatus::Completed,
                    Some("fine"),
                    None,
                    usage(1, 2),
                    3
                )
                .unwrap()
        );
        assert!(
            !store
                .finish(
                    &done.id,
                    TaskStatus::Failed,
                    None,
                    Some("late"),
                    usage(0, 0),
                    0
                )
                .unwrap()
        );
        let d = store.get(&done.id).unwrap().unwrap();
        assert_eq!(
            (d.status, d.output.as_deref(), d.error),
            (TaskStatus::Completed, Some("fine"), None)
        );
        assert_eq!(
            store.request_cancel(&done.id).unwrap(),
            Some(TaskStatus::Completed)
        );
        assert!(!store.cancel(&done.id).unwrap());

        let err = store
            .finish(&done.id, TaskStatus::Running, None, None, usage(0, 0), 0)
            .unwrap_err();
        assert!(err.to_string().contains("not a final status"), "{err}");
    }

    #[test]
    fn dead_workers_are_failed_only_when_stale_and_not_alive() {
        let (_tmp, store) = store();
        let t0 = now_ms() - 120_000;
        let dead = store
            .create_task_at(t0, "dead", None, "{}", 5, false)
            .unwrap();
        let alive = store
            .create_task_at(t0, "alive", None, "{}", 5, false)
            .unwrap();
        let fresh = store.create_task("fresh", None, "{}", 5, false).unwrap();
        store.set_pid(&dead.id, 111).unwrap();
        store.set_pid(&alive.id, 222).unwrap();
        let is_alive = |t: &TaskRecord| t.pid == Some(222);
        // Not stale yet: nothing happens, whatever the liveness check says.
        assert!(
            store
                .mark_dead_workers_at(t0 + 1_000, |_| false, Duration::from_secs(30))
                .unwrap()
                .is_empty()
        );
        // Now the two old ones are stale, `fresh` is not.
        store.heartbeat(&fresh.id).unwrap();
        let marked = store
            .mark_dead_workers(is_alive, Duration::from_secs(30))
            .unwrap();
        assert_eq!(marked, vec![dead.id]);
        let d = store.get(&dead.id).unwrap().unwrap();
        assert_eq!(d.status, TaskStatus::Failed);
        let error = d.error.unwrap();
        assert!(
            error.starts_with("worker died (no heartbeat since 20"),
            "{error}"
        );
        assert!(error.ends_with("Z, pid 111)"), "{error}");
        assert_eq!(
            store.get(&alive.id).unwrap().unwrap().status,
            TaskStatus::Running
        );
        assert_eq!(
            store.get(&fresh.id).unwrap().unwrap().status,
            TaskStatus::Running
        );
        // The dead worker's slot is free again.
        assert_eq!(store.running_count().unwrap(), 2);
        // Its late finish is refused.
        assert!(
            !store
                .finish(&dead.id, TaskStatus::Completed, None, None, usage(0, 0), 0)
                .unwrap()
        );
    }

    #[test]
    fn expiry_forgets_results_but_remembers_ids() {
        let (_tmp, store) = store();
        let done = store.create_task("done", None, "{}", 5, false).unwrap();
        let running = store.create_task("running", None, "{}", 5, false).unwrap();
        store
            .finish(
                &done.id,
                TaskStatus::Completed,
                Some("x"),
                None,
                usage(0, 0),
                1,
            )
            .unwrap();
        let log = store.task_log_path(&done.id);
        std::fs::create_dir_all(log.parent().unwrap()).unwrap();
        std::fs::write(&log, "log").unwrap();

        assert!(store.expire(Duration::from_secs(600)).unwrap().is_empty());
        assert!(matches!(
            store.lookup(&done.id).unwrap(),
            TaskLookup::Found(_)
        ));
        assert_eq!(store.list(TaskFilter::Finished).unwrap().len(), 1);

        let expired = store
            .expire_at(now_ms() + 601_000, Duration::from_secs(600))
            .unwrap();
        assert_eq!(expired, vec![done.id]);
        assert!(!log.exists());
        assert_eq!(store.lookup(&done.id).unwrap(), TaskLookup::Expired);
        assert_eq!(store.get(&done.id).unwrap(), None);
        assert!(
            matches!(store.lookup(&running.id).unwrap(), TaskLookup::Found(_)),
            "running tasks never expire"
        );
        let never: TaskId = "20000101_1".parse().unwrap();
        assert_eq!(store.lookup(&never).unwrap(), TaskLookup::NotFound);

        // Ids are not reused after expiry.
        let next = store.create_task("next", None, "{}", 5, false).unwrap();
        assert!(next.id.seq() > running.id.seq() || next.id.date() > running.id.date());

        // Expired ids are forgotten after a week.
        store
            .expire_at(now_ms() + 8 * 24 * HOUR_MS, Duration::from_secs(600))
            .unwrap();
        assert_eq!(store.lookup(&done.id).unwrap(), TaskLookup::NotFound);
    }

    #[test]
    fn list_filters_in_creation_order() {
        let (_tmp, store) = store();
        let ids: Vec<TaskId> = (0..12)
            .map(|i| {
                store
                    .create_task(&i.to_string(), None, "{}", 100, false)
                    .unwrap()
                    .id
            })
            .collect();
        store
            .finish(&ids[3], TaskStatus::Completed, None, None, usage(0, 0), 0)
            .unwrap();
        store
            .finish(&ids[10], TaskStatus::Failed, None, None, usage(0, 0), 0)
            .unwrap();
        let all: Vec<TaskId> = store
            .list(TaskFilter::All)
            .unwrap()
            .iter()
            .map(|t| t.id)
            .collect();
        assert_eq!(all, ids, "seq order, not text order (…_10 after …_9)");
        let finished: Vec<TaskId> = store
            .list(TaskFilter::Finished)
            .unwrap()
            .iter()
            .map(|t| t.id)
            .collect();
        assert_eq!(finished, vec![ids[3], ids[10]]);
        assert_eq!(store.list(TaskFilter::Active).unwrap().len(), 10);
        assert_eq!(
            store
                .list(TaskFilter::Status(TaskStatus::Failed))
                .unwrap()
                .len(),
            1
        );
    }
}
