//! Where stdio servers are forked: one thread that lives as long as summon.
//!
//! A server asks the kernel to kill it when its parent ends (`PR_SET_PDEATHSIG`, see
//! `sandbox::helper`). For that signal the kernel's "parent" is the *thread* that forked the
//! server, not the process: a server forked on a Tokio worker or blocking-pool thread would be
//! killed when that thread ends — the blocking pool ends idle threads after ten seconds, and a
//! runtime's workers end with it, while a task may still be using its servers. So every
//! server is forked on this thread, which is never ended: the signal then comes exactly when
//! summon itself goes, by `exit`, by a crash or by SIGKILL.
//!
//! The fork happens inside the caller's runtime context ([`tokio::runtime::Handle::enter`]),
//! so the child is registered with, reaped by and awaited on the caller's runtime as before.

use std::sync::Mutex;
use std::sync::mpsc;

use process_wrap::tokio::{ChildWrapper, CommandWrap};

type Job = Box<dyn FnOnce() + Send>;

/// The sender to the forking thread, started on first use.
fn jobs() -> std::io::Result<mpsc::Sender<Job>> {
    static JOBS: Mutex<Option<mpsc::Sender<Job>>> = Mutex::new(None);
    let mut jobs = JOBS
        .lock()
        .map_err(|_| std::io::Error::other("the server starter failed"))?;
    if let Some(sender) = jobs.as_ref() {
        return Ok(sender.clone());
    }
    let (sender, receiver) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("summon-mcp-spawn".to_owned())
        .spawn(move || {
            // Never returns while summon runs: the sender is kept in `JOBS` for good.
            for job in receiver {
                job();
            }
        })?;
    *jobs = Some(sender.clone());
    Ok(sender)
}

/// Spawns `command` on the forking thread and returns the child. Must be called inside a
/// Tokio runtime.
pub(crate) async fn spawn(mut command: CommandWrap) -> std::io::Result<Box<dyn ChildWrapper>> {
    let handle = tokio::runtime::Handle::current();
    let (done, spawned) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _runtime = handle.enter();
        let _ = done.send(command.spawn());
    });
    jobs()?
        .send(job)
        .map_err(|_| std::io::Error::other("the server starter stopped"))?;
    spawned
        .await
        .map_err(|_| std::io::Error::other("the server starter stopped"))?
}
