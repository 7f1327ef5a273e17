//! The bench report: vLLM benchmark_serving's keys where they overlap
//! (`completed`, `request_throughput`, `mean_ttft_ms`, `p99_itl_ms`, ...), then
//! omen's own counters under `omen` and every request under `requests`.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::{BenchRun, ContextAction, RequestRecord};

/// Percentiles reported for each latency metric (vLLM's `--metric-percentiles 90,95,99`).
pub const PERCENTILES: [f64; 3] = [90.0, 95.0, 99.0];

/// Adds `mean_X_ms`, `median_X_ms`, `std_X_ms` and `pNN_X_ms` for `values` (0 when empty, as vLLM).
fn add_stats(out: &mut Map<String, Value>, name: &str, values: &[f64]) {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len() as f64;
    let (mean, median, std) = if sorted.is_empty() {
        (0.0, 0.0, 0.0)
    } else {
        let mean = sorted.iter().sum::<f64>() / n;
        // np.std: the population standard deviation.
        let var = sorted.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        (mean, omen_signals::quantile_linear(&sorted, 0.5), var.sqrt())
    };
    out.insert(format!("mean_{name}_ms"), json!(mean));
    out.insert(format!("median_{name}_ms"), json!(median));
    out.insert(format!("std_{name}_ms"), json!(std));
    for p in PERCENTILES {
        let v = if sorted.is_empty() { 0.0 } else { omen_signals::quantile_linear(&sorted, p / 100.0) };
        out.insert(format!("p{p}_{name}_ms"), json!(v));
    }
}

/// The report of a run as JSON.
pub fn report(run: &BenchRun) -> Value {
    let ok: Vec<&RequestRecord> = run.records.iter().filter(|r| r.success).collect();
    let total_input: u64 = ok.iter().map(|r| r.input_tokens).sum();
    let total_output: u64 = ok.iter().map(|r| r.output_tokens).sum();
    let d = run.duration_s.max(1e-9);
    let mut out = Map::new();
    out.insert("date".into(), json!(chrono::Local::now().format("%Y%m%d-%H%M%S").to_string()));
    out.insert("backend".into(), json!("openai"));
    out.insert("model_id".into(), json!(run.model));
    out.insert("num_prompts".into(), json!(run.records.len()));
    out.insert("request_rate".into(), json!(run.workflow.arrival.rate));
    out.insert("max_concurrency".into(), json!(run.workflow.concurrency));
    out.insert("duration".into(), json!(run.duration_s));
    out.insert("completed".into(), json!(ok.len()));
    out.insert("failed".into(), json!(run.records.len() - ok.len()));
    out.insert("total_input_tokens".into(), json!(total_input));
    out.insert("total_output_tokens".into(), json!(total_output));
    out.insert("request_throughput".into(), json!(ok.len() as f64 / d));
    out.insert("output_throughput".into(), json!(total_output as f64 / d));
    out.insert("total_token_throughput".into(), json!((total_input + total_output) as f64 / d));
    let ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft_ms).collect();
    let tpot: Vec<f64> = ok.iter().filter_map(|r| r.tpot_ms).collect();
    let itl: Vec<f64> = ok.iter().flat_map(|r| r.itl_ms.iter().copied()).collect();
    let e2el: Vec<f64> = ok.iter().filter_map(|r| r.e2el_ms).collect();
    add_stats(&mut out, "ttft", &ttft);
    add_stats(&mut out, "tpot", &tpot);
    add_stats(&mut out, "itl", &itl);
    add_stats(&mut out, "e2el", &e2el);
    let bleu: Vec<f64> = ok.iter().filter_map(|r| r.bleu).collect();
    if !bleu.is_empty() {
        // Answer quality against the workflow's references (sentence BLEU, 0-100).
        out.insert("mean_bleu".into(), json!(bleu.iter().sum::<f64>() / bleu.len() as f64));
        out.insert("scored_requests".into(), json!(bleu.len()));
    }
    out.insert("input_lens".into(), json!(ok.iter().map(|r| r.input_tokens).collect::<Vec<_>>()));
    out.insert("output_lens".into(), json!(ok.iter().map(|r| r.output_tokens).collect::<Vec<_>>()));
    out.insert("ttfts".into(), json!(ttft.iter().map(|v| v / 1e3).collect::<Vec<_>>()));
    out.insert(
        "errors".into(),
        json!(run.records.iter().map(|r| r.error.clone().unwrap_or_default()).collect::<Vec<_>>()),
    );

    let mut errors_by_kind: BTreeMap<String, u64> = BTreeMap::new();
    for k in run.records.iter().filter_map(|r| r.error_kind.as_ref()) {
        *errors_by_kind.entry(k.clone()).or_default() += 1;
    }
    let mut states: BTreeMap<&str, u64> = BTreeMap::new();
    for r in &run.records {
        *states.entry(r.state.as_str()).or_default() += 1;
    }
    let count = |a: ContextAction| run.records.iter().filter(|r| r.context == a).count();
    let rtt = run.rtt.as_ref().map(|c| {
        json!({"baseline_ttft_ms": c.baseline_s.map(|b| b * 1e3), "backoffs": c.backoffs, "final_throttle": c.throttle})
    });
    out.insert(
        "omen".into(),
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "workflow": run.workflow.name,
            "endpoint": run.endpoint,
            "api": run.workflow.api,
            "seed": run.workflow.seed,
            "sessions": run.sessions,
            "retries": run.records.iter().map(|r| u64::from(r.attempts.saturating_sub(1))).sum::<u64>(),
            "errors_by_kind": errors_by_kind,
            "requests_by_state": states,
            "context_resets": count(ContextAction::Reset),
            "context_truncations": count(ContextAction::Truncated),
            "context_overflows": count(ContextAction::Overflow),
            "max_history_turns": run.records.iter().map(|r| r.history_turns).max().unwrap_or(0),
            "arrival_rate_changes": run.rate_changes,
            "rtt_backoff": rtt,
            "p99_drift": p99_drift(&run.records, run.duration_s),
        }),
    );
    out.insert("requests".into(), json!(run.records));
    Value::Object(out)
}

