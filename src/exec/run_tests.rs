//! The engine on its own: a plan in, the run's events out, with the test mock as the provider
//! (an HTTP server in this process) and a consumer that keeps every event.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use summon_mock_llm::{MockConfig, MockServer, RecordedRequest, Reply};
use tokio_util::sync::CancellationToken;

use super::plan::{RunRequest, plan_for_run};
use super::{RunOptions, run_pipeline};
use crate::diag::{Diagnostics, SourceFile};
use crate::env::Env;
use crate::event::{Consumer, FailureClass, RunEvent, RunSummary, StepStatus};
use crate::output::DisplayMode;

/// One event as a test compares it.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    StepStarted(usize),
    Total(usize, u64),
    Sent(usize, usize),
    Retry(usize, &'static str, Duration),
    Finished {
        step: usize,
        index: u64,
        ok: bool,
        row: Option<u64>,
    },
    StepFinished(usize, StepStatus, Option<String>),
    /// Just before a failed task's `Finished`: the class of its failure.
    Failed(u64, FailureClass),
    /// A wait for a provider that is still starting.
    Waiting(usize, Duration),
    Other,
}

/// Keeps every event; with `stop`, cancels it when the first task of step 1 finishes.
struct Tap(Arc<Mutex<Vec<Seen>>>, Option<CancellationToken>);

impl Consumer for Tap {
    fn on_event(&mut self, event: &RunEvent) {
        if let (Some(stop), RunEvent::TaskFinished { done, .. }) = (&self.1, event)
            && done.step == 1
        {
            stop.cancel();
        }
        let mut seen = self.0.lock().unwrap();
        if let RunEvent::TaskFinished { done, .. } = event
            && let Some(failure) = &done.error
        {
            seen.push(Seen::Failed(done.index, failure.class));
        }
        let one = match event {
            RunEvent::StepStarted { step } => Seen::StepStarted(*step),
            RunEvent::StepTotal { step, total } => Seen::Total(*step, *total),
            RunEvent::TasksStarted { step, count } => Seen::Sent(*step, *count),
            RunEvent::Retry { step, class, wait } => Seen::Retry(*step, class, *wait),
            RunEvent::Waiting { step, wait } => Seen::Waiting(*step, *wait),
            RunEvent::TaskFinished { done, row, .. } => Seen::Finished {
                step: done.step,
                index: done.index,
                ok: done.ok,
                row: *row,
            },
            RunEvent::StepFinished {
                step,
                status,
                error,
            } => Seen::StepFinished(*step, *status, error.clone()),
            // What tasks do inside is not what these tests follow.
            RunEvent::Activity(_)
            | RunEvent::Decomposed { .. }
            | RunEvent::Slot { .. }
            | RunEvent::Held { .. }
            | RunEvent::OutputLimit { .. }
            | RunEvent::RateLimits { .. } => return,
            RunEvent::LevelStarted { .. }
            | RunEvent::Notice { .. }
            | RunEvent::Interrupted { .. } => Seen::Other,
        };
        seen.push(one);
    }
}

/// A project folder and the mock provider it talks to.
struct Engine {
    dir: tempfile::TempDir,
    server: MockServer,
    _runtime: tokio::runtime::Runtime,
}

