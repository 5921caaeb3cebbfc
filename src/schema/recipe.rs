//! The schema of a goose recipe, and of the parameters that pipelines declare the same way.

use serde_json::{Value, json};

/// A scalar goose reads as text (`version: 1.0` is a number in YAML but text to goose).
fn scalar(description: &str) -> Value {
    json!({"description": description, "type": ["string", "number", "boolean"]})
}

/// `stop`: one stop sequence or a list of at most four (shared with the pipeline schema).
pub(super) fn stop() -> Value {
    json!({
        "description": "Stop sequences: the answer ends before the first of them the model writes (at most 4).",
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 4}
        ]
    })
}

fn text(description: &str) -> Value {
    json!({"description": description, "type": "string"})
}

/// A list of strings, or one string.
fn strings(description: &str) -> Value {
    json!({
        "description": description,
        "anyOf": [
            {"type": "array", "items": {"type": ["string", "number", "boolean"]}},
            {"type": "string"}
        ]
    })
}

/// A mapping of names to text values.
fn string_map(description: &str) -> Value {
    json!({
        "description": description,
        "type": "object",
        "additionalProperties": {"type": ["string", "number", "boolean", "null"]}
    })
}

fn whole(description: &str, minimum: u64) -> Value {
    json!({"description": description, "type": "integer", "minimum": minimum})
}

/// `parameters`: the list of a recipe's (or a pipeline's) inputs.
pub(super) fn parameters() -> Value {
    json!({
        "description": "The inputs, given with `--param KEY=VALUE` (or a pipeline's `parameters:` for a source) and read in templates as `{{ KEY }}`.",
        "type": "array",
        "items": {
            "type": "object",
            "required": ["key"],
            "properties": {
                "key": text("The parameter's name, as used in templates (`{{ key }}`) and `--param key=...`."),
                "input_type": {
                    "description": "The kind of value: string (default), number, boolean, date, file (the value is a path whose content is inserted), select (one of `options`).",
                    "enum": ["string", "number", "boolean", "date", "file", "select"]
                },
                "requirement": {
                    "description": "required (default): must be given; optional: may be omitted, then `default` is used; user_prompt: asked for interactively.",
                    "enum": ["required", "optional", "user_prompt"]
                },
                "default": scalar("The value used when none is given (not allowed for a file parameter)."),
                "description": text("What the parameter is for; shown by `summon explain`."),
                "options": strings("The allowed values of a select parameter.")
            },
            "additionalProperties": true
        }
    })
}

fn extension() -> Value {
    json!({
        "anyOf": [
            {
                "description": "A builtin extension by name (the older cookbook form, `- Developer`).",
                "type": "string"
            },
            {
                "type": "object",
                "required": ["type", "name"],
                "properties": {
                    "type": {
                        "description": "How the extension runs: builtin, platform, stdio (a local command), streamable_http or sse (a URL), inline_python, frontend.",
                        "type": "string",
                        "examples": ["builtin", "platform", "stdio", "streamable_http", "sse", "inline_python", "frontend"]
                    },
                    "name": text("The extension's name; its tools are called `NAME__TOOL`."),
                    "cmd": text("stdio: the command to start."),
                    "args": strings("stdio: the command's arguments."),
                    "envs": string_map("Environment variables set for the extension."),
                    "env_keys": strings("Names of environment variables passed through from the caller."),
                    "headers": string_map("streamable_http/sse: HTTP headers sent with each request."),
                    "uri": text("streamable_http/sse: the server's URL."),
                    "timeout": whole("Seconds to wait for one tool call.", 0),
                    "sandbox": super::pipeline::sandbox(),
                    "network": super::pipeline::network(),
                    "available_tools": strings("Only these of the extension's tools are offered to the model."),
                    "description": text("What the extension is for."),
                    "bundled": {"description": "goose desktop bookkeeping; ignored."},
                    "display_name": {"description": "goose desktop's label; ignored."},
                    "code": {"description": "inline_python: the code goose runs; ignored by summon."},
                    "dependencies": {"description": "inline_python: packages goose installs; ignored by summon."},
                    "tools": {"description": "frontend: tools the goose UI provides; ignored by summon."},
                    "instructions": {"description": "frontend: instructions for the goose UI; ignored by summon."}
                },
                "additionalProperties": true
            }
        ]
    })
}

