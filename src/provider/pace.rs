//! How many requests a provider that rate-limits is sent at once, and when.
//!
//! A 429 means the provider (or the key) is over its limit, for every task, not only the one
//! that got it. So the number of requests in flight is halved (at most once per wait the
//! provider asked for) and grows back by one with each success — additive increase,
//! multiplicative decrease — and the fan-out settles at what the provider takes instead of
//! sending every waiting task's request again at once. When the 429s come in a row, as many as
//! half the requests that were in flight with no success between them, the provider refuses
//! everything for now: no request goes before the wait it asked for (`Retry-After`) has
//! passed. A 429 now and then among successes pauses nothing. Until the first 429 nothing is
//! limited, and a request costs two atomic operations here.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// No limit: the state until the provider first rate-limits, and again once the limit has
/// grown past any concurrency a run uses.
const UNLIMITED: usize = usize::MAX;

/// The limit is lifted once it grows back to this many requests at once.
const LIFTED_AT: usize = 4096;

/// The wait after a 429 that names none.
const DEFAULT_WAIT: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct Pace {
    in_flight: AtomicUsize,
    limit: AtomicUsize,
    /// A request ended or the limit grew: a waiter may go.
    freed: Notify,
    /// The 429s answered since the last success.
    streak: AtomicUsize,
    times: Mutex<Times>,
}

#[derive(Debug, Default)]
struct Times {
    /// Until when nothing is sent (the provider's last `Retry-After`, once 429s came in a row).
    cool: Option<Instant>,
    /// Until when a 429 belongs to the wave that last halved the limit.
    wave: Option<Instant>,
}

impl Default for Pace {
    fn default() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            limit: AtomicUsize::new(UNLIMITED),
            freed: Notify::new(),
            streak: AtomicUsize::new(0),
            times: Mutex::new(Times::default()),
        }
    }
}

/// A request in flight; its end lets a waiting one go.
pub(crate) struct InFlight<'a>(&'a Pace);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        if self.0.limit.load(Ordering::Acquire) != UNLIMITED {
            self.0.freed.notify_one();
        }
    }
}

impl Pace {
    /// Waits until a request may be sent: the provider's asked-for wait is over and fewer
    /// requests than the limit are in flight.
    pub(crate) async fn admit(&self) -> InFlight<'_> {
        loop {
            let limit = self.limit.load(Ordering::Acquire);
            if limit == UNLIMITED {
                self.in_flight.fetch_add(1, Ordering::AcqRel);
                // The limit may have been set between the load and the add: checked again.
                if self.limit.load(Ordering::Acquire) == UNLIMITED {
                    return InFlight(self);
                }
                self.in_flight.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            let cool = self.times.lock().ok().and_then(|t| t.cool);
            if let Some(at) = cool
                && at > Instant::now()
            {
                tokio::time::sleep_until(at).await;
                continue;
            }
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let now = self.in_flight.load(Ordering::Acquire);
            if now < limit
                && self
                    .in_flight
                    .compare_exchange(now, now + 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                return InFlight(self);
            }
            if now >= limit {
                freed.await;
            }
        }
    }

    /// The provider answered 429 asking for `wait` (or nothing): the limit is halved, once
    /// per wait; when the 429s have come in a row, nothing is sent before the wait has passed.
    pub(crate) fn rate_limited(&self, wait: Option<Duration>) {
        let now = Instant::now();
        let wait = wait.unwrap_or(DEFAULT_WAIT);
        let streak = self.streak.fetch_add(1, Ordering::AcqRel) + 1;
        let Ok(mut times) = self.times.lock() else {
            return;
        };
        // The requests at once when it came (this one among them).
        let at_once = self
            .limit
            .load(Ordering::Acquire)
            .min(self.in_flight.load(Ordering::Acquire));
        // The 429s of requests sent before the first of them was answered are one wave: the
        // limit is halved once for it (and set again if it was lifted since).
        if times.wave.is_none_or(|end| end <= now)
            || self.limit.load(Ordering::Acquire) == UNLIMITED
        {
            times.wave = Some(now + wait);
            self.limit.store((at_once / 2).max(1), Ordering::Release);
        }
        if streak >= (at_once / 2).max(1) {
            let until = now + wait;
            times.cool = Some(times.cool.map_or(until, |at| at.max(until)));
        }
    }

