//! The live display of a run, on stderr. [`resolve`] picks the mode:
//!
//! - [`DisplayMode::Bar`] on a terminal: one indicatif bar per step,
//!   `notes [=====>    ] 120/400 41s, ETA 1m · 16 in flight, 3 failed, 52.1k tokens, $0.21` (the
//!   counts cut to the terminal's width, never wrapped; `, 2 waiting to retry (next in 1.5s)` while tasks
//!   wait out a provider's retry delay),
//!   a spinner while the step's total is unknown, redrawn at most [`BAR_HZ`] times a second.
//!   When the run ends (or is interrupted) the bars are cleared and each step's final line is
//!   printed once.
//! - [`DisplayMode::Lines`] when stderr is not a terminal or `CI` is set: one plain line per
//!   running step every [`LINES_INTERVAL`], and one when a step ends:
//!   `[summon] notes: 120/400 done, 16 in flight, 3 failed, 52.1k tokens, $0.21`.
//! - [`DisplayMode::Quiet`] with `--quiet`: nothing.
//!
//! Per task the cost is O(1): a short mutex hold to bump counters. Nothing is formatted per
//! task; a background thread reads the counters and draws (bars) or prints (lines).

use std::io::{self, Write};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indexmap::IndexMap;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::report::{cache_share, fmt_tokens};

/// Bar redraws per second, at most.
pub(crate) const BAR_HZ: u8 = 10;
/// The pause between two rounds of plain lines.
pub(crate) const LINES_INTERVAL: Duration = Duration::from_secs(5);

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DisplayMode {
    Bar,
    Lines,
    Quiet,
}

/// The display for a run: `--quiet` wins, then `CI` or a non-terminal stderr give plain lines.
pub(crate) fn resolve(is_terminal: bool, is_ci: bool, quiet: bool) -> DisplayMode {
    if quiet {
        DisplayMode::Quiet
    } else if is_ci || !is_terminal {
        DisplayMode::Lines
    } else {
        DisplayMode::Bar
    }
}

#[derive(Default)]
struct StepState {
    total: Option<u64>,
    done: u64,
    /// Tasks sent and not finished, those waiting to retry among them.
    in_flight: u64,
    /// Of those, the tasks that gave their concurrency slot back to wait, and have not taken
    /// one again: not in flight.
    parked: u64,
    /// When the retry waits of the step's tasks end: a task is waiting until then, not in
    /// flight.
    retry_ends: Vec<Instant>,
    /// When the waits of the step's requests held by the provider's rate limits end, and the
    /// limit that held the last one.
    held_ends: Vec<Instant>,
    held_by: String,
    failed: u64,
    tokens: u64,
    /// Input tokens, and those of them read from the provider's prompt cache.
    input: u64,
    cache_read: u64,
    cost: f64,
    priced: u64,
    unpriced: u64,
    finished: bool,
    /// Changed since the last draw.
    dirty: bool,
    bar: Option<ProgressBar>,
    /// The style the bar has once started: `Some(true)` with a total, `Some(false)` a spinner
    /// (a step's total may be learned after it started).
    bar_style: Option<bool>,
    /// A task of the step was sent: until then it waits for the steps it depends on.
    started: bool,
}

impl StepState {
    /// The cost so far ([`super::report::cost_text`]), nothing before the first task ends.
    fn cost_text(&self) -> Option<String> {
        super::report::cost_text(self.cost, self.priced, self.unpriced)
    }

    /// How many tasks wait to retry now, and when the first of them goes again.
    fn waiting(&self) -> (u64, Option<Duration>) {
        let now = Instant::now();
        let left = self
            .retry_ends
            .iter()
            .filter_map(|end| end.checked_duration_since(now));
        left.fold((0, None), |(n, next), wait| {
            (
                n + 1,
                Some(next.map_or(wait, |next: Duration| next.min(wait))),
            )
        })
    }

