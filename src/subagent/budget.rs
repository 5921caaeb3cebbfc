//! A spend cap (`--max-cost`, `settings.max_cost`, the config file's `max_cost`): one
//! [`Ledger`] per run or delegation, one [`TaskBudget`] per task.
//!
//! Before each request a task states the most it may still spend: every turn it has left
//! (this one included) at its output limit, with this request's input. The request is sent
//! only when what is spent, plus what the other tasks in flight may still spend, plus that,
//! stays within the cap. A task refused before its first request does not start; one refused
//! later stops before its next request. Every answer's cost (retries and corrections
//! included) is added to what is spent as it arrives. Once a request is refused the cap is
//! reached: no task starts after it, and the tasks in flight finish within what they were
//! given.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::config::file::Price;
use crate::config::prices::{ModelPrices, Tier};
use crate::provider::Usage;

/// The wording of a refused request.
pub(crate) const REACHED: &str = "budget reached";

/// A run's spend cap and what it has spent.
#[derive(Debug)]
pub(crate) struct Ledger {
    cap: f64,
    state: Mutex<State>,
    /// Each model priced against the cap, with the price counted and where it came from.
    prices: Mutex<std::collections::BTreeMap<String, String>>,
}

#[derive(Debug, Default)]
struct State {
    /// USD spent: by earlier attempts of the run, and by every answer since.
    spent: f64,
    /// What the tasks in flight may still spend.
    reserved: f64,
    /// A request was refused: no new task starts.
    reached: bool,
}

impl Ledger {
    /// A cap of `cap` USD, with `spent` spent already (an earlier attempt of a resumed run).
    pub(crate) fn new(cap: f64, spent: f64) -> Arc<Self> {
        Arc::new(Self {
            cap,
            state: Mutex::new(State {
                spent,
                ..State::default()
            }),
            prices: Mutex::default(),
        })
    }

    /// Notes the price `model`'s requests are counted at and where it came from
    /// ([`crate::config::Config::price_source`]), for the message of a reached cap.
    pub(crate) fn counted_at(&self, model: &str, source: Option<String>) {
        let mut prices = self.prices.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(source) = source {
            prices.entry(model.to_owned()).or_insert(source);
        }
    }

    /// `; counted at gpt-4o at $2.50 input, ... (summon's built-in table of ...)`, or nothing
    /// when no model was priced.
    fn prices_text(&self) -> String {
        let prices = self.prices.lock().unwrap_or_else(|e| e.into_inner());
        if prices.is_empty() {
            return String::new();
        }
        let list: Vec<&str> = prices.values().map(String::as_str).collect();
        format!("; counted at {}", list.join("; "))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn cap(&self) -> f64 {
        self.cap
    }

    /// USD spent so far.
    pub(crate) fn spent(&self) -> f64 {
        self.state().spent
    }

    /// Whether a request was refused: the run ends "budget reached".
    pub(crate) fn reached(&self) -> bool {
        self.state().reached
    }

    /// `budget reached: $X of $Y`.
    pub(crate) fn reached_text(&self) -> String {
        format!(
            "{REACHED}: {} of {}{}",
            usd(self.spent()),
            usd(self.cap),
            self.prices_text()
        )
    }

    /// `$X of $Y`: what progress lines, summaries and reports show.
    pub(crate) fn spent_of_cap(&self) -> String {
        format!("{} of {}", usd(self.spent()), usd(self.cap))
    }

    /// Holds `amount` for work sent at once (a provider batch, estimated before it is
    /// sent): `false`, and the cap reached, when it would cross the cap.
    pub(crate) fn hold(&self, amount: f64) -> bool {
        let mut state = self.state();
        if state.reached || state.spent + state.reserved + amount > self.cap * (1.0 + 1e-12) {
            state.reached = true;
            return false;
        }
        state.reserved += amount;
        true
    }

    /// Work held with [`Self::hold`] ended: `held` is given back and `cost` is spent.
    pub(crate) fn settle(&self, held: f64, cost: f64) {
        let mut state = self.state();
        state.reserved = (state.reserved - held).max(0.0);
        state.spent += cost;
    }

    /// A task's budget for a model priced `prices`, asking for `tier`: its worst case at
    /// the tier's price (standard for flex, which may be served at standard), each answer
    /// at the tier the provider says served it.
    pub(crate) fn task(self: &Arc<Self>, prices: ModelPrices, tier: Tier) -> TaskBudget {
        let worst = match tier {
            Tier::Priority => prices.at(Tier::Priority).unwrap_or(prices.standard),
            Tier::Batch => prices.at(Tier::Batch).unwrap_or(prices.standard),
            Tier::Standard | Tier::Flex => prices.standard,
        };
        TaskBudget {
            ledger: Arc::clone(self),
            prices,
            price: worst,
            held: Mutex::new(0.0),
            started: Mutex::new(false),
        }
    }
}

/// A dollar amount as the cap is shown: cents, or finer below a cent.
pub(crate) fn usd(value: f64) -> String {
    if value > 0.0 && value < 0.01 {
        format!("${value:.4}")
    } else {
        format!("${value:.2}")
    }
}

/// Why a request was not sent.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refused {
    /// The task had sent nothing yet: it did not start.
    pub(crate) before_start: bool,
    pub(crate) message: String,
}

