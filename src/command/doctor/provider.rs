//! The provider and model a delegation would use, where each setting came from, and whether
//! the provider answers one cheap request (its models list) within a short timeout.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::check::{Check, Section};
use crate::cli::DoctorArgs;
use crate::config::resolve::Origin;
use crate::config::resolve::resolve_with;
use crate::config::{Config, Overrides, Resolved, resolve};
use crate::env::Env;
use crate::provider::{Client, ProviderError, ProviderKind};

/// Bound on connecting to the provider.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on the whole models request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(6);
/// How many model ids a fix lists at most.
const MODELS_SHOWN: usize = 8;

/// What the JSON output says about the provider and model.
#[derive(Debug, Default)]
pub(super) struct Report {
    pub(super) provider: Option<Value>,
    pub(super) model: Option<Value>,
}

pub(super) fn check(
    args: &DoctorArgs,
    env: &Env,
    config: &Config,
    checks: &mut Vec<Check>,
) -> Report {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            checks.push(Check::error(
                Section::Provider,
                format!("cannot start the network runtime: {e}"),
            ));
            return Report::default();
        }
    };
    let overrides = Overrides {
        provider_flag: args.provider.as_deref(),
        model_flag: args.model.as_deref(),
        ..Overrides::default()
    };
    // Offline, auto-detection does not probe for a local Ollama either.
    let resolved = if args.offline {
        resolve_with(env, config, &overrides, |_| false)
    } else {
        runtime.block_on(resolve(env, config, &overrides))
    };
    let resolved = match resolved {
        Ok(resolved) => resolved,
        Err(diagnostic) => {
            let mut check = Check::from_diagnostic(
                Section::Provider,
                &diagnostic,
                "see docs/providers.md, \"Providers and models\"",
            );
            if args.offline {
                check
                    .message
                    .push_str("\n(--offline: a local Ollama was not looked for)");
            }
            checks.push(check);
            return Report::default();
        }
    };
    describe(&resolved, env, checks);
    let answers = if args.offline {
        checks.push(Check::ok(
            Section::Provider,
            "not asked whether the provider answers (--offline)",
        ));
        None
    } else {
        Some(runtime.block_on(ping(&resolved, checks)))
    };
    let asked = answers.as_ref().is_some_and(|a| a.ok);
    checks.push(window_check(&resolved, config, asked, &runtime));
    report(&resolved, answers)
}

/// The model's context window and where it comes from: the config file, the built-in list,
/// or (asked only when the provider answers and nothing else gives it) the server.
fn window_check(
    r: &Resolved,
    config: &Config,
    ask: bool,
    runtime: &tokio::runtime::Runtime,
) -> Check {
    let model = &r.model;
    let known = config.window_origin(model).or_else(|| {
        ask.then(|| runtime.block_on(crate::provider::server_window(&r.endpoint, model)))
            .flatten()
            .map(|w| (w.tokens, format!("the server: {}", w.from)))
    });
    match known {
        Some((tokens, from)) => Check::ok(
            Section::Provider,
            format!("context window of `{model}`: {tokens} tokens (from {from})"),
        ),
        None => Check::ok(
            Section::Provider,
            format!(
                "context window of `{model}`: unknown; requests are not checked against it, \
                 and `reduce: auto` needs `models: {{{model}: {{context_window: TOKENS}}}}` in \
                 summon.yaml"
            ),
        ),
    }
}

/// The provider, its endpoint and key, and the model, each with where it came from.
fn describe(r: &Resolved, env: &Env, checks: &mut Vec<Check>) {
    let def = &r.provider;
    checks.push(Check::ok(
        Section::Provider,
        format!(
            "provider `{}` (from {})",
            r.provider_name, r.provider_origin
        ),
    ));
    let defined_by = match &def.origin {
        Origin::ConfigFile(path) => format!("; defined in {}", path.display()),
        _ => String::new(),
    };
    checks.push(Check::ok(
        Section::Provider,
        format!(
            "{} API at {} (from {}){defined_by}",
            kind_name(def.kind),
            r.endpoint.base_url,
            def.base_url_origin,
        ),
    ));
    let alias = r
        .model_alias
        .as_ref()
        .map(|a| format!(", alias `{a}`"))
        .unwrap_or_default();
    checks.push(Check::ok(
        Section::Provider,
        format!("model `{}` (from {}{alias})", r.model, r.model_origin),
    ));
    let key = match (&r.endpoint.api_key, &r.endpoint.api_key_env) {
        (Some(_), Some(var)) => match env.credentials_file_of(var) {
            Some(file) => Check::ok(
                Section::Provider,
                format!(
                    "API key set in {var}, read from {} (not shown)",
                    file.display()
                ),
            ),
            None => Check::ok(
                Section::Provider,
                format!("API key set in {var} (not shown)"),
            ),
        },
        (Some(_), None) => Check::ok(Section::Provider, "API key set (not shown)"),
        (None, Some(var)) => Check::ok(
            Section::Provider,
            format!("no API key: {var} is not set, and this server does not require one"),
        ),
        (None, None) => Check::ok(Section::Provider, "no API key needed"),
    };
    checks.push(key);
    for warning in &r.warnings {
        checks.push(Check::from_diagnostic(
            Section::Provider,
            warning,
            "map the alias under the provider's `aliases` in the config file",
        ));
    }
}

fn kind_name(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::OpenAi => "OpenAI-compatible",
        ProviderKind::Anthropic => "Anthropic",
    }
}

/// Outcome of the models request.
struct Answer {
    ok: bool,
    models: Option<usize>,
}