/// Fewest successful requests per drift window (with fewer the P99 is the window's maximum).
pub const DRIFT_MIN_PER_WINDOW: usize = 10;
/// Most drift windows.
pub const DRIFT_MAX_WINDOWS: usize = 20;

/// One time window of a run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DriftWindow {
    /// Start, seconds from the start of the run (by request start).
    pub start_s: f64,
    /// End.
    pub end_s: f64,
    /// Successful requests started in it.
    pub requests: usize,
    /// P99 TTFT, ms.
    pub p99_ttft_ms: f64,
    /// P99 E2EL, ms.
    pub p99_e2el_ms: f64,
}

/// Does the tail worsen over a run (as the cache warms and fragments)?
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct P99Drift {
    /// The windows, in time order (empty when the run is too short).
    pub windows: Vec<DriftWindow>,
    /// Theil-Sen slope of the windows' P99 E2EL, ms per minute, with its 90% interval.
    pub e2el_slope_ms_per_min: Option<[f64; 3]>,
    /// The same for P99 TTFT.
    pub ttft_slope_ms_per_min: Option<[f64; 3]>,
    /// `worsens` (E2EL slope interval above 0), `improves` (below 0), `steady`, or `too_short`.
    pub verdict: String,
}

/// The P99 of successful requests in equal windows of the run, and whether it trends.
pub fn p99_drift(records: &[RequestRecord], duration_s: f64) -> P99Drift {
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.success && r.e2el_ms.is_some()).collect();
    let k = (ok.len() / DRIFT_MIN_PER_WINDOW).min(DRIFT_MAX_WINDOWS);
    if k < 3 || duration_s <= 0.0 {
        return P99Drift {
            windows: Vec::new(),
            e2el_slope_ms_per_min: None,
            ttft_slope_ms_per_min: None,
            verdict: "too_short".into(),
        };
    }
    let span = ok.iter().map(|r| r.start_s).fold(0.0, f64::max).max(1e-9);
    let width = span / k as f64;
    let mut bins: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); k];
    for r in ok {
        let i = ((r.start_s / width) as usize).min(k - 1);
        bins[i].0.extend(r.ttft_ms);
        bins[i].1.extend(r.e2el_ms);
    }
    let p99 = |xs: &mut Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        omen_signals::quantile_linear(xs, 0.99)
    };
    let windows: Vec<DriftWindow> = bins
        .into_iter()
        .enumerate()
        .filter(|(_, (_, e))| !e.is_empty())
        .map(|(i, (mut t, mut e))| DriftWindow {
            start_s: i as f64 * width,
            end_s: (i + 1) as f64 * width,
            requests: e.len(),
            p99_ttft_ms: if t.is_empty() { f64::NAN } else { p99(&mut t) },
            p99_e2el_ms: p99(&mut e),
        })
        .collect();
    let minutes: Vec<f64> = windows.iter().map(|w| (w.start_s + w.end_s) / 2.0 / 60.0).collect();
    let slope = |get: fn(&DriftWindow) -> f64| {
        let ys: Vec<f64> = windows.iter().map(get).collect();
        omen_signals::theil_sen(&minutes, &ys, 0.90).ok().map(|f| [f.slope, f.low_slope, f.high_slope])
    };
    let e2el = slope(|w| w.p99_e2el_ms);
    let verdict = match e2el {
        Some([_, lo, _]) if lo > 0.0 => "worsens",
        Some([_, _, hi]) if hi < 0.0 => "improves",
        Some(_) => "steady",
        None => "too_short",
    };
    P99Drift {
        e2el_slope_ms_per_min: e2el,
        ttft_slope_ms_per_min: slope(|w| w.p99_ttft_ms),
        windows,
        verdict: verdict.into(),
    }
}

