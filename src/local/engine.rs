//! llama.cpp in process (through `llama-cpp-2`): one model, one context, one generation at a
//! time, sampled as llama.cpp's server samples, and with a GBNF grammar when the answer must
//! have a shape.

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::OnceLock;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;

/// Tokens decoded in one batch while reading the prompt.
const BATCH: usize = 512;
/// The largest context the engine sets up (a few hundred MB of cache for a small model).
const MAX_CONTEXT: u32 = 8192;

/// What a generation is asked for.
#[derive(Debug, Clone, Default)]
pub(crate) struct Params {
    /// A GBNF grammar the answer must match (root rule `root`).
    pub(crate) grammar: Option<String>,
    /// At most this many tokens; `None`: up to the end of the context.
    pub(crate) max_tokens: Option<u32>,
    /// The answer ends before the first of these.
    pub(crate) stop: Vec<String>,
    /// 0: the most likely token each time; else sampled at this temperature (0.8 when
    /// unset, with llama.cpp server's top-k 40, top-p 0.95 and min-p 0.05).
    pub(crate) temperature: Option<f32>,
    pub(crate) seed: u32,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// The model ended its turn, or a stop sequence came.
    Stop,
    /// The token limit.
    Length,
}

/// An answer and what it took.
#[derive(Debug, Clone)]
pub(crate) struct Generation {
    pub(crate) text: String,
    pub(crate) prompt_tokens: u32,
    pub(crate) completion_tokens: u32,
    pub(crate) finish: Finish,
}

/// Why a generation could not run: the request's fault, or the engine's.
#[derive(Debug)]
pub(crate) enum GenError {
    /// The prompt does not fit the context window.
    TooLong {
        prompt: u32,
        window: u32,
    },
    /// The grammar does not parse.
    Grammar(String),
    Engine(String),
}

impl std::fmt::Display for GenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooLong { prompt, window } => write!(
                f,
                "the prompt has {prompt} tokens, more than this model's context window of \
                 {window} tokens leaves room for"
            ),
            Self::Grammar(e) => write!(f, "the answer's grammar is not valid: {e}"),
            Self::Engine(e) => f.write_str(e),
        }
    }
}

/// llama.cpp's backend, set up once per process.
fn backend() -> Result<&'static LlamaBackend, String> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            let mut backend = LlamaBackend::init().map_err(|e| e.to_string())?;
            backend.void_logs();
            Ok(backend)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// A loaded model and its context.
pub(crate) struct Engine {
    model: &'static LlamaModel,
    ctx: LlamaContext<'static>,
    window: u32,
}

