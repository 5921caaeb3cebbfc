//! What it takes to start one MCP server: resolved from a recipe's `extensions` entry (or a
//! project's `.mcp.json`) before the task runs, so a missing variable is an input error and
//! not a failure half-way through a task.

use std::sync::Arc;
use std::time::Duration;

use crate::diag::{Diagnostic, SourceFile, Span};
use crate::env::Env;
use crate::recipe::{Extension, ExtensionKind};

/// goose's default for an extension's `timeout`.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// One MCP server a subagent is connected to. Values of `envs` and `headers` may be secrets:
/// `Debug` shows names only.
#[derive(Clone)]
pub(crate) struct ServerSpec {
    /// The extension's name: tools are offered as `<name>__<tool>`.
    pub(crate) name: String,
    pub(crate) transport: Transport,
    /// Bounds start-up and each call.
    pub(crate) timeout: Duration,
    /// The server's tools to offer (its own names); empty = all of them.
    pub(crate) allow: Vec<String>,
    /// The values taken from the environment through `env_keys` (or `${VAR}` in
    /// `.mcp.json`): secrets, redacted from everything the run reports (see `subagent::run`).
    pub(crate) secrets: Vec<String>,
    /// Tools are offered as `mcp__<name>__<tool>`, the form an agent file names them in
    /// (Claude Code's), rather than goose's `<name>__<tool>`.
    pub(crate) mcp_prefix: bool,
}

#[derive(Clone)]
pub(crate) enum Transport {
    /// A child process speaking JSON-RPC on stdin/stdout, started in the task's working
    /// directory.
    Stdio {
        cmd: String,
        args: Vec<String>,
        /// Set for the child on top of the environment (secret-looking variables of summon's
        /// own environment are not passed on unless named here).
        envs: Vec<(String, String)>,
        /// The extension's `sandbox:` (default off: servers often need the network).
        sandbox: crate::sandbox::Sandbox,
    },
    /// An HTTP endpoint speaking MCP's streamable HTTP transport.
    Http {
        uri: String,
        headers: Vec<(String, String)>,
    },
}

/// Names only: environment values and headers may be secrets.
impl std::fmt::Debug for ServerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let transport = match &self.transport {
            Transport::Stdio { cmd, .. } => format!("stdio `{cmd}`"),
            Transport::Http { uri, .. } => format!("streamable_http `{uri}`"),
        };
        f.debug_struct("ServerSpec")
            .field("name", &self.name)
            .field("transport", &transport)
            .field("timeout", &self.timeout)
            .field("allow", &self.allow)
            .finish()
    }
}

impl ServerSpec {
    /// What using the server does: ``starts `cmd args` `` or `connects to URI`.
    pub(crate) fn action(&self) -> String {
        match &self.transport {
            Transport::Stdio { cmd, args, .. } => {
                let mut line = cmd.clone();
                for arg in args {
                    line.push(' ');
                    line.push_str(arg);
                }
                format!("starts `{line}`")
            }
            Transport::Http { uri, .. } => format!("connects to {uri}"),
        }
    }

    /// The server a `stdio` or `streamable_http` extension describes. `env_keys` values are
    /// taken from `env`; a missing one is an error naming it. Other kinds are not servers:
    /// `Ok(None)`.
    pub(crate) fn from_extension(
        ext: &Extension,
        file: Option<&Arc<SourceFile>>,
        env: &Env,
    ) -> Result<Option<Self>, Diagnostic> {
        let at = |message: String| match file {
            Some(file) => Diagnostic::error(message).at(Span::new(file, ext.pos)),
            None => Diagnostic::error(message),
        };
        let (transport, secrets) = match &ext.kind {
            ExtensionKind::Stdio => {
                let Some(cmd) = ext.cmd.clone().filter(|c| !c.trim().is_empty()) else {
                    return Err(at(format!(
                        "extension `{}` is of type stdio but has no `cmd`",
                        ext.name
                    )));
                };
                let mut secrets = Vec::new();
                let mut envs: Vec<(String, String)> = ext
                    .envs
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                for key in &ext.env_keys {
                    let Some(value) = env.var(key) else {
                        return Err(at(format!(
                            "extension `{}` needs the environment variable `{key}` (listed in \
                             its env_keys), which is not set",
                            ext.name
                        )));
                    };
                    envs.retain(|(k, _)| k != key);
                    envs.push((key.clone(), value.to_owned()));
                    secrets.push(value.to_owned());
                }
                (
                    Transport::Stdio {
                        cmd,
                        args: ext.args.clone(),
                        envs,
                        sandbox: crate::sandbox::Sandbox {
                            policy: ext.sandbox.unwrap_or(crate::sandbox::Policy::Off),
                            network: ext.network,
                        },
                    },
                    secrets,
                )
            }
            ExtensionKind::StreamableHttp => {
                let Some(uri) = ext.uri.clone().filter(|u| !u.trim().is_empty()) else {
                    return Err(at(format!(
                        "extension `{}` is of type streamable_http but has no `uri`",
                        ext.name
                    )));
                };
                if !(uri.starts_with("http://") || uri.starts_with("https://")) {
                    return Err(at(format!(
                        "extension `{}`: uri `{uri}` is not an http:// or https:// address",
                        ext.name
                    )));
                }
                let headers = ext
                    .headers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                (Transport::Http { uri, headers }, Vec::new())
            }
            _ => return Ok(None),
        };
        Ok(Some(Self {
            name: ext.name.clone(),
            transport,
            timeout: ext
                .timeout_secs
                .filter(|s| *s > 0)
                .map_or(DEFAULT_TIMEOUT, Duration::from_secs),
            allow: ext.available_tools.clone(),
            secrets,
            mcp_prefix: false,
        }))
    }

