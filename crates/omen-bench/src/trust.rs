//! Whether a bench result can be trusted and whether it may ship.
//!
//! Repeat runs: `omen bench --repeat N` runs the same workload N times, drops the first
//! (cold caches, JIT warm-up) and the last (often cut short or disturbed by teardown), and
//! calls the rest stable when the spread of their P95 latencies, (max - min) / median, stays
//! within a threshold. Golden gate: `omen compare GOLDEN CANDIDATE --tolerances FILE` checks
//! each metric of a per-metric tolerance table and gives a verdict per metric and an exit
//! code a CI job can gate on.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::loadgen::{BenchRun, RequestRecord};

/// One latency of a request, ms.
type Latency = fn(&RequestRecord) -> Option<f64>;

/// The latency metrics whose P95 spread decides stability, as (report name, getter).
const STABILITY_METRICS: [(&str, Latency); 3] =
    [("ttft", |r| r.ttft_ms), ("tpot", |r| r.tpot_ms), ("e2el", |r| r.e2el_ms)];

/// Default stability threshold: P95s of the kept runs within 10% of their median.
pub const DEFAULT_STABLE_SPREAD: f64 = 0.10;

/// How the repeated runs agreed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RepeatSummary {
    /// Runs made.
    pub runs: usize,
    /// Runs kept for the report, numbered from 1.
    pub kept: Vec<usize>,
    /// P95 of each latency metric (ms) in each kept run, keyed `p95_ttft_ms`, ...
    pub p95_ms: BTreeMap<String, Vec<f64>>,
    /// (max - min) / median of those P95s, per metric.
    pub spread: BTreeMap<String, f64>,
    /// The threshold the spread was held to.
    pub threshold: f64,
    /// Every spread within the threshold; `None` when fewer than two runs were kept, so
    /// there is nothing to compare (`--repeat 4` or more).
    pub stable: Option<bool>,
    /// The metrics whose spread exceeded the threshold.
    pub unstable_metrics: Vec<String>,
}

/// The run numbers (from 1) kept out of `n`: all but the first and last when n >= 3.
pub fn kept_runs(n: usize) -> std::ops::RangeInclusive<usize> {
    if n >= 3 {
        2..=n - 1
    } else {
        1..=n
    }
}

fn p95(records: &[RequestRecord], get: Latency) -> Option<f64> {
    let mut xs: Vec<f64> = records.iter().filter(|r| r.success).filter_map(get).collect();
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    Some(omen_signals::quantile_linear(&xs, 0.95))
}

/// Judges the kept runs of `runs` (all of them, in order) against `threshold`.
pub fn repeat_summary(runs: &[BenchRun], threshold: f64) -> RepeatSummary {
    let kept: Vec<usize> = kept_runs(runs.len()).collect();
    let mut p95_ms = BTreeMap::new();
    let mut spread = BTreeMap::new();
    let mut unstable = Vec::new();
    for (name, get) in STABILITY_METRICS {
        let values: Vec<f64> = kept.iter().filter_map(|&i| p95(&runs[i - 1].records, get)).collect();
        let key = format!("p95_{name}_ms");
        if values.len() == kept.len() && !values.is_empty() {
            let mut sorted = values.clone();
            sorted.sort_by(f64::total_cmp);
            let median = omen_signals::quantile_linear(&sorted, 0.5);
            let s = (sorted[sorted.len() - 1] - sorted[0]) / median.abs().max(1e-9);
            if s > threshold {
                unstable.push(key.clone());
            }
            spread.insert(key.clone(), s);
        } else if kept.len() >= 2 {
            // A kept run without a single successful value cannot be judged stable.
            unstable.push(key.clone());
        }
        p95_ms.insert(key, values);
    }
    let judged = kept.len() >= 2;
    RepeatSummary {
        runs: runs.len(),
        kept,
        p95_ms,
        spread,
        threshold,
        stable: judged.then_some(unstable.is_empty()),
        unstable_metrics: unstable,
    }
}

