//! `omen replay TRACE --out DIR`: the live pipeline, run offline over a trace in
//! event time, with a JSON report and an SVG plot of health, anomaly scores and alerts.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use plotters::prelude::*;
use serde::Serialize;

use omen_agent::config::Config;
use omen_agent::engine::{AlertEvent, Engine, HealthSummary, Level};
use omen_agent::forecast_view::ForecastView;
use omen_agent::metrics::LiveMetrics;
use omen_signals::catalogue;
use omen_store::{Resolution, Store};

/// The replay report (report.json).
#[derive(Debug, Serialize)]
pub struct ReplayReport {
    /// Trace path.
    pub trace: String,
    /// Samples read.
    pub samples: usize,
    /// First and last sample time, ms.
    pub first_ts_ms: i64,
    /// Last sample time, ms.
    pub last_ts_ms: i64,
    /// Health score at every tick: (ms, score).
    pub health_timeline: Vec<(i64, f64)>,
    /// Health level and early-warning transitions.
    pub events: Vec<AlertEvent>,
    /// The summary at the end of the trace.
    pub final_summary: Option<HealthSummary>,
    /// Each SLO's forecast at the end of the trace over the trace's whole daily indicator,
    /// with its warning; drawn in forecast-<slo>.svg.
    pub forecasts: Vec<ForecastView>,
}

/// Runs the pipeline over `trace` and writes report.json, report.svg and omen.db into `out`.
pub fn replay(mut cfg: Config, trace: &Path, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out)
        .with_context(|| format!("cannot create the output folder {}", out.display()))?;
    let db = out.join("omen.db");
    for suffix in ["", "-wal", "-shm"] {
        let p = out.join(format!("omen.db{suffix}"));
        if p.exists() {
            std::fs::remove_file(&p).with_context(|| format!("cannot replace {}", p.display()))?;
        }
    }
    cfg.store.path = db.clone();
    let report = replay_into(Arc::new(cfg), trace, &db)?;
    let json_path = out.join("report.json");
    std::fs::write(&json_path, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    let store = Store::open(&db)?;
    let svg_path = out.join("report.svg");
    plot(&report, &store, &svg_path)?;
    for view in &report.forecasts {
        let path = out.join(format!("forecast-{}.svg", view.slo));
        std::fs::write(&path, view.svg().map_err(anyhow::Error::msg)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("{}", forecast_line(view));
    }
    let warnings = report.events.iter().filter(|e| e.level != Level::Ok).count();
    println!(
        "replayed {} samples ({} .. {}); {} alert transition(s), {} warning or worse; wrote {}, {} and {}",
        report.samples,
        fmt_ts(report.first_ts_ms),
        fmt_ts(report.last_ts_ms),
        report.events.len(),
        warnings,
        json_path.display(),
        svg_path.display(),
        db.display()
    );
    Ok(())
}

/// One SLO's outcome in words: its warning, what it said, and the first day beyond the
/// threshold with the lead the warning gave.
fn forecast_line(view: &ForecastView) -> String {
    let mut line = format!("  {}: ", view.slo);
    match &view.warning {
        Some(w) => {
            line += &format!("warned {}", &w.since[..16.min(w.since.len())].replace('T', " "));
            if let Some(d) = w.days_to_breach {
                line += &format!(", saying {d:.1} days to breach");
            }
        }
        None => line += "no warning",
    }
    match (&view.first_day_beyond, view.first_day_beyond_midpoint, &view.warning) {
        (Some(day), Some(midpoint), Some(w)) => {
            let lead = midpoint - w.since_day;
            line +=
                &format!("; first day beyond {}: {day} ({lead:.1} days after the warning)", view.threshold);
        }
        (Some(day), _, _) => line += &format!("; first day beyond {}: {day}", view.threshold),
        (None, _, _) => line += &format!("; no day beyond {}", view.threshold),
    }
    line
}

/// A time stamp as reports show it (UTC, to the minute).
pub(crate) fn fmt_ts(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M").to_string())
        .unwrap_or_default()
}

/// The pipeline over the trace, writing to the store at `db`.
pub fn replay_into(cfg: Arc<Config>, trace: &Path, db: &Path) -> Result<ReplayReport> {
    // The report can be rebuilt from the trace: commit at reads, not at every batch.
    let store = Arc::new(Store::open_offline(db)?);
    let mut engine = Engine::new(cfg, store.clone(), Arc::new(LiveMetrics::new()))?;
    let summary = engine.summary_handle();
    let (mut samples, mut first, mut last) = (0usize, i64::MAX, i64::MIN);
    let mut timeline = Vec::new();
    let mut last_tick = None;
    for batch in omen_sources::trace_file::batches(trace)? {
        let batch = batch?;
        samples += batch.len();
        first = first.min(batch[0].ts_ms);
        last = last.max(batch[0].ts_ms);
        engine.process(batch)?;
        // The agent compacts sealed rows between batches whenever its queue is empty (a
        // live source leaves it idle between samples): the same here, so that the store
        // the replay reads and writes has the agent's shape.
        while engine.maintain()? {}
        if let Some(s) = summary.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            if last_tick != Some(s.ts_ms) {
                timeline.push((s.ts_ms, s.health_score));
                last_tick = Some(s.ts_ms);
            }
        }
    }
    if samples == 0 {
        anyhow::bail!("{} holds no samples", trace.display());
    }
    let final_summary = engine.tick(last)?;
    let (day_from, day_until) = (first.div_euclid(omen_store::DAY_MS) * omen_store::DAY_MS, last + 1);
    let mut forecasts = Vec::new();
    for f in &final_summary.forecasts {
        let daily = omen_agent::engine::daily_indicator(&store, f.indicator, day_from, day_until)?;
        forecasts.push(ForecastView::with_daily(f, final_summary.ts_ms, &daily));
    }
    let final_summary = Some(final_summary);
    Ok(ReplayReport {
        trace: trace.display().to_string(),
        samples,
        first_ts_ms: first,
        last_ts_ms: last,
        health_timeline: timeline,
        events: engine.events().to_vec(),
        final_summary,
        forecasts,
    })
}

