//! Reads a [`Pipeline`] (SPEC §6, format version 1) from its YAML file and validates it,
//! reporting every problem with its position in one pass: the shape of every key, exactly one
//! kind per step, templates that compile and read only what exists, step references, `needs`,
//! `over`, and dependency cycles.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use indexmap::IndexMap;

use super::duration::{from_seconds, parse_duration};
use super::graph::{self, Graph};
use super::items::StaticForm;
use super::model::{
    Backend, DECOMPOSE_AGENT_KEYS, DECOMPOSE_FORMS, Decompose, FanOut, MinSuccess, OnError,
    OnExtensionError, OutputBody, OutputFile, Pipeline, PipelineSettings, Reduce, Step, StepKind,
    TABLE_VARIABLES, Table, TableFormat, TaskTemplate, Template,
};
use super::refs;
use crate::diag::suggestions;
use crate::diag::{Diagnostic, Diagnostics, FileDiags, Pos, SourceFile};
use crate::recipe::read_parameters;
use crate::sandbox::Policy;
use crate::template;
use crate::yaml::{self, MapReader, Node, ScalarStyle, Value};

/// The step kinds; a step has exactly one.
const KINDS: [&str; 4] = ["decompose", "fan_out", "synthesize", "delegate"];
const KINDS_TEXT: &str = "`decompose`, `fan_out`, `synthesize`, `delegate`";
/// Template variables every template may read besides the parameters.
const GLOBAL_VARIABLES: [&str; 2] = ["steps", "agents"];
/// Template variables only a fan_out step's templates may read.
const FAN_OUT_VARIABLES: [&str; 2] = ["item", "loop"];

/// Whether a parsed YAML document is a pipeline rather than a recipe: a mapping with `steps`
/// and no `title`.
pub(crate) fn looks_like_pipeline(root: &Node) -> bool {
    root.as_map().is_some() && root.get("steps").is_some() && root.get("title").is_none()
}

/// For `summon validate`: if `file` is a pipeline, parses and validates it into `diags` and
/// returns `Some` with the pipeline when it has no error; otherwise returns `None` and reports
/// nothing.
pub(crate) fn validate_if_pipeline(
    file: &Arc<SourceFile>,
    diags: &mut Diagnostics,
) -> Option<Option<Pipeline>> {
    let is_pipeline = match yaml::parse(&file.text) {
        Ok(Some(root)) => looks_like_pipeline(&root),
        Ok(None) => false,
        // broken YAML: judged by its top-level keys, so the error is told in pipeline terms
        Err(_) => {
            let has_key = |key: &str| file.text.lines().any(|l| l.starts_with(key));
            has_key("steps:") && !has_key("title:")
        }
    };
    is_pipeline.then(|| parse_pipeline(file, diags))
}

/// Parses and validates a pipeline file. Every problem goes to `diags`; `None` when any of
/// them is an error.
pub(crate) fn parse_pipeline(file: &Arc<SourceFile>, diags: &mut Diagnostics) -> Option<Pipeline> {
    let mut local = Diagnostics::default();
    let pipeline = read_file(file, &mut local.for_file(file));
    // A misspelt key (`on_eror`) would silently change what runs: in a pipeline, summon's
    // own format, an unknown key is an error (recipes and agents, shared with other tools,
    // keep it a warning).
    for d in &mut local.items {
        if d.message.starts_with("unknown key ") {
            d.severity = crate::diag::Severity::Error;
        }
    }
    let ok = !local.has_errors();
    diags.extend(local);
    pipeline.filter(|_| ok)
}

fn read_file(file: &Arc<SourceFile>, d: &mut FileDiags<'_>) -> Option<Pipeline> {
    let root = match yaml::parse(&file.text) {
        Ok(Some(root)) => root,
        Ok(None) => {
            d.error(
                Pos::new(1, 1, 1),
                "the file is empty; a pipeline needs `version: 1` and `steps`",
            );
            return None;
        }
        Err(syntax) => {
            let mut diagnostic = Diagnostic::error(format!("invalid YAML: {}", syntax.message))
                .at(d.span(syntax.pos));
            let near = (syntax.pos.line.saturating_sub(1)..=syntax.pos.line)
                .filter_map(|line| file.line_text(line))
                .any(|line| line.contains(": {{") || line.contains("- {{"));
            if near {
                diagnostic = diagnostic.with_hint(QUOTE_HINT);
            }
            d.push(diagnostic);
            return None;
        }
    };
    let Some(mut r) = MapReader::new(&root, "") else {
        d.error(
            root.pos,
            format!("a pipeline must be a mapping, found {}", root.kind_name()),
        );
        return None;
    };
    read_version(&mut r, d);
    let name = string_field(&mut r, "name", d).unwrap_or_else(|| file_stem(file.path()));
    let description = string_field(&mut r, "description", d).unwrap_or_default();
    let parameters = r
        .get("parameters")
        .map(|p| read_parameters(p, d))
        .unwrap_or_default();
    let settings = r
        .get("settings")
        .map(|s| read_settings(s, d))
        .unwrap_or_default();
    let (steps, kinds_known) = read_steps(r.get_entry("steps"), d);
    let outputs = r
        .get("outputs")
        .map(|o| read_outputs(o, d))
        .unwrap_or_default();
    r.finish(d);
    let mut pipeline = Pipeline {
        file: Arc::clone(file),
        name,
        description,
        parameters,
        settings,
        steps,
        outputs,
    };
    resolve_over(&mut pipeline);
    check(&pipeline, &kinds_known, d);
    Some(pipeline)
}

