//! The catalog: every source by name, frozen once read. Earlier directories win a name
//! clash; the losers are kept as [`Shadowed`] so `summon validate` can report them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::search_path::{DirKind, Scope, SearchDir};
use crate::agent::AgentDef;
use crate::diag::suggestions;
use crate::diag::{Diagnostic, Diagnostics, SourceFile};
use crate::recipe::{Recipe, Strictness, SubRecipe, parse_recipe};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum SourceKind {
    Recipe,
    Agent,
    Subrecipe,
}

impl SourceKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Recipe => "recipe",
            Self::Agent => "agent",
            Self::Subrecipe => "subrecipe",
        }
    }
}

/// What a source is made of.
#[derive(Debug, Clone)]
pub(crate) enum SourceDef {
    Recipe(Arc<Recipe>),
    Agent(Arc<AgentDef>),
    /// A parent recipe's `sub_recipes` entry and the recipe file it points at.
    Subrecipe {
        parent: Arc<Recipe>,
        entry: SubRecipe,
        recipe: Arc<Recipe>,
    },
}

/// A named source.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    pub(crate) name: String,
    pub(crate) kind: SourceKind,
    pub(crate) description: String,
    pub(crate) path: PathBuf,
    pub(crate) scope: Scope,
    pub(crate) def: SourceDef,
}

impl Source {
    /// Parameter values fixed by the source: a subrecipe's `values` that are plain text (those
    /// that are templates need the parent recipe's parameters).
    pub(crate) fn preset_values(&self) -> indexmap::IndexMap<String, String> {
        match &self.def {
            SourceDef::Subrecipe { entry, .. } => entry
                .values
                .iter()
                .filter(|(_, v)| !crate::template::has_template(v))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            _ => indexmap::IndexMap::new(),
        }
    }

    /// The recipe behind a recipe or subrecipe source.
    pub(crate) fn recipe(&self) -> Option<&Arc<Recipe>> {
        match &self.def {
            SourceDef::Recipe(recipe) | SourceDef::Subrecipe { recipe, .. } => Some(recipe),
            SourceDef::Agent(_) => None,
        }
    }
}

/// A source hidden by an earlier one of the same name.
#[derive(Debug, Clone)]
pub(crate) struct Shadowed {
    pub(crate) name: String,
    pub(crate) kind: SourceKind,
    pub(crate) path: PathBuf,
    pub(crate) winner: PathBuf,
}

#[derive(Debug)]
pub(crate) struct Catalog {
    pub(crate) sources: Vec<Source>,
    pub(crate) shadowed: Vec<Shadowed>,
    pub(crate) diagnostics: Diagnostics,
    pub(crate) searched: Vec<SearchDir>,
}

impl Catalog {
    pub(crate) fn new(searched: Vec<SearchDir>) -> Self {
        Self {
            sources: Vec::new(),
            shadowed: Vec::new(),
            diagnostics: Diagnostics::default(),
            searched,
        }
    }

    /// Adds a source unless an earlier one has its name.
    pub(crate) fn add(&mut self, source: Source) {
        match self.sources.iter().find(|s| s.name == source.name) {
            Some(winner) => {
                if winner.path != source.path {
                    self.shadowed.push(Shadowed {
                        name: source.name,
                        kind: source.kind,
                        path: source.path,
                        winner: winner.path.clone(),
                    });
                }
            }
            None => self.sources.push(source),
        }
    }