    /// Whether the server's tool `tool` is offered.
    pub(crate) fn allows(&self, tool: &str) -> bool {
        self.allow.is_empty() || self.allow.iter().any(|a| a == tool)
    }

    /// The name the model sees for the server's tool `tool`.
    pub(crate) fn exposed_name(&self, tool: &str) -> String {
        if self.mcp_prefix {
            format!("mcp__{}__{tool}", self.name)
        } else {
            format!("{}__{tool}", self.name)
        }
    }
}

#[cfg(test)]
mod tests {
    use indexmap::IndexMap;

    use super::*;
    use crate::diag::Pos;

    fn stdio(env_keys: &[&str]) -> Extension {
        Extension {
            name: "fs".into(),
            pos: Pos::new(1, 1, 1),
            kind: ExtensionKind::Stdio,
            args: vec!["a".into()],
            available_tools: Vec::new(),
            cmd: Some("server".into()),
            description: None,
            env_keys: env_keys.iter().map(|k| (*k).to_owned()).collect(),
            envs: IndexMap::from([("MODE".to_owned(), "x".to_owned())]),
            headers: IndexMap::new(),
            timeout_secs: Some(7),
            uri: None,
            sandbox: None,
            network: false,
        }
    }

    #[test]
    fn env_keys_come_from_the_environment() {
        let env = Env::for_test("/", &[("TOKEN", "s3cret")]);
        let spec = ServerSpec::from_extension(&stdio(&["TOKEN"]), None, &env)
            .unwrap()
            .unwrap();
        let Transport::Stdio {
            envs, cmd, args, ..
        } = &spec.transport
        else {
            panic!("not stdio")
        };
        assert_eq!(cmd, "server");
        assert_eq!(args, &["a"]);
        assert_eq!(
            envs,
            &[
                ("MODE".to_owned(), "x".to_owned()),
                ("TOKEN".to_owned(), "s3cret".to_owned())
            ]
        );
        assert_eq!(spec.timeout, Duration::from_secs(7));
        assert_eq!(spec.secrets, ["s3cret"], "only env_keys values are secrets");
        let err = ServerSpec::from_extension(&stdio(&["MISSING_KEY"]), None, &env)
            .err()
            .unwrap();
        assert!(err.message.contains("`MISSING_KEY`"), "{}", err.message);
        assert!(err.message.contains("extension `fs`"), "{}", err.message);
    }

    #[test]
    fn kinds_and_required_fields() {
        let env = Env::for_test("/", &[]);
        let mut ext = stdio(&[]);
        ext.cmd = None;
        assert!(ServerSpec::from_extension(&ext, None, &env).is_err());
        ext.kind = ExtensionKind::StreamableHttp;
        assert!(ServerSpec::from_extension(&ext, None, &env).is_err());
        ext.uri = Some("ftp://x".into());
        assert!(ServerSpec::from_extension(&ext, None, &env).is_err());
        ext.uri = Some("http://127.0.0.1:1/mcp".into());
        let spec = ServerSpec::from_extension(&ext, None, &env)
            .unwrap()
            .unwrap();
        assert!(matches!(spec.transport, Transport::Http { .. }));
        ext.kind = ExtensionKind::Builtin;
        assert!(
            ServerSpec::from_extension(&ext, None, &env)
                .unwrap()
                .is_none()
        );
        ext.available_tools = vec!["read".into()];
        ext.kind = ExtensionKind::Stdio;
        ext.cmd = Some("x".into());
        let spec = ServerSpec::from_extension(&ext, None, &env)
            .unwrap()
            .unwrap();
        assert!(spec.allows("read"));
        assert!(!spec.allows("write"));
        assert_eq!(spec.exposed_name("read"), "fs__read");
    }
}
