//! `summon completions SHELL` and `summon man`, both generated from the clap definitions in
//! [`crate::cli`], and the completion requests the shell scripts make.
//!
//! The completion script is short: on each TAB the shell runs summon again with
//! [`COMPLETE_VAR`] set to the shell's name and the words typed so far after `--`
//! (`_SUMMON_COMPLETE=bash summon -- summon load re`). [`complete_request`] answers that
//! before the command line is parsed, from the same clap definitions, so commands, flags and
//! their values are always those of the binary that answers. Source names (after
//! `--source`, and `summon load`) and background task ids (`summon load`) come from
//! [`source_names`] and [`source_names_and_task_ids`], which read the project the shell is
//! in. Nothing is printed to stderr while completing, and a completion never fails loudly.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use clap_complete::CompletionCandidate;
use clap_complete::env::{Bash, Elvish, EnvCompleter, Fish, Powershell, Zsh};

use super::Ctx;
use crate::cli::{Cli, CompletionsArgs, ManArgs};
use crate::env::Env;
use crate::error::{Error, Result};
use crate::output::write_atomically;
use crate::source::{SourceKind, discover, search_dirs};
use crate::store::{DB_FILE, DIR_NAME, Store, TaskFilter};

/// The variable that turns a run of summon into a completion request.
pub(crate) const COMPLETE_VAR: &str = "_SUMMON_COMPLETE";

/// Longest description shown next to a completion candidate, in characters.
const HELP_CHARS: usize = 60;

/// The shells `summon completions` writes scripts for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Shell {
    Bash,
    Zsh,
    Fish,
    Elvish,
    Powershell,
}

impl Shell {
    fn completer(self) -> &'static dyn EnvCompleter {
        match self {
            Self::Bash => &Bash,
            Self::Zsh => &Zsh,
            Self::Fish => &Fish,
            Self::Elvish => &Elvish,
            Self::Powershell => &Powershell,
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        // `$SHELL` may be given as a path.
        let name = Path::new(name).file_stem()?.to_str()?;
        [
            Self::Bash,
            Self::Zsh,
            Self::Fish,
            Self::Elvish,
            Self::Powershell,
        ]
        .into_iter()
        .find(|shell| shell.completer().is(name))
    }
}

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

/// Every source name, with its kind and description as help.
pub(crate) fn source_names() -> Vec<CompletionCandidate> {
    let Ok(env) = Env::from_process() else {
        return Vec::new();
    };
    let bash = env.var(COMPLETE_VAR) == Some("bash");
    let catalog = discover(search_dirs(&env));
    catalog
        .sources
        .iter()
        .filter_map(|source| {
            // A name comes from a file anyone can commit: bash puts it into the command line
            // as it is, so it goes there escaped (zsh and fish quote what they insert), and
            // one with a control character is offered to no shell.
            let value = if bash {
                bash_word(&source.name)?
            } else if source.name.chars().any(char::is_control) {
                return None;
            } else {
                source.name.clone()
            };
            let kind = match source.kind {
                SourceKind::Recipe => "recipe",
                SourceKind::Agent => "agent",
                SourceKind::Subrecipe => "subrecipe",
            };
            let help = format!("{kind}: {}", short(&source.description));
            Some(CompletionCandidate::new(value).help(Some(help.trim_end().to_owned().into())))
        })
        .collect()
}

/// `text` as one word of a bash command line, each character the shell would read as syntax
/// (`$`, `;`, quotes, backquotes, spaces, ...) escaped with a backslash, so a plain prefix
/// still matches; `None` for text with a control character, which no escape makes safe to
/// insert.
fn bash_word(text: &str) -> Option<String> {
    if text.chars().any(char::is_control) {
        return None;
    }
    let mut word = String::with_capacity(text.len());
    for c in text.chars() {
        if !(c.is_alphanumeric() || "-_./:@%+=,".contains(c)) {
            word.push('\\');
        }
        word.push(c);
    }
    Some(word)
}

/// [`source_names`], then the ids of background tasks that are running or can be collected.
pub(crate) fn source_names_and_task_ids() -> Vec<CompletionCandidate> {
    let mut candidates = source_names();
    if let Ok(env) = Env::from_process() {
        candidates.extend(task_ids(&env.cwd));
    }
    candidates
}

/// Task ids from the project's store; nothing (and no store created) when there is none.
fn task_ids(project: &Path) -> Vec<CompletionCandidate> {
    let Some(found) = crate::store::find_project(project) else {
        return Vec::new();
    };
    if !found.join(DIR_NAME).join(DB_FILE).is_file() {
        return Vec::new();
    }
    let Ok(store) = Store::open(&found) else {
        return Vec::new();
    };
    let Ok(tasks) = store.list(TaskFilter::All) else {
        return Vec::new();
    };
    tasks
        .iter()
        .map(|task| {
            let help = format!("task, {}: {}", task.status, short(&task.description));
            CompletionCandidate::new(task.id.to_string())
                .help(Some(help.trim_end().to_owned().into()))
        })
        .collect()
}

/// The first line of `text`, cut to [`HELP_CHARS`].
fn short(text: &str) -> String {
    let line = text.lines().next().unwrap_or("").trim();
    if line.chars().count() <= HELP_CHARS {
        line.to_owned()
    } else {
        let cut: String = line.chars().take(HELP_CHARS - 1).collect();
        format!("{cut}…")
    }
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
    fn shells_by_name_and_path() {
        assert_eq!(Shell::from_name("bash"), Some(Shell::Bash));
        assert_eq!(Shell::from_name("/usr/bin/zsh"), Some(Shell::Zsh));
        assert_eq!(Shell::from_name("fish"), Some(Shell::Fish));
        assert_eq!(Shell::from_name("tcsh"), None);
    }

    #[test]
    fn bash_words_escape_syntax() {
        assert_eq!(bash_word("release-notes").as_deref(), Some("release-notes"));
        assert_eq!(bash_word("résumé_v1.2").as_deref(), Some("résumé_v1.2"));
        assert_eq!(
            bash_word("a$(b);c `d` 'e'").as_deref(),
            Some(r"a\$\(b\)\;c\ \`d\`\ \'e\'")
        );
        assert_eq!(bash_word("a\nb"), None);
        assert_eq!(bash_word("a\u{b}b"), None);
    }

    #[test]
    fn help_is_one_short_line() {
        assert_eq!(short("first\nsecond"), "first");
        let long = "x".repeat(100);
        assert_eq!(short(&long).chars().count(), HELP_CHARS);
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
