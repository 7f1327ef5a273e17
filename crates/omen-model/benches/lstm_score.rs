//! Per-window scoring latency of the LSTM autoencoder on CPU (batch of one window, the
//! agent's case), full and pruned to 60% of the hidden units. The target is <= 1 ms.

use criterion::{criterion_group, criterion_main, Criterion};
use omen_model::features::FeatureSet;
use omen_model::lstm_ae::{LstmAeConfig, LstmAutoencoder};

fn series(n: usize) -> Vec<Vec<f64>> {
    (0..n)
        .map(|i| vec![(i as f64 * std::f64::consts::TAU / 24.0).sin() + ((i * 7919) % 13) as f64 * 0.01])
        .collect()
}

fn bench(c: &mut Criterion) {
    tch::set_num_threads(1);
    let cfg = LstmAeConfig { epochs: 3, ..Default::default() };
    let data = series(600);
    let fs = FeatureSet::parse(vec!["value".into()], "raw,diff").unwrap();
    let model = LstmAutoencoder::train(fs, &data, &cfg, &mut |_| {}).unwrap();
    let (pruned, _) = model.prune(0.6, None, 0).unwrap();
    let rows = model.meta.features.transform_all(&data[..cfg.window]).unwrap();
    let mut g = c.benchmark_group("lstm_ae_score_window");
    g.bench_function("full_w32_h32", |b| b.iter(|| model.score_window(std::hint::black_box(&rows)).unwrap()));
    g.bench_function("pruned_w32_h19", |b| {
        b.iter(|| pruned.score_window(std::hint::black_box(&rows)).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