    /// `16 in flight` and, while some tasks wait to retry, `2 waiting to retry (next in 1.5s)`;
    /// while the provider's limits hold requests back, first (a narrow terminal cuts the
    /// line's end), `12 held by the provider's output tokens per minute (40k)`.
    fn flight(&self) -> String {
        let (waiting, next) = self.waiting();
        let now = Instant::now();
        let held = self.held_ends.iter().filter(|end| **end > now).count();
        let mut text = if held > 0 {
            format!("{held} held by {}, ", self.held_by)
        } else {
            String::new()
        };
        text.push_str(&format!(
            "{} in flight",
            self.in_flight.saturating_sub(self.parked)
        ));
        if let Some(next) = next {
            text.push_str(&format!(
                ", {waiting} waiting to retry (next in {:.1}s)",
                next.as_secs_f64()
            ));
        }
        text
    }

    /// `120/400 done, 16 in flight, 3 failed, 52.1k tokens, $0.21`
    fn line(&self, id: &str) -> String {
        let mut line = format!("[summon] {id}: {}", self.done);
        if let Some(total) = self.total {
            line.push_str(&format!("/{total}"));
        }
        line.push_str(" done");
        if !self.finished {
            line.push_str(", ");
            line.push_str(&self.flight());
        }
        line.push_str(&format!(
            ", {} failed, {} tokens",
            self.failed,
            fmt_tokens(self.tokens)
        ));
        if let Some(share) = cache_share(self.input, self.cache_read) {
            line.push_str(", ");
            line.push_str(&share);
        }
        if let Some(cost) = self.cost_text() {
            line.push_str(", ");
            line.push_str(&cost);
        }
        line
    }

    /// The bar's message: `16 in flight, 3 failed, 52.1k tokens, 62% cached, $0.21`, and the
    /// run's spend against its cap when it has one.
    fn message(&self, budget: Option<&str>) -> String {
        let mut parts = Vec::new();
        if !self.finished {
            parts.push(self.flight());
        }
        parts.push(format!("{} failed", self.failed));
        parts.push(format!("{} tokens", fmt_tokens(self.tokens)));
        // Short on the bar, which must fit a terminal line with its ETA.
        if self.cache_read > 0 && self.input > 0 {
            let percent = (self.cache_read as f64 * 100.0 / self.input as f64).round();
            parts.push(format!("{percent:.0}% cached"));
        }
        if let Some(cost) = self.cost_text() {
            parts.push(cost);
        }
        if let Some(budget) = budget {
            parts.push(format!("run {budget}"));
        }
        parts.join(", ")
    }

    fn draw(&mut self, budget: Option<&str>) {
        self.dirty = false;
        let Some(bar) = &self.bar else { return };
        if let Some(total) = self.total {
            bar.set_length(total);
        }
        // Waiting, then a spinner until the total is known, then the bar.
        let with_total = self.total.is_some();
        if (self.started || self.done > 0) && self.bar_style != Some(with_total) {
            bar.set_style(bar_style(with_total));
            self.bar_style = Some(with_total);
        }
        bar.set_position(self.done);
        bar.set_message(self.message(budget));
        if self.finished && !bar.is_finished() {
            bar.finish();
        }
    }
}

struct Shared {
    mode: DisplayMode,
    steps: Mutex<IndexMap<String, StepState>>,
    multi: Option<MultiProgress>,
    lines_out: Mutex<Box<dyn Write + Send>>,
    /// The run's spend cap, when it has one.
    budget: Mutex<Option<Arc<crate::subagent::budget::Ledger>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    /// `$0.21 of $1.00 cap`, under a spend cap.
    fn budget_text(&self) -> Option<String> {
        lock(&self.budget)
            .as_ref()
            .map(|ledger| format!("{} cap", ledger.spent_of_cap()))
    }

    fn print(&self, text: &str) {
        match &self.multi {
            Some(multi) => {
                let _ = multi.println(text);
            }
            None => {
                let mut out = lock(&self.lines_out);
                let _ = out.write_all(text.as_bytes());
                let _ = out.flush();
            }
        }
    }

