//! The end of the server: when the client goes (stdin closed) or a signal stops summon, the
//! foreground work stops at once: each foreground task's worker is asked to stop, and killed
//! with its process group when it has not within a short grace; each `run_pipeline` run gets
//! SIGTERM, as a stopped `summon run` does. Background (`async`) tasks keep running.

use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};

use super::Shared;
use crate::delegation;
use crate::store::TaskId;

/// The grace of a foreground worker when the server stops: within it the worker records its
/// own end; after it, it is killed. Short enough that the work is gone within a second.
const STOP_GRACE: Duration = Duration::from_millis(300);

/// The signals that stop the server.
pub(super) struct Signals {
    term: Signal,
    interrupt: Signal,
    hangup: Signal,
}

impl Signals {
    /// Listens from now on (inside the runtime).
    pub(super) fn new() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The next one: its name and number.
    pub(super) async fn next(mut self) -> (&'static str, i32) {
        tokio::select! {
            _ = self.term.recv() => ("terminated (SIGTERM)", 15),
            _ = self.interrupt.recv() => ("interrupted", 2),
            _ = self.hangup.recv() => ("hung up (SIGHUP)", 1),
        }
    }
}

/// Ends the server: the foreground work is stopped, the traces sent; after a signal summon
/// exits with 128 + its number, as a shell reports a death by it.
pub(super) fn finish(
    shared: &Shared,
    runtime: tokio::runtime::Runtime,
    signal: Option<(&'static str, i32)>,
) {
    shared.shutdown.cancel();
    stop_foreground(shared);
    runtime.shutdown_timeout(Duration::from_millis(200));
    super::finish_traces(shared);
    if let Some((name, number)) = signal {
        eprintln!("summon: {name}: stopped the MCP server and its foreground tasks");
        std::process::exit(128 + number);
    }
}

/// Stops the foreground tasks still running, all at once, and the `run_pipeline` runs.
fn stop_foreground(shared: &Shared) {
    let ids: Vec<TaskId> = shared
        .foreground
        .lock()
        .map(|set| set.iter().copied().collect())
        .unwrap_or_default();
    let runs: Vec<u32> = shared
        .runs
        .lock()
        .map(|set| set.iter().copied().collect())
        .unwrap_or_default();
    for pgid in &runs {
        if let Ok(pgid) = i32::try_from(*pgid) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
    let grace = delegation::cancel_grace(&shared.env)
        .unwrap_or(STOP_GRACE)
        .min(STOP_GRACE);
    std::thread::scope(|scope| {
        for id in &ids {
            scope.spawn(move || {
                if let Ok(Some(tasks)) = delegation::TaskStore::open_existing(&shared.env)
                    && let Ok(cancelled) = delegation::cancel(&tasks, id, grace)
                    && let Some(pid) = cancelled.view.task.pid
                {
                    reaped(pid);
                }
            });
        }
    });
    // A run given SIGTERM kills its own tasks' groups and exits; the rest is killed.
    let deadline = std::time::Instant::now() + STOP_GRACE * 2;
    for pgid in runs {
        while crate::process::pid_alive(pgid) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        crate::process::groups::kill(pgid);
    }
}

/// Waits (a short, bounded time) until the worker `pid`, this server's child, is reaped by
/// the thread that waits for it: a server that exited first would leave it to init.
fn reaped(pid: u32) {
    let deadline = std::time::Instant::now() + STOP_GRACE;
    while std::path::Path::new(&format!("/proc/{pid}")).exists()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The client's input, which cancels `closed` when it ends.
pub(super) struct EndOfInput<R> {
    inner: R,
    closed: tokio_util::sync::CancellationToken,
}

impl<R> EndOfInput<R> {
    pub(super) fn new(inner: R, closed: tokio_util::sync::CancellationToken) -> Self {
        Self { inner, closed }
    }
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for EndOfInput<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let ended = match &polled {
            std::task::Poll::Ready(Ok(())) => buf.filled().len() == before && buf.remaining() > 0,
            std::task::Poll::Ready(Err(_)) => true,
            std::task::Poll::Pending => false,
        };
        if ended {
            self.closed.cancel();
        }
        polled
    }
}
