//! A store written by a released omen (schema version 1, made by scripts/make-store-fixture.sh
//! with that release's binary: two days of one KV layer every 5 minutes) opens in this omen
//! with its history intact and takes new samples. A change of the schema must come with a
//! migration that keeps this test passing.

use std::collections::BTreeMap;
use std::io::Read as _;

use omen_sources::Sample;
use omen_store::{RangeSeries, Resolution, Store};

const DAY1: i64 = 1_793_491_200_000; // 2026-11-01T00:00:00Z

#[test]
fn a_store_of_the_previous_release_opens_with_its_history() {
    let gz = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/store-schema1.db.gz")).unwrap();
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut bytes).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("omen.db");
    std::fs::write(&path, bytes).unwrap();

    let store = Store::open(&path).expect("the previous release's store opens");
    // Migrated to schema 2 (the block tables) on open; its rows are read as they are.
    assert_eq!(store.meta("schema_version").unwrap().as_deref(), Some("2"));
    let days = store.day_aggregates("kvcache_usage_ratio", DAY1, DAY1 + 2 * 86_400_000).unwrap();
    let first = days.iter().find(|d| d.day_ms == DAY1).expect("day 1 rolled up");
    assert_eq!(first.count, 288);
    assert!((first.mean - 143.5 / 288.0).abs() < 1e-12, "{}", first.mean);
    let layer: BTreeMap<String, String> = [("layer".to_owned(), "3".to_owned())].into();
    let raw =
        store.range("kvcache_usage_ratio", &layer, DAY1, DAY1 + 3_600_000, 300_000, Resolution::Raw).unwrap();
    assert_eq!(raw[0].points.len(), 12, "an hour of 5-minute samples");
    assert_eq!(raw[0].points[1], (DAY1 + 300_000, 5.0 / 1440.0));

    // And it keeps working: new samples of the same series go to the same series.
    let labels: BTreeMap<String, String> =
        [("gpu".to_owned(), "0".to_owned()), ("layer".to_owned(), "3".to_owned())].into();
    let next = DAY1 + 2 * 86_400_000;
    store
        .insert(&[Sample {
            ts_ms: next,
            signal: "kvcache_usage_ratio".into(),
            labels: labels.clone(),
            value: 0.5,
        }])
        .unwrap();
    assert_eq!(store.series_matching("kvcache_usage_ratio", &BTreeMap::new()), 1);

    // The old rows move into blocks and read the same.
    let before_minutes =
        store.range("kvcache_usage_ratio", &layer, DAY1, next + 1, 3_600_000, Resolution::Minute).unwrap();
    let before_raw =
        store.range("kvcache_usage_ratio", &layer, DAY1, next + 1, 600_000, Resolution::Raw).unwrap();
    let raw_count = store.raw_sample_count().unwrap();
    let moved = store.compact_all(next + 86_400_000).unwrap();
    assert!(moved.rows > raw_count as usize, "raw rows and minute rows moved: {moved:?}");
    assert_eq!(store.compact_all(next + 86_400_000).unwrap().rows, 0, "nothing sealed is left");
    assert_eq!(store.raw_sample_count().unwrap(), raw_count);
    // The same buckets; sealed values keep 24 significant bits.
    let same = |a: &[RangeSeries], b: &[RangeSeries]| {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.labels, y.labels);
            assert_eq!(x.points.len(), y.points.len());
            for (p, q) in x.points.iter().zip(&y.points) {
                assert!(p.0 == q.0 && (p.1 - q.1).abs() <= 2e-7 * q.1.abs().max(1.0), "{p:?} vs {q:?}");
            }
        }
    };
    same(
        &store.range("kvcache_usage_ratio", &layer, DAY1, next + 1, 600_000, Resolution::Raw).unwrap(),
        &before_raw,
    );
    same(
        &store.range("kvcache_usage_ratio", &layer, DAY1, next + 1, 3_600_000, Resolution::Minute).unwrap(),
        &before_minutes,
    );
    assert_eq!(store.earliest_ts().unwrap(), Some(DAY1));
    drop(store);
    let reopened = Store::open(&path).unwrap();
    assert_eq!(reopened.latest_ts().unwrap(), Some(next));
}
