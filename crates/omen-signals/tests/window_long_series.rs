//! The streaming window score against the direct formula evaluated in
//! double-double arithmetic (about 106 bits), over long series: equal to 1e-9 relative.

use omen_signals::{WindowAnomaly, SKEW_WEIGHT, STD_EPSILON};
use rand::{rngs::StdRng, RngExt, SeedableRng};

/// A double-double number hi + lo with |lo| <= ulp(hi) / 2.
#[derive(Clone, Copy)]
struct Dd(f64, f64);

fn two_sum(a: f64, b: f64) -> Dd {
    let s = a + b;
    let bb = s - a;
    Dd(s, (a - (s - bb)) + (b - bb))
}

fn two_prod(a: f64, b: f64) -> Dd {
    let p = a * b;
    Dd(p, a.mul_add(b, -p))
}

impl Dd {
    fn from(x: f64) -> Self {
        Dd(x, 0.0)
    }
    fn add(self, o: Dd) -> Dd {
        let s = two_sum(self.0, o.0);
        let e = s.1 + self.1 + o.1;
        two_sum(s.0, e)
    }
    fn neg(self) -> Dd {
        Dd(-self.0, -self.1)
    }
    fn mul(self, o: Dd) -> Dd {
        let p = two_prod(self.0, o.0);
        let e = p.1 + (self.0 * o.1 + self.1 * o.0);
        two_sum(p.0, e)
    }
    fn div_f64(self, d: f64) -> Dd {
        let q1 = self.0 / d;
        let r = self.add(two_prod(q1, d).neg());
        let q2 = r.0 / d;
        two_sum(q1, q2)
    }
    fn to_f64(self) -> f64 {
        self.0 + self.1
    }
}

/// The DESIGN.md formula with every sum and deviation in double-double.
fn precise_score(window: &[f64], x: f64) -> f64 {
    let n = window.len() as f64;
    let mean = window.iter().fold(Dd::from(0.0), |s, &v| s.add(Dd::from(v))).div_f64(n);
    let (mut m2, mut m3) = (Dd::from(0.0), Dd::from(0.0));
    for &v in window {
        let d = Dd::from(v).add(mean.neg());
        let d2 = d.mul(d);
        m2 = m2.add(d2);
        m3 = m3.add(d2.mul(d));
    }
    let (m2, m3) = (m2.to_f64(), m3.to_f64());
    let std = (m2 / n).sqrt();
    let degenerate = window.iter().all(|&v| v == window[0]);
    let skew = if degenerate { 0.0 } else { (m3 / (m2 * m2.sqrt())) * (n * (n - 1.0).sqrt() / (n - 2.0)) };
    let z = Dd::from(x).add(mean.neg()).to_f64().abs() / (std + STD_EPSILON);
    z + SKEW_WEIGHT * skew.abs()
}

fn check(name: &str, values: &[f64], w: usize, stride: usize) {
    let mut scorer = WindowAnomaly::new(w).unwrap();
    let mut worst = 0.0f64;
    for (i, &x) in values.iter().enumerate() {
        let got = scorer.push(x).unwrap();
        // the precise reference is O(w) per point: check a stride of points, all of them near the end
        if i >= w && (i % stride == 0 || i + 500 > values.len()) {
            let expected = precise_score(&values[i - w..i], x);
            let got = got.unwrap().score;
            let rel = (got - expected).abs() / expected.abs().max(1.0);
            worst = worst.max(rel);
            assert!(rel <= 1e-9, "{name} i={i}: {got} vs precise {expected} (rel {rel:e})");
        }
    }
    println!("{name}: {} samples, window {w}, worst relative error {worst:e}", values.len());
}

#[test]
fn long_series_stay_within_1e9_of_the_precise_formula() {
    let mut rng = StdRng::seed_from_u64(99);
    let n = 1_000_000;
    let gaussian: Vec<f64> =
        (0..n).map(|_| rng.random_range(-1.0..1.0) + rng.random_range(-1.0..1.0)).collect();
    check("gaussian-ish", &gaussian, 60, 97);

    let mut walk = Vec::with_capacity(n);
    let mut level = 1e6;
    for _ in 0..n {
        level += rng.random_range(-1.0..1.0);
        walk.push(level);
    }
    check("random walk at 1e6", &walk, 128, 101);

    let spikes: Vec<f64> =
        (0..n).map(|i| if i % 5003 == 0 { 1e7 } else { 3.0 + 1e-3 * rng.random_range(-1.0..1.0) }).collect();
    check("rare huge spikes", &spikes, 50, 89);

    let plateaus: Vec<f64> =
        (0..200_000).map(|i| if (i / 700) % 2 == 0 { 0.1 } else { 0.1 + 1e-9 * (i % 7) as f64 }).collect();
    check("constant and near-constant plateaus", &plateaus, 40, 13);

    let ramp: Vec<f64> = (0..n).map(|i| 1e-3 * i as f64 + rng.random_range(0.0..0.01)).collect();
    check("ramp", &ramp, 288, 211);
}
