//! `summon merge PIPELINE DIR...`: checks that the directories are the complete set of
//! shards of one run (`summon run --shard I/N --out DIR`) of this pipeline with the same
//! parameters and items, combines their tasks, runs the steps left for the merge, and writes
//! what `summon run` writes: the final step's text on stdout, `--out DIR` (`results.jsonl`
//! with every task of every shard and of the merge, `report.json`, `report.html`), `--junit`, and the
//! pipeline's `outputs`.
//!
//! JSON (`--json`): `{"run_id", "status": "succeeded"|"failed"|"interrupted", "shards": N,
//! "steps": [{"id", "status": "succeeded"|"failed"|"skipped", "error"}], "output"}`.

use std::io::IsTerminal;

use serde_json::json;

use super::Ctx;
use crate::cli::MergeArgs;
use crate::compile::{Flags, Inputs, compile_pipeline};
use crate::config::load_config;
use crate::error::{Error, Result};
use crate::exec::plan::{plan_for_merge, shard_params};
use crate::exec::{RunOptions, run_pipeline};
use crate::output::resolve_display;
use crate::recipe::params::Origin;
use crate::recipe::{ParamInput, bind_params};

pub(crate) fn run(args: &MergeArgs, ctx: &mut Ctx) -> Result<()> {
    let shown = args.pipeline.display().to_string();
    let started = ctx.enter_project();
    let mut args = args.clone();
    if started != ctx.env.cwd {
        // The command line's paths are read from where summon was started.
        args.pipeline = started.join(&args.pipeline);
        for dir in &mut args.dirs {
            *dir = started.join(&*dir);
        }
        for path in [&mut args.out, &mut args.junit, &mut args.params.params_file]
            .into_iter()
            .flatten()
        {
            *path = started.join(&*path);
        }
    }
    let args = &args;
    let pipeline = super::run::load_pipeline(&args.pipeline, ctx)?;
    if let Some(out) = &args.out {
        let out_dir = ctx.env.cwd.join(out);
        for dir in &args.dirs {
            let dir_path = ctx.env.cwd.join(dir);
            let same = match (out_dir.canonicalize(), dir_path.canonicalize()) {
                (Ok(a), Ok(b)) => a == b,
                _ => out_dir == dir_path,
            };
            if same {
                return Err(Error::usage(format!(
                    "`--out {}` is one of the shard directories; write the merge elsewhere",
                    out.display()
                )));
            }
        }
    }
    // Without --param/--params, the shards' own parameters (checked against every shard).
    let input = if args.params.param.is_empty() && args.params.params_file.is_none() {
        let mut input = ParamInput::default();
        if let Some(first) = args.dirs.first() {
            for (key, value) in shard_params(&ctx.env, first)? {
                input.values.insert(key, (value, Origin::Flag));
            }
        }
        input
    } else {
        ParamInput::from_args(
            args.params.params_file.as_deref(),
            &args.params.param,
            &ctx.env.cwd,
        )?
    };
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
    let params = binding.values();
    let plan = plan_for_merge(&ctx.env, &pipeline, &params, &args.dirs, &shown)?;
    for note in &plan.notes {
        ctx.note(&format!("warning: {note}"));
    }
    let catalog = ctx.catalog();
    let compiled = compile_pipeline(
        pipeline,
        &Inputs {
            params: &params,
            flags: Flags::default(),
            catalog: &catalog,
        },
    );
    // The steps the shards ran are given; those left for the merge are checked as a run
    // checks them.
    compiled
        .check(|step| plan.given(step).is_none())
        .map_err(Error::Input)?;
    let pipeline = compiled.pipeline;
    let (config, warnings) = load_config(&ctx.env).map_err(Error::Input)?;
    ctx.report(&warnings.items);
    crate::provider::RetryPolicy::from_env(&ctx.env)
        .map_err(|message| Error::from(crate::diag::Diagnostic::error(message)))?;
    let trace_settings =
        crate::telemetry::Settings::resolve(&ctx.env, &config).map_err(Error::from)?;
    let traces = super::run::start_traces(trace_settings.as_ref(), &pipeline, ctx);
    if let Some(traces) = &traces {
        traces.set_prices(config.prices());
    }
    let display = resolve_display(
        std::io::stderr().is_terminal(),
        ctx.env.is_set("CI"),
        args.quiet || args.output.json,
    );
    let name = pipeline.name.clone();
    let options = RunOptions {
        reuse: false,
        wait: false,
        watch: traces.as_ref().map(crate::telemetry::RunTraces::consumer),
        trace_id: traces.as_ref().map(|t| t.trace_id().to_owned()),
        traceparent: traces
            .as_ref()
            .map(crate::telemetry::RunTraces::traceparent),
        stop: None,
        pipeline,
        params,
        concurrency: args.concurrency.map(|c| c as usize),
        out_dir: args.out.clone(),
        resume: None,
        junit: args.junit.clone(),
        display,
        batch: false,
        plan,
        max_cost: args.max_cost,
    };
    let ran = run_pipeline(&ctx.env, config, catalog, options);
    super::run::end_traces(traces, &ran, ctx);
    let mut summary = ran?;
    super::run::write_step_summary("merge", &name, &summary, ctx);
    let mut extra = serde_json::Map::new();
    extra.insert("shards".into(), json!(args.dirs.len()));
    let failed = super::run::print_outcome(&mut summary, extra, args.output.json, ctx)?;
    if let Some(reached) = &summary.budget {
        eprintln!(
            "summon: merge stopped, {reached}; run `summon merge {shown} --max-cost MORE` again \
             (finished tasks are not repeated)"
        );
        return Err(Error::Budget);
    }
    if summary.interrupted {
        eprintln!(
            "summon: merge interrupted; run `summon merge {shown}` again (finished shard tasks \
             are not repeated)"
        );
        return Err(Error::Interrupted);
    }
    if failed {
        return Err(Error::Failed(String::new()));
    }
    Ok(())
}
