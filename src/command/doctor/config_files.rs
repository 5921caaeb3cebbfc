//! The config files summon looks for, and every problem in them at `file:line:col`.

use super::check::{Check, Section};
use crate::config::file::Loaded;

pub(super) fn check(loaded: &Loaded, checks: &mut Vec<Check>) {
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
    for diagnostic in &loaded.diagnostics.items {
        checks.push(Check::from_diagnostic(
            Section::Config,
            diagnostic,
            "edit the file at that line; the README's \"Providers and models\" documents the format",
        ));
    }
}
