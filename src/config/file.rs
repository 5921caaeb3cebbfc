//! The config file: named providers, default provider and model, and model prices.
//!
//! Two files are read, both optional:
//!
//! 1. the global file `<config dir>/summon/config.yaml`, where the config dir is
//!    `$XDG_CONFIG_HOME`, else `~/.config`;
//! 2. the project file `summon.yaml` in the working directory, which overrides the global one:
//!    top-level scalars (`default_provider`, `default_model`, `max_output_tokens`) are replaced; `providers` are
//!    merged by name, a project provider replacing the global one of the same name wholly;
//!    `prices` are merged by model.
//!
//! ```yaml
//! default_provider: work          # optional: the provider used when nothing else names one
//! default_model: gpt-4o-mini      # optional: the model used when nothing else names one
//! max_output_tokens: 16000        # optional: the output limit of every request (default:
//!                                 # one that fits the task; docs/providers.md)
//! max_cost: 20                    # optional: the spend cap in USD of every run, delegation
//!                                 # and merge (`--max-cost` and `settings.max_cost` override)
//! providers:
//!   work:
//!     kind: openai                # openai (any OpenAI-compatible server) | anthropic
//!     base_url: https://api.openai.com/v1   # OpenAI-compatible: with /v1; Anthropic: without
//!     api_key_env: OPENAI_API_KEY # the NAME of the env var holding the key, never the key
//!     default_model: gpt-4o-mini
//!     aliases: { sonnet: gpt-4o, fast: gpt-4o-mini }
//!     requests_per_minute: 500    # shared by every concurrent subagent of this provider; the
//!     tokens_per_minute: 200000   # provider's rate-limit headers apply too, the smaller wins
//!     input_tokens_per_minute: 200000   # Anthropic-style keys: input and output apart
//!     output_tokens_per_minute: 40000
//!     limits_per: key             # key (default): under --shard I/N each shard gets 1/N of
//!                                 # the limits; shard: each shard has a key of its own
//!     local: true                 # optional: a local server whatever its URL (summon's
//!                                 # runaway output guard applies; default: told from the URL)
//!     timeout_secs: 600           # whole request
//!     connect_timeout_secs: 10
//!     structured_output: json_schema # json_schema | json_object | none: what an OpenAI-
//!                                    # compatible server is asked for structured answers
//!   local:
//!     kind: openai
//!     base_url: http://localhost:8000/v1    # vLLM, llama.cpp, LM Studio: no key needed
//! prices:                         # USD per million tokens, for cost estimates
//!   gpt-4o-mini: { input: 0.15, output: 0.60 }
//!   claude-sonnet-4-5: { input: 3, output: 15, cached_input: 0.30, cache_write: 3.75 }
//!                                 # cached_input / cache_write: optional; by default the
//!                                 # provider's documented share of `input` for the model
//! cache: false                    # optional: no prompt caching (default: on)
//! models:                         # per-model facts over the built-in ones
//!   my-local-model: { context_window: 32000 }   # tokens of prompt and output per request
//!   claude-sonnet-4-7: { structured_outputs: true } # Anthropic: answer in the schema natively
//!                                 # (`output_config.format`); built in for Opus 4.5/4.6,
//!                                 # Sonnet 4.5/4.6, Haiku 4.5; others get a forced answer tool
//! store:                          # run history kept per pipeline (default: 20 runs, 7 days)
//!   keep_runs: 20
//!   keep_days: 7
//! shell_env: [GOPATH, CARGO_HOME] # variables the model's shell commands get besides PATH,
//!                                 # HOME, USER, LOGNAME, LANG, LC_ALL, LC_CTYPE, TERM, TZ
//! traces:                         # OpenTelemetry export (the OTEL_* variables win over these)
//!   endpoint: http://localhost:4318 # the collector, as OTEL_EXPORTER_OTLP_ENDPOINT
//!   protocol: http/protobuf       # http/protobuf | http/json | grpc
//!   capture_content: false        # prompt and answer text on the spans
//! ```
//!
//! Provider entries:
//!
//! - `kind` is required, except for an entry named like a built-in preset (`openai`,
//!   `anthropic`, `ollama`): such an entry overrides the preset, and the fields it leaves out
//!   (kind, base URL, key variable) keep the preset's values; its aliases are added to the
//!   preset's.
//! - `base_url` defaults to the official API of the kind (`https://api.openai.com/v1`,
//!   `https://api.anthropic.com`).
//! - `api_key_env` defaults to `ANTHROPIC_API_KEY` for `kind: anthropic` and to
//!   `OPENAI_API_KEY` at the official OpenAI URL; elsewhere no key is sent unless it is set.
//!   When it is set explicitly, the variable must be set when the provider is used.
//! - `aliases` map model names (such as Claude Code's `sonnet`, `opus`, `haiku`) to the
//!   provider's model ids; every `kind: anthropic` provider knows the Claude aliases already.
//!
//! `shell_env` names are added to those of the other file. A name that holds a credential (any
//! provider's `api_key_env`, or one named like a key: `*API_KEY`, `*_AUTH_TOKEN`) is refused;
//! the project file's list applies only in a trusted project.
//!
//! A literal `api_key:` is refused: keys live in environment variables only. Unknown keys are
//! warnings naming their dotted path and line; bad values are errors at their position. A
//! diagnostic about a line that may hold a secret names the line instead of quoting it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use indexmap::IndexMap;

use super::presets::PRESET_NAMES;
use crate::diag::{Diagnostic, Diagnostics, FileDiags, Pos, SourceFile, Span};
use crate::env::Env;
use crate::provider::{ProviderKind, RateLimits, redact};
use crate::yaml::{self, MapReader, Node};

/// Config files larger than this are refused.
const MAX_CONFIG_SIZE: usize = 1 << 20;
/// Timeouts beyond this (about 11 days) are refused as mistakes.
const MAX_TIMEOUT_SECS: f64 = 1_000_000.0;

/// The global config file, `<config dir>/summon/config.yaml`; `None` without a home directory.
pub(crate) fn global_path(env: &Env) -> Option<PathBuf> {
    env.config_dir()
        .map(|dir| dir.join("summon").join("config.yaml"))
}

/// The project config file, `summon.yaml` in the project folder that holds the working
/// directory (found from any subfolder, as the project's sources are).
pub(crate) fn project_path(env: &Env) -> PathBuf {
    crate::store::project_root(&env.cwd, env.home().as_deref())
        .0
        .join("summon.yaml")
}

/// Which of the two config files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    Global,
    Project,
}

/// A config file summon looked for, found or not (for `doctor`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConfigFileInfo {
    pub(crate) scope: Scope,
    pub(crate) path: PathBuf,
    pub(crate) found: bool,
}

/// A configured value and where it was written.
#[derive(Debug, Clone)]
pub(crate) struct Located<T> {
    pub(crate) value: T,
    pub(crate) file: Arc<SourceFile>,
    /// The position of the value.
    pub(crate) pos: Pos,
}

impl<T> Located<T> {
    pub(crate) fn path(&self) -> &Path {
        self.file.path()
    }

    pub(crate) fn span(&self) -> Span {
        Span::new(&self.file, self.pos)
    }
}

/// One `providers.NAME` entry, as written. A provider is replaced wholly by a later file, so
/// the whole entry has one origin.
#[derive(Debug, Clone)]
pub(crate) struct ProviderConfig {
    pub(crate) name: String,
    /// The file that defines it and the position of its name.
    pub(crate) file: Arc<SourceFile>,
    #[cfg_attr(not(test), expect(dead_code, reason = "only the tests read it yet"))]
    pub(crate) pos: Pos,
    /// `None` only for entries named like a preset, which keep the preset's kind.
    pub(crate) kind: Option<ProviderKind>,
    pub(crate) base_url: Option<String>,
    pub(crate) api_key_env: Option<String>,
    /// `structured_output`: what an OpenAI-compatible server is asked for structured answers.
    pub(crate) structured_output: Option<crate::provider::OpenAiFormat>,
    /// Where `base_url` (else `api_key_env`) is written: the settings that decide where a
    /// credential goes, which need trust in a project file.
    pub(crate) routing_pos: Option<Pos>,
    /// The file it is in, global or project.
    pub(crate) scope: Scope,
    pub(crate) default_model: Option<String>,
    pub(crate) aliases: IndexMap<String, String>,
    pub(crate) limits: RateLimits,
    /// `limits_per: shard`: each shard of a sharded run has the limits whole (its own key);
    /// `None` or `key`: they are shared by the shards.
    pub(crate) limits_per_shard: Option<bool>,
    /// `local`: the server runs locally (summon's runaway guard applies), whatever its URL
    /// says.
    pub(crate) local: Option<bool>,
    pub(crate) request_timeout: Option<Duration>,
    pub(crate) connect_timeout: Option<Duration>,
}

