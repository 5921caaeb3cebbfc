//! What a server's transport noticed that the MCP client library does not pass on: a message
//! it had to drop, a connection that failed, and tools that only run as tasks.
//!
//! A dropped answer would otherwise leave its call waiting for the whole timeout; the call in
//! flight watches [`Observed::alarm`] and fails at once with the transport's own words.

use std::collections::BTreeSet;
use std::sync::Mutex;

use tokio::sync::watch;

/// Shared by a server's transport (which reports) and the server's calls (which listen).
pub(crate) struct Observed {
    alarm: watch::Sender<Option<String>>,
    /// Tools the server marked `execution.taskSupport: "required"`: every plain call of them
    /// fails, so they are not offered.
    task_only: Mutex<BTreeSet<String>>,
}

impl Default for Observed {
    fn default() -> Self {
        Self {
            alarm: watch::Sender::new(None),
            task_only: Mutex::new(BTreeSet::new()),
        }
    }
}

impl Observed {
    /// Reports a problem that ends the call in flight, in words for the user.
    pub(crate) fn raise(&self, message: String) {
        self.alarm.send_replace(Some(message));
    }

    /// The last problem reported, if any.
    pub(crate) fn last(&self) -> Option<String> {
        self.alarm.borrow().clone()
    }

    /// A listener that hears only problems reported from now on.
    pub(crate) fn listen(&self) -> Listener {
        Listener(self.alarm.subscribe())
    }

    /// Notes the tools that only run as tasks in a raw JSON-RPC message, if it is a
    /// `tools/list` answer (the library's types leave out a tool's `execution`).
    pub(crate) fn note_task_only_tools(&self, message: &serde_json::Value) {
        let Some(tools) = message
            .get("result")
            .and_then(|r| r.get("tools"))
            .and_then(serde_json::Value::as_array)
        else {
            return;
        };
        for tool in tools {
            if tool["execution"]["taskSupport"] == "required"
                && let Some(name) = tool["name"].as_str()
            {
                self.note_task_only(name.to_owned());
            }
        }
    }

    fn note_task_only(&self, tool: String) {
        if let Ok(mut names) = self.task_only.lock() {
            names.insert(tool);
        }
    }

    pub(crate) fn is_task_only(&self, tool: &str) -> bool {
        self.task_only
            .lock()
            .is_ok_and(|names| names.contains(tool))
    }
}

/// Waits for the next problem a transport reports.
pub(crate) struct Listener(watch::Receiver<Option<String>>);

impl Listener {
    /// The next problem; never returns when none comes.
    pub(crate) async fn next(&mut self) -> String {
        loop {
            if self.0.changed().await.is_err() {
                return std::future::pending().await;
            }
            if let Some(message) = self.0.borrow_and_update().clone() {
                return message;
            }
        }
    }
}
