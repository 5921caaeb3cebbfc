//! `summon run --dry-run`: the plan of a run, with every request that needs no model output
//! drafted as the run would send it, and nothing sent.
//!
//! Static decompose steps (`items`, `command`, `glob`, `file`) are expanded, so fan-out widths
//! are known. Every task whose templates read only parameters, `item`, `loop` and the items of
//! those steps is rendered and prepared like a real task (source, parameters, system prompt,
//! first message, built-in tools), without a provider: its input tokens are estimated from its
//! first request the same way the token budget estimates them. Tasks that read model output
//! (`steps.<id>.output|results` of a subagent step, or the items of a subagent decompose) are
//! rendered when the run gets there and are left out of the estimate, which says so.
//!
//! A file of items is streamed, never held whole. Commands run (a dry run needs their items),
//! expanded as the run expands them; a command, glob or file that fails here is reported, as
//! it may work once earlier steps ran. The plan starts from the compiled pipeline
//! ([`crate::compile`]): what the compile finds (sources, tools, parameters, items files,
//! templates over literal items) is reported first, at its position; a template that fails
//! to render over the items expanded here, or a source they name that the catalog lacks, is
//! an error the run would hit too.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::step::{
    Compiled, Rendered, StepConfig, expects_data, prepare_message, task_request, task_source,
};
use crate::compile::{
    Check, CompiledPipeline, Contexts, ItemSource, agents_json, base_context, check_task,
    item_context,
};
use crate::config::{Config, resolve::resolve_with};
use crate::delegation::{Draft, Resolver, draft};
use crate::env::Env;
use crate::pipeline::graph::{Graph, step_templates};
use crate::pipeline::items::{self, StaticForm, expand_items, open_file_items};
use crate::pipeline::model::{Decompose, Pipeline, Step, StepKind, TaskTemplate};
use crate::pipeline::refs;
use crate::provider::ToolSpec;
use crate::source::Catalog;

/// The plan of one step.
#[derive(Debug, Default)]
pub(crate) struct StepPlan {
    pub(crate) id: String,
    pub(crate) kind: &'static str,
    /// The steps it waits for.
    pub(crate) needs: Vec<String>,
    /// Items (decompose by items, command, glob or file) or tasks; `None` until the run knows.
    pub(crate) width: Option<u64>,
    /// Subagent tasks it sends; `None` until the run knows.
    pub(crate) tasks: Option<u64>,
    /// Tasks whose first request was drafted.
    pub(crate) drafted: u64,
    /// Their estimated input tokens.
    pub(crate) input_tokens: u64,
    /// Their per-task overhead: tokens beyond their own text (tools, standard prompt, labels).
    pub(crate) overhead: crate::event::OverheadSum,
    /// The model of the first drafted task (`None`: none drafted, or no model configured).
    pub(crate) model: Option<String>,
    /// The first drafted task's first user message.
    pub(crate) prompt: Option<String>,
    /// Why some of its requests are known only during the run.
    pub(crate) later: Option<String>,
    /// Warnings its tasks would print (extensions, left-out tools), once each.
    pub(crate) notes: Vec<String>,
    /// The output limit of its first drafted task's requests, and why.
    pub(crate) output_limit: Option<DryCap>,
    /// A reducing synthesis: the expected tasks of each level.
    pub(crate) levels: Option<LevelsPlan>,
}

/// A step's output limit as the dry run tells it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DryCap {
    /// The limit of the first request; `None`: none sent (the provider's own).
    pub(crate) tokens: Option<u32>,
    pub(crate) source: crate::subagent::output_cap::CapSource,
    /// The step's later tasks learn their limit from its answers.
    pub(crate) learned: bool,
    pub(crate) local: bool,
    pub(crate) kind: crate::provider::ProviderKind,
}

