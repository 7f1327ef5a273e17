//! The forecast of one SLO as a person reads it (`GET /scores/forecast?slo=`, and the
//! replay's forecast pictures): the daily indicator, the fitted trend with its interval,
//! the threshold, the predicted breach, and when the warning started; as JSON or SVG.

use plotters::prelude::*;
use serde::Serialize;

use crate::config::{Direction, SloIndicator, TrendScale};
use crate::engine::{FittedTrend, SloForecast, TrendPoint};

const DAY_MS: f64 = 86_400_000.0;

/// Days of trend drawn past the forecast's time at least, and at most.
const DRAWN_DAYS_MIN: f64 = omen_signals::EARLY_WARNING_DAYS;
const DRAWN_DAYS_MAX: f64 = 4.0 * omen_signals::EARLY_WARNING_DAYS;

/// One SLO's forecast with what it was fitted to.
#[derive(Debug, Clone, Serialize)]
pub struct ForecastView {
    /// SLO name.
    pub slo: String,
    /// The daily indicator.
    pub indicator: SloIndicator,
    /// The threshold the indicator must not cross.
    pub threshold: f64,
    /// Which side of the threshold is a breach.
    pub direction: Direction,
    /// The scale the trend was fitted on.
    pub scale: TrendScale,
    /// When the forecast was made (RFC 3339).
    pub as_of: String,
    /// The same, in days since the epoch.
    #[serde(skip)]
    pub now_day: f64,
    /// Days until the trend crosses the threshold; `None`: not forecast to breach.
    pub days_to_breach: Option<f64>,
    /// The far end of the interval; `None`: some trend in the interval never crosses.
    pub days_to_breach_upper: Option<f64>,
    /// The near end of the interval.
    pub days_to_breach_lower: Option<f64>,
    /// The predicted breach (RFC 3339).
    pub breach_at: Option<String>,
    /// The interval's far end (RFC 3339).
    pub breach_upper_at: Option<String>,
    /// Whether the SLO is under an early warning.
    pub early_warning: bool,
    /// The warning as it started, with the trend it was drawn from.
    pub warning: Option<WarningView>,
    /// The first day whose indicator is beyond the threshold, among `daily`.
    pub first_day_beyond: Option<String>,
    /// That day's midpoint, days since the epoch.
    #[serde(skip)]
    pub first_day_beyond_midpoint: Option<f64>,
    /// The daily indicator, oldest first.
    pub daily: Vec<DailyValue>,
    /// The current trend, one point a day from the start of the regime it was fitted to.
    pub trend: Vec<TrendDay>,
}

/// The early warning as it started.
#[derive(Debug, Clone, Serialize)]
pub struct WarningView {
    /// When it started (RFC 3339).
    pub since: String,
    /// The same, in days since the epoch.
    #[serde(skip)]
    pub since_day: f64,
    /// Days to breach it said.
    pub days_to_breach: Option<f64>,
    /// The interval's far end it said.
    pub days_to_breach_upper: Option<f64>,
    /// The interval's near end it said.
    pub days_to_breach_lower: Option<f64>,
    /// The breach it predicted (RFC 3339).
    pub breach_at: Option<String>,
    /// Its trend.
    pub trend: Vec<TrendDay>,
}

/// One day of the indicator.
#[derive(Debug, Clone, Serialize)]
pub struct DailyValue {
    /// The day (UTC, YYYY-MM-DD).
    pub date: String,
    /// The indicator's value.
    pub value: f64,
    /// The day's midpoint, days since the epoch (for plotting).
    #[serde(skip)]
    day: f64,
}

/// One day of a trend: the central line and the interval's lower and upper lines.
#[derive(Debug, Clone, Serialize)]
pub struct TrendDay {
    /// The day (UTC, YYYY-MM-DD).
    pub date: String,
    /// The central trend.
    pub central: Option<f64>,
    /// The interval's lower line.
    pub low: Option<f64>,
    /// The interval's upper line.
    pub high: Option<f64>,
    #[serde(skip)]
    point: TrendPoint,
}

fn date(day: f64) -> String {
    chrono::DateTime::from_timestamp_millis((day * DAY_MS) as i64)
        .map(|t| t.format("%Y-%m-%d").to_string())
        .unwrap_or_default()
}

fn rfc3339(day: f64) -> String {
    omen_sources::clock::rfc3339((day * DAY_MS).round() as i64).unwrap_or_default()
}

/// A finite number, or `None` (JSON has no infinity).
fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// The trend one point a day (day midpoints) from the start of its regime until `until_day`.
fn trend_days(trend: &FittedTrend, until_day: f64) -> Vec<TrendDay> {
    let mut out = Vec::new();
    let mut day = trend.from_day;
    while day <= until_day + 1e-9 && out.len() < 1_000 {
        let point = trend.at(day);
        out.push(TrendDay {
            date: date(day),
            central: finite(point.central),
            low: finite(point.low),
            high: finite(point.high),
            point,
        });
        day += 1.0;
    }
    out
}

