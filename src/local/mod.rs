//! The built-in local model, `--provider local`: a small instruct model run by llama.cpp
//! inside summon (cargo feature `local`), with no server to install and no key.
//!
//! `SUMMON_LOCAL_MODEL` names a GGUF file or a known model ([`model::KNOWN`]); without it the
//! default, SmolLM2-135M-Instruct (Q4_1, 94 MiB), is downloaded once into summon's cache
//! folder with its checksum checked. The model answers on an OpenAI-compatible endpoint on
//! 127.0.0.1 that lives in summon's process ([`server`]), so the provider client treats it as
//! any compatible server; schemas and tool calls are kept by grammars ([`chat`]).

#[cfg(feature = "local")]
mod chat;
#[cfg(feature = "local")]
mod engine;
#[cfg_attr(not(feature = "local"), allow(dead_code))]
pub(crate) mod model;
#[cfg(feature = "local")]
mod server;

use crate::env::Env;

/// The provider's name.
pub(crate) const PROVIDER: &str = "local";

/// The base URL the provider has until the model is started: nothing listens there.
pub(crate) const NOT_STARTED_URL: &str = "http://127.0.0.1:0/v1";

/// The name of the model `SUMMON_LOCAL_MODEL` chooses (the default's when it names nothing
/// usable: the error comes when the model is started).
pub(crate) fn model_name(env: &Env) -> String {
    model::choose(env).map_or_else(|_| model::KNOWN[0].name.to_owned(), |c| c.name())
}

/// Starts the model (once per process: downloaded first if need be, then loaded) and returns
/// the base URL of its endpoint, `http://127.0.0.1:PORT/v1`.
#[cfg(feature = "local")]
pub(crate) fn base_url(env: &Env) -> Result<String, String> {
    use std::sync::OnceLock;
    static RUNNING: OnceLock<Result<server::Running, String>> = OnceLock::new();
    RUNNING
        .get_or_init(|| {
            let choice = model::choose(env)?;
            let name = choice.name();
            let path = match choice {
                model::Choice::File(path) => path,
                model::Choice::Known(known) => {
                    // On a thread with a runtime of its own: the caller may be inside one.
                    let env = env.clone();
                    std::thread::spawn(move || {
                        tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .map_err(|e| e.to_string())?
                            .block_on(model::ensure(&env, known))
                    })
                    .join()
                    .map_err(|_| "the download stopped unexpectedly".to_owned())??
                }
            };
            server::start(path, name)
        })
        .as_ref()
        .map(|running| running.base_url.clone())
        .map_err(Clone::clone)
}

/// Without the engine compiled in, the provider says how to get it.
#[cfg(not(feature = "local"))]
pub(crate) fn base_url(_env: &Env) -> Result<String, String> {
    Err(
        "this summon was built without the built-in local model; install it with \
         `cargo install --locked --features local ...` (README, Install)"
            .to_owned(),
    )
}
