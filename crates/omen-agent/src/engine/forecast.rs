//! SLO forecasts: each indicator's daily values (the worst of a trailing window of days),
//! a Theil-Sen trend on the SLO's scale, the days until it crosses the threshold, and the
//! early warnings those give; plus the indicator definitions the simulator shares.

use std::collections::BTreeMap;

use anyhow::Result;
use omen_signals::{
    breach_interval, catalogue, current_regime_start, days_to_breach, reset_cycle, residual_scale, theil_sen,
    trailing_worst, BreachDirection, WeeklyProfile, REGIME_MIN_SIDE, WARNING_MARGIN_DAYS,
};
use omen_sources::Sample;
use serde::{Deserialize, Serialize};

use super::{to_labels, AlertEvent, Engine, Level};
use crate::config::{Direction, SloConfig, SloIndicator, TrendScale};
use omen_signals::HOUR_MS;
use omen_store::{Resolution, DAY_MS};

/// The Theil-Sen fit of the last `recent` of the days `x`, `y` when its slope interval lies
/// wholly beyond that of `all`, their fit over every day, towards the breach (both at
/// `confidence`). Asked of today and of the day before, it fires in 0.31% of forecasts of
/// series without acceleration (a line plus Gaussian, Student-t(3) or weekly-dipping
/// noise, 14 to 28 days; scripts/forecast-null-sims.py), against 1.3% for today alone.
fn recent_acceleration(
    x: &[f64],
    y: &[f64],
    all: &omen_signals::TheilSen,
    recent: usize,
    confidence: f64,
    direction: BreachDirection,
) -> Option<omen_signals::TheilSen> {
    let n = x.len();
    let r = theil_sen(&x[n - recent..], &y[n - recent..], confidence).ok()?;
    let steeper = match direction {
        BreachDirection::Above => r.low_slope > all.high_slope,
        BreachDirection::Below => r.high_slope < all.low_slope,
    };
    steeper.then_some(r)
}

/// Store meta key of the SLOs under an early warning (JSON: SLO name -> [`WarnedForecast`]).
pub const WARNINGS_META_KEY: &str = "forecast_warnings";

/// The exported time to breach is in seconds (Prometheus' base unit); forecasts count days.
const SECONDS_PER_DAY: f64 = 86_400.0;

/// Forecast of one SLO.
#[derive(Debug, Clone, Serialize)]
pub struct SloForecast {
    /// SLO name.
    pub slo: String,
    /// The daily indicator.
    pub indicator: SloIndicator,
    /// Threshold.
    pub threshold: f64,
    /// Which side of the threshold is a breach.
    pub direction: Direction,
    /// Days of data the trend used.
    pub days: usize,
    /// Latest point the trend used: the worst daily value of the last `worst_of_days` days.
    pub latest: Option<f64>,
    /// Trend slope per day, in the indicator's units (linear scale), ln units (log scale) or
    /// 1/units (reciprocal scale: negative while the indicator rises).
    pub slope_per_day: Option<f64>,
    /// The scale the trend was fitted on.
    pub scale: TrendScale,
    /// Days until breach (None: not forecast to breach).
    pub days_to_breach: Option<f64>,
    /// Far end of the interval.
    pub days_to_breach_upper: Option<f64>,
    /// Near end of the interval.
    pub days_to_breach_lower: Option<f64>,
    /// Early warning: the breach is within the lead (`horizon_days`) and the whole slope
    /// interval points towards it.
    pub early_warning: bool,
    /// The trend follows the last `forecast.recent_days`, which move towards the breach
    /// significantly faster than the regime's line (an accelerating drift).
    pub accelerating: bool,
    /// Days until the next reset when the indicator is reset regularly (a leak that
    /// periodic restarts free, see `omen_signals::reset_cycle`); a breach forecast beyond
    /// it (plus a day) does not warn. `None` without such resets, or once one is overdue.
    pub reset_expected_in_days: Option<f64>,
    /// The onset (Unix ms) of a lasting shift away from the breach that came after the
    /// trend's regime began and took the indicator back past the regime's median (a restart
    /// that frees a leak): the trend follows a regime that has ended, so the early warning
    /// it would give waits until the regime split sees the shift. `None` otherwise.
    pub warning_held_by_shift_ms: Option<i64>,
    /// The current early warning: when it started and what it said then; `None` without one.
    pub warned: Option<WarnedForecast>,
    /// The daily indicator the trend was fitted to: (day midpoint in days since the epoch,
    /// value), oldest first, the whole lookback (the days before the regime included).
    #[serde(skip)]
    pub daily: Vec<(f64, f64)>,
    /// The fitted trend, to draw it; `None` before `min_days` days.
    #[serde(skip)]
    pub trend: Option<FittedTrend>,
}

impl SloForecast {
    /// The next regular reset is expected before the breach (plus the warning's margin):
    /// the breach will not come, so no warning starts and a standing one ends at once.
    fn reset_comes_first(&self) -> bool {
        self.reset_expected_in_days
            .zip(self.days_to_breach)
            .is_some_and(|(next, d)| d > next + WARNING_MARGIN_DAYS)
    }
}

/// A reset later than this many typical cycles is overdue: the resets may have stopped, and
/// the forecast no longer counts on the next one.
const RESET_OVERDUE: f64 = 1.25;

/// What an SLO's forecast takes from its daily values alone, apart from the time it is
/// made: the days the trend uses, the fitted trend and the reset rhythm.
#[derive(Debug, Clone)]
pub(super) struct SloFit {
    /// Days the trend uses: the current regime's (its last `recent_days` when accelerating).
    days: usize,
    /// The latest trailing-worst day.
    latest: Option<f64>,
    /// The regular resets: (typical cycle, day of the last reset).
    resets: Option<(f64, f64)>,
    /// The trend; `None` before `min_days` days or when no line can be fitted.
    trend: Option<TrendFit>,
}

/// A fitted trend and what the breach is read against.
#[derive(Debug, Clone, Copy)]
struct TrendFit {
    /// The line (of the regime, or of its last days when accelerating).
    fit: omen_signals::TheilSen,
    /// First day (midpoint) the line was fitted to.
    from_day: f64,
    /// The days' scatter around the line (robust, trend scale).
    scatter: f64,
    /// The worst weekday's offset on the trend scale (0 without a weekly profile).
    worst_weekday_offset: f64,
    /// The line follows the last `recent_days`.
    accelerating: bool,
    /// The weekly profile taken off the days before the fit, if any.
    profile: Option<WeeklyProfile>,
}

impl TrendFit {
    /// The line's value at its median day (trend scale) as a day on `day`'s weekday reads
    /// it: with that weekday's offset in the regime's weekly profile (none in a regime
    /// younger than two weeks: the lookback's profile would take a weekly restart's
    /// sawtooth for the week's shape and excuse the restart).
    fn middle_on(&self, day: f64) -> f64 {
        self.fit.y_median + self.profile.map_or(0.0, |p| p.offset_on(day))
    }
}