/// Each fan-out's `over` as the index of the step it names.
fn resolve_over(pipeline: &mut Pipeline) {
    let index: HashMap<String, usize> = pipeline
        .steps
        .iter()
        .enumerate()
        .map(|(i, s)| (s.id.clone(), i))
        .collect();
    for step in &mut pipeline.steps {
        if let StepKind::FanOut(fan_out) = &mut step.kind {
            fan_out.over_step = index.get(&fan_out.over).copied();
        }
    }
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn read_version(r: &mut MapReader<'_>, d: &mut FileDiags<'_>) {
    match r.get_entry("version") {
        None => d.error(
            Pos::new(1, 1, 1),
            "missing `version: 1`: a pipeline names its format version (this summon reads version 1)",
        ),
        Some((_, value)) => {
            if value.to_json() != serde_json::json!(1) && value.as_str() != Some("1") {
                d.error(
                    value.pos,
                    format!(
                        "unsupported pipeline `version` {}: this summon reads version 1",
                        describe(value)
                    ),
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Scalars and numbers

/// How a value is shown in a message: a scalar as written, a collection by its kind.
fn describe(node: &Node) -> String {
    match node.as_str() {
        Some(text) => format!("`{text}`"),
        None => node.kind_name().to_owned(),
    }
}

fn scalar_text(node: &Node, path: &str, d: &mut FileDiags<'_>) -> Option<String> {
    match node.as_str() {
        Some(text) => Some(text.to_owned()),
        None => {
            d.error(
                node.pos,
                format!("`{path}` must be a string, found {}", node.kind_name()),
            );
            None
        }
    }
}

fn string_field(r: &mut MapReader<'_>, key: &str, d: &mut FileDiags<'_>) -> Option<String> {
    let path = r.child_path(key);
    r.get(key).and_then(|v| scalar_text(v, &path, d))
}

/// A string that is rendered later, with where it was written.
fn template(node: &Node, path: &str, d: &mut FileDiags<'_>) -> Option<Template> {
    match &node.value {
        Value::Scalar(text, style) if !node.is_null() => {
            let block = *style == ScalarStyle::Block;
            let pos = if block {
                block_indicator_pos(&d.file, node.pos, text)
            } else {
                node.pos
            };
            Some(Template {
                text: text.clone(),
                pos,
                block,
            })
        }
        _ => {
            let mut diagnostic = Diagnostic::error(format!(
                "`{path}` must be a string (a template), found {}",
                node.kind_name()
            ))
            .at(d.span(node.pos));
            if starts_unquoted_template(&d.file, node.pos) {
                diagnostic = diagnostic.with_hint(QUOTE_HINT);
            }
            d.push(diagnostic);
            None
        }
    }
}

const QUOTE_HINT: &str =
    "YAML reads an unquoted `{{ ... }}` as a mapping: quote the template, `\"{{ item }}\"`";

/// Whether the text at `pos` is an unquoted `{{` (which YAML reads as a flow mapping).
fn starts_unquoted_template(file: &SourceFile, pos: Pos) -> bool {
    file.line_text(pos.line).is_some_and(|line| {
        let rest: String = line
            .chars()
            .skip(usize::try_from(pos.col.saturating_sub(1)).unwrap_or(0))
            .collect();
        rest.starts_with("{{") || rest.starts_with("{%")
    })
}

/// The YAML tree places a block scalar at its first non-blank content line; a [`Template`]
/// is placed at the `|`/`>` indicator, the line before its text.
fn block_indicator_pos(file: &SourceFile, content: Pos, text: &str) -> Pos {
    let blank_lines = text.chars().take_while(|&c| c == '\n').count();
    let line = content
        .line
        .saturating_sub(u32::try_from(blank_lines).unwrap_or(0) + 1)
        .max(1);
    let col = file
        .line_text(line)
        .and_then(|l| {
            let code = l.split(" #").next().unwrap_or(l);
            code.rfind(['|', '>'])
                .map(|b| code[..b].chars().count() + 1)
        })
        .unwrap_or(1);
    Pos::new(line, u32::try_from(col).unwrap_or(1), 1)
}

fn template_field(r: &mut MapReader<'_>, key: &str, d: &mut FileDiags<'_>) -> Option<Template> {
    let path = r.child_path(key);
    r.get(key).and_then(|v| template(v, &path, d))
}

fn whole_number(node: &Node, path: &str, min: u64, d: &mut FileDiags<'_>) -> Option<u64> {
    match node.to_json().as_u64() {
        Some(n) if n >= min => Some(n),
        _ => {
            d.error(
                node.pos,
                format!(
                    "`{path}` must be a whole number ≥ {min}, found {}",
                    describe(node)
                ),
            );
            None
        }
    }
}

fn count_field<T: TryFrom<u64>>(
    r: &mut MapReader<'_>,
    key: &str,
    min: u64,
    d: &mut FileDiags<'_>,
) -> Option<T> {
    let path = r.child_path(key);
    r.get(key)
        .and_then(|v| whole_number(v, &path, min, d))
        .and_then(|n| T::try_from(n).ok())
}

fn bool_field(r: &mut MapReader<'_>, key: &str, d: &mut FileDiags<'_>) -> Option<bool> {
    let path = r.child_path(key);
    let node = r.get(key)?;
    let value = node.to_json().as_bool();
    if value.is_none() {
        d.error(
            node.pos,
            format!("`{path}` must be true or false, found {}", describe(node)),
        );
    }
    value
}

/// `tier: standard | flex | priority | batch`.
fn tier_field(r: &mut MapReader<'_>, d: &mut FileDiags<'_>) -> Option<(crate::config::Tier, Pos)> {
    use crate::config::Tier;
    choice(
        r,
        "tier",
        &[
            ("standard", Tier::Standard),
            ("flex", Tier::Flex),
            ("priority", Tier::Priority),
            ("batch", Tier::Batch),
        ],
        d,
    )
}

/// `flex_fallback: standard` (true) or `none` (false).
fn flex_fallback_field(r: &mut MapReader<'_>, d: &mut FileDiags<'_>) -> Option<bool> {
    choice(
        r,
        "flex_fallback",
        &[("standard", true), ("none", false)],
        d,
    )
    .map(|(v, _)| v)
}

/// A spend cap: a number of US dollars above 0.
fn usd_field(r: &mut MapReader<'_>, key: &str, d: &mut FileDiags<'_>) -> Option<f64> {
    let path = r.child_path(key);
    let node = r.get(key)?;
    match node.to_json().as_f64() {
        Some(value) if value > 0.0 && value.is_finite() => Some(value),
        _ => {
            d.error(
                node.pos,
                format!(
                    "`{path}` must be a number of US dollars above 0, found {}",
                    describe(node)
                ),
            );
            None
        }
    }
}

fn temperature_field(r: &mut MapReader<'_>, d: &mut FileDiags<'_>) -> Option<f64> {
    let path = r.child_path("temperature");
    let node = r.get("temperature")?;
    match node.to_json().as_f64() {
        Some(value) if (0.0..=2.0).contains(&value) => Some(value),
        _ => {
            d.error(
                node.pos,
                format!(
                    "`{path}` must be a number between 0 and 2, found {}",
                    describe(node)
                ),
            );
            None
        }
    }
}

/// One of a fixed set of words.
fn choice<T: Copy>(
    r: &mut MapReader<'_>,
    key: &str,
    choices: &[(&str, T)],
    d: &mut FileDiags<'_>,
) -> Option<(T, Pos)> {
    let path = r.child_path(key);
    let node = r.get(key)?;
    let found = node
        .as_str()
        .and_then(|text| choices.iter().find(|(name, _)| *name == text));
    match found {
        Some((_, value)) => Some((*value, node.pos)),
        None => {
            let names: Vec<String> = choices.iter().map(|(n, _)| format!("`{n}`")).collect();
            d.error(
                node.pos,
                format!(
                    "`{path}` must be {}, found {}",
                    names.join(" or "),
                    describe(node)
                ),
            );
            None
        }
    }
}

/// `sandbox:` — the policy of the model's shell commands.
fn sandbox_field(r: &mut MapReader<'_>, d: &mut FileDiags<'_>) -> Option<Policy> {
    let choices = [
        ("workspace-write", Policy::WorkspaceWrite),
        ("read-only", Policy::ReadOnly),
        ("off", Policy::Off),
    ];
    choice(r, "sandbox", &choices, d).map(|(policy, _)| policy)
}

// ---------------------------------------------------------------------------------------
// Settings, steps, outputs

fn read_settings(node: &Node, d: &mut FileDiags<'_>) -> PipelineSettings {
    let Some(mut r) = MapReader::new(node, "settings") else {
        d.error(
            node.pos,
            format!("`settings` must be a mapping, found {}", node.kind_name()),
        );
        return PipelineSettings::default();
    };
    let settings = PipelineSettings {
        provider: string_field(&mut r, "provider", d),
        model: string_field(&mut r, "model", d),
        temperature: temperature_field(&mut r, d),
        max_turns: count_field(&mut r, "max_turns", 1, d),
        max_output_tokens: count_field(&mut r, "max_output_tokens", 1, d),
        stop: r
            .get("stop")
            .map(|node| crate::recipe::stop_sequences(node, "settings.stop", d))
            .unwrap_or_default(),
        concurrency: count_field(&mut r, "concurrency", 1, d),
        max_cost: usd_field(&mut r, "max_cost", d),
        tier: tier_field(&mut r, d),
        flex_fallback: flex_fallback_field(&mut r, d),
        sandbox: sandbox_field(&mut r, d),
        network: bool_field(&mut r, "network", d),
    };
    r.finish(d);
    settings
}

/// The steps, and for each whether its kind was given exactly once (so that checks about
/// other steps' kinds do not pile up on a broken step).
fn read_steps(entry: Option<(&Node, &Node)>, d: &mut FileDiags<'_>) -> (Vec<Step>, Vec<bool>) {
    let mut steps: Vec<Step> = Vec::new();
    let mut known = Vec::new();
    let Some((key, node)) = entry else {
        d.error(
            Pos::new(1, 1, 1),
            "missing `steps`: a pipeline needs at least one step",
        );
        return (steps, known);
    };
    let items = match node.as_seq() {
        Some(items) if !items.is_empty() => items,
        Some(_) => {
            d.error(
                node.pos,
                "`steps` is empty: a pipeline needs at least one step",
            );
            return (steps, known);
        }
        None if node.is_null() => {
            d.error(
                key.pos,
                "`steps` is empty: a pipeline needs at least one step",
            );
            return (steps, known);
        }
        None => {
            d.error(
                node.pos,
                format!(
                    "`steps` must be a list of steps, found {}",
                    node.kind_name()
                ),
            );
            return (steps, known);
        }
    };
    for (index, item) in items.iter().enumerate() {
        if let Some((step, kind_known)) = read_step(index, item, &steps, d) {
            steps.push(step);
            known.push(kind_known);
        }
    }
    (steps, known)
}

/// Whether a step id can be written as `steps.<id>` in a template.
fn is_valid_id(id: &str) -> bool {
    let mut chars = id.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `my-step` → `my_step`, `1st` → `_1st`.
fn suggested_id(id: &str) -> String {
    let mut out: String = id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if !out.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        out.insert(0, '_');
    }
    out
}

/// How a step is named in messages: by its id, or by its place when it has none.
fn step_label(id: &str, path: &str) -> String {
    if id.is_empty() {
        format!("`{path}`")
    } else {
        format!("step `{id}`")
    }
}

fn read_step(
    index: usize,
    node: &Node,
    earlier: &[Step],
    d: &mut FileDiags<'_>,
) -> Option<(Step, bool)> {
    let path = format!("steps[{index}]");
    let Some(mut r) = MapReader::new(node, path.clone()) else {
        d.error(
            node.pos,
            format!(
                "`{path}` must be a mapping with `id` and one of {KINDS_TEXT}, found {}",
                node.kind_name()
            ),
        );
        return None;
    };
    let (id, pos) = read_id(&mut r, node, &path, earlier, d);
    let label = step_label(&id, &path);
    let mut kinds: Vec<(&str, &Node, &Node)> = KINDS
        .iter()
        .filter_map(|&kind| r.get_entry(kind).map(|(k, v)| (kind, k, v)))
        .collect();
    kinds.sort_by_key(|(_, k, _)| (k.pos.line, k.pos.col));
    match kinds.as_slice() {
        [] => {
            let mut diagnostic = Diagnostic::error(format!(
                "{label} has no kind: set exactly one of {KINDS_TEXT}"
            ))
            .at(d.span(pos));
            let misplaced = DECOMPOSE_AGENT_KEYS
                .into_iter()
                .chain(["over"])
                .chain(DECOMPOSE_FORMS)
                .find(|key| node.get(key).is_some());
            if let Some(key) = misplaced {
                diagnostic = diagnostic.with_hint(format!(
                    "`{key}` goes under the kind: `delegate: {{ {key}: ... }}` runs one task, `fan_out` one per item, `decompose` lists items"
                ));
            }
            d.push(diagnostic);
        }
        [_] => {}
        [_, second, ..] => {
            let names: Vec<String> = kinds.iter().map(|(k, _, _)| format!("`{k}`")).collect();
            let listed = if kinds.len() == 2 {
                format!("both {} and {}", names[0], names[1])
            } else {
                format!(
                    "{} and {}",
                    names[..names.len() - 1].join(", "),
                    names[names.len() - 1]
                )
            };
            d.error(
                second.1.pos,
                format!("{label} has {listed}; a step has exactly one of {KINDS_TEXT}"),
            );
        }
    }
    let kind = match kinds.first() {
        Some(&(kind, key, value)) => {
            let kind_path = format!("{path}.{kind}");
            match kind {
                "decompose" => StepKind::Decompose(read_decompose(key, value, &kind_path, d)),
                "fan_out" => StepKind::FanOut(read_fan_out(key, value, &kind_path, d)),
                "synthesize" => StepKind::Synthesize(read_task_body(key, value, &kind_path, d)),
                _ => StepKind::Delegate(read_task_body(key, value, &kind_path, d)),
            }
        }
        None => StepKind::Delegate(TaskTemplate::default()),
    };
    let kind_known = kinds.len() == 1;
    let is_fan_out = matches!(kind, StepKind::FanOut(_));
    let needs = r
        .get("needs")
        .map(|n| read_needs(n, &format!("{path}.needs"), d))
        .unwrap_or_default();
    let concurrency = count_field(&mut r, "concurrency", 1, d);
    let on_error = choice(
        &mut r,
        "on_error",
        &[
            ("fail_fast", OnError::FailFast),
            ("continue", OnError::Continue),
        ],
        d,
    )
    .map(|(v, _)| v)
    .unwrap_or_default();
    let min_success = match r.get_entry("min_success") {
        Some((key, value)) if !value.is_null() => {
            if kind_known && !is_fan_out {
                d.error(
                    key.pos,
                    format!(
                        "`min_success` applies only to fan_out steps; {label} is a {} step",
                        kind.name()
                    ),
                );
            }
            read_min_success(value, &format!("{path}.min_success"), d)
        }
        _ => None,
    };
    let retries = count_field(&mut r, "retries", 0, d).unwrap_or(0);
    let timeout = r
        .get("timeout")
        .and_then(|t| read_timeout(t, &format!("{path}.timeout"), d));
    let provider = string_field(&mut r, "provider", d);
    let model = string_field(&mut r, "model", d);
    let temperature = temperature_field(&mut r, d);
    let max_turns = count_field(&mut r, "max_turns", 1, d);
    let max_output_tokens = count_field(&mut r, "max_output_tokens", 1, d);
    let stop = r
        .get("stop")
        .map(|node| crate::recipe::stop_sequences(node, &format!("{path}.stop"), d));
    let allow_empty = bool_field(&mut r, "allow_empty", d).unwrap_or(false);
    let backend = match choice(
        &mut r,
        "backend",
        &[("live", Backend::Live), ("batch", Backend::Batch)],
        d,
    ) {
        Some((Backend::Batch, pos)) if kind_known && !is_fan_out => {
            d.error(
                pos,
                format!(
                    "`backend: batch` applies only to fan_out steps; {label} is a {} step",
                    kind.name()
                ),
            );
            Backend::Live
        }
        Some((backend, _)) => backend,
        None => Backend::Live,
    };
    let tier = tier_field(&mut r, d);
    let backend = match tier {
        Some((crate::config::Tier::Batch, pos)) if kind_known && !is_fan_out => {
            d.error(
                pos,
                format!(
                    "`tier: batch` applies only to fan_out steps; {label} is a {} step",
                    kind.name()
                ),
            );
            backend
        }
        // `tier: batch` is `backend: batch`.
        Some((crate::config::Tier::Batch, _)) => Backend::Batch,
        _ => backend,
    };
    let flex_fallback = flex_fallback_field(&mut r, d);
    let reuse = bool_field(&mut r, "reuse", d).unwrap_or(false);
    let sandbox = sandbox_field(&mut r, d);
    let network = bool_field(&mut r, "network", d);
    let on_extension_error = choice(
        &mut r,
        "on_extension_error",
        &[
            ("warn", OnExtensionError::Warn),
            ("fail", OnExtensionError::Fail),
        ],
        d,
    )
    .map(|(v, _)| v)
    .unwrap_or_default();
    let context_window = count_field(&mut r, "context_window", 1, d);
    let is_synthesize = !kind_known || matches!(kind, StepKind::Synthesize(_));
    let reduce = read_reduce(&mut r, is_synthesize, &label, kind.name(), d);
    let cache = bool_field(&mut r, "cache", d);
    let tools = r
        .get("tools")
        .map(|t| read_step_tools(t, &format!("{path}.tools"), d));
    if kind_known {
        warn_kind_keys(&mut r, &path, kind.name(), d);
    }
    r.finish(d);
    Some((
        Step {
            id,
            pos,
            kind,
            needs,
            concurrency,
            on_error,
            min_success,
            retries,
            timeout,
            provider,
            model,
            temperature,
            max_turns,
            max_output_tokens,
            stop,
            allow_empty,
            backend,
            tier,
            flex_fallback,
            reuse,
            sandbox,
            network,
            on_extension_error,
            context_window,
            reduce,
            cache,
            tools,
        },
        kind_known,
    ))
}

/// `reduce: auto`, `chunk_tokens: N` and `reduce_instructions`: a synthesize step's
/// hierarchical reduction (`chunk_tokens` alone asks for it too).
fn read_reduce(
    r: &mut MapReader<'_>,
    is_synthesize: bool,
    label: &str,
    kind: &str,
    d: &mut FileDiags<'_>,
) -> Option<Reduce> {
    let mut first: Option<Pos> = None;
    for key in ["reduce", "chunk_tokens", "reduce_instructions"] {
        if let Some((node, _)) = r.get_entry(key) {
            if !is_synthesize {
                d.error(
                    node.pos,
                    format!("`{key}` applies only to synthesize steps; {label} is a {kind} step"),
                );
            }
            first = first.or(Some(node.pos));
        }
    }
    let auto = choice(r, "reduce", &[("auto", ())], d);
    let chunk_tokens = count_field(r, "chunk_tokens", 1, d);
    let instructions_key = r.get_entry("reduce_instructions").map(|(k, _)| k.pos);
    let instructions = template_field(r, "reduce_instructions", d);
    if auto.is_none() && chunk_tokens.is_none() {
        if let Some(pos) = instructions_key {
            d.error(
                pos,
                format!(
                    "`reduce_instructions` applies only with `reduce: auto` or `chunk_tokens`; \
                     {label} does not reduce"
                ),
            );
        }
        return None;
    }
    Some(Reduce {
        chunk_tokens,
        instructions,
        pos: first?,
    })
}

/// The step's id and its position (the step's own position when it has no usable id; the
/// id is then empty).
fn read_id(
    r: &mut MapReader<'_>,
    node: &Node,
    path: &str,
    earlier: &[Step],
    d: &mut FileDiags<'_>,
) -> (String, Pos) {
    let Some(value) = r.get("id") else {
        d.error(node.pos, format!("`{path}` is missing `id`"));
        return (String::new(), node.pos);
    };
    let Some(id) = scalar_text(value, &format!("{path}.id"), d) else {
        return (String::new(), value.pos);
    };
    if !is_valid_id(&id) {
        d.push(
            Diagnostic::error(format!(
                "step id `{id}` is not a name templates can use: it must match `[A-Za-z_][A-Za-z0-9_]*` (letters, digits, `_`) so that `steps.<id>` works"
            ))
            .at(d.span(value.pos))
            .with_hint(format!("rename it `{}`", suggested_id(&id))),
        );
    }
    if let Some(first) = earlier.iter().find(|s| s.id == id) {
        d.error(
            value.pos,
            format!(
                "duplicate step id `{id}`: line {} already has it",
                first.pos.line
            ),
        );
    }
    (id, value.pos)
}

fn read_needs(node: &Node, path: &str, d: &mut FileDiags<'_>) -> Vec<(String, Pos)> {
    match node.as_seq() {
        Some(items) => items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| {
                scalar_text(item, &format!("{path}[{i}]"), d).map(|id| (id, item.pos))
            })
            .collect(),
        None => scalar_text(node, path, d)
            .map(|id| vec![(id, node.pos)])
            .unwrap_or_default(),
    }
}

/// A count (`8`) or a percentage (`"80%"`).
fn read_min_success(node: &Node, path: &str, d: &mut FileDiags<'_>) -> Option<MinSuccess> {
    let text = node.as_str().unwrap_or("").trim();
    let parsed = if let Some(percent) = text.strip_suffix('%') {
        percent
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|p| (0.0..=100.0).contains(p))
            .map(MinSuccess::Percent)
    } else {
        text.parse::<usize>().ok().map(MinSuccess::Count)
    };
    if parsed.is_none() {
        d.error(
            node.pos,
            format!(
                "`{path}` must be a count of tasks (`8`) or a percentage from 0% to 100% (`\"80%\"`), found {}",
                describe(node)
            ),
        );
    }
    parsed
}

/// Seconds as a number, or a duration string (`90s`, `5m`, `1h30m`).
fn read_timeout(node: &Node, path: &str, d: &mut FileDiags<'_>) -> Option<std::time::Duration> {
    let result = match (node.to_json(), node.as_str()) {
        (serde_json::Value::Number(n), _) => n.as_f64().and_then(from_seconds).ok_or_else(|| {
            format!(
                "`{path}` must be more than 0 seconds, found {}",
                describe(node)
            )
        }),
        (_, Some(text)) => parse_duration(text).map_err(|e| format!("`{path}`: {e}")),
        _ => Err(format!(
            "`{path}` must be a duration (`90s`, `5m`, `1h30m`) or a number of seconds, found {}",
            node.kind_name()
        )),
    };
    result.map_err(|message| d.error(node.pos, message)).ok()
}

/// A step kind's mapping; `None` (reported) when it is empty or not a mapping.
fn kind_map<'a>(
    key: &Node,
    node: &'a Node,
    path: &str,
    wants: &str,
    d: &mut FileDiags<'_>,
) -> Option<MapReader<'a>> {
    if node.is_null() {
        d.error(key.pos, format!("`{path}` is empty: it needs {wants}"));
        return None;
    }
    let reader = MapReader::new(node, path);
    if reader.is_none() {
        d.error(
            node.pos,
            format!(
                "`{path}` must be a mapping with {wants}, found {}",
                node.kind_name()
            ),
        );
    }
    reader
}

/// `source`, `instructions`, `parameters`, `context`, `extensions` of a task.
fn read_task(r: &mut MapReader<'_>, d: &mut FileDiags<'_>) -> TaskTemplate {
    let source = template_field(r, "source", d);
    let instructions = template_field(r, "instructions", d);
    let parameters_path = r.child_path("parameters");
    let parameters = r
        .get("parameters")
        .map(|p| read_task_parameters(p, &parameters_path, d))
        .unwrap_or_default();
    let context = template_field(r, "context", d);
    let extensions_path = r.child_path("extensions");
    let extensions = r
        .get_entry("extensions")
        .map(|(_, e)| read_extension_names(e, &extensions_path, d));
    TaskTemplate {
        source,
        instructions,
        parameters,
        context,
        extensions,
        schema: None,
    }
}

/// Keys of a step's kind written at the step's own level, where nothing reads them: each is
/// a warning that says where it goes (`extensions` beside `id` instead of under `fan_out:`).
fn warn_kind_keys(r: &mut MapReader<'_>, path: &str, kind: &str, d: &mut FileDiags<'_>) {
    const TASK_KEYS: [&str; 8] = [
        "source",
        "instructions",
        "prompt",
        "parameters",
        "extensions",
        "context",
        "schema",
        "over",
    ];
    for key in TASK_KEYS.into_iter().chain(DECOMPOSE_FORMS) {
        if let Some(node) = r.misplaced(key) {
            d.error(
                node.pos,
                format!(
                    "`{path}.{key}` is not a step key; it goes under the step's kind: \
                     `{path}.{kind}.{key}`"
                ),
            );
        }
    }
}

/// A fan-out's `schema:`, checked like a recipe's `response.json_schema`: a JSON Schema
/// object the validator accepts, else an error at its position.
fn read_schema(
    r: &mut MapReader<'_>,
    path: &str,
    d: &mut FileDiags<'_>,
) -> Option<serde_json::Value> {
    let node = r.get("schema")?;
    let schema = node.to_json();
    if !schema.is_object() {
        d.error(
            node.pos,
            format!(
                "`{path}.schema` must be a JSON Schema object, found {}",
                node.kind_name()
            ),
        );
        return None;
    }
    if let Err(error) = jsonschema::validator_for(&schema) {
        d.error(
            node.pos,
            format!("`{path}.schema` is not a valid schema: {error}"),
        );
        return None;
    }
    Some(schema)
}

/// A subagent decompose's `schema:`: checked as a fan-out's, and it must yield items
/// ([`crate::pipeline::items_of_schema`]).
fn read_items_schema(
    r: &mut MapReader<'_>,
    path: &str,
    d: &mut FileDiags<'_>,
) -> Option<serde_json::Value> {
    let pos = r.get_entry("schema").map(|(_, v)| v.pos);
    let schema = read_schema(r, path, d)?;
    if let Err(why) = super::items::items_of_schema(&schema) {
        d.error(
            pos.unwrap_or_default(),
            format!("`{path}.schema` cannot give the step its items: {why}"),
        );
        return None;
    }
    Some(schema)
}

fn read_task_parameters(
    node: &Node,
    path: &str,
    d: &mut FileDiags<'_>,
) -> IndexMap<String, Template> {
    let Some(entries) = node.as_map() else {
        d.error(
            node.pos,
            format!(
                "`{path}` must be a mapping of parameter names to values, found {}",
                node.kind_name()
            ),
        );
        return IndexMap::new();
    };
    let mut out = IndexMap::new();
    for (key, value) in entries {
        let Some(name) = key.as_str() else {
            d.error(key.pos, format!("`{path}` has a key that is not a name"));
            continue;
        };
        let value_path = format!("{path}.{name}");
        let value = if value.is_null() {
            Some(Template {
                text: String::new(),
                pos: value.pos,
                block: false,
            })
        } else {
            template(value, &value_path, d)
        };
        if out.contains_key(name) {
            d.warning(
                key.pos,
                format!("duplicate key `{value_path}`; the first one is used"),
            );
            continue;
        }
        if let Some(value) = value {
            out.insert(name.to_owned(), value);
        }
    }
    out
}

/// Extension names: a list, one name, or `[]` (none); null means the source's own.
fn read_extension_names(node: &Node, path: &str, d: &mut FileDiags<'_>) -> Vec<String> {
    if node.is_null() {
        return Vec::new();
    }
    match node.as_seq() {
        Some(items) => items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| scalar_text(item, &format!("{path}[{i}]"), d))
            .collect(),
        None => scalar_text(node, path, d).into_iter().collect(),
    }
}

/// A step's `tools:`: a list of tool or extension names (`[]` or null: none). An entry that
/// names no tool is an error at the entry; whether the task has it is checked against the
/// catalog (`exec::source_check`).
fn read_step_tools(node: &Node, path: &str, d: &mut FileDiags<'_>) -> Vec<(String, Pos)> {
    if node.is_null() {
        return Vec::new();
    }
    let Some(items) = node.as_seq() else {
        d.error(
            node.pos,
            format!(
                "`{path}` must be a list of tool names, found {}",
                node.kind_name()
            ),
        );
        return Vec::new();
    };
    let mut tools = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let Some(name) = scalar_text(item, &format!("{path}[{i}]"), d) else {
            continue;
        };
        match crate::agent::StepTool::parse(&name) {
            Ok(_) => tools.push((name.trim().to_owned(), item.pos)),
            Err(why) => d.error(item.pos, format!("unknown tool in `{path}`: {why}")),
        }
    }
    tools
}

