//! The baseline omen's early warnings are compared with: Prometheus' own practice, computed
//! by the real Prometheus. A trace is backfilled into a TSDB (`promtool tsdb
//! create-blocks-from openmetrics`), a daily-indicator recording rule per SLO is evaluated
//! hour by hour over it by Prometheus' query engine and written back as its recorded series
//! (what `promtool tsdb create-blocks-from rules` does), and the alert of the kind the
//! node-mixin ships, `predict_linear(<daily indicator>[7d], 14 * 86400) > T`, is
//! queried hour by hour through the HTTP API. Its transitions become alert events that
//! evaluate-warnings scores with the same rules as omen's.
//!
//! Needs `prometheus` and `promtool` (Debian package prometheus, installed by `make setup`).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use omen_agent::config::{Config, Direction, SloIndicator};
use omen_agent::engine::{AlertEvent, Level};
use omen_signals::catalogue;

/// The window `predict_linear` fits, and how far ahead it looks, in days.
pub const PREDICT_LINEAR_WINDOW_DAYS: u32 = 7;
/// See [`PREDICT_LINEAR_WINDOW_DAYS`].
pub const PREDICT_LINEAR_AHEAD_DAYS: u32 = 14;
/// Recording rules and the alert are evaluated once an hour.
const STEP_SECONDS: i64 = 3_600;

/// The Prometheus binaries the baseline runs.
#[derive(Debug, Clone)]
pub struct PrometheusTools {
    /// `prometheus`.
    pub prometheus: PathBuf,
    /// `promtool`.
    pub promtool: PathBuf,
}

impl Default for PrometheusTools {
    fn default() -> Self {
        Self { prometheus: "prometheus".into(), promtool: "promtool".into() }
    }
}

/// The recording rule of an SLO's daily indicator over a trailing day, as Prometheus
/// computes it from omen's exported gauges (the same statistic and combination as the
/// agent's calendar-day indicator), and its name (level:metric:operations).
pub fn recording_rule(slo_name: &str, indicator: SloIndicator) -> (String, String) {
    let def = omen_agent::engine::IndicatorDefinition::of(indicator);
    let metric = format!("omen_{}", def.signal);
    let over_day = match def.statistic {
        omen_agent::engine::DailyStatistic::P99 => format!("quantile_over_time(0.99, {metric}[1d])"),
        omen_agent::engine::DailyStatistic::P95 => format!("quantile_over_time(0.95, {metric}[1d])"),
        omen_agent::engine::DailyStatistic::Min => format!("min_over_time({metric}[1d])"),
        omen_agent::engine::DailyStatistic::Mean => format!("avg_over_time({metric}[1d])"),
    };
    let (combine, op) = match def.combine {
        omen_agent::engine::CombineSeries::Max => ("max", "max"),
        omen_agent::engine::CombineSeries::Min => ("min", "min"),
        omen_agent::engine::CombineSeries::Mean => ("avg", "avg"),
    };
    (format!("slo:{metric}:{op}_{slo_name}_1d"), format!("{combine}({over_day})"))
}

/// The alert expression for one SLO on its recording rule.
pub fn alert_expr(record: &str, direction: Direction, threshold: f64) -> String {
    let cmp = match direction {
        Direction::Above => ">",
        Direction::Below => "<",
    };
    format!(
        "predict_linear({record}[{PREDICT_LINEAR_WINDOW_DAYS}d], {PREDICT_LINEAR_AHEAD_DAYS} * 86400) {cmp} {threshold}"
    )
}

/// A child process killed when dropped.
pub struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Series by (signal, labels), each a list of (ms, value).
type SeriesMap = BTreeMap<(String, BTreeMap<String, String>), Vec<(i64, f64)>>;