impl SloFit {
    /// The fit of `slo` to its daily indicator `raw` (day midpoint, value; oldest first).
    fn of(f: &crate::config::ForecastConfig, slo: &SloConfig, raw: &[(f64, f64)]) -> Self {
        let worst_of = f.worst_of_days.max(1);
        let direction = slo.breach_direction();
        let y_raw: Vec<f64> = raw.iter().map(|d| d.1).collect();
        let daily: Vec<(f64, f64)> = raw[raw.len().min(worst_of - 1)..]
            .iter()
            .map(|d| d.0)
            .zip(trailing_worst(&y_raw, worst_of, direction))
            .collect();
        let scale = slo.trend_scale();
        let mut out =
            SloFit { days: daily.len(), latest: daily.last().map(|d| d.1), resets: None, trend: None };
        // On a log or reciprocal scale, non-positive days (a latency of 0 is a broken probe)
        // are left out; 1/x falls as x rises, so on the reciprocal scale the breach
        // direction flips.
        let points: Vec<(f64, f64)> = daily
            .into_iter()
            .filter(|d| scale == TrendScale::Linear || d.1 > 0.0)
            .map(|(x, y)| (x, scale.apply(y)))
            .collect();
        let direction = scale.direction(direction);
        let (mut x, mut y): (Vec<f64>, Vec<f64>) = points.into_iter().unzip();
        // Regular resets (restarts freeing a leak) are read from the whole lookback.
        out.resets = if f.regimes { reset_cycle(&x, &y, direction) } else { None };
        // The current regime only: the days before a significant level shift are left
        // out, and a new regime is forecast once it has min_days of its own.
        if f.regimes {
            let start = current_regime_start(&x, &y);
            x.drain(..start);
            y.drain(..start);
        }
        out.days = x.len();
        if x.len() < f.min_days {
            return out;
        }
        // The trend of the series less its weekly cycle; the breach on its worst weekday.
        let mut worst_weekday_offset = 0.0;
        let profile = if f.weekly_profile { WeeklyProfile::of(&x, &y) } else { None };
        if let Some(profile) = profile {
            y = profile.adjust(&x, &y);
            worst_weekday_offset = profile.worst(direction);
        }
        let Ok(mut fit) = theil_sen(&x, &y, f.confidence) else {
            return out;
        };
        // A trend that bends towards the breach: when the last recent_days move
        // significantly faster towards it than the regime's line, today and the
        // day before, the forecast follows them (a line over the regime lags an
        // accelerating drift or a queueing knee).
        let mut from = 0;
        let mut accelerating = false;
        let recent = f.recent_days;
        if recent >= 3 && x.len() > recent + 1 {
            let n = x.len();
            let today = recent_acceleration(&x, &y, &fit, recent, f.confidence, direction);
            let day_before = || {
                let (x, y) = (&x[..n - 1], &y[..n - 1]);
                let all = theil_sen(x, y, f.confidence).ok()?;
                recent_acceleration(x, y, &all, recent, f.confidence, direction)
            };
            if let Some(r) = today.filter(|_| day_before().is_some()) {
                (fit, from) = (r, n - recent);
                accelerating = true;
            }
        }
        let (x, y) = (&x[from..], &y[from..]);
        out.days = x.len();
        // The interval a user reads: the slope interval with the scatter of the days
        // around the trend, at the same confidence.
        let scatter = residual_scale(&fit, x, y);
        out.trend =
            Some(TrendFit { fit, from_day: x[0], scatter, worst_weekday_offset, accelerating, profile });
        out
    }

    /// The forecast this fit gives at `now_ms`; `raw` is the daily indicator it was fitted to.
    fn forecast_at(
        &self,
        f: &crate::config::ForecastConfig,
        slo: &SloConfig,
        raw: Vec<(f64, f64)>,
        now_ms: i64,
    ) -> SloForecast {
        let scale = slo.trend_scale();
        let mut fc = SloForecast {
            slo: slo.name.clone(),
            indicator: slo.indicator,
            threshold: slo.threshold,
            direction: slo.direction,
            days: self.days,
            latest: self.latest,
            slope_per_day: None,
            scale,
            days_to_breach: None,
            days_to_breach_upper: None,
            days_to_breach_lower: None,
            early_warning: false,
            accelerating: false,
            reset_expected_in_days: None,
            warning_held_by_shift_ms: None,
            warned: None,
            daily: raw,
            trend: None,
        };
        let Some(t) = &self.trend else {
            return fc;
        };
        let threshold = scale.apply(slo.threshold) - t.worst_weekday_offset;
        let direction = scale.direction(slo.breach_direction());
        let now_day = now_ms as f64 / DAY_MS as f64;
        let b = days_to_breach(&t.fit, now_day, threshold, direction);
        fc.accelerating = t.accelerating;
        fc.slope_per_day = Some(t.fit.slope);
        fc.days_to_breach = b.days_to_breach;
        let (lower, upper) = breach_interval(&t.fit, t.scatter, f.confidence, now_day, threshold, direction);
        fc.days_to_breach_lower = lower;
        fc.days_to_breach_upper = b.latest_days.and(upper);
        fc.early_warning = b.warns(f.horizon_days);
        // A breach that the next regular reset would come before is no breach,
        // while the resets keep their rhythm (not overdue).
        if let Some((cycle, reset_day)) = self.resets {
            let age = now_day - reset_day;
            if age <= RESET_OVERDUE * cycle {
                let next = (cycle - age).max(0.0);
                fc.reset_expected_in_days = Some(next);
                if fc.reset_comes_first() {
                    fc.early_warning = false;
                }
            }
        }
        fc.trend = Some(FittedTrend {
            from_day: t.from_day,
            now_day,
            x_median: t.fit.x_median,
            y_median: t.fit.y_median,
            slope: t.fit.slope,
            low_slope: t.fit.low_slope,
            high_slope: t.fit.high_slope,
            worst_weekday_offset: t.worst_weekday_offset,
            scale,
        });
        fc
    }
}

/// An early warning as it stood when it started. Kept in the store (meta
/// [`WARNINGS_META_KEY`]) so that a restarted agent goes on with the same warning: its start
/// and what it said then, without the trend line it was drawn from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WarnedForecast {
    /// When the warning started, Unix ms.
    pub since_ms: i64,
    /// The days to breach it said then.
    pub days_to_breach: Option<f64>,
    /// The far end of its interval then.
    pub days_to_breach_upper: Option<f64>,
    /// The near end of its interval then.
    pub days_to_breach_lower: Option<f64>,
    /// When the forecast last warned, Unix ms (`None`: at `since_ms`); the warning ends
    /// `forecast.keep_warning_days` after it.
    #[serde(default)]
    pub last_warned_ms: Option<i64>,
    /// The trend it was drawn from.
    #[serde(skip)]
    pub trend: Option<FittedTrend>,
}

/// A forecast's trend, enough to draw it: the line on the trend scale through
/// (`x_median`, `y_median`) with the central slope and the interval's two ends, shifted to
/// the worst weekday when a weekly profile was used. Days count since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FittedTrend {
    /// First day (midpoint) of the regime the line was fitted to.
    pub from_day: f64,
    /// The day the forecast was made (the tick's time, in days).
    pub now_day: f64,
    /// The point every slope of the interval passes through (trend scale).
    pub x_median: f64,
    /// See `x_median`.
    pub y_median: f64,
    /// Central slope per day (trend scale).
    pub slope: f64,
    /// The interval's ends (trend scale).
    pub low_slope: f64,
    /// See `low_slope`.
    pub high_slope: f64,
    /// The worst weekday's offset added to the line (trend scale; 0 without a profile).
    pub worst_weekday_offset: f64,
    /// The scale of the line.
    pub scale: TrendScale,
}

impl FittedTrend {
    /// The worst-weekday trend at `day` in the indicator's units: the central line and the
    /// lowest and highest of the interval's lines (low <= central <= high).
    pub fn at(&self, day: f64) -> TrendPoint {
        let on_scale = |slope: f64| {
            let t = self.y_median + slope * (day - self.x_median) + self.worst_weekday_offset;
            // 1/x at or below 0 is beyond every value of x: the line has passed infinity.
            if self.scale == TrendScale::Reciprocal && t <= 0.0 {
                f64::INFINITY
            } else {
                self.scale.invert(t)
            }
        };
        let central = on_scale(self.slope);
        let [a, b] = [self.low_slope, self.high_slope].map(on_scale);
        TrendPoint { day, central, low: a.min(b).min(central), high: a.max(b).max(central) }
    }
}

/// One day of a drawn trend, in the indicator's units.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TrendPoint {
    /// Days since the epoch.
    pub day: f64,
    /// The central line.
    pub central: f64,
    /// The interval's lower line.
    pub low: f64,
    /// The interval's upper line.
    pub high: f64,
}

impl Engine {
    /// The forecast of every configured SLO from the complete days before `now_ms`. The
    /// fit of an SLO is kept while its daily values stay the same (they change once a day),
    /// so a tick refits only what a new day changed and moves the rest to `now_ms`.
    pub(super) fn forecasts(&mut self, now_ms: i64) -> Result<Vec<SloForecast>> {
        let cfg = self.cfg.clone();
        let f = &cfg.forecast;
        let today = now_ms.div_euclid(DAY_MS) * DAY_MS;
        let worst_of = f.worst_of_days.max(1);
        // Earlier days feed the first trailing windows, so the trend still spans lookback_days.
        let from = today - (f.lookback_days + worst_of - 1) as i64 * DAY_MS;
        let mut out = Vec::new();
        for slo in &f.slos {
            let raw = self.daily_indicator(slo, from, today)?;
            let fit = match self.fit_cache.get(&slo.name) {
                Some((days, fit)) if *days == raw => fit.clone(),
                _ => {
                    let fit = SloFit::of(f, slo, &raw);
                    self.fit_cache.insert(slo.name.clone(), (raw.clone(), fit.clone()));
                    fit
                }
            };
            let mut fc = fit.forecast_at(f, slo, raw, now_ms);
            // Only a warning about to start is held: one already standing goes on until
            // its forecast ends it.
            if fc.early_warning && !self.warnings.contains_key(&slo.name) {
                if let Some(onset_ms) = self.unfitted_reset(slo, &fit, now_ms)? {
                    fc.early_warning = false;
                    fc.warning_held_by_shift_ms = Some(onset_ms);
                }
            }
            out.push(fc);
        }
        Ok(out)
    }

