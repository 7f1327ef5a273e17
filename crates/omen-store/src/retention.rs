//! Keeping the history bounded: day aggregates rolled up from raw samples (they outlive
//! the raw ones for the forecasts) or written from elsewhere (a backfill), and deletion
//! of what is past its retention.

use std::sync::atomic::Ordering;

use anyhow::Result;
use omen_signals::{quantile_linear, DAY_MS};
use rusqlite::params;

use crate::blocks::{newest_raw_ts, raw_from_blocks, MINUTE_BLOCK_MS, RAW_BLOCK_MS};
use crate::insert::{NewSeries, INSERT_SERIES};
use crate::{DayAggregate, SeriesIds, Store, Unit, Writer};

/// Writes (or replaces) one series' aggregate of one day.
const UPSERT_DAY: &str = "INSERT OR REPLACE INTO day_agg (series_id, day_ms, count, sum, min, max, p50, p95, p99) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";

/// Blocks of each tier one [`Store::apply_retention`] call deletes at most: an hour of
/// raw blocks of 8 GPUs x 80 layers (values and anomaly scores).
pub const RETENTION_BLOCKS_PER_CALL: usize = 2560;

/// What one [`Store::roll_up_day`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RollUp {
    /// Day aggregates written.
    pub written: usize,
    /// Series looked at (those without samples that day write nothing).
    pub visited: usize,
    /// The series id to continue from, or None when the day is complete.
    pub next_id: Option<i64>,
}

impl Store {
    /// Computes day aggregates for every complete UTC day in [from_day_ms, until_day_ms) from raw samples.
    pub fn roll_up_days(&self, from_day_ms: i64, until_day_ms: i64) -> Result<usize> {
        let mut written = 0;
        let mut day = from_day_ms.div_euclid(DAY_MS) * DAY_MS;
        while day < until_day_ms {
            written += self.roll_up_day(day, 0, usize::MAX)?.written;
            day += DAY_MS;
        }
        Ok(written)
    }

    /// Computes the day aggregates of the UTC day starting at `day_ms` from raw samples (rows
    /// and blocks) for the series with ids from `from_id` on, at most `max_series` of them in
    /// one transaction, so that a caller can spread a day of many series over several ticks.
    pub fn roll_up_day(&self, day_ms: i64, from_id: i64, max_series: usize) -> Result<RollUp> {
        let mut ids: Vec<i64> = {
            let catalog = self.catalog.read().unwrap_or_else(|e| e.into_inner());
            catalog.values().flatten().map(|(id, _)| *id).filter(|&id| id >= from_id).collect()
        };
        ids.sort_unstable();
        let next_id = ids.get(max_series).copied();
        ids.truncate(max_series);
        let visited = ids.len();
        let mut w = self.writer()?;
        let offline = w.offline;
        let tx = Unit::begin(&mut w.conn, offline)?;
        let mut written = 0;
        {
            let mut rows = tx.prepare_cached(
                "SELECT value FROM samples WHERE series_id = ?1 AND ts_ms >= ?2 AND ts_ms < ?3",
            )?;
            let mut upsert = tx.prepare_cached(UPSERT_DAY)?;
            let mut values: Vec<f64> = Vec::new();
            for id in ids {
                values.clear();
                raw_from_blocks(&tx, id, day_ms, day_ms + DAY_MS, |_, v| values.push(v))?;
                let mut q = rows.query(params![id, day_ms, day_ms + DAY_MS])?;
                while let Some(r) = q.next()? {
                    values.push(r.get(0)?);
                }
                if values.is_empty() {
                    continue;
                }
                values.sort_by(f64::total_cmp);
                let sum: f64 = values.iter().sum();
                upsert.execute(params![
                    id,
                    day_ms,
                    values.len() as i64,
                    sum,
                    values[0],
                    values[values.len() - 1],
                    quantile_linear(&values, 0.5),
                    quantile_linear(&values, 0.95),
                    quantile_linear(&values, 0.99)
                ])?;
                written += 1;
            }
        }
        tx.commit()?;
        self.changed();
        Ok(RollUp { written, visited, next_id })
    }

    /// Whether the store holds any day aggregate (a new or emptied store holds none).
    pub fn has_day_aggregates(&self) -> Result<bool> {
        Ok(self.reader()?.query_row("SELECT EXISTS (SELECT 1 FROM day_agg)", [], |r| r.get(0))?)
    }

