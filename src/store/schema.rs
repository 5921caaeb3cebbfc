//! Versioned schema migrations.
//!
//! `PRAGMA user_version` is the number of migrations applied. [`MIGRATIONS`] is append-only:
//! never edit a released migration, add a new one (and keep it additive where possible, so
//! that the previous summon keeps working until the user upgrades every copy). Each migration
//! runs in its own `BEGIN IMMEDIATE` transaction together with its `user_version` bump, and the
//! version is re-read inside that transaction, so many processes opening a fresh store at once
//! apply every migration exactly once. A database whose version is above [`SCHEMA_VERSION`]
//! was written by a newer summon and is refused with [`StoreError::NewerSchema`] rather than
//! misread.
//!
//! Tables are `STRICT` (SQLite type-checks every value); timestamps are INTEGER milliseconds
//! since the Unix epoch; JSON columns are TEXT, opaque to the store unless noted.

use std::path::Path;

use rusqlite::{Connection, Transaction, TransactionBehavior};

use super::{Fail, StoreError, retry_busy};

/// Version 1: background tasks and run journals.
const V1: &str = r#"
-- Background tasks (`delegate --async`). `seq` orders tasks by creation (the queue order);
-- `id` is the user-facing YYYYMMDD_N.
CREATE TABLE task_counters (
    day  TEXT    PRIMARY KEY,          -- YYYYMMDD (UTC)
    last INTEGER NOT NULL              -- last sequence number handed out that day
) STRICT;

CREATE TABLE tasks (
    seq               INTEGER PRIMARY KEY,
    id                TEXT    NOT NULL UNIQUE,
    status            TEXT    NOT NULL
        CHECK (status IN ('queued', 'running', 'completed', 'failed', 'cancelled')),
    description       TEXT    NOT NULL,
    source            TEXT,
    request           TEXT    NOT NULL,  -- the delegation request (JSON, opaque)
    pid               INTEGER,           -- the worker process
    cancel_requested  INTEGER NOT NULL DEFAULT 0,
    created_at        INTEGER NOT NULL,
    started_at        INTEGER,           -- when the task took a slot
    finished_at       INTEGER,
    last_activity_at  INTEGER,           -- last progress (turn, tool call)
    heartbeat_at      INTEGER NOT NULL,  -- last sign of life of the worker (or queued waiter)
    turns             INTEGER NOT NULL DEFAULT 0,
    tool_calls        INTEGER NOT NULL DEFAULT 0,
    recent_tool_calls TEXT    NOT NULL DEFAULT '[]',  -- JSON array of the last 20 lines
    output            TEXT,
    error             TEXT,
    input_tokens      INTEGER NOT NULL DEFAULT 0,
    output_tokens     INTEGER NOT NULL DEFAULT 0,
    provider          TEXT,
    model             TEXT
) STRICT;

CREATE INDEX tasks_by_status ON tasks (status, seq);