    /// The onset of a lasting shift of `slo`'s indicator away from the breach that `fit`'s
    /// trend does not know about, if it took the indicator back past the trend's median day
    /// as the shift's weekday reads it ([`TrendFit::middle_on`]; see
    /// [`SloForecast::warning_held_by_shift_ms`]). A shift counts from its regime's
    /// start until the regime split can see it ([`REGIME_MIN_SIDE`] complete days after its
    /// day, plus `worst_of_days - 1`). The indicator since the onset (its last day at most,
    /// from minute aggregates) is read at most once an hour, and only while a warning would
    /// start.
    fn unfitted_reset(&mut self, slo: &SloConfig, fit: &SloFit, now_ms: i64) -> Result<Option<i64>> {
        // Without regimes no split would ever take the shift in: holding would only delay.
        let (Some(trend), true) = (&fit.trend, self.cfg.forecast.regimes) else {
            return Ok(None);
        };
        let def = IndicatorDefinition::of(slo.indicator);
        let (source, opposite) = shift_source(slo.indicator);
        let breach = slo.breach_direction();
        let away_is_up = (breach == BreachDirection::Below) != opposite;
        let onset = self.shift_onsets.get(source).and_then(|o| if away_is_up { o.up_ms } else { o.down_ms });
        let Some(onset_ms) = onset else {
            return Ok(None);
        };
        let today = now_ms.div_euclid(DAY_MS) * DAY_MS;
        let regime_start_ms = ((trend.from_day - 0.5) * DAY_MS as f64).round() as i64;
        // The split sees a shift once REGIME_MIN_SIDE daily values follow its day, and a
        // trailing worst of several days keeps the day before the shift that much longer.
        let blind_days = (REGIME_MIN_SIDE + self.cfg.forecast.worst_of_days.max(1) - 1) as i64;
        if onset_ms < regime_start_ms || onset_ms < today - blind_days * DAY_MS {
            return Ok(None);
        }
        let hour = now_ms.div_euclid(HOUR_MS);
        if let Some(&(checked_hour, checked_onset, undone)) = self.reset_checks.get(&slo.name) {
            if checked_hour == hour && checked_onset == onset_ms {
                return Ok(undone.then_some(onset_ms));
            }
        }
        let since = indicator_since(&self.store, def, onset_ms.max(now_ms - DAY_MS), now_ms)?;
        // A weekend dip is judged against the weekend's own level, not the week's.
        let middle = trend.middle_on(onset_ms as f64 / DAY_MS as f64);
        let scale = slo.trend_scale();
        let undone = since.is_some_and(|v| {
            if scale != TrendScale::Linear && v <= 0.0 {
                return false;
            }
            let v = scale.apply(v);
            match scale.direction(breach) {
                BreachDirection::Above => v < middle,
                BreachDirection::Below => v > middle,
            }
        });
        self.reset_checks.insert(slo.name.clone(), (hour, onset_ms, undone));
        Ok(undone.then_some(onset_ms))
    }

    /// Publishes each forecast's time to breach in seconds (withdrawn when not forecast), adds them to
    /// the tick's samples, records an alert event when an SLO's early warning changes, and
    /// attaches to each forecast the warning it is under.
    pub(super) fn publish_forecasts(
        &mut self,
        now_ms: i64,
        forecasts: &mut [SloForecast],
        out: &mut Vec<Sample>,
    ) {
        // Warnings of SLOs no longer configured (kept from an earlier run) end silently.
        let before = self.warnings.len();
        self.warnings.retain(|slo, _| forecasts.iter().any(|f| f.slo == *slo));
        let mut changed = self.warnings.len() != before;
        // A standing warning ends once the forecast has not warned for keep_warning_days:
        // a weekend's low days, read as the trend's latest, do not end it for two days.
        let keep_ms = (self.cfg.forecast.keep_warning_days * DAY_MS as f64) as i64;
        for f in forecasts.iter_mut() {
            let labels: BTreeMap<String, String> = [("slo".to_owned(), f.slo.clone())].into();
            for (name, value) in [
                (catalogue::FORECAST_TIME_TO_BREACH.name, f.days_to_breach),
                (catalogue::FORECAST_TIME_TO_BREACH_UPPER.name, f.days_to_breach_upper),
            ] {
                let value = value.map(|days| days * SECONDS_PER_DAY);
                match value {
                    Some(v) => {
                        self.live.set_gauge(name, to_labels(&labels), v);
                        out.push(Sample {
                            ts_ms: now_ms,
                            signal: name.into(),
                            labels: labels.clone(),
                            value: v,
                        });
                    }
                    None => self.live.remove_gauge(name, &to_labels(&labels)),
                }
            }
            let was = self.warnings.contains_key(&f.slo);
            let reset_first = f.reset_comes_first();
            let stands = match self.warnings.get_mut(&f.slo) {
                Some(w) if f.early_warning => {
                    // Kept hourly in the store, so that a restart keeps about the same end.
                    changed |= w.last_warned_ms.unwrap_or(w.since_ms) / HOUR_MS < now_ms / HOUR_MS;
                    w.last_warned_ms = Some(now_ms);
                    true
                }
                Some(w) => !reset_first && now_ms - w.last_warned_ms.unwrap_or(w.since_ms) < keep_ms,
                None => f.early_warning,
            };
            changed |= was != stands;
            if stands && !was {
                let warned = WarnedForecast {
                    since_ms: now_ms,
                    days_to_breach: f.days_to_breach,
                    days_to_breach_upper: f.days_to_breach_upper,
                    days_to_breach_lower: f.days_to_breach_lower,
                    last_warned_ms: Some(now_ms),
                    trend: f.trend,
                };
                self.warnings.insert(f.slo.clone(), warned);
            } else if !stands {
                self.warnings.remove(&f.slo);
            }
            f.warned = self.warnings.get(&f.slo).cloned();
            let (name, value) = (catalogue::FORECAST_EARLY_WARNING.name, if stands { 1.0 } else { 0.0 });
            self.live.set_gauge(name, to_labels(&labels), value);
            out.push(Sample { ts_ms: now_ms, signal: name.into(), labels: labels.clone(), value });
            if was != stands {
                self.events.push(AlertEvent {
                    ts_ms: now_ms,
                    alert: format!("forecast:{}", f.slo),
                    level: if stands { Level::Warning } else { Level::Ok },
                    reason: match f.days_to_breach {
                        Some(d) => format!("{} forecast to cross {} in {d:.1} days", f.slo, f.threshold),
                        None => format!("{} no longer forecast to breach", f.slo),
                    },
                    days_to_breach: f.days_to_breach,
                    days_to_breach_interval: f.days_to_breach_lower.zip(f.days_to_breach_upper),
                });
            }
        }
        if changed {
            self.persist_warnings();
        }
    }

    /// Writes the current warnings to the store; a failure is logged, and the next change
    /// tries again (the warnings themselves are unaffected).
    fn persist_warnings(&self) {
        let json = serde_json::to_string(&self.warnings).expect("warnings serialise");
        if let Err(e) = self.store.set_meta(WARNINGS_META_KEY, &json) {
            tracing::warn!(
                "cannot keep the early warnings in the store; a restart would start them anew: {e:#}"
            );
        }
    }

    /// (day midpoint in days since the epoch, indicator) for complete days in [from, until).
    ///
    /// Kept per indicator until the window moves or a day roll-up or retention changes the
    /// day aggregates: reading them costs a row per series and day (19,200 rows for 640
    /// layers over 30 days), which a tick would otherwise pay every minute for an answer
    /// that changes once a day.
    fn daily_indicator(&mut self, slo: &SloConfig, from_ms: i64, until_ms: i64) -> Result<Vec<(f64, f64)>> {
        let def = IndicatorDefinition::of(slo.indicator);
        let key = DailyKey { from_ms, until_ms, day_agg_generation: self.day_agg_generation };
        if let Some((cached_key, days)) = self.daily_cache.get(&def) {
            if *cached_key == key {
                return Ok(days.clone());
            }
        }
        let days = daily_indicator(&self.store, slo.indicator, from_ms, until_ms)?;
        self.daily_cache.insert(def, (key, days.clone()));
        Ok(days)
    }
}

