//! The MCP servers of one running task: started when the task starts, asked for their tools,
//! called, and stopped when the task ends — however it ends.
//!
//! Nothing here can hang a task: start-up and every call are bounded by the extension's
//! `timeout`; a server that fails to start, crashes or stops answering becomes a warning
//! naming the extension and a tool error the model reads. A stdio server runs in its own
//! process group, and the whole group is killed when the session ends or is dropped (a
//! cancelled task drops it), so no server process outlives its task. A summon killed without a
//! chance to stop them takes its servers along all the same: see [`super::spawn`] (the
//! parent-death signal) and [`super::record`] (a background worker's servers in the store).

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientCapabilities, ClientConfig, ClientRequest,
    ContentBlock, Implementation, ServerResult,
};
use rmcp::service::{PeerRequestOptions, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;

use super::observed::Observed;
use super::server::{ServerSpec, Transport};
use super::stderr::StderrTail;
use super::stdio::StdioTransport;
use crate::provider::ToolOutput;
use crate::provider::ToolSpec;
use crate::sandbox::CommandEnv;

/// How long a server gets to stop by itself (stdin closed) before its group is killed.
const STOP_GRACE: Duration = Duration::from_millis(500);
/// The most text one call returns to the model.
const MAX_OUTPUT: usize = 100 * 1024;
/// Progress notifications restart a call's timeout, up to this many times its length in all.
const PROGRESS_CEILING: u32 = 10;

/// The connected servers of one task.
#[derive(Default)]
pub(crate) struct Session {
    servers: Vec<Server>,
}

/// What [`Session::start`] produced.
pub(crate) struct Started {
    pub(crate) session: Session,
    /// The tools to offer, named `<extension>__<tool>`, in the extensions' order.
    pub(crate) specs: Vec<ToolSpec>,
    /// One line per problem, each naming its extension.
    pub(crate) warnings: Vec<String>,
}

struct Server {
    name: String,
    timeout: Duration,
    /// `None` once stopped.
    client: tokio::sync::Mutex<Option<RunningService<RoleClient, ClientConfig>>>,
    /// What the transport noticed: a dropped answer or a failed connection ends the call.
    observed: Arc<Observed>,
    /// (exposed name, the server's own name).
    tools: Vec<(String, String)>,
    group: Option<ProcessGroup>,
    stderr: Arc<Mutex<StderrTail>>,
    /// Why the server can no longer be used.
    broken: Mutex<Option<String>>,
}

impl Session {
    /// Starts every server at once. A server that cannot be started is left out with a
    /// warning; the others are still offered. `env` says which of summon's variables are
    /// credentials: a server gets none of them unless its extension names it.
    pub(crate) async fn start(specs: &[ServerSpec], workdir: &Path, env: &CommandEnv) -> Started {
        let started =
            futures::future::join_all(specs.iter().map(|s| start_one(s, workdir, env))).await;
        let mut session = Session::default();
        let mut tool_specs = Vec::new();
        let mut warnings = Vec::new();
        for result in started {
            match result {
                Ok((server, specs, mut problems)) => {
                    tool_specs.extend(specs);
                    warnings.append(&mut problems);
                    session.servers.push(server);
                }
                Err(warning) => warnings.push(warning),
            }
        }
        session.offer_valid_names(&mut tool_specs);
        Started {
            session,
            specs: tool_specs,
            warnings,
        }
    }

    /// Renames the tools whose `<extension>__<tool>` name providers would refuse (other
    /// characters, too long, offered twice): `specs` are the servers' tools in order.
    fn offer_valid_names(&mut self, specs: &mut [ToolSpec]) {
        let wanted: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
        let offered = crate::provider::tool_name::assign(&wanted, &[]);
        let exposed = self
            .servers
            .iter_mut()
            .flat_map(|server| server.tools.iter_mut().map(|(exposed, _)| exposed));
        for ((spec, exposed), name) in specs.iter_mut().zip(exposed).zip(offered) {
            spec.name.clone_from(&name);
            *exposed = name;
        }
    }

    /// Whether `name` is a tool of a server that failed: it is no longer offered.
    pub(crate) fn withdrawn(&self, name: &str) -> bool {
        self.server_of(name)
            .is_some_and(|(server, _)| server.broken.lock().is_ok_and(|b| b.is_some()))
    }

    /// Whether `name` is a tool of one of the servers.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.server_of(name).is_some()
    }

    fn server_of(&self, name: &str) -> Option<(&Server, &str)> {
        self.servers.iter().find_map(|server| {
            server
                .tools
                .iter()
                .find(|(exposed, _)| exposed == name)
                .map(|(_, own)| (server, own.as_str()))
        })
    }

    /// Runs one call. The second value is a warning for the user when the server failed
    /// (it is then no longer used).
    pub(crate) async fn call(
        &self,
        name: &str,
        args: &Value,
        traceparent: Option<&str>,
    ) -> (ToolOutput, Option<String>) {
        let Some((server, own)) = self.server_of(name) else {
            return (
                ToolOutput::error(format!(
                    "unknown_tool: Unknown tool `{name}`: it is not one of your tools"
                )),
                None,
            );
        };
        server.call(own, args, traceparent).await
    }

    /// The extension whose tool `name` is, when it is one of theirs.
    pub(crate) fn extension_of(&self, name: &str) -> Option<&str> {
        self.server_of(name).map(|(server, _)| server.name.as_str())
    }

    /// Stops every server: stdin is closed, and after a short grace the process group is
    /// killed.
    pub(crate) async fn shutdown(self) {
        futures::future::join_all(self.servers.into_iter().map(Server::stop)).await;
    }
}