impl Engine {
    fn new(mock: MockConfig) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let server = runtime.block_on(MockServer::start(mock));
        Self {
            dir: tempfile::tempdir().unwrap(),
            server,
            _runtime: runtime,
        }
    }

    fn env(&self) -> Env {
        let home = self.dir.path().to_string_lossy().into_owned();
        Env::for_test(
            self.dir.path(),
            &[
                ("HOME", &home),
                ("OPENAI_BASE_URL", &self.server.url_openai()),
                ("OPENAI_API_KEY", "sk-test-engine"),
                ("SUMMON_MODEL", "mock-model"),
                ("SUMMON_RETRY_BASE_MS", "10"),
            ],
        )
    }

    /// Runs `yaml` (`resume`: the run to continue) and answers how it ended and its events.
    fn run(
        &self,
        yaml: &str,
        concurrency: Option<usize>,
        resume: Option<&str>,
    ) -> (crate::error::Result<RunSummary>, Vec<Seen>) {
        self.run_stopped(yaml, concurrency, resume, None)
    }

    /// [`Self::run`], stopped through `stop` when the first task of step 1 finishes.
    fn run_stopped(
        &self,
        yaml: &str,
        concurrency: Option<usize>,
        resume: Option<&str>,
        stop: Option<CancellationToken>,
    ) -> (crate::error::Result<RunSummary>, Vec<Seen>) {
        let env = self.env();
        let path = self.dir.path().join("p.yaml");
        std::fs::write(&path, yaml).unwrap();
        let file = SourceFile::new(&path, yaml.to_owned());
        let mut diags = Diagnostics::default();
        let pipeline = crate::pipeline::parse::parse_pipeline(&file, &mut diags)
            .unwrap_or_else(|| panic!("{:?}", diags.items));
        let params = indexmap::IndexMap::new();
        let request = RunRequest {
            shard: None,
            until: None,
            items_from: None,
            out: None,
            shown: "p.yaml",
        };
        let plan = plan_for_run(&env, &pipeline, &params, &request).unwrap();
        let (config, _) = crate::config::load_config(&env).unwrap();
        let catalog = crate::source::discover(crate::source::search_dirs(&env));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let options = RunOptions {
            max_cost: None,
            pipeline,
            params,
            concurrency,
            out_dir: None,
            resume: resume.map(|id| Some(id.to_owned())),
            junit: None,
            display: DisplayMode::Quiet,
            batch: false,
            plan,
            reuse: false,
            wait: false,
            watch: Some(Box::new(Tap(Arc::clone(&seen), stop.clone()))),
            trace_id: None,
            traceparent: None,
            stop,
        };
        let summary = run_pipeline(&env, config, catalog, options);
        let seen = seen.lock().unwrap().clone();
        (summary, seen)
    }
}

/// `list` gives `items`; `each` fans out over them with `extra` keys; `sum` synthesizes.
fn pipeline(items: &[&str], extra: &str) -> String {
    format!(
        "version: 1\nname: engine\nsteps:\n  - id: list\n    decompose:\n      items: [{}]\n  - \
         id: each\n    fan_out:\n      over: list\n      instructions: \"Check {{{{ item \
         }}}}\"\n{extra}  - id: sum\n    synthesize:\n      instructions: \"Sum {{% for r in \
         steps.each.results %}}{{{{ r.status }}}} {{% endfor %}}\"\n",
        items.join(", ")
    )
}

/// Fails every fan-out request whose item contains `bad`.
fn failing_bad() -> MockConfig {
    MockConfig::new().rule(|req: &RecordedRequest| {
        let text = req.last_user_text().unwrap_or_default();
        if text.starts_with("Check ") && text.contains("bad") {
            Reply::status(
                400,
                r#"{"error":{"message":"this item is bad","type":"invalid_request_error"}}"#,
            )
        } else {
            Reply::Echo
        }
    })
}

fn step_ends(seen: &[Seen]) -> Vec<(usize, StepStatus)> {
    seen.iter()
        .filter_map(|s| match s {
            Seen::StepFinished(step, status, _) => Some((*step, *status)),
            _ => None,
        })
        .collect()
}

fn finished(seen: &[Seen], step: usize) -> Vec<(u64, bool, Option<u64>)> {
    seen.iter()
        .filter_map(|s| match s {
            Seen::Finished {
                step: st,
                index,
                ok,
                row,
            } if *st == step => Some((*index, *ok, *row)),
            _ => None,
        })
        .collect()
}

fn position(seen: &[Seen], wanted: &Seen) -> usize {
    seen.iter()
        .position(|s| s == wanted)
        .unwrap_or_else(|| panic!("no {wanted:?} in {seen:#?}"))
}

