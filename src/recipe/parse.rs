//! Reads a [`Recipe`] from a positioned YAML/JSON tree, reporting every problem with its
//! position: errors for what goose requires, warnings for what it would ignore.

use std::path::Path;
use std::sync::Arc;

use indexmap::IndexMap;

use super::model::{
    Extension, ExtensionKind, InputType, Parameter, Recipe, Requirement, RetryConfig, Settings,
    SubRecipe,
};
use crate::diag::{Diagnostics, FileDiags, Pos, SourceFile};
use crate::template;
use crate::yaml::{self, MapReader, Node};

/// How to treat a file that may not be a recipe at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strictness {
    /// The file was named as a recipe: every problem is reported.
    Strict,
    /// A file found in the working directory: if it does not look like a recipe it is
    /// ignored without a word (`package.json`, `docker-compose.yml`).
    Lenient,
}

/// Desktop exports wrap the recipe under `recipe:` next to these keys.
const DESKTOP_KEYS: &[&str] = &["name", "isGlobal", "lastModified", "isArchived", "id"];

/// Parses a recipe file. `None` when it is not a recipe, or has errors (reported to `diags`).
pub(crate) fn parse_recipe(
    file: &Arc<SourceFile>,
    strictness: Strictness,
    diags: &mut Diagnostics,
) -> Option<Recipe> {
    let mut local = Diagnostics::default();
    let result = parse_inner(file, strictness, &mut local);
    if result.is_none() && strictness == Strictness::Lenient && !looks_like_recipe(&file.text) {
        return None;
    }
    diags.extend(local);
    result
}

fn looks_like_recipe(text: &str) -> bool {
    match yaml::parse(text) {
        Ok(Some(root)) => {
            let root = root
                .get("recipe")
                .filter(|r| r.as_map().is_some())
                .unwrap_or(&root);
            root.get("title").is_some()
                && (root.get("instructions").is_some() || root.get("prompt").is_some())
        }
        Ok(None) => false,
        Err(_) => {
            text.lines().any(|l| l.starts_with("title:"))
                && text
                    .lines()
                    .any(|l| l.starts_with("instructions:") || l.starts_with("prompt:"))
        }
    }
}

fn parse_inner(
    file: &Arc<SourceFile>,
    strictness: Strictness,
    diags: &mut Diagnostics,
) -> Option<Recipe> {
    let mut d = diags.for_file(file);
    let (root, whole_text_template) = match yaml::parse(&file.text) {
        Ok(Some(root)) => (root, false),
        Ok(None) => {
            if strictness == Strictness::Strict {
                d.error(Pos::new(1, 1, 1), "the file is empty; a recipe needs `title`, `description` and `instructions` or `prompt`");
            }
            return None;
        }
        Err(syntax) => match structure_from_template(file) {
            Some(Ok(root)) => (root, true),
            Some(Err(diagnostic)) => {
                d.push(diagnostic);
                return None;
            }
            None => {
                d.error(syntax.pos, format!("invalid YAML: {}", syntax.message));
                return None;
            }
        },
    };
    if root.as_map().is_none() {
        d.error(
            root.pos,
            format!("a recipe must be a mapping, found {}", root.kind_name()),
        );
        return None;
    }
    let root = desktop_unwrap(root, &mut d);
    let recipe = read_recipe(file, root, whole_text_template, &mut d)?;
    (!d.has_errors()).then_some(recipe)
}

