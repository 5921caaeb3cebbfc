//! A run's catalog, frozen into its journal when the run starts: `--resume` rebuilds the
//! catalog from this list instead of scanning the directories again, so sources added or
//! renamed since take effect only in a new run. Each entry's file is read again (a role's
//! text is always read when its subagent starts).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use super::catalog::{Catalog, Source, SourceDef, SourceKind};
use super::search_path::Scope;
use crate::agent::{AgentDir, AgentParse, parse_agent};
use crate::diag::{Diagnostics, SourceFile};
use crate::recipe::{Strictness, parse_recipe};

/// The catalog as JSON: `[{"name", "kind", "path", "scope", "parent"}]`.
pub(crate) fn freeze(catalog: &Catalog) -> Value {
    catalog
        .sources
        .iter()
        .map(|s| {
            let parent = match &s.def {
                SourceDef::Subrecipe { parent, .. } => Some(parent.path().display().to_string()),
                _ => None,
            };
            json!({
                "name": s.name,
                "kind": s.kind.name(),
                "path": s.path.display().to_string(),
                "scope": if s.scope == Scope::Local { "local" } else { "global" },
                "parent": parent,
            })
        })
        .collect()
}

/// Rebuilds a catalog from [`freeze`]'s list. Entries whose file no longer parses are left
/// out, so their tasks fail with the catalog's message.
pub(crate) fn thaw(frozen: &Value) -> Catalog {
    let mut catalog = Catalog::new(Vec::new());
    let mut diags = Diagnostics::default();
    for entry in frozen.as_array().map(Vec::as_slice).unwrap_or_default() {
        let (Some(name), Some(kind), Some(path)) = (
            entry["name"].as_str(),
            entry["kind"].as_str(),
            entry["path"].as_str().map(PathBuf::from),
        ) else {
            continue;
        };
        let scope = if entry["scope"] == "global" {
            Scope::Global
        } else {
            Scope::Local
        };
        let source = match kind {
            "recipe" => read_recipe(&path, &mut diags).map(|recipe| Source {
                name: name.to_owned(),
                kind: SourceKind::Recipe,
                description: recipe.description.clone(),
                path: path.clone(),
                scope,
                def: SourceDef::Recipe(recipe),
            }),
            "agent" => read_agent(&path, &mut diags)
                .filter(|a| a.name == name)
                .map(|agent| Source {
                    name: name.to_owned(),
                    kind: SourceKind::Agent,
                    description: agent.description.clone(),
                    path: path.clone(),
                    scope,
                    def: SourceDef::Agent(agent),
                }),
            "subrecipe" => entry["parent"]
                .as_str()
                .and_then(|parent| read_recipe(Path::new(parent), &mut diags))
                .and_then(|parent| {
                    let entry = parent.sub_recipes.iter().find(|s| s.name == name)?.clone();
                    let recipe = read_recipe(&entry.path, &mut diags)?;
                    Some(Source {
                        name: name.to_owned(),
                        kind: SourceKind::Subrecipe,
                        description: entry
                            .description
                            .clone()
                            .unwrap_or_else(|| recipe.description.clone()),
                        path: entry.path.clone(),
                        scope,
                        def: SourceDef::Subrecipe {
                            parent,
                            entry,
                            recipe,
                        },
                    })
                }),
            _ => None,
        };
        if let Some(source) = source {
            catalog.add(source);
        }
    }
    catalog.diagnostics = diags;
    catalog
}

fn read_recipe(path: &Path, diags: &mut Diagnostics) -> Option<Arc<crate::recipe::Recipe>> {
    let text = super::read_source_text(path).ok()?;
    parse_recipe(&SourceFile::new(path, text), Strictness::Strict, diags).map(Arc::new)
}

fn read_agent(path: &Path, diags: &mut Diagnostics) -> Option<Arc<crate::agent::AgentDef>> {
    let text = super::read_source_text(path).ok()?;
    let dir = if path.parent().is_some_and(|p| p.ends_with(".agents/agents")) {
        AgentDir::Project
    } else {
        AgentDir::Other
    };
    match parse_agent(&SourceFile::new(path, text), dir, diags) {
        AgentParse::Agent(agent) => Some(Arc::new(agent)),
        AgentParse::NotAnAgent => None,
    }
}
