//! The `.summon/` store: durable state shared by every `summon` process of a project.
//!
//! # Layout
//!
//! `<project>/.summon/` holds `state.db` (SQLite, WAL mode: `state.db-wal`, `state.db-shm`
//! beside it), `tasks/<TASK_ID>.log` (a background worker's stdout/stderr, see
//! [`Store::task_log_path`]) and a `.gitignore` of `*` so none of it is committed.
//!
//! # Tables (schema in [`schema`], versioned by `PRAGMA user_version`)
//!
//! | table | rows | written by |
//! |---|---|---|
//! | `task_counters` | one per UTC day: the last task sequence number handed out | `create_task` |
//! | `tasks` | background tasks (`delegate --async`) | the caller (create), the worker (pid, heartbeat, progress, finish), `load --cancel` (cancel), any process (dead-worker sweep, expiry) |
//! | `expired_tasks` | ids of tasks deleted by expiry, kept 7 days | `expire` |
//! | `task_servers` | the MCP servers a worker runs: process group and leader's start time | the worker (as it starts and stops them), the dead-worker sweep's caller (takes them to stop them), `expire` |
//! | `runs` | pipeline runs (`summon run`) | the runner |
//! | `run_tasks` | one finished task of a run, keyed by (run, step, item index) | the runner's [`JournalWriter`] |
//! | `run_batches` | provider batches of a run in flight | the batch backend |
//!
//! Runs are held by their process, listed, and pruned by retention in [`history`].
//!
//! # Concurrency
//!
//! Many processes open the store at once: `--async` callers, workers, `summon tasks`, `load`,
//! pipeline runners. Every connection uses WAL (readers never block the writer and never see a
//! partial transaction), `synchronous=NORMAL` (a process crash — `kill -9` — never loses a
//! committed transaction; only a power loss may lose the last few), `foreign_keys=ON` and a
//! 10 s `busy_timeout`. Every read-modify-write runs in one `BEGIN IMMEDIATE` transaction (the
//! write lock is taken up front, so no transaction ever fails half-way on a lock upgrade) and is
//! retried with jittered backoff when SQLite still reports BUSY/LOCKED; after about a minute of
//! contention the caller gets [`StoreError::Busy`], never SQLite's "database is locked".
//!
//! All timestamps are stored as integer milliseconds since the Unix epoch (UTC).
//!
//! The API is synchronous (rusqlite is); async callers use `spawn_blocking`. A [`Store`] owns
//! one connection and is `Send` but not `Sync`: open one per thread, or share one behind a
//! mutex. [`JournalWriter`] has its own connection on its own thread.

// A few methods (writer statistics, direct result batches, running counts, id parts) serve
// only the store's own tests.
#![cfg_attr(
    not(test),
    expect(dead_code, reason = "some methods serve only the store's tests")
)]

mod batch;
mod history;
mod journal;
pub(crate) mod live;
mod schema;
pub(crate) mod sign;
mod task;
mod task_id;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use rusqlite::{Connection, ErrorCode, Transaction, TransactionBehavior};

pub(crate) use batch::{BatchRecord, BatchTask};
pub(crate) use history::{Retention, RunListing};
pub(crate) use journal::{
    FinishedMap, JournalStatus, JournalWriter, RunRecord, RunSetup, RunStatus, TaskResultRow,
    WriterOptions, micro_usd,
};
pub(crate) use schema::SCHEMA_VERSION;
pub(crate) use sign::{key_path, load_key};
pub(crate) use task::{Claim, Control, TaskFilter, TaskLookup, TaskRecord, TaskStatus};
pub(crate) use task_id::TaskId;

/// The store directory, relative to the project (working) directory.
pub(crate) const DIR_NAME: &str = ".summon";
/// The database file inside [`DIR_NAME`].
pub(crate) const DB_FILE: &str = "state.db";

/// How long SQLite itself waits for a lock before reporting BUSY.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// How many times a BUSY/LOCKED operation is retried on top of the busy timeout.
const BUSY_RETRIES: u32 = 6;

