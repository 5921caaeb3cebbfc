//! `summon run PIPELINE`: the final step's text on stdout, progress on stderr.
//!
//! JSON (`--json`): `{"run_id", "status": "succeeded"|"failed"|"interrupted", "steps":
//! [{"id", "status": "succeeded"|"failed"|"skipped"|"deferred", "error"}], "input_tokens",
//! "output_tokens", "cache_read_tokens", "cache_write_tokens", "output"}` (the tokens over the
//! whole run);
//! `deferred`: a step a shard leaves for `summon merge`, or one after `--until STEP`.
//! `--dry-run --json`: `{"steps": [{"id", "kind", "needs": [ID], "width", "drafted",
//! "input_tokens", "overhead", "model", "prompt", "later", "notes", "output_limit": {"tokens"
//! (`null`: none sent), "source" (`explicit`, `schema` or `full`), "learned" (later tasks learn
//! theirs from the step's answers), "default"}, "tier", "estimated_cost_usd": {"input", "output_max"}}], "tasks",
//! "drafted_tasks", "estimated_input_tokens", "estimated_input_cost_usd",
//! "estimated_cost_usd", "max_cost_usd", "prices" (each model's price counted and where it
//! came from), "estimate_crosses_cap", "unpriced_models",
//! "errors"}`; `overhead` is the drafted tasks' per-task overhead as in `report.json`
//! (`null`: none drafted); a step's `estimated_cost_usd` prices its drafted first requests
//! at its tier (`null`: none drafted, or no price), `output_max` at the output limit;
//! `estimate_crosses_cap` is `null` without a spend cap.

use crate::text::thousands;
use std::io::IsTerminal;

use serde_json::json;

use super::Ctx;
use crate::cli::RunArgs;
use crate::compile::{CompiledPipeline, Flags, Inputs, ModelChoice, compile_pipeline};
use crate::config::load_config;
use crate::diag::{Diagnostics, SourceFile};
use crate::error::{Error, Result};
use crate::event::{FinalText, RunSummary, StepStatus};
use crate::exec::{RunOptions, run_pipeline};
use crate::output::{STEP_SUMMARY_VAR, append_step_summary, resolve_display};
use crate::pipeline::model::Pipeline;
use crate::pipeline::parse::parse_pipeline;
use crate::recipe::{ParamInput, bind_params};
use crate::source::read_source_text;