fn has_task(task: &TaskTemplate) -> bool {
    task.source.is_some() || task.instructions.is_some()
}

fn require_task(task: &TaskTemplate, key: &Node, path: &str, d: &mut FileDiags<'_>) {
    if !has_task(task) {
        d.error(
            key.pos,
            format!("`{path}` needs `source`, `instructions`, or both"),
        );
    }
}

/// `synthesize` and `delegate`: one task.
fn read_task_body(key: &Node, node: &Node, path: &str, d: &mut FileDiags<'_>) -> TaskTemplate {
    let Some(mut r) = kind_map(key, node, path, "`source`, `instructions`, or both", d) else {
        return TaskTemplate::default();
    };
    let task = read_task(&mut r, d);
    r.finish(d);
    require_task(&task, key, path, d);
    task
}

fn read_fan_out(key: &Node, node: &Node, path: &str, d: &mut FileDiags<'_>) -> FanOut {
    let mut fan_out = FanOut {
        over: String::new(),
        over_pos: key.pos,
        over_step: None,
        task: TaskTemplate::default(),
    };
    let Some(mut r) = kind_map(
        key,
        node,
        path,
        "`over` and `source`, `instructions`, or both",
        d,
    ) else {
        return fan_out;
    };
    match r.get("over") {
        Some(over) => {
            if let Some(id) = scalar_text(over, &format!("{path}.over"), d) {
                fan_out.over = id;
                fan_out.over_pos = over.pos;
            }
        }
        None => d.error(
            key.pos,
            format!("`{path}` is missing `over`: the decompose step whose items to iterate"),
        ),
    }
    fan_out.task = read_task(&mut r, d);
    fan_out.task.schema = read_schema(&mut r, path, d).map(Box::new);
    r.finish(d);
    require_task(&fan_out.task, key, path, d);
    fan_out
}

