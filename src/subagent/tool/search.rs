//! The tools that look across files: `list_files` (glob) and `search` (regex over lines).
//!
//! Both walk the working directory (or a folder inside it) with the `ignore` crate, so
//! `.gitignore`, `.ignore` and git's exclude files are honoured even outside a git repository,
//! `.git` itself is skipped, and symlinks are neither followed nor read: only regular files are
//! listed and searched. Results are sorted by path and capped, with a note when cut.

use std::path::{Path, PathBuf};

use globset::{GlobBuilder, GlobMatcher};
use ignore::WalkBuilder;
use regex::{Regex, RegexBuilder};
use serde_json::{Value, json};

use super::args::Args;
use super::workdir::{Access, WorkDir};
use super::{ToolError, blocking, shown};
use crate::provider::ToolSpec;

/// The most paths `list_files` returns.
pub(crate) const LIST_CAP: usize = 1000;
/// The most matching lines `search` returns.
pub(crate) const MATCH_CAP: usize = 500;
/// Matching lines longer than this many characters are cut.
pub(crate) const LINE_CHARS: usize = 300;
/// Files larger than this are not searched.
const SEARCH_FILE_MAX: u64 = 32 * 1024 * 1024;
/// How much of the start of a file is checked for NUL bytes to tell binary files.
const BINARY_SNIFF: usize = 8 * 1024;

const LIST_EXPECTED: &str =
    r#"{"pattern"?: string (glob, default "**/*"), "path"?: string (folder)}"#;
const SEARCH_EXPECTED: &str = r#"{"pattern": string (regex), "path"?: string (folder or file), "glob"?: string, "case_insensitive"?: boolean}"#;

pub(crate) fn list_files_spec() -> ToolSpec {
    ToolSpec {
        name: "list_files".into(),
        description: format!(
            "List files in the working directory whose path matches a glob pattern, sorted, one \
             path per line relative to the working directory. A pattern without `/` matches file \
             names at any depth (`*.rs`); a pattern with `/` matches the path relative to `path` \
             (`src/**/*.rs`); `*` does not cross `/`, `**` does. Files ignored by .gitignore and \
             the .git folder are skipped. At most {LIST_CAP} paths are returned."
        ),
        parameters: json!({
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Glob pattern (default \"**/*\": every file)."},
                "path": {"type": "string", "description": "Folder to list, relative to the working directory (default: the working directory)."}
            },
            "additionalProperties": false
        }),
    }
}

pub(crate) fn search_spec() -> ToolSpec {
    ToolSpec {
        name: "search".into(),
        description: format!(
            "Search the text files of the working directory for lines matching a regular \
             expression (Rust regex syntax, matched per line). Returns `path:line: text` lines \
             sorted by path, long lines cut at {LINE_CHARS} characters, at most {MATCH_CAP} \
             matches. Files ignored by .gitignore, the .git folder and binary files are skipped. \
             Narrow with `path` (a folder or file) and `glob` (a file-name filter such as `*.rs`)."
        ),
        parameters: json!({
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Regular expression to look for."},
                "path": {"type": "string", "description": "Folder or file to search, relative to the working directory (default: the working directory)."},
                "glob": {"type": "string", "description": "Only search files matching this glob (same rules as list_files)."},
                "case_insensitive": {"type": "boolean", "description": "Ignore case (default false)."}
            },
            "required": ["pattern"],
            "additionalProperties": false
        }),
    }
}

/// A glob over file paths, with `list_files`'s rules.
struct FileFilter {
    matcher: GlobMatcher,
    /// A pattern without `/` matches the file name at any depth.
    name_only: bool,
}

impl FileFilter {
    fn new(pattern: &str) -> Result<Self, ToolError> {
        let pattern = pattern.trim();
        let pattern = pattern.strip_prefix("./").unwrap_or(pattern);
        let glob = GlobBuilder::new(pattern)
            .literal_separator(true)
            .build()
            .map_err(|e| {
                ToolError::Failed(format!(
                    "invalid glob pattern {}: {}",
                    shown(pattern),
                    e.kind()
                ))
            })?;
        Ok(Self {
            matcher: glob.compile_matcher(),
            name_only: !pattern.contains('/'),
        })
    }