pub(crate) fn run(args: &RunArgs, ctx: &mut Ctx) -> Result<()> {
    let shown = args.pipeline.display().to_string();
    let started = ctx.enter_project();
    let args = &if started == ctx.env.cwd {
        args.clone()
    } else {
        from_started(args, &started)
    };
    let pipeline = load_pipeline(&args.pipeline, ctx)?;
    // `--resume=auto` continues the last run of this pipeline (and part of it) when it did not
    // complete, else starts one: one command for a job's first attempt and every requeue.
    let auto = args.resume.as_deref() == Some(RESUME_AUTO);
    let earlier = match &args.resume {
        Some(_) if auto => {
            resumed_setup(&pipeline, args, "", &shown, ctx)?.filter(|setup| !setup.completed)
        }
        Some(id) => resumed_setup(&pipeline, args, id, &shown, ctx)?,
        None => None,
    };
    let auto_args;
    let args = if auto {
        let mut resolved = args.clone();
        resolved.resume = earlier.as_ref().map(|setup| setup.run_id.clone());
        if let Some(setup) = &earlier {
            ctx.note(&format!(
                "note: --resume=auto: continuing run {}",
                setup.run_id
            ));
        }
        auto_args = resolved;
        &auto_args
    } else {
        args
    };
    let args = &match &earlier {
        Some(setup) => setup.fill(args, &ctx.env.cwd)?,
        None => args.clone(),
    };
    let params = match earlier.as_ref().and_then(|e| e.params.clone()) {
        Some(params) if args.params.param.is_empty() && args.params.params_file.is_none() => params,
        _ => {
            let input = ParamInput::from_args(
                args.params.params_file.as_deref(),
                &args.params.param,
                &ctx.env.cwd,
            )?;
            let binding = bind_params(
                &pipeline.parameters,
                &input,
                &indexmap::IndexMap::new(),
                Some(&pipeline.file),
                &ctx.env.cwd,
            );
            if binding.problems.has_errors() {
                return Err(binding.problems.into());
            }
            binding.values()
        }
    };
    let request = crate::exec::plan::RunRequest {
        shard: args.shard.as_deref(),
        until: args.until.as_deref(),
        items_from: args.items_from.as_deref(),
        // A dry run writes nothing: a shard's needs no `--out`.
        out: args
            .out
            .as_deref()
            .or_else(|| args.dry_run.then(|| std::path::Path::new("."))),
        shown: &shown,
    };
    let plan = crate::exec::plan::plan_for_run(&ctx.env, &pipeline, &params, &request)?;
    let catalog = ctx.catalog();
    // A resumed run keeps the catalog it started with: it is checked against that.
    let frozen = earlier.as_ref().and_then(|setup| setup.catalog.as_ref());
    let compiled = compile_pipeline(
        pipeline,
        &Inputs {
            params: &params,
            flags: Flags::new(args.max_output_tokens, args.sandbox.level()),
            catalog: frozen.unwrap_or(&catalog),
        },
    );
    ctx.report(
        &catalog.shadow_warnings_for(used_sources(&compiled.pipeline).as_deref(), &ctx.env.cwd),
    );
    ctx.report(&compiled.warnings());
    if args.dry_run {
        return dry_run(&compiled, &catalog, &params, &plan, args, ctx);
    }
    // Without the run to resume, the run says so before anything else.
    if args.resume.is_none() || frozen.is_some() {
        compiled.check(|_| true).map_err(Error::Input)?;
    }
    for note in &plan.notes {
        ctx.note(&format!("note: {note}"));
    }
    let closing = args
        .out
        .as_deref()
        .and_then(|out| plan.closing_note(out, &shown));
    let (config, warnings) = load_config(&ctx.env).map_err(Error::Input)?;
    ctx.report(&warnings.items);
    let trace_settings =
        crate::telemetry::Settings::resolve(&ctx.env, &config).map_err(Error::from)?;
    let cap = args
        .max_cost
        .or(compiled.pipeline.settings.max_cost)
        .or(config.max_cost);
    let mut config = config;
    preflight(&compiled, &mut config, &ctx.env, cap)?;
    let pipeline = compiled.pipeline;
    let display = resolve_display(
        std::io::stderr().is_terminal(),
        ctx.env.is_set("CI"),
        args.quiet || args.output.json,
    );
    let name = pipeline.name.clone();
    let traces = start_traces(trace_settings.as_ref(), &pipeline, ctx);
    if let Some(traces) = &traces {
        traces.set_prices(config.prices());
    }
    let options = RunOptions {
        pipeline,
        params,
        concurrency: args.concurrency.map(|c| c as usize),
        out_dir: args.out.clone(),
        resume: args
            .resume
            .as_ref()
            .map(|id| (!id.is_empty()).then(|| id.clone())),
        junit: args.junit.clone(),
        display,
        batch: args.batch,
        plan,
        reuse: args.reuse,
        wait: args.wait,
        watch: traces.as_ref().map(crate::telemetry::RunTraces::consumer),
        trace_id: traces.as_ref().map(|t| t.trace_id().to_owned()),
        traceparent: traces
            .as_ref()
            .map(crate::telemetry::RunTraces::traceparent),
        stop: None,
        max_cost: args.max_cost,
    };
    let ran = run_pipeline(&ctx.env, config, catalog, options);
    end_traces(traces, &ran, ctx);
    let mut summary = ran?;
    write_step_summary("run", &name, &summary, ctx);
    let failed = print_outcome(&mut summary, serde_json::Map::new(), args.output.json, ctx)?;
    if summary.interrupted {
        // A shard or `--until` run resumes with the same part of the pipeline.
        let mut part = String::new();
        for (flag, value) in [
            ("--shard", args.shard.clone()),
            ("--until", args.until.clone()),
            ("--out", args.out.as_ref().map(|d| d.display().to_string())),
        ] {
            if let (Some(value), true) = (value, args.shard.is_some() || args.until.is_some()) {
                part.push_str(&format!(" {flag} {value}"));
            }
        }
        if let Some(reached) = &summary.budget {
            eprintln!(
                "summon: run {} stopped, {reached}; continue it with `summon run {}{part} \
                 --resume --max-cost MORE`",
                summary.run_id,
                args.pipeline.display()
            );
            return Err(Error::Budget);
        }
        if let Some(stopped) = &summary.provider {
            let (id, path) = (&summary.run_id, args.pipeline.display());
            if stopped.no_server {
                eprintln!(
                    "summon: error: run {id} stopped: {}\n  fix: once the provider answers \
                     (`summon doctor` tries it), continue the run with `summon run \
                     {path}{part} --resume`",
                    stopped.text
                );
            } else if stopped.refused {
                eprintln!(
                    "summon: error: run {id} stopped: {}\n  fix: check the key (`summon doctor` \
                     tries it), then continue the run with `summon run {path}{part} --resume`",
                    stopped.text
                );
            } else {
                eprintln!(
                    "summon: run {id} stopped: {}; no task started after that. Once it \
                     answers again, continue the run with `summon run {path}{part} --resume`",
                    stopped.text
                );
            }
            return Err(Error::ProviderStopped {
                refused: stopped.refused || stopped.no_server,
            });
        }
        eprintln!(
            "summon: run {} interrupted; continue it with `summon run {}{part} --resume`",
            summary.run_id,
            args.pipeline.display()
        );
        return Err(Error::Interrupted);
    }
    if failed {
        let catalog = summary.steps.iter().any(|(_, _, error)| {
            error
                .as_deref()
                .is_some_and(crate::compile::is_catalog_error)
        });
        let items_file = summary.steps.iter().any(|(_, _, error)| {
            error
                .as_deref()
                .is_some_and(|e| e.starts_with("cannot read items file"))
        });
        if items_file {
            // `--resume` keeps the run's parameters: a corrected `--param` is a new run.
            eprintln!(
                "summon: run {} failed; put the file in place and continue with `--resume`, or \
                 start a new run with a corrected --param (`--resume` keeps this run's parameters)",
                summary.run_id
            );
        } else if catalog {
            // `--resume` reuses the catalog frozen when the run started and would fail again.
            eprintln!(
                "summon: run {} failed; a new run picks up new or changed definitions (`--resume` keeps the catalog the run started with)",
                summary.run_id
            );
        } else {
            eprintln!(
                "summon: run {} failed; after fixing, `--resume` repeats only unfinished tasks",
                summary.run_id
            );
        }
        return Err(Error::Failed(String::new()));
    }
    if let Some(closing) = closing {
        ctx.note(&closing);
    }
    Ok(())
}

/// The traces of a run, when the `OTEL_*` variables ask for them; traces that cannot start
/// are a warning, never a failed run.
pub(super) fn start_traces(
    settings: Option<&crate::telemetry::Settings>,
    pipeline: &Pipeline,
    ctx: &Ctx,
) -> Option<crate::telemetry::RunTraces> {
    let steps = pipeline.steps.iter().map(|s| s.id.clone()).collect();
    match crate::telemetry::RunTraces::start(settings?, &ctx.env, &pipeline.name, steps) {
        Ok(traces) => Some(traces),
        Err(err) => {
            ctx.note(&format!("warning: traces: not exported ({err})"));
            None
        }
    }
}

