//! Turning one delegation — a source and/or instructions, parameters, overrides — into a
//! runnable subagent: rendered prompt, tools, provider and model, limits. Shared by
//! `summon delegate` and pipeline steps.

use std::path::{Path, PathBuf};

use crate::config::{Config, Overrides, Resolved, env_max_turns, resolve};
use crate::diag::{Diagnostic, Diagnostics};
use crate::env::Env;
use crate::mcp::ServerSpec;
use crate::recipe::{Extension, ExtensionKind, ParamInput, Recipe, bind_params, render_recipe};
use crate::source::{Source, SourceDef};
use crate::subagent::tool::{ToolSet, WorkDir};
use crate::subagent::{FirstMessage, SubagentSpec, read_role_text, system_prompt};

/// The built-in default for `max_turns`.
pub(crate) const DEFAULT_MAX_TURNS: u32 = 25;
/// How many times a schema-invalid answer is sent back.
pub(crate) const SCHEMA_RETRIES: u32 = 3;

/// What the caller asks for.
#[derive(Debug, Clone, Default)]
pub(crate) struct Request {
    pub(crate) instructions: Option<String>,
    pub(crate) params: ParamInput,
    /// `None`: the source's own extensions; `Some(empty)`: none.
    pub(crate) extensions: Option<Vec<String>>,
    pub(crate) provider: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) temperature: Option<f64>,
    pub(crate) max_turns: Option<u32>,
    /// The output limit of each request; `None`: the config file's, else summon's default.
    pub(crate) max_output_tokens: Option<u32>,
    /// Stop sequences over the source's own (`settings.stop`); empty: the source's.
    pub(crate) stop: Vec<String>,
    /// An empty final answer completes the task (a pipeline step's `allow_empty`).
    pub(crate) allow_empty: bool,
    pub(crate) context: Option<String>,
    pub(crate) working_dir: Option<PathBuf>,
    /// A schema the answer must match, over the source's own (pipelines ask decompose
    /// subagents for a JSON array).
    pub(crate) response_schema: Option<serde_json::Value>,
    /// The sandbox of the model's shell commands, as the caller decided it (flags over step
    /// over settings); what is left undecided falls to the config file, then the defaults.
    pub(crate) sandbox: (Option<crate::sandbox::Policy>, Option<bool>),
    /// The model's context window, over the config file's and the built-in one (a pipeline
    /// step's `context_window`).
    pub(crate) context_window: Option<u64>,
    /// A pipeline step's `tools:`: the subset of the task's tools it sends (`None`: all).
    pub(crate) tools: Option<Vec<String>>,
    /// A pipeline task: written inline (no source), it gets only the tools its step names
    /// (`extensions:`, `tools:`), not the file tools `summon delegate --instructions` has.
    pub(crate) named_tools_only: bool,
    /// An agent source's `tools` as a `summon mcp` session's catalog froze them, over the
    /// file's own (`Some(None)`: the role lists none, so it has every tool).
    pub(crate) role_tools: Option<Option<Vec<crate::agent::ToolRef>>>,
}

/// A delegation ready to run.
pub(crate) struct Prepared {
    pub(crate) spec: SubagentSpec,
    pub(crate) resolved: std::sync::Arc<Resolved>,
    /// Shown before the run: listed tools left out, extensions not started, alias fallbacks.
    pub(crate) notes: Vec<Diagnostic>,
    /// A short label for progress lines: the source name, or `task`.
    pub(crate) label: String,
    /// The bytes of the system prompt and first message that are the task's own text.
    pub(crate) content_len: usize,
}

/// How the note about an agent's listed tools that are not available starts (seed 004's
/// words).
const LEFT_OUT: &str = "Listed tools not available, left out: ";

impl Prepared {
    /// The notes that belong in the task's result, not only on stderr: as seed 004 has it,
    /// the result says which listed tools were left out.
    pub(crate) fn result_warnings(&self) -> impl Iterator<Item = String> + '_ {
        self.notes
            .iter()
            .filter(|note| note.message.starts_with(LEFT_OUT))
            .map(|note| note.message.clone())
    }
}