/// The kept runs as one run: records renumbered and laid end to end in time, durations
/// and counters summed, so the usual report of it is the report of all kept requests.
pub fn pooled(runs: &[BenchRun]) -> Option<BenchRun> {
    let kept: Vec<&BenchRun> = kept_runs(runs.len()).map(|i| &runs[i - 1]).collect();
    let last = (*kept.last()?).clone();
    let mut records = Vec::new();
    let (mut offset, mut sessions, mut rate_changes) = (0.0, 0, 0);
    for run in &kept {
        for r in &run.records {
            let mut r = r.clone();
            r.id = records.len() as u64;
            r.session += sessions;
            r.start_s += offset;
            r.end_s += offset;
            records.push(r);
        }
        offset += run.duration_s;
        sessions += run.sessions;
        rate_changes += run.rate_changes;
    }
    Some(BenchRun { records, duration_s: offset, sessions, rate_changes, ..last })
}

/// How much a metric may move before the gate calls it a breach.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    /// In the metric's own unit (e.g. 5 for 5 ms on a `_ms` metric).
    Absolute(f64),
    /// A fraction of the golden value (written `8%`).
    Relative(f64),
}

impl Bound {
    fn allowed(self, golden: f64) -> f64 {
        match self {
            Bound::Absolute(x) => x,
            Bound::Relative(f) => f * golden.abs(),
        }
    }

    fn describe(self) -> String {
        match self {
            Bound::Absolute(x) => format!("{x}"),
            Bound::Relative(f) => format!("{}%", f * 100.0),
        }
    }
}

impl<'de> Deserialize<'de> for Bound {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Text(String),
        }
        let bound = match Raw::deserialize(d)? {
            Raw::Number(x) => Bound::Absolute(x),
            Raw::Text(t) => {
                let pct = t.trim().strip_suffix('%').and_then(|n| n.trim().parse::<f64>().ok()).ok_or_else(
                    || {
                        serde::de::Error::custom(format!(
                            "{t:?} is neither a number (in the metric's unit) nor a percentage like \"8%\""
                        ))
                    },
                )?;
                Bound::Relative(pct / 100.0)
            }
        };
        let x = match bound {
            Bound::Absolute(x) | Bound::Relative(x) => x,
        };
        if !(x.is_finite() && x >= 0.0) {
            return Err(serde::de::Error::custom(
                "a tolerance must be a finite amount >= 0 (the sign is the key: increase or decrease)",
            ));
        }
        Ok(bound)
    }
}

/// How bad a breach of a tolerance is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Risk {
    /// Worth a look.
    Low,
    /// Should be explained before shipping.
    Medium,
    /// Blocks shipping.
    High,
}

/// The tolerance of one metric: how far it may rise and fall against the golden report.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tolerance {
    /// Largest allowed rise; absent: any rise is fine.
    #[serde(default)]
    pub increase: Option<Bound>,
    /// Largest allowed fall; absent: any fall is fine.
    #[serde(default)]
    pub decrease: Option<Bound>,
    /// How bad a breach is.
    pub risk: Risk,
}

/// A tolerance table (YAML), e.g. deploy/bench/tolerances.yaml.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tolerances {
    /// The lowest risk whose breach fails the gate (default high).
    #[serde(default = "default_fail_on")]
    pub fail_on: Risk,
    /// Tolerances by report key, e.g. `p95_e2el_ms`, `request_throughput`, `mean_bleu`.
    pub metrics: BTreeMap<String, Tolerance>,
}

fn default_fail_on() -> Risk {
    Risk::High
}

/// What a tolerance table is, for its errors.
const YAML: crate::yaml::Kind =
    crate::yaml::Kind { name: "tolerance table", example: "deploy/bench/tolerances.yaml" };

/// A tolerance table or a report could not be used; names the input, the problem and the fix.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// The file could not be read or does not match the schema.
    #[error(transparent)]
    Yaml(#[from] crate::yaml::YamlError),
    /// The table is valid YAML but cannot gate anything.
    #[error("tolerance table {path}: {field}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// Field path.
        field: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A report lacks a metric the table names.
    #[error("{report} has no numeric `{metric}` (named in the tolerance table); {hint}")]
    MissingMetric {
        /// The report file.
        report: String,
        /// The metric.
        metric: String,
        /// How to get it.
        hint: &'static str,
    },
}

