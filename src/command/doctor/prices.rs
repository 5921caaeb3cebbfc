//! The price of the model a delegation would use, and `summon doctor --prices`: the built-in
//! price table (its date and sources) with the config file's entries over it.

use serde_json::{Value, json};

use super::check::{Check, Section};
use crate::config::file::Price;
use crate::config::prices::{BuiltIn, ModelPrices, built_in, no_price_hint};
use crate::config::{Config, NO_PRICE, Tier};

/// `$1.25 in, $0.125 cached, $10 out`.
fn describe(price: &Price) -> String {
    let mut text = format!(
        "${} in, ${} cached",
        number(price.input),
        number(price.cached_input)
    );
    if price.cache_write != price.input {
        text.push_str(&format!(", ${} cache write", number(price.cache_write)));
    }
    text.push_str(&format!(", ${} out", number(price.output)));
    text
}

/// A price without trailing zeros.
fn number(usd: f64) -> String {
    let text = format!("{usd:.4}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn origin(from_file: bool, table: &BuiltIn) -> String {
    if from_file {
        "the config file's `prices`".to_owned()
    } else {
        format!("the built-in table of {}", table.date)
    }
}

/// The finding about `model`'s price.
pub(super) fn check(config: &Config, model: &str, checks: &mut Vec<Check>) {
    let table = built_in();
    match config.prices().model(model) {
        Some((prices, from_file)) => checks.push(Check::ok(
            Section::Provider,
            format!(
                "price of `{model}`: {} per million tokens (from {})",
                describe(&prices.standard),
                origin(from_file, table)
            ),
        )),
        // Not a fault of the setup (a local model costs nothing to know), but said with the
        // fix: costs read "no price" and a spend cap is refused.
        None => checks.push(
            Check::ok(
                Section::Provider,
                format!(
                    "{NO_PRICE} for model `{model}`: costs cannot be told and a spend cap \
                     (`--max-cost`) is refused"
                ),
            )
            .fix(no_price_hint(model)),
        ),
    }
}

fn tiers_json(prices: &ModelPrices) -> Value {
    let mut tiers = serde_json::Map::new();
    for tier in [Tier::Standard, Tier::Flex, Tier::Priority, Tier::Batch] {
        if let Some(p) = prices.at(tier) {
            tiers.insert(
                tier.name().to_owned(),
                json!({"input": p.input, "cached_input": p.cached_input,
                       "cache_write": p.cache_write, "output": p.output}),
            );
        }
    }
    Value::Object(tiers)
}

/// Every model's prices: the built-in table's, then the config file's entries (which replace
/// a built-in model's standard price).
fn rows(config: &Config) -> Vec<(String, ModelPrices, bool)> {
    let prices = config.prices();
    let mut rows: Vec<(String, ModelPrices, bool)> = Vec::new();
    for model in built_in().models.keys().chain(config.prices.keys()) {
        if rows.iter().any(|(m, _, _)| m == model) {
            continue;
        }
        if let Some((p, from_file)) = prices.model(model) {
            rows.push((model.clone(), p, from_file));
        }
    }
    rows
}

/// `summon doctor --prices --json`.
pub(super) fn table_json(config: &Config) -> Value {
    let table = built_in();
    let models: serde_json::Map<String, Value> = rows(config)
        .into_iter()
        .map(|(model, p, from_file)| {
            let mut entry = tiers_json(&p);
            entry["from"] = json!(if from_file { "config" } else { "built-in" });
            (model, entry)
        })
        .collect();
    json!({
        "date": table.date,
        "unit": "USD per million tokens",
        "sources": table.sources,
        "notes": table.notes,
        "models": models,
    })
}

/// `summon doctor --prices`.
pub(super) fn table_text(config: &Config) -> String {
    let table = built_in();
    let mut text = format!(
        "Prices in USD per million tokens: the built-in table of {}, under the config file's \
         `prices:`\n",
        table.date
    );
    for source in &table.sources {
        text.push_str(&format!("  source: {source}\n"));
    }
    for note in &table.notes {
        text.push_str(&format!("  note: {note}\n"));
    }
    text.push('\n');
    for (model, prices, from_file) in rows(config) {
        let from = if from_file { "  (config file)" } else { "" };
        text.push_str(&format!("{model}{from}\n"));
        for tier in [Tier::Standard, Tier::Flex, Tier::Priority, Tier::Batch] {
            if let Some(p) = prices.at(tier) {
                text.push_str(&format!("  {:<9} {}\n", tier.name(), describe(&p)));
            }
        }
    }
    text.push_str(&format!(
        "\nAny other model has {NO_PRICE}: {}\n",
        no_price_hint("MODEL")
    ));
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn numbers_lose_their_trailing_zeros() {
        assert_eq!(super::number(10.0), "10");
        assert_eq!(super::number(0.125), "0.125");
        assert_eq!(super::number(0.0625), "0.0625");
    }
}
