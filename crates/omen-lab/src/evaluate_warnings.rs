//! `omen evaluate-warnings --scenarios DIR`: simulates every scenario, replays it
//! through the real pipeline (the `omen replay` code: Engine, store, forecasts, in
//! event time) and scores the warnings against the scenario's labels: lead time of
//! the first early warning for the scenario's SLO before its breach, false alarms
//! per week on healthy traces, and detection delay of abrupt faults. With `--seeds N`
//! each scenario runs under N seeds, so a lead time is a distribution and not one draw.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::simulate::{simulate, FaultKind, Labels, Scenario};
use omen_agent::config::Config;
use omen_agent::engine::{AlertEvent, Level};
use omen_signals::DAY_MS;

/// Targets the report checks.
pub const TARGET_LEAD_DAYS: f64 = 14.0;
/// At most this many false alarms per week on healthy traces (1 per 4 weeks).
pub const TARGET_FALSE_ALARMS_PER_WEEK: f64 = 0.25;
/// Abrupt faults flagged within this many minutes.
pub const TARGET_DETECTION_MINUTES: f64 = 5.0;
/// No breach warned less than this many days ahead.
pub const TARGET_MIN_LEAD_DAYS: f64 = 10.0;
/// Median |said - actual| of the first warnings, days.
pub const TARGET_SAID_ERROR_DAYS: f64 = 2.0;
/// Share of first warnings whose days-to-breach interval holds the actual lead.
pub const TARGET_INTERVAL_COVERAGE: f64 = 0.8;

/// The result of one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    /// Scenario name.
    pub scenario: String,
    /// The seed of this run.
    pub seed: u64,
    /// Its labels (fault, onset, SLO, breach).
    pub labels: Labels,
    /// Trace length, days.
    pub days: f64,
    /// First early warning for the scenario's SLO at or after the onset, Unix ms.
    pub first_warning_ts_ms: Option<i64>,
    /// Breach minus first early warning, days (None: no warning before the breach, or no breach).
    pub lead_days: Option<f64>,
    /// What that first warning forecast: days to breach (compare with `lead_days`).
    pub warned_days_to_breach: Option<f64>,
    /// The interval of days to breach that first warning gave.
    pub warned_interval: Option<(f64, f64)>,
    /// First health >= warning at or after the onset minus the onset, minutes (abrupt faults).
    pub detection_minutes: Option<f64>,
    /// Alarm episodes (health rising to >= warning, or an early warning turning on) before the
    /// onset, or anywhere on a healthy trace.
    pub false_alarms: usize,
    /// false_alarms per week of the alarm-free part of the trace.
    pub false_alarms_per_week: f64,
    /// A trap: a fault that never breaches its SLO (a plateau, a step, a surge that passes).
    pub trap: bool,
    /// Early warnings for the trap's SLO at or after its onset (each one a false alarm).
    pub trap_warnings: usize,
    /// Every alert transition, for inspection.
    pub events: Vec<AlertEvent>,
    /// The same run scored on the baseline's alerts (`predict_linear` in the real
    /// Prometheus, baseline.rs), when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Box<ScenarioResult>>,
}

/// One scenario over all its seeds.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioAggregate {
    /// Scenario name.
    pub scenario: String,
    /// Its fault.
    pub fault: FaultKind,
    /// Runs (seeds).
    pub runs: usize,
    /// Median, lowest and highest lead over the runs, days (slow drifts; a miss counts as 0).
    pub median_lead_days: Option<f64>,
    /// Lowest lead, days.
    pub min_lead_days: Option<f64>,
    /// Highest lead, days.
    pub max_lead_days: Option<f64>,
    /// Runs without a warning before the breach.
    pub missed: usize,
    /// Worst detection delay, minutes (abrupt faults; None when a run was never flagged).
    pub max_detection_minutes: Option<f64>,
    /// False alarms over all runs.
    pub false_alarms: usize,
    /// Early warnings on trap runs.
    pub trap_warnings: usize,
}