/// Ends a run's traces as the run ended and sends them; a collector that did not take them
/// all is one warning.
pub(super) fn end_traces(
    traces: Option<crate::telemetry::RunTraces>,
    ran: &Result<RunSummary>,
    ctx: &Ctx,
) {
    let Some(traces) = traces else {
        return;
    };
    let (run_id, failed) = match ran {
        Ok(summary) => (
            Some(summary.run_id.as_str()),
            summary
                .steps
                .iter()
                .find(|(_, status, _)| *status == crate::event::StepStatus::Failed)
                .map(|(id, _, _)| format!("step {id} failed"))
                .or_else(|| summary.interrupted.then(|| "interrupted".to_owned())),
        ),
        Err(_) => (None, Some("the run ended in error".to_owned())),
    };
    if let Some(warning) = traces.finish(run_id, failed.as_deref()) {
        ctx.note(&format!("warning: {warning}"));
    }
}

/// `--resume=auto`: continue the last run when it did not complete, else start one.
pub(crate) const RESUME_AUTO: &str = "auto";

/// What a run to be resumed was started with.
struct Setup {
    run_id: String,
    /// The run completed: `--resume=auto` starts a new one.
    completed: bool,
    params: Option<indexmap::IndexMap<String, String>>,
    out: Option<String>,
    junit: Option<String>,
    concurrency: Option<u32>,
    /// `--max-cost` the run was started with (a resume may raise it).
    max_cost: Option<f64>,
    /// The catalog the run was started with.
    catalog: Option<crate::source::Catalog>,
}

impl Setup {
    /// The arguments with what was not given taken from the run; a value given that differs
    /// is refused.
    fn fill(&self, args: &RunArgs, project: &std::path::Path) -> Result<RunArgs> {
        let mut args = args.clone();
        // The store is in the writable workspace: a path read back from it is taken only
        // when it stays inside the project, through no link, as `outputs` paths do. Given
        // again on the command line, it is the user's choice.
        let recorded = |flag: &str, path: &str| {
            recorded_path_problem(project, path).map_or(Ok(()), |why| {
                Err(Error::usage(format!(
                    "run {} recorded {flag} {path}, which {why}; summon does not take it from \
                     the store: give {flag} again to resume with it",
                    self.run_id
                )))
            })
        };
        if let (None, Some(out)) = (&args.out, &self.out) {
            recorded("--out", out)?;
        }
        if let (None, Some(junit)) = (&args.junit, &self.junit) {
            recorded("--junit", junit)?;
        }
        let differs = |flag: &str, given: String, was: Option<&str>| {
            Error::usage(format!(
                "run {} was started with {}; resume it with the same {flag}, or without it",
                self.run_id,
                match was {
                    Some(was) => format!("{flag} {was}, not {given}"),
                    None => format!("no {flag}, not {flag} {given}"),
                }
            ))
        };
        match (&args.out, &self.out) {
            (None, Some(out)) => args.out = Some(out.into()),
            (Some(given), was) if was.as_deref() != Some(&*given.to_string_lossy()) => {
                return Err(differs(
                    "--out",
                    given.display().to_string(),
                    was.as_deref(),
                ));
            }
            _ => {}
        }
        match (&args.junit, &self.junit) {
            (None, Some(junit)) => args.junit = Some(junit.into()),
            (Some(given), was) if was.as_deref() != Some(&*given.to_string_lossy()) => {
                return Err(differs(
                    "--junit",
                    given.display().to_string(),
                    was.as_deref(),
                ));
            }
            _ => {}
        }
        match (args.concurrency, self.concurrency) {
            (None, Some(n)) => args.concurrency = Some(n),
            (Some(given), Some(was)) if given != was => {
                return Err(differs(
                    "--concurrency",
                    given.to_string(),
                    Some(&was.to_string()),
                ));
            }
            _ => {}
        }
        // A different cap is what a run that reached its cap resumes with.
        if args.max_cost.is_none() {
            args.max_cost = self.max_cost;
        }
        Ok(args)
    }
}

/// The source names the pipeline's steps name; `None` when a `source:` is a template (it can
/// name any source).
fn used_sources(pipeline: &Pipeline) -> Option<Vec<&str>> {
    use crate::pipeline::model::{Decompose, StepKind};
    let mut names = Vec::new();
    for step in &pipeline.steps {
        let task = match &step.kind {
            StepKind::Decompose(Decompose::Agent(task))
            | StepKind::Synthesize(task)
            | StepKind::Delegate(task) => task,
            StepKind::FanOut(fan_out) => &fan_out.task,
            StepKind::Decompose(_) => continue,
        };
        if let Some(source) = &task.source {
            if crate::template::has_template(&source.text) {
                return None;
            }
            names.push(source.text.trim());
        }
    }
    Some(names)
}

/// Why a path read back from the store cannot be used: it leaves `project` (absolute, `..`)
/// or goes through a symbolic link there; `None` when it stays inside.
fn recorded_path_problem(project: &std::path::Path, path: &str) -> Option<&'static str> {
    use std::path::Component;
    let relative = std::path::Path::new(path);
    if relative.is_absolute()
        || relative
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Some("leaves the project");
    }
    let mut at = project.to_path_buf();
    for component in relative.components() {
        at.push(component);
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if meta.file_type().is_symlink() => return Some("goes through a link"),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    None
}