fn read_decompose(key: &Node, node: &Node, path: &str, d: &mut FileDiags<'_>) -> Decompose {
    let fallback = Decompose::Items(Vec::new());
    let forms_text = super::model::decompose_forms_text();
    let wants = format!("one of {forms_text}");
    let Some(mut r) = kind_map(key, node, path, &wants, d) else {
        return fallback;
    };
    // which forms are given, in file order
    let mut forms: Vec<(&str, Pos)> = DECOMPOSE_FORMS
        .into_iter()
        .filter_map(|form| {
            r.get_entry(form)
                .filter(|(_, v)| !v.is_null())
                .map(|(k, _)| (form, k.pos))
        })
        .collect();
    // a subagent: `source` and/or `instructions`, named by the first one written
    let agent_key = DECOMPOSE_AGENT_KEYS
        .into_iter()
        .filter_map(|key| {
            r.get_entry(key)
                .filter(|(_, v)| !v.is_null())
                .map(|(k, _)| (key, k.pos))
        })
        .min_by_key(|(_, p)| (p.line, p.col));
    forms.extend(agent_key);
    forms.sort_by_key(|(_, p)| (p.line, p.col));
    match forms.as_slice() {
        [] => d.error(key.pos, format!("`{path}` needs {wants}")),
        [_] => {}
        [first, second, ..] => d.error(
            second.1,
            format!(
                "`{path}` takes exactly one of {forms_text}; `{}` and `{}` are both set",
                first.0, second.0
            ),
        ),
    }
    let command_path = r.child_path("command");
    let command = template_field(&mut r, "command", d);
    if let Some(command) = &command {
        let reads = refs::step_refs(&command.text);
        let whole = !refs::whole_steps_uses(&command.text).is_empty();
        if let Some(read) = reads
            .first()
            .map(|r| format!("`steps.{}`", r.id))
            .or(whole.then(|| "`steps`".to_owned()))
        {
            d.warning(
                command.pos,
                format!(
                    "`{command_path}` reads another step's output ({read}): every value reaches the shell as one quoted word, but what a model wrote still chooses the command's arguments (a path, a flag, a revision)"
                ),
            );
        }
    }
    let items_path = r.child_path("items");
    let items = r.get("items").map(|node| match node.as_seq() {
        Some(items) => items.iter().map(Node::to_json).collect(),
        None => {
            d.error(
                node.pos,
                format!("`{items_path}` must be a list, found {}", node.kind_name()),
            );
            Vec::new()
        }
    });
    let file = template_field(&mut r, "file", d);
    let glob = template_field(&mut r, "glob", d);
    let gitignore_path = r.child_path("gitignore");
    let gitignore_key = r.get_entry("gitignore").map(|(k, _)| k.pos);
    let gitignore = bool_field(&mut r, "gitignore", d);
    if let Some(pos) = gitignore_key
        && forms.first().is_some_and(|(f, _)| *f != "glob")
    {
        d.warning(
            pos,
            format!("`{gitignore_path}` only applies to `glob`; it is ignored"),
        );
    }
    let outside_path = r.child_path("outside_project");
    let outside_key = r.get_entry("outside_project").map(|(k, _)| k.pos);
    let outside_project = bool_field(&mut r, "outside_project", d).unwrap_or(false);
    match outside_key {
        Some(pos) if forms.first().is_some_and(|(f, _)| *f != "file") => d.warning(
            pos,
            format!("`{outside_path}` only applies to `file`; it is ignored"),
        ),
        Some(pos) if outside_project => d.warning(
            pos,
            format!(
                "`{outside_path}: true`: the items file may be read outside the project (its rendered path may use `..`, be absolute or go through a link), wherever the user can read"
            ),
        ),
        _ => {}
    }
    let is_agent = forms
        .first()
        .is_some_and(|(f, _)| matches!(*f, "source" | "instructions"));
    let agent = if is_agent || forms.is_empty() {
        let mut task = read_task(&mut r, d);
        task.schema = read_items_schema(&mut r, path, d).map(Box::new);
        Some(task)
    } else {
        // a subagent's keys mean nothing for the other forms
        if agent_key.is_none() {
            for extra in ["parameters", "context", "extensions", "schema"] {
                let extra_path = r.child_path(extra);
                if let Some((k, _)) = r.get_entry(extra) {
                    d.warning(
                        k.pos,
                        format!(
                            "`{extra_path}` only applies to a subagent decompose (`source`/`instructions`); it is ignored"
                        ),
                    );
                }
            }
        } else {
            r.ignore(&["parameters", "context", "extensions", "schema"]);
        }
        None
    };
    r.finish(d);
    match forms.first().map(|(f, _)| *f) {
        Some("command") => command.map_or(fallback, |t| Decompose::Static(StaticForm::Command, t)),
        Some("items") => items.map_or(fallback, Decompose::Items),
        Some("file") => file.map_or(fallback, |t| {
            Decompose::Static(StaticForm::File { outside_project }, t)
        }),
        Some("glob") => glob.map_or(fallback, |t| {
            Decompose::Static(
                StaticForm::Glob {
                    gitignore: gitignore.unwrap_or(true),
                },
                t,
            )
        }),
        Some(_) => agent.map_or(fallback, Decompose::Agent),
        None => fallback,
    }
}

fn read_outputs(node: &Node, d: &mut FileDiags<'_>) -> Vec<OutputFile> {
    let Some(items) = node.as_seq() else {
        d.error(
            node.pos,
            format!(
                "`outputs` must be a list of `path`/`content` (or `path`/`rows`/`columns`) entries, found {}",
                node.kind_name()
            ),
        );
        return Vec::new();
    };
    let mut out = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let path = format!("outputs[{index}]");
        let Some(mut r) = MapReader::new(item, path.clone()) else {
            d.error(
                item.pos,
                format!(
                    "`{path}` must be a mapping with `path` and `content` (or `rows` and `columns`)"
                ),
            );
            continue;
        };
        let file = template_field(&mut r, "path", d);
        let content = template_field(&mut r, "content", d);
        let rows = r.get("rows");
        let columns = r.get("columns");
        let only = r.get("only");
        let keep_formulas = r.get_entry("keep_formulas").map(|(k, _)| k.pos);
        let keep = bool_field(&mut r, "keep_formulas", d).unwrap_or(false);
        let outside_key = r.get_entry("outside_project").map(|(k, _)| k.pos);
        let outside_project = bool_field(&mut r, "outside_project", d).unwrap_or(false);
        if let (true, Some(pos)) = (outside_project, outside_key) {
            d.warning(
                pos,
                format!(
                    "`{path}.outside_project: true`: this file may be written outside the project (its rendered path may use `..`, be absolute or go through a link), wherever the user can write"
                ),
            );
        }
        r.finish(d);
        if file.is_none() && is_absent(item, "path") {
            d.error(item.pos, format!("`{path}` is missing `path`"));
        }
        let is_table =
            rows.is_some() || columns.is_some() || only.is_some() || keep_formulas.is_some();
        if is_table {
            if let (Some(_), Some(rows)) = (&content, rows) {
                d.push(
                    Diagnostic::error(format!(
                        "`{path}` has both `content` and `rows`: an entry is either a text file (`content`) or a table (`rows` and `columns`)"
                    ))
                    .at(d.span(rows.pos))
                    .with_hint("move the table to an entry of its own"),
                );
                continue;
            }
            let table = read_table(item, &path, rows, columns, only, file.as_ref(), d).map(|t| {
                if let (Some(pos), TableFormat::Jsonl) = (keep_formulas, t.format) {
                    d.warning(
                        pos,
                        format!(
                            "`{path}.keep_formulas` only applies to a .csv table; it is ignored"
                        ),
                    );
                }
                Table {
                    keep_formulas: keep,
                    ..t
                }
            });
            if let (Some(file), Some(table)) = (file, table) {
                out.push(OutputFile {
                    path: file,
                    body: OutputBody::Table(table),
                    outside_project,
                });
            }
            continue;
        }
        if content.is_none() && is_absent(item, "content") {
            d.error(
                item.pos,
                format!("`{path}` is missing `content` (or `rows` and `columns` for a table)"),
            );
        }
        if let (Some(file), Some(content)) = (file, content) {
            out.push(OutputFile {
                path: file,
                body: OutputBody::Text(content),
                outside_project,
            });
        }
    }
    out
}