impl Server {
    async fn call(
        &self,
        tool: &str,
        args: &Value,
        traceparent: Option<&str>,
    ) -> (ToolOutput, Option<String>) {
        if let Some(reason) = self.broken.lock().ok().and_then(|b| b.clone()) {
            return (
                ToolOutput::error(format!(
                    "extension `{}` is not available: {reason}",
                    self.name
                )),
                None,
            );
        }
        let arguments = match args {
            Value::Object(map) => Some(map.clone()),
            Value::Null => None,
            other => {
                return (
                    ToolOutput::error(format!(
                        "invalid arguments for `{}__{tool}`: expected a JSON object, got {}",
                        self.name,
                        kind_of(other)
                    )),
                    None,
                );
            }
        };
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = arguments;
        if let Some(traceparent) = traceparent {
            // W3C trace context in `_meta` (SEP-414): the server's spans join the call's.
            let mut meta = rmcp::model::RequestMetaObject::default();
            meta.set_traceparent(traceparent);
            params.meta = Some(meta);
        }
        let guard = self.client.lock().await;
        let Some(client) = guard.as_ref() else {
            return (
                ToolOutput::error(format!("extension `{}` was stopped", self.name)),
                None,
            );
        };
        // Progress notifications are a sign of life: each restarts the timeout.
        let options = PeerRequestOptions::with_timeout(self.timeout)
            .reset_timeout_on_progress()
            .with_max_total_timeout(self.timeout * PROGRESS_CEILING);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let mut alarm = self.observed.listen();
        let outcome = tokio::select! {
            biased;
            message = alarm.next() => Err(message),
            outcome = async {
                client
                    .send_cancellable_request(request, options)
                    .await?
                    .await_response()
                    .await
            } => Ok(outcome),
        };
        drop(guard);
        match outcome {
            Ok(Ok(ServerResult::CallToolResult(result))) => (format_result(result), None),
            Ok(Ok(ServerResult::EmptyResult(_))) => (ToolOutput::ok(""), None),
            Ok(Ok(_)) => (
                ToolOutput::error(format!(
                    "extension `{}`: the server answered the call with something other than a \
                     tool result",
                    self.name
                )),
                None,
            ),
            Ok(Err(rmcp::ServiceError::Timeout { timeout })) => {
                let reason = if timeout > self.timeout {
                    format!(
                        "it did not finish within {} (its progress notifications extend the \
                         wait up to that)",
                        seconds(timeout)
                    )
                } else {
                    format!("it did not answer within {}", seconds(timeout))
                };
                self.fail(reason).await
            }
            Ok(Err(e)) => {
                // A closed transport usually means the server is exiting: give it a moment to
                // be seen gone, so that the message says so.
                if matches!(e, rmcp::ServiceError::TransportClosed)
                    && let Some(group) = &self.group
                {
                    group.wait_gone(Duration::from_millis(500)).await;
                }
                let running = self.group.as_ref().is_none_or(ProcessGroup::leader_alive);
                let reason = if !running {
                    format!("the server exited{}", self.stderr_tail())
                } else if let Some(seen) = self.observed.last() {
                    seen
                } else {
                    format!("the call failed: {e}")
                };
                // A protocol-level error from a live server leaves it usable.
                if running && !matches!(e, rmcp::ServiceError::TransportClosed) {
                    return (
                        ToolOutput::error(format!("extension `{}`: {reason}", self.name)),
                        None,
                    );
                }
                self.fail(reason).await
            }
            Err(message) => {
                // A stdio server whose answer was dropped can still be used; a failed
                // connection or a server that exited cannot.
                let usable = self.group.as_ref().is_some_and(ProcessGroup::leader_alive);
                if usable {
                    (
                        ToolOutput::error(format!("extension `{}`: {message}", self.name)),
                        None,
                    )
                } else {
                    self.fail(message).await
                }
            }
        }
    }

