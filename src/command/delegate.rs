//! `summon delegate`: run one subagent; its final text on stdout, progress on stderr. With
//! `--async` the task goes to a detached worker (see [`crate::delegation`]).
//!
//! JSON (`--json`): `{"status": "completed"|"failed", "output", "structured", "error",
//! "turns", "tool_calls", "tokens": {"input", "output"}, "duration_ms", "provider",
//! "provider_from", "model", "model_from", "source", "sandbox", "warnings"}` (`*_from` says where the
//! setting came from; `sandbox` is `{"policy", "network"}` of the shell commands, `null`
//! without the shell; `warnings` lists an agent's listed tools that were left out and what went
//! wrong with the task's extensions, such as a
//! server that did not start). With `--async --json`: `{"task_id", "status": "running"|"queued", "description"}`.

use serde_json::json;

use super::Ctx;
use crate::cli::DelegateArgs;
use crate::config::load_config;
use crate::delegation::{self, DelegationOutcome, DelegationRequest, Observer, Started};
use crate::error::{Error, Result};
use crate::recipe::ParamInput;
use crate::store::{TaskId, TaskStatus};
use crate::subagent::SubagentEvent;

pub(crate) fn run(args: &DelegateArgs, ctx: &mut Ctx) -> Result<()> {
    // Inside a subagent this command was refused already (`super::execute`).
    if args.instructions.is_none() && args.source.is_none() {
        return Err(Error::usage(
            "nothing to do: pass --instructions, --source, or both",
        ));
    }
    if args
        .instructions
        .as_deref()
        .is_some_and(|task| task.trim().is_empty())
    {
        return Err(Error::usage(
            "--instructions is blank: give the subagent a task, or leave the flag out to run the source's own prompt",
        ));
    }
    if args.source.is_none() && (!args.params.param.is_empty() || args.params.params_file.is_some())
    {
        return Err(Error::usage("--param and --params need --source"));
    }
    if args.queue && !args.r#async {
        return Err(Error::usage("--queue only applies with --async"));
    }
    if args.stop.len() > crate::recipe::MAX_STOP_SEQUENCES {
        return Err(Error::usage(format!(
            "--stop is given {} times; providers take at most {} stop sequences",
            args.stop.len(),
            crate::recipe::MAX_STOP_SEQUENCES
        )));
    }
    let request = request_from_args(args, ctx)?;
    let (config, warnings) = load_config(&ctx.env).map_err(Error::Input)?;
    let trace_settings =
        crate::telemetry::Settings::resolve(&ctx.env, &config).map_err(Error::from)?;
    // The catalog is read once and frozen for the delegation.
    let catalog = ctx.catalog();
    if let Some(source) = &request.source {
        ctx.report(&catalog.shadow_warnings_for(Some(&[source.as_str()]), &ctx.env.cwd));
    }
    if args.r#async {
        let started = delegation::start(&ctx.env, &config, &catalog, &request, args.queue)?;
        return show_started(&started, args.output.json, ctx);
    }
    let palette = ctx.err_palette;
    if !args.output.json && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        eprint!("{}", header(request.source.as_deref(), palette));
    }
    let mut traces = start_traces(trace_settings.as_ref(), &request, ctx);
    let env = ctx.env.clone().traced(
        traces
            .as_ref()
            .map(crate::telemetry::DelegationTraces::traceparent),
    );
    let observer: &mut Observer<'_> = &mut |label: &str, event: SubagentEvent| {
        if let Some(traces) = &mut traces {
            traces.observe(&event);
        }
        progress_line(label, palette, event);
    };
    let ran = delegation::run(&env, &config, &catalog, &request, observer, None);
    if let Some(traces) = traces {
        let failure;
        let ended = match &ran {
            Ok(outcome) => crate::telemetry::Ended {
                error: outcome.error.as_ref(),
                task: None,
                output: &outcome.text,
            },
            Err(_) => {
                failure = crate::event::Failure::new(
                    crate::event::FailureClass::Prepare,
                    "the delegation could not start",
                );
                crate::telemetry::Ended {
                    error: Some(&failure),
                    task: None,
                    output: "",
                }
            }
        };
        if let Some(warning) = traces.finish(&ended) {
            ctx.note(&format!("warning: {warning}"));
        }
    }
    let outcome = ran?;
    let mut notes = warnings.items;
    notes.extend(outcome.notes.iter().cloned());
    ctx.report(&notes);
    show(&outcome, args, ctx)?;
    match outcome.error {
        None => Ok(()),
        Some(failure) if failure.class == crate::event::FailureClass::Budget => {
            eprintln!("summon: {}", failure.message);
            Err(Error::Budget)
        }
        Some(failure) => Err(Error::Failed(failure.message)),
    }
}