/// The structure of a recipe whose YAML is itself templated (`{% if %}` around keys,
/// `{% extends "parent.yaml" %}`, `{% include %}` of YAML parts), found by rendering the whole
/// text leniently, as goose renders before parsing; files are read from the recipe's folder.
/// `None` when that gives no YAML either; a diagnostic when a file it pulls in cannot be read.
fn structure_from_template(
    file: &Arc<SourceFile>,
) -> Option<Result<Node, crate::diag::Diagnostic>> {
    if !template::has_template(&file.text) {
        return None;
    }
    let dir = file.path().parent();
    let env = template::lenient_environment(dir);
    match super::literals::render(&env, &file.text, &minijinja::Value::UNDEFINED) {
        Ok(text) => match yaml::parse(&text) {
            Ok(Some(root)) => Some(Ok(root)),
            _ => None,
        },
        // A missing or refused parent or part says more than the YAML error would.
        Err(error) if template::uses_other_files(&file.text) => {
            let line = error.line.unwrap_or(1);
            Some(Err(crate::diag::Diagnostic::error(format!(
                "cannot render template: {}",
                error.message
            ))
            .at(crate::diag::Span::new(file, Pos::new(line, 1, 1)))))
        }
        Err(_) => None,
    }
}

/// Reads a recipe from an already parsed (and possibly rendered) mapping.
pub(super) fn recipe_from_root(
    file: &Arc<SourceFile>,
    root: Node,
    whole_text_template: bool,
    diags: &mut Diagnostics,
) -> Option<Recipe> {
    let mut d = diags.for_file(file);
    let recipe = read_recipe(file, root, whole_text_template, &mut d)?;
    (!d.has_errors()).then_some(recipe)
}

/// The desktop form: `{name, recipe: {...}, ...}` → the inner mapping.
fn desktop_unwrap(root: Node, d: &mut FileDiags<'_>) -> Node {
    let Some(inner) = root.get("recipe").filter(|r| r.as_map().is_some()) else {
        return root;
    };
    if root.get("title").is_some() || root.get("instructions").is_some() {
        return root;
    }
    let inner = inner.clone();
    if let Some(mut reader) = MapReader::new(&root, "") {
        reader.ignore(&["recipe"]);
        reader.ignore(DESKTOP_KEYS);
        reader.finish(d);
    }
    inner
}

fn read_recipe(
    file: &Arc<SourceFile>,
    root: Node,
    whole_text_template: bool,
    d: &mut FileDiags<'_>,
) -> Option<Recipe> {
    let mut r = MapReader::new(&root, "")?;
    let title = string_field(&mut r, "title", d);
    let description = string_field(&mut r, "description", d);
    let instructions = string_field(&mut r, "instructions", d);
    let prompt = string_field(&mut r, "prompt", d);
    let top = Pos::new(1, 1, 1);
    // A field given with the wrong type was reported already.
    let given = |name: &str| root.get(name).is_some_and(|v| !v.is_null());
    for (name, value) in [("title", &title), ("description", &description)] {
        if value.is_none() && !given(name) {
            d.error(top, format!("missing required field `{name}`"));
        }
    }
    if instructions.is_none() && prompt.is_none() && !given("instructions") && !given("prompt") {
        d.error(
            top,
            "a recipe needs `instructions` or `prompt`; neither is set",
        );
    }
    let version = r.get("version").and_then(|v| scalar_text(v, "version", d));
    let author = r.get("author").and_then(|a| read_author(a, d));
    let activities = r
        .get("activities")
        .map(|a| string_list(a, "activities", d))
        .unwrap_or_default();
    let parameters = r
        .get("parameters")
        .map(|p| read_parameters(p, d))
        .unwrap_or_default();
    let extensions = r
        .get("extensions")
        .map(|e| read_extensions(e, d))
        .unwrap_or_default();
    let no_extensions = r
        .get("extensions")
        .and_then(Node::as_seq)
        .is_some_and(<[Node]>::is_empty);
    let settings = r
        .get("settings")
        .map(|s| read_settings(s, d))
        .unwrap_or_default();
    let response_schema = r.get("response").and_then(|s| read_response(s, d));
    let retry = r.get("retry").and_then(|s| read_retry(s, d));
    let dir = file
        .path()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let sub_recipes = r
        .get("sub_recipes")
        .map(|s| read_sub_recipes(s, &dir, d))
        .unwrap_or_default();
    r.finish(d);
    Some(Recipe {
        file: Arc::clone(file),
        title: title.unwrap_or_default(),
        description: description.unwrap_or_default(),
        instructions,
        prompt,
        activities,
        author,
        extensions,
        no_extensions,
        parameters,
        response_schema,
        retry,
        settings,
        sub_recipes,
        version,
        root,
        whole_text_template,
    })
}