/// Everything that can go wrong in the store. Messages name the database file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    #[error("cannot create the summon store directory {}: {source}", .path.display())]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open the summon store {}: {source}", .path.display())]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("summon store {}: {source}", .path.display())]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error(
        "the summon store {} stayed locked by other summon processes for {}s; try again",
        .path.display(), .waited.as_secs()
    )]
    Busy { path: PathBuf, waited: Duration },
    #[error(
        "the summon store {} was written by a newer version of summon (store schema {found}, \
         this summon knows up to {supported}); upgrade summon, or delete {} to start over \
         (this discards background tasks and run journals)",
        .path.display(), .path.parent().unwrap_or(Path::new(DIR_NAME)).display()
    )]
    NewerSchema {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error("summon store {}: {detail}", .path.display())]
    Invalid { path: PathBuf, detail: String },
    #[error(
        "Maximum number of background tasks ({cap}) reached. Wait for a task to finish, use \
         `summon load TASK_ID` to collect one, or run without --async (synchronously)."
    )]
    TooManyTasks { running: usize, cap: usize },
    #[error("summon store {}: the run journal could not be written: {message}", .path.display())]
    Journal { path: PathBuf, message: String },
}

/// A handle on `<project>/.summon/state.db`: one SQLite connection.
#[derive(Debug)]
pub(crate) struct Store {
    conn: Connection,
    dir: PathBuf,
    db_path: PathBuf,
}

/// The project directory whose `.summon/` serves commands run in `cwd`: `cwd` itself or its
/// nearest parent with one, as git finds `.git`, so `summon tasks` and `summon load ID` work
/// from any subfolder of the project.
pub(crate) fn find_project(cwd: &Path) -> Option<PathBuf> {
    cwd.ancestors()
        .find(|dir| dir.join(DIR_NAME).is_dir())
        .map(Path::to_path_buf)
}

/// What makes a folder a project's root folder for [`project_root`].
pub(crate) const PROJECT_MARKERS: [&str; 8] = [
    DIR_NAME,
    "summon.yaml",
    ".git",
    "pipelines",
    "recipes",
    ".goose",
    ".agents",
    ".claude/agents",
];

/// The project folder `summon run` and `summon merge` work in when started in `cwd`: `cwd` or
/// its nearest parent holding one of [`PROJECT_MARKERS`] (`.summon/`, `summon.yaml`, `.git`, `pipelines/`,
/// `recipes/`, `.goose/`, `.agents/`, `.claude/agents/`), found upward as git finds `.git`,
/// and `cwd` itself when none does. The home folder is a project only when `cwd` is the home
/// folder (its `.goose/` and `.claude/` are the user's global folders), and the search stops
/// there. Returns the folder and the marker that made it one.
pub(crate) fn project_root(cwd: &Path, home: Option<&Path>) -> (PathBuf, Option<&'static str>) {
    for dir in cwd.ancestors() {
        if home == Some(dir) && dir != cwd {
            break;
        }
        if let Some(marker) = PROJECT_MARKERS
            .into_iter()
            .find(|m| dir.join(m).symlink_metadata().is_ok())
        {
            return (dir.to_path_buf(), Some(marker));
        }
    }
    (cwd.to_path_buf(), None)
}

impl Store {
    /// The store of the project `env.cwd` is in ([`find_project`]), created in its project
    /// folder ([`project_root`]) when there is none: for commands that write (a background
    /// task, a pipeline run).
    pub(crate) fn open_for(env: &crate::env::Env) -> Result<Store, StoreError> {
        let cwd = &env.cwd;
        Store::open(
            &find_project(cwd).unwrap_or_else(|| project_root(cwd, env.home().as_deref()).0),
        )
    }

    /// The store of the project `cwd` is in, or `None` when there is none: for commands that
    /// only read, which never create a `.summon/` folder.
    pub(crate) fn open_existing(cwd: &Path) -> Result<Option<Store>, StoreError> {
        find_project(cwd).map(|dir| Store::open(&dir)).transpose()
    }

    /// The project directory the store belongs to (the parent of `.summon/`).
    pub(crate) fn project_dir(&self) -> &Path {
        self.dir.parent().unwrap_or(&self.dir)
    }

