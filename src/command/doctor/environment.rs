//! The variables of subagents and background tasks that goose users know under goose's
//! names (`GOOSE_SUBAGENT_MAX_TURNS`, ...): for each one set, which name is used. The
//! `SUMMON_*` name is read first, then goose's ([`crate::env::GOOSE_NAMES`]).

use super::check::{Check, Section};
use crate::env::{Env, GOOSE_NAMES};

pub(super) fn check(env: &Env, checks: &mut Vec<Check>) {
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