fn recipe_body() -> Value {
    json!({
        "type": "object",
        "properties": {
            "version": scalar("The recipe format's version (goose writes `1.0.0`)."),
            "title": text("A short title (required)."),
            "description": text("What the recipe does (required)."),
            "instructions": text("The system prompt: how the model should work. A template: `{{ param }}` inserts a parameter. A recipe needs `instructions` or `prompt`."),
            "prompt": text("The first user message. A template like `instructions`."),
            "author": {
                "description": "Who wrote the recipe: a name, or a mapping with `contact`.",
                "anyOf": [
                    {"type": "string"},
                    {
                        "type": "object",
                        "properties": {
                            "contact": text("How to reach the author."),
                            "metadata": {"description": "Anything else about the author; ignored."}
                        },
                        "additionalProperties": true
                    }
                ]
            },
            "activities": strings("Suggested first messages, shown by goose's UI."),
            "parameters": parameters(),
            "extensions": {
                "description": "The MCP servers (goose extensions) whose tools the model may use.",
                "type": "array",
                "items": extension()
            },
            "settings": {
                "description": "Provider and model settings for this recipe (the command line and summon.yaml can override them).",
                "type": "object",
                "properties": {
                    "goose_provider": text("The provider (goose's name for it; wins over `provider`)."),
                    "provider": text("The provider: openai, anthropic, ollama, ... or a preset of summon.yaml."),
                    "goose_model": text("The model (goose's name for it; wins over `model`)."),
                    "model": text("The model name."),
                    "temperature": {"description": "Sampling temperature, 0 to 2.", "type": "number", "minimum": 0, "maximum": 2},
                    "max_turns": whole("At most this many model turns for one task.", 1),
                    "stop": stop()
                },
                "additionalProperties": true
            },
            "response": {
                "description": "Structured output: the final answer must match a JSON Schema.",
                "type": "object",
                "properties": {
                    "json_schema": {"description": "The JSON Schema the final answer must match.", "type": "object"}
                },
                "additionalProperties": true
            },
            "retry": {
                "description": "Run the task again when a shell check fails after it (goose's retry).",
                "type": "object",
                "required": ["max_retries", "checks"],
                "properties": {
                    "max_retries": whole("How many times to retry at most.", 1),
                    "checks": {
                        "description": "Shell commands that must all succeed after the task; one failing means a retry.",
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["command"],
                            "properties": {
                                "type": {"description": "The check's kind: only `shell` exists.", "const": "shell"},
                                "command": text("The shell command; exit status 0 passes.")
                            },
                            "additionalProperties": true
                        }
                    },
                    "on_failure": text("A shell command run before each retry (to reset state)."),
                    "timeout_seconds": whole("Seconds each check may take.", 1),
                    "on_failure_timeout_seconds": whole("Seconds `on_failure` may take.", 1)
                },
                "additionalProperties": true
            },
            "sub_recipes": {
                "description": "Other recipes the model may run as tools.",
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "path"],
                    "properties": {
                        "name": text("The tool's name."),
                        "path": text("The sub-recipe's file, relative to this recipe."),
                        "description": text("What the sub-recipe does, for the model."),
                        "values": string_map("Parameter values fixed for the sub-recipe."),
                        "sequential_when_repeated": {"description": "goose's scheduling hint; ignored by summon.", "type": "boolean"}
                    },
                    "additionalProperties": true
                }
            }
        },
        "required": ["title", "description"],
        "anyOf": [{"required": ["instructions"]}, {"required": ["prompt"]}],
        "additionalProperties": true
    })
}

/// A recipe, or goose desktop's export of one (the recipe under `recipe:`).
pub(super) fn schema() -> Value {
    let mut body = recipe_body();
    allow_null(&mut body);
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": super::id("recipe"),
        "title": "goose recipe",
        "description": "A goose recipe as summon reads it: `summon delegate NAME`, or a pipeline step's `source`. Keys goose does not know are ignored by goose, and warned about by `summon validate`.",
        "$defs": {"recipe": body},
        "anyOf": [
            {"$ref": "#/$defs/recipe"},
            {
                "description": "goose desktop's export: the recipe under `recipe:`.",
                "type": "object",
                "required": ["recipe"],
                "properties": {
                    "recipe": {"$ref": "#/$defs/recipe", "description": "The recipe itself."},
                    "name": text("The desktop's name for the saved recipe."),
                    "id": {"description": "The desktop's id; ignored."},
                    "isGlobal": {"description": "The desktop's scope flag; ignored."},
                    "lastModified": {"description": "The desktop's timestamp; ignored."},
                    "isArchived": {"description": "The desktop's archive flag; ignored."}
                },
                "additionalProperties": true
            }
        ]
    })
}

/// Lets every key of every mapping below `node` be null: goose and summon read a null value
/// as an absent key, and shared recipes have them (`sub_recipes: null`).
fn allow_null(node: &mut Value) {
    let Some(object) = node.as_object_mut() else {
        return;
    };
    if let Some(Value::Object(properties)) = object.get_mut("properties") {
        for property in properties.values_mut() {
            allow_null(property);
            make_nullable(property);
        }
    }
    for key in ["items", "anyOf"] {
        match object.get_mut(key) {
            Some(Value::Array(branches)) => branches.iter_mut().for_each(allow_null),
            Some(child) => allow_null(child),
            None => {}
        }
    }
}

fn make_nullable(property: &mut Value) {
    let Some(object) = property.as_object_mut() else {
        return;
    };
    if let Some(kind) = object.get_mut("type") {
        match kind {
            Value::String(name) => *kind = json!([name.clone(), "null"]),
            Value::Array(names) if !names.contains(&json!("null")) => names.push(json!("null")),
            _ => {}
        }
    } else if let Some(Value::Array(values)) = object.get_mut("enum") {
        values.push(Value::Null);
    } else if let Some(Value::Array(branches)) = object.get_mut("anyOf") {
        branches.push(json!({"type": "null"}));
    }
}