/// What a person at a terminal sees as a delegation starts, as goose shows it:
/// `─── delegate | summon ───...` and the source it runs.
fn header(source: Option<&str>, palette: crate::color::Palette) -> String {
    let mut text = palette.dim(&format!("─── delegate | summon {}", "─".repeat(39)));
    text.push('\n');
    if let Some(source) = source {
        text.push_str(&format!("source: {}\n", crate::text::printable(source)));
    }
    text
}

/// The result: the answer on stdout (all of it with `--json`).
fn show(outcome: &DelegationOutcome, args: &DelegateArgs, ctx: &mut Ctx) -> Result<()> {
    if args.output.json {
        ctx.out.json(&json!({
            "status": if outcome.completed() { "completed" } else { "failed" },
            "output": outcome.text,
            "structured": outcome.structured,
            "error": outcome.error.as_ref().map(|f| &f.message),
            "turns": outcome.turns,
            "tool_calls": outcome.tool_calls,
            "tokens": {"input": outcome.usage.input_tokens, "output": outcome.usage.output_tokens},
            "duration_ms": u64::try_from(outcome.duration.as_millis()).unwrap_or(u64::MAX),
            "provider": outcome.model.provider,
            "provider_from": outcome.model.provider_from,
            "model": outcome.model.model,
            "model_from": outcome.model.model_from,
            "source": args.source,
            "sandbox": outcome.sandbox.map(crate::sandbox::Sandbox::to_json),
            "warnings": outcome.warnings,
        }))?;
    } else {
        let text = outcome.answer();
        if !text.is_empty() {
            ctx.out.line(text.trim_end())?;
        }
    }
    Ok(())
}

/// `delegate --async`: the task's id, and how to collect it.
fn show_started(started: &Started, json: bool, ctx: &mut Ctx) -> Result<()> {
    if json {
        ctx.out.json(&json!({
            "task_id": started.id.to_string(),
            "status": started.status.as_str(),
            "description": started.description,
        }))?;
    } else {
        let queued = if started.status == TaskStatus::Queued {
            format!(
                " (queued: {cap} tasks are running; it starts when one finishes)",
                cap = started.cap
            )
        } else {
            String::new()
        };
        ctx.out.write(&format!(
            "Task {id} started in background: \"{description}\"{queued}\n\
             Collect the result with `summon load {id}` (`--peek` to check on it, `--cancel` to stop it).\n",
            id = started.id,
            description = started.description,
        ))?;
    }
    Ok(())
}

/// `summon __worker ID`: the worker process of a background task; its progress lines and
/// notes go to the task's log.
pub(super) fn worker(id_text: &str, ctx: &mut Ctx) -> Result<()> {
    let id: TaskId = id_text
        .parse()
        .map_err(|_| Error::usage(format!("not a task id: `{id_text}`")))?;
    let palette = crate::color::Palette::default();
    // A variable the starting command accepted; unusable here, it only leaves traces off.
    let settings = crate::config::load_config(&ctx.env)
        .ok()
        .and_then(|(config, _)| crate::telemetry::Settings::resolve(&ctx.env, &config).ok())
        .flatten();
    let request = crate::store::Store::open_for(&ctx.env)
        .ok()
        .and_then(|store| store.get(&id).ok().flatten())
        .and_then(|task| serde_json::from_str::<DelegationRequest>(&task.request_json).ok());
    let mut traces = request
        .as_ref()
        .and_then(|request| start_traces(settings.as_ref(), request, ctx));
    let env = ctx.env.clone().traced(
        traces
            .as_ref()
            .map(crate::telemetry::DelegationTraces::traceparent),
    );
    let observer: &mut Observer<'_> = &mut |label: &str, event: SubagentEvent| {
        if let Some(traces) = &mut traces {
            traces.observe(&event);
        }
        progress_line(label, palette, event);
    };
    let notes = delegation::run_worker(&env, id, observer)?;
    if let Some(traces) = traces {
        // The worker recorded how the task ended.
        let task = crate::store::Store::open_for(&ctx.env)
            .ok()
            .and_then(|store| store.get(&id).ok().flatten());
        let failure = task.as_ref().and_then(|task| {
            (task.status != crate::store::TaskStatus::Completed).then(|| {
                crate::event::Failure::new(
                    crate::event::FailureClass::Other,
                    task.error.clone().unwrap_or_default(),
                )
            })
        });
        let id_text = id.to_string();
        let output = task
            .as_ref()
            .and_then(|t| t.output.clone())
            .unwrap_or_default();
        if let Some(warning) = traces.finish(&crate::telemetry::Ended {
            error: failure.as_ref(),
            task: Some(&id_text),
            output: &output,
        }) {
            eprintln!("summon: warning: {warning}");
        }
    }
    for note in &notes {
        eprintln!("{}", note.message);
    }
    Ok(())
}

