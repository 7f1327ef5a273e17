//! Stores written by released omens (schema versions 1 and 2, made by
//! scripts/make-store-fixture.sh with each release's binary: two days of one KV layer every
//! 5 minutes, and from schema 2 a day of KV fragmentation) open in this omen with their
//! history intact and take new samples. A change of the schema must come with a migration
//! that keeps these tests passing.

use std::collections::BTreeMap;
use std::io::Read as _;

use omen_sources::Sample;
use omen_store::{RangeSeries, Resolution, Store};

const DAY1: i64 = 1_793_491_200_000; // 2026-11-01T00:00:00Z

/// Unpacks a fixture into `dir`; returns the store's path.
fn fixture(name: &str, dir: &std::path::Path) -> std::path::PathBuf {
    let gz = std::fs::read(format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut bytes).unwrap();
    let path = dir.join("omen.db");
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn a_store_of_schema_2_reads_kvf_ratio_as_kv_fragmentation() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture("store-schema2.db.gz", dir.path());
    let store = Store::open(&path).expect("the schema 2 store opens");
    assert_eq!(store.meta("schema_version").unwrap().as_deref(), Some("3"));
    let layer: BTreeMap<String, String> = [("layer".to_owned(), "3".to_owned())].into();
    let kvf =
        store.range("kv_fragmentation", &layer, DAY1, DAY1 + 86_400_000, 300_000, Resolution::Raw).unwrap();
    assert_eq!(kvf.len(), 1);
    assert_eq!(kvf[0].points.len(), 288, "a day of 5-minute samples under the new name");
    // Sealed into blocks by that release: values keep 24 significant bits.
    let (t, v) = kvf[0].points[1];
    assert!(t == DAY1 + 300_000 && (v - (1.0 + 5.0 / 1440.0)).abs() < 2e-7, "{t} {v}");
    assert_eq!(store.series_matching("kvf_ratio", &BTreeMap::new()), 0);
    // The series derived from it name it in their `signal` label.
    let by_signal: BTreeMap<String, String> = [("signal".to_owned(), "kv_fragmentation".to_owned())].into();
    assert_eq!(store.series_matching("anomaly_score", &by_signal), 1);
    let old: BTreeMap<String, String> = [("signal".to_owned(), "kvf_ratio".to_owned())].into();
    assert_eq!(store.series_matching("anomaly_score", &old), 0);
    // New samples join the renamed series.
    let labels: BTreeMap<String, String> =
        [("gpu".to_owned(), "0".to_owned()), ("layer".to_owned(), "3".to_owned())].into();
    let sample = Sample { ts_ms: DAY1 + 86_400_000, signal: "kv_fragmentation".into(), labels, value: 2.0 };
    store.insert(&[sample]).unwrap();
    assert_eq!(store.series_matching("kv_fragmentation", &BTreeMap::new()), 1);
    drop(store);
    // Opening it again migrates nothing more.
    let reopened = Store::open(&path).unwrap();
    assert_eq!(reopened.meta("schema_version").unwrap().as_deref(), Some("3"));
    assert_eq!(reopened.series_matching("kv_fragmentation", &BTreeMap::new()), 1);
}

#[test]
fn a_store_of_the_previous_release_opens_with_its_history() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture("store-schema1.db.gz", dir.path());

    let store = Store::open(&path).expect("the previous release's store opens");
    // Migrated on open (the block tables of schema 2, the renames of 3); its rows are read as they are.
    assert_eq!(store.meta("schema_version").unwrap().as_deref(), Some("3"));
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
