//! Sandbox policies: where a model-run command may write, and whether it may use the network.

use std::fmt;

/// Where a model-run command may write.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Policy {
    /// Read anywhere; write only in the working directory (not in its .git or .summon), the
    /// private TMPDIR and devices.
    #[default]
    WorkspaceWrite,
    /// Read anywhere; write nowhere but devices such as `/dev/null`.
    ReadOnly,
    /// No sandbox: the command can do whatever the user can.
    Off,
}

impl Policy {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::WorkspaceWrite => "workspace-write",
            Self::ReadOnly => "read-only",
            Self::Off => "off",
        }
    }

    /// The policy named `name`, if it is one.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        match name {
            "workspace-write" => Some(Self::WorkspaceWrite),
            "read-only" => Some(Self::ReadOnly),
            "off" => Some(Self::Off),
            _ => None,
        }
    }

    /// What the policy allows, in a few words (for `summon doctor`).
    pub(crate) fn summary(self) -> &'static str {
        match self {
            Self::WorkspaceWrite => {
                "read anywhere, write in the working directory (not its .git or .summon) and a \
                 private TMPDIR"
            }
            Self::ReadOnly => "read anywhere, write nowhere",
            Self::Off => "no sandbox",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The effective sandbox of a task's `shell` commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Sandbox {
    pub(crate) policy: Policy,
    /// Whether commands may open network sockets (always true when the policy is `off`).
    pub(crate) network: bool,
}

impl Sandbox {
    /// The most specific of each setting wins: `flag` over `nearer` over `farther`.
    pub(crate) fn pick(levels: &[(Option<Policy>, Option<bool>)]) -> Self {
        Self {
            policy: levels.iter().find_map(|l| l.0).unwrap_or_default(),
            network: levels.iter().find_map(|l| l.1).unwrap_or(false),
        }
    }

    /// This sandbox, or the default one when it is `off` (what a kernel check is about).
    pub(crate) fn policy_if_on(self) -> Self {
        if self.policy == Policy::Off {
            Self::default()
        } else {
            self
        }
    }

    /// `workspace-write, no network`, `workspace-write + network`, `off`.
    pub(crate) fn describe(self) -> String {
        match (self.policy, self.network) {
            (Policy::Off, _) => "off".to_owned(),
            (policy, true) => format!("{policy} + network"),
            (policy, false) => format!("{policy}, no network"),
        }
    }

    /// The JSON form in `--json` and `report.json`.
    pub(crate) fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "policy": self.policy.name(),
            "network": self.network || self.policy == Policy::Off,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_specific_setting_wins() {
        let sb = Sandbox::pick(&[
            (None, Some(true)),
            (Some(Policy::ReadOnly), Some(false)),
            (Some(Policy::Off), None),
        ]);
        assert_eq!(sb.policy, Policy::ReadOnly);
        assert!(sb.network);
        assert_eq!(Sandbox::pick(&[]), Sandbox::default());
        assert_eq!(Sandbox::default().policy, Policy::WorkspaceWrite);
        for name in ["workspace-write", "read-only", "off"] {
            assert_eq!(Policy::parse(name).unwrap().name(), name);
        }
    }
}