/// A failure to prepare: bad input (exit 1) or a task failure such as an unreadable role
/// file (exit 2).
#[derive(Debug)]
pub(crate) enum PrepareError {
    Input(Diagnostics),
    Task(String),
}

impl From<Diagnostic> for PrepareError {
    fn from(diagnostic: Diagnostic) -> Self {
        let mut diags = Diagnostics::default();
        diags.push(diagnostic);
        Self::Input(diags)
    }
}

/// Builds the subagent for `source` (or ad-hoc when `None`).
pub(crate) async fn prepare(
    env: &Env,
    config: &Config,
    source: Option<&Source>,
    request: &Request,
) -> Result<Prepared, PrepareError> {
    prepare_with(env, config, source, request, &Resolver::default()).await
}

/// Provider resolutions already made, by the settings that decided them: a run with many
/// tasks resolves (and probes) once per distinct combination.
#[derive(Default)]
pub(crate) struct Resolver {
    cache:
        std::sync::Mutex<std::collections::HashMap<[Option<String>; 4], std::sync::Arc<Resolved>>>,
    /// The default working directory, checked once.
    workdir: std::sync::OnceLock<WorkDir>,
    /// The environment of model-run commands, made once (it reads every provider preset).
    command_env: std::sync::OnceLock<crate::sandbox::CommandEnv>,
    /// The subagents' `load`, made once.
    loader: std::sync::OnceLock<std::sync::Arc<dyn crate::subagent::Loader>>,
}

impl Resolver {
    async fn resolve(
        &self,
        env: &Env,
        config: &Config,
        overrides: &Overrides<'_>,
    ) -> Result<std::sync::Arc<Resolved>, Diagnostic> {
        let key = [
            overrides.provider_flag.map(str::to_owned),
            overrides.model_flag.map(str::to_owned),
            overrides.recipe_provider.map(str::to_owned),
            overrides.recipe_model.map(str::to_owned),
        ];
        if let Some(found) = self.cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Ok(found);
        }
        let resolved = std::sync::Arc::new(resolve(env, config, overrides).await?);
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(key, std::sync::Arc::clone(&resolved));
        }
        Ok(resolved)
    }

    /// The subagent's working directory: `--working-dir` checked each time, the default once.
    fn workdir(&self, cwd: &Path, wanted: Option<&Path>) -> Result<WorkDir, Diagnostic> {
        if wanted.is_none()
            && let Some(found) = self.workdir.get()
        {
            return Ok(found.clone());
        }
        let path = working_dir(cwd, wanted)?;
        let workdir = WorkDir::new(&path).map_err(|e| {
            Diagnostic::error(format!(
                "cannot use working directory `{}`: {e}",
                path.display()
            ))
        })?;
        if wanted.is_none() {
            let _ = self.workdir.set(workdir.clone());
        }
        Ok(workdir)
    }
}

/// [`prepare`] with a shared [`Resolver`].
pub(crate) async fn prepare_with(
    env: &Env,
    config: &Config,
    source: Option<&Source>,
    request: &Request,
    resolver: &Resolver,
) -> Result<Prepared, PrepareError> {
    let draft = draft(env, source, request, resolver)?;
    let resolved = resolver.resolve(env, config, &draft.overrides()).await?;
    check_sandbox_trust(config, request)?;
    let mut draft = draft;
    draft.tools = draft.tools.with_sandbox(crate::sandbox::Sandbox::pick(&[
        request.sandbox,
        (config.sandbox, config.network),
    ]));
    let command_env = match resolver.command_env.get() {
        Some(made) => made.clone(),
        None => {
            let made = config.command_env(env)?;
            let _ = resolver.command_env.set(made.clone());
            made
        }
    };
    draft.tools = draft.tools.with_command_env(command_env);
    let mut prepared = draft.into_prepared(resolved);
    let limit = &mut prepared.spec.max_output_tokens;
    *limit = limit.or(config.max_output_tokens);
    prepared.spec.context_window = request
        .context_window
        .or_else(|| config.context_window(&prepared.resolved.model));
    prepared.spec.native_structured = config.native_structured(&prepared.resolved.model);
    Ok(prepared)
}