impl ProviderConfig {
    pub(crate) fn path(&self) -> &Path {
        self.file.path()
    }
}

/// One name of `shell_env`, and the file it is written in.
#[derive(Debug, Clone)]
pub(crate) struct ShellEnvName {
    pub(crate) name: Located<String>,
    pub(crate) scope: Scope,
}

/// USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Price {
    pub(crate) input: f64,
    pub(crate) output: f64,
    /// Input read from the provider's prompt cache.
    pub(crate) cached_input: f64,
    /// Input written to the prompt cache (Anthropic).
    pub(crate) cache_write: f64,
}

impl Price {
    /// `input` and `output` with the cache prices the provider documents for `model`'s family
    /// (Claude: reads 0.1×, writes 1.25× the input price; OpenAI reads: gpt-5 0.1×, gpt-4.1
    /// and o3/o4 0.25×, gpt-4o 0.5×); other models get no discount.
    pub(crate) fn with_cache_defaults(model: &str, input: f64, output: f64) -> Self {
        let m = model.to_ascii_lowercase();
        let (read, write) = if m.contains("claude") {
            (0.1, 1.25)
        } else if m.starts_with("gpt-5") {
            (0.1, 1.0)
        } else if m.starts_with("gpt-4.1") || m.starts_with("o3") || m.starts_with("o4") {
            (0.25, 1.0)
        } else if m.starts_with("gpt-4o") {
            (0.5, 1.0)
        } else {
            (1.0, 1.0)
        };
        Self {
            input,
            output,
            cached_input: input * read,
            cache_write: input * write,
        }
    }

    /// Every price times `factor`.
    pub(crate) fn scaled(&self, factor: f64) -> Self {
        Self {
            input: self.input * factor,
            output: self.output * factor,
            cached_input: self.cached_input * factor,
            cache_write: self.cache_write * factor,
        }
    }

    /// The cost in USD of `usage`, each part of the input at its own price.
    pub(crate) fn cost(&self, usage: &crate::provider::Usage) -> f64 {
        (usage.uncached_input() as f64 * self.input
            + usage.cache_read_tokens as f64 * self.cached_input
            + usage.cache_write_tokens as f64 * self.cache_write
            + usage.output_tokens as f64 * self.output)
            / 1e6
    }
}

/// The merged configuration of both files; every value keeps the file it came from.
#[derive(Debug, Clone, Default)]
pub(crate) struct Config {
    /// The files looked for, global first.
    pub(crate) files: Vec<ConfigFileInfo>,
    pub(crate) default_provider: Option<Located<String>>,
    pub(crate) default_model: Option<Located<String>>,
    /// The output limit of every request, unless a flag or step sets one.
    pub(crate) max_output_tokens: Option<u32>,
    /// `max_cost`: the spend cap of every run and delegation in USD, unless a flag or the
    /// pipeline sets one.
    pub(crate) max_cost: Option<f64>,
    pub(crate) providers: IndexMap<String, ProviderConfig>,
    pub(crate) prices: IndexMap<String, Located<Price>>,
    /// `models.<id>.context_window`: context windows over the built-in ones, by model id.
    pub(crate) context_windows: IndexMap<String, u64>,
    /// Context windows servers said for models the config file and the built-in list give
    /// none (asked once per run, before its first request), by model id.
    pub(crate) learned_windows: IndexMap<String, crate::provider::ServerWindow>,
    /// `models.<id>.structured_outputs`: whether Anthropic's native structured outputs are
    /// used for the model, over the built-in list.
    pub(crate) native_structured: IndexMap<String, bool>,
    /// Whether the project's own settings that send credentials may apply.
    pub(crate) trust: super::trust::Trust,
    /// `store.keep_runs`: the newest runs of each pipeline kept in the run history.
    pub(crate) keep_runs: Option<u64>,
    /// `store.keep_days`: runs younger than this many days are kept too.
    pub(crate) keep_days: Option<f64>,
    /// `sandbox` / `network`: the sandbox of the model's shell commands, unless a flag, step
    /// or pipeline setting decides.
    pub(crate) sandbox: Option<crate::sandbox::Policy>,
    pub(crate) network: Option<bool>,
    /// `cache: false`: no prompt caching (breakpoints, cache key, warm-up) in any step.
    pub(crate) cache: Option<bool>,
    /// `shell_env`: the variables the model's shell commands get besides the defaults, from
    /// both files.
    pub(crate) shell_env: Vec<ShellEnvName>,
    /// Where a file loosens the sandbox (`sandbox: off`, `network: true`), by key; kept for
    /// the project file only, whose loosening needs trust.
    pub(crate) loosened: Vec<(&'static str, Span)>,
    /// `traces`: where and how traces are exported, under the `OTEL_*` variables.
    pub(crate) traces: Option<Located<TracesConfig>>,
    /// The models whose price an untrusted project asked lower than the price under it:
    /// where the price counted instead comes from.
    pub(crate) price_floors: IndexMap<String, String>,
}

/// The config file's `traces` entry; the scope says whose file wrote it (a project's needs
/// trust: it would send the run's spans to a host of the repository's choosing).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct TracesConfig {
    /// The collector's base URL, or a URL ending in `/v1/traces` used as given.
    pub(crate) endpoint: Option<String>,
    /// `http/protobuf`, `http/json` or `grpc`.
    pub(crate) protocol: Option<String>,
    pub(crate) capture_content: Option<bool>,
    pub(crate) scope: Option<Scope>,
}

impl Config {
    /// Reads one file's text. Problems go to `diags`; what could be read is returned.
    pub(crate) fn parse(file: &Arc<SourceFile>, diags: &mut Diagnostics) -> Self {
        let mut local = Diagnostics::default();
        let config = parse_inner(file, &mut local);
        for diagnostic in local.items {
            diags.push(scrub(diagnostic));
        }
        config
    }

    /// Lays `over` (a later file) on top of `self`.
    pub(crate) fn merge(&mut self, over: Self) {
        self.files.extend(over.files);
        if over.default_provider.is_some() {
            self.default_provider = over.default_provider;
        }
        if over.default_model.is_some() {
            self.default_model = over.default_model;
        }
        if over.max_output_tokens.is_some() {
            self.max_output_tokens = over.max_output_tokens;
        }
        self.max_cost = over.max_cost.or(self.max_cost);
        self.providers.extend(over.providers);
        self.prices.extend(over.prices);
        self.context_windows.extend(over.context_windows);
        self.native_structured.extend(over.native_structured);
        self.keep_runs = over.keep_runs.or(self.keep_runs);
        self.keep_days = over.keep_days.or(self.keep_days);
        self.sandbox = over.sandbox.or(self.sandbox);
        self.network = over.network.or(self.network);
        self.cache = over.cache.or(self.cache);
        self.loosened.extend(over.loosened);
        self.shell_env.extend(over.shell_env);
        if over.traces.is_some() {
            self.traces = over.traces;
        }
    }

    /// The environment of the model's shell commands: the `shell_env` names, none of the
    /// variables a provider takes its key from. An error when the project file adds names
    /// and the project is not trusted: a cloned repository must not hand the user's
    /// variables to the model.
    pub(crate) fn command_env(&self, env: &Env) -> Result<crate::sandbox::CommandEnv, Diagnostic> {
        if !self.trust.is_trusted()
            && let Some(first) = self.shell_env.iter().find(|n| n.scope == Scope::Project)
        {
            let names: Vec<&str> = self
                .shell_env
                .iter()
                .filter(|n| n.scope == Scope::Project)
                .map(|n| n.name.value.as_str())
                .collect();
            return Err(Diagnostic::error(format!(
                "`shell_env` in this project's summon.yaml would give the model's shell \
                 commands {} from your environment, and this project is not trusted",
                names.join(", ")
            ))
            .with_hint(self.trust.how_to_trust())
            .at(first.name.span()));
        }
        let credentials: Vec<String> = super::presets::key_variables(env, self)
            .into_iter()
            .map(|(variable, _)| variable)
            .collect();
        let keys = credentials
            .iter()
            .filter_map(|variable| env.var(variable))
            .map(|key| crate::provider::Secret::new(key.trim()))
            .collect();
        let names = self
            .shell_env
            .iter()
            .map(|n| n.name.value.clone())
            .collect();
        Ok(crate::sandbox::CommandEnv::new(names, credentials, keys))
    }

