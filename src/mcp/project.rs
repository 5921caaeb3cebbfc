//! A project's `.mcp.json` (Claude Code's project MCP configuration): the servers that an
//! agent's `mcp__server__tool` entries name.
//!
//! ```json
//! {"mcpServers": {
//!   "files": {"command": "npx", "args": ["-y", "server"], "env": {"TOKEN": "${TOKEN}"}},
//!   "web": {"type": "http", "url": "https://example.com/mcp", "headers": {"X-Key": "${KEY}"}}
//! }}
//! ```
//!
//! `${VAR}` and `${VAR:-default}` are expanded from the environment, as Claude Code does; a
//! variable that is not set and has no default is an error naming it, for the servers a task
//! starts only. `timeout` is in milliseconds, as Claude Code reads it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::server::{DEFAULT_TIMEOUT, ServerSpec, Transport};
use crate::diag::{Diagnostic, Pos, SourceFile, Span};
use crate::env::Env;
use crate::yaml::Node;

/// The file name, in the working directory.
pub(crate) const FILE_NAME: &str = ".mcp.json";

/// The servers of `<dir>/.mcp.json`; none when there is no such file.
pub(crate) fn project_servers(dir: &Path, env: &Env) -> Result<Vec<ServerSpec>, Diagnostic> {
    servers_of(dir, env, |_| true, |_| {})
}

/// The servers of the project's `.mcp.json` (in the project folder that holds the working
/// directory) named in `names`, the only ones a task starts (what the others need, an unset
/// `${VAR}` say, is not this task's concern), with the trust of the file judged by the very
/// bytes they were parsed from.
pub(crate) fn named_project_servers_as_read(
    env: &Env,
    names: &[&str],
) -> Result<(Vec<ServerSpec>, Result<(), crate::config::trust::Untrusted>), Diagnostic> {
    let dir = crate::store::project_root(&env.cwd, env.home().as_deref()).0;
    let mut trust = Ok(());
    let servers = servers_of(
        &dir,
        env,
        |name| names.contains(&name),
        |file| {
            trust = crate::config::trust::check_file(env, &file.path, file.text.as_bytes());
        },
    )?;
    Ok((servers, trust))
}

fn servers_of(
    dir: &Path,
    env: &Env,
    wanted: impl Fn(&str) -> bool,
    read: impl FnOnce(&Arc<SourceFile>),
) -> Result<Vec<ServerSpec>, Diagnostic> {
    let path = dir.join(FILE_NAME);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(Diagnostic::error(format!("cannot read {FILE_NAME}: {e}")).in_file(&path));
        }
    };
    let file = SourceFile::new(&path, text);
    read(&file);
    let err = |pos: Pos, message: String| Diagnostic::error(message).at(Span::new(&file, pos));
    let root = match crate::yaml::parse(&file.text) {
        Ok(Some(root)) => root,
        Ok(None) => return Ok(Vec::new()),
        Err(e) => return Err(err(e.pos, format!("invalid JSON: {}", e.message))),
    };
    let Some(servers) = root.get("mcpServers") else {
        return Ok(Vec::new());
    };
    let Some(entries) = servers.as_map() else {
        return Err(err(
            servers.pos,
            format!(
                "`mcpServers` must be an object, not {}",
                servers.kind_name()
            ),
        ));
    };
    let mut out = Vec::new();
    for (key, value) in entries {
        let name = key.as_str().unwrap_or_default().to_owned();
        if wanted(&name) {
            out.push(server(&name, value, env, &file)?);
        }
    }
    Ok(out)
}

