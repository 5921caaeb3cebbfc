//! [`compile_pipeline`]: a parsed pipeline, its parameters, the run's flags and the source
//! catalog, turned into what the run, its dry run and `summon validate` all start from: each
//! step's settings, the source it names, where its items come from, and every problem that
//! is certain before a task is rendered, at its position in the pipeline file.
//!
//! The checks (all without the network, and without running a command):
//! - a `source:` the catalog lacks or cannot use: a literal one, or a templated one rendered
//!   with the parameters and the items of literal `items:` lists ([`super::sources`]);
//! - a `tools:` entry the task cannot have ([`super::tools`]);
//! - a tool the instructions name that the task does not have: a warning, at its line
//!   ([`super::tools::check_mentions`]);
//! - the `parameters:` of a task with a literal source: a required recipe parameter not
//!   given, a key the recipe does not declare, parameters or no instructions for an agent
//!   ([`super::params`]);
//! - a literal items `file:` with an extension no reader knows;
//! - a template that fails to render with everything it reads known before the run (the
//!   parameters given, the items of literal `items:` lists): as the dry run renders it
//!   ([`super::render`]).

use indexmap::IndexMap;

use super::context::Known;
use super::params::check_params;
use super::settings::{Flags, StepSettings, apply_flags};
use crate::diag::{Diagnostic, Diagnostics, Pos, Span};
use crate::pipeline::items::{StaticForm, check_items_path};
use crate::pipeline::model::{Decompose, Pipeline, Step, StepKind, TaskTemplate};
use crate::source::{Catalog, SourceDef};

/// What a pipeline is compiled with besides its file.
pub(crate) struct Inputs<'a> {
    /// The pipeline's parameter values (empty in `summon validate`: templated sources that
    /// read one are checked by the run).
    pub(crate) params: &'a IndexMap<String, String>,
    pub(crate) flags: Flags,
    /// The sources the run sees (a resumed run: the catalog it was started with).
    pub(crate) catalog: &'a Catalog,
}

/// A pipeline ready to run: the flags written into it, each step resolved, and what is wrong
/// with it.
#[derive(Debug)]
pub(crate) struct CompiledPipeline {
    /// The pipeline with the flags over its keys: what the engine runs.
    pub(crate) pipeline: Pipeline,
    /// By step index.
    pub(crate) steps: Vec<CompiledStep>,
    /// Errors, sources first, then tools, parameters and items, each in step order.
    pub(crate) findings: Vec<Finding>,
}

/// One step, resolved.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CompiledStep {
    pub(crate) settings: StepSettings,
    pub(crate) source: SourceRef,
    /// Where its items come from (`None`: a step of one task).
    pub(crate) items: Option<ItemSource>,
    /// The provider and model its tasks ask for, when no template decides them.
    pub(crate) model: Option<ModelChoice>,
}

/// The source a step's tasks name.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SourceRef {
    /// None: a general subagent with the step's instructions, or a decompose that needs no
    /// subagent.
    General,
    /// A literal name the catalog has.
    Named(String),
    /// A literal name the catalog lacks or cannot use (a finding says why).
    Missing(String),
    /// A template: each task names its own.
    Templated,
}

/// Where a step's items come from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ItemSource {
    /// A literal `items:` list of this many.
    Listed(usize),
    /// A command, glob or file ([`crate::pipeline::items::expand_items`]).
    Static(StaticForm),
    /// A subagent's answer.
    Subagent,
    /// A fan-out: the items of this step.
    Over(usize),
}

/// The provider and model a step's tasks ask for before the config file and the environment
/// decide the rest ([`crate::config::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ModelChoice {
    /// The step's (or the pipeline's) `provider` and `model`.
    pub(crate) provider: Option<String>,
    pub(crate) model: Option<String>,
    /// The source's own: a recipe's `settings`, an agent's `model`.
    pub(crate) source_provider: Option<String>,
    pub(crate) source_model: Option<String>,
    /// Where the source's come from ("recipe `x` settings", "agent `x`").
    pub(crate) origin: String,
}

impl ModelChoice {
    /// The choice as the overrides the config's resolution takes.
    pub(crate) fn overrides(&self) -> crate::config::Overrides<'_> {
        crate::config::Overrides {
            provider_flag: self.provider.as_deref(),
            model_flag: self.model.as_deref(),
            recipe_provider: self.source_provider.as_deref(),
            recipe_model: self.source_model.as_deref(),
            recipe_origin: &self.origin,
        }
    }
}

