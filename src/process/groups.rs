//! The process groups of the shell commands running now, so that an interrupted summon
//! (Ctrl-C, SIGTERM) kills them instead of leaving them running without a parent.

use std::collections::BTreeSet;
use std::sync::Mutex;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

static LIVE: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());
/// Set once a signal that ends summon arrived: its watcher exits the process.
static ENDING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// The process groups of the MCP servers running now.
static SERVERS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// Notes a running MCP server's process group.
pub(crate) fn register_server(pgid: u32) {
    if let Ok(mut live) = SERVERS.lock() {
        live.insert(pgid);
    }
}

/// Forgets an MCP server's process group that was killed.
pub(crate) fn unregister_server(pgid: u32) {
    if let Ok(mut live) = SERVERS.lock() {
        live.remove(&pgid);
    }
}

/// Kills every running MCP server's process group; returns how many there were.
pub(crate) fn kill_servers() -> usize {
    let live: Vec<u32> = SERVERS
        .lock()
        .map(|live| live.iter().copied().collect())
        .unwrap_or_default();
    live.iter().copied().for_each(kill);
    live.len()
}

/// Notes a running command's process group.
pub(crate) fn register(pgid: u32) {
    if let Ok(mut live) = LIVE.lock() {
        live.insert(pgid);
    }
}

/// Forgets a process group that was killed.
pub(crate) fn unregister(pgid: u32) {
    if let Ok(mut live) = LIVE.lock() {
        live.remove(&pgid);
    }
}

/// Sends SIGKILL to every process of the group `pgid` (quietly: it may be gone already).
pub(crate) fn kill(pgid: u32) {
    if let Ok(pgid) = i32::try_from(pgid)
        && pgid > 1
    {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

/// Kills every running command's process group; returns how many there were.
pub(crate) fn kill_all() -> usize {
    let live: Vec<u32> = LIVE
        .lock()
        .map(|live| live.iter().copied().collect())
        .unwrap_or_default();
    live.iter().copied().for_each(kill);
    live.len()
}

/// Which signals end summon after killing the running commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handled {
    /// SIGTERM and SIGHUP (a command that handles Ctrl-C itself, such as `run`).
    Terminate,
    /// Those and Ctrl-C (SIGINT).
    TerminateAndInterrupt,
}

/// Something drawn on the terminal that a signal's exit line would tear (the run's live
/// display): stopped first, its bars cleared and its last lines printed.
pub(crate) trait Screen: Send + Sync {
    fn finish(&self);
}

/// The screen to stop before a signal's exit line, while it lives.
static SCREEN: Mutex<Option<std::sync::Weak<dyn Screen>>> = Mutex::new(None);

/// Says which screen to stop before a signal's exit line.
pub(crate) fn stop_on_exit(screen: std::sync::Weak<dyn Screen>) {
    if let Ok(mut slot) = SCREEN.lock() {
        *slot = Some(screen);
    }
}

/// What must be written out before a signal's exit (a run's traces), while it lives.
static FLUSH: Mutex<Option<std::sync::Weak<dyn Screen>>> = Mutex::new(None);

/// Says what to flush (its `finish`) before a signal's exit, after the screen is stopped.
pub(crate) fn flush_on_exit(flush: std::sync::Weak<dyn Screen>) {
    if let Ok(mut slot) = FLUSH.lock() {
        *slot = Some(flush);
    }
}

/// Called when the work is done, before summon exits with its own code: when a signal is
/// ending summon, waits for its watcher to exit with the signal's code, so that a command
/// whose children the watcher killed cannot finish first and exit as if nothing happened.
pub(crate) fn wait_if_ending() {
    if ENDING.load(std::sync::atomic::Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
}

/// Watches for the signals `handled` on a thread of its own: on one, kills the commands still
/// running, says so, and exits with 128 + the signal number, as the shell reports a death by
/// that signal.
pub(crate) fn exit_on_signals(handled: Handled) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    // Registered before this returns, so no signal is missed once the work starts.
    let registered = runtime.block_on(async {
        let term = signal(SignalKind::terminate())?;
        let hangup = signal(SignalKind::hangup())?;
        let interrupt = match handled {
            Handled::TerminateAndInterrupt => Some(signal(SignalKind::interrupt())?),
            Handled::Terminate => None,
        };
        std::io::Result::Ok((term, hangup, interrupt))
    });
    let Ok((mut term, mut hangup, mut interrupt)) = registered else {
        return;
    };
    std::thread::spawn(move || {
        let (name, number) = runtime.block_on(async {
            let interrupted = async {
                match interrupt.as_mut() {
                    Some(signal) => signal.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = term.recv() => ("terminated (SIGTERM)", 15),
                _ = hangup.recv() => ("hung up (SIGHUP)", 1),
                _ = interrupted => ("interrupted", 2),
            }
        });
        // From here the work may end by itself (its commands and servers are killed): it
        // waits in `wait_if_ending` for this exit instead of exiting with its own code.
        ENDING.store(true, std::sync::atomic::Ordering::SeqCst);
        let killed = kill_all();
        let servers = kill_servers();
        let what = match killed {
            0 => String::new(),
            1 => ": killed the running command and every process it started".to_owned(),
            n => format!(": killed the {n} running commands and every process they started"),
        };
        let stopped = match servers {
            0 => String::new(),
            1 => "; stopped the MCP server".to_owned(),
            n => format!("; stopped the {n} MCP servers"),
        };
        let stopped = if what.is_empty() {
            stopped.replacen(';', ":", 1)
        } else {
            stopped
        };
        let screen = SCREEN
            .lock()
            .ok()
            .and_then(|slot| slot.as_ref().and_then(std::sync::Weak::upgrade));
        if let Some(screen) = screen {
            screen.finish();
        }
        eprintln!("summon: {name}{what}{stopped}");
        let flush = FLUSH
            .lock()
            .ok()
            .and_then(|slot| slot.as_ref().and_then(std::sync::Weak::upgrade));
        if let Some(flush) = flush {
            flush.finish();
        }
        std::process::exit(128 + number);
    });
}
