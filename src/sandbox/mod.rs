//! The sandbox of commands the model runs through the `shell` tool.
//!
//! A policy says where such a command may write; network access is a separate grant. On Linux
//! summon applies them by starting itself with a hidden subcommand ([`helper`]) that confines
//! its own process with Landlock and a seccomp socket filter and then executes the command, so
//! the confinement is inherited by everything the command starts. Where the kernel cannot
//! confine ([`support`]), the shell refuses unless the policy is `off`.

pub(crate) mod helper;
mod policy;
pub(crate) mod support;

pub(crate) use policy::{Policy, Sandbox};
