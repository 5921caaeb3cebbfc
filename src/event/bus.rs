//! The one stream from a running pipeline to its outputs: the engine emits [`RunEvent`]s
//! through an [`Events`] handle, and one [`Consumer`] (which hands each event on to the
//! journal, `results.jsonl`, the report, JUnit, the tables and the display) takes them in
//! order, until the stream is closed and the consumer handed back.

use std::sync::{Arc, Mutex, MutexGuard};

use super::{Notice, RunEvent, TaskDone};

/// What follows a run's events.
pub(crate) trait Consumer: Send {
    fn on_event(&mut self, event: &RunEvent);
}

/// The consumer and the journal row count, under one lock so that row numbers follow the
/// order the consumer sees.
pub(crate) struct Bus<C: ?Sized> {
    /// Journal rows handed out so far: a task's row is its position in this order.
    rows: u64,
    consumer: C,
}

impl<C> Bus<Option<C>> {
    pub(crate) fn new(consumer: C) -> Self {
        Self {
            rows: 0,
            consumer: Some(consumer),
        }
    }

    /// Ends the stream: the consumer is handed back, and later events go nowhere.
    pub(crate) fn close(&mut self) -> Option<C> {
        self.consumer.take()
    }
}

/// A closed stream's consumer: nothing.
impl<C: Consumer> Consumer for Option<C> {
    fn on_event(&mut self, event: &RunEvent) {
        if let Some(consumer) = self {
            consumer.on_event(event);
        }
    }
}

/// The engine's handle on the stream: cheap to clone, shared by every step and task.
#[derive(Clone)]
pub(crate) struct Events {
    bus: Arc<Mutex<Bus<dyn Consumer>>>,
    /// Whether a consumer follows what running tasks do ([`Events::activity`]); without one,
    /// those events are not sent.
    live: bool,
}

impl Events {
    /// Events to `bus`, which the caller keeps to take the consumer back when the run ends.
    pub(crate) fn new<C: Consumer + 'static>(bus: &Arc<Mutex<Bus<Option<C>>>>) -> Self {
        let bus: Arc<Mutex<Bus<dyn Consumer>>> = bus.clone();
        Self { bus, live: false }
    }

    /// Sends what running tasks do too (a consumer such as traces follows them).
    pub(crate) fn follow_tasks(mut self, live: bool) -> Self {
        self.live = live;
        self
    }

    fn lock(&self) -> MutexGuard<'_, Bus<dyn Consumer>> {
        // A consumer that panicked leaves the bus usable: outputs are best effort.
        self.bus
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn emit(&self, event: RunEvent) {
        self.lock().consumer.on_event(&event);
    }

    /// A finished task of `level` (a reduction's) or of its step; answers its journal row
    /// number (none for a task the journal has already).
    pub(crate) fn task_finished(&self, done: TaskDone, level: Option<u32>) -> Option<u64> {
        let mut bus = self.lock();
        let row = (!done.resumed).then(|| {
            let row = bus.rows;
            bus.rows += 1;
            row
        });
        bus.consumer.on_event(&RunEvent::TaskFinished {
            done: Box::new(done),
            level,
            row,
        });
        row
    }

    /// What task `index` of `step` is doing now, when a consumer follows running tasks.
    pub(crate) fn activity(&self, step: usize, index: u64, what: super::Doing) {
        if !self.live {
            return;
        }
        self.emit(RunEvent::Activity(super::Activity {
            step,
            index,
            at: std::time::Instant::now(),
            what,
        }));
    }

    /// A warning about `step`, shown once per run however many of its tasks meet it.
    pub(crate) fn warn(&self, step: &str, message: &str) {
        self.warning(format!("step `{step}`: {message}"));
    }

    /// `summon: warning: {text}`, shown once per run.
    pub(crate) fn warning(&self, text: String) {
        self.emit(RunEvent::Notice {
            kind: Notice::Warning,
            text,
        });
    }

    /// `[summon] {text}`: what a step is doing.
    pub(crate) fn progress(&self, text: String) {
        self.emit(RunEvent::Notice {
            kind: Notice::Progress,
            text,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Seen(Vec<String>);

    impl Consumer for Seen {
        fn on_event(&mut self, event: &RunEvent) {
            self.0.push(match event {
                RunEvent::TaskFinished { done, row, .. } => format!("{} {row:?}", done.index),
                other => format!("{other:?}"),
            });
        }
    }

    fn done(index: u64, resumed: bool) -> TaskDone {
        TaskDone {
            index,
            resumed,
            ..TaskDone::default()
        }
    }

    #[test]
    fn rows_count_only_tasks_the_journal_does_not_have_in_the_order_the_consumer_sees() {
        let bus = Arc::new(Mutex::new(Bus::new(Seen(Vec::new()))));
        let events = Events::new(&bus);
        assert_eq!(events.task_finished(done(7, false), None), Some(0));
        assert_eq!(events.task_finished(done(3, true), None), None);
        assert_eq!(
            events.clone().task_finished(done(5, false), Some(1)),
            Some(1)
        );
        let seen = bus.lock().unwrap().close().unwrap();
        assert_eq!(seen.0, ["7 Some(0)", "3 None", "5 Some(1)"]);
        // Closed: an event after the end goes nowhere, and the rows go on counting.
        assert_eq!(events.task_finished(done(9, false), None), Some(2));
        assert!(bus.lock().unwrap().close().is_none());
    }

    #[test]
    fn what_running_tasks_do_is_sent_only_to_a_stream_that_follows_them() {
        let bus = Arc::new(Mutex::new(Bus::new(Seen(Vec::new()))));
        let doing = || super::super::Doing::ToolEnded { ok: true };
        Events::new(&bus).activity(0, 1, doing());
        Events::new(&bus).follow_tasks(true).activity(0, 2, doing());
        let seen = bus.lock().unwrap().close().unwrap();
        assert_eq!(seen.0.len(), 1, "{:?}", seen.0);
        assert!(seen.0[0].contains("index: 2"), "{:?}", seen.0);
    }
}
