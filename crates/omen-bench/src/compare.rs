//! `omen compare A.json B.json`: Delta-Metric d = (M_B - M_A) / |M_A| for each
//! metric of two bench reports, with a percentile-bootstrap interval computed
//! from the per-request records, and a direction-aware verdict: for latencies and
//! the error rate an increase is a regression, for throughputs an improvement;
//! an interval that contains 0 (or a change below `min_effect`) is noise.

use std::path::Path;

use omen_signals::{
    delta_metric, interval_from_differences, percentile_difference_ci, quantile_linear, BootstrapInterval,
    DeltaVerdict,
};
use rand::rngs::StdRng;
use rand::{Rng, RngExt as _, SeedableRng};
use serde::Serialize;

use crate::loadgen::RequestRecord;

/// A report could not be compared.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// The file could not be read.
    #[error("cannot read bench report {path}: {source}; check the path")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not an `omen bench` report.
    #[error("{path} is not an omen bench report: {reason}; produce it with `omen bench --out {path}`")]
    Format {
        /// The file.
        path: String,
        /// What is missing.
        reason: String,
    },
    /// The bootstrap rejected the samples or settings.
    #[error("bootstrap for {metric}: {source}")]
    Bootstrap {
        /// The metric.
        metric: String,
        /// The underlying error.
        source: omen_signals::SignalError,
    },
    /// A setting is out of range.
    #[error("{field} = {value}: {reason}")]
    Setting {
        /// The option.
        field: &'static str,
        /// The value.
        value: String,
        /// What is allowed.
        reason: &'static str,
    },
}

/// A bench report as read back: its duration and per-request records.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// `duration`, seconds.
    pub duration_s: f64,
    /// `requests`.
    pub records: Vec<RequestRecord>,
}

/// Reads the parts of a report that the comparison needs.
pub fn load(path: &Path) -> Result<Loaded, CompareError> {
    let name = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|source| CompareError::Read { path: name.clone(), source })?;
    let format = |reason: String| CompareError::Format { path: name.clone(), reason };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format(format!("not JSON ({e})")))?;
    let duration_s = v
        .get("duration")
        .and_then(serde_json::Value::as_f64)
        .filter(|d| *d > 0.0)
        .ok_or_else(|| format("no positive `duration`".into()))?;
    let requests = v.get("requests").cloned().ok_or_else(|| format("no `requests` records".into()))?;
    let records: Vec<RequestRecord> =
        serde_json::from_value(requests).map_err(|e| format(format!("bad `requests` record ({e})")))?;
    if records.is_empty() {
        return Err(format("`requests` is empty".into()));
    }
    Ok(Loaded { duration_s, records })
}

/// Which direction of change is good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    /// Latencies, error rate.
    Lower,
    /// Throughputs.
    Higher,
}

/// The verdict on one metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// B is worse than A beyond the noise.
    Regression,
    /// B is better than A beyond the noise.
    Improvement,
    /// The interval contains no change (or the change is below min_effect).
    Noise,
}

/// One row of the comparison.
#[derive(Debug, Clone, Serialize)]
pub struct MetricDelta {
    /// Metric key as in the report, e.g. `p99_ttft_ms`.
    pub metric: String,
    /// Good direction.
    pub better: Better,
    /// Value in A.
    pub a: f64,
    /// Value in B.
    pub b: f64,
    /// Delta-Metric (B - A) / |A|.
    pub delta: f64,
    /// Bootstrap interval of B - A, lower end.
    pub diff_lower: f64,
    /// Upper end.
    pub diff_upper: f64,
    /// The interval relative to |A| (comparable with `delta`), lower end.
    pub delta_lower: f64,
    /// Upper end.
    pub delta_upper: f64,
    /// Regression, improvement or noise.
    pub verdict: Verdict,
}

/// Settings of the comparison.
#[derive(Debug, Clone, Copy)]
pub struct CompareOptions {
    /// Confidence level of the intervals, e.g. 0.95.
    pub confidence: f64,
    /// Bootstrap resamples (>= 100).
    pub resamples: usize,
    /// Seed of the bootstrap.
    pub seed: u64,
    /// Smallest |delta| that counts as a change, e.g. 0.02 for 2%.
    pub min_effect: f64,
}