/// One task's share of a [`Ledger`]: what it may still spend, held while it runs.
#[derive(Debug)]
pub(crate) struct TaskBudget {
    ledger: Arc<Ledger>,
    prices: ModelPrices,
    /// What a request may cost at most, per token.
    price: Price,
    held: Mutex<f64>,
    /// A request of this task was let through.
    started: Mutex<bool>,
}

impl TaskBudget {
    /// The most a task may still spend: `turns` requests, each of `input` tokens and
    /// `output` tokens at the output limit.
    pub(crate) fn worst(&self, input: u64, output: u64, turns: u32) -> f64 {
        f64::from(turns) * (input as f64 * self.price.input + output as f64 * self.price.output)
            / 1e6
    }

    /// Before a request: may the task send it, given that it may still spend `worst`?
    pub(crate) fn before_request(&self, worst: f64) -> Result<(), Refused> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        let mut state = self.ledger.state();
        let others = (state.reserved - *held).max(0.0);
        let fits = state.spent + others + worst <= self.ledger.cap * (1.0 + 1e-12);
        if !fits || (state.reached && !*started) {
            state.reached = true;
            let spent = state.spent;
            drop(state);
            let message = if *started {
                format!(
                    "{REACHED}: stopped before its next request ({} of {} spent; the next \
                     request may cost up to {}){}",
                    usd(spent),
                    usd(self.ledger.cap),
                    usd(worst),
                    self.ledger.prices_text()
                )
            } else {
                format!(
                    "{REACHED}: not started ({} of {} spent){}",
                    usd(spent),
                    usd(self.ledger.cap),
                    self.ledger.prices_text()
                )
            };
            return Err(Refused {
                before_start: !*started,
                message,
            });
        }
        state.reserved = others + worst;
        *held = worst;
        *started = true;
        Ok(())
    }

    /// After an answer served at `served` (the answer's `service_tier`; none: standard):
    /// what it cost is spent.
    pub(crate) fn spend(&self, usage: &Usage, served: Option<&str>) {
        let tier = served.and_then(Tier::parse).unwrap_or_default();
        let price = self.prices.at(tier).unwrap_or(self.prices.standard);
        let cost = price.cost(usage);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let mut state = self.ledger.state();
        state.spent += cost;
        let released = cost.min(*held);
        *held -= released;
        state.reserved = (state.reserved - released).max(0.0);
    }
}

