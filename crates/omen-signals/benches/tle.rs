//! TLE over 128k f32 logits against a plain memory-read pass over the same array.
//!
//! Hot: one 512 KiB vector read again and again (L2/L3-resident on the 2-core EPYC VM).
//! Cold: each iteration takes the next of 128 distinct vectors (64 MiB, twice the L3),
//! so the data comes from DRAM, as a sidecar scoring a fresh logits vector sees it.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use omen_signals::first_token_entropy_bits;
use std::hint::black_box;

const VOCAB: usize = 128 * 1024;
/// Distinct vectors in the cold pool: 128 x 512 KiB = 64 MiB.
const COLD_VECTORS: usize = 128;

/// The baseline: read every logit once (an 8-lane sum, which the compiler vectorises).
///
/// Its single chain of dependent vector adds (3 cycles per 8 floats on Zen 3, ~30 GiB/s
/// at 3 GHz) is what bounds it when the data is in cache, not the cache itself.
fn memory_read_pass(xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for c in xs.chunks_exact(8) {
        for l in 0..8 {
            acc[l] += c[l];
        }
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn memory_read_pass_avx2(xs: &[f32]) -> f32 {
    memory_read_pass(xs)
}

fn read_pass(xs: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present.
        return unsafe { memory_read_pass_avx2(xs) };
    }
    memory_read_pass(xs)
}

fn logits(n: usize) -> Vec<f32> {
    logits_seeded(n, 0x9E37_79B9)
}

fn logits_seeded(n: usize, seed: u32) -> Vec<f32> {
    // deterministic pseudo-random logits in about [-10, 10] with one peak
    let mut state = seed | 1;
    let mut v: Vec<f32> = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state as f32 / u32::MAX as f32) * 20.0 - 10.0
        })
        .collect();
    v[n / 3] = 30.0;
    v
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("tle_128k");
    group.throughput(Throughput::Bytes((VOCAB * 4) as u64));
    let x = logits(VOCAB);
    group.bench_with_input(BenchmarkId::new("memory_read_pass", VOCAB), &x, |b, x| {
        b.iter(|| read_pass(black_box(x)))
    });
    group.bench_with_input(BenchmarkId::new("first_token_entropy_bits", VOCAB), &x, |b, x| {
        b.iter(|| first_token_entropy_bits(black_box(x)).unwrap())
    });
    group.bench_with_input(BenchmarkId::new("scalar_libm_two_pass", VOCAB), &x, |b, x| {
        // what a straightforward implementation costs: libm exp, max pass then sum pass
        b.iter(|| {
            let x = black_box(x);
            let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let (mut s, mut t) = (0.0f64, 0.0f64);
            for &v in x {
                let y = v - m;
                let e = y.exp();
                s += e as f64;
                t += (e * y) as f64;
            }
            (s.ln() - t / s) / std::f64::consts::LN_2
        })
    });
    let pool: Vec<Vec<f32>> =
        (0..COLD_VECTORS as u32).map(|i| logits_seeded(VOCAB, 0x2545_F491 ^ (i * 7919))).collect();
    let mut next = 0usize;
    group.bench_function(BenchmarkId::new("memory_read_pass_cold", VOCAB), |b| {
        b.iter(|| {
            next = (next + 1) % COLD_VECTORS;
            read_pass(black_box(&pool[next]))
        })
    });
    group.bench_function(BenchmarkId::new("first_token_entropy_bits_cold", VOCAB), |b| {
        b.iter(|| {
            next = (next + 1) % COLD_VECTORS;
            first_token_entropy_bits(black_box(&pool[next])).unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
