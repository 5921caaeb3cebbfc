//! Subagents: one agent loop, its prompt and its tools.

pub(crate) mod budget;
mod cache;
mod checks;
mod ending;
mod event;
mod extract;
mod nesting;
pub(crate) mod output_cap;
mod prompt;
mod redact;
mod role;
mod run;
mod slot;
mod structured;
pub(crate) mod tool;

pub(crate) use crate::env::NESTED_ENV;
pub(crate) use cache::{TaskCache, WarmSignal};
pub(crate) use ending::answer_problem;
pub(crate) use event::SubagentEvent;
pub(crate) use nesting::inside_subagent;
pub(crate) use prompt::{
    FirstMessage, content_len as prompt_content_len, system_prompt, tools_section,
};
pub(crate) use redact::Redactor;
pub(crate) use role::read_role_text;
pub(crate) use run::{SubagentResult, SubagentSpec, SubagentStatus, run_subagent};
pub(crate) use slot::Slot;
pub(crate) use structured::{check_answer, schema_failure};
pub(crate) use tool::Loader;