/// Aggregates over all scenarios, with pass/fail against the targets.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Median lead time over the slow-drift runs (every scenario and seed), days (a missed
    /// warning counts as 0).
    pub median_lead_days: Option<f64>,
    /// Slow-drift runs that median is over.
    pub slow_drift_runs: usize,
    /// Slow-drift runs (`scenario@seed` when there are several seeds) that got no warning
    /// before the breach.
    pub missed: Vec<String>,
    /// False alarms per week over all healthy traces together.
    pub healthy_false_alarms_per_week: Option<f64>,
    /// Worst detection delay of abrupt faults, minutes (None when one was never flagged).
    pub max_detection_minutes: Option<f64>,
    /// Median lead >= 14 days.
    pub lead_target_met: bool,
    /// <= 1 false alarm per 4 weeks on healthy traces.
    pub false_alarm_target_met: bool,
    /// Every abrupt fault flagged within 5 minutes.
    pub detection_target_met: bool,
    /// Lowest lead over the slow-drift runs, days (a miss counts as 0).
    pub min_lead_days: Option<f64>,
    /// No breach warned less than 10 days ahead.
    pub min_lead_target_met: bool,
    /// Median |said - lead| over the warned slow-drift runs, days.
    pub median_said_error_days: Option<f64>,
    /// That median within 2 days.
    pub said_error_target_met: bool,
    /// Share of the warned slow-drift runs whose first warning's interval holds the lead.
    pub interval_coverage: Option<f64>,
    /// Warned slow-drift runs with an interval, that share is over.
    pub interval_runs: usize,
    /// That share at least 80%.
    pub interval_coverage_target_met: bool,
    /// Trap runs (faults that never breach).
    pub trap_runs: usize,
    /// Early warnings on traps, over all trap runs (target 0).
    pub trap_warnings: usize,
}

/// The evaluation report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Per-run results, in scenario then seed order.
    pub scenarios: Vec<ScenarioResult>,
    /// Per scenario over its seeds.
    pub by_scenario: Vec<ScenarioAggregate>,
    /// Aggregates and targets.
    pub summary: Summary,
    /// The baseline's aggregates on the same runs, when asked for.
    pub baseline_summary: Option<Summary>,
}

/// Scenario files (*.yaml, *.yml) in `dir`, sorted by name.
pub fn scenario_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the scenarios folder {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    if files.is_empty() {
        anyhow::bail!("{} holds no *.yaml scenarios; see deploy/scenarios/ for examples", dir.display());
    }
    Ok(files)
}

/// How many runs of each scenario, and how many replays at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvaluateOptions {
    /// Seeds per scenario: the scenario's own seed, then seed + 1, ... (at least 1).
    pub seeds: usize,
    /// Replays run in parallel (at least 1); each is independent (own trace and store).
    pub jobs: usize,
    /// Also score Prometheus' `predict_linear` alert on each trace, in the real Prometheus
    /// (baseline.rs; needs `prometheus` and `promtool`).
    pub baseline: bool,
}

impl Default for EvaluateOptions {
    fn default() -> Self {
        Self { seeds: 1, jobs: 1, baseline: false }
    }
}

/// Simulates and replays one scenario under `work` (trace, labels and store kept there),
/// and with `baseline` scores the baseline's alerts on the same trace (in `work/baseline`).
pub fn evaluate_one(
    cfg: &Config,
    scenario: &Scenario,
    work: &Path,
    baseline: bool,
) -> Result<ScenarioResult> {
    let labels = simulate(scenario, work)?;
    let db = work.join("omen.db");
    for suffix in ["", "-wal", "-shm"] {
        let p = work.join(format!("omen.db{suffix}"));
        if p.exists() {
            std::fs::remove_file(&p).with_context(|| format!("cannot replace {}", p.display()))?;
        }
    }
    let mut cfg = cfg.clone();
    cfg.store.path = db.clone();
    let cfg = Arc::new(cfg);
    let trace = work.join("trace.jsonl.gz");
    let report = crate::replay::replay_into(cfg.clone(), &trace, &db)?;
    let mut result = score(scenario, labels.clone(), report.events);
    if baseline {
        let tools = crate::baseline::PrometheusTools::default();
        let events = crate::baseline::predict_linear_events(&tools, &cfg, &trace, &work.join("baseline"))
            .context("the predict_linear baseline")?;
        result.baseline = Some(Box::new(score(scenario, labels, events)));
    }
    Ok(result)
}