#[test]
fn a_run_emits_each_step_between_its_start_and_end_in_dependency_order() {
    let engine = Engine::new(MockConfig::new());
    let (summary, seen) = engine.run(&pipeline(&["a", "b", "c"], ""), None, None);
    let summary = summary.unwrap();
    assert!(summary.steps.iter().all(|s| s.1 == StepStatus::Succeeded));
    assert_eq!(
        step_ends(&seen),
        [
            (0, StepStatus::Succeeded),
            (1, StepStatus::Succeeded),
            (2, StepStatus::Succeeded)
        ]
    );
    for step in 0..3 {
        let start = position(&seen, &Seen::StepStarted(step));
        let end = position(
            &seen,
            &Seen::StepFinished(step, StepStatus::Succeeded, None),
        );
        assert!(start < end);
        if step > 0 {
            let before = position(
                &seen,
                &Seen::StepFinished(step - 1, StepStatus::Succeeded, None),
            );
            assert!(before < start, "step {step} started before its input ended");
        }
        // Every task of the step is sent and finished inside it.
        for (i, s) in seen.iter().enumerate() {
            if matches!(s, Seen::Sent(st, _) | Seen::Finished { step: st, .. } if *st == step) {
                assert!(start < i && i < end, "{s:?} outside step {step}");
            }
        }
    }
    assert!(position(&seen, &Seen::Total(1, 3)) < position(&seen, &Seen::Sent(1, 1)));
    // Journal rows are handed out in the order the outputs see the tasks: 0, 1, 2, 3.
    let rows: Vec<Option<u64>> = seen
        .iter()
        .filter_map(|s| match s {
            Seen::Finished { row, .. } => Some(*row),
            _ => None,
        })
        .collect();
    assert_eq!(rows, [Some(0), Some(1), Some(2), Some(3)]);
    let mut items: Vec<u64> = finished(&seen, 1).iter().map(|f| f.0).collect();
    items.sort_unstable();
    assert_eq!(items, [0, 1, 2]);
}

#[test]
fn tasks_in_flight_never_exceed_the_cap() {
    let engine = Engine::new(MockConfig::new().latency(Duration::from_millis(100)));
    let items: Vec<String> = (0..8).map(|i| format!("i{i}")).collect();
    let items: Vec<&str> = items.iter().map(String::as_str).collect();
    let (summary, seen) = engine.run(&pipeline(&items, ""), Some(3), None);
    summary.unwrap();
    let (mut now, mut peak) = (0usize, 0usize);
    for s in &seen {
        match s {
            Seen::Sent(1, n) => now += n,
            Seen::Finished { step: 1, .. } => now -= 1,
            _ => {}
        }
        peak = peak.max(now);
    }
    assert!(peak <= 3, "peak {peak} over the cap of 3");
    assert!(engine.server.peak_in_flight() <= 3);
    assert_eq!(finished(&seen, 1).len(), 8);
}