/// The table parts of an `outputs` entry (`rows`, `columns`, `only`); `path` gives the
/// format by its extension.
fn read_table(
    item: &Node,
    path: &str,
    rows: Option<&Node>,
    columns: Option<&Node>,
    only: Option<&Node>,
    file: Option<&Template>,
    d: &mut FileDiags<'_>,
) -> Option<Table> {
    let mut ok = true;
    let rows = match rows {
        None => {
            d.error(
                item.pos,
                format!(
                    "`{path}` is missing `rows`: the fan_out step whose tasks are the table's rows"
                ),
            );
            ok = false;
            None
        }
        Some(node) => scalar_text(node, &format!("{path}.rows"), d).map(|id| (id, node.pos)),
    };
    let mut list = Vec::new();
    match columns {
        None => {
            d.error(
                item.pos,
                format!("`{path}` is missing `columns`: a mapping of column name to template"),
            );
            ok = false;
        }
        Some(node) => match node.as_map() {
            Some(entries) if !entries.is_empty() => {
                for (key, value) in entries {
                    let Some(name) = key.as_str() else {
                        d.error(key.pos, format!("`{path}.columns` keys must be names"));
                        ok = false;
                        continue;
                    };
                    if list.iter().any(|(n, _): &(String, Template)| n == name) {
                        d.error(key.pos, format!("column `{name}` is given twice"));
                        ok = false;
                        continue;
                    }
                    let child = format!("{path}.columns.{name}");
                    // A plain number or boolean is the column's constant text.
                    let t = match &value.value {
                        Value::Scalar(text, ScalarStyle::Plain) if !value.is_null() => {
                            Some(Template {
                                text: text.clone(),
                                pos: value.pos,
                                block: false,
                            })
                        }
                        _ => template(value, &child, d),
                    };
                    match t {
                        Some(t) => list.push((name.to_owned(), t)),
                        None => ok = false,
                    }
                }
            }
            _ => {
                d.error(
                    node.pos,
                    format!(
                        "`{path}.columns` must be a non-empty mapping of column name to template, found {}",
                        node.kind_name()
                    ),
                );
                ok = false;
            }
        },
    }
    let only_completed = match only {
        None => false,
        Some(node) if node.as_str() == Some("completed") => true,
        Some(node) => {
            d.error(
                node.pos,
                format!(
                    "`{path}.only` must be `completed`, found {}",
                    describe(node)
                ),
            );
            ok = false;
            false
        }
    };
    let format = file.and_then(|file| {
        let text = file.text.trim().to_ascii_lowercase();
        if text.ends_with(".csv") {
            Some(TableFormat::Csv)
        } else if text.ends_with(".jsonl") {
            Some(TableFormat::Jsonl)
        } else {
            d.push(
                Diagnostic::error(format!(
                    "a table's path must end with `.csv` or `.jsonl` (the format), found `{}`",
                    file.text.trim()
                ))
                .at(d.span(file.pos))
                .with_hint("name the file `….csv` for CSV with a header, or `….jsonl` for one JSON object per row"),
            );
            None
        }
    });
    let (rows, rows_pos) = rows?;
    if !ok {
        return None;
    }
    Some(Table {
        rows,
        rows_pos,
        columns: list,
        only_completed,
        keep_formulas: false,
        format: format?,
    })
}

/// Whether `key` is absent (or null) in a mapping: a present value of the wrong type was
/// already reported.
fn is_absent(map: &Node, key: &str) -> bool {
    map.get(key).is_none_or(Node::is_null)
}

// ---------------------------------------------------------------------------------------
// Validation across the file

/// Checks templates, references, `needs`, `over` and cycles.
fn check(pipeline: &Pipeline, kinds_known: &[bool], d: &mut FileDiags<'_>) {
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for (i, step) in pipeline.steps.iter().enumerate() {
        if !step.id.is_empty() {
            ids.entry(step.id.as_str()).or_insert(i);
        }
    }
    let mut checker = TemplateChecker {
        pipeline,
        ids: &ids,
        used: BTreeSet::new(),
    };
    for parameter in &pipeline.parameters {
        if GLOBAL_VARIABLES.contains(&parameter.key.as_str())
            || FAN_OUT_VARIABLES.contains(&parameter.key.as_str())
        {
            d.error(
                parameter.pos,
                format!(
                    "parameter `{0}` would hide the template variable `{0}`; rename it",
                    parameter.key
                ),
            );
        }
    }
    for step in &pipeline.steps {
        let in_fan_out = matches!(step.kind, StepKind::FanOut(_));
        for t in graph::step_templates(step) {
            checker.check(t, Some(step), in_fan_out, d);
        }
        if let (Some(reduce), StepKind::Synthesize(_)) = (&step.reduce, &step.kind) {
            if pipeline.reduced_step(step).is_none() {
                d.error(
                    reduce.pos,
                    format!(
                        "`reduce` chunks the results of one fan_out step: the instructions of \
                         step `{}` must read `steps.<id>.results` of exactly one fan_out step",
                        step.id
                    ),
                );
            }
            // The upper levels read the step's own `steps.<id>.partials`.
            if let Some(t) = &reduce.instructions {
                checker.check(t, None, false, d);
            }
        }
        for (id, pos) in &step.needs {
            if *id == step.id {
                d.error(*pos, format!("step `{id}` needs itself"));
            } else if !ids.contains_key(id.as_str()) {
                checker.unknown_step(id, *pos, d);
            }
        }
        if let StepKind::FanOut(fan_out) = &step.kind
            && !fan_out.over.is_empty()
        {
            let over = fan_out.over.as_str();
            match ids.get(over) {
                _ if over == step.id => d.error(
                    fan_out.over_pos,
                    format!("step `{over}` iterates over itself; `over` names a decompose step"),
                ),
                None => checker.unknown_step(over, fan_out.over_pos, d),
                Some(&j) => {
                    let target = &pipeline.steps[j];
                    if kinds_known[j] && !matches!(target.kind, StepKind::Decompose(_)) {
                        let mut diagnostic = Diagnostic::error(format!(
                            "`over: {over}` names a {} step; only decompose steps have items",
                            target.kind.name()
                        ))
                        .at(d.span(fan_out.over_pos));
                        if let StepKind::FanOut(inner) = &target.kind
                            && !inner.over.is_empty()
                        {
                            diagnostic = diagnostic.with_hint(format!(
                                "`{over}` runs once per item of `{}`; `over: {}` iterates the same items",
                                inner.over, inner.over
                            ));
                        }
                        d.push(diagnostic);
                    }
                }
            }
        }
    }
    for t in graph::output_templates(pipeline) {
        checker.check(t, None, false, d);
    }
    for output in &pipeline.outputs {
        let OutputBody::Table(table) = &output.body else {
            continue;
        };
        match ids.get(table.rows.as_str()) {
            None => checker.unknown_step(&table.rows, table.rows_pos, d),
            Some(&j) => {
                let target = &pipeline.steps[j];
                if kinds_known[j] && !matches!(target.kind, StepKind::FanOut(_)) {
                    let fan_outs: Vec<String> = pipeline
                        .steps
                        .iter()
                        .filter(|s| matches!(s.kind, StepKind::FanOut(_)))
                        .map(|s| format!("`{}`", s.id))
                        .collect();
                    let hint = if fan_outs.is_empty() {
                        "the pipeline has no fan_out step".to_owned()
                    } else {
                        format!("the fan_out steps are {}", fan_outs.join(", "))
                    };
                    d.push(
                        Diagnostic::error(format!(
                            "`rows: {}` names a {} step; a table's rows are the tasks of a fan_out step",
                            table.rows,
                            target.kind.name()
                        ))
                        .at(d.span(table.rows_pos))
                        .with_hint(hint),
                    );
                }
            }
        }
        for (_, t) in &table.columns {
            check_column(pipeline, t, d);
        }
    }
    for parameter in &pipeline.parameters {
        if !checker.used.contains(parameter.key.as_str()) {
            d.warning(
                parameter.pos,
                format!(
                    "parameter `{}` is declared but never used in a template",
                    parameter.key
                ),
            );
        }
    }
    let graph = Graph::new(pipeline);
    for cycle in graph.cycles() {
        let names: Vec<&str> = cycle
            .iter()
            .map(|&i| pipeline.steps[i].id.as_str())
            .collect();
        let first = &pipeline.steps[cycle[0]];
        d.push(
            Diagnostic::error(format!("dependency cycle: {}", names.join(" -> ")))
                .at(d.span(first.pos))
                .with_hint(
                    "each step needs the next one (through `steps.<id>` in a template, `needs` or `over`); no step of the cycle can start",
                ),
        );
    }
}

/// A table column's template: its syntax, and that it reads only the row's variables.
fn check_column(pipeline: &Pipeline, t: &Template, d: &mut FileDiags<'_>) {
    if !template::has_template(&t.text) {
        return;
    }
    let file = &pipeline.file;
    let vars = match template::variables(&t.text) {
        Ok(vars) => vars,
        Err(error) => {
            d.error(
                syntax_error_pos(file, t, error.line),
                format!("template error: {}", error.message),
            );
            return;
        }
    };
    for name in vars {
        if TABLE_VARIABLES.contains(&name.as_str()) {
            continue;
        }
        let pos = refs::find_variable(&t.text, &name)
            .map_or(t.pos, |offset| locate(file, t, offset, &name));
        let allowed = "a column reads `item`, `data`, `output`, `status` and `error`";
        let hint = match suggestions(&name, TABLE_VARIABLES.iter().copied()).first() {
            Some(close) => format!("did you mean `{close}`? {allowed}"),
            None => allowed.to_owned(),
        };
        d.push(
            Diagnostic::error(format!("undefined variable `{name}` in a table column"))
                .at(d.span(pos))
                .with_hint(hint),
        );
    }
}

struct TemplateChecker<'a> {
    pipeline: &'a Pipeline,
    ids: &'a HashMap<&'a str, usize>,
    /// Parameters some template reads.
    used: BTreeSet<String>,
}