    /// One round of the background thread.
    fn tick(&self) {
        let budget = self.budget_text();
        let budget = budget.as_deref();
        let mut steps = lock(&self.steps);
        match self.mode {
            DisplayMode::Bar => {
                for state in steps.values_mut() {
                    // A retry wait counts down: drawn again until it is over.
                    let now = Instant::now();
                    let waits = state.retry_ends.len();
                    state.retry_ends.retain(|end| *end > now);
                    if state.dirty || waits > 0 {
                        state.draw(budget);
                    } else if let (Some(bar), false) = (&state.bar, state.finished) {
                        // The spinner turns and the elapsed time and ETA move on.
                        bar.tick();
                    }
                }
            }
            DisplayMode::Lines => {
                let mut text = String::new();
                for (id, state) in steps.iter() {
                    if !state.finished && (state.done > 0 || state.in_flight > 0) {
                        text.push_str(&state.line(id));
                        text.push('\n');
                    }
                }
                drop(steps);
                if let (false, Some(budget)) = (text.is_empty(), budget) {
                    text.push_str(&format!("[summon] spent {budget}\n"));
                }
                if !text.is_empty() {
                    self.print(&text);
                }
            }
            DisplayMode::Quiet => {}
        }
    }
}

/// The live display. Methods take `&self`; share it behind an `Arc`.
pub(crate) struct Progress {
    shared: Arc<Shared>,
    ticker: Mutex<Option<(mpsc::Sender<()>, JoinHandle<()>)>>,
    /// The terminal's settings before the bars turned its `^C` echo off.
    echo: Mutex<Option<QuietInterrupt>>,
}

/// The terminal's `^C` echo (`ECHOCTL`), off while the bars are drawn: the terminal writes
/// `^C` where the cursor is when Ctrl-C is typed, behind the bars' back, and the bars could not
/// be cleared whole after it (a frozen bar above the last lines). Restored when the display
/// stops.
struct QuietInterrupt {
    saved: nix::sys::termios::Termios,
}

impl QuietInterrupt {
    /// Turns the echo off on stderr's terminal; `None` when stderr is not a terminal or the
    /// echo is off already.
    fn start() -> Option<Self> {
        use nix::sys::termios::{LocalFlags, SetArg, tcgetattr, tcsetattr};
        let stderr = io::stderr();
        let saved = tcgetattr(&stderr).ok()?;
        if !saved.local_flags.contains(LocalFlags::ECHOCTL) {
            return None;
        }
        let mut quiet = saved.clone();
        quiet.local_flags.remove(LocalFlags::ECHOCTL);
        tcsetattr(&stderr, SetArg::TCSANOW, &quiet).ok()?;
        Some(Self { saved })
    }

    fn restore(self) {
        use nix::sys::termios::{SetArg, tcsetattr};
        let _ = tcsetattr(io::stderr(), SetArg::TCSANOW, &self.saved);
    }
}

impl crate::process::groups::Screen for Progress {
    fn finish(&self) {
        Progress::finish(self);
    }
}

impl Progress {
    /// The display on stderr.
    pub(crate) fn new(mode: DisplayMode) -> Self {
        let progress = Self::build(
            mode,
            ProgressDrawTarget::stderr_with_hz(BAR_HZ),
            Box::new(io::stderr()),
            LINES_INTERVAL,
        );
        if mode == DisplayMode::Bar {
            *lock(&progress.echo) = QuietInterrupt::start();
        }
        progress
    }