/// What a finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Check {
    Source,
    Tools,
    Parameters,
    Items,
    /// A template that fails to render with everything it reads known.
    Render,
    /// Instructions that name a tool the task does not have: a warning, not an error.
    Mentions,
}

/// A problem of one step, certain before the run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Finding {
    pub(crate) step: usize,
    pub(crate) check: Check,
    pub(crate) pos: Pos,
    /// Without the step's name (see [`CompiledPipeline::message`]).
    pub(crate) message: String,
    pub(crate) hint: Option<String>,
}

/// Compiles `pipeline` (see the module documentation). Never fails: what is wrong is in
/// [`CompiledPipeline::findings`].
pub(crate) fn compile_pipeline(mut pipeline: Pipeline, inputs: &Inputs<'_>) -> CompiledPipeline {
    apply_flags(&mut pipeline, &inputs.flags);
    let catalog = inputs.catalog;
    let tenv = crate::template::environment(pipeline.file.path().parent());
    let known = Known::new(&pipeline, catalog, inputs.params);
    let each = |check, found: Vec<(usize, Pos, String)>| {
        found.into_iter().map(move |(step, pos, message)| Finding {
            step,
            check,
            pos,
            message,
            hint: None,
        })
    };
    let mut findings: Vec<Finding> = each(
        Check::Source,
        super::sources::check_sources(&tenv, &pipeline, catalog, &known),
    )
    .chain(each(
        Check::Render,
        super::render::check_renders(&tenv, &pipeline, &known, inputs.params),
    ))
    .collect();
    // A name no search folder has: where they are.
    for finding in &mut findings {
        if finding.check == Check::Source && finding.message.contains(" not found.") {
            finding.hint = catalog.looked_in();
        }
    }
    let mut steps = Vec::with_capacity(pipeline.steps.len());
    for (index, step) in pipeline.steps.iter().enumerate() {
        let settings = StepSettings::layer(&inputs.flags, step, &pipeline.settings);
        if let Some((pos, message)) = super::tools::check_step(step, catalog) {
            findings.push(Finding {
                step: index,
                check: Check::Tools,
                pos,
                message,
                hint: None,
            });
        }
        if let Some((pos, message, hint)) =
            super::tools::check_mentions(&pipeline.file, step, settings.max_turns, catalog)
        {
            findings.push(Finding {
                step: index,
                check: Check::Mentions,
                pos,
                message,
                hint: Some(hint),
            });
        }
        let task = step_task(step);
        let source = task.map_or(SourceRef::General, |task| source_ref(task, catalog));
        if let (Some(task), SourceRef::Named(name)) = (task, &source)
            && let (Some(found), Some(at)) = (catalog.get(name), &task.source)
        {
            findings.extend(
                check_params(task, found, at.pos)
                    .into_iter()
                    .map(|p| Finding {
                        step: index,
                        check: Check::Parameters,
                        pos: p.pos,
                        message: p.message,
                        hint: p.hint,
                    }),
            );
        }
        let items = item_source(step);
        // A literal path that climbs out with `..` is refused before anything runs; an
        // absolute one and links are judged when the step opens the file.
        if let StepKind::Decompose(Decompose::Static(
            StaticForm::File {
                outside_project: false,
            },
            template,
        )) = &step.kind
            && !crate::template::has_template(&template.text)
            && std::path::Path::new(template.text.trim())
                .components()
                .any(|c| c == std::path::Component::ParentDir)
        {
            findings.push(Finding {
                step: index,
                check: Check::Items,
                pos: template.pos,
                message: format!(
                    "`decompose.file`: items file `{}` climbs out of the working directory with \
                     `..`; an items file stays inside it, as `glob`'s matches do",
                    template.text.trim()
                ),
                hint: Some(
                    "move the file into the project, or set `outside_project: true` on the step \
                     to read it where it is"
                        .to_owned(),
                ),
            });
        }
        if let StepKind::Decompose(Decompose::Static(StaticForm::File { .. }, template)) =
            &step.kind
            && !crate::template::has_template(&template.text)
            && let Err(error) = check_items_path(std::path::Path::new(template.text.trim()))
        {
            findings.push(Finding {
                step: index,
                check: Check::Items,
                pos: template.pos,
                message: error.to_string(),
                hint: None,
            });
        }
        let model = task.and_then(|_| model_choice(&settings, &source, catalog));
        steps.push(CompiledStep {
            settings,
            source,
            items,
            model,
        });
    }
    findings.sort_by_key(|f| (f.check, f.step));
    CompiledPipeline {
        pipeline,
        steps,
        findings,
    }
}

