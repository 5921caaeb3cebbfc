//! What the shell completion of summon offers beyond the clap definitions: the shells it
//! writes scripts for, and the names of the project's sources and background tasks, read from
//! the project the shell is in. Below the command line (`cli`), which names these completers, and
//! used by `summon completions`.

use std::path::Path;

use clap_complete::CompletionCandidate;
use clap_complete::env::{Bash, Elvish, EnvCompleter, Fish, Powershell, Zsh};

use crate::env::Env;
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
    pub(crate) fn completer(self) -> &'static dyn EnvCompleter {
        match self {
            Self::Bash => &Bash,
            Self::Zsh => &Zsh,
            Self::Fish => &Fish,
            Self::Elvish => &Elvish,
            Self::Powershell => &Powershell,
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Self> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
