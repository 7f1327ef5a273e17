//! The coupled degradation model on the agent's own history: per-minute end-to-end latency
//! (canary), server throughput (scrape), TTFT (canary) and quality (1 − RCI) are fitted as
//! L = c + α/T + βF + γ(1−Q) (omen_signals::coupled), and the latency change between the two
//! halves of the window is attributed to each term. `omen explain` runs it on any window;
//! the engine refreshes it every `explain.interval` for /scores/latest, where it is shown
//! only when R² reaches `explain.min_r_squared`, and otherwise says why not.

use std::collections::BTreeMap;

use anyhow::Result;
use omen_signals::catalogue::{self, Signal};
use omen_signals::coupled::{attribute, fit_coupled, Coefficient, CoupledObservation};
use omen_store::{Resolution, Store};
use serde::Serialize;

use super::Engine;

/// The four series the model reads, from the catalogue.
pub const INPUTS: [Signal; 4] = [
    catalogue::CANARY_E2E_SECONDS,
    catalogue::SERVER_GENERATION_TOKENS_PER_SECOND,
    catalogue::CANARY_TTFT_SECONDS,
    catalogue::RCI,
];

/// One coefficient as /scores/latest and `omen explain` report it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Estimate {
    /// Point estimate.
    pub estimate: f64,
    /// Lower end of the confidence interval.
    pub lower: f64,
    /// Upper end.
    pub upper: f64,
}

impl From<Coefficient> for Estimate {
    fn from(c: Coefficient) -> Self {
        Self { estimate: c.estimate, lower: c.lower, upper: c.upper }
    }
}

/// The fitted model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencyModel {
    /// Baseline latency c, seconds.
    pub intercept_s: Estimate,
    /// α: seconds per (1 / tokens per second); None when throughput did not vary.
    pub alpha: Option<Estimate>,
    /// β: seconds of latency per second of TTFT; None when TTFT did not vary.
    pub beta: Option<Estimate>,
    /// γ: seconds of latency per unit of lost quality (1 − Q = RCI); None when quality did
    /// not vary (a greedy canary on an unchanged model gives the same answer every time).
    pub gamma: Option<Estimate>,
    /// R² of the fit.
    pub r_squared: f64,
    /// Minutes fitted.
    pub observations: usize,
    /// Confidence level of the intervals.
    pub confidence: f64,
}

/// The latency change from the window's first half to its second, by term.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencyAttribution {
    /// Mean latency of the first half, seconds.
    pub before_s: f64,
    /// Mean latency of the second half, seconds.
    pub after_s: f64,
    /// Share of throughput (α term), seconds.
    pub throughput_s: f64,
    /// Share of TTFT (β term), seconds.
    pub ttft_s: f64,
    /// Share of quality (γ term), seconds.
    pub quality_s: f64,
    /// What the terms do not explain, seconds.
    pub unexplained_s: f64,
}

/// What the coupled model says about one window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencyExplanation {
    /// Window start, ms.
    pub since_ms: i64,
    /// Window end, ms.
    pub until_ms: i64,
    /// Where the window splits into "before" and "after", ms.
    pub split_ms: i64,
    /// The fit, when one could be made.
    pub model: Option<LatencyModel>,
    /// The attribution, when the fit is good enough (R² at least the bound).
    pub attribution: Option<LatencyAttribution>,
    /// Why there is no fit or no attribution; None when both are there.
    pub reason: Option<String>,
}

