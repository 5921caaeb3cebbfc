//! `summon runs`: the history of `summon run` in this project.
//!
//! JSON (`--json`): `{"runs": [RUN]}`, newest first, where RUN is `{"run_id", "pipeline",
//! "status", "started_at", "finished_at", "duration_ms", "completed", "failed",
//! "input_tokens", "output_tokens", "cost_usd", "priced", "out"}` (`cost_usd` from the run's
//! report: null while it runs or when no price is configured; over the priced tasks only when
//! `priced` is false: some tasks had no price). `runs show ID --json`: RUN with
//! `"report"`, the content of the run's `report.json`. `runs prune --json`: `{"runs",
//! "tasks"}` deleted.

use serde_json::{Value, json};

use super::Ctx;
use crate::cli::{RunsAction, RunsArgs};
use crate::error::{Error, Result};
use crate::output::{fmt_cost, fmt_duration, fmt_tokens};
use crate::store::{Retention, RunListing, RunStatus, Store};

pub(crate) fn run(args: &RunsArgs, ctx: &mut Ctx) -> Result<()> {
    match &args.action {
        None => list(args, ctx),
        Some(RunsAction::Show { run_id, output }) => show(run_id, output.json, ctx),
        Some(RunsAction::Prune {
            keep,
            older_than,
            pipeline,
            output,
        }) => prune(
            *keep,
            older_than.as_deref(),
            pipeline.as_deref(),
            output.json,
            ctx,
        ),
    }
}

/// The project's store, found like git finds `.git`; `None` when there is none (listing and
/// showing never create one).
fn existing_store(ctx: &Ctx) -> Result<Option<Store>> {
    Store::open_existing(&ctx.env.cwd).map_err(Error::from)
}

/// The pipeline path as runs record it (canonical).
fn pipeline_key(path: &std::path::Path, ctx: &Ctx) -> String {
    let full = ctx.env.cwd.join(path);
    full.canonicalize().unwrap_or(full).display().to_string()
}

fn list(args: &RunsArgs, ctx: &mut Ctx) -> Result<()> {
    let status = args
        .status
        .as_deref()
        .map(|s| s.parse::<RunStatus>().map_err(Error::usage))
        .transpose()?;
    let pipeline = args.pipeline.as_deref().map(|p| pipeline_key(p, ctx));
    let runs = match existing_store(ctx)? {
        Some(store) => store.list_runs(pipeline.as_deref(), status)?,
        None => Vec::new(),
    };
    if args.output.json {
        let items: Vec<Value> = runs.iter().map(|r| run_json(r, ctx)).collect();
        ctx.out.json(&json!({ "runs": items }))?;
        return Ok(());
    }
    if runs.is_empty() {
        let all = match (&pipeline, status) {
            (None, None) => 0,
            _ => match existing_store(ctx)? {
                Some(store) => store.list_runs(None, None)?.len(),
                None => 0,
            },
        };
        if all == 0 {
            ctx.out
                .line("No runs recorded here. Start one with `summon run PIPELINE.yaml`.")?;
        } else {
            let mut asked = Vec::new();
            if let Some(path) = &args.pipeline {
                asked.push(format!("--pipeline {}", path.display()));
            }
            if let Some(status) = &args.status {
                asked.push(format!("--status {status}"));
            }
            ctx.out.line(&format!(
                "No run matches {}; `summon runs` lists all {}.",
                asked.join(" "),
                crate::plural::count(all as u64, "run")
            ))?;
        }
        return Ok(());
    }
    let mut text = format!(
        "{:<18} {:<11} {:<20} {:>9} {:>11} {:>8} {:>8}  {}\n",
        "RUN", "STATUS", "STARTED", "DURATION", "DONE/FAILED", "TOKENS", "COST", "PIPELINE"
    );
    for r in &runs {
        let run = &r.run;
        text.push_str(&format!(
            "{:<18} {:<11} {:<20} {:>9} {:>11} {:>8} {:>8}  {}\n",
            run.run_id,
            run.status.as_str(),
            run.created_at.strftime("%Y-%m-%d %H:%M:%S").to_string(),
            duration(r).map_or_else(|| "-".to_owned(), fmt_duration),
            format!("{}/{}", r.completed, r.failed),
            fmt_tokens(r.input_tokens + r.output_tokens),
            shown_cost(r),
            shown_path(&run.pipeline_path, ctx),
        ));
    }
    ctx.out.write(&text)?;
    Ok(())
}

