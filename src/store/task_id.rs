//! Background task ids: `YYYYMMDD_N`, the UTC date the task was created and the sequence number
//! of that day, from 1 (`20260219_1`, `20260219_2`, ...).
//!
//! The shape is chosen so that an id can never be mistaken for a source name:
//! [`TaskId::looks_like`] is a purely syntactic test (eight digits, `_`, digits) that commands
//! use to route an argument to the task store instead of the source catalog, before parsing it.
//! Allocation lives in the store (`task_counters`, one row per UTC day, bumped in the same
//! `BEGIN IMMEDIATE` transaction that inserts the task row), so ids are unique across processes.

use std::fmt;
use std::str::FromStr;

use jiff::civil::Date;
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A background task id: the UTC creation date and the per-day sequence number (≥ 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct TaskId {
    date: Date,
    seq: u64,
}

/// Why a string is not a task id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ParseTaskIdError {
    #[error("'{0}' is not a task id (expected YYYYMMDD_N, e.g. 20260219_1)")]
    Shape(String),
    #[error("'{0}' is not a task id: {1} is not a calendar date")]
    Date(String, String),
    #[error(
        "'{0}' is not a task id: the sequence number must be a positive number without leading zeros"
    )]
    Sequence(String),
}

impl TaskId {
    /// The id of the `seq`-th task (from 1) created on `date` (UTC).
    pub(crate) fn new(date: Date, seq: u64) -> Self {
        debug_assert!(seq >= 1, "task sequence numbers start at 1");
        Self { date, seq }
    }

    /// The UTC day the task was created on.
    pub(crate) fn date(&self) -> Date {
        self.date
    }

    /// The sequence number of the task within its day (from 1).
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// Whether `s` has the shape of a task id (eight digits, `_`, one or more digits), whether
    /// or not it is a valid one. Anything that looks like a task id is treated as one, so a
    /// malformed id gets a task-id error instead of "source not found".
    pub(crate) fn looks_like(s: &str) -> bool {
        let b = s.as_bytes();
        b.len() >= 10
            && b[..8].iter().all(u8::is_ascii_digit)
            && b[8] == b'_'
            && b[9..].iter().all(u8::is_ascii_digit)
    }

    /// The `YYYYMMDD` key of a UTC day, as stored in `task_counters`.
    pub(crate) fn day_key(date: Date) -> String {
        format!("{:04}{:02}{:02}", date.year(), date.month(), date.day())
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}_{}", Self::day_key(self.date), self.seq)
    }
}

impl FromStr for TaskId {
    type Err = ParseTaskIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if !Self::looks_like(s) {
            return Err(ParseTaskIdError::Shape(s.to_owned()));
        }
        let digits = |range: std::ops::Range<usize>| -> i16 {
            s[range]
                .bytes()
                .fold(0, |n, b| n * 10 + i16::from(b - b'0'))
        };
        let (year, month, day) = (digits(0..4), digits(4..6), digits(6..8));
        let date = i8::try_from(month)
            .ok()
            .zip(i8::try_from(day).ok())
            .and_then(|(m, d)| Date::new(year, m, d).ok())
            .ok_or_else(|| ParseTaskIdError::Date(s.to_owned(), s[..8].to_owned()))?;
        let seq_text = &s[9..];
        let seq = seq_text
            .parse::<u64>()
            .ok()
            .filter(|&n| n >= 1 && !seq_text.starts_with('0'))
            .ok_or_else(|| ParseTaskIdError::Sequence(s.to_owned()))?;
        Ok(Self { date, seq })
    }
}

impl Serialize for TaskId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TaskId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl ToSql for TaskId {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.to_string()))
    }
}

impl FromSql for TaskId {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        value
            .as_str()?
            .parse()
            .map_err(|e| FromSqlError::Other(Box::new(e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn display_and_parse() {
        let id: TaskId = "20260219_1".parse().unwrap();
        assert_eq!(id.date(), Date::new(2026, 2, 19).unwrap());
        assert_eq!(id.seq(), 1);
        assert_eq!(id.to_string(), "20260219_1");
        assert_eq!(
            TaskId::new(Date::new(2026, 12, 1).unwrap(), 42).to_string(),
            "20261201_42"
        );
    }

    #[test]
    fn looks_like_is_syntactic() {
        for yes in ["20260219_1", "20260219_123456", "99999999_0", "20261399_1"] {
            assert!(TaskId::looks_like(yes), "{yes}");
        }
        for no in [
            "",
            "20260219",
            "20260219_",
            "2026021_1",
            "20260219-1",
            "20260219_1a",
            "release-notes",
            "a20260219_1",
            "20260219_ 1",
            "２0260219_1",
        ] {
            assert!(!TaskId::looks_like(no), "{no}");
        }
    }

    #[test]
    fn rejects_invalid_ids_with_reasons() {
        for (text, want) in [
            ("20261399_1", "not a calendar date"),
            ("20260230_1", "not a calendar date"),
            ("20260219_0", "positive number"),
            ("20260219_01", "leading zeros"),
            ("20260219_99999999999999999999999", "positive number"),
            ("review", "expected YYYYMMDD_N"),
        ] {
            let err = text.parse::<TaskId>().unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
            assert!(err.contains(text), "{text}: {err}");
        }
    }

    #[test]
    fn orders_by_date_then_sequence() {
        let ids: Vec<TaskId> = ["20260219_10", "20260219_2", "20260218_7"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let mut sorted = ids.clone();
        sorted.sort();
        let texts: Vec<String> = sorted.iter().map(ToString::to_string).collect();
        assert_eq!(texts, ["20260218_7", "20260219_2", "20260219_10"]);
    }

    #[test]
    fn serde_as_string() {
        let id: TaskId = "20260219_3".parse().unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"20260219_3\"");
        let back: TaskId = serde_json::from_str("\"20260219_3\"").unwrap();
        assert_eq!(back, id);
        assert!(serde_json::from_str::<TaskId>("\"nope\"").is_err());
    }

    proptest! {
        #[test]
        fn round_trips(year in 1i16..=9999, month in 1i8..=12, day in 1i8..=28, seq in 1u64..u64::MAX) {
            let id = TaskId::new(Date::new(year, month, day).unwrap(), seq);
            let text = id.to_string();
            prop_assert!(TaskId::looks_like(&text));
            prop_assert_eq!(text.parse::<TaskId>().unwrap(), id);
        }

        #[test]
        fn source_like_names_never_look_like_ids(name in "[a-z][a-z0-9_-]{0,30}") {
            prop_assert!(!TaskId::looks_like(&name));
        }
    }
}
