//! The output limit a step's requests carried, as the run's events and outputs tell it.

/// Where a task's output limit comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CapSource {
    /// `max_output_tokens` was set.
    Explicit,
    /// The answer's JSON schema bounds it.
    Schema,
    /// Learned from the step's own answers.
    Learned,
    /// The full limit (see the module documentation).
    Full,
}

/// A step's output limits, as report.json and the summary give them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct CapSummary {
    /// Where the limit of the step's later requests came from.
    pub(crate) source: CapSource,
    /// The smallest and largest limit a request was sent with (none: no limit sent).
    pub(crate) smallest: Option<u32>,
    pub(crate) largest: Option<u32>,
    /// The longest answer that was not cut off, in output tokens.
    pub(crate) longest_answer: Option<u32>,
    /// Answers cut off at a learned or schema bound and sent again with the full limit.
    pub(crate) resent: u64,
}

impl CapSummary {
    /// The output limits of one step run in parts (the shards of a merge): the smallest and
    /// largest limits of all, the longest answer, every re-send; the source of the last part
    /// that learned, else of the last part.
    pub(crate) fn combine(parts: impl IntoIterator<Item = Self>) -> Option<Self> {
        let mut all: Option<Self> = None;
        for part in parts {
            all = Some(match all {
                None => part,
                Some(mut all) => {
                    all.smallest = match (all.smallest, part.smallest) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    all.largest = all.largest.max(part.largest);
                    all.longest_answer = all.longest_answer.max(part.longest_answer);
                    all.resent += part.resent;
                    if all.source != CapSource::Learned {
                        all.source = part.source;
                    }
                    all
                }
            });
        }
        all
    }

    /// `learned: 128 tokens (the longest answer 12; the first request 4,096), 0 re-sent`
    pub(crate) fn describe(&self) -> String {
        let tokens = |n: u32| crate::text::thousands(u64::from(n));
        let limits = match (self.smallest, self.largest) {
            (Some(low), Some(high)) if low == high => format!("{} tokens", tokens(high)),
            (Some(low), Some(high)) => format!("{}–{} tokens", tokens(low), tokens(high)),
            _ => "none sent".to_owned(),
        };
        let why = match self.source {
            CapSource::Explicit => "max_output_tokens".to_owned(),
            CapSource::Schema => "bounded by the answer's JSON schema".to_owned(),
            CapSource::Learned => format!(
                "learned from the step's answers, the longest {} tokens",
                self.longest_answer.map_or(0, u64::from)
            ),
            CapSource::Full => "the full limit".to_owned(),
        };
        let mut text = format!("{limits} ({why})");
        if self.resent > 0 {
            text.push_str(&format!(
                ", {} cut off and sent again with the full limit",
                self.resent
            ));
        }
        text
    }
}