/// A series' peak anomaly score, labels and points.
type Peak = (f64, BTreeMap<String, String>, Vec<(i64, f64)>);

fn plot(report: &ReplayReport, store: &Store, path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, (1200, 800)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(380);
    let (x0, x1) = (report.first_ts_ms as f64 / 3.6e6, report.last_ts_ms as f64 / 3.6e6 + 1e-9);
    let hours = |ms: i64| (ms as f64 / 3.6e6) - x0;

    let mut chart = ChartBuilder::on(&top)
        .caption("omen replay: health score and alerts", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..(x1 - x0), 0.0..1.0)?;
    chart.configure_mesh().x_desc("hours since trace start").y_desc("health score").draw()?;
    for (level, color) in [(0.6, RGBColor(230, 160, 0)), (0.8, RED)] {
        chart.draw_series(LineSeries::new([(0.0, level), (x1 - x0, level)], color.stroke_width(1)))?;
    }
    chart
        .draw_series(LineSeries::new(
            report.health_timeline.iter().map(|&(t, v)| (hours(t), v)),
            BLUE.stroke_width(2),
        ))?
        .label(catalogue::HEALTH_SCORE.name)
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLUE));
    for e in &report.events {
        let color = match e.level {
            Level::Ok => GREEN,
            Level::Warning => RGBColor(230, 160, 0),
            Level::Critical => RED,
        };
        chart.draw_series(std::iter::once(Circle::new((hours(e.ts_ms), 0.97), 5, color.filled())))?;
    }
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.8)).draw()?;

    // Anomaly scores of the series that peaked highest.
    let step = ((report.last_ts_ms - report.first_ts_ms) / 600).max(60_000);
    let mut peaks: Vec<Peak> = store
        .range(
            catalogue::ANOMALY_SCORE.name,
            &BTreeMap::new(),
            report.first_ts_ms,
            report.last_ts_ms + 1,
            step,
            Resolution::Raw,
        )?
        .into_iter()
        .map(|s| (s.points.iter().map(|p| p.1).fold(0.0, f64::max), s.labels, s.points))
        .collect();
    peaks.sort_by(|a, b| b.0.total_cmp(&a.0));
    peaks.truncate(5);
    let y_max = peaks.first().map_or(1.0, |p| p.0).max(1.0) * 1.05;
    let mut chart = ChartBuilder::on(&bottom)
        .caption("anomaly scores (top 5 series by peak)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..(x1 - x0), 0.0..y_max)?;
    chart.configure_mesh().x_desc("hours since trace start").y_desc("anomaly score").draw()?;
    for (i, (_, labels, points)) in peaks.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let name = labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
        chart
            .draw_series(LineSeries::new(points.iter().map(|&(t, v)| (hours(t), v)), color.stroke_width(1)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
    }
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.8)).draw()?;
    root.present().with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}
