//! Provider definitions: the built-in presets (`openai`, `anthropic`, `ollama`), which work
//! without any config file, and config entries laid over them.
//!
//! - `openai`: kind openai at `OPENAI_BASE_URL` (with `/v1`, as OpenAI's SDKs take it) or
//!   `https://api.openai.com/v1`; key `OPENAI_API_KEY`, required at the official URL only.
//! - `anthropic`: kind anthropic at `ANTHROPIC_BASE_URL` (without `/v1`) or
//!   `https://api.anthropic.com`; key `ANTHROPIC_API_KEY`, required; the Claude aliases
//!   `sonnet`, `opus`, `haiku`.
//! - `ollama`: kind openai at `{OLLAMA_HOST}/v1`, `OLLAMA_HOST` defaulting to
//!   `http://localhost:11434` and accepted with or without scheme and port, as Ollama reads it;
//!   no key.
//! - `local`: the built-in local model ([`crate::local`]), kind openai at an endpoint inside
//!   summon's process, known only once the model is started; no key.

use std::time::Duration;

use indexmap::IndexMap;

use super::file::{Config, ProviderConfig};
use super::resolve::Origin;
use crate::env::Env;
use crate::provider::{ProviderKind, RateLimits};

/// The built-in provider names.
pub(crate) const PRESET_NAMES: [&str; 4] = ["openai", "anthropic", "ollama", "local"];

pub(crate) const OPENAI_URL: &str = "https://api.openai.com/v1";
pub(crate) const ANTHROPIC_URL: &str = "https://api.anthropic.com";
pub(crate) const OLLAMA_URL: &str = "http://localhost:11434";
const OLLAMA_PORT: u16 = 11434;

/// The model aliases Claude Code's agent files use, and what they mean on Anthropic's API.
pub(crate) const CLAUDE_ALIASES: [(&str, &str); 3] = [
    ("sonnet", "claude-sonnet-4-5"),
    ("opus", "claude-opus-4-1"),
    ("haiku", "claude-haiku-4-5"),
];

/// Everything needed to talk to one provider, with where the main values came from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProviderDef {
    pub(crate) name: String,
    pub(crate) kind: ProviderKind,
    /// For openai kind with `/v1`; for anthropic without.
    pub(crate) base_url: String,
    pub(crate) base_url_origin: Origin,
    /// The variable holding the key.
    pub(crate) api_key_env: Option<String>,
    /// Whether a missing key is an error (hosted APIs, or a key variable named explicitly).
    pub(crate) key_required: bool,
    pub(crate) default_model: Option<(String, Origin)>,
    /// Model name → model id; config aliases over built-in ones.
    pub(crate) aliases: IndexMap<String, String>,
    pub(crate) limits: RateLimits,
    /// The limits are each shard's own (`limits_per: shard`), not shared by the shards.
    pub(crate) limits_per_shard: bool,
    /// `local` in the config file: the server is local (or not) whatever its URL says.
    pub(crate) local: Option<bool>,
    pub(crate) request_timeout: Option<Duration>,
    pub(crate) connect_timeout: Option<Duration>,
    /// Where the definition itself came from: [`Origin::Preset`] or [`Origin::ConfigFile`].
    pub(crate) origin: Origin,
    /// What an OpenAI-compatible server is asked for structured answers.
    pub(crate) structured_output: Option<crate::provider::OpenAiFormat>,
    /// Where the project's `summon.yaml` sets this provider's `base_url` or `api_key_env`:
    /// those apply only in a trusted project.
    pub(crate) project_routing: Option<crate::diag::Span>,
}