    /// Writes day aggregates computed elsewhere (a backfill from Prometheus), creating their
    /// series, in one transaction; a day already stored for a series is replaced. Returns
    /// the rows written. Rows with a count below 1 or a non-finite statistic are refused.
    pub fn insert_day_aggregates(&self, rows: &[DayAggregate]) -> Result<usize> {
        if let Some(bad) = rows.iter().find(|d| {
            d.count < 1 || ![d.mean, d.min, d.max, d.p50, d.p95, d.p99].iter().all(|v| v.is_finite())
        }) {
            anyhow::bail!(
                "day aggregate of {} {:?} on day {} has a count below 1 or a non-finite statistic: {bad:?}",
                bad.key.signal,
                bad.key.labels,
                bad.day_ms
            );
        }
        let mut w = self.writer()?;
        let Writer { conn, series_ids, offline, .. } = &mut *w;
        let mut created = NewSeries::default();
        let tx = Unit::begin(conn, *offline)?;
        match write_day_aggregates(tx, series_ids, &mut created, rows) {
            Ok(()) => {
                created.publish(&self.catalog);
                self.changed();
                Ok(rows.len())
            }
            Err(e) => {
                created.forget(series_ids);
                Err(e)
            }
        }
    }

    /// Deletes raw samples, minute and day aggregates older than their retention, relative to
    /// `now_ms`; at most [`RETENTION_BLOCKS_PER_CALL`] blocks of each tier per call, so that
    /// a call after a long outage (weeks of blocks past the cutoff at once) holds the writer
    /// briefly: a return value of at least that many means more may be left for the next call.
    pub fn apply_retention(
        &self,
        now_ms: i64,
        raw_days: u32,
        minute_days: u32,
        day_days: u32,
    ) -> Result<usize> {
        let mut w = self.writer()?;
        let raw_cutoff = now_ms - raw_days as i64 * DAY_MS;
        let mut n = w.conn.execute("DELETE FROM samples WHERE ts_ms < ?1", [raw_cutoff])?;
        // A block goes once all of its span is past the cutoff.
        n += w.conn.execute(
            "DELETE FROM sample_blocks WHERE rowid IN (SELECT rowid FROM sample_blocks WHERE start_ms <= ?1 LIMIT ?2)",
            params![raw_cutoff.saturating_sub(RAW_BLOCK_MS), RETENTION_BLOCKS_PER_CALL as i64],
        )?;
        let minute_cutoff = now_ms - minute_days as i64 * DAY_MS;
        // minute_agg has no index by time: scan it only when a row can be past the cutoff.
        if w.minutes.iter().any(|(_, m)| m.oldest_minute_row.is_some_and(|t| t < minute_cutoff)) {
            n += w.conn.execute("DELETE FROM minute_agg WHERE minute_ms < ?1", [minute_cutoff])?;
        }
        n += w.conn.execute(
            "DELETE FROM minute_blocks WHERE rowid IN (SELECT rowid FROM minute_blocks WHERE start_ms <= ?1 LIMIT ?2)",
            params![minute_cutoff.saturating_sub(MINUTE_BLOCK_MS), RETENTION_BLOCKS_PER_CALL as i64],
        )?;
        // Logged samples of minutes past retention would only rebuild them after a crash.
        w.conn.execute("DELETE FROM minute_log WHERE minute_ms < ?1", [minute_cutoff])?;
        // An open minute past retention goes too (it would be written only to be deleted).
        let mut dropped = Vec::new();
        for (id, m) in w.minutes.iter_mut() {
            if m.open.is_some_and(|(minute, _)| minute < minute_cutoff) {
                m.open = None;
                dropped.push(id);
            }
        }
        n += dropped.len();
        if !dropped.is_empty() {
            let mut view = w.open_view.write().unwrap_or_else(|e| e.into_inner());
            for id in dropped {
                view.set(id, None);
            }
        }
        n += w.conn.execute("DELETE FROM day_agg WHERE day_ms < ?1", [now_ms - day_days as i64 * DAY_MS])?;
        if n > 0 {
            // Retention deletes the oldest rows: the newest stored time can only have gone
            // when it was itself past the raw cutoff.
            if self.latest_stored_ts.load(Ordering::Relaxed) < raw_cutoff {
                let latest = newest_raw_ts(&w.conn)?;
                self.latest_stored_ts.store(latest.unwrap_or(i64::MIN), Ordering::Relaxed);
            }
            self.changed();
        }
        Ok(n)
    }
}