impl Default for CompareOptions {
    fn default() -> Self {
        Self { confidence: 0.95, resamples: 2000, seed: 0, min_effect: 0.0 }
    }
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// Report A's path.
    pub a: String,
    /// Report B's path.
    pub b: String,
    /// Confidence level.
    pub confidence: f64,
    /// Resamples.
    pub resamples: usize,
    /// Smallest change counted.
    pub min_effect: f64,
    /// One row per metric.
    pub metrics: Vec<MetricDelta>,
}

/// Percentile-bootstrap interval of mean(B) - mean(A), resampling both independently.
pub fn mean_difference_ci<R: Rng + ?Sized>(
    a: &[f64],
    b: &[f64],
    confidence: f64,
    resamples: usize,
    rng: &mut R,
) -> Option<BootstrapInterval> {
    if a.is_empty() || b.is_empty() || resamples < 100 || !(confidence > 0.0 && confidence < 1.0) {
        return None;
    }
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    let resampled = |xs: &[f64], rng: &mut R| {
        (0..xs.len()).map(|_| xs[rng.random_range(0..xs.len())]).sum::<f64>() / xs.len() as f64
    };
    let diffs: Vec<f64> = (0..resamples).map(|_| resampled(b, rng) - resampled(a, rng)).collect();
    Some(interval_from_differences(mean(b) - mean(a), diffs, confidence))
}

/// Completions (or tokens) per second in equal time bins of the run; their mean is the run's throughput.
fn binned_rates(run: &Loaded, weight: impl Fn(&RequestRecord) -> f64) -> Vec<f64> {
    let ok = run.records.iter().filter(|r| r.success).count();
    let bins = ((ok as f64).sqrt().ceil() as usize).clamp(3, 50);
    let width = run.duration_s / bins as f64;
    let mut rates = vec![0.0; bins];
    for r in run.records.iter().filter(|r| r.success) {
        let i = ((r.end_s / width) as usize).min(bins - 1);
        rates[i] += weight(r) / width;
    }
    rates
}

fn verdict(iv: &BootstrapInterval, delta: f64, better: Better, min_effect: f64) -> Verdict {
    if delta.abs() < min_effect {
        return Verdict::Noise;
    }
    match (iv.verdict, better) {
        (DeltaVerdict::Noise, _) => Verdict::Noise,
        (DeltaVerdict::Increase, Better::Lower) | (DeltaVerdict::Decrease, Better::Higher) => {
            Verdict::Regression
        }
        _ => Verdict::Improvement,
    }
}

fn row(metric: String, better: Better, iv: &BootstrapInterval, a: f64, min_effect: f64) -> MetricDelta {
    let b = a + iv.estimate;
    let delta = delta_metric(a, b);
    let scale = a.abs().max(1e-6);
    MetricDelta {
        metric,
        better,
        a,
        b,
        delta,
        diff_lower: iv.lower,
        diff_upper: iv.upper,
        delta_lower: iv.lower / scale,
        delta_upper: iv.upper / scale,
        verdict: verdict(iv, delta, better, min_effect),
    }
}

