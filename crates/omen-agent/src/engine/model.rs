//! The LSTM autoencoder's live step (feature `lstm`): once per tick, the latest value of
//! each of its source series goes to the model, and its severity becomes `lstm_ae_score`.

use std::collections::{BTreeMap, HashMap};

use omen_signals::catalogue;
use omen_sources::Sample;

use super::Engine;

impl Engine {
    /// One LSTM-AE step: the latest value of each source series (stale ones count as missing).
    /// It cannot fail the tick: a failing model only withdraws its score.
    pub(super) fn score_model(&mut self, now_ms: i64, out: &mut Vec<Sample>) {
        let Some(model) = self.model.as_mut() else { return };
        // Keys as SeriesKey displays them (`signal{k="v"}`), the form the model names its sources in;
        // only the model's own signals are read, not every live series.
        let signals: std::collections::BTreeSet<&str> =
            model.sources().iter().map(|s| s.split('{').next().unwrap_or(s)).collect();
        let mut latest: HashMap<String, f64> = HashMap::new();
        for signal in signals {
            let Some(by_labels) = self.series.get(signal) else { continue };
            for (labels, st) in by_labels.iter().filter(|(_, st)| st.is_fresh(now_ms)) {
                let key = omen_sources::SeriesKey { signal: signal.to_owned(), labels: labels.clone() };
                latest.insert(key.to_string(), st.last_value);
            }
        }
        let tick = model.tick(|s| latest.get(s).copied());
        // A failing model (its worker died, say) must not cost the batch its storage: the
        // score goes away, the failure is logged once, and the next tick tries again.
        let tick = match tick {
            Ok(t) => {
                if self.model_failing {
                    tracing::info!("LSTM-AE scoring works again");
                    self.model_failing = false;
                }
                t
            }
            Err(e) => {
                if !self.model_failing {
                    tracing::error!(
                        "LSTM-AE scoring failed; lstm_ae_score is withdrawn until it works again: {e:#}"
                    );
                    self.model_failing = true;
                }
                self.model_contributions.clear();
                self.live.remove_gauge(catalogue::LSTM_AE_SCORE.name, &Vec::new());
                return;
            }
        };
        match tick {
            crate::lstm_live::Tick::Scored { severity, contributions, .. } => {
                self.model_contributions = contributions;
                self.live.set_gauge(catalogue::LSTM_AE_SCORE.name, Vec::new(), severity);
                out.push(Sample {
                    ts_ms: now_ms,
                    signal: catalogue::LSTM_AE_SCORE.name.into(),
                    labels: BTreeMap::new(),
                    value: severity,
                });
            }
            // A source went silent: an old score must not hold the health score up.
            crate::lstm_live::Tick::Missing => {
                self.model_contributions.clear();
                self.live.remove_gauge(catalogue::LSTM_AE_SCORE.name, &Vec::new())
            }
            crate::lstm_live::Tick::Filling => {}
        }
    }
}