/// Every provider name that can be used: presets, then configured ones.
pub(crate) fn known_names(config: &Config) -> Vec<&str> {
    let mut names: Vec<&str> = PRESET_NAMES.to_vec();
    for name in config.providers.keys() {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    names
}

/// The variables providers take their keys from, with the provider's name: every preset's
/// and every configured provider's `api_key_env`.
pub(crate) fn key_variables(env: &Env, config: &Config) -> Vec<(String, String)> {
    known_names(config)
        .into_iter()
        .filter_map(|name| {
            let variable = lookup(name, env, config)?.api_key_env?;
            Some((variable, name.to_owned()))
        })
        .collect()
}

/// The definition of provider `name`: a config entry over the preset of that name, or either
/// alone; `None` when it is neither.
pub(crate) fn lookup(name: &str, env: &Env, config: &Config) -> Option<ProviderDef> {
    let preset = preset(name, env);
    match config.providers.get(name) {
        Some(entry) => Some(from_config(entry, preset)),
        None => preset,
    }
}

/// A built-in preset.
pub(crate) fn preset(name: &str, env: &Env) -> Option<ProviderDef> {
    let (kind, base_url, base_url_origin, api_key_env) = match name {
        "openai" => {
            let (url, origin) = env_or(env, "OPENAI_BASE_URL", OPENAI_URL);
            (ProviderKind::OpenAi, url, origin, Some("OPENAI_API_KEY"))
        }
        "anthropic" => {
            let (url, origin) = env_or(env, "ANTHROPIC_BASE_URL", ANTHROPIC_URL);
            let url = url.strip_suffix("/v1").map(str::to_owned).unwrap_or(url);
            (
                ProviderKind::Anthropic,
                url,
                origin,
                Some("ANTHROPIC_API_KEY"),
            )
        }
        "ollama" => {
            let (root, origin) = ollama_root(env);
            (ProviderKind::OpenAi, format!("{root}/v1"), origin, None)
        }
        crate::local::PROVIDER => (
            ProviderKind::OpenAi,
            crate::local::NOT_STARTED_URL.to_owned(),
            Origin::Preset,
            None,
        ),
        _ => return None,
    };
    Some(ProviderDef {
        name: name.to_owned(),
        kind,
        key_required: key_required_by_url(kind, &base_url),
        base_url,
        base_url_origin,
        api_key_env: api_key_env.map(str::to_owned),
        default_model: (name == crate::local::PROVIDER)
            .then(|| (crate::local::model_name(env), Origin::Preset)),
        aliases: builtin_aliases(kind),
        limits: RateLimits::default(),
        limits_per_shard: false,
        local: None,
        request_timeout: None,
        connect_timeout: None,
        origin: Origin::Preset,
        structured_output: None,
        project_routing: None,
    })
}

fn from_config(entry: &ProviderConfig, preset: Option<ProviderDef>) -> ProviderDef {
    let from_file = || Origin::ConfigFile(entry.path().to_path_buf());
    let kind = entry
        .kind
        .or(preset.as_ref().map(|p| p.kind))
        .unwrap_or(ProviderKind::OpenAi);
    // A preset of another kind has nothing to lend.
    let preset = preset.filter(|p| p.kind == kind);
    let (base_url, base_url_origin) = match (&entry.base_url, &preset) {
        (Some(url), _) => (normalize_base(kind, url), from_file()),
        (None, Some(p)) => (p.base_url.clone(), p.base_url_origin.clone()),
        (None, None) => (official_url(kind).to_owned(), Origin::Preset),
    };
    let (api_key_env, key_required) = match (&entry.api_key_env, &preset) {
        (Some(var), _) => (Some(var.clone()), true),
        (None, Some(p)) => (
            p.api_key_env.clone(),
            p.api_key_env.is_some() && key_required_by_url(kind, &base_url),
        ),
        (None, None) => {
            let required = key_required_by_url(kind, &base_url);
            let default_var = match kind {
                ProviderKind::Anthropic => Some("ANTHROPIC_API_KEY"),
                ProviderKind::OpenAi => required.then_some("OPENAI_API_KEY"),
            };
            (default_var.map(str::to_owned), required)
        }
    };
    let mut aliases = preset
        .as_ref()
        .map_or_else(|| builtin_aliases(kind), |p| p.aliases.clone());
    aliases.extend(entry.aliases.clone());
    let default_model = entry
        .default_model
        .clone()
        .map(|m| (m, from_file()))
        .or_else(|| preset.and_then(|p| p.default_model));
    ProviderDef {
        name: entry.name.clone(),
        kind,
        base_url,
        base_url_origin,
        api_key_env,
        key_required,
        default_model,
        aliases,
        limits: entry.limits,
        limits_per_shard: entry.limits_per_shard.unwrap_or(false),
        local: entry.local,
        request_timeout: entry.request_timeout,
        connect_timeout: entry.connect_timeout,
        origin: from_file(),
        structured_output: entry.structured_output,
        project_routing: entry
            .routing_pos
            .filter(|_| entry.scope == super::file::Scope::Project)
            .map(|pos| crate::diag::Span::new(&entry.file, pos)),
    }
}

/// Whether `def` is the built-in local model (the `local` preset, its base URL not replaced
/// by a config entry).
pub(crate) fn is_builtin_local(def: &ProviderDef) -> bool {
    def.base_url == crate::local::NOT_STARTED_URL
}

fn official_url(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::OpenAi => OPENAI_URL,
        ProviderKind::Anthropic => ANTHROPIC_URL,
    }
}

fn builtin_aliases(kind: ProviderKind) -> IndexMap<String, String> {
    match kind {
        ProviderKind::Anthropic => CLAUDE_ALIASES
            .iter()
            .map(|(alias, model)| ((*alias).to_owned(), (*model).to_owned()))
            .collect(),
        ProviderKind::OpenAi => IndexMap::new(),
    }
}

