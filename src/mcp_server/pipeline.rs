//! `run_pipeline`: `summon run PATH --json` as a child in its own process group, so the run
//! has the command's own rules (trust, sandbox, store, catalog, the nesting ban); its
//! progress lines go to the client, a cancelled call stops it as SIGTERM stops a run.

use std::io::{BufRead as _, Read as _};
use std::process::Stdio;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::args::{Args, Object};
use super::tools::RUN_PIPELINE;
use super::{Progress, Shared};
use crate::mcp_server::calls::{Reply, sized};

pub(super) fn run(
    shared: &Shared,
    map: &Object,
    progress: &Progress,
    cancel: &CancellationToken,
) -> Result<Reply, String> {
    let args = Args::new(RUN_PIPELINE, map, &["path", "parameters", "out"])?;
    let path = args.required_string("path")?;
    let params = args.values("parameters")?;
    let out = args.string("out")?;
    // Both are the model's words: they stay inside the project, and go to `summon run` as
    // absolute paths and `--flag=value` words, never read as flags of their own.
    let within = |key: &str, value: &str| {
        crate::safe_fs::inside(&shared.env.cwd, std::path::Path::new(value))
            .map(|rel| shared.env.cwd.join(rel))
            .map_err(|_| {
                format!("run_pipeline: `{key}` must be inside the project, found `{value}`")
            })
    };
    let pipeline = within("path", &path)?;
    // `out` is a folder the run writes into: judged with a name inside it, so a link planted
    // at its own name that leads out is refused too.
    let out_dir = out
        .as_deref()
        .map(|out| {
            within("out", out)?;
            let inner = std::path::Path::new(out).join("results.jsonl");
            crate::safe_fs::inside(&shared.env.cwd, &inner)
                .map(|rel| shared.env.cwd.join(rel).with_file_name(""))
                .map_err(|why| {
                    format!(
                        "run_pipeline: `out` must be inside the project, found `{out}` (it {})",
                        why.reason()
                    )
                })
        })
        .transpose()?;
    // Only a pipeline the user trusts runs, and none written while this server runs.
    super::trust::trusted_pipeline(shared, &pipeline, &path)?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find summon itself: {e}"))?;
    let mut command = std::process::Command::new(exe);
    command
        .arg("run")
        .arg("--json")
        .arg("--color=never")
        // The run parses the file again: it runs only bytes the same rule allows.
        .env(crate::config::trust::PIPELINE_TRUST_ENV, "1")
        .current_dir(&shared.env.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in &params {
        command.arg(format!("--param={key}={value}"));
    }
    if let Some(out_dir) = &out_dir {
        let mut word = std::ffi::OsString::from("--out=");
        word.push(out_dir);
        command.arg(word);
    }
    command.arg("--").arg(&pipeline);
    if let Some(trace) = &progress.trace {
        // The run's trace is a child of this call's span.
        command.env("TRACEPARENT", trace);
    }
    let mut wrapped = process_wrap::std::CommandWrap::from(command);
    wrapped.wrap(process_wrap::std::ProcessGroup::leader());
    let mut child = wrapped
        .spawn()
        .map_err(|e| format!("cannot start `summon run`: {e}"))?;
    let pgid = child.id();
    if let Ok(mut runs) = shared.runs.lock() {
        runs.insert(pgid);
    }
    let mut stdout = child.stdout().take().expect("piped stdout");
    let stderr = child.stderr().take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let errors = std::thread::scope(|scope| {
        let lines = scope.spawn(|| {
            let mut kept = Vec::new();
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let line = crate::text::printable(&line).into_owned();
                if !line.trim().is_empty() {
                    progress.line(&line);
                    kept.push(line);
                }
            }
            kept
        });
        // A cancelled call stops the run as SIGTERM does: its tasks' process groups die.
        let mut stopped = false;
        while !lines.is_finished() {
            if !stopped && (cancel.is_cancelled() || shared.shutdown.is_cancelled()) {
                if let Ok(pid) = i32::try_from(pgid) {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                }
                stopped = true;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        lines.join().unwrap_or_default()
    });
    let status = child.wait();
    if let Ok(mut runs) = shared.runs.lock() {
        runs.remove(&pgid);
    }
    let status = status.map_err(|e| format!("waiting for `summon run`: {e}"))?;
    let stdout = reader.join().unwrap_or_default();
    let Ok(result) = serde_json::from_str::<Value>(&stdout) else {
        let mut text = format!("run_pipeline: `summon run {path}` failed ({status})");
        for line in errors.iter().rev().take(20).rev() {
            text.push('\n');
            text.push_str(line);
        }
        return Err(text);
    };
    Ok(render(shared, &result, out.as_deref(), &errors))
}

/// The run's final text, its counts and tokens, its failures and its reports.
fn render(shared: &Shared, result: &Value, out: Option<&str>, errors: &[String]) -> Reply {
    let run_id = result["run_id"].as_str().unwrap_or("");
    let status = result["status"].as_str().unwrap_or("unknown");
    let mut text = format!("Pipeline run {run_id}: {status}\n");
    let mut report = Value::Null;
    if let Some(out) = out {
        let dir = shared.env.cwd.join(out);
        report = std::fs::read_to_string(dir.join("report.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        for file in ["report.json", "report.html", "results.jsonl"] {
            if dir.join(file).exists() {
                text.push_str(&format!("Report: {}\n", dir.join(file).display()));
            }
        }
    } else {
        text.push_str(
            "Reports: none written (give `out` for report.json, report.html and results.jsonl)\n",
        );
    }
    let total = &report["total"];
    if let Some(tasks) = total["tasks"].as_u64() {
        text.push_str(&format!(
            "Tasks: {tasks}, {} completed, {} failed\n",
            total["completed"].as_u64().unwrap_or(0),
            total["failed"].as_u64().unwrap_or(0)
        ));
    }
    text.push_str(&format!(
        "Tokens: {} in, {} out\n",
        result["input_tokens"]
            .as_u64()
            .or(total["input_tokens"].as_u64())
            .unwrap_or(0),
        result["output_tokens"]
            .as_u64()
            .or(total["output_tokens"].as_u64())
            .unwrap_or(0),
    ));
    match total["cost_usd"].as_f64() {
        Some(cost) => text.push_str(&format!("Cost: ${cost:.4}\n")),
        None => text.push_str("Cost: unknown (no price configured, or no report)\n"),
    }
    let mut failed = false;
    for step in result["steps"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        if step["status"] == "failed" {
            failed = true;
            text.push_str(&format!(
                "Step `{}` failed: {}\n",
                step["id"].as_str().unwrap_or("?"),
                step["error"].as_str().unwrap_or("")
            ));
        }
    }
    if status == "interrupted" {
        failed = true;
        if let Some(last) = errors.last() {
            text.push_str(last);
            text.push('\n');
        }
    }
    if let Some(output) = result["output"].as_str().filter(|o| !o.is_empty()) {
        text.push('\n');
        text.push_str(&sized(
            shared,
            &format!("run-{run_id}"),
            output.trim_end(),
            40_000,
        ));
        text.push('\n');
    }
    Reply {
        text,
        error: failed,
        task: None,
    }
}