impl DryCap {
    /// `4,096 tokens for the first answer (summon's runaway guard for a local server), then
    /// learned from the step's answers (twice the longest plus 32)`
    pub(crate) fn describe(&self) -> String {
        use crate::subagent::output_cap::CapSource;
        let tokens = match self.tokens {
            Some(n) => format!("{} tokens", crate::text::thousands(u64::from(n))),
            None => "none sent".to_owned(),
        };
        match self.source {
            CapSource::Explicit => format!("{tokens} per answer (max_output_tokens)"),
            CapSource::Schema => format!(
                "{tokens} per answer (bounded by the answer's JSON schema; an answer cut off there \
                 is sent again with the full limit)"
            ),
            CapSource::Learned | CapSource::Full => {
                let why = match (self.kind, self.local, self.tokens) {
                    (crate::provider::ProviderKind::Anthropic, _, _) => {
                        "Anthropic requires one".to_owned()
                    }
                    (_, true, _) => "summon's runaway guard for a local server".to_owned(),
                    (_, false, _) => "the provider's own limit: a hosted provider ends answers \
                                      itself"
                        .to_owned(),
                };
                if self.learned {
                    format!(
                        "{tokens} for the first answer ({why}), then learned from the step's \
                         answers (twice the longest plus 32; one cut off is sent again with the \
                         full limit); max_output_tokens sets one"
                    )
                } else {
                    format!("{tokens} per answer ({why}; max_output_tokens sets one)")
                }
            }
        }
    }
}

/// The expected levels of a hierarchical reduction (`reduce`, `chunk_tokens`).
#[derive(Debug, Default)]
pub(crate) struct LevelsPlan {
    /// Tasks per level, from level 1; empty when every result fits one request.
    pub(crate) tasks: Vec<u64>,
    /// The tokens of results one chunk holds.
    pub(crate) chunk_tokens: u64,
    /// The tokens counted for each result, and whether that is its output limit.
    pub(crate) per_result: u64,
    pub(crate) from_limit: bool,
    /// The tokens counted for each partial answer of the upper levels.
    pub(crate) per_partial: u64,
    /// The chunks of the last level do not shrink: the reduction would not converge.
    pub(crate) diverges: bool,
    /// `reduce: auto`: the context window the chunks fill, and where it comes from.
    pub(crate) window: Option<(u64, String)>,
}

/// The tokens counted for an answer without an output limit.
const ANSWER_ESTIMATE: u64 = 500;
/// Levels beyond this are not planned (the run stops there too).
const MAX_PLANNED_LEVELS: usize = 32;

/// The expected tasks per level of reducing `n` results of `per_result` tokens in chunks of
/// `budget` tokens, the partial answers taking `per_partial` tokens each.
pub(crate) fn levels(n: u64, per_result: u64, per_partial: u64, budget: u64) -> (Vec<u64>, bool) {
    let per_chunk = |cost: u64| (budget / cost.max(1)).max(1);
    let first = n.div_ceil(per_chunk(per_result));
    if first <= 1 {
        return (Vec::new(), false);
    }
    let mut tasks = vec![first];
    let mut m = first;
    while m > 1 && tasks.len() < MAX_PLANNED_LEVELS {
        let next = m.div_ceil(per_chunk(per_partial));
        if next >= m {
            return (tasks, true);
        }
        tasks.push(next);
        m = next;
    }
    (tasks, m > 1)
}

/// The expected levels of synthesize step `i`, when it reduces and its fan-out's width is
/// known.
fn plan_levels(
    env: &Env,
    config: &Config,
    compiled: &CompiledPipeline,
    i: usize,
    plans: &[StepPlan],
) -> Option<LevelsPlan> {
    let pipeline = &compiled.pipeline;
    let step = &pipeline.steps[i];
    let (StepKind::Synthesize(task), Some(reduce)) = (&step.kind, &step.reduce) else {
        return None;
    };
    let over = pipeline.reduced_step(step)?;
    let n = plans[over].tasks?;
    let fan_out = &compiled.steps[over].settings;
    let own = &compiled.steps[i].settings;
    let (per_result, from_limit) = match fan_out.max_output_tokens {
        Some(limit) => (u64::from(limit), true),
        None => (ANSWER_ESTIMATE, false),
    };
    let per_partial = own.max_output_tokens.map_or(ANSWER_ESTIMATE, u64::from);
    let mut window_from = None;
    let budget = match reduce.chunk_tokens {
        Some(tokens) => tokens,
        None => {
            let overrides = crate::config::resolve::Overrides {
                provider_flag: own.provider.as_deref(),
                model_flag: own.model.as_deref(),
                ..Default::default()
            };
            let model = resolve_with(env, config, &overrides, |_| false)
                .or_else(|_| resolve_with(env, config, &overrides, |_| true))
                .ok()
                .map(|r| r.model);
            let (window, from) = match step.context_window {
                Some(tokens) => (tokens, "the step's `context_window`".to_owned()),
                None => model.as_deref().and_then(|m| config.window_origin(m))?,
            };
            window_from = Some((window, from));
            // The prompt without results and the synthesis's own output limit.
            let template: usize = task
                .instructions
                .iter()
                .chain(task.context.iter())
                .map(|t| t.text.len())
                .sum();
            let fixed = (template as u64).div_ceil(4) + own.max_output_tokens.map_or(0, u64::from);
            window.checked_sub(fixed).filter(|b| *b > 0)?
        }
    };
    let (tasks, diverges) = levels(n, per_result, per_partial, budget);
    Some(LevelsPlan {
        tasks,
        chunk_tokens: budget,
        per_result,
        from_limit,
        per_partial,
        diverges,
        window: window_from,
    })
}