/// Anthropic always wants a key; OpenAI-compatible servers only at OpenAI itself (local
/// servers need none).
fn key_required_by_url(kind: ProviderKind, base_url: &str) -> bool {
    match kind {
        ProviderKind::Anthropic => true,
        ProviderKind::OpenAi => reqwest::Url::parse(base_url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_ascii_lowercase))
            .is_some_and(|host| host == "api.openai.com"),
    }
}

fn normalize_base(kind: ProviderKind, url: &str) -> String {
    let url = url.trim().trim_end_matches('/');
    match kind {
        ProviderKind::OpenAi => url.to_owned(),
        ProviderKind::Anthropic => url.strip_suffix("/v1").unwrap_or(url).to_owned(),
    }
}

fn env_or(env: &Env, var: &str, default: &str) -> (String, Origin) {
    match env.var(var).map(str::trim).filter(|v| !v.is_empty()) {
        Some(value) => (
            value.trim_end_matches('/').to_owned(),
            Origin::Env(var.to_owned()),
        ),
        None => (default.to_owned(), Origin::Preset),
    }
}

/// The Ollama server's root URL (without `/v1`) and where it came from.
pub(crate) fn ollama_root(env: &Env) -> (String, Origin) {
    match env
        .var("OLLAMA_HOST")
        .map(str::trim)
        .filter(|v| !v.is_empty())
    {
        Some(host) => (
            normalize_ollama_host(host),
            Origin::Env("OLLAMA_HOST".into()),
        ),
        None => (OLLAMA_URL.to_owned(), Origin::Preset),
    }
}

/// `OLLAMA_HOST` as Ollama reads it: `host`, `host:port`, `scheme://host[:port][/path]`;
/// without a scheme it is http and the port defaults to 11434. The bind-all addresses a server
/// is often started with mean this machine.
fn normalize_ollama_host(raw: &str) -> String {
    let raw = raw.trim().trim_end_matches('/');
    let (scheme, rest, scheme_given) = match raw.split_once("://") {
        Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest, true),
        None => ("http".to_owned(), raw, false),
    };
    let (hostport, path) = match rest.split_once('/') {
        Some((hostport, path)) => (hostport, format!("/{path}")),
        None => (rest, String::new()),
    };
    let path = path.strip_suffix("/v1").unwrap_or(&path);
    let (host, port) = split_host_port(hostport);
    let host = match host.as_str() {
        "" | "0.0.0.0" => "127.0.0.1".to_owned(),
        "[::]" => "[::1]".to_owned(),
        _ => host,
    };
    let port = match port {
        Some(port) => format!(":{port}"),
        None if scheme_given => String::new(),
        None => format!(":{OLLAMA_PORT}"),
    };
    format!("{scheme}://{host}{port}{path}")
}

