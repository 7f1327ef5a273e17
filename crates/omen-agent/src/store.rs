//! SQLite store (WAL): raw samples with retention, minute and day aggregates kept
//! for weeks so that a restart keeps the history the 14-day forecast needs.
//!
//! A batch is acknowledged only after its transaction commits; with WAL and
//! synchronous=NORMAL a committed transaction survives `kill -9` (it is in the
//! WAL file; only an OS crash or power loss can drop the last ones).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result};
use omen_signals::quantile_linear;
use omen_sources::{Sample, SeriesKey};
use rusqlite::{params, Connection, OptionalExtension};

const SCHEMA_VERSION: i64 = 1;
/// One day in milliseconds.
pub const DAY_MS: i64 = 86_400_000;
const MINUTE_MS: i64 = 60_000;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS series (
    id INTEGER PRIMARY KEY,
    signal TEXT NOT NULL,
    labels TEXT NOT NULL,
    UNIQUE (signal, labels)
);
CREATE TABLE IF NOT EXISTS samples (series_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL, value REAL NOT NULL);
CREATE INDEX IF NOT EXISTS samples_by_series_ts ON samples (series_id, ts_ms);
CREATE INDEX IF NOT EXISTS samples_by_ts ON samples (ts_ms);
CREATE TABLE IF NOT EXISTS minute_agg (
    series_id INTEGER NOT NULL, minute_ms INTEGER NOT NULL,
    count INTEGER NOT NULL, sum REAL NOT NULL, min REAL NOT NULL, max REAL NOT NULL, last REAL NOT NULL,
    PRIMARY KEY (series_id, minute_ms)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS day_agg (
    series_id INTEGER NOT NULL, day_ms INTEGER NOT NULL,
    count INTEGER NOT NULL, sum REAL NOT NULL, min REAL NOT NULL, max REAL NOT NULL,
    p50 REAL NOT NULL, p95 REAL NOT NULL, p99 REAL NOT NULL,
    PRIMARY KEY (series_id, day_ms)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS canary_reference (canary TEXT PRIMARY KEY, reference TEXT NOT NULL, captured_ms INTEGER NOT NULL);
";

/// Daily aggregate of one series.
#[derive(Debug, Clone, PartialEq)]
pub struct DayAggregate {
    /// Series.
    pub key: SeriesKey,
    /// Start of the UTC day, ms.
    pub day_ms: i64,
    /// Samples in the day.
    pub count: i64,
    /// Mean.
    pub mean: f64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// Which table a range query reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Raw samples.
    Raw,
    /// Minute aggregates.
    Minute,
    /// Day aggregates.
    Day,
}

/// One series of a range query: points are (bucket start ms, mean in bucket).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RangeSeries {
    /// Series labels.
    pub labels: BTreeMap<String, String>,
    /// (bucket start, mean) pairs.
    pub points: Vec<(i64, f64)>,
}

/// The store: one writer connection and a few readers (WAL lets them run concurrently).
pub struct Store {
    path: PathBuf,
    writer: Mutex<Writer>,
    readers: Vec<Mutex<Connection>>,
}

struct Writer {
    conn: Connection,
    series_ids: HashMap<SeriesKey, i64>,
}

fn open_connection(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path).with_context(|| format!("cannot open the store {}", path.display()))?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(conn)
}

fn labels_json(labels: &BTreeMap<String, String>) -> String {
    serde_json::to_string(labels).expect("string map serialises")
}