/// The setup of the run `--resume` names (or of the last run of this pipeline and part of it),
/// when the store has it; `None` leaves the errors to the run itself.
fn resumed_setup(
    pipeline: &Pipeline,
    args: &RunArgs,
    id: &str,
    shown: &str,
    ctx: &Ctx,
) -> Result<Option<Setup>> {
    let Some(store) = crate::store::Store::open_existing(&ctx.env.cwd)? else {
        return Ok(None);
    };
    let run = if id.is_empty() {
        // The part of the pipeline (shard, --until) decides which run is the last one.
        let request = crate::exec::plan::RunRequest {
            shard: args.shard.as_deref(),
            until: args.until.as_deref(),
            items_from: None,
            out: Some(args.out.as_deref().unwrap_or(std::path::Path::new("."))),
            shown,
        };
        let Ok(plan) = crate::exec::plan::plan_for_run(
            &ctx.env,
            pipeline,
            &indexmap::IndexMap::new(),
            &request,
        ) else {
            return Ok(None);
        };
        let path = pipeline
            .file
            .path()
            .canonicalize()
            .unwrap_or_else(|_| pipeline.file.path().to_path_buf());
        store.last_run_of_shard(&path.display().to_string(), plan.journal_tag().as_deref())
    } else {
        store.get_run(id)
    }?;
    let Some(run) = run else {
        return Ok(None);
    };
    let setup = run.setup.clone().unwrap_or_default();
    Ok(Some(Setup {
        params: serde_json::from_str(&run.params_json).ok(),
        out: setup.out,
        junit: setup.junit,
        concurrency: setup.concurrency.and_then(|n| u32::try_from(n).ok()),
        max_cost: setup.max_cost_micro_usd.map(|m| m as f64 / 1e6),
        catalog: serde_json::from_str::<serde_json::Value>(&run.catalog_json)
            .ok()
            .filter(serde_json::Value::is_array)
            .map(|frozen| crate::source::thaw(&frozen)),
        completed: run.status == crate::store::RunStatus::Completed,
        run_id: run.run_id,
    }))
}

/// Before the first task: the provider and model every step would use are resolved, so a
/// missing key, no model or a provider an untrusted project points somewhere fails at once
/// with exit 1, not after every task of a step has failed. What is decided only by templates
/// or model output (a templated `source:`, provider or model) is left to the tasks.
///
/// A step that needs its model's context window (`reduce: auto`) or can use it (a synthesis
/// whose size is known in advance) and has none from the step, the config file or the
/// built-in list has it asked of the model's server, once per model
/// ([`crate::provider::server_window`]); `reduce: auto` without a window fails here, before
/// any request.
fn preflight(
    compiled: &CompiledPipeline,
    config: &mut crate::config::Config,
    env: &crate::env::Env,
    cap: Option<f64>,
) -> Result<()> {
    // Each model choice once, with the steps that make it.
    let mut wanted: Vec<(&str, &ModelChoice, Vec<usize>)> = Vec::new();
    for (index, (step, resolved)) in compiled
        .pipeline
        .steps
        .iter()
        .zip(&compiled.steps)
        .enumerate()
    {
        let Some(choice) = &resolved.model else {
            continue;
        };
        let same = |other: &ModelChoice| {
            (
                &other.provider,
                &other.model,
                &other.source_provider,
                &other.source_model,
            ) == (
                &choice.provider,
                &choice.model,
                &choice.source_provider,
                &choice.source_model,
            )
        };
        match wanted.iter_mut().find(|(_, other, _)| same(other)) {
            Some((_, _, steps)) => steps.push(index),
            None => wanted.push((&step.id, choice, vec![index])),
        }
    }
    if wanted.is_empty() {
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut silent = std::collections::HashSet::new();
    for (step, choice, steps) in wanted {
        let overrides = choice.overrides();
        let resolved = runtime
            .block_on(crate::config::resolve(env, config, &overrides))
            .map_err(|d| {
                let message = format!("step `{step}`: {}", d.message);
                Error::from(crate::diag::Diagnostic { message, ..d })
            })?;
        if let Some(cap) = cap
            && config.price(&resolved.model).is_none()
        {
            // A cap cannot be kept without knowing what a request costs.
            return Err(Error::from(
                crate::diag::Diagnostic::error(format!(
                    "step `{step}`: {} for model `{}`, so the spend cap of {} cannot be kept",
                    crate::config::NO_PRICE,
                    resolved.model,
                    crate::subagent::budget::usd(cap)
                ))
                .with_hint(crate::config::prices::no_price_hint(&resolved.model)),
            ));
        }
        for index in steps {
            check_tier(compiled, index, &resolved)?;
            learn_window(compiled, index, &resolved, config, &runtime, &mut silent)?;
        }
    }
    Ok(())
}

/// The context windows a dry run shows, asked of the servers as the run asks them (a
/// provider that cannot be resolved without the network is left out); `reduce: auto`
/// without a window fails as the run would.
fn dry_run_windows(
    compiled: &CompiledPipeline,
    config: &mut crate::config::Config,
    env: &crate::env::Env,
) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut silent = std::collections::HashSet::new();
    for (index, resolved) in compiled.steps.iter().enumerate() {
        let Some(choice) = &resolved.model else {
            continue;
        };
        let overrides = choice.overrides();
        if let Ok(resolved) =
            crate::config::resolve::resolve_with(env, config, &overrides, |_| false)
        {
            learn_window(compiled, index, &resolved, config, &runtime, &mut silent)?;
        }
    }
    Ok(())
}