/// A scalar's text; collections are an error naming the key.
fn scalar_text(node: &Node, key: &str, d: &mut FileDiags<'_>) -> Option<String> {
    match node.as_str() {
        Some(text) if node.as_map().is_none() && node.as_seq().is_none() => Some(text.to_owned()),
        _ => {
            d.error(
                node.pos,
                format!("`{key}` must be a string, found {}", node.kind_name()),
            );
            None
        }
    }
}

fn string_field(r: &mut MapReader<'_>, key: &str, d: &mut FileDiags<'_>) -> Option<String> {
    let path = r.child_path(key);
    r.get(key).and_then(|v| scalar_text(v, &path, d))
}

fn string_list(node: &Node, key: &str, d: &mut FileDiags<'_>) -> Vec<String> {
    match node.as_seq() {
        Some(items) => items
            .iter()
            .filter_map(|item| scalar_text(item, key, d))
            .collect(),
        None => match node.as_str() {
            Some(single) => vec![single.to_owned()],
            None => {
                d.error(
                    node.pos,
                    format!("`{key}` must be a list, found {}", node.kind_name()),
                );
                Vec::new()
            }
        },
    }
}

fn string_map(node: &Node, key: &str, d: &mut FileDiags<'_>) -> IndexMap<String, String> {
    let Some(entries) = node.as_map() else {
        d.error(
            node.pos,
            format!("`{key}` must be a mapping, found {}", node.kind_name()),
        );
        return IndexMap::new();
    };
    entries
        .iter()
        .filter_map(|(k, v)| {
            let name = k.as_str()?.to_owned();
            let value = if v.is_null() {
                String::new()
            } else {
                scalar_text(v, &format!("{key}.{name}"), d)?
            };
            Some((name, value))
        })
        .collect()
}

fn uint(node: &Node, key: &str, d: &mut FileDiags<'_>) -> Option<u64> {
    match node.to_json().as_u64() {
        Some(n) => Some(n),
        None => {
            d.error(
                node.pos,
                format!(
                    "`{key}` must be a whole number ≥ 0, found {}",
                    node.kind_name()
                ),
            );
            None
        }
    }
}

fn read_author(node: &Node, d: &mut FileDiags<'_>) -> Option<String> {
    if let Some(name) = node.as_str() {
        return Some(name.to_owned());
    }
    let mut r = MapReader::new(node, "author")?;
    let contact = string_field(&mut r, "contact", d);
    r.ignore(&["metadata"]);
    r.finish(d);
    contact
}

