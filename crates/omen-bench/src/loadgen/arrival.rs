//! Session arrivals: a Poisson process whose rate is piecewise constant, re-drawn
//! every `change_every` from Gamma(k, rate/k) (mean `rate`, CV 1/sqrt(k)), and
//! scaled by the back-off throttle. Within a segment the gaps are exponential;
//! a gap that crosses a segment end restarts there (memorylessness), so the
//! process is exactly Poisson with the piecewise rate.

use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Exp1, Gamma};

use super::workflow::ArrivalConfig;

/// Generator of session start times, in seconds from the start of the run.
#[derive(Debug)]
pub struct Arrivals {
    mean_rate: f64,
    gamma: Option<Gamma<f64>>,
    change_every: f64,
    rate: f64,
    segment_end: f64,
    now: f64,
    rng: StdRng,
    /// How many times the rate was re-drawn.
    pub rate_changes: u64,
}

impl Arrivals {
    /// A process for `cfg`, seeded for reproducible runs.
    pub fn new(cfg: &ArrivalConfig, seed: u64) -> Self {
        let gamma = cfg.rate_shape.and_then(|k| Gamma::new(k, cfg.rate / k).ok());
        let mut me = Self {
            mean_rate: cfg.rate,
            gamma,
            change_every: cfg.change_every.as_secs_f64(),
            rate: cfg.rate,
            segment_end: cfg.change_every.as_secs_f64(),
            now: 0.0,
            rng: StdRng::seed_from_u64(seed),
            rate_changes: 0,
        };
        me.rate = me.draw_rate();
        me
    }

    fn draw_rate(&mut self) -> f64 {
        match &self.gamma {
            Some(g) => g.sample(&mut self.rng).max(self.mean_rate * 1e-6),
            None => self.mean_rate,
        }
    }

    /// The next arrival time; `throttle` in (0, 1] scales the rate (1 = no back-off).
    pub fn next_arrival(&mut self, throttle: f64) -> f64 {
        let throttle = throttle.clamp(1e-6, 1.0);
        loop {
            let e: f64 = Exp1.sample(&mut self.rng);
            let t = self.now + e / (self.rate * throttle);
            if t < self.segment_end {
                self.now = t;
                return t;
            }
            self.now = self.segment_end;
            self.segment_end += self.change_every;
            self.rate = self.draw_rate();
            self.rate_changes += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cfg(rate: f64, shape: Option<f64>, every: f64) -> ArrivalConfig {
        ArrivalConfig { rate, rate_shape: shape, change_every: Duration::from_secs_f64(every) }
    }

    #[test]
    fn constant_rate_gaps_are_exponential() {
        let mut a = Arrivals::new(&cfg(4.0, None, 5.0), 7);
        let mut prev = 0.0;
        let mut gaps: Vec<f64> = (0..4000)
            .map(|_| {
                let t = a.next_arrival(1.0);
                let g = t - prev;
                prev = t;
                g
            })
            .collect();
        let n = gaps.len() as f64;
        let mean = gaps.iter().sum::<f64>() / n;
        assert!((mean - 0.25).abs() < 0.25 * 0.06, "mean gap {mean}");
        // Kolmogorov-Smirnov against Exp(4): D below the 1% critical value 1.63/sqrt(n).
        gaps.sort_by(f64::total_cmp);
        let d = gaps
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let f = 1.0 - (-4.0 * x).exp();
                (f - i as f64 / n).abs().max(((i + 1) as f64 / n - f).abs())
            })
            .fold(0.0, f64::max);
        assert!(d < 1.63 / n.sqrt(), "KS D = {d}");
        // A different law is rejected by the same check: Exp(3) gaps are not Exp(4).
        let d3 = gaps
            .iter()
            .enumerate()
            .map(|(i, &x)| ((1.0 - (-3.0 * x).exp()) - i as f64 / n).abs())
            .fold(0.0, f64::max);
        assert!(d3 > 1.63 / n.sqrt(), "KS D vs Exp(3) = {d3}");
    }

    #[test]
    fn gamma_rate_changes_keep_the_mean_and_add_burstiness() {
        // Rate re-drawn every second from Gamma(k = 2, mean 5) over 4000 s.
        let mut a = Arrivals::new(&cfg(5.0, Some(2.0), 1.0), 11);
        let horizon = 4000.0;
        let mut counts = vec![0u32; horizon as usize];
        loop {
            let t = a.next_arrival(1.0);
            if t >= horizon {
                break;
            }
            counts[t as usize] += 1;
        }
        let n = counts.len() as f64;
        let mean = counts.iter().map(|&c| c as f64).sum::<f64>() / n;
        let var = counts.iter().map(|&c| (c as f64 - mean).powi(2)).sum::<f64>() / (n - 1.0);
        assert!((mean - 5.0).abs() < 0.2, "mean count per second {mean}");
        // Mixed Poisson: Var = E[rate] + Var[rate] = 5 + 25/2 = 17.5, far above Poisson's 5.
        assert!((var - 17.5).abs() < 2.5, "variance {var}");
        assert!(a.rate_changes >= 3999, "{}", a.rate_changes);
    }

    #[test]
    fn throttle_slows_and_seed_reproduces() {
        let take = |seed, throttle| {
            let mut a = Arrivals::new(&cfg(10.0, Some(4.0), 2.0), seed);
            (0..2000).map(|_| a.next_arrival(throttle)).last().unwrap()
        };
        assert_eq!(take(3, 1.0), take(3, 1.0));
        assert_ne!(take(3, 1.0), take(4, 1.0));
        let last = |throttle| {
            let mut a = Arrivals::new(&cfg(10.0, None, 1e6), 5);
            (0..2000).map(|_| a.next_arrival(throttle)).last().unwrap()
        };
        let (full, half) = (last(1.0), last(0.5));
        assert!((half / full - 2.0).abs() < 1e-9, "{full} vs {half}");
    }
}
