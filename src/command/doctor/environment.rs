//! The variables of subagents and background tasks that goose users know under goose's
//! names (`GOOSE_SUBAGENT_MAX_TURNS`, ...): for each one set, which name is used. The
//! `SUMMON_*` name is read first, then goose's ([`crate::env::GOOSE_NAMES`]). And the user's
//! credentials file: which variables it gives, or why it is not read.

use super::check::{Check, Section};
use crate::env::{Env, GOOSE_NAMES};

pub(super) fn check(env: &Env, checks: &mut Vec<Check>) {
    credentials(env, checks);
    for (summon, goose) in GOOSE_NAMES {
        match (env.var(summon), env.var(goose)) {
            (None, None) => {}
            (Some(value), Some(same)) if value == same => {
                checks.push(Check::ok(
                    Section::Environment,
                    format!("{summon}={value} (and {goose}, the same)"),
                ));
            }
            (Some(value), None) => {
                checks.push(Check::ok(Section::Environment, format!("{summon}={value}")));
            }
            (None, Some(value)) => checks.push(Check::ok(
                Section::Environment,
                format!("{goose}={value} is used ({summon} is not set)"),
            )),
            (Some(value), Some(ignored)) => checks.push(
                Check::warning(
                    Section::Environment,
                    format!("{summon}={value} is used; {goose}={ignored} is ignored"),
                )
                .fix(format!(
                    "{summon} comes first; unset one of them so the environment says one thing"
                )),
            ),
        }
    }
}

/// The credentials file ([`crate::env::Credentials`]): the names it gives (never a value),
/// or an error with the fix when it is there but not read.
fn credentials(env: &Env, checks: &mut Vec<Check>) {
    let Some(file) = &env.credentials else {
        return;
    };
    if let Some(problem) = &file.problem {
        let fix = if problem.contains("chmod") {
            format!("chmod 600 {}", file.path.display())
        } else {
            format!(
                "keep only `NAME=value` lines in {}, owned by you with mode 0600",
                file.path.display()
            )
        };
        checks.push(
            Check::error(Section::Environment, problem.clone())
                .fix(fix)
                .in_file(file.path.clone()),
        );
    }
    if !file.used.is_empty() {
        checks.push(Check::ok(
            Section::Environment,
            format!(
                "{} read from {} (the environment does not set {})",
                file.used.join(", "),
                file.path.display(),
                if file.used.len() == 1 { "it" } else { "them" }
            ),
        ));
    }
}