    /// Which standard price of `model` a cost and the spend cap count with, and where it came
    /// from: `gpt-4o at $2.50 input, $10.00 output per million tokens (summon's built-in
    /// table of 2025-06-01)`; the user's config file, this project's summon.yaml (trusted or
    /// not), or a price under an untrusted project's lower one. `None` without a price.
    pub(crate) fn price_source(&self, model: &str) -> Option<String> {
        let (prices, from_file) = self.prices().model(model)?;
        let from = if !from_file {
            format!(
                "summon's built-in table of {}",
                super::prices::built_in().date
            )
        } else {
            let entry = super::prices::find(&self.prices, model);
            let project = entry.is_some_and(|entry| {
                self.files
                    .iter()
                    .any(|f| f.scope == Scope::Project && f.path == entry.path())
            });
            match (entry, project) {
                (Some(entry), false) => format!("the config file {}", entry.path().display()),
                (_, true) if self.trust.is_trusted() => {
                    "this project's summon.yaml, trusted".to_owned()
                }
                (_, true) => match super::prices::find(&self.price_floors, model) {
                    Some(floor) => format!(
                        "{floor}: this untrusted project's summon.yaml asked less, and may only \
                         raise a price"
                    ),
                    None => "this untrusted project's summon.yaml, which may only raise a price \
                             or price a model with none"
                        .to_owned(),
                },
                (None, false) => "the config file".to_owned(),
            }
        };
        let p = prices.standard;
        Some(format!(
            "{model} at ${} input, ${} output per million tokens ({from})",
            p.input, p.output
        ))
    }

    /// The price of a model: the config file's, else the built-in table's.
    pub(crate) fn price(&self, model: &str) -> Option<Price> {
        self.prices().get(model)
    }

    /// The prices of every model: the config file's entries over the built-in table.
    pub(crate) fn prices(&self) -> super::prices::Prices {
        super::prices::Prices::new(
            self.prices
                .iter()
                .map(|(model, price)| (model.clone(), price.value))
                .collect(),
        )
    }

    /// The context window of `model`: the config file's, else the built-in one, else the one
    /// its server said.
    pub(crate) fn context_window(&self, model: &str) -> Option<u64> {
        self.window_origin(model).map(|(tokens, _)| tokens)
    }

    /// [`Self::context_window`] and where it comes from, as `--dry-run` and `doctor` say it.
    pub(crate) fn window_origin(&self, model: &str) -> Option<(u64, String)> {
        if let Some(tokens) = self.context_windows.get(model) {
            return Some((
                *tokens,
                format!("the config file's `models.{model}.context_window`"),
            ));
        }
        if let Some(tokens) = super::windows::built_in(model) {
            return Some((tokens, "built in".to_owned()));
        }
        self.learned_windows
            .get(model)
            .map(|w| (w.tokens, format!("the server: {}", w.from)))
    }

    /// Whether an Anthropic model answers in a JSON schema natively (`output_config.format`):
    /// the config file's word, else the built-in list.
    pub(crate) fn native_structured(&self, model: &str) -> bool {
        self.native_structured
            .get(model)
            .copied()
            .unwrap_or_else(|| crate::provider::anthropic_native_structured(model))
    }

    /// The files that were found and read.
    #[cfg(test)]
    pub(crate) fn found_files(&self) -> impl Iterator<Item = &Path> {
        self.files
            .iter()
            .filter(|f| f.found)
            .map(|f| f.path.as_path())
    }
}

/// Both files read and merged, with every problem found (for `doctor`, which reports them
/// and goes on).
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    pub(crate) config: Config,
    pub(crate) diagnostics: Diagnostics,
}

/// Reads the global, then the project config file. Missing files are fine.
pub(crate) fn load(env: &Env) -> Loaded {
    let mut loaded = Loaded::default();
    // The project file's bytes as parsed: its trust is judged by them, not by a second read.
    let mut project_bytes: Option<Option<Arc<SourceFile>>> = None;
    // The project's own prices, and those under them (the user's file), until trust decides.
    let mut project_prices = IndexMap::new();
    let mut under_project = IndexMap::new();
    let files = global_path(env)
        .map(|p| (Scope::Global, p))
        .into_iter()
        .chain([(Scope::Project, project_path(env))]);
    for (scope, path) in files {
        let file = match read(&path) {
            Ok(file) => file,
            Err(diagnostic) => {
                loaded.diagnostics.push(diagnostic);
                None
            }
        };
        if scope == Scope::Project {
            project_bytes = Some(file.clone());
        }
        loaded.config.files.push(ConfigFileInfo {
            scope,
            path,
            found: file.is_some(),
        });
        if let Some(file) = file {
            let mut layer = Config::parse(&file, &mut loaded.diagnostics);
            for provider in layer.providers.values_mut() {
                provider.scope = scope;
            }
            if scope != Scope::Project {
                layer.loosened.clear();
            }
            for name in &mut layer.shell_env {
                name.scope = scope;
            }
            if let Some(traces) = &mut layer.traces {
                traces.value.scope = Some(scope);
            }
            if scope == Scope::Project {
                project_prices = layer.prices.clone();
                under_project = loaded.config.prices.clone();
            }
            loaded.config.merge(layer);
        }
    }
    loaded.config.trust = super::trust::project_trust_as_read(
        env,
        project_bytes
            .as_ref()
            .map(|file| file.as_ref().map(|f| f.text.as_bytes())),
    );
    if !loaded.config.trust.is_trusted() {
        keep_prices_up(&mut loaded, &project_prices, &under_project);
    }
    refuse_listed_keys(&mut loaded, env);
    loaded
}

/// An untrusted project's `prices` may raise a price, or price a model that has none, but
/// never lower one: the spend cap counts with them, and a cloned repository must not turn it
/// off by pricing a model at 0. Each part of such an entry that is lower than the price under
/// it (the user's config file's, else the built-in table's) is kept at that price, with a
/// warning at the line.
fn keep_prices_up(
    loaded: &mut Loaded,
    project: &IndexMap<String, Located<Price>>,
    under: &IndexMap<String, Located<Price>>,
) {
    for (model, entry) in project {
        let (floor, origin) = match under.get(model) {
            Some(user) => (user.value, "the user's config file".to_owned()),
            None => match super::prices::listed(model) {
                Some(listed) => (listed.standard, "summon's built-in table".to_owned()),
                None => continue,
            },
        };
        let asked = entry.value;
        let kept = Price {
            input: asked.input.max(floor.input),
            output: asked.output.max(floor.output),
            cached_input: asked.cached_input.max(floor.cached_input),
            cache_write: asked.cache_write.max(floor.cache_write),
        };
        if kept == asked {
            continue;
        }
        loaded.diagnostics.push(
            Diagnostic::warning(format!(
                "`prices.{model}` of this untrusted project is lower than the price of \
                 {origin} (input {}, output {} USD per million tokens): the cost and \
                 `--max-cost` count with that price",
                floor.input, floor.output
            ))
            .with_hint(loaded.config.trust.how_to_trust())
            .at(entry.span()),
        );
        if let Some(merged) = loaded.config.prices.get_mut(model) {
            merged.value = kept;
        }
        loaded.config.price_floors.insert(model.clone(), origin);
    }
}

/// Refuses a `shell_env` name that a provider takes its key from: the model's commands
/// never get a credential.
fn refuse_listed_keys(loaded: &mut Loaded, env: &Env) {
    let keys = super::presets::key_variables(env, &loaded.config);
    for listed in &loaded.config.shell_env {
        if let Some((variable, provider)) = keys.iter().find(|(v, _)| *v == listed.name.value) {
            loaded.diagnostics.push(
                Diagnostic::error(format!(
                    "`shell_env` lists {variable}, which holds the API key of provider \
                     `{provider}`: the model's shell commands never get a credential"
                ))
                .with_hint(format!("remove {variable} from `shell_env`"))
                .at(listed.name.span()),
            );
        }
    }
}

