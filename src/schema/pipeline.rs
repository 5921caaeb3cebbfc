//! The schema of a pipeline file (format version 1).

use serde_json::{Map, Value, json};

fn text(description: &str) -> Value {
    json!({"description": description, "type": "string"})
}

/// A string that is rendered as a template.
fn template(description: &str) -> Value {
    json!({"description": format!("{description} A template (`{{{{ ... }}}}`)."), "type": "string"})
}

fn tier() -> Value {
    json!({
        "description": "The service tier of the requests: standard (default); flex (OpenAI: batch prices, slower answers, a 429 when capacity is short); priority (OpenAI: faster, dearer); batch (fan_out only: `backend: batch`). Priced by the tier the provider says served each answer.",
        "enum": ["standard", "flex", "priority", "batch"]
    })
}

fn flex_fallback() -> Value {
    json!({
        "description": "standard: a flex request the provider has no capacity for (429) is sent at once at the standard tier, and priced so; none (default): retried at flex with backoff.",
        "enum": ["standard", "none"]
    })
}

fn whole(description: &str, minimum: u64) -> Value {
    json!({"description": description, "type": "integer", "minimum": minimum})
}

fn temperature() -> Value {
    json!({"description": "Sampling temperature, 0 to 2.", "type": "number", "minimum": 0, "maximum": 2})
}

