//! Whether and how a run exports traces, from the standard OpenTelemetry variables.

use std::time::Duration;

use crate::diag::Diagnostic;
use crate::env::Env;

/// The OTLP protocol spans are sent with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// `http/protobuf`, the default.
    HttpProtobuf,
    /// `http/json`.
    HttpJson,
    /// `grpc`.
    Grpc,
}

impl Protocol {
    fn parse(text: &str) -> Option<Self> {
        match text {
            "http/protobuf" => Some(Self::HttpProtobuf),
            "http/json" => Some(Self::HttpJson),
            "grpc" => Some(Self::Grpc),
            _ => None,
        }
    }
}

/// How traces are exported; `None` from [`Settings::resolve`] when they are not.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settings {
    /// Where the spans go, as the variables or the config file say it (for messages).
    pub(crate) endpoint: String,
    /// The URL the exporter sends to: a traces endpoint as given, a base URL with
    /// `/v1/traces` added over HTTP (gRPC has no path).
    pub(crate) url: String,
    pub(crate) protocol: Protocol,
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

const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

impl Settings {
    /// The settings the environment and the config file's `traces` ask for (a variable wins
    /// over the file): `None` without an endpoint or with `OTEL_SDK_DISABLED=true`. An error
    /// names a variable or a line whose value summon cannot use, and a project's `traces`
    /// endpoint in a project that is not trusted.
    pub(crate) fn resolve(
        env: &Env,
        config: &crate::config::Config,
    ) -> Result<Option<Self>, Diagnostic> {
        let file = config.traces.as_ref();
        // The file's values were checked when it was read: an error here names a variable.
        let settings =
            Self::from_sources(env, file.map(|f| &f.value)).map_err(Diagnostic::error)?;
        if let (Some(settings), Some(f)) = (&settings, file)
            && f.value.scope == Some(crate::config::Scope::Project)
            && f.value.endpoint.is_some()
            && !env_set(env, TRACES_ENDPOINT)
            && !env_set(env, ENDPOINT)
            && !config.trust.is_trusted()
        {
            return Err(Diagnostic::error(format!(
                "`traces` in this project's summon.yaml would send this run's spans to {}, and \
                 this project is not trusted",
                settings.endpoint
            ))
            .with_hint(config.trust.how_to_trust())
            .at(f.span()));
        }
        if let (Some(_), Some(f)) = (&settings, file)
            && f.value.scope == Some(crate::config::Scope::Project)
            && f.value.capture_content == Some(true)
            && !env_set(env, "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
            && !config.trust.is_trusted()
        {
            return Err(Diagnostic::error(
                "`traces.capture_content` in this project's summon.yaml would put every prompt \
                 and answer on the spans sent to the collector, and this project is not trusted",
            )
            .with_hint(config.trust.how_to_trust())
            .at(f.span()));
        }
        Ok(settings)
    }

    /// The settings the environment asks for, over the config file's `file`.
    pub(crate) fn from_sources(
        env: &Env,
        file: Option<&crate::config::TracesConfig>,
    ) -> Result<Option<Self>, String> {
        let set = |key: &str| env.var(key).map(str::trim).filter(|v| !v.is_empty());
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let (protocol_key, protocol_text) = [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ]
        .iter()
        .find_map(|key| set(key).map(|v| ((*key).to_owned(), v.to_owned())))
        .or_else(|| {
            file.and_then(|f| f.protocol.clone())
                .map(|p| ("traces.protocol".to_owned(), p))
        })
        .unwrap_or_else(|| (String::new(), "http/protobuf".to_owned()));
        let protocol = Protocol::parse(&protocol_text).ok_or_else(|| {
            format!("{protocol_key}={protocol_text:?}: expected http/protobuf, http/json or grpc")
        })?;
        let (endpoint, url) = if let Some(given) = set(TRACES_ENDPOINT) {
            (given.to_owned(), given.to_owned())
        } else if let Some(base) = set(ENDPOINT) {
            (base.to_owned(), traces_url(base, protocol))
        } else if let Some(given) = file.and_then(|f| f.endpoint.as_deref()) {
            let url = if given.trim_end_matches('/').ends_with("/v1/traces") {
                given.to_owned()
            } else {
                traces_url(given, protocol)
            };
            (given.to_owned(), url)
        } else {
            return Ok(None);
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
        let capture_content = match set("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT") {
            Some(v) => v.eq_ignore_ascii_case("true"),
            None => file.and_then(|f| f.capture_content).unwrap_or(false),
        };
        Ok(Some(Self {
            endpoint,
            url,
            protocol,
            capture_content,
            queue: usize::try_from(number("OTEL_BSP_MAX_QUEUE_SIZE", 2048)?.max(1))
                .unwrap_or(usize::MAX),
            batch: usize::try_from(number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?.max(1))
                .unwrap_or(usize::MAX),
            delay: Duration::from_millis(number("OTEL_BSP_SCHEDULE_DELAY", 1000)?),
            timeout,
            flush: timeout.min(Duration::from_secs(5)),
        }))
    }

    /// The settings of the environment alone (no config file).
    #[cfg(test)]
    pub(crate) fn from_env(env: &Env) -> Result<Option<Self>, String> {
        Self::from_sources(env, None)
    }
}

fn env_set(env: &Env, key: &str) -> bool {
    env.var(key).is_some_and(|v| !v.trim().is_empty())
}

/// The traces URL under a collector's base URL: `/v1/traces` added over HTTP, as the
/// standard says of `OTEL_EXPORTER_OTLP_ENDPOINT`; over gRPC the base itself.
fn traces_url(base: &str, protocol: Protocol) -> String {
    match protocol {
        Protocol::Grpc => base.to_owned(),
        Protocol::HttpProtobuf | Protocol::HttpJson => {
            format!("{}/v1/traces", base.trim_end_matches('/'))
        }
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
        assert_eq!(on.url, "http://127.0.0.1:4318/v1/traces");
        assert_eq!(on.protocol, Protocol::HttpProtobuf);
        assert!(!on.capture_content);
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
        assert_eq!(traces_first.url, "http://b:4318/v1/traces");
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
        assert!(on.protocol == Protocol::HttpJson && on.capture_content);
        assert_eq!(on.queue, 10);
        assert_eq!(on.timeout, Duration::from_millis(200));
        assert_eq!(on.flush, Duration::from_millis(200));
        let grpc = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317/"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(grpc.protocol, Protocol::Grpc);
        assert_eq!(grpc.url, "http://a:4317/", "gRPC has no path to add");
        let unknown = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift"),
        ])
        .unwrap_err();
        assert_eq!(
            unknown,
            "OTEL_EXPORTER_OTLP_PROTOCOL=\"thrift\": expected http/protobuf, http/json or grpc"
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

    #[test]
    fn the_config_file_sets_what_no_variable_does() {
        let file = crate::config::TracesConfig {
            endpoint: Some("https://collector.example:4318/".into()),
            protocol: Some("http/json".into()),
            capture_content: Some(true),
            scope: None,
        };
        let on = Settings::from_sources(&Env::for_test("/", &[]), Some(&file))
            .unwrap()
            .unwrap();
        assert_eq!(on.url, "https://collector.example:4318/v1/traces");
        assert_eq!(on.protocol, Protocol::HttpJson);
        assert!(on.capture_content);
        let given = crate::config::TracesConfig {
            endpoint: Some("http://c:4318/v1/traces".into()),
            ..Default::default()
        };
        let as_given = Settings::from_sources(&Env::for_test("/", &[]), Some(&given))
            .unwrap()
            .unwrap();
        assert_eq!(as_given.url, "http://c:4318/v1/traces");
        // The variables win, each on its own.
        let env = Env::for_test(
            "/",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://d:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                (
                    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
                    "false",
                ),
            ],
        );
        let over = Settings::from_sources(&env, Some(&file)).unwrap().unwrap();
        assert_eq!(
            (over.url.as_str(), over.protocol, over.capture_content),
            ("http://d:4317", Protocol::Grpc, false)
        );
        let off = Env::for_test("/", &[("OTEL_SDK_DISABLED", "true")]);
        assert_eq!(Settings::from_sources(&off, Some(&file)), Ok(None));
    }
}
