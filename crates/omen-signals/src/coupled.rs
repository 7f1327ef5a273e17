//! The coupled degradation model: end-to-end latency explained by throughput, time to first
//! token and output quality,
//!
//! L = c + α·(1/T) + β·F + γ·(1−Q) + ε,
//!
//! fitted by robust regression (Huber M-estimation by iteratively reweighted least squares,
//! so that a few stalled requests do not set the coefficients), with t-intervals from the
//! final weighted fit and R² of its residuals. A latency change between two periods is then
//! attributed to each term: the coefficient times the change of the term's mean; what the
//! terms do not explain is reported as such. The intercept c absorbs the baseline latency,
//! so the seed's ΔL form (latency change against a baseline) is the same model.

use statrs::distribution::{ContinuousCDF, StudentsT};

/// One observation period (e.g. one minute) of the four series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CoupledObservation {
    /// End-to-end latency L, seconds.
    pub latency_s: f64,
    /// Throughput T, tokens per second (> 0).
    pub throughput: f64,
    /// Time to first token F, seconds.
    pub ttft_s: f64,
    /// Output quality Q in [0, 1] (1 − RCI).
    pub quality: f64,
}

impl CoupledObservation {
    /// The regressors (1, 1/T, F, 1−Q).
    fn row(&self) -> [f64; 4] {
        [1.0, 1.0 / self.throughput, self.ttft_s, 1.0 - self.quality]
    }
}

/// The names of the model's terms, in coefficient order after the intercept.
pub const TERMS: [&str; 3] = ["throughput (alpha, 1/T)", "ttft (beta, F)", "quality (gamma, 1-Q)"];

/// One fitted coefficient with its confidence interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Coefficient {
    /// Estimate.
    pub estimate: f64,
    /// Standard error.
    pub std_error: f64,
    /// Lower end of the interval.
    pub lower: f64,
    /// Upper end of the interval.
    pub upper: f64,
}

/// A fitted coupled model.
#[derive(Debug, Clone, PartialEq)]
pub struct CoupledFit {
    /// Baseline latency c, seconds.
    pub intercept: Coefficient,
    /// α, seconds per (1 / (tokens/s)); None when throughput did not vary.
    pub alpha: Option<Coefficient>,
    /// β, seconds of latency per second of TTFT; None when TTFT did not vary.
    pub beta: Option<Coefficient>,
    /// γ, seconds of latency per unit of lost quality; None when quality did not vary (a
    /// greedy canary on an unchanged model answers the same every time).
    pub gamma: Option<Coefficient>,
    /// 1 − SS_res / SS_tot of the robust fit's residuals.
    pub r_squared: f64,
    /// Observations used.
    pub observations: usize,
    /// Robust residual scale (MAD / 0.6745), seconds.
    pub residual_scale: f64,
    /// Confidence level of the intervals.
    pub confidence: f64,
}

impl CoupledFit {
    /// Predicted latency for one observation.
    pub fn predict(&self, o: &CoupledObservation) -> f64 {
        let row = o.row();
        self.intercept.estimate
            + self.terms().iter().zip(&row[1..]).map(|(c, x)| c.map_or(0.0, |c| c.estimate) * x).sum::<f64>()
    }

    /// α, β, γ in [`TERMS`] order.
    pub fn terms(&self) -> [Option<Coefficient>; 3] {
        [self.alpha, self.beta, self.gamma]
    }
}

