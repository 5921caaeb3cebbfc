//! `summon doctor`: is summon set up to work here? Each finding is ok, a warning or an error,
//! with the fix; exit 1 when any is an error.
//!
//! The sections, each in its own file: [`provider`] (the provider and model a delegation
//! would use, where each setting came from, whether the provider answers: one `GET` of its
//! models list with a short timeout; the API key is never shown), [`environment`] (which of
//! the `SUMMON_*` variables and goose's names for them is used), [`config_files`] (the
//! config files looked for and their problems at `file:line:col`), [`sources`] (how many,
//! broken files, every source shadowed by another) and [`store`] (the `.summon/` schema
//! version, tasks whose worker is gone), and [`sandbox`] (whether the model's shell commands
//! will be sandboxed: the Landlock ABI, the default policy and what each policy gives).
//! [`prices`] says the model's price and where it comes from; `--prices` prints the whole
//! price table instead (`--json`: `{"date", "unit", "sources", "notes", "models": {MODEL:
//! {"standard"|"flex"|"priority"|"batch": {"input", "cached_input", "cache_write", "output"},
//! "from": "built-in"|"config"}}}`).
//!
//! JSON (`--json`): `{"ok": BOOL, "errors": N, "warnings": N, "provider": PROVIDER|null,
//! "model": {"name", "from", "alias"}|null, "config_files": [{"path", "scope":
//! "global"|"project", "found"}], "checks": [CHECK]}` where CHECK is `{"section":
//! "provider"|"environment"|"config"|"sources"|"store"|"sandbox", "status": "ok"|"warning"|"error", "message", "fix",
//! "path", "line", "column"}` (`fix`, `path`, `line`, `column` may be null) and PROVIDER is
//! `{"name", "kind": "openai"|"anthropic", "from", "base_url", "base_url_from",
//! "defined_by", "key_env", "key_set", "answers": BOOL|null, "models": N|null}`
//! (`answers` is null with `--offline`); `"sandbox": {"sandboxed": BOOL, "landlock_abi":
//! N|null, "landlock_tcp": BOOL, "default": {"policy", "network"}}`.

mod check;
mod config_files;
mod environment;
mod prices;
mod provider;
mod sandbox;
mod sources;
mod store;

use serde_json::json;

use super::Ctx;
use crate::cli::DoctorArgs;
use crate::diag::Diagnostics;
use crate::error::{Error, Result};
use check::{Check, Section, Status};

pub(crate) fn run(args: &DoctorArgs, ctx: &mut Ctx) -> Result<()> {
    let loaded = crate::config::file::load(&ctx.env);
    if args.prices {
        if args.output.json {
            ctx.out.json(&prices::table_json(&loaded.config))?;
        } else {
            ctx.out.write(&prices::table_text(&loaded.config))?;
        }
        return Ok(());
    }
    let mut checks = Vec::new();
    let report = provider::check(args, &ctx.env, &loaded.config, &mut checks);
    if let Some(model) = report.model.as_ref().and_then(|m| m["name"].as_str()) {
        prices::check(&loaded.config, model, &mut checks);
    }
    environment::check(&ctx.env, &mut checks);
    config_files::check(&loaded, &ctx.env, &mut checks);
    sources::check(&ctx.catalog(), &ctx.env.cwd, &mut checks);
    store::check(&ctx.env, &mut checks);
    let sandbox = sandbox::check(&loaded.config, &mut checks);
    let errors = checks.iter().filter(|c| c.status == Status::Error).count();
    let warnings = checks
        .iter()
        .filter(|c| c.status == Status::Warning)
        .count();
    if args.output.json {
        let files: Vec<_> = loaded
            .config
            .files
            .iter()
            .map(|f| {
                json!({
                    "path": f.path.display().to_string(),
                    "scope": match f.scope {
                        crate::config::file::Scope::Global => "global",
                        crate::config::file::Scope::Project => "project",
                    },
                    "found": f.found,
                })
            })
            .collect();
        ctx.out.json(&json!({
            "ok": errors == 0,
            "errors": errors,
            "warnings": warnings,
            "provider": report.provider,
            "model": report.model,
            "config_files": files,
            "sandbox": sandbox,
            "checks": checks.iter().map(|c| c.to_json()).collect::<Vec<_>>(),
        }))?;
    } else {
        let mut text = String::new();
        for section in Section::ALL {
            let in_section: Vec<&Check> = checks.iter().filter(|c| c.section == section).collect();
            if in_section.is_empty() {
                continue;
            }
            text.push_str(&ctx.out_palette.bold(section.title()));
            text.push('\n');
            for check in in_section {
                text.push_str(&check.render(&ctx.env.cwd, ctx.out_palette));
            }
        }
        text.push_str(&format!(
            "\nsummon doctor: {}, {}\n",
            crate::plural::count(errors as u64, "error"),
            crate::plural::count(warnings as u64, "warning")
        ));
        ctx.out.write(&text)?;
    }
    if errors > 0 {
        // Already shown: exit 1 without printing anything more.
        return Err(Error::Input(Diagnostics::default()));
    }
    Ok(())
}
