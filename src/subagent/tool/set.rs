//! The set of tools one subagent is offered, and the dispatch of the model's calls.
//!
//! A subagent gets the file tools (unless its delegation takes them away: an empty list of
//! extensions, one turn, a pipeline step written inline that names no tools) and `shell`
//! when its invocation grants goose's `developer` extension; an agent's `tools` list only narrows that: listing `Bash` / `shell`
//! without the grant does not offer the shell. Listed entries summon cannot offer are handed
//! back so the run can say they were left out. A call to a tool outside the set runs nothing and returns an
//! `unknown_tool` error that lists the tools the model does have.

use serde_json::Value;

use super::shell::Scratch;
use super::workdir::WorkDir;
use super::{Loader, ToolOutput, fs, search, shell, shown};
use crate::agent::{BuiltinTool, ToolKind, ToolRef};
use crate::provider::ToolSpec;
use crate::sandbox::{CommandEnv, Sandbox};

/// A listed MCP tool: server, tool (`None` = all of the server's), the entry as written.
pub(crate) type McpWanted = (String, Option<String>, String);

/// One tool of a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tool {
    Builtin(BuiltinTool),
    /// `load`, offered with a [`Loader`] to a subagent that has other tools.
    Load,
}

impl Tool {
    fn name(&self) -> &'static str {
        match self {
            Self::Builtin(tool) => tool.name(),
            Self::Load => super::load::NAME,
        }
    }
}

/// The work of `load`, compared by identity.
#[derive(Debug, Clone)]
struct LoaderRef(std::sync::Arc<dyn Loader>);

impl PartialEq for LoaderRef {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for LoaderRef {}

/// The tools offered to one subagent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolSet {
    /// In offering order.
    tools: Vec<Tool>,
    /// `Some` when the shell was offered only through patterns such as `Bash(git log*)`: the
    /// commands it may run.
    shell_patterns: Option<Vec<String>>,
    /// The sandbox `shell` commands run in.
    sandbox: Sandbox,
    /// The environment variables `shell` commands get.
    command_env: CommandEnv,
    /// What `load` does, when the set offers it.
    loader: Option<LoaderRef>,
}

impl ToolSet {
    /// The built-in tools a subagent gets: file tools always, `shell` only when `shell_enabled`;
    /// narrowed by an agent's `tools` list when given (None = no narrowing; Some(empty) = no
    /// tools). A definition only narrows: an agent that lists the shell (`Bash`, `shell`,
    /// `developer__shell`) without `shell_enabled` does not get it.
    ///
    /// Returns the set, the listed entries that are not available (raw text, once each: tools
    /// summon does not have, such as `WebFetch`, and a shell the invocation did not grant,
    /// with the flag that grants it), and the listed MCP tools as (server, tool —
    /// `None` for all of the server's —, raw text), for the caller to find servers for.
    /// Delegation entries are ignored: a subagent never delegates.
    pub(crate) fn builtin(
        shell_enabled: bool,
        narrow: Option<&[ToolRef]>,
    ) -> (ToolSet, Vec<String>, Vec<McpWanted>) {
        let Some(list) = narrow else {
            let tools = BuiltinTool::ALL
                .into_iter()
                .filter(|tool| *tool != BuiltinTool::Shell || shell_enabled)
                .map(Tool::Builtin)
                .collect();
            return (
                ToolSet {
                    tools,
                    shell_patterns: None,
                    sandbox: Sandbox::default(),
                    command_env: CommandEnv::default(),
                    loader: None,
                },
                Vec::new(),
                Vec::new(),
            );
        };
        let mut wanted = Vec::new();
        let mut unavailable: Vec<String> = Vec::new();
        let mut mcp: Vec<McpWanted> = Vec::new();
        let mut patterns: Vec<String> = Vec::new();
        let mut shell_unrestricted = false;
        let mut ungranted: Vec<&str> = Vec::new();
        for entry in list {
            match &entry.kind {
                ToolKind::Builtin {
                    tool: BuiltinTool::Shell,
                    ..
                } if !shell_enabled => {
                    let raw = entry.raw.trim();
                    if !ungranted.contains(&raw) {
                        ungranted.push(raw);
                    }
                }
                ToolKind::Builtin { tool, pattern } => {
                    if !wanted.contains(tool) {
                        wanted.push(*tool);
                    }
                    if *tool == BuiltinTool::Shell {
                        match pattern {
                            None => shell_unrestricted = true,
                            Some(p) if !patterns.contains(p) => patterns.push(p.clone()),
                            Some(_) => {}
                        }
                    }
                }
                ToolKind::Mcp { server, tool } => {
                    if !mcp.iter().any(|(s, t, _)| s == server && t == tool) {
                        mcp.push((server.clone(), tool.clone(), entry.raw.trim().to_owned()));
                    }
                }
                ToolKind::Unsupported => {
                    let raw = entry.raw.trim();
                    if !unavailable.iter().any(|u| u == raw) {
                        unavailable.push(raw.to_owned());
                    }
                }
                ToolKind::Delegation => {}
            }
        }
        if !ungranted.is_empty() {
            unavailable.push(format!(
                "{} — grant it with --extensions developer",
                ungranted.join(", ")
            ));
        }
        let tools = BuiltinTool::ALL
            .into_iter()
            .filter(|tool| wanted.contains(tool))
            .map(Tool::Builtin)
            .collect();
        let shell_patterns =
            (wanted.contains(&BuiltinTool::Shell) && !shell_unrestricted).then_some(patterns);
        (
            ToolSet {
                tools,
                shell_patterns,
                sandbox: Sandbox::default(),
                command_env: CommandEnv::default(),
                loader: None,
            },
            unavailable,
            mcp,
        )
    }

