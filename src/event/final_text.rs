//! The final step's text: every task's output in item order, a blank line between two, for
//! stdout. A fan-out of a million tasks must not hold a million outputs in memory: an output
//! that arrives in order goes straight to the text, one that finishes early waits in a small
//! map for those before it (tasks start in item order, so the map stays about as large as the
//! concurrency), and a text that grows past [`SPILL_AT`] bytes moves to an unnamed file.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

/// How much text stays in memory before it moves to a file.
const SPILL_AT: usize = 1 << 20;
const SEPARATOR: &str = "\n\n";

/// The final step's text, whole.
#[derive(Debug)]
pub(crate) enum FinalText {
    Memory(String),
    /// An unnamed file (gone when closed) holding `len` bytes of UTF-8.
    File {
        file: File,
        len: u64,
    },
}

impl FinalText {
    pub(crate) fn into_string(self) -> io::Result<String> {
        match self {
            Self::Memory(text) => Ok(text),
            Self::File { mut file, len } => {
                let mut text = String::with_capacity(usize::try_from(len).unwrap_or(0));
                file.seek(SeekFrom::Start(0))?;
                file.read_to_string(&mut text)?;
                Ok(text)
            }
        }
    }

    /// Writes the text without its trailing whitespace, then a line break.
    pub(crate) fn write_line(self, out: &mut impl Write) -> io::Result<()> {
        match self {
            Self::Memory(text) => out.write_all(text.trim_end().as_bytes())?,
            Self::File { mut file, len } => {
                let keep = trimmed_len(&mut file, len)?;
                file.seek(SeekFrom::Start(0))?;
                let copied = io::copy(&mut (&mut file).take(keep), out)?;
                if copied != keep {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the final text's file is shorter than what was written to it",
                    ));
                }
            }
        }
        out.write_all(b"\n")?;
        out.flush()
    }
}

/// The length of the file's text without its trailing whitespace (as `str::trim_end` counts
/// it), reading only the end of the file.
fn trimmed_len(file: &mut File, len: u64) -> io::Result<u64> {
    const TAIL: u64 = 64 * 1024;
    let mut end = len;
    let mut bytes = Vec::new();
    loop {
        let start = end.saturating_sub(TAIL);
        file.seek(SeekFrom::Start(start))?;
        bytes.clear();
        (&mut *file).take(end - start).read_to_end(&mut bytes)?;
        // A window that starts inside a character skips that character's remaining bytes.
        let skip = if start == 0 {
            0
        } else {
            bytes.iter().take_while(|b| *b & 0xC0 == 0x80).count()
        };
        let text = std::str::from_utf8(&bytes[skip..]).map_err(io::Error::other)?;
        let kept = text.trim_end().len() as u64;
        if kept > 0 || start == 0 {
            return Ok(start + skip as u64 + kept);
        }
        end = start + skip as u64;
    }
}

/// Collects the outputs as tasks finish, in any order.
pub(crate) struct FinalTextBuilder {
    /// Where the text moves when it grows past [`SPILL_AT`].
    spill_dir: PathBuf,
    /// The index the text waits for.
    next: u64,
    /// Outputs of tasks that finished before some task ahead of them.
    early: BTreeMap<u64, String>,
    text: String,
    file: Option<BufWriter<File>>,
    len: u64,
    pieces: u64,
    error: Option<io::Error>,
}

impl FinalTextBuilder {
    pub(crate) fn new(spill_dir: PathBuf) -> Self {
        Self {
            spill_dir,
            next: 0,
            early: BTreeMap::new(),
            text: String::new(),
            file: None,
            len: 0,
            pieces: 0,
            error: None,
        }
    }

    /// Adds the output of the task with item index `index`.
    pub(crate) fn push(&mut self, index: u64, output: &str) {
        if index > self.next {
            self.early.insert(index, output.to_owned());
            return;
        }
        self.append(output);
        if index == self.next {
            self.next += 1;
            while let Some(output) = self.early.remove(&self.next) {
                self.append(&output);
                self.next += 1;
            }
        }
    }

