//! Model prices: the built-in table (`prices.json`, dated, with its sources) under the config
//! file's `prices:` entries, and the service tiers that change a price.
//!
//! A model is looked up by its id, then by the id without a dated snapshot suffix
//! (`gpt-4o-2024-08-06` is priced as `gpt-4o`, `claude-sonnet-4-5-20250929` as
//! `claude-sonnet-4-5`). An entry of the config file replaces the standard price of the same
//! model; its tiers keep the built-in table's prices (batch: half the standard price).

use std::collections::HashMap;
use std::sync::OnceLock;

use indexmap::IndexMap;
use serde::Deserialize;

use super::file::Price;

/// The wording of a cost that cannot be told, everywhere it is shown.
pub(crate) const NO_PRICE: &str = "no price";

/// How to give a model a price, said after [`NO_PRICE`].
pub(crate) fn no_price_hint(model: &str) -> String {
    format!(
        "add it to `prices:` in summon.yaml, e.g. `{model}: {{ input: 1.0, output: 4.0 }}` \
         (USD per million tokens; see docs/cost.md)"
    )
}

/// A provider's service tier: what a request is served at, and priced at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Tier {
    #[default]
    Standard,
    /// OpenAI's `flex`: batch prices, slower answers, 429 when capacity is short.
    Flex,
    /// OpenAI's `priority`: faster, dearer.
    Priority,
    /// The provider's batch API (`backend: batch`).
    Batch,
}

impl Tier {
    /// The tier a word names: summon's names, and OpenAI's `service_tier` values (`default`
    /// and `auto` are the standard tier).
    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text {
            "standard" | "default" | "auto" => Some(Self::Standard),
            "flex" => Some(Self::Flex),
            "priority" => Some(Self::Priority),
            "batch" => Some(Self::Batch),
            _ => None,
        }
    }

    /// The `service_tier` a request asks for at this tier (none: the provider's default).
    pub(crate) fn service_tier(self) -> Option<&'static str> {
        match self {
            Self::Flex => Some("flex"),
            Self::Priority => Some("priority"),
            Self::Standard | Self::Batch => None,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Standard => "standard",
            Self::Flex => "flex",
            Self::Priority => "priority",
            Self::Batch => "batch",
        }
    }
}

/// One model's prices: standard, and the tiers that change them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ModelPrices {
    pub(crate) standard: Price,
    pub(crate) flex: Option<Price>,
    pub(crate) priority: Option<Price>,
    pub(crate) batch: Option<Price>,
}

impl ModelPrices {
    /// A config file's entry `standard` over the built-in entry `built_in`, if any (a model
    /// the table does not list has flex at half its standard price, OpenAI's rule).
    pub(crate) fn from_standard(standard: Price, built_in: Option<&ModelPrices>) -> Self {
        Self {
            standard,
            flex: match built_in {
                Some(listed) => listed.flex,
                None => Some(standard.scaled(0.5)),
            },
            priority: built_in.and_then(|b| b.priority),
            batch: built_in.and_then(|b| b.batch),
        }
    }