-- Ids of tasks removed by expiry, so `load ID` can say "expired" rather than "not found".
CREATE TABLE expired_tasks (
    id         TEXT    PRIMARY KEY,
    expired_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- Pipeline runs (`summon run`).
CREATE TABLE runs (
    run_id        TEXT    PRIMARY KEY,   -- YYYYMMDD-HHMMSS (UTC), "-N" added on a collision
    pipeline_path TEXT    NOT NULL,
    pipeline_hash TEXT    NOT NULL,
    params        TEXT    NOT NULL,      -- JSON
    catalog       TEXT    NOT NULL,      -- the frozen agent catalog (JSON, opaque)
    status        TEXT    NOT NULL
        CHECK (status IN ('running', 'completed', 'failed', 'interrupted')),
    created_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    shard         TEXT                   -- shard description (JSON, opaque), if sharded
) STRICT;

CREATE INDEX runs_by_pipeline ON runs (pipeline_path, created_at);

-- The journal: one row per finished task of a run (a retried task replaces its row).
CREATE TABLE run_tasks (
    run_id        TEXT    NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    step_id       TEXT    NOT NULL,
    item_index    INTEGER NOT NULL,
    input_hash    TEXT    NOT NULL,      -- hex content hash of the rendered request
    status        TEXT    NOT NULL
        CHECK (status IN ('submitted', 'completed', 'failed', 'cancelled')),
    output        TEXT,
    item          TEXT,                  -- the item (JSON)
    turns         INTEGER NOT NULL DEFAULT 0,
    input_tokens  INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    duration_ms   INTEGER NOT NULL DEFAULT 0,
    error         TEXT,
    finished_at   INTEGER NOT NULL,
    batch_id      TEXT,                  -- provider batch holding the task (backend: batch)
    PRIMARY KEY (run_id, step_id, item_index)
) STRICT;
"#;

/// Version 2: provider batches of a run (`backend: batch`), for `--resume` to poll them again.
const V2: &str = r#"
CREATE TABLE run_batches (
    run_id     TEXT    NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    batch_id   TEXT    NOT NULL,         -- the provider's id
    step_id    TEXT    NOT NULL,
    provider   TEXT    NOT NULL,         -- the provider's name in summon's configuration
    status     TEXT    NOT NULL CHECK (status IN ('submitted', 'ended')),
    tasks      TEXT    NOT NULL,         -- JSON: [{"index", "hash", "custom_id"}]
    created_at INTEGER NOT NULL,
    ended_at   INTEGER,
    PRIMARY KEY (run_id, batch_id)
) STRICT;

CREATE INDEX run_batches_by_step ON run_batches (run_id, step_id, status);
"#;

/// Version 3: run history. Who holds a live run (so a second run of the same pipeline is
/// refused while it lives), where its `--out` went, and its report for `summon runs show`.
const V3: &str = r#"
ALTER TABLE runs ADD COLUMN pid INTEGER;       -- the process running it, while it runs
ALTER TABLE runs ADD COLUMN out_dir TEXT;      -- `--out`, as given
ALTER TABLE runs ADD COLUMN report TEXT;       -- report.json's content (JSON), once it ended
ALTER TABLE runs ADD COLUMN options TEXT;      -- what `--resume` reuses: out, junit,
                                               -- concurrency (JSON)
ALTER TABLE runs ADD COLUMN defaults TEXT;     -- what picks the default provider and model
                                               -- (JSON, opaque): `--reuse` takes answers only
                                               -- from runs with the same

-- Task outputs, stored once per content: runs that give (or reuse) the same answer share it.
-- A run_tasks row names its output by `output_hash`; rows written before keep `output`.
CREATE TABLE outputs (
    hash TEXT PRIMARY KEY,                     -- hex SHA-256 of the text
    text TEXT NOT NULL
) STRICT;
ALTER TABLE run_tasks ADD COLUMN output_hash TEXT;

-- Ids of runs removed by retention: never handed out again (a run started within the same
-- second would get the id), and `--resume ID` can say the run was pruned.
CREATE TABLE pruned_runs (
    run_id    TEXT    PRIMARY KEY,
    pruned_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
CREATE INDEX run_tasks_by_output ON run_tasks (output_hash) WHERE output_hash IS NOT NULL;
"#;

/// Version 4: the MCP servers a background task's worker started, so that the command that
/// finds the worker dead (killed, with no chance to stop them) also stops them.
const V4: &str = r#"
CREATE TABLE task_servers (
    task_id TEXT    NOT NULL,          -- tasks.id
    pgid    INTEGER NOT NULL,          -- the server's process group: its leader's pid
    started INTEGER NOT NULL,          -- the leader's start time (clock ticks after boot, as in
                                       -- /proc/PID/stat), so a reused pid is never signalled
    PRIMARY KEY (task_id, pgid)
) STRICT, WITHOUT ROWID;
"#;

/// Version 5: what went wrong with a background task's extensions, so that `load` says so as
/// the foreground would.
const V5: &str = r#"
ALTER TABLE tasks ADD COLUMN warnings TEXT;   -- a JSON array of lines; NULL: none
"#;

/// Version 6: a journal row's answer is signed with the user's key (outside the workspace),
/// so that `reuse` takes no answer summon did not write.
const V6: &str = r#"
ALTER TABLE run_tasks ADD COLUMN mac TEXT;    -- hex HMAC-SHA256 of the answer; NULL: unsigned
"#;

/// Version 7: a background task's request is signed with the user's key, so that its worker
/// runs no request summon did not write.
const V7: &str = r#"
ALTER TABLE tasks ADD COLUMN request_mac TEXT; -- hex HMAC-SHA256 of id and request; NULL: unsigned
"#;

/// Version 8: what a resumed run needs to report a journaled task as the attempt that ran it
/// did: its model (its price), role, prompt, attempts and retries.
const V8: &str = r#"
ALTER TABLE run_tasks ADD COLUMN meta TEXT;   -- JSON (TaskMeta); NULL: written before
"#;

/// Every migration, in order; migration `i` takes the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7, V8];

/// The schema version this summon writes and understands.
pub(crate) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

pub(super) fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA user_version", [], |row| row.get(0))
}

fn newer(path: &Path, found: i64) -> StoreError {
    StoreError::NewerSchema {
        path: path.to_owned(),
        found,
        supported: SCHEMA_VERSION,
    }
}

/// Brings the database at `path` (open on `conn`) to [`SCHEMA_VERSION`].
pub(super) fn migrate(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    migrate_with(conn, path, MIGRATIONS)
}