/// How far past its time a trend is drawn: to its interval's far end (or its central
/// breach), at least [`DRAWN_DAYS_MIN`] and at most [`DRAWN_DAYS_MAX`] days.
fn drawn_until(now_day: f64, central: Option<f64>, upper: Option<f64>) -> f64 {
    now_day + upper.or(central).unwrap_or(0.0).clamp(DRAWN_DAYS_MIN, DRAWN_DAYS_MAX)
}

impl ForecastView {
    /// The view of `f` over its own daily values (the forecast's lookback).
    pub fn of(f: &SloForecast, as_of_ms: i64) -> Self {
        Self::with_daily(f, as_of_ms, &f.daily)
    }

    /// The view of `f` over `daily` ((day midpoint, value) oldest first), e.g. a whole trace.
    pub fn with_daily(f: &SloForecast, as_of_ms: i64, daily: &[(f64, f64)]) -> Self {
        let now_day = as_of_ms as f64 / DAY_MS;
        let beyond = |v: f64| match f.direction {
            Direction::Above => v > f.threshold,
            Direction::Below => v < f.threshold,
        };
        let first_beyond = daily.iter().find(|d| beyond(d.1)).map(|d| d.0);
        let warning = f.warned.as_ref().map(|w| {
            let since_day = w.since_ms as f64 / DAY_MS;
            WarningView {
                since: rfc3339(since_day),
                since_day,
                days_to_breach: w.days_to_breach,
                days_to_breach_upper: w.days_to_breach_upper,
                days_to_breach_lower: w.days_to_breach_lower,
                breach_at: w.days_to_breach.map(|d| rfc3339(since_day + d)),
                trend: w.trend.as_ref().map_or_else(Vec::new, |t| {
                    trend_days(t, drawn_until(since_day, w.days_to_breach, w.days_to_breach_upper))
                }),
            }
        });
        Self {
            slo: f.slo.clone(),
            indicator: f.indicator,
            threshold: f.threshold,
            direction: f.direction,
            scale: f.scale,
            as_of: rfc3339(now_day),
            now_day,
            days_to_breach: f.days_to_breach,
            days_to_breach_upper: f.days_to_breach_upper,
            days_to_breach_lower: f.days_to_breach_lower,
            breach_at: f.days_to_breach.map(|d| rfc3339(now_day + d)),
            breach_upper_at: f.days_to_breach_upper.map(|d| rfc3339(now_day + d)),
            early_warning: f.early_warning,
            warning,
            first_day_beyond: first_beyond.map(date),
            first_day_beyond_midpoint: first_beyond,
            daily: daily.iter().map(|&(day, value)| DailyValue { date: date(day), value, day }).collect(),
            trend: f.trend.as_ref().map_or_else(Vec::new, |t| {
                trend_days(t, drawn_until(now_day, f.days_to_breach, f.days_to_breach_upper))
            }),
        }
    }

    /// The picture: the daily indicator, the threshold, the current trend with its interval,
    /// the trend the warning was drawn from, when it started and the breach it predicted.
    pub fn svg(&self) -> Result<String, String> {
        let mut out = String::new();
        self.draw(&mut out).map_err(|e| format!("cannot draw the forecast of {}: {e}", self.slo))?;
        Ok(out)
    }

    fn draw(&self, out: &mut String) -> Result<(), Box<dyn std::error::Error + '_>> {
        let warned_day = self.warning.as_ref().map(|w| w.since_day);
        let predicted_day = self
            .warning
            .as_ref()
            .and_then(|w| w.days_to_breach.map(|d| w.since_day + d))
            .or(self.days_to_breach.map(|d| self.now_day + d));
        let days = self.daily.iter().map(|d| d.day);
        let trend_points =
            self.trend.iter().chain(self.warning.iter().flat_map(|w| &w.trend)).map(|t| t.point);
        let xs: Vec<f64> =
            days.chain(trend_points.clone().map(|p| p.day)).chain(warned_day).chain(predicted_day).collect();
        let (x0, x1) = bounds(&xs).unwrap_or((0.0, 1.0));
        // The y range holds the data and the threshold; the trend's interval may leave it.
        let ys: Vec<f64> = self.daily.iter().map(|d| d.value).chain([self.threshold]).collect();
        let (lo, hi) = bounds(&ys).unwrap_or((0.0, 1.0));
        let pad = ((hi - lo) * 0.15).max(hi.abs() * 0.02).max(1e-9);
        let (y0, y1) = (lo - pad, hi + pad);
        let clip = |v: f64| if v.is_nan() { y1 } else { v.clamp(y0, y1) };