    /// A request succeeded: the limit grows by one, and is lifted once it is large.
    pub(crate) fn succeeded(&self) {
        if self.streak.load(Ordering::Acquire) != 0 {
            self.streak.store(0, Ordering::Release);
        }
        let limit = self.limit.load(Ordering::Acquire);
        if limit == UNLIMITED {
            return;
        }
        let next = if limit + 1 >= LIFTED_AT {
            UNLIMITED
        } else {
            limit + 1
        };
        if self
            .limit
            .compare_exchange(limit, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            if next == UNLIMITED {
                // Ends no longer notify once there is no limit: every waiter goes now.
                self.freed.notify_waiters();
            } else {
                self.freed.notify_one();
            }
        }
    }

    /// The limit in force (`None` when there is none).
    #[cfg(test)]
    pub(crate) fn limit(&self) -> Option<usize> {
        Some(self.limit.load(Ordering::Acquire)).filter(|l| *l != UNLIMITED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn a_rate_limit_halves_the_requests_at_once_and_waits_the_asked_time() {
        let pace = Arc::new(Pace::default());
        let held: Vec<_> = futures::future::join_all((0..8).map(|_| pace.admit())).await;
        assert_eq!(pace.limit(), None);
        // All eight are answered 429 (one episode): the limit is 4, once.
        for _ in 0..8 {
            pace.rate_limited(Some(Duration::from_secs(3)));
        }
        drop(held);
        assert_eq!(pace.limit(), Some(4));
        let start = Instant::now();
        let four: Vec<_> = futures::future::join_all((0..4).map(|_| pace.admit())).await;
        assert_eq!(start.elapsed(), Duration::from_secs(3), "the asked wait");
        // A fifth waits for one of the four to end.
        let fifth = {
            let pace = Arc::clone(&pace);
            tokio::spawn(async move {
                let _in = pace.admit().await;
                Instant::now()
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!fifth.is_finished());
        drop(four);
        let went = fifth.await.expect("fifth");
        assert_eq!(went - start, Duration::from_secs(4));
    }

    /// A 429 now and then among successes halves the limit once per wait but pauses nothing.
    #[tokio::test(start_paused = true)]
    async fn a_429_among_successes_pauses_nothing() {
        let pace = Pace::default();
        let held: Vec<_> = futures::future::join_all((0..64).map(|_| pace.admit())).await;
        for _ in 0..3 {
            pace.rate_limited(Some(Duration::from_secs(5)));
            pace.succeeded();
            pace.succeeded();
        }
        // One wave (within the 5 s): halved once, grown by six.
        assert_eq!(pace.limit(), Some(32 + 6));
        drop(held);
        let start = Instant::now();
        let _again: Vec<_> = futures::future::join_all((0..8).map(|_| pace.admit())).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    /// Waiters parked at a limit that is then lifted all go, though no request ends after.
    #[tokio::test(start_paused = true)]
    async fn lifting_the_limit_lets_every_waiter_go() {
        let pace = Arc::new(Pace::default());
        let held: Vec<_> = futures::future::join_all((0..LIFTED_AT).map(|_| pace.admit())).await;
        pace.rate_limited(Some(Duration::ZERO));
        for _ in 0..LIFTED_AT / 2 - 1 {
            pace.succeeded();
        }
        assert_eq!(pace.limit(), Some(LIFTED_AT - 1));
        let waiters: Vec<_> = (0..6)
            .map(|_| {
                let pace = Arc::clone(&pace);
                tokio::spawn(async move {
                    let _in = pace.admit().await;
                })
            })
            .collect();
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        assert!(waiters.iter().all(|w| !w.is_finished()));
        pace.succeeded();
        assert_eq!(pace.limit(), None);
        for waiter in waiters {
            tokio::time::timeout(Duration::from_secs(60), waiter)
                .await
                .expect("a waiter left parked")
                .expect("waiter");
        }
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn successes_grow_the_limit_back_until_it_is_lifted() {
        let pace = Pace::default();
        let one = pace.admit().await;
        pace.rate_limited(None);
        drop(one);
        assert_eq!(pace.limit(), Some(1));
        for _ in 0..10 {
            pace.succeeded();
        }
        assert_eq!(pace.limit(), Some(11));
        for _ in 0..LIFTED_AT {
            pace.succeeded();
        }
        assert_eq!(pace.limit(), None);
        // Lifted within the wave's wait (1 s, none has passed): a 429 limits again.
        let two: Vec<_> = futures::future::join_all((0..2).map(|_| pace.admit())).await;
        pace.rate_limited(None);
        assert_eq!(pace.limit(), Some(1));
        drop(two);
    }
}
