//! `summon delegate`: run one subagent; its final text on stdout, progress on stderr.
//!
//! JSON (`--json`): `{"status": "completed"|"failed", "output", "structured", "error",
//! "turns", "tool_calls", "tokens": {"input", "output"}, "duration_ms", "provider",
//! "provider_from", "model", "model_from", "source"}` (`*_from` says where the setting came from).

use serde_json::json;

use super::Ctx;
use crate::cli::DelegateArgs;
use crate::config::load_config;
use crate::delegation::{PrepareError, Request, prepare};
use crate::error::{Error, Result};
use crate::provider::{Client, RateLimiter, RetryPolicy};
use crate::recipe::ParamInput;
use crate::subagent::{SubagentEvent, SubagentStatus, run_subagent};

/// Set in the environment of every command a subagent runs, so a nested `summon delegate`
/// is refused.
pub(crate) const NESTED_ENV: &str = "SUMMON_SUBAGENT";

pub(crate) fn run(args: &DelegateArgs, ctx: &mut Ctx) -> Result<()> {
    if ctx.env.var(NESTED_ENV).is_some() {
        return Err(Error::usage(
            "Delegated tasks cannot spawn further delegations: this command runs inside a subagent",
        ));
    }
    if args.instructions.is_none() && args.source.is_none() {
        return Err(Error::usage(
            "nothing to do: pass --instructions, --source, or both",
        ));
    }
    if args.source.is_none() && (!args.params.param.is_empty() || args.params.params_file.is_some())
    {
        return Err(Error::usage("--param and --params need --source"));
    }
    let (config, warnings) = load_config(&ctx.env).map_err(Error::Input)?;
    ctx.report(&warnings.items);
    // The catalog is read once and frozen; an unknown name fails before any request.
    let catalog = ctx.catalog();
    let source = match &args.source {
        Some(name) => Some(
            catalog
                .get(name)
                .ok_or_else(|| Error::from(catalog.not_found(name)))?,
        ),
        None => None,
    };
    let context = match args.context.as_deref() {
        Some(text) => Some(read_context(text, ctx)?),
        None => None,
    };
    let request = Request {
        instructions: args.instructions.clone(),
        params: ParamInput::from_args(
            args.params.params_file.as_deref(),
            &args.params.param,
            &ctx.env.cwd,
        )?,
        extensions: args.extensions.as_ref().map(|list| {
            list.iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        }),
        provider: args.model.provider.clone(),
        model: args.model.model.clone(),
        temperature: args.model.temperature,
        max_turns: args.max_turns,
        context,
        working_dir: args.working_dir.clone(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let env = ctx.env.clone();
    let prepared = match runtime.block_on(prepare(&env, &config, source, &request)) {
        Ok(prepared) => prepared,
        Err(PrepareError::Input(diags)) => return Err(Error::Input(diags)),
        Err(PrepareError::Task(message)) => return Err(Error::Failed(message)),
    };
    ctx.report(&prepared.notes);
    let client =
        Client::new(prepared.resolved.endpoint.clone()).map_err(|e| Error::usage(e.to_string()))?;
    let limiter = RateLimiter::new(prepared.resolved.limits);
    let label = prepared.label.clone();
    let palette = ctx.err_palette;
    let mut observer = move |event: SubagentEvent| match event {
        SubagentEvent::ToolCall { name, ok, summary } => {
            if ok {
                eprintln!("[subagent {label}] {name}: {}", palette.green("completed"));
            } else {
                eprintln!(
                    "[subagent {label}] {name}: {}: {summary}",
                    palette.error("failed")
                );
            }
        }
        SubagentEvent::Retry {
            attempt,
            delay,
            reason,
        } => eprintln!(
            "[subagent {label}] retry {attempt} in {:.1}s: {reason}",
            delay.as_secs_f64()
        ),
        SubagentEvent::SchemaRetry { .. } => {
            eprintln!("[subagent {label}] answer does not match the schema; asking again");
        }
        SubagentEvent::CheckRetry { attempt, reason } => {
            eprintln!("[subagent {label}] retry checks failed (attempt {attempt}): {reason}");
        }
        SubagentEvent::Turn { .. } | SubagentEvent::Text { .. } => {}
    };
    let result = runtime.block_on(run_subagent(
        &client,
        &RetryPolicy::default(),
        &limiter,
        &prepared.spec,
        &mut observer,
    ));
    let error = result.error(prepared.spec.max_turns);
    if args.output.json {
        ctx.out.json(&json!({
            "status": if result.status == SubagentStatus::Completed { "completed" } else { "failed" },
            "output": result.text,
            "structured": result.structured,
            "error": error,
            "turns": result.turns,
            "tool_calls": result.tool_calls,
            "tokens": {"input": result.usage.input_tokens, "output": result.usage.output_tokens},
            "duration_ms": u64::try_from(result.duration.as_millis()).unwrap_or(u64::MAX),
            "provider": prepared.resolved.provider_name,
            "provider_from": prepared.resolved.provider_origin.to_string(),
            "model": prepared.resolved.model,
            "model_from": prepared.resolved.model_origin.to_string(),
            "source": args.source,
        }))?;
    } else {
        let text = match &result.structured {
            Some(value) => serde_json::to_string_pretty(value).unwrap_or_default(),
            None => result.text.clone(),
        };
        if !text.is_empty() {
            ctx.out.line(text.trim_end())?;
        }
    }
    match error {
        None => Ok(()),
        Some(message) => Err(Error::Failed(message)),
    }
}

/// `--context TEXT`, or `@FILE` read relative to the working directory.
fn read_context(text: &str, ctx: &Ctx) -> Result<String> {
    let Some(path) = text.strip_prefix('@') else {
        return Ok(text.to_owned());
    };
    let full = ctx.env.cwd.join(path);
    std::fs::read_to_string(&full).map_err(|e| {
        Error::usage(format!(
            "--context @{path}: cannot read `{}`: {e}",
            full.display()
        ))
    })
}
