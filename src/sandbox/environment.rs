//! The environment of the commands the model runs: built from an allowlist, never a
//! credential.
//!
//! A `shell` command gets only the variables of [`DEFAULT_NAMES`] and those the config
//! file's `shell_env` adds, as they are in summon's environment, plus what summon sets itself
//! (`TMPDIR`, the subagent marker). A variable the configuration names as a credential (any
//! provider's `api_key_env`) or whose name reads as one (`*API_KEY`, `*_AUTH_TOKEN`) is never
//! passed, even when listed; the config file refuses such a listing.

use std::ffi::OsString;

use crate::provider::Secret;

/// What every command gets, when summon has it.
pub(crate) const DEFAULT_NAMES: [&str; 9] = [
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ",
];

/// The allowlist of one run's commands: the names passed besides [`DEFAULT_NAMES`], and the
/// credentials never passed, with their values (which a run's reports redact). The values of
/// the names passed are read when a command starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CommandEnv {
    extra: Vec<String>,
    credentials: Vec<String>,
    keys: Vec<Secret>,
    /// The span context a command runs under (`TRACEPARENT`), when the run exports traces.
    traceparent: Option<String>,
}

impl CommandEnv {
    /// `extra` (the config's `shell_env`) passed besides the defaults, none of `credentials`;
    /// `keys` are the values of those that are set.
    pub(crate) fn new(extra: Vec<String>, credentials: Vec<String>, keys: Vec<Secret>) -> Self {
        Self {
            extra,
            credentials,
            keys,
            traceparent: None,
        }
    }

    /// Commands get `TRACEPARENT` set to `traceparent`.
    pub(crate) fn set_traceparent(&mut self, traceparent: String) {
        self.traceparent = Some(traceparent);
    }

    /// What `TRACEPARENT` a command gets, if any.
    pub(crate) fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }

    /// A span id for one tool call of a traced run (none when the run is not traced): the
    /// call's span gets it, and what the call starts runs under [`Self::child_traceparent`].
    pub(crate) fn new_span_id(&self) -> Option<u64> {
        self.traceparent.as_ref()?;
        Some(loop {
            let id: u64 = rand::random();
            if id != 0 {
                break id;
            }
        })
    }

    /// The run's `TRACEPARENT` with the span `span_id` as the parent.
    pub(crate) fn child_traceparent(&self, span_id: u64) -> Option<String> {
        let traceparent = self.traceparent.as_deref()?;
        let mut parts: Vec<&str> = traceparent.split('-').collect();
        if parts.len() != 4 {
            return None;
        }
        let span = format!("{span_id:016x}");
        parts[2] = &span;
        Some(parts.join("-"))
    }

    /// The configured keys: the values of the credential variables that are set.
    pub(crate) fn keys(&self) -> &[Secret] {
        &self.keys
    }

    /// Whether `name` is a credential: named by the configuration, or named like one.
    pub(crate) fn is_credential(&self, name: &str) -> bool {
        is_secret_name(name) || self.credentials.iter().any(|c| c == name)
    }

    /// Whether a command gets `name` (when summon has it).
    pub(crate) fn passes(&self, name: &str) -> bool {
        (DEFAULT_NAMES.contains(&name) || self.extra.iter().any(|e| e == name))
            && !self.is_credential(name)
    }

    /// The variables of `vars` (summon's environment) a command gets.
    pub(crate) fn select(
        &self,
        vars: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Vec<(OsString, OsString)> {
        vars.into_iter()
            .filter(|(name, _)| name.to_str().is_some_and(|name| self.passes(name)))
            .collect()
    }
}

/// Whether an environment variable is named like an API key or token for a provider.
pub(crate) fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.ends_with("API_KEY") || upper.ends_with("_AUTH_TOKEN")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allowed_names_pass_and_never_a_credential() {
        let env = CommandEnv::new(
            vec![
                "GOPATH".into(),
                "WORK_LLM_TOKEN".into(),
                "MY_API_KEY".into(),
            ],
            vec!["WORK_LLM_TOKEN".into()],
            Vec::new(),
        );
        let vars = [
            ("PATH", "/bin"),
            ("GOPATH", "/go"),
            ("WORK_LLM_TOKEN", "tok"),
            ("MY_API_KEY", "k"),
            ("OPENAI_API_KEY", "k"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
            ("CARGO_HOME", "/c"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let passed: Vec<_> = env
            .select(vars)
            .into_iter()
            .map(|(k, _)| k.into_string().unwrap())
            .collect();
        assert_eq!(passed, ["PATH", "GOPATH"]);
        assert!(!CommandEnv::default().passes("GOPATH"));
        assert!(CommandEnv::default().passes("HOME"));
    }

    #[test]
    fn secret_names() {
        for name in [
            "OPENAI_API_KEY",
            "anthropic_api_key",
            "API_KEY",
            "ANTHROPIC_AUTH_TOKEN",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in ["PATH", "HOME", "API_KEYS_DIR", "TOKENIZERS_PARALLELISM"] {
            assert!(!is_secret_name(name), "{name}");
        }
    }
}