    fn build(
        mode: DisplayMode,
        bar_target: ProgressDrawTarget,
        lines_out: Box<dyn Write + Send>,
        lines_interval: Duration,
    ) -> Self {
        let multi = (mode == DisplayMode::Bar).then(|| MultiProgress::with_draw_target(bar_target));
        let shared = Arc::new(Shared {
            mode,
            steps: Mutex::new(IndexMap::new()),
            multi,
            lines_out: Mutex::new(lines_out),
            budget: Mutex::new(None),
        });
        let interval = match mode {
            DisplayMode::Bar => Some(Duration::from_millis(1000 / u64::from(BAR_HZ))),
            DisplayMode::Lines => Some(lines_interval),
            DisplayMode::Quiet => None,
        };
        let ticker = interval.and_then(|interval| {
            let (stop, stopped) = mpsc::channel::<()>();
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("summon-progress".to_owned())
                .spawn(move || {
                    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                        shared.tick();
                    }
                })
                .ok()
                .map(|handle| (stop, handle))
        });
        Self {
            shared,
            ticker: Mutex::new(ticker),
            echo: Mutex::new(None),
        }
    }
    pub(crate) fn mode(&self) -> DisplayMode {
        self.shared.mode
    }

    /// Adds a step (again: updates its total). `total` is its task count, when known.
    /// Shows the run's spend against its cap.
    pub(crate) fn set_budget(&self, ledger: Arc<crate::subagent::budget::Ledger>) {
        *lock(&self.shared.budget) = Some(ledger);
    }

    pub(crate) fn add_step(&self, id: &str, total: Option<u64>) {
        let mut steps = lock(&self.shared.steps);
        if let Some(state) = steps.get_mut(id) {
            state.total = total.or(state.total);
            state.dirty = true;
            return;
        }
        let bar = self.shared.multi.as_ref().map(|multi| {
            let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::hidden())
                .with_style(waiting_style())
                .with_prefix(id.to_owned());
            multi.add(bar)
        });
        steps.insert(
            id.to_owned(),
            StepState {
                total,
                dirty: true,
                bar,
                ..StepState::default()
            },
        );
    }

    /// Sets the task count of `step`, once known (after its items are produced).
    pub(crate) fn set_total(&self, step: &str, total: u64) {
        self.add_step(step, Some(total));
    }

    /// A task of `step` was sent.
    pub(crate) fn task_started(&self, step: &str) {
        if let Some(state) = lock(&self.shared.steps).get_mut(step) {
            if !state.started {
                state.started = true;
                // The step's clock starts with its first task, not with the run.
                if let Some(bar) = &state.bar {
                    bar.reset();
                }
            }
            state.in_flight += 1;
            state.dirty = true;
        }
    }

    /// A task of `step` gave its concurrency slot back (`given`), or took one again.
    pub(crate) fn slot(&self, step: &str, given: bool) {
        if let Some(state) = lock(&self.shared.steps).get_mut(step) {
            if given {
                state.parked += 1;
            } else {
                state.parked = state.parked.saturating_sub(1);
            }
            state.dirty = true;
        }
    }

    /// A task of `step` waits `wait` before its request is sent again.
    pub(crate) fn retry(&self, step: &str, wait: Duration) {
        if let Some(state) = lock(&self.shared.steps).get_mut(step) {
            let now = Instant::now();
            state.retry_ends.retain(|end| *end > now);
            state.retry_ends.push(now + wait);
            state.dirty = true;
        }
    }

    /// A request of a task of `step` waits `wait` at most for the provider's rate limit
    /// `limit`; a zero `wait`: one such hold ended (early, as tokens came back).
    pub(crate) fn held(&self, step: &str, limit: &str, wait: Duration) {
        if let Some(state) = lock(&self.shared.steps).get_mut(step) {
            let now = Instant::now();
            state.held_ends.retain(|end| *end > now);
            if wait.is_zero() {
                if let Some(first) = state
                    .held_ends
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, end)| **end)
                    .map(|(i, _)| i)
                {
                    state.held_ends.swap_remove(first);
                }
                state.dirty = true;
                return;
            }
            state.held_ends.push(now + wait);
            if state.held_by != limit {
                limit.clone_into(&mut state.held_by);
            }
            state.dirty = true;
        }
    }

    /// A task of `step` ended; `cost` is `None` when its model has no price.
    pub(crate) fn task_finished(&self, step: &str, ok: bool, tokens: u64, cost: Option<f64>) {
        if let Some(state) = lock(&self.shared.steps).get_mut(step) {
            state.in_flight = state.in_flight.saturating_sub(1);
            state.done += 1;
            state.failed += u64::from(!ok);
            state.tokens += tokens;
            match cost {
                Some(cost) => {
                    state.cost += cost;
                    state.priced += 1;
                }
                None => state.unpriced += 1,
            }
            state.dirty = true;
        }
    }

    /// Counts a finished task's input and the part of it read from the prompt cache (called
    /// before [`Progress::task_finished`], which redraws).
    pub(crate) fn task_input(&self, step: &str, input: u64, cache_read: u64) {
        if let Some(state) = lock(&self.shared.steps).get_mut(step) {
            state.input += input;
            state.cache_read += cache_read;
        }
    }

    /// `step` is over: its bar shows its final numbers, or its last line is printed.
    pub(crate) fn step_finished(&self, step: &str) {
        let budget = self.shared.budget_text();
        let mut steps = lock(&self.shared.steps);
        let Some(state) = steps.get_mut(step) else {
            return;
        };
        if state.finished {
            return;
        }
        state.finished = true;
        match self.shared.mode {
            DisplayMode::Bar => state.draw(budget.as_deref()),
            DisplayMode::Lines => {
                let mut line = state.line(step);
                line.push('\n');
                if let Some(budget) = budget {
                    line.push_str(&format!("[summon] spent {budget}\n"));
                }
                drop(steps);
                self.shared.print(&line);
            }
            DisplayMode::Quiet => {}
        }
    }

    /// Prints a line without disturbing the bars (they are redrawn below it).
    pub(crate) fn println(&self, text: &str) {
        match self.shared.mode {
            DisplayMode::Bar => self.shared.print(text),
            _ => {
                let mut line = text.to_owned();
                line.push('\n');
                self.shared.print(&line);
            }
        }
    }

    /// The run was interrupted: the terminal has echoed `^C` into the bars' last line, so the
    /// frame is redrawn from a fresh line, and `text` is printed above it.
    pub(crate) fn interrupted(&self, text: &str) {
        if let (DisplayMode::Bar, Some(multi)) = (self.shared.mode, &self.shared.multi) {
            let _ = multi.clear();
            let mut out = lock(&self.shared.lines_out);
            let _ = out.write_all(b"\r\x1b[2K");
            let _ = out.flush();
        }
        self.println(text);
    }

    /// Stops the display: the bars are cleared and every step's final line printed once, or
    /// a last line for every step that did not finish. Idempotent; dropping the display does
    /// it too.
    pub(crate) fn finish(&self) {
        if let Some(echo) = lock(&self.echo).take() {
            echo.restore();
        }
        let Some((stop, handle)) = lock(&self.ticker).take() else {
            return;
        };
        drop(stop);
        let _ = handle.join();
        let mut steps = lock(&self.shared.steps);
        match self.shared.mode {
            DisplayMode::Bar => {
                for state in steps.values_mut() {
                    if let Some(bar) = state.bar.take() {
                        bar.finish_and_clear();
                    }
                }
                if let Some(multi) = &self.shared.multi {
                    let _ = multi.clear();
                }
                let mut text = String::new();
                for (id, state) in steps.iter_mut() {
                    if state.done > 0 || state.in_flight > 0 || state.total.is_some() {
                        state.finished = true;
                        text.push_str(&state.line(id));
                        text.push('\n');
                    }
                }
                drop(steps);
                let mut out = lock(&self.shared.lines_out);
                let _ = out.write_all(text.as_bytes());
                let _ = out.flush();
            }
            DisplayMode::Lines => {
                let mut text = String::new();
                for (id, state) in steps.iter_mut() {
                    if !state.finished && (state.done > 0 || state.in_flight > 0) {
                        text.push_str(&state.line(id));
                        text.push('\n');
                    }
                }
                drop(steps);
                if !text.is_empty() {
                    self.shared.print(&text);
                }
            }
            DisplayMode::Quiet => {}
        }
    }
}