impl CompiledPipeline {
    /// A finding's message as `summon validate` and `summon run` print it: a source problem
    /// as the catalog words it, the others after the step's name.
    pub(crate) fn message(&self, finding: &Finding) -> String {
        match finding.check {
            Check::Source => finding.message.clone(),
            _ => self.step_message(finding),
        }
    }

    /// A finding's message after the step's name (the dry run's form).
    pub(crate) fn step_message(&self, finding: &Finding) -> String {
        let id = &self.pipeline.steps[finding.step].id;
        format!("step `{id}`: {}", finding.message)
    }

    /// The first finding of `check` in step `step`.
    pub(crate) fn finding(&self, step: usize, check: Check) -> Option<&Finding> {
        self.findings
            .iter()
            .find(|f| f.step == step && f.check == check)
    }

    /// The findings of the steps `keep` takes, as errors at their positions.
    pub(crate) fn diagnostics(&self, keep: impl Fn(usize) -> bool) -> Diagnostics {
        let mut diags = Diagnostics::default();
        for finding in self.findings.iter().filter(|f| keep(f.step)) {
            let message = self.message(finding);
            let diagnostic = if finding.check == Check::Mentions {
                Diagnostic::warning(message)
            } else {
                Diagnostic::error(message)
            };
            let mut diagnostic = diagnostic.at(Span::new(&self.pipeline.file, finding.pos));
            if let Some(hint) = &finding.hint {
                diagnostic = diagnostic.with_hint(hint.clone());
            }
            diags.push(diagnostic);
        }
        diags
    }

    /// The warnings among the findings, at their positions (shown by `summon run` and its
    /// dry run, as `summon validate` shows them).
    pub(crate) fn warnings(&self) -> Vec<Diagnostic> {
        let mut diags = self.diagnostics(|_| true);
        diags.items.retain(|d| !d.is_error());
        diags.items
    }

    /// `Err` with the findings of the steps `keep` takes, when there are any.
    /// Warnings are left out: [`Self::warnings`] has them.
    pub(crate) fn check(&self, keep: impl Fn(usize) -> bool) -> Result<(), Diagnostics> {
        let mut diags = self.diagnostics(keep);
        diags.items.retain(Diagnostic::is_error);
        if diags.items.is_empty() {
            Ok(())
        } else {
            Err(diags)
        }
    }
}

/// The subagent task of a step, when it has one.
pub(crate) fn step_task(step: &Step) -> Option<&TaskTemplate> {
    match &step.kind {
        StepKind::Decompose(Decompose::Agent(task))
        | StepKind::Synthesize(task)
        | StepKind::Delegate(task) => Some(task),
        StepKind::FanOut(fan_out) => Some(&fan_out.task),
        StepKind::Decompose(_) => None,
    }
}

fn source_ref(task: &TaskTemplate, catalog: &Catalog) -> SourceRef {
    let Some(source) = &task.source else {
        return SourceRef::General;
    };
    if crate::template::has_template(&source.text) {
        return SourceRef::Templated;
    }
    match super::context::named_source(&source.text) {
        None => SourceRef::General,
        Some(name) if catalog.get(name).is_some() => SourceRef::Named(name.to_owned()),
        Some(name) => SourceRef::Missing(name.to_owned()),
    }
}

fn item_source(step: &Step) -> Option<ItemSource> {
    match &step.kind {
        StepKind::Decompose(Decompose::Items(items)) => Some(ItemSource::Listed(items.len())),
        StepKind::Decompose(Decompose::Static(form, _)) => Some(ItemSource::Static(*form)),
        StepKind::Decompose(Decompose::Agent(_)) => Some(ItemSource::Subagent),
        StepKind::FanOut(fan_out) => fan_out.over_step.map(ItemSource::Over),
        StepKind::Synthesize(_) | StepKind::Delegate(_) => None,
    }
}