/// The plan of a run.
#[derive(Debug, Default)]
pub(crate) struct DryRun {
    pub(crate) steps: Vec<StepPlan>,
    /// Estimated input tokens by model (`None`: no model configured).
    pub(crate) tokens_by_model: Vec<(Option<String>, u64)>,
    /// Errors the run would hit, at the step they are in.
    pub(crate) errors: Vec<(crate::diag::Pos, String)>,
}

impl DryRun {
    pub(crate) fn input_tokens(&self) -> u64 {
        self.tokens_by_model.iter().map(|(_, t)| t).sum()
    }
}

/// The items of a step that a dry run knows.
enum Known {
    Items(Vec<Value>),
    /// A file of items no template reads whole: streamed by the fan-out over it.
    File(std::path::PathBuf),
}

/// Plans a compiled pipeline with `params` (those it was compiled with): expands static
/// decompositions, drafts every request that needs no model output, and sends nothing. The
/// compile's findings are its errors, with what drafting finds besides.
pub(crate) fn plan(
    env: &Env,
    config: &Config,
    catalog: &Catalog,
    compiled: &CompiledPipeline,
    params: &indexmap::IndexMap<String, String>,
    run_plan: &super::plan::Plan,
) -> DryRun {
    let pipeline = &compiled.pipeline;
    let graph = Graph::new(pipeline);
    let tenv = crate::template::environment(pipeline.file.path().parent());
    let agents = agents_json(catalog);
    // An items command gets no credential, in a dry run as in the run.
    let command_vars = items::CommandVars {
        set: Vec::new(),
        withheld: crate::config::presets::key_variables(env, config)
            .into_iter()
            .map(|(variable, _)| variable)
            .collect(),
    };
    let mut drafter = Drafter {
        env,
        config,
        catalog,
        resolver: Resolver::default(),
        models: HashMap::new(),
        tool_chars: Vec::new(),
        tokens: HashMap::new(),
        order: Vec::new(),
    };
    let mut known: Vec<Option<Known>> = (0..pipeline.steps.len()).map(|_| None).collect();
    let mut plans: Vec<StepPlan> = pipeline
        .steps
        .iter()
        .enumerate()
        .map(|(i, step)| StepPlan {
            id: step.id.clone(),
            kind: step.kind.name(),
            needs: graph
                .deps(i)
                .iter()
                .map(|d| pipeline.steps[*d].id.clone())
                .collect(),
            ..StepPlan::default()
        })
        .collect();
    let mut errors = Vec::new();
    for &i in graph.order() {
        let step = &pipeline.steps[i];
        // A fan-out's width is that of the step it goes over, counted there.
        let over = match compiled.steps[i].items {
            Some(ItemSource::Over(over)) => Some(over),
            _ => None,
        };
        let over_width = over.and_then(|o| plans[o].width);
        let plan = &mut plans[i];
        // Parameters, `agents`, and the steps whose items are known.
        let mut steps = Map::new();
        for (k, data) in known.iter().enumerate() {
            if let Some(Known::Items(items)) = data {
                steps.insert(
                    pipeline.steps[k].id.clone(),
                    json!({"items": items, "output": null, "results": null}),
                );
            }
        }
        let base = base_context(params, Value::Object(steps), &agents);
        let unknown = unknown_reads(pipeline, step, &known);
        let reads_known = unknown.is_empty();
        let mut config = StepConfig::new(i, step, &pipeline.settings);
        // A shard drafts only the fan-out tasks it owns, and none of the steps left for the
        // merge.
        config.shard = run_plan.step_shard(i);
        let left_for_merge = matches!(run_plan.mode, super::plan::Mode::Shard(_))
            && run_plan.role(i) == crate::pipeline::shard::Role::Merge;
        let outcome = match &step.kind {
            _ if left_for_merge => {
                plan.tasks = Some(0);
                plan.later = Some("left for `summon merge`".into());
                Ok(())
            }
            StepKind::Decompose(decompose) => {
                plan.tasks = Some(u64::from(matches!(decompose, Decompose::Agent(_))));
                let found = if unknown.is_empty() {
                    expand(env, &tenv, pipeline, step, decompose, &base, &command_vars)
                } else {
                    Ok(Expanded::Later(Later::Needs(unknown)))
                };
                match found {
                    Err(error) => Err(error),
                    Ok(Expanded::Known(data)) => {
                        plan.width = match &data {
                            Known::Items(items) => Some(items.len() as u64),
                            Known::File(path) => count_file(path),
                        };
                        known[i] = Some(data);
                        Ok(())
                    }
                    Ok(Expanded::Subagent(task)) => {
                        plan.later = Some("its items are the answer of a subagent".into());
                        plan.notes.push(items_schema_note(catalog, task));
                        let schema = Some(json!({"type": "array"}));
                        drafter.tasks(&tenv, &config, task, &base, schema, None, plan)
                    }
                    Ok(Expanded::Later(later)) => {
                        plan.later = Some(later.to_string());
                        Ok(())
                    }
                }
            }
            StepKind::FanOut(fan_out) => match over.and_then(|o| known[o].as_ref()) {
                None => {
                    plan.later = Some(format!(
                        "its tasks are known once `{}` has run",
                        fan_out.over
                    ));
                    Ok(())
                }
                Some(items) => {
                    plan.width = over_width;
                    plan.tasks = over_width;
                    if unknown.is_empty() {
                        let drafted = drafter.tasks(
                            &tenv,
                            &config,
                            &fan_out.task,
                            &base,
                            fan_out.task.schema.as_deref().cloned(),
                            Some(items),
                            plan,
                        );
                        if config.shard.is_some() {
                            plan.tasks = Some(plan.drafted);
                        }
                        drafted
                    } else {
                        plan.later = Some(Later::Needs(unknown).to_string());
                        Ok(())
                    }
                }
            },
            StepKind::Synthesize(task) | StepKind::Delegate(task) => {
                plan.width = Some(1);
                plan.tasks = Some(1);
                if unknown.is_empty() {
                    drafter.tasks(&tenv, &config, task, &base, None, None, plan)
                } else {
                    plan.later = Some(Later::Needs(unknown).to_string());
                    Ok(())
                }
            }
        };
        // What the compile found is told at its position, before what drafting made of the
        // step; a source is also checked with every item expanded here.
        let over_items = over.and_then(|o| known[o].as_ref());
        let found = |check| {
            compiled
                .finding(i, check)
                .map(|f| (f.pos, compiled.step_message(f)))
        };
        let named = found(Check::Source)
            .or_else(|| {
                source_problem(&tenv, catalog, step, &base, reads_known, over_items)
                    .map(|(pos, message)| (pos, format!("step `{}`: {message}", step.id)))
            })
            .or_else(|| {
                [Check::Tools, Check::Parameters, Check::Items, Check::Render]
                    .into_iter()
                    .find_map(found)
            });
        match (named, outcome) {
            (Some(error), _) => errors.push(error),
            (None, Err(message)) => {
                errors.push((step.pos, format!("step `{}`: {message}", step.id)))
            }
            (None, Ok(())) => {}
        }
    }
    for i in 0..pipeline.steps.len() {
        let levels = plan_levels(env, config, compiled, i, &plans);
        if let Some(l) = levels.as_ref().filter(|l| !l.tasks.is_empty()) {
            plans[i].tasks = Some(l.tasks.iter().sum());
        }
        plans[i].levels = levels;
    }
    let tokens_by_model = drafter
        .order
        .iter()
        .map(|model| (model.clone(), drafter.tokens[model]))
        .collect();
    DryRun {
        steps: plans,
        tokens_by_model,
        errors,
    }
}

