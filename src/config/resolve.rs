//! Which provider and model a run uses, and where each choice came from.
//!
//! Provider, first that is set wins: env `SUMMON_SUBAGENT_PROVIDER` (else goose's `GOOSE_SUBAGENT_PROVIDER`) → `--provider` → recipe
//! `settings.goose_provider`/`provider` → env `SUMMON_PROVIDER` → config `default_provider`
//! (project file over global) → auto-detection: `OPENAI_API_KEY` → `openai`;
//! `ANTHROPIC_API_KEY` → `anthropic`; `OPENAI_BASE_URL` (a keyless compatible server) →
//! `openai`; a local Ollama that answers → `ollama`; else one error listing the ways to
//! configure a provider.
//!
//! Model: env `SUMMON_SUBAGENT_MODEL` (else `GOOSE_SUBAGENT_MODEL`) → `--model` → recipe settings model (an agent's
//! frontmatter `model`) → env `SUMMON_MODEL` → config `default_model` → the provider's
//! `default_model` → an error naming `SUMMON_MODEL` and `SUMMON_SUBAGENT_MODEL`. Each name goes
//! through the provider's aliases; `inherit` means "no override" and a Claude alias (`sonnet`,
//! `opus`, `haiku`) the provider cannot map is never sent literally: that level is skipped with
//! a warning.
//!
//! Everything but the Ollama probe is synchronous ([`resolve_with`] takes the probe as a
//! closure); [`resolve`] runs the real probe only when auto-detection gets that far.

use std::fmt;
use std::path::PathBuf;

use super::file::{self, Config};
use super::presets::{self, CLAUDE_ALIASES, ProviderDef};
use super::probe;
use crate::diag::Diagnostic;
use crate::diag::suggestions;
use crate::env::Env;
use crate::provider::{ProviderEndpoint, RateLimits, Secret};

/// Where a setting came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Origin {
    /// An environment variable, by name.
    Env(String),
    /// A command-line flag.
    Flag,
    /// The recipe or agent being run (`"recipe settings"`, ``"agent `x`"``).
    Recipe(String),
    /// A config file.
    ConfigFile(PathBuf),
    /// A built-in preset or default.
    Preset,
    /// Auto-detection, with the reason (`"OPENAI_API_KEY is set"`).
    AutoDetected(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Env(var) => write!(f, "environment variable {var}"),
            Self::Flag => f.write_str("command-line flag"),
            Self::Recipe(what) => f.write_str(what),
            Self::ConfigFile(path) => write!(f, "config file {}", path.display()),
            Self::Preset => f.write_str("built-in default"),
            Self::AutoDetected(why) => write!(f, "auto-detected: {why}"),
        }
    }
}

impl Origin {
    /// A short "where from" for messages; `flag` names the flag (`--model`).
    fn source(&self, flag: &str) -> String {
        match self {
            Self::Env(var) => var.clone(),
            Self::Flag => flag.to_owned(),
            other => other.to_string(),
        }
    }
}

/// What the command line and the recipe ask for.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Overrides<'a> {
    pub(crate) provider_flag: Option<&'a str>,
    pub(crate) model_flag: Option<&'a str>,
    /// `settings.goose_provider` / `settings.provider`.
    pub(crate) recipe_provider: Option<&'a str>,
    /// `settings.goose_model` / `settings.model`, or an agent's frontmatter `model`.
    pub(crate) recipe_model: Option<&'a str>,
    /// What the recipe values came from, for messages: `"recipe settings"`, ``"agent `x`"``.
    pub(crate) recipe_origin: &'a str,
}

impl Overrides<'_> {
    fn recipe_origin(&self) -> Origin {
        let what = if self.recipe_origin.is_empty() {
            "recipe settings"
        } else {
            self.recipe_origin
        };
        Origin::Recipe(what.to_owned())
    }
}

/// The provider and model a run uses.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub(crate) provider_name: String,
    /// Ready for [`crate::provider::Client::new`], key included when there is one.
    pub(crate) endpoint: ProviderEndpoint,
    /// The model id sent to the provider (aliases resolved).
    pub(crate) model: String,
    pub(crate) limits: RateLimits,
    pub(crate) provider_origin: Origin,
    pub(crate) model_origin: Origin,
    /// The name that was looked up in the aliases to give [`Self::model`], if any.
    pub(crate) model_alias: Option<String>,
    /// The provider's definition (where its base URL and key variable came from).
    pub(crate) provider: ProviderDef,
    /// Levels skipped because a Claude alias had no mapping for this provider.
    pub(crate) warnings: Vec<Diagnostic>,
}

/// The chosen provider name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProviderChoice {
    pub(crate) name: String,
    pub(crate) origin: Origin,
}

/// The chosen model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ModelChoice {
    /// The id sent to the provider.
    pub(crate) model: String,
    pub(crate) origin: Origin,
    /// The alias it was resolved from.
    pub(crate) alias: Option<String>,
}

/// Resolves provider, model and key, probing a local Ollama if auto-detection gets that far.
pub(crate) async fn resolve(
    env: &Env,
    config: &Config,
    overrides: &Overrides<'_>,
) -> Result<Resolved, Diagnostic> {
    let mut wanted: Option<String> = None;
    let first = resolve_with(env, config, overrides, |root| {
        wanted = Some(root.to_owned());
        false
    });
    let result = match wanted {
        Some(root) if probe::ollama_answers(&root).await => {
            resolve_with(env, config, overrides, |_| true)
        }
        _ => first,
    };
    match result {
        Err(diagnostic) if diagnostic.message.starts_with(NO_MODEL) => {
            Err(with_offered_models(env, config, overrides, diagnostic).await)
        }
        Ok(resolved) if presets::is_builtin_local(&resolved.provider) => {
            start_local(env, config, resolved)
        }
        other => other,
    }
}