/// Compares report B against report A.
pub fn compare(a: &Loaded, b: &Loaded, opts: CompareOptions) -> Result<Vec<MetricDelta>, CompareError> {
    if !(opts.confidence > 0.0 && opts.confidence < 1.0) {
        return Err(CompareError::Setting {
            field: "--confidence",
            value: opts.confidence.to_string(),
            reason: "must be in (0, 1), e.g. 0.95",
        });
    }
    if opts.resamples < 100 {
        return Err(CompareError::Setting {
            field: "--resamples",
            value: opts.resamples.to_string(),
            reason: "use at least 100 (2000 is the default)",
        });
    }
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut rows = Vec::new();
    type Get = fn(&RequestRecord) -> Option<f64>;
    let latency: [(&str, Get); 4] = [
        ("ttft", |r| r.ttft_ms),
        ("tpot", |r| r.tpot_ms),
        ("itl", |r| (!r.itl_ms.is_empty()).then(|| r.itl_ms.iter().sum::<f64>() / r.itl_ms.len() as f64)),
        ("e2el", |r| r.e2el_ms),
    ];
    for (name, get) in latency {
        let xa: Vec<f64> = a.records.iter().filter(|r| r.success).filter_map(get).collect();
        let xb: Vec<f64> = b.records.iter().filter(|r| r.success).filter_map(get).collect();
        if xa.is_empty() || xb.is_empty() {
            continue;
        }
        let boot = |metric: &str, source| CompareError::Bootstrap { metric: metric.to_owned(), source };
        if let Some(iv) = mean_difference_ci(&xa, &xb, opts.confidence, opts.resamples, &mut rng) {
            let ma = xa.iter().sum::<f64>() / xa.len() as f64;
            rows.push(row(format!("mean_{name}_ms"), Better::Lower, &iv, ma, opts.min_effect));
        }
        let mut sa = xa.clone();
        sa.sort_by(f64::total_cmp);
        for (label, q) in [("median", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99)] {
            let metric = format!("{label}_{name}_ms");
            let iv = percentile_difference_ci(&xa, &xb, q, opts.confidence, opts.resamples, &mut rng)
                .map_err(|e| boot(&metric, e))?;
            rows.push(row(metric, Better::Lower, &iv, quantile_linear(&sa, q), opts.min_effect));
        }
    }
    type Weight = fn(&RequestRecord) -> f64;
    let throughput: [(&str, Weight); 3] = [
        ("request_throughput", |_| 1.0),
        ("output_throughput", |r| r.output_tokens as f64),
        ("total_token_throughput", |r| (r.input_tokens + r.output_tokens) as f64),
    ];
    for (name, w) in throughput {
        let (ra, rb) = (binned_rates(a, w), binned_rates(b, w));
        if let Some(iv) = mean_difference_ci(&ra, &rb, opts.confidence, opts.resamples, &mut rng) {
            let ma = ra.iter().sum::<f64>() / ra.len() as f64;
            rows.push(row(name.to_owned(), Better::Higher, &iv, ma, opts.min_effect));
        }
    }
    let errors =
        |l: &Loaded| -> Vec<f64> { l.records.iter().map(|r| f64::from(u8::from(!r.success))).collect() };
    let (ea, eb) = (errors(a), errors(b));
    if let Some(iv) = mean_difference_ci(&ea, &eb, opts.confidence, opts.resamples, &mut rng) {
        let ma = ea.iter().sum::<f64>() / ea.len() as f64;
        rows.push(row("error_rate".into(), Better::Lower, &iv, ma, opts.min_effect));
    }
    let bleu =
        |l: &Loaded| -> Vec<f64> { l.records.iter().filter(|r| r.success).filter_map(|r| r.bleu).collect() };
    let (qa, qb) = (bleu(a), bleu(b));
    if let Some(iv) = mean_difference_ci(&qa, &qb, opts.confidence, opts.resamples, &mut rng) {
        let ma = qa.iter().sum::<f64>() / qa.len() as f64;
        rows.push(row("mean_bleu".into(), Better::Higher, &iv, ma, opts.min_effect));
    }
    Ok(rows)
}

