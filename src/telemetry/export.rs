//! Sending spans without ever holding up the run: a span that ends goes into a bounded
//! queue (or, when the queue is full, is counted dropped), and one thread of its own sends
//! them in batches. The end of the run waits a bounded time for the rest.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};

use super::Settings;

/// What became of the spans.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// Accepted by the collector.
    exported: AtomicU64,
    /// Ended in all.
    ended: AtomicU64,
    /// Why the first export that failed did.
    error: Mutex<Option<String>>,
}

/// What became of the spans, once the end of the run has waited for them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) ended: u64,
    pub(crate) exported: u64,
    /// Ended and not exported.
    pub(crate) dropped: u64,
    pub(crate) error: Option<String>,
}

enum Message {
    Span(Box<SpanData>),
    Resource(Resource),
}

/// The span processor: a bounded queue in front of the export thread.
#[derive(Debug)]
pub(crate) struct Exporting {
    sender: Mutex<Option<SyncSender<Message>>>,
    counts: Arc<Counts>,
    /// Told when the export thread has sent (or given up on) everything.
    finished: Mutex<Option<Receiver<()>>>,
    flush: Duration,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Message")
    }
}

impl Exporting {
    /// Starts the export thread, whose exporter `make` builds on the thread's own runtime
    /// (a gRPC channel's tasks live there).
    pub(crate) fn start<E: SpanExporter + 'static>(
        make: impl FnOnce() -> Result<E, String> + Send + 'static,
        settings: &Settings,
        unreachable: Arc<Mutex<Option<String>>>,
    ) -> std::io::Result<(Self, Arc<Counts>)> {
        let (sender, receiver) = std::sync::mpsc::sync_channel(settings.queue);
        let (done, finished) = std::sync::mpsc::channel();
        let counts = Arc::new(Counts::default());
        let worker_counts = Arc::clone(&counts);
        let (batch, delay) = (settings.batch, settings.delay);
        std::thread::Builder::new()
            .name("summon-traces".to_owned())
            .spawn(move || {
                run_worker(make, worker_counts, unreachable, batch, delay, &receiver);
                let _ = done.send(());
            })?;
        Ok((
            Self {
                sender: Mutex::new(Some(sender)),
                counts: Arc::clone(&counts),
                finished: Mutex::new(Some(finished)),
                flush: settings.flush,
            },
            counts,
        ))
    }
}

impl Counts {
    /// The tally so far.
    pub(crate) fn tally(&self) -> Tally {
        let ended = self.ended.load(Ordering::Relaxed);
        let exported = self.exported.load(Ordering::Relaxed);
        Tally {
            ended,
            exported,
            dropped: ended.saturating_sub(exported),
            error: self
                .error
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        }
    }

    /// Notes why spans were not exported (the first reason is the one told).
    fn failed(&self, error: String) {
        let mut first = self
            .error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        first.get_or_insert(error);
    }
}

impl SpanProcessor for Exporting {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        self.counts.ended.fetch_add(1, Ordering::Relaxed);
        let sender = self
            .sender
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let sent = match sender.as_ref() {
            Some(sender) => sender.try_send(Message::Span(Box::new(span))),
            None => Err(TrySendError::Disconnected(Message::Resource(
                Resource::builder_empty().build(),
            ))),
        };
        if let Err(err) = sent {
            let why = match err {
                TrySendError::Full(_) => {
                    "the export queue was full (the collector is slow or down)"
                }
                TrySendError::Disconnected(_) => "the run had ended",
            };
            self.counts.failed(why.to_owned());
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    /// Closes the queue and waits at most the flush time (not `timeout`, which the SDK sets
    /// long) for the export thread to send what it holds.
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        drop(
            self.sender
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
        );
        let finished = self
            .finished
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(finished) = finished {
            let _ = finished.recv_timeout(self.flush);
        }
        Ok(())
    }

    fn set_resource(&mut self, resource: &Resource) {
        if let Some(sender) = self
            .sender
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            // The queue is empty before the first span: this cannot be refused.
            let _ = sender.try_send(Message::Resource(resource.clone()));
        }
    }
}

/// The export thread: batches of spans to the exporter, on a runtime of its own.
struct Worker<E> {
    exporter: E,
    counts: Arc<Counts>,
    /// Why the client could not send the last request, when it could not.
    unreachable: Arc<Mutex<Option<String>>>,
    batch: usize,
    delay: Duration,
}

/// The export thread's work: its runtime, its exporter, then the queue until it closes.
fn run_worker<E: SpanExporter>(
    make: impl FnOnce() -> Result<E, String>,
    counts: Arc<Counts>,
    unreachable: Arc<Mutex<Option<String>>>,
    batch: usize,
    delay: Duration,
    receiver: &Receiver<Message>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            counts.failed(format!("cannot start the export thread: {err}"));
            return;
        }
    };
    let exporter = {
        let _entered = runtime.enter();
        make()
    };
    match exporter {
        Ok(exporter) => Worker {
            exporter,
            counts,
            unreachable,
            batch,
            delay,
        }
        .run(&runtime, receiver),
        Err(err) => counts.failed(err),
    }
}

impl<E: SpanExporter> Worker<E> {
    fn run(mut self, runtime: &tokio::runtime::Runtime, receiver: &Receiver<Message>) {
        let mut spans = Vec::new();
        let mut due: Option<Instant> = None;
        loop {
            let message = match due {
                Some(due) => receiver.recv_timeout(due.saturating_duration_since(Instant::now())),
                None => receiver.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match message {
                Ok(Message::Span(span)) => {
                    spans.push(*span);
                    due.get_or_insert_with(|| Instant::now() + self.delay);
                    if spans.len() >= self.batch {
                        self.send(runtime, &mut spans);
                        due = None;
                    }
                }
                Ok(Message::Resource(resource)) => self.exporter.set_resource(&resource),
                Err(RecvTimeoutError::Timeout) => {
                    self.send(runtime, &mut spans);
                    due = None;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.send(runtime, &mut spans);
                    return;
                }
            }
        }
    }

    fn send(&mut self, runtime: &tokio::runtime::Runtime, spans: &mut Vec<SpanData>) {
        if spans.is_empty() {
            return;
        }
        let batch = std::mem::take(spans);
        let count = batch.len() as u64;
        match runtime.block_on(self.exporter.export(batch)) {
            Ok(()) => {
                self.counts.exported.fetch_add(count, Ordering::Relaxed);
            }
            Err(err) => {
                let why = self
                    .unreachable
                    .lock()
                    .ok()
                    .and_then(|mut slot| slot.take())
                    .unwrap_or_else(|| err.to_string());
                self.counts.failed(why);
            }
        }
    }
}