/// `indicator`'s daily values from the store's day aggregates of the days in [from, until):
/// (day midpoint in days since the epoch, value), oldest first.
pub fn daily_indicator(
    store: &omen_store::Store,
    indicator: SloIndicator,
    from_ms: i64,
    until_ms: i64,
) -> Result<Vec<(f64, f64)>> {
    let def = IndicatorDefinition::of(indicator);
    let mut by_day: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
    for d in store.day_aggregates(def.signal, from_ms, until_ms)? {
        by_day.entry(d.day_ms).or_default().push(def.statistic.of_aggregate(&d));
    }
    Ok(by_day.into_iter().map(|(day, v)| (day as f64 / DAY_MS as f64 + 0.5, def.combine.apply(&v))).collect())
}

/// The newest lasting shift of one signal in each direction (its onset, Unix ms; any series).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ShiftOnsets {
    /// The newest shift up.
    pub(super) up_ms: Option<i64>,
    /// The newest shift down.
    pub(super) down_ms: Option<i64>,
}

/// The scored signal whose lasting shifts move `indicator`, and whether it moves opposite
/// to it: the headroom is derived from the GPU memory used, and only that is scored.
fn shift_source(indicator: SloIndicator) -> (&'static str, bool) {
    match indicator {
        SloIndicator::VramHeadroom => (catalogue::GPU_MEMORY_USED_BYTES.name, true),
        other => (IndicatorDefinition::of(other).signal, false),
    }
}

/// Series need this many minutes since a shift to say where the indicator stands.
const MIN_MINUTES_SINCE_SHIFT: usize = 30;

/// `def`'s statistic over [from, until) instead of a day, from minute aggregates (their
/// means, so a percentile reads a little low): each series with at least
/// [`MIN_MINUTES_SINCE_SHIFT`] minutes, combined as the days are; `None` without one.
fn indicator_since(
    store: &omen_store::Store,
    def: IndicatorDefinition,
    from_ms: i64,
    until_ms: i64,
) -> Result<Option<f64>> {
    let series = store.range(def.signal, &BTreeMap::new(), from_ms, until_ms, 60_000, Resolution::Minute)?;
    let per_series: Vec<f64> = series
        .into_iter()
        .filter(|s| s.points.len() >= MIN_MINUTES_SINCE_SHIFT)
        .map(|s| {
            let mut v: Vec<f64> = s.points.into_iter().map(|p| p.1).collect();
            v.sort_by(f64::total_cmp);
            def.statistic.of_sorted(&v)
        })
        .collect();
    Ok((!per_series.is_empty()).then(|| def.combine.apply(&per_series)))
}

/// What a cached daily indicator was read for (see [`Engine::daily_indicator`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DailyKey {
    from_ms: i64,
    until_ms: i64,
    day_agg_generation: u64,
}

/// How an SLO indicator is computed from stored samples: the one definition that the
/// forecasts and the simulator's breach labels (simulate.rs) share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IndicatorDefinition {
    /// The stored series it reads.
    pub signal: &'static str,
    /// Which daily statistic of each series.
    pub statistic: DailyStatistic,
    /// How the series of one day combine (max over layers, mean over canaries).
    pub combine: CombineSeries,
}

impl IndicatorDefinition {
    /// The definition of `indicator` (config.rs documents each).
    pub fn of(indicator: SloIndicator) -> Self {
        use CombineSeries::{Max, Mean, Min};
        let (signal, statistic, combine) = match indicator {
            SloIndicator::TtftP99 => (catalogue::CANARY_TTFT_SECONDS, DailyStatistic::P99, Max),
            SloIndicator::KvUsage => (catalogue::KVCACHE_USAGE_RATIO, DailyStatistic::P95, Max),
            SloIndicator::Kvf => (catalogue::KV_FRAGMENTATION, DailyStatistic::P95, Max),
            SloIndicator::VramHeadroom => (catalogue::GPU_MEMORY_HEADROOM_RATIO, DailyStatistic::Min, Min),
            SloIndicator::Rci => (catalogue::RCI, DailyStatistic::Mean, Mean),
        };
        Self { signal: signal.name, statistic, combine }
    }
}

/// A daily statistic of one series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DailyStatistic {
    /// 99th percentile.
    P99,
    /// 95th percentile.
    P95,
    /// Minimum.
    Min,
    /// Mean.
    Mean,
}

impl DailyStatistic {
    /// The statistic as the store's day aggregate holds it.
    pub fn of_aggregate(self, d: &omen_store::DayAggregate) -> f64 {
        match self {
            Self::P99 => d.p99,
            Self::P95 => d.p95,
            Self::Min => d.min,
            Self::Mean => d.mean,
        }
    }

    /// The statistic of one day's values, sorted ascending and not empty; the quantiles are
    /// numpy's linear ones, as the store's day aggregates compute them.
    pub fn of_sorted(self, sorted: &[f64]) -> f64 {
        match self {
            Self::P99 => omen_signals::quantile_linear(sorted, 0.99),
            Self::P95 => omen_signals::quantile_linear(sorted, 0.95),
            Self::Min => sorted[0],
            Self::Mean => sorted.iter().sum::<f64>() / sorted.len() as f64,
        }
    }
}

/// How the series of one day combine into the day's indicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CombineSeries {
    /// The highest (the worst layer or GPU).
    Max,
    /// The lowest (the least headroom).
    Min,
    /// The mean (over canaries).
    Mean,
}