/// The first source name a step's tasks ask for that the catalog lacks, rendered with
/// everything the dry run knows (`reads_known`: the step reads no model output).
fn source_problem(
    tenv: &minijinja::Environment<'_>,
    catalog: &Catalog,
    step: &Step,
    base: &minijinja::Value,
    reads_known: bool,
    over_items: Option<&Known>,
) -> Option<(crate::diag::Pos, String)> {
    let task = match &step.kind {
        StepKind::Decompose(Decompose::Agent(task))
        | StepKind::Synthesize(task)
        | StepKind::Delegate(task) => task,
        StepKind::FanOut(fan_out) => &fan_out.task,
        StepKind::Decompose(_) => return None,
    };
    let fan_out = matches!(step.kind, StepKind::FanOut(_));
    let mut items: Box<dyn Iterator<Item = Value>> = match over_items {
        Some(Known::Items(items)) => Box::new(items.iter().cloned()),
        Some(Known::File(path)) => match open_file_items(path) {
            Ok(reader) => Box::new(reader.map_while(Result::ok)),
            Err(_) => Box::new(std::iter::empty()),
        },
        None => Box::new(std::iter::empty()),
    };
    let contexts = if !reads_known || (fan_out && over_items.is_none()) {
        Contexts::Unknown
    } else if fan_out {
        Contexts::Items(base, &mut items)
    } else {
        Contexts::One(base)
    };
    check_task(tenv, catalog, task, contexts)
}

