//! One client's session: the tasks it started (the only ones it sees, collects and cancels,
//! unless the server shares the project's tasks) and what they may spend.

use std::collections::HashMap;
use std::sync::Mutex;

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
}

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
