//! Keeps the schemas equal to the parsers: at every place, the keys a parser reads are
//! exactly the properties the schema lists there.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::SchemaKind;
use crate::diag::{Diagnostics, SourceFile};
use crate::recipe::{Strictness, parse_recipe};
use crate::yaml::key_log;

/// A pipeline that has every key a pipeline may have, at every place.
const FULL_PIPELINE: &str = r#"
version: 1
name: all
description: every key
parameters:
  - {key: topic, input_type: string, requirement: optional, default: x, description: d, options: [x]}
settings: {provider: openai, model: m, temperature: 0.5, max_turns: 2, max_output_tokens: 9, stop: ["\n"], concurrency: 2, max_cost: 5}
steps:
  - id: listed
    decompose: {items: [a, b]}
  - id: agent_items
    decompose: {instructions: "list", source: r, parameters: {a: "1"}, context: c, extensions: [x], schema: {type: array}}
  - id: from_command
    decompose: {command: "echo a", file: f, glob: "*.md", gitignore: false, outside_project: false}
  - id: work
    fan_out: {over: listed, source: r, instructions: "do {{ item }}", parameters: {a: "1"}, context: c, extensions: [], schema: {type: object}}
    needs: [listed]
    concurrency: 2
    on_error: continue
    min_success: "50%"
    retries: 1
    timeout: 5m
    provider: openai
    model: m
    temperature: 1
    max_turns: 3
    max_output_tokens: 10
    stop: END
    allow_empty: true
    backend: batch
    reuse: true
    on_extension_error: fail
    cache: false
    context_window: 32000
    tools: [read_file]
  - id: sum
    synthesize: {instructions: "merge", source: r, parameters: {}, context: c, extensions: x}
    reduce: auto
    chunk_tokens: 4000
    reduce_instructions: "merge {{ steps.sum.partials }}"
  - id: one
    delegate: {instructions: "one", source: r, parameters: {}, context: c, extensions: x}
outputs:
  - {path: out.md, content: "{{ steps.sum.output }}", outside_project: false}
  - {path: out.csv, rows: work, columns: {id: "{{ item }}", label: "{{ data.label }}"}, only: completed, keep_formulas: false}
"#;

/// A recipe that has every key a recipe may have, at every place.
const FULL_RECIPE: &str = r#"
version: 1.0.0
title: t
description: d
instructions: i
prompt: p
author: {contact: me, metadata: x}
activities: [a]
parameters:
  - {key: k, input_type: string, requirement: required, default: x, description: d, options: [x]}
extensions:
  - {type: stdio, name: n, cmd: c, args: [a], envs: {A: b}, env_keys: [K], headers: {H: v}, uri: u, timeout: 3, available_tools: [t], description: d, bundled: true, display_name: D, code: x, dependencies: [], tools: [], instructions: x}
settings: {goose_provider: p, provider: p, goose_model: m, model: m, temperature: 0.1, max_turns: 2, stop: [END]}
response: {json_schema: {type: object}}
retry: {max_retries: 1, checks: [{type: shell, command: "true"}], on_failure: x, timeout_seconds: 1, on_failure_timeout_seconds: 1}
sub_recipes:
  - {name: s, path: sub.yaml, description: d, values: {a: b}, sequential_when_repeated: true}
"#;

/// goose desktop's export of a recipe.
const DESKTOP_RECIPE: &str = r#"
id: x
name: n
isGlobal: true
lastModified: now
isArchived: false
recipe: {title: t, description: d, instructions: i}
"#;

/// The keys the parser read, by place, while parsing `files`.
fn parsed_keys(files: &[(&str, &str)], pipeline: bool) -> BTreeMap<String, BTreeSet<String>> {
    key_log::collect(|| {
        for (path, text) in files {
            let file = SourceFile::new(*path, *text);
            let mut diags = Diagnostics::default();
            if pipeline {
                crate::pipeline::parse::parse_pipeline(&file, &mut diags);
            } else {
                parse_recipe(&file, Strictness::Strict, &mut diags);
            }
            let unknown: Vec<_> = diags
                .items
                .iter()
                .filter(|d| d.message.contains("unknown key"))
                .map(|d| d.message.clone())
                .collect();
            assert!(unknown.is_empty(), "{path}: {unknown:?}");
        }
    })
}

