//! `history.prometheus_url`: an agent that starts with no day aggregates in its store
//! (a rescheduled sidecar on an empty volume) reads the days its forecasts need from a
//! Prometheus that scraped its earlier life, so that its forecasts start at once instead
//! of `forecast.min_days` later.
//!
//! For each SLO indicator's signal (the gauge `omen_<signal>` omen exports), one
//! `query_range` per statistic with a step of one day, evaluated 1 ms before each UTC
//! midnight over `[1d]`: `count_over_time`, `sum_over_time`, `min_over_time`,
//! `max_over_time` and `quantile_over_time` (0.5, 0.95, 0.99; linear interpolation, as the
//! store's own roll-up computes them). Prometheus holds the gauge as scraped, so a day's
//! statistics are over the scraped values rather than every sample the agent saw; for the
//! daily p95, p99, min and mean the forecasts read, that is the same day seen at the scrape
//! interval. Whatever cannot be loaded is logged, and the agent starts anyway.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use anyhow::Result;
use serde::Deserialize;
use tracing::{info, warn};

use crate::config::{Config, HistoryConfig};
use crate::engine::IndicatorDefinition;
use omen_sources::SeriesKey;
use omen_store::{DayAggregate, Store, DAY_MS};

/// What a backfill loaded and what it could not.
#[derive(Debug, Default)]
pub struct Backfill {
    /// Series that received day aggregates.
    pub series: usize,
    /// Day aggregates written.
    pub rows: usize,
    /// What could not be loaded, one line per signal (or one for an unreachable server).
    pub problems: Vec<String>,
}

/// One day statistic, as the PromQL function over `[1d]` that computes it.
#[derive(Debug, Clone, Copy)]
enum Statistic {
    Count,
    Sum,
    Min,
    Max,
    Quantile(usize, f64),
}

const STATISTICS: [Statistic; 7] = [
    Statistic::Count,
    Statistic::Sum,
    Statistic::Min,
    Statistic::Max,
    Statistic::Quantile(0, 0.5),
    Statistic::Quantile(1, 0.95),
    Statistic::Quantile(2, 0.99),
];

impl Statistic {
    /// The PromQL expression over one day of `selector`.
    fn query(self, selector: &str) -> String {
        match self {
            Self::Count => format!("count_over_time({selector}[1d])"),
            Self::Sum => format!("sum_over_time({selector}[1d])"),
            Self::Min => format!("min_over_time({selector}[1d])"),
            Self::Max => format!("max_over_time({selector}[1d])"),
            Self::Quantile(_, q) => format!("quantile_over_time({q}, {selector}[1d])"),
        }
    }
}

/// A day's statistics as they arrive, one query at a time.
#[derive(Debug, Default, Clone, Copy)]
struct Partial {
    count: Option<f64>,
    sum: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
    quantiles: [Option<f64>; 3],
}

impl Partial {
    /// Adds one series' value of `statistic`. Series that differ only in dropped labels
    /// (replicas, earlier pods) merge: counts and sums add, the extremes stay extremes, and
    /// a quantile is the highest of theirs, as the forecast would take the worst series.
    fn merge(&mut self, statistic: Statistic, value: f64) {
        type Combine = fn(f64, f64) -> f64;
        let (slot, combine): (&mut Option<f64>, Combine) = match statistic {
            Statistic::Count => (&mut self.count, |a, b| a + b),
            Statistic::Sum => (&mut self.sum, |a, b| a + b),
            Statistic::Min => (&mut self.min, f64::min),
            Statistic::Max => (&mut self.max, f64::max),
            Statistic::Quantile(i, _) => (&mut self.quantiles[i], f64::max),
        };
        *slot = Some(slot.map_or(value, |v| combine(v, value)));
    }

    /// The day aggregate, once every statistic arrived for a day with samples.
    fn complete(&self, key: SeriesKey, day_ms: i64) -> Option<DayAggregate> {
        let (count, sum) = (self.count?, self.sum?);
        let [p50, p95, p99] = self.quantiles;
        (count >= 1.0).then_some(DayAggregate {
            key,
            day_ms,
            count: count as i64,
            mean: sum / count,
            min: self.min?,
            max: self.max?,
            p50: p50?,
            p95: p95?,
            p99: p99?,
        })
    }
}

/// Prometheus' answer to `/api/v1/query_range`.
#[derive(Debug, Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    data: Option<AnswerData>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AnswerData {
    result_type: String,
    result: Vec<MatrixSeries>,
}

#[derive(Debug, Deserialize)]
struct MatrixSeries {
    metric: BTreeMap<String, String>,
    values: Vec<(f64, String)>,
}

