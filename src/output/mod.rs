//! Writing results: a run's outputs as one consumer of its events, stdout that survives a
//! closed pipe, and YAML for people.

mod junit;
mod progress;
mod recorder;
mod report;
mod report_html;
mod results;
mod stdout;
mod step_summary;
mod table;
mod yaml_text;

pub(crate) use junit::JunitWriter;
pub(crate) use progress::{DisplayMode, Progress, resolve as resolve_display};
pub(crate) use recorder::{Outputs, Recorder, WriteError, served_tier};
pub(crate) use report::{
    BudgetJson, REPORT_FILE, RETRY_CLASSES, Report, fmt_cost, fmt_duration, fmt_tokens,
    write_atomically,
};
pub(crate) use report_html::{HTML_FILE, HtmlError, write_html};
pub(crate) use results::{RESULTS_FILE, ResultLine, ResultsWriter, read_results};
pub(crate) use stdout::Stdout;
pub(crate) use step_summary::{STEP_SUMMARY_VAR, append_step_summary};
pub(crate) use table::Tables;
pub(crate) use yaml_text::to_yaml;
