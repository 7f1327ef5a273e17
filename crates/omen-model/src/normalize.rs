//! Per-feature z-score normalisation fitted on normal (training) data.

use serde::{Deserialize, Serialize};

use crate::ModelError;

/// Mean and standard deviation of each feature, from the training rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Normalizer {
    /// Per-feature means.
    pub mean: Vec<f64>,
    /// Per-feature standard deviations (a constant feature gets 1, so it maps to 0).
    pub std: Vec<f64>,
}

fn check_rows(rows: &[Vec<f64>], width: usize) -> Result<(), ModelError> {
    for (r, row) in rows.iter().enumerate() {
        if row.len() != width {
            return Err(ModelError::Width { row: r, got: row.len(), expected: width });
        }
        if let Some((f, &value)) = row.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(ModelError::NonFinite { row: r, feature: f, value });
        }
    }
    Ok(())
}

impl Normalizer {
    /// Fits on `rows` (each a feature vector of equal width).
    pub fn fit(rows: &[Vec<f64>]) -> Result<Self, ModelError> {
        if rows.len() < 2 {
            return Err(ModelError::TooFew { what: "training rows", have: rows.len(), need: 2 });
        }
        let width = rows[0].len();
        if width == 0 {
            return Err(ModelError::Parameter { parameter: "rows", reason: "rows have no features".into() });
        }
        check_rows(rows, width)?;
        let n = rows.len() as f64;
        let mut mean = vec![0.0; width];
        for row in rows {
            for (m, v) in mean.iter_mut().zip(row) {
                *m += v;
            }
        }
        for m in &mut mean {
            *m /= n;
        }
        let mut std = vec![0.0; width];
        for row in rows {
            for ((s, v), m) in std.iter_mut().zip(row).zip(&mean) {
                *s += (v - m) * (v - m) / n;
            }
        }
        for s in &mut std {
            *s = if *s > 0.0 { s.sqrt() } else { 1.0 };
        }
        Ok(Self { mean, std })
    }

    /// Number of features.
    pub fn width(&self) -> usize {
        self.mean.len()
    }

    /// Normalises rows with the fitted statistics.
    pub fn transform(&self, rows: &[Vec<f64>]) -> Result<Vec<Vec<f64>>, ModelError> {
        check_rows(rows, self.width())?;
        Ok(rows
            .iter()
            .map(|row| row.iter().zip(&self.mean).zip(&self.std).map(|((v, m), s)| (v - m) / s).collect())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fitted_rows_have_zero_mean_unit_std() {
        let rows: Vec<Vec<f64>> = (0..100).map(|i| vec![i as f64, 5.0, (i % 7) as f64 * 2.0]).collect();
        let n = Normalizer::fit(&rows).unwrap();
        let t = n.transform(&rows).unwrap();
        for f in 0..3 {
            let mean: f64 = t.iter().map(|r| r[f]).sum::<f64>() / 100.0;
            let var: f64 = t.iter().map(|r| r[f] * r[f]).sum::<f64>() / 100.0;
            assert!(mean.abs() < 1e-9, "feature {f}: mean {mean}");
            assert!(f == 1 || (var - 1.0).abs() < 1e-9, "feature {f}: variance {var}");
        }
        assert!(t.iter().all(|r| r[1] == 0.0), "a constant feature maps to 0");
    }

    #[test]
    fn bad_rows_are_errors() {
        assert!(Normalizer::fit(&[vec![1.0]]).is_err());
        assert_eq!(
            Normalizer::fit(&[vec![1.0], vec![1.0, 2.0]]).unwrap_err(),
            ModelError::Width { row: 1, got: 2, expected: 1 }
        );
        assert!(matches!(
            Normalizer::fit(&[vec![1.0], vec![f64::NAN]]),
            Err(ModelError::NonFinite { row: 1, .. })
        ));
    }
}