pub(crate) fn read_parameters(node: &Node, d: &mut FileDiags<'_>) -> Vec<Parameter> {
    let Some(items) = node.as_seq() else {
        d.error(
            node.pos,
            format!("`parameters` must be a list, found {}", node.kind_name()),
        );
        return Vec::new();
    };
    let mut out: Vec<Parameter> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let path = format!("parameters[{index}]");
        let Some(mut r) = MapReader::new(item, path.clone()) else {
            d.error(
                item.pos,
                format!("`{path}` must be a mapping with `key`, `input_type` and `requirement`"),
            );
            continue;
        };
        let key_node = r.get("key");
        // Without a key the entry is still checked, so every problem shows at once.
        let (key, has_key) = match key_node.and_then(|k| scalar_text(k, &format!("{path}.key"), d))
        {
            Some(key) => (key, true),
            None => {
                if key_node.is_none() {
                    d.error(item.pos, format!("`{path}` is missing `key`"));
                }
                (format!("#{}", index + 1), false)
            }
        };
        let pos = key_node.map_or(item.pos, |k| k.pos);
        let input_type = match r.get("input_type") {
            Some(t) => match t.as_str().and_then(InputType::from_name) {
                Some(input_type) => input_type,
                None => {
                    d.push(
                        crate::diag::Diagnostic::error(format!(
                            "parameter `{key}`: unknown input type `{}`",
                            t.as_str().unwrap_or("?")
                        ))
                        .at(d.span(t.pos))
                        .with_hint(format!("use one of {}", InputType::NAMES)),
                    );
                    InputType::String
                }
            },
            None => {
                d.warning(
                    pos,
                    format!("parameter `{key}` has no `input_type`; string is assumed"),
                );
                InputType::String
            }
        };
        let requirement = match r.get("requirement") {
            Some(t) => match t.as_str().and_then(Requirement::from_name) {
                Some(requirement) => requirement,
                None => {
                    d.error(t.pos, format!(
                        "parameter `{key}`: unknown requirement `{}`; use required, optional or user_prompt",
                        t.as_str().unwrap_or("?")
                    ));
                    Requirement::Required
                }
            },
            None => {
                d.warning(
                    pos,
                    format!("parameter `{key}` has no `requirement`; required is assumed"),
                );
                Requirement::Required
            }
        };
        let default_entry = r.get_entry("default").filter(|(_, v)| !v.is_null());
        let default_node = default_entry.map(|(_, v)| v);
        let mut default = default_node.and_then(|v| scalar_text(v, &format!("{path}.default"), d));
        if let (InputType::File, Some((key_node, _))) = (input_type, default_entry) {
            // goose refuses this too: a shared recipe could otherwise read any file of the
            // user's (`default: ~/.ssh/id_rsa`) into its prompt without being asked.
            d.error(
                key_node.pos,
                format!(
                    "file parameter `{key}` cannot have a default value, to avoid importing sensitive user files"
                ),
            );
            default = None;
        }
        let description = string_field(&mut r, "description", d).unwrap_or_default();
        let options_node = r.get("options");
        let options = options_node
            .map(|o| string_list(o, &format!("{path}.options"), d))
            .unwrap_or_default();
        r.finish(d);
        if requirement == Requirement::Optional && default_node.is_none() {
            d.warning(pos, format!(
                "optional parameter `{key}` has no default; it is empty unless given (goose rejects this)"
            ));
        }
        if let (Some(value), Some(node)) = (&default, default_node) {
            let wrong = match input_type {
                InputType::Number => value.trim().parse::<f64>().map_or(true, |n| !n.is_finite()),
                InputType::Boolean => {
                    !matches!(value.trim().to_ascii_lowercase().as_str(), "true" | "false")
                }
                _ => false,
            };
            if wrong {
                d.error(
                    node.pos,
                    format!(
                        "default `{value}` of {} parameter `{key}` is not a {}",
                        input_type.name(),
                        if input_type == InputType::Number {
                            "number"
                        } else {
                            "boolean (true or false)"
                        }
                    ),
                );
            }
        }
        if input_type == InputType::Select {
            if options.is_empty() {
                d.error(pos, format!("select parameter `{key}` needs `options`"));
            } else if let (Some(value), Some(node)) = (&default, default_node)
                && !options.contains(value)
            {
                d.error(
                    node.pos,
                    format!(
                        "default `{value}` of parameter `{key}` is not one of its options: {}",
                        options.join(", ")
                    ),
                );
            }
        } else if options_node.is_some() {
            d.warning(
                options_node.map_or(pos, |o| o.pos),
                format!(
                    "`options` only applies to select parameters; `{key}` is {}",
                    input_type.name()
                ),
            );
        }
        if !has_key {
            continue;
        }
        if out.iter().any(|p| p.key == key) {
            d.error(pos, format!("parameter `{key}` is declared twice"));
            continue;
        }
        out.push(Parameter {
            key,
            pos,
            input_type,
            requirement,
            default,
            description,
            options,
        });
    }
    out
}

