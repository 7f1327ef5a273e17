//! One BERTScore pair (a canary-length answer against its reference) on the CPU:
//! tokenisation, two encoder passes over all-MiniLM-L6-v2 and the greedy matching.
//! Needs the model from `make setup`.

use criterion::{criterion_group, criterion_main, Criterion};
use omen_model::bertscore::{model_dir, BertScorer};

fn bench_pair(c: &mut Criterion) {
    let scorer = BertScorer::load(&model_dir()).unwrap_or_else(|e| panic!("{e}"));
    // As the agent runs it: one libtorch thread unless OMP_NUM_THREADS says otherwise.
    let scorer = match std::env::var("OMP_NUM_THREADS").ok().and_then(|v| v.parse().ok()) {
        Some(n) => scorer.with_threads(n),
        None => scorer.with_threads(1),
    };
    let candidate = "The capital of France is Paris, which is also the country's largest city.";
    let reference = "Paris is the capital of France.";
    c.bench_function("bertscore_pair_canary", |b| b.iter(|| scorer.score(candidate, reference).unwrap()));
    let long_answer = "The operator checks the cache, the queue and the latency of each request. ".repeat(8);
    c.bench_function("bertscore_pair_128_tokens", |b| {
        b.iter(|| scorer.score(&long_answer, &long_answer).unwrap())
    });
}

criterion_group!(benches, bench_pair);
criterion_main!(benches);