/// Reads both config files: the merged config and its warnings, or every diagnostic (errors
/// and warnings) when there is an error.
pub(crate) fn load_config(env: &Env) -> Result<(Config, Diagnostics), Diagnostics> {
    let loaded = load(env);
    if loaded.diagnostics.has_errors() {
        Err(loaded.diagnostics)
    } else {
        Ok((loaded.config, loaded.diagnostics))
    }
}

/// The file, `None` when it does not exist.
fn read(path: &Path) -> Result<Option<Arc<SourceFile>>, Diagnostic> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(
                Diagnostic::error(format!("cannot read the config file: {e}")).in_file(path),
            );
        }
    };
    if bytes.len() > MAX_CONFIG_SIZE {
        return Err(Diagnostic::error(format!(
            "the config file is larger than {} KiB; is it the right file?",
            MAX_CONFIG_SIZE / 1024
        ))
        .in_file(path));
    }
    match String::from_utf8(bytes) {
        Ok(text) => Ok(Some(SourceFile::new(path, text))),
        Err(_) => Err(Diagnostic::error("the config file is not valid UTF-8").in_file(path)),
    }
}

fn parse_inner(file: &Arc<SourceFile>, diags: &mut Diagnostics) -> Config {
    let mut d = diags.for_file(file);
    let mut config = Config::default();
    let root = match yaml::parse(&file.text) {
        Ok(Some(root)) if !root.is_null() => root,
        Ok(_) => return config,
        Err(e) => {
            d.error(e.pos, format!("invalid YAML: {}", e.message));
            return config;
        }
    };
    let Some(mut r) = MapReader::new(&root, "") else {
        d.error(
            root.pos,
            format!(
                "a config file must be a mapping (`providers:`, `default_provider:`, ...), found {}",
                root.kind_name()
            ),
        );
        return config;
    };
    refuse_literal_key(&mut r, &mut d);
    config.default_provider = located_string(&mut r, "default_provider", &mut d);
    config.default_model = located_string(&mut r, "default_model", &mut d);
    config.max_cost = r.get("max_cost").and_then(|n| match n.to_json().as_f64() {
        Some(usd) if usd > 0.0 && usd.is_finite() => Some(usd),
        _ => {
            d.error(
                n.pos,
                format!(
                    "`max_cost` must be a number of US dollars above 0, found {}",
                    describe(n)
                ),
            );
            None
        }
    });
    config.max_output_tokens = r
        .get("max_output_tokens")
        .and_then(|n| output_limit(n, "max_output_tokens", &mut d));
    if let Some(node) = r.get("providers") {
        config.providers = read_providers(node, &mut d);
    }
    if let Some(node) = r.get("prices") {
        config.prices = read_prices(node, &mut d);
    }
    if let Some(node) = r.get("models") {
        (config.context_windows, config.native_structured) =
            super::windows::read_models(node, &mut d);
    }
    if let Some(node) = r.get("store") {
        read_store_settings(node, &mut config, &mut d);
    }
    if let Some(node) = r.get("sandbox") {
        config.sandbox = node.as_str().and_then(crate::sandbox::Policy::parse);
        if config.sandbox == Some(crate::sandbox::Policy::Off) {
            config.loosened.push(("sandbox", Span::new(file, node.pos)));
        }
        if config.sandbox.is_none() {
            d.error(
                node.pos,
                "`sandbox` must be `workspace-write`, `read-only` or `off`",
            );
        }
    }
    if let Some(node) = r.get("network") {
        config.network = match node.as_str() {
            Some("true") => {
                config.loosened.push(("network", Span::new(file, node.pos)));
                Some(true)
            }
            Some("false") => Some(false),
            _ => {
                d.error(node.pos, "`network` must be true or false");
                None
            }
        };
    }
    if let Some(node) = r.get("shell_env") {
        config.shell_env = read_shell_env(node, &mut d);
    }
    if let Some(node) = r.get("traces") {
        config.traces = read_traces(node, &mut d);
    }
    if let Some(node) = r.get("cache") {
        config.cache = match node.as_str() {
            Some("true") => Some(true),
            Some("false") => Some(false),
            _ => {
                d.error(node.pos, "`cache` must be true or false");
                None
            }
        };
    }
    r.finish(&mut d);
    config
}

/// `shell_env: [NAME, ...]`: variables the model's shell commands get besides the defaults.
fn read_shell_env(node: &Node, d: &mut FileDiags<'_>) -> Vec<ShellEnvName> {
    let Some(items) = node.as_seq() else {
        d.error(
            node.pos,
            format!(
                "`shell_env` must be a list of environment variable names (`[GOPATH, \
                 CARGO_HOME]`), found {}",
                node.kind_name()
            ),
        );
        return Vec::new();
    };
    let mut names = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("shell_env[{i}]");
        let text = match item.as_str() {
            Some(text) if item.as_map().is_none() && item.as_seq().is_none() => text.trim(),
            _ => {
                d.error(
                    item.pos,
                    format!(
                        "`{path}` must be the name of an environment variable, found {}",
                        item.kind_name()
                    ),
                );
                continue;
            }
        };
        if !is_env_name(text) || looks_like_key(text) {
            d.push(no_echo(
                d.file.path(),
                item.pos,
                format!(
                    "`{path}` must be the name of an environment variable (letters, digits and \
                     `_`, like GOPATH)"
                ),
            ));
            continue;
        }
        if crate::sandbox::is_secret_name(text) {
            d.push(
                Diagnostic::error(format!(
                    "`{path}` is {text}, named like an API key: the model's shell commands \
                     never get a credential"
                ))
                .with_hint(format!("remove {text} from `shell_env`"))
                .at(Span::new(&d.file, item.pos)),
            );
            continue;
        }
        names.push(ShellEnvName {
            name: Located {
                value: text.to_owned(),
                file: Arc::clone(&d.file),
                pos: item.pos,
            },
            scope: Scope::Global,
        });
    }
    names
}

/// `store: {keep_runs: N, keep_days: D}`: the run history's retention.
/// `traces: {endpoint, protocol, capture_content}`.
fn read_traces(node: &Node, d: &mut FileDiags<'_>) -> Option<Located<TracesConfig>> {
    let Some(mut r) = MapReader::new(node, "traces") else {
        d.error(
            node.pos,
            format!(
                "`traces` must be a mapping (`endpoint:`, `protocol:`, `capture_content:`), \
                 found {}",
                node.kind_name()
            ),
        );
        return None;
    };
    let mut traces = TracesConfig::default();
    if let Some(n) = r.get("endpoint") {
        match n.as_str().map(str::trim) {
            Some(url) if url.starts_with("http://") || url.starts_with("https://") => {
                traces.endpoint = Some(url.to_owned());
            }
            _ => d.error(
                n.pos,
                format!(
                    "`traces.endpoint` must be the collector's http:// or https:// URL, found {}",
                    describe(n)
                ),
            ),
        }
    }
    if let Some(n) = r.get("protocol") {
        match n.as_str() {
            Some(p @ ("http/protobuf" | "http/json" | "grpc")) => {
                traces.protocol = Some(p.to_owned());
            }
            _ => d.error(
                n.pos,
                format!(
                    "`traces.protocol` must be http/protobuf, http/json or grpc, found {}",
                    describe(n)
                ),
            ),
        }
    }
    if let Some(n) = r.get("capture_content") {
        match n.as_str() {
            Some("true") => traces.capture_content = Some(true),
            Some("false") => traces.capture_content = Some(false),
            _ => d.error(n.pos, "`traces.capture_content` must be true or false"),
        }
    }
    r.finish(d);
    Some(Located {
        value: traces,
        file: Arc::clone(&d.file),
        pos: node.pos,
    })
}