/// The trace's samples of the SLO indicators' signals, with the GPU memory headroom the
/// agent derives from used and total bytes (as Prometheus would scrape them from omen),
/// each series in time order; and the first and last sample time, ms.
fn trace_series(trace: &Path, cfg: &Config) -> Result<(SeriesMap, i64, i64)> {
    let wanted: Vec<&str> = cfg
        .forecast
        .slos
        .iter()
        .map(|s| omen_agent::engine::IndicatorDefinition::of(s.indicator).signal)
        .collect();
    let headroom = catalogue::GPU_MEMORY_HEADROOM_RATIO.name;
    let mut series = SeriesMap::new();
    let mut gpu_total: BTreeMap<BTreeMap<String, String>, f64> = BTreeMap::new();
    let (mut first, mut last) = (i64::MAX, i64::MIN);
    for batch in omen_sources::trace_file::batches(trace)? {
        for s in batch? {
            first = first.min(s.ts_ms);
            last = last.max(s.ts_ms);
            if s.signal == catalogue::GPU_MEMORY_TOTAL_BYTES.name {
                gpu_total.insert(s.labels.clone(), s.value);
            } else if s.signal == catalogue::GPU_MEMORY_USED_BYTES.name && wanted.contains(&headroom) {
                let total = gpu_total.get(&s.labels).copied().unwrap_or(0.0);
                if let Some(value) = catalogue::gpu_memory_headroom(s.value, total) {
                    let key = (format!("omen_{headroom}"), s.labels.clone());
                    series.entry(key).or_default().push((s.ts_ms, value));
                }
            }
            if wanted.contains(&s.signal.as_str()) {
                series.entry((format!("omen_{}", s.signal), s.labels)).or_default().push((s.ts_ms, s.value));
            }
        }
    }
    if series.is_empty() {
        bail!("{} holds none of the SLO indicators' signals ({})", trace.display(), wanted.join(", "));
    }
    for points in series.values_mut() {
        points.sort_by_key(|p| p.0);
        points.dedup_by_key(|p| p.0);
    }
    Ok((series, first, last))
}

/// OpenMetrics text of the points of `series` in [from, until) ms: one family after
/// another (the map's order keeps a family's series together), each series in time order.
fn openmetrics(series: &SeriesMap, from_ms: i64, until_ms: i64) -> String {
    let mut text = String::new();
    let mut family = String::new();
    for ((metric, labels), points) in series {
        let start = points.partition_point(|p| p.0 < from_ms);
        let end = points.partition_point(|p| p.0 < until_ms);
        if start == end {
            continue;
        }
        if *metric != family {
            text += &format!("# TYPE {metric} gauge\n");
            family = metric.clone();
        }
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
            .collect();
        for (t, v) in &points[start..end] {
            text += &format!("{metric}{{{}}} {v} {:.3}\n", labels.join(","), *t as f64 / 1000.0);
        }
    }
    text += "# EOF\n";
    text
}

