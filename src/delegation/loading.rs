//! The `load` tool's work, shared by `summon mcp` and the subagents' own `load`: list the
//! project's sources and the finished background tasks, load one source's content, and
//! collect, peek at or cancel a background task. It never starts anything.

use std::time::Duration;

use super::{CollectError, SourceList, TaskStore, TaskView, format_secs};
use crate::env::Env;
use crate::error::Error;
use crate::source::{Catalog, SourceKind};
use crate::store::TaskId;

/// How often a running task is looked at while `load` waits for it.
const POLL: Duration = Duration::from_millis(200);

/// What one `load` call works with.
pub(crate) struct Loading<'a> {
    pub(crate) env: &'a Env,
    pub(crate) catalog: &'a Catalog,
    pub(crate) listing: &'a SourceList,
    /// The longest wait for a running task.
    pub(crate) wait: Duration,
    /// Whether the caller has gone (a cancelled call): the wait ends early.
    pub(crate) interrupted: &'a (dyn Fn() -> bool + Sync),
    /// A task's answer as the reader gets it (`summon mcp` cuts a long one and keeps the
    /// whole text in a file): the task id and the answer.
    pub(crate) answer: &'a (dyn Fn(&str, &str) -> String + Sync),
    /// How the reader calls `load` again (`load`, or `load` of the tool's own name).
    pub(crate) tool: &'a str,
    /// The tasks the reader may see, collect and cancel (`None`: every task of the project);
    /// any other task id reads as unknown.
    pub(crate) owned: Option<&'a (dyn Fn(&TaskId) -> bool + Sync)>,
    /// The finished tasks whose result the reader already got (a foreground call's answer):
    /// not listed as awaiting retrieval, though still collected by their id.
    pub(crate) delivered: Option<&'a (dyn Fn(&TaskId) -> bool + Sync)>,
}

impl Loading<'_> {
    /// `load(source, peek, cancel)`: the text for the reader, or an error in its words.
    pub(crate) fn load(
        &self,
        source: Option<&str>,
        peek: bool,
        stop: bool,
    ) -> Result<String, String> {
        let tool = self.tool;
        if peek && stop {
            return Err(format!("{tool}: `peek` and `cancel` cannot both be true"));
        }
        let Some(name) = source else {
            if peek || stop {
                return Err(format!(
                    "{tool}: `peek` and `cancel` apply to a background task id in `source`"
                ));
            }
            return self.listing();
        };
        let id: Option<TaskId> = TaskId::looks_like(name)
            .then(|| name.parse().ok())
            .flatten();
        let task = match &id {
            Some(id) => self.task_exists(id)?,
            None => false,
        };
        if !task {
            if peek || stop {
                return Err(match id {
                    Some(id) => CollectError::NotFound(id)
                        .to_string()
                        .replace("`summon tasks`", &format!("{tool}()")),
                    None => format!(
                        "{tool}: `{}` is not a background task id",
                        crate::text::printable(name)
                    ),
                });
            }
            // A source named like a task id is loaded when no task has that id.
            return match super::load_source(self.catalog, name) {
                Ok(source) => Ok(source.render()),
                Err(diagnostic) => Err(diagnostic
                    .message
                    .replace("Use summon load to see", &format!("Use {tool}() to see"))),
            };
        }
        let id = id.expect("a task was found by its id");
        let tasks = self.open_tasks()?;
        if peek {
            let view = super::peek(&tasks, &id).map_err(|e| e.to_string())?;
            return Ok(view.progress_text(&format!("{tool}(source: \"{}\")", view.task.id)));
        }
        if stop {
            let grace = super::cancel_grace(self.env).map_err(|e| self.error_text(&e))?;
            let cancelled = super::cancel(&tasks, &id, grace).map_err(|e| e.to_string())?;
            return Ok(self.result_text(&cancelled.view));
        }
        // A bounded wait, in short slices so a cancelled call ends it.
        let deadline = std::time::Instant::now() + self.wait;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let collected = super::wait(&tasks, &id, left.min(POLL)).map_err(|e| e.to_string())?;
            if !collected.still_running {
                return Ok(self.result_text(&collected.view));
            }
            if left.is_zero() || (self.interrupted)() {
                let view = &collected.view;
                return Ok(format!(
                    "Task {id} is still running (elapsed {}, {} turns, {} tool calls). \
Call {tool}(source: \"{id}\") again to keep waiting, with peek: true to check on it, or cancel: true to stop it.",
                    format_secs(view.elapsed_secs),
                    view.task.turns,
                    view.task.tool_calls,
                ));
            }
        }
    }

    /// An error as the reader reads it: diagnostics rendered without colour.
    pub(crate) fn error_text(&self, error: &Error) -> String {
        error_text(error, self.env)
    }

    fn open_tasks(&self) -> Result<TaskStore, String> {
        TaskStore::open(self.env).map_err(|e| self.error_text(&e))
    }

    fn may_see(&self, id: &TaskId) -> bool {
        self.owned.is_none_or(|owned| owned(id))
    }

    fn task_exists(&self, id: &TaskId) -> Result<bool, String> {
        if !self.may_see(id) {
            return Ok(false);
        }
        let Some(tasks) = TaskStore::open_existing(self.env).map_err(|e| self.error_text(&e))?
        else {
            return Ok(false);
        };
        match super::peek(&tasks, id) {
            Ok(_) => Ok(true),
            Err(CollectError::NotFound(_) | CollectError::Expired(_)) => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }

    /// `load()`: the finished tasks awaiting retrieval, then the sources, in goose's words.
    fn listing(&self) -> Result<String, String> {
        let tool = self.tool;
        let mut text = String::new();
        if let Some(tasks) = TaskStore::open_existing(self.env).map_err(|e| self.error_text(&e))? {
            let done = tasks
                .list(crate::store::TaskFilter::Finished)
                .map_err(|e| e.to_string())?;
            let done: Vec<_> = done
                .into_iter()
                .filter(|view| self.may_see(&view.task.id))
                .filter(|view| {
                    !self
                        .delivered
                        .is_some_and(|delivered| delivered(&view.task.id))
                })
                .collect();
            if !done.is_empty() {
                text.push_str("Completed tasks awaiting retrieval:\n");
                text.push_str(&awaiting_lines(done.iter().map(|view| &view.task)));
            }
        }
        let listing = self.listing;
        if listing.sources.is_empty() {
            text.push_str("No sources found. Sources are looked for in:\n");
            for dir in &listing.searched {
                text.push_str(&format!("  {}\n", dir.display()));
            }
            return Ok(text);
        }
        for (kind, heading) in [
            (SourceKind::Subrecipe, "Subrecipes"),
            (SourceKind::Recipe, "Recipes"),
            (SourceKind::Agent, "Agents"),
        ] {
            let group: Vec<_> = listing.of_kind(kind).collect();
            if group.is_empty() {
                continue;
            }
            text.push_str(&format!("{heading}:\n"));
            for source in group {
                let description = source.description.trim().lines().next().unwrap_or("");
                let tools = source.tools.as_deref().map_or(String::new(), |tools| {
                    format!(" [tools: {}]", super::tools_line(tools))
                });
                text.push_str(&format!("  {} - {description}{tools}\n", source.name));
            }
            text.push('\n');
        }
        text.push_str(&format!("Use {tool}(source: name) to load into context.\n"));
        Ok(text)
    }

    /// A finished task: what it was, how it went, and its answer.
    pub(crate) fn result_text(&self, view: &TaskView) -> String {
        let task = &view.task;
        let mut text = format!(
            "Task {}: {}\nStatus: {}\nDuration: {}\nTurns: {}\nTool calls: {}\nTokens: {} in, {} out\n",
            task.id,
            task.description,
            task.status.as_str(),
            format_secs(view.elapsed_secs),
            task.turns,
            task.tool_calls,
            task.tokens.input_tokens,
            task.tokens.output_tokens,
        );
        text.push_str(&format!("Cost: {}\n", task_cost(self.env, task)));
        if let Some(error) = &task.error {
            text.push_str(&format!("Error: {error}\n"));
        }
        for warning in &task.warnings {
            text.push_str(&format!("Warning: {warning}\n"));
        }
        let answer = view.answer();
        if !answer.is_empty() {
            text.push('\n');
            text.push_str(&(self.answer)(&task.id.to_string(), answer));
            text.push('\n');
        }
        text
    }
}

