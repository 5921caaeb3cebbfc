//! Traces of a run over OpenTelemetry (OTLP over HTTP): the standard `OTEL_*` variables turn
//! them on ([`Settings`]), a consumer of the run's events turns steps, tasks, attempts, model
//! requests and tool calls into spans ([`RunTraces`]), and a bounded queue sends them from a
//! thread of its own ([`Exporting`]), so that a slow, down or refusing collector costs the
//! run one warning and nothing else.
//!
//! ```text
//! RunEvent ──> RunTraces (spans, ended with the engine's own times)
//!                 │ on_end: try_send, or count it dropped
//!                 v
//!              Exporting ── bounded queue ──> worker thread (batches, its own runtime)
//!                                                 └─> OTLP SpanExporter ─> reqwest ─> collector
//! ```

mod calls;
mod client;
mod delegation;
mod export;
mod settings;
mod spans;

pub(crate) use calls::{CallSpan, SessionTraces};
pub(crate) use delegation::{DelegationTraces, Ended};
pub(crate) use settings::Settings;
pub(crate) use spans::RunTraces;
