//! Tool arguments with a key written twice (`{"agent": "a", "agent": "b", ...}`): a JSON
//! parser keeps the last one, so the call would run with a value the model may not have
//! meant. The seed refuses them. The client's messages are read here as they arrive (stdio:
//! each line; HTTP: each request's body) and a `tools/call` whose arguments hold such a key
//! is noted by its request id; the call then answers with the refusal.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use tokio::io::{AsyncRead, ReadBuf};

/// The refusals noted for calls not yet answered, by their request id (as JSON text).
#[derive(Debug, Default)]
pub(super) struct Duplicates {
    found: Mutex<HashMap<String, String>>,
}

impl Duplicates {
    /// Reads one message of the session `session` (empty over stdio); notes a `tools/call`
    /// whose arguments repeat a key.
    pub(super) fn check(&self, session: &str, message: &[u8]) {
        // Most messages are not calls with arguments: looked at only when they might be.
        if !contains(message, b"tools/call") {
            return;
        }
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(message) else {
            return;
        };
        // A batch (an array of messages; no longer in the protocol) is not looked at.
        if !value.is_object() {
            return;
        }
        let text = String::from_utf8_lossy(message);
        self.note(session, &value, &text);
    }

    fn note(&self, session: &str, value: &serde_json::Value, raw: &str) {
        if value["method"] != "tools/call" || value["id"].is_null() {
            return;
        }
        let tool = value["params"]["name"].as_str().unwrap_or("tool");
        let Some(repeated) = repeated_key(raw) else {
            return;
        };
        let Some(path) = repeated.0.strip_prefix("params.arguments") else {
            return;
        };
        let path = path.trim_start_matches('.');
        let place = if path.is_empty() {
            "the arguments have".to_owned()
        } else {
            format!("`{path}` has")
        };
        let refusal = format!(
            "{}: {place} the key `{}` twice; write each key once",
            crate::text::printable(tool),
            crate::text::printable(&repeated.1)
        );
        if let Ok(mut found) = self.found.lock() {
            found.insert(format!("{session} {}", value["id"]), refusal);
        }
    }

    /// The refusal noted for the call with this request id (as JSON text) of the session
    /// `session`, taken out.
    pub(super) fn take(&self, session: &str, id: &str) -> Option<String> {
        self.found.lock().ok()?.remove(&format!("{session} {id}"))
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The first key written twice in one object of `text`: the object's path (`a.b[0]`) and
/// the key.
fn repeated_key(text: &str) -> Option<(String, String)> {
    let found = std::cell::RefCell::new(None);
    let mut deserializer = serde_json::Deserializer::from_str(text);
    Walk {
        path: String::new(),
        found: &found,
    }
    .deserialize(&mut deserializer)
    .ok()?;
    found.into_inner()
}

struct Walk<'a> {
    path: String,
    found: &'a std::cell::RefCell<Option<(String, String)>>,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JSON")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) && self.found.borrow().is_none() {
                *self.found.borrow_mut() = Some((self.path.clone(), key.clone()));
            }
            let path = if self.path.is_empty() {
                key
            } else {
                format!("{}.{key}", self.path)
            };
            map.next_value_seed(Walk {
                path,
                found: self.found,
            })?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while seq
            .next_element_seed(Walk {
                path: format!("{}[{i}]", self.path),
                found: self.found,
            })?
            .is_some()
        {
            i += 1;
        }
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// The client's stdin, read through [`Duplicates::check`] line by line on its way to the
/// session.
pub(super) struct Watch<R> {
    inner: R,
    line: Vec<u8>,
    duplicates: Arc<Duplicates>,
}

impl<R> Watch<R> {
    pub(super) fn new(inner: R, duplicates: Arc<Duplicates>) -> Self {
        Self {
            inner,
            line: Vec::new(),
            duplicates,
        }
    }
}

/// A line longer than this is not looked at (it is passed on as it is).
const MAX_LINE: usize = 16 << 20;

impl<R: AsyncRead + Unpin> AsyncRead for Watch<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &polled {
            let new = buf.filled()[before..].to_vec();
            for byte in new {
                if byte == b'\n' {
                    let line = std::mem::take(&mut self.line);
                    self.duplicates.check("", &line);
                } else if self.line.len() < MAX_LINE {
                    self.line.push(byte);
                }
            }
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_key_in_a_calls_arguments_is_noted_by_its_id() {
        let duplicates = Duplicates::default();
        duplicates.check("", br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"spawn_agent","arguments":{"tasks":[{"agent":"a","task":"x","agent":null}]}}}"#);
        duplicates.check("", br#"{"jsonrpc":"2.0","id":"s","method":"tools/call","params":{"name":"delegate","arguments":{"instructions":"a","instructions":"b"}}}"#);
        duplicates.check("", br#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"spawn_agent","arguments":{"tasks":[{"agent":"a","task":"x"},{"agent":"b","task":"y"}]}}}"#);
        assert_eq!(
            duplicates.take("", "7").as_deref(),
            Some("spawn_agent: `tasks[0]` has the key `agent` twice; write each key once")
        );
        assert_eq!(
            duplicates.take("", "\"s\"").as_deref(),
            Some("delegate: the arguments have the key `instructions` twice; write each key once")
        );
        assert_eq!(duplicates.take("", "8"), None);
        assert_eq!(duplicates.take("", "7"), None, "taken once");
    }
}