/// The context window step `index` needs or can use, asked of its model's server when
/// nothing else gives it (and kept in `config` for the run); an error when the step has
/// `reduce: auto` and the server does not say it either. `silent` holds the servers and
/// models already asked in vain, so each is asked once.
fn learn_window(
    compiled: &CompiledPipeline,
    index: usize,
    resolved: &crate::config::Resolved,
    config: &mut crate::config::Config,
    runtime: &tokio::runtime::Runtime,
    silent: &mut std::collections::HashSet<(String, String)>,
) -> Result<()> {
    let pipeline = &compiled.pipeline;
    let step = &pipeline.steps[index];
    let auto = step.reduce.as_ref().filter(|r| r.chunk_tokens.is_none());
    let wanted = auto.is_some()
        || (step.reduce.is_none() && crate::exec::reduce::foreseen(pipeline, step).is_some());
    let model = &resolved.model;
    if !wanted || step.context_window.is_some() || config.context_window(model).is_some() {
        return Ok(());
    }
    let key = (resolved.endpoint.base_url.clone(), model.clone());
    if !silent.contains(&key) {
        match runtime.block_on(crate::provider::server_window(&resolved.endpoint, model)) {
            Some(window) => {
                config.learned_windows.insert(model.clone(), window);
                return Ok(());
            }
            None => {
                silent.insert(key);
            }
        }
    }
    let Some(reduce) = auto else {
        return Ok(());
    };
    let server = if resolved.endpoint.kind == crate::provider::ProviderKind::OpenAi {
        format!(
            ", and its server at {} does not say it",
            resolved.endpoint.base_url
        )
    } else {
        String::new()
    };
    Err(Error::from(
        crate::diag::Diagnostic::error(format!(
            "step `{}`: `reduce: auto` needs the context window of `{model}`: the config file \
             gives none{server}; nothing was sent",
            step.id
        ))
        .at(crate::diag::Span::new(&pipeline.file, reduce.pos))
        .with_hint(format!(
            "set `models: {{{model}: {{context_window: TOKENS}}}}` in summon.yaml, \
             `context_window: TOKENS` on the step, or `chunk_tokens: TOKENS` instead of \
             `reduce: auto`"
        )),
    ))
}

/// A step's `tier` its provider or model is known to refuse: an error at the line that sets
/// it, before the run. Flex and priority are OpenAI's service tiers; a model of the built-in
/// price table is offered at the tiers it lists.
fn check_tier(
    compiled: &CompiledPipeline,
    index: usize,
    resolved: &crate::config::Resolved,
) -> Result<()> {
    use crate::config::Tier;
    let pipeline = &compiled.pipeline;
    let step = &pipeline.steps[index];
    let Some((tier, pos)) = step.tier.or(pipeline.settings.tier) else {
        return Ok(());
    };
    if !matches!(tier, Tier::Flex | Tier::Priority) {
        return Ok(());
    }
    let problem = if resolved.endpoint.kind == crate::provider::ProviderKind::Anthropic {
        Some(format!(
            "provider `{}` (Anthropic) has no `{}` service tier; Anthropic's cheaper path is \
             its Message Batches API (`tier: batch` on a fan_out step)",
            resolved.provider_name,
            tier.name()
        ))
    } else {
        crate::config::prices::listed(&resolved.model)
            .filter(|listed| listed.at(tier).is_none())
            .map(|_| {
                format!(
                    "model `{}` is not offered at the `{}` tier (OpenAI offers flex for the \
                     gpt-5 family, o3 and o4-mini)",
                    resolved.model,
                    tier.name()
                )
            })
    };
    match problem {
        Some(message) => Err(Error::from(
            crate::diag::Diagnostic::error(format!("step `{}`: {message}", step.id))
                .at(crate::diag::Span::new(&pipeline.file, pos)),
        )),
        None => Ok(()),
    }
}

/// Appends the run's Markdown summary to the file `GITHUB_STEP_SUMMARY` names (set by GitHub
/// Actions), so a CI job page shows counts, cost and failures. A file that cannot be written
/// is a warning: the run itself went as it went.
pub(super) fn write_step_summary(command: &str, name: &str, summary: &RunSummary, ctx: &Ctx) {
    let Some(path) = ctx.env.var(STEP_SUMMARY_VAR) else {
        return;
    };
    let path = ctx.env.cwd.join(path);
    if let Err(error) = append_step_summary(&path, command, name, summary) {
        eprintln!(
            "summon: warning: cannot write the job summary to {} ({STEP_SUMMARY_VAR}): {error}",
            path.display()
        );
    }
}

/// Prints what a run or merge produced: its JSON (with `extra` fields) or the final step's
/// text, and a line per failed step on stderr. Returns whether a step failed.
pub(super) fn print_outcome(
    summary: &mut RunSummary,
    extra: serde_json::Map<String, serde_json::Value>,
    json: bool,
    ctx: &mut Ctx,
) -> Result<bool> {
    let failed: Vec<_> = summary
        .steps
        .iter()
        .filter(|(_, status, _)| *status == StepStatus::Failed)
        .collect();
    if json {
        let status = if summary.interrupted {
            "interrupted"
        } else if failed.is_empty() {
            "succeeded"
        } else {
            "failed"
        };
        let steps: Vec<_> = summary
            .steps
            .iter()
            .map(|(id, status, error)| {
                let status = match status {
                    StepStatus::Succeeded => "succeeded",
                    StepStatus::Failed => "failed",
                    StepStatus::Skipped => "skipped",
                    StepStatus::Deferred => "deferred",
                };
                json!({"id": id, "status": status, "error": error})
            })
            .collect();
        let mut value = json!({"run_id": summary.run_id, "status": status});
        if let Some(object) = value.as_object_mut() {
            object.extend(extra);
            object.insert("steps".into(), json!(steps));
            let total = &summary.report["total"];
            for key in [
                "input_tokens",
                "output_tokens",
                "cache_read_tokens",
                "cache_write_tokens",
            ] {
                object.insert(key.into(), total[key].clone());
            }
            let output = summary.final_output.take().map(FinalText::into_string);
            object.insert("output".into(), json!(output.transpose()?));
        }
        ctx.out.json(&value)?;
    } else if failed.is_empty()
        && !summary.interrupted
        && let Some(output) = summary.final_output.take()
    {
        ctx.out.stream(|out| output.write_line(out))?;
    }
    for (id, _, error) in &failed {
        // A task's error can quote what a provider or a model wrote.
        eprintln!(
            "summon: step `{id}` failed: {}",
            crate::text::printable(error.as_deref().unwrap_or(""))
        );
    }
    Ok(!failed.is_empty())
}

