//! `summon run PIPELINE`: the final step's text on stdout, progress on stderr.
//!
//! JSON (`--json`): `{"run_id", "status": "succeeded"|"failed"|"interrupted", "steps":
//! [{"id", "status": "succeeded"|"failed"|"skipped"|"deferred", "error"}], "output"}`;
//! `deferred`: a step a shard leaves for `summon merge`, or one after `--until STEP`.
//! `--dry-run --json`: `{"steps": [{"id", "kind", "needs": [ID], "width", "drafted",
//! "input_tokens", "model", "prompt", "later", "notes"}], "tasks", "drafted_tasks",
//! "estimated_input_tokens", "estimated_input_cost_usd", "unpriced_models", "errors"}`.

use std::io::IsTerminal;

use serde_json::json;

use super::Ctx;
use crate::cli::RunArgs;
use crate::config::load_config;
use crate::diag::{Diagnostics, SourceFile};
use crate::error::{Error, Result};
use crate::exec::{FinalText, RunOptions, RunSummary, StepStatus, run_pipeline};
use crate::output::resolve_display;
use crate::pipeline::model::Pipeline;
use crate::pipeline::parse::parse_pipeline;
use crate::recipe::{ParamInput, bind_params};
use crate::source::read_source_text;

pub(crate) fn run(args: &RunArgs, ctx: &mut Ctx) -> Result<()> {
    let mut pipeline = load_pipeline(&args.pipeline, ctx)?;
    pipeline.override_output_limit(args.max_output_tokens);
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

/// Prints the plan of a run: the graph, the widths, every request that needs no model output
/// drafted, and an estimate of their input tokens and cost. Sends nothing.
fn dry_run(
    pipeline: &Pipeline,
    params: &indexmap::IndexMap<String, String>,
    json: bool,
    ctx: &mut Ctx,
) -> Result<()> {
    let (config, warnings) = load_config(&ctx.env).map_err(Error::Input)?;
    ctx.report(&warnings.items);
    let catalog = ctx.catalog();
    let plan = crate::exec::dry_run::plan(&ctx.env, &config, &catalog, pipeline, params);
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
            .map(|s| {
                json!({
                    "id": s.id, "kind": s.kind, "needs": s.needs, "width": s.width,
                    "tasks": s.tasks, "drafted": s.drafted, "input_tokens": s.input_tokens, "model": s.model,
                    "prompt": s.prompt, "later": s.later, "notes": s.notes,
                })
            })
            .collect();
        ctx.out.json(&json!({
            "steps": steps,
            "tasks": tasks,
            "drafted_tasks": drafted,
            "estimated_input_tokens": tokens,
            "estimated_input_cost_usd": cost,
            "unpriced_models": unpriced,
            "errors": plan.errors.iter().map(|(pos, message)| json!({
                "line": pos.line, "column": pos.col, "message": message,
            })).collect::<Vec<_>>(),
        }))?;
    } else {
        ctx.out.write(&dry_run_text(
            pipeline, &plan, tasks, drafted, cost, &unpriced,
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

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The text of `--dry-run`.
fn dry_run_text(
    pipeline: &Pipeline,
    plan: &crate::exec::dry_run::DryRun,
    tasks: u64,
    drafted: u64,
    cost: f64,
    unpriced: &[String],
) -> String {
    let mut text = format!(
        "Pipeline {} ({} steps)\n",
        pipeline.name,
        pipeline.steps.len()
    );
    if !pipeline.description.is_empty() {
        text.push_str(&format!("{}\n", pipeline.description.trim()));
    }
    for step in &plan.steps {
        let after = if step.needs.is_empty() {
            String::new()
        } else {
            format!(" after {}", step.needs.join(", "))
        };
        let plural = |n: u64, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
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
        text.push_str(&line);
        text.push('\n');
        if let Some(prompt) = &step.prompt {
            for prompt_line in prompt.lines().take(6) {
                text.push_str(&format!("      | {prompt_line}\n"));
            }
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
            "Estimated input cost: ${cost:.4} for priced models; no price in the config file for: {}\n",
            unpriced.join(", ")
        ));
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