#[test]
fn fail_fast_fails_the_step_and_skips_what_needs_it() {
    let engine = Engine::new(failing_bad());
    let (summary, seen) = engine.run(&pipeline(&["ok0", "bad1", "ok2"], ""), Some(1), None);
    let summary = summary.unwrap();
    let statuses: Vec<StepStatus> = summary.steps.iter().map(|s| s.1).collect();
    assert_eq!(
        statuses,
        [
            StepStatus::Succeeded,
            StepStatus::Failed,
            StepStatus::Skipped
        ]
    );
    // One at a time: the failure stops the fan-out before its third item.
    assert_eq!(
        finished(&seen, 1),
        [(0, true, Some(0)), (1, false, Some(1))]
    );
    assert!(
        !seen.contains(&Seen::StepStarted(2)),
        "the synthesis of a failed fan-out never starts"
    );
    // The provider's refusal keeps its class up to the task's record.
    assert!(seen.contains(&Seen::Failed(1, FailureClass::Provider("bad_request"))));
    match seen.iter().find(|s| matches!(s, Seen::StepFinished(1, ..))) {
        Some(Seen::StepFinished(_, StepStatus::Failed, Some(error))) => {
            assert!(error.contains("this item is bad"), "{error}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn on_error_continue_runs_every_item_and_min_success_decides() {
    let engine = Engine::new(failing_bad());
    let items = ["ok0", "bad1", "ok2", "ok3"];
    let (summary, seen) = engine.run(
        &pipeline(&items, "    on_error: continue\n    min_success: 3\n"),
        None,
        None,
    );
    assert!(
        summary
            .unwrap()
            .steps
            .iter()
            .all(|s| s.1 == StepStatus::Succeeded)
    );
    assert_eq!(finished(&seen, 1).len(), 4);
    assert_eq!(finished(&seen, 2), [(0, true, Some(4))]);

    let engine = Engine::new(failing_bad());
    let (summary, seen) = engine.run(
        &pipeline(&items, "    on_error: continue\n    min_success: 100%\n"),
        None,
        None,
    );
    let summary = summary.unwrap();
    assert_eq!(summary.steps[1].1, StepStatus::Failed);
    assert_eq!(finished(&seen, 1).len(), 4, "continue still ran every item");
    assert_eq!(summary.steps[2].1, StepStatus::Skipped);
}

#[test]
fn a_provider_still_starting_is_waited_for_as_waiting_not_as_retries() {
    let loading = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let count = Arc::clone(&loading);
    let engine = Engine::new(MockConfig::new().rule(move |_: &RecordedRequest| {
        if count.fetch_add(1, Ordering::SeqCst) < 3 {
            Reply::status(
                503,
                r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#,
            )
        } else {
            Reply::Echo
        }
    }));
    let (summary, seen) = engine.run(&pipeline(&["a", "b"], ""), Some(1), None);
    summary.unwrap();
    let waits: Vec<usize> = seen
        .iter()
        .filter_map(|s| match s {
            Seen::Waiting(step, wait) if !wait.is_zero() => Some(*step),
            _ => None,
        })
        .collect();
    // one event for each of the three refused requests, and none counted as a retry
    assert_eq!(waits, [1, 1, 1], "{seen:?}");
    assert!(
        !seen.iter().any(|s| matches!(s, Seen::Retry(..))),
        "{seen:?}"
    );
}

#[test]
fn a_rate_limit_wait_is_an_event_and_gives_the_slot_to_the_next_task() {
    let first = Arc::new(AtomicBool::new(false));
    let seen_first = Arc::clone(&first);
    let engine = Engine::new(MockConfig::new().rule(move |req: &RecordedRequest| {
        let text = req.last_user_text().unwrap_or_default();
        if text.contains("slow") && !seen_first.swap(true, Ordering::SeqCst) {
            Reply::status_with_headers(429, [("retry-after", "1")], r#"{"error":{}}"#)
        } else {
            Reply::Echo
        }
    }));
    let (summary, seen) = engine.run(&pipeline(&["slow", "quick"], ""), Some(1), None);
    summary.unwrap();
    let retry = seen
        .iter()
        .find_map(|s| match s {
            Seen::Retry(step, class, wait) => Some((*step, *class, *wait)),
            _ => None,
        })
        .expect("a retry event");
    assert_eq!((retry.0, retry.1), (1, "rate_limited"));
    assert!(retry.2 >= Duration::from_secs(1), "waited {:?}", retry.2);
    // With one slot, the second item finished while the first waited out its Retry-After.
    assert_eq!(
        finished(&seen, 1)
            .iter()
            .map(|f| (f.0, f.1))
            .collect::<Vec<_>>(),
        [(1, true), (0, true)]
    );
}

#[test]
fn a_resumed_run_emits_the_journaled_tasks_without_rows_and_runs_only_the_rest() {
    let fail = Arc::new(AtomicBool::new(true));
    let failing = Arc::clone(&fail);
    let engine = Engine::new(MockConfig::new().rule(move |req: &RecordedRequest| {
        let text = req.last_user_text().unwrap_or_default();
        if text.contains("flaky") && failing.load(Ordering::SeqCst) {
            Reply::status(400, r#"{"error":{"message":"not yet"}}"#)
        } else {
            Reply::Echo
        }
    }));
    let yaml = pipeline(
        &["one", "flaky", "three"],
        "    on_error: continue\n    min_success: 100%\n",
    );
    let (summary, _) = engine.run(&yaml, None, None);
    let summary = summary.unwrap();
    assert_eq!(summary.steps[1].1, StepStatus::Failed);
    // Chat requests only: a task waiting for the provider's first answer may ask its model
    // list.
    let chats = || {
        engine
            .server
            .requests()
            .iter()
            .filter(|r| r.api != summon_mock_llm::Api::Models)
            .count()
    };
    let sent_first = chats();
    assert_eq!(sent_first, 3);

    fail.store(false, Ordering::SeqCst);
    let (summary, seen) = engine.run(&yaml, None, Some(&summary.run_id));
    assert!(
        summary
            .unwrap()
            .steps
            .iter()
            .all(|s| s.1 == StepStatus::Succeeded)
    );
    let mut tasks = finished(&seen, 1);
    tasks.sort_unstable();
    // The two completed tasks come from the journal (no new row); only `flaky` ran again.
    assert_eq!(
        tasks,
        [(0, true, None), (1, true, Some(0)), (2, true, None)]
    );
    assert_eq!(chats() - sent_first, 2, "flaky and the synthesis");
}

#[test]
fn a_task_past_its_timeout_fails_as_a_timeout_and_a_retry_runs_it_again() {
    let engine = Engine::new(MockConfig::new().latency(Duration::from_millis(1500)));
    let (summary, seen) = engine.run(
        &pipeline(&["slow"], "    timeout: 1s\n    retries: 1\n"),
        None,
        None,
    );
    assert_eq!(summary.unwrap().steps[1].1, StepStatus::Failed);
    assert!(
        seen.contains(&Seen::Failed(0, FailureClass::Timeout)),
        "{seen:#?}"
    );
    assert_eq!(
        engine.server.request_count(),
        2,
        "the step's retry ran it again"
    );
}

#[test]
fn a_stopped_run_starts_no_new_task_ends_interrupted_and_resumes_the_rest() {
    let engine = Engine::new(MockConfig::new());
    let items = ["a", "b", "c", "d", "e", "f"];
    let yaml = pipeline(&items, "");
    let stop = CancellationToken::new();
    let (summary, seen) = engine.run_stopped(&yaml, Some(1), None, Some(stop.clone()));
    let summary = summary.unwrap();
    assert!(summary.interrupted);
    assert!(stop.is_cancelled());
    // One task at a time: the stop came as the first finished, so no other was started.
    assert_eq!(finished(&seen, 1).len(), 1, "{seen:#?}");
    assert!(
        !seen.contains(&Seen::StepStarted(2)),
        "the synthesis never starts"
    );
    assert_ne!(summary.steps[1].1, StepStatus::Succeeded);

    let (summary, seen) = engine.run(&yaml, Some(1), Some(&summary.run_id));
    assert!(
        summary
            .unwrap()
            .steps
            .iter()
            .all(|s| s.1 == StepStatus::Succeeded)
    );
    let rows: Vec<Option<u64>> = finished(&seen, 1).iter().map(|f| f.2).collect();
    assert_eq!(
        rows.iter().filter(|r| r.is_none()).count(),
        1,
        "one from the journal"
    );
    assert_eq!(
        engine.server.request_count(),
        7,
        "six items and the synthesis, once each"
    );
}