/// Why a step's items or requests are known only during the run.
enum Later {
    /// It reads what these steps produce.
    Needs(Vec<String>),
    /// Its command, glob or file failed here.
    Failed(String),
}

impl std::fmt::Display for Later {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Needs(ids) => {
                let ids: Vec<String> = ids.iter().map(|id| format!("`{id}`")).collect();
                write!(f, "rendered once {} has run", ids.join(" and "))
            }
            Self::Failed(why) => write!(f, "not known before the run: {why}"),
        }
    }
}

/// The steps a step's templates read that the dry run does not know: any field of a subagent
/// step, and `output`/`results` of a decompose step (only its items are known).
fn unknown_reads(pipeline: &Pipeline, step: &Step, known: &[Option<Known>]) -> Vec<String> {
    let mut unknown: Vec<String> = Vec::new();
    let mut add = |id: &str| {
        if !unknown.iter().any(|u| u == id) {
            unknown.push(id.to_owned());
        }
    };
    let position = |id: &str| pipeline.steps.iter().position(|s| s.id == id);
    for template in step_templates(step) {
        for r in refs::step_refs(&template.text) {
            let items_known =
                position(&r.id).is_some_and(|k| matches!(known[k], Some(Known::Items(_))));
            if !(items_known && r.field.as_deref() == Some("items")) {
                add(&r.id);
            }
        }
        // `{% for s in steps %}` reads every step above.
        if !refs::whole_steps_uses(&template.text).is_empty() {
            let here = position(&step.id).unwrap_or(0);
            for (k, other) in pipeline.steps[..here].iter().enumerate() {
                if !matches!(known[k], Some(Known::Items(_))) {
                    add(&other.id);
                }
            }
        }
    }
    unknown
}

/// The schema a subagent decompose's answer is asked for, and where it comes from.
fn items_schema_note(catalog: &Catalog, task: &TaskTemplate) -> String {
    use crate::source::SourceDef;
    if let Some(schema) = &task.schema {
        return format!("items: the answer to the step's `schema:` {schema}");
    }
    let literal = task
        .source
        .as_ref()
        .filter(|s| !crate::template::has_template(&s.text))
        .and_then(|s| crate::compile::named_source(&s.text));
    let recipe_schema = literal.and_then(|name| match &catalog.get(name)?.def {
        SourceDef::Recipe(recipe) | SourceDef::Subrecipe { recipe, .. } => {
            Some((name, recipe.response_schema.as_ref()?))
        }
        SourceDef::Agent(_) => None,
    });
    match recipe_schema {
        Some((name, schema)) => {
            format!("items: the answer to the `response.json_schema` of `{name}`: {schema}")
        }
        None => "items: the answer, a JSON array (give the step a `schema:` to bound it)".into(),
    }
}

/// What a dry run makes of a decompose step.
enum Expanded<'p> {
    Known(Known),
    /// A subagent lists the items: its one task is drafted instead.
    Subagent(&'p TaskTemplate),
    Later(Later),
}