/// Loads the day aggregates of the days before `now_ms` that the forecasts read, when
/// `history.prometheus_url` is set and the store holds no day aggregate yet; `None` when
/// there is nothing to do. Never fails the start: problems come back in [`Backfill`].
pub async fn backfill(cfg: &Config, store: &Store, now_ms: i64) -> Result<Option<Backfill>> {
    let Some(url) = &cfg.history.prometheus_url else {
        return Ok(None);
    };
    if store.has_day_aggregates()? {
        return Ok(None);
    }
    let f = &cfg.forecast;
    let today = now_ms.div_euclid(DAY_MS) * DAY_MS;
    let days = (f.lookback_days + f.worst_of_days.max(1) - 1) as i64;
    let from = today - days * DAY_MS;
    let mut signals: Vec<&'static str> =
        f.slos.iter().map(|slo| IndicatorDefinition::of(slo.indicator).signal).collect();
    signals.sort_unstable();
    signals.dedup();
    let client = reqwest::Client::builder().timeout(cfg.history.timeout).build()?;
    let started = Instant::now();
    info!(prometheus = %url, days, signals = signals.len(), "history: the store has no day aggregates; backfilling them from Prometheus");
    let mut out = Backfill::default();
    let mut series_seen = std::collections::BTreeSet::new();
    for (i, signal) in signals.iter().enumerate() {
        match load_signal(&client, url, &cfg.history, signal, from, today).await {
            Ok(rows) => {
                series_seen.extend(rows.iter().map(|r| r.key.clone()));
                let written = store.insert_day_aggregates(&rows)?;
                out.rows += written;
                info!(signal, rows = written, "history: signal {} of {} loaded", i + 1, signals.len());
            }
            Err(LoadError::Unreachable(reason)) => {
                out.problems.push(format!("Prometheus at {url} cannot be reached: {reason}"));
                break;
            }
            Err(LoadError::Answer(reason)) => out.problems.push(format!("{signal}: {reason}")),
        }
    }
    out.series = series_seen.len();
    let secs = started.elapsed().as_secs_f64();
    if out.problems.is_empty() {
        info!(rows = out.rows, series = out.series, secs, "history: backfill done; forecasts start from it");
    } else {
        warn!(
            rows = out.rows,
            series = out.series,
            "history: backfill from {url} incomplete, the forecasts of what is missing start from this agent's own \
             samples: {}",
            out.problems.join("; ")
        );
    }
    Ok(Some(out))
}

/// Why a signal's days could not be loaded.
#[derive(Debug)]
enum LoadError {
    /// No answer at all (connection refused, timeout): later queries would fail alike.
    Unreachable(String),
    /// An answer that is an error or not a query_range matrix.
    Answer(String),
}

/// The day aggregates of `signal` for the days in `[from, until)`.
async fn load_signal(
    client: &reqwest::Client,
    url: &str,
    history: &HistoryConfig,
    signal: &str,
    from: i64,
    until: i64,
) -> Result<Vec<DayAggregate>, LoadError> {
    // Each evaluation 1 ms before a midnight: `[1d]` then covers exactly that UTC day.
    let (start, end) = ((from + DAY_MS - 1) as f64 / 1000.0, (until - 1) as f64 / 1000.0);
    let mut days = load_days(client, url, history, signal, start, end).await?;
    // Days an older omen exported under a name since renamed fill the days the current name lacks.
    for (old, _) in omen_signals::catalogue::RENAMED.iter().filter(|(_, new)| *new == signal) {
        for (key, partial) in load_days(client, url, history, old, start, end).await? {
            days.entry(key).or_insert(partial);
        }
    }
    let mut rows: Vec<DayAggregate> = days
        .into_iter()
        .filter_map(|((labels, day_ms), p)| {
            p.complete(SeriesKey { signal: signal.to_owned(), labels }, day_ms)
        })
        .filter(|d| d.day_ms >= from && d.day_ms < until)
        .collect();
    rows.sort_by(|a, b| (a.day_ms, &a.key.labels).cmp(&(b.day_ms, &b.key.labels)));
    Ok(rows)
}

/// The day statistics of the series exported as `omen_<name>`, by labels and day.
async fn load_days(
    client: &reqwest::Client,
    url: &str,
    history: &HistoryConfig,
    name: &str,
    start: f64,
    end: f64,
) -> Result<HashMap<(BTreeMap<String, String>, i64), Partial>, LoadError> {
    let selector = selector(name, &history.match_labels);
    let mut days: HashMap<(BTreeMap<String, String>, i64), Partial> = HashMap::new();
    for statistic in STATISTICS {
        let query = statistic.query(&selector);
        let answer = query_range(client, url, &query, start, end).await?;
        for s in answer {
            let labels: BTreeMap<String, String> = s
                .metric
                .into_iter()
                .filter(|(k, _)| k != "__name__" && !history.drop_labels.contains(k))
                .collect();
            for (ts, value) in s.values {
                let Ok(v) = value.parse::<f64>() else {
                    return Err(LoadError::Answer(format!("{query}: the value {value:?} is not a number")));
                };
                if !v.is_finite() {
                    continue;
                }
                let day_ms = ((ts * 1000.0).round() as i64 + 1 - DAY_MS).div_euclid(DAY_MS) * DAY_MS;
                days.entry((labels.clone(), day_ms)).or_default().merge(statistic, v);
            }
        }
    }
    Ok(days)
}

