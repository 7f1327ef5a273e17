//! Feature rows for the autoencoder, derived from raw source columns the same way in
//! training (batch) and in the agent (one row per health tick), so both see one input.

use serde::{Deserialize, Serialize};

use crate::ModelError;

/// How a feature is derived from its source column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "window")]
pub enum Transform {
    /// The value itself.
    Raw,
    /// x_t - x_{t-1} (0 for the first row).
    Diff,
    /// Mean of the last `n` values (fewer at the start).
    RollingMean(usize),
    /// Population std of the last `n` values (fewer at the start).
    RollingStd(usize),
}

/// One feature: a source column (a CSV column or a series such as `kv_fragmentation{layer="0"}`) and a transform.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeatureSpec {
    /// Index of the source column in the raw rows.
    pub source: usize,
    /// The transform.
    pub transform: Transform,
}

/// The features of a model: its source names (the raw row order) and the derived features.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeatureSet {
    /// Names of the raw source columns, in raw-row order.
    pub sources: Vec<String>,
    /// Derived features, in model-input order.
    pub features: Vec<FeatureSpec>,
}

impl FeatureSet {
    /// Every source as a raw feature.
    pub fn raw(sources: Vec<String>) -> Self {
        let features =
            (0..sources.len()).map(|source| FeatureSpec { source, transform: Transform::Raw }).collect();
        Self { sources, features }
    }

    /// Parses a comma-separated transform list such as `raw,diff,mean:8,std:8`, applied to every source.
    pub fn parse(sources: Vec<String>, list: &str) -> Result<Self, ModelError> {
        let mut transforms = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let bad = || ModelError::Parameter {
                parameter: "features",
                reason: format!("{item:?} is not one of raw, diff, mean:N, std:N (N >= 2)"),
            };
            let t = match item.split_once(':') {
                None if item == "raw" => Transform::Raw,
                None if item == "diff" => Transform::Diff,
                Some((kind, n)) => {
                    let n: usize = n.parse().map_err(|_| bad())?;
                    if n < 2 {
                        return Err(bad());
                    }
                    match kind {
                        "mean" => Transform::RollingMean(n),
                        "std" => Transform::RollingStd(n),
                        _ => return Err(bad()),
                    }
                }
                None => return Err(bad()),
            };
            transforms.push(t);
        }
        if transforms.is_empty() || sources.is_empty() {
            return Err(ModelError::Parameter {
                parameter: "features",
                reason: "need at least one source and one transform (e.g. raw)".into(),
            });
        }
        let features = (0..sources.len())
            .flat_map(|source| transforms.iter().map(move |&transform| FeatureSpec { source, transform }))
            .collect();
        Ok(Self { sources, features })
    }

    /// Number of model-input features.
    pub fn width(&self) -> usize {
        self.features.len()
    }

    /// A streaming builder over raw rows.
    pub fn builder(&self) -> FeatureBuilder {
        let history = self
            .features
            .iter()
            .map(|f| match f.transform {
                Transform::Raw | Transform::Diff => 1,
                Transform::RollingMean(n) | Transform::RollingStd(n) => n,
            })
            .max()
            .unwrap_or(1);
        FeatureBuilder { set: self.clone(), history, past: std::collections::VecDeque::new() }
    }

    /// Feature rows of a whole series of raw rows (row i uses raw rows up to i).
    pub fn transform_all(&self, raw: &[Vec<f64>]) -> Result<Vec<Vec<f64>>, ModelError> {
        let mut b = self.builder();
        raw.iter().enumerate().map(|(i, r)| b.push(r).map_err(|e| e.at_row(i))).collect()
    }
}

/// Derives feature rows one raw row at a time.
#[derive(Debug, Clone)]
pub struct FeatureBuilder {
    set: FeatureSet,
    history: usize,
    past: std::collections::VecDeque<Vec<f64>>,
}

impl FeatureBuilder {
    /// The feature row for the next raw row.
    pub fn push(&mut self, raw: &[f64]) -> Result<Vec<f64>, ModelError> {
        if raw.len() != self.set.sources.len() {
            return Err(ModelError::Width { row: 0, got: raw.len(), expected: self.set.sources.len() });
        }
        if let Some((feature, &value)) = raw.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(ModelError::NonFinite { row: 0, feature, value });
        }
        self.past.push_back(raw.to_vec());
        if self.past.len() > self.history {
            self.past.pop_front();
        }
        let last = |n: usize, s: usize| self.past.iter().rev().take(n).map(move |r| r[s]);
        Ok(self
            .set
            .features
            .iter()
            .map(|f| match f.transform {
                Transform::Raw => raw[f.source],
                Transform::Diff => {
                    let n = self.past.len();
                    if n >= 2 {
                        raw[f.source] - self.past[n - 2][f.source]
                    } else {
                        0.0
                    }
                }
                Transform::RollingMean(n) => {
                    let k = n.min(self.past.len()) as f64;
                    last(n, f.source).sum::<f64>() / k
                }
                Transform::RollingStd(n) => {
                    let k = n.min(self.past.len()) as f64;
                    let m = last(n, f.source).sum::<f64>() / k;
                    (last(n, f.source).map(|v| (v - m) * (v - m)).sum::<f64>() / k).sqrt()
                }
            })
            .collect())
    }
}

impl ModelError {
    /// The same error with the row index set (row-wise errors from a streaming builder).
    fn at_row(self, row: usize) -> Self {
        match self {
            ModelError::Width { got, expected, .. } => ModelError::Width { row, got, expected },
            ModelError::NonFinite { feature, value, .. } => ModelError::NonFinite { row, feature, value },
            e => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transforms_match_their_definitions() {
        let set = FeatureSet::parse(vec!["value".into()], "raw,diff,mean:3,std:3").unwrap();
        assert_eq!(set.width(), 4);
        let raw: Vec<Vec<f64>> = [1.0, 4.0, 2.0, 8.0].iter().map(|&v| vec![v]).collect();
        let rows = set.transform_all(&raw).unwrap();
        assert_eq!(rows[0], vec![1.0, 0.0, 1.0, 0.0]);
        assert_eq!(rows[1], vec![4.0, 3.0, 2.5, 1.5]);
        let m = 14.0 / 3.0;
        assert!((rows[3][2] - m).abs() < 1e-12);
        let var = [4.0f64, 2.0, 8.0].iter().map(|v| (v - m) * (v - m)).sum::<f64>() / 3.0;
        assert!((rows[3][3] - var.sqrt()).abs() < 1e-12);
        assert_eq!(rows[3][1], 6.0);
    }

    #[test]
    fn bad_lists_and_rows_are_errors() {
        assert!(FeatureSet::parse(vec!["v".into()], "raw,median:3").is_err());
        assert!(FeatureSet::parse(vec!["v".into()], "mean:1").is_err());
        assert!(FeatureSet::parse(vec![], "raw").is_err());
        let set = FeatureSet::raw(vec!["a".into(), "b".into()]);
        assert_eq!(
            set.transform_all(&[vec![1.0, 2.0], vec![1.0]]).unwrap_err(),
            ModelError::Width { row: 1, got: 1, expected: 2 }
        );
    }
}