    /// The whole text; `None` when no task finished. Outputs still waiting for a task that
    /// never finished (an interrupted run) follow in item order.
    pub(crate) fn finish(mut self) -> io::Result<Option<FinalText>> {
        for output in std::mem::take(&mut self.early).into_values() {
            self.append(&output);
        }
        if let Some(error) = self.error {
            return Err(error);
        }
        if self.pieces == 0 {
            return Ok(None);
        }
        Ok(Some(match self.file {
            None => FinalText::Memory(self.text),
            Some(writer) => FinalText::File {
                file: writer
                    .into_inner()
                    .map_err(io::IntoInnerError::into_error)?,
                len: self.len,
            },
        }))
    }

    fn append(&mut self, output: &str) {
        if self.error.is_some() {
            return;
        }
        let separator = if self.pieces > 0 { SEPARATOR } else { "" };
        self.pieces += 1;
        self.len += (separator.len() + output.len()) as u64;
        if self.file.is_none() {
            self.text.push_str(separator);
            self.text.push_str(output);
            if self.text.len() <= SPILL_AT {
                return;
            }
            match tempfile::tempfile_in(&self.spill_dir) {
                Ok(file) => {
                    let mut writer = BufWriter::with_capacity(64 * 1024, file);
                    let text = std::mem::take(&mut self.text);
                    if let Err(error) = writer.write_all(text.as_bytes()) {
                        self.error = Some(error);
                    }
                    self.file = Some(writer);
                }
                Err(error) => self.error = Some(error),
            }
            return;
        }
        if let Some(writer) = &mut self.file
            && let Err(error) = writer
                .write_all(separator.as_bytes())
                .and_then(|()| writer.write_all(output.as_bytes()))
        {
            self.error = Some(error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(order: &[u64], outputs: &[String], dir: &std::path::Path) -> FinalText {
        let mut builder = FinalTextBuilder::new(dir.to_owned());
        for &i in order {
            builder.push(i, &outputs[i as usize]);
        }
        builder.finish().unwrap().unwrap()
    }

    fn printed(text: FinalText) -> String {
        let mut out = Vec::new();
        text.write_line(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn outputs_come_out_in_item_order_whatever_order_they_finish_in() {
        let dir = tempfile::tempdir().unwrap();
        let outputs: Vec<String> = (0..6).map(|i| format!("out {i}")).collect();
        let text = collect(&[2, 0, 1, 5, 3, 4], &outputs, dir.path());
        assert!(matches!(text, FinalText::Memory(_)));
        assert_eq!(
            text.into_string().unwrap(),
            "out 0\n\nout 1\n\nout 2\n\nout 3\n\nout 4\n\nout 5"
        );
    }

    #[test]
    fn a_large_text_moves_to_a_file_and_reads_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        // Multi-byte characters across the spill and read boundaries; trailing whitespace of
        // more than one read window at the end.
        let outputs: Vec<String> = (0..3000u64)
            .map(|i| format!("task {i}: {}", "é—".repeat(200)))
            .chain([" \u{3000}\n".repeat(40_000)])
            .collect();
        let mut order: Vec<u64> = (0..outputs.len() as u64).collect();
        for pair in order.chunks_mut(7) {
            pair.reverse();
        }
        let expected = outputs.join("\n\n");
        let text = collect(&order, &outputs, dir.path());
        assert!(matches!(text, FinalText::File { .. }), "not spilled");
        assert_eq!(printed(text), format!("{}\n", expected.trim_end()));
        let text = collect(&order, &outputs, dir.path());
        assert_eq!(text.into_string().unwrap(), expected);
        // The file has no name: nothing is left in the directory.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn outputs_after_a_task_that_never_finished_still_come_out_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let outputs: Vec<String> = (0..5).map(|i| format!("out {i}")).collect();
        let text = collect(&[0, 4, 2], &outputs, dir.path());
        assert_eq!(text.into_string().unwrap(), "out 0\n\nout 2\n\nout 4");
    }

    #[test]
    fn no_finished_task_is_no_text_and_an_unwritable_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let builder = FinalTextBuilder::new(dir.path().to_owned());
        assert!(builder.finish().unwrap().is_none());
        let mut builder = FinalTextBuilder::new(dir.path().join("missing"));
        builder.push(0, &"x".repeat(SPILL_AT + 1));
        assert!(builder.finish().is_err());
    }
}