fn read_extensions(node: &Node, d: &mut FileDiags<'_>) -> Vec<Extension> {
    let Some(items) = node.as_seq() else {
        d.error(
            node.pos,
            format!("`extensions` must be a list, found {}", node.kind_name()),
        );
        return Vec::new();
    };
    let mut out: Vec<Extension> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let path = format!("extensions[{index}]");
        if let Some(name) = item.as_str() {
            // Old cookbook files list extensions by display name ("Developer").
            d.warning(
                item.pos,
                format!(
                    "`{path}` is a plain string; read as the builtin extension `{}`",
                    name.to_lowercase()
                ),
            );
            out.push(Extension {
                name: name.to_lowercase(),
                pos: item.pos,
                kind: ExtensionKind::Builtin,
                args: Vec::new(),
                available_tools: Vec::new(),
                cmd: None,
                description: None,
                env_keys: Vec::new(),
                envs: IndexMap::new(),
                headers: IndexMap::new(),
                timeout_secs: None,
                uri: None,
                sandbox: None,
                network: false,
            });
            continue;
        }
        let Some(mut r) = MapReader::new(item, path.clone()) else {
            d.error(
                item.pos,
                format!("`{path}` must be a mapping with `type` and `name`"),
            );
            continue;
        };
        let type_node = r.get("type");
        let kind = match type_node.and_then(Node::as_str) {
            Some(kind) => ExtensionKind::from_name(kind),
            None => {
                d.error(item.pos, format!("`{path}` is missing `type`"));
                continue;
            }
        };
        let name_node = r.get("name");
        let Some(name) = name_node.and_then(|n| scalar_text(n, &format!("{path}.name"), d)) else {
            d.error(item.pos, format!("`{path}` is missing `name`"));
            continue;
        };
        let pos = name_node.map_or(item.pos, |n| n.pos);
        check_extension_name(&name, pos, &kind, &out, d);
        if kind == ExtensionKind::Sse {
            d.warning(
                type_node.map_or(item.pos, |n| n.pos),
                format!(
                    "extension `{name}`: `type: sse` is MCP's deprecated HTTP+SSE transport, \
                     which summon does not connect to; the extension is left out (use \
                     `streamable_http` if the server offers it)"
                ),
            );
        }
        let cmd = string_field(&mut r, "cmd", d);
        let args = r
            .get("args")
            .map(|a| string_list(a, &format!("{path}.args"), d))
            .unwrap_or_default();
        let envs = r
            .get("envs")
            .map(|e| string_map(e, &format!("{path}.envs"), d))
            .unwrap_or_default();
        let env_keys = r
            .get("env_keys")
            .map(|e| string_list(e, &format!("{path}.env_keys"), d))
            .unwrap_or_default();
        let headers = r
            .get("headers")
            .map(|e| string_map(e, &format!("{path}.headers"), d))
            .unwrap_or_default();
        let uri = string_field(&mut r, "uri", d);
        let timeout_secs = r
            .get("timeout")
            .and_then(|t| uint(t, &format!("{path}.timeout"), d));
        let available_tools = r
            .get("available_tools")
            .map(|a| string_list(a, &format!("{path}.available_tools"), d))
            .unwrap_or_default();
        let description = string_field(&mut r, "description", d);
        let sandbox = r.get("sandbox").and_then(|node| {
            let policy = node.as_str().and_then(crate::sandbox::Policy::parse);
            if policy.is_none() {
                d.error(
                    node.pos,
                    format!(
                        "`{path}.sandbox` must be `workspace-write`, `read-only` or `off`, found {}",
                        node.as_str().map_or_else(|| node.kind_name().to_owned(), |t| format!("`{t}`"))
                    ),
                );
            }
            policy
        });
        let network = match r.get("network").map(|n| (n, n.as_str())) {
            None | Some((_, Some("false"))) => false,
            Some((_, Some("true"))) => true,
            Some((node, _)) => {
                d.error(node.pos, format!("`{path}.network` must be true or false"));
                false
            }
        };
        r.ignore(&[
            "bundled",
            "display_name",
            "code",
            "dependencies",
            "tools",
            "instructions",
        ]);
        r.finish(d);
        match kind {
            ExtensionKind::Stdio if cmd.is_none() => {
                d.error(pos, format!("stdio extension `{name}` needs `cmd`"));
            }
            ExtensionKind::StreamableHttp | ExtensionKind::Sse if uri.is_none() => {
                d.error(pos, format!("extension `{name}` needs `uri`"));
            }
            _ => {}
        }
        out.push(Extension {
            name,
            pos,
            kind,
            args,
            available_tools,
            cmd,
            description,
            env_keys,
            envs,
            headers,
            timeout_secs,
            uri,
            sandbox,
            network,
        });
    }
    out
}

