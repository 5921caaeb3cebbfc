//! The Markdown summary of a run for a CI job page: when `GITHUB_STEP_SUMMARY` names a file
//! (GitHub Actions sets it for every step), `summon run` appends the run's status, a table of
//! each step's counts and cost, and the failures, so a plain `run:` step shows them too.

use std::io::Write as _;
use std::path::Path;

use serde_json::Value;

use super::fmt_cost;
use crate::event::{RunSummary, StepStatus};

/// The variable that names the job summary file.
pub(crate) const STEP_SUMMARY_VAR: &str = "GITHUB_STEP_SUMMARY";

/// Appends the summary of `summary` (what `command`, `run` or `merge`, did with the pipeline
/// `name`) to `path`. GitHub concatenates what every step appends, so the file is never
/// truncated.
pub(crate) fn append_step_summary(
    path: &Path,
    command: &str,
    name: &str,
    summary: &RunSummary,
) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(markdown(command, name, summary).as_bytes())
}

/// The run's status in the words of `summon runs` and report.html: `completed`, `failed`
/// or `interrupted`.
fn status(summary: &RunSummary) -> &'static str {
    if summary.interrupted {
        "interrupted"
    } else if summary
        .steps
        .iter()
        .all(|(_, s, _)| matches!(s, StepStatus::Succeeded | StepStatus::Deferred))
    {
        "completed"
    } else {
        "failed"
    }
}

fn step_status(status: StepStatus) -> &'static str {
    match status {
        StepStatus::Succeeded => "succeeded",
        StepStatus::Failed => "failed",
        StepStatus::Skipped => "skipped",
        StepStatus::Deferred => "deferred",
    }
}

/// A table cell: one line, `|` escaped, at most 300 characters.
fn cell(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out: String = line.chars().take(300).collect();
    if line.chars().count() > 300 {
        out.push('…');
    }
    out.replace('|', "\\|")
}

/// Text from outside summon (a failure's message quotes a provider or a model) as a code span:
/// one line of at most 300 characters, shown literally — no image, link, HTML or emphasis.
fn literal(text: &str) -> String {
    let line = crate::text::printable(text)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let mut out: String = line.chars().take(300).collect();
    if line.chars().count() > 300 {
        out.push('…');
    }
    // A fence longer than any run of backticks inside; spaces keep one at either end apart.
    let longest = out.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    format!("{fence} {out} {fence}")
}

fn count(stats: &Value, key: &str) -> u64 {
    stats[key].as_u64().unwrap_or(0)
}

fn cost(stats: &Value) -> String {
    let tasks = count(stats, "tasks");
    let unpriced = count(stats, "unpriced_tasks");
    match stats["cost_usd"].as_f64() {
        Some(usd) => super::report::cost_text(usd, tasks.saturating_sub(unpriced).max(1), unpriced)
            .unwrap_or_else(|| fmt_cost(usd)),
        None if unpriced > 0 => crate::config::NO_PRICE.to_owned(),
        None => "–".to_owned(),
    }
}

fn markdown(command: &str, name: &str, summary: &RunSummary) -> String {
    let mut text = format!(
        "### summon {command} `{}`: {}\n\n{} (run `{}`)\n\n",
        cell(name),
        status(summary),
        cell(&summary.summary_line),
        summary.run_id
    );
    text.push_str(
        "| step | status | tasks | completed | failed | skipped | resumed | tokens | cost |\n",
    );
    text.push_str("|---|---|--:|--:|--:|--:|--:|--:|--:|\n");
    for (id, status, _) in &summary.steps {
        let stats = &summary.report["steps"][id];
        let tokens = count(stats, "input_tokens") + count(stats, "output_tokens");
        text.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            cell(id),
            step_status(*status),
            count(stats, "tasks"),
            count(stats, "completed"),
            count(stats, "failed"),
            count(stats, "skipped"),
            count(stats, "resumed"),
            super::fmt_tokens(tokens),
            cost(stats),
        ));
    }
    let failures: Vec<_> = summary
        .steps
        .iter()
        .filter(|(_, status, _)| *status == StepStatus::Failed)
        .collect();
    if !failures.is_empty() {
        text.push_str("\n**Failures**\n\n");
        for (id, _, error) in failures {
            text.push_str(&format!(
                "- step `{}`: {}\n",
                cell(id),
                literal(error.as_deref().unwrap_or("failed"))
            ));
        }
    }
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_failed_run_lists_its_steps_and_failures() {
        let summary = RunSummary {
            run_id: "r1".into(),
            steps: vec![
                (
                    "work".into(),
                    StepStatus::Failed,
                    Some("2 of 3 tasks | failed\nbadly".into()),
                ),
                ("sum".into(), StepStatus::Skipped, None),
            ],
            final_output: None,
            interrupted: false,
            budget: None,
            provider: None,
            report: json!({"steps": {"work": {"tasks": 3, "completed": 1, "failed": 2,
                "input_tokens": 1000, "output_tokens": 200, "cost_usd": 0.5, "priced": true}}}),
            summary_line: "3 tasks: 1 completed, 2 failed".into(),
        };
        let text = markdown("run", "p", &summary);
        assert!(text.starts_with("### summon run `p`: failed\n"), "{text}");
        assert!(
            text.contains("| work | failed | 3 | 1 | 2 | 0 | 0 | 1.2k | $0.50 |"),
            "{text}"
        );
        assert!(
            text.contains("| sum | skipped | 0 | 0 | 0 | 0 | 0 | 0 | – |"),
            "{text}"
        );
        assert!(
            text.contains("- step `work`: ` 2 of 3 tasks | failed badly `\n"),
            "{text}"
        );
    }

    #[test]
    fn a_failure_quoting_markdown_and_html_is_shown_as_text() {
        let hostile = "![x](https://evil.example/pixel.png) <img src=x onerror=alert(1)> \
                       [click](https://evil.example) **bold** ``tick`` \u{1b}]0;t\u{7}";
        let summary = RunSummary {
            run_id: "r1".into(),
            steps: vec![("work".into(), StepStatus::Failed, Some(hostile.into()))],
            final_output: None,
            interrupted: false,
            budget: None,
            provider: None,
            report: json!({"steps": {}}),
            summary_line: "1 task: 1 failed".into(),
        };
        let text = markdown("run", "p", &summary);
        let line = text.lines().find(|l| l.starts_with("- step")).unwrap();
        assert_eq!(
            line,
            "- step `work`: ``` ![x](https://evil.example/pixel.png) <img src=x onerror=alert(1)> \
             [click](https://evil.example) **bold** ``tick`` ```"
        );
    }
}
