//! Sliding windows over a multivariate series, the autoencoder's input.

use crate::ModelError;

/// Windows of `len` consecutive rows, every `stride` rows: [window][time][feature].
pub fn sliding_windows(
    rows: &[Vec<f64>],
    len: usize,
    stride: usize,
) -> Result<Vec<Vec<Vec<f64>>>, ModelError> {
    if len == 0 || stride == 0 {
        return Err(ModelError::Parameter {
            parameter: "window",
            reason: "window length and stride must be at least 1".into(),
        });
    }
    if rows.len() < len {
        return Err(ModelError::TooFew { what: "rows for one window", have: rows.len(), need: len });
    }
    Ok((0..=rows.len() - len).step_by(stride).map(|start| rows[start..start + len].to_vec()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_cover_the_series() {
        let rows: Vec<Vec<f64>> = (0..10).map(|i| vec![i as f64]).collect();
        let w = sliding_windows(&rows, 4, 3).unwrap();
        assert_eq!(w.len(), 3);
        assert_eq!(w[2][0][0], 6.0);
        assert_eq!(w[2][3][0], 9.0);
        assert!(sliding_windows(&rows, 11, 1).is_err());
        assert!(sliding_windows(&rows, 0, 1).is_err());
    }
}
