//! The health score: the riskiest series, raised to the warning band by any forecast
//! early warning and to the LSTM autoencoder's score; its level, and the transitions
//! of that level reported as alert events.

use std::collections::BTreeMap;

use omen_signals::catalogue;
use omen_sources::Sample;
use serde::Serialize;

use super::{Engine, SloForecast};
use crate::config::HealthConfig;

/// Severity bands of the health score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Below the warning threshold.
    Ok,
    /// [warning, critical).
    Warning,
    /// >= critical.
    Critical,
}

impl Level {
    /// The band of `health` under the configured thresholds (both inclusive).
    pub(super) fn of(health: f64, cfg: &HealthConfig) -> Self {
        if health >= cfg.critical {
            Level::Critical
        } else if health >= cfg.warning {
            Level::Warning
        } else {
            Level::Ok
        }
    }
}

/// One series' share in the health score.
#[derive(Debug, Clone, Serialize)]
pub struct Contributor {
    /// Signal name.
    pub signal: String,
    /// Series labels.
    pub labels: BTreeMap<String, String>,
    /// Risk in [0, 1] from the debounced window score.
    pub risk: f64,
    /// Latest window anomaly score.
    pub anomaly_score: f64,
    /// Latest value.
    pub value: f64,
}

/// What the last tick concluded; served by /scores/latest.
#[derive(Debug, Clone, Serialize)]
pub struct HealthSummary {
    /// Event time of the tick, ms.
    pub ts_ms: i64,
    /// Health score in [0, 1].
    pub health_score: f64,
    /// Its band.
    pub level: Level,
    /// Series ranked by risk (the signals that moved).
    pub contributors: Vec<Contributor>,
    /// Per-SLO forecasts.
    pub forecasts: Vec<SloForecast>,
    /// The coupled latency model over `explain.window` (None until its first fit).
    pub latency_model: Option<super::LatencyExplanation>,
}

/// A change of the health level or of an early warning, for reports.
#[derive(Debug, Clone, Serialize)]
pub struct AlertEvent {
    /// Event time, ms.
    pub ts_ms: i64,
    /// `health` or `forecast:<slo>`.
    pub alert: String,
    /// New state.
    pub level: Level,
    /// The top contributing signal or the SLO.
    pub reason: String,
    /// For an early warning: the forecast days to breach when it changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub days_to_breach: Option<f64>,
}

impl Engine {
    /// Health in [0, 1]: the top contributor's risk, at least the warning threshold while a
    /// forecast warns early, and at least the live LSTM-AE score (set by this tick's model
    /// step, or replayed as a sample).
    pub(super) fn health_score(&self, contributors: &[Contributor], forecasts: &[SloForecast]) -> f64 {
        let mut health = contributors.first().map_or(0.0, |c| c.risk);
        if forecasts.iter().any(|f| f.early_warning) {
            health = health.max(self.cfg.health.warning);
        }
        if let Some(lstm) = self.live.gauge(catalogue::LSTM_AE_SCORE.name, &Vec::new()) {
            health = health.max(lstm);
        }
        health
    }

    /// Publishes the health score as a gauge and adds it to the tick's samples.
    pub(super) fn publish_health(&self, now_ms: i64, health: f64, out: &mut Vec<Sample>) {
        out.push(Sample {
            ts_ms: now_ms,
            signal: catalogue::HEALTH_SCORE.name.into(),
            labels: BTreeMap::new(),
            value: health,
        });
        self.live.set_gauge(catalogue::HEALTH_SCORE.name, Vec::new(), health);
    }

    /// Records an alert event when the level changed since the last tick, naming the top
    /// contributor (or the early warning, or that all is normal again).
    pub(super) fn track_level(
        &mut self,
        now_ms: i64,
        level: Level,
        contributors: &[Contributor],
        forecasts: &[SloForecast],
    ) {
        if level == self.health_level {
            return;
        }
        self.events.push(AlertEvent {
            ts_ms: now_ms,
            alert: "health".into(),
            level,
            reason: contributors.first().map_or_else(
                || {
                    if forecasts.iter().any(|f| f.early_warning) {
                        "forecast early warning".into()
                    } else {
                        "all signals normal".into()
                    }
                },
                |c| format!("{} {:?} anomaly score {:.2}", c.signal, c.labels, c.anomaly_score),
            ),
            days_to_breach: None,
        });
        self.health_level = level;
    }
}