    /// Every recipe's `sub_recipes` entries become subrecipe sources (after all files, so
    /// a recipe file of the same name wins).
    pub(crate) fn add_sub_recipes(&mut self, diags: &mut Diagnostics) {
        let parents: Vec<Arc<Recipe>> = self
            .sources
            .iter()
            .filter_map(|s| match &s.def {
                SourceDef::Recipe(r) if !r.sub_recipes.is_empty() => Some(Arc::clone(r)),
                _ => None,
            })
            .collect();
        for parent in parents {
            for entry in &parent.sub_recipes {
                if self
                    .sources
                    .iter()
                    .any(|s| s.name == entry.name && s.path == entry.path)
                {
                    continue;
                }
                let Some(recipe) = load_sub_recipe(&entry.path, diags) else {
                    continue;
                };
                let description = entry
                    .description
                    .clone()
                    .unwrap_or_else(|| recipe.description.clone());
                self.add(Source {
                    name: entry.name.clone(),
                    kind: SourceKind::Subrecipe,
                    description,
                    path: entry.path.clone(),
                    scope: Scope::Local,
                    def: SourceDef::Subrecipe {
                        parent: Arc::clone(&parent),
                        entry: entry.clone(),
                        recipe,
                    },
                });
            }
        }
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Source> {
        self.sources.iter().find(|s| s.name == name)
    }

    /// Close names for a name that was not found.
    pub(crate) fn suggest(&self, name: &str) -> Vec<&str> {
        suggestions(name, self.sources.iter().map(|s| s.name.as_str()))
    }

    /// The "not found" error of SPEC §2; for a name whose file is there but could not be
    /// read as a source, that file and what to run, since the name is not misspelt, with the
    /// file's first error as the hint.
    pub(crate) fn not_found(&self, name: &str) -> Diagnostic {
        let Some(problem) = self.unusable(name) else {
            return self.not_found_message(name);
        };
        let found = Diagnostic::error(format!("Source '{name}' cannot be used: {problem}"));
        match self.left_out(name) {
            Some(error) => {
                let path = error
                    .file_path()
                    .map(|p| match self.working_dir() {
                        Some(cwd) => crate::diag::render::display_path(p, cwd),
                        None => p.display().to_string(),
                    })
                    .unwrap_or_default();
                let at = error
                    .span
                    .as_ref()
                    .map(|s| format!(":{}:{}", s.pos.line, s.pos.col))
                    .unwrap_or_default();
                found.with_hint(format!("{path}{at}: {}", error.message))
            }
            None => found,
        }
    }

    /// The first error of a source file named `name` that discovery left out.
    fn left_out(&self, name: &str) -> Option<&Diagnostic> {
        self.diagnostics.items.iter().find(|d| {
            d.is_error()
                && d.file_path()
                    .and_then(std::path::Path::file_stem)
                    .is_some_and(|stem| stem == name)
        })
    }

    fn not_found_message(&self, name: &str) -> Diagnostic {
        let close = self.suggest(name);
        let found = if close.is_empty() {
            Diagnostic::error(format!(
                "Source '{name}' not found. Use summon load to see available sources."
            ))
        } else {
            Diagnostic::error(format!(
                "Source '{name}' not found. Did you mean: {}?",
                close.join(", ")
            ))
        };
        // With nothing close, where it looked says more than the name.
        match self.looked_in() {
            Some(looked) if close.is_empty() => found.with_hint(looked),
            _ => found,
        }
    }

    /// Where discovery looked, for a name it did not find: the folders that exist, the
    /// working directory's relative to it.
    pub(crate) fn looked_in(&self) -> Option<String> {
        let cwd = self.working_dir()?;
        let shown: Vec<String> = self
            .searched
            .iter()
            .filter(|d| d.path.is_dir())
            .map(|d| match d.path.strip_prefix(cwd) {
                Ok(rel) if rel.as_os_str().is_empty() => format!("{}/", cwd.display()),
                Ok(rel) => format!("{}/", rel.display()),
                Err(_) => format!("{}/", d.path.display()),
            })
            .collect();
        let missing = self.searched.len() - shown.len();
        Some(format!(
            "looked in {}{}",
            shown.join(", "),
            if missing > 0 {
                format!(" ({missing} other search folders do not exist)")
            } else {
                String::new()
            }
        ))
    }

    /// Why a file meant to define `name` gave no source: "`recipes/x.yaml` has errors: run
    /// summon validate". A file is meant to define the name of its stem or, for an agent, the
    /// `name:` in its frontmatter; it gave no source when discovery reported problems in it
    /// and no source comes from it.
    pub(crate) fn unusable(&self, name: &str) -> Option<String> {
        let mut broken: Vec<(&Path, bool)> = Vec::new();
        for d in &self.diagnostics.items {
            let Some(path) = d.file_path() else {
                continue;
            };
            match broken.iter_mut().find(|(p, _)| *p == path) {
                Some((_, errors)) => *errors |= d.is_error(),
                None => broken.push((path, d.is_error())),
            }
        }
        let (path, errors) = broken.into_iter().find(|(path, _)| {
            !self.sources.iter().any(|s| s.path == *path)
                && !self.shadowed.iter().any(|s| s.path == *path)
                && meant_name(path, name)
        })?;
        let shown = match self.working_dir() {
            Some(cwd) => crate::diag::render::display_path(path, cwd),
            None => path.display().to_string(),
        };
        let what = if errors { "has errors" } else { "was skipped" };
        Some(format!("`{shown}` {what}: run summon validate"))
    }

    /// The working directory, when this catalog was discovered from it.
    fn working_dir(&self) -> Option<&Path> {
        self.searched
            .iter()
            .find(|d| d.kind == DirKind::WorkingDir)
            .map(|d| d.path.as_path())
    }

    /// Shadowing of the sources a command uses, as warnings: at run time the user sees that
    /// a name they know (their own recipe) stands for another file (a cloned repository's).
    /// `names`: `None` when any source may be used (a templated `source:`).
    pub(crate) fn shadow_warnings_for(
        &self,
        names: Option<&[&str]>,
        cwd: &std::path::Path,
    ) -> Vec<Diagnostic> {
        self.shadowed
            .iter()
            .filter(|s| names.is_none_or(|names| names.contains(&s.name.as_str())))
            .map(|s| {
                Diagnostic::warning(format!(
                    "{} `{}` is shadowed: this command uses `{}`, which is found first",
                    s.kind.name(),
                    s.name,
                    crate::diag::render::display_path(&s.winner, cwd)
                ))
                .in_file(&s.path)
            })
            .collect()
    }

    /// Shadowing as warnings, for `summon validate`.
    pub(crate) fn shadow_warnings(&self, cwd: &std::path::Path) -> Vec<Diagnostic> {
        self.shadowed
            .iter()
            .map(|s| {
                Diagnostic::warning(format!(
                    "{} `{}` is shadowed by `{}`, which is found first",
                    s.kind.name(),
                    s.name,
                    crate::diag::render::display_path(&s.winner, cwd)
                ))
                .in_file(&s.path)
            })
            .collect()
    }
}

/// Whether the file at `path` is meant to define `name`: its stem, or the `name:` line of an
/// agent file's frontmatter (read as text, since the frontmatter may be what is broken).
fn meant_name(path: &Path, name: &str) -> bool {
    if path
        .file_stem()
        .is_some_and(|stem| stem.to_string_lossy() == name)
    {
        return true;
    }
    if path.extension().is_none_or(|e| e != "md") {
        return false;
    }
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    let mut lines = text.lines();
    if lines.next().map(str::trim_end) != Some("---") {
        return false;
    }
    lines
        .take_while(|line| line.trim_end() != "---")
        .filter_map(|line| line.strip_prefix("name:"))
        .any(|value| value.trim().trim_matches(['"', '\'']) == name)
}

fn load_sub_recipe(path: &std::path::Path, diags: &mut Diagnostics) -> Option<Arc<Recipe>> {
    match super::read_source_text(path) {
        Ok(text) => {
            let file = SourceFile::new(path, text);
            parse_recipe(&file, Strictness::Strict, diags).map(Arc::new)
        }
        Err(message) => {
            diags.push(Diagnostic::warning(message).in_file(path));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_with_problems_and_no_source_is_named_by_its_stem() {
        let mut catalog = Catalog::new(Vec::new());
        catalog
            .diagnostics
            .push(Diagnostic::warning("unknown key").in_file("/p/recipes/a.yaml"));
        catalog
            .diagnostics
            .push(Diagnostic::error("missing `title`").in_file("/p/recipes/a.yaml"));
        catalog
            .diagnostics
            .push(Diagnostic::warning("skipped: broken symlink").in_file("/p/recipes/b.yaml"));
        assert_eq!(
            catalog.unusable("a").as_deref(),
            Some("`/p/recipes/a.yaml` has errors: run summon validate")
        );
        assert_eq!(
            catalog.unusable("b").as_deref(),
            Some("`/p/recipes/b.yaml` was skipped: run summon validate")
        );
        assert_eq!(catalog.unusable("c"), None);
        assert!(
            catalog
                .not_found("a")
                .message
                .starts_with("Source 'a' cannot be used: ")
        );
    }

    #[test]
    fn an_agent_file_is_meant_to_define_its_frontmatter_name() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rev.md");
        std::fs::write(
            &path,
            "---\nname: \"code-reviewer\"\ntools: [Read\n---\nBody\n",
        )
        .expect("write");
        assert!(meant_name(&path, "code-reviewer"));
        assert!(meant_name(&path, "rev"));
        assert!(!meant_name(&path, "Body"));
    }
}