/// A few lines for stderr after a run.
pub fn summary(report: &Value) -> String {
    let g = |k: &str| report.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
    format!(
        "completed {} failed {} in {:.2}s: {:.3} req/s, {:.1} output tok/s\n\
         TTFT ms mean {:.1} median {:.1} p99 {:.1} | TPOT ms mean {:.2} p99 {:.2} | ITL ms mean {:.2} | E2EL ms mean {:.1} p99 {:.1}",
        g("completed"),
        g("failed"),
        g("duration"),
        g("request_throughput"),
        g("output_throughput"),
        g("mean_ttft_ms"),
        g("median_ttft_ms"),
        g("p99_ttft_ms"),
        g("mean_tpot_ms"),
        g("p99_tpot_ms"),
        g("mean_itl_ms"),
        g("mean_e2el_ms"),
        g("p99_e2el_ms"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_use_vllm_names_and_numpy_percentiles() {
        let mut m = Map::new();
        add_stats(&mut m, "ttft", &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m["mean_ttft_ms"], 2.5);
        assert_eq!(m["median_ttft_ms"], 2.5);
        assert!((m["std_ttft_ms"].as_f64().unwrap() - 1.25f64.sqrt()).abs() < 1e-12);
        assert!((m["p90_ttft_ms"].as_f64().unwrap() - 3.7).abs() < 1e-12);
        assert!((m["p99_ttft_ms"].as_f64().unwrap() - 3.97).abs() < 1e-12);
        let mut e = Map::new();
        add_stats(&mut e, "itl", &[]);
        assert_eq!(e["p99_itl_ms"], 0.0);
    }

    fn record(start_s: f64, e2el_ms: f64) -> RequestRecord {
        RequestRecord::for_test(start_s, e2el_ms / 2.0, e2el_ms)
    }

    #[test]
    fn p99_drift_sees_a_tail_that_grows() {
        // 5 minutes at 1 request/s: the slowest request of every 10 grows by 10 ms per minute.
        let grow: Vec<RequestRecord> = (0..300)
            .map(|i| {
                let t = i as f64;
                record(t, if i % 10 == 9 { 500.0 + t / 6.0 } else { 100.0 + (i % 7) as f64 })
            })
            .collect();
        let d = p99_drift(&grow, 300.0);
        assert_eq!(d.windows.len(), 20);
        assert_eq!(d.verdict, "worsens", "{d:?}");
        let [slope, lo, hi] = d.e2el_slope_ms_per_min.unwrap();
        assert!((slope - 10.0).abs() < 2.0 && lo <= slope && slope <= hi, "{slope} [{lo}, {hi}]");
        // The same tail without growth is steady; a run too short for 3 windows of 10 says so.
        let flat: Vec<RequestRecord> = (0..300)
            .map(|i| record(i as f64, if i % 10 == 9 { 500.0 } else { 100.0 + (i % 7) as f64 }))
            .collect();
        assert_eq!(p99_drift(&flat, 300.0).verdict, "steady");
        let short = p99_drift(&flat[..25], 25.0);
        assert_eq!((short.verdict.as_str(), short.windows.len()), ("too_short", 0));
    }
}