/// The resolution of the built-in local model with the endpoint it answers at, once it is
/// started (downloaded first if need be). Chosen because nothing else was configured, it says
/// so in one line; when it cannot start then, the error lists the ways to configure a
/// provider, with why the built-in one failed.
fn start_local(env: &Env, config: &Config, mut resolved: Resolved) -> Result<Resolved, Diagnostic> {
    let fallback = match &resolved.provider_origin {
        Origin::AutoDetected(why) => Some(why.clone()),
        _ => None,
    };
    match crate::local::base_url(env) {
        Ok(url) => {
            if let Some(why) = fallback {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    eprintln!(
                        "summon: {why}: using the built-in local model {} (to use another \
                         provider, see `summon doctor` or docs/providers.md)",
                        resolved.model
                    );
                });
            }
            resolved.provider.base_url = url;
            resolved.endpoint = endpoint(env, &resolved.provider)?;
            Ok(resolved)
        }
        Err(e) if fallback.is_some() => Err(nothing_configured(
            env,
            config,
            &ollama_root(env, config),
            Some(&e),
        )),
        Err(e) => Err(Diagnostic::error(format!(
            "the built-in local model (provider `local`, from {}) cannot start: {e}",
            resolved.provider_origin.source("--provider")
        ))
        .with_hint(format!(
            "set {} to a GGUF file or one of: {}; or choose another provider",
            crate::local::model::MODEL_VAR,
            crate::local::model::known_names()
        ))),
    }
}

/// The start of the error for a provider without a model.
const NO_MODEL: &str = "no model configured for provider";

/// The "no model" error with the models the provider offers, when it lists them within a few
/// seconds (a guess costs the user a round trip; a list does not).
async fn with_offered_models(
    env: &Env,
    config: &Config,
    overrides: &Overrides<'_>,
    diagnostic: Diagnostic,
) -> Diagnostic {
    const SHOWN: usize = 12;
    let Ok(choice) = choose_provider(env, config, overrides, |_| true) else {
        return diagnostic;
    };
    let Ok(def) = provider_def(env, config, &choice) else {
        return diagnostic;
    };
    let Ok(endpoint) = endpoint(env, &def) else {
        return diagnostic;
    };
    let Ok(client) = crate::provider::Client::new(endpoint) else {
        return diagnostic;
    };
    let listed =
        tokio::time::timeout(std::time::Duration::from_secs(3), client.list_models()).await;
    match listed {
        Ok(Ok(models)) if !models.is_empty() => {
            let mut names: Vec<&str> = models.iter().map(String::as_str).take(SHOWN).collect();
            if models.len() > SHOWN {
                names.push("...");
            }
            let hint = format!(
                "provider `{}` offers: {} (e.g. SUMMON_MODEL={})",
                def.name,
                names.join(", "),
                models[0]
            );
            let hint = match &diagnostic.hint {
                Some(existing) => format!("{existing}\n{hint}"),
                None => hint,
            };
            diagnostic.with_hint(hint)
        }
        _ => diagnostic,
    }
}

/// [`resolve`] without I/O: `probe(root)` tells whether an Ollama answers at `root` (its URL
/// without `/v1`); it is called only when auto-detection reaches Ollama.
pub(crate) fn resolve_with(
    env: &Env,
    config: &Config,
    overrides: &Overrides<'_>,
    probe: impl FnMut(&str) -> bool,
) -> Result<Resolved, Diagnostic> {
    let choice = choose_provider(env, config, overrides, probe)?;
    let def = provider_def(env, config, &choice)?;
    if let Some(span) = &def.project_routing
        && !config.trust.is_trusted()
    {
        return Err(untrusted_provider(&def, span, &config.trust));
    }
    let mut warnings = Vec::new();
    let model = choose_model(env, config, overrides, &def, &mut warnings)?;
    let endpoint = endpoint(env, &def)?;
    Ok(Resolved {
        provider_name: choice.name,
        endpoint,
        model: model.model,
        limits: def.limits,
        provider_origin: choice.origin,
        model_origin: model.origin,
        model_alias: model.alias,
        provider: def,
        warnings,
    })
}

/// A provider whose destination or key the project's own `summon.yaml` decides, in a project
/// that is not trusted: named with the host and the variable it would send there.
fn untrusted_provider(
    def: &ProviderDef,
    span: &crate::diag::Span,
    trust: &super::trust::Trust,
) -> Diagnostic {
    let host = reqwest::Url::parse(&def.base_url)
        .ok()
        .and_then(|u| {
            u.host_str().map(|h| {
                u.port()
                    .map_or_else(|| h.to_owned(), |p| format!("{h}:{p}"))
            })
        })
        .unwrap_or_else(|| def.base_url.clone());
    let what = match &def.api_key_env {
        Some(var) => format!("would send the key in {var} to {host}"),
        None => format!("would send your prompts to {host}"),
    };
    Diagnostic::error(format!(
        "provider `{}` of this project's summon.yaml {what}, and this project is not trusted",
        def.name
    ))
    .at(span.clone())
    .with_hint(trust.how_to_trust())
}

