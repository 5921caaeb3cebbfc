//! The text of a new pipeline, `pipelines/NAME.yaml`: decompose, fan out, synthesize.

use super::param_spec::ParamSpec;
use super::recipe::parameters_yaml;
use super::yaml_text::scalar;

/// What `summon new pipeline` was given.
#[derive(Debug, Clone)]
pub(crate) struct PipelineSpec<'a> {
    pub(crate) name: &'a str,
    pub(crate) description: &'a str,
    /// The recipe or agent that gets each item, with the parameters it requires and the
    /// value each gets (a template).
    pub(crate) source: Option<(&'a str, Vec<(String, String)>)>,
    pub(crate) params: &'a [ParamSpec],
    pub(crate) model: Option<&'a str>,
}

/// The pipeline file, every step commented.
pub(crate) fn pipeline_text(spec: &PipelineSpec<'_>) -> String {
    let name = spec.name;
    let mut text = format!(
        "# Pipeline `{name}` (format version 1): `summon run pipelines/{name}.yaml`.\n\
         # `summon validate pipelines/{name}.yaml` checks it; `summon run ... --dry-run` shows the\n\
         # plan and sends nothing.\n\
         version: 1\n\
         name: {name}\n"
    );
    text.push_str(&format!("description: {}\n", scalar(spec.description)));
    if !spec.params.is_empty() {
        text.push_str("# Values come from --param KEY=VALUE; `{{ KEY }}` inserts one.\n");
        text.push_str(&parameters_yaml(spec.params));
    }
    text.push_str("settings:\n");
    text.push_str(
        "  concurrency: 4            # tasks in flight at most (--concurrency N overrides)\n",
    );
    match spec.model {
        Some(model) => text.push_str(&format!("  model: {}\n", scalar(model))),
        None => {
            text.push_str("  # model: gpt-4o-mini     # default: the provider's, or SUMMON_MODEL\n")
        }
    }
    text.push_str(
        "steps:\n\
         \x20 # The work items: `items` (a list), `command` (one item per output line), `file`\n\
         \x20 # (CSV or JSONL), `glob` (matching paths), or a subagent (`instructions`) whose\n\
         \x20 # answer is a JSON array.\n\
         \x20 - id: items\n\
         \x20   decompose:\n\
         \x20     items: [first, second, third]\n\
         \x20 # One task per item, at most `concurrency` at a time; `{{ item }}` is the item.\n\
         \x20 - id: work\n\
         \x20   fan_out:\n\
         \x20     over: items\n",
    );
    if let Some((source, required)) = &spec.source {
        text.push_str(&format!("      source: {}\n", scalar(source)));
        if !required.is_empty() {
            text.push_str("      parameters:             # the source's required parameters\n");
            for (key, value) in required {
                text.push_str(&format!("        {}: {}\n", scalar(key), scalar(value)));
            }
        }
    }
    text.push_str("      instructions: |\n        Work on {{ item }}.\n");
    for p in spec.params {
        text.push_str(&format!("        {}: {{{{ {} }}}}\n", p.key, p.key));
    }
    text.push_str(if spec.source.is_some() {
        "\x20   # tools: [read_file]        # only narrows the tools its source declares\n"
    } else {
        "\x20   # tools: [read_file, list_files]  # written inline, a step gets only the tools it\n\
         \x20   #                                 # names (`extensions: [developer]`: shell too)\n"
    });
    text.push_str(
        "\x20   on_error: continue        # a failed item does not stop the others\n\
         \x20 # One task that merges the results, in item order.\n\
         \x20 - id: summary\n\
         \x20   synthesize:\n\
         \x20     instructions: |\n\
         \x20       Merge these results into one answer:\n\
         \x20       {% for r in steps.work.results %}\n\
         \x20       ## {{ r.item }} ({{ r.status }})\n\
         \x20       {{ r.output }}\n\
         \x20       {% endfor %}\n\
         # outputs:                     # files written when every step succeeded\n\
         #   - path: out/summary.md\n\
         #     content: \"{{ steps.summary.output }}\"\n",
    );
    text
}