/// Fits the model on `[since_ms, until_ms)` at `step_ms` and splits the latency change at
/// `split_ms`; a fit with R² below `min_r_squared` is returned without attribution.
pub fn explain(
    store: &Store,
    since_ms: i64,
    until_ms: i64,
    split_ms: i64,
    step_ms: i64,
    confidence: f64,
    min_r_squared: f64,
) -> Result<LatencyExplanation> {
    let mut out =
        LatencyExplanation { since_ms, until_ms, split_ms, model: None, attribution: None, reason: None };
    let (obs, missing) = observations(store, since_ms, until_ms, step_ms)?;
    if let Some(signal) = missing {
        out.reason = Some(format!(
            "no {} in the window; {}",
            signal.name,
            if signal.name == catalogue::SERVER_GENERATION_TOKENS_PER_SECOND.name {
                "throughput comes from the server's /metrics: configure sources.server_metrics"
            } else {
                "the canary prober provides it: configure sources.canary with a reference answer"
            }
        ));
        return Ok(out);
    }
    let fit = match fit_coupled(&obs.iter().map(|(_, o)| *o).collect::<Vec<_>>(), confidence) {
        Ok(fit) => fit,
        Err(e) => {
            out.reason = Some(e.to_string());
            return Ok(out);
        }
    };
    out.model = Some(LatencyModel {
        intercept_s: fit.intercept.into(),
        alpha: fit.alpha.map(Into::into),
        beta: fit.beta.map(Into::into),
        gamma: fit.gamma.map(Into::into),
        r_squared: fit.r_squared,
        observations: fit.observations,
        confidence,
    });
    if fit.r_squared < min_r_squared {
        out.reason = Some(format!(
            "R² {:.2} is below explain.min_r_squared {min_r_squared}: the three terms do not explain latency well enough here to split its change",
            fit.r_squared
        ));
        return Ok(out);
    }
    let before: Vec<CoupledObservation> =
        obs.iter().filter(|(t, _)| *t < split_ms).map(|(_, o)| *o).collect();
    let after: Vec<CoupledObservation> =
        obs.iter().filter(|(t, _)| *t >= split_ms).map(|(_, o)| *o).collect();
    if before.is_empty() || after.is_empty() {
        out.reason = Some("no data on one side of the split; move --split inside the data".into());
        return Ok(out);
    }
    let a = attribute(&fit, &before, &after);
    out.attribution = Some(LatencyAttribution {
        before_s: a.before_s,
        after_s: a.after_s,
        throughput_s: a.terms[0],
        ttft_s: a.terms[1],
        quality_s: a.terms[2],
        unexplained_s: a.unexplained_s,
    });
    Ok(out)
}

/// Observations with their bucket start, ms.
type TimedObservations = Vec<(i64, CoupledObservation)>;

/// Per-step observations where all four inputs have a value (the mean over their series:
/// canaries, servers) and throughput is positive, or the first input with no data at all.
fn observations(
    store: &Store,
    since_ms: i64,
    until_ms: i64,
    step_ms: i64,
) -> Result<(TimedObservations, Option<Signal>)> {
    let mut columns: Vec<BTreeMap<i64, f64>> = Vec::new();
    for signal in INPUTS {
        let mut sums: BTreeMap<i64, (f64, usize)> = BTreeMap::new();
        for series in
            store.range(signal.name, &BTreeMap::new(), since_ms, until_ms, step_ms, Resolution::Minute)?
        {
            for (t, v) in series.points {
                let e = sums.entry(t).or_default();
                e.0 += v;
                e.1 += 1;
            }
        }
        if sums.is_empty() {
            return Ok((Vec::new(), Some(signal)));
        }
        columns.push(sums.into_iter().map(|(t, (s, n))| (t, s / n as f64)).collect());
    }
    // A minute in which the server generated nothing has no throughput to divide by (a
    // server reports 0 tokens/s when idle): it is left out.
    let obs = columns[0]
        .iter()
        .filter_map(|(t, &latency_s)| {
            Some((
                *t,
                CoupledObservation {
                    latency_s,
                    throughput: *columns[1].get(t).filter(|&&v| v > 0.0)?,
                    ttft_s: *columns[2].get(t)?,
                    quality: 1.0 - *columns[3].get(t)?,
                },
            ))
        })
        .collect();
    Ok((obs, None))
}