    /// The set without the built-in tools `keep` refuses (a step's `tools:`, or none at all
    /// for a task that cannot call one).
    pub(crate) fn keep_only(mut self, keep: impl Fn(BuiltinTool) -> bool) -> Self {
        self.tools.retain(|tool| match tool {
            Tool::Builtin(builtin) => keep(*builtin),
            Tool::Load => true,
        });
        self.offer_load_with_others();
        self
    }

    /// The set with `load`, done by `loader`, when it offers any other tool (a subagent
    /// keeps `load`, as in goose; one with no tools gets none).
    pub(crate) fn with_loader(mut self, loader: std::sync::Arc<dyn Loader>) -> Self {
        self.loader = Some(LoaderRef(loader));
        if !self.tools.contains(&Tool::Load) {
            self.tools.push(Tool::Load);
        }
        self.offer_load_with_others();
        self
    }

    /// `load` only beside another tool.
    fn offer_load_with_others(&mut self) {
        if self.tools.iter().all(|tool| *tool == Tool::Load) {
            self.tools.clear();
        }
    }

    /// The set with `shell` commands run in `sandbox`.
    pub(crate) fn with_sandbox(mut self, sandbox: Sandbox) -> Self {
        self.sandbox = sandbox;
        self
    }

    /// The set with `shell` commands given the variables `env` allows.
    pub(crate) fn with_command_env(mut self, env: CommandEnv) -> Self {
        self.command_env = env;
        self
    }

    /// `shell` commands get `TRACEPARENT` set to `traceparent`.
    pub(crate) fn set_traceparent(&mut self, traceparent: String) {
        self.command_env.set_traceparent(traceparent);
    }

    /// The environment `shell` commands get.
    pub(crate) fn command_env(&self) -> &CommandEnv {
        &self.command_env
    }

    /// The sandbox `shell` commands run in.
    pub(crate) fn sandbox(&self) -> Sandbox {
        self.sandbox
    }

    /// Whether the set offers `shell`.
    pub(crate) fn has_shell(&self) -> bool {
        self.tools.contains(&Tool::Builtin(BuiltinTool::Shell))
    }

    /// The specs offered to the model, in a stable order. Built once per distinct set of
    /// tools and shared: every model request carries them.
    pub(crate) fn specs(&self) -> std::sync::Arc<[ToolSpec]> {
        type Cache =
            std::sync::Mutex<Vec<((Vec<Tool>, Option<Vec<String>>), std::sync::Arc<[ToolSpec]>)>>;
        static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        let key = (self.tools.clone(), self.shell_patterns.clone());
        if let Ok(entries) = cache.lock()
            && let Some((_, specs)) = entries.iter().find(|(k, _)| *k == key)
        {
            return std::sync::Arc::clone(specs);
        }
        let specs: std::sync::Arc<[ToolSpec]> = self.build_specs().into();
        if let Ok(mut entries) = cache.lock() {
            entries.push((key, std::sync::Arc::clone(&specs)));
        }
        specs
    }