impl Drop for TaskBudget {
    fn drop(&mut self) {
        let held = *self.held.get_mut().unwrap_or_else(|e| e.into_inner());
        let mut state = self.ledger.state();
        state.reserved = (state.reserved - held).max(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn price() -> ModelPrices {
        // $1 per million input tokens, $10 per million output tokens; flex at half.
        let standard = Price {
            input: 1.0,
            output: 10.0,
            cached_input: 0.1,
            cache_write: 1.0,
        };
        ModelPrices {
            standard,
            flex: Some(standard.scaled(0.5)),
            priority: None,
            batch: None,
        }
    }

    fn usage(input: u64, output: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            ..Usage::default()
        }
    }

    #[test]
    fn a_task_starts_only_when_its_worst_case_fits_beside_the_others() {
        let ledger = Ledger::new(1.0, 0.0);
        let a = ledger.task(price(), Tier::Standard);
        // 2 turns of 100,000 input and 20,000 output tokens: 2 × $0.30.
        let worst = a.worst(100_000, 20_000, 2);
        assert!((worst - 0.6).abs() < 1e-9);
        a.before_request(worst).unwrap();
        let b = ledger.task(price(), Tier::Standard);
        let refused = b.before_request(worst).unwrap_err();
        assert!(refused.before_start, "{refused:?}");
        assert_eq!(
            refused.message,
            "budget reached: not started ($0.00 of $1.00 spent)"
        );
        assert!(ledger.reached());
        // At the cap no new task starts, even one that would fit.
        let c = ledger.task(price(), Tier::Standard);
        assert!(c.before_request(0.0001).unwrap_err().before_start);
        // The task in flight goes on within what it holds.
        a.spend(&usage(100_000, 20_000), None);
        assert!((ledger.spent() - 0.3).abs() < 1e-9);
        a.before_request(a.worst(100_000, 20_000, 1)).unwrap();
        a.spend(&usage(100_000, 20_000), None);
        assert_eq!(ledger.reached_text(), "budget reached: $0.60 of $1.00");
    }

    #[test]
    fn a_task_whose_input_grew_stops_before_its_next_request() {
        let ledger = Ledger::new(1.0, 0.0);
        let a = ledger.task(price(), Tier::Standard);
        a.before_request(a.worst(1_000, 1_000, 3)).unwrap();
        a.spend(&usage(1_000, 1_000), None);
        // A tool result of 900,000 tokens: the next request alone could cost $0.91.
        let refused = a.before_request(a.worst(901_000, 1_000, 2)).unwrap_err();
        assert!(!refused.before_start);
        assert!(
            refused
                .message
                .starts_with("budget reached: stopped before its next request")
        );
    }

    #[test]
    fn an_answer_is_priced_at_the_tier_that_served_it() {
        let ledger = Ledger::new(10.0, 0.0);
        let a = ledger.task(price(), Tier::Flex);
        // Held at the standard price: flex may be served at standard.
        assert!((a.worst(0, 100_000, 1) - 1.0).abs() < 1e-9);
        a.before_request(1.0).unwrap();
        a.spend(&usage(0, 100_000), Some("flex"));
        assert!((ledger.spent() - 0.5).abs() < 1e-9);
        a.spend(&usage(0, 100_000), Some("default"));
        assert!((ledger.spent() - 1.5).abs() < 1e-9);
    }

    #[test]
    fn a_batch_is_held_whole_or_not_at_all() {
        let ledger = Ledger::new(1.0, 0.0);
        assert!(ledger.hold(0.6));
        assert!(!ledger.hold(0.5), "0.6 + 0.5 crosses 1.0");
        assert!(ledger.reached());
        ledger.settle(0.6, 0.2);
        assert!((ledger.spent() - 0.2).abs() < 1e-9);
        assert!(!ledger.hold(0.1), "at the cap nothing more is sent");
    }

    #[test]
    fn what_a_finished_task_held_is_given_back_and_earlier_spending_counts() {
        let ledger = Ledger::new(1.0, 0.5);
        {
            let a = ledger.task(price(), Tier::Standard);
            a.before_request(0.4).unwrap();
        }
        let b = ledger.task(price(), Tier::Standard);
        b.before_request(0.5).unwrap();
        let c = ledger.task(price(), Tier::Standard);
        assert!(
            c.before_request(0.01).is_err(),
            "$0.5 spent before, $0.5 held"
        );
    }
}
