//! Standard output. Writes return errors instead of panicking, so `summon load | head`
//! ends quietly when the reader goes away.

use std::io::Write;

pub(crate) struct Stdout {
    inner: std::io::Stdout,
}

impl Stdout {
    pub(crate) fn new() -> Self {
        Self {
            inner: std::io::stdout(),
        }
    }

    /// Writes `text` as is.
    pub(crate) fn write(&mut self, text: &str) -> std::io::Result<()> {
        let mut lock = self.inner.lock();
        lock.write_all(text.as_bytes())?;
        lock.flush()
    }

    /// Writes `text` and a line break.
    pub(crate) fn line(&mut self, text: &str) -> std::io::Result<()> {
        let mut lock = self.inner.lock();
        lock.write_all(text.as_bytes())?;
        lock.write_all(b"\n")?;
        lock.flush()
    }

    /// Hands standard output to `write` (for text too large to pass whole), then flushes.
    pub(crate) fn stream(
        &mut self,
        write: impl FnOnce(&mut std::io::StdoutLock<'static>) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let mut lock = self.inner.lock();
        write(&mut lock)?;
        lock.flush()
    }

    /// Writes a JSON value, pretty-printed.
    pub(crate) fn json(&mut self, value: &serde_json::Value) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
        self.line(&text)
    }
}