    fn build_specs(&self) -> Vec<ToolSpec> {
        self.tools
            .iter()
            .map(|tool| match tool {
                Tool::Builtin(builtin) => match builtin {
                    BuiltinTool::ReadFile => fs::read_file_spec(),
                    BuiltinTool::WriteFile => fs::write_file_spec(),
                    BuiltinTool::EditFile => fs::edit_file_spec(),
                    BuiltinTool::ListFiles => search::list_files_spec(),
                    BuiltinTool::Search => search::search_spec(),
                    BuiltinTool::Shell => shell::shell_spec(self.shell_patterns.as_deref()),
                },
                Tool::Load => super::load::load_spec(),
            })
            .collect()
    }

    /// The names of the tools, in the order of [`ToolSet::specs`].
    pub(crate) fn names(&self) -> Vec<&str> {
        self.tools.iter().map(Tool::name).collect()
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    fn find(&self, name: &str) -> Option<Tool> {
        self.tools.iter().copied().find(|tool| tool.name() == name)
    }

    /// The answer to a call of a tool the subagent does not have: it names the tool and lists
    /// the ones it has (these and `extra`, the MCP tools).
    pub(crate) fn unknown_tool(&self, name: &str, extra: &[&str]) -> ToolOutput {
        let mut names = self.names();
        names.extend_from_slice(extra);
        let available = if names.is_empty() {
            "You have no tools.".to_owned()
        } else {
            format!("Available tools: {}.", names.join(", "))
        };
        ToolOutput::error(format!(
            "unknown_tool: Unknown tool {}: it is not one of your tools; nothing was run. {available}",
            shown(name)
        ))
    }

    /// Runs a call. A name not in the set returns an error output whose content starts with
    /// `unknown_tool:` naming the tool and listing the available ones, and runs nothing.
    /// `scratch` is the task's private temporary directory, made on the first shell call.
    pub(crate) async fn call(
        &self,
        name: &str,
        args: &Value,
        workdir: &WorkDir,
        scratch: &Scratch,
        traceparent: Option<&str>,
    ) -> ToolOutput {
        let Some(tool) = self.find(name) else {
            return self.unknown_tool(name, &[]);
        };
        let result = match tool {
            Tool::Load => {
                return match &self.loader {
                    Some(loader) => super::load::load(std::sync::Arc::clone(&loader.0), args).await,
                    None => self.unknown_tool(name, &[]),
                };
            }
            Tool::Builtin(builtin) => match builtin {
                BuiltinTool::ReadFile => fs::read_file(args, workdir).await,
                BuiltinTool::WriteFile => fs::write_file(args, workdir, self.sandbox.policy).await,
                BuiltinTool::EditFile => fs::edit_file(args, workdir, self.sandbox.policy).await,
                BuiltinTool::ListFiles => search::list_files(args, workdir).await,
                BuiltinTool::Search => search::search(args, workdir).await,
                BuiltinTool::Shell => {
                    let context = shell::Context {
                        workdir,
                        scratch,
                        sandbox: self.sandbox,
                        env: &self.command_env,
                        traceparent,
                    };
                    shell::shell(args, &context, self.shell_patterns.as_deref()).await
                }
            },
        };
        ToolOutput::from(result)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::diag::Pos;
    use crate::subagent::tool::test_support::Sandbox;

    /// [`ToolSet::builtin`] with the shell unsandboxed: the unit-test binary is not summon,
    /// which the sandbox starts (tests/sandbox.rs covers the sandbox).
    fn builtin_off(
        shell_enabled: bool,
        narrow: Option<&[ToolRef]>,
    ) -> (ToolSet, Vec<String>, Vec<McpWanted>) {
        let (set, unavailable, mcp) = ToolSet::builtin(shell_enabled, narrow);
        let off = crate::sandbox::Sandbox {
            policy: crate::sandbox::Policy::Off,
            network: false,
        };
        (set.with_sandbox(off), unavailable, mcp)
    }

    fn refs(raws: &[&str]) -> Vec<ToolRef> {
        raws.iter()
            .map(|raw| ToolRef::new(*raw, Pos::new(1, 1, 1)))
            .collect()
    }

    fn narrowed(shell_enabled: bool, raws: &[&str]) -> (ToolSet, Vec<String>) {
        let (set, unavailable, _) = builtin_off(shell_enabled, Some(&refs(raws)));
        (set, unavailable)
    }

    const FILE_TOOLS: [&str; 5] = [
        "read_file",
        "write_file",
        "edit_file",
        "list_files",
        "search",
    ];

    #[test]
    fn default_sets() {
        let (set, unavailable, _) = builtin_off(false, None);
        assert_eq!(set.names(), FILE_TOOLS);
        assert!(unavailable.is_empty());
        let (set, _, _) = builtin_off(true, None);
        assert_eq!(set.names(), [&FILE_TOOLS[..], &["shell"]].concat());
        assert_eq!(set.shell_patterns, None);
        let specs = set.specs();
        let spec_names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(spec_names, set.names());
        for spec in specs.iter() {
            assert_eq!(spec.parameters["type"], "object", "{}", spec.name);
            assert!(spec.description.len() > 40, "{}", spec.name);
        }
        assert!(set.contains("shell"));
        assert!(!set.contains("Bash"));
    }

    #[test]
    fn narrowing() {
        let (set, unavailable) = narrowed(true, &["Read", "Grep"]);
        assert_eq!(set.names(), ["read_file", "search"]);
        assert!(unavailable.is_empty());

        let (set, unavailable) = narrowed(true, &[]);
        assert!(set.names().is_empty());
        assert!(set.specs().is_empty());
        assert!(unavailable.is_empty());

        // Listing the shell does not offer it when the invocation does not grant it.
        let (set, unavailable) = narrowed(false, &["Bash", "Read", "Bash(git log*)", "Bash"]);
        assert_eq!(set.names(), ["read_file"]);
        assert_eq!(
            unavailable,
            ["Bash, Bash(git log*) — grant it with --extensions developer"]
        );
        let (set, _) = narrowed(true, &["Bash", "Read"]);
        assert_eq!(set.names(), ["read_file", "shell"]);
        assert_eq!(set.shell_patterns, None);

        // Order follows summon's, not the list's; duplicates collapse.
        let (set, _) = narrowed(true, &["shell", "Edit", "MultiEdit", "Glob", "LS", "Write"]);
        assert_eq!(
            set.names(),
            ["write_file", "edit_file", "list_files", "shell"]
        );

        let (set, unavailable) = narrowed(
            false,
            &[
                "WebFetch",
                "Read",
                "mcp__github__create_issue",
                "Task",
                "WebFetch",
                "TodoWrite",
            ],
        );
        assert_eq!(set.names(), ["read_file"]);
        assert_eq!(unavailable, ["WebFetch", "TodoWrite"]);
        let (_, _, mcp) = builtin_off(
            false,
            Some(&refs(&[
                "mcp__github__create_issue",
                "mcp__github",
                "mcp__github__create_issue",
                "fs__read",
            ])),
        );
        assert_eq!(
            mcp,
            [
                (
                    "github".to_owned(),
                    Some("create_issue".to_owned()),
                    "mcp__github__create_issue".to_owned()
                ),
                ("github".to_owned(), None, "mcp__github".to_owned()),
                (
                    "fs".to_owned(),
                    Some("read".to_owned()),
                    "fs__read".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn shell_patterns() {
        let (set, _) = narrowed(
            true,
            &["Bash(git log*)", "Bash(git diff*)", "Bash(git log*)"],
        );
        assert_eq!(set.names(), ["shell"]);
        assert_eq!(
            set.shell_patterns.as_deref(),
            Some(&["git log*".to_owned(), "git diff*".to_owned()][..])
        );
        assert!(set.specs()[0].description.contains("Restricted"));
        // An unrestricted entry wins over patterns.
        let (set, _) = narrowed(true, &["Bash(git log*)", "Bash"]);
        assert_eq!(set.shell_patterns, None);
    }

    #[tokio::test]
    async fn calls_dispatch_to_the_tools() {
        let sb = Sandbox::new();
        let (set, _, _) = builtin_off(true, None);
        let call = |name: &'static str, args: Value| {
            let set = set.clone();
            let wd = sb.wd.clone();
            async move { set.call(name, &args, &wd, &Scratch::default(), None).await }
        };
        let out = call(
            "write_file",
            json!({"path": "d/n.txt", "content": "alpha\nbeta\n"}),
        )
        .await;
        assert_eq!(out, ToolOutput::ok("wrote 11 bytes to d/n.txt"));
        let out = call(
            "edit_file",
            json!({"path": "d/n.txt", "old_string": "beta", "new_string": "gamma"}),
        )
        .await;
        assert_eq!(out, ToolOutput::ok("replaced 1 occurrence in d/n.txt"));
        let out = call("read_file", json!({"path": "d/n.txt"})).await;
        assert_eq!(out, ToolOutput::ok("alpha\ngamma\n"));
        let out = call("list_files", json!({"pattern": "*.txt"})).await;
        assert_eq!(out, ToolOutput::ok("d/n.txt"));
        let out = call("search", json!({"pattern": "gam+a"})).await;
        assert_eq!(out, ToolOutput::ok("d/n.txt:2: gamma"));
        let out = call("shell", json!({"command": "cat d/n.txt"})).await;
        assert_eq!(
            out,
            ToolOutput::ok("exit code: 0\n[stdout]\nalpha\ngamma\n")
        );
        let out = call("read_file", json!({"path": "../outside/secret.txt"})).await;
        assert!(out.is_error);
        assert!(
            out.content.contains("outside the working directory"),
            "{}",
            out.content
        );
    }

    #[tokio::test]
    async fn malformed_arguments_are_tool_errors() {
        let sb = Sandbox::new();
        let (set, _, _) = builtin_off(true, None);
        for name in set.names() {
            for args in [
                json!("{\"path\": \"a"),
                json!([]),
                json!({"path": 1, "pattern": 2, "command": 3}),
            ] {
                let out = set
                    .call(name, &args, &sb.wd, &Scratch::default(), None)
                    .await;
                assert!(out.is_error, "{name} {args}");
                assert!(
                    out.content
                        .starts_with(&format!("invalid arguments for `{name}`")),
                    "{name} {args}: {}",
                    out.content
                );
                assert!(
                    out.content.contains("Expected arguments: {"),
                    "{}",
                    out.content
                );
            }
        }
    }

    #[tokio::test]
    async fn unknown_tools_run_nothing() {
        let sb = Sandbox::new();
        let (set, _) = narrowed(true, &["Read", "Grep"]);
        let out = set
            .call(
                "write_file",
                &json!({"path": "x.txt", "content": "no"}),
                &sb.wd,
                &Scratch::default(),
                None,
            )
            .await;
        assert!(out.is_error);
        assert_eq!(
            out.content,
            "unknown_tool: Unknown tool `write_file`: it is not one of your tools; nothing was \
             run. Available tools: read_file, search."
        );
        let out = set
            .call(
                "shell",
                &json!({"command": "touch y.txt"}),
                &sb.wd,
                &Scratch::default(),
                None,
            )
            .await;
        assert!(
            out.content
                .starts_with("unknown_tool: Unknown tool `shell`"),
            "{}",
            out.content
        );
        let out = set
            .call(
                "Bash",
                &json!({"command": "touch y.txt"}),
                &sb.wd,
                &Scratch::default(),
                None,
            )
            .await;
        assert!(
            out.content.starts_with("unknown_tool: Unknown tool `Bash`"),
            "{}",
            out.content
        );
        assert!(!sb.root().join("x.txt").exists());
        assert!(!sb.root().join("y.txt").exists());

        let (empty, _) = narrowed(true, &[]);
        let out = empty
            .call(
                "read_file",
                &json!({"path": "x"}),
                &sb.wd,
                &Scratch::default(),
                None,
            )
            .await;
        assert_eq!(
            out,
            ToolOutput::error(
                "unknown_tool: Unknown tool `read_file`: it is not one of your tools; nothing was \
                 run. You have no tools."
            )
        );
    }

    #[tokio::test]
    async fn restricted_shell_through_the_set() {
        let sb = Sandbox::new();
        let (set, _) = narrowed(true, &["Bash(echo hi*)"]);
        let out = set
            .call(
                "shell",
                &json!({"command": "echo hi"}),
                &sb.wd,
                &Scratch::default(),
                None,
            )
            .await;
        assert_eq!(out, ToolOutput::ok("exit code: 0\n[stdout]\nhi\n"));
        let out = set
            .call(
                "shell",
                &json!({"command": "touch z"}),
                &sb.wd,
                &Scratch::default(),
                None,
            )
            .await;
        assert!(out.is_error);
        assert!(
            out.content.starts_with("command not allowed"),
            "{}",
            out.content
        );
        assert!(!sb.root().join("z").exists());
    }
}