/// An extension's name starts the names its tools are offered under (`<name>__<tool>`), so
/// it must be one providers accept there, and only one extension may have it.
fn check_extension_name(
    name: &str,
    pos: Pos,
    kind: &ExtensionKind,
    earlier: &[Extension],
    d: &mut FileDiags<'_>,
) {
    let server = matches!(
        kind,
        ExtensionKind::Stdio | ExtensionKind::StreamableHttp | ExtensionKind::Sse
    );
    if server && !crate::provider::tool_name::is_valid_prefix(name) {
        d.error(
            pos,
            format!(
                "extension name `{name}` cannot start a tool name: use letters, digits, `_` \
                 and `-` only, at most 60 of them"
            ),
        );
    }
    if let Some(first) = earlier.iter().find(|e| e.name == name) {
        d.error(
            pos,
            format!(
                "extension `{name}` is listed twice (first at line {}): one name per extension",
                first.pos.line
            ),
        );
    }
}

fn read_settings(node: &Node, d: &mut FileDiags<'_>) -> Settings {
    let Some(mut r) = MapReader::new(node, "settings") else {
        d.error(
            node.pos,
            format!("`settings` must be a mapping, found {}", node.kind_name()),
        );
        return Settings::default();
    };
    let goose_provider = string_field(&mut r, "goose_provider", d);
    let provider = string_field(&mut r, "provider", d);
    let goose_model = string_field(&mut r, "goose_model", d);
    let model = string_field(&mut r, "model", d);
    let temperature = r
        .get("temperature")
        .and_then(|t| match t.to_json().as_f64() {
            Some(value) if (0.0..=2.0).contains(&value) => Some(value),
            _ => {
                d.error(
                    t.pos,
                    "`settings.temperature` must be a number between 0 and 2",
                );
                None
            }
        });
    let max_turns = r.get("max_turns").and_then(|t| match t.to_json().as_u64() {
        Some(n) if n >= 1 => u32::try_from(n).ok(),
        _ => {
            d.error(t.pos, "`settings.max_turns` must be a whole number ≥ 1");
            None
        }
    });
    let stop = r
        .get("stop")
        .map(|node| stop_sequences(node, "settings.stop", d))
        .unwrap_or_default();
    r.finish(d);
    Settings {
        provider: goose_provider.or(provider),
        model: goose_model.or(model),
        temperature,
        max_turns,
        stop,
    }
}

/// The most stop sequences a request may carry (OpenAI's limit).
pub(crate) const MAX_STOP_SEQUENCES: usize = 4;