    /// Marks the server unusable, stops it, and phrases the failure for the model and the user.
    async fn fail(&self, reason: String) -> (ToolOutput, Option<String>) {
        if let Ok(mut broken) = self.broken.lock() {
            *broken = Some(reason.clone());
        }
        let client = self.client.lock().await.take();
        if let Some(group) = &self.group {
            group.kill();
        }
        drop(client);
        let warning = format!(
            "extension `{}` failed: {reason}; its tools are no longer offered",
            self.name
        );
        (
            ToolOutput::error(format!(
                "extension `{}` failed: {reason}. Its tools cannot be used for the rest of \
                 this task.",
                self.name
            )),
            Some(warning),
        )
    }

    fn stderr_tail(&self) -> String {
        self.stderr.lock().map(|t| t.quote()).unwrap_or_default()
    }

    async fn stop(self) {
        let client = self.client.lock().await.take();
        if let Some(client) = client {
            // Closing the transport closes the server's stdin; well-behaved servers exit.
            let _ = tokio::time::timeout(STOP_GRACE, client.cancel()).await;
        }
        if let Some(group) = &self.group {
            group.kill();
        }
    }
}

/// Starts one server and lists its tools.
async fn start_one(
    spec: &ServerSpec,
    workdir: &Path,
    env: &CommandEnv,
) -> Result<(Server, Vec<ToolSpec>, Vec<String>), String> {
    let stderr = Arc::new(Mutex::new(StderrTail::default()));
    let observed = Arc::new(Observed::default());
    let fail = |reason: String, stderr: &Arc<Mutex<StderrTail>>| {
        let tail = stderr.lock().map(|t| t.quote()).unwrap_or_default();
        format!(
            "extension `{}` did not start: {reason}{tail}; its tools are left out",
            spec.name
        )
    };
    let (client, group) = match &spec.transport {
        Transport::Stdio {
            cmd,
            args,
            envs,
            sandbox,
        } => {
            if let Some(refusal) = crate::sandbox::support::refusal(*sandbox) {
                return Err(fail(refusal, &stderr));
            }
            let (transport, group) =
                spawn_stdio(cmd, args, envs, *sandbox, workdir, env, &stderr, &observed)
                    .await
                    .map_err(|e| fail(format!("cannot run `{cmd}`: {e}"), &stderr))?;
            let client =
                match tokio::time::timeout(spec.timeout, client_config().serve(transport)).await {
                    Ok(Ok(client)) => client,
                    Ok(Err(e)) => {
                        // Let the stderr reader catch the server's last words.
                        group.wait_gone(Duration::from_millis(200)).await;
                        wait_closed(&stderr, Duration::from_millis(200)).await;
                        let reason = observed.last().unwrap_or_else(|| e.to_string());
                        return Err(fail(reason, &stderr));
                    }
                    Err(_) => {
                        return Err(fail(
                            format!("no answer within {}", seconds(spec.timeout)),
                            &stderr,
                        ));
                    }
                };
            (client, Some(group))
        }
        Transport::Http { uri, headers } => {
            let mut custom = std::collections::HashMap::new();
            for (name, value) in headers {
                let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|e| fail(format!("header `{name}`: {e}"), &stderr))?;
                let value = reqwest::header::HeaderValue::from_str(value)
                    .map_err(|e| fail(format!("header `{name}`: {e}"), &stderr))?;
                custom.insert(name, value);
            }
            let http = reqwest::Client::builder()
                .connect_timeout(spec.timeout.min(Duration::from_secs(10)))
                .build()
                .map_err(|e| fail(e.to_string(), &stderr))?;
            let config =
                StreamableHttpClientTransportConfig::with_uri(uri.as_str()).custom_headers(custom);
            let http = super::http::WatchedClient::new(http, Arc::clone(&observed));
            let transport = StreamableHttpClientTransport::with_client(http, config);
            let client =
                match tokio::time::timeout(spec.timeout, client_config().serve(transport)).await {
                    Ok(Ok(client)) => client,
                    Ok(Err(e)) => {
                        let reason = observed.last().unwrap_or_else(|| e.to_string());
                        return Err(fail(reason, &stderr));
                    }
                    Err(_) => {
                        return Err(fail(
                            format!("no answer within {}", seconds(spec.timeout)),
                            &stderr,
                        ));
                    }
                };
            (client, None)
        }
    };
    let listed = match tokio::time::timeout(spec.timeout, client.list_all_tools()).await {
        Ok(Ok(tools)) => tools,
        Ok(Err(e)) => return Err(fail(format!("cannot list its tools: {e}"), &stderr)),
        Err(_) => {
            return Err(fail(
                format!("it did not list its tools within {}", seconds(spec.timeout)),
                &stderr,
            ));
        }
    };
    let mut warnings = Vec::new();
    for wanted in &spec.allow {
        if !listed.iter().any(|t| t.name == wanted.as_str()) {
            warnings.push(format!(
                "extension `{}` has no tool `{wanted}` (listed in its available_tools)",
                spec.name
            ));
        }
    }
    let mut tools = Vec::new();
    let mut specs = Vec::new();
    for tool in listed.into_iter().filter(|t| spec.allows(&t.name)) {
        if observed.is_task_only(&tool.name) {
            warnings.push(format!(
                "extension `{}`: tool `{}` runs only as a task (execution.taskSupport: \
                 required), which summon does not support; it is left out",
                spec.name, tool.name
            ));
            continue;
        }
        let exposed = spec.exposed_name(&tool.name);
        specs.push(ToolSpec {
            name: exposed.clone(),
            description: tool
                .description
                .as_deref()
                .unwrap_or("(no description)")
                .to_owned(),
            parameters: Value::Object((*tool.input_schema).clone()),
        });
        tools.push((exposed, tool.name.into_owned()));
    }
    Ok((
        Server {
            name: spec.name.clone(),
            timeout: spec.timeout,
            client: tokio::sync::Mutex::new(Some(client)),
            observed,
            tools,
            group,
            stderr,
            broken: Mutex::new(None),
        },
        specs,
        warnings,
    ))
}