impl Store {
    /// Opens (creating if needed) the store at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("store.path: cannot create the folder {}; fix its permissions or choose another store.path", dir.display()))?;
        }
        let conn = open_connection(path)?;
        conn.execute_batch(SCHEMA).context("cannot create the store's tables")?;
        let version: Option<String> = conn
            .query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0))
            .optional()?;
        match version {
            None => {
                conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?1)", [SCHEMA_VERSION.to_string()])?;
            }
            Some(v) if v == SCHEMA_VERSION.to_string() => {}
            Some(v) => anyhow::bail!(
                "store {} has schema version {v}; this omen uses {SCHEMA_VERSION}; point store.path at a new file or upgrade omen",
                path.display()
            ),
        }
        let mut series_ids = HashMap::new();
        {
            let mut stmt = conn.prepare("SELECT id, signal, labels FROM series")?;
            let rows = stmt.query_map([], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
            })?;
            for row in rows {
                let (id, signal, labels) = row?;
                let labels: BTreeMap<String, String> =
                    serde_json::from_str(&labels).context("corrupt series labels in the store")?;
                series_ids.insert(SeriesKey { signal, labels }, id);
            }
        }
        let readers = (0..4).map(|_| open_connection(path).map(Mutex::new)).collect::<Result<Vec<_>>>()?;
        Ok(Self { path: path.to_owned(), writer: Mutex::new(Writer { conn, series_ids }), readers })
    }

    /// File path of the database.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn reader(&self) -> std::sync::MutexGuard<'_, Connection> {
        for r in &self.readers {
            if let Ok(guard) = r.try_lock() {
                return guard;
            }
        }
        self.readers[0].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes samples and their minute aggregates in one transaction; returns after commit.
    pub fn insert(&self, samples: &[Sample]) -> Result<()> {
        self.insert_with_raw(samples, &[])
    }

    /// As [`Store::insert`], but samples whose `keep_raw` entry is false only update
    /// their minute aggregate (decimation of high-rate series). A shorter `keep_raw` keeps the rest raw.
    pub fn insert_with_raw(&self, samples: &[Sample], keep_raw: &[bool]) -> Result<()> {
        if samples.is_empty() {
            return Ok(());
        }
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let Writer { conn, series_ids } = &mut *w;
        let mut created: Vec<SeriesKey> = Vec::new();
        let result = insert_batch(conn, series_ids, &mut created, samples, keep_raw);
        if result.is_err() {
            // The transaction rolled back: ids handed out inside it are void.
            for key in &created {
                series_ids.remove(key);
            }
        }
        result
    }

    /// Computes day aggregates for every complete UTC day in [from_day_ms, until_day_ms) from raw samples.
    pub fn roll_up_days(&self, from_day_ms: i64, until_day_ms: i64) -> Result<usize> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let tx = w.conn.transaction()?;
        let mut written = 0;
        let mut day = from_day_ms.div_euclid(DAY_MS) * DAY_MS;
        while day < until_day_ms {
            let mut by_series: HashMap<i64, Vec<f64>> = HashMap::new();
            {
                let mut stmt = tx.prepare_cached(
                    "SELECT series_id, value FROM samples WHERE ts_ms >= ?1 AND ts_ms < ?2",
                )?;
                let rows = stmt.query_map(params![day, day + DAY_MS], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, f64>(1)?))
                })?;
                for row in rows {
                    let (id, v) = row?;
                    by_series.entry(id).or_default().push(v);
                }
            }
            let mut upsert = tx.prepare_cached(
                "INSERT OR REPLACE INTO day_agg (series_id, day_ms, count, sum, min, max, p50, p95, p99) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?;
            for (id, mut values) in by_series {
                values.sort_by(f64::total_cmp);
                let sum: f64 = values.iter().sum();
                upsert.execute(params![
                    id,
                    day,
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
            day += DAY_MS;
        }
        tx.commit()?;
        Ok(written)
    }

    /// Day aggregates of every series of `signal` for days in [from_day_ms, until_day_ms).
    pub fn day_aggregates(
        &self,
        signal: &str,
        from_day_ms: i64,
        until_day_ms: i64,
    ) -> Result<Vec<DayAggregate>> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(
            "SELECT s.labels, d.day_ms, d.count, d.sum, d.min, d.max, d.p50, d.p95, d.p99 FROM day_agg d
             JOIN series s ON s.id = d.series_id WHERE s.signal = ?1 AND d.day_ms >= ?2 AND d.day_ms < ?3 ORDER BY d.day_ms",
        )?;
        let rows = stmt.query_map(params![signal, from_day_ms, until_day_ms], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, f64>(3)?,
                r.get::<_, f64>(4)?,
                r.get::<_, f64>(5)?,
                r.get::<_, f64>(6)?,
                r.get::<_, f64>(7)?,
                r.get::<_, f64>(8)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (labels, day_ms, count, sum, min, max, p50, p95, p99) = row?;
            out.push(DayAggregate {
                key: SeriesKey { signal: signal.to_owned(), labels: serde_json::from_str(&labels)? },
                day_ms,
                count,
                mean: sum / count as f64,
                min,
                max,
                p50,
                p95,
                p99,
            });
        }
        Ok(out)
    }

    /// Mean per `step_ms` bucket of every series of `signal` whose labels include `matchers`, over [since, until).
    pub fn range(
        &self,
        signal: &str,
        matchers: &BTreeMap<String, String>,
        since_ms: i64,
        until_ms: i64,
        step_ms: i64,
        resolution: Resolution,
    ) -> Result<Vec<RangeSeries>> {
        let conn = self.reader();
        let sql = match resolution {
            Resolution::Raw => {
                "SELECT s.labels, (x.ts_ms - ?2) / ?4, SUM(x.value), COUNT(*) FROM samples x JOIN series s ON s.id = x.series_id
                 WHERE s.signal = ?1 AND x.ts_ms >= ?2 AND x.ts_ms < ?3 GROUP BY s.id, 2 ORDER BY s.id, 2"
            }
            Resolution::Minute => {
                "SELECT s.labels, (x.minute_ms - ?2) / ?4, SUM(x.sum), SUM(x.count) FROM minute_agg x JOIN series s ON s.id = x.series_id
                 WHERE s.signal = ?1 AND x.minute_ms >= ?2 AND x.minute_ms < ?3 GROUP BY s.id, 2 ORDER BY s.id, 2"
            }
            Resolution::Day => {
                "SELECT s.labels, (x.day_ms - ?2) / ?4, SUM(x.sum), SUM(x.count) FROM day_agg x JOIN series s ON s.id = x.series_id
                 WHERE s.signal = ?1 AND x.day_ms >= ?2 AND x.day_ms < ?3 GROUP BY s.id, 2 ORDER BY s.id, 2"
            }
        };
        let mut stmt = conn.prepare_cached(sql)?;
        let rows = stmt.query_map(params![signal, since_ms, until_ms, step_ms], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, f64>(2)?, r.get::<_, i64>(3)?))
        })?;
        let mut out: Vec<RangeSeries> = Vec::new();
        let mut last_labels = String::new();
        for row in rows {
            let (labels_text, bucket, sum, count) = row?;
            if out.is_empty() || labels_text != last_labels {
                let labels: BTreeMap<String, String> = serde_json::from_str(&labels_text)?;
                out.push(RangeSeries { labels, points: Vec::new() });
                last_labels = labels_text;
            }
            out.last_mut()
                .expect("pushed above")
                .points
                .push((since_ms + bucket * step_ms, sum / count as f64));
        }
        out.retain(|s| matchers.iter().all(|(k, v)| s.labels.get(k) == Some(v)));
        Ok(out)
    }

    /// Deletes raw samples, minute and day aggregates older than their retention, relative to `now_ms`.
    pub fn apply_retention(
        &self,
        now_ms: i64,
        raw_days: u32,
        minute_days: u32,
        day_days: u32,
    ) -> Result<usize> {
        let w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let mut n =
            w.conn.execute("DELETE FROM samples WHERE ts_ms < ?1", [now_ms - raw_days as i64 * DAY_MS])?;
        n += w
            .conn
            .execute("DELETE FROM minute_agg WHERE minute_ms < ?1", [now_ms - minute_days as i64 * DAY_MS])?;
        n += w.conn.execute("DELETE FROM day_agg WHERE day_ms < ?1", [now_ms - day_days as i64 * DAY_MS])?;
        Ok(n)
    }

    /// Reads a value from the meta table.
    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        let conn = self.reader();
        Ok(conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).optional()?)
    }

    /// Writes a value to the meta table.
    pub fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        let w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        w.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)", params![key, value])?;
        Ok(())
    }

    /// The stored reference answer of a canary.
    pub fn canary_reference(&self, canary: &str) -> Result<Option<String>> {
        let conn = self.reader();
        Ok(conn
            .query_row("SELECT reference FROM canary_reference WHERE canary = ?1", [canary], |r| r.get(0))
            .optional()?)
    }

    /// Stores a canary's reference answer (first capture wins).
    pub fn set_canary_reference(&self, canary: &str, reference: &str, now_ms: i64) -> Result<()> {
        let w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        w.conn.execute(
            "INSERT OR IGNORE INTO canary_reference (canary, reference, captured_ms) VALUES (?1, ?2, ?3)",
            params![canary, reference, now_ms],
        )?;
        Ok(())
    }

    /// Number of raw samples stored (for tests and /readyz detail).
    pub fn raw_sample_count(&self) -> Result<i64> {
        Ok(self.reader().query_row("SELECT COUNT(*) FROM samples", [], |r| r.get(0))?)
    }

    /// Raw samples stored for `signal`.
    pub fn count(&self, signal: &str) -> Result<i64> {
        Ok(self.reader().query_row(
            "SELECT COUNT(*) FROM samples x JOIN series s ON s.id = x.series_id WHERE s.signal = ?1",
            [signal],
            |r| r.get(0),
        )?)
    }

    /// Earliest raw timestamp stored, if any.
    pub fn earliest_ts(&self) -> Result<Option<i64>> {
        Ok(self.reader().query_row("SELECT MIN(ts_ms) FROM samples", [], |r| r.get(0))?)
    }

    /// Names of the signals that have series in the store, sorted.
    pub fn signals(&self) -> Result<Vec<String>> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached("SELECT DISTINCT signal FROM series ORDER BY signal")?;
        let names = stmt.query_map([], |r| r.get::<_, String>(0))?.collect::<Result<Vec<_>, _>>()?;
        Ok(names)
    }

    /// Latest raw timestamp stored, if any.
    pub fn latest_ts(&self) -> Result<Option<i64>> {
        Ok(self.reader().query_row("SELECT MAX(ts_ms) FROM samples", [], |r| r.get(0))?)
    }
}