fn read_store_settings(node: &Node, config: &mut Config, d: &mut FileDiags<'_>) {
    let Some(mut r) = MapReader::new(node, "store") else {
        d.error(
            node.pos,
            format!(
                "`store` must be a mapping (`keep_runs:`, `keep_days:`), found {}",
                node.kind_name()
            ),
        );
        return;
    };
    config.keep_runs = r
        .get("keep_runs")
        .and_then(|n| positive_int(n, "store.keep_runs", d));
    config.keep_days = r
        .get("keep_days")
        .and_then(|n| non_negative(n, "store.keep_days", d));
    r.finish(d);
}

/// Key spellings that would hold a literal API key.
const LITERAL_KEY_NAMES: &[&str] = &["api_key", "apiKey", "api-key", "apikey"];

/// Refuses `api_key:` with an error that names the line but never shows it.
fn refuse_literal_key(r: &mut MapReader<'_>, d: &mut FileDiags<'_>) {
    for name in LITERAL_KEY_NAMES {
        let Some((key, _)) = r.get_entry(name) else {
            continue;
        };
        let path = r.child_path(name);
        let env_path = match path.rsplit_once('.') {
            Some((parent, _)) => format!("{parent}.api_key_env"),
            None => "providers.NAME.api_key_env".to_owned(),
        };
        d.push(
            no_echo(
                d.file.path(),
                key.pos,
                format!(
                    "`{path}` would hold an API key in a file; summon reads keys only from \
                     environment variables"
                ),
            )
            .with_hint(format!(
                "remove it, put the key in an environment variable and name that variable with \
                 `{env_path}` (for example `api_key_env: OPENAI_API_KEY`)"
            )),
        );
    }
}

/// An error about `pos` that names the file and line but shows neither the line nor the value.
fn no_echo(path: &Path, pos: Pos, message: String) -> Diagnostic {
    Diagnostic::error(format!("{message} (line {})", pos.line)).in_file(path)
}

/// Drops the source excerpt of a diagnostic whose line may hold a secret (a key-like token or
/// a key such as `token:`), naming the line instead, and redacts key-like text in the message.
fn scrub(mut diagnostic: Diagnostic) -> Diagnostic {
    diagnostic.message = redact(&diagnostic.message, None);
    let Some(span) = &diagnostic.span else {
        return diagnostic;
    };
    let line = span.file.line_text(span.pos.line).unwrap_or_default();
    if line_may_hold_secret(line) {
        diagnostic.message = format!("{} (line {})", diagnostic.message, span.pos.line);
        diagnostic.path = Some(span.file.path().to_path_buf());
        diagnostic.span = None;
    }
    diagnostic
}

fn line_may_hold_secret(line: &str) -> bool {
    if redact(line, None) != line {
        return true;
    }
    let key: String = line
        .trim_start()
        .trim_start_matches("- ")
        .split(':')
        .next()
        .unwrap_or_default()
        .trim()
        .trim_matches(['"', '\''])
        .to_ascii_lowercase()
        .chars()
        .filter(|c| !matches!(c, '_' | '-'))
        .collect();
    key == "key"
        || key == "authorization"
        || [
            "apikey",
            "token",
            "secret",
            "password",
            "credential",
            "credentials",
        ]
        .iter()
        .any(|s| key.ends_with(s))
}

fn located_string(
    r: &mut MapReader<'_>,
    key: &str,
    d: &mut FileDiags<'_>,
) -> Option<Located<String>> {
    let path = r.child_path(key);
    let node = r.get(key)?;
    let value = string_value(node, &path, d)?;
    Some(Located {
        value,
        file: Arc::clone(&d.file),
        pos: node.pos,
    })
}

/// `true` or `false`.
fn bool_value(node: &Node, path: &str, d: &mut FileDiags<'_>) -> Option<bool> {
    match node.as_str() {
        Some("true") => Some(true),
        Some("false") => Some(false),
        _ => {
            d.error(node.pos, format!("`{path}` must be true or false"));
            None
        }
    }
}

/// A non-empty string scalar.
fn string_value(node: &Node, path: &str, d: &mut FileDiags<'_>) -> Option<String> {
    match node.as_str() {
        Some(text) if node.as_map().is_none() && node.as_seq().is_none() => {
            let text = text.trim();
            if text.is_empty() {
                d.error(node.pos, format!("`{path}` must not be empty"));
                None
            } else {
                Some(text.to_owned())
            }
        }
        _ => {
            d.error(
                node.pos,
                format!("`{path}` must be a string, found {}", node.kind_name()),
            );
            None
        }
    }
}

fn read_providers(node: &Node, d: &mut FileDiags<'_>) -> IndexMap<String, ProviderConfig> {
    let mut providers = IndexMap::new();
    let Some(entries) = node.as_map() else {
        d.error(
            node.pos,
            format!(
                "`providers` must be a mapping of provider names to settings, found {}",
                node.kind_name()
            ),
        );
        return providers;
    };
    for (key, value) in entries {
        let Some(name) = key.as_str().map(str::trim).filter(|n| !n.is_empty()) else {
            d.error(key.pos, "a provider name must be a non-empty string");
            continue;
        };
        if providers.contains_key(name) {
            d.warning(
                key.pos,
                format!("duplicate provider `providers.{name}`; the first one is used"),
            );
            continue;
        }
        if let Some(provider) = read_provider(name, key, value, d) {
            providers.insert(name.to_owned(), provider);
        }
    }
    providers
}

fn read_provider(
    name: &str,
    key: &Node,
    node: &Node,
    d: &mut FileDiags<'_>,
) -> Option<ProviderConfig> {
    let path = format!("providers.{name}");
    let Some(mut r) = MapReader::new(node, path.clone()) else {
        d.error(
            node.pos,
            format!(
                "`{path}` must be a mapping (`kind:`, `base_url:`, ...), found {}",
                node.kind_name()
            ),
        );
        return None;
    };
    let errors_before = d.out.error_count();
    refuse_literal_key(&mut r, d);
    let kind_node = r.get("kind");
    let kind = kind_node.and_then(|n| read_kind(n, &format!("{path}.kind"), d));
    let base_url_node = r.get("base_url");
    let base_url = base_url_node.and_then(|n| read_url(n, &format!("{path}.base_url"), d));
    let api_key_env_node = r.get("api_key_env");
    let api_key_env =
        api_key_env_node.and_then(|n| read_env_name(n, &format!("{path}.api_key_env"), d));
    let routing_pos = base_url_node.or(api_key_env_node).map(|n| n.pos);
    let structured_output = r.get("structured_output").and_then(|n| {
        let text = string_value(n, &format!("{path}.structured_output"), d)?;
        let parsed = crate::provider::OpenAiFormat::parse(&text);
        if parsed.is_none() {
            d.error(
                n.pos,
                format!(
                    "`{path}.structured_output` must be json_schema, json_object or none, found \
                     `{text}`"
                ),
            );
        }
        parsed
    });
    let default_model = r
        .get("default_model")
        .and_then(|n| string_value(n, &format!("{path}.default_model"), d));
    let aliases = r
        .get("aliases")
        .map(|n| read_aliases(n, &format!("{path}.aliases"), d))
        .unwrap_or_default();
    let requests_per_minute = r
        .get("requests_per_minute")
        .and_then(|n| positive_int(n, &format!("{path}.requests_per_minute"), d))
        .and_then(|n| u32::try_from(n).ok());
    let tokens_per_minute = r
        .get("tokens_per_minute")
        .and_then(|n| positive_int(n, &format!("{path}.tokens_per_minute"), d));
    let input_tokens_per_minute = r
        .get("input_tokens_per_minute")
        .and_then(|n| positive_int(n, &format!("{path}.input_tokens_per_minute"), d));
    let output_tokens_per_minute = r
        .get("output_tokens_per_minute")
        .and_then(|n| positive_int(n, &format!("{path}.output_tokens_per_minute"), d));
    // Under `--shard I/N` a configured limit is the shard's share unless it is the shard's
    // own (a key per shard).
    let limits_per_shard = r.get("limits_per").and_then(|n| {
        let text = string_value(n, &format!("{path}.limits_per"), d)?;
        match text.as_str() {
            "key" => Some(false),
            "shard" => Some(true),
            _ => {
                d.error(
                    n.pos,
                    format!(
                        "`{path}.limits_per` must be key (the limits are the key's, shared by \
                         every shard) or shard (each shard has its own key), found `{text}`"
                    ),
                );
                None
            }
        }
    });
    let local = r
        .get("local")
        .and_then(|n| bool_value(n, &format!("{path}.local"), d));
    let request_timeout = r
        .get("timeout_secs")
        .and_then(|n| seconds(n, &format!("{path}.timeout_secs"), d));
    let connect_timeout = r
        .get("connect_timeout_secs")
        .and_then(|n| seconds(n, &format!("{path}.connect_timeout_secs"), d));
    r.finish(d);
    if kind_node.is_none() && !PRESET_NAMES.contains(&name) {
        d.error(
            key.pos,
            format!(
                "provider `{name}` needs a `kind`: openai (any OpenAI-compatible server) or \
                 anthropic"
            ),
        );
    }
    if d.out.error_count() > errors_before {
        return None;
    }
    Some(ProviderConfig {
        name: name.to_owned(),
        file: Arc::clone(&d.file),
        pos: key.pos,
        kind,
        base_url,
        api_key_env,
        routing_pos,
        structured_output,
        scope: Scope::Global,
        default_model,
        aliases,
        limits: RateLimits {
            requests_per_minute,
            tokens_per_minute,
            input_tokens_per_minute,
            output_tokens_per_minute,
        },
        limits_per_shard,
        local,
        request_timeout,
        connect_timeout,
    })
}