/// [`Store::insert_day_aggregates`]' transaction.
fn write_day_aggregates(
    tx: Unit<'_>,
    series_ids: &mut SeriesIds,
    created: &mut NewSeries,
    rows: &[DayAggregate],
) -> Result<()> {
    {
        let mut new_series = tx.prepare_cached(INSERT_SERIES)?;
        let mut upsert = tx.prepare_cached(UPSERT_DAY)?;
        for d in rows {
            let id = created.id(&tx, &mut new_series, series_ids, &d.key.signal, &d.key.labels)?;
            upsert.execute(params![
                id,
                d.day_ms,
                d.count,
                d.mean * d.count as f64,
                d.min,
                d.max,
                d.p50,
                d.p95,
                d.p99
            ])?;
        }
    }
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use omen_sources::Sample;

    use crate::test_util::sample;
    use crate::{DayAggregate, Resolution, Store, DAY_MS};

    #[test]
    fn written_day_aggregates_read_back_and_share_their_series_with_later_samples() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("omen.db");
        let store = Store::open(&path).unwrap();
        assert!(!store.has_day_aggregates().unwrap());
        let t0 = 1_793_577_600_000;
        let key = sample(t0, "kv_fragmentation", "0", 0.0).series_key();
        let day = |i: i64, v: f64| DayAggregate {
            key: key.clone(),
            day_ms: t0 + i * DAY_MS,
            count: 288,
            mean: v,
            min: v - 0.1,
            max: v + 0.2,
            p50: v,
            p95: v + 0.1,
            p99: v + 0.15,
        };
        let rows: Vec<DayAggregate> = (0..3).map(|i| day(i, 1.2 + 0.1 * i as f64)).collect();
        assert_eq!(store.insert_day_aggregates(&rows).unwrap(), 3);
        assert!(store.has_day_aggregates().unwrap());
        let back = store.day_aggregates("kv_fragmentation", t0, t0 + 3 * DAY_MS).unwrap();
        assert_eq!(back.len(), 3);
        for (b, r) in back.iter().zip(&rows) {
            assert_eq!((b.day_ms, b.count, b.min, b.max, b.p95), (r.day_ms, r.count, r.min, r.max, r.p95));
            assert!((b.mean - r.mean).abs() < 1e-12);
        }
        // Samples of the same series land in it, and their roll-up replaces nothing earlier.
        store.insert(&[sample(t0 + 3 * DAY_MS, "kv_fragmentation", "0", 2.0)]).unwrap();
        store.roll_up_days(t0 + 3 * DAY_MS, t0 + 4 * DAY_MS).unwrap();
        let all = store.day_aggregates("kv_fragmentation", t0, t0 + 4 * DAY_MS).unwrap();
        assert_eq!(all.len(), 4);
        assert!(all.iter().all(|d| d.key == key));
        drop(store);
        let store = Store::open(&path).unwrap();
        assert_eq!(store.series_matching("kv_fragmentation", &BTreeMap::new()), 1);
        // A row that is not an aggregate is refused, naming the series, and nothing is written.
        let mut bad = day(9, 1.0);
        bad.p99 = f64::NAN;
        let e = store.insert_day_aggregates(&[day(8, 1.0), bad]).unwrap_err();
        assert!(format!("{e}").contains("kv_fragmentation"), "{e}");
        assert_eq!(store.day_aggregates("kv_fragmentation", t0, t0 + 10 * DAY_MS).unwrap().len(), 4);
    }

    #[test]
    fn insert_range_rollup_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/omen.db");
        let t0 = 1_793_577_600_000; // a UTC midnight
        {
            let store = Store::open(&path).unwrap();
            let batch: Vec<Sample> = (0..120)
                .flat_map(|i| {
                    [
                        sample(t0 + i * 30_000, "kv_fragmentation", "0", 1.0 + i as f64),
                        sample(t0 + i * 30_000, "kv_fragmentation", "1", 2.0),
                    ]
                })
                .collect();
            store.insert(&batch).unwrap();
            assert_eq!(store.raw_sample_count().unwrap(), 240);
            let r = store
                .range("kv_fragmentation", &BTreeMap::new(), t0, t0 + 3_600_000, 600_000, Resolution::Raw)
                .unwrap();
            assert_eq!(r.len(), 2);
            assert_eq!(r[0].points.len(), 6);
            // first 10 minutes of layer 0: values 1..=20, mean 10.5
            assert_eq!(r[0].points[0], (t0, 10.5));
            let m = store
                .range(
                    "kv_fragmentation",
                    &[("layer".to_owned(), "0".to_owned())].into(),
                    t0,
                    t0 + 3_600_000,
                    600_000,
                    Resolution::Minute,
                )
                .unwrap();
            assert_eq!(m.len(), 1);
            assert_eq!(m[0].points[0], (t0, 10.5));
            assert_eq!(store.roll_up_days(t0, t0 + DAY_MS).unwrap(), 2);
        }
        let store = Store::open(&path).unwrap();
        let days = store.day_aggregates("kv_fragmentation", t0, t0 + DAY_MS).unwrap();
        assert_eq!(days.len(), 2);
        let layer0 = days.iter().find(|d| d.key.labels["layer"] == "0").unwrap();
        assert_eq!((layer0.count, layer0.min, layer0.max), (120, 1.0, 120.0));
        assert_eq!(layer0.p50, 60.5);
        // new samples of a known series reuse its id after reopen
        store.insert(&[sample(t0 + DAY_MS, "kv_fragmentation", "0", 5.0)]).unwrap();
        assert_eq!(
            store
                .range("kv_fragmentation", &BTreeMap::new(), t0, t0 + 2 * DAY_MS, DAY_MS, Resolution::Raw)
                .unwrap()
                .len(),
            2
        );
        // everything before t0 + 1 day + 1 ms goes: 241 raw samples, 121 minute buckets, 2 day rows
        assert_eq!(store.apply_retention(t0 + 2 * DAY_MS + 1, 1, 1, 1).unwrap(), 241 + 121 + 2);
    }
}