/// The keys a task (fan_out, synthesize, delegate, a subagent decompose) has.
fn task_properties() -> Map<String, Value> {
    let value = json!({
        "source": template("The recipe or agent that runs the task, by name or path (`review`, `recipes/review.yaml`)."),
        "instructions": template("What the task does: the instructions of a subagent without a source, or added to the source's."),
        "parameters": {
            "description": "Values for the source's parameters, each a template.",
            "type": "object",
            "additionalProperties": {"type": ["string", "number", "boolean", "null"]}
        },
        "context": template("Text added to the task's first message."),
        "extensions": {
            "description": "The MCP servers the task may use, by name: a list, one name, or `[]` for none. Absent: the source's own.",
            "anyOf": [
                {"type": "array", "items": {"type": "string"}},
                {"type": "string"},
                {"type": "null"}
            ]
        }
    });
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// A task step body: `source`, `instructions` or both, plus `extra` keys.
fn task(description: &str, extra: &[(&str, Value)], required: &[&str]) -> Value {
    let mut properties = task_properties();
    for (key, value) in extra {
        properties.insert((*key).to_owned(), value.clone());
    }
    json!({
        "description": description,
        "type": "object",
        "properties": properties,
        "required": required,
        "anyOf": [{"required": ["source"]}, {"required": ["instructions"]}],
        "additionalProperties": false
    })
}

fn decompose() -> Value {
    let mut properties = task_properties();
    for (key, value) in [
        (
            "command",
            template("A shell command; each line of its output is an item."),
        ),
        (
            "items",
            json!({"description": "The items, written out.", "type": "array"}),
        ),
        (
            "file",
            template("A CSV or JSONL file; each row or line is an item."),
        ),
        (
            "glob",
            template("A glob pattern; each matching path is an item."),
        ),
        (
            "outside_project",
            json!({
                "description": "With `file`: read the items file even outside the working directory (`..`, an absolute path, a link that leads out); without it such a file is refused, as `glob` refuses such a pattern.",
                "type": "boolean",
                "default": false
            }),
        ),
        (
            "schema",
            json!({
                "description": "For a subagent: the JSON Schema its answer must match, over its source's `response.json_schema`; an array, or an object whose required `items` property is an array.",
                "type": "object"
            }),
        ),
        (
            "gitignore",
            json!({
                "description": "With `glob`: leave out what `.gitignore`, `.ignore` and `.git/info/exclude` leave out (the default); `false` matches every file.",
                "type": "boolean",
                "default": true
            }),
        ),
    ] {
        properties.insert(key.to_owned(), value);
    }
    use crate::pipeline::model::{DECOMPOSE_AGENT_KEYS, DECOMPOSE_FORMS};
    let forms = DECOMPOSE_FORMS.into_iter().chain(DECOMPOSE_AGENT_KEYS);
    json!({
        "description": "Produces the work items: exactly one of `command`, `items`, `file`, `glob`, or a subagent (`source`/`instructions`) whose answer is a JSON array.",
        "type": "object",
        "properties": properties,
        "anyOf": forms.map(|f| json!({"required": [f]})).collect::<Vec<_>>(),
        "additionalProperties": false
    })
}

fn step() -> Value {
    let kinds = ["decompose", "fan_out", "synthesize", "delegate"];
    json!({
        "type": "object",
        "required": ["id"],
        "properties": {
            "id": {
                "description": "The step's name; later templates read its results as `steps.<id>`.",
                "type": "string",
                "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"
            },
            "decompose": decompose(),
            "fan_out": task(
                "One task per item of the step named in `over`, at most `concurrency` at a time; `{{ item }}` is the item.",
                &[
                    ("over", text("The id of the decompose step whose items to iterate.")),
                    (
                        "schema",
                        json!({
                            "description": "The JSON Schema every answer must match (as a recipe's `response.json_schema`); the parsed answers are `r.data`.",
                            "type": "object"
                        }),
                    ),
                ],
                &["over"],
            ),
            "synthesize": task("One task that reads earlier steps' results (`steps.<id>.results`).", &[], &[]),
            "delegate": task("One task.", &[], &[]),
            "needs": {
                "description": "Steps that must finish first, besides the ones the templates read: an id or a list of ids.",
                "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
            },
            "concurrency": whole("At most this many of the step's tasks at a time.", 1),
            "on_error": {
                "description": "fail_fast (default): the first failed task stops the run; continue: the others go on, and the step fails only when none succeeded (unless min_success: 0).",
                "enum": ["fail_fast", "continue"]
            },
            "min_success": {
                "description": "fan_out: the step succeeds when at least this many tasks do: a count (`8`) or a percentage (`\"80%\"`); 0 lets every task fail.",
                "anyOf": [
                    {"type": "integer", "minimum": 0},
                    {"type": "string", "pattern": "^\\s*([0-9]+|[0-9]+(\\.[0-9]+)?\\s*%)\\s*$"}
                ]
            },
            "retries": whole("Retries of a failed task.", 0),
            "timeout": {
                "description": "How long one task may take: seconds, or a duration (`90s`, `5m`, `1h30m`).",
                "anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "string"}]
            },
            "provider": text("The provider for this step's tasks."),
            "model": text("The model for this step's tasks."),
            "temperature": temperature(),
            "max_turns": whole("At most this many model turns for one task.", 1),
            "max_output_tokens": whole("At most this many output tokens for one answer.", 1),
            "stop": super::recipe::stop(),
            "allow_empty": {"description": "An empty answer counts as success (by default it fails the task).", "type": "boolean"},
            "backend": {
                "description": "live (default): one request per turn; batch (fan_out only): the provider's batch API, cheaper and slower.",
                "enum": ["live", "batch"]
            },
            "tier": tier(),
            "flex_fallback": flex_fallback(),
            "reuse": {"description": "Take the answer of an earlier run to the same request instead of sending it again.", "type": "boolean"},
            "sandbox": sandbox(),
            "network": network(),
            "on_extension_error": {
                "description": "A task whose extension (MCP server) did not start or failed: warn (default) keeps the status its answer gives it, fail fails it. Either way its result lists the warnings.",
                "enum": ["warn", "fail"]
            },
            "cache": {"description": "false: no prompt caching for this step (no cache breakpoints or cache key, no warm-up task).", "type": "boolean"},
            "context_window": whole("The model's context window in tokens for this step's requests, over the config file's `models` and the built-in one; a request that cannot fit fails before it is sent.", 1),
            "reduce": {
                "description": "synthesize: auto reduces the results hierarchically, in chunks that each fit the context window, then the partial answers the same way, until one answer remains.",
                "enum": ["auto"]
            },
            "chunk_tokens": whole("synthesize: reduce hierarchically with at most this many tokens of results per chunk.", 1),
            "reduce_instructions": text("synthesize with reduce: the instructions of the upper levels, over `steps.<id>.partials` (default: the step's own instructions over the partial answers)."),
            "tools": {
                "description": "The tools this step's tasks are sent, a subset of what they have: names as the model sees them (read_file, write_file, edit_file, list_files, search, shell, EXT__TOOL) or whole extensions (developer, an MCP extension's name). [] sends none.",
                "type": ["array", "null"],
                "items": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"}
            }
        },
        "oneOf": kinds.iter().map(|k| json!({"required": [k]})).collect::<Vec<_>>(),
        "additionalProperties": false
    })
}

/// The sandbox policy of the commands the model runs through `shell`.
pub(super) fn sandbox() -> Value {
    json!({
        "description": "Where the commands the model runs may write: workspace-write (default: the working directory and a private TMPDIR), read-only, or off (no sandbox).",
        "enum": ["workspace-write", "read-only", "off"]
    })
}

/// The network grant that goes with the sandbox.
pub(super) fn network() -> Value {
    json!({"description": "Whether sandboxed commands may use the network (default false).", "type": "boolean"})
}

pub(super) fn schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": super::id("pipeline"),
        "title": "summon pipeline",
        "description": "A pipeline for `summon run`: decompose work into items, fan out one task per item, synthesize the results.",
        "type": "object",
        "required": ["version", "steps"],
        "properties": {
            "version": {"description": "The format version: 1.", "enum": [1, "1"]},
            "name": text("The pipeline's name (default: the file name)."),
            "description": text("What the pipeline does."),
            "parameters": super::recipe::parameters(),
            "settings": {
                "description": "Defaults for every step.",
                "type": "object",
                "properties": {
                    "provider": text("The provider: openai, anthropic, ollama, ... or a preset of summon.yaml."),
                    "model": text("The model name."),
                    "temperature": temperature(),
                    "max_turns": whole("At most this many model turns for one task.", 1),
                    "max_output_tokens": whole("At most this many output tokens for one answer.", 1),
                    "stop": super::recipe::stop(),
                    "concurrency": whole("At most this many tasks in flight (`--concurrency` overrides; default 8).", 1),
                    "tier": tier(),
                    "flex_fallback": flex_fallback(),
                    "max_cost": {"description": "A spend cap in USD for the run: no task starts that could cross it (`--max-cost` overrides; the config file's `max_cost` is the default).", "type": "number", "exclusiveMinimum": 0},
                    "sandbox": sandbox(),
                    "network": network()
                },
                "additionalProperties": false
            },
            "steps": {
                "description": "The steps, each with an `id` and exactly one of `decompose`, `fan_out`, `synthesize`, `delegate`.",
                "type": "array",
                "minItems": 1,
                "items": step()
            },
            "outputs": {
                "description": "Files written when every step succeeded.",
                "type": "array",
                "items": {
                    "description": "A text file (`path`, `content`), or a table (`path` ending .csv or .jsonl, `rows`, `columns`, optionally `only`, `keep_formulas`).",
                    "type": "object",
                    "required": ["path"],
                    "oneOf": [
                        {"required": ["content"], "not": {"required": ["rows"]}},
                        {"required": ["rows", "columns"], "not": {"required": ["content"]}}
                    ],
                    "properties": {
                        "path": template("The file to write; a table's ends with .csv (a header, then one record per row) or .jsonl (one object per row)."),
                        "content": template("What to write in it."),
                        "rows": {
                            "description": "A table: the fan_out step whose tasks are its rows, one per item in item order.",
                            "type": "string"
                        },
                        "columns": {
                            "description": "A table's columns, in order: name to template over `item`, `data`, `output`, `status` (completed or failed) and `error`.",
                            "type": "object",
                            "minProperties": 1,
                            "additionalProperties": {"type": ["string", "number", "boolean"]}
                        },
                        "only": {
                            "description": "`completed`: failed items are left out of the table.",
                            "enum": ["completed"]
                        },
                        "keep_formulas": {
                            "description": "true: CSV cells that start like a spreadsheet formula (`=`, `+`, `-`, `@`, tab, carriage return) are written as they are; by default they get a leading `'` so a spreadsheet shows them as text.",
                            "type": "boolean"
                        },
                        "outside_project": {
                            "description": "true: the rendered path may leave the project (`..`, an absolute path, a symbolic link); without it such a path is refused. `summon validate` warns about it.",
                            "type": "boolean"
                        }
                    },
                    "additionalProperties": false
                }
            }
        },
        "additionalProperties": false
    })
}
