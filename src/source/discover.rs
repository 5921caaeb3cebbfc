//! Scanning the search directories: one level deep, files over 1 MiB and symlinks that
//! leave their directory skipped with a warning, every parse problem collected.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::catalog::{Catalog, Source, SourceDef, SourceKind};
use super::search_path::{DirKind, SearchDir};
use crate::agent::{AgentDir, AgentParse, parse_agent};
use crate::diag::{Diagnostic, Diagnostics, SourceFile};
use crate::recipe::{Strictness, parse_recipe};

/// Files larger than this are not read.
pub(crate) const MAX_FILE_SIZE: u64 = 1024 * 1024;

const RECIPE_EXTENSIONS: &[&str] = &["yaml", "yml", "json"];

/// Reads every search directory and builds the catalog. Problems in individual files do
/// not stop discovery; they are kept in the catalog's diagnostics.
pub(crate) fn discover(dirs: Vec<SearchDir>) -> Catalog {
    let mut found: Vec<(usize, PathBuf)> = Vec::new();
    let mut diags = Diagnostics::default();
    for (index, dir) in dirs.iter().enumerate() {
        let mut files = list_dir(dir, &mut diags);
        files.sort();
        found.extend(files.into_iter().map(|f| (index, f)));
    }
    let parsed = parse_all(&dirs, &found);
    let mut catalog = Catalog::new(dirs);
    for (source, file_diags) in parsed {
        diags.extend(file_diags);
        if let Some(source) = source {
            catalog.add(source);
        }
    }
    catalog.add_sub_recipes(&mut diags);
    catalog.diagnostics = diags;
    catalog
}

/// Parses files on all cores; results come back in discovery order.
fn parse_all(dirs: &[SearchDir], found: &[(usize, PathBuf)]) -> Vec<(Option<Source>, Diagnostics)> {
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(8);
    if threads <= 1 || found.len() < 64 {
        return found
            .iter()
            .map(|(i, path)| parse_one(&dirs[*i], path))
            .collect();
    }
    let chunk = found.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = found
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    part.iter()
                        .map(|(i, path)| parse_one(&dirs[*i], path))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })
}

/// The candidate files of one directory (not recursive).
fn list_dir(dir: &SearchDir, diags: &mut Diagnostics) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(&dir.path) else {
        return Vec::new();
    };
    let real_dir = dir.path.canonicalize().unwrap_or_else(|_| dir.path.clone());
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(extension) = path.extension().and_then(|e| e.to_str()) else {
            continue;
        };
        let wanted = if dir.kind.holds_recipes() {
            RECIPE_EXTENSIONS.contains(&extension)
        } else {
            extension == "md"
        };
        if !wanted {
            continue;
        }
        let Ok(file_type) = entry.file_type() else {
            continue;
        };
        if file_type.is_symlink() {
            match path.canonicalize() {
                Ok(target) if target.starts_with(&real_dir) => {}
                Ok(target) => {
                    diags.push(
                        Diagnostic::warning(format!(
                            "skipped: symlink leads out of its directory (to `{}`)",
                            target.display()
                        ))
                        .in_file(&path),
                    );
                    continue;
                }
                Err(_) => {
                    diags.push(Diagnostic::warning("skipped: broken symlink").in_file(&path));
                    continue;
                }
            }
        }
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => out.push(path),
            Ok(_) => {}
            Err(e) => diags.push(Diagnostic::warning(format!("skipped: {e}")).in_file(&path)),
        }
    }
    out
}

/// Reads a source file, refusing huge ones; the error is a warning-ready message.
pub(crate) fn read_source_text(path: &Path) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read: {e}"))?;
    if meta.len() > MAX_FILE_SIZE {
        return Err(format!(
            "skipped: {} bytes is over the 1 MiB limit for source files",
            meta.len()
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    String::from_utf8(bytes).map_err(|_| "skipped: not UTF-8 text".to_owned())
}

fn parse_one(dir: &SearchDir, path: &Path) -> (Option<Source>, Diagnostics) {
    let mut diags = Diagnostics::default();
    let text = match read_source_text(path) {
        Ok(text) => text,
        Err(message) => {
            diags.push(Diagnostic::warning(message).in_file(path));
            return (None, diags);
        }
    };
    let file = SourceFile::new(path, text);
    let source = if dir.kind.holds_recipes() {
        let strictness = if dir.kind == DirKind::WorkingDir {
            Strictness::Lenient
        } else {
            Strictness::Strict
        };
        parse_recipe(&file, strictness, &mut diags).map(|recipe| {
            let recipe = Arc::new(recipe);
            Source {
                name: recipe.stem(),
                kind: SourceKind::Recipe,
                description: recipe.description.clone(),
                path: path.to_path_buf(),
                scope: dir.scope,
                def: SourceDef::Recipe(recipe),
            }
        })
    } else {
        let agent_dir = if dir.kind == DirKind::ProjectRoles {
            AgentDir::Project
        } else {
            AgentDir::Other
        };
        match parse_agent(&file, agent_dir, &mut diags) {
            AgentParse::Agent(agent) => {
                let agent = Arc::new(agent);
                Some(Source {
                    name: agent.name.clone(),
                    kind: SourceKind::Agent,
                    description: agent.description.clone(),
                    path: path.to_path_buf(),
                    scope: dir.scope,
                    def: SourceDef::Agent(agent),
                })
            }
            AgentParse::NotAnAgent => None,
        }
    };
    (source, diags)
}
