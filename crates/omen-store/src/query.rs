//! Reading: a small pool of reader connections, the in-memory series catalogue that
//! picks the series a query reads, and the queries themselves.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex};

use anyhow::Result;
use omen_sources::SeriesKey;
use rusqlite::{params, Connection};

use crate::blocks::{
    add_in_order, hours_from_blocks, minutes_from_blocks, oldest_raw_ts, raw_from_blocks, span_start,
    SumCount, HOUR_MS,
};
use crate::minutes::MinuteFold;
use crate::schema::open_connection;
use crate::Store;

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
    /// Hour sums of the minute aggregates: each hour counts in the bucket its start falls
    /// in, and only hours that start in [since, until) count.
    Hour,
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

/// Reader connections handed out one request at a time; a caller waits for a free one.
pub(crate) struct ReaderPool {
    idle: Mutex<Vec<Connection>>,
    returned: Condvar,
}

/// A reader connection on loan from the pool; it goes back on drop.
pub(crate) struct PooledReader<'a> {
    pool: &'a ReaderPool,
    conn: Option<Connection>,
}

impl std::ops::Deref for PooledReader<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn.as_ref().expect("held until drop")
    }
}

impl Drop for PooledReader<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.idle.lock().unwrap_or_else(|e| e.into_inner()).push(conn);
            self.pool.returned.notify_one();
        }
    }
}

impl ReaderPool {
    /// Opens the pool's connections to the store at `path`.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let idle = (0..READERS).map(|_| open_connection(path)).collect::<Result<Vec<_>>>()?;
        Ok(Self { idle: Mutex::new(idle), returned: Condvar::new() })
    }

    /// Lends an idle connection, waiting for one to come back if all are out.
    pub(crate) fn get(&self) -> PooledReader<'_> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(conn) = idle.pop() {
                return PooledReader { pool: self, conn: Some(conn) };
            }
            idle = self.returned.wait(idle).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Reader connections (WAL readers never wait for the writer).
const READERS: usize = 4;

/// One bucket of a range query before its mean: (bucket index, sum, count).
type Bucket = SumCount;

/// A series' labels and its non-empty buckets in bucket order.
type SeriesBuckets = (BTreeMap<String, String>, Vec<Bucket>);

/// Two bucket lists in bucket order, merged: the sums and counts of a bucket in both add.
fn merge_buckets(a: Vec<Bucket>, b: Vec<Bucket>) -> Vec<Bucket> {
    if a.is_empty() {
        return b;
    }
    if b.is_empty() {
        return a;
    }
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.0 == y.0 => {
                let (x, y) = (a.next().expect("peeked"), b.next().expect("peeked"));
                (x.0, x.1 + y.1, x.2 + y.2)
            }
            (Some(x), Some(y)) if x.0 < y.0 => a.next().expect("peeked"),
            (Some(_), Some(_)) | (None, Some(_)) => b.next().expect("peeked"),
            (Some(_), None) => a.next().expect("peeked"),
            (None, None) => return out,
        };
        out.push(next);
    }
}

/// `t` rounded up to a whole hour.
fn ceil_hour(t: i64) -> i64 {
    span_start(t.saturating_add(HOUR_MS - 1), HOUR_MS)
}

/// Every stored series of each signal, (id, labels) in id order, for range queries.
pub(crate) type Catalog = HashMap<String, Vec<(i64, BTreeMap<String, String>)>>;