/// One `GET` of the models list; never retried, bounded by [`REQUEST_TIMEOUT`].
async fn ping(r: &Resolved, checks: &mut Vec<Check>) -> Answer {
    let mut endpoint = r.endpoint.clone();
    endpoint.connect_timeout = endpoint.connect_timeout.min(CONNECT_TIMEOUT);
    endpoint.request_timeout = endpoint.request_timeout.min(REQUEST_TIMEOUT);
    let base = endpoint.base_url.clone();
    let key_var = endpoint.api_key_env.clone();
    let client = match Client::new(endpoint) {
        Ok(client) => client,
        Err(e) => {
            checks.push(Check::error(Section::Provider, e.to_string()));
            return Answer {
                ok: false,
                models: None,
            };
        }
    };
    let start = Instant::now();
    let result = tokio::time::timeout(REQUEST_TIMEOUT, client.list_models()).await;
    let ms = start.elapsed().as_millis();
    let fail = |checks: &mut Vec<Check>, check: Check| {
        checks.push(check);
        Answer {
            ok: false,
            models: None,
        }
    };
    let models = match result {
        Err(_) => {
            return fail(
                checks,
                Check::error(
                    Section::Provider,
                    format!(
                        "the provider did not answer within {}s at {base}",
                        REQUEST_TIMEOUT.as_secs()
                    ),
                )
                .fix("check that the server is up and the base URL is right"),
            );
        }
        Ok(Err(error)) => {
            let (check, answered) = failure(&error, &base, key_var.as_deref(), r.endpoint.kind);
            checks.push(check);
            return Answer {
                ok: answered,
                models: None,
            };
        }
        Ok(Ok(models)) => models,
    };
    checks.push(Check::ok(
        Section::Provider,
        format!(
            "the provider answers: {} model(s) listed in {ms} ms",
            models.len()
        ),
    ));
    if !models.is_empty() && !lists_model(&models, &r.model) {
        let mut shown: Vec<&str> = models
            .iter()
            .take(MODELS_SHOWN)
            .map(String::as_str)
            .collect();
        if models.len() > MODELS_SHOWN {
            shown.push("...");
        }
        checks.push(
            Check::warning(
                Section::Provider,
                format!(
                    "model `{}` is not among the models the provider lists",
                    r.model
                ),
            )
            .fix(format!(
                "use one it lists (SUMMON_MODEL, --model or `default_model`): {}",
                shown.join(", ")
            )),
        );
    }
    Answer {
        ok: true,
        models: Some(models.len()),
    }
}

/// Whether `model` is listed (Ollama lists `name:latest` for `name`).
fn lists_model(models: &[String], model: &str) -> bool {
    models
        .iter()
        .any(|m| m == model || m.strip_suffix(":latest") == Some(model))
}

/// The finding for a failed models request, and whether the provider answered at all.
fn failure(
    error: &ProviderError,
    base: &str,
    key_var: Option<&str>,
    kind: ProviderKind,
) -> (Check, bool) {
    let message = error.to_string();
    let key_fix = match key_var {
        Some(var) => format!("check the key in {var}"),
        None => "check the provider's key (`api_key_env` in the config file)".to_owned(),
    };
    match error {
        ProviderError::Network { .. } => (
            Check::error(
                Section::Provider,
                format!("the provider does not answer: {message}"),
            )
            .fix(format!(
                "start the server at {base}, or point summon at one that runs"
            )),
            false,
        ),
        ProviderError::Auth { .. } => (
            Check::error(
                Section::Provider,
                format!("the provider refused the request: {message}"),
            )
            .fix(key_fix),
            true,
        ),
        ProviderError::QuotaExhausted { .. } => (
            Check::error(
                Section::Provider,
                format!("the account has no quota left: {message}"),
            )
            .fix("add credit or raise the quota with the provider"),
            true,
        ),
        ProviderError::RateLimited { .. } | ProviderError::Overloaded { .. } => (
            Check::warning(
                Section::Provider,
                format!("the provider answers but is busy: {message}"),
            )
            .fix("nothing to change; summon waits and retries during runs"),
            true,
        ),
        _ => {
            let fix =
                if kind == ProviderKind::OpenAi && !base.trim_end_matches('/').ends_with("/v1") {
                    "the base URL of an OpenAI-compatible server usually ends in `/v1`; check it"
                } else {
                    "some servers do not list models; if delegation works, nothing to change"
                };
            (
                Check::warning(
                    Section::Provider,
                    format!("the provider answers, but not to the models list: {message}"),
                )
                .fix(fix),
                true,
            )
        }
    }
}

fn report(r: &Resolved, answer: Option<Answer>) -> Report {
    let def = &r.provider;
    Report {
        provider: Some(json!({
            "name": r.provider_name,
            "kind": match def.kind {
                ProviderKind::OpenAi => "openai",
                ProviderKind::Anthropic => "anthropic",
            },
            "from": r.provider_origin.to_string(),
            "base_url": r.endpoint.base_url,
            "base_url_from": def.base_url_origin.to_string(),
            "defined_by": def.origin.to_string(),
            "key_env": r.endpoint.api_key_env,
            "key_set": r.endpoint.api_key.is_some(),
            "answers": answer.as_ref().map(|a| a.ok),
            "models": answer.as_ref().and_then(|a| a.models),
        })),
        model: Some(json!({
            "name": r.model,
            "from": r.model_origin.to_string(),
            "alias": r.model_alias,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::lists_model;

    #[test]
    fn ollama_latest_tags_match_bare_names() {
        let models = vec!["llama3:latest".to_owned(), "gpt-4o".to_owned()];
        assert!(lists_model(&models, "llama3"));
        assert!(lists_model(&models, "gpt-4o"));
        assert!(!lists_model(&models, "gpt-4"));
    }
}
