//! One client's session: the tasks it started (the only ones it sees, collects and cancels,
//! unless the server shares the project's tasks) and what they may spend.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::delegation::TaskStore;
use crate::store::TaskId;

/// What one session holds.
#[derive(Debug, Default)]
pub(crate) struct Session {
    /// `--share-tasks`: every task of the project is this session's.
    share: bool,
    /// The tasks this session started, each with the spend it was allowed (its `max_cost`,
    /// `None` without a cap).
    tasks: Mutex<HashMap<TaskId, Option<f64>>>,
    /// Spend held by calls whose tasks are not recorded yet.
    held: Mutex<f64>,
    /// How long its host waits for a call, as far as the session has shown: the time at
    /// which a call of it was given up (cancelled, or a `load` of the same task sent again
    /// while one still waited). `None` until that happens.
    patience: Mutex<Option<Duration>>,
    /// The next wait of a `load` of each running task, grown after each one the host waited
    /// through ([`Session::load_wait`]).
    waits: Mutex<HashMap<String, Duration>>,
    /// The `load` calls waiting now, by their source: when they started, and how to end one.
    loading: Mutex<HashMap<String, (Instant, CancellationToken)>>,
    /// The finished tasks whose result a call of the session already answered with.
    delivered: Mutex<std::collections::HashSet<TaskId>>,
}

/// The first wait of a `load` of a running task: below the shortest per-call timeout of a
/// host's defaults (the OpenAI Agents SDK gives a call 5 s).
pub(crate) const FIRST_LOAD_WAIT: Duration = Duration::from_secs(4);

/// Spend a call holds from the session's cap until its tasks are recorded as the session's.
#[derive(Debug)]
pub(crate) struct Held<'a> {
    session: &'a Session,
    amount: f64,
}

impl Held<'_> {
    /// What the call may spend, in USD.
    pub(crate) fn amount(&self) -> f64 {
        self.amount
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Ok(mut held) = self.session.held.lock() {
            *held = (*held - self.amount).max(0.0);
        }
    }
}

impl Session {
    pub(crate) fn new(share: bool) -> Self {
        Self {
            share,
            tasks: Mutex::new(HashMap::new()),
            held: Mutex::new(0.0),
            patience: Mutex::new(None),
            waits: Mutex::new(HashMap::new()),
            loading: Mutex::new(HashMap::new()),
            delivered: Mutex::new(std::collections::HashSet::new()),
        }
    }

    /// Notes that a call answered with the result of the finished task `id`.
    pub(crate) fn delivered(&self, id: TaskId) {
        if let Ok(mut delivered) = self.delivered.lock() {
            delivered.insert(id);
        }
    }

    /// Whether a call already answered with the result of the task `id`.
    pub(crate) fn was_delivered(&self, id: &TaskId) -> bool {
        self.delivered.lock().is_ok_and(|d| d.contains(id))
    }

    /// The longest a call may keep its host waiting: three quarters of the time at which a
    /// call was given up, once one was; `None` before.
    pub(crate) fn patience(&self) -> Option<Duration> {
        self.patience
            .lock()
            .ok()
            .and_then(|p| *p)
            .map(|p| p.mul_f64(0.75))
    }

    /// Notes that the host gave up on a call after `waited`. Under a second it says nothing
    /// of the host's timeout (the model sent the same call twice, or stopped it itself).
    pub(crate) fn gave_up(&self, waited: Duration) {
        if waited < Duration::from_secs(1) {
            return;
        }
        if let Ok(mut patience) = self.patience.lock() {
            *patience = Some(patience.map_or(waited, |p| p.min(waited)));
        }
    }

    /// Starts a `load` of `source` that may wait: how long it may wait (`most`, at most,
    /// `FIRST_LOAD_WAIT` the first time, twice the last wait after each wait the host saw
    /// through, never past the session's patience), and the token that ends it early when
    /// the host sends the same `load` again (it gave up on this one).
    pub(crate) fn load_started(
        &self,
        source: &str,
        most: Duration,
    ) -> (Duration, CancellationToken) {
        let step = self
            .waits
            .lock()
            .ok()
            .and_then(|waits| waits.get(source).copied())
            .unwrap_or(FIRST_LOAD_WAIT);
        let mut wait = most.min(step);
        if let Some(patience) = self.patience() {
            wait = wait.min(patience);
        }
        let token = CancellationToken::new();
        if let Ok(mut loading) = self.loading.lock()
            && let Some((since, earlier)) =
                loading.insert(source.to_owned(), (Instant::now(), token.clone()))
        {
            // The same load again while one waits: the host gave up on the first.
            self.gave_up(since.elapsed());
            earlier.cancel();
        }
        (wait, token)
    }

    /// Ends a `load` of `source` that waited `waited` of its `wait`; `cut`: the host gave
    /// up on it. A wait the host saw through makes the next one twice as long.
    pub(crate) fn load_ended(
        &self,
        source: &str,
        token: &CancellationToken,
        wait: Duration,
        waited: Duration,
        cut: bool,
    ) {
        if let Ok(mut loading) = self.loading.lock()
            && loading.get(source).is_some_and(|(_, t)| t == token)
        {
            loading.remove(source);
        }
        if cut {
            self.gave_up(waited);
        } else if waited >= wait
            && let Ok(mut waits) = self.waits.lock()
        {
            waits.insert(source.to_owned(), wait.saturating_mul(2));
        }
    }

    /// Holds what is left of `cap` for one call; `Err`: nothing is left, with what the
    /// session's tasks spent or may still spend.
    pub(crate) fn hold(
        &self,
        cap: f64,
        tasks: &TaskStore,
        config: &crate::config::Config,
    ) -> Result<Held<'_>, f64> {
        let mut held = self.held.lock().map_err(|_| cap)?;
        let committed = self.committed(tasks, config) + *held;
        let left = cap - committed;
        // Less than a hundredth of a cent buys no request.
        if left < 0.0001 {
            return Err(committed);
        }
        *held += left;
        Ok(Held {
            session: self,
            amount: left,
        })
    }

    /// Whether the session may see, collect and cancel the task `id`.
    pub(crate) fn owns(&self, id: &TaskId) -> bool {
        self.share || self.tasks.lock().is_ok_and(|tasks| tasks.contains_key(id))
    }

    /// Notes a task the session started, with the spend it was allowed.
    pub(crate) fn started(&self, id: TaskId, allowed: Option<f64>) {
        if let Ok(mut tasks) = self.tasks.lock() {
            tasks.insert(id, allowed);
        }
    }

    /// What the session's tasks have spent or may still spend: a finished task its cost at
    /// its model's price; a running one the cap it was given (or its cost so far, the larger).
    pub(crate) fn committed(&self, tasks: &TaskStore, config: &crate::config::Config) -> f64 {
        let started: Vec<(TaskId, Option<f64>)> = self
            .tasks
            .lock()
            .map(|tasks| tasks.iter().map(|(id, cap)| (*id, *cap)).collect())
            .unwrap_or_default();
        started
            .into_iter()
            .map(|(id, allowed)| {
                let Ok(view) = crate::delegation::peek(tasks, &id) else {
                    return allowed.unwrap_or(0.0);
                };
                let task = &view.task;
                let spent = task
                    .model
                    .as_deref()
                    .and_then(|model| config.price(model))
                    .map_or(0.0, |price| price.cost(&task.tokens));
                if task.status.is_terminal() {
                    spent
                } else {
                    spent.max(allowed.unwrap_or(0.0))
                }
            })
            .sum()
    }
}