impl Tolerances {
    /// Reads and checks a tolerance table.
    pub fn load(path: &Path) -> Result<Self, GateError> {
        let (text, name) = crate::yaml::read(path, YAML)?;
        Self::from_yaml(&text, &name)
    }

    /// Parses and checks a table; `path` only names the input in errors.
    pub fn from_yaml(text: &str, path: &str) -> Result<Self, GateError> {
        let t: Tolerances = crate::yaml::parse(text, path, YAML)?;
        if t.metrics.is_empty() {
            return Err(GateError::Invalid {
                path: path.to_owned(),
                field: "metrics".into(),
                reason: "no metrics; name at least one report key, e.g. p95_e2el_ms".into(),
            });
        }
        for (name, m) in &t.metrics {
            if m.increase.is_none() && m.decrease.is_none() {
                return Err(GateError::Invalid {
                    path: path.to_owned(),
                    field: format!("metrics.{name}"),
                    reason: "sets neither increase nor decrease, so it can never breach; set one".into(),
                });
            }
        }
        Ok(t)
    }
}

/// The gate's verdict on one metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GateVerdict {
    /// Within its tolerance.
    Pass,
    /// Outside its tolerance.
    Breach,
}

/// One row of the gate.
#[derive(Debug, Clone, Serialize)]
pub struct GateRow {
    /// Report key.
    pub metric: String,
    /// Golden value.
    pub golden: f64,
    /// Candidate value.
    pub candidate: f64,
    /// candidate - golden.
    pub change: f64,
    /// The change relative to |golden|.
    pub relative_change: f64,
    /// The tolerance as written, e.g. `+5 / -5` or `-8%`.
    pub tolerance: String,
    /// Risk of a breach.
    pub risk: Risk,
    /// Pass or breach.
    pub verdict: GateVerdict,
    /// Whether this row fails the gate (a breach at or above `fail_on`).
    pub fails_gate: bool,
}

fn metric_of(report: &Value, name: &str, metric: &str) -> Result<f64, GateError> {
    report.get(metric).and_then(Value::as_f64).filter(|v| v.is_finite()).ok_or_else(|| {
        GateError::MissingMetric {
            report: name.to_owned(),
            metric: metric.to_owned(),
            hint: if metric.contains("bleu") {
                "answers are only scored when the workflow's states give `references`"
            } else {
                "use a report key written by `omen bench` (see docs/bench.md)"
            },
        }
    })
}

/// Checks `candidate` against `golden` metric by metric.
pub fn gate(
    golden: (&str, &Value),
    candidate: (&str, &Value),
    table: &Tolerances,
) -> Result<Vec<GateRow>, GateError> {
    let mut rows = Vec::new();
    for (metric, tol) in &table.metrics {
        let g = metric_of(golden.1, golden.0, metric)?;
        let c = metric_of(candidate.1, candidate.0, metric)?;
        let change = c - g;
        let breach = tol.increase.is_some_and(|b| change > b.allowed(g) + 1e-12)
            || tol.decrease.is_some_and(|b| -change > b.allowed(g) + 1e-12);
        let tolerance = match (tol.increase, tol.decrease) {
            (Some(i), Some(d)) => format!("+{} / -{}", i.describe(), d.describe()),
            (Some(i), None) => format!("+{}", i.describe()),
            (None, Some(d)) => format!("-{}", d.describe()),
            (None, None) => unreachable!("the table was checked at load"),
        };
        rows.push(GateRow {
            metric: metric.clone(),
            golden: g,
            candidate: c,
            change,
            relative_change: change / g.abs().max(1e-12),
            tolerance,
            risk: tol.risk,
            verdict: if breach { GateVerdict::Breach } else { GateVerdict::Pass },
            fails_gate: breach && tol.risk >= table.fail_on,
        });
    }
    Ok(rows)
}