impl Engine {
    /// Refits the model over the last `explain.window` once `explain.interval` of event time
    /// has passed; the result rides along in every summary until the next refit.
    pub(super) fn refresh_explanation(&mut self, now_ms: i64) -> Result<()> {
        let e = &self.cfg.explain;
        let every = e.interval.as_millis() as i64;
        if self.explained_at_ms.is_some_and(|t| now_ms - t < every && now_ms >= t) {
            return Ok(());
        }
        let window = e.window.as_millis() as i64;
        let since = now_ms - window;
        self.explanation = Some(explain(
            &self.store,
            since,
            now_ms + 1,
            since + window / 2,
            60_000,
            e.confidence,
            e.min_r_squared,
        )?);
        self.explained_at_ms = Some(now_ms);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omen_sources::Sample;

    /// A store with `minutes` of the four inputs, one sample each a minute, latency from
    /// known coefficients (c 0.5, α 40, β 0.6, γ 3) plus small deterministic noise; TTFT
    /// rises in the second half.
    fn store_with_history(dir: &std::path::Path, minutes: i64) -> Store {
        let store = Store::open(&dir.join("omen.db")).unwrap();
        let canary: BTreeMap<String, String> = [("canary".to_owned(), "c1".to_owned())].into();
        let mut samples = Vec::new();
        for m in 0..minutes {
            let ts_ms = m * 60_000 + 30_000;
            let x = m as f64;
            let throughput = 60.0 + 40.0 * (x * 0.37).sin();
            let ttft = 0.3 + 0.2 * (x * 0.91).cos() + if m >= minutes / 2 { 0.4 } else { 0.0 };
            let rci = 0.2 + 0.1 * (x * 1.7).sin();
            let noise = 0.01 * (x * 12.9898).sin();
            let latency = 0.5 + 40.0 / throughput + 0.6 * ttft + 3.0 * rci + noise;
            for (signal, value) in [(INPUTS[0], latency), (INPUTS[2], ttft), (INPUTS[3], rci)] {
                samples.push(Sample { ts_ms, signal: signal.name.into(), labels: canary.clone(), value });
            }
            samples.push(Sample {
                ts_ms,
                signal: INPUTS[1].name.into(),
                labels: BTreeMap::new(),
                value: throughput,
            });
        }
        store.insert(&samples).unwrap();
        store.flush().unwrap();
        store
    }

    #[test]
    fn the_store_history_gives_the_coefficients_and_the_ttft_share_of_the_change() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_history(dir.path(), 120);
        let e = explain(&store, 0, 120 * 60_000, 60 * 60_000, 60_000, 0.95, 0.5).unwrap();
        let model = e.model.as_ref().expect("fitted");
        assert_eq!(model.observations, 120);
        for (got, want) in [(model.alpha, 40.0), (model.beta, 0.6), (model.gamma, 3.0)] {
            let got = got.expect("every input varies");
            assert!(got.lower <= want && want <= got.upper, "{want} outside {got:?}");
        }
        let a = e.attribution.as_ref().expect("attributed");
        // The second half's TTFT is 0.4 s higher: 0.6 * 0.4 = 0.24 s of latency.
        assert!((a.ttft_s - 0.24).abs() < 0.03, "{a:?}");
        assert!(e.reason.is_none());
    }

    #[test]
    fn missing_inputs_and_a_poor_fit_say_why() {
        let dir = tempfile::tempdir().unwrap();
        let empty = Store::open(&dir.path().join("empty.db")).unwrap();
        let e = explain(&empty, 0, 3_600_000, 1_800_000, 60_000, 0.95, 0.5).unwrap();
        assert!(e.model.is_none());
        assert!(e.reason.unwrap().contains("canary_e2e_seconds"));
        let store = store_with_history(dir.path(), 10);
        let e = explain(&store, 0, 600_000, 300_000, 60_000, 0.95, 0.5).unwrap();
        assert!(e.reason.unwrap().contains("too few"), "10 minutes cannot be fitted");
        let other = tempfile::tempdir().unwrap();
        let store = store_with_history(other.path(), 120);
        let e = explain(&store, 0, 120 * 60_000, 60 * 60_000, 60_000, 0.95, 1.0).unwrap();
        assert!(e.model.is_some() && e.attribution.is_none());
        assert!(e.reason.unwrap().contains("explain.min_r_squared"));
    }
}