/// Why a fit could not be made; each says what to change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoupledError {
    /// Too few observations for four coefficients and their intervals.
    #[error("{have} observations are too few to fit the coupled model; it needs at least {needed} (collect more history or widen the period)")]
    TooFewObservations {
        /// Observations given.
        have: usize,
        /// Observations needed.
        needed: usize,
    },
    /// A value is NaN, infinite, or a throughput is not positive.
    #[error("observation {index}: {field} = {value} is not usable ({reason}); drop that period")]
    BadValue {
        /// Observation index.
        index: usize,
        /// Which series.
        field: &'static str,
        /// The value.
        value: f64,
        /// What is wrong.
        reason: &'static str,
    },
    /// No input varies, so nothing can be told from the intercept.
    #[error("throughput, TTFT and quality are all constant over the period, so no effect can be estimated; fit over a period in which they change")]
    NothingVaries,
    /// Two or more inputs move together, so their effects cannot be told apart.
    #[error("the inputs are collinear ({first} and {second} correlate at {correlation:.3}), so their effects cannot be told apart; fit over a period in which they vary independently")]
    Collinear {
        /// One term.
        first: &'static str,
        /// The term most correlated with it.
        second: &'static str,
        /// Their correlation.
        correlation: f64,
    },
    /// The confidence level is not in (0, 1).
    #[error("confidence = {0} must be in (0, 1), e.g. 0.95")]
    Confidence(f64),
}

/// Huber's tuning constant: 95% efficiency under normal errors.
const HUBER_K: f64 = 1.345;
/// Least observations per coefficient.
const OBSERVATIONS_PER_COEFFICIENT: usize = 5;
/// Determinant of the regressors' correlation matrix below which they count as collinear.
const MIN_CORRELATION_DETERMINANT: f64 = 1e-4;
const IRLS_ITERATIONS: usize = 50;

/// Fits the coupled model to `obs` with intervals at `confidence` (e.g. 0.95).
pub fn fit_coupled(obs: &[CoupledObservation], confidence: f64) -> Result<CoupledFit, CoupledError> {
    if !(confidence > 0.0 && confidence < 1.0) {
        return Err(CoupledError::Confidence(confidence));
    }
    let needed = 4 * OBSERVATIONS_PER_COEFFICIENT;
    if obs.len() < needed {
        return Err(CoupledError::TooFewObservations { have: obs.len(), needed });
    }
    for (index, o) in obs.iter().enumerate() {
        for (field, value) in [
            ("latency_s", o.latency_s),
            ("throughput", o.throughput),
            ("ttft_s", o.ttft_s),
            ("quality", o.quality),
        ] {
            if !value.is_finite() {
                return Err(CoupledError::BadValue { index, field, value, reason: "not a finite number" });
            }
        }
        if o.throughput <= 0.0 {
            let value = o.throughput;
            return Err(CoupledError::BadValue {
                index,
                field: "throughput",
                value,
                reason: "must be positive",
            });
        }
    }
    let mut rows: Vec<[f64; 4]> = obs.iter().map(CoupledObservation::row).collect();
    let y: Vec<f64> = obs.iter().map(|o| o.latency_s).collect();
    // A constant term is left out: its column is zeroed and its coefficient pinned to 0 (it
    // would only repeat the intercept).
    let dropped = check_design(&rows)?;
    for r in &mut rows {
        for (j, d) in dropped.iter().enumerate() {
            if *d {
                r[j + 1] = 0.0;
            }
        }
    }

    // The first pass is ordinary least squares: its (XᵀX)⁻¹ is also what the intervals need.
    let mut weights = vec![1.0; rows.len()];
    let (mut beta, unweighted_inverse) =
        weighted_least_squares(&rows, &y, &weights, dropped).expect("checked design is invertible");
    let mut scale = 0.0;
    for _ in 0..IRLS_ITERATIONS {
        let residuals: Vec<f64> = rows.iter().zip(&y).map(|(r, y)| y - dot(r, &beta)).collect();
        scale = mad_scale(&residuals);
        if scale <= f64::EPSILON * (1.0 + y.iter().map(|v| v.abs()).fold(0.0, f64::max)) {
            break; // an exact fit: every weight stays 1
        }
        for (w, r) in weights.iter_mut().zip(&residuals) {
            let u = (r / scale).abs();
            *w = if u <= HUBER_K { 1.0 } else { HUBER_K / u };
        }
        let next =
            weighted_least_squares(&rows, &y, &weights, dropped).expect("checked design is invertible").0;
        let moved = next.iter().zip(&beta).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        beta = next;
        if moved <= 1e-10 * (1.0 + beta.iter().map(|b| b.abs()).fold(0.0, f64::max)) {
            break;
        }
    }
    // Huber's asymptotic covariance: s² · mean(ψ²)·n/(n−p) / mean(ψ')² · (XᵀX)⁻¹, with
    // ψ the Huber function of the scaled residuals (weighted least squares' own covariance
    // would understate it: down-weighting shrinks the residual sum).
    let n = rows.len();
    let dof = (n - 4) as f64;
    let sigma2 = if scale > 0.0 {
        let u: Vec<f64> = rows.iter().zip(&y).map(|(r, y)| (y - dot(r, &beta)) / scale).collect();
        let psi2 = u.iter().map(|u| u.clamp(-HUBER_K, HUBER_K).powi(2)).sum::<f64>() / dof;
        let slope = u.iter().filter(|u| u.abs() <= HUBER_K).count() as f64 / n as f64;
        scale * scale * psi2 / (slope * slope).max(f64::MIN_POSITIVE)
    } else {
        0.0
    };
    let t = StudentsT::new(0.0, 1.0, dof).expect("dof > 0").inverse_cdf(0.5 + confidence / 2.0);
    let coefficient = |i: usize| {
        let std_error = (sigma2 * unweighted_inverse[i][i]).max(0.0).sqrt();
        Coefficient {
            estimate: beta[i],
            std_error,
            lower: beta[i] - t * std_error,
            upper: beta[i] + t * std_error,
        }
    };
    let mean_y = y.iter().sum::<f64>() / n as f64;
    let ss_tot: f64 = y.iter().map(|v| (v - mean_y).powi(2)).sum();
    let ss_res: f64 = rows.iter().zip(&y).map(|(r, y)| (y - dot(r, &beta)).powi(2)).sum();
    let r_squared = if ss_tot > 0.0 { 1.0 - ss_res / ss_tot } else { 1.0 };
    Ok(CoupledFit {
        intercept: coefficient(0),
        alpha: (!dropped[0]).then(|| coefficient(1)),
        beta: (!dropped[1]).then(|| coefficient(2)),
        gamma: (!dropped[2]).then(|| coefficient(3)),
        r_squared,
        observations: n,
        residual_scale: scale,
        confidence,
    })
}