    /// Whether the file at `rel` (relative to the folder walked) matches.
    fn matches(&self, rel: &Path) -> bool {
        if self.name_only {
            rel.file_name()
                .is_some_and(|name| self.matcher.is_match(name))
        } else {
            self.matcher.is_match(rel)
        }
    }
}

/// The regular files under `base` (or `base` itself when it is a file) that `filter` accepts,
/// honouring ignore files, sorted.
fn walk(base: &Path, filter: Option<&FileFilter>) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = WalkBuilder::new(base)
        .hidden(false)
        .require_git(false)
        .follow_links(false)
        .filter_entry(|entry| entry.file_name() != ".git")
        .build()
        .filter_map(Result::ok)
        .filter(|entry| entry.file_type().is_some_and(|t| t.is_file()))
        .map(ignore::DirEntry::into_path)
        .filter(|path| {
            filter.is_none_or(|f| {
                let rel = path.strip_prefix(base).unwrap_or(path);
                let rel = if rel.as_os_str().is_empty() {
                    Path::new(path.file_name().unwrap_or_default())
                } else {
                    rel
                };
                f.matches(rel)
            })
        })
        .collect();
    files.sort();
    files
}

/// Resolves the optional folder argument; it must exist.
fn base_dir(wd: &WorkDir, user_path: Option<&str>) -> Result<PathBuf, ToolError> {
    let base = wd.resolve(user_path.unwrap_or("."), Access::Read)?;
    if !base.exists() {
        return Err(ToolError::Failed(format!(
            "{} does not exist",
            shown(user_path.unwrap_or("."))
        )));
    }
    Ok(base)
}

/// `list_files {pattern?, path?}`.
pub(crate) async fn list_files(args: &Value, wd: &WorkDir) -> Result<String, ToolError> {
    let args = Args::parse("list_files", LIST_EXPECTED, args)?;
    let pattern = args.opt_str("pattern")?.unwrap_or("**/*").to_owned();
    let user_path = args.opt_str("path")?;
    let filter = FileFilter::new(&pattern)?;
    let base = base_dir(wd, user_path)?;
    let where_ = user_path
        .map(|p| format!(" in {}", shown(p)))
        .unwrap_or_default();
    let wd = wd.clone();
    blocking(move || {
        let files = walk(&base, Some(&filter));
        if files.is_empty() {
            return Ok(format!("no files match {}{where_}", shown(&pattern)));
        }
        let mut out: Vec<String> = files
            .iter()
            .take(LIST_CAP)
            .map(|path| wd.display(path))
            .collect();
        if files.len() > LIST_CAP {
            out.push(format!(
                "[{} more files not shown ({} in all); narrow the pattern or the path]",
                files.len() - LIST_CAP,
                files.len()
            ));
        }
        Ok(out.join("\n"))
    })
    .await
}

/// `search {pattern, path?, glob?, case_insensitive?}`.
pub(crate) async fn search(args: &Value, wd: &WorkDir) -> Result<String, ToolError> {
    let args = Args::parse("search", SEARCH_EXPECTED, args)?;
    let pattern = args.str("pattern")?.to_owned();
    let user_path = args.opt_str("path")?;
    let glob = args.opt_str("glob")?;
    let case_insensitive = args.opt_bool("case_insensitive")?.unwrap_or(false);
    let regex = RegexBuilder::new(&pattern)
        .case_insensitive(case_insensitive)
        .build()
        .map_err(|e| ToolError::Failed(format!("invalid regex {}: {e}", shown(&pattern))))?;
    let filter = glob.map(FileFilter::new).transpose()?;
    let base = base_dir(wd, user_path)?;
    let wd = wd.clone();
    blocking(move || {
        let files = walk(&base, filter.as_ref());
        let mut out = Vec::new();
        let complete = files
            .iter()
            .all(|file| search_file(file, &regex, &wd, &mut out));
        if out.is_empty() {
            return Ok(format!("no matches for {}", shown(&pattern)));
        }
        if !complete {
            out.push(format!(
                "[Stopped after {MATCH_CAP} matches; narrow the search with `path`, `glob` or a \
                 more specific pattern]"
            ));
        }
        Ok(out.join("\n"))
    })
    .await
}