/// Refuses a sandbox the project's `summon.yaml` loosens (`sandbox: off`, `network: true`)
/// when the project is not trusted and no flag or step decides it instead: a cloned
/// repository must not be able to let the model's commands out.
fn check_sandbox_trust(config: &Config, request: &Request) -> Result<(), Diagnostic> {
    if config.trust.is_trusted() {
        return Ok(());
    }
    let (policy, network) = request.sandbox;
    let applies = |key: &str| match key {
        "sandbox" => policy.is_none(),
        _ => network.is_none(),
    };
    match config.loosened.iter().find(|(key, _)| applies(key)) {
        Some((key, span)) => Err(Diagnostic::error(format!(
            "`{key}` in this project's summon.yaml would let the model's shell commands {}, and \
             this project is not trusted",
            if *key == "sandbox" {
                "write anywhere"
            } else {
                "use the network"
            }
        ))
        .with_hint(config.trust.how_to_trust())
        .at(span.clone())),
        None => Ok(()),
    }
}

/// The longest a subagent's `load` of a running background task waits.
const LOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(50);

/// A delegation with everything decided but its provider and model: the prompt, the first
/// message and the built-in tools its first request carries (what `summon run --dry-run`
/// counts without contacting anyone).
pub(crate) struct Draft {
    label: String,
    pub(crate) system: String,
    pub(crate) first_message: String,
    pub(crate) tools: ToolSet,
    /// MCP servers the task would start (their tools join the built-in ones).
    pub(crate) servers: Vec<ServerSpec>,
    pub(crate) notes: Vec<Diagnostic>,
    /// The bytes of `system` and `first_message` that are the task's own instructions,
    /// context, prompt and role text; the rest is framing (see `crate::event::Overhead`).
    pub(crate) content_len: usize,
    workdir: WorkDir,
    max_turns: u32,
    temperature: Option<f64>,
    max_output_tokens: Option<u32>,
    stop: Vec<String>,
    allow_empty: bool,
    response_schema: Option<serde_json::Value>,
    retry: Option<crate::recipe::RetryConfig>,
    provider_flag: Option<String>,
    model_flag: Option<String>,
    recipe_provider: Option<String>,
    recipe_model: Option<String>,
    recipe_origin: String,
}

impl Draft {
    /// What decides the provider and model, beyond the environment and the config file.
    /// The JSON Schema the answer must match, when it must.
    pub(crate) fn response_schema(&self) -> Option<&serde_json::Value> {
        self.response_schema.as_ref()
    }

    pub(crate) fn overrides(&self) -> Overrides<'_> {
        Overrides {
            provider_flag: self.provider_flag.as_deref(),
            model_flag: self.model_flag.as_deref(),
            recipe_provider: self.recipe_provider.as_deref(),
            recipe_model: self.recipe_model.as_deref(),
            recipe_origin: &self.recipe_origin,
        }
    }

    fn into_prepared(self, resolved: std::sync::Arc<Resolved>) -> Prepared {
        let mut notes = self.notes;
        notes.extend(resolved.warnings.iter().cloned());
        let spec = SubagentSpec {
            system: self.system,
            first_message: self.first_message,
            model: resolved.model.clone(),
            tools: self.tools,
            workdir: self.workdir,
            max_turns: self.max_turns,
            temperature: self.temperature,
            max_output_tokens: self.max_output_tokens,
            stop: self.stop,
            allow_empty: self.allow_empty,
            context_window: None,
            native_structured: false,
            response_schema: self.response_schema,
            schema_retries: SCHEMA_RETRIES,
            retry: self.retry,
            extensions: self.servers,
            slot: None,
            budget: None,
            cache: crate::subagent::TaskCache::default(),
            output_cap: std::sync::Arc::new(crate::subagent::output_cap::OutputCap::solo()),
        };
        Prepared {
            spec,
            resolved,
            notes,
            label: self.label,
            content_len: self.content_len,
        }
    }
}

