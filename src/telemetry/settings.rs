//! Whether and how a run exports traces, from the standard OpenTelemetry variables.

use std::time::Duration;

use crate::env::Env;

/// How traces are exported; `None` from [`Settings::from_env`] when they are not.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settings {
    /// Where the spans go, as the variables say it (for messages).
    pub(crate) endpoint: String,
    /// `http/protobuf` (the default) or `http/json`.
    pub(crate) json: bool,
    /// Prompt and answer text on the spans (`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`).
    pub(crate) capture_content: bool,
    /// Most spans waiting to be sent; more are dropped (`OTEL_BSP_MAX_QUEUE_SIZE`).
    pub(crate) queue: usize,
    /// Most spans in one request (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`).
    pub(crate) batch: usize,
    /// Longest a span waits for its batch to fill (`OTEL_BSP_SCHEDULE_DELAY`, ms).
    pub(crate) delay: Duration,
    /// Longest one export request may take (`OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` or
    /// `OTEL_EXPORTER_OTLP_TIMEOUT`, ms).
    pub(crate) timeout: Duration,
    /// Longest the end of the run waits for the last spans to be sent.
    pub(crate) flush: Duration,
}

/// The variables that name a collector, the traces' own first.
const ENDPOINTS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

impl Settings {
    /// The settings the environment asks for: `None` without an endpoint or with
    /// `OTEL_SDK_DISABLED=true`; an error names a variable whose value summon cannot use.
    pub(crate) fn from_env(env: &Env) -> Result<Option<Self>, String> {
        let set = |key: &str| env.var(key).map(str::trim).filter(|v| !v.is_empty());
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let Some(endpoint) = ENDPOINTS.iter().find_map(|key| set(key)) else {
            return Ok(None);
        };
        let (protocol_key, protocol) = [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ]
        .iter()
        .find_map(|key| set(key).map(|v| (*key, v)))
        .unwrap_or(("", "http/protobuf"));
        let json = match protocol {
            "http/protobuf" => false,
            "http/json" => true,
            "grpc" => {
                return Err(format!(
                    "{protocol_key}=grpc: summon exports traces over OTLP/HTTP only; \
                     set it to http/protobuf (and the endpoint to the collector's HTTP port, \
                     usually 4318)"
                ));
            }
            other => {
                return Err(format!(
                    "{protocol_key}={other:?}: expected http/protobuf or http/json"
                ));
            }
        };
        let number = |key: &str, default: u64| -> Result<u64, String> {
            set(key).map_or(Ok(default), |v| {
                v.parse::<u64>()
                    .map_err(|_| format!("{key}={v:?}: expected a whole number"))
            })
        };
        let timeout_key = if set("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT").is_some() {
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
        } else {
            "OTEL_EXPORTER_OTLP_TIMEOUT"
        };
        let timeout = Duration::from_millis(number(timeout_key, 10_000)?.max(1));
        Ok(Some(Self {
            endpoint: endpoint.to_owned(),
            json,
            capture_content: set("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
                .is_some_and(|v| v.eq_ignore_ascii_case("true")),
            queue: usize::try_from(number("OTEL_BSP_MAX_QUEUE_SIZE", 2048)?.max(1))
                .unwrap_or(usize::MAX),
            batch: usize::try_from(number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?.max(1))
                .unwrap_or(usize::MAX),
            delay: Duration::from_millis(number("OTEL_BSP_SCHEDULE_DELAY", 1000)?),
            timeout,
            flush: timeout.min(Duration::from_secs(5)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Option<Settings>, String> {
        Settings::from_env(&Env::for_test("/", vars))
    }

    #[test]
    fn an_endpoint_turns_traces_on_and_the_sdk_switch_off() {
        assert_eq!(settings(&[]), Ok(None));
        assert_eq!(settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]), Ok(None));
        let on = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")])
            .unwrap()
            .unwrap();
        assert_eq!(on.endpoint, "http://127.0.0.1:4318");
        assert!(!on.json && !on.capture_content);
        assert_eq!((on.queue, on.batch), (2048, 512));
        let traces_first = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://b:4318/v1/traces",
            ),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(traces_first.endpoint, "http://b:4318/v1/traces");
        assert_eq!(
            settings(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
                ("OTEL_SDK_DISABLED", "TRUE"),
            ]),
            Ok(None)
        );
    }

    #[test]
    fn protocols_content_and_limits_follow_their_variables() {
        let on = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "10"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "200"),
        ])
        .unwrap()
        .unwrap();
        assert!(on.json && on.capture_content);
        assert_eq!(on.queue, 10);
        assert_eq!(on.timeout, Duration::from_millis(200));
        assert_eq!(on.flush, Duration::from_millis(200));
        let grpc = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ])
        .unwrap_err();
        assert!(
            grpc.starts_with("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc:"),
            "{grpc}"
        );
        let bad = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "lots"),
        ])
        .unwrap_err();
        assert_eq!(
            bad,
            "OTEL_BSP_MAX_QUEUE_SIZE=\"lots\": expected a whole number"
        );
    }
}