/// One progress line on stderr: `[subagent NAME] read_file: completed`. Names, paths and
/// reasons can come from the model, a provider or a server: shown without control sequences.
fn progress_line(label: &str, palette: crate::color::Palette, event: SubagentEvent) {
    use crate::text::printable;
    let label = printable(label);
    match event {
        SubagentEvent::ToolCall { name, ok, summary } => {
            let (name, summary) = (printable(&name), printable(&summary));
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
            ..
        } => eprintln!(
            "[subagent {label}] retry {attempt} in {:.1}s: {}",
            delay.as_secs_f64(),
            printable(&reason)
        ),
        SubagentEvent::SchemaRetry { .. } => {
            eprintln!("[subagent {label}] answer does not match the schema; asking again");
        }
        SubagentEvent::CheckRetry { attempt, reason } => {
            eprintln!(
                "[subagent {label}] retry checks failed (attempt {attempt}): {}",
                printable(&reason)
            );
        }
        SubagentEvent::Warning { message } => {
            eprintln!(
                "[subagent {label}] {}: {}",
                palette.warning("warning"),
                printable(&message)
            );
        }
        SubagentEvent::Turn { .. }
        | SubagentEvent::StartupWait { .. }
        | SubagentEvent::Held { .. }
        | SubagentEvent::HeldFor { .. }
        | SubagentEvent::Text { .. }
        | SubagentEvent::Tokens { .. }
        | SubagentEvent::Response { .. }
        | SubagentEvent::ToolStarted { .. }
        | SubagentEvent::Started { .. }
        | SubagentEvent::Framing { .. } => {}
    }
}

/// The request as it will run, with `--params FILE` and `--context @FILE` already read, so
/// a background task does not depend on files that may change meanwhile.
fn request_from_args(args: &DelegateArgs, ctx: &Ctx) -> Result<DelegationRequest> {
    let params = ParamInput::from_args(
        args.params.params_file.as_deref(),
        &args.params.param,
        &ctx.env.cwd,
    )?;
    let context = match args.context.as_deref() {
        Some(text) => Some(read_context(text, ctx)?),
        None => piped_context()?,
    };
    Ok(DelegationRequest {
        source: args.source.clone(),
        instructions: args.instructions.clone(),
        params: params
            .values
            .into_iter()
            .map(|(k, (v, _))| (k, v))
            .collect(),
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
        max_cost: args.max_cost,
        tier: args.tier,
        flex_fallback: args.flex_fallback,
        max_output_tokens: args.max_output_tokens,
        stop: args.stop.clone(),
        context,
        working_dir: args.working_dir.clone(),
        sandbox: args.sandbox.sandbox,
        network: args.sandbox.network.then_some(true),
        role_tools: None,
    })
}

/// What is piped in (`git diff | summon delegate --instructions "review this"`), as the
/// context, when stdin is not a terminal and gives some text; `/dev/null` or a closed stdin
/// (CI) gives none.
fn piped_context() -> Result<Option<String>> {
    use std::io::{IsTerminal as _, Read as _};
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    if let Err(e) = stdin.lock().read_to_end(&mut bytes) {
        // A closed descriptor is no input; anything else is said.
        if e.raw_os_error() == Some(libc::EBADF) {
            return Ok(None);
        }
        return Err(Error::usage(format!(
            "cannot read stdin as the context: {e}"
        )));
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        Error::usage("stdin is not UTF-8 text; pass the context with --context @FILE")
    })?;
    Ok((!text.trim().is_empty()).then_some(text))
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

/// The trace of a delegation, when the `OTEL_*` variables ask for one; a trace that cannot
/// start is a warning, never a failed delegation.
fn start_traces(
    settings: Option<&crate::telemetry::Settings>,
    request: &DelegationRequest,
    ctx: &Ctx,
) -> Option<crate::telemetry::DelegationTraces> {
    let label = request.source.as_deref().unwrap_or("task");
    match crate::telemetry::DelegationTraces::start(settings?, &ctx.env, label) {
        Ok(traces) => Some(traces),
        Err(err) => {
            ctx.note(&format!("warning: traces: not exported ({err})"));
            None
        }
    }
}