    /// The price at `tier`; `None` when the model is not sold at that tier (flex and
    /// priority not listed for it). Batch is half the standard price unless listed.
    pub(crate) fn at(&self, tier: Tier) -> Option<Price> {
        match tier {
            Tier::Standard => Some(self.standard),
            Tier::Batch => Some(self.batch.unwrap_or_else(|| self.standard.scaled(0.5))),
            Tier::Flex => self.flex,
            Tier::Priority => self.priority,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TierJson {
    input: f64,
    output: f64,
    cached_input: Option<f64>,
    cache_write: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelJson {
    input: f64,
    output: f64,
    cached_input: Option<f64>,
    cache_write: Option<f64>,
    flex: Option<TierJson>,
    priority: Option<TierJson>,
    batch: Option<TierJson>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TableJson {
    date: String,
    #[allow(dead_code)] // documents the file; always USD per million tokens
    unit: String,
    sources: Vec<String>,
    #[serde(default)]
    notes: Vec<String>,
    models: IndexMap<String, ModelJson>,
}

/// The built-in price table.
#[derive(Debug, Default)]
pub(crate) struct BuiltIn {
    pub(crate) date: String,
    pub(crate) sources: Vec<String>,
    pub(crate) notes: Vec<String>,
    pub(crate) models: IndexMap<String, ModelPrices>,
}

const TABLE: &str = include_str!("prices.json");

fn price_of(
    model: &str,
    input: f64,
    output: f64,
    cached: Option<f64>,
    write: Option<f64>,
) -> Price {
    let price = Price::with_cache_defaults(model, input, output);
    Price {
        cached_input: cached.unwrap_or(price.cached_input),
        cache_write: write.unwrap_or(price.cache_write),
        ..price
    }
}

fn parse_table(text: &str) -> Result<BuiltIn, serde_json::Error> {
    let table: TableJson = serde_json::from_str(text)?;
    let tier = |model: &str, t: Option<TierJson>| {
        t.map(|t| price_of(model, t.input, t.output, t.cached_input, t.cache_write))
    };
    let models = table
        .models
        .into_iter()
        .map(|(model, m)| {
            let standard = price_of(&model, m.input, m.output, m.cached_input, m.cache_write);
            let prices = ModelPrices {
                standard,
                flex: tier(&model, m.flex),
                priority: tier(&model, m.priority),
                batch: tier(&model, m.batch),
            };
            (model, prices)
        })
        .collect();
    Ok(BuiltIn {
        date: table.date,
        sources: table.sources,
        notes: table.notes,
        models,
    })
}

/// The built-in table (read once; a unit test keeps it readable).
pub(crate) fn built_in() -> &'static BuiltIn {
    static TABLE_ONCE: OnceLock<BuiltIn> = OnceLock::new();
    TABLE_ONCE.get_or_init(|| parse_table(TABLE).unwrap_or_default())
}

/// `model`'s entry in `table`: by its id, else by the id without a dated snapshot suffix
/// (`-2024-08-06`, `-20250929`) or a provider prefix (`openai/`).
pub(crate) fn find<'t, T>(table: &'t IndexMap<String, T>, model: &str) -> Option<&'t T> {
    if let Some(found) = table.get(model) {
        return Some(found);
    }
    let model = model.rsplit('/').next().unwrap_or(model);
    if let Some(found) = table.get(model) {
        return Some(found);
    }
    // The longest id the model starts with, followed by a dash and a date.
    table
        .iter()
        .filter(|(id, _)| {
            model
                .strip_prefix(id.as_str())
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|rest| {
                    rest.len() >= 4
                        && rest.chars().all(|c| c.is_ascii_digit() || c == '-')
                        && rest.starts_with(|c: char| c.is_ascii_digit())
                })
        })
        .max_by_key(|(id, _)| id.len())
        .map(|(_, found)| found)
}

/// `model`'s entry in the built-in table (what summon knows it is offered at).
pub(crate) fn listed(model: &str) -> Option<ModelPrices> {
    find(&built_in().models, model).copied()
}

/// The prices a run uses: the config file's entries over the built-in table.
#[derive(Debug, Clone, Default)]
pub(crate) struct Prices {
    file: IndexMap<String, Price>,
    /// Without the built-in table (tests of the report's arithmetic).
    file_only: bool,
}

impl Prices {
    pub(crate) fn new(file: IndexMap<String, Price>) -> Self {
        Self {
            file,
            file_only: false,
        }
    }

    /// Only `file`'s prices, no built-in table.
    #[cfg(test)]
    pub(crate) fn only(file: HashMap<String, Price>) -> Self {
        Self {
            file: file.into_iter().collect(),
            file_only: true,
        }
    }

    /// `model`'s prices, and whether they come from the config file.
    pub(crate) fn model(&self, model: &str) -> Option<(ModelPrices, bool)> {
        let listed = (!self.file_only)
            .then(|| find(&built_in().models, model))
            .flatten();
        if let Some(price) = find(&self.file, model) {
            return Some((ModelPrices::from_standard(*price, listed), true));
        }
        listed.map(|p| (*p, false))
    }

    /// `model`'s standard price.
    pub(crate) fn get(&self, model: &str) -> Option<Price> {
        self.model(model).map(|(p, _)| p.standard)
    }