impl Engine {
    /// Loads the GGUF at `path` and sets up a context of the model's trained window (at most
    /// [`MAX_CONTEXT`]) on every core. The model stays loaded for the life of the process.
    pub(crate) fn load(path: &Path) -> Result<Self, String> {
        let backend = backend()?;
        let model = LlamaModel::load_from_file(backend, path, &LlamaModelParams::default())
            .map_err(|e| format!("cannot load the model {}: {e}", path.display()))?;
        let model: &'static LlamaModel = Box::leak(Box::new(model));
        let window = model.n_ctx_train().clamp(512, MAX_CONTEXT);
        let threads = std::thread::available_parallelism()
            .map_or(2, std::num::NonZero::get)
            .try_into()
            .unwrap_or(2);
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(window))
            .with_n_batch(BATCH as u32)
            .with_n_threads(threads)
            .with_n_threads_batch(threads);
        let ctx = model
            .new_context(backend, params)
            .map_err(|e| format!("cannot set up a context for {}: {e}", path.display()))?;
        Ok(Self { model, ctx, window })
    }

    /// The context window in tokens.
    pub(crate) fn window(&self) -> u32 {
        self.window
    }

    /// The prompt for `messages` (role, text) in the model's own chat template (ChatML when
    /// the file has none llama.cpp knows), ready for the assistant's turn.
    pub(crate) fn prompt(&self, messages: &[(String, String)]) -> Result<String, String> {
        let chat = messages
            .iter()
            .map(|(role, text)| {
                LlamaChatMessage::new(role.clone(), text.replace('\0', ""))
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Ok(template) = self.model.chat_template(None)
            && let Ok(prompt) = self.model.apply_chat_template(&template, &chat, true)
        {
            return Ok(prompt);
        }
        let chatml = LlamaChatTemplate::new("chatml").map_err(|e| e.to_string())?;
        self.model
            .apply_chat_template(&chatml, &chat, true)
            .map_err(|e| format!("cannot apply the chat template: {e}"))
    }

    /// Generates the answer to `prompt`.
    pub(crate) fn generate(
        &mut self,
        prompt: &str,
        params: &Params,
    ) -> Result<Generation, GenError> {
        let engine = |e: &dyn std::fmt::Display| GenError::Engine(e.to_string());
        let vocab = self.model.vocab();
        let tokens = vocab.tokenize(prompt.as_bytes(), true, true);
        if tokens.is_empty() {
            return Err(GenError::Engine("the prompt is empty".into()));
        }
        let prompt_tokens = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
        if prompt_tokens + 1 >= self.window {
            return Err(GenError::TooLong {
                prompt: prompt_tokens,
                window: self.window,
            });
        }
        let room = self.window - prompt_tokens;
        let max_tokens = params.max_tokens.map_or(room, |m| m.min(room));
        let mut sampler = {
            let mut chain = Vec::new();
            if let Some(grammar) = &params.grammar {
                chain.push(
                    LlamaSampler::grammar(self.model, grammar, "root")
                        .map_err(|e| GenError::Grammar(e.to_string()))?,
                );
            }
            match params.temperature {
                Some(t) if t <= 0.0 => chain.push(LlamaSampler::greedy()),
                // llama.cpp server's defaults: greedy decoding of a small model repeats itself
                // until the output limit.
                t => {
                    chain.push(LlamaSampler::top_k(40));
                    chain.push(LlamaSampler::top_p(0.95, 1));
                    chain.push(LlamaSampler::min_p(0.05, 1));
                    chain.push(LlamaSampler::temp(t.unwrap_or(0.8)));
                    chain.push(LlamaSampler::dist(params.seed));
                }
            }
            LlamaSampler::chain_simple(chain)
        };
        self.ctx.clear_kv_cache();
        let mut batch = LlamaBatch::new(BATCH, 1);
        let last = tokens.len() - 1;
        for (chunk_index, chunk) in tokens.chunks(BATCH).enumerate() {
            batch.clear();
            for (i, token) in chunk.iter().enumerate() {
                let position = chunk_index * BATCH + i;
                batch
                    .add(*token, position as i32, &[0], position == last)
                    .map_err(|e| engine(&e))?;
            }
            self.ctx.decode(&mut batch).map_err(|e| engine(&e))?;
        }
        let mut position = tokens.len() as i32;
        let mut out: Vec<u8> = Vec::new();
        let mut completion_tokens = 0;
        let mut finish = Finish::Length;
        while completion_tokens < max_tokens {
            // Samples and accepts (the grammar moves on with it).
            let token = sampler.sample(&self.ctx, batch.n_tokens() - 1);
            if vocab.is_eog(token) {
                finish = Finish::Stop;
                break;
            }
            out.extend(vocab.token_to_piece(token, false, None));
            completion_tokens += 1;
            if let Some(cut) = stop_at(&out, &params.stop) {
                out.truncate(cut);
                finish = Finish::Stop;
                break;
            }
            batch.clear();
            batch
                .add(token, position, &[0], true)
                .map_err(|e| engine(&e))?;
            position += 1;
            self.ctx.decode(&mut batch).map_err(|e| engine(&e))?;
        }
        Ok(Generation {
            text: String::from_utf8_lossy(&out).into_owned(),
            prompt_tokens,
            completion_tokens,
            finish,
        })
    }
}

/// Where the first stop sequence in `out` starts, if one has come.
fn stop_at(out: &[u8], stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| memchr::memmem::find(out, s.as_bytes()))
        .min()
}

#[cfg(test)]
mod tests {
    use super::stop_at;

    #[test]
    fn the_answer_ends_at_the_first_stop_sequence() {
        let stops = ["END".to_owned(), "\n\n".to_owned(), String::new()];
        assert_eq!(stop_at(b"one\n\ntwo END", &stops), Some(3));
        assert_eq!(stop_at(b"one END\n\n", &stops), Some(4));
        assert_eq!(stop_at(b"no stop here", &stops), None);
    }
}
