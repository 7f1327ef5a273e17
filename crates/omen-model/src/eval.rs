//! Window-based detection metrics: a labelled window is found when any detection lies in
//! it; each run of consecutive detections outside every window is one false positive.

use serde::Serialize;

use omen_nab::CostMatrix;

/// NAB's cost matrix of a profile (config/profiles.json of NAB), for callers without the NAB folder.
pub fn nab_profile(name: &str) -> Option<CostMatrix> {
    match name {
        "standard" => Some(CostMatrix { tp: 1.0, fp: 0.11, fn_: 1.0, tn: 1.0 }),
        "reward_low_FP_rate" => Some(CostMatrix { tp: 1.0, fp: 0.22, fn_: 1.0, tn: 1.0 }),
        "reward_low_FN_rate" => Some(CostMatrix { tp: 1.0, fp: 0.11, fn_: 2.0, tn: 1.0 }),
        _ => None,
    }
}

/// Window-based counts and rates.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WindowF1 {
    /// Windows with at least one detection.
    pub tp: usize,
    /// Windows without one.
    pub fn_: usize,
    /// Runs of detections outside every window.
    pub fp: usize,
    /// tp / (tp + fp), 0 when nothing was detected.
    pub precision: f64,
    /// tp / (tp + fn), 0 without windows.
    pub recall: f64,
    /// Harmonic mean of precision and recall.
    pub f1: f64,
}

impl WindowF1 {
    /// Rates from counts (also for sums over files).
    pub fn from_counts(tp: usize, fn_: usize, fp: usize) -> Self {
        let ratio = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let (precision, recall) = (ratio(tp, tp + fp), ratio(tp, tp + fn_));
        let f1 = if precision + recall > 0.0 { 2.0 * precision * recall / (precision + recall) } else { 0.0 };
        Self { tp, fn_, fp, precision, recall, f1 }
    }
}

/// Scores `detected` (one flag per row) against inclusive row windows; rows before `from` are ignored.
pub fn window_f1(detected: &[bool], windows: &[(usize, usize)], from: usize) -> WindowF1 {
    let inside = |i: usize| windows.iter().any(|&(a, b)| a <= i && i <= b);
    let tp =
        windows.iter().filter(|&&(a, b)| (a.max(from)..=b).any(|i| detected.get(i) == Some(&true))).count();
    let mut fp = 0;
    let mut in_run = false;
    for (i, &d) in detected.iter().enumerate().skip(from) {
        let outside = d && !inside(i);
        if outside && !in_run {
            fp += 1;
        }
        in_run = outside;
    }
    WindowF1::from_counts(tp, windows.len() - tp, fp)
}

/// Row index ranges of timestamp windows (`2014-01-01 00:00:00.000000` matches `2014-01-01 00:00:00`).
pub fn window_rows(
    timestamps: &[String],
    windows: &[(String, String)],
) -> Result<Vec<(usize, usize)>, String> {
    let key = |s: &str| s.trim().split('.').next().unwrap_or("").to_string();
    let find = |t: &str| {
        let k = key(t);
        timestamps
            .iter()
            .position(|x| key(x) == k)
            .ok_or_else(|| format!("window limit {t} is not a timestamp of the data"))
    };
    windows.iter().map(|(a, b)| Ok((find(a)?, find(b)?))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_the_definition() {
        let mut d = vec![false; 100];
        d[12] = true; // in window 1
        d[13] = true;
        d[40] = true; // FP run 1
        d[41] = true;
        d[70] = true; // FP run 2
        d[2] = true; // ignored (before `from`)
        let w = [(10, 20), (50, 60)];
        let r = window_f1(&d, &w, 5);
        assert_eq!((r.tp, r.fn_, r.fp), (1, 1, 2));
        assert!((r.precision - 1.0 / 3.0).abs() < 1e-12 && (r.recall - 0.5).abs() < 1e-12);
        assert!((r.f1 - 0.4).abs() < 1e-12);
        assert_eq!(window_f1(&[false; 10], &[], 0).f1, 0.0);
        let ts: Vec<String> = ["a", "b.000", "c"].iter().map(|s| s.to_string()).collect();
        assert_eq!(window_rows(&ts, &[("b".into(), "c".into())]).unwrap(), vec![(1, 2)]);
        assert!(window_rows(&ts, &[("x".into(), "c".into())]).is_err());
        assert_eq!(nab_profile("reward_low_FN_rate").unwrap().fn_, 2.0);
    }
}