/// A latency change between two periods split by term.
#[derive(Debug, Clone, PartialEq)]
pub struct Attribution {
    /// Mean latency of the first period, seconds.
    pub before_s: f64,
    /// Mean latency of the second period, seconds.
    pub after_s: f64,
    /// Each term's share of the change, seconds, in [`TERMS`] order.
    pub terms: [f64; 3],
    /// The change the terms do not explain, seconds.
    pub unexplained_s: f64,
}

impl Attribution {
    /// The whole change, seconds.
    pub fn change_s(&self) -> f64 {
        self.after_s - self.before_s
    }
}

/// Splits the change of mean latency from `before` to `after` (both non-empty) by term:
/// each coefficient times the change of its regressor's mean.
pub fn attribute(
    fit: &CoupledFit,
    before: &[CoupledObservation],
    after: &[CoupledObservation],
) -> Attribution {
    let mean_row = |o: &[CoupledObservation]| {
        let mut m = [0.0; 4];
        for r in o.iter().map(CoupledObservation::row) {
            for (m, v) in m.iter_mut().zip(r) {
                *m += v / o.len() as f64;
            }
        }
        m
    };
    let mean_latency = |o: &[CoupledObservation]| o.iter().map(|o| o.latency_s).sum::<f64>() / o.len() as f64;
    let (b, a) = (mean_row(before), mean_row(after));
    let coefs = fit.terms().map(|c| c.map_or(0.0, |c| c.estimate));
    let terms = [coefs[0] * (a[1] - b[1]), coefs[1] * (a[2] - b[2]), coefs[2] * (a[3] - b[3])];
    let (before_s, after_s) = (mean_latency(before), mean_latency(after));
    Attribution { before_s, after_s, terms, unexplained_s: after_s - before_s - terms.iter().sum::<f64>() }
}