/// Everything of a delegation that needs no provider: reads the source and renders it, never
/// touches the network.
pub(crate) fn draft(
    env: &Env,
    source: Option<&Source>,
    request: &Request,
    resolver: &Resolver,
) -> Result<Draft, PrepareError> {
    let workdir = resolver.workdir(&env.cwd, request.working_dir.as_deref())?;
    let mut notes = Vec::new();
    let env_turns = env_max_turns(env)?;
    let (label, plan) = match source {
        None => {
            let Some(instructions) = request.instructions.clone() else {
                return Err(Diagnostic::error(
                    "nothing to do: pass --instructions, --source, or both",
                )
                .into());
            };
            if !request.params.is_empty() {
                return Err(Diagnostic::error("--param and --params need --source").into());
            }
            (
                "task".to_owned(),
                Plan {
                    instructions: None,
                    first: FirstMessage::AdHoc { instructions },
                    settings_provider: None,
                    settings_model: None,
                    origin: "recipe settings".into(),
                    stop: Vec::new(),
                    temperature: None,
                    max_turns: None,
                    schema: None,
                    retry: None,
                    extensions: Vec::new(),
                    no_extensions: false,
                    file: None,
                    narrow: None,
                },
            )
        }
        Some(source) => match &source.def {
            SourceDef::Recipe(recipe) | SourceDef::Subrecipe { recipe, .. } => (
                source.name.clone(),
                recipe_plan(source, recipe, request, &env.cwd, &mut notes)?,
            ),
            SourceDef::Agent(agent) => {
                if !request.params.is_empty() {
                    return Err(Diagnostic::error(format!(
                        "agent `{}` takes no parameters",
                        agent.name
                    ))
                    .into());
                }
                let role_text = read_role_text(agent).map_err(PrepareError::Task)?;
                // Alone, the role text is the work: a fixed task asks for it.
                let task = match request.instructions.clone() {
                    Some(task) => task,
                    None if role_text.trim().is_empty() => {
                        return Err(Diagnostic::error(format!(
                            "agent `{}` has no role text to run on its own: pass --instructions",
                            agent.name
                        ))
                        .into());
                    }
                    None => crate::agent::AGENT_ALONE_TASK.to_owned(),
                };
                // A project's role is shown from the working directory; one from a folder
                // outside it (`~/.claude/agents`, ...) is said to be so, from the home folder.
                let project = source.scope == crate::source::Scope::Local;
                let path = if project {
                    crate::diag::render::display_path(agent.path(), &env.cwd)
                } else {
                    outside_path(agent.path(), env)
                };
                (
                    agent.name.clone(),
                    Plan {
                        instructions: None,
                        first: FirstMessage::Role {
                            name: agent.name.clone(),
                            path,
                            project,
                            role_text,
                            task,
                        },
                        settings_provider: None,
                        settings_model: agent.model.clone(),
                        origin: format!("agent `{}`", agent.name),
                        stop: Vec::new(),
                        temperature: None,
                        max_turns: None,
                        schema: None,
                        retry: None,
                        extensions: Vec::new(),
                        no_extensions: false,
                        file: None,
                        narrow: request
                            .role_tools
                            .clone()
                            .unwrap_or_else(|| agent.tools.clone()),
                    },
                )
            }
        },
    };
    // Extensions: the source's own unless the caller lists them; `developer` is summon's
    // built-in file and shell tools; stdio and streamable_http ones are MCP servers.
    let known: Vec<String> = plan.extensions.iter().map(|e| e.name.clone()).collect();
    let chosen: Vec<Extension> = match &request.extensions {
        None => plan.extensions.clone(),
        Some(wanted) => {
            let mut chosen = Vec::new();
            for name in wanted {
                match plan.extensions.iter().find(|e| &e.name == name) {
                    Some(found) => chosen.push(found.clone()),
                    None if name == "developer" => chosen.push(Extension::builtin(name)),
                    None => notes.push(Diagnostic::warning(format!(
                        "unknown extension `{name}` ignored{}",
                        if known.is_empty() {
                            String::new()
                        } else {
                            format!("; this source has: {}", known.join(", "))
                        }
                    ))),
                }
            }
            chosen
        }
    };
    // The recipe's `retry` commands run outside the sandbox: a project's need its trust.
    if let Some(retry) = plan.retry.as_ref()
        && let Some(file) = plan.file.as_ref()
        && let Some(command) = retry.checks.first().or(retry.on_failure.as_ref())
        && let Err(why) = crate::config::trust::check_file(env, file.path(), file.text.as_bytes())
    {
        return Err(Diagnostic::error(format!(
            "`retry` of {} would run `{command}` outside the sandbox, and {why}",
            plan.origin
        ))
        .in_file(file.path())
        .with_hint(why.hint())
        .into());
    }
    let mut shell_enabled = false;
    let mut servers = Vec::new();
    for ext in &chosen {
        let name = &ext.name;
        match &ext.kind {
            ExtensionKind::Builtin | ExtensionKind::Platform if name == "developer" => {
                shell_enabled = true
            }
            ExtensionKind::Builtin | ExtensionKind::Platform => notes.push(Diagnostic::warning(
                format!("goose extension `{name}` has no equivalent in summon and is left out"),
            )),
            ExtensionKind::Stdio | ExtensionKind::StreamableHttp => {
                // A cloned repository's recipe starts its command only once trusted, pinned
                // to the file's content, as `.mcp.json` servers are.
                if matches!(ext.kind, ExtensionKind::Stdio)
                    && let Some(file) = plan.file.as_ref()
                    && let Err(why) =
                        crate::config::trust::check_file(env, file.path(), file.text.as_bytes())
                {
                    return Err(Diagnostic::error(format!(
                        "extension `{name}` of {} would start a command ({}), and {why}",
                        plan.origin,
                        ext.cmd.as_deref().unwrap_or("?"),
                    ))
                    .in_file(file.path())
                    .with_hint(why.hint())
                    .into());
                }
                if let Some(server) = ServerSpec::from_extension(ext, plan.file.as_ref(), env)? {
                    servers.push(server);
                }
            }
            other => notes.push(Diagnostic::warning(format!(
                "extension `{name}` of type {} is not supported and is left out",
                other.name()
            ))),
        }
    }
    let (mut tools, mut unavailable, wanted_mcp) =
        ToolSet::builtin(shell_enabled, plan.narrow.as_deref());
    // An agent's `mcp__server__tool` entries name servers of the project's `.mcp.json`.
    if !wanted_mcp.is_empty() {
        let names: Vec<&str> = wanted_mcp
            .iter()
            .map(|(name, _, _)| name.as_str())
            .collect();
        let (project, trust) = crate::mcp::named_project_servers_as_read(env, &names)?;
        if let Err(why) = trust
            && let Some(server) = wanted_mcp
                .iter()
                .find_map(|(name, _, _)| project.iter().find(|s| &s.name == name))
        {
            return Err(crate::mcp::untrusted_server(server, &why).into());
        }
        for (server, tool, raw) in wanted_mcp {
            let Some(found) = project.iter().find(|s| s.name == server) else {
                if !unavailable.contains(&raw) {
                    unavailable.push(raw);
                }
                continue;
            };
            let named_as_mcp = raw.starts_with("mcp__");
            match servers
                .iter_mut()
                .find(|s: &&mut ServerSpec| s.name == server)
            {
                Some(existing) => {
                    existing.mcp_prefix |= named_as_mcp;
                    if let Some(tool) = tool
                        && !existing.allow.is_empty()
                    {
                        existing.allow.push(tool);
                    } else {
                        existing.allow.clear();
                    }
                }
                None => {
                    let mut spec = found.clone();
                    spec.allow = tool.into_iter().collect();
                    spec.mcp_prefix = named_as_mcp;
                    servers.push(spec);
                }
            }
        }
    }
    if !unavailable.is_empty() {
        notes.push(Diagnostic::warning(format!(
            "{LEFT_OUT}{}",
            unavailable.join(", ")
        )));
    }
    let max_turns = request
        .max_turns
        .or(plan.max_turns)
        .or(env_turns)
        .unwrap_or(DEFAULT_MAX_TURNS);
    if let Some(listed) = &request.tools {
        let granted: Vec<String> = chosen.iter().map(|e| e.name.clone()).collect();
        tools = narrow_to_step(listed, &granted, tools, &mut servers)?;
    }
    // An empty list of extensions (`--extensions ''`, a step's or a recipe's
    // `extensions: []`) means none at all, as in goose: not even the file tools. One request
    // leaves no turn to use a tool's result. Either way the task is sent no tools.
    let no_extensions = match &request.extensions {
        Some(listed) => listed.is_empty(),
        None => plan.no_extensions,
    };
    // A pipeline step written inline names the tools it wants; naming none, it has none.
    let unnamed = request.named_tools_only
        && source.is_none()
        && request.extensions.is_none()
        && request.tools.is_none();
    if no_extensions || unnamed || max_turns <= 1 {
        tools = tools.keep_only(|_| false);
        servers.clear();
    }
    // A subagent keeps `load`, as in goose: one with tools can list and load the project's
    // sources and collect a background task (it starts none).
    let loader = resolver.loader.get_or_init(|| {
        std::sync::Arc::new(super::loading::ProjectLoader {
            env: env.clone(),
            wait: LOAD_WAIT,
        })
    });
    tools = tools.with_loader(std::sync::Arc::clone(loader));
    let schema = request.response_schema.clone().or(plan.schema);
    let first_message = plan.first.text();
    if first_message.trim().is_empty() || plan.first.task_is_blank() {
        return Err(Diagnostic::error(format!(
            "the task's instructions are blank: {} has nothing for the model to do",
            if label == "task" { "the task" } else { &label }
        ))
        .into());
    }
    let names = tools.names();
    let system = system_prompt(
        plan.first.has_role(),
        workdir.path(),
        plan.instructions.as_deref(),
        request.context.as_deref(),
        &names,
    );
    let content_len = crate::subagent::prompt_content_len(
        plan.instructions.as_deref(),
        request.context.as_deref(),
    ) + plan.first.content_len();
    Ok(Draft {
        label,
        system,
        first_message,
        tools,
        servers,
        notes,
        content_len,
        workdir,
        max_turns,
        temperature: request.temperature.or(plan.temperature),
        max_output_tokens: request.max_output_tokens,
        stop: if request.stop.is_empty() {
            plan.stop
        } else {
            request.stop.clone()
        },
        allow_empty: request.allow_empty,
        response_schema: schema,
        retry: plan.retry,
        provider_flag: request.provider.clone(),
        model_flag: request.model.clone(),
        recipe_provider: plan.settings_provider,
        recipe_model: plan.settings_model,
        recipe_origin: plan.origin,
    })
}