/// Expands a decompose step as the run would; `Err` when its template does not render.
fn expand<'p>(
    env: &Env,
    tenv: &minijinja::Environment<'_>,
    pipeline: &Pipeline,
    step: &Step,
    decompose: &'p Decompose,
    base: &minijinja::Value,
    command_vars: &items::CommandVars,
) -> Result<Expanded<'p>, String> {
    let (form, template) = match decompose {
        Decompose::Items(items) => return Ok(Expanded::Known(Known::Items(items.clone()))),
        Decompose::Agent(task) => return Ok(Expanded::Subagent(task)),
        Decompose::Static(form, template) => (*form, template),
    };
    let text = if form == StaticForm::Command {
        crate::template::render_command(tenv, &template.text, base)
    } else {
        tenv.render_str(&template.text, base)
    }
    .map_err(|e| template.render_error(&e))?;
    let keep_items = Graph::new(pipeline).items_needed_by(&step.id);
    Ok(
        match expand_items(form, &text, &env.cwd, keep_items, command_vars) {
            Ok(items::Expanded::Items(items)) => Expanded::Known(Known::Items(items)),
            Ok(items::Expanded::File(path)) => Expanded::Known(Known::File(path)),
            // An items file the run could not read is an error now, as it would be then.
            Err(e) if matches!(form, StaticForm::File { .. }) => return Err(e.to_string()),
            Err(e) => Expanded::Later(Later::Failed(e.to_string())),
        },
    )
}

/// The number of items of a file, streamed; `None` when a line is bad (the run reports it).
fn count_file(path: &std::path::Path) -> Option<u64> {
    let mut count = 0u64;
    for item in open_file_items(path).ok()? {
        item.ok()?;
        count += 1;
    }
    Some(count)
}

/// Drafts tasks and adds up their estimates.
struct Drafter<'a> {
    env: &'a Env,
    config: &'a Config,
    catalog: &'a Catalog,
    resolver: Resolver,
    /// The model each combination of overrides resolves to without the network.
    models: HashMap<[Option<String>; 4], Option<String>>,
    /// The characters of each tool set (by its shared spec list).
    tool_chars: Vec<(Arc<[ToolSpec]>, usize)>,
    tokens: HashMap<Option<String>, u64>,
    /// Models in the order they were first seen.
    order: Vec<Option<String>>,
}

