//! Scratch: context surprise with a time-of-day tag and soft neighbours.
use omen_model::nab::{self, NabCorpus};
use omen_signals::RangeNovelty;
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
type Files = Vec<(String, Vec<String>, Vec<f64>)>;

struct Cs {
    low: f64,
    width: f64,
    bins: usize,
    order: usize,
    alpha: f64,
    counts: Vec<HashMap<u64, (Vec<f64>, f64)>>,
    recent: VecDeque<u16>,
    nb: usize,
}
impl Cs {
    fn new(low: f64, high: f64, bins: usize, order: usize, alpha: f64, nb: usize) -> Self {
        Self {
            low,
            width: (high - low) / bins as f64,
            bins,
            order,
            alpha,
            counts: vec![HashMap::new(); order + 2],
            recent: VecDeque::new(),
            nb,
        }
    }
    fn bin(&self, x: f64) -> u16 {
        let b = ((x - self.low) / self.width).floor();
        if b < 0.0 {
            0
        } else if b >= self.bins as f64 {
            (self.bins + 1) as u16
        } else {
            b as u16 + 1
        }
    }
    fn ctx(&self, k: usize, tag: u64) -> u64 {
        let base = (self.bins + 2) as u64;
        self.recent.iter().skip(self.recent.len() - k).fold(tag, |c, &b| c * base + b as u64)
    }
    fn push(&mut self, x: f64, tag: u64) -> f64 {
        let bin = self.bin(x) as usize;
        let n = (self.bins + 2) as f64;
        let longest = self.order.min(self.recent.len());
        let mut s = 1.0;
        for k in (0..=longest).rev() {
            if let Some((next, total)) = self.counts[k].get(&self.ctx(k, tag)) {
                let lo = bin.saturating_sub(self.nb);
                let hi = (bin + self.nb).min(self.bins + 1);
                let c: f64 = (lo..=hi).map(|b| next[b] * if b == bin { 1.0 } else { 0.5 }).sum();
                s = 1.0 - (c + self.alpha) / (total + self.alpha * n);
                break;
            }
        }
        for k in 0..=longest {
            let code = self.ctx(k, tag);
            let e = self.counts[k].entry(code).or_insert_with(|| (vec![0.0; self.bins + 2], 0.0));
            e.0[bin] += 1.0;
            e.1 += 1.0;
        }
        self.recent.push_back(bin as u16);
        if self.recent.len() > self.order {
            self.recent.pop_front();
        }
        s.clamp(0.0, 1.0)
    }
}
fn hour(ts: &str) -> u64 {
    ts.get(11..13).and_then(|h| h.parse().ok()).unwrap_or(0)
}
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let get = |i: usize, d: f64| a.get(i).map(|s| s.parse().unwrap()).unwrap_or(d);
    let (bins, order, alpha, pad) = (get(0, 16.0) as usize, get(1, 3.0) as usize, get(2, 1.0), 0.2);
    let hb = get(3, 4.0) as u64;
    let nb = get(4, 0.0) as usize;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/nab");
    let corpus = NabCorpus::load(&dir)?;
    let names = ["base", "tod", "max(base,tod)", "min(base,tod)"];
    let mut columns: Vec<Files> = vec![Vec::new(); names.len()];
    for rel in nab::data_files(&dir)? {
        let (ts, values) = nab::read_csv_column(&dir.join("data").join(&rel), "value")?;
        let p = nab::probation_length(values.len());
        let (lo, hi) =
            values[..p].iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
        let m = ((hi - lo) * pad).max(1e-9);
        let mut c0 = Cs::new(lo - m, hi + m, bins, order, alpha, nb);
        let mut c1 = Cs::new(lo - m, hi + m, bins, order, alpha, nb);
        let mut nv = RangeNovelty::new(0.01, 200)?;
        let mut out: Vec<Vec<f64>> = vec![Vec::with_capacity(values.len()); names.len()];
        for (i, (&v, t)) in values.iter().zip(&ts).enumerate() {
            let novel = if nv.push(v)? { 1.0 } else { 0.0 };
            let s0 = c0.push(v, 0);
            let s1 = c1.push(v, 1 + hour(t) / (24 / hb.max(1)));
            let z = |x: f64| if i < p { 0.0 } else { x };
            for (col, x) in out.iter_mut().zip([
                z(s0).max(novel),
                z(s1).max(novel),
                z(s0.max(s1)).max(novel),
                z(s0.min(s1)).max(novel),
            ]) {
                col.push(x);
            }
        }
        for (col, scores) in columns.iter_mut().zip(out) {
            col.push((rel.clone(), ts.clone(), scores));
        }
    }
    let cost = corpus.cost("standard")?;
    let mut line = format!("bins {bins} order {order} alpha {alpha} hb {hb} nb {nb}:");
    for (n, col) in names.iter().zip(&columns) {
        let (b, norm) = nab::optimised_normalised(&corpus, col, &cost)?;
        line += &format!(" {n} {norm:.2} ({:.4});", b.threshold);
    }
    println!("{line}");
    Ok(())
}