fn show(run_id: &str, json: bool, ctx: &mut Ctx) -> Result<()> {
    let listing = match existing_store(ctx)? {
        Some(store) => store.run_listing(run_id)?,
        None => None,
    };
    let Some(listing) = listing else {
        return Err(Error::usage(format!(
            "no run `{run_id}` in this project's store; `summon runs` lists them (old runs are \
             pruned by store.keep_runs and store.keep_days)"
        )));
    };
    if json {
        let mut value = run_json(&listing, ctx);
        value["report"] = listing.report.clone().unwrap_or(Value::Null);
        ctx.out.json(&value)?;
        return Ok(());
    }
    let run = &listing.run;
    let mut text = format!(
        "Run {} of {}: {}\nStarted {}",
        run.run_id,
        shown_path(&run.pipeline_path, ctx),
        run.status.as_str(),
        run.created_at.strftime("%Y-%m-%d %H:%M:%S UTC"),
    );
    if let Some(d) = duration(&listing) {
        text.push_str(&format!(", took {}", fmt_duration(d)));
    }
    text.push('\n');
    match &run.out_dir {
        Some(out) => text.push_str(&format!("Output: {}\n", shown_path(out, ctx))),
        None => text.push_str("Output: none (run without --out)\n"),
    }
    if let Some(trace) = listing
        .report
        .as_ref()
        .and_then(|report| report["trace_id"].as_str())
    {
        text.push_str(&format!("Trace: {trace}\n"));
    }
    match &listing.report {
        Some(report) => {
            if let Some(out) = &run.out_dir {
                let page = std::path::Path::new(out).join("report.html");
                if ctx.env.cwd.join(&page).is_file() {
                    text.push_str(&format!(
                        "Report: {} (`--json` prints report.json)\n",
                        shown_path(&page.display().to_string(), ctx)
                    ));
                }
            }
            text.push('\n');
            text.push_str(&report_table(report));
        }
        None => text.push_str(&format!(
            "No report yet: {} tasks completed, {} failed, {} tokens so far.\n",
            listing.completed,
            listing.failed,
            fmt_tokens(listing.input_tokens + listing.output_tokens)
        )),
    }
    ctx.out.write(&text)?;
    Ok(())
}

/// A run's report as a person reads it: a row per step (status, tasks, tokens, cost), the
/// total, the retries by cause and the count of warnings.
fn report_table(report: &Value) -> String {
    let status_of = |id: &str| {
        report["pipeline"]["steps"]
            .as_array()
            .and_then(|steps| steps.iter().find(|s| s["id"] == id))
            .and_then(|s| s["status"].as_str())
            .unwrap_or("-")
            .to_owned()
    };
    let row = |name: &str, status: &str, stats: &Value| {
        let n = |key: &str| stats[key].as_u64().unwrap_or(0);
        let cost = match (stats["cost_usd"].as_f64(), stats["priced"].as_bool()) {
            (Some(cost), Some(true)) => fmt_cost(cost),
            _ => "no price".to_owned(),
        };
        format!(
            "{name:<20} {status:<10} {:>7} {:>9} {:>7} {:>8} {:>9}\n",
            n("tasks"),
            n("completed"),
            n("failed"),
            fmt_tokens(n("input_tokens") + n("output_tokens")),
            cost
        )
    };
    let mut text = format!(
        "{:<20} {:<10} {:>7} {:>9} {:>7} {:>8} {:>9}\n",
        "STEP", "STATUS", "TASKS", "COMPLETED", "FAILED", "TOKENS", "COST"
    );
    if let Some(steps) = report["steps"].as_object() {
        for (id, stats) in steps {
            text.push_str(&row(id, &status_of(id), stats));
        }
    }
    text.push_str(&row("total", "", &report["total"]));
    let retries: Vec<String> = report["retries_by_class"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(class, n)| {
            n.as_u64()
                .filter(|n| *n > 0)
                .map(|n| format!("{n} {class}"))
        })
        .collect();
    if !retries.is_empty() {
        text.push_str(&format!("Retried requests: {}\n", retries.join(", ")));
    }
    if let Some(warnings) = report["warnings"].as_array().filter(|w| !w.is_empty()) {
        text.push_str(&format!(
            "{} about extensions and tools: `--json` lists them\n",
            crate::plural::count(warnings.len() as u64, "warning")
        ));
    }
    text
}

