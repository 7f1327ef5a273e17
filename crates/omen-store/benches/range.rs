//! A 14-day /scores range query on one series of a store that holds 15 days of 64 series
//! (the query the history benchmark asks: step 1h, answered from hour sums), the same query
//! from minute aggregates, and the cost of merely reading the same block bytes from
//! SQLite: the ratios are what decoding and bucketing add.

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use omen_sources::Sample;
use omen_store::{Resolution, Store, DAY_MS};

const T0: i64 = 1_793_577_600_000; // a UTC midnight
const DAYS: i64 = 15;
const SERIES: usize = 64;
/// Two samples a minute: enough for minute aggregates, quick to fill.
const PERIOD_MS: i64 = 30_000;

fn labels(layer: usize) -> BTreeMap<String, String> {
    [("gpu".to_owned(), "0".to_owned()), ("layer".to_owned(), layer.to_string())].into()
}

/// 15 days of 64 series, compacted as the agent leaves it.
fn filled(dir: &std::path::Path) -> Store {
    let store = Store::open(&dir.join("omen.db")).unwrap();
    let end = T0 + DAYS * DAY_MS;
    let batch_span = 600_000; // ten minutes of every series per batch
    let mut t = T0;
    while t < end {
        let batch: Vec<Sample> = (t..t + batch_span)
            .step_by(PERIOD_MS as usize)
            .flat_map(|ts| {
                (0..SERIES).map(move |layer| Sample {
                    ts_ms: ts,
                    signal: "kv_fragmentation".into(),
                    labels: labels(layer),
                    value: 1.0 + ((ts / PERIOD_MS) as f64 * 0.01 + layer as f64).sin().abs(),
                })
            })
            .collect();
        // Raw rows are not what a 14-day query reads; keep the fill quick.
        store.insert_with_raw(&batch, &vec![false; batch.len()]).unwrap();
        t += batch_span;
        if (t - T0) % (6 * 3_600_000) == 0 {
            store.compact_all(t).unwrap();
        }
    }
    store.compact_all(end).unwrap();
    store
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = filled(dir.path());
    let until = T0 + DAYS * DAY_MS;
    let since = until - 14 * DAY_MS;
    let layer = labels(17);
    let mut group = c.benchmark_group("range_14d_one_series");
    // What /scores answers a 14-day query at step 1h from (hour sums), and the same from minutes.
    for (name, resolution) in
        [("query_step_1h", Resolution::Hour), ("query_step_1h_from_minutes", Resolution::Minute)]
    {
        group.bench_function(name, |b| {
            b.iter(|| {
                let r = store
                    .range("kv_fragmentation", black_box(&layer), since, until, 3_600_000, resolution)
                    .unwrap();
                assert_eq!(r[0].points.len(), 336);
                r
            })
        });
    }
    let conn = rusqlite::Connection::open(store.path()).unwrap();
    let id: i64 = conn
        .query_row("SELECT id FROM series WHERE labels = ?1", [serde_json::to_string(&layer).unwrap()], |r| {
            r.get(0)
        })
        .unwrap();
    group.bench_function("reference_read_block_bytes", |b| {
        let mut stmt = conn
            .prepare(
                "SELECT data FROM minute_blocks WHERE series_id = ?1 AND start_ms > ?2 AND start_ms < ?3",
            )
            .unwrap();
        b.iter(|| {
            let mut bytes = 0usize;
            let mut rows = stmt.query(rusqlite::params![id, since - 6 * 3_600_000, until]).unwrap();
            while let Some(r) = rows.next().unwrap() {
                bytes += r.get_ref(0).unwrap().as_blob().unwrap().len();
            }
            bytes
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
