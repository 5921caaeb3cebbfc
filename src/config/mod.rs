//! Configuration: the config files, the built-in provider presets, and the resolution of the
//! provider, model and API key a run uses — each with where it came from, for messages and
//! `summon doctor`.
//!
//! - [`file`]: the documented format of `~/.config/summon/config.yaml` and `./summon.yaml`,
//!   read and merged by [`load_config`].
//! - [`presets`]: `openai`, `anthropic` and `ollama`, which need no config file.
//! - [`resolve()`]: the order of SPEC §3 (env, flag, recipe, env, config, auto-detection).
//! - [`probe`]: the short local Ollama check used by auto-detection.

pub(crate) mod file;
pub(crate) mod presets;
pub(crate) mod prices;
mod probe;
pub(crate) mod resolve;
pub(crate) mod trust;
pub(crate) mod windows;

pub(crate) use file::{Config, Scope, TracesConfig, load_config};
pub(crate) use prices::{NO_PRICE, Prices, Tier};
pub(crate) use resolve::{Overrides, Resolved, env_max_turns, resolve};