/// Every schema node `node` stands for: itself, what it refers to, its alternatives. A
/// definition is walked where it is first referred to (the parser reads goose desktop's
/// `recipe:` at the root, where the plain recipe is).
fn expand<'a>(
    root: &'a Value,
    node: &'a Value,
    seen: &mut BTreeSet<String>,
    out: &mut Vec<&'a Value>,
) {
    if let Some(reference) = node
        .get("$ref")
        .and_then(Value::as_str)
        .filter(|r| seen.insert((*r).to_owned()))
    {
        let target = reference
            .strip_prefix("#/$defs/")
            .and_then(|name| root.get("$defs")?.get(name));
        if let Some(target) = target {
            expand(root, target, seen, out);
        }
    }
    out.push(node);
    for combinator in ["anyOf", "oneOf", "allOf"] {
        for branch in node
            .get(combinator)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            expand(root, branch, seen, out);
        }
    }
}

/// The schema's properties at every place that has some, by the parser's path form.
fn schema_keys(schema: &Value) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    walk(
        schema,
        schema,
        String::new(),
        &mut BTreeSet::new(),
        &mut out,
    );
    out
}

fn walk(
    root: &Value,
    node: &Value,
    path: String,
    seen: &mut BTreeSet<String>,
    out: &mut BTreeMap<String, BTreeSet<String>>,
) {
    let mut nodes = Vec::new();
    expand(root, node, seen, &mut nodes);
    for node in nodes {
        if let Some(properties) = node.get("properties").and_then(Value::as_object) {
            let keys = out.entry(path.clone()).or_default();
            keys.extend(properties.keys().cloned());
            for (key, child) in properties {
                let child_path = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                walk(root, child, child_path, seen, out);
            }
        }
        if let Some(items) = node.get("items") {
            walk(root, items, format!("{path}[]"), seen, out);
        }
    }
}

fn assert_same(kind: SchemaKind, parsed: &BTreeMap<String, BTreeSet<String>>) {
    let schema = schema_keys(&kind.schema());
    for (path, keys) in parsed {
        let listed = schema.get(path).cloned().unwrap_or_default();
        assert_eq!(
            keys.iter().collect::<Vec<_>>(),
            listed.iter().collect::<Vec<_>>(),
            "{} schema at `{path}`: left is what the parser reads",
            kind.name()
        );
    }
    let unread: Vec<_> = schema.keys().filter(|p| !parsed.contains_key(*p)).collect();
    assert!(
        unread.is_empty(),
        "{} schema has mappings the parser never reads: {unread:?}",
        kind.name()
    );
}

#[test]
fn the_pipeline_schema_lists_exactly_the_keys_the_parser_reads() {
    let parsed = parsed_keys(&[("all.yaml", FULL_PIPELINE)], true);
    assert!(parsed.contains_key("steps[].fan_out"), "{parsed:?}");
    assert_same(SchemaKind::Pipeline, &parsed);
}

#[test]
fn the_recipe_schema_lists_exactly_the_keys_the_parser_reads() {
    let parsed = parsed_keys(
        &[("full.yaml", FULL_RECIPE), ("desktop.json", DESKTOP_RECIPE)],
        false,
    );
    assert!(parsed.contains_key("retry.checks[]"), "{parsed:?}");
    assert_same(SchemaKind::Recipe, &parsed);
}

#[test]
fn the_agent_schema_lists_exactly_the_frontmatter_keys_summon_reads() {
    let schema = SchemaKind::Agent.schema();
    let listed: BTreeSet<&str> = schema["properties"]
        .as_object()
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let read: BTreeSet<&str> = crate::agent::FRONTMATTER_KEYS.into_iter().collect();
    assert_eq!(listed, read);
}

#[test]
fn the_walk_finds_a_key_missing_from_a_schema() {
    // The check itself must be able to fail: a schema without `settings.model`.
    let mut schema = SchemaKind::Pipeline.schema();
    if let Some(settings) = schema["properties"]["settings"]["properties"].as_object_mut() {
        settings.remove("model");
    }
    let parsed = parsed_keys(&[("all.yaml", FULL_PIPELINE)], true);
    let keys = schema_keys(&schema);
    assert_ne!(keys.get("settings"), parsed.get("settings"));
}