/// How summon introduces itself to servers.
fn client_config() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("summon", env!("CARGO_PKG_VERSION")),
    )
}

/// Spawns a stdio server as the leader of a new process group, its stderr kept in `tail`.
/// On Linux the server dies with summon (see [`super::spawn`]).
#[allow(clippy::too_many_arguments)] // the command, where and how it runs, what watches it
async fn spawn_stdio(
    cmd: &str,
    args: &[String],
    envs: &[(String, String)],
    sandbox: crate::sandbox::Sandbox,
    workdir: &Path,
    env: &CommandEnv,
    tail: &Arc<Mutex<StderrTail>>,
    observed: &Arc<Observed>,
) -> std::io::Result<(StdioTransport, ProcessGroup)> {
    let path = envs
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| std::ffi::OsString::from(v))
        .or_else(|| std::env::var_os("PATH"));
    crate::sandbox::helper::check_program(cmd, workdir, path.as_deref())?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut command = crate::sandbox::helper::server_command(sandbox, &[workdir], cmd, &args)?;
    command
        .current_dir(workdir)
        .env(crate::env::NESTED_ENV, "1");
    // A traced run's servers start under its span; each call carries its own in `_meta`.
    if let Some(traceparent) = env.traceparent() {
        command.env("TRACEPARENT", traceparent);
    }
    // summon's own secrets (the providers' key variables, and variables named like keys) are
    // not handed to servers unless the extension names them.
    for (name, _) in std::env::vars_os() {
        if let Some(name) = name.to_str()
            && env.is_credential(name)
            && !envs.iter().any(|(k, _)| k == name)
        {
            command.env_remove(name);
        }
    }
    command.envs(envs.iter().map(|(k, v)| (k, v)));
    let mut wrapped = process_wrap::tokio::CommandWrap::from(command);
    wrapped.wrap(process_wrap::tokio::ProcessGroup::leader());
    wrapped
        .command_mut()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = super::spawn::spawn(wrapped).await?;
    let stderr = child.inner_mut().stderr().take();
    let pid = child
        .id()
        .ok_or_else(|| std::io::Error::other("the process exited at once"))?;
    let transport = StdioTransport::new(child, Arc::clone(observed))?;
    crate::process::groups::register_server(pid);
    super::record::started(pid);
    let group = ProcessGroup {
        pgid: pid,
        killed: false.into(),
    };
    if let Some(stderr) = stderr {
        let tail = Arc::clone(tail);
        tokio::spawn(async move {
            // Bytes, not text: a line that is not UTF-8 must not end the reading.
            let mut reader = tokio::io::BufReader::new(stderr);
            let mut line = Vec::new();
            while matches!(reader.read_until(b'\n', &mut line).await, Ok(n) if n > 0) {
                if let Ok(mut tail) = tail.lock() {
                    tail.push(&String::from_utf8_lossy(&line));
                }
                line.clear();
            }
            if let Ok(mut tail) = tail.lock() {
                tail.close();
            }
        });
    }
    Ok((transport, group))
}

