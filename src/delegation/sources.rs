//! The sources a caller can load or delegate to: listing them, and loading one into context.

use std::path::PathBuf;

use crate::diag::Diagnostic;
use crate::recipe::Parameter;
use crate::source::{Catalog, Scope, Source, SourceDef, SourceKind};

/// One source of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SourceEntry {
    pub(crate) name: String,
    pub(crate) kind: SourceKind,
    pub(crate) description: String,
    pub(crate) path: PathBuf,
    pub(crate) scope: Scope,
    /// The file of the recipe that declares a subrecipe.
    pub(crate) parent: Option<PathBuf>,
    /// An agent's `tools` list as written (`None`: no list, no narrowing).
    pub(crate) tools: Option<Vec<String>>,
}

/// An agent's `tools` list as written; `None` for other sources and agents without one.
fn tools_of(source: &Source) -> Option<Vec<String>> {
    match &source.def {
        SourceDef::Agent(agent) => agent
            .tools
            .as_ref()
            .map(|tools| tools.iter().map(|t| t.raw.clone()).collect()),
        _ => None,
    }
}

/// Every source of a catalog, and where they were looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SourceList {
    /// In the catalog's order.
    pub(crate) sources: Vec<SourceEntry>,
    /// The directories searched, in precedence order.
    pub(crate) searched: Vec<PathBuf>,
    /// How many source files have errors and are left out.
    pub(crate) problems: usize,
    /// Files that were not read at all, with why: over the size limit, a symlink out of its
    /// directory or a broken one, unreadable.
    pub(crate) skipped: Vec<(PathBuf, String)>,
}

impl SourceList {
    /// The sources of one kind, in order.
    pub(crate) fn of_kind(&self, kind: SourceKind) -> impl Iterator<Item = &SourceEntry> {
        self.sources.iter().filter(move |s| s.kind == kind)
    }
}

/// Lists the sources of `catalog`.
pub(crate) fn list(catalog: &Catalog) -> SourceList {
    SourceList {
        sources: catalog
            .sources
            .iter()
            .map(|s| SourceEntry {
                name: s.name.clone(),
                kind: s.kind,
                description: s.description.clone(),
                path: s.path.clone(),
                scope: s.scope,
                parent: match &s.def {
                    SourceDef::Subrecipe { parent, .. } => Some(parent.path().to_path_buf()),
                    _ => None,
                },
                tools: tools_of(s),
            })
            .collect(),
        searched: catalog.searched.iter().map(|d| d.path.clone()).collect(),
        problems: catalog.diagnostics.error_count(),
        skipped: catalog
            .diagnostics
            .items
            .iter()
            .filter(|d| !d.is_error())
            .filter_map(|d| {
                let reason = d
                    .message
                    .strip_prefix("skipped: ")
                    .or_else(|| d.message.starts_with("cannot read").then_some(&*d.message))?;
                Some((d.file_path()?.to_path_buf(), reason.to_owned()))
            })
            .collect(),
    }
}

/// A source loaded into context: its text, and a subrecipe's parameters.
#[derive(Debug, Clone)]
pub(crate) struct LoadedSource {
    pub(crate) name: String,
    pub(crate) kind: SourceKind,
    pub(crate) path: PathBuf,
    pub(crate) description: String,
    /// A recipe's instructions and prompt, an agent's role text.
    pub(crate) content: String,
    /// A subrecipe's parameters (none for other kinds).
    pub(crate) parameters: Vec<Parameter>,
    /// An agent's `tools` list as written.
    pub(crate) tools: Option<Vec<String>>,
}

impl LoadedSource {
    /// The text that puts the source in a reader's context: `# Loaded: NAME (kind)`, the
    /// content, the parameters, and a closing line.
    pub(crate) fn render(&self) -> String {
        let mut text = format!(
            "# Loaded: {} ({})\n\n{}\n",
            self.name,
            self.kind.name(),
            self.content.trim_end()
        );
        if let Some(tools) = &self.tools {
            text.push_str(&format!("\n## Tools\n\n{}\n", tools_line(tools)));
        }
        if !self.parameters.is_empty() {
            text.push_str("\n## Parameters\n\n");
            text.push_str(&format_parameters(&self.parameters));
        }
        text.push_str("\nThis knowledge is now available in your context.\n");
        text
    }
}

/// An agent's tools list for people: the names, or that it lists none.
pub(crate) fn tools_line(tools: &[String]) -> String {
    if tools.is_empty() {
        "none (`tools: []`)".to_owned()
    } else {
        tools.join(", ")
    }
}

/// Loads the source called `name`; an unknown name is an error that suggests close ones.
pub(crate) fn load(catalog: &Catalog, name: &str) -> Result<LoadedSource, Diagnostic> {
    let source = catalog.get(name).ok_or_else(|| catalog.not_found(name))?;
    Ok(loaded(source))
}

fn loaded(source: &Source) -> LoadedSource {
    let parameters = match &source.def {
        SourceDef::Subrecipe { recipe, .. } => recipe.parameters.clone(),
        _ => Vec::new(),
    };
    LoadedSource {
        name: source.name.clone(),
        kind: source.kind,
        path: source.path.clone(),
        description: source.description.clone(),
        content: content_of(source),
        parameters,
        tools: tools_of(source),
    }
}

