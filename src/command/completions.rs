//! `summon completions SHELL` and `summon man`, both generated from the clap definitions in
//! [`crate::cli`], and the completion requests the shell scripts make.
//!
//! The completion script is short: on each TAB the shell runs summon again with
//! [`COMPLETE_VAR`] set to the shell's name and the words typed so far after `--`
//! (`_SUMMON_COMPLETE=bash summon -- summon load re`). [`complete_request`] answers that
//! before the command line is parsed, from the same clap definitions, so commands, flags and
//! their values are always those of the binary that answers. Source names (after
//! `--source`, and `summon load`) and background task ids (`summon load`) come from
//! [`crate::candidates::source_names`] and
//! [`crate::candidates::source_names_and_task_ids`], which read the project the shell is
//! in. Nothing is printed to stderr while completing, and a completion never fails loudly.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::CommandFactory;

use super::Ctx;
use crate::candidates::{COMPLETE_VAR, Shell};
use crate::cli::{Cli, CompletionsArgs, ManArgs};
use crate::env::Env;
use crate::error::{Error, Result};
use crate::output::write_atomically;

/// `summon completions SHELL`: the registration script on stdout.
pub(crate) fn run_completions(args: &CompletionsArgs, ctx: &mut Ctx) -> Result<()> {
    let mut script = Vec::new();
    args.shell.completer().write_registration(
        COMPLETE_VAR,
        "summon",
        "summon",
        &completer_path(ctx),
        &mut script,
    )?;
    ctx.out.write(&String::from_utf8_lossy(&script))?;
    Ok(())
}

/// The program the script runs to complete: `summon` from `PATH` when summon was started
/// that way (so the script survives reinstalls), else the absolute path it was started by.
fn completer_path(ctx: &Ctx) -> String {
    let argv0 = std::env::args_os().next().map(PathBuf::from);
    match argv0 {
        Some(path) if path.components().count() > 1 => {
            ctx.env.cwd.join(path).to_string_lossy().into_owned()
        }
        _ => "summon".to_owned(),
    }
}

/// Answers a completion request when [`COMPLETE_VAR`] is set; returns the exit code, or
/// `None` for an ordinary run. `args` is the whole command line, program name first.
pub(crate) fn complete_request(args: &[OsString], env: &Env) -> Option<i32> {
    let name = env.var(COMPLETE_VAR)?;
    if name == "0" {
        return None;
    }
    let Some(shell) = Shell::from_name(name) else {
        let _ = writeln!(
            std::io::stderr(),
            "summon: error: {COMPLETE_VAR}: unknown shell `{name}`"
        );
        return Some(crate::error::exit::USAGE);
    };
    let words: Vec<OsString> = match args.iter().position(|a| a == "--") {
        Some(i) => args[i + 1..].to_vec(),
        None => Vec::new(),
    };
    let mut cmd = Cli::command();
    cmd.build();
    let mut buf = Vec::new();
    let result = if words.is_empty() {
        shell
            .completer()
            .write_registration(COMPLETE_VAR, "summon", "summon", "summon", &mut buf)
    } else {
        shell
            .completer()
            .write_complete(&mut cmd, words, Some(&env.cwd), &mut buf)
    };
    // A completion that cannot be computed offers nothing; the shell falls back to files.
    if result.is_err() {
        return Some(crate::error::exit::USAGE);
    }
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(&buf).and_then(|()| stdout.flush());
    Some(crate::error::exit::OK)
}

/// `summon man [--out DIR]`: `summon.1` on stdout, or every page written into DIR.
pub(crate) fn run_man(args: &ManArgs, ctx: &mut Ctx) -> Result<()> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let Some(dir) = &args.out else {
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut page)?;
        ctx.out.write(&String::from_utf8_lossy(&page))?;
        return Ok(());
    };
    let dir = ctx.env.cwd.join(dir);
    let mut written = Vec::new();
    write_pages(&cmd, &dir, &mut written).map_err(|e| {
        Error::usage(format!(
            "cannot write the man pages into {}: {e}",
            dir.display()
        ))
    })?;
    let cwd = ctx.env.cwd.clone();
    let mut text = String::new();
    for path in &written {
        text.push_str(&crate::diag::render::display_path(path, &cwd));
        text.push('\n');
    }
    ctx.out.write(&text)?;
    Ok(())
}

/// The page of `cmd` and of each visible subcommand, depth first.
fn write_pages(cmd: &clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(cmd.clone());
    let mut page = Vec::new();
    man.render(&mut page)?;
    let path = dir.join(man.get_filename());
    write_atomically(&path, &page)?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir, written)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/cli.md: every visible command's `--help`, depth first, for readers on the web.
    fn cli_reference() -> String {
        fn add(cmd: &mut clap::Command, path: &str, out: &mut String) {
            let help = cmd.render_long_help().to_string();
            let help: Vec<&str> = help.trim_end().lines().map(str::trim_end).collect();
            out.push_str(&format!(
                "## `{path}`\n\n```text\n{}\n```\n\n",
                help.join("\n")
            ));
            let names: Vec<String> = cmd
                .get_subcommands()
                .filter(|c| !c.is_hide_set())
                .map(|c| c.get_name().to_owned())
                .collect();
            for name in names {
                if let Some(sub) = cmd.find_subcommand_mut(&name) {
                    add(sub, &format!("{path} {name}"), out);
                }
            }
        }
        let mut cmd = Cli::command().disable_help_subcommand(true).term_width(100);
        cmd.build();
        let mut out = String::from(
            "# Command-line reference\n\nEvery command's `--help`, generated from the program itself \
         (`SUMMON_WRITE_DOCS=1 cargo test --lib cli_reference` writes this file again; a test \
         keeps it current). What the commands are for: [commands.md](commands.md).\n\n",
        );
        add(&mut cmd, "summon", &mut out);
        out.truncate(out.trim_end().len());
        out.push('\n');
        out
    }

    #[test]
    fn cli_reference_is_current() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cli.md");
        let wanted = cli_reference();
        if std::env::var_os("SUMMON_WRITE_DOCS").is_some() {
            std::fs::write(&path, &wanted).unwrap();
        }
        let found = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            found == wanted,
            "docs/cli.md is not the commands' --help: run SUMMON_WRITE_DOCS=1 cargo test --lib cli_reference"
        );
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