/// The gate as a fixed-width table.
pub fn gate_table(rows: &[GateRow]) -> String {
    let mut out = format!(
        "{:<24} {:>12} {:>12} {:>10} {:>16} {:>7}  {}\n",
        "metric", "golden", "candidate", "change", "tolerance", "risk", "verdict"
    );
    for r in rows {
        let risk = match r.risk {
            Risk::Low => "low",
            Risk::Medium => "medium",
            Risk::High => "high",
        };
        let verdict = match (r.verdict, r.fails_gate) {
            (GateVerdict::Pass, _) => "pass",
            (GateVerdict::Breach, true) => "BREACH (fails the gate)",
            (GateVerdict::Breach, false) => "breach (below fail_on)",
        };
        out.push_str(&format!(
            "{:<24} {:>12.3} {:>12.3} {:>+9.1}% {:>16} {:>7}  {}\n",
            r.metric,
            r.golden,
            r.candidate,
            r.relative_change * 100.0,
            r.tolerance,
            risk,
            verdict
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SEED_TABLE: &str = include_str!("../../../deploy/bench/tolerances.yaml");

    fn record(id: u64, ttft: f64, e2el: f64) -> RequestRecord {
        RequestRecord {
            id,
            session: id,
            tpot_ms: Some(10.0),
            ..RequestRecord::for_test(id as f64, ttft, e2el)
        }
    }

    fn run(ttft: f64) -> BenchRun {
        let wf = crate::loadgen::workflow::Workflow::from_yaml(
            "name: t\nmax_requests: 4\narrival: { rate: 1.0 }\nstart: a\nstates:\n  a:\n    prompts: [\"hi\"]\n",
            "t.yaml",
        )
        .unwrap();
        BenchRun {
            records: (0..20).map(|i| record(i, ttft + i as f64, 2.0 * ttft)).collect(),
            duration_s: 10.0,
            sessions: 20,
            model: "m".into(),
            endpoint: "http://x/v1".into(),
            workflow: wf,
            rate_changes: 1,
            rtt: None,
        }
    }

    #[test]
    fn first_and_last_runs_are_dropped_and_spread_decides() {
        assert_eq!(kept_runs(5), 2..=4);
        assert_eq!(kept_runs(1), 1..=1);
        // A slow cold first run and a disturbed last one do not count.
        let runs = [run(500.0), run(100.0), run(104.0), run(102.0), run(20.0)];
        let s = repeat_summary(&runs, 0.10);
        assert_eq!(s.kept, [2, 3, 4]);
        assert_eq!(s.stable, Some(true), "{s:?}");
        let ttft = &s.p95_ms["p95_ttft_ms"];
        assert_eq!(ttft.len(), 3);
        assert!(s.spread["p95_ttft_ms"] > 0.0 && s.spread["p95_ttft_ms"] < 0.10);
        let unstable = [run(100.0), run(100.0), run(150.0), run(100.0), run(100.0)];
        let s = repeat_summary(&unstable, 0.10);
        assert_eq!(s.stable, Some(false));
        assert!(s.unstable_metrics.contains(&"p95_ttft_ms".to_owned()), "{s:?}");
        // A looser threshold accepts the same runs.
        assert_eq!(repeat_summary(&unstable, 0.9).stable, Some(true));
        // One kept run (of 3) has nothing to agree with: not judged.
        let three = repeat_summary(&unstable[..3], 0.10);
        assert_eq!((three.kept.as_slice(), three.stable), ([2].as_slice(), None));
    }

    #[test]
    fn pooled_runs_lie_end_to_end() {
        let runs = [run(1.0), run(2.0), run(3.0), run(4.0)];
        let p = pooled(&runs).unwrap();
        assert_eq!(p.records.len(), 40);
        assert_eq!(p.duration_s, 20.0);
        assert_eq!(p.sessions, 40);
        assert_eq!(p.records[20].start_s, 10.0);
        assert_eq!(p.records[20].ttft_ms, Some(3.0));
        assert!(p.records.windows(2).all(|w| w[1].id == w[0].id + 1));
        assert!(pooled(&[]).is_none());
    }

    #[test]
    fn the_seeds_table_gates_latency_quality_and_throughput() {
        let table = Tolerances::from_yaml(SEED_TABLE, "deploy/bench/tolerances.yaml").unwrap();
        assert_eq!(table.fail_on, Risk::High);
        let golden = json!({"p95_e2el_ms": 200.0, "mean_bleu": 40.0, "request_throughput": 10.0});
        let same = gate(("g", &golden), ("c", &golden), &table).unwrap();
        assert!(same.iter().all(|r| r.verdict == GateVerdict::Pass && !r.fails_gate));
        // +6 ms p95 breaches +-5 ms (high); -0.2% BLEU is within -0.3%; -9% throughput breaches -8% (high).
        let worse = json!({"p95_e2el_ms": 206.0, "mean_bleu": 39.92, "request_throughput": 9.1});
        let rows = gate(("g", &golden), ("c", &worse), &table).unwrap();
        let v = |m: &str| rows.iter().find(|r| r.metric == m).unwrap().clone();
        assert_eq!(v("p95_e2el_ms").verdict, GateVerdict::Breach);
        assert!(v("p95_e2el_ms").fails_gate);
        assert_eq!(v("mean_bleu").verdict, GateVerdict::Pass);
        assert_eq!(v("request_throughput").verdict, GateVerdict::Breach);
        // 5 ms faster is within +-5; 6 ms faster is a breach too (the seed's "+-").
        let faster = json!({"p95_e2el_ms": 195.0, "mean_bleu": 40.0, "request_throughput": 10.0});
        assert!(gate(("g", &golden), ("c", &faster), &table).unwrap().iter().all(|r| !r.fails_gate));
        let much_faster = json!({"p95_e2el_ms": 194.0, "mean_bleu": 40.0, "request_throughput": 10.0});
        let rows = gate(("g", &golden), ("c", &much_faster), &table).unwrap();
        let p95 = rows.iter().find(|r| r.metric == "p95_e2el_ms").unwrap();
        assert!(p95.verdict == GateVerdict::Breach && p95.fails_gate, "{p95:?}");
        // A medium-risk breach is reported but does not fail a gate set to high.
        let dumber = json!({"p95_e2el_ms": 200.0, "mean_bleu": 39.0, "request_throughput": 10.0});
        let rows = gate(("g", &golden), ("c", &dumber), &table).unwrap();
        let q = rows.iter().find(|r| r.metric == "mean_bleu").unwrap();
        assert_eq!((q.verdict, q.fails_gate), (GateVerdict::Breach, false));
        assert!(gate_table(&rows).contains("breach (below fail_on)"));
        // More throughput is never a breach: only a decrease is bounded.
        let faster = json!({"p95_e2el_ms": 200.0, "mean_bleu": 40.0, "request_throughput": 20.0});
        assert!(gate(("g", &golden), ("c", &faster), &table).unwrap().iter().all(|r| !r.fails_gate));
    }

    #[test]
    fn bad_tables_and_reports_say_the_fix() {
        let e = Tolerances::from_yaml("metrics:\n  p95_e2el_ms: { increase: 5ms, risk: high }\n", "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("metrics.p95_e2el_ms.increase") && e.contains("\"8%\""), "{e}");
        let e = Tolerances::from_yaml("metrics:\n  x: { increase: 5, risk: severe }\n", "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("metrics.x.risk"), "{e}");
        let e = Tolerances::from_yaml("metrics:\n  x: { risk: high }\n", "t.yaml").unwrap_err().to_string();
        assert!(e.contains("metrics.x") && e.contains("neither"), "{e}");
        let e = Tolerances::from_yaml("metrics: {}\n", "t.yaml").unwrap_err().to_string();
        assert!(e.contains("no metrics"), "{e}");
        let e = Tolerances::from_yaml("metrics:\n  x: { decrease: -3, risk: low }\n", "t.yaml").unwrap_err();
        assert!(e.to_string().contains(">= 0"), "{e}");
        let table = Tolerances::from_yaml(SEED_TABLE, "t.yaml").unwrap();
        let e = gate(("golden.json", &json!({"p95_e2el_ms": 1.0})), ("c.json", &json!({})), &table)
            .unwrap_err()
            .to_string();
        assert!(e.contains("golden.json") && e.contains("mean_bleu") && e.contains("references"), "{e}");
    }
}
