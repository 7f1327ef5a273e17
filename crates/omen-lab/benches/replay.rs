//! Replay throughput through the agent's pipeline (`omen replay`'s path: the engine, the
//! offline store, compaction between batches, a tick per health interval): samples per
//! second over the vram-leak scenario of deploy/scenarios (9 series at 60 s). `cargo bench`
//! replays all of its 42 days; the test run of the benchmark (`cargo test --benches`)
//! replays 3, to check that it works.

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use omen_agent::config::Config;
use omen_lab::simulate::{simulate, Scenario};

fn replay(c: &mut Criterion) {
    let scenario_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/scenarios/vram-leak.yaml");
    let mut scenario = Scenario::load(&scenario_path).unwrap();
    // `cargo bench` passes --bench; the benchmark's test run does not.
    if !std::env::args().any(|a| a == "--bench") {
        scenario.days = 3.0;
    }
    let dir = tempfile::tempdir().unwrap();
    let labels = simulate(&scenario, dir.path()).unwrap();
    let trace = dir.path().join("trace.jsonl.gz");
    let samples = labels.samples as u64;
    let mut group = c.benchmark_group("replay");
    group.throughput(Throughput::Elements(samples));
    group.sample_size(10);
    group.bench_function(format!("vram-leak {} days, {samples} samples", scenario.days), |b| {
        b.iter_batched(
            || {
                let db = tempfile::tempdir().unwrap();
                let mut cfg = Config::default();
                cfg.store.path = db.path().join("omen.db");
                (db, Arc::new(cfg))
            },
            |(db, cfg)| {
                let path = cfg.store.path.clone();
                let report = omen_lab::replay::replay_into(cfg, &trace, &path).unwrap();
                assert_eq!(report.samples as u64, samples);
                black_box(report);
                db
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, replay);
criterion_main!(benches);