/// `stop`: a string or a list of at most [`MAX_STOP_SEQUENCES`] strings, none empty.
pub(crate) fn stop_sequences(node: &Node, path: &str, d: &mut FileDiags<'_>) -> Vec<String> {
    let items: Vec<&Node> = match node.as_seq() {
        Some(items) => items.iter().collect(),
        None => vec![node],
    };
    if items.len() > MAX_STOP_SEQUENCES {
        d.error(
            node.pos,
            format!(
                "`{path}` lists {} sequences; providers take at most {MAX_STOP_SEQUENCES}",
                items.len()
            ),
        );
        return Vec::new();
    }
    let mut out = Vec::new();
    for item in items {
        match item.as_str() {
            Some("") => d.error(item.pos, format!("`{path}` must not be an empty string")),
            Some(text) => out.push(text.to_owned()),
            None => d.error(
                item.pos,
                format!(
                    "`{path}` must be a string or a list of strings, found {}",
                    item.kind_name()
                ),
            ),
        }
    }
    out
}

fn read_response(node: &Node, d: &mut FileDiags<'_>) -> Option<serde_json::Value> {
    let mut r = MapReader::new(node, "response")?;
    let schema_node = r.get("json_schema");
    r.finish(d);
    let schema_node = schema_node?;
    let schema = schema_node.to_json();
    if !schema.is_object() {
        d.error(
            schema_node.pos,
            "`response.json_schema` must be a JSON Schema object",
        );
        return None;
    }
    if let Err(error) = jsonschema::validator_for(&schema) {
        d.error(
            schema_node.pos,
            format!("`response.json_schema` is not a valid schema: {error}"),
        );
        return None;
    }
    Some(schema)
}

/// goose's `retry`, with goose's validation: `max_retries` and `checks` are required,
/// `max_retries` and the timeouts (when given) must be greater than 0.
fn read_retry(node: &Node, d: &mut FileDiags<'_>) -> Option<RetryConfig> {
    let Some(mut r) = MapReader::new(node, "retry") else {
        d.error(node.pos, "`retry` must be a mapping");
        return None;
    };
    let max_retries = match r.get_entry("max_retries").filter(|(_, v)| !v.is_null()) {
        Some((key, n)) => uint(n, "retry.max_retries", d)
            .and_then(|n| positive(n, key, "retry.max_retries", "", d))
            .and_then(|n| match u32::try_from(n) {
                Ok(n) => Some(n),
                Err(_) => {
                    d.error(key.pos, "`retry.max_retries` is too large");
                    None
                }
            }),
        None => {
            d.error(node.pos, "`retry` is missing `max_retries`");
            None
        }
    };
    let checks = match r.get_entry("checks").filter(|(_, v)| !v.is_null()) {
        Some((key, list)) => read_checks(key, list, d),
        None => {
            d.error(node.pos, "`retry` is missing `checks`");
            None
        }
    };
    let on_failure = string_field(&mut r, "on_failure", d);
    let mut timeout = |r: &mut MapReader<'_>, name: &str| {
        let path = format!("retry.{name}");
        let (key, value) = r.get_entry(name).filter(|(_, v)| !v.is_null())?;
        uint(value, &path, d).and_then(|n| positive(n, key, &path, " if specified", d))
    };
    let timeout_secs = timeout(&mut r, "timeout_seconds");
    let on_failure_timeout_secs = timeout(&mut r, "on_failure_timeout_seconds");
    r.finish(d);
    Some(RetryConfig {
        max_retries: max_retries?,
        checks: checks?,
        on_failure,
        timeout_secs,
        on_failure_timeout_secs,
    })
}

/// `n` when it is greater than 0; otherwise goose's refusal, at the key.
fn positive(n: u64, key: &Node, path: &str, when: &str, d: &mut FileDiags<'_>) -> Option<u64> {
    if n == 0 {
        d.error(key.pos, format!("`{path}` must be greater than 0{when}"));
        return None;
    }
    Some(n)
}