fn read_kind(node: &Node, path: &str, d: &mut FileDiags<'_>) -> Option<ProviderKind> {
    let text = string_value(node, path, d)?;
    match text.to_ascii_lowercase().as_str() {
        "openai" => Some(ProviderKind::OpenAi),
        "anthropic" => Some(ProviderKind::Anthropic),
        _ => {
            d.push(
                Diagnostic::error(format!(
                    "unknown provider kind `{text}` in `{path}`; use one of openai, anthropic"
                ))
                .at(d.span(node.pos))
                .with_hint(
                    "every OpenAI-compatible server (Ollama, vLLM, llama.cpp, LM Studio, \
                     OpenRouter, Groq, Gemini's OpenAI endpoint, ...) is `kind: openai` with its \
                     `base_url`",
                ),
            );
            None
        }
    }
}

fn read_url(node: &Node, path: &str, d: &mut FileDiags<'_>) -> Option<String> {
    let text = string_value(node, path, d)?;
    let text = text.trim_end_matches('/').to_owned();
    match reqwest::Url::parse(&text) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => Some(text),
        _ => {
            d.error(
                node.pos,
                format!(
                    "`{path}` must be an http:// or https:// URL (for example \
                     `http://localhost:8000/v1`)"
                ),
            );
            None
        }
    }
}

/// The name of an environment variable. A value that is not one may be the key itself, so
/// the error neither quotes it nor shows its line.
fn read_env_name(node: &Node, path: &str, d: &mut FileDiags<'_>) -> Option<String> {
    let text = match node.as_str() {
        Some(text) if node.as_map().is_none() && node.as_seq().is_none() => text.trim(),
        _ => {
            d.error(
                node.pos,
                format!(
                    "`{path}` must be the name of an environment variable, found {}",
                    node.kind_name()
                ),
            );
            return None;
        }
    };
    if is_env_name(text) && !looks_like_key(text) {
        return Some(text.to_owned());
    }
    d.push(
        no_echo(
            d.file.path(),
            node.pos,
            format!(
                "`{path}` must be the NAME of the environment variable that holds the key \
                 (letters, digits and `_`, like OPENAI_API_KEY), not the key itself"
            ),
        )
        .with_hint("if a key was written here, remove it from the file and consider it leaked"),
    );
    None
}

fn is_env_name(text: &str) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A long mixed-case or lowercase token with digits reads as a key, not a variable name.
fn looks_like_key(text: &str) -> bool {
    redact(text, None) != text
        || (text.len() >= 24
            && text.chars().any(|c| c.is_ascii_lowercase())
            && text.chars().any(|c| c.is_ascii_digit()))
}

fn read_aliases(node: &Node, path: &str, d: &mut FileDiags<'_>) -> IndexMap<String, String> {
    let mut aliases = IndexMap::new();
    let Some(entries) = node.as_map() else {
        d.error(
            node.pos,
            format!(
                "`{path}` must be a mapping of names to model ids (`sonnet: gpt-4o`), found {}",
                node.kind_name()
            ),
        );
        return aliases;
    };
    for (key, value) in entries {
        let Some(alias) = key.as_str().map(str::trim).filter(|a| !a.is_empty()) else {
            d.error(
                key.pos,
                format!("an alias name in `{path}` must be a string"),
            );
            continue;
        };
        if let Some(model) = string_value(value, &format!("{path}.{alias}"), d) {
            aliases.insert(alias.to_owned(), model);
        }
    }
    aliases
}

/// An output limit in tokens: a whole number from 1 to 2^32 - 1.
fn output_limit(node: &Node, path: &str, d: &mut FileDiags<'_>) -> Option<u32> {
    let n = positive_int(node, path, d)?;
    let limit = u32::try_from(n).ok();
    if limit.is_none() {
        d.error(
            node.pos,
            format!("`{path}` must be at most {}, found {n}", u32::MAX),
        );
    }
    limit
}

fn positive_int(node: &Node, path: &str, d: &mut FileDiags<'_>) -> Option<u64> {
    match node.to_json().as_u64() {
        Some(n) if n >= 1 => Some(n),
        _ => {
            d.error(
                node.pos,
                format!(
                    "`{path}` must be a whole number ≥ 1, found {}",
                    describe(node)
                ),
            );
            None
        }
    }
}

fn seconds(node: &Node, path: &str, d: &mut FileDiags<'_>) -> Option<Duration> {
    match node.to_json().as_f64() {
        Some(s) if s > 0.0 && s <= MAX_TIMEOUT_SECS => Some(Duration::from_secs_f64(s)),
        _ => {
            d.error(
                node.pos,
                format!(
                    "`{path}` must be a number of seconds > 0, found {}",
                    describe(node)
                ),
            );
            None
        }
    }
}

fn non_negative(node: &Node, path: &str, d: &mut FileDiags<'_>) -> Option<f64> {
    match node.to_json().as_f64() {
        Some(n) if n >= 0.0 && n.is_finite() => Some(n),
        _ => {
            d.error(
                node.pos,
                format!(
                    "`{path}` must be a number ≥ 0 (USD per million tokens), found {}",
                    describe(node)
                ),
            );
            None
        }
    }
}

/// A scalar's text in backticks, or the kind of a collection.
fn describe(node: &Node) -> String {
    match node.as_str() {
        Some(text) if node.as_map().is_none() && node.as_seq().is_none() => format!("`{text}`"),
        _ => node.kind_name().to_owned(),
    }
}