/// The comparison as a fixed-width table.
pub fn table(rows: &[MetricDelta], confidence: f64) -> String {
    let ci = format!("{:.0}% CI of delta", confidence * 100.0);
    let mut out =
        format!("{:<24} {:>12} {:>12} {:>9} {:>21}  {}\n", "metric", "A", "B", "delta", ci, "verdict");
    for r in rows {
        let verdict = match r.verdict {
            Verdict::Regression => "regression",
            Verdict::Improvement => "improvement",
            Verdict::Noise => "noise",
        };
        out.push_str(&format!(
            "{:<24} {:>12.3} {:>12.3} {:>+8.1}% {:>+9.1}% .. {:>+7.1}%  {}\n",
            r.metric,
            r.a,
            r.b,
            r.delta * 100.0,
            r.delta_lower * 100.0,
            r.delta_upper * 100.0,
            verdict
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of `n` requests, one completing every `gap` seconds, with TTFT drawn around `ttft`.
    fn run(n: usize, gap: f64, ttft: f64, fail_every: usize, seed: u64) -> Loaded {
        let mut rng = StdRng::seed_from_u64(seed);
        let records = (0..n)
            .map(|i| {
                let success = fail_every == 0 || i % fail_every != 0;
                let t = ttft * rng.random_range(0.8..1.2);
                let r = RequestRecord {
                    id: i as u64,
                    session: i as u64,
                    end_s: (i + 1) as f64 * gap - 1e-9,
                    tpot_ms: Some(5.0 * rng.random_range(0.9..1.1)),
                    itl_ms: vec![5.0, 5.2],
                    input_tokens: 20,
                    output_tokens: 16,
                    ..RequestRecord::for_test(i as f64 * gap, t, t + 100.0)
                };
                if success {
                    r
                } else {
                    r.failed()
                }
            })
            .collect();
        Loaded { duration_s: n as f64 * gap, records }
    }

    /// Fewer resamples than the CLI's default keep the debug-build tests quick.
    fn opts() -> CompareOptions {
        CompareOptions { resamples: 500, ..CompareOptions::default() }
    }

    fn verdict_of(rows: &[MetricDelta], metric: &str) -> Verdict {
        rows.iter().find(|r| r.metric == metric).unwrap_or_else(|| panic!("no {metric}")).verdict
    }

    #[test]
    fn slower_b_is_a_latency_regression_and_same_is_noise() {
        let a = run(200, 0.1, 50.0, 0, 1);
        let b = run(200, 0.1, 80.0, 0, 2);
        let rows = compare(&a, &b, opts()).unwrap();
        for m in ["mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "mean_e2el_ms"] {
            assert_eq!(verdict_of(&rows, m), Verdict::Regression, "{m}");
        }
        let ttft = rows.iter().find(|r| r.metric == "mean_ttft_ms").unwrap();
        assert!((ttft.delta - 0.6).abs() < 0.1 && ttft.delta_lower < ttft.delta, "{ttft:?}");
        // Same distribution, other draws: noise.
        let rows = compare(&a, &run(200, 0.1, 50.0, 0, 3), opts()).unwrap();
        assert_eq!(verdict_of(&rows, "mean_ttft_ms"), Verdict::Noise);
        assert_eq!(verdict_of(&rows, "request_throughput"), Verdict::Noise);
        // Reversed: faster B is an improvement.
        let rows = compare(&b, &a, opts()).unwrap();
        assert_eq!(verdict_of(&rows, "median_ttft_ms"), Verdict::Improvement);
    }

    #[test]
    fn throughput_and_errors_are_direction_aware() {
        let a = run(100, 0.2, 50.0, 0, 1);
        let fast = run(100, 0.1, 50.0, 0, 1);
        let rows = compare(&a, &fast, opts()).unwrap();
        assert_eq!(verdict_of(&rows, "request_throughput"), Verdict::Improvement);
        assert_eq!(verdict_of(&rows, "output_throughput"), Verdict::Improvement);
        let r = rows.iter().find(|r| r.metric == "request_throughput").unwrap();
        assert!((r.a - 5.0).abs() < 1e-9 && (r.b - 10.0).abs() < 1e-9, "{r:?}");
        let rows = compare(&fast, &a, opts()).unwrap();
        assert_eq!(verdict_of(&rows, "output_throughput"), Verdict::Regression);
        let failing = run(100, 0.1, 50.0, 3, 1);
        let rows = compare(&fast, &failing, opts()).unwrap();
        assert_eq!(verdict_of(&rows, "error_rate"), Verdict::Regression);
        // A change below min_effect is noise even when significant.
        let opts = CompareOptions { min_effect: 1.5, ..opts() };
        let rows = compare(&a, &fast, opts).unwrap();
        assert_eq!(verdict_of(&rows, "request_throughput"), Verdict::Noise);
        assert!(table(&rows, 0.95).contains("request_throughput"));
    }

    #[test]
    fn bad_files_and_settings_say_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        std::fs::write(&p, "{\"duration\": 1.0}").unwrap();
        let e = load(&p).unwrap_err().to_string();
        assert!(e.contains("requests") && e.contains("omen bench"), "{e}");
        assert!(load(&dir.path().join("missing.json")).unwrap_err().to_string().contains("cannot read"));
        let a = run(10, 0.1, 50.0, 0, 1);
        let opts = CompareOptions { resamples: 10, ..opts() };
        assert!(compare(&a, &a, opts).unwrap_err().to_string().contains("--resamples"));
    }
}