/// What a task's tokens cost at its model's price (the store keeps no cache split: every input
/// token at the input price, an upper bound), or "no price".
fn task_cost(env: &Env, task: &crate::store::TaskRecord) -> String {
    let price = task.model.as_deref().and_then(|model| {
        crate::config::load_config(env)
            .ok()
            .and_then(|(config, _)| config.price(model))
    });
    match price {
        Some(price) => crate::output::fmt_cost(price.cost(&task.tokens)),
        None => "no price".to_owned(),
    }
}

/// An error as a model reads it: diagnostics rendered without colour, no program name, and
/// the tool's own words for listing the sources.
pub(crate) fn error_text(error: &Error, env: &Env) -> String {
    match error {
        Error::Input(diags) => {
            let text =
                crate::diag::render_all(&diags.items, &env.cwd, crate::color::Palette::default());
            text.replace("summon: error: ", "")
                .replace("Use summon load to see", "Use load() to see")
                .trim_end()
                .to_owned()
        }
        Error::Failed(message) | Error::Busy(message) | Error::Internal(message) => message.clone(),
        Error::Store(e) => e.to_string(),
        Error::Io(e) => e.to_string(),
        Error::Write { path, source } => Error::write_message(path, source),
        Error::StillRunning => "still running".into(),
        Error::Interrupted => "interrupted".into(),
        Error::Budget => "budget reached".into(),
        Error::ProviderStopped { refused: true } => "the provider refused the key".into(),
        Error::ProviderStopped { refused: false } => "the provider could not be reached".into(),
    }
}

/// The subagents' `load`: the project's sources as they are when it is called, and its
/// background tasks, waited for at most `wait`.
#[derive(Debug)]
pub(crate) struct ProjectLoader {
    pub(crate) env: Env,
    pub(crate) wait: Duration,
}

impl crate::subagent::Loader for ProjectLoader {
    fn load(&self, source: Option<&str>, peek: bool, cancel: bool) -> Result<String, String> {
        let catalog = crate::source::discover(crate::source::search_dirs(&self.env));
        let listing = super::list_sources(&catalog);
        Loading {
            env: &self.env,
            catalog: &catalog,
            listing: &listing,
            wait: self.wait,
            interrupted: &|| false,
            answer: &|_, answer| answer.to_owned(),
            tool: "load",
            // A subagent starts no task (delegations cannot nest), so it reads, collects and
            // cancels none: another caller's task reads as unknown.
            owned: Some(&|_| false),
            delivered: None,
        }
        .load(source, peek, cancel)
    }
}

/// The lines of `load`'s list of finished background tasks awaiting collection (id,
/// description, status), with the blank line after them.
pub(crate) fn awaiting_lines<'a>(
    tasks: impl Iterator<Item = &'a crate::store::TaskRecord>,
) -> String {
    let mut text = String::new();
    for task in tasks {
        text.push_str(&format!(
            "  {}  {}  ({})\n",
            task.id,
            task.description,
            task.status.as_str()
        ));
    }
    text.push('\n');
    text
}