/// Appends the matching lines of `file` to `out`; false once [`MATCH_CAP`] is reached.
fn search_file(file: &Path, regex: &Regex, wd: &WorkDir, out: &mut Vec<String>) -> bool {
    if std::fs::metadata(file).map_or(true, |m| m.len() > SEARCH_FILE_MAX) {
        return true;
    }
    let Ok(bytes) = std::fs::read(file) else {
        return true;
    };
    if bytes[..bytes.len().min(BINARY_SNIFF)].contains(&0) {
        return true;
    }
    let text = String::from_utf8_lossy(&bytes);
    let shown_path = wd.display(file);
    for (index, line) in text.lines().enumerate() {
        if !regex.is_match(line) {
            continue;
        }
        if out.len() >= MATCH_CAP {
            return false;
        }
        let mut cut: String = line.chars().take(LINE_CHARS).collect();
        if cut.len() < line.len() {
            cut.push_str("...");
        }
        out.push(format!("{shown_path}:{}: {cut}", index + 1));
    }
    true
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::subagent::tool::test_support::Sandbox;

    fn tree() -> Sandbox {
        let sb = Sandbox::new();
        sb.write("src/main.rs", "fn main() {\n    println!(\"Hello\");\n}\n");
        sb.write("src/lib/util.rs", "pub fn hello() {}\n// HELLO again\n");
        sb.write("README.md", "hello readme\n");
        sb.write(".gitignore", "target/\n*.log\n");
        sb.write("target/debug/out.rs", "fn hello() {}\n");
        sb.write("build.log", "hello log\n");
        sb.write(".git/config", "hello git\n");
        sb.write(".github/ci.yml", "hello ci\n");
        sb
    }

    async fn list(sb: &Sandbox, args: Value) -> Result<String, ToolError> {
        list_files(&args, &sb.wd).await
    }

    async fn grep(sb: &Sandbox, args: Value) -> Result<String, ToolError> {
        search(&args, &sb.wd).await
    }

    #[tokio::test]
    async fn list_respects_gitignore_and_globs() {
        let sb = tree();
        assert_eq!(
            list(&sb, json!({})).await.unwrap(),
            ".github/ci.yml\n.gitignore\nREADME.md\nsrc/lib/util.rs\nsrc/main.rs"
        );
        assert_eq!(
            list(&sb, Value::Null).await.unwrap(),
            list(&sb, json!({"pattern": "**/*"})).await.unwrap()
        );
        assert_eq!(
            list(&sb, json!({"pattern": "*.rs"})).await.unwrap(),
            "src/lib/util.rs\nsrc/main.rs"
        );
        assert_eq!(
            list(&sb, json!({"pattern": "src/*.rs"})).await.unwrap(),
            "src/main.rs"
        );
        assert_eq!(
            list(&sb, json!({"pattern": "*.rs", "path": "src/lib"}))
                .await
                .unwrap(),
            "src/lib/util.rs"
        );
        assert_eq!(
            list(&sb, json!({"pattern": "*.py"})).await.unwrap(),
            "no files match `*.py`"
        );
        let err = list(&sb, json!({"pattern": "a[b"})).await.unwrap_err();
        assert!(
            err.to_string().starts_with("invalid glob pattern `a[b`"),
            "{err}"
        );
        let err = list(&sb, json!({"path": "nothere"})).await.unwrap_err();
        assert_eq!(err.to_string(), "`nothere` does not exist");
    }

    #[tokio::test]
    async fn list_is_capped() {
        let sb = Sandbox::new();
        for i in 0..(LIST_CAP + 5) {
            sb.write(&format!("f/{i:04}.txt"), "");
        }
        let out = list(&sb, json!({})).await.unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), LIST_CAP + 1);
        assert_eq!(lines[0], "f/0000.txt");
        assert_eq!(
            lines[LIST_CAP],
            "[5 more files not shown (1005 in all); narrow the pattern or the path]"
        );
    }

    #[tokio::test]
    async fn search_finds_lines() {
        let sb = tree();
        assert_eq!(
            grep(&sb, json!({"pattern": "hello"})).await.unwrap(),
            ".github/ci.yml:1: hello ci\nREADME.md:1: hello readme\nsrc/lib/util.rs:1: pub fn hello() {}"
        );
        assert_eq!(
            grep(
                &sb,
                json!({"pattern": "hello", "case_insensitive": true, "glob": "*.rs"})
            )
            .await
            .unwrap(),
            "src/lib/util.rs:1: pub fn hello() {}\nsrc/lib/util.rs:2: // HELLO again\nsrc/main.rs:2:     println!(\"Hello\");"
        );
        assert_eq!(
            grep(&sb, json!({"pattern": "^fn", "path": "src/main.rs"}))
                .await
                .unwrap(),
            "src/main.rs:1: fn main() {"
        );
        assert_eq!(
            grep(&sb, json!({"pattern": "nothing here"})).await.unwrap(),
            "no matches for `nothing here`"
        );
        let err = grep(&sb, json!({"pattern": "fn ("})).await.unwrap_err();
        assert!(err.to_string().starts_with("invalid regex `fn (`"), "{err}");
        let err = grep(&sb, json!({"path": "src"})).await.unwrap_err();
        assert!(
            err.to_string().contains("missing required field `pattern`"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn search_caps_matches_and_line_length() {
        let sb = Sandbox::new();
        sb.write("many.txt", &"match\n".repeat(MATCH_CAP + 10));
        sb.write("long.txt", &format!("match {}\n", "x".repeat(1000)));
        std::fs::write(sb.root().join("bin.dat"), b"match\0\0").unwrap();
        let out = grep(&sb, json!({"pattern": "match", "path": "long.txt"}))
            .await
            .unwrap();
        assert_eq!(out.chars().count(), "long.txt:1: ".len() + LINE_CHARS + 3);
        assert!(out.ends_with("xxx..."));
        let out = grep(&sb, json!({"pattern": "match"})).await.unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), MATCH_CAP + 1);
        assert!(lines[MATCH_CAP].starts_with("[Stopped after 500 matches"));
        assert!(!out.contains("bin.dat"));
    }

    #[tokio::test]
    async fn walking_tools_refuse_escapes_and_skip_outside_links() {
        let sb = Sandbox::new();
        sb.write("in.txt", "top secret inside\n");
        for path in sb.escapes() {
            let err = list(&sb, json!({"path": path})).await.unwrap_err();
            assert!(
                matches!(
                    err,
                    ToolError::Outside { .. } | ToolError::InvalidPath { .. }
                ),
                "list {path:?}: {err}"
            );
            let err = grep(&sb, json!({"pattern": "secret", "path": path}))
                .await
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    ToolError::Outside { .. } | ToolError::InvalidPath { .. }
                ),
                "search {path:?}: {err}"
            );
        }
        // The symlinks to the outside file and folder are neither listed nor read.
        assert_eq!(list(&sb, json!({})).await.unwrap(), "in.txt");
        assert_eq!(
            grep(&sb, json!({"pattern": "secret"})).await.unwrap(),
            "in.txt:1: top secret inside"
        );
        let abs = sb.root().display().to_string();
        assert_eq!(list(&sb, json!({"path": abs})).await.unwrap(), "in.txt");
    }
}
