//! The config files summon looks for, and every problem in them at `file:line:col`.

use super::check::{Check, Section};
use crate::config::file::Loaded;
use crate::env::Env;

pub(super) fn check(loaded: &Loaded, env: &Env, checks: &mut Vec<Check>) {
    for file in &loaded.config.files {
        let problems = loaded
            .diagnostics
            .items
            .iter()
            .filter(|d| d.file_path() == Some(file.path.as_path()))
            .count();
        let check = if !file.found {
            Check::ok(Section::Config, "not found (optional)")
        } else if problems == 0 {
            Check::ok(Section::Config, "read, no problems")
        } else {
            let n = if problems == 1 {
                "1 problem".to_owned()
            } else {
                format!("{problems} problems")
            };
            Check::ok(Section::Config, format!("read, {n} (below)"))
        };
        checks.push(check.in_file(&file.path));
    }
    trust(loaded, env, checks);
    for diagnostic in &loaded.diagnostics.items {
        checks.push(Check::from_diagnostic(
            Section::Config,
            diagnostic,
            "edit the file at that line; docs/providers.md documents the format",
        ));
    }
}

/// Whether the project is trusted, and what its files would do with trust.
fn trust(loaded: &Loaded, env: &Env, checks: &mut Vec<Check>) {
    let trust = &loaded.config.trust;
    let enables = crate::command::trust::enabled_by_trust(env);
    let check = match (trust.is_trusted(), enables.is_empty()) {
        (_, true) => Check::ok(
            Section::Config,
            format!(
                "project {}; its summon.yaml and .mcp.json send no credential and start nothing",
                trust.describe()
            ),
        ),
        (true, false) => Check::ok(
            Section::Config,
            format!("project {}: {}", trust.describe(), enables.join("; ")),
        ),
        (false, false) => Check::warning(
            Section::Config,
            format!(
                "project {}; trusting it would allow: {}",
                trust.describe(),
                enables.join("; ")
            ),
        )
        .fix(
            "read those files, then run `summon trust` (in CI: --trust or SUMMON_TRUST_PROJECT=1)",
        ),
    };
    checks.push(check);
}
