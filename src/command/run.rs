//! `summon run PIPELINE`: the final step's text on stdout, progress on stderr.
//!
//! JSON (`--json`): `{"run_id", "status": "succeeded"|"failed"|"interrupted", "steps":
//! [{"id", "status": "succeeded"|"failed"|"skipped"|"deferred", "error"}], "output"}`;
//! `deferred`: a step a shard leaves for `summon merge`, or one after `--until STEP`.
//! `--dry-run --json`: `{"steps": [{"id", "kind", "needs": [ID], "width", "prompt"}],
//! "estimated_input_tokens", "estimated_input_cost_usd", "unpriced_models"}`.

use std::io::IsTerminal;

use serde_json::json;

use super::Ctx;
use crate::cli::RunArgs;
use crate::config::load_config;
use crate::diag::{Diagnostics, SourceFile};
use crate::error::{Error, Result};
use crate::exec::{FinalText, RunOptions, RunSummary, StepStatus, run_pipeline};
use crate::output::resolve_display;
use crate::pipeline::model::{Decompose, Pipeline, StepKind};
use crate::pipeline::parse::parse_pipeline;
use crate::recipe::{ParamInput, bind_params};
use crate::source::read_source_text;

pub(crate) fn run(args: &RunArgs, ctx: &mut Ctx) -> Result<()> {
    let pipeline = load_pipeline(&args.pipeline, ctx)?;
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
    let params = binding.values();
    let shown = args.pipeline.display().to_string();
    let request = crate::exec::shard::RunRequest {
        shard: args.shard.as_deref(),
        until: args.until.as_deref(),
        items_from: args.items_from.as_deref(),
        out: args.out.as_deref(),
        shown: &shown,
    };
    let plan = crate::exec::shard::plan_for_run(&ctx.env, &pipeline, &params, &request)?;
    if args.dry_run {
        return dry_run(&pipeline, &params, args.output.json, ctx);
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
    let catalog = ctx.catalog();
    let display = resolve_display(
        std::io::stderr().is_terminal(),
        ctx.env.is_set("CI"),
        args.quiet || args.output.json,
    );
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
    };
    let mut summary = run_pipeline(&ctx.env, config, catalog, options)?;
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
        eprintln!(
            "summon: run {} interrupted; continue it with `summon run {}{part} --resume`",
            summary.run_id,
            args.pipeline.display()
        );
        return Err(Error::Interrupted);
    }
    if failed {
        eprintln!(
            "summon: run {} failed; after fixing, `--resume` repeats only unfinished tasks",
            summary.run_id
        );
        return Err(Error::Failed(String::new()));
    }
    if let Some(closing) = closing {
        ctx.note(&closing);
    }
    Ok(())
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
        eprintln!(
            "summon: step `{id}` failed: {}",
            error.as_deref().unwrap_or("")
        );
    }
    Ok(!failed.is_empty())
}

