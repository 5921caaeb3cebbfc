//! The ordered list of directories searched for sources: project-local first, then global.

use std::path::PathBuf;

use crate::env::Env;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    Local,
    Global,
}

/// What a directory holds and how strictly it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DirKind {
    /// The working directory: files that are not recipes are ignored silently.
    WorkingDir,
    Recipes,
    /// The project's `.agents/agents/`: a role's name must equal its file stem.
    ProjectRoles,
    Agents,
}

impl DirKind {
    pub(crate) fn holds_recipes(self) -> bool {
        matches!(self, Self::WorkingDir | Self::Recipes)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct SearchDir {
    pub(crate) path: PathBuf,
    pub(crate) kind: DirKind,
    pub(crate) scope: Scope,
}

/// Every directory summon searches, in precedence order (earlier wins on a name clash).
pub(crate) fn search_dirs(env: &Env) -> Vec<SearchDir> {
    let cwd = &env.cwd;
    let home = env.home();
    let config = env.config_dir().map(|c| c.join("summon"));
    let mut dirs = Vec::new();
    let mut add = |path: Option<PathBuf>, kind: DirKind, scope: Scope| {
        if let Some(path) = path {
            dirs.push(SearchDir { path, kind, scope });
        }
    };
    // The project's folders are found from any of its subfolders, as `summon run` finds them.
    let (root, _) = crate::store::project_root(cwd, home.as_deref());
    add(Some(cwd.clone()), DirKind::WorkingDir, Scope::Local);
    for sub in ["recipes", ".goose/recipes", ".agents/recipes"] {
        add(Some(root.join(sub)), DirKind::Recipes, Scope::Local);
    }
    for dir in env
        .path_list("SUMMON_RECIPE_PATH")
        .into_iter()
        .chain(env.path_list("GOOSE_RECIPE_PATH"))
    {
        add(Some(cwd.join(dir)), DirKind::Recipes, Scope::Global);
    }
    add(
        home.as_ref().map(|h| h.join(".goose/recipes")),
        DirKind::Recipes,
        Scope::Global,
    );
    add(
        config.as_ref().map(|c| c.join("recipes")),
        DirKind::Recipes,
        Scope::Global,
    );
    add(
        home.as_ref().map(|h| h.join(".agents/recipes")),
        DirKind::Recipes,
        Scope::Global,
    );
    add(
        Some(root.join(".goose/agents")),
        DirKind::Agents,
        Scope::Local,
    );
    add(
        Some(root.join(".claude/agents")),
        DirKind::Agents,
        Scope::Local,
    );
    add(
        Some(root.join(".agents/agents")),
        DirKind::ProjectRoles,
        Scope::Local,
    );
    add(
        home.as_ref().map(|h| h.join(".goose/agents")),
        DirKind::Agents,
        Scope::Global,
    );
    add(
        home.as_ref().map(|h| h.join(".agents/agents")),
        DirKind::Agents,
        Scope::Global,
    );
    add(
        config.as_ref().map(|c| c.join("agents")),
        DirKind::Agents,
        Scope::Global,
    );
    add(
        home.as_ref().map(|h| h.join(".claude/agents")),
        DirKind::Agents,
        Scope::Global,
    );
    // The same folder reached twice (the project is the home directory) is read once, in
    // its first and most local role.
    let mut seen = Vec::new();
    dirs.retain(|d| {
        let key = (
            d.path.canonicalize().unwrap_or_else(|_| d.path.clone()),
            d.kind.holds_recipes(),
        );
        if seen.contains(&key) {
            false
        } else {
            seen.push(key);
            true
        }
    });
    dirs
}