/// The error for a server of this project's `.mcp.json` that an agent names, in a project
/// that is not trusted: the server is not started.
pub(crate) fn untrusted_server(
    server: &ServerSpec,
    why: &crate::config::trust::Untrusted,
) -> Diagnostic {
    let path = why.project.join(FILE_NAME);
    let diagnostic = Diagnostic::error(format!(
        "server `{}` of this project's {FILE_NAME} {}, and {why}",
        server.name,
        server.action()
    ))
    .with_hint(why.hint());
    // Point at the server's name in the file when it can be found again.
    let located = std::fs::read_to_string(&path).ok().and_then(|text| {
        let file = SourceFile::new(&path, text);
        let root = crate::yaml::parse(&file.text).ok()??;
        let entries = root.get("mcpServers")?.as_map()?;
        let (key, _) = entries
            .iter()
            .find(|(k, _)| k.as_str() == Some(server.name.as_str()))?;
        Some(Span::new(&file, key.pos))
    });
    match located {
        Some(span) => diagnostic.at(span),
        None => diagnostic.in_file(&path),
    }
}

fn server(
    name: &str,
    node: &Node,
    env: &Env,
    file: &Arc<SourceFile>,
) -> Result<ServerSpec, Diagnostic> {
    let err = |pos: Pos, message: String| Diagnostic::error(message).at(Span::new(file, pos));
    if node.as_map().is_none() {
        return Err(err(
            node.pos,
            format!(
                "server `{name}` must be an object, not {}",
                node.kind_name()
            ),
        ));
    }
    // The values `${VAR}` expanded to: they may be tokens, and are redacted like `env_keys`.
    let secrets = std::cell::RefCell::new(Vec::new());
    let expand = |text: &str, env: &Env| expand(text, env, &mut secrets.borrow_mut());
    let text = |key: &str| -> Result<Option<String>, Diagnostic> {
        match node.get(key) {
            None => Ok(None),
            Some(value) => match value.as_str() {
                Some(s) => expand(s, env)
                    .map(Some)
                    .map_err(|e| err(value.pos, format!("server `{name}`, `{key}`: {e}"))),
                None => Err(err(
                    value.pos,
                    format!("server `{name}`: `{key}` must be a string"),
                )),
            },
        }
    };
    let pairs = |key: &str| -> Result<Vec<(String, String)>, Diagnostic> {
        let Some(value) = node.get(key) else {
            return Ok(Vec::new());
        };
        let Some(map) = value.as_map() else {
            return Err(err(
                value.pos,
                format!("server `{name}`: `{key}` must be an object"),
            ));
        };
        map.iter()
            .map(|(k, v)| {
                let k = k.as_str().unwrap_or_default().to_owned();
                let v = v.as_str().ok_or_else(|| {
                    err(
                        v.pos,
                        format!("server `{name}`: `{key}.{k}` must be a string"),
                    )
                })?;
                let v = expand(v, env)
                    .map_err(|e| err(node.pos, format!("server `{name}`, `{key}.{k}`: {e}")))?;
                Ok((k, v))
            })
            .collect()
    };
    let kind = text("type")?.unwrap_or_else(|| {
        if node.get("url").is_some() {
            "http".into()
        } else {
            "stdio".into()
        }
    });
    let transport = match kind.as_str() {
        "stdio" => {
            let Some(cmd) = text("command")? else {
                return Err(err(node.pos, format!("server `{name}` has no `command`")));
            };
            let args = match node.get("args") {
                None => Vec::new(),
                Some(list) => {
                    let Some(items) = list.as_seq() else {
                        return Err(err(
                            list.pos,
                            format!("server `{name}`: `args` must be an array"),
                        ));
                    };
                    items
                        .iter()
                        .map(|item| {
                            let s = item.as_str().ok_or_else(|| {
                                err(item.pos, format!("server `{name}`: args must be strings"))
                            })?;
                            expand(s, env)
                                .map_err(|e| err(item.pos, format!("server `{name}`, `args`: {e}")))
                        })
                        .collect::<Result<_, _>>()?
                }
            };
            Transport::Stdio {
                cmd,
                args,
                envs: pairs("env")?,
                // `.mcp.json` has no sandbox key; its servers run as the user.
                sandbox: crate::sandbox::Sandbox {
                    policy: crate::sandbox::Policy::Off,
                    network: true,
                },
            }
        }
        "http" | "streamable-http" | "streamable_http" => {
            let Some(uri) = text("url")? else {
                return Err(err(node.pos, format!("server `{name}` has no `url`")));
            };
            Transport::Http {
                uri,
                headers: pairs("headers")?,
            }
        }
        other => {
            return Err(err(
                node.pos,
                format!(
                    "server `{name}` has type `{other}`; summon supports stdio and http \
                     (streamable HTTP)"
                ),
            ));
        }
    };
    let timeout = match node.get("timeout") {
        None => DEFAULT_TIMEOUT,
        Some(value) => timeout_of(value).ok_or_else(|| {
            err(
                value.pos,
                format!(
                    "server `{name}`: `timeout` must be a positive number of milliseconds \
                     (as in Claude Code), found {}",
                    value
                        .as_str()
                        .map_or_else(|| value.kind_name().to_owned(), |t| format!("`{t}`"))
                ),
            )
        })?,
    };
    Ok(ServerSpec {
        name: name.to_owned(),
        transport,
        timeout,
        allow: Vec::new(),
        secrets: secrets.into_inner(),
        mcp_prefix: false,
    })
}