/// Which terms are constant (left out), and an error for collinear ones, found on the
/// correlation matrix of the terms that vary.
fn check_design(rows: &[[f64; 4]]) -> Result<[bool; 3], CoupledError> {
    let n = rows.len() as f64;
    let mut means = [0.0; 3];
    for r in rows {
        for j in 0..3 {
            means[j] += r[j + 1] / n;
        }
    }
    let centred: Vec<[f64; 3]> =
        rows.iter().map(|r| [r[1] - means[0], r[2] - means[1], r[3] - means[2]]).collect();
    let mut norms = [0.0; 3];
    for c in &centred {
        for j in 0..3 {
            norms[j] += c[j] * c[j];
        }
    }
    let dropped: [bool; 3] =
        std::array::from_fn(|j| norms[j].sqrt() <= 1e-12 * (1.0 + means[j].abs()) * n.sqrt());
    let active: Vec<usize> = (0..3).filter(|&j| !dropped[j]).collect();
    if active.is_empty() {
        return Err(CoupledError::NothingVaries);
    }
    let mut corr = [[0.0; 3]; 3];
    for c in &centred {
        for &i in &active {
            for &j in &active {
                corr[i][j] += c[i] * c[j] / (norms[i] * norms[j]).sqrt();
            }
        }
    }
    for j in 0..3 {
        if dropped[j] {
            corr[j][j] = 1.0; // the identity in the left-out rows: the determinant is the active block's
        }
    }
    let det = corr[0][0] * (corr[1][1] * corr[2][2] - corr[1][2] * corr[2][1])
        - corr[0][1] * (corr[1][0] * corr[2][2] - corr[1][2] * corr[2][0])
        + corr[0][2] * (corr[1][0] * corr[2][1] - corr[1][1] * corr[2][0]);
    if det < MIN_CORRELATION_DETERMINANT {
        let (i, j) = [(0, 1), (0, 2), (1, 2)]
            .into_iter()
            .max_by(|a, b| corr[a.0][a.1].abs().total_cmp(&corr[b.0][b.1].abs()))
            .expect("three pairs");
        return Err(CoupledError::Collinear { first: TERMS[i], second: TERMS[j], correlation: corr[i][j] });
    }
    Ok(dropped)
}

fn dot(a: &[f64; 4], b: &[f64; 4]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// Robust residual scale: median absolute deviation from the median, over 0.6745.
fn mad_scale(residuals: &[f64]) -> f64 {
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let m = v.len() / 2;
        if v.len() % 2 == 1 {
            v[m]
        } else {
            (v[m - 1] + v[m]) / 2.0
        }
    };
    let mut r = residuals.to_vec();
    let med = median(&mut r);
    let mut dev: Vec<f64> = residuals.iter().map(|x| (x - med).abs()).collect();
    median(&mut dev) / 0.6745
}

