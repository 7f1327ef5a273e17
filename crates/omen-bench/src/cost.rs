//! What a bench run cost: per-request cost from its token counts and a price table,
//! throughput per unit of cost, a latency-normalised cost efficiency, and output tokens
//! per GB of GPU memory when an omen agent beside the server has an NVML reading.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::loadgen::RequestRecord;

/// Prices of one model, per million tokens, in the table's currency.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    /// Price of a million prompt tokens.
    pub input_per_million_tokens: f64,
    /// Price of a million output tokens.
    pub output_per_million_tokens: f64,
}

fn default_currency() -> String {
    "USD".into()
}
fn default_hardware_factor() -> f64 {
    1.0
}

/// A price table (YAML), e.g. deploy/bench/prices.yaml.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceTable {
    /// Currency of every price (a label only; default USD).
    #[serde(default = "default_currency")]
    pub currency: String,
    /// Multiplies every price: the cost of the hardware the run used relative to the one the
    /// prices were set for (e.g. 1.4 for a pricier GPU class; default 1).
    #[serde(default = "default_hardware_factor")]
    pub hardware_factor: f64,
    /// Prices by the model name the server answers to.
    pub models: BTreeMap<String, ModelPrice>,
}

/// What a price table is, for its errors.
const YAML: crate::yaml::Kind =
    crate::yaml::Kind { name: "price table", example: "deploy/bench/prices.yaml" };

/// A price table could not be used; names the file, the field and the fix.
#[derive(Debug, thiserror::Error)]
pub enum CostError {
    /// The file could not be read or does not match the schema.
    #[error(transparent)]
    Yaml(#[from] crate::yaml::YamlError),
    /// A value is out of range.
    #[error("price table {path}: {field}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// Field path.
        field: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The run's model has no price.
    #[error("price table {path} has no price for model {model:?} (it prices {known}); add `models.{model}` with input_per_million_tokens and output_per_million_tokens")]
    MissingModel {
        /// The file.
        path: String,
        /// The model the server answers to.
        model: String,
        /// The models it prices.
        known: String,
    },
}

impl PriceTable {
    /// Reads and checks a price table.
    pub fn load(path: &Path) -> Result<Self, CostError> {
        let (text, name) = crate::yaml::read(path, YAML)?;
        Self::from_yaml(&text, &name)
    }

    /// Parses and checks a table; `path` only names the input in errors.
    pub fn from_yaml(text: &str, path: &str) -> Result<Self, CostError> {
        let t: PriceTable = crate::yaml::parse(text, path, YAML)?;
        let bad = |field: String, reason: String| CostError::Invalid { path: path.to_owned(), field, reason };
        if !(t.hardware_factor.is_finite() && t.hardware_factor > 0.0) {
            return Err(bad(
                "hardware_factor".into(),
                format!("{} must be > 0 (1 = the priced hardware)", t.hardware_factor),
            ));
        }
        if t.models.is_empty() {
            return Err(bad("models".into(), "no models; price at least the model you bench".into()));
        }
        for (name, p) in &t.models {
            for (field, v) in [
                ("input_per_million_tokens", p.input_per_million_tokens),
                ("output_per_million_tokens", p.output_per_million_tokens),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(bad(format!("models.{name}.{field}"), format!("{v} must be a price >= 0")));
                }
            }
        }
        Ok(t)
    }

    /// The price of `model`, or an error naming the table and the fix.
    pub fn price(&self, model: &str, path: &str) -> Result<&ModelPrice, CostError> {
        self.models.get(model).ok_or_else(|| CostError::MissingModel {
            path: path.to_owned(),
            model: model.to_owned(),
            known: self.models.keys().map(String::as_str).collect::<Vec<_>>().join(", "),
        })
    }

    /// The cost of one request with these token counts.
    pub fn request_cost(&self, price: &ModelPrice, input_tokens: u64, output_tokens: u64) -> f64 {
        (input_tokens as f64 * price.input_per_million_tokens
            + output_tokens as f64 * price.output_per_million_tokens)
            / 1e6
            * self.hardware_factor
    }
}