/// Applies a pipeline step's `tools:` to the task's built-in tools and MCP servers; an entry
/// naming a tool the task does not have is an error.
fn narrow_to_step(
    listed: &[String],
    granted: &[String],
    tools: ToolSet,
    servers: &mut Vec<ServerSpec>,
) -> Result<ToolSet, PrepareError> {
    let subset = crate::subagent::tool::Subset::parse(listed).map_err(Diagnostic::error)?;
    // An agent's `mcp__server` entries start servers beyond the granted extensions.
    let mut extensions = granted.to_vec();
    extensions.extend(servers.iter().map(|s| s.name.clone()));
    if let Some((_, message)) = subset.problem(listed, &extensions) {
        return Err(Diagnostic::error(message).into());
    }
    subset.narrow_servers(servers);
    Ok(tools.keep_only(|tool| subset.keeps_builtin(tool)))
}

/// The parts of a delegation that depend on its source.
struct Plan {
    instructions: Option<String>,
    first: FirstMessage,
    settings_provider: Option<String>,
    settings_model: Option<String>,
    origin: String,
    temperature: Option<f64>,
    max_turns: Option<u32>,
    /// The recipe's `settings.stop`.
    stop: Vec<String>,
    schema: Option<serde_json::Value>,
    retry: Option<crate::recipe::RetryConfig>,
    extensions: Vec<Extension>,
    /// The source lists no extensions at all (`extensions: []`).
    no_extensions: bool,
    /// The file the extensions were read from, for error positions.
    file: Option<std::sync::Arc<crate::diag::SourceFile>>,
    narrow: Option<Vec<crate::agent::ToolRef>>,
}