pub(super) fn load_pipeline(pipeline: &std::path::Path, ctx: &Ctx) -> Result<Pipeline> {
    let path = ctx.env.cwd.join(pipeline);
    let text = read_source_text(&path)
        .map_err(|message| Error::from(crate::diag::Diagnostic::error(message).in_file(&path)))?;
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

/// Renders what needs no model output, prints the graph, widths and an estimate.
fn dry_run(
    pipeline: &Pipeline,
    params: &indexmap::IndexMap<String, String>,
    json: bool,
    ctx: &mut Ctx,
) -> Result<()> {
    let graph = crate::pipeline::graph::Graph::new(pipeline);
    let env = crate::template::environment(pipeline.file.path().parent());
    let mut context = serde_json::Map::new();
    for (k, v) in params {
        context.insert(k.clone(), json!(v));
    }
    let base = minijinja::Value::from(minijinja::value::Serde(serde_json::Value::Object(context)));
    let mut widths: Vec<Option<usize>> = vec![None; pipeline.steps.len()];
    let mut steps_json = Vec::new();
    let mut tokens = 0usize;
    let (config, _) = load_config(&ctx.env).map_err(Error::Input)?;
    let mut cost = 0.0f64;
    let mut unpriced: Vec<String> = Vec::new();
    let mut text = format!(
        "Pipeline {} ({} steps)\n",
        pipeline.name,
        pipeline.steps.len()
    );
    if !pipeline.description.is_empty() {
        text.push_str(&format!("{}\n", pipeline.description.trim()));
    }
    for (i, step) in pipeline.steps.iter().enumerate() {
        let needs: Vec<&str> = graph
            .deps(i)
            .iter()
            .map(|d| pipeline.steps[*d].id.as_str())
            .collect();
        let (width, prompt) = match &step.kind {
            StepKind::Decompose(Decompose::Items(items)) => (Some(items.len()), None),
            StepKind::Decompose(Decompose::Command(t)) => {
                let count = env
                    .render_str(&t.text, &base)
                    .ok()
                    .and_then(|c| {
                        crate::pipeline::items::command_items(
                            &c,
                            &ctx.env.cwd,
                            std::time::Duration::from_secs(60),
                        )
                        .ok()
                    })
                    .map(|items| items.len());
                (count, None)
            }
            StepKind::Decompose(Decompose::Glob(t)) => (
                env.render_str(&t.text, &base)
                    .ok()
                    .and_then(|g| crate::pipeline::items::glob_items(&g, &ctx.env.cwd).ok())
                    .map(|items| items.len()),
                None,
            ),
            StepKind::Decompose(Decompose::File(t)) => (
                env.render_str(&t.text, &base)
                    .ok()
                    .and_then(|p| {
                        crate::pipeline::items::open_file_items(&ctx.env.cwd.join(p.trim())).ok()
                    })
                    .map(Iterator::count),
                None,
            ),
            StepKind::Decompose(Decompose::Agent(task))
            | StepKind::Synthesize(task)
            | StepKind::Delegate(task) => {
                let prompt = task
                    .instructions
                    .as_ref()
                    .and_then(|t| env.render_str(&t.text, &base).ok());
                (Some(1), prompt)
            }
            StepKind::FanOut(fan_out) => {
                let over = pipeline.steps.iter().position(|s| s.id == fan_out.over);
                (over.and_then(|o| widths[o]), None)
            }
        };
        widths[i] = width;
        let tasks = match &step.kind {
            StepKind::Decompose(Decompose::Agent(_))
            | StepKind::Synthesize(_)
            | StepKind::Delegate(_) => Some(1),
            StepKind::FanOut(_) => width,
            StepKind::Decompose(_) => Some(0),
        };
        let step_tokens = if let (Some(p), Some(n)) = (&prompt, tasks) {
            p.len() / 4 * n
        } else if let (StepKind::FanOut(f), Some(n)) = (&step.kind, tasks) {
            f.task.instructions.as_ref().map_or(0, |t| t.text.len() / 4) * n
        } else {
            0
        };
        tokens += step_tokens;
        // The model this step would most likely use, for its input price.
        let model = step
            .model
            .clone()
            .or_else(|| pipeline.settings.model.clone())
            .or_else(|| ctx.env.var("SUMMON_SUBAGENT_MODEL").map(str::to_owned))
            .or_else(|| ctx.env.var("SUMMON_MODEL").map(str::to_owned))
            .or_else(|| config.default_model.as_ref().map(|m| m.value.clone()));
        if step_tokens > 0 {
            match model.as_deref().and_then(|m| config.price(m)) {
                Some(price) => cost += step_tokens as f64 * price.input / 1e6,
                None => unpriced.push(model.unwrap_or_else(|| "(no model set)".into())),
            }
        }
        text.push_str(&format!(
            "  {} ({}){}{}\n",
            step.id,
            step.kind.name(),
            if needs.is_empty() {
                String::new()
            } else {
                format!(" after {}", needs.join(", "))
            },
            match (width, &step.kind) {
                (Some(w), StepKind::FanOut(_)) => format!(": {w} tasks"),
                (Some(w), StepKind::Decompose(Decompose::Agent(_))) => format!(": {w} task"),
                (Some(w), StepKind::Decompose(_)) => format!(": {w} items"),
                (None, StepKind::FanOut(_) | StepKind::Decompose(_)) =>
                    ": width known after the run starts".into(),
                _ => ": 1 task".into(),
            }
        ));
        if let Some(prompt) = &prompt {
            for line in prompt.lines().take(6) {
                text.push_str(&format!("      | {line}\n"));
            }
        }
        steps_json.push(json!({"id": step.id, "kind": step.kind.name(), "needs": needs, "width": width, "prompt": prompt}));
    }
    text.push_str(&format!(
        "Estimated input tokens (prompts known before the run): ~{tokens}\n"
    ));
    unpriced.sort();
    unpriced.dedup();
    if unpriced.is_empty() {
        text.push_str(&format!("Estimated input cost: ${cost:.4}\n"));
    } else {
        text.push_str(&format!(
            "Estimated input cost: ${cost:.4} for priced models; no price in the config file for: {}\n",
            unpriced.join(", ")
        ));
    }
    text.push_str("No request was sent.\n");
    if json {
        ctx.out.json(&json!({
            "steps": steps_json,
            "estimated_input_tokens": tokens,
            "estimated_input_cost_usd": cost,
            "unpriced_models": unpriced,
        }))?;
    } else {
        ctx.out.write(&text)?;
    }
    Ok(())
}
