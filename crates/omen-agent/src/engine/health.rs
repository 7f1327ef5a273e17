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
    /// Risk in [0, 1] of its held change (`omen_anomaly_risk`).
    pub risk: f64,
    /// Latest anomaly score from `signals.detector`.
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
    /// Why the level is above ok, strongest first: each part of the health score at or
    /// above the warning threshold (empty at level ok).
    pub reasons: Vec<Reason>,
    /// Lasting level shifts, newest first (the last 20): changes that held for
    /// `signals.latch`, after which the new level counts as normal.
    pub changes: Vec<LevelShift>,
    /// Per-SLO forecasts.
    pub forecasts: Vec<SloForecast>,
    /// The coupled latency model over `explain.window` (None until its first fit).
    pub latency_model: Option<super::LatencyExplanation>,
    /// The LSTM-AE: where it comes from, its age and validation (None without a `model` section).
    pub model: Option<crate::model_training::ModelStatus>,
}

/// A change of a series that held for `signals.latch`: the series lives at a new level.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LevelShift {
    /// Signal name.
    pub signal: String,
    /// Series labels.
    pub labels: BTreeMap<String, String>,
    /// Onset of the change, ms.
    pub since_ms: i64,
    /// When it had held for `signals.latch`, ms.
    pub confirmed_ms: i64,
    /// Mean of the window before the onset.
    pub before: f64,
    /// Mean of the values since the onset.
    pub after: f64,
    /// `after - before` in the old window's standard deviations.
    pub shift_sigmas: f64,
}

/// One reason for a health level above ok.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reason {
    /// A series whose change holds, with its risk at or above the warning threshold.
    Anomaly {
        /// Signal name.
        signal: String,
        /// Series labels.
        labels: BTreeMap<String, String>,
        /// Risk in [0, 1].
        risk: f64,
        /// Latest anomaly score.
        anomaly_score: f64,
    },
    /// An SLO whose early warning stands (`forecast.keep_warning_days`).
    EarlyWarning {
        /// The SLO.
        slo: String,
        /// Forecast days until the breach; `None` while the warning is kept through a
        /// forecast that does not warn.
        days_to_breach: Option<f64>,
        /// The SLO threshold.
        threshold: f64,
    },
    /// The LSTM autoencoder's score (`omen_lstm_ae_score`).
    Model {
        /// Its severity in [0, 1].
        score: f64,
        /// The source series that contribute most to its reconstruction error (at most
        /// [`MODEL_CONTRIBUTORS`], largest share first); empty for a replayed score.
        contributors: Vec<ModelContributor>,
    },
}

/// How many of the LSTM-AE's inputs a reason names.
pub const MODEL_CONTRIBUTORS: usize = 3;

/// An input series of the LSTM autoencoder and its share of the reconstruction error.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelContributor {
    /// The source series, as the model names it (`signal{k="v"}`).
    pub series: String,
    /// Its share of the error in [0, 1].
    pub share: f64,
}

impl Reason {
    /// One line for logs and alert events.
    pub fn describe(&self) -> String {
        match self {
            Reason::Anomaly { signal, labels, risk, anomaly_score } => {
                let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!(
                    "{signal}{{{}}} changed: risk {risk:.2}, anomaly score {anomaly_score:.3}",
                    labels.join(",")
                )
            }
            Reason::EarlyWarning { slo, days_to_breach: Some(d), threshold } => {
                format!("SLO {slo} (threshold {threshold}) forecast to breach in {d:.1} days")
            }
            Reason::EarlyWarning { slo, days_to_breach: None, threshold } => {
                format!("SLO {slo} (threshold {threshold}) early warning kept: not forecast to breach within the lead now")
            }
            Reason::Model { score, contributors } if contributors.is_empty() => {
                format!("LSTM autoencoder score {score:.2}")
            }
            Reason::Model { score, contributors } => {
                let parts: Vec<String> =
                    contributors.iter().map(|c| format!("{} {:.0}%", c.series, 100.0 * c.share)).collect();
                format!("LSTM autoencoder score {score:.2}, error mostly from {}", parts.join(", "))
            }
        }
    }
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
    /// Why: the reasons of the new level, or that all is normal again.
    pub reason: String,
    /// For an early warning: the forecast days to breach when it changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub days_to_breach: Option<f64>,
    /// For an early warning: the interval of the days to breach when it changed (its ends
    /// over the slope interval at `forecast.confidence`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub days_to_breach_interval: Option<(f64, f64)>,
}

impl Engine {
    /// Health in [0, 1]: the top contributor's risk, at least the warning threshold while a
    /// forecast warns early, and at least the live LSTM-AE score (set by this tick's model
    /// step, or replayed as a sample).
    pub(super) fn health_score(&self, contributors: &[Contributor], forecasts: &[SloForecast]) -> f64 {
        let mut health = contributors.first().map_or(0.0, |c| c.risk);
        if forecasts.iter().any(|f| f.warned.is_some()) {
            health = health.max(self.cfg.health.warning);
        }
        if let Some(lstm) = self.live.gauge(catalogue::LSTM_AE_SCORE.name, &Vec::new()) {
            health = health.max(lstm);
        }
        health
    }

    /// The parts of the health score at or above the warning threshold, strongest first
    /// (an early warning counts as the warning threshold).
    pub(super) fn reasons(&self, contributors: &[Contributor], forecasts: &[SloForecast]) -> Vec<Reason> {
        let warning = self.cfg.health.warning;
        let mut ranked: Vec<(f64, Reason)> = Vec::new();
        for c in contributors.iter().filter(|c| c.risk >= warning) {
            ranked.push((
                c.risk,
                Reason::Anomaly {
                    signal: c.signal.clone(),
                    labels: c.labels.clone(),
                    risk: c.risk,
                    anomaly_score: c.anomaly_score,
                },
            ));
        }
        for f in forecasts.iter().filter(|f| f.warned.is_some()) {
            let reason = Reason::EarlyWarning {
                slo: f.slo.clone(),
                // None while a warning is kept through a forecast that does not warn.
                days_to_breach: f.days_to_breach.filter(|_| f.early_warning),
                threshold: f.threshold,
            };
            ranked.push((warning, reason));
        }
        if let Some(score) =
            self.live.gauge(catalogue::LSTM_AE_SCORE.name, &Vec::new()).filter(|&s| s >= warning)
        {
            let contributors = self
                .model_contributions
                .iter()
                .take(MODEL_CONTRIBUTORS)
                .map(|(series, share)| ModelContributor { series: series.clone(), share: *share })
                .collect();
            ranked.push((score, Reason::Model { score, contributors }));
        }
        // Stable: equal strengths keep anomalies, then forecasts (config order), then the model.
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
        ranked.into_iter().map(|(_, r)| r).collect()
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

    /// Records an alert event when the level changed since the last tick, with its reasons
    /// (or that all is normal again).
    pub(super) fn track_level(&mut self, now_ms: i64, level: Level, reasons: &[Reason]) {
        if level == self.health_level {
            return;
        }
        let reason = if reasons.is_empty() {
            "all signals normal".to_owned()
        } else {
            reasons.iter().map(Reason::describe).collect::<Vec<_>>().join("; ")
        };
        self.events.push(AlertEvent {
            ts_ms: now_ms,
            alert: "health".into(),
            level,
            reason,
            days_to_breach: None,
            days_to_breach_interval: None,
        });
        self.health_level = level;
    }
}