/// A server's `timeout`: milliseconds, as Claude Code reads it (a whole number, or a string
/// of digits); zero is refused.
fn timeout_of(node: &Node) -> Option<Duration> {
    let ms = match node.to_json() {
        serde_json::Value::Number(n) => n.as_u64()?,
        serde_json::Value::String(s) => s.trim().parse().ok()?,
        _ => return None,
    };
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// Expands `${VAR}` and `${VAR:-default}`; the values taken from the environment are added
/// to `used`.
fn expand(text: &str, env: &Env, used: &mut Vec<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(format!("unclosed `${{` in `{text}`"));
        };
        let inner = &after[..end];
        let (var, default) = match inner.split_once(":-") {
            Some((var, default)) => (var, Some(default)),
            None => (inner, None),
        };
        match (env.var(var), default) {
            (Some(value), _) => {
                out.push_str(value);
                used.push(value.to_owned());
            }
            (None, Some(default)) => out.push_str(default),
            (None, None) => {
                return Err(format!(
                    "the environment variable `{var}` is not set (and has no `:-` default)"
                ));
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion() {
        let env = Env::for_test("/", &[("A", "x")]);
        let mut used = Vec::new();
        assert_eq!(expand("${A}-${B:-d}", &env, &mut used).unwrap(), "x-d");
        assert_eq!(used, ["x"], "only values from the environment");
        assert!(expand("${B}", &env, &mut used).unwrap_err().contains("`B`"));
        assert!(expand("${A", &env, &mut used).is_err());
        assert_eq!(expand("plain $A", &env, &mut used).unwrap(), "plain $A");
    }

    #[test]
    fn reads_servers_and_names_problems() {
        let dir = tempfile::tempdir().unwrap();
        let env = Env::for_test(dir.path(), &[("TOKEN", "t")]);
        assert!(project_servers(dir.path(), &env).unwrap().is_empty());
        std::fs::write(
            dir.path().join(FILE_NAME),
            r#"{"mcpServers": {
  "files": {"command": "srv", "args": ["--root", "."], "env": {"T": "${TOKEN}"}},
  "web": {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {"K": "v"}}
}}"#,
        )
        .unwrap();
        let servers = project_servers(dir.path(), &env).unwrap();
        assert_eq!(servers.len(), 2);
        assert_eq!(servers[0].name, "files");
        let Transport::Stdio {
            cmd, args, envs, ..
        } = &servers[0].transport
        else {
            panic!()
        };
        assert_eq!((cmd.as_str(), args.len()), ("srv", 2));
        assert_eq!(envs, &[("T".to_owned(), "t".to_owned())]);
        assert!(matches!(servers[1].transport, Transport::Http { .. }));

        std::fs::write(
            dir.path().join(FILE_NAME),
            "{\"mcpServers\": {\n  \"bad\": {\"args\": []}\n}}",
        )
        .unwrap();
        let err = project_servers(dir.path(), &env).unwrap_err();
        assert!(err.message.contains("server `bad` has no `command`"));
        assert_eq!(err.span.unwrap().pos.line, 2);
    }
}