/// GPU memory the server used during the run, as omen read it, or why it is not known.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Vram {
    /// Read from the omen agent (`gpu_memory_used_bytes`, summed over GPUs).
    Measured {
        /// Bytes in use.
        used_bytes: f64,
        /// GPUs summed.
        gpus: usize,
        /// Where it came from.
        source: String,
    },
    /// No reading; the reason says why.
    Unavailable {
        /// Why, and how to get one.
        reason: String,
    },
}

/// The cost section of a bench report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostSummary {
    /// Currency of every figure.
    pub currency: String,
    /// The table's hardware factor.
    pub hardware_factor: f64,
    /// The model's prices.
    pub price: ModelPrice,
    /// Cost of every successful request.
    pub total_cost: f64,
    /// Mean cost of a successful request.
    pub mean_cost_per_request: f64,
    /// Cost of a million output tokens at this run's input/output mix.
    pub cost_per_million_output_tokens: f64,
    /// Output tokens bought by one unit of currency (throughput per unit cost).
    pub output_tokens_per_unit_cost: f64,
    /// Output tokens per unit cost divided by the P95 end-to-end latency in seconds: two
    /// setups with the same price per token differ by how long users wait for it.
    pub latency_normalised_efficiency: f64,
    /// GPU memory used, when known.
    pub vram: Vram,
    /// Output tokens per second per GB of GPU memory in use (when it is known).
    pub output_throughput_per_vram_gb: Option<f64>,
}

/// The cost of the successful `records` of a run of `duration_s` seconds.
pub fn summarise(
    table: &PriceTable,
    price: &ModelPrice,
    records: &[RequestRecord],
    duration_s: f64,
    p95_e2el_ms: f64,
    vram: Vram,
) -> CostSummary {
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.success).collect();
    let total_cost: f64 = ok.iter().map(|r| table.request_cost(price, r.input_tokens, r.output_tokens)).sum();
    let output: u64 = ok.iter().map(|r| r.output_tokens).sum();
    let per_cost = |x: f64| if total_cost > 0.0 { x / total_cost } else { f64::INFINITY };
    let tokens_per_cost = per_cost(output as f64);
    let output_throughput = output as f64 / duration_s.max(1e-9);
    let per_gb = match &vram {
        Vram::Measured { used_bytes, .. } if *used_bytes > 0.0 => {
            Some(output_throughput / (used_bytes / 1e9))
        }
        _ => None,
    };
    CostSummary {
        currency: table.currency.clone(),
        hardware_factor: table.hardware_factor,
        price: price.clone(),
        total_cost,
        mean_cost_per_request: if ok.is_empty() { 0.0 } else { total_cost / ok.len() as f64 },
        cost_per_million_output_tokens: if output == 0 { 0.0 } else { total_cost / output as f64 * 1e6 },
        output_tokens_per_unit_cost: tokens_per_cost,
        latency_normalised_efficiency: tokens_per_cost / (p95_e2el_ms / 1e3).max(1e-9),
        vram,
        output_throughput_per_vram_gb: per_gb,
    }
}