fn recipe_plan(
    source: &Source,
    recipe: &Recipe,
    request: &Request,
    cwd: &Path,
    notes: &mut Vec<Diagnostic>,
) -> Result<Plan, PrepareError> {
    let preset = source.preset_values();
    let binding = bind_params(
        &recipe.parameters,
        &request.params,
        &preset,
        Some(&recipe.file),
        cwd,
    );
    if binding.problems.has_errors() {
        return Err(PrepareError::Input(binding.problems));
    }
    notes.extend(binding.problems.items.iter().cloned());
    let rendered = render_recipe(recipe, &binding.values()).map_err(PrepareError::Input)?;
    let (instructions, prompt) = match (rendered.instructions, rendered.prompt) {
        (Some(instructions), Some(prompt)) => (Some(instructions), prompt),
        (Some(instructions), None) => (None, instructions),
        (None, Some(prompt)) => (None, prompt),
        (None, None) => (None, String::new()),
    };
    Ok(Plan {
        instructions,
        first: FirstMessage::Recipe {
            prompt,
            extra: request.instructions.clone(),
        },
        settings_provider: rendered.settings.provider.clone(),
        settings_model: rendered.settings.model.clone(),
        origin: format!("recipe `{}` settings", source.name),
        temperature: rendered.settings.temperature,
        max_turns: rendered.settings.max_turns,
        stop: rendered.settings.stop.clone(),
        schema: rendered.response_schema.clone(),
        retry: rendered.retry.clone(),
        extensions: rendered.extensions.clone(),
        no_extensions: rendered.no_extensions,
        file: Some(std::sync::Arc::clone(&recipe.file)),
        narrow: None,
    })
}