/// A step's bar: with a total, the bar, counts, elapsed time and ETA; without one, a
/// spinner and the count so far.
fn bar_style(with_total: bool) -> ProgressStyle {
    style(if with_total {
        "{prefix:.bold} [{bar:30}] {pos}/{len} {elapsed}, ETA {eta} · {wide_msg}"
    } else {
        "{spinner} {prefix:.bold} {pos} done, {elapsed} · {wide_msg}"
    })
}

/// A step that waits for the steps it depends on.
fn waiting_style() -> ProgressStyle {
    style("{prefix:.bold} waiting")
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .expect("valid template")
        .progress_chars("=> ")
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_held_by_a_rate_limit_are_said_first_with_the_limit() {
        let mut state = StepState {
            total: Some(3),
            in_flight: 3,
            parked: 2,
            held_by: "the provider's output tokens per minute (40k)".to_owned(),
            ..StepState::default()
        };
        let later = Instant::now() + Duration::from_secs(30);
        state.held_ends = vec![later, later];
        assert_eq!(
            state.line("s"),
            "[summon] s: 0/3 done, 2 held by the provider's output tokens per minute (40k), \
             1 in flight, 0 failed, 0 tokens"
        );
        // Their waits over: nothing is said of them.
        state.held_ends = vec![Instant::now() - Duration::from_millis(1)];
        assert!(
            state
                .line("s")
                .starts_with("[summon] s: 0/3 done, 1 in flight, 0 failed")
        );
    }

    #[test]
    fn a_task_waiting_to_retry_is_not_in_flight_and_its_wait_counts_down() {
        let mut state = StepState {
            total: Some(3),
            in_flight: 2,
            ..StepState::default()
        };
        assert_eq!(
            state.line("s"),
            "[summon] s: 0/3 done, 2 in flight, 0 failed, 0 tokens"
        );
        // The task gives its slot back, then waits.
        state.parked = 1;
        state
            .retry_ends
            .push(Instant::now() + Duration::from_secs(30));
        let line = state.line("s");
        assert!(
            line.starts_with("[summon] s: 0/3 done, 1 in flight, 1 waiting to retry (next in "),
            "{line}"
        );
        let next: f64 = line
            .split("next in ")
            .nth(1)
            .and_then(|rest| rest.split('s').next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(next > 25.0 && next <= 30.0, "{line}");
        // A wait that is over, the slot not taken again yet: still not in flight.
        state.retry_ends = vec![Instant::now() - Duration::from_millis(1)];
        assert!(
            state.message(None).starts_with("1 in flight, 0 failed"),
            "{}",
            state.message(None)
        );
        // The slot taken again: in flight.
        state.parked = 0;
        assert!(
            state.message(None).starts_with("2 in flight, 0 failed"),
            "{}",
            state.message(None)
        );
    }

    /// Tasks that gave their slot back and wait for one are not in flight: at concurrency 2
    /// the display never says more than 2, however many tasks started.
    #[test]
    fn tasks_waiting_for_a_slot_are_not_in_flight() {
        let progress = Progress::new(DisplayMode::Quiet);
        progress.add_step("s", Some(20));
        for _ in 0..12 {
            progress.task_started("s");
        }
        for _ in 0..10 {
            progress.slot("s", true);
        }
        let steps = lock(&progress.shared.steps);
        let message = steps.get("s").unwrap().message(None);
        assert!(message.starts_with("2 in flight"), "{message}");
    }

    #[test]
    fn display_mode_table() {
        use DisplayMode::*;
        // (is_terminal, is_ci, quiet) -> mode
        let table = [
            ((true, false, false), Bar),
            ((true, true, false), Lines),
            ((false, false, false), Lines),
            ((false, true, false), Lines),
            ((true, false, true), Quiet),
            ((true, true, true), Quiet),
            ((false, false, true), Quiet),
            ((false, true, true), Quiet),
        ];
        for ((terminal, ci, quiet), want) in table {
            assert_eq!(
                resolve(terminal, ci, quiet),
                want,
                "{terminal} {ci} {quiet}"
            );
        }
    }

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            lock(&self.0).extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Buffer {
        fn text(&self) -> String {
            String::from_utf8(lock(&self.0).clone()).unwrap()
        }
    }

    fn lines_progress(interval: Duration) -> (Progress, Buffer) {
        let buffer = Buffer::default();
        let progress = Progress::build(
            DisplayMode::Lines,
            ProgressDrawTarget::hidden(),
            Box::new(buffer.clone()),
            interval,
        );
        (progress, buffer)
    }

    #[test]
    fn lines_are_periodic_and_final() {
        let (progress, buffer) = lines_progress(Duration::from_millis(50));
        progress.add_step("notes", Some(400));
        progress.add_step("later", None);
        for _ in 0..136 {
            progress.task_started("notes");
        }
        for i in 0..120 {
            progress.task_finished("notes", i % 40 != 0, 434, Some(0.00175));
        }
        let want = "[summon] notes: 120/400 done, 16 in flight, 3 failed, 52.1k tokens, $0.21";
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !buffer.text().lines().any(|l| l == want) {
            assert!(
                std::time::Instant::now() < deadline,
                "no periodic line: {}",
                buffer.text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let text = buffer.text();
        assert!(
            text.lines().all(|l| l.starts_with("[summon] notes: ")),
            "{text}"
        );
        assert!(!text.contains("later"), "idle steps print nothing: {text}");
        for _ in 0..16 {
            progress.task_finished("notes", true, 0, None);
        }
        progress.step_finished("notes");
        progress.task_started("later");
        progress.task_finished("later", true, 10, None);
        progress.finish();
        progress.finish();
        let text = buffer.text();
        let tail: Vec<&str> = text.lines().rev().take(2).collect();
        assert_eq!(
            tail[0],
            "[summon] later: 1 done, 0 in flight, 0 failed, 10 tokens, no price"
        );
        assert_eq!(
            tail[1],
            "[summon] notes: 136/400 done, 3 failed, 52.1k tokens, $0.21 + no price for 16 tasks"
        );
        // Nothing is printed after finish.
        let len = text.len();
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(buffer.text().len(), len);
    }

    #[test]
    fn bars_print_only_each_step_s_final_line_and_quiet_nothing() {
        for mode in [DisplayMode::Bar, DisplayMode::Quiet] {
            let buffer = Buffer::default();
            let progress = Progress::build(
                mode,
                ProgressDrawTarget::hidden(),
                Box::new(buffer.clone()),
                Duration::from_millis(10),
            );
            progress.add_step("s", Some(2));
            progress.task_started("s");
            progress.task_finished("s", false, 5, Some(0.5));
            progress.task_finished("unknown-step", true, 5, None);
            std::thread::sleep(Duration::from_millis(150));
            {
                let steps = lock(&progress.shared.steps);
                let state = &steps["s"];
                assert_eq!((state.done, state.failed, state.tokens), (1, 1, 5));
                assert_eq!(
                    state.message(None),
                    "0 in flight, 1 failed, 5 tokens, $0.50"
                );
                if let Some(bar) = &state.bar {
                    assert_eq!(bar.position(), 1);
                    assert_eq!(bar.length(), Some(2));
                }
            }
            progress.step_finished("s");
            drop(progress);
            let want = match mode {
                DisplayMode::Bar => "[summon] s: 1/2 done, 1 failed, 5 tokens, $0.50\n",
                _ => "",
            };
            assert_eq!(buffer.text(), want, "{mode:?}");
        }
    }

    #[test]
    fn per_task_updates_are_cheap() {
        let (progress, _buffer) = lines_progress(LINES_INTERVAL);
        progress.add_step("s", Some(1_000_000));
        let started = std::time::Instant::now();
        for _ in 0..200_000 {
            progress.task_started("s");
            progress.task_finished("s", true, 100, Some(0.001));
        }
        let per_task = started.elapsed() / 200_000;
        // Generous for debug builds on a shared machine; a release build is far below.
        assert!(
            per_task < Duration::from_micros(20),
            "{per_task:?} per task"
        );
    }
}
