//! How steps and runs end, as the outputs see them.

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StepStatus {
    Succeeded,
    Failed,
    /// Not run: a step it depends on failed, or the run was interrupted.
    Skipped,
    /// Not run here: left for `summon merge` (a shard), or not needed (`--until`).
    Deferred,
}

impl StepStatus {
    /// `succeeded`, `failed`, `skipped` or `deferred`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
            Self::Deferred => "deferred",
        }
    }
}

/// The end of a run.
#[derive(Debug)]
pub(crate) struct RunSummary {
    pub(crate) run_id: String,
    pub(crate) steps: Vec<(String, StepStatus, Option<String>)>,
    /// The final step's text.
    pub(crate) final_output: Option<super::FinalText>,
    pub(crate) interrupted: bool,
    /// `budget reached: $X of $Y` when the spend cap stopped the run (then `interrupted`
    /// too: it resumes like one).
    pub(crate) budget: Option<String>,
    /// The provider that stopped the run (then `interrupted` too: it resumes like one).
    pub(crate) provider: Option<ProviderStopped>,
    /// The run's `report.json` document (counts, tokens, cost per step and in total).
    pub(crate) report: serde_json::Value,
    /// The one-line summary printed at the end (`12 tasks: 11 completed, ...`).
    pub(crate) summary_line: String,
}

/// A provider that stopped a run from starting tasks.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProviderStopped {
    /// It refused the key (else it could not be reached).
    pub(crate) refused: bool,
    /// Nothing answered at its URL from the start (no server, or plain HTTP at an
    /// `https://` URL): its configuration is to be fixed, not waited out.
    pub(crate) no_server: bool,
    /// What happened, naming the provider.
    pub(crate) text: String,
}

/// What a run tells its outputs while it runs, in the order it happens. The journal,
/// `results.jsonl`, the tables, `report.json`, JUnit and the terminal display all follow the
/// run from these alone (see [`super::Events`]).
#[derive(Debug)]
pub(crate) enum RunEvent {
    /// A step starts: the steps it needs have ended.
    StepStarted { step: usize },
    /// How many tasks a step sends, once its items are known.
    StepTotal { step: usize, total: u64 },
    /// A level of a step's reduction starts with `chunks` tasks.
    LevelStarted {
        step: usize,
        level: u32,
        chunks: usize,
    },
    /// A decompose step's command ran (or its glob or file was read) from `started` until
    /// now, giving `items` (none for a file streamed later) or failing with `error`.
    Decomposed {
        step: usize,
        form: &'static str,
        started: std::time::Instant,
        items: Option<usize>,
        error: Option<String>,
    },
    /// Tasks of a step were sent (one, or a whole provider batch).
    TasksStarted { step: usize, count: usize },
    /// A provider request of a task of `step` is sent again after `wait`;
    /// `class` is [`crate::provider::ProviderError::retry_class`] (`rate_limited` for a
    /// rate-limit wait).
    Retry {
        step: usize,
        class: &'static str,
        wait: std::time::Duration,
    },
    /// A task of `step` waits `wait` for its provider to start before its request is sent
    /// again: not in flight meanwhile, and not a retry.
    Waiting {
        step: usize,
        wait: std::time::Duration,
    },
    /// A request of a task of `step` waits `wait` at most for the provider's rate limits
    /// (`limit` says which: `the provider's output tokens per minute (40k)`) before it is
    /// sent: not in flight meanwhile, and not a retry. A zero `wait` (and no `limit`): one
    /// such hold is over.
    Held {
        step: usize,
        limit: String,
        wait: std::time::Duration,
    },
    /// The output limits a step's requests were sent with, once its tasks have run.
    OutputLimit {
        step: usize,
        summary: super::CapSummary,
    },
    /// What each provider's rate limits held back and charged over the run, once every step
    /// has ended (by provider name).
    RateLimits {
        providers: Vec<(String, crate::provider::AdmissionStats)>,
    },
    /// A task of `step` gave its concurrency slot back to wait (`given`), or took one again:
    /// not in flight meanwhile.
    Slot { step: usize, given: bool },
    /// A task finished (or was taken from an earlier run), with all it did. `level`: the
    /// reduction level it belongs to; `row`: its journal row number, `None` when the
    /// journal has it already (a resumed task).
    TaskFinished {
        done: Box<super::TaskDone>,
        level: Option<u32>,
        row: Option<u64>,
    },
    /// What a running task did (an attempt, a model request, a tool call), for consumers
    /// that follow tasks live.
    Activity(super::Activity),
    /// A line for the person watching: a warning (shown once per run however many tasks
    /// meet it) or what a step is doing (not shown by a quiet display).
    Notice { kind: Notice, text: String },
    /// The first Ctrl-C: no new task starts.
    Interrupted { text: String },
    /// A step ended.
    StepFinished {
        step: usize,
        status: StepStatus,
        error: Option<String>,
    },
}

/// The kind of a [`RunEvent::Notice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notice {
    /// `summon: warning: ...`, shown whatever the display.
    Warning,
    /// `[summon] ...`, what a step is doing; a quiet display shows none.
    Progress,
}