/// A value that counts as set: trimmed, non-empty.
fn set(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

/// Picks the provider name in the documented order.
pub(crate) fn choose_provider(
    env: &Env,
    config: &Config,
    overrides: &Overrides<'_>,
    mut probe: impl FnMut(&str) -> bool,
) -> Result<ProviderChoice, Diagnostic> {
    let subagent = env.var_or_goose("SUMMON_SUBAGENT_PROVIDER");
    let explicit = [
        (
            subagent.map(|(value, _)| value),
            Origin::Env(
                subagent
                    .map_or("SUMMON_SUBAGENT_PROVIDER", |(_, var)| var)
                    .into(),
            ),
        ),
        (overrides.provider_flag, Origin::Flag),
        (overrides.recipe_provider, overrides.recipe_origin()),
        (
            env.var("SUMMON_PROVIDER"),
            Origin::Env("SUMMON_PROVIDER".into()),
        ),
        (
            config.default_provider.as_ref().map(|d| d.value.as_str()),
            config
                .default_provider
                .as_ref()
                .map_or(Origin::Preset, |d| {
                    Origin::ConfigFile(d.path().to_path_buf())
                }),
        ),
    ];
    for (value, origin) in explicit {
        if let Some(name) = set(value) {
            return Ok(ProviderChoice {
                name: name.to_owned(),
                origin,
            });
        }
    }
    let detected = |name: &str, why: String| ProviderChoice {
        name: name.to_owned(),
        origin: Origin::AutoDetected(why),
    };
    for (var, name) in [
        ("OPENAI_API_KEY", "openai"),
        ("ANTHROPIC_API_KEY", "anthropic"),
        ("OPENAI_BASE_URL", "openai"),
    ] {
        if env.var(var).is_some() {
            return Ok(detected(name, format!("{var} is set")));
        }
    }
    let root = ollama_root(env, config);
    if probe(&root) {
        return Ok(detected(
            "ollama",
            format!("a local Ollama answered at {root}"),
        ));
    }
    // Configured providers without a default get the error's hint instead.
    if cfg!(feature = "local") && config.providers.is_empty() {
        return Ok(detected(
            crate::local::PROVIDER,
            format!("no provider is configured and no local Ollama answered at {root}"),
        ));
    }
    Err(nothing_configured(env, config, &root, None))
}

/// The root URL (without `/v1`) of the `ollama` provider, config entry included.
fn ollama_root(env: &Env, config: &Config) -> String {
    presets::lookup("ollama", env, config).map_or_else(
        || presets::ollama_root(env).0,
        |def| {
            let base = def.base_url.trim_end_matches('/');
            base.strip_suffix("/v1").unwrap_or(base).to_owned()
        },
    )
}

fn config_path_text(env: &Env) -> String {
    file::global_path(env).map_or_else(
        || "~/.config/summon/config.yaml".to_owned(),
        |p| p.display().to_string(),
    )
}

/// The error for no usable provider; `local_failed`: why the built-in local model, tried
/// last, could not start.
fn nothing_configured(
    env: &Env,
    config: &Config,
    ollama_root: &str,
    local_failed: Option<&str>,
) -> Diagnostic {
    let local = match local_failed {
        Some(why) => format!("the built-in local model could not start: {why}"),
        None if cfg!(feature = "local") => "set SUMMON_PROVIDER=local".to_owned(),
        None => "install summon with `--features local`, then set SUMMON_PROVIDER=local".to_owned(),
    };
    let mut diagnostic = Diagnostic::error(format!(
        "no LLM provider is configured, and no local Ollama answered at {ollama_root}; \
         configure one of:\n\
         \x20 - OpenAI: set OPENAI_API_KEY (for an OpenAI-compatible server such as vLLM, \
         llama.cpp or LM Studio, set OPENAI_BASE_URL, e.g. http://localhost:8000/v1)\n\
         \x20 - Anthropic: set ANTHROPIC_API_KEY\n\
         \x20 - Ollama: start it (`ollama serve`), or set SUMMON_PROVIDER=ollama and \
         OLLAMA_HOST=HOST:PORT\n\
         \x20 - a config file at {} (or summon.yaml in the working directory) with \
         `providers:` and `default_provider:`\n\
         \x20 - {}\n\
         \x20 - the built-in local model: {local}",
        config_path_text(env),
        credentials_text(env),
    ));
    if let Some(first) = config.providers.keys().next() {
        let names: Vec<&str> = config.providers.keys().map(String::as_str).collect();
        diagnostic = diagnostic.with_hint(format!(
            "the config defines provider(s) {} but no `default_provider`; add \
             `default_provider: {first}` or set SUMMON_PROVIDER={first}",
            names.join(", ")
        ));
    }
    diagnostic
}

/// The definition of the chosen provider, or an error listing the known names.
pub(crate) fn provider_def(
    env: &Env,
    config: &Config,
    choice: &ProviderChoice,
) -> Result<ProviderDef, Diagnostic> {
    if let Some(def) = presets::lookup(&choice.name, env, config) {
        return Ok(def);
    }
    let known = presets::known_names(config);
    let mut diagnostic = Diagnostic::error(format!(
        "unknown provider `{}` (from {}); known providers: {}",
        choice.name,
        choice.origin.source("--provider"),
        known.join(", ")
    ));
    if let (Origin::ConfigFile(_), Some(value)) = (&choice.origin, &config.default_provider) {
        diagnostic = diagnostic.at(value.span());
    }
    let close = suggestions(&choice.name, known.iter().copied());
    let config_path = match &choice.origin {
        Origin::ConfigFile(path) => path.display().to_string(),
        _ => config_path_text(env),
    };
    let hint = match close.as_slice() {
        [] => format!("define it under `providers:` in {config_path}"),
        names => format!(
            "did you mean {}? Other providers are defined under `providers:` in {config_path}",
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(" or "),
        ),
    };
    Err(diagnostic.with_hint(hint))
}

/// Whether `name` is one of Claude Code's model aliases (or `inherit`), which must never be
/// sent to a provider literally.
fn is_claude_alias(name: &str) -> bool {
    name == "inherit" || CLAUDE_ALIASES.iter().any(|(alias, _)| *alias == name)
}

/// Picks the model in the documented order, through the provider's aliases. Skipped levels
/// add warnings.
pub(crate) fn choose_model(
    env: &Env,
    config: &Config,
    overrides: &Overrides<'_>,
    def: &ProviderDef,
    warnings: &mut Vec<Diagnostic>,
) -> Result<ModelChoice, Diagnostic> {
    let subagent = env.var_or_goose("SUMMON_SUBAGENT_MODEL");
    let levels = [
        (
            subagent.map(|(value, _)| value),
            Origin::Env(
                subagent
                    .map_or("SUMMON_SUBAGENT_MODEL", |(_, var)| var)
                    .into(),
            ),
        ),
        (overrides.model_flag, Origin::Flag),
        (overrides.recipe_model, overrides.recipe_origin()),
        (env.var("SUMMON_MODEL"), Origin::Env("SUMMON_MODEL".into())),
        (
            config.default_model.as_ref().map(|m| m.value.as_str()),
            config.default_model.as_ref().map_or(Origin::Preset, |m| {
                Origin::ConfigFile(m.path().to_path_buf())
            }),
        ),
        (
            def.default_model.as_ref().map(|(m, _)| m.as_str()),
            def.default_model
                .as_ref()
                .map_or(Origin::Preset, |(_, origin)| origin.clone()),
        ),
    ];
    let mut skipped = Vec::new();
    for (value, origin) in levels {
        let Some(name) = set(value) else { continue };
        if let Some(model) = def.aliases.get(name) {
            return Ok(ModelChoice {
                model: model.clone(),
                origin,
                alias: Some(name.to_owned()),
            });
        }
        if name == "inherit" {
            continue;
        }
        if is_claude_alias(name) {
            let from = origin.source("--model");
            warnings.push(Diagnostic::warning(format!(
                "model `{name}` (from {from}) has no alias for provider `{provider}`; add one \
                 under providers.{provider}.aliases",
                provider = def.name
            )));
            skipped.push(format!("`{name}` (from {from})"));
            continue;
        }
        return Ok(ModelChoice {
            model: name.to_owned(),
            origin,
            alias: None,
        });
    }
    let mut diagnostic = Diagnostic::error(format!(
        "{NO_MODEL} `{}`; set SUMMON_MODEL (or SUMMON_SUBAGENT_MODEL for \
         subagents only), pass --model, or set default_model in {}",
        def.name,
        config_path_text(env)
    ));
    if !skipped.is_empty() {
        diagnostic = diagnostic.with_hint(format!(
            "skipped {}: provider `{}` has no alias for it; add one under providers.{}.aliases",
            skipped.join(", "),
            def.name,
            def.name
        ));
    }
    Err(diagnostic)
}

/// The endpoint of a provider, with its key read from the environment.
pub(crate) fn endpoint(env: &Env, def: &ProviderDef) -> Result<ProviderEndpoint, Diagnostic> {
    let valid_url = reqwest::Url::parse(&def.base_url)
        .ok()
        .is_some_and(|u| matches!(u.scheme(), "http" | "https") && u.has_host());
    if !valid_url {
        return Err(Diagnostic::error(format!(
            "the base URL of provider `{}` (from {}) is not an http:// or https:// URL",
            def.name,
            def.base_url_origin.source("--provider")
        )));
    }
    let mut endpoint = ProviderEndpoint::new(&def.name, def.kind, &def.base_url);
    endpoint.local = def.local;
    if let Some(format) = def.structured_output {
        endpoint.structured_output = format;
    }
    if let Some(timeout) = def.request_timeout {
        endpoint.request_timeout = timeout;
    }
    if let Some(timeout) = def.connect_timeout {
        endpoint.connect_timeout = timeout;
    }
    match &def.api_key_env {
        Some(var) => match env.var(var).map(str::trim).filter(|k| !k.is_empty()) {
            Some(key) => endpoint = endpoint.with_api_key(Secret::new(key), Some(var)),
            None if def.key_required => return Err(missing_key(env, def, var)),
            // Named anyway, so a 401 from the server says which variable to set.
            None => endpoint.api_key_env = Some(var.clone()),
        },
        None if def.key_required => {
            return Err(Diagnostic::error(format!(
                "provider `{}` needs an API key; name the environment variable that holds it \
                 with `api_key_env` under providers.{} in {}",
                def.name,
                def.name,
                config_path_text(env)
            )));
        }
        None => {}
    }
    Ok(endpoint)
}

/// Where the keys may also live, for a process started with a bare environment (an MCP
/// host's), and why the credentials file was not read when it was not.
fn credentials_text(env: &Env) -> String {
    let path = env.credentials_path().map_or_else(
        || "~/.local/state/summon/credentials".to_owned(),
        |p| p.display().to_string(),
    );
    let mut text = format!(
        "a key kept for processes started with a bare environment (MCP hosts start \
         `summon mcp` with little more than PATH and HOME): a line such as \
         `OPENAI_API_KEY=sk-...` in {path} (mode 0600), read when the environment lacks \
         the variable"
    );
    if let Some(problem) = env.credentials.as_ref().and_then(|c| c.problem.as_deref()) {
        text.push_str(" (that file was not used: ");
        text.push_str(problem);
        text.push(')');
    }
    text
}

fn missing_key(env: &Env, def: &ProviderDef, var: &str) -> Diagnostic {
    let mut message = format!(
        "provider `{}` needs an API key, but {var} is not set",
        def.name
    );
    if let Some(problem) = env.credentials.as_ref().and_then(|c| c.problem.as_deref()) {
        message.push_str(" (the credentials file was not used: ");
        message.push_str(problem);
        message.push(')');
    }
    let hint = match (&def.origin, def.name.as_str()) {
        (Origin::Preset, "openai") => format!(
            "export {var}=...; for a local OpenAI-compatible server set OPENAI_BASE_URL (e.g. \
             http://localhost:8000/v1) instead"
        ),
        (Origin::ConfigFile(path), _) => format!(
            "export {var}=...; if the server needs no key, remove `api_key_env` from \
             providers.{} in {}",
            def.name,
            path.display()
        ),
        _ => format!("export {var}=..."),
    };
    let file = env.credentials_path().map_or_else(
        || "~/.local/state/summon/credentials".to_owned(),
        |p| p.display().to_string(),
    );
    Diagnostic::error(message).with_hint(format!(
        "{hint}; or write the line `{var}=...` in {file} (mode 0600), which summon reads when \
         its environment lacks {var}, as when an MCP host starts `summon mcp` with a bare \
         environment"
    ))
}

/// `SUMMON_SUBAGENT_MAX_TURNS` (or goose's `GOOSE_SUBAGENT_MAX_TURNS`): a whole number ≥ 1,
/// or unset.
pub(crate) fn env_max_turns(env: &Env) -> Result<Option<u32>, Diagnostic> {
    let Some((raw, var)) = env.var_or_goose("SUMMON_SUBAGENT_MAX_TURNS") else {
        return Ok(None);
    };
    let Some(raw) = set(Some(raw)) else {
        return Ok(None);
    };
    match raw.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(Some(n)),
        _ => Err(Diagnostic::error(format!(
            "{var} must be a whole number ≥ 1, found `{raw}`"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::{Diagnostics, SourceFile};
    use crate::provider::ProviderKind;
    use std::cell::Cell;
    use std::path::Path;

    const CONFIG_PATH: &str = "/w/summon.yaml";
    const SECRET: &str = "sk-test-SECRETabcdefghijklmnop0123";

    fn env(vars: &[(&str, &str)]) -> Env {
        let mut all = vec![("HOME", "/home/u")];
        all.extend_from_slice(vars);
        Env::for_test("/w", &all)
    }

    fn config(text: &str) -> Config {
        let mut diags = Diagnostics::default();
        let config = Config::parse(&SourceFile::new(CONFIG_PATH, text), &mut diags);
        assert!(diags.items.is_empty(), "{:?}", diags.items);
        config
    }

    fn from_config() -> Origin {
        Origin::ConfigFile(PathBuf::from(CONFIG_PATH))
    }

    fn env_origin(var: &str) -> Origin {
        Origin::Env(var.to_owned())
    }

    fn agent() -> Origin {
        Origin::Recipe("agent `x`".into())
    }

    fn overrides<'a>(
        provider_flag: Option<&'a str>,
        model_flag: Option<&'a str>,
        recipe_provider: Option<&'a str>,
        recipe_model: Option<&'a str>,
    ) -> Overrides<'a> {
        Overrides {
            provider_flag,
            model_flag,
            recipe_provider,
            recipe_model,
            recipe_origin: "agent `x`",
        }
    }

    const TWO_LOCALS: &str = "default_provider: local\n\
                              providers:\n\
                             \x20 local: { kind: openai, base_url: http://localhost:8000/v1 }\n\
                             \x20 other: { kind: openai, base_url: http://localhost:8001/v1 }\n";

    #[test]
    fn provider_order_each_level_beats_the_next() {
        struct Case {
            vars: &'static [(&'static str, &'static str)],
            flag: Option<&'static str>,
            recipe: Option<&'static str>,
            config: &'static str,
            ollama: bool,
            name: &'static str,
            origin: Origin,
        }
        let all_env: &[(&str, &str)] = &[
            ("SUMMON_SUBAGENT_PROVIDER", "ollama"),
            ("SUMMON_PROVIDER", "openai"),
            ("OPENAI_API_KEY", SECRET),
            ("ANTHROPIC_API_KEY", SECRET),
        ];
        let cases = [
            Case {
                vars: all_env,
                flag: Some("other"),
                recipe: Some("anthropic"),
                config: TWO_LOCALS,
                ollama: true,
                name: "ollama",
                origin: env_origin("SUMMON_SUBAGENT_PROVIDER"),
            },
            Case {
                vars: &all_env[1..],
                flag: Some("other"),
                recipe: Some("ollama"),
                config: TWO_LOCALS,
                ollama: true,
                name: "other",
                origin: Origin::Flag,
            },
            Case {
                vars: &[("SUMMON_PROVIDER", "other")],
                flag: None,
                recipe: Some("ollama"),
                config: TWO_LOCALS,
                ollama: true,
                name: "ollama",
                origin: agent(),
            },
            Case {
                vars: &[("SUMMON_PROVIDER", "other"), ("OPENAI_API_KEY", SECRET)],
                flag: None,
                recipe: None,
                config: TWO_LOCALS,
                ollama: true,
                name: "other",
                origin: env_origin("SUMMON_PROVIDER"),
            },
            Case {
                vars: &all_env[2..],
                flag: None,
                recipe: Some("  "),
                config: TWO_LOCALS,
                ollama: true,
                name: "local",
                origin: from_config(),
            },
            Case {
                vars: &all_env[2..],
                flag: None,
                recipe: None,
                config: "",
                ollama: true,
                name: "openai",
                origin: Origin::AutoDetected("OPENAI_API_KEY is set".into()),
            },
            Case {
                vars: &[
                    ("ANTHROPIC_API_KEY", SECRET),
                    ("OPENAI_BASE_URL", "http://localhost:8000/v1"),
                ],
                flag: None,
                recipe: None,
                config: "",
                ollama: true,
                name: "anthropic",
                origin: Origin::AutoDetected("ANTHROPIC_API_KEY is set".into()),
            },
            Case {
                vars: &[("OPENAI_BASE_URL", "http://localhost:8000/v1")],
                flag: None,
                recipe: None,
                config: "",
                ollama: true,
                name: "openai",
                origin: Origin::AutoDetected("OPENAI_BASE_URL is set".into()),
            },
            Case {
                vars: &[],
                flag: None,
                recipe: None,
                config: "",
                ollama: true,
                name: "ollama",
                origin: Origin::AutoDetected(
                    "a local Ollama answered at http://localhost:11434".into(),
                ),
            },
        ];
        for (i, case) in cases.iter().enumerate() {
            let probes = Cell::new(0);
            let result = resolve_with(
                &env(case.vars),
                &config(case.config),
                &overrides(case.flag, Some("m"), case.recipe, None),
                |root| {
                    assert_eq!(root, "http://localhost:11434");
                    probes.set(probes.get() + 1);
                    case.ollama
                },
            );
            let resolved = result.unwrap_or_else(|e| panic!("case {i}: {}", e.message));
            assert_eq!(
                (resolved.provider_name.as_str(), &resolved.provider_origin),
                (case.name, &case.origin),
                "case {i}"
            );
            assert_eq!(resolved.endpoint.name, case.name, "case {i}");
            let expected_probes = usize::from(
                matches!(case.origin, Origin::AutoDetected(ref w) if w.contains("Ollama")),
            );
            assert_eq!(
                probes.get(),
                expected_probes,
                "case {i}: probe only when reached"
            );
        }
    }

    #[test]
    #[cfg(feature = "local")]
    fn with_nothing_configured_the_built_in_model_is_chosen() {
        let e = env(&[("OLLAMA_HOST", "127.0.0.1:9")]);
        let r = resolve_with(&e, &Config::default(), &Overrides::default(), |_| false)
            .expect("the built-in model");
        assert_eq!(r.provider_name, "local");
        assert_eq!(
            r.provider_origin,
            Origin::AutoDetected(
                "no provider is configured and no local Ollama answered at http://127.0.0.1:9"
                    .into()
            )
        );
        assert_eq!(r.model, "smollm2-135m-instruct");
        assert!(presets::is_builtin_local(&r.provider));
    }

    #[test]
    fn a_built_in_model_that_cannot_start_is_listed_with_the_reason() {
        let e = env(&[]);
        let err = nothing_configured(&e, &Config::default(), "http://h:1", Some("no file"));
        assert!(
            err.message.starts_with(
                "no LLM provider is configured, and no local Ollama answered at http://h:1"
            ),
            "{}",
            err.message
        );
        assert!(
            err.message.ends_with(
                "\n  - the built-in local model: the built-in local model could not start: no file"
            ),
            "{}",
            err.message
        );
    }

    #[test]
    #[cfg(not(feature = "local"))]
    fn nothing_configured_lists_the_ways() {
        let e = env(&[("OLLAMA_HOST", "127.0.0.1:9")]);
        let err = resolve_with(&e, &Config::default(), &Overrides::default(), |root| {
            assert_eq!(root, "http://127.0.0.1:9");
            false
        })
        .expect_err("nothing configured");
        for needle in [
            "no local Ollama answered at http://127.0.0.1:9",
            "OPENAI_API_KEY",
            "OPENAI_BASE_URL",
            "ANTHROPIC_API_KEY",
            "SUMMON_PROVIDER=ollama",
            "OLLAMA_HOST",
            "/home/u/.config/summon/config.yaml",
        ] {
            assert!(err.message.contains(needle), "{needle}: {}", err.message);
        }
        assert_eq!(err.hint, None);

        // Providers but no default: the hint says how to pick one.
        let err = resolve_with(
            &e,
            &config("providers:\n  work: { kind: openai }\n"),
            &Overrides::default(),
            |_| false,
        )
        .expect_err("no default provider");
        assert!(
            err.hint
                .as_deref()
                .is_some_and(|h| h.contains("default_provider: work")),
            "{err:?}"
        );
    }

    #[test]
    fn unknown_provider_suggests_close_names() {
        let cfg = config(TWO_LOCALS);
        let err = resolve_with(
            &env(&[]),
            &cfg,
            &overrides(Some("opnai"), Some("m"), None, None),
            |_| false,
        )
        .expect_err("unknown");
        assert_eq!(
            err.message,
            "unknown provider `opnai` (from --provider); known providers: openai, anthropic, \
             ollama, local, other"
        );
        assert!(
            err.hint
                .as_deref()
                .is_some_and(|h| h.starts_with("did you mean `openai`?"))
        );

        let err = resolve_with(
            &env(&[]),
            &config("default_provider: wrok\nproviders:\n  work: { kind: openai }\n"),
            &Overrides::default(),
            |_| false,
        )
        .expect_err("unknown default");
        let span = err.span.as_ref().expect("points at default_provider");
        assert_eq!((span.pos.line, span.pos.col), (1, 19));
        assert!(err.hint.as_deref().is_some_and(|h| h.contains("`work`")));
    }

    #[test]
    fn model_order_each_level_beats_the_next() {
        let cfg = config(
            "default_model: cfg-model\n\
             providers:\n\
            \x20 local: { kind: openai, base_url: http://localhost:8000/v1, default_model: prov-model }\n",
        );
        let no_default = config(
            "providers:\n\
            \x20 local: { kind: openai, base_url: http://localhost:8000/v1, default_model: prov-model }\n",
        );
        let all_env: &[(&str, &str)] = &[
            ("SUMMON_SUBAGENT_MODEL", "a"),
            ("SUMMON_MODEL", "d"),
            ("SUMMON_PROVIDER", "local"),
        ];
        /// Env, --model, recipe model, config → expected model and origin.
        type Case<'a> = (
            &'a [(&'a str, &'a str)],
            Option<&'a str>,
            Option<&'a str>,
            &'a Config,
            &'a str,
            Origin,
        );
        let cases: [Case<'_>; 6] = [
            (
                all_env,
                Some("b"),
                Some("c"),
                &cfg,
                "a",
                env_origin("SUMMON_SUBAGENT_MODEL"),
            ),
            (&all_env[1..], Some("b"), Some("c"), &cfg, "b", Origin::Flag),
            (&all_env[1..], None, Some("c"), &cfg, "c", agent()),
            (
                &all_env[1..],
                None,
                None,
                &cfg,
                "d",
                env_origin("SUMMON_MODEL"),
            ),
            (
                &all_env[2..],
                None,
                Some(""),
                &cfg,
                "cfg-model",
                from_config(),
            ),
            (
                &all_env[2..],
                None,
                None,
                &no_default,
                "prov-model",
                from_config(),
            ),
        ];
        for (i, (vars, flag, recipe, cfg, model, origin)) in cases.into_iter().enumerate() {
            let resolved = resolve_with(
                &env(vars),
                cfg,
                &overrides(None, flag, None, recipe),
                |_| false,
            )
            .unwrap_or_else(|e| panic!("case {i}: {}", e.message));
            assert_eq!(
                (resolved.model.as_str(), &resolved.model_origin),
                (model, &origin),
                "case {i}"
            );
            assert!(resolved.warnings.is_empty());
        }

        let err = resolve_with(
            &env(&[("SUMMON_PROVIDER", "ollama")]),
            &Config::default(),
            &Overrides::default(),
            |_| false,
        )
        .expect_err("no model");
        assert_eq!(
            err.message,
            "no model configured for provider `ollama`; set SUMMON_MODEL (or \
             SUMMON_SUBAGENT_MODEL for subagents only), pass --model, or set default_model in \
             /home/u/.config/summon/config.yaml"
        );
    }

    #[test]
    fn aliases_and_inherit() {
        let anthropic = env(&[
            ("SUMMON_PROVIDER", "anthropic"),
            ("ANTHROPIC_API_KEY", SECRET),
        ]);
        let openai = env(&[("OPENAI_API_KEY", SECRET)]);
        let openai_with_fallback = env(&[("OPENAI_API_KEY", SECRET), ("SUMMON_MODEL", "gpt-4o")]);
        let aliased = config(
            "providers:\n  openai:\n    aliases: { sonnet: gpt-4o, inherit: gpt-4o-mini }\n",
        );

        // sonnet on anthropic: built-in alias.
        let r = resolve_with(
            &anthropic,
            &Config::default(),
            &overrides(None, None, None, Some("sonnet")),
            |_| false,
        )
        .expect("resolves");
        assert_eq!(
            (r.model.as_str(), r.model_alias.as_deref()),
            ("claude-sonnet-4-5", Some("sonnet"))
        );
        assert_eq!(r.model_origin, agent());
        assert_eq!(r.endpoint.kind, ProviderKind::Anthropic);

        // sonnet on openai without an alias: skipped with a warning, the next level wins.
        let r = resolve_with(
            &openai_with_fallback,
            &Config::default(),
            &overrides(None, None, None, Some("sonnet")),
            |_| false,
        )
        .expect("resolves");
        assert_eq!(
            (r.model.as_str(), &r.model_origin),
            ("gpt-4o", &env_origin("SUMMON_MODEL"))
        );
        assert_eq!(r.warnings.len(), 1);
        assert_eq!(
            r.warnings[0].message,
            "model `sonnet` (from agent `x`) has no alias for provider `openai`; add one under \
             providers.openai.aliases"
        );

        // ... and with nothing below it: the model error says what was skipped.
        let err = resolve_with(
            &openai,
            &Config::default(),
            &overrides(None, Some("opus"), None, None),
            |_| false,
        )
        .expect_err("skipped");
        assert!(
            err.message
                .starts_with("no model configured for provider `openai`")
        );
        assert!(
            err.hint
                .as_deref()
                .is_some_and(|h| h.contains("`opus` (from --model)")),
            "{err:?}"
        );

        // A configured alias on openai.
        let r = resolve_with(
            &openai,
            &aliased,
            &overrides(None, None, None, Some("sonnet")),
            |_| false,
        )
        .expect("resolves");
        assert_eq!(
            (r.model.as_str(), r.model_alias.as_deref()),
            ("gpt-4o", Some("sonnet"))
        );

        // inherit: no override, silently.
        let r = resolve_with(
            &openai_with_fallback,
            &Config::default(),
            &overrides(None, None, None, Some("inherit")),
            |_| false,
        )
        .expect("resolves");
        assert_eq!(r.model, "gpt-4o");
        assert!(r.warnings.is_empty());
        // ... unless the provider maps it.
        let r = resolve_with(
            &openai_with_fallback,
            &aliased,
            &overrides(None, None, None, Some("inherit")),
            |_| false,
        )
        .expect("resolves");
        assert_eq!(r.model, "gpt-4o-mini");

        // Plain names pass through; aliases apply at every level.
        let r = resolve_with(
            &anthropic,
            &Config::default(),
            &overrides(None, Some("haiku"), None, Some("x")),
            |_| false,
        )
        .expect("resolves");
        assert_eq!(
            (r.model.as_str(), &r.model_origin),
            ("claude-haiku-4-5", &Origin::Flag)
        );
    }

    #[test]
    fn api_keys() {
        // Present: on the endpoint, with its variable.
        let r = resolve_with(
            &env(&[("OPENAI_API_KEY", SECRET)]),
            &Config::default(),
            &overrides(None, Some("m"), None, None),
            |_| false,
        )
        .expect("resolves");
        assert_eq!(
            r.endpoint.api_key.as_ref().map(Secret::expose),
            Some(SECRET)
        );
        assert_eq!(r.endpoint.api_key_env.as_deref(), Some("OPENAI_API_KEY"));
        assert_eq!(r.endpoint.base_url, "https://api.openai.com/v1");
        assert!(
            !format!("{r:?}").contains(SECRET),
            "Debug never shows the key"
        );

        // Missing where required: the error names the variable and holds no key.
        for (vars, provider, var) in [
            (&[("ANTHROPIC_API_KEY", "")][..], "openai", "OPENAI_API_KEY"),
            (
                &[("OPENAI_API_KEY", SECRET)][..],
                "anthropic",
                "ANTHROPIC_API_KEY",
            ),
            (&[("OPENAI_API_KEY", SECRET)][..], "keyed", "MY_KEY"),
        ] {
            let cfg = config(
                "providers:\n  keyed: { kind: openai, base_url: http://h/v1, api_key_env: MY_KEY }\n",
            );
            let err = resolve_with(
                &env(vars),
                &cfg,
                &overrides(Some(provider), Some("m"), None, None),
                |_| false,
            )
            .expect_err("missing key");
            assert_eq!(
                err.message,
                format!("provider `{provider}` needs an API key, but {var} is not set")
            );
            let all = format!("{err:?}");
            assert!(!all.contains(SECRET) && !all.contains("SECRET"), "{all}");
        }

        // Optional for a local OpenAI-compatible server: none sent, the variable still named.
        let r = resolve_with(
            &env(&[("OPENAI_BASE_URL", "http://localhost:8000/v1")]),
            &Config::default(),
            &overrides(None, Some("m"), None, None),
            |_| false,
        )
        .expect("no key needed");
        assert!(r.endpoint.api_key.is_none());
        assert_eq!(r.endpoint.api_key_env.as_deref(), Some("OPENAI_API_KEY"));
        assert_eq!(r.provider.base_url_origin, env_origin("OPENAI_BASE_URL"));

        // A bad base URL from the environment names the variable.
        let err = resolve_with(
            &env(&[("OPENAI_BASE_URL", "localhost:8000")]),
            &Config::default(),
            &overrides(None, Some("m"), None, None),
            |_| false,
        )
        .expect_err("bad url");
        assert!(
            err.message.contains("(from OPENAI_BASE_URL)"),
            "{}",
            err.message
        );
    }

    #[test]
    fn endpoint_takes_limits_and_timeouts_from_the_config() {
        let cfg = config(
            "default_provider: work\n\
             providers:\n\
            \x20 work: { kind: anthropic, base_url: http://gw/v1, api_key_env: GW_KEY, \
             requests_per_minute: 5, tokens_per_minute: 900, timeout_secs: 30, \
             connect_timeout_secs: 2, default_model: sonnet }\n",
        );
        let r = resolve_with(
            &env(&[("GW_KEY", SECRET)]),
            &cfg,
            &Overrides::default(),
            |_| false,
        )
        .expect("resolves");
        assert_eq!(r.endpoint.base_url, "http://gw");
        assert_eq!(r.endpoint.request_timeout.as_secs(), 30);
        assert_eq!(r.endpoint.connect_timeout.as_secs(), 2);
        assert_eq!(r.limits.requests_per_minute, Some(5));
        assert_eq!(r.limits.tokens_per_minute, Some(900));
        // The provider's default model goes through its (built-in) aliases too.
        assert_eq!(
            (r.model.as_str(), &r.model_origin),
            ("claude-sonnet-4-5", &from_config())
        );
        assert_eq!(r.provider.origin, from_config());
        assert_eq!(r.endpoint.api_key_env.as_deref(), Some("GW_KEY"));
    }

    #[test]
    fn max_turns_from_the_environment() {
        assert_eq!(env_max_turns(&env(&[])).ok(), Some(None));
        assert_eq!(
            env_max_turns(&env(&[("SUMMON_SUBAGENT_MAX_TURNS", "7")])).ok(),
            Some(Some(7))
        );
        assert_eq!(
            env_max_turns(&env(&[("SUMMON_SUBAGENT_MAX_TURNS", " 3 ")])).ok(),
            Some(Some(3))
        );
        for bad in ["0", "-1", "x", "1.5", "99999999999"] {
            let err = env_max_turns(&env(&[("SUMMON_SUBAGENT_MAX_TURNS", bad)])).expect_err(bad);
            assert!(
                err.message
                    .starts_with("SUMMON_SUBAGENT_MAX_TURNS must be a whole number ≥ 1"),
                "{}",
                err.message
            );
        }
    }

    #[test]
    fn origins_read_well() {
        assert_eq!(
            env_origin("SUMMON_MODEL").to_string(),
            "environment variable SUMMON_MODEL"
        );
        assert_eq!(
            Origin::ConfigFile(Path::new("/a/b.yaml").into()).to_string(),
            "config file /a/b.yaml"
        );
        assert_eq!(agent().to_string(), "agent `x`");
    }

    #[tokio::test]
    async fn resolve_probes_a_live_ollama_and_skips_a_dead_one() {
        use summon_mock_llm::{MockConfig, MockServer};
        let server = MockServer::start(MockConfig::new()).await;
        let host = server.addr().to_string();
        let e = env(&[("OLLAMA_HOST", host.as_str())]);
        let r = resolve(
            &e,
            &Config::default(),
            &overrides(None, Some("llama3.2"), None, None),
        )
        .await
        .expect("ollama detected");
        assert_eq!(r.provider_name, "ollama");
        assert_eq!(r.endpoint.base_url, format!("http://{host}/v1"));
        assert_eq!(
            r.provider_origin,
            Origin::AutoDetected(format!("a local Ollama answered at http://{host}"))
        );
        assert!(r.endpoint.api_key.is_none());
        server.shutdown().await;

        // Built with the local model, it is tried last: here it cannot start.
        let e = env(&[
            ("OLLAMA_HOST", host.as_str()),
            ("SUMMON_LOCAL_MODEL", "/nowhere/model.gguf"),
        ]);
        let err = resolve(
            &e,
            &Config::default(),
            &overrides(None, Some("llama3.2"), None, None),
        )
        .await
        .expect_err("nothing answers");
        assert!(
            err.message.starts_with("no LLM provider is configured"),
            "{}",
            err.message
        );

        // Explicit configuration never probes.
        let r = resolve(
            &env(&[
                ("OLLAMA_HOST", host.as_str()),
                ("SUMMON_PROVIDER", "ollama"),
            ]),
            &Config::default(),
            &overrides(None, Some("m"), None, None),
        )
        .await
        .expect("explicit");
        assert_eq!(r.provider_origin, env_origin("SUMMON_PROVIDER"));
    }
}
