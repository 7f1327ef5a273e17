//! One `omen bench` invocation: the workload run once or `repeat` times, the server's
//! metrics scraped around the kept runs, and the report with its repeat verdict, latency
//! breakdown, cost and picture.

use serde_json::Value;

use crate::breakdown::{self, BreakdownError};
use crate::cost::{self, CostError, PriceTable, Vram};
use crate::loadgen::{self, report, workflow::Workflow, BenchError, BenchOptions};
use crate::{picture, trust};

/// What a bench invocation adds to the plain run.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// Runs of the workload (1, or 3 and more: the first and last are dropped).
    pub repeat: u32,
    /// Largest P95 spread of the kept runs that counts as stable.
    pub stable_spread: f64,
    /// The caller will fail an unstable result, so the runs must be judged.
    pub require_stable: bool,
    /// The price table and its path, for the cost section.
    pub prices: Option<(String, PriceTable)>,
    /// An omen agent beside the server, for its GPU memory reading.
    pub omen: Option<String>,
    /// The server's `/metrics`, for the server's side of the latency breakdown.
    pub server_metrics: Option<String>,
}

/// A bench invocation could not be made; each names the input and the fix.
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    /// A setting is out of range.
    #[error(transparent)]
    Option(#[from] crate::BadOption),
    /// A run could not start.
    #[error(transparent)]
    Bench(#[from] BenchError),
    /// The price table cannot price the run.
    #[error(transparent)]
    Cost(#[from] CostError),
    /// The server's metrics could not be scraped.
    #[error(transparent)]
    Breakdown(#[from] BreakdownError),
}

/// What a bench invocation produced.
#[derive(Debug, Clone)]
pub struct SuiteResult {
    /// The report (JSON).
    pub report: Value,
    /// Whether the kept runs agreed; `None` when fewer than two were kept.
    pub stable: Option<bool>,
    /// The picture of the kept runs (SVG).
    pub svg: String,
    /// Lines for a person, in the order they happened.
    pub log: Vec<String>,
}

impl SuiteOptions {
    /// Checks the options; every error names one.
    pub fn validate(&self) -> Result<(), SuiteError> {
        if self.repeat == 0 || self.repeat == 2 {
            return Err(SuiteError::from(crate::BadOption {
                option: "--repeat",
                value: self.repeat.to_string(),
                reason: "give 1, or at least 3 (the first and last runs are dropped)",
            }));
        }
        if self.require_stable && trust::kept_runs(self.repeat as usize).count() < 2 {
            return Err(SuiteError::from(crate::BadOption {
                option: "--require-stable with --repeat",
                value: self.repeat.to_string(),
                reason: "stability needs two kept runs to compare: give --repeat 4 or more",
            }));
        }
        if !(self.stable_spread.is_finite() && self.stable_spread > 0.0) {
            return Err(SuiteError::from(crate::BadOption {
                option: "--stable-spread",
                value: self.stable_spread.to_string(),
                reason: "must be > 0, e.g. 0.1 for 10%",
            }));
        }
        Ok(())
    }
}

/// Runs the bench invocation; `say` gets each line for a person as it happens.
pub async fn run(
    wf: &Workflow,
    opts: &BenchOptions,
    suite: &SuiteOptions,
    mut say: impl FnMut(&str),
) -> Result<SuiteResult, SuiteError> {
    suite.validate()?;
    let mut log = Vec::new();
    let mut tell = |line: String| {
        say(&line);
        log.push(line);
    };
    let mut opts = opts.clone();
    if let Some((path, table)) = &suite.prices {
        // The model must have a price before any load is sent, so it is found first.
        let model = loadgen::resolve_model(wf, &opts).await?;
        table.price(&model, path)?;
        opts.model = Some(model);
    }
    // A page that cannot be read stops the bench before any load, not after a run; this
    // first scrape is also the "before" of a single run.
    let mut before = match &suite.server_metrics {
        Some(url) => Some(breakdown::scrape(url).await?),
        None => None,
    };
    let n = suite.repeat as usize;
    let kept = trust::kept_runs(n);
    let mut runs = Vec::with_capacity(n);
    let mut server = None;
    for i in 1..=n {
        if n > 1 {
            tell(format!("run {i}/{n}{}", if kept.contains(&i) { "" } else { " (not kept)" }));
        }
        // The server's counters around the kept runs (which are consecutive) only.
        if let (Some(url), true) = (&suite.server_metrics, i == *kept.start() && i > 1) {
            before = Some(breakdown::scrape(url).await?);
        }
        // Hooks see the kept runs only, as the report does.
        let run_opts = BenchOptions {
            run: i as u32,
            hooks: if kept.contains(&i) { opts.hooks.clone() } else { Vec::new() },
            ..opts.clone()
        };
        runs.push(loadgen::bench(wf.clone(), &run_opts).await?);
        if let (Some(url), Some(b), true) = (&suite.server_metrics, &before, i == *kept.end()) {
            let after = breakdown::scrape(url).await?;
            server = Some(breakdown::server_view(url, b, &after));
        }
    }
    let Some(pooled) = trust::pooled(&runs) else {
        unreachable!("validate() allows only 1 or 3+ runs, so one is kept")
    };
    let mut report = report::report(&pooled);
    let mut stable = None;
    if n > 1 {
        let summary = trust::repeat_summary(&runs, suite.stable_spread);
        stable = summary.stable;
        let verdict = match summary.stable {
            None => "stability not judged: one run kept (give --repeat 4 or more to compare runs)".to_owned(),
            Some(true) => "stable".to_owned(),
            Some(false) => format!("NOT stable ({})", summary.unstable_metrics.join(", ")),
        };
        let spreads: Vec<String> =
            summary.spread.iter().map(|(k, v)| format!("{k} {:.1}%", v * 100.0)).collect();
        tell(format!(
            "runs {:?} of {n} kept; P95 spread {} (threshold {:.1}%): {}",
            summary.kept,
            spreads.join(", "),
            summary.threshold * 100.0,
            verdict
        ));
        report["omen"]["repeat"] = serde_json::json!(summary);
    }
    let split = breakdown::breakdown(&pooled.records, server);
    if let Some(s) = &split.ttft_split_ms {
        tell(format!(
            "TTFT mean: queue {:.1} ms + prefill {:.1} ms + network/client {:.1} ms (server's view)",
            s.queue, s.prefill, s.network_and_client
        ));
    }
    report["omen"]["latency_breakdown"] = serde_json::json!(split);
    if let Some((path, table)) = &suite.prices {
        let price = table.price(&pooled.model, path)?;
        let vram = match &suite.omen {
            Some(url) => cost::vram_from_omen(url).await,
            None => Vram::Unavailable {
                reason: "no omen agent given; pass --omen http://HOST:PORT of the agent beside the server for its NVML reading".into(),
            },
        };
        let p95 = report["p95_e2el_ms"].as_f64().unwrap_or(f64::NAN);
        let c = cost::summarise(table, price, &pooled.records, pooled.duration_s, p95, vram);
        tell(format!(
            "cost: {:.6} {} in all, {:.3e} per request, {:.0} output tokens per {}{}",
            c.total_cost,
            c.currency,
            c.mean_cost_per_request,
            c.output_tokens_per_unit_cost,
            c.currency,
            match (&c.vram, c.output_throughput_per_vram_gb) {
                (_, Some(g)) => format!(", {g:.2} output tokens/s per GB of VRAM"),
                (Vram::Unavailable { reason }, _) => format!("; VRAM unknown: {reason}"),
                _ => String::new(),
            }
        ));
        report["omen"]["cost"] = serde_json::json!(c);
    }
    if !opts.hooks.is_empty() {
        let (hooks, summary) = (opts.hooks.clone(), crate::hooks::summary_of(&report));
        let mut outcomes = tokio::task::spawn_blocking(move || {
            hooks.iter().map(|h| h.finalise(&summary)).collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        // Two hooks of one name (one script given twice) stay apart in the report.
        let names: Vec<String> = outcomes.iter().map(|o| o.name.clone()).collect();
        for (i, o) in outcomes.iter_mut().enumerate() {
            let earlier = names[..i].iter().filter(|n| **n == names[i]).count();
            if earlier > 0 {
                o.name = format!("{}#{}", names[i], earlier + 1);
            }
        }
        for o in &outcomes {
            match &o.error {
                Some(e) => tell(format!("hook {}: FAILED and switched off ({e}); the run went on", o.name)),
                None => tell(format!("hook {}: {}", o.name, Value::Object(o.metrics.clone()))),
            }
        }
        report["omen"]["hooks"] = serde_json::json!(outcomes);
    }
    let drift = report::p99_drift(&pooled.records, pooled.duration_s);
    let title = format!(
        "{} on {}: {} ok, {} failed, {:.2} req/s, P99 E2EL {:.0} ms, tail {}",
        wf.name,
        pooled.model,
        report["completed"],
        report["failed"],
        report["request_throughput"].as_f64().unwrap_or(f64::NAN),
        report["p99_e2el_ms"].as_f64().unwrap_or(f64::NAN),
        drift.verdict
    );
    let svg = picture::bench_svg(&title, &pooled.records, &drift).unwrap_or_else(|e| {
        tell(e);
        String::new()
    });
    Ok(SuiteResult { report, stable, svg, log })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(repeat: u32, require_stable: bool) -> SuiteOptions {
        SuiteOptions {
            repeat,
            stable_spread: 0.1,
            require_stable,
            prices: None,
            omen: None,
            server_metrics: None,
        }
    }

    #[test]
    fn repeat_counts_that_cannot_be_judged_are_refused_by_name() {
        assert!(options(1, false).validate().is_ok() && options(3, false).validate().is_ok());
        assert!(options(4, true).validate().is_ok());
        for (repeat, require) in [(0, false), (2, false), (3, true), (1, true)] {
            let e = options(repeat, require).validate().unwrap_err().to_string();
            assert!(e.contains("--repeat"), "{repeat} {require}: {e}");
        }
        let mut o = options(1, false);
        o.stable_spread = 0.0;
        assert!(o.validate().unwrap_err().to_string().contains("--stable-spread"));
    }
}