/// Scores the alert transitions of a replay against the labels.
pub fn score(scenario: &Scenario, labels: Labels, events: Vec<AlertEvent>) -> ScenarioResult {
    let days = (labels.last_ts_ms - labels.first_ts_ms) as f64 / DAY_MS as f64;
    let onset = labels.onset_ts_ms.unwrap_or(i64::MAX);
    let forecast_alert = labels.slo.as_ref().map(|s| format!("forecast:{s}"));
    let first_warning = events
        .iter()
        .find(|e| e.ts_ms >= onset && Some(&e.alert) == forecast_alert.as_ref() && e.level != Level::Ok);
    let first_warning_ts_ms = first_warning.map(|e| e.ts_ms);
    let warned_days_to_breach = first_warning.and_then(|e| e.days_to_breach);
    let warned_interval = first_warning.and_then(|e| e.days_to_breach_interval);
    let lead_days = match (first_warning_ts_ms, labels.breach_ts_ms) {
        (Some(w), Some(b)) if w < b => Some((b - w) as f64 / DAY_MS as f64),
        _ => None,
    };
    let detection_minutes = (labels.abrupt)
        .then(|| events.iter().find(|e| e.ts_ms >= onset && e.alert == "health" && e.level != Level::Ok))
        .flatten()
        .map(|e| (e.ts_ms - onset) as f64 / 60_000.0);
    let false_alarms = alarm_episodes(events.iter().filter(|e| e.ts_ms < onset));
    let clean_days =
        if labels.onset_ts_ms.is_some() { (onset - labels.first_ts_ms) as f64 / DAY_MS as f64 } else { days };
    let trap = labels.fault != FaultKind::Healthy && !labels.abrupt && labels.breach_ts_ms.is_none();
    let trap_warnings = if trap {
        alarm_episodes(
            events.iter().filter(|e| e.ts_ms >= onset && Some(&e.alert) == forecast_alert.as_ref()),
        )
    } else {
        0
    };
    ScenarioResult {
        trap,
        trap_warnings,
        scenario: scenario.name.clone(),
        seed: scenario.seed,
        labels,
        days,
        first_warning_ts_ms,
        lead_days,
        warned_days_to_breach,
        warned_interval,
        detection_minutes,
        false_alarms,
        false_alarms_per_week: if clean_days > 0.0 { false_alarms as f64 / (clean_days / 7.0) } else { 0.0 },
        events,
        baseline: None,
    }
}

/// Alarm episodes among `events`: each time the health alert or an early warning
/// (`forecast:*`) leaves Ok, counted per alert, since each one pages on its own.
fn alarm_episodes<'a>(events: impl Iterator<Item = &'a AlertEvent>) -> usize {
    let mut levels: std::collections::HashMap<&str, Level> = std::collections::HashMap::new();
    let mut episodes = 0;
    for e in events.filter(|e| e.alert == "health" || e.alert.starts_with("forecast:")) {
        let before = levels.insert(e.alert.as_str(), e.level).unwrap_or(Level::Ok);
        if before == Level::Ok && e.level != Level::Ok {
            episodes += 1;
        }
    }
    episodes
}

