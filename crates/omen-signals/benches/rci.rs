//! Streaming RCI per-token update for a 512-token answer (target <= 2 us per token).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use omen_signals::bleu::BleuReference;
use omen_signals::{RciWeights, StreamingRci};
use std::hint::black_box;
use std::sync::Arc;

const WORDS: &[&str] = &[
    "The",
    " KV",
    " cache",
    " stores",
    " keys",
    " and",
    " values",
    " for",
    " every",
    " layer",
    ",",
    " so",
    " long",
    " contexts",
    " need",
    " more",
    " blocks",
    ".",
    " Paged",
    " attention",
    " allocates",
    " 16",
    "-token",
    " blocks",
    " on",
    " demand",
    " (",
    "see",
    " vLLM",
    ")",
    " and",
    " frees",
    " them",
    " when",
    " a",
    " request",
    " ends",
    ".",
];

fn answer_tokens(n: usize) -> Vec<&'static str> {
    (0..n).map(|i| WORDS[(i * 7 + i / 13) % WORDS.len()]).collect()
}

fn bench(c: &mut Criterion) {
    let tokens = answer_tokens(512);
    let reference_text: String = answer_tokens(480).concat();
    let reference = Arc::new(BleuReference::new(&[reference_text]).unwrap());
    let mut group = c.benchmark_group("rci_streaming");
    group.throughput(Throughput::Elements(tokens.len() as u64));
    group.bench_function("push_512_tokens", |b| {
        b.iter(|| {
            let mut s = StreamingRci::new(reference.clone(), RciWeights::default());
            for t in black_box(&tokens) {
                s.push_token(t);
            }
            s.finish(None).unwrap().value
        })
    });
    group.bench_function("push_512_tokens_reading_each", |b| {
        b.iter(|| {
            let mut s = StreamingRci::new(reference.clone(), RciWeights::default());
            let mut acc = 0.0;
            for t in black_box(&tokens) {
                s.push_token(t);
                acc += s.lexical().0.score;
            }
            acc
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