    /// Opens (creating if needed) the store of `project_dir` and brings its schema up to date.
    /// Safe to call from many processes at once.
    pub(crate) fn open(project_dir: &Path) -> Result<Store, StoreError> {
        let dir = project_dir.join(DIR_NAME);
        std::fs::create_dir_all(&dir).map_err(|source| StoreError::CreateDir {
            path: dir.clone(),
            source,
        })?;
        let ignore = dir.join(".gitignore");
        if !ignore.exists() {
            // Best effort: the store works without it.
            let _ = std::fs::write(&ignore, "*\n");
        }
        let db_path = dir.join(DB_FILE);
        let conn = connect(&db_path)?;
        schema::migrate(&conn, &db_path)?;
        Ok(Store { conn, dir, db_path })
    }

    /// The `.summon/` directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The database file.
    pub(crate) fn db_path(&self) -> &Path {
        &self.db_path
    }

    /// Where a background worker's output goes: `.summon/tasks/<ID>.log` (the directory is
    /// created by the caller; [`Store::expire`] removes the file with the task).
    pub(crate) fn task_log_path(&self, id: &TaskId) -> PathBuf {
        self.dir.join("tasks").join(format!("{id}.log"))
    }

    /// The schema version of the database (`PRAGMA user_version`).
    pub(crate) fn schema_version(&self) -> Result<i64, StoreError> {
        self.read(|conn| Ok(schema::user_version(conn)?))
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction, committed when `f` succeeds, rolled back
    /// otherwise; the whole transaction is retried while the database is busy.
    fn write<T>(
        &self,
        mut f: impl FnMut(&Transaction<'_>) -> Result<T, Fail>,
    ) -> Result<T, StoreError> {
        retry_busy(&self.db_path, || {
            let tx = Transaction::new_unchecked(&self.conn, TransactionBehavior::Immediate)?;
            let value = f(&tx)?;
            tx.commit()?;
            Ok(value)
        })
    }

    /// Runs `f` (reads, or a single self-contained write statement), retried while busy.
    fn read<T>(&self, mut f: impl FnMut(&Connection) -> Result<T, Fail>) -> Result<T, StoreError> {
        retry_busy(&self.db_path, || f(&self.conn))
    }

    fn invalid(&self, detail: impl Into<String>) -> StoreError {
        StoreError::Invalid {
            path: self.db_path.clone(),
            detail: detail.into(),
        }
    }
}

/// Opens one connection to `db_path` with the store's settings (no migration).
fn connect(db_path: &Path) -> Result<Connection, StoreError> {
    let opened = Connection::open(db_path).and_then(|conn| {
        conn.busy_timeout(BUSY_TIMEOUT)?;
        Ok(conn)
    });
    let conn = opened.map_err(|source| StoreError::Open {
        path: db_path.to_owned(),
        source,
    })?;
    let configured = retry_busy(db_path, || {
        // Switching to WAL is persistent; on an existing WAL database this is a no-op.
        conn.query_row("PRAGMA journal_mode=WAL", [], |row| row.get::<_, String>(0))?;
        conn.execute_batch(
            "PRAGMA synchronous=NORMAL;
             PRAGMA foreign_keys=ON;
             PRAGMA journal_size_limit=67108864;",
        )?;
        Ok(())
    });
    match configured {
        Err(StoreError::Sqlite { path, source }) => Err(StoreError::Open { path, source }),
        other => other.map(|()| conn),
    }
}

/// A failure inside a store operation: a database error (retried when it is BUSY/LOCKED) or a
/// finished store error (returned as is).
#[derive(Debug)]
enum Fail {
    Db(rusqlite::Error),
    Store(StoreError),
}

impl From<rusqlite::Error> for Fail {
    fn from(error: rusqlite::Error) -> Self {
        Fail::Db(error)
    }
}

impl From<StoreError> for Fail {
    fn from(error: StoreError) -> Self {
        Fail::Store(error)
    }
}

fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// Runs `op`, retrying with jittered exponential backoff (5 ms up to 2 s) while SQLite reports
/// BUSY/LOCKED, at most [`BUSY_RETRIES`] times. `op` must be safe to repeat (a transaction that
/// failed was rolled back).
fn retry_busy<T>(db_path: &Path, mut op: impl FnMut() -> Result<T, Fail>) -> Result<T, StoreError> {
    let start = Instant::now();
    let mut delay = Duration::from_millis(5);
    let mut attempt = 0;
    loop {
        match op() {
            Ok(value) => return Ok(value),
            Err(Fail::Db(error)) if is_busy(&error) => {
                if attempt == BUSY_RETRIES {
                    return Err(StoreError::Busy {
                        path: db_path.to_owned(),
                        waited: start.elapsed(),
                    });
                }
                attempt += 1;
                let jitter = rand::random_range(0.5..1.5);
                std::thread::sleep(delay.mul_f64(jitter));
                delay = (delay * 4).min(Duration::from_secs(2));
            }
            Err(Fail::Db(source)) => {
                return Err(StoreError::Sqlite {
                    path: db_path.to_owned(),
                    source,
                });
            }
            Err(Fail::Store(error)) => return Err(error),
        }
    }
}

/// Now, in milliseconds since the Unix epoch.
fn now_ms() -> i64 {
    Timestamp::now().as_millisecond()
}

/// A stored millisecond timestamp as a [`Timestamp`].
fn timestamp(ms: i64) -> rusqlite::Result<Timestamp> {
    Timestamp::from_millisecond(ms).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Integer, Box::new(e))
    })
}