/// Aggregates results against the targets.
pub fn summarize(results: &[ScenarioResult]) -> Summary {
    let all: Vec<&ScenarioResult> = results.iter().collect();
    let several_seeds = has_several_seeds(results);
    let missed: Vec<String> =
        all.iter().filter(|r| is_missed(r)).map(|r| run_label(&r.scenario, r.seed, several_seeds)).collect();
    let leads = slow_drift_leads(&all);
    let median_lead_days = median(&leads);
    let healthy: Vec<&ScenarioResult> =
        results.iter().filter(|r| r.labels.fault == FaultKind::Healthy).collect();
    let healthy_false_alarms_per_week = (!healthy.is_empty()).then(|| {
        let alarms: usize = healthy.iter().map(|r| r.false_alarms).sum();
        let weeks: f64 = healthy.iter().map(|r| r.days / 7.0).sum();
        alarms as f64 / weeks
    });
    let max_detection_minutes = worst_detection_minutes(&all);
    let min_lead_days = leads.iter().copied().reduce(f64::min);
    let said_errors: Vec<f64> = all
        .iter()
        .filter(|r| is_slow_drift(r))
        .filter_map(|r| Some((r.warned_days_to_breach? - r.lead_days?).abs()))
        .collect();
    let median_said_error_days = median(&said_errors);
    let covered: Vec<bool> = all
        .iter()
        .filter(|r| is_slow_drift(r))
        .filter_map(|r| {
            let ((lo, hi), lead) = (r.warned_interval?, r.lead_days?);
            Some(lo <= lead && lead <= hi)
        })
        .collect();
    let interval_coverage =
        (!covered.is_empty()).then(|| covered.iter().filter(|c| **c).count() as f64 / covered.len() as f64);
    let traps: Vec<&&ScenarioResult> = all.iter().filter(|r| r.trap).collect();
    Summary {
        min_lead_days,
        min_lead_target_met: min_lead_days.is_none_or(|d| d >= TARGET_MIN_LEAD_DAYS),
        median_said_error_days,
        said_error_target_met: median_said_error_days.is_none_or(|d| d <= TARGET_SAID_ERROR_DAYS),
        interval_coverage,
        interval_runs: covered.len(),
        interval_coverage_target_met: interval_coverage.is_none_or(|c| c >= TARGET_INTERVAL_COVERAGE),
        trap_runs: traps.len(),
        trap_warnings: traps.iter().map(|r| r.trap_warnings).sum(),
        median_lead_days,
        slow_drift_runs: leads.len(),
        lead_target_met: median_lead_days.is_none_or(|d| d >= TARGET_LEAD_DAYS),
        false_alarm_target_met: healthy_false_alarms_per_week
            .is_none_or(|f| f <= TARGET_FALSE_ALARMS_PER_WEEK),
        detection_target_met: !results.iter().any(|r| r.labels.abrupt)
            || max_detection_minutes.is_some_and(|m| m <= TARGET_DETECTION_MINUTES),
        missed,
        healthy_false_alarms_per_week,
        max_detection_minutes,
    }
}

/// A fault that drifts to a breach (traps, which never breach, are scored apart).
fn is_slow_drift(r: &ScenarioResult) -> bool {
    r.labels.fault != FaultKind::Healthy && !r.labels.abrupt && !r.trap
}

/// A slow-drift run with no early warning before its breach.
fn is_missed(r: &ScenarioResult) -> bool {
    is_slow_drift(r) && r.lead_days.is_none()
}

/// Leads of the slow-drift runs among `runs`, days; a missed warning counts as 0.
fn slow_drift_leads(runs: &[&ScenarioResult]) -> Vec<f64> {
    runs.iter().filter(|r| is_slow_drift(r)).map(|r| r.lead_days.unwrap_or(0.0)).collect()
}

fn median(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| omen_signals::median(values))
}

/// Worst detection delay of the abrupt runs among `runs`, minutes; None when one of them was
/// never flagged, or there is none.
fn worst_detection_minutes(runs: &[&ScenarioResult]) -> Option<f64> {
    let abrupt: Vec<&&ScenarioResult> = runs.iter().filter(|r| r.labels.abrupt).collect();
    if abrupt.iter().all(|r| r.detection_minutes.is_some()) {
        abrupt.iter().filter_map(|r| r.detection_minutes).reduce(f64::max)
    } else {
        None
    }
}

/// Whether some scenario ran under more than one seed.
fn has_several_seeds(results: &[ScenarioResult]) -> bool {
    results.iter().any(|r| results.iter().any(|o| o.scenario == r.scenario && o.seed != r.seed))
}

/// How a run is named in work folders, tables and the missed list: `name@seed` when
/// scenarios run under several seeds, else the name alone.
fn run_label(name: &str, seed: u64, several_seeds: bool) -> String {
    if several_seeds {
        format!("{name}@{seed}")
    } else {
        name.to_owned()
    }
}