/// `retry.checks`: a list of `{type: shell, command}`. An empty list is valid, as in goose,
/// but then nothing is ever retried.
fn read_checks(key: &Node, list: &Node, d: &mut FileDiags<'_>) -> Option<Vec<String>> {
    let Some(items) = list.as_seq() else {
        d.error(
            key.pos,
            format!("`retry.checks` must be a list, found {}", list.kind_name()),
        );
        return None;
    };
    if items.is_empty() {
        d.warning(
            key.pos,
            "`retry.checks` is empty: no check can fail, so the task is never retried",
        );
    }
    let mut checks = Vec::new();
    for (index, check) in items.iter().enumerate() {
        let path = format!("retry.checks[{index}]");
        let Some(mut c) = MapReader::new(check, path.clone()) else {
            d.error(
                check.pos,
                format!("`{path}` must be a mapping with `type: shell` and `command`"),
            );
            continue;
        };
        if let Some(kind) = c.get("type").and_then(Node::as_str)
            && kind != "shell"
        {
            d.error(
                check.pos,
                format!("`{path}`: only `shell` checks exist, not `{kind}`"),
            );
        }
        match string_field(&mut c, "command", d) {
            Some(command) => checks.push(command),
            None => d.error(check.pos, format!("`{path}` is missing `command`")),
        }
        c.finish(d);
    }
    Some(checks)
}

fn read_sub_recipes(node: &Node, dir: &Path, d: &mut FileDiags<'_>) -> Vec<SubRecipe> {
    let Some(items) = node.as_seq() else {
        d.error(
            node.pos,
            format!("`sub_recipes` must be a list, found {}", node.kind_name()),
        );
        return Vec::new();
    };
    let mut out: Vec<SubRecipe> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let path = format!("sub_recipes[{index}]");
        let Some(mut r) = MapReader::new(item, path.clone()) else {
            d.error(
                item.pos,
                format!("`{path}` must be a mapping with `name` and `path`"),
            );
            continue;
        };
        let name_node = r.get("name");
        let name = name_node.and_then(|n| scalar_text(n, &format!("{path}.name"), d));
        let path_node = r.get("path");
        let raw_path = path_node.and_then(|p| scalar_text(p, &format!("{path}.path"), d));
        let description = string_field(&mut r, "description", d);
        let values = r
            .get("values")
            .map(|v| string_map(v, &format!("{path}.values"), d))
            .unwrap_or_default();
        r.ignore(&["sequential_when_repeated"]);
        r.finish(d);
        let (Some(name), Some(raw_path), Some(path_node)) = (name, raw_path, path_node) else {
            d.error(item.pos, format!("`{path}` needs both `name` and `path`"));
            continue;
        };
        let pos = name_node.map_or(item.pos, |n| n.pos);
        let resolved = match resolve_sub_recipe_path(&raw_path, dir) {
            Ok(resolved) => resolved,
            Err(message) => {
                d.error(path_node.pos, format!("sub-recipe `{name}`: {message}"));
                continue;
            }
        };
        if !resolved.is_file() {
            d.error(
                path_node.pos,
                format!(
                    "sub-recipe `{name}`: file `{}` not found",
                    resolved.display()
                ),
            );
            continue;
        }
        if out.iter().any(|s| s.name == name) {
            d.error(pos, format!("sub-recipe `{name}` is declared twice"));
            continue;
        }
        out.push(SubRecipe {
            name,
            pos,
            path: resolved,
            description,
            values,
        });
    }
    out
}

/// A sub-recipe path: `{{ recipe_dir }}` expanded, relative paths joined to the recipe's
/// directory.
fn resolve_sub_recipe_path(raw: &str, dir: &Path) -> Result<std::path::PathBuf, String> {
    let text = if template::has_template(raw) {
        let env = template::environment(None);
        let ctx =
            minijinja::context! { recipe_dir => template::dir_value(dir).display().to_string() };
        template::render(&env, raw, &ctx)
            .map_err(|e| format!("cannot expand `{raw}`: {}", e.message))?
    } else {
        raw.to_owned()
    };
    let path = Path::new(text.trim());
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        dir.join(path)
    };
    Ok(joined
        .components()
        .filter(|c| *c != std::path::Component::CurDir)
        .collect())
}
