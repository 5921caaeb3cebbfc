//! Sleeps that end when the clock says, for [`crate::MockConfig::exact_latency`].
//!
//! tokio's timer wheel counts whole milliseconds and rounds every deadline up, and the runtime
//! parks with a millisecond timeout: a 10 ms sleep lasts 11–12 ms, which is 10–20 % of the
//! latency a benchmark asks for. Here one thread keeps the deadlines in order and waits for the
//! next one with the operating system's timed wait, then wakes every sleeper that is due.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::oneshot;

/// The timer's resolution: a sleep ends up to this much after its deadline.
const QUANTUM: std::time::Duration = std::time::Duration::from_micros(250);

/// The sleepers by deadline, then arrival (two equal deadlines both stay); `None` once every
/// handle is gone.
type Waiting = Option<BTreeMap<(Instant, u64), oneshot::Sender<()>>>;

struct State {
    waiting: Mutex<(Waiting, u64)>,
    /// Signalled when a deadline comes before all the others (with one latency for every
    /// request, deadlines arrive in order and the thread sleeps undisturbed) and at the end.
    earlier: Condvar,
}

/// A handle on the timer thread; the thread ends when the handle is dropped.
pub(crate) struct Timer {
    state: Arc<State>,
}

impl Timer {
    pub(crate) fn start() -> std::io::Result<Self> {
        let state = Arc::new(State {
            waiting: Mutex::new((Some(BTreeMap::new()), 0)),
            earlier: Condvar::new(),
        });
        let thread_state = Arc::clone(&state);
        std::thread::Builder::new()
            .name("mock-llm-timer".into())
            .spawn(move || run(&thread_state))?;
        Ok(Self { state })
    }

    /// Returns at `deadline` (or at once when it has passed).
    pub(crate) async fn sleep_until(&self, deadline: Instant) {
        let (wake, woken) = oneshot::channel();
        {
            let mut guard = self
                .state
                .waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let (waiting, arrivals) = &mut *guard;
            let Some(waiting) = waiting else {
                return;
            };
            let first = waiting
                .first_key_value()
                .is_none_or(|((next, _), _)| deadline < *next);
            waiting.insert((deadline, *arrivals), wake);
            *arrivals += 1;
            if first {
                self.state.earlier.notify_one();
            }
        }
        let _ = woken.await;
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        let mut guard = self
            .state
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Dropping the senders wakes whoever still sleeps.
        guard.0 = None;
        self.state.earlier.notify_one();
    }
}

fn run(state: &State) {
    let mut due = Vec::new();
    loop {
        let mut guard = state.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(waiting) = &mut guard.0 else {
            return;
        };
        let now = Instant::now();
        while let Some(entry) = waiting.first_entry() {
            if entry.key().0 > now {
                break;
            }
            due.push(entry.remove());
        }
        // Wake at most once a quantum: answers due within it go out together, as a busy
        // server's would, instead of one thread wake-up each.
        if due.is_empty() {
            let next = waiting
                .first_key_value()
                .map(|((next, _), _)| (*next).max(now + QUANTUM));
            let _guard = match next {
                Some(next) => {
                    state
                        .earlier
                        .wait_timeout(guard, next.saturating_duration_since(now))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => state
                    .earlier
                    .wait(guard)
                    .unwrap_or_else(PoisonError::into_inner),
            };
            continue;
        }
        drop(guard);
        for wake in due.drain(..) {
            let _ = wake.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_sleeper_wakes_and_none_before_its_deadline() {
        let timer = std::sync::Arc::new(Timer::start().unwrap());
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        // Equal deadlines, one already past, and arrivals out of deadline order.
        for ms in [30u64, 10, 20, 10, 0] {
            let timer = std::sync::Arc::clone(&timer);
            let deadline = start + Duration::from_millis(ms);
            tasks.spawn(async move {
                timer.sleep_until(deadline).await;
                (Instant::now() >= deadline, ms)
            });
        }
        let mut woken = tasks.join_all().await;
        woken.sort_by_key(|(_, ms)| *ms);
        assert_eq!(
            woken,
            [(true, 0), (true, 10), (true, 10), (true, 20), (true, 30)]
        );
    }
}