/// A file outside the project: `~/...` under the home folder, else its full path.
fn outside_path(path: &Path, env: &Env) -> String {
    match env
        .home()
        .and_then(|home| path.strip_prefix(home).ok().map(Path::to_path_buf))
    {
        Some(rest) => format!("~/{}", rest.display()),
        None => path.display().to_string(),
    }
}

/// `--working-dir` must resolve inside the current directory, symlinks included.
fn working_dir(cwd: &Path, wanted: Option<&Path>) -> Result<PathBuf, Diagnostic> {
    let real_cwd = cwd
        .canonicalize()
        .map_err(|e| Diagnostic::error(format!("cannot resolve the working directory: {e}")))?;
    let Some(wanted) = wanted else {
        return Ok(real_cwd);
    };
    let real = cwd
        .join(wanted)
        .canonicalize()
        .map_err(|e| Diagnostic::error(format!("--working-dir `{}`: {e}", wanted.display())))?;
    if !real.starts_with(&real_cwd) {
        return Err(Diagnostic::error(format!(
            "--working-dir `{}` is outside the current directory",
            wanted.display()
        )));
    }
    if !real.is_dir() {
        return Err(Diagnostic::error(format!(
            "--working-dir `{}` is not a directory",
            wanted.display()
        )));
    }
    Ok(real)
}