        let root = SVGBackend::with_string(out, (1000, 460)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut title = format!(
            "{}: daily {} against {} {}",
            self.slo,
            indicator_name(self.indicator),
            direction_word(self.direction),
            self.threshold
        );
        if let Some(w) = &self.warning {
            title += &format!(
                " | warned {} ({} days to breach)",
                &w.since[..10.min(w.since.len())],
                w.days_to_breach.map_or("?".into(), |d| format!("{d:.1}"))
            );
        }
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(x0 - 0.5..x1 + 0.5, y0..y1)?;
        chart
            .configure_mesh()
            .x_desc("day (UTC)")
            .y_desc(indicator_name(self.indicator))
            .x_label_formatter(&|d| date(*d)[5..].to_string())
            .draw()?;

        // The current trend's interval as a band, its central line, then the warning's line.
        if !self.trend.is_empty() {
            let band: Vec<(f64, f64)> = self
                .trend
                .iter()
                .map(|t| (t.point.day, clip(t.point.low)))
                .chain(self.trend.iter().rev().map(|t| (t.point.day, clip(t.point.high))))
                .collect();
            chart
                .draw_series(std::iter::once(Polygon::new(band, BLUE.mix(0.12).filled())))?
                .label("trend interval (now)")
                .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], BLUE.mix(0.12).filled()));
            chart
                .draw_series(LineSeries::new(
                    self.trend.iter().map(|t| (t.point.day, clip(t.point.central))),
                    BLUE.stroke_width(2),
                ))?
                .label("trend (now)")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLUE.stroke_width(2)));
        }
        let orange = RGBColor(230, 130, 0);
        if let Some(w) = self.warning.as_ref().filter(|w| !w.trend.is_empty()) {
            chart
                .draw_series(DashedLineSeries::new(
                    w.trend.iter().map(|t| (t.point.day, clip(t.point.central))),
                    6,
                    4,
                    orange.stroke_width(2),
                ))?
                .label("trend when the warning started")
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], orange.stroke_width(2)));
        }
        chart
            .draw_series(DashedLineSeries::new(
                [(x0 - 0.5, self.threshold), (x1 + 0.5, self.threshold)],
                8,
                6,
                RED.stroke_width(1),
            ))?
            .label(format!("threshold {}", self.threshold))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], RED));
        chart
            .draw_series(LineSeries::new(self.daily.iter().map(|d| (d.day, d.value)), BLACK.mix(0.6)))?
            .label("daily indicator")
            .legend(|(x, y)| Circle::new((x + 8, y), 3, BLACK.filled()));
        chart.draw_series(self.daily.iter().map(|d| Circle::new((d.day, d.value), 3, BLACK.filled())))?;
        if let Some(day) = warned_day {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    [(day, y0), (day, y1)],
                    orange.stroke_width(2),
                )))?
                .label("warning started")
                .legend(move |(x, y)| {
                    PathElement::new([(x + 8, y - 6), (x + 8, y + 6)], orange.stroke_width(2))
                });
        }
        // The breach's interval as a bar on the threshold: the warning's, else the current one.
        let (base, lower, upper) = match &self.warning {
            Some(w) => (w.since_day, w.days_to_breach_lower, w.days_to_breach_upper),
            None => (self.now_day, self.days_to_breach_lower, self.days_to_breach_upper),
        };
        if let Some(lo) = lower {
            let hi = upper.unwrap_or(DRAWN_DAYS_MAX);
            let bar = [(base + lo, self.threshold), (base + hi, self.threshold)];
            chart
                .draw_series(std::iter::once(PathElement::new(bar, RED.mix(0.6).stroke_width(6))))?
                .label("breach interval")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], RED.mix(0.6).stroke_width(6)));
        }
        if let Some(day) = predicted_day {
            chart
                .draw_series(std::iter::once(Cross::new((day, self.threshold), 8, RED.stroke_width(3))))?
                .label("predicted breach")
                .legend(|(x, y)| Cross::new((x + 8, y), 5, RED.stroke_width(2)));
        }
        if let Some(day) = self.first_day_beyond_midpoint {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    [(day, y0), (day, y1)],
                    RED.mix(0.5).stroke_width(2),
                )))?
                .label("first day beyond the threshold")
                .legend(|(x, y)| {
                    PathElement::new([(x + 8, y - 6), (x + 8, y + 6)], RED.mix(0.5).stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.85))
            .draw()?;
        root.present()?;
        Ok(())
    }
}

/// The smallest and largest finite value.
fn bounds(v: &[f64]) -> Option<(f64, f64)> {
    let finite = v.iter().copied().filter(|x| x.is_finite());
    let lo = finite.clone().reduce(f64::min)?;
    let hi = finite.reduce(f64::max)?;
    Some((lo, hi))
}

fn indicator_name(i: SloIndicator) -> &'static str {
    match i {
        SloIndicator::TtftP99 => "TTFT p99 (s)",
        SloIndicator::KvUsage => "KV usage p95",
        SloIndicator::Kvf => "KVF p95",
        SloIndicator::VramHeadroom => "VRAM headroom (min)",
        SloIndicator::Rci => "RCI (mean)",
    }
}

fn direction_word(d: Direction) -> &'static str {
    match d {
        Direction::Above => "upper limit",
        Direction::Below => "lower limit",
    }
}