/// Splits `host:port`, `[v6]:port`, `[v6]`, bare `v6` or `host`; IPv6 hosts come back in
/// brackets.
fn split_host_port(hostport: &str) -> (String, Option<&str>) {
    if let Some(rest) = hostport.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((host, tail)) => (format!("[{host}]"), tail.strip_prefix(':')),
            None => (hostport.to_owned(), None),
        };
    }
    match hostport.matches(':').count() {
        0 => (hostport.to_owned(), None),
        1 => {
            let (host, port) = hostport.split_once(':').unwrap_or((hostport, ""));
            (host.to_owned(), Some(port).filter(|p| !p.is_empty()))
        }
        _ => (format!("[{hostport}]"), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::{Diagnostics, SourceFile};
    use std::path::PathBuf;

    fn env(vars: &[(&str, &str)]) -> Env {
        Env::for_test("/w", vars)
    }

    fn config(text: &str) -> Config {
        let mut diags = Diagnostics::default();
        let config = Config::parse(&SourceFile::new("/w/summon.yaml", text), &mut diags);
        assert!(diags.items.is_empty(), "{:?}", diags.items);
        config
    }

    #[test]
    fn ollama_host_forms() {
        for (raw, expected) in [
            ("127.0.0.1:11434", "http://127.0.0.1:11434"),
            ("127.0.0.1", "http://127.0.0.1:11434"),
            ("localhost:8080", "http://localhost:8080"),
            ("0.0.0.0", "http://127.0.0.1:11434"),
            ("0.0.0.0:9999", "http://127.0.0.1:9999"),
            ("http://localhost:11434/", "http://localhost:11434"),
            ("https://ollama.example.com", "https://ollama.example.com"),
            ("http://box:11434/v1", "http://box:11434"),
            ("http://box/ollama", "http://box/ollama"),
            ("[::1]:11434", "http://[::1]:11434"),
            ("::1", "http://[::1]:11434"),
            ("[::]", "http://[::1]:11434"),
        ] {
            assert_eq!(normalize_ollama_host(raw), expected, "{raw}");
        }
    }

    #[test]
    fn presets_follow_the_environment() {
        let bare = env(&[]);
        let openai = preset("openai", &bare).expect("openai");
        assert_eq!(
            (
                openai.base_url.as_str(),
                openai.key_required,
                &openai.base_url_origin
            ),
            (OPENAI_URL, true, &Origin::Preset)
        );
        assert_eq!(openai.api_key_env.as_deref(), Some("OPENAI_API_KEY"));
        let anthropic = preset("anthropic", &bare).expect("anthropic");
        assert_eq!(anthropic.base_url, ANTHROPIC_URL);
        assert_eq!(anthropic.aliases["sonnet"], "claude-sonnet-4-5");
        assert_eq!(anthropic.aliases["opus"], "claude-opus-4-1");
        assert_eq!(anthropic.aliases["haiku"], "claude-haiku-4-5");
        let ollama = preset("ollama", &bare).expect("ollama");
        assert_eq!(ollama.base_url, "http://localhost:11434/v1");
        assert_eq!(
            (ollama.api_key_env.as_ref(), ollama.key_required),
            (None, false)
        );
        assert!(preset("gemini", &bare).is_none());

        let custom = env(&[
            ("OPENAI_BASE_URL", "http://localhost:8000/v1/"),
            ("ANTHROPIC_BASE_URL", "https://proxy.example/v1"),
            ("OLLAMA_HOST", "10.0.0.5:11434"),
        ]);
        let openai = preset("openai", &custom).expect("openai");
        assert_eq!(openai.base_url, "http://localhost:8000/v1");
        assert_eq!(
            openai.base_url_origin,
            Origin::Env("OPENAI_BASE_URL".into())
        );
        assert!(!openai.key_required, "local servers need no key");
        let anthropic = preset("anthropic", &custom).expect("anthropic");
        assert_eq!(anthropic.base_url, "https://proxy.example");
        assert!(anthropic.key_required);
        let ollama = preset("ollama", &custom).expect("ollama");
        assert_eq!(ollama.base_url, "http://10.0.0.5:11434/v1");
        assert_eq!(ollama.base_url_origin, Origin::Env("OLLAMA_HOST".into()));
    }

    #[test]
    fn config_entries_override_presets_and_stand_alone() {
        let config = config(
            "providers:\n\
            \x20 openai: { requests_per_minute: 60, aliases: { sonnet: gpt-4o } }\n\
            \x20 anthropic: { base_url: https://gw.example/v1/, aliases: { sonnet: claude-x } }\n\
            \x20 local: { kind: openai, base_url: http://localhost:8000/v1 }\n\
            \x20 hosted: { kind: openai, default_model: gpt-4o }\n\
            \x20 keyed: { kind: openai, base_url: http://h/v1, api_key_env: MY_KEY }\n\
            \x20 claude: { kind: anthropic }\n",
        );
        let file = Origin::ConfigFile(PathBuf::from("/w/summon.yaml"));
        let e = env(&[]);
        let openai = lookup("openai", &e, &config).expect("openai");
        assert_eq!(openai.base_url, OPENAI_URL);
        assert_eq!(openai.base_url_origin, Origin::Preset);
        assert_eq!(openai.limits.requests_per_minute, Some(60));
        assert_eq!(openai.aliases["sonnet"], "gpt-4o");
        assert_eq!(openai.origin, file);
        assert!(openai.key_required);

        let anthropic = lookup("anthropic", &e, &config).expect("anthropic");
        assert_eq!(anthropic.base_url, "https://gw.example");
        assert_eq!(anthropic.aliases["sonnet"], "claude-x");
        assert_eq!(anthropic.aliases["haiku"], "claude-haiku-4-5");
        assert_eq!(anthropic.api_key_env.as_deref(), Some("ANTHROPIC_API_KEY"));

        let local = lookup("local", &e, &config).expect("local");
        assert_eq!(
            (local.api_key_env.as_ref(), local.key_required),
            (None, false)
        );
        assert_eq!(local.base_url_origin, file);

        let hosted = lookup("hosted", &e, &config).expect("hosted");
        assert_eq!(hosted.base_url, OPENAI_URL);
        assert_eq!(hosted.api_key_env.as_deref(), Some("OPENAI_API_KEY"));
        assert!(hosted.key_required);
        assert_eq!(hosted.default_model, Some(("gpt-4o".into(), file.clone())));

        let keyed = lookup("keyed", &e, &config).expect("keyed");
        assert_eq!(
            (keyed.api_key_env.as_deref(), keyed.key_required),
            (Some("MY_KEY"), true)
        );
        let claude = lookup("claude", &e, &config).expect("claude");
        assert_eq!(claude.aliases["opus"], "claude-opus-4-1");
        assert!(claude.key_required);

        assert!(lookup("nope", &e, &config).is_none());
        assert_eq!(
            known_names(&config),
            [
                "openai",
                "anthropic",
                "ollama",
                "local",
                "hosted",
                "keyed",
                "claude"
            ]
        );
    }
}
