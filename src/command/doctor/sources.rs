//! The sources found: how many, which files are left out, and every name shadowed by another.

use super::check::{Check, Section};
use crate::diag::render::display_path;
use crate::source::{Catalog, SourceKind};

pub(super) fn check(catalog: &Catalog, cwd: &std::path::Path, checks: &mut Vec<Check>) {
    let count = |kind: SourceKind| catalog.sources.iter().filter(|s| s.kind == kind).count();
    let total = catalog.sources.len();
    if total == 0 {
        checks.push(
            Check::ok(Section::Sources, "no recipes or agents found")
                .fix("`summon new recipe NAME` or `summon new agent NAME` writes one"),
        );
    } else {
        let parts: Vec<String> = [
            (SourceKind::Recipe, "recipe"),
            (SourceKind::Agent, "agent"),
            (SourceKind::Subrecipe, "subrecipe"),
        ]
        .into_iter()
        .filter(|(kind, _)| count(*kind) > 0)
        .map(|(kind, what)| match count(kind) {
            1 => format!("1 {what}"),
            n => format!("{n} {what}s"),
        })
        .collect();
        checks.push(Check::ok(
            Section::Sources,
            format!("{total} found: {}", parts.join(", ")),
        ));
    }
    let mut files: Vec<&std::path::Path> = catalog
        .diagnostics
        .items
        .iter()
        .filter(|d| d.is_error())
        .filter_map(|d| d.file_path())
        .collect();
    files.dedup();
    for path in files {
        let first = catalog
            .diagnostics
            .items
            .iter()
            .find(|d| d.is_error() && d.file_path() == Some(path));
        if let Some(first) = first {
            let mut check = Check::from_diagnostic(Section::Sources, first, "");
            check.status = super::check::Status::Warning;
            check.message = format!("left out: {}", first.message);
            check.fix = Some(format!(
                "`summon validate {}` shows every problem of the file",
                display_path(path, cwd)
            ));
            checks.push(check);
        }
    }
    for shadowed in &catalog.shadowed {
        checks.push(
            Check::warning(
                Section::Sources,
                format!(
                    "{} `{}` is shadowed by {}, which is found first",
                    shadowed.kind.name(),
                    shadowed.name,
                    display_path(&shadowed.winner, cwd)
                ),
            )
            .in_file(&shadowed.path)
            .fix("rename one of the two, or delete the one you do not use"),
        );
    }
}
