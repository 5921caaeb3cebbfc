//! The catalog: every source by name, frozen once read. Earlier directories win a name
//! clash; the losers are kept as [`Shadowed`] so `summon validate` can report them.

use std::path::PathBuf;
use std::sync::Arc;

use super::search_path::{Scope, SearchDir};
use super::suggest::suggestions;
use crate::agent::AgentDef;
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

    /// The "not found" error of SPEC §2; when a recipe file of that name was left out for
    /// its errors, the hint names the file and its first error.
    pub(crate) fn not_found(&self, name: &str) -> Diagnostic {
        let found = self.not_found_message(name);
        match self.left_out(name) {
            Some(error) => {
                let cwd = std::env::current_dir().unwrap_or_default();
                let path = error
                    .file_path()
                    .map(|p| crate::diag::render::display_path(p, &cwd))
                    .unwrap_or_default();
                let at = error
                    .span
                    .as_ref()
                    .map(|s| format!(":{}:{}", s.pos.line, s.pos.col))
                    .unwrap_or_default();
                found.with_hint(format!(
                    "{path}{at} has errors, so it was left out: {}",
                    error.message
                ))
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
        if close.is_empty() {
            Diagnostic::error(format!(
                "Source '{name}' not found. Use summon load to see available sources."
            ))
        } else {
            Diagnostic::error(format!(
                "Source '{name}' not found. Did you mean: {}?",
                close.join(", ")
            ))
        }
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