impl TemplateChecker<'_> {
    /// Syntax, variables and step references of one template; `owner` is the step it belongs
    /// to (`None` for `outputs`).
    fn check(
        &mut self,
        t: &Template,
        owner: Option<&Step>,
        in_fan_out: bool,
        d: &mut FileDiags<'_>,
    ) {
        if !template::has_template(&t.text) {
            return;
        }
        let file = &self.pipeline.file;
        let vars = match template::variables(&t.text) {
            Ok(vars) => vars,
            Err(error) => {
                d.error(
                    syntax_error_pos(file, t, error.line),
                    format!("template error: {}", error.message),
                );
                return;
            }
        };
        for var in vars {
            let name = var.as_str();
            let pos = || {
                refs::find_variable(&t.text, name)
                    .map_or(t.pos, |offset| locate(file, t, offset, name))
            };
            if self.pipeline.parameters.iter().any(|p| p.key == var) {
                self.used.insert(var);
            } else if FAN_OUT_VARIABLES.contains(&name) {
                if !in_fan_out {
                    let place = match owner {
                        Some(step) => format!("step `{}` is a {} step", step.id, step.kind.name()),
                        None => "`outputs` are written once, after the run".to_owned(),
                    };
                    d.error(
                        pos(),
                        format!(
                            "`{name}` is only defined in a fan_out step's templates (one task per item); {place}"
                        ),
                    );
                }
            } else if !GLOBAL_VARIABLES.contains(&name) {
                let mut diagnostic =
                    Diagnostic::error(format!("undefined variable `{name}`")).at(d.span(pos()));
                let params = self.pipeline.parameters.iter().map(|p| p.key.as_str());
                diagnostic = match suggestions(name, params).first() {
                    Some(close) => diagnostic.with_hint(format!(
                        "did you mean `{close}`? Templates read the pipeline's parameters, `steps`, `agents`, and in a fan_out `item` and `loop`"
                    )),
                    None => diagnostic.with_hint(format!(
                        "declare it under `parameters` (`- key: {name}`), or use `steps`, `agents`, or in a fan_out `item` and `loop`"
                    )),
                };
                d.push(diagnostic);
            }
        }
        for (id, offset) in graph::referenced_steps(&t.text) {
            if owner.is_some_and(|s| s.id == id) {
                d.error(
                    locate(file, t, offset, &id),
                    format!("step `{id}` reads its own result; a step can only read steps that run before it"),
                );
            } else if !self.ids.contains_key(id.as_str()) {
                self.unknown_step(&id, locate(file, t, offset, &id), d);
            }
        }
    }

    fn unknown_step(&self, id: &str, pos: Pos, d: &mut FileDiags<'_>) {
        let ids = self
            .pipeline
            .steps
            .iter()
            .map(|s| s.id.as_str())
            .filter(|s| !s.is_empty());
        let close = suggestions(id, ids.clone());
        let hint = match close.first() {
            Some(close) => format!("did you mean `{close}`?"),
            None => {
                let all: Vec<String> = ids.map(|s| format!("`{s}`")).collect();
                format!("the steps are {}", all.join(", "))
            }
        };
        d.push(
            Diagnostic::error(format!("unknown step `{id}`"))
                .at(d.span(pos))
                .with_hint(hint),
        );
    }
}

// ---------------------------------------------------------------------------------------
// Positions inside templates

/// The byte offset where 1-based `line` starts (the end of the text past the last line).
fn line_start(text: &str, line: u32) -> usize {
    if line <= 1 {
        return 0;
    }
    text.match_indices('\n')
        .nth(usize::try_from(line - 2).unwrap_or(usize::MAX))
        .map_or(text.len(), |(i, _)| i + 1)
}

/// 1-based line and column (in characters) of a byte offset.
fn line_col(text: &str, offset: usize) -> (u32, u32) {
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_begin = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_begin..].chars().count() + 1;
    (
        u32::try_from(line).unwrap_or(u32::MAX),
        u32::try_from(col).unwrap_or(u32::MAX),
    )
}

/// The file position of `needle`, found at byte `offset` of the template's text: the same
/// occurrence counted from where the template starts in the file (escapes and folding move
/// text around; counting occurrences does not care).
fn locate(file: &SourceFile, t: &Template, offset: usize, needle: &str) -> Pos {
    let len = u32::try_from(needle.chars().count()).unwrap_or(1);
    let nth = t.text[..offset].matches(needle).count();
    let first_line = t.first_line();
    let mut start = line_start(&file.text, first_line);
    if !t.block {
        let line_text = &file.text[start..];
        let line_text = &line_text[..line_text.find('\n').unwrap_or(line_text.len())];
        start += line_text
            .char_indices()
            .nth(usize::try_from(t.pos.col.saturating_sub(1)).unwrap_or(0))
            .map_or(line_text.len(), |(i, _)| i);
    }
    if let Some((found, _)) = file.text[start..].match_indices(needle).nth(nth) {
        let (line, col) = line_col(&file.text, start + found);
        return Pos::new(line, col, len);
    }
    let lines = u32::try_from(t.text[..offset].matches('\n').count()).unwrap_or(0);
    Pos::new(
        first_line + lines,
        if lines == 0 { t.pos.col } else { 1 },
        len,
    )
}