/// The command line's paths read from where summon was started (`started`), before the
/// project folder became the working directory.
fn from_started(args: &RunArgs, started: &std::path::Path) -> RunArgs {
    let mut args = args.clone();
    args.pipeline = started.join(&args.pipeline);
    for path in [
        &mut args.out,
        &mut args.junit,
        &mut args.items_from,
        &mut args.params.params_file,
    ]
    .into_iter()
    .flatten()
    {
        *path = started.join(&*path);
    }
    args
}

pub(super) fn load_pipeline(pipeline: &std::path::Path, ctx: &Ctx) -> Result<Pipeline> {
    let path = ctx.env.cwd.join(pipeline);
    let text = read_source_text(&path).map_err(|message| {
        let mut found = crate::diag::Diagnostic::error(message).in_file(&path);
        if !path.exists()
            && let Some(close) = close_files(&path, &ctx.env.cwd)
        {
            found = found.with_hint(close);
        }
        Error::from(found)
    })?;
    // Started by `summon mcp`'s run_pipeline: only bytes the user trusts run.
    if ctx.env.var(crate::config::trust::PIPELINE_TRUST_ENV) == Some("1")
        && let Err(why) = crate::config::trust::check_pipeline(&ctx.env, &path, text.as_bytes())
    {
        return Err(Error::from(
            crate::diag::Diagnostic::error(format!("this pipeline is not run: {why}"))
                .in_file(&path)
                .with_hint(why.hint()),
        ));
    }
    if let Some(hint) = not_a_pipeline(&path, &text) {
        return Err(Error::from(
            crate::diag::Diagnostic::error(hint).in_file(&path),
        ));
    }
    let file = SourceFile::new(&path, text);
    let mut diags = Diagnostics::default();
    let pipeline = parse_pipeline(&file, &mut diags);
    let (errors, warnings): (Vec<_>, Vec<_>) = diags.items.into_iter().partition(|d| d.is_error());
    ctx.report(&warnings);
    match pipeline {
        Some(pipeline) if errors.is_empty() => Ok(pipeline),
        _ => Err(Error::Input(Diagnostics { items: errors })),
    }
}

/// "did you mean" for a pipeline file that is not there: the close names of its folder's
/// YAML files, or the pipelines of the project's `pipelines/` when its folder is missing.
fn close_files(path: &std::path::Path, cwd: &std::path::Path) -> Option<String> {
    let dir = path.parent()?;
    let wanted = path.file_name()?.to_str()?;
    let names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".yaml") || n.ends_with(".yml"))
        .collect();
    let close = crate::diag::suggestions(wanted, names.iter().map(String::as_str));
    if close.is_empty() {
        return None;
    }
    let shown: Vec<String> = close
        .iter()
        .map(|name| crate::diag::render::display_path(&dir.join(name), cwd))
        .collect();
    Some(format!("did you mean {}?", shown.join(", ")))
}

/// What a file given to `summon run` is when it is a recipe or an agent rather than a
/// pipeline, and how to run that instead; `None` for anything else (the pipeline parser
/// reports it).
fn not_a_pipeline(path: &std::path::Path, text: &str) -> Option<String> {
    let stem = path.file_stem()?.to_string_lossy().into_owned();
    if path.extension().is_some_and(|e| e == "md") {
        let name = text
            .lines()
            .skip(1)
            .take_while(|l| l.trim() != "---")
            .find_map(|l| l.strip_prefix("name:"))
            .map_or(stem, |n| n.trim().trim_matches(['"', '\'']).to_owned());
        return Some(format!(
            "this is an agent definition, not a pipeline; run it with `summon delegate \
             --source {name} --instructions \"...\"`"
        ));
    }
    let root = crate::yaml::parse(text).ok()??;
    let map = root.as_map()?;
    let has = |key: &str| map.iter().any(|(k, _)| k.as_str() == Some(key));
    let recipe = has("recipe") || has("instructions") || has("prompt");
    (recipe && !has("steps")).then(|| {
        format!(
            "this is a goose recipe, not a pipeline; run it with `summon delegate --source \
             {stem}`, or name it in a pipeline step's `source:`"
        )
    })
}