impl Drafter<'_> {
    /// Drafts one task (`items: None`) or one per item, into `plan`.
    #[allow(clippy::too_many_arguments)] // one step's templates and context
    fn tasks(
        &mut self,
        tenv: &minijinja::Environment<'_>,
        step: &StepConfig,
        task: &TaskTemplate,
        base: &minijinja::Value,
        schema: Option<Value>,
        items: Option<&Known>,
        plan: &mut StepPlan,
    ) -> Result<(), String> {
        let compiled = Compiled::new(tenv, task)?;
        let mut one = |ctx: &minijinja::Value| -> Result<(), String> {
            let mut rendered = compiled.render(task, ctx)?;
            if rendered.schema.is_none() && !expects_data(self.catalog, &rendered) {
                rendered.schema.clone_from(&schema);
            }
            if !step.owns(&step.hash(&rendered)) {
                return Ok(());
            }
            self.task(step, &rendered, plan)
        };
        match items {
            None => one(base),
            Some(Known::Items(items)) => {
                for (index, item) in items.iter().enumerate() {
                    one(&item_context(base, item, index as u64))
                        .map_err(|e| format!("item {index}: {e}"))?;
                }
                Ok(())
            }
            Some(Known::File(path)) => {
                let reader = open_file_items(path).map_err(|e| e.to_string())?;
                for (index, item) in reader.enumerate() {
                    let item = item.map_err(|e| e.to_string())?;
                    one(&item_context(base, &item, index as u64))
                        .map_err(|e| format!("item {index}: {e}"))?;
                }
                Ok(())
            }
        }
    }

    fn task(
        &mut self,
        step: &StepConfig,
        rendered: &Rendered,
        plan: &mut StepPlan,
    ) -> Result<(), String> {
        let source = task_source(self.catalog, rendered)?;
        let request = task_request(step, rendered);
        let draft = draft(self.env, source, &request, &self.resolver).map_err(prepare_message)?;
        let model = self.model(&draft);
        let (tokens, tool_chars) = self.estimate(&draft, model.as_deref());
        plan.overhead.add(crate::event::Overhead::count(
            draft.system.len(),
            draft.first_message.len(),
            model.as_deref().map_or(0, str::len),
            tool_chars,
            draft.content_len,
        ));
        if plan.drafted == 0 {
            plan.model.clone_from(&model);
            plan.prompt = Some(draft.first_message.clone());
            let resolved = resolve_with(self.env, self.config, &draft.overrides(), |_| true);
            if let Ok(resolved) = &resolved {
                let explicit = step
                    .settings
                    .max_output_tokens
                    .or(self.config.max_output_tokens);
                let schema = draft
                    .response_schema()
                    .filter(|_| draft.tools.names().is_empty())
                    .and_then(crate::subagent::output_cap::schema_bound);
                let local = resolved.endpoint.is_local();
                let full =
                    crate::subagent::output_cap::full_limit(resolved.endpoint.kind, local, None, 0);
                let (tokens, source) =
                    crate::subagent::output_cap::OutputCap::solo().choose(explicit, schema, full);
                plan.output_limit = Some(DryCap {
                    tokens,
                    source,
                    learned: step.fan_out
                        && explicit.is_none()
                        && schema.is_none()
                        && full.is_some(),
                    local,
                    kind: resolved.endpoint.kind,
                });
            }
            if let Some(schema) = draft.response_schema()
                && let Ok(resolved) = &resolved
            {
                plan.notes.push(format!(
                    "structured answers: {}",
                    crate::provider::structured_mechanism(
                        schema,
                        resolved.endpoint.kind,
                        resolved.endpoint.structured_output,
                        self.config.native_structured(&resolved.model),
                    )
                ));
            }
            if !draft.servers.is_empty() {
                let names: Vec<&str> = draft.servers.iter().map(|s| s.name.as_str()).collect();
                plan.notes.push(format!(
                    "the tools of {} are not counted: a dry run starts no MCP server",
                    names.join(", ")
                ));
            }
        }
        for note in &draft.notes {
            if !plan.notes.contains(&note.message) {
                plan.notes.push(note.message.clone());
            }
        }
        plan.drafted += 1;
        plan.input_tokens += tokens;
        if !self.tokens.contains_key(&model) {
            self.order.push(model.clone());
        }
        *self.tokens.entry(model).or_default() += tokens;
        Ok(())
    }

    /// The model the run would choose, when that needs no network (auto-detecting a local
    /// Ollama does).
    fn model(&mut self, draft: &Draft) -> Option<String> {
        let o = draft.overrides();
        let key = [
            o.provider_flag.map(str::to_owned),
            o.model_flag.map(str::to_owned),
            o.recipe_provider.map(str::to_owned),
            o.recipe_model.map(str::to_owned),
        ];
        if let Some(found) = self.models.get(&key) {
            return found.clone();
        }
        // Without a configured provider the run would look for a local Ollama: the model
        // is then the one it would use there.
        let model = resolve_with(self.env, self.config, &o, |_| false)
            .or_else(|_| resolve_with(self.env, self.config, &o, |_| true))
            .ok()
            .map(|r| r.model);
        self.models.insert(key, model.clone());
        model
    }

    /// The input tokens of the task's first request, as [`crate::provider::estimate_tokens`]
    /// counts them, and the bytes of its tool definitions.
    fn estimate(&mut self, draft: &Draft, model: Option<&str>) -> (u64, usize) {
        let specs = draft.tools.specs();
        let tools = match self
            .tool_chars
            .iter()
            .find(|(known, _)| Arc::ptr_eq(known, &specs))
        {
            Some((_, chars)) => *chars,
            None => {
                let chars = crate::provider::tool_chars(&specs);
                self.tool_chars.push((specs, chars));
                chars
            }
        };
        let chars =
            draft.system.len() + draft.first_message.len() + model.map_or(0, str::len) + tools;
        ((chars as u64).div_ceil(4), tools)
    }
}

#[cfg(test)]
mod tests {
    use super::levels;

    #[test]
    fn levels_shrink_by_the_chunk_size_until_one_task() {
        assert_eq!(levels(100, 100, 300, 1000), (vec![10, 4, 2, 1], false));
        // Everything fits one request: no reduction.
        assert_eq!(levels(5, 100, 300, 1000), (vec![], false));
        // Partial answers as large as a chunk never come together.
        assert_eq!(levels(100, 100, 1000, 1000), (vec![10], true));
    }
}