    /// `model`'s price at `tier`.
    pub(crate) fn at(&self, model: &str, tier: Tier) -> Option<Price> {
        self.model(model).and_then(|(p, _)| p.at(tier))
    }
}

/// For tests and callers holding a plain map.
impl From<HashMap<String, Price>> for Prices {
    fn from(map: HashMap<String, Price>) -> Self {
        Self::new(map.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_table_reads_and_every_price_is_sane() {
        let table = parse_table(TABLE).expect("prices.json reads");
        assert!(table.date.len() == 10, "{}", table.date);
        assert!(table.sources.iter().all(|s| s.starts_with("https://")));
        assert!(table.models.len() >= 20);
        for (model, prices) in &table.models {
            let s = prices.standard;
            assert!(s.input > 0.0 && s.output >= s.input, "{model}");
            assert!(s.cached_input < s.input, "{model}: a cache read is cheaper");
            for tier in [prices.flex, prices.batch].into_iter().flatten() {
                assert!(tier.input < s.input && tier.output < s.output, "{model}");
            }
            if let Some(p) = prices.priority {
                assert!(p.input > s.input && p.output > s.output, "{model}");
            }
            if model.starts_with("claude") {
                assert!(s.cache_write > s.input, "{model}: a cache write costs more");
                assert!(
                    prices.flex.is_none() && prices.priority.is_none(),
                    "{model}"
                );
            }
        }
    }

    #[test]
    fn snapshots_and_prefixes_find_their_model_and_unknown_models_have_no_price() {
        let prices = Prices::default();
        assert_eq!(prices.get("gpt-4o-2024-08-06"), prices.get("gpt-4o"));
        assert_eq!(
            prices.get("claude-sonnet-4-5-20250929").map(|p| p.input),
            Some(3.0)
        );
        assert_eq!(prices.get("openai/gpt-5-mini").map(|p| p.output), Some(2.0));
        // gpt-4o-mini is its own model, not a snapshot of gpt-4o.
        assert_eq!(prices.get("gpt-4o-mini").map(|p| p.input), Some(0.15));
        assert_eq!(prices.get("my-local-model"), None);
        assert_eq!(prices.get("gpt-4o-turbo-whatever"), None);
    }

    #[test]
    fn tiers_price_as_listed_and_batch_is_half_unless_listed() {
        let prices = Prices::default();
        let flex = prices.at("gpt-5-mini", Tier::Flex).unwrap();
        assert_eq!((flex.input, flex.output), (0.125, 1.0));
        let batch = prices.at("claude-haiku-4-5", Tier::Batch).unwrap();
        assert_eq!((batch.input, batch.output), (0.5, 2.5));
        assert_eq!(
            prices.at("gpt-4o", Tier::Flex),
            None,
            "gpt-4o has no flex tier"
        );
        assert_eq!(prices.at("claude-sonnet-4-5", Tier::Priority), None);
    }

    #[test]
    fn a_config_entry_replaces_the_built_in_one() {
        let mut file = IndexMap::new();
        file.insert(
            "gpt-5".to_owned(),
            Price::with_cache_defaults("gpt-5", 1.0, 2.0),
        );
        let prices = Prices::new(file);
        assert_eq!(prices.get("gpt-5").map(|p| p.output), Some(2.0));
        assert_eq!(prices.at("gpt-5", Tier::Batch).map(|p| p.output), Some(1.0));
        // The tiers keep the table's prices.
        assert_eq!(prices.at("gpt-5", Tier::Flex).map(|p| p.output), Some(5.0));
        assert!(prices.model("gpt-5").unwrap().1);
        assert!(!prices.model("gpt-5-mini").unwrap().1);
    }

    /// A 1,000-task classification: a shared prefix of 2,048 tokens (instructions and the
    /// label set; cached after the first task), 200 tokens of item, 50 tokens of answer, priced
    /// from the built-in table at each tier. `cargo test --lib classification -- --nocapture`
    /// prints the table of docs/cost.md.
    #[test]
    fn classification_of_a_thousand_items_at_each_tier() {
        use crate::provider::Usage;
        let (tasks, prefix, item, answer) = (1000u64, 2048u64, 200u64, 50u64);
        let usage = |cached: bool, write: bool| Usage {
            input_tokens: prefix + item,
            output_tokens: answer,
            cache_read_tokens: if cached { prefix } else { 0 },
            cache_write_tokens: if write { prefix } else { 0 },
        };
        let prices = Prices::default();
        let run = |model: &str, tier: Tier| {
            let p = prices.at(model, tier).unwrap();
            let anthropic = model.starts_with("claude");
            let first = p.cost(&usage(false, anthropic));
            let rest = p.cost(&usage(true, false)) * (tasks - 1) as f64;
            let uncached = p.cost(&usage(false, false)) * tasks as f64;
            (first + rest, uncached)
        };
        for (model, tiers) in [
            ("gpt-5-mini", &[Tier::Standard, Tier::Flex, Tier::Batch][..]),
            ("gpt-5", &[Tier::Standard, Tier::Flex, Tier::Batch][..]),
            ("claude-haiku-4-5", &[Tier::Standard, Tier::Batch][..]),
        ] {
            let (standard, _) = run(model, Tier::Standard);
            for &tier in tiers {
                let (cached, uncached) = run(model, tier);
                println!(
                    "| {model} | {} | ${cached:.4} | ${uncached:.4} |",
                    tier.name()
                );
                if tier != Tier::Standard {
                    // Flex and batch: half the standard price, cache discounts on top.
                    assert!((cached * 2.0 - standard).abs() < 1e-9, "{model} {tier:?}");
                }
                assert!(cached < uncached, "the cached prefix saves");
            }
        }
    }
}