fn prune(
    keep: Option<usize>,
    older_than: Option<&str>,
    pipeline: Option<&std::path::Path>,
    json: bool,
    ctx: &mut Ctx,
) -> Result<()> {
    let (config, warnings) = crate::config::load_config(&ctx.env).map_err(Error::Input)?;
    ctx.report(&warnings.items);
    let mut retention = Retention::default();
    if let Some(keep) = keep.or(config.keep_runs.map(|k| k as usize)) {
        retention.keep = keep;
    }
    match older_than {
        Some(text) => retention.keep_for = parse_age(text).map_err(Error::usage)?,
        None => {
            if let Some(days) = config.keep_days {
                retention.keep_for = std::time::Duration::from_secs_f64(days * 86_400.0);
            }
        }
    }
    let pipeline = pipeline.map(|p| pipeline_key(p, ctx));
    let Some(store) = existing_store(ctx)? else {
        ctx.out.line("No runs recorded here: nothing to prune.")?;
        return Ok(());
    };
    let pruned = store.prune_runs(pipeline.as_deref(), retention, None)?;
    if pruned.runs > 0 {
        store.reclaim_space()?;
    }
    if json {
        ctx.out
            .json(&json!({"runs": pruned.runs, "tasks": pruned.tasks}))?;
    } else {
        ctx.out.line(&format!(
            "Pruned {} run{} ({} task result{}); kept the newest {} of each pipeline and those \
             younger than {}.",
            pruned.runs,
            crate::plural::s(pruned.runs),
            pruned.tasks,
            crate::plural::s(pruned.tasks),
            retention.keep,
            fmt_duration(retention.keep_for)
        ))?;
    }
    Ok(())
}

/// `7d`, or a duration as pipelines write them (`12h`, `90m`).
fn parse_age(text: &str) -> std::result::Result<std::time::Duration, String> {
    if let Some(days) = text.trim().strip_suffix('d')
        && let Ok(days) = days.trim().parse::<f64>()
        && days >= 0.0
        && days.is_finite()
    {
        return Ok(std::time::Duration::from_secs_f64(days * 86_400.0));
    }
    crate::pipeline::duration::parse_duration(text)
        .map_err(|e| format!("--older-than: {e}, or days (`7d`)"))
}

fn duration(r: &RunListing) -> Option<std::time::Duration> {
    let end = r.run.finished_at?;
    Some(end.duration_since(r.run.created_at).unsigned_abs())
}

fn cost(r: &RunListing) -> Option<f64> {
    r.report.as_ref()?["total"]["cost_usd"].as_f64()
}

/// Whether every task of the run had a price (`None` while it has no report).
fn priced(r: &RunListing) -> Option<bool> {
    r.report.as_ref()?["total"]["priced"].as_bool()
}

/// The cost column: unknown is not zero. A run with tasks that had no price shows what the
/// priced ones cost and `+ ?`, or `no price` when they cost nothing.
fn shown_cost(r: &RunListing) -> String {
    match (cost(r), priced(r)) {
        (Some(cost), Some(true) | None) => fmt_cost(cost),
        (Some(cost), Some(false)) if cost > 0.0 => format!("{} + ?", fmt_cost(cost)),
        _ => "no price".to_owned(),
    }
}

fn shown_path(path: &str, ctx: &Ctx) -> String {
    crate::diag::render::display_path(std::path::Path::new(path), &ctx.env.cwd)
}

fn run_json(r: &RunListing, ctx: &Ctx) -> Value {
    let run = &r.run;
    json!({
        "run_id": run.run_id,
        "pipeline": shown_path(&run.pipeline_path, ctx),
        "status": run.status.as_str(),
        "started_at": run.created_at.to_string(),
        "finished_at": run.finished_at.map(|t| t.to_string()),
        "duration_ms": duration(r).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        "completed": r.completed,
        "failed": r.failed,
        "input_tokens": r.input_tokens,
        "output_tokens": r.output_tokens,
        "cost_usd": cost(r),
        "priced": priced(r),
        "out": run.out_dir.as_deref().map(|out| shown_path(out, ctx)),
    })
}
