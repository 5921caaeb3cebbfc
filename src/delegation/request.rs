//! A delegation as a caller asks for it, and as a background task records it.

use serde::{Deserialize, Serialize};

use crate::recipe::ParamInput;

use super::prepare::Request;

/// A delegation as recorded for a background worker; files named on the command line are
/// already read.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct DelegationRequest {
    pub(crate) source: Option<String>,
    pub(crate) instructions: Option<String>,
    pub(crate) params: Vec<(String, String)>,
    pub(crate) extensions: Option<Vec<String>>,
    pub(crate) provider: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) temperature: Option<f64>,
    pub(crate) max_turns: Option<u32>,
    #[serde(default)]
    pub(crate) max_output_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) stop: Vec<String>,
    pub(crate) context: Option<String>,
    pub(crate) working_dir: Option<std::path::PathBuf>,
    /// The `--sandbox` / `--network` flags.
    #[serde(default)]
    pub(crate) sandbox: Option<crate::sandbox::Policy>,
    #[serde(default)]
    pub(crate) network: Option<bool>,
    /// `--max-cost`: the delegation's spend cap in USD (over the config file's `max_cost`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_cost: Option<f64>,
    /// `--tier`: the service tier of its requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tier: Option<crate::config::Tier>,
    /// `--flex-fallback standard`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) flex_fallback: bool,
    /// An agent source's `tools` frozen by a `summon mcp` session's catalog, over what its
    /// file lists when the task starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) role_tools: Option<RoleTools>,
}

/// A role's tool list as a session's catalog froze it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RoleTools {
    /// `None`: the role lists no tools (it has every tool).
    pub(crate) tools: Option<Vec<String>>,
}

impl DelegationRequest {
    /// A one-line description: the source, or the start of the instructions.
    pub(crate) fn description(&self) -> String {
        let instructions = self
            .instructions
            .as_deref()
            .map(|i| i.split_whitespace().collect::<Vec<_>>().join(" "));
        let short = instructions.map(|i| {
            if i.chars().count() > 60 {
                format!("{}...", i.chars().take(57).collect::<String>())
            } else {
                i
            }
        });
        match (&self.source, short) {
            (Some(source), Some(text)) => format!("{source}: {text}"),
            (Some(source), None) => source.clone(),
            (None, Some(text)) => text,
            (None, None) => "task".into(),
        }
    }

    pub(super) fn to_request(&self) -> Request {
        let mut params = ParamInput::default();
        for (key, value) in &self.params {
            params.values.insert(
                key.clone(),
                (value.clone(), crate::recipe::params::Origin::Flag),
            );
        }
        Request {
            instructions: self.instructions.clone(),
            params,
            extensions: self.extensions.clone(),
            provider: self.provider.clone(),
            model: self.model.clone(),
            temperature: self.temperature,
            max_turns: self.max_turns,
            max_output_tokens: self.max_output_tokens,
            stop: self.stop.clone(),
            allow_empty: false,
            context: self.context.clone(),
            working_dir: self.working_dir.clone(),
            response_schema: None,
            sandbox: (self.sandbox, self.network),
            context_window: None,
            tools: None,
            named_tools_only: false,
            role_tools: self.role_tools.as_ref().map(|frozen| {
                frozen.tools.as_ref().map(|listed| {
                    listed
                        .iter()
                        .map(|raw| crate::agent::ToolRef::new(raw.clone(), Default::default()))
                        .collect()
                })
            }),
        }
    }
}