/// Prints the plan of a run: the graph, the widths, every request that needs no model output
/// drafted, and an estimate of their input tokens and cost. Sends nothing.
fn dry_run(
    compiled: &CompiledPipeline,
    catalog: &crate::source::Catalog,
    params: &indexmap::IndexMap<String, String>,
    run_plan: &crate::exec::plan::Plan,
    args: &RunArgs,
    ctx: &mut Ctx,
) -> Result<()> {
    let json = args.output.json;
    let (mut config, warnings) = load_config(&ctx.env).map_err(Error::Input)?;
    ctx.report(&warnings.items);
    dry_run_windows(compiled, &mut config, &ctx.env)?;
    let pipeline = &compiled.pipeline;
    let plan = crate::exec::dry_run::plan(&ctx.env, &config, catalog, compiled, params, run_plan);
    let costs = step_costs(pipeline, &plan, &config, args.batch);
    let budget = DryBudget {
        cap: args
            .max_cost
            .or(pipeline.settings.max_cost)
            .or(config.max_cost),
        estimate: costs.iter().flatten().map(|c| c.input + c.output_max).sum(),
        prices: {
            let mut models: Vec<&str> = plan
                .steps
                .iter()
                .filter_map(|s| s.model.as_deref())
                .collect();
            models.sort_unstable();
            models.dedup();
            models
                .into_iter()
                .filter_map(|m| config.price_source(m))
                .collect()
        },
    };
    let mut cost = 0.0f64;
    let mut unpriced: Vec<String> = Vec::new();
    for (model, tokens) in &plan.tokens_by_model {
        match model.as_deref().and_then(|m| config.price(m)) {
            Some(price) => cost += *tokens as f64 * price.input / 1e6,
            None if *tokens > 0 => {
                unpriced.push(model.clone().unwrap_or_else(|| "(no model set)".into()))
            }
            None => {}
        }
    }
    unpriced.sort();
    unpriced.dedup();
    // Tasks known before the run; a fan-out over model output adds more.
    let tasks: u64 = plan.steps.iter().filter_map(|s| s.tasks).sum();
    let drafted: u64 = plan.steps.iter().map(|s| s.drafted).sum();
    let tokens = plan.input_tokens();
    if json {
        let steps: Vec<serde_json::Value> = plan
            .steps
            .iter()
            .zip(&costs)
            .map(|(s, c)| {
                json!({
                    "tier": c.as_ref().map(|c| c.tier.name()),
                    "estimated_cost_usd": c.as_ref().map(|c| json!({
                        "input": c.input, "output_max": c.output_max,
                    })),
                    "id": s.id, "kind": s.kind, "needs": s.needs, "width": s.width,
                    "tasks": s.tasks, "drafted": s.drafted, "input_tokens": s.input_tokens,
                    "overhead": s.overhead.json(), "model": s.model,
                    "prompt": s.prompt, "later": s.later, "notes": s.notes,
                    "output_limit": s.output_limit.map(|cap| json!({
                        "tokens": cap.tokens, "source": cap.source, "learned": cap.learned,
                        "default": matches!(
                            cap.source,
                            crate::subagent::output_cap::CapSource::Full
                        ),
                    })),
                    "levels": s.levels.as_ref().map(|l| json!({
                        "tasks": l.tasks, "chunk_tokens": l.chunk_tokens,
                        "tokens_per_result": l.per_result, "from_output_limit": l.from_limit,
                        "tokens_per_partial": l.per_partial, "converges": !l.diverges,
                        "context_window": l.window.as_ref().map(|(tokens, from)| json!({
                            "tokens": tokens, "from": from,
                        })),
                    })),
                })
            })
            .collect();
        ctx.out.json(&json!({
            "steps": steps,
            "tasks": tasks,
            "drafted_tasks": drafted,
            "estimated_input_tokens": tokens,
            "estimated_input_cost_usd": cost,
            "estimated_cost_usd": budget.estimate,
            "max_cost_usd": budget.cap,
            "prices": budget.prices,
            "estimate_crosses_cap": budget.crosses(),
            "unpriced_models": unpriced,
            "errors": plan.errors.iter().map(|(pos, message)| json!({
                "line": pos.line, "column": pos.col, "message": message,
            })).collect::<Vec<_>>(),
        }))?;
    } else {
        ctx.out.write(&dry_run_text(
            pipeline, &plan, tasks, drafted, cost, &unpriced, &costs, &budget,
        ))?;
    }
    if plan.errors.is_empty() {
        return Ok(());
    }
    let mut diags = Diagnostics::default();
    let mut file = diags.for_file(&pipeline.file);
    for (pos, message) in &plan.errors {
        file.error(*pos, message.clone());
    }
    Err(Error::Input(diags))
}

/// The text of `--dry-run`.
/// A reduction's expected levels, for the dry run's step line.
fn levels_text(levels: &crate::exec::dry_run::LevelsPlan) -> String {
    let per_result = format!(
        "~{} tokens per result ({})",
        thousands(levels.per_result),
        if levels.from_limit {
            "its output limit"
        } else {
            "estimated; set max_output_tokens for a bound"
        }
    );
    let window = levels
        .window
        .as_ref()
        .map_or(String::new(), |(tokens, from)| {
            format!(
                "; context window {} tokens, from {from}",
                thousands(*tokens)
            )
        });
    if levels.tasks.is_empty() {
        return format!(
            "; reduce: every result fits one request ({per_result}, chunks of ≤ {} tokens){window}",
            thousands(levels.chunk_tokens)
        );
    }
    let counts: Vec<String> = levels.tasks.iter().map(|t| t.to_string()).collect();
    let n = levels.tasks.len();
    let mut text = format!(
        "; reduce: ~{n} level{} ({} task{}), chunks of ≤ {} tokens, {per_result}",
        if n == 1 { "" } else { "s" },
        counts.join(", "),
        if levels.tasks.iter().sum::<u64>() == 1 {
            ""
        } else {
            "s"
        },
        thousands(levels.chunk_tokens),
    );
    if levels.diverges {
        text.push_str(&format!(
            "; partial answers of ~{} tokens do not fit together: the reduction would not converge",
            thousands(levels.per_partial)
        ));
    }
    text.push_str(&window);
    text
}

/// What a step's drafted first requests cost at its tier: their input, and their output at
/// the output limit.
struct StepCost {
    tier: crate::config::Tier,
    input: f64,
    output_max: f64,
}

/// The spend cap of a dry run and the estimate it is held against.
struct DryBudget {
    cap: Option<f64>,
    estimate: f64,
    /// Each model's price the cost counts with, and where it came from.
    prices: Vec<String>,
}

impl DryBudget {
    fn crosses(&self) -> Option<bool> {
        self.cap.map(|cap| self.estimate > cap)
    }
}