impl CombineSeries {
    /// Combines one day's per-series statistics (not empty).
    pub fn apply(self, v: &[f64]) -> f64 {
        match self {
            Self::Max => v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            Self::Min => v.iter().copied().fold(f64::INFINITY, f64::min),
            Self::Mean => v.iter().sum::<f64>() / v.len() as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::engine;
    use super::super::Engine;
    use super::SloForecast;
    use super::{catalogue, AlertEvent, IndicatorDefinition, Level};
    use crate::config::{Direction, SloIndicator};

    #[test]
    fn every_indicator_reads_the_signal_the_catalogue_names() {
        for spelling in ["ttft_p99", "kv_usage", "kvf", "vram_headroom", "rci"] {
            let indicator: SloIndicator = serde_yaml::from_str(spelling).unwrap();
            let signal = catalogue::indicator_signal(spelling).unwrap();
            assert_eq!(IndicatorDefinition::of(indicator).signal, signal.name, "{spelling}");
        }
    }
    use crate::config::TrendScale;
    use omen_sources::Sample;
    use omen_store::DAY_MS;

    #[test]
    fn rising_kv_usage_gives_an_early_warning() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), "forecast: {min_days: 7, worst_of_days: 1}\n");
        let t0 = 1_793_577_600_000;
        // 12 days of KV usage rising 2.5 points a day from 0.55, hourly samples with a daily cycle
        for h in 0..(12 * 24) {
            let day = h as f64 / 24.0;
            let v = 0.55 + 0.025 * day + 0.02 * ((h % 24) as f64 / 24.0 * std::f64::consts::TAU).sin();
            let s = Sample {
                ts_ms: t0 + h * 3_600_000,
                signal: "kvcache_usage_ratio".into(),
                labels: [("layer".to_owned(), "0".to_owned())].into(),
                value: v,
            };
            e.process(vec![s]).unwrap();
        }
        let s = e.tick(t0 + 12 * DAY_MS).unwrap();
        let kv = s.forecasts.iter().find(|f| f.slo == "kv_usage").unwrap();
        assert_eq!(kv.days, 12, "{kv:?}");
        let d = kv.days_to_breach.unwrap();
        // p95 of a day is ~0.02 above its mean; the 0.95 line is crossed in about 3-6 days
        assert!(d > 2.0 && d < 8.0, "{kv:?}");
        assert!(kv.early_warning);
        // The warning keeps the forecast it started with (at an earlier tick, on fewer days,
        // predicting the same breach day); the view draws it over the days.
        let warned = kv.warned.as_ref().unwrap();
        assert!(warned.since_ms < t0 + 12 * DAY_MS && warned.trend.is_some(), "{warned:?}");
        let said_breach = warned.since_ms as f64 / DAY_MS as f64 + warned.days_to_breach.unwrap();
        assert!((said_breach - (12.0 + d + t0 as f64 / DAY_MS as f64)).abs() < 0.5, "{warned:?}");
        let trend = kv.trend.unwrap();
        let at_breach = trend.at(trend.now_day + d);
        assert!((at_breach.central - 0.95).abs() < 1e-9, "{at_breach:?}");
        assert!(at_breach.low <= at_breach.central && at_breach.central <= at_breach.high);
        let view = crate::forecast_view::ForecastView::of(kv, s.ts_ms);
        assert_eq!(view.daily.len(), 12);
        assert!(view.warning.as_ref().unwrap().since.starts_with("2026-11-"), "{view:?}");
        assert!(view.trend.len() >= 12 + 14, "from the first day to 14 days ahead: {}", view.trend.len());
        let svg = view.svg().unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("threshold 0.95") && svg.contains("warning started"));
        assert!(s.health_score >= 0.6);
        assert!(e.events().iter().any(|ev| ev.alert == "forecast:kv_usage"));
        // The day aggregates are read once per day: another tick of the day, and an
        // engine that starts afresh on the same store (a restart), give the same forecasts.
        let again = e.tick(t0 + 12 * DAY_MS).unwrap();
        let mut restarted = engine(dir.path(), "forecast: {min_days: 7, worst_of_days: 1}\n");
        let mut fresh = restarted.tick(t0 + 12 * DAY_MS).unwrap();
        assert_eq!(format!("{:?}", again.forecasts), format!("{:?}", s.forecasts));
        // The restarted engine goes on with the same warning, kept in the store: the same
        // start and what it said then (not its trend line), and no new alert event.
        let kept = fresh.forecasts.iter().find(|f| f.slo == "kv_usage").unwrap().warned.clone().unwrap();
        assert_eq!((kept.since_ms, kept.days_to_breach), (warned.since_ms, warned.days_to_breach));
        assert!(kept.trend.is_none());
        assert!(
            !restarted.events().iter().any(|ev| ev.alert == "forecast:kv_usage"),
            "{:?}",
            restarted.events()
        );
        let mut started_now = s.forecasts.clone();
        for f in started_now.iter_mut().chain(fresh.forecasts.iter_mut()) {
            f.warned = None;
        }
        assert_eq!(format!("{:?}", fresh.forecasts), format!("{:?}", started_now));
        let ttft = s.forecasts.iter().find(|f| f.slo == "ttft_p99").unwrap();
        assert!(ttft.days_to_breach.is_none() && !ttft.early_warning);
    }

    /// Daily p95 KV usage rising 0.01/day with a weekend dip of 0.15, over `days` days.
    fn weekly_kv_engine(dir: &std::path::Path, forecast: &str, days: i64) -> Engine {
        let mut e = engine(dir, forecast);
        // 2026-11-02 is a Monday.
        let t0 = 1_793_577_600_000;
        for h in 0..(days * 24) {
            let day = h / 24;
            let weekend = if day % 7 >= 5 { 0.15 } else { 0.0 };
            let v = 0.55 + 0.01 * day as f64 - weekend;
            let labels = [("layer".to_owned(), "0".to_owned())].into();
            let s =
                Sample { ts_ms: t0 + h * 3_600_000, signal: "kvcache_usage_ratio".into(), labels, value: v };
            e.process(vec![s]).unwrap();
        }
        e
    }

    #[test]
    fn a_weekly_profile_removes_a_weekly_dip_from_the_trend() {
        let t_end = 1_793_577_600_000 + 26 * DAY_MS;
        let dir = tempfile::tempdir().unwrap();
        let mut profiled = weekly_kv_engine(dir.path(), "forecast: {min_days: 7}\n", 26);
        let kv = profiled.tick(t_end).unwrap().forecasts.into_iter().find(|f| f.slo == "kv_usage").unwrap();
        // Every day counts once; less its weekend offset the series is the weekday line.
        assert_eq!(kv.days, 26, "{kv:?}");
        assert!((kv.slope_per_day.unwrap() - 0.01).abs() < 1e-9, "{kv:?}");
        // 0.95 on the worst weekday (a weekday): reached by the line at day 40, 14.5 days on.
        let d = kv.days_to_breach.unwrap();
        assert!((d - 14.5).abs() < 1e-6, "{kv:?}");
        // An exact line: the interval is the half day a daily breach falls in.
        assert!((kv.days_to_breach_upper.unwrap() - (d + 0.5)).abs() < 1e-6, "{kv:?}");
        assert!((kv.days_to_breach_lower.unwrap() - (d - 0.5)).abs() < 1e-6, "{kv:?}");
        assert!(kv.early_warning, "within 14 days plus the margin: {kv:?}");

        // The rule before it: the trend of the trailing 7-day worst day.
        let dir = tempfile::tempdir().unwrap();
        let trailing = "forecast: {min_days: 7, worst_of_days: 7, weekly_profile: false, regimes: false}\n";
        let mut worst = weekly_kv_engine(dir.path(), trailing, 26);
        let kv = worst.tick(t_end).unwrap().forecasts.into_iter().find(|f| f.slo == "kv_usage").unwrap();
        // 26 complete days give 20 trailing weekly maxima: the weekday line, slope 0.01.
        assert_eq!(kv.days, 20, "{kv:?}");
        assert!((kv.slope_per_day.unwrap() - 0.01).abs() < 1e-9, "{kv:?}");
        assert!((kv.latest.unwrap() - (0.55 + 0.01 * 25.0)).abs() < 1e-9, "{kv:?}");
        assert!((kv.days_to_breach.unwrap() - 15.0).abs() < 0.6, "{kv:?}");

        // Day by day without a profile, the weekends widen the slope interval.
        let dir = tempfile::tempdir().unwrap();
        let plain = "forecast: {min_days: 7, weekly_profile: false, regimes: false, recent_days: 0}\n";
        let mut daily = weekly_kv_engine(dir.path(), plain, 26);
        let kv = daily.tick(t_end).unwrap().forecasts.into_iter().find(|f| f.slo == "kv_usage").unwrap();
        let far = kv.days_to_breach_upper.unwrap_or(f64::INFINITY);
        assert!(far > d + 1.0, "{kv:?}");
    }

    #[test]
    fn a_level_step_starts_a_new_regime_and_does_not_warn() {
        // KV usage flat at 0.55, stepping to 0.75 on day 16 (a deploy), 24 days in all.
        let dir = tempfile::tempdir().unwrap();
        let e = |forecast: &str| {
            let mut e = engine(dir.path().join(forecast.len().to_string()).as_path(), forecast);
            let t0 = 1_793_577_600_000;
            for h in 0..(24 * 24) {
                let day = h / 24;
                let v = if day >= 16 { 0.75 } else { 0.55 } + 0.002 * ((h * 7919) % 13) as f64 / 13.0;
                let labels = [("layer".to_owned(), "0".to_owned())].into();
                let s = Sample {
                    ts_ms: t0 + h * 3_600_000,
                    signal: "kvcache_usage_ratio".into(),
                    labels,
                    value: v,
                };
                e.process(vec![s]).unwrap();
            }
            let s = e.tick(t0 + 24 * DAY_MS).unwrap();
            s.forecasts.into_iter().find(|f| f.slo == "kv_usage").unwrap()
        };
        std::fs::create_dir_all(dir.path()).unwrap();
        let kv = e("forecast: {min_days: 7}\n");
        // The 8 days since the step, flat: no breach ahead.
        assert_eq!(kv.days, 8, "{kv:?}");
        assert!(!kv.early_warning && kv.days_to_breach.is_none_or(|d| d > 30.0), "{kv:?}");
        // Fitted over the step, the line rises and warns.
        let kv = e("forecast: {min_days: 7, regimes: false}\n");
        assert_eq!(kv.days, 24, "{kv:?}");
        assert!(kv.slope_per_day.unwrap() > 0.005, "{kv:?}");
    }

    /// Feeds `hours` hourly samples of `signal{layer="0"}`, valued by `value(hour)`, from the
    /// start of 2026-11-02; returns that start (ms).
    fn feed_hourly(e: &mut Engine, signal: &str, hours: i64, value: impl Fn(i64) -> f64) -> i64 {
        let t0 = 1_793_577_600_000;
        for h in 0..hours {
            let labels = [("layer".to_owned(), "0".to_owned())].into();
            let s = Sample { ts_ms: t0 + h * 3_600_000, signal: signal.into(), labels, value: value(h) };
            e.process(vec![s]).unwrap();
        }
        t0
    }

    /// Hourly samples of `signal` from hour `hours.start` to `hours.end` (from t0, 2026-11-02).
    fn feed_hours(
        e: &mut Engine,
        signal: &str,
        labels: (&str, &str),
        hours: std::ops::Range<i64>,
        value: impl Fn(i64) -> f64,
    ) {
        let t0 = 1_793_577_600_000;
        for h in hours {
            let labels = [(labels.0.to_owned(), labels.1.to_owned())].into();
            let s = Sample { ts_ms: t0 + h * 3_600_000, signal: signal.into(), labels, value: value(h) };
            e.process(vec![s]).unwrap();
        }
    }

    /// A kept fit against a fresh one: an engine fed `days` days of `signal` ticks in the
    /// morning and evening of the next day, a new engine fed the same ticks in the evening
    /// only; then both get one more day (`value` of it raised by `next_day_step`) and tick.
    /// Each forecast of `slo` must be the same in both, and the kept one must move with the tick.
    fn kept_fit_agrees_with_a_fresh_one(
        forecast: &str,
        signal: &str,
        labels: (&str, &str),
        slo: &str,
        days: i64,
        value: impl Fn(i64) -> f64 + Copy,
        next_day_step: f64,
    ) -> serde_json::Value {
        let t0 = 1_793_577_600_000;
        let at = |e: &mut Engine, now: i64| {
            let mut f = e.tick(now).unwrap().forecasts.into_iter().find(|f| f.slo == slo).unwrap();
            // When the warning started differs between the engines by construction.
            f.warned = None;
            (serde_json::to_value(&f).unwrap(), f.trend, f.daily)
        };
        let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (mut kept, mut fresh) = (engine(dir_a.path(), forecast), engine(dir_b.path(), forecast));
        feed_hours(&mut kept, signal, labels, 0..days * 24, value);
        feed_hours(&mut fresh, signal, labels, 0..days * 24, value);
        let (morning, evening) = (t0 + days * DAY_MS + 3_600_000, t0 + days * DAY_MS + 13 * 3_600_000);
        let first = at(&mut kept, morning);
        let later = at(&mut kept, evening);
        assert!(later.1.is_some(), "{slo}: a trend is fitted");
        assert_eq!(later, at(&mut fresh, evening), "{slo}: the kept fit gives what a new fit gives");
        // The same fit half a day later: the same line, the breach half a day nearer.
        assert_eq!(first.1.unwrap().slope, later.1.unwrap().slope);
        if let (Some(a), Some(b)) = (first.0["days_to_breach"].as_f64(), later.0["days_to_breach"].as_f64()) {
            assert!((a - b - 0.5).abs() < 1e-9, "{slo}: {a} then {b}");
        }
        // A new day refits in both.
        for e in [&mut kept, &mut fresh] {
            feed_hours(e, signal, labels, days * 24..(days + 1) * 24, |h| value(h) + next_day_step);
        }
        let next_day = t0 + (days + 1) * DAY_MS + 3_600_000;
        let refitted = at(&mut kept, next_day);
        assert_ne!(refitted.1, later.1, "{slo}: the new day moved the trend");
        assert_eq!(refitted, at(&mut fresh, next_day), "{slo}: after a new day");
        later.0
    }

    #[test]
    fn a_kept_fit_forecasts_as_a_fresh_one_and_moves_with_the_tick() {
        // A linear trend with a daily cycle.
        kept_fit_agrees_with_a_fresh_one(
            "forecast: {min_days: 5, worst_of_days: 1}\n",
            "kvcache_usage_ratio",
            ("layer", "0"),
            "kv_usage",
            20,
            |h| 0.5 + 0.012 * (h as f64 / 24.0) + 0.01 * ((h % 24) as f64 / 24.0 * 6.3).sin(),
            0.05,
        );
        // Queueing latency on the reciprocal scale (the breach direction flips there).
        kept_fit_agrees_with_a_fresh_one(
            "forecast: {min_days: 7, slos: [{name: ttft_p99, indicator: ttft_p99, threshold: 2.0}]}\n",
            "canary_ttft_seconds",
            ("canary", "capital"),
            "ttft_p99",
            18,
            |h| 0.2 / (1.0 - (0.5 + 0.015 * (h / 24) as f64)),
            0.3,
        );
        // A leak that weekly restarts reset: the reset rhythm and its age.
        let restarted = kept_fit_agrees_with_a_fresh_one(
            "forecast: {min_days: 5, worst_of_days: 1}\n",
            "kvcache_usage_ratio",
            ("layer", "0"),
            "kv_usage",
            26,
            |h| 0.55 + 0.035 * ((h / 24) % 7) as f64 + 0.035 * (h % 24) as f64 / 24.0,
            0.05,
        );
        assert!(restarted["reset_expected_in_days"].is_number(), "the resets were seen: {restarted}");
    }

    /// KV usage rising 3.5 points a day and reset by a restart every 7 days while
    /// `restarts_until` (days) lasts, hourly samples with a daily cycle, for `days` days;
    /// the forecast of the tick at the end. The restart on day 21 resets to 0.62, the earlier
    /// ones to 0.55, so that the latest reset is the largest step and the current regime is
    /// the last cycle alone (as in the vram-leak-restarts trap, where the line of one cycle
    /// is what warned).
    fn restarted_leak_forecast(days: i64, restarts_until: i64) -> SloForecast {
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), "forecast: {min_days: 5, worst_of_days: 1}\n");
        let t0 = feed_hourly(&mut e, "kvcache_usage_ratio", days * 24, |h| {
            let day = h / 24;
            let since_reset = if day < restarts_until { day % 7 } else { day - (restarts_until - 1) / 7 * 7 };
            let base = if day >= 21 { 0.62 } else { 0.55 };
            base + 0.035 * (since_reset as f64 + (h % 24) as f64 / 24.0)
                + 0.01 * ((h % 24) as f64 / 24.0 * std::f64::consts::TAU).sin()
        });
        let s = e.tick(t0 + days * DAY_MS).unwrap();
        s.forecasts.into_iter().find(|f| f.slo == "kv_usage").unwrap()
    }

    #[test]
    fn a_leak_that_weekly_restarts_free_is_not_warned_until_the_restarts_stop() {
        // The last day of the fourth cycle: the line of this week would cross 0.95 in a few
        // days, but the restart is due tomorrow.
        let kv = restarted_leak_forecast(28, 28);
        assert!(kv.days_to_breach.is_some_and(|d| d < 14.0), "{kv:?}");
        let next = kv.reset_expected_in_days.unwrap_or_else(|| panic!("{kv:?}"));
        assert!(next <= 1.0, "{kv:?}");
        assert!(!kv.early_warning, "{kv:?}");
        // The restart due on day 28 does not come: once it is overdue (past 1.25 cycles) the
        // leak is forecast as any other, and warned.
        let kv = restarted_leak_forecast(31, 28);
        assert_eq!(kv.reset_expected_in_days, None, "{kv:?}");
        assert!(kv.early_warning, "{kv:?}");
    }

    /// A GPU of 80 GB whose memory leaks 2.5 GB a day from 10 GB; a deploy on day 8 takes it
    /// from 30 to 40 GB (a step the regime split starts a regime at), and a restart on day
    /// `restart_day`, if any, frees the leak. Samples every 10 minutes until day `end_day`;
    /// from day 15 on, the line of days 8 to 14 (7 days) forecasts a breach of the 5%
    /// headroom within a week. The vram_headroom forecast at the end.
    fn leak_forecast(restart_day: Option<f64>, end_day: f64) -> SloForecast {
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), "forecast: {min_days: 7, worst_of_days: 1}\n");
        let t0 = 1_793_577_600_000;
        let gib = 1024.0 * 1024.0 * 1024.0;
        let step = 600_000;
        let end = t0 + (end_day * DAY_MS as f64) as i64;
        let mut ts = t0;
        while ts < end {
            let day = (ts - t0) as f64 / DAY_MS as f64;
            let used = if day < 8.0 {
                10.0 + 2.5 * day
            } else if let Some(restart) = restart_day.filter(|&r| day >= r) {
                40.0 + 2.5 * (day - restart)
            } else {
                40.0 + 2.5 * (day - 8.0)
            };
            // A little scatter, as a real allocator gives.
            let wobble = 0.05 * (((ts / step) * 7919 % 13) as f64 - 6.0) / 6.0;
            let labels: std::collections::BTreeMap<String, String> =
                [("gpu".to_owned(), "0".to_owned())].into();
            let sample = |signal: &str, value: f64| Sample {
                ts_ms: ts,
                signal: signal.into(),
                labels: labels.clone(),
                value,
            };
            e.process(vec![
                sample(catalogue::GPU_MEMORY_USED_BYTES.name, (used + wobble) * gib),
                sample(catalogue::GPU_MEMORY_TOTAL_BYTES.name, 80.0 * gib),
            ])
            .unwrap();
            ts += step;
        }
        let s = e.tick(end).unwrap();
        s.forecasts.into_iter().find(|f| f.slo == "vram_headroom").unwrap()
    }

    /// `fc` still crosses within 14 days, but its warning waits for a shift whose onset lies
    /// within `tolerance_ms` of noon on day 14 (from 2026-11-02).
    fn assert_held_by_a_shift_at_noon_of_day_14(fc: &SloForecast, tolerance_ms: i64) {
        assert!(fc.days_to_breach.is_some_and(|d| d < 14.0), "{fc:?}");
        assert!(!fc.early_warning, "{fc:?}");
        let onset = fc.warning_held_by_shift_ms.unwrap_or_else(|| panic!("{fc:?}"));
        let noon_day_14 = 1_793_577_600_000 + 14 * DAY_MS + DAY_MS / 2;
        assert!((onset - noon_day_14).abs() <= tolerance_ms, "onset {onset}, shift at {noon_day_14}");
    }

    #[test]
    fn a_restart_that_frees_a_leak_holds_the_warning_its_old_regime_would_give() {
        // Without the restart, the line of days 8 to 14 warns at once.
        let leak = leak_forecast(None, 15.5);
        assert!(leak.early_warning, "{leak:?}");
        assert_eq!(leak.warning_held_by_shift_ms, None, "{leak:?}");
        // The restart at noon on day 14 has freed the leak: the daily values do not show it
        // yet (day 14's minimum is from before it), the line still crosses within a week,
        // but the warning waits and names the restart's shift.
        assert_held_by_a_shift_at_noon_of_day_14(&leak_forecast(Some(14.5), 15.5), 600_000);
        // A warning that stood before the restart is not ended by it: the hold only keeps
        // new warnings from starting.
        let standing = leak_forecast(Some(15.75), 16.5);
        assert!(standing.early_warning, "{standing:?}");
        let warned = standing.warned.as_ref().unwrap_or_else(|| panic!("{standing:?}"));
        assert_eq!(warned.since_ms, 1_793_577_600_000 + 15 * DAY_MS, "{standing:?}");
        assert_eq!(standing.warning_held_by_shift_ms, None, "{standing:?}");
    }

    /// Canary TTFT of a queue, every 10 minutes: utilisation 0.3 until day 8, then 0.6
    /// rising 0.02 a day (1/TTFT falls in a straight line and reaches the 2 s SLO at
    /// utilisation 0.9, on day 23), until a scale-out at `scale_out_day` halves the
    /// utilisation; the ttft_p99 forecast at `end_day`.
    fn queue_forecast(scale_out_day: Option<f64>, end_day: f64) -> SloForecast {
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), "forecast: {min_days: 7, worst_of_days: 1}\n");
        let t0 = 1_793_577_600_000;
        let step = 600_000;
        let end = t0 + (end_day * DAY_MS as f64) as i64;
        let mut ts = t0;
        while ts < end {
            let day = (ts - t0) as f64 / DAY_MS as f64;
            let mut rho = if day < 8.0 { 0.3 } else { 0.6 + 0.02 * (day - 8.0) };
            if scale_out_day.is_some_and(|r| day >= r) {
                rho /= 2.0;
            }
            let wobble = 1.0 + 0.02 * (((ts / step) * 7919 % 13) as f64 - 6.0) / 6.0;
            let labels = [("canary".to_owned(), "capital".to_owned())].into();
            let value = 0.2 / (1.0 - rho) * wobble;
            e.process(vec![Sample {
                ts_ms: ts,
                signal: catalogue::CANARY_TTFT_SECONDS.name.into(),
                labels,
                value,
            }])
            .unwrap();
            ts += step;
        }
        e.tick(end).unwrap().forecasts.into_iter().find(|f| f.slo == "ttft_p99").unwrap()
    }

    #[test]
    fn a_scale_out_that_frees_a_queue_holds_the_warning_on_the_reciprocal_scale() {
        // Without the scale-out, the line of days 8 to 14 (on 1/TTFT) warns at once.
        let queue = queue_forecast(None, 15.5);
        assert_eq!(queue.scale, TrendScale::Reciprocal);
        assert!(queue.early_warning && queue.warning_held_by_shift_ms.is_none(), "{queue:?}");
        // The scale-out at noon on day 14 halved the utilisation (0.73 to 0.37): TTFT fell
        // from 0.74 s to 0.32 s, and 1/TTFT since then (3.2) lies above the line's middle
        // (about 1.65), on the safe side of the reciprocal scale.
        assert_held_by_a_shift_at_noon_of_day_14(&queue_forecast(Some(14.5), 15.5), 3_600_000);
    }

    /// KV usage of one layer every 10 minutes from Monday 2026-11-02 until noon on the
    /// fourth Saturday: rising 0.2 points a day, 4 points lower at weekends, with a
    /// day-to-day scatter of up to 1.5 points. At the end: the kv_usage forecast, and the
    /// shift a warning about to start would wait for (under `forecast`).
    fn weekend_dip(forecast: &str) -> (SloForecast, Option<i64>) {
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), forecast);
        let t0 = 1_793_577_600_000;
        let step = 600_000;
        let end = t0 + 26 * DAY_MS + DAY_MS / 2;
        let scatter = [0.015, -0.01, 0.01, -0.015, 0.0];
        let mut ts = t0;
        while ts < end {
            let day = (ts - t0) / DAY_MS;
            let weekend = if matches!(day % 7, 5 | 6) { -0.04 } else { 0.0 };
            let wobble = 0.002 * ((ts / step) % 3) as f64;
            let value = 0.55 + 0.002 * day as f64 + weekend + scatter[day as usize % 5] + wobble;
            let labels = [("layer".to_owned(), "0".to_owned())].into();
            e.process(vec![Sample { ts_ms: ts, signal: "kvcache_usage_ratio".into(), labels, value }])
                .unwrap();
            ts += step;
        }
        let fc = e.tick(end).unwrap().forecasts.into_iter().find(|f| f.slo == "kv_usage").unwrap();
        let cfg = e.cfg.clone();
        let slo = cfg.forecast.slos.iter().find(|s| s.name == "kv_usage").unwrap();
        let fit = e.fit_cache["kv_usage"].1.clone();
        let held = e.unfitted_reset(slo, &fit, end).unwrap();
        (fc, held)
    }

    #[test]
    fn a_weekend_dip_is_judged_against_the_weekends_own_level() {
        // The Saturday's shift down is deeper than the line's rise since its middle day,
        // but no deeper than the weekly profile's weekend offset: nothing is held.
        let (fc, held) = weekend_dip("forecast: {min_days: 7, worst_of_days: 1}\n");
        assert!(fc.trend.is_some() && fc.days >= 14, "a regime with a weekly profile: {fc:?}");
        assert_eq!(held, None, "{fc:?}");
        // Without the profile the same dip reads as a reset: the offset is what spares it.
        let (fc, held) = weekend_dip("forecast: {min_days: 7, worst_of_days: 1, weekly_profile: false}\n");
        let saturday = 1_793_577_600_000 + 26 * DAY_MS;
        assert_eq!(held, Some(saturday), "{fc:?}");
    }

    /// TTFT of a queue whose utilisation rises 1.5 points a day from 0.5: 0.2 s / (1 - rho),
    /// one value per day, hourly samples; `scale` is the TTFT SLO's trend scale.
    fn queueing_ttft_forecast(scale: &str) -> SloForecast {
        let dir = tempfile::tempdir().unwrap();
        let slo = format!("{{name: ttft_p99, indicator: ttft_p99, threshold: 2.0, scale: {scale}}}");
        let mut e = engine(dir.path(), &format!("forecast: {{min_days: 7, slos: [{slo}]}}\n"));
        let t0 = 1_793_577_600_000;
        for h in 0..(18 * 24) {
            let rho = 0.5 + 0.015 * (h / 24) as f64;
            let labels = [("canary".to_owned(), "capital".to_owned())].into();
            let s = Sample {
                ts_ms: t0 + h * 3_600_000,
                signal: "canary_ttft_seconds".into(),
                labels,
                value: 0.2 / (1.0 - rho),
            };
            e.process(vec![s]).unwrap();
        }
        e.tick(t0 + 18 * DAY_MS).unwrap().forecasts.remove(0)
    }

    #[test]
    fn a_queueing_knee_is_a_straight_line_on_the_reciprocal_scale() {
        // 1/TTFT = 5 (1 - rho) falls linearly; it reaches 1/2 s when rho = 0.9, on the day
        // whose value is 0.5 + 0.015 d = 0.9: d = 26.67, its midpoint line crossing at
        // x = 27.17, so 9.17 days after day 18 starts.
        let f = queueing_ttft_forecast("reciprocal");
        assert_eq!(f.scale, TrendScale::Reciprocal);
        let d = f.days_to_breach.unwrap();
        // Drawn in seconds: the hyperbola through the threshold at the breach, and past the
        // day 1/TTFT reaches 0 (rho = 1), beyond every latency.
        let trend = f.trend.unwrap();
        assert!((trend.at(trend.now_day + d).central - 2.0).abs() < 1e-9, "{trend:?}");
        let rho_one = (1.0 - 0.5) / 0.015 + 0.5;
        assert!(trend.at(trend.from_day + rho_one + 1.0).central.is_infinite(), "{trend:?}");
        assert!((d - (0.4 / 0.015 + 0.5 - 18.0)).abs() < 1e-6, "{f:?}");
        let upper = f.days_to_breach_upper.unwrap();
        assert!(
            (upper - (d + 0.5)).abs() < 1e-6,
            "an exact line: only the half day of a daily breach: {f:?}"
        );
        assert!(f.early_warning, "{f:?}");
        assert!(f.slope_per_day.unwrap() < 0.0, "1/TTFT falls: {f:?}");
        // A straight line in ln(TTFT) bends below the hyperbola, so it sees the knee later.
        let log = queueing_ttft_forecast("log");
        assert!(log.days_to_breach.unwrap() > d + 3.0, "{log:?}");
        let linear = queueing_ttft_forecast("linear");
        assert!(linear.days_to_breach.unwrap() > log.days_to_breach.unwrap(), "{linear:?}");
    }

    /// Daily p95 KVF flat at 1.2 for 8 days, then rising 0.02 s^2 / 14 (s days since day 8),
    /// over 22 days; the forecast at the end of day 21.
    fn accelerating_kvf_forecast(forecast: &str) -> SloForecast {
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), forecast);
        let t0 = feed_hourly(&mut e, "kv_fragmentation", 22 * 24, |h| {
            let s = ((h / 24) as f64 - 8.0).max(0.0);
            1.2 + 0.02 * s * s / 14.0 + 0.003 * ((h * 7919) % 13) as f64 / 13.0
        });
        e.tick(t0 + 22 * DAY_MS).unwrap().forecasts.into_iter().find(|f| f.slo == "kvf").unwrap()
    }

    #[test]
    fn an_accelerating_drift_is_forecast_from_its_recent_days() {
        // 1.8 is reached when 0.02 s^2 / 14 = 0.6 (s = 20.5, day 28.5): 6.5 days after the
        // end of day 21. The recent week's line says about 11; the regime's says more.
        let recent = accelerating_kvf_forecast("forecast: {min_days: 7}\n");
        assert!(recent.accelerating && recent.days == 7, "{recent:?}");
        let regime = accelerating_kvf_forecast("forecast: {min_days: 7, recent_days: 0}\n");
        assert!(!regime.accelerating, "{regime:?}");
        let (r, g) = (recent.days_to_breach.unwrap(), regime.days_to_breach.unwrap_or(f64::INFINITY));
        assert!(r < g - 2.0 && r > 6.5, "recent {r:.1} days, regime {g:.1} days");
        // A line does not accelerate: the same forecast with or without the test.
        let dir = tempfile::tempdir().unwrap();
        let t_end = 1_793_577_600_000 + 26 * DAY_MS;
        let mut line = weekly_kv_engine(dir.path(), "forecast: {min_days: 7}\n", 26);
        let kv = line.tick(t_end).unwrap().forecasts.into_iter().find(|f| f.slo == "kv_usage").unwrap();
        assert!(!kv.accelerating && kv.days == 26, "{kv:?}");
    }

    /// A kv_usage forecast that warns (10 days to breach) or does not (no breach).
    fn kv_forecast(warns: bool) -> SloForecast {
        SloForecast {
            slo: "kv_usage".into(),
            indicator: SloIndicator::KvUsage,
            threshold: 0.95,
            direction: Direction::Above,
            days: 14,
            latest: Some(0.8),
            slope_per_day: Some(if warns { 0.015 } else { 0.0 }),
            scale: TrendScale::Linear,
            days_to_breach: warns.then_some(10.0),
            days_to_breach_upper: warns.then_some(12.0),
            days_to_breach_lower: warns.then_some(8.0),
            early_warning: warns,
            accelerating: false,
            reset_expected_in_days: None,
            warning_held_by_shift_ms: None,
            warned: None,
            daily: Vec::new(),
            trend: None,
        }
    }

    /// Publishes, at each (day, warns) in turn, a kv_usage forecast that warns or not;
    /// returns what stood after each: (omen_forecast_early_warning, warning's start).
    fn kept_warnings(forecast: &str, steps: &[(f64, bool)]) -> (Vec<(f64, Option<i64>)>, Vec<AlertEvent>) {
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), forecast);
        let t0 = 1_793_577_600_000;
        let labels = vec![("slo".to_owned(), "kv_usage".to_owned())];
        let mut stood = Vec::new();
        for &(day, warns) in steps {
            let mut fcs = vec![kv_forecast(warns)];
            e.publish_forecasts(t0 + (day * DAY_MS as f64) as i64, &mut fcs, &mut Vec::new());
            let flag = e.live.gauge(catalogue::FORECAST_EARLY_WARNING.name, &labels).unwrap();
            stood.push((flag, fcs[0].warned.as_ref().map(|w| w.since_ms - t0)));
        }
        (stood, e.events().to_vec())
    }

    #[test]
    fn a_warning_stands_until_the_forecast_has_not_warned_for_keep_warning_days() {
        // Warns on days 0 and 1, not on day 2 (a weekend), again on day 3, then no more.
        let steps = [(0.0, true), (1.0, true), (2.0, false), (3.0, true), (5.9, false), (6.0, false)];
        let (stood, events) = kept_warnings("forecast: {keep_warning_days: 3}\n", &steps);
        let since = Some(0);
        assert_eq!(
            stood,
            [(1.0, since), (1.0, since), (1.0, since), (1.0, since), (1.0, since), (0.0, None)]
        );
        // One warning, one end: three days after the forecast last warned.
        let levels: Vec<(i64, Level)> = events.iter().map(|ev| (ev.ts_ms, ev.level)).collect();
        let t0 = 1_793_577_600_000;
        assert_eq!(levels, [(t0, Level::Warning), (t0 + 6 * DAY_MS, Level::Ok)]);
        // With 0 days, the first forecast that does not warn ends it, and the next starts anew.
        let (stood, events) = kept_warnings("forecast: {keep_warning_days: 0}\n", &steps[..4]);
        assert_eq!(stood, [(1.0, Some(0)), (1.0, Some(0)), (0.0, None), (1.0, Some(3 * DAY_MS))]);
        assert_eq!(events.len(), 3);
        // A warning kept by an older agent has no last_warned_ms: it counts from its start.
        let old: super::WarnedForecast = serde_json::from_str(
            r#"{"since_ms": 5, "days_to_breach": 10.0, "days_to_breach_upper": 12.0, "days_to_breach_lower": 8.0}"#,
        )
        .unwrap();
        assert_eq!((old.since_ms, old.last_warned_ms), (5, None));
    }

    #[test]
    fn a_restart_expected_before_the_breach_ends_a_standing_warning_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), "forecast: {keep_warning_days: 3}\n");
        let t0 = 1_793_577_600_000;
        e.publish_forecasts(t0, &mut [kv_forecast(true)], &mut Vec::new());
        // A day later the forecast still crosses in 10 days, but a restart is due in 2.
        let mut reset_first = kv_forecast(false);
        (reset_first.days_to_breach, reset_first.reset_expected_in_days) = (Some(10.0), Some(2.0));
        let mut fcs = vec![reset_first.clone()];
        e.publish_forecasts(t0 + DAY_MS, &mut fcs, &mut Vec::new());
        assert!(fcs[0].warned.is_none(), "{:?}", fcs[0]);
        let labels = vec![("slo".to_owned(), "kv_usage".to_owned())];
        assert_eq!(e.live.gauge(catalogue::FORECAST_EARLY_WARNING.name, &labels), Some(0.0));
        // A restart due after the breach does not: the lapse is kept.
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), "forecast: {keep_warning_days: 3}\n");
        e.publish_forecasts(t0 + 2 * DAY_MS, &mut [kv_forecast(true)], &mut Vec::new());
        reset_first.reset_expected_in_days = Some(12.0);
        let mut fcs = vec![reset_first];
        e.publish_forecasts(t0 + 3 * DAY_MS, &mut fcs, &mut Vec::new());
        assert!(fcs[0].warned.is_some(), "{:?}", fcs[0]);
    }

    #[test]
    fn latency_trends_are_fitted_on_the_reciprocal_scale() {
        let cfg = crate::config::Config::default();
        let ttft = cfg.forecast.slos.iter().find(|s| s.name == "ttft_p99").unwrap();
        assert_eq!(ttft.trend_scale(), TrendScale::Reciprocal);
        let kv = cfg.forecast.slos.iter().find(|s| s.name == "kv_usage").unwrap();
        assert_eq!(kv.trend_scale(), TrendScale::Linear);
    }
}