/// Per-scenario aggregates of `results`, in first-seen order.
pub fn by_scenario(results: &[ScenarioResult]) -> Vec<ScenarioAggregate> {
    let mut names: Vec<&str> = Vec::new();
    for r in results {
        if !names.contains(&r.scenario.as_str()) {
            names.push(&r.scenario);
        }
    }
    names
        .into_iter()
        .map(|name| {
            let runs: Vec<&ScenarioResult> = results.iter().filter(|r| r.scenario == name).collect();
            let leads = slow_drift_leads(&runs);
            ScenarioAggregate {
                scenario: name.to_owned(),
                fault: runs[0].labels.fault,
                runs: runs.len(),
                median_lead_days: median(&leads),
                min_lead_days: leads.iter().copied().reduce(f64::min),
                max_lead_days: leads.iter().copied().reduce(f64::max),
                missed: runs.iter().filter(|r| is_missed(r)).count(),
                max_detection_minutes: worst_detection_minutes(&runs),
                false_alarms: runs.iter().map(|r| r.false_alarms).sum(),
                trap_warnings: runs.iter().map(|r| r.trap_warnings).sum(),
            }
        })
        .collect()
}

/// Evaluates every scenario in `dir` under `options.seeds` seeds, working under `work`
/// (one folder per scenario, or per scenario and seed when there are several).
pub fn evaluate(cfg: &Config, dir: &Path, work: &Path, options: EvaluateOptions) -> Result<Report> {
    let seeds = options.seeds.max(1);
    let mut runs: Vec<(PathBuf, Scenario, PathBuf)> = Vec::new();
    let mut named: HashMap<String, PathBuf> = HashMap::new();
    for path in scenario_files(dir)? {
        let scenario = Scenario::load(&path)?;
        // Each scenario's runs work in a folder named after it, and the report groups by name.
        if let Some(first) = named.insert(scenario.name.clone(), path.clone()) {
            anyhow::bail!(
                "{} and {} both name their scenario {:?}; give each file its own `name` (runs of one scenario under several seeds come from --seeds)",
                first.display(),
                path.display(),
                scenario.name
            );
        }
        for k in 0..seeds as u64 {
            let mut run = scenario.clone();
            run.seed = scenario.seed.wrapping_add(k);
            let folder = work.join(run_label(&run.name, run.seed, seeds > 1));
            runs.push((path.clone(), run, folder));
        }
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::atomic::AtomicUsize::new(0);
    let results: std::sync::Mutex<Vec<Option<Result<ScenarioResult>>>> =
        std::sync::Mutex::new((0..runs.len()).map(|_| None).collect());
    let failed = std::sync::atomic::AtomicBool::new(false);
    // Each replay owns its trace and store, so they run side by side; a failure stops the
    // others from taking new runs (the ones in flight finish).
    std::thread::scope(|scope| {
        for _ in 0..options.jobs.clamp(1, runs.len().max(1)) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= runs.len() || failed.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let (path, scenario, folder) = &runs[i];
                let started = std::time::Instant::now();
                let result = evaluate_one(cfg, scenario, folder, options.baseline)
                    .with_context(|| format!("scenario {} (seed {})", path.display(), scenario.seed));
                if result.is_err() {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                let finished = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                let secs = started.elapsed().as_secs_f64();
                match &result {
                    Ok(r) => tracing::info!(
                        scenario = %scenario.name,
                        seed = scenario.seed,
                        lead_days = %opt(r.lead_days, 1),
                        said_days = %opt(r.warned_days_to_breach, 1),
                        false_alarms = r.false_alarms,
                        secs = secs.round(),
                        "evaluated run {finished} of {}",
                        runs.len()
                    ),
                    Err(e) => {
                        tracing::error!(scenario = %scenario.name, seed = scenario.seed, "run failed: {e:#}")
                    }
                }
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(result);
            });
        }
    });
    let mut scenarios = Vec::with_capacity(runs.len());
    for r in results.into_inner().unwrap_or_else(|e| e.into_inner()).into_iter().flatten() {
        scenarios.push(r?);
    }
    let summary = summarize(&scenarios);
    let baseline: Vec<ScenarioResult> =
        scenarios.iter().filter_map(|r| r.baseline.as_deref().cloned()).collect();
    let baseline_summary = (options.baseline && !baseline.is_empty()).then(|| summarize(&baseline));
    Ok(Report { by_scenario: by_scenario(&scenarios), scenarios, summary, baseline_summary })
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// The report as a plain-text table: one row per run, then (with several seeds) one per
/// scenario, then the targets.
pub fn table(report: &Report) -> String {
    let several_seeds = has_several_seeds(&report.scenarios);
    let lead = |r: &ScenarioResult| {
        if is_missed(r) {
            "missed".into()
        } else if r.trap {
            format!("trap:{}", r.trap_warnings)
        } else {
            opt(r.lead_days, 1)
        }
    };
    let mut s = format!(
        "{:<30} {:<24} {:>5} {:>13} {:>7} {:>7} {:>13} {:>10} {:>6} {:>8} {:>6}\n",
        "scenario",
        "fault",
        "days",
        "SLO",
        "lead d",
        "said d",
        "interval d",
        "detect min",
        "FA/wk",
        "PL lead",
        "PL FA"
    );
    for r in &report.scenarios {
        let name = run_label(&r.scenario, r.seed, several_seeds);
        let interval = r.warned_interval.map_or("-".into(), |(lo, hi)| format!("{lo:.1}..{hi:.1}"));
        let (pl_lead, pl_fa) = match &r.baseline {
            Some(b) => (lead(b), format!("{:.2}", b.false_alarms_per_week)),
            None => ("-".into(), "-".into()),
        };
        s += &format!(
            "{:<30} {:<24} {:>5.1} {:>13} {:>7} {:>7} {:>13} {:>10} {:>6.2} {:>8} {:>6}\n",
            name,
            format!("{:?}", r.labels.fault),
            r.days,
            r.labels.slo.clone().unwrap_or_else(|| "-".into()),
            lead(r),
            opt(r.warned_days_to_breach, 1),
            interval,
            opt(r.detection_minutes, 1),
            r.false_alarms_per_week,
            pl_lead,
            pl_fa,
        );
    }
    if several_seeds {
        s += &format!(
            "\n{:<30} {:>4} {:>11} {:>17} {:>6} {:>10} {:>5} {:>5}\n",
            "scenario", "runs", "median lead", "lead min..max", "missed", "detect max", "FA", "trapW"
        );
        for a in &report.by_scenario {
            let range = match (a.min_lead_days, a.max_lead_days) {
                (Some(lo), Some(hi)) => format!("{lo:.1}..{hi:.1}"),
                _ => "-".into(),
            };
            s += &format!(
                "{:<30} {:>4} {:>11} {:>17} {:>6} {:>10} {:>5} {:>5}\n",
                a.scenario,
                a.runs,
                opt(a.median_lead_days, 1),
                range,
                a.missed,
                opt(a.max_detection_minutes, 1),
                a.false_alarms,
                a.trap_warnings
            );
        }
    }
    let m = &report.summary;
    // (what, value, target, met): one line each.
    let targets = [
        (
            format!("median lead (slow drifts, {} runs)", m.slow_drift_runs),
            format!("{} days", opt(m.median_lead_days, 1)),
            format!(">= {TARGET_LEAD_DAYS}"),
            m.lead_target_met,
        ),
        (
            "false alarms on healthy traces".into(),
            format!("{} per week", opt(m.healthy_false_alarms_per_week, 2)),
            format!("<= {TARGET_FALSE_ALARMS_PER_WEEK}"),
            m.false_alarm_target_met,
        ),
        (
            "lowest lead (slow drifts)".into(),
            format!("{} days", opt(m.min_lead_days, 1)),
            format!(">= {TARGET_MIN_LEAD_DAYS}"),
            m.min_lead_target_met,
        ),
        (
            "median |said - lead| at the first warning".into(),
            format!("{} days", opt(m.median_said_error_days, 2)),
            format!("<= {TARGET_SAID_ERROR_DAYS}"),
            m.said_error_target_met,
        ),
        (
            format!("days-to-breach interval holding the lead ({} warned runs)", m.interval_runs),
            opt(m.interval_coverage.map(|c| 100.0 * c), 0) + "%",
            format!(">= {:.0}%", 100.0 * TARGET_INTERVAL_COVERAGE),
            m.interval_coverage_target_met,
        ),
        (
            "early warnings on traps".into(),
            format!("{} over {} runs", m.trap_warnings, m.trap_runs),
            "0".into(),
            m.trap_warnings == 0,
        ),
        (
            "abrupt detection".into(),
            format!("worst {} min", opt(m.max_detection_minutes, 1)),
            format!("<= {TARGET_DETECTION_MINUTES}"),
            m.detection_target_met,
        ),
    ];
    for (what, value, target, met) in targets {
        s += &format!("{what}: {value} (target {target}: {})\n", if met { "met" } else { "MISSED" });
    }
    if let Some(b) = &report.baseline_summary {
        s += &format!(
            "\nbaseline, Prometheus predict_linear(daily indicator[{}d], {} * 86400) on the same runs:\n",
            crate::baseline::PREDICT_LINEAR_WINDOW_DAYS,
            crate::baseline::PREDICT_LINEAR_AHEAD_DAYS
        );
        s += &format!(
            "median lead {} days (omen {}), lowest lead {} days (omen {}), missed {} (omen {}), \
             false alarms on healthy traces {} per week (omen {}), early warnings on traps {} (omen {})\n",
            opt(b.median_lead_days, 1),
            opt(m.median_lead_days, 1),
            opt(b.min_lead_days, 1),
            opt(m.min_lead_days, 1),
            b.missed.len(),
            m.missed.len(),
            opt(b.healthy_false_alarms_per_week, 2),
            opt(m.healthy_false_alarms_per_week, 2),
            b.trap_warnings,
            m.trap_warnings,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(ts_ms: i64, alert: &str, level: Level) -> AlertEvent {
        AlertEvent {
            ts_ms,
            alert: alert.into(),
            level,
            reason: String::new(),
            days_to_breach: None,
            days_to_breach_interval: None,
        }
    }

    #[test]
    fn early_warnings_and_health_each_count_as_alarms() {
        let events = [
            event(1, "health", Level::Warning),
            event(2, "health", Level::Critical),
            event(3, "forecast:kv_usage", Level::Warning),
            event(4, "health", Level::Ok),
            event(5, "forecast:kv_usage", Level::Ok),
            event(6, "forecast:kv_usage", Level::Warning),
            event(7, "health", Level::Warning),
        ];
        // health: 1 and 7; kv_usage: 3 and 6. Warning -> Critical is the same episode.
        assert_eq!(alarm_episodes(events.iter()), 4);
        assert_eq!(alarm_episodes(events.iter().filter(|e| e.alert == "health")), 2);
        assert_eq!(alarm_episodes(std::iter::empty()), 0);
    }

    #[test]
    fn a_fault_that_never_breaches_is_a_trap_and_its_warnings_count() {
        let s = Scenario::from_yaml(
            "name: t\ndays: 14\nstep: 1h\nfault: {kind: kvf_step, onset_days: 5, magnitude: 0.3}\n",
            "(test)",
        )
        .unwrap();
        let labels = s.labels(&s.generate());
        let onset = labels.onset_ts_ms.unwrap();
        let events = vec![
            event(onset - 1, "forecast:kvf", Level::Warning),
            event(onset - 1, "forecast:kvf", Level::Ok),
            event(onset + 1, "forecast:kvf", Level::Warning),
            event(onset + 2, "forecast:rci", Level::Warning),
        ];
        let r = score(&s, labels, events);
        assert!(r.trap);
        assert_eq!((r.trap_warnings, r.false_alarms), (1, 1));
        let summary = summarize(std::slice::from_ref(&r));
        assert_eq!((summary.trap_runs, summary.trap_warnings, summary.slow_drift_runs), (1, 1, 0));
        assert!(summary.missed.is_empty());
    }

    #[test]
    fn two_scenario_files_of_one_name_are_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let yaml = "name: same\ndays: 2\nstep: 1h\nfault: {kind: kvf_step, onset_days: 1, magnitude: 0.3}\n";
        std::fs::write(dir.path().join("a.yaml"), yaml).unwrap();
        std::fs::write(dir.path().join("b.yaml"), yaml).unwrap();
        let options = EvaluateOptions { seeds: 1, jobs: 1, baseline: false };
        let e = evaluate(&Config::default(), dir.path(), &dir.path().join("work"), options).unwrap_err();
        let message = format!("{e:#}");
        assert!(
            message.contains("a.yaml") && message.contains("b.yaml") && message.contains("\"same\""),
            "{message}"
        );
        assert!(!dir.path().join("work").exists(), "nothing ran: {message}");
    }
}
