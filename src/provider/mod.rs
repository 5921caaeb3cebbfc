//! LLM provider clients: provider-neutral chat types, the OpenAI-compatible and Anthropic wire
//! formats, error classification, retries and per-provider rate budgets.

mod admission;
mod anthropic;
mod batch;
mod batch_anthropic;
mod batch_openai;
mod cache;
mod client;
mod error;
mod message;
mod openai;
mod pace;
mod retry;
mod structured;
pub(crate) mod tool_name;
mod window;

pub(crate) use admission::{AdmissionStats, Binding, RateLimits, estimate_tokens, tool_chars};
pub(crate) use batch::{BatchCounts, BatchLine, BatchState, BatchStatus, LineResult};
pub(crate) use cache::{CacheHint, OPENAI_MIN_TOKENS, anthropic_min_tokens};
pub(crate) use client::{
    Client, ProviderEndpoint, ProviderKind, ProviderStop, install_crypto_provider,
};
pub(crate) use error::{MIN_KEY_CHARS, ProviderError, Secret, redact};
#[cfg(test)]
pub(crate) use message::ToolCall;
pub(crate) use message::{ChatRequest, ChatResponse, Message, ToolOutput, ToolSpec, Usage};
pub(crate) use retry::{RetryHook, RetryPolicy, end_waits, retry_transient, send_with_retry};
pub(crate) use structured::{
    OpenAiFormat, ResponseFormat, anthropic_native_structured, mechanism as structured_mechanism,
    unwrap_answer,
};
pub(crate) use window::{ServerWindow, server_window};
