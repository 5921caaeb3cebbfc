//! The stdio transport of a server summon starts: one JSON-RPC message per line on the
//! child's stdout and stdin.
//!
//! It replaces the MCP library's child-process transport for two reasons. A message longer than
//! that transport's line limit (16 MiB) is dropped there without a word, so the call it answers
//! waits for the whole timeout; here the limit is [`MAX_MESSAGE`] and a longer message is
//! reported at once through [`Observed`]. And it sees each message before it is parsed into
//! the library's types, which leave out a tool's `execution` (tools that only run as tasks).

use std::sync::Arc;

use process_wrap::tokio::ChildWrapper;
use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};

use super::observed::Observed;

/// The largest message read from a server: enough for a 10 MB file sent twice (as content and
/// as structured content) or a 30 MB image in base64; what the model is shown is much smaller.
pub(crate) const MAX_MESSAGE: usize = 64 * 1024 * 1024;

/// The transport of one server process.
pub(crate) struct StdioTransport {
    read: BufReader<ChildStdout>,
    /// The line being read; kept between calls, as a read can be cancelled half-way.
    line: Vec<u8>,
    /// Set while the rest of an over-long line is skipped.
    discarding: bool,
    write: Arc<tokio::sync::Mutex<Option<ChildStdin>>>,
    observed: Arc<Observed>,
    /// Reaped in the background once dropped; the server's process group is killed by the
    /// session.
    _child: Box<dyn ChildWrapper>,
}

enum Read {
    Line,
    Oversized,
    End,
}

impl StdioTransport {
    /// Takes over a spawned child's stdin and stdout.
    pub(crate) fn new(
        mut child: Box<dyn ChildWrapper>,
        observed: Arc<Observed>,
    ) -> std::io::Result<Self> {
        let stdin = child
            .inner_mut()
            .stdin()
            .take()
            .ok_or_else(|| std::io::Error::other("the server's stdin is not a pipe"))?;
        let stdout = child
            .inner_mut()
            .stdout()
            .take()
            .ok_or_else(|| std::io::Error::other("the server's stdout is not a pipe"))?;
        Ok(Self {
            read: BufReader::new(stdout),
            line: Vec::new(),
            discarding: false,
            write: Arc::new(tokio::sync::Mutex::new(Some(stdin))),
            observed,
            _child: child,
        })
    }

    /// Reads up to the next newline into `self.line`, never holding more than [`MAX_MESSAGE`]
    /// bytes. Cancellation-safe: bytes are moved from the reader's buffer to `self.line` with
    /// no await in between.
    async fn read_line(&mut self) -> Read {
        loop {
            let (used, done) = {
                let available = match self.read.fill_buf().await {
                    Ok(available) if !available.is_empty() => available,
                    _ => return Read::End,
                };
                let newline = available.iter().position(|b| *b == b'\n');
                let used = newline.map_or(available.len(), |i| i + 1);
                if self.discarding {
                    if newline.is_some() {
                        self.discarding = false;
                    }
                    (used, None)
                } else if self.line.len() + used > MAX_MESSAGE {
                    self.line.clear();
                    self.discarding = newline.is_none();
                    (used, Some(Read::Oversized))
                } else {
                    self.line.extend_from_slice(&available[..used]);
                    (used, newline.map(|_| Read::Line))
                }
            };
            self.read.consume(used);
            if let Some(done) = done {
                return done;
            }
        }
    }

    /// Parses one line; notes what the library's types leave out.
    fn parse(&self, line: &[u8]) -> Option<RxJsonRpcMessage<RoleClient>> {
        let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
        let value: Value = serde_json::from_slice(line).ok()?;
        self.observed.note_task_only_tools(&value);
        let has_id = value.get("id").is_some_and(|id| !id.is_null());
        match serde_json::from_value(value) {
            Ok(message) => Some(message),
            Err(e) => {
                // An answer nobody can read would leave its call waiting.
                if has_id {
                    self.observed
                        .raise(format!("it sent an answer summon cannot read: {e}"));
                }
                None
            }
        }
    }
}

impl rmcp::transport::Transport<RoleClient> for StdioTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let write = Arc::clone(&self.write);
        async move {
            let mut bytes = serde_json::to_vec(&item)?;
            bytes.push(b'\n');
            let mut guard = write.lock().await;
            let Some(stdin) = guard.as_mut() else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "the server's stdin is closed",
                ));
            };
            stdin.write_all(&bytes).await?;
            stdin.flush().await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            match self.read_line().await {
                Read::End => return None,
                Read::Oversized => {
                    self.observed.raise(format!(
                        "its answer is larger than {}, the most summon reads in one message, \
                         and was dropped",
                        super::size::human(MAX_MESSAGE)
                    ));
                }
                Read::Line => {
                    let line = std::mem::take(&mut self.line);
                    let trimmed = line.strip_suffix(b"\n").unwrap_or(&line);
                    let trimmed = trimmed.strip_suffix(b"\r").unwrap_or(trimmed);
                    let parsed = if trimmed.iter().all(u8::is_ascii_whitespace) {
                        None
                    } else {
                        self.parse(trimmed)
                    };
                    if let Some(message) = parsed {
                        return Some(message);
                    }
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // Closing stdin asks the server to exit; the session kills its group after a grace.
        drop(self.write.lock().await.take());
        Ok(())
    }
}
