//! The model settings of a step's tasks, layered in one place: a command-line flag over the
//! step's own key over the pipeline's `settings`. What is still unset after that is the
//! source's (a recipe's `settings`, an agent's `model`), then the config file's, then the
//! built-in default, decided where each task is prepared (`delegation`, `config::resolve`),
//! since a templated source is known only then.

use crate::pipeline::model::{Pipeline, PipelineSettings, Step};
use crate::sandbox::Policy;

/// The flags of `summon run` that set a step's settings, over the pipeline file.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Flags {
    /// `--max-output-tokens`.
    pub(crate) max_output_tokens: Option<u32>,
    /// `--sandbox`.
    pub(crate) sandbox: Option<Policy>,
    /// `--network` (`None`: not given).
    pub(crate) network: Option<bool>,
}

impl Flags {
    /// `--sandbox` / `--network`: the policy and network flag they give, when given.
    pub(crate) fn new(
        max_output_tokens: Option<u32>,
        (sandbox, network): (Option<Policy>, Option<bool>),
    ) -> Self {
        Self {
            max_output_tokens,
            sandbox,
            network,
        }
    }
}

/// A step's settings after the flags, the step and the pipeline's `settings`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct StepSettings {
    pub(crate) provider: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) temperature: Option<f64>,
    pub(crate) max_turns: Option<u32>,
    pub(crate) max_output_tokens: Option<u32>,
    /// The sandbox of the model's shell commands, and whether they may use the network.
    pub(crate) sandbox: Option<Policy>,
    pub(crate) network: Option<bool>,
    /// Stop sequences: the step's `stop`, else the settings'.
    pub(crate) stop: Vec<String>,
    /// The service tier: the step's, else the settings' (standard).
    pub(crate) tier: crate::config::Tier,
    /// `flex_fallback: standard`: the step's, else the settings'.
    pub(crate) flex_fallback: bool,
}

impl StepSettings {
    /// Flag > step > pipeline `settings`, for each setting.
    pub(crate) fn layer(flags: &Flags, step: &Step, pipeline: &PipelineSettings) -> Self {
        Self {
            provider: step.provider.clone().or_else(|| pipeline.provider.clone()),
            model: step.model.clone().or_else(|| pipeline.model.clone()),
            temperature: step.temperature.or(pipeline.temperature),
            max_turns: step.max_turns.or(pipeline.max_turns),
            max_output_tokens: flags
                .max_output_tokens
                .or(step.max_output_tokens)
                .or(pipeline.max_output_tokens),
            sandbox: flags.sandbox.or(step.sandbox).or(pipeline.sandbox),
            network: flags.network.or(step.network).or(pipeline.network),
            stop: step.stop.clone().unwrap_or_else(|| pipeline.stop.clone()),
            tier: step
                .tier
                .or(pipeline.tier)
                .map(|(tier, _)| tier)
                .unwrap_or_default(),
            flex_fallback: step
                .flex_fallback
                .or(pipeline.flex_fallback)
                .unwrap_or(false),
        }
    }
}

/// Writes the flags into the pipeline the engine runs, over every step's keys and the
/// `settings`, so that [`StepSettings::layer`] without flags gives every step the same
/// settings as with them.
pub(crate) fn apply_flags(pipeline: &mut Pipeline, flags: &Flags) {
    let settings = &mut pipeline.settings;
    settings.max_output_tokens = flags.max_output_tokens.or(settings.max_output_tokens);
    settings.sandbox = flags.sandbox.or(settings.sandbox);
    settings.network = flags.network.or(settings.network);
    for step in &mut pipeline.steps {
        step.max_output_tokens = flags.max_output_tokens.or(step.max_output_tokens);
        step.sandbox = flags.sandbox.or(step.sandbox);
        step.network = flags.network.or(step.network);
    }
}