/// Waits up to `limit` for the server's stderr to reach its end (the server exited and its
/// last lines were read).
async fn wait_closed(tail: &Mutex<StderrTail>, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    while !tail.lock().is_ok_and(|t| t.is_closed()) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A server's process group; killed (all of it) when dropped.
struct ProcessGroup {
    pgid: u32,
    /// Set once the group was killed: a pgid is not signalled twice, as it may be reused.
    killed: std::sync::atomic::AtomicBool,
}

impl ProcessGroup {
    fn pid(&self) -> Option<nix::unistd::Pid> {
        i32::try_from(self.pgid)
            .ok()
            .map(nix::unistd::Pid::from_raw)
    }

    fn kill(&self) {
        if self.killed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        if let Some(pid) = self.pid() {
            let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
        }
        crate::process::groups::unregister_server(self.pgid);
        super::record::stopped(self.pgid);
    }

    /// Whether the group's leader (the server itself) still runs (a zombie has ended).
    fn leader_alive(&self) -> bool {
        crate::process::pid_alive(self.pgid)
    }

    /// Waits up to `limit` for the leader to exit.
    async fn wait_gone(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while self.leader_alive() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The result's content as text for the model, at most [`MAX_OUTPUT`] of it.
fn format_result(result: rmcp::model::CallToolResult) -> ToolOutput {
    let mut parts = Vec::new();
    for block in &result.content {
        match block {
            ContentBlock::Text(text) => parts.push(text.text.clone()),
            ContentBlock::Image(image) => parts.push(format!(
                "[image: {}, {} bytes]",
                image.mime_type,
                decoded_len(&image.data)
            )),
            ContentBlock::Audio(audio) => parts.push(format!(
                "[audio: {}, {} bytes]",
                audio.mime_type,
                decoded_len(&audio.data)
            )),
            other => parts.push(serde_json::to_string(other).unwrap_or_default()),
        }
    }
    if parts.is_empty()
        && let Some(structured) = &result.structured_content
    {
        parts.push(structured.to_string());
    }
    let mut text = parts.join("\n");
    let full = text.len();
    if crate::text::truncate_at_boundary(&mut text, MAX_OUTPUT) {
        text.push_str(&format!(
            "\n[output truncated: showed the first {} of {}]",
            super::size::human(MAX_OUTPUT),
            super::size::human(full)
        ));
    }
    if result.is_error == Some(true) {
        if text.trim().is_empty() {
            text = "the tool reported an error with no message".to_owned();
        }
        ToolOutput::error(text)
    } else {
        ToolOutput::ok(text)
    }
}

/// The number of bytes base64 `data` stands for.
fn decoded_len(data: &str) -> usize {
    let digits = data.bytes().filter(|b| !b.is_ascii_whitespace()).count();
    let padding = data
        .trim_end()
        .bytes()
        .rev()
        .take_while(|b| *b == b'=')
        .count();
    (digits / 4 * 3 + (digits % 4).saturating_sub(1)).saturating_sub(padding.min(2))
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn seconds(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs.fract() == 0.0 {
        format!("{secs:.0}s")
    } else {
        format!("{secs:.1}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_text() {
        let result: rmcp::model::CallToolResult = serde_json::from_value(serde_json::json!({
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
            "isError": true
        }))
        .unwrap();
        assert_eq!(format_result(result), ToolOutput::error("one\ntwo"));
        let result: rmcp::model::CallToolResult = serde_json::from_value(serde_json::json!({
            "content": [],
            "structuredContent": {"a": 1}
        }))
        .unwrap();
        assert_eq!(format_result(result), ToolOutput::ok("{\"a\":1}"));
    }

    #[test]
    fn base64_lengths_are_bytes() {
        assert_eq!(decoded_len(""), 0);
        assert_eq!(decoded_len("YQ=="), 1);
        assert_eq!(decoded_len("YWI="), 2);
        assert_eq!(decoded_len("YWJj"), 3);
        assert_eq!(decoded_len("YWJjZA"), 4);
        assert_eq!(decoded_len("YWJj\nZGVm\n"), 6);
    }
}