fn read_prices(node: &Node, d: &mut FileDiags<'_>) -> IndexMap<String, Located<Price>> {
    let mut prices = IndexMap::new();
    let Some(entries) = node.as_map() else {
        d.error(
            node.pos,
            format!(
                "`prices` must be a mapping of model ids to `{{ input: USD, output: USD }}`, \
                 found {}",
                node.kind_name()
            ),
        );
        return prices;
    };
    for (key, value) in entries {
        let Some(model) = key.as_str().map(str::trim).filter(|m| !m.is_empty()) else {
            d.error(key.pos, "a model id in `prices` must be a string");
            continue;
        };
        let path = format!("prices.{model}");
        let Some(mut r) = MapReader::new(value, path.clone()) else {
            d.error(
                value.pos,
                format!(
                    "`{path}` must be `{{ input: USD, output: USD }}` per million tokens, found {}",
                    value.kind_name()
                ),
            );
            continue;
        };
        let input = r.get("input");
        let output = r.get("output");
        let input_value = input.and_then(|n| non_negative(n, &format!("{path}.input"), d));
        let output_value = output.and_then(|n| non_negative(n, &format!("{path}.output"), d));
        let cached_input = r
            .get("cached_input")
            .and_then(|n| non_negative(n, &format!("{path}.cached_input"), d));
        let cache_write = r
            .get("cache_write")
            .and_then(|n| non_negative(n, &format!("{path}.cache_write"), d));
        r.finish(d);
        for (field, node) in [("input", input), ("output", output)] {
            if node.is_none() {
                d.error(
                    key.pos,
                    format!("`{path}` needs `{field}` (USD per million tokens)"),
                );
            }
        }
        if let (Some(input), Some(output)) = (input_value, output_value) {
            prices.insert(
                model.to_owned(),
                Located {
                    value: {
                        let price = Price::with_cache_defaults(model, input, output);
                        Price {
                            cached_input: cached_input.unwrap_or(price.cached_input),
                            cache_write: cache_write.unwrap_or(price.cache_write),
                            ..price
                        }
                    },
                    file: Arc::clone(&d.file),
                    pos: key.pos,
                },
            );
        }
    }
    prices
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::Severity;

    const SECRET: &str = "sk-proj-AbCdEfGhIjKlMnOpQrStUv0123456789";

    fn parse_text(text: &str) -> (Config, Diagnostics) {
        let file = SourceFile::new("/p/summon.yaml", text);
        let mut diags = Diagnostics::default();
        let config = Config::parse(&file, &mut diags);
        (config, diags)
    }

    /// Every diagnostic, rendered as the user would see it.
    fn rendered(diags: &Diagnostics) -> String {
        crate::diag::render_all(&diags.items, Path::new("/"), crate::color::Palette::plain())
    }

    fn temp_env(global: Option<&str>, project: Option<&str>) -> (tempfile::TempDir, Env) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let xdg = tmp.path().join("xdg");
        let cwd = tmp.path().join("proj");
        std::fs::create_dir_all(xdg.join("summon")).expect("mkdir");
        std::fs::create_dir_all(&cwd).expect("mkdir");
        if let Some(text) = global {
            std::fs::write(xdg.join("summon/config.yaml"), text).expect("write");
        }
        if let Some(text) = project {
            std::fs::write(cwd.join("summon.yaml"), text).expect("write");
        }
        let env = Env::for_test(
            &cwd,
            &[
                ("HOME", tmp.path().join("home").to_str().expect("utf-8")),
                ("XDG_CONFIG_HOME", xdg.to_str().expect("utf-8")),
            ],
        );
        (tmp, env)
    }

    #[test]
    fn the_output_limit_is_read_and_the_project_file_wins() {
        let (config, diags) = parse_text("max_output_tokens: 16000\n");
        assert!(diags.items.is_empty(), "{diags:?}");
        assert_eq!(config.max_output_tokens, Some(16000));
        let (_tmp, env) = temp_env(
            Some("max_output_tokens: 100\n"),
            Some("max_output_tokens: 200\n"),
        );
        assert_eq!(load(&env).config.max_output_tokens, Some(200));
        let (_tmp, env) = temp_env(Some("max_output_tokens: 100\n"), Some("{}\n"));
        assert_eq!(load(&env).config.max_output_tokens, Some(100));
    }

    #[test]
    fn full_example_parses() {
        let (config, diags) = parse_text(
            "default_provider: work\n\
             default_model: gpt-4o-mini\n\
             providers:\n\
            \x20 work:\n\
            \x20   kind: openai\n\
            \x20   base_url: https://api.openai.com/v1/\n\
            \x20   api_key_env: OPENAI_API_KEY\n\
            \x20   default_model: gpt-4o-mini\n\
            \x20   aliases: { sonnet: gpt-4o, fast: gpt-4o-mini }\n\
            \x20   requests_per_minute: 500\n\
            \x20   tokens_per_minute: 200000\n\
            \x20   timeout_secs: 600\n\
            \x20   connect_timeout_secs: 2.5\n\
             prices:\n\
            \x20 gpt-4o-mini: { input: 0.15, output: 0.60 }\n",
        );
        assert!(diags.items.is_empty(), "{}", rendered(&diags));
        assert_eq!(
            config.default_provider.as_ref().map(|v| v.value.as_str()),
            Some("work")
        );
        assert_eq!(
            config.default_provider.as_ref().map(|v| v.pos.line),
            Some(1)
        );
        let work = &config.providers["work"];
        assert_eq!(work.kind, Some(ProviderKind::OpenAi));
        assert_eq!(work.base_url.as_deref(), Some("https://api.openai.com/v1"));
        assert_eq!(work.api_key_env.as_deref(), Some("OPENAI_API_KEY"));
        assert_eq!(work.aliases["sonnet"], "gpt-4o");
        assert_eq!(work.limits.requests_per_minute, Some(500));
        assert_eq!(work.limits.tokens_per_minute, Some(200_000));
        assert_eq!(work.request_timeout, Some(Duration::from_secs(600)));
        assert_eq!(work.connect_timeout, Some(Duration::from_millis(2500)));
        assert_eq!(work.pos.line, 4);
        assert_eq!(
            config.price("gpt-4o-mini"),
            Some(Price {
                input: 0.15,
                output: 0.6,
                cached_input: 0.075,
                cache_write: 0.15,
            })
        );
    }

    #[test]
    fn cache_prices_default_by_model_family_and_can_be_set() {
        let (config, diags) = parse_text(
            "prices:\n  claude-sonnet-4-5: { input: 3, output: 15 }\n  local: { input: 1, output: 2, cached_input: 0.5, cache_write: 1.5 }\n",
        );
        assert!(diags.items.is_empty(), "{}", rendered(&diags));
        let claude = config.price("claude-sonnet-4-5").unwrap();
        assert!((claude.cached_input - 0.3).abs() < 1e-12);
        assert!((claude.cache_write - 3.75).abs() < 1e-12);
        let local = config.price("local").unwrap();
        assert_eq!((local.cached_input, local.cache_write), (0.5, 1.5));
        let usage = crate::provider::Usage {
            input_tokens: 1_000_000,
            output_tokens: 0,
            cache_read_tokens: 500_000,
            cache_write_tokens: 250_000,
        };
        // 250k uncached at 3, 500k read at 0.3, 250k written at 3.75.
        assert!((claude.cost(&usage) - (0.75 + 0.15 + 0.9375)).abs() < 1e-9);
    }

    #[test]
    fn empty_and_comment_only_files_are_fine() {
        for text in ["", "# nothing yet\n", "---\n"] {
            let (config, diags) = parse_text(text);
            assert!(diags.items.is_empty(), "{text:?}: {}", rendered(&diags));
            assert!(config.providers.is_empty());
        }
    }

    #[test]
    fn unknown_keys_warn_with_dotted_path_and_line() {
        let (config, diags) = parse_text(
            "default_provider: work\n\
             providers:\n\
            \x20 work:\n\
            \x20   kind: openai\n\
            \x20   base_ulr: http://x\n\
             colour: blue\n",
        );
        assert!(!diags.has_errors(), "{}", rendered(&diags));
        let text = rendered(&diags);
        assert!(
            text.contains("summon.yaml:5:5: warning: unknown key `providers.work.base_ulr`"),
            "{text}"
        );
        assert!(
            text.contains("summon.yaml:6:1: warning: unknown key `colour`"),
            "{text}"
        );
        assert!(config.providers.contains_key("work"));
    }

    #[test]
    fn bad_values_are_errors_at_their_position() {
        let cases: &[(&str, &str)] = &[
            (
                "providers:\n  g:\n    kind: gemini\n",
                "summon.yaml:3:11: error: unknown provider kind `gemini` in `providers.g.kind`; use one of openai, anthropic",
            ),
            (
                "providers:\n  w:\n    base_url: http://x/v1\n",
                "summon.yaml:2:3: error: provider `w` needs a `kind`",
            ),
            (
                "providers:\n  w:\n    kind: openai\n    base_url: localhost:8000\n",
                "summon.yaml:4:15: error: `providers.w.base_url` must be an http:// or https:// URL",
            ),
            (
                "providers:\n  w:\n    kind: openai\n    requests_per_minute: 0\n",
                "summon.yaml:4:26: error: `providers.w.requests_per_minute` must be a whole number ≥ 1, found `0`",
            ),
            (
                "max_output_tokens: 0\n",
                "summon.yaml:1:20: error: `max_output_tokens` must be a whole number ≥ 1, found `0`",
            ),
            (
                "max_output_tokens: 5000000000\n",
                "summon.yaml:1:20: error: `max_output_tokens` must be at most 4294967295, found 5000000000",
            ),
            (
                "providers:\n  w:\n    kind: openai\n    timeout_secs: soon\n",
                "summon.yaml:4:19: error: `providers.w.timeout_secs` must be a number of seconds > 0, found `soon`",
            ),
            (
                "providers:\n  w:\n    kind: openai\n    aliases: [a, b]\n",
                "summon.yaml:4:14: error: `providers.w.aliases` must be a mapping",
            ),
            (
                "providers: [openai]\n",
                "summon.yaml:1:12: error: `providers` must be a mapping",
            ),
            (
                "prices:\n  m: { input: 1 }\n",
                "summon.yaml:2:3: error: `prices.m` needs `output`",
            ),
            (
                "prices:\n  m: { input: -1, output: 2 }\n",
                "summon.yaml:2:15: error: `prices.m.input` must be a number ≥ 0",
            ),
            (
                "default_model: [a]\n",
                "summon.yaml:1:16: error: `default_model` must be a string, found a list",
            ),
            (
                "- a\n- b\n",
                "summon.yaml:1:1: error: a config file must be a mapping",
            ),
            ("providers: {\n", "summon.yaml:"),
        ];
        for (text, expected) in cases {
            let (config, diags) = parse_text(text);
            assert!(diags.has_errors(), "{text:?}");
            let out = rendered(&diags);
            assert!(out.contains(expected), "{text:?}\n{out}");
            assert!(
                config.providers.is_empty(),
                "{text:?}: a broken provider is left out"
            );
        }
    }

    #[test]
    fn shell_env_is_a_list_of_variable_names_none_a_key() {
        let (config, diags) = parse_text("shell_env: [GOPATH, CARGO_HOME]\n");
        assert!(diags.items.is_empty(), "{}", rendered(&diags));
        let names: Vec<&str> = config
            .shell_env
            .iter()
            .map(|n| n.name.value.as_str())
            .collect();
        assert_eq!(names, ["GOPATH", "CARGO_HOME"]);
        for (text, expected) in [
            (
                "shell_env: GOPATH\n",
                "summon.yaml:1:12: error: `shell_env` must be a list of environment variable names",
            ),
            (
                "shell_env: [GOPATH, {a: 1}]\n",
                "summon.yaml:1:21: error: `shell_env[1]` must be the name of an environment variable, found a mapping",
            ),
            (
                "shell_env: [not-a-name]\n",
                "`shell_env[0]` must be the name of an environment variable (letters, digits and `_`, like GOPATH) (line 1)",
            ),
            (
                "shell_env: [MY_API_KEY]\n",
                "summon.yaml:1:13: error: `shell_env[0]` is MY_API_KEY, named like an API key",
            ),
        ] {
            let (config, diags) = parse_text(text);
            assert!(diags.has_errors(), "{text:?}");
            let out = rendered(&diags);
            assert!(out.contains(expected), "{text:?}\n{out}");
            assert!(config.shell_env.len() <= 1, "{text:?}");
        }
    }

    #[test]
    fn a_preset_name_needs_no_kind() {
        let (config, diags) =
            parse_text("providers:\n  openai:\n    requests_per_minute: 60\n  ollama: {}\n");
        assert!(diags.items.is_empty(), "{}", rendered(&diags));
        assert_eq!(config.providers["openai"].kind, None);
        assert!(config.providers.contains_key("ollama"));
    }

    #[test]
    fn literal_api_key_is_refused_without_echo() {
        for text in [
            format!("providers:\n  w:\n    kind: openai\n    api_key: {SECRET}\n"),
            format!("providers:\n  w:\n    kind: openai\n    api_key: \"{SECRET}\"\n"),
            format!("api_key: {SECRET}\n"),
            // The key where the variable name belongs.
            format!("providers:\n  w:\n    kind: openai\n    api_key_env: {SECRET}\n"),
            "providers:\n  w:\n    kind: openai\n    api_key_env: gsk_4f9aQ2b7Xc1d8E3f6G5h0JkLmN\n"
                .to_owned(),
            // Secrets under unknown keys are not quoted either.
            format!("providers:\n  w:\n    kind: openai\n    token: {SECRET}\n"),
            format!("providers:\n  w:\n    kind: openai\n    extra: {SECRET}\n"),
        ] {
            let (_, diags) = parse_text(&text);
            let out = rendered(&diags);
            assert!(!diags.items.is_empty(), "{text}");
            assert!(!out.contains("sk-proj"), "{out}");
            assert!(!out.contains("gsk_"), "{out}");
            assert!(!out.contains("AbCdEf"), "{out}");
            let line = text.lines().count();
            assert!(out.contains(&format!("(line {line})")), "{out}");
            for d in &diags.items {
                assert!(d.span.is_none(), "no excerpt: {out}");
                assert_eq!(d.path.as_deref(), Some(Path::new("/p/summon.yaml")));
            }
        }
        let (_, diags) = parse_text(&format!(
            "providers:\n  w:\n    kind: openai\n    api_key: {SECRET}\n"
        ));
        assert_eq!(diags.items[0].severity, Severity::Error);
        let out = rendered(&diags);
        assert!(out.contains("`providers.w.api_key`"), "{out}");
        assert!(out.contains("`providers.w.api_key_env`"), "{out}");
    }

    #[test]
    fn global_and_project_files_merge() {
        let (_tmp, env) = temp_env(
            Some(
                "default_provider: work\n\
                 default_model: g-model\n\
                 providers:\n\
                \x20 work: { kind: openai, base_url: http://global/v1, default_model: gw }\n\
                \x20 other: { kind: anthropic }\n\
                 prices:\n\
                \x20 a: { input: 1, output: 2 }\n\
                \x20 b: { input: 1, output: 2 }\n",
            ),
            Some(
                "default_model: p-model\n\
                 providers:\n\
                \x20 work: { kind: openai, base_url: http://project/v1 }\n\
                 prices:\n\
                \x20 b: { input: 3, output: 4 }\n",
            ),
        );
        let (config, warnings) = load_config(&env).expect("valid config");
        assert!(warnings.items.is_empty());
        let global = global_path(&env).expect("global path");
        let project = project_path(&env);
        assert_eq!(
            config.files,
            [
                ConfigFileInfo {
                    scope: Scope::Global,
                    path: global.clone(),
                    found: true
                },
                ConfigFileInfo {
                    scope: Scope::Project,
                    path: project.clone(),
                    found: true
                },
            ]
        );
        let provider = config.default_provider.as_ref().expect("default provider");
        assert_eq!(
            (provider.value.as_str(), provider.path()),
            ("work", global.as_path())
        );
        let model = config.default_model.as_ref().expect("default model");
        assert_eq!(
            (model.value.as_str(), model.path()),
            ("p-model", project.as_path())
        );
        // The project's `work` replaces the global one wholly: no default_model survives.
        let work = &config.providers["work"];
        assert_eq!(work.base_url.as_deref(), Some("http://project/v1"));
        assert_eq!(work.default_model, None);
        assert_eq!(work.path(), project);
        assert_eq!(config.providers["other"].path(), global);
        assert_eq!(config.price("a").map(|p| p.input), Some(1.0));
        assert_eq!(config.price("b").map(|p| p.input), Some(3.0));
        assert_eq!(config.prices["b"].path(), project);
    }

    #[test]
    fn missing_files_are_fine_and_errors_come_back() {
        let (_tmp, env) = temp_env(None, None);
        let (config, warnings) = load_config(&env).expect("no files is fine");
        assert!(warnings.items.is_empty());
        assert_eq!(config.found_files().count(), 0);
        assert_eq!(config.files.len(), 2);

        let (_tmp, env) = temp_env(
            Some("providers:\n  g:\n    kind: gemini\n"),
            Some("colour: blue\n"),
        );
        let diags = load_config(&env).expect_err("bad kind");
        assert_eq!(diags.error_count(), 1);
        assert_eq!(diags.warning_count(), 1);
        let out = rendered(&diags);
        assert!(out.contains("summon/config.yaml:3:11: error"), "{out}");
        // `load` keeps what could be read, for `doctor`.
        let loaded = load(&env);
        assert_eq!(loaded.config.found_files().count(), 2);
    }

    #[test]
    fn a_directory_in_place_of_the_file_is_an_error() {
        let (_tmp, env) = temp_env(None, None);
        std::fs::create_dir(project_path(&env)).expect("mkdir");
        let diags = load_config(&env).expect_err("unreadable");
        assert!(
            diags.items[0]
                .message
                .contains("cannot read the config file")
        );
    }
}