/// Each step's [`StepCost`]; `None` for a step with nothing drafted or no price.
fn step_costs(
    pipeline: &Pipeline,
    plan: &crate::exec::dry_run::DryRun,
    config: &crate::config::Config,
    batch_all: bool,
) -> Vec<Option<StepCost>> {
    use crate::config::Tier;
    let prices = config.prices();
    plan.steps
        .iter()
        .map(|s| {
            let step = pipeline.steps.iter().find(|p| p.id == s.id)?;
            let settings = crate::compile::StepSettings::layer(
                &crate::compile::Flags::default(),
                step,
                &pipeline.settings,
            );
            let fan_out = matches!(step.kind, crate::pipeline::model::StepKind::FanOut(_));
            let tier = if step.backend == crate::pipeline::model::Backend::Batch
                || (batch_all && fan_out)
            {
                Tier::Batch
            } else {
                settings.tier
            };
            if s.drafted == 0 {
                return None;
            }
            let price = prices.at(s.model.as_deref()?, tier)?;
            // An answer with no limit sent is priced at summon's local guard.
            let output = s.output_limit.map_or(0, |cap| {
                u64::from(
                    cap.tokens
                        .unwrap_or(crate::subagent::output_cap::LOCAL_GUARD),
                )
            });
            Some(StepCost {
                tier,
                input: s.input_tokens as f64 * price.input / 1e6,
                output_max: (s.drafted * output) as f64 * price.output / 1e6,
            })
        })
        .collect()
}

#[allow(clippy::too_many_arguments)] // the parts of one printed plan
fn dry_run_text(
    pipeline: &Pipeline,
    plan: &crate::exec::dry_run::DryRun,
    tasks: u64,
    drafted: u64,
    cost: f64,
    unpriced: &[String],
    costs: &[Option<StepCost>],
    budget: &DryBudget,
) -> String {
    let mut text = format!(
        "Pipeline {} ({} steps)\n",
        pipeline.name,
        pipeline.steps.len()
    );
    if !pipeline.description.is_empty() {
        text.push_str(&format!("{}\n", pipeline.description.trim()));
    }
    for (step, step_cost) in plan.steps.iter().zip(costs) {
        let after = if step.needs.is_empty() {
            String::new()
        } else {
            format!(" after {}", step.needs.join(", "))
        };
        let plural = |n: u64, what: &str| crate::plural::count(n, what);
        let width = match (step.kind, step.width, step.tasks) {
            ("decompose", Some(w), _) => plural(w, "item"),
            (_, _, Some(n)) => plural(n, "task"),
            _ => "width known during the run".into(),
        };
        let mut line = format!("  {} ({}){after}: {width}", step.id, step.kind);
        if step.drafted > 0 {
            line.push_str(&format!(
                ", ~{} input tokens{}",
                thousands(step.input_tokens),
                step.model
                    .as_ref()
                    .map(|m| format!(" for {m}"))
                    .unwrap_or_default()
            ));
        }
        if let Some(later) = &step.later {
            line.push_str(&format!("; {later}"));
        }
        if let Some(levels) = &step.levels {
            line.push_str(&levels_text(levels));
        }
        text.push_str(&line);
        text.push('\n');
        if let Some(prompt) = &step.prompt {
            for prompt_line in prompt.lines().take(6) {
                text.push_str(&format!("      | {prompt_line}\n"));
            }
        }
        if step.overhead.tasks > 0 {
            let o = &step.overhead;
            text.push_str(&format!(
                "      overhead: ~{} tokens per task beyond its instructions, context and role \
                 ({} of them tool definitions)\n",
                thousands(o.per_task_max),
                thousands(o.tool_tokens_per_task_max)
            ));
        }
        if let Some(cap) = &step.output_limit {
            text.push_str(&format!("      output limit: {}\n", cap.describe()));
        }
        if let Some(c) = step_cost {
            text.push_str(&format!(
                "      cost at the {} tier: ~${:.4} input, up to ${:.4} output (first requests)\n",
                c.tier.name(),
                c.input,
                c.output_max
            ));
        }
        for note in &step.notes {
            text.push_str(&format!("      note: {note}\n"));
        }
    }
    text.push_str(&format!(
        "Estimated input tokens: ~{} in the first requests of {drafted} of {tasks} tasks \
         (tasks that read model output, tool results and later turns come on top)\n",
        thousands(plan.input_tokens())
    ));
    if unpriced.is_empty() {
        text.push_str(&format!("Estimated input cost: ${cost:.4}\n"));
    } else {
        text.push_str(&format!(
            "Estimated input cost: ${cost:.4} for priced models; {} for: {} ({})\n",
            crate::config::NO_PRICE,
            unpriced.join(", "),
            crate::config::prices::no_price_hint(&unpriced[0])
        ));
    }
    if budget.estimate > 0.0 {
        text.push_str(&format!(
            "Estimated cost of those first requests at each step's tier: up to ${:.4} (their \
             input, and their output at the output limit)\n",
            budget.estimate
        ));
    }
    if let Some(cap) = budget.cap {
        let cap_text = crate::subagent::budget::usd(cap);
        if budget.crosses() == Some(true) {
            text.push_str(&format!(
                "Spend cap: {cap_text}; the estimate already crosses it: the run would stop \
                 with \"budget reached\" before every task has run\n"
            ));
        } else {
            text.push_str(&format!(
                "Spend cap: {cap_text}; the estimate is within it (later turns, tool results \
                 and tasks that read model output come on top)\n"
            ));
        }
        for price in &budget.prices {
            text.push_str(&format!("  counted at {price}\n"));
        }
    }
    text.push_str("No request was sent.\n");
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_groups_digits_by_three() {
        let cases = [
            (0, "0"),
            (999, "999"),
            (1000, "1,000"),
            (105_590_000, "105,590,000"),
        ];
        for (n, text) in cases {
            assert_eq!(super::thousands(n), text);
        }
    }
}
