//! NoveltySurprise throughput (omen's NAB detector): two context models and a range check
//! per value, so that a per-series detector costs little at the agent's rates.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use omen_signals::{NoveltySurprise, NoveltySurpriseConfig};
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let n = 100_000;
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let xs: Vec<(f64, f64)> = (0..n)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let day = (i % 288) as f64 / 288.0;
            (
                50.0 + 20.0 * (day * std::f64::consts::TAU).sin()
                    + (state >> 11) as f64 / (1u64 << 53) as f64 * 5.0,
                day,
            )
        })
        .collect();
    let mut group = c.benchmark_group("novelty_surprise");
    group.throughput(Throughput::Elements(n as u64));
    group.bench_function("push", |b| {
        b.iter(|| {
            let mut d = NoveltySurprise::new(20.0, 80.0, 750, NoveltySurpriseConfig::default()).unwrap();
            let mut acc = 0.0;
            for &(x, day) in black_box(&xs) {
                acc += d.push(x, day).unwrap();
            }
            acc
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