/// The provider and model a task asks for, when none of them is a template (`None`: the run
/// decides them per task).
fn model_choice(
    settings: &StepSettings,
    source: &SourceRef,
    catalog: &Catalog,
) -> Option<ModelChoice> {
    let literal = |text: Option<&str>| -> Result<Option<String>, ()> {
        match text {
            Some(t) if crate::template::has_template(t) => Err(()),
            Some(t) => Ok(Some(t.trim().to_owned())),
            None => Ok(None),
        }
    };
    let found = match source {
        SourceRef::Templated => return None,
        SourceRef::Named(name) => catalog.get(name),
        SourceRef::General | SourceRef::Missing(_) => None,
    };
    let (source_provider, source_model, origin) = match found.map(|s| (&s.name, &s.def)) {
        Some((name, SourceDef::Recipe(recipe) | SourceDef::Subrecipe { recipe, .. })) => (
            recipe.settings.provider.clone(),
            recipe.settings.model.clone(),
            format!("recipe `{name}` settings"),
        ),
        Some((name, SourceDef::Agent(agent))) => {
            (None, agent.model.clone(), format!("agent `{name}`"))
        }
        None => (None, None, String::new()),
    };
    Some(ModelChoice {
        provider: literal(settings.provider.as_deref()).ok()?,
        model: literal(settings.model.as_deref()).ok()?,
        source_provider: literal(source_provider.as_deref()).ok()?,
        source_model: literal(source_model.as_deref()).ok()?,
        origin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::SourceFile;
    use crate::pipeline::parse::parse_pipeline;
    use crate::sandbox::Policy;

    /// A catalog of the recipes written to a temporary project, and the project.
    fn catalog(recipes: &[(&str, &str)]) -> (Catalog, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("recipes")).unwrap();
        for (name, text) in recipes {
            std::fs::write(dir.path().join("recipes").join(name), text).unwrap();
        }
        let env = crate::env::Env::for_test(dir.path(), &[]);
        (
            crate::source::discover(crate::source::search_dirs(&env)),
            dir,
        )
    }

    fn compile(text: &str, flags: Flags, catalog: &Catalog) -> CompiledPipeline {
        compile_with(text, flags, catalog, &IndexMap::new())
    }

    fn compile_with(
        text: &str,
        flags: Flags,
        catalog: &Catalog,
        params: &IndexMap<String, String>,
    ) -> CompiledPipeline {
        let file = SourceFile::new(std::path::Path::new("p.yaml"), text.to_owned());
        let mut diags = Diagnostics::default();
        let pipeline = parse_pipeline(&file, &mut diags).expect("a valid pipeline");
        let inputs = Inputs {
            params,
            flags,
            catalog,
        };
        compile_pipeline(pipeline, &inputs)
    }

    const NOTES: &str = "version: 1.0.0\ntitle: Notes\ndescription: d\n\
        instructions: Notes on {{ area }} in {{ lang }}.\n\
        settings: {goose_provider: anthropic, goose_model: claude-x}\n\
        parameters:\n\
        - {key: area, input_type: string, requirement: required, description: a}\n\
        - {key: lang, input_type: string, requirement: required, description: l}\n\
        - {key: tone, input_type: string, requirement: required, default: dry, description: t}\n";

    #[test]
    fn settings_are_the_flag_then_the_step_then_the_pipeline() {
        let (catalog, _dir) = catalog(&[]);
        let text = "version: 1\nsettings: {model: m-pipeline, temperature: 0.5, max_turns: 7, \
            max_output_tokens: 100, sandbox: read-only}\nsteps:\n\
            - id: a\n  delegate: {instructions: x}\n  model: m-step\n  max_output_tokens: 200\n\
            - id: b\n  delegate: {instructions: y}\n";
        let compiled = compile(text, Flags::default(), &catalog);
        let a = &compiled.steps[0].settings;
        let b = &compiled.steps[1].settings;
        assert_eq!(a.model.as_deref(), Some("m-step"));
        assert_eq!(b.model.as_deref(), Some("m-pipeline"));
        assert_eq!((a.temperature, a.max_turns), (Some(0.5), Some(7)));
        assert_eq!(
            (a.max_output_tokens, b.max_output_tokens),
            (Some(200), Some(100))
        );
        assert_eq!(a.sandbox, Some(Policy::ReadOnly));
        assert_eq!(a.network, None);
        let flags = Flags::new(Some(50), (Some(Policy::Off), Some(true)));
        let compiled = compile(text, flags, &catalog);
        for step in &compiled.steps {
            assert_eq!(step.settings.max_output_tokens, Some(50));
            assert_eq!(step.settings.sandbox, Some(Policy::Off));
            assert_eq!(step.settings.network, Some(true));
        }
        // The flags are in the pipeline the engine runs: layered again, nothing changes.
        for (step, resolved) in compiled.pipeline.steps.iter().zip(&compiled.steps) {
            let again = StepSettings::layer(&Flags::default(), step, &compiled.pipeline.settings);
            assert_eq!(again, resolved.settings);
        }
    }

    #[test]
    fn a_required_recipe_parameter_the_step_does_not_give_is_found_at_its_source() {
        let (catalog, _dir) = catalog(&[("notes.yaml", NOTES)]);
        let text = "version: 1\nsteps:\n- id: list\n  decompose: {items: [a, b]}\n\
            - id: each\n  fan_out:\n    over: list\n    source: notes\n    \
            parameters: {area: \"{{ item }}\"}\n";
        let compiled = compile(text, Flags::default(), &catalog);
        assert_eq!(compiled.steps[1].source, SourceRef::Named("notes".into()));
        assert_eq!(compiled.steps[1].items, Some(ItemSource::Over(0)));
        assert_eq!(compiled.steps[0].items, Some(ItemSource::Listed(2)));
        let [finding] = compiled.findings.as_slice() else {
            panic!("{:?}", compiled.findings);
        };
        // `tone` has a default: only `lang` is missing.
        assert_eq!(
            (
                finding.step,
                finding.check,
                finding.pos.line,
                finding.pos.col
            ),
            (1, Check::Parameters, 8, 13)
        );
        assert_eq!(
            compiled.message(finding),
            "step `each`: recipe `notes` has a required parameter the step does not give: `lang`"
        );
        // The recipe's settings are what the step's tasks ask for.
        let model = compiled.steps[1].model.as_ref().unwrap();
        assert_eq!(
            (
                model.source_provider.as_deref(),
                model.source_model.as_deref()
            ),
            (Some("anthropic"), Some("claude-x"))
        );
        assert_eq!(model.origin, "recipe `notes` settings");
    }

    #[test]
    fn an_unknown_source_is_found_at_its_value_and_not_checked_further() {
        let (catalog, _dir) = catalog(&[("notes.yaml", NOTES)]);
        let text = "version: 1\nsteps:\n- id: a\n  delegate:\n    source: nots\n    \
            parameters: {x: y}\n";
        let compiled = compile(text, Flags::default(), &catalog);
        assert_eq!(compiled.steps[0].source, SourceRef::Missing("nots".into()));
        let [finding] = compiled.findings.as_slice() else {
            panic!("{:?}", compiled.findings);
        };
        assert_eq!(
            (finding.check, finding.pos.line, finding.pos.col),
            (Check::Source, 5, 13)
        );
        assert_eq!(
            compiled.message(finding),
            "Source 'nots' not found. Did you mean: notes?"
        );
        assert_eq!(
            compiled.step_message(finding),
            "step `a`: Source 'nots' not found. Did you mean: notes?"
        );
        assert!(compiled.check(|_| true).is_err());
        assert!(compiled.check(|step| step != 0).is_ok());
    }

    #[test]
    fn a_templated_source_is_left_to_each_task() {
        let (catalog, _dir) = catalog(&[("notes.yaml", NOTES)]);
        let text = "version: 1\nparameters:\n\
            - {key: who, input_type: string, requirement: required, description: w}\n\
            steps:\n- id: a\n  delegate:\n    source: \"{{ who }}\"\n    instructions: x\n";
        let compiled = compile(text, Flags::default(), &catalog);
        assert_eq!(compiled.steps[0].source, SourceRef::Templated);
        assert_eq!(compiled.steps[0].model, None);
        assert!(compiled.findings.is_empty(), "{:?}", compiled.findings);
    }

    #[test]
    fn a_template_is_rendered_only_when_everything_it_reads_is_known() {
        let (catalog, _dir) = catalog(&[]);
        let text = "version: 1\nparameters:\n\
            - {key: who, input_type: string, requirement: required, description: w}\n\
            steps:\n- id: a\n  delegate:\n    instructions: \"{{ who.name }}\"\n";
        // Without the parameter (validate), the template is left to the run.
        let compiled = compile(text, Flags::default(), &catalog);
        assert!(compiled.findings.is_empty(), "{:?}", compiled.findings);
        // With it, it renders as the run would, and fails as the run would.
        let params = IndexMap::from([("who".to_owned(), "ann".to_owned())]);
        let compiled = compile_with(text, Flags::default(), &catalog, &params);
        let [finding] = compiled.findings.as_slice() else {
            panic!("{:?}", compiled.findings);
        };
        assert_eq!((finding.check, finding.pos.line), (Check::Render, 5));
        assert!(
            finding
                .message
                .starts_with("line 7: cannot render template: undefined value"),
            "{}",
            finding.message
        );
    }
}