fn migrate_with(conn: &Connection, path: &Path, migrations: &[&str]) -> Result<(), StoreError> {
    let target = migrations.len() as i64;
    let current = retry_busy(path, || Ok(user_version(conn)?))?;
    if current > target {
        return Err(newer(path, current));
    }
    let mut version = current;
    while version < target {
        version = retry_busy(path, || {
            let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
            // Another process may have migrated since we looked.
            let version = user_version(&tx)?;
            if version > target {
                return Err(Fail::Store(newer(path, version)));
            }
            if version == target {
                return Ok(version);
            }
            tx.execute_batch(migrations[version as usize])?;
            tx.pragma_update(None, "user_version", version + 1)?;
            tx.commit()?;
            Ok(version + 1)
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::Store;
    use super::*;

    fn tables(conn: &Connection) -> Vec<String> {
        let mut stmt = conn
            .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn migrates_an_empty_database_and_reopens_idempotently() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(
            tables(&store.conn),
            [
                "expired_tasks",
                "outputs",
                "pruned_runs",
                "run_batches",
                "run_tasks",
                "runs",
                "task_counters",
                "task_servers",
                "tasks"
            ]
        );
        let task = store
            .create_task("kept", None, "{}", 5, false)
            .expect("create");
        drop(store);

        let again = Store::open(tmp.path()).unwrap();
        assert_eq!(again.schema_version().unwrap(), SCHEMA_VERSION);
        assert!(
            again.get(&task.id).unwrap().is_some(),
            "data survives reopen"
        );
    }

    /// A store made by the first `version` migrations, holding one running task
    /// (`20260101_1`), opened by this summon.
    fn old_store_with_a_task(version: usize) -> (tempfile::TempDir, Store) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(super::super::DIR_NAME);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(super::super::DB_FILE);
        let conn = Connection::open(&path).unwrap();
        migrate_with(&conn, &path, &MIGRATIONS[..version]).unwrap();
        conn.execute(
            "INSERT INTO tasks (id, status, description, request, created_at, heartbeat_at)
             VALUES ('20260101_1', 'running', 'old', '{}', 1, 1)",
            [],
        )
        .unwrap();
        drop(conn);
        let store = Store::open(tmp.path()).unwrap();
        (tmp, store)
    }

    #[test]
    fn a_version_3_store_gains_the_task_servers_and_keeps_its_tasks() {
        let (_tmp, store) = old_store_with_a_task(3);
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        let id = "20260101_1".parse().unwrap();
        assert!(store.get(&id).unwrap().is_some(), "the old task is kept");
        store.add_server(&id, 4242, 77).unwrap();
        store.add_server(&id, 4243, 78).unwrap();
        store.remove_server(&id, 4243).unwrap();
        assert_eq!(store.take_servers(&id).unwrap(), [(4242, 77)]);
        assert_eq!(store.take_servers(&id).unwrap(), []);
    }

    #[test]
    fn a_version_4_store_gains_task_warnings_and_keeps_its_tasks() {
        let (_tmp, store) = old_store_with_a_task(4);
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        let id = "20260101_1".parse().unwrap();
        assert!(store.get(&id).unwrap().unwrap().warnings.is_empty());
        store
            .set_warnings(&id, &["extension `x` did not start".to_owned()])
            .unwrap();
        assert_eq!(
            store.get(&id).unwrap().unwrap().warnings,
            ["extension `x` did not start"]
        );
    }

    #[test]
    fn refuses_a_store_from_a_newer_summon() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        store
            .conn
            .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        drop(store);
        let err = Store::open(tmp.path()).unwrap_err();
        assert!(matches!(err, StoreError::NewerSchema { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains("newer version of summon"), "{message}");
        assert!(message.contains(".summon/state.db"), "{message}");
        assert!(message.contains(&format!("schema {}", SCHEMA_VERSION + 1)));
    }

    #[test]
    fn applies_pending_migrations_in_order_each_once() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("m.db");
        let conn = Connection::open(&path).unwrap();
        let steps = [
            "CREATE TABLE a (x INTEGER) STRICT;",
            "INSERT INTO a VALUES (1);",
            "INSERT INTO a VALUES (2);",
        ];
        migrate_with(&conn, &path, &steps[..2]).unwrap();
        assert_eq!(user_version(&conn).unwrap(), 2);
        migrate_with(&conn, &path, &steps[..2]).unwrap();
        migrate_with(&conn, &path, &steps).unwrap();
        migrate_with(&conn, &path, &steps).unwrap();
        let sum: i64 = conn
            .query_row("SELECT sum(x) FROM a", [], |r| r.get(0))
            .unwrap();
        assert_eq!((user_version(&conn).unwrap(), sum), (3, 3));
    }

    #[test]
    fn a_failing_migration_leaves_the_previous_version_intact() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("m.db");
        let conn = Connection::open(&path).unwrap();
        let steps = [
            "CREATE TABLE a (x INTEGER) STRICT;",
            "CREATE TABLE b (y INTEGER) STRICT; INSERT INTO nowhere VALUES (1);",
        ];
        let err = migrate_with(&conn, &path, &steps).unwrap_err();
        assert!(err.to_string().contains("m.db"), "{err}");
        assert_eq!(user_version(&conn).unwrap(), 1);
        let b_exists: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE name = 'b'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(b_exists, 0, "the failed migration was rolled back");
    }

    #[test]
    fn concurrent_first_opens_migrate_once() {
        let tmp = tempfile::tempdir().unwrap();
        let barrier = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    barrier.wait();
                    let store = Store::open(tmp.path()).unwrap();
                    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
                });
            }
        });
    }
}