/// The text a source contributes: a recipe's instructions and prompt, an agent's role text.
fn content_of(source: &Source) -> String {
    match &source.def {
        SourceDef::Agent(agent) => agent.body.trim().to_owned(),
        SourceDef::Recipe(recipe) | SourceDef::Subrecipe { recipe, .. } => {
            let mut parts = Vec::new();
            if let Some(instructions) = &recipe.instructions {
                parts.push(instructions.trim_end().to_owned());
            }
            if let Some(prompt) = &recipe.prompt {
                parts.push(format!("## Prompt\n\n{}", prompt.trim_end()));
            }
            parts.join("\n\n")
        }
    }
}

/// One line per parameter: key, type, requirement, default, options, description.
fn format_parameters(parameters: &[Parameter]) -> String {
    let mut text = String::new();
    for p in parameters {
        let mut facts = vec![
            p.input_type.name().to_owned(),
            p.requirement.name().to_owned(),
        ];
        if let Some(default) = &p.default {
            facts.push(format!("default: {default}"));
        }
        if !p.options.is_empty() {
            facts.push(format!("options: {}", p.options.join(", ")));
        }
        text.push_str(&format!("- `{}` ({})", p.key, facts.join(", ")));
        if !p.description.is_empty() {
            text.push_str(&format!(": {}", p.description.trim()));
        }
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Env;

    /// A project with a recipe declaring a subrecipe, an agent and a broken recipe; the home
    /// directory is empty.
    fn project() -> (tempfile::TempDir, Catalog) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("project");
        let home = dir.path().join("home");
        let write = |path: &str, text: &str| {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write(
            "recipes/main.yaml",
            "title: Main\ndescription: main recipe\ninstructions: use the helper\n\
             prompt: start now\nsub_recipes:\n  - name: helper\n    path: sub/helper.yaml\n",
        );
        write(
            "recipes/sub/helper.yaml",
            "title: Helper\ndescription: helps\ninstructions: help with {{ lang }}\n\
             parameters:\n  - key: lang\n    input_type: select\n    requirement: optional\n    \
             default: rust\n    options: [rust, go]\n    description: the language\n",
        );
        write(
            ".claude/agents/scout.md",
            "---\nname: scout\ndescription: Maps the code\n---\n\nYou map the code.\n\n",
        );
        write("recipes/broken.yaml", "title: [unclosed\n");
        std::fs::create_dir_all(&home).unwrap();
        let env = Env::for_test(&root, &[("HOME", home.to_str().unwrap())]);
        let catalog = crate::source::discover(crate::source::search_dirs(&env));
        (dir, catalog)
    }

    #[test]
    fn the_listing_has_every_source_with_its_kind_and_parent() {
        let (dir, catalog) = project();
        let root = dir.path().join("project");
        let listing = list(&catalog);
        let names = |kind| {
            listing
                .of_kind(kind)
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(SourceKind::Recipe), ["main"]);
        assert_eq!(names(SourceKind::Subrecipe), ["helper"]);
        assert_eq!(names(SourceKind::Agent), ["scout"]);
        let helper = listing.sources.iter().find(|s| s.name == "helper").unwrap();
        assert_eq!(
            helper.parent.as_deref(),
            Some(root.join("recipes/main.yaml").as_path())
        );
        assert_eq!(helper.scope, Scope::Local);
        let scout = listing.sources.iter().find(|s| s.name == "scout").unwrap();
        assert_eq!(scout.description, "Maps the code");
        assert_eq!(scout.parent, None);
        assert_eq!(listing.problems, 1);
        assert_eq!(listing.searched.first(), Some(&root));
        assert!(
            listing
                .searched
                .contains(&dir.path().join("home/.goose/recipes"))
        );
    }

    #[test]
    fn a_loaded_subrecipe_has_its_content_and_parameters() {
        let (_dir, catalog) = project();
        let helper = load(&catalog, "helper").unwrap();
        assert_eq!(helper.kind, SourceKind::Subrecipe);
        assert_eq!(helper.content, "help with {{ lang }}");
        assert_eq!(helper.parameters.len(), 1);
        assert_eq!(
            helper.render(),
            "# Loaded: helper (subrecipe)\n\nhelp with {{ lang }}\n\n## Parameters\n\n\
             - `lang` (select, optional, default: rust, options: rust, go): the language\n\
             \nThis knowledge is now available in your context.\n"
        );
        let main = load(&catalog, "main").unwrap();
        assert_eq!(main.content, "use the helper\n\n## Prompt\n\nstart now");
        assert!(main.parameters.is_empty());
        let scout = load(&catalog, "scout").unwrap();
        assert_eq!(scout.kind, SourceKind::Agent);
        assert_eq!(
            scout.render(),
            "# Loaded: scout (agent)\n\nYou map the code.\n\n\
             This knowledge is now available in your context.\n"
        );
    }

    #[test]
    fn an_unknown_name_suggests_close_ones() {
        let (_dir, catalog) = project();
        let error = load(&catalog, "scot").unwrap_err();
        assert_eq!(
            error.message,
            "Source 'scot' not found. Did you mean: scout?"
        );
    }
}