/// A stored nullable millisecond timestamp.
fn opt_timestamp(ms: Option<i64>) -> rusqlite::Result<Option<Timestamp>> {
    ms.map(timestamp).transpose()
}

/// Milliseconds of a duration, saturating.
fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A count for an INTEGER column, saturating.
fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// An INTEGER column as a count (negative values, which we never write, read as 0).
fn uint(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_can_move_between_threads() {
        fn send<T: Send>() {}
        fn send_sync<T: Send + Sync>() {}
        send::<Store>();
        send_sync::<JournalWriter>();
        send_sync::<StoreError>();
    }

    #[test]
    fn the_nearest_store_above_is_used_and_readers_create_none() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        assert!(Store::open_existing(&deep).unwrap().is_none());
        assert!(!deep.join(DIR_NAME).exists());
        Store::open(tmp.path()).unwrap();
        let found = Store::open_existing(&deep)
            .unwrap()
            .expect("the store above");
        assert_eq!(found.project_dir(), tmp.path());
        let mut env = crate::env::Env::default();
        env.cwd = deep.clone();
        assert_eq!(
            Store::open_for(&env).unwrap().dir(),
            tmp.path().join(DIR_NAME)
        );
        assert!(!deep.join(DIR_NAME).exists());
    }

    #[test]
    fn open_creates_the_directory_database_and_gitignore() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        assert_eq!(store.dir(), tmp.path().join(".summon"));
        assert!(store.db_path().is_file());
        assert_eq!(
            std::fs::read_to_string(tmp.path().join(".summon/.gitignore")).unwrap(),
            "*\n"
        );
        let mode: String = store
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let sync: i64 = store
            .conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 1, "NORMAL");
        let fk: i64 = store
            .conn
            .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
            .unwrap();
        assert_eq!(fk, 1);
    }

    #[test]
    fn errors_name_the_database() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join(".summon")).unwrap();
        std::fs::write(
            tmp.path().join(".summon/state.db"),
            "this is not a database, just text that is long enough to have a header....",
        )
        .unwrap();
        let err = Store::open(tmp.path()).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains(".summon/state.db") && message.starts_with("cannot open"),
            "{message}"
        );
    }

    #[test]
    fn unwritable_directory_is_a_clear_error() {
        let tmp = tempfile::tempdir().unwrap();
        // A file where the directory should be.
        std::fs::write(tmp.path().join(".summon"), "").unwrap();
        let err = Store::open(tmp.path()).unwrap_err();
        assert!(matches!(err, StoreError::CreateDir { .. }), "{err:?}");
        assert!(err.to_string().contains(".summon"), "{err}");
    }

    #[test]
    fn busy_is_retried_then_reported_without_sqlite_wording() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("x.db");
        let mut calls = 0;
        let busy = || {
            rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                Some("database is locked".into()),
            )
        };
        let ok = retry_busy(&path, || {
            calls += 1;
            if calls < 3 { Err(busy().into()) } else { Ok(7) }
        })
        .unwrap();
        assert_eq!((ok, calls), (7, 3));

        let err = retry_busy::<()>(&path, || Err(busy().into())).unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, StoreError::Busy { .. }));
        assert!(message.contains("x.db") && !message.contains("database is locked"));
    }
}
