//! Window anomaly score throughput (target >= 20 M samples/s on one core).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use omen_signals::WindowAnomaly;
use std::hint::black_box;

fn series(n: usize) -> Vec<f64> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    (0..n)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            100.0 + (i as f64 * 0.01).sin() * 5.0 + (state >> 11) as f64 / (1u64 << 53) as f64
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let n = 1_000_000;
    let xs = series(n);
    let mut group = c.benchmark_group("window_score");
    group.throughput(Throughput::Elements(n as u64));
    for w in [60usize, 1440] {
        group.bench_with_input(BenchmarkId::new("streaming", w), &w, |b, &w| {
            b.iter(|| {
                let mut s = WindowAnomaly::new(w).unwrap();
                let mut acc = 0.0;
                for &x in black_box(&xs) {
                    if let Some(sc) = s.push(x).unwrap() {
                        acc += sc.score;
                    }
                }
                acc
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