/// Weighted least squares: the coefficients and (XᵀWX)⁻¹, or None when singular.
///
/// Four unknowns: Gauss-Jordan elimination with partial pivoting on the 4×4 normal equations.
/// nalgebra (the maintained choice) would raise the workspace's minimum Rust version from
/// 1.85 to 1.89 for this one solve.
fn weighted_least_squares(
    rows: &[[f64; 4]],
    y: &[f64],
    w: &[f64],
    dropped: [bool; 3],
) -> Option<([f64; 4], [[f64; 4]; 4])> {
    let mut a = [[0.0; 8]; 4];
    let mut rhs = [0.0; 4];
    for ((r, y), w) in rows.iter().zip(y).zip(w) {
        for i in 0..4 {
            rhs[i] += w * r[i] * y;
            for j in 0..4 {
                a[i][j] += w * r[i] * r[j];
            }
        }
    }
    for (i, row) in a.iter_mut().enumerate() {
        row[4 + i] = 1.0;
    }
    // A left-out term's row reads 1 * b = 0 (its column is zero, so nothing else sees it).
    for (j, d) in dropped.iter().enumerate() {
        if *d {
            a[j + 1][j + 1] = 1.0;
        }
    }
    for col in 0..4 {
        let pivot = (col..4).max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs()))?;
        if a[pivot][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, pivot);
        let p = a[col][col];
        for v in a[col].iter_mut() {
            *v /= p;
        }
        for r in 0..4 {
            if r != col {
                let f = a[r][col];
                let pivot_row = a[col];
                for (v, pv) in a[r].iter_mut().zip(pivot_row) {
                    *v -= f * pv;
                }
            }
        }
    }
    let mut inverse = [[0.0; 4]; 4];
    for i in 0..4 {
        inverse[i].copy_from_slice(&a[i][4..]);
    }
    let mut coef = [0.0; 4];
    for i in 0..4 {
        coef[i] = (0..4).map(|j| inverse[i][j] * rhs[j]).sum();
    }
    Some((coef, inverse))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    /// Observations from known coefficients, inputs varying independently, Gaussian-ish noise.
    fn generated(
        n: usize,
        (c, a, b, g): (f64, f64, f64, f64),
        noise: f64,
        seed: u64,
    ) -> Vec<CoupledObservation> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                let throughput = rng.random_range(20.0..200.0);
                let ttft_s = rng.random_range(0.05..1.5);
                let quality = rng.random_range(0.6..1.0);
                // Sum of uniforms: near-normal noise with sd = noise.
                let e: f64 = (0..12).map(|_| rng.random_range(-0.5..0.5)).sum::<f64>() * noise;
                let latency_s = c + a / throughput + b * ttft_s + g * (1.0 - quality) + e;
                CoupledObservation { latency_s, throughput, ttft_s, quality }
            })
            .collect()
    }

    #[test]
    fn known_coefficients_are_recovered_within_their_intervals() {
        let truth = (0.8, 38.0, 0.52, 2.9);
        let obs = generated(400, truth, 0.05, 7);
        let fit = fit_coupled(&obs, 0.95).unwrap();
        for (c, want) in [
            (fit.intercept, truth.0),
            (fit.alpha.unwrap(), truth.1),
            (fit.beta.unwrap(), truth.2),
            (fit.gamma.unwrap(), truth.3),
        ] {
            assert!(c.lower <= want && want <= c.upper, "{want} outside [{}, {}]", c.lower, c.upper);
        }
        assert!(fit.r_squared > 0.9, "{}", fit.r_squared);
    }

    #[test]
    fn the_intervals_cover_the_truth_at_their_level() {
        let truth = [0.8, 38.0, 0.52, 2.9];
        let runs = 300;
        let mut covered = [0usize; 4];
        for seed in 0..runs {
            let fit = fit_coupled(&generated(200, (truth[0], truth[1], truth[2], truth[3]), 0.05, seed), 0.9)
                .unwrap();
            for (i, c) in
                [fit.intercept, fit.alpha.unwrap(), fit.beta.unwrap(), fit.gamma.unwrap()].iter().enumerate()
            {
                covered[i] += usize::from(c.lower <= truth[i] && truth[i] <= c.upper);
            }
        }
        for (i, n) in covered.iter().enumerate() {
            let share = *n as f64 / runs as f64;
            assert!((0.85..=0.95).contains(&share), "coefficient {i}: 90% intervals covered {share}");
        }
    }

    #[test]
    fn outliers_do_not_move_the_robust_fit() {
        let truth = (0.8, 38.0, 0.52, 2.9);
        let mut obs = generated(300, truth, 0.05, 3);
        // 5% of periods with a stalled request: latency far above the model.
        for o in obs.iter_mut().step_by(20) {
            o.latency_s += 30.0;
        }
        let fit = fit_coupled(&obs, 0.95).unwrap();
        assert!((fit.beta.unwrap().estimate - truth.2).abs() < 0.05, "{:?}", fit.beta);
        assert!((fit.alpha.unwrap().estimate - truth.1).abs() < 4.0, "{:?}", fit.alpha);
    }

    #[test]
    fn attribution_sums_to_the_change() {
        let truth = (0.8, 38.0, 0.52, 2.9);
        let obs = generated(200, truth, 0.01, 11);
        let fit = fit_coupled(&obs, 0.95).unwrap();
        // The same periods again, with a TTFT regression of 0.5 s and its true latency cost.
        let before = &obs[..100];
        let after: Vec<CoupledObservation> = before
            .iter()
            .map(|o| CoupledObservation {
                ttft_s: o.ttft_s + 0.5,
                latency_s: o.latency_s + truth.2 * 0.5,
                ..*o
            })
            .collect();
        let at = attribute(&fit, before, &after);
        let sum: f64 = at.terms.iter().sum::<f64>() + at.unexplained_s;
        assert!((sum - at.change_s()).abs() < 1e-9);
        assert!((at.change_s() - 0.26).abs() < 1e-9);
        assert!((at.terms[1] - 0.26).abs() < 0.01, "{at:?}");
        assert!(at.terms[0].abs() < 1e-9 && at.terms[2].abs() < 1e-9, "{at:?}");
        assert!(at.unexplained_s.abs() < 0.01, "{at:?}");
    }

    #[test]
    fn too_little_history_constant_and_collinear_inputs_are_named() {
        let obs = generated(10, (0.8, 38.0, 0.52, 2.9), 0.05, 1);
        assert_eq!(fit_coupled(&obs, 0.95), Err(CoupledError::TooFewObservations { have: 10, needed: 20 }));
        let mut constant = generated(50, (0.8, 38.0, 0.52, 2.9), 0.05, 1);
        for o in &mut constant {
            o.quality = 0.9;
        }
        // Constant quality (a greedy canary): its term is left out, the others still fit.
        let fit = fit_coupled(&constant, 0.95).unwrap();
        assert!(fit.gamma.is_none() && fit.alpha.is_some() && fit.beta.is_some());
        assert!(fit.beta.unwrap().lower <= 0.52 && 0.52 <= fit.beta.unwrap().upper, "{:?}", fit.beta);
        for o in &mut constant {
            o.throughput = 50.0;
            o.ttft_s = 0.2;
        }
        assert_eq!(fit_coupled(&constant, 0.95), Err(CoupledError::NothingVaries));
        let mut collinear = generated(50, (0.8, 38.0, 0.52, 2.9), 0.05, 1);
        for o in &mut collinear {
            o.ttft_s = 3.0 / o.throughput; // TTFT moves exactly with 1/T
        }
        let e = fit_coupled(&collinear, 0.95).unwrap_err();
        assert!(matches!(e, CoupledError::Collinear { .. }), "{e}");
        assert!(e.to_string().contains("throughput") && e.to_string().contains("ttft"), "{e}");
        let mut bad = generated(50, (0.8, 38.0, 0.52, 2.9), 0.05, 1);
        bad[3].throughput = 0.0;
        assert!(fit_coupled(&bad, 0.95).unwrap_err().to_string().contains("observation 3: throughput"));
        assert!(fit_coupled(&generated(50, (0.8, 38.0, 0.52, 2.9), 0.05, 1), 1.0).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Noise-free data is fitted exactly (R² = 1) whatever the coefficients.
        #[test]
        fn noise_free_data_is_fitted_exactly(
            c in -5.0..5.0f64, a in -100.0..100.0f64, b in -3.0..3.0f64, g in -10.0..10.0f64, seed in 0u64..1000
        ) {
            let obs = generated(40, (c, a, b, g), 0.0, seed);
            let fit = fit_coupled(&obs, 0.9).unwrap();
            for (got, want) in [(fit.intercept.estimate, c), (fit.alpha.unwrap().estimate, a), (fit.beta.unwrap().estimate, b), (fit.gamma.unwrap().estimate, g)] {
                prop_assert!((got - want).abs() <= 1e-6 * (1.0 + want.abs()), "{got} vs {want}");
            }
            for o in &obs {
                prop_assert!((fit.predict(o) - o.latency_s).abs() < 1e-6);
            }
        }
    }
}