/// Where a template syntax error on line `error_line` of the template is shown: that line
/// of the file, from its first non-blank character (a one-line template: the whole value).
fn syntax_error_pos(file: &SourceFile, t: &Template, error_line: Option<u32>) -> Pos {
    let offset = error_line.unwrap_or(1).saturating_sub(1);
    if !t.block && offset == 0 {
        return t.pos;
    }
    let line = t.first_line() + offset;
    match file.line_text(line) {
        Some(text) => {
            let indent = text.chars().take_while(|c| c.is_whitespace()).count();
            let len = text.trim().chars().count().max(1);
            Pos::new(
                line,
                u32::try_from(indent + 1).unwrap_or(1),
                u32::try_from(len).unwrap_or(1),
            )
        }
        None => Pos::new(line, 1, 1),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::time::Duration;

    use super::*;
    use crate::diag::Severity;

    /// The SPEC §6 example, verbatim.
    pub(crate) const SPEC_EXAMPLE: &str = r#"version: 1
name: release-notes-by-area
description: Notes per area of the code, then one summary
parameters:              # same schema as recipe parameters; --param KEY=VALUE on the command line
  - key: since
    input_type: string
    requirement: optional
    default: v1.0.0
settings:                # all optional: provider, model, temperature, max_turns, concurrency
  concurrency: 8         # global cap on tasks in flight (--concurrency overrides)
steps:
  - id: areas
    decompose:           # exactly one of: command, items, file, glob, source/instructions
      command: "git diff --name-only {{ since }}..HEAD | cut -d/ -f1 | sort -u"
  - id: notes
    fan_out:
      over: areas        # the step whose items to iterate
      source: release-notes          # or instructions only (ad-hoc), or both
      parameters: { area: "{{ item }}" }
    concurrency: 4       # per-step cap
    on_error: continue   # default fail_fast
  - id: summary
    synthesize:
      instructions: |
        Merge these notes into one document:
        {% for r in steps.notes.results %}## {{ r.item }}
        {{ r.output }}
        {% endfor %}
outputs:
  - path: out/release-notes.md
    content: "{{ steps.summary.output }}"
"#;

    fn file(text: &str) -> Arc<SourceFile> {
        SourceFile::new("p.yaml", unindent(text))
    }

    /// Texts written indented in a test (starting with a newline) lose the indentation.
    fn unindent(text: &str) -> String {
        let Some(body) = text.strip_prefix('\n') else {
            return text.to_owned();
        };
        let indent = body
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.len() - l.trim_start().len())
            .min()
            .unwrap_or(0);
        body.lines()
            .map(|l| l.get(indent..).unwrap_or("").trim_end())
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    }

    /// A diagnostic as `(severity, line, col, message)`.
    type Found = (Severity, u32, u32, String);

    /// Parses, returning the pipeline (when valid) and the diagnostics.
    pub(crate) fn run(text: &str) -> (Option<Pipeline>, Vec<Found>) {
        let mut diags = Diagnostics::default();
        let pipeline = parse_pipeline(&file(text), &mut diags);
        let found = diags
            .items
            .iter()
            .map(|d| {
                let pos = d.span.as_ref().map(|s| s.pos).unwrap_or_default();
                (d.severity, pos.line, pos.col, d.message.clone())
            })
            .collect();
        (pipeline, found)
    }

    /// Reads a pipeline even when it has errors (for graph tests of broken pipelines).
    pub(crate) fn read_unchecked(text: &str) -> Pipeline {
        let file = file(text);
        let mut diags = Diagnostics::default();
        read_file(&file, &mut diags.for_file(&file)).expect("a mapping")
    }

    fn valid(text: &str) -> Pipeline {
        let (pipeline, found) = run(text);
        let errors: Vec<_> = found.iter().filter(|d| d.0 == Severity::Error).collect();
        assert!(errors.is_empty(), "{errors:#?}");
        pipeline.expect("valid")
    }

    fn t(text: &str, line: u32, col: u32, block: bool) -> Template {
        Template {
            text: text.into(),
            pos: Pos::new(line, col, 0),
            block,
        }
    }

    fn same_template(actual: &Template, expected: &Template) {
        assert_eq!(actual.text, expected.text);
        assert_eq!(
            (actual.pos.line, actual.pos.col, actual.block),
            (expected.pos.line, expected.pos.col, expected.block),
            "{:?}",
            actual.text
        );
    }

    #[test]
    fn the_spec_example_parses_to_the_model() {
        let p = valid(SPEC_EXAMPLE);
        assert_eq!(p.name, "release-notes-by-area");
        assert_eq!(
            p.description,
            "Notes per area of the code, then one summary"
        );
        assert_eq!(p.parameters.len(), 1);
        assert_eq!(p.parameters[0].key, "since");
        assert_eq!(p.parameters[0].default.as_deref(), Some("v1.0.0"));
        assert_eq!(p.settings.concurrency, Some(8));
        assert_eq!(p.settings.provider, None);
        let ids: Vec<&str> = p.steps.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["areas", "notes", "summary"]);

        let areas = &p.steps[0];
        assert_eq!((areas.pos.line, areas.pos.col), (12, 9));
        let StepKind::Decompose(Decompose::Static(StaticForm::Command, command)) = &areas.kind
        else {
            panic!("{:?}", areas.kind);
        };
        same_template(
            command,
            &t(
                "git diff --name-only {{ since }}..HEAD | cut -d/ -f1 | sort -u",
                14,
                16,
                false,
            ),
        );
        assert_eq!(areas.on_error, OnError::FailFast);
        assert_eq!(areas.concurrency, None);
        assert_eq!(areas.backend, Backend::Live);

        let notes = &p.steps[1];
        let StepKind::FanOut(fan_out) = &notes.kind else {
            panic!("{:?}", notes.kind);
        };
        assert_eq!(fan_out.over, "areas");
        assert_eq!((fan_out.over_pos.line, fan_out.over_pos.col), (17, 13));
        same_template(
            fan_out.task.source.as_ref().unwrap(),
            &t("release-notes", 18, 15, false),
        );
        assert!(fan_out.task.instructions.is_none());
        assert_eq!(fan_out.task.parameters.len(), 1);
        same_template(
            &fan_out.task.parameters["area"],
            &t("{{ item }}", 19, 27, false),
        );
        assert_eq!(fan_out.task.extensions, None);
        assert_eq!(notes.concurrency, Some(4));
        assert_eq!(notes.on_error, OnError::Continue);
        assert_eq!(notes.retries, 0);
        assert_eq!(notes.timeout, None);
        assert!(notes.needs.is_empty());

        let summary = &p.steps[2];
        let StepKind::Synthesize(task) = &summary.kind else {
            panic!("{:?}", summary.kind);
        };
        let instructions = task.instructions.as_ref().unwrap();
        assert!(instructions.block);
        assert_eq!((instructions.pos.line, instructions.pos.col), (24, 21));
        assert_eq!(instructions.first_line(), 25);
        assert!(
            instructions
                .text
                .starts_with("Merge these notes into one document:\n{% for r")
        );

        assert_eq!(p.outputs.len(), 1);
        same_template(
            &p.outputs[0].path,
            &t("out/release-notes.md", 30, 11, false),
        );
        let OutputBody::Text(content) = &p.outputs[0].body else {
            panic!("a text output")
        };
        same_template(content, &t("{{ steps.summary.output }}", 31, 14, false));
    }

    #[test]
    fn every_key_is_read() {
        let p = valid(
            r#"
            version: 1
            parameters:
              - {key: topic, input_type: string, requirement: required}
            settings:
              provider: openai
              model: gpt-x
              temperature: 0.3
              max_turns: 4
              concurrency: 16
            steps:
              - id: list
                decompose:
                  instructions: "List subtopics of {{ topic }} as a JSON array"
                  source: planner
                  parameters: {depth: 2}
                  context: "{{ agents }}"
                  extensions: [developer]
                retries: 2
                timeout: 1h30m
                provider: anthropic
                model: claude
                temperature: 1.5
                max_turns: 3
              - id: work
                fan_out:
                  over: list
                  instructions: "{{ loop.index }}: {{ item }}"
                  extensions: []
                needs: lit
                min_success: "80%"
                backend: batch
                timeout: 90
              - id: lit
                decompose: {items: [1, "two", {three: 3}]}
              - id: files
                decompose: {glob: "docs/**/*.md"}
                needs: [lit, work]
              - id: rows
                decompose: {file: data.csv}
              - id: one
                delegate: {source: reviewer, context: "{{ steps.rows.items }}"}
                on_error: fail_fast
                timeout: 2.5
            "#,
        );
        assert_eq!(p.name, "p", "the file stem when there is no `name`");
        assert_eq!(p.settings.provider.as_deref(), Some("openai"));
        assert_eq!(p.settings.model.as_deref(), Some("gpt-x"));
        assert_eq!(p.settings.temperature, Some(0.3));
        assert_eq!(p.settings.max_turns, Some(4));
        assert_eq!(p.settings.concurrency, Some(16));
        let list = &p.steps[0];
        let StepKind::Decompose(Decompose::Agent(task)) = &list.kind else {
            panic!("{:?}", list.kind);
        };
        assert_eq!(task.source.as_ref().unwrap().text, "planner");
        assert_eq!(task.parameters["depth"].text, "2");
        assert_eq!(task.context.as_ref().unwrap().text, "{{ agents }}");
        assert_eq!(task.extensions, Some(vec!["developer".to_owned()]));
        assert_eq!(list.retries, 2);
        assert_eq!(list.timeout, Some(Duration::from_secs(5400)));
        assert_eq!(list.provider.as_deref(), Some("anthropic"));
        assert_eq!(list.model.as_deref(), Some("claude"));
        assert_eq!(list.temperature, Some(1.5));
        assert_eq!(list.max_turns, Some(3));
        let work = &p.steps[1];
        let StepKind::FanOut(fan_out) = &work.kind else {
            panic!()
        };
        assert_eq!(fan_out.task.extensions, Some(Vec::new()));
        assert_eq!(
            work.needs
                .iter()
                .map(|(id, _)| id.as_str())
                .collect::<Vec<_>>(),
            ["lit"]
        );
        assert_eq!(work.min_success, Some(MinSuccess::Percent(80.0)));
        assert_eq!(work.backend, Backend::Batch);
        assert_eq!(work.timeout, Some(Duration::from_secs(90)));
        let StepKind::Decompose(Decompose::Items(items)) = &p.steps[2].kind else {
            panic!()
        };
        assert_eq!(
            items,
            &[
                serde_json::json!(1),
                "two".into(),
                serde_json::json!({"three": 3})
            ]
        );
        assert!(
            matches!(&p.steps[3].kind, StepKind::Decompose(Decompose::Static(StaticForm::Glob { gitignore: true }, g)) if g.text == "docs/**/*.md")
        );
        assert_eq!(p.steps[3].needs.len(), 2);
        assert!(
            matches!(&p.steps[4].kind, StepKind::Decompose(Decompose::Static(StaticForm::File { outside_project: false }, f)) if f.text == "data.csv")
        );
        assert_eq!(p.steps[5].timeout, Some(Duration::from_millis(2500)));
        assert!(matches!(&p.steps[5].kind, StepKind::Delegate(_)));
    }

    /// A minimal valid pipeline around one step's extra lines (at line 3 on).
    fn one_step(lines: &str) -> String {
        format!("version: 1\nsteps:\n{lines}")
    }

    #[test]
    fn each_rule_is_reported_at_its_position() {
        // (pipeline text, line, col, message start)
        let cases: &[(&str, u32, u32, &str)] = &[
            (
                "steps:\n  - id: a\n    delegate: {instructions: x}\n",
                1,
                1,
                "missing `version: 1`",
            ),
            (
                "version: 2\nsteps:\n  - id: a\n    delegate: {instructions: x}\n",
                1,
                10,
                "unsupported pipeline `version` `2`",
            ),
            ("version: 1\nsteps: []\n", 2, 8, "`steps` is empty"),
            ("version: 1\nsteps:\n", 2, 1, "`steps` is empty"),
            ("version: 1\nsteps: 3\n", 2, 8, "`steps` must be a list"),
            (
                &one_step("  - delegate: {instructions: x}\n"),
                3,
                5,
                "`steps[0]` is missing `id`",
            ),
            (
                &one_step("  - id: 2nd\n    delegate: {instructions: x}\n"),
                3,
                9,
                "step id `2nd` is not a name templates can use",
            ),
            (
                &one_step(
                    "  - id: a\n    delegate: {instructions: x}\n  - id: a\n    delegate: {instructions: y}\n",
                ),
                5,
                9,
                "duplicate step id `a`: line 3 already has it",
            ),
            (
                &one_step("  - id: a\n    needs: []\n"),
                3,
                9,
                "step `a` has no kind: set exactly one of `decompose`, `fan_out`, `synthesize`, `delegate`",
            ),
            (
                &one_step(
                    "  - id: a\n    delegate: {instructions: x}\n    synthesize: {instructions: y}\n",
                ),
                5,
                5,
                "step `a` has both `delegate` and `synthesize`",
            ),
            (
                &one_step("  - id: a\n    delegate: {context: x}\n"),
                4,
                5,
                "`steps[0].delegate` needs `source`, `instructions`, or both",
            ),
            (
                &one_step("  - id: a\n    delegate:\n"),
                4,
                5,
                "`steps[0].delegate` is empty",
            ),
            (
                &one_step("  - id: a\n    decompose: {}\n"),
                4,
                5,
                "`steps[0].decompose` needs one of `command`, `items`",
            ),
            (
                &one_step("  - id: a\n    decompose: {glob: '*', instructions: x}\n"),
                4,
                28,
                "`steps[0].decompose` takes exactly one of",
            ),
            (
                &one_step("  - id: a\n    decompose: {items: x}\n"),
                4,
                24,
                "`steps[0].decompose.items` must be a list",
            ),
            (
                &one_step("  - id: a\n    fan_out: {instructions: x}\n"),
                4,
                5,
                "`steps[0].fan_out` is missing `over`",
            ),
            (
                &one_step(
                    "  - id: a\n    decompose: {items: [1]}\n  - id: b\n    fan_out: {over: a}\n",
                ),
                6,
                5,
                "`steps[1].fan_out` needs `source`, `instructions`, or both",
            ),
            (
                &one_step(
                    "  - id: a\n    decompose: {items: [1]}\n  - id: b\n    fan_out: {over: zz, instructions: x}\n",
                ),
                6,
                21,
                "unknown step `zz`",
            ),
            (
                &one_step(
                    "  - id: a\n    decompose: {items: [1]}\n  - id: b\n    fan_out: {over: a, instructions: x}\n  - id: c\n    fan_out: {over: b, instructions: y}\n",
                ),
                8,
                21,
                "`over: b` names a fan_out step; only decompose steps have items",
            ),
            (
                &one_step(
                    "  - id: a\n    delegate: {instructions: x}\n  - id: b\n    fan_out: {over: a, instructions: y}\n",
                ),
                6,
                21,
                "`over: a` names a delegate step",
            ),
            (
                &one_step("  - id: b\n    fan_out: {over: b, instructions: y}\n"),
                4,
                21,
                "step `b` iterates over itself",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: x}\n    needs: [a]\n"),
                5,
                13,
                "step `a` needs itself",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: x}\n    needs: [b, c]\n"),
                5,
                13,
                "unknown step `b`",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: x}\n    needs: q\n"),
                5,
                12,
                "unknown step `q`",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: \"{{ steps.a.output }}\"}\n"),
                4,
                40,
                "step `a` reads its own result",
            ),
            (
                &one_step(
                    "  - id: a\n    delegate: {instructions: \"x {{ steps.nope.output }}\"}\n",
                ),
                4,
                42,
                "unknown step `nope`",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: \"{{ steps['no-pe'] }}\"}\n"),
                4,
                41,
                "unknown step `no-pe`",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: \"{{ who }}\"}\n"),
                4,
                34,
                "undefined variable `who`",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: \"{{ item }}\"}\n"),
                4,
                34,
                "`item` is only defined in a fan_out step's templates",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: \"{{ x }\"}\n"),
                4,
                30,
                "template error: syntax error",
            ),
            (
                &one_step(
                    "  - id: a\n    delegate:\n      instructions: |\n        one\n        two {% if %}\n",
                ),
                7,
                9,
                "template error: syntax error",
            ),
            (
                &one_step(
                    "  - id: a\n    delegate:\n      instructions: |\n        one\n        two {{ steps.zz.output }}\n",
                ),
                7,
                22,
                "unknown step `zz`",
            ),
            (
                &one_step(
                    "  - id: a\n    delegate:\n      instructions: >\n        one\n        two {{ steps.zz.output }}\n",
                ),
                7,
                22,
                "unknown step `zz`",
            ),
            (
                &one_step(
                    "  - id: a\n    delegate:\n      instructions: \"one\n        two \\\"{{ steps.zz }}\"\n",
                ),
                6,
                24,
                "unknown step `zz`",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: x}\n    concurrency: 0\n"),
                5,
                18,
                "`steps[0].concurrency` must be a whole number ≥ 1, found `0`",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: x}\n    retries: -1\n"),
                5,
                14,
                "`steps[0].retries` must be a whole number ≥ 0",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: x}\n    on_error: ignore\n"),
                5,
                15,
                "`steps[0].on_error` must be `fail_fast` or `continue`, found `ignore`",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: x}\n    backend: cloud\n"),
                5,
                14,
                "`steps[0].backend` must be `live` or `batch`",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: x}\n    backend: batch\n"),
                5,
                14,
                "`backend: batch` applies only to fan_out steps",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: x}\n    min_success: 2\n"),
                5,
                5,
                "`min_success` applies only to fan_out steps; step `a` is a delegate step",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: x}\n    temperature: 3\n"),
                5,
                18,
                "`steps[0].temperature` must be a number between 0 and 2",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: x}\n    allow_empty: maybe\n"),
                5,
                18,
                "`steps[0].allow_empty` must be true or false, found `maybe`",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: x}\n    max_turns: 0\n"),
                5,
                16,
                "`steps[0].max_turns` must be a whole number ≥ 1",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: x}\n    timeout: 0\n"),
                5,
                14,
                "`steps[0].timeout` must be more than 0 seconds",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: x}\n    timeout: soon\n"),
                5,
                14,
                "`steps[0].timeout`: `soon` is not a duration",
            ),
            (
                &one_step("  - id: a\n    delegate: {instructions: [x]}\n"),
                4,
                30,
                "`steps[0].delegate.instructions` must be a string (a template), found a list",
            ),
            (
                "version: 1\nsettings: {concurrency: 0}\nsteps:\n  - id: a\n    delegate: {instructions: x}\n",
                2,
                25,
                "`settings.concurrency` must be a whole number ≥ 1",
            ),
            (
                "version: 1\nsettings: {temperature: hot}\nsteps:\n  - id: a\n    delegate: {instructions: x}\n",
                2,
                25,
                "`settings.temperature` must be a number between 0 and 2",
            ),
            (
                "version: 1\nsteps:\n  - id: a\n    delegate: {instructions: x}\noutputs:\n  - path: o.md\n",
                6,
                5,
                "`outputs[0]` is missing `content`",
            ),
            (
                "version: 1\nsteps:\n  - id: a\n    delegate: {instructions: x}\noutputs:\n  - {path: o.md, content: \"{{ steps.b.output }}\"}\n",
                6,
                37,
                "unknown step `b`",
            ),
            (
                "version: 1\nsteps:\n  - id: a\n    delegate: {instructions: x}\noutputs:\n  - {path: o.md, content: \"{{ item }}\"}\n",
                6,
                31,
                "`item` is only defined in a fan_out step's templates (one task per item); `outputs`",
            ),
            (
                "version: 1\nparameters:\n  - {key: steps, input_type: string, requirement: required}\nsteps:\n  - id: a\n    delegate: {instructions: \"{{ steps }}\"}\n",
                3,
                11,
                "parameter `steps` would hide the template variable `steps`",
            ),
            (
                "version: 1\nsteps:\n  - id: a\n    delegate: {instructions: \"{{ steps.b.output }}\"}\n  - id: b\n    delegate: {instructions: x}\n    needs: a\n",
                3,
                9,
                "dependency cycle: a -> b -> a",
            ),
            ("- 1\n", 1, 1, "a pipeline must be a mapping"),
            ("version: 1\nsteps: [\n", 2, 8, "invalid YAML"),
        ];
        let mut failures = Vec::new();
        for (text, line, col, message) in cases {
            let (pipeline, found) = run(text);
            let errors: Vec<_> = found.iter().filter(|d| d.0 == Severity::Error).collect();
            let hit = errors
                .iter()
                .any(|(_, l, c, m)| (l, c) == (line, col) && m.starts_with(message));
            if pipeline.is_some() || !hit {
                failures.push(format!(
                    "want {line}:{col} {message}\nin:\n{text}got: {errors:#?}"
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    }

    #[test]
    fn all_problems_are_reported_in_one_pass() {
        let (pipeline, found) = run(r#"
            steps:
              - id: a
                delegate: {instructions: "{{ steps.x.output }} {{ y }}"}
                timeout: never
              - id: a
                fan_out: {over: nothing, instructions: i}
            "#);
        assert!(pipeline.is_none());
        let messages: Vec<&str> = found.iter().map(|d| d.3.as_str()).collect();
        for wanted in [
            "missing `version: 1`",
            "unknown step `x`",
            "undefined variable `y`",
            "`steps[0].timeout`: `never` is not a duration",
            "duplicate step id `a`",
            "unknown step `nothing`",
        ] {
            assert!(
                messages.iter().any(|m| m.starts_with(wanted)),
                "{wanted}: {messages:#?}"
            );
        }
    }

    #[test]
    fn warnings_alone_keep_the_pipeline() {
        let (pipeline, found) = run(r#"
            version: 1
            parameters:
              - {key: unused, input_type: string, requirement: optional, default: x}
            steps:
              - id: a
                decompose: {command: ls, context: c}
            "#);
        assert!(pipeline.is_some(), "{found:#?}");
        let warnings: Vec<(u32, &str)> = found
            .iter()
            .inspect(|d| assert_eq!(d.0, Severity::Warning, "{d:?}"))
            .map(|d| (d.1, d.3.as_str()))
            .collect();
        assert_eq!(
            warnings,
            [
                (
                    6,
                    "`steps[0].decompose.context` only applies to a subagent decompose (`source`/`instructions`); it is ignored"
                ),
                (
                    3,
                    "parameter `unused` is declared but never used in a template"
                ),
            ]
        );
    }

    #[test]
    fn an_unknown_key_is_an_error_with_the_key_it_may_mean() {
        let (pipeline, found) = run(r#"
            version: 1
            steps:
              - id: a
                decompose: {items: [x]}
                extra: 1
              - id: b
                fan_out: {over: a, instructions: "{{ item }}", colour: red}
                on_eror: continue
            "#);
        assert!(pipeline.is_none(), "{found:#?}");
        let errors: Vec<(u32, &str)> = found
            .iter()
            .inspect(|d| assert_eq!(d.0, Severity::Error, "{d:?}"))
            .map(|d| (d.1, d.3.as_str()))
            .collect();
        assert_eq!(
            errors,
            [
                (5, "unknown key `steps[0].extra`"),
                (7, "unknown key `steps[1].fan_out.colour`"),
                (
                    8,
                    "unknown key `steps[1].on_eror`; did you mean `on_error`?"
                ),
            ]
        );
    }

    #[test]
    fn template_variables() {
        let ok = |instructions: &str, kind: &str| {
            let text = format!(
                "version: 1\nparameters:\n  - {{key: p, input_type: string, requirement: required}}\nsteps:\n  - id: d\n    decompose: {{items: [1]}}\n  - id: s\n    {kind}: {{over: d, instructions: {instructions:?}, context: \"{{{{ p }}}}\"}}\n"
            );
            run(&text)
        };
        for (template, kind, error) in [
            ("{{ item }} {{ loop.index }} {{ agents }}", "fan_out", None),
            (
                "{% for a in agents %}{{ a.name }}{% endfor %}",
                "fan_out",
                None,
            ),
            (
                "{% for item in steps.d.items %}{{ item }}{{ loop.index }}{% endfor %}",
                "synthesize",
                None,
            ),
            (
                "{{ loop.index }}",
                "synthesize",
                Some("`loop` is only defined"),
            ),
            ("{{ items }}", "fan_out", Some("undefined variable `items`")),
            ("{{ steps.d.items | length }}", "fan_out", None),
        ] {
            let (pipeline, found) = ok(template, kind);
            let errors: Vec<&str> = found
                .iter()
                .filter(|d| d.0 == Severity::Error)
                .map(|d| d.3.as_str())
                .collect();
            let unknown_over = kind == "synthesize";
            match error {
                None => {
                    // synthesize has no `over`: that unknown key is the only error
                    let expected: &[&str] = if unknown_over {
                        &["unknown key `steps[1].synthesize.over`"]
                    } else {
                        &[]
                    };
                    assert_eq!(errors, expected, "{template}");
                    assert!(pipeline.is_some() || unknown_over);
                }
                Some(message) => assert!(
                    errors.iter().any(|e| e.starts_with(message)),
                    "{template}: {errors:?}"
                ),
            }
        }
    }

    #[test]
    fn min_success_forms() {
        let cases: &[(&str, Option<MinSuccess>)] = &[
            ("3", Some(MinSuccess::Count(3))),
            ("0", Some(MinSuccess::Count(0))),
            ("\"80%\"", Some(MinSuccess::Percent(80.0))),
            ("'12.5 %'", Some(MinSuccess::Percent(12.5))),
            ("100%", Some(MinSuccess::Percent(100.0))),
            ("\"3\"", Some(MinSuccess::Count(3))),
            ("101%", None),
            ("-1", None),
            ("0.5", None),
            ("most", None),
            ("[1]", None),
        ];
        for (value, want) in cases {
            let text = one_step(&format!(
                "  - id: d\n    decompose: {{items: [1]}}\n  - id: f\n    fan_out: {{over: d, instructions: x}}\n    min_success: {value}\n"
            ));
            let (pipeline, found) = run(&text);
            match want {
                Some(want) => {
                    let pipeline = pipeline.unwrap_or_else(|| panic!("{value}: {found:?}"));
                    assert_eq!(pipeline.steps[1].min_success, Some(*want), "{value}");
                }
                None => {
                    assert!(pipeline.is_none(), "{value}");
                    assert!(
                        found.iter().any(|d| (d.1, d.2) == (7, 18)
                            && d.3.starts_with("`steps[1].min_success` must be a count")),
                        "{value}: {found:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn timeouts() {
        for (value, want) in [
            ("90", Some(90_000)),
            ("0.5", Some(500)),
            ("\"90s\"", Some(90_000)),
            ("5m", Some(300_000)),
            ("1h30m", Some(5_400_000)),
            ("-3", None),
            ("true", None),
            ("5 minutes", None),
        ] {
            let text = one_step(&format!(
                "  - id: a\n    delegate: {{instructions: x}}\n    timeout: {value}\n"
            ));
            let (pipeline, found) = run(&text);
            match want {
                Some(ms) => assert_eq!(
                    pipeline.map(|p| p.steps[0].timeout),
                    Some(Some(Duration::from_millis(ms))),
                    "{value}: {found:?}"
                ),
                None => assert!(pipeline.is_none(), "{value}"),
            }
        }
    }

    #[test]
    fn version_forms() {
        for (value, ok) in [
            ("1", true),
            ("\"1\"", true),
            ("2", false),
            ("1.0", false),
            ("", false),
            ("[1]", false),
        ] {
            let text =
                format!("version: {value}\nsteps:\n  - id: a\n    delegate: {{instructions: x}}\n");
            assert_eq!(run(&text).0.is_some(), ok, "{value}");
        }
    }

    #[test]
    fn pipelines_are_told_from_recipes() {
        let doc = |text: &str| crate::yaml::parse(text).unwrap().unwrap();
        assert!(looks_like_pipeline(&doc("version: 1\nsteps: []\n")));
        assert!(looks_like_pipeline(&doc("steps:\n")));
        assert!(!looks_like_pipeline(&doc(
            "title: t\nsteps: []\ninstructions: x\n"
        )));
        assert!(!looks_like_pipeline(&doc("title: t\ninstructions: x\n")));
        assert!(!looks_like_pipeline(&doc("- steps\n")));
    }

    #[test]
    fn validate_takes_only_pipelines() {
        let check = |text: &str| {
            let mut diags = Diagnostics::default();
            let taken = validate_if_pipeline(&file(text), &mut diags).is_some();
            let messages: Vec<String> = diags.items.iter().map(|d| d.message.clone()).collect();
            (taken, messages)
        };
        assert_eq!(check("title: t\ninstructions: x\n"), (false, Vec::new()));
        assert_eq!(check("title: t\nsteps: [\n"), (false, Vec::new()));
        let (taken, messages) =
            check("version: 1\nsteps:\n  - id: a\n    delegate: {instructions: x}\n");
        assert!(taken && messages.is_empty(), "{messages:?}");
        let (taken, messages) = check("version: 1\nsteps:\n  - id: [\n");
        assert!(taken);
        assert!(messages[0].starts_with("invalid YAML"), "{messages:?}");
    }

    #[test]
    fn ids() {
        for (id, ok) in [
            ("a", true),
            ("_x9", true),
            ("Notes_2", true),
            ("2a", false),
            ("a-b", false),
            ("a.b", false),
            ("é", false),
            ("", false),
        ] {
            assert_eq!(is_valid_id(id), ok, "{id}");
        }
        assert_eq!(suggested_id("my-step"), "my_step");
        assert_eq!(suggested_id("1st"), "_1st");
    }
}
