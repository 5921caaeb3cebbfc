//! The spans of `summon mcp`: one per tool call (`tools/call NAME`, a server span), under the
//! client's context when its request carries one in `_meta` (SEP-414), else under
//! `TRACEPARENT`. The delegations and pipelines a call starts run under its span: their
//! workers get it as `TRACEPARENT`.

use std::collections::HashMap;
use std::sync::Arc;

use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

use super::Settings;
use super::export::Counts;

/// The traces of one `summon mcp` server.
pub(crate) struct SessionTraces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    counts: Arc<Counts>,
    endpoint: String,
    /// `TRACEPARENT` of the server's own environment: the parent of calls whose request
    /// carries none.
    parent: Context,
}

/// One tool call's span.
pub(crate) struct CallSpan(Context);

impl SessionTraces {
    /// Starts the export of the session's spans.
    pub(crate) fn start(settings: &Settings, env: &crate::env::Env) -> std::io::Result<Self> {
        let (provider, counts) = super::spans::tracer_provider(settings, env)?;
        Ok(Self {
            tracer: provider.tracer("summon"),
            provider,
            counts,
            endpoint: settings.endpoint.clone(),
            parent: super::spans::parent_context(env),
        })
    }

    /// Starts the span of a call of `tool`, under `traceparent` (the request's `_meta`) when
    /// it is a valid one.
    pub(crate) fn call(
        &self,
        tool: &str,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
    ) -> CallSpan {
        let parent = traceparent
            .map(|tp| extract(tp, tracestate))
            .filter(|cx| cx.span().span_context().is_valid())
            .unwrap_or_else(|| self.parent.clone());
        let span = self
            .tracer
            .span_builder(format!("tools/call {tool}"))
            .with_kind(SpanKind::Server)
            .with_attributes(vec![
                KeyValue::new("mcp.method.name", "tools/call"),
                KeyValue::new("gen_ai.operation.name", "execute_tool"),
                KeyValue::new("gen_ai.tool.name", tool.to_owned()),
                KeyValue::new("openinference.span.kind", "TOOL"),
            ])
            .start_with_context(&self.tracer, &parent);
        CallSpan(parent.with_span(span))
    }

    /// Ends the session: sends what is left within the flush time; the one warning when
    /// spans did not all reach the collector.
    pub(crate) fn finish(&self) -> Option<String> {
        let _ = self.provider.shutdown();
        super::spans::warning(&self.endpoint, &self.counts.tally())
    }
}

impl CallSpan {
    /// The span's context as a `TRACEPARENT` value, for what the call starts.
    pub(crate) fn traceparent(&self) -> String {
        let span = self.0.span();
        let context = span.span_context();
        format!(
            "00-{}-{}-{:02x}",
            context.trace_id(),
            context.span_id(),
            context.trace_flags().to_u8()
        )
    }

    /// Ends the span; `error` (the call's error reply, its first line) sets the error status.
    pub(crate) fn end(self, error: Option<&str>) {
        if let Some(error) = error {
            let span = self.0.span();
            span.set_attribute(KeyValue::new("error.type", "tool_error"));
            span.set_status(Status::error(error.to_owned()));
        }
        self.0.span().end();
    }
}

fn extract(traceparent: &str, tracestate: Option<&str>) -> Context {
    use opentelemetry::propagation::TextMapPropagator as _;
    let mut carrier = HashMap::new();
    carrier.insert("traceparent".to_owned(), traceparent.trim().to_owned());
    if let Some(state) = tracestate {
        carrier.insert("tracestate".to_owned(), state.trim().to_owned());
    }
    opentelemetry_sdk::propagation::TraceContextPropagator::new()
        .extract_with_context(&Context::new(), &carrier)
}