/// The catalogue's series of `signal` whose labels include every matcher.
fn matching<'a>(
    catalog: &'a Catalog,
    signal: &str,
    matchers: &'a BTreeMap<String, String>,
) -> impl Iterator<Item = &'a (i64, BTreeMap<String, String>)> {
    catalog
        .get(signal)
        .into_iter()
        .flatten()
        .filter(|(_, labels)| matchers.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

impl Store {
    /// Day aggregates of every series of `signal` for days in [from_day_ms, until_day_ms).
    pub fn day_aggregates(
        &self,
        signal: &str,
        from_day_ms: i64,
        until_day_ms: i64,
    ) -> Result<Vec<DayAggregate>> {
        let conn = self.reader()?;
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

    /// How many stored series of `signal` have labels that include `matchers`.
    pub fn series_matching(&self, signal: &str, matchers: &BTreeMap<String, String>) -> usize {
        let catalog = self.catalog.read().unwrap_or_else(|e| e.into_inner());
        matching(&catalog, signal, matchers).count()
    }

    /// Mean per `step_ms` bucket of every series of `signal` whose labels include `matchers`, over [since, until).
    /// Only the matching series are read (their ids come from the series catalogue).
    pub fn range(
        &self,
        signal: &str,
        matchers: &BTreeMap<String, String>,
        since_ms: i64,
        until_ms: i64,
        step_ms: i64,
        resolution: Resolution,
    ) -> Result<Vec<RangeSeries>> {
        let series = self.range_buckets(signal, matchers, since_ms, until_ms, step_ms, resolution)?;
        Ok(series
            .into_iter()
            .map(|(labels, buckets)| RangeSeries {
                labels,
                points: buckets
                    .into_iter()
                    .map(|(b, sum, count)| (since_ms + b * step_ms, sum / count as f64))
                    .collect(),
            })
            .collect())
    }

    /// [`Store::range`] before the means: each series' non-empty buckets as (bucket index, sum, count).
    fn range_buckets(
        &self,
        signal: &str,
        matchers: &BTreeMap<String, String>,
        since_ms: i64,
        until_ms: i64,
        step_ms: i64,
        resolution: Resolution,
    ) -> Result<Vec<SeriesBuckets>> {
        let selected: Vec<(i64, BTreeMap<String, String>)> = {
            let catalog = self.catalog.read().unwrap_or_else(|e| e.into_inner());
            matching(&catalog, signal, matchers).cloned().collect()
        };
        if selected.is_empty() {
            return Ok(Vec::new());
        }
        // The minutes read: at hour resolution, those of the hours that start in [since, until).
        let (lo, hi) = match resolution {
            Resolution::Hour => (ceil_hour(since_ms), ceil_hour(until_ms)),
            _ => (since_ms, until_ms),
        };
        let conn = self.reader()?;
        // One read transaction: every series is read from the same committed snapshot.
        let tx = conn.unchecked_transaction()?;
        let mut open: HashMap<i64, (i64, MinuteFold)> = HashMap::new();
        if matches!(resolution, Resolution::Minute | Resolution::Hour) {
            // The committed open minutes, taken together with the start of the snapshot
            // so that a minute written meanwhile is counted exactly once (see OpenView).
            let view = self.open_view.read().unwrap_or_else(|e| e.into_inner());
            tx.query_row("SELECT COUNT(*) FROM meta", [], |r| r.get::<_, i64>(0))?;
            for (id, _) in &selected {
                if let Some(o) = view.get(*id) {
                    if o.0 >= lo && o.0 < hi {
                        open.insert(*id, o);
                    }
                }
            }
        }
        let sql = match resolution {
            Resolution::Raw => {
                "SELECT (ts_ms - ?2) / ?4, SUM(value), COUNT(*) FROM samples
                 WHERE series_id = ?1 AND ts_ms >= ?2 AND ts_ms < ?3 GROUP BY 1 ORDER BY 1"
            }
            Resolution::Minute => {
                "SELECT (minute_ms - ?2) / ?4, SUM(sum), SUM(count) FROM minute_agg
                 WHERE series_id = ?1 AND minute_ms >= ?2 AND minute_ms < ?3 GROUP BY 1 ORDER BY 1"
            }
            Resolution::Hour => {
                "SELECT (minute_ms / 3600000 * 3600000 - ?2) / ?4, SUM(sum), SUM(count) FROM minute_agg
                 WHERE series_id = ?1 AND minute_ms >= ?5 AND minute_ms < ?6 GROUP BY 1 ORDER BY 1"
            }
            Resolution::Day => {
                "SELECT (day_ms - ?2) / ?4, SUM(sum), SUM(count) FROM day_agg
                 WHERE series_id = ?1 AND day_ms >= ?2 AND day_ms < ?3 GROUP BY 1 ORDER BY 1"
            }
        };
        let mut stmt = tx.prepare_cached(sql)?;
        let mut out = Vec::new();
        for (id, labels) in selected {
            // Sealed history first (blocks), then the rows of the same buckets.
            let mut sealed: Vec<Bucket> = Vec::new();
            let bucket = |ts: i64| (ts - since_ms) / step_ms;
            match resolution {
                Resolution::Raw => raw_from_blocks(&tx, id, since_ms, until_ms, |ts, v| {
                    add_in_order(&mut sealed, bucket(ts), v, 1)
                })?,
                Resolution::Minute => minutes_from_blocks(&tx, id, since_ms, until_ms, |minute, f| {
                    add_in_order(&mut sealed, bucket(minute), f.sum, f.count)
                })?,
                Resolution::Hour => hours_from_blocks(&tx, id, lo, hi, |(hour, sum, count)| {
                    add_in_order(&mut sealed, bucket(hour), sum, count)
                })?,
                Resolution::Day => {}
            }
            let map_row = |r: &rusqlite::Row<'_>| Ok((r.get(0)?, r.get(1)?, r.get(2)?));
            let rows: Vec<Bucket> = if resolution == Resolution::Hour {
                stmt.query_map(params![id, since_ms, until_ms, step_ms, lo, hi], map_row)?
                    .collect::<rusqlite::Result<_>>()?
            } else {
                stmt.query_map(params![id, since_ms, until_ms, step_ms], map_row)?
                    .collect::<rusqlite::Result<_>>()?
            };
            let mut buckets = merge_buckets(sealed, rows);
            if let Some((minute, fold)) = open.get(&id) {
                let start =
                    if resolution == Resolution::Hour { span_start(*minute, HOUR_MS) } else { *minute };
                let bucket = (start - since_ms) / step_ms;
                match buckets.binary_search_by_key(&bucket, |b| b.0) {
                    Ok(i) => {
                        buckets[i].1 += fold.sum;
                        buckets[i].2 += fold.count;
                    }
                    Err(i) => buckets.insert(i, (bucket, fold.sum, fold.count)),
                }
            }
            if !buckets.is_empty() {
                out.push((labels, buckets));
            }
        }
        Ok(out)
    }

    /// Number of raw samples stored (rows and blocks).
    pub fn raw_sample_count(&self) -> Result<i64> {
        Ok(self.reader()?.query_row(
            "SELECT (SELECT COUNT(*) FROM samples) + (SELECT COALESCE(SUM(count), 0) FROM sample_blocks)",
            [],
            |r| r.get(0),
        )?)
    }

    /// Raw samples stored for `signal` (rows and blocks).
    pub fn count(&self, signal: &str) -> Result<i64> {
        Ok(self.reader()?.query_row(
            "SELECT (SELECT COUNT(*) FROM samples x JOIN series s ON s.id = x.series_id WHERE s.signal = ?1)
                  + (SELECT COALESCE(SUM(b.count), 0) FROM sample_blocks b JOIN series s ON s.id = b.series_id WHERE s.signal = ?1)",
            [signal],
            |r| r.get(0),
        )?)
    }

    /// Earliest raw timestamp stored, if any.
    pub fn earliest_ts(&self) -> Result<Option<i64>> {
        oldest_raw_ts(&*self.reader()?)
    }

    /// Names of the signals that have series in the store, sorted.
    pub fn signals(&self) -> Result<Vec<String>> {
        let conn = self.reader()?;
        let mut stmt = conn.prepare_cached("SELECT DISTINCT signal FROM series ORDER BY signal")?;
        let names = stmt.query_map([], |r| r.get::<_, String>(0))?.collect::<Result<Vec<_>, _>>()?;
        Ok(names)
    }

    /// Latest timestamp stored, raw or folded into a minute aggregate, if any (kept in
    /// memory: every /scores request asks; after a restart, the newest raw row's).
    pub fn latest_ts(&self) -> Result<Option<i64>> {
        if self.offline {
            // An offline store that lost its held writes no longer knows its newest sample.
            drop(self.writer()?);
        }
        Ok(Some(self.latest_stored_ts.load(Ordering::Relaxed)).filter(|&t| t != i64::MIN))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use omen_sources::Sample;

    use crate::test_util::sample;
    use crate::{Resolution, Store};

    #[test]
    fn range_reads_only_the_series_its_matchers_select() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        let t0 = 1_793_577_600_000;
        let two = |gpu: &str, layer: &str, v: f64| Sample {
            ts_ms: t0,
            signal: "kv_fragmentation".into(),
            labels: [("gpu".to_owned(), gpu.to_owned()), ("layer".to_owned(), layer.to_owned())].into(),
            value: v,
        };
        store
            .insert(&[
                two("0", "3", 1.0),
                two("1", "3", 2.0),
                two("0", "4", 3.0),
                sample(t0, "other", "3", 9.0),
            ])
            .unwrap();
        let q = |m: &[(&str, &str)]| {
            let m: BTreeMap<String, String> = m.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            store.range("kv_fragmentation", &m, t0, t0 + 1000, 1000, Resolution::Raw).unwrap()
        };
        assert_eq!(q(&[]).len(), 3);
        let l3: Vec<f64> = q(&[("layer", "3")]).iter().map(|s| s.points[0].1).collect();
        assert_eq!(l3, vec![1.0, 2.0]);
        assert_eq!(q(&[("layer", "3"), ("gpu", "1")])[0].points, vec![(t0, 2.0)]);
        assert!(q(&[("layer", "7")]).is_empty());
        assert!(q(&[("pool", "a")]).is_empty());
        assert_eq!(store.latest_ts().unwrap(), Some(t0));
    }

    #[test]
    fn minute_queries_answer_while_a_batch_holds_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(Store::open(&dir.path().join("omen.db")).unwrap());
        let t0 = 1_793_577_600_000;
        store.insert(&(0..90).map(|i| sample(t0 + i * 1000, "kv", "0", 1.0)).collect::<Vec<_>>()).unwrap();
        // A batch in progress holds the writer; the query must not need it.
        let writer = store.writer.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = store.clone();
        std::thread::spawn(move || {
            let r =
                reader.range("kv", &BTreeMap::new(), t0, t0 + 7 * 3_600_000, 3_600_000, Resolution::Minute);
            tx.send(r.map(|s| s[0].points.clone())).unwrap();
        });
        // Generous: a query that waits for the writer never answers while it is held.
        let points =
            rx.recv_timeout(std::time::Duration::from_secs(60)).expect("the query waited for the writer");
        assert_eq!(points.unwrap(), vec![(t0, 1.0)]);
        drop(writer);
    }

    #[test]
    fn queries_during_writes_count_every_committed_sample_exactly_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(Store::open(&dir.path().join("omen.db")).unwrap());
        let t0 = 1_793_577_600_000;
        const BATCH: i64 = 7;
        const BATCHES: i64 = 600;
        let writer = {
            let store = store.clone();
            std::thread::spawn(move || {
                for b in 0..BATCHES {
                    // Sample i has value i: a snapshot holds a prefix of them, whose sum is known.
                    let batch: Vec<Sample> = (b * BATCH..(b + 1) * BATCH)
                        .map(|i| sample(t0 + i * 1000, "kv", "0", i as f64))
                        .collect();
                    store.insert(&batch).unwrap();
                }
            })
        };
        let until = t0 + BATCH * BATCHES * 1000;
        let mut seen = 0;
        while !writer.is_finished() || seen == 0 {
            let series = store
                .range_buckets("kv", &BTreeMap::new(), t0, until, until - t0, Resolution::Minute)
                .unwrap();
            let Some((_, buckets)) = series.first() else { continue };
            let (sum, count) = (buckets[0].1, buckets[0].2);
            assert_eq!(count % BATCH, 0, "a batch is seen whole or not at all");
            assert_eq!(sum, (count * (count - 1) / 2) as f64, "{count} samples: each once, none missing");
            seen += 1;
        }
        writer.join().unwrap();
        assert!(seen > 0);
    }
}