/// Writes `series` into blocks under `tsdb`, one promtool run per UTC day: promtool reads
/// its whole input once per two-hour block, so one file of 42 days costs 504 reads of all
/// of it (30 s for 121,000 samples here), and a day's file 12 reads of a day.
fn backfill(
    tools: &PrometheusTools,
    series: &SeriesMap,
    first_ms: i64,
    last_ms: i64,
    dir: &Path,
    tsdb: &Path,
) -> Result<()> {
    let day = 86_400_000;
    let mut from = first_ms.div_euclid(day) * day;
    let input = dir.join("day.om");
    while from <= last_ms {
        let text = openmetrics(series, from, from + day);
        if text.len() > "# EOF\n".len() {
            std::fs::File::create(&input)?.write_all(text.as_bytes())?;
            run(
                Command::new(&tools.promtool)
                    .args(["tsdb", "create-blocks-from", "openmetrics", "--quiet"])
                    .arg(&input)
                    .arg(tsdb),
                "promtool tsdb create-blocks-from openmetrics",
            )?;
        }
        from += day;
    }
    if input.exists() {
        std::fs::remove_file(&input)?;
    }
    Ok(())
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().with_context(|| {
        format!("cannot run {what}: install the Debian package prometheus (make setup does)")
    })?;
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts Prometheus on loopback over the TSDB `tsdb` (config and log in `dir`) and waits
/// until it answers ready; returns the server (killed when dropped) and its URL.
pub fn start_prometheus(tools: &PrometheusTools, dir: &Path, tsdb: &Path) -> Result<(Killed, String)> {
    let config = dir.join("prometheus.yml");
    std::fs::write(&config, "global:\n  scrape_interval: 1m\n")?;
    let port = free_port()?;
    let log = std::fs::File::create(dir.join("prometheus.log"))?;
    let child = Command::new(&tools.prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", tsdb.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--storage.tsdb.retention.time=100y")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| {
            format!("cannot start {}: install the Debian package prometheus", tools.prometheus.display())
        })?;
    let server = Killed(child);
    let url = format!("http://127.0.0.1:{port}");
    let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if client.get(format!("{url}/-/ready")).send().is_ok_and(|r| r.status().is_success()) {
            return Ok((server, url));
        }
        if Instant::now() > deadline {
            bail!("prometheus at {url} not ready after 60 s; see {}", dir.join("prometheus.log").display());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `expr` evaluated hour by hour over [start, end] (Unix s): (time, value) of every point
/// of every series it returns, in time order (a comparison returns the hours it holds).
fn query_range(url: &str, expr: &str, start_s: i64, end_s: i64) -> Result<Vec<(i64, f64)>> {
    let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(300)).build()?;
    let query = reqwest::Url::parse_with_params(
        &format!("{url}/api/v1/query_range"),
        &[
            ("query", expr.to_owned()),
            ("start", start_s.to_string()),
            ("end", end_s.to_string()),
            ("step", STEP_SECONDS.to_string()),
        ],
    )?;
    let answer: serde_json::Value = client
        .get(query)
        .send()
        .with_context(|| format!("query_range {expr}"))?
        .json()
        .with_context(|| format!("query_range {expr}: not JSON"))?;
    if answer["status"] != "success" {
        bail!("query_range {expr}: {}", answer["error"]);
    }
    let mut points = Vec::new();
    for series in answer["data"]["result"].as_array().into_iter().flatten() {
        for point in series["values"].as_array().into_iter().flatten() {
            let t = point[0].as_f64();
            let v = point[1].as_str().and_then(|v| v.parse::<f64>().ok());
            if let (Some(t), Some(v)) = (t, v) {
                points.push((t as i64, v));
            }
        }
    }
    points.sort_by_key(|p| p.0);
    points.dedup_by_key(|p| p.0);
    Ok(points)
}

/// The baseline's alert transitions over `trace`, one `forecast:<slo>` alert per configured
/// SLO, working in `work` (the TSDB, rules and Prometheus' log stay there).
pub fn predict_linear_events(
    tools: &PrometheusTools,
    cfg: &Config,
    trace: &Path,
    work: &Path,
) -> Result<Vec<AlertEvent>> {
    if work.exists() {
        std::fs::remove_dir_all(work).with_context(|| format!("cannot clear {}", work.display()))?;
    }
    std::fs::create_dir_all(work).with_context(|| format!("cannot create {}", work.display()))?;
    let (series, first_ms, last_ms) = trace_series(trace, cfg)?;
    let tsdb = work.join("tsdb");
    backfill(tools, &series, first_ms, last_ms, work, &tsdb)?;
    drop(series);

    // The recording rules as a rule file would hold them (kept for inspection), evaluated
    // hour by hour by Prometheus' query engine over the backfilled trace, as promtool's
    // rule backfill does (one query_range per rule here, not one per two-hour block).
    let mut rules = String::from("groups:\n- name: omen-baseline\n  interval: 1h\n  rules:\n");
    let mut alerts = Vec::new();
    let mut recorded = SeriesMap::new();
    let (start_s, end_s) = (first_ms.div_euclid(1000), last_ms.div_euclid(1000) + 1);
    let first_hour = start_s - start_s.rem_euclid(STEP_SECONDS) + STEP_SECONDS;
    {
        let (_server, url) = start_prometheus(tools, work, &tsdb)?;
        for slo in &cfg.forecast.slos {
            let (record, expr) = recording_rule(&slo.name, slo.indicator);
            rules += &format!("  - record: {record}\n    expr: {expr}\n");
            let points: Vec<(i64, f64)> = query_range(&url, &expr, first_hour, end_s)?
                .into_iter()
                .map(|(t, v)| (t * 1000, v))
                .collect();
            alerts.push((slo.name.clone(), alert_expr(&record, slo.direction, slo.threshold)));
            if points.is_empty() {
                tracing::warn!(
                    "{}: the recording rule {record} gives no points; {} cannot fire",
                    trace.display(),
                    slo.name
                );
            } else {
                recorded.insert((record, BTreeMap::new()), points);
            }
        }
    }
    std::fs::write(work.join("rules.yml"), &rules)?;
    if !recorded.is_empty() {
        backfill(tools, &recorded, first_hour * 1000, end_s * 1000, work, &tsdb)?;
    }
    // A fresh start loads the recorded blocks beside the trace's.
    let (_server, url) = start_prometheus(tools, work, &tsdb)?;
    // The alert is judged once its window is full, as on a Prometheus with history (omen
    // waits for forecast.min_days, 7 by default, in the same way).
    let window_s = i64::from(PREDICT_LINEAR_WINDOW_DAYS) * 86_400;
    let first_hour = first_hour + window_s;
    let mut events = Vec::new();
    for (slo, expr) in alerts {
        let hours: Vec<i64> =
            query_range(&url, &expr, first_hour, end_s)?.into_iter().map(|(t, _)| t).collect();
        let mut on = false;
        let mut t = first_hour;
        while t <= end_s {
            let now_on = hours.binary_search(&t).is_ok();
            if now_on != on {
                events.push(AlertEvent {
                    ts_ms: t * 1000,
                    alert: format!("forecast:{slo}"),
                    level: if now_on { Level::Warning } else { Level::Ok },
                    reason: expr.clone(),
                    days_to_breach: None,
                    days_to_breach_interval: None,
                });
                on = now_on;
            }
            t += STEP_SECONDS;
        }
    }
    events.sort_by_key(|e| e.ts_ms);
    Ok(events)
}