/// Reads the GPU memory in use from an omen agent's `GET /scores/latest`.
pub async fn vram_from_omen(omen_url: &str) -> Vram {
    let client = reqwest::Client::new();
    let url = format!(
        "{}/scores/latest?signal={}",
        omen_url.trim_end_matches('/'),
        omen_signals::catalogue::GPU_MEMORY_USED_BYTES.name
    );
    let unavailable = |reason: String| Vram::Unavailable { reason };
    let response = match client.get(&url).timeout(std::time::Duration::from_secs(5)).send().await {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => return unavailable(format!("{url} answered HTTP {}; check --omen", r.status())),
        Err(e) => {
            return unavailable(format!(
                "{url}: {}; check --omen and that the agent runs",
                omen_sources::error_chain(&e)
            ))
        }
    };
    let body: serde_json::Value = match response.json().await {
        Ok(v) => v,
        Err(e) => {
            return unavailable(format!(
                "{url} is not omen's /scores/latest ({e}); give --omen the agent's API address (http.listen), not its metrics port"
            ))
        }
    };
    let values: Vec<f64> = body["signals"]
        .as_array()
        .map(|a| a.iter().filter_map(|s| s["value"].as_f64()).filter(|v| v.is_finite()).collect())
        .unwrap_or_default();
    if values.is_empty() {
        return unavailable(format!(
            "the omen agent at {omen_url} has no gpu_memory_used_bytes reading (no NVML on its node, or sources.nvml is off)"
        ));
    }
    Vram::Measured { used_bytes: values.iter().sum(), gpus: values.len(), source: url }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIPPED: &str = include_str!("../../../deploy/bench/prices.yaml");

    fn record(input: u64, output: u64, success: bool) -> RequestRecord {
        let r = RequestRecord::for_test(0.0, 10.0, 1000.0);
        let r = if success { r } else { r.failed() };
        RequestRecord { input_tokens: input, output_tokens: output, ..r }
    }

    #[test]
    fn cost_follows_tokens_prices_and_hardware() {
        let table = PriceTable::from_yaml(
            "currency: EUR\nhardware_factor: 2\nmodels:\n  m: { input_per_million_tokens: 1, output_per_million_tokens: 3 }\n",
            "p.yaml",
        )
        .unwrap();
        let price = table.price("m", "p.yaml").unwrap().clone();
        // 1000 in + 500 out: (1000 x 1 + 500 x 3) / 1e6 x 2 = 0.005.
        assert!((table.request_cost(&price, 1000, 500) - 0.005).abs() < 1e-15);
        let records = [record(1000, 500, true), record(1000, 500, true), record(1000, 0, false)];
        let vram = Vram::Measured { used_bytes: 2e9, gpus: 1, source: "x".into() };
        let s = summarise(&table, &price, &records, 10.0, 2000.0, vram);
        assert_eq!(s.currency, "EUR");
        assert!((s.total_cost - 0.01).abs() < 1e-15, "failed requests cost nothing here: {s:?}");
        assert!((s.mean_cost_per_request - 0.005).abs() < 1e-15);
        assert!((s.output_tokens_per_unit_cost - 100_000.0).abs() < 1e-6);
        assert!((s.cost_per_million_output_tokens - 10.0).abs() < 1e-9);
        assert!((s.latency_normalised_efficiency - 50_000.0).abs() < 1e-6, "per second of P95");
        // 1000 output tokens in 10 s on 2 GB.
        assert_eq!(s.output_throughput_per_vram_gb, Some(50.0));
        let none =
            summarise(&table, &price, &records, 10.0, 2000.0, Vram::Unavailable { reason: "no NVML".into() });
        assert_eq!(none.output_throughput_per_vram_gb, None);
        let json = serde_json::to_value(&none).unwrap();
        assert_eq!(json["vram"]["status"], "unavailable");
        assert_eq!(json["vram"]["reason"], "no NVML");
    }

    #[test]
    fn bad_tables_and_missing_models_say_the_fix() {
        let table = PriceTable::from_yaml(SHIPPED, "deploy/bench/prices.yaml").unwrap();
        assert!(table.price("smollm2-135m", "x").is_ok());
        let e = table.price("llama-70b", "deploy/bench/prices.yaml").unwrap_err().to_string();
        assert!(
            e.contains("deploy/bench/prices.yaml")
                && e.contains("\"llama-70b\"")
                && e.contains("models.llama-70b"),
            "{e}"
        );
        let e = PriceTable::from_yaml(
            "models:\n  m: { input_per_million_tokens: -1, output_per_million_tokens: 1 }\n",
            "p.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("models.m.input_per_million_tokens"), "{e}");
        let e = PriceTable::from_yaml("models:\n  m: { input_per_million: 1 }\n", "p.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("models.m") && e.contains("prices.yaml"), "{e}");
        let e = PriceTable::from_yaml("hardware_factor: 0\nmodels: {}\n", "p.yaml").unwrap_err().to_string();
        assert!(e.contains("hardware_factor"), "{e}");
        let e = PriceTable::from_yaml("models: {}\n", "p.yaml").unwrap_err().to_string();
        assert!(e.contains("no models"), "{e}");
    }
}