/// A minute bucket of one series folded over a batch; `last` is the value of its last sample in batch order.
struct MinuteFold {
    count: i64,
    sum: f64,
    min: f64,
    max: f64,
    last: f64,
}

impl MinuteFold {
    fn new(value: f64) -> Self {
        Self { count: 1, sum: value, min: value, max: value, last: value }
    }

    fn add(&mut self, value: f64) {
        self.count += 1;
        self.sum += value;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
        self.last = value;
    }
}

fn insert_batch(
    conn: &mut Connection,
    series_ids: &mut HashMap<SeriesKey, i64>,
    created: &mut Vec<SeriesKey>,
    samples: &[Sample],
    keep_raw: &[bool],
) -> Result<()> {
    let tx = conn.transaction()?;
    {
        let mut new_series = tx.prepare_cached("INSERT INTO series (signal, labels) VALUES (?1, ?2)")?;
        let mut insert =
            tx.prepare_cached("INSERT INTO samples (series_id, ts_ms, value) VALUES (?1, ?2, ?3)")?;
        let mut minute = tx.prepare_cached(
            "INSERT INTO minute_agg (series_id, minute_ms, count, sum, min, max, last) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (series_id, minute_ms) DO UPDATE SET count = count + excluded.count, sum = sum + excluded.sum,
             min = min(min, excluded.min), max = max(max, excluded.max), last = excluded.last",
        )?;
        let mut minutes: HashMap<(i64, i64), MinuteFold> = HashMap::new();
        // Consecutive samples of one series (the usual push order) reuse its id without a key copy.
        let mut last_id: Option<(usize, i64)> = None;
        for (i, s) in samples.iter().enumerate() {
            let same_as_last = last_id.filter(|&(j, _)| {
                let p = &samples[j];
                p.signal == s.signal && p.labels == s.labels
            });
            let id = match same_as_last {
                Some((_, id)) => id,
                None => match series_ids.get(&s.series_key()) {
                    Some(&id) => id,
                    None => {
                        let key = s.series_key();
                        new_series.execute(params![key.signal, labels_json(&key.labels)])?;
                        let id = tx.last_insert_rowid();
                        created.push(key.clone());
                        series_ids.insert(key, id);
                        id
                    }
                },
            };
            last_id = Some((i, id));
            if keep_raw.get(i).copied().unwrap_or(true) {
                insert.execute(params![id, s.ts_ms, s.value])?;
            }
            let bucket = s.ts_ms.div_euclid(MINUTE_MS) * MINUTE_MS;
            minutes
                .entry((id, bucket))
                .and_modify(|a: &mut MinuteFold| a.add(s.value))
                .or_insert_with(|| MinuteFold::new(s.value));
        }
        // One upsert per (series, minute) of the batch, in the same transaction as its raw rows.
        for ((id, bucket), a) in &minutes {
            minute.execute(params![id, bucket, a.count, a.sum, a.min, a.max, a.last])?;
        }
    }
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ts_ms: i64, signal: &str, layer: &str, value: f64) -> Sample {
        Sample {
            ts_ms,
            signal: signal.into(),
            labels: [("layer".to_owned(), layer.to_owned())].into(),
            value,
        }
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
                        sample(t0 + i * 30_000, "kvf_ratio", "0", 1.0 + i as f64),
                        sample(t0 + i * 30_000, "kvf_ratio", "1", 2.0),
                    ]
                })
                .collect();
            store.insert(&batch).unwrap();
            assert_eq!(store.raw_sample_count().unwrap(), 240);
            let r = store
                .range("kvf_ratio", &BTreeMap::new(), t0, t0 + 3_600_000, 600_000, Resolution::Raw)
                .unwrap();
            assert_eq!(r.len(), 2);
            assert_eq!(r[0].points.len(), 6);
            // first 10 minutes of layer 0: values 1..=20, mean 10.5
            assert_eq!(r[0].points[0], (t0, 10.5));
            let m = store
                .range(
                    "kvf_ratio",
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
        let days = store.day_aggregates("kvf_ratio", t0, t0 + DAY_MS).unwrap();
        assert_eq!(days.len(), 2);
        let layer0 = days.iter().find(|d| d.key.labels["layer"] == "0").unwrap();
        assert_eq!((layer0.count, layer0.min, layer0.max), (120, 1.0, 120.0));
        assert_eq!(layer0.p50, 60.5);
        // new samples of a known series reuse its id after reopen
        store.insert(&[sample(t0 + DAY_MS, "kvf_ratio", "0", 5.0)]).unwrap();
        assert_eq!(
            store
                .range("kvf_ratio", &BTreeMap::new(), t0, t0 + 2 * DAY_MS, DAY_MS, Resolution::Raw)
                .unwrap()
                .len(),
            2
        );
        // everything before t0 + 1 day + 1 ms goes: 241 raw samples, 121 minute buckets, 2 day rows
        assert_eq!(store.apply_retention(t0 + 2 * DAY_MS + 1, 1, 1, 1).unwrap(), 241 + 121 + 2);
    }

    #[test]
    fn decimated_samples_still_enter_minute_aggregates() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        let t0 = 1_793_577_600_000;
        let batch: Vec<Sample> = (0..60).map(|i| sample(t0 + i * 1000, "kv", "0", i as f64)).collect();
        let keep: Vec<bool> = (0..60).map(|i| i % 10 == 0).collect();
        store.insert_with_raw(&batch, &keep).unwrap();
        assert_eq!(store.count("kv").unwrap(), 6);
        let m = store.range("kv", &BTreeMap::new(), t0, t0 + 60_000, 60_000, Resolution::Minute).unwrap();
        assert_eq!(m[0].points, vec![(t0, 29.5)]);
    }

    #[test]
    fn minute_folds_across_batches_match_per_sample_totals() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        let t0 = 1_793_577_600_000;
        // Two batches, each with two series interleaved, spanning two minutes.
        for half in 0..2i64 {
            let batch: Vec<Sample> = (0..60)
                .flat_map(|i| {
                    let ts = t0 + (half * 60 + i) * 1000;
                    [sample(ts, "kv", "0", i as f64), sample(ts, "kv", "1", 100.0 + i as f64)]
                })
                .collect();
            store.insert(&batch).unwrap();
        }
        let conn = store.reader();
        let rows: Vec<(i64, i64, f64, f64, f64, f64)> = conn
            .prepare(
                "SELECT minute_ms, count, sum, min, max, last FROM minute_agg ORDER BY series_id, minute_ms",
            )
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let sum: f64 = (0..60).map(|i| i as f64).sum();
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[0], (t0, 60, sum, 0.0, 59.0, 59.0));
        assert_eq!(rows[1], (t0 + 60_000, 60, sum, 0.0, 59.0, 59.0));
        assert_eq!(rows[2], (t0, 60, sum + 6000.0, 100.0, 159.0, 159.0));
    }

    #[test]
    fn canary_reference_first_capture_wins() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        store.set_canary_reference("c", "first", 1).unwrap();
        store.set_canary_reference("c", "second", 2).unwrap();
        assert_eq!(store.canary_reference("c").unwrap().as_deref(), Some("first"));
        assert_eq!(store.canary_reference("d").unwrap(), None);
    }
}
