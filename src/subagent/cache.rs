//! How one task uses the provider's prompt cache, and the signal that lets the rest of a
//! fan-out start once the first task's prefix is in the cache.

use std::sync::Arc;

use tokio::sync::watch;

use crate::provider::{
    CacheHint, ChatRequest, OPENAI_MIN_TOKENS, ProviderKind, anthropic_min_tokens, tool_chars,
};

/// A task's use of the prompt cache.
#[derive(Debug, Clone)]
pub(crate) struct TaskCache {
    /// Caching is on (`cache: false` turns it off).
    pub(crate) on: bool,
    /// Other tasks of the step share this task's tools and system prompt.
    pub(crate) shared: bool,
    /// OpenAI's `prompt_cache_key`, stable per step.
    pub(crate) key: Option<String>,
    /// Fired once the task's first answer has arrived, or at once when nothing it sends can
    /// be cached; the step holds its other tasks back until then.
    pub(crate) warm: Option<Arc<WarmSignal>>,
}

impl Default for TaskCache {
    /// A task on its own: caching on, nothing shared.
    fn default() -> Self {
        Self {
            on: true,
            shared: false,
            key: None,
            warm: None,
        }
    }
}

impl TaskCache {
    /// What a request asks of the cache. `first_turn`: it carries only the first message;
    /// `more_turns`: another turn may re-send this conversation. A one-task, one-turn request
    /// asks nothing: no later request would read what it wrote. The first message of a task
    /// that shares its prefix is not marked: a one-turn answer (the usual fan-out task) would
    /// pay a cache write for its own item text. A later turn is marked even when no turn
    /// may follow it (the last one `max_turns` allows): Anthropic reads a cached prefix only
    /// up to a mark, and that turn re-sends the conversation the previous turn wrote.
    pub(crate) fn hint(&self, first_turn: bool, more_turns: bool) -> CacheHint {
        if !self.on {
            return CacheHint::default();
        }
        let in_a_loop = more_turns || !first_turn;
        CacheHint {
            prefix: self.shared || in_a_loop,
            newest: in_a_loop && !(first_turn && self.shared),
            key: self.key.clone(),
        }
    }

    /// Tells the step its other tasks may start.
    pub(crate) fn fire_warm(&self) {
        if let Some(warm) = &self.warm {
            warm.fire();
        }
    }
}

/// Whether the part of `request` every task of a step shares (tools and system prompt) is long
/// enough for the provider to cache, by estimate (a quarter of its characters).
pub(crate) fn prefix_is_cacheable(kind: ProviderKind, request: &ChatRequest) -> bool {
    let tokens = (tool_chars(&request.tools) + request.system.len()) as u64 / 4;
    let min = match kind {
        ProviderKind::Anthropic => anthropic_min_tokens(&request.model),
        ProviderKind::OpenAi => OPENAI_MIN_TOKENS,
    };
    tokens >= min
}

/// Fired once; waited on by the step that holds its tasks back.
#[derive(Debug)]
pub(crate) struct WarmSignal(watch::Sender<bool>);

impl WarmSignal {
    pub(crate) fn new() -> (Arc<Self>, watch::Receiver<bool>) {
        let (tx, rx) = watch::channel(false);
        (Arc::new(Self(tx)), rx)
    }

    pub(crate) fn fire(&self) {
        self.0.send_replace(true);
    }
}

impl Drop for WarmSignal {
    /// A task that ends without an answer (cancelled, failed before sending) lets the rest go.
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_follow_sharing_and_turns() {
        let solo = TaskCache::default();
        assert!(solo.hint(true, false).is_off(), "one task, one turn");
        let loop_hint = solo.hint(true, true);
        assert!(loop_hint.prefix && loop_hint.newest);
        let shared = TaskCache {
            shared: true,
            ..TaskCache::default()
        };
        let first = shared.hint(true, true);
        assert!(first.prefix && !first.newest);
        assert!(shared.hint(false, true).newest);
        // The last turn a task may take reads what the turn before it wrote.
        let last = solo.hint(false, false);
        assert!(last.prefix && last.newest);
        let off = TaskCache {
            on: false,
            shared: true,
            ..TaskCache::default()
        };
        assert!(off.hint(false, true).is_off());
    }

    #[test]
    fn the_signal_fires_when_dropped() {
        let (signal, rx) = WarmSignal::new();
        assert!(!*rx.borrow());
        drop(signal);
        assert!(*rx.borrow());
    }
}