/// `omen_<signal>{k="v",...}` with the label values escaped as PromQL strings.
fn selector(signal: &str, match_labels: &BTreeMap<String, String>) -> String {
    let matchers: Vec<String> = match_labels
        .iter()
        .map(|(k, v)| {
            format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"))
        })
        .collect();
    format!("omen_{signal}{{{}}}", matchers.join(","))
}

/// One `/api/v1/query_range` call; the matrix it answers.
async fn query_range(
    client: &reqwest::Client,
    url: &str,
    query: &str,
    start: f64,
    end: f64,
) -> Result<Vec<MatrixSeries>, LoadError> {
    let endpoint = format!("{}/api/v1/query_range", url.trim_end_matches('/'));
    let (start, end) = (format!("{start:.3}"), format!("{end:.3}"));
    let params = [("query", query), ("start", &start), ("end", &end), ("step", "86400")];
    let endpoint = reqwest::Url::parse_with_params(&endpoint, params)
        .map_err(|e| LoadError::Unreachable(format!("{endpoint} is not a URL: {e}")))?;
    let response = client.get(endpoint).send().await.map_err(|e| LoadError::Unreachable(error_chain(&e)))?;
    let status = response.status();
    let body = response.bytes().await.map_err(|e| LoadError::Unreachable(error_chain(&e)))?;
    let answer: Answer = serde_json::from_slice(&body).map_err(|e| {
        LoadError::Answer(format!(
            "{query}: HTTP {status}, not a Prometheus API answer ({e}): {:?}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        ))
    })?;
    if answer.status != "success" {
        return Err(LoadError::Answer(format!(
            "{query}: HTTP {status}, Prometheus says: {}",
            answer.error.unwrap_or_else(|| format!("status {:?}", answer.status))
        )));
    }
    match answer.data {
        Some(d) if d.result_type == "matrix" => Ok(d.result),
        Some(d) => {
            Err(LoadError::Answer(format!("{query}: a {} answer where a matrix was expected", d.result_type)))
        }
        None => Err(LoadError::Answer(format!("{query}: a success answer without data"))),
    }
}

/// An error and its causes on one line (reqwest's top line alone hides "connection refused").
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cause = e.source();
    while let Some(c) = cause {
        parts.push(c.to_string());
        cause = c.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_escape_label_values() {
        let labels: BTreeMap<String, String> = [("ns".to_owned(), "a\"b\\c".to_owned())].into();
        assert_eq!(selector("kv_fragmentation", &labels), r#"omen_kv_fragmentation{ns="a\"b\\c"}"#);
        assert_eq!(selector("rci", &BTreeMap::new()), "omen_rci{}");
        assert_eq!(Statistic::Quantile(1, 0.95).query("x{}"), "quantile_over_time(0.95, x{}[1d])");
    }

    #[test]
    fn a_day_is_complete_only_with_every_statistic_and_a_sample() {
        let key = SeriesKey { signal: "kv_fragmentation".into(), labels: BTreeMap::new() };
        let mut p = Partial::default();
        for (s, v) in STATISTICS.iter().zip([4.0, 6.0, 1.0, 2.0, 1.5, 1.9, 2.0]) {
            assert!(p.complete(key.clone(), 0).is_none());
            p.merge(*s, v);
        }
        let d = p.complete(key.clone(), 0).unwrap();
        assert_eq!((d.count, d.mean, d.min, d.max, d.p50, d.p95, d.p99), (4, 1.5, 1.0, 2.0, 1.5, 1.9, 2.0));
        // A second replica's day: counts and sums add, extremes and quantiles the worst.
        for (s, v) in STATISTICS.iter().zip([4.0, 10.0, 0.5, 1.8, 1.7, 1.8, 2.5]) {
            p.merge(*s, v);
        }
        let d = p.complete(key.clone(), 0).unwrap();
        assert_eq!((d.count, d.mean, d.min, d.max, d.p50, d.p95, d.p99), (8, 2.0, 0.5, 2.0, 1.7, 1.9, 2.5));
        let empty = Partial { count: Some(0.0), ..p };
        assert!(empty.complete(key, 0).is_none());
    }
}
