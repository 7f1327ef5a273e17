//! SQLite store (WAL): raw samples with retention, minute and day aggregates kept
//! for weeks so that a restart keeps the history the 14-day forecast needs.
//!
//! A batch is acknowledged only after its transaction commits; with WAL and
//! synchronous=NORMAL a committed transaction survives `kill -9` (it is in the
//! WAL file; only an OS crash or power loss can drop the last ones).
//!
//! Minute aggregates: the open minute of each series is folded in memory and written
//! once, when a sample of a later minute arrives (or at [`Store::flush`] / drop), so
//! the store writes about one aggregate row per series per minute instead of one
//! upsert per sample. Raw samples stay durable per batch, and so do the samples that
//! decimation keeps out of the raw table: each batch appends them, packed in one row,
//! to `minute_log` in its own transaction. After a `kill -9` the open minute is rebuilt
//! from that minute's raw samples and logged ones when the store reopens, so it loses
//! nothing acknowledged. Log rows go once their minutes are written. One `Store` at a
//! time per database file: a second one would hold the same open minutes.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, RwLock};

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
CREATE TABLE IF NOT EXISTS minute_log (minute_ms INTEGER NOT NULL, entries BLOB NOT NULL);
";

/// Bytes of one `minute_log` entry: series id, timestamp (i64 LE each), value (f64 LE).
const LOG_ENTRY_BYTES: usize = 24;

/// Appends one decimated sample to a batch's `minute_log` entries.
fn log_entry(out: &mut Vec<u8>, id: i64, ts_ms: i64, value: f64) {
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&ts_ms.to_le_bytes());
    out.extend_from_slice(&value.to_le_bytes());
}

/// Logged decimated samples by series id, (ts, value) in log order.
type MinuteLog = HashMap<i64, Vec<(i64, f64)>>;

/// Reads every `minute_log` row; a row whose length is not a whole number of entries is corrupt.
fn read_minute_log(conn: &Connection) -> Result<MinuteLog> {
    let mut out = MinuteLog::new();
    let mut stmt = conn.prepare("SELECT entries FROM minute_log ORDER BY rowid")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let blob: Vec<u8> = row.get(0)?;
        anyhow::ensure!(
            blob.len() % LOG_ENTRY_BYTES == 0,
            "corrupt minute_log row of {} bytes in the store; delete the store file or restore a backup",
            blob.len()
        );
        for e in blob.chunks_exact(LOG_ENTRY_BYTES) {
            let word = |i: usize| <[u8; 8]>::try_from(&e[i * 8..i * 8 + 8]).expect("8 bytes");
            let (id, ts, value) =
                (i64::from_le_bytes(word(0)), i64::from_le_bytes(word(1)), f64::from_le_bytes(word(2)));
            out.entry(id).or_default().push((ts, value));
        }
    }
    Ok(out)
}

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

/// Identity of a stored series, as [`Store::insert_with_ids`] hands it out.
pub type SeriesId = i64;

/// Reader connections handed out one request at a time; a caller waits for a free one.
struct ReaderPool {
    idle: Mutex<Vec<Connection>>,
    returned: Condvar,
}

/// A reader connection on loan from the pool; it goes back on drop.
struct PooledReader<'a> {
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
    fn get(&self) -> PooledReader<'_> {
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

/// Series ids by signal, then labels: looked up by reference, without building a key.
type SeriesIds = HashMap<String, HashMap<BTreeMap<String, String>, i64>>;

/// Every stored series of each signal, (id, labels) in id order, for range queries.
type Catalog = HashMap<String, Vec<(i64, BTreeMap<String, String>)>>;

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

/// The store: one writer connection and a pool of readers (WAL lets them run concurrently).
pub struct Store {
    path: PathBuf,
    writer: Mutex<Writer>,
    readers: ReaderPool,
    /// Committed series, so that a range query reads only the series its matchers select.
    catalog: RwLock<Catalog>,
    /// Newest committed raw timestamp (i64::MIN: none).
    latest_raw_ts: AtomicI64,
    /// Bumped after every committed change, so readers can cache what they read.
    generation: AtomicU64,
}

struct Writer {
    conn: Connection,
    series_ids: SeriesIds,
    minutes: MinuteTable,
    /// Newest minute any sample fell in (event time).
    newest_minute: i64,
    /// Open minutes before this one have been written and their log rows deleted.
    log_floor: i64,
}

/// The minute state of every series, indexed by series id: ids are SQLite rowids handed
/// out as max + 1, so they are dense and a vector beats a hash map on the per-sample path.
#[derive(Default)]
struct MinuteTable(Vec<SeriesMinutes>);

impl MinuteTable {
    fn get(&self, id: i64) -> Option<&SeriesMinutes> {
        usize::try_from(id).ok().and_then(|i| self.0.get(i))
    }

    fn slot(&mut self, id: i64) -> &mut SeriesMinutes {
        let i = usize::try_from(id).expect("series ids are rowids >= 1");
        if i >= self.0.len() {
            self.0.resize(i + 1, SeriesMinutes::default());
        }
        &mut self.0[i]
    }

    fn iter(&self) -> impl Iterator<Item = (i64, &SeriesMinutes)> {
        self.0.iter().enumerate().map(|(i, m)| (i as i64, m))
    }

    fn values_mut(&mut self) -> impl Iterator<Item = &mut SeriesMinutes> {
        self.0.iter_mut()
    }
}

/// The minute-aggregate state of one series.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct SeriesMinutes {
    /// The newest minute, folded in memory and not yet written.
    open: Option<(i64, MinuteFold)>,
    /// The newest minute that may have a row in minute_agg; `open` is always newer.
    newest_row: Option<i64>,
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

fn minute_of(ts_ms: i64) -> i64 {
    ts_ms.div_euclid(MINUTE_MS) * MINUTE_MS
}

const UPSERT_MINUTE: &str = "INSERT INTO minute_agg (series_id, minute_ms, count, sum, min, max, last) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
     ON CONFLICT (series_id, minute_ms) DO UPDATE SET count = count + excluded.count, sum = sum + excluded.sum,
     min = min(min, excluded.min), max = max(max, excluded.max), last = excluded.last";

/// The minute state of one series after a restart: its newest aggregate row, and its
/// newest minute (of raw or logged samples) when that minute has no row yet (it was open
/// at the crash), folded from both in time order.
fn recover_minutes(conn: &Connection, id: i64, logged: &[(i64, f64)]) -> Result<SeriesMinutes> {
    let newest_row: Option<i64> = conn
        .prepare_cached("SELECT MAX(minute_ms) FROM minute_agg WHERE series_id = ?1")?
        .query_row([id], |r| r.get(0))?;
    let newest_raw: Option<i64> = conn
        .prepare_cached("SELECT MAX(ts_ms) FROM samples WHERE series_id = ?1")?
        .query_row([id], |r| r.get(0))?;
    let newest_logged = logged.iter().map(|e| e.0).max();
    let mut state = SeriesMinutes { open: None, newest_row };
    let Some(minute) = newest_raw.max(newest_logged).map(minute_of) else { return Ok(state) };
    if newest_row.is_some_and(|r| r >= minute) {
        return Ok(state);
    }
    let mut stmt = conn.prepare_cached(
        "SELECT ts_ms, value FROM samples WHERE series_id = ?1 AND ts_ms >= ?2 AND ts_ms < ?3 ORDER BY ts_ms, rowid",
    )?;
    let mut values: Vec<(i64, f64)> = stmt
        .query_map(params![id, minute, minute + MINUTE_MS], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    values.extend(logged.iter().filter(|e| minute_of(e.0) == minute));
    // Stable: raw before logged at the same time stamp, each in its own order.
    values.sort_by_key(|e| e.0);
    let mut fold: Option<MinuteFold> = None;
    for (_, v) in values {
        match fold.as_mut() {
            Some(f) => f.add(v),
            None => fold = Some(MinuteFold::new(v)),
        }
    }
    state.open = fold.map(|f| (minute, f));
    Ok(state)
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
        let mut series_ids = SeriesIds::new();
        let mut catalog = Catalog::new();
        let mut minutes = MinuteTable::default();
        let log = read_minute_log(&conn)?;
        {
            let mut stmt = conn.prepare("SELECT id, signal, labels FROM series ORDER BY id")?;
            let rows = stmt.query_map([], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
            })?;
            for row in rows {
                let (id, signal, labels) = row?;
                let labels: BTreeMap<String, String> =
                    serde_json::from_str(&labels).context("corrupt series labels in the store")?;
                catalog.entry(signal.clone()).or_default().push((id, labels.clone()));
                series_ids.entry(signal).or_default().insert(labels, id);
                *minutes.slot(id) = recover_minutes(&conn, id, log.get(&id).map_or(&[], |v| v.as_slice()))?;
            }
        }
        let latest: Option<i64> = conn.query_row("SELECT MAX(ts_ms) FROM samples", [], |r| r.get(0))?;
        let idle = (0..READERS).map(|_| open_connection(path)).collect::<Result<Vec<_>>>()?;
        Ok(Self {
            path: path.to_owned(),
            writer: Mutex::new(Writer {
                conn,
                series_ids,
                minutes,
                newest_minute: i64::MIN,
                log_floor: i64::MIN,
            }),
            readers: ReaderPool { idle: Mutex::new(idle), returned: Condvar::new() },
            catalog: RwLock::new(catalog),
            latest_raw_ts: AtomicI64::new(latest.unwrap_or(i64::MIN)),
            generation: AtomicU64::new(0),
        })
    }

    /// File path of the database.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn reader(&self) -> PooledReader<'_> {
        self.readers.get()
    }

    /// Writes samples and their minute aggregates in one transaction; returns after commit.
    pub fn insert(&self, samples: &[Sample]) -> Result<()> {
        self.insert_with_raw(samples, &[])
    }

    /// As [`Store::insert`], but samples whose `keep_raw` entry is false only update
    /// their minute aggregate (decimation of high-rate series). A shorter `keep_raw` keeps the rest raw.
    pub fn insert_with_raw(&self, samples: &[Sample], keep_raw: &[bool]) -> Result<()> {
        self.insert_with_ids(samples, keep_raw, &mut vec![None; samples.len()])
    }

    /// As [`Store::insert_with_raw`], with the series id of each sample where the caller
    /// knows it (saves the label lookup); it must come from this store. Unknown ids are
    /// filled in; they are valid only when this returns Ok (a failed batch voids new ids).
    pub fn insert_with_ids(
        &self,
        samples: &[Sample],
        keep_raw: &[bool],
        ids: &mut [Option<SeriesId>],
    ) -> Result<()> {
        if samples.is_empty() {
            return Ok(());
        }
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let mut created: Vec<(i64, SeriesKey)> = Vec::new();
        let mut undo: Vec<(i64, SeriesMinutes)> = Vec::with_capacity(samples.len());
        let result = insert_batch(&mut w, &mut created, &mut undo, samples, keep_raw, ids);
        match result {
            Ok(newest_raw) => {
                if let Some(ts) = newest_raw {
                    self.latest_raw_ts.fetch_max(ts, Ordering::Relaxed);
                }
                // The batch is committed either way; a failure here only keeps log rows longer.
                if let Err(e) = close_stale_minutes(&mut w) {
                    tracing::warn!(
                        "store {}: stale open minutes not written yet: {e:#}",
                        self.path.display()
                    );
                }
                self.changed();
                if !created.is_empty() {
                    let mut catalog = self.catalog.write().unwrap_or_else(|e| e.into_inner());
                    for (id, key) in created {
                        catalog.entry(key.signal).or_default().push((id, key.labels));
                    }
                }
                Ok(())
            }
            Err(e) => {
                // The transaction rolled back: ids handed out inside it are void, and the
                // open minutes go back to what was committed.
                let Writer { series_ids, minutes, .. } = &mut *w;
                for (_, key) in &created {
                    if let Some(f) = series_ids.get_mut(&key.signal) {
                        f.remove(&key.labels);
                    }
                }
                // Newest first, so that each series ends at its state before the batch.
                for (id, before) in undo.into_iter().rev() {
                    *minutes.slot(id) = before;
                }
                Err(e)
            }
        }
    }

    /// Writes every open minute aggregate (at shutdown); returns the rows written.
    pub fn flush(&self) -> Result<usize> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let written = flush_open_minutes(&mut w);
        self.changed();
        written
    }

    /// A number that changes after every committed write: two reads at the same
    /// generation see the same data.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Marks a committed change (called with the writer lock held).
    fn changed(&self) {
        self.generation.fetch_add(1, Ordering::Release);
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
        self.changed();
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
        let selected: Vec<(i64, BTreeMap<String, String>)> = {
            let catalog = self.catalog.read().unwrap_or_else(|e| e.into_inner());
            matching(&catalog, signal, matchers).cloned().collect()
        };
        if selected.is_empty() {
            return Ok(Vec::new());
        }
        let conn = self.reader();
        // One read transaction: every series is read from the same committed snapshot.
        let tx = conn.unchecked_transaction()?;
        let mut open: HashMap<i64, (i64, MinuteFold)> = HashMap::new();
        if resolution == Resolution::Minute {
            // The open minutes live in the writer: take them together with the start of
            // the snapshot, so that a minute flushed meanwhile is counted exactly once.
            let w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            tx.query_row("SELECT COUNT(*) FROM meta", [], |r| r.get::<_, i64>(0))?;
            for (id, _) in &selected {
                if let Some(o) = w.minutes.get(*id).and_then(|m| m.open) {
                    if o.0 >= since_ms && o.0 < until_ms {
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
            Resolution::Day => {
                "SELECT (day_ms - ?2) / ?4, SUM(sum), SUM(count) FROM day_agg
                 WHERE series_id = ?1 AND day_ms >= ?2 AND day_ms < ?3 GROUP BY 1 ORDER BY 1"
            }
        };
        let mut stmt = tx.prepare_cached(sql)?;
        let mut out = Vec::new();
        for (id, labels) in selected {
            let mut buckets: Vec<(i64, f64, i64)> = stmt
                .query_map(params![id, since_ms, until_ms, step_ms], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?
                .collect::<rusqlite::Result<_>>()?;
            if let Some((minute, fold)) = open.get(&id) {
                let bucket = (minute - since_ms) / step_ms;
                match buckets.binary_search_by_key(&bucket, |b| b.0) {
                    Ok(i) => {
                        buckets[i].1 += fold.sum;
                        buckets[i].2 += fold.count;
                    }
                    Err(i) => buckets.insert(i, (bucket, fold.sum, fold.count)),
                }
            }
            if buckets.is_empty() {
                continue;
            }
            let points = buckets
                .into_iter()
                .map(|(b, sum, count)| (since_ms + b * step_ms, sum / count as f64))
                .collect();
            out.push(RangeSeries { labels, points });
        }
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
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let mut n =
            w.conn.execute("DELETE FROM samples WHERE ts_ms < ?1", [now_ms - raw_days as i64 * DAY_MS])?;
        let minute_cutoff = now_ms - minute_days as i64 * DAY_MS;
        n += w.conn.execute("DELETE FROM minute_agg WHERE minute_ms < ?1", [minute_cutoff])?;
        // Logged samples of minutes past retention would only rebuild them after a crash.
        w.conn.execute("DELETE FROM minute_log WHERE minute_ms < ?1", [minute_cutoff])?;
        // An open minute past retention goes too (it would be written only to be deleted).
        for m in w.minutes.values_mut() {
            if m.open.is_some_and(|(minute, _)| minute < minute_cutoff) {
                m.open = None;
                n += 1;
            }
        }
        n += w.conn.execute("DELETE FROM day_agg WHERE day_ms < ?1", [now_ms - day_days as i64 * DAY_MS])?;
        if n > 0 {
            let latest: Option<i64> = w.conn.query_row("SELECT MAX(ts_ms) FROM samples", [], |r| r.get(0))?;
            self.latest_raw_ts.store(latest.unwrap_or(i64::MIN), Ordering::Relaxed);
            self.changed();
        }
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

    /// Latest raw timestamp stored, if any (kept in memory: every /scores request asks).
    pub fn latest_ts(&self) -> Result<Option<i64>> {
        Ok(Some(self.latest_raw_ts.load(Ordering::Relaxed)).filter(|&t| t != i64::MIN))
    }
}

impl Drop for Store {
    /// Writes the open minutes; a failure here only costs what a `kill -9` would.
    fn drop(&mut self) {
        let w = self.writer.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = flush_open_minutes(w) {
            tracing::warn!(
                "store {}: open minute aggregates not written at close: {e:#}",
                self.path.display()
            );
        }
    }
}

/// A minute bucket of one series; `last` is the value of its last sample in arrival order.
#[derive(Debug, Clone, Copy, PartialEq)]
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

fn upsert_minute(
    stmt: &mut rusqlite::CachedStatement<'_>,
    id: i64,
    minute: i64,
    a: &MinuteFold,
) -> Result<()> {
    stmt.execute(params![id, minute, a.count, a.sum, a.min, a.max, a.last])?;
    Ok(())
}

fn flush_open_minutes(w: &mut Writer) -> Result<usize> {
    if w.minutes.iter().all(|(_, m)| m.open.is_none()) {
        return Ok(0);
    }
    // Every open minute becomes a row: nothing is left to rebuild from the log.
    write_open_minutes(w, i64::MAX)
}

/// Writes the open minutes older than the minute before the newest one (series that
/// went quiet; a late sample still adds to the written row) and deletes the log rows of
/// minutes before that, once per minute of event time, so that the log stays about two
/// minutes long whatever series stop.
fn close_stale_minutes(w: &mut Writer) -> Result<()> {
    let cutoff = w.newest_minute.saturating_sub(MINUTE_MS);
    if cutoff <= w.log_floor {
        return Ok(());
    }
    write_open_minutes(w, cutoff)?;
    w.log_floor = cutoff;
    Ok(())
}

/// Writes every open minute before `before` as its row and deletes the log rows of
/// minutes before it, in one transaction; returns the rows written.
fn write_open_minutes(w: &mut Writer, before: i64) -> Result<usize> {
    let tx = w.conn.transaction()?;
    let mut closed = Vec::new();
    {
        let mut upsert = tx.prepare_cached(UPSERT_MINUTE)?;
        for (id, m) in w.minutes.iter() {
            if let Some((minute, fold)) = &m.open {
                if *minute < before {
                    upsert_minute(&mut upsert, id, *minute, fold)?;
                    closed.push(id);
                }
            }
        }
    }
    tx.execute("DELETE FROM minute_log WHERE minute_ms < ?1", [before])?;
    tx.commit()?;
    for &id in &closed {
        let m = w.minutes.slot(id);
        if let Some((minute, _)) = m.open.take() {
            m.newest_row = Some(minute);
        }
    }
    Ok(closed.len())
}

/// Writes one batch in one transaction; returns the newest raw timestamp written. The
/// open minutes are updated in place; `undo` records a series' state before each change.
fn insert_batch(
    w: &mut Writer,
    created: &mut Vec<(i64, SeriesKey)>,
    undo: &mut Vec<(i64, SeriesMinutes)>,
    samples: &[Sample],
    keep_raw: &[bool],
    ids: &mut [Option<SeriesId>],
) -> Result<Option<i64>> {
    let Writer { conn, series_ids, minutes, newest_minute, .. } = w;
    let tx = conn.transaction()?;
    let mut newest_raw: Option<i64> = None;
    // Decimated samples folded into open minutes, for minute_log (see the module doc).
    let mut logged: Vec<u8> = Vec::new();
    let mut logged_minute = i64::MIN;
    let mut batch_newest_minute = i64::MIN;
    {
        let mut new_series = tx.prepare_cached("INSERT INTO series (signal, labels) VALUES (?1, ?2)")?;
        let mut insert =
            tx.prepare_cached("INSERT INTO samples (series_id, ts_ms, value) VALUES (?1, ?2, ?3)")?;
        let mut upsert = tx.prepare_cached(UPSERT_MINUTE)?;
        // Samples for a minute that is no longer open (late or replayed data), folded per batch.
        let mut late: HashMap<(i64, i64), MinuteFold> = HashMap::new();
        for (i, s) in samples.iter().enumerate() {
            let known = ids.get(i).copied().flatten();
            let id = match known.or_else(|| series_ids.get(&s.signal).and_then(|f| f.get(&s.labels)).copied())
            {
                Some(id) => id,
                None => {
                    new_series.execute(params![s.signal, labels_json(&s.labels)])?;
                    let id = tx.last_insert_rowid();
                    created.push((id, s.series_key()));
                    let family = match series_ids.get_mut(&s.signal) {
                        Some(f) => f,
                        None => series_ids.entry(s.signal.clone()).or_default(),
                    };
                    family.insert(s.labels.clone(), id);
                    id
                }
            };
            if let Some(slot) = ids.get_mut(i) {
                *slot = Some(id);
            }
            let raw = keep_raw.get(i).copied().unwrap_or(true);
            if raw {
                insert.execute(params![id, s.ts_ms, s.value])?;
                newest_raw = Some(newest_raw.map_or(s.ts_ms, |t| t.max(s.ts_ms)));
            }
            let bucket = minute_of(s.ts_ms);
            batch_newest_minute = batch_newest_minute.max(bucket);
            let m = minutes.slot(id);
            undo.push((id, *m));
            let mut log_it = |logged: &mut Vec<u8>| {
                if !raw {
                    log_entry(logged, id, s.ts_ms, s.value);
                    logged_minute = logged_minute.max(bucket);
                }
            };
            match &mut m.open {
                Some((open, fold)) if *open == bucket => {
                    fold.add(s.value);
                    log_it(&mut logged);
                }
                open if open.is_none_or(|(o, _)| bucket > o) && m.newest_row.is_none_or(|r| bucket > r) => {
                    // A newer minute: the open one is complete; write it with this batch.
                    if let Some((o, fold)) = open.take() {
                        upsert_minute(&mut upsert, id, o, &fold)?;
                        m.newest_row = Some(o);
                    }
                    m.open = Some((bucket, MinuteFold::new(s.value)));
                    log_it(&mut logged);
                }
                _ => {
                    late.entry((id, bucket))
                        .and_modify(|a| a.add(s.value))
                        .or_insert_with(|| MinuteFold::new(s.value));
                    m.newest_row = Some(m.newest_row.map_or(bucket, |r| r.max(bucket)));
                }
            }
        }
        for ((id, bucket), a) in &late {
            upsert_minute(&mut upsert, *id, *bucket, a)?;
        }
        if !logged.is_empty() {
            tx.prepare_cached("INSERT INTO minute_log (minute_ms, entries) VALUES (?1, ?2)")?
                .execute(params![logged_minute, logged])?;
        }
    }
    tx.commit()?;
    *newest_minute = (*newest_minute).max(batch_newest_minute);
    Ok(newest_raw)
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
    fn every_committed_write_changes_the_generation() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        let t0 = 1_793_577_600_000;
        let mut seen = vec![store.generation()];
        store.insert(&[sample(t0, "kvf_ratio", "0", 1.0)]).unwrap();
        seen.push(store.generation());
        store.insert(&[]).unwrap(); // nothing written: the same generation
        assert_eq!(store.generation(), seen[1]);
        store.flush().unwrap();
        seen.push(store.generation());
        store.roll_up_days(t0, t0 + DAY_MS).unwrap();
        seen.push(store.generation());
        store.apply_retention(t0 + 400 * DAY_MS, 1, 1, 1).unwrap();
        seen.push(store.generation());
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
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
        // Minute t0 was written when minute t0 + 1 began; the open one at flush.
        assert_eq!(store.flush().unwrap(), 2);
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

    /// Every minute_agg row, (series id, minute, count, sum, min, max, last).
    type MinuteRow = (i64, i64, i64, f64, f64, f64, f64);

    fn minute_rows(store: &Store) -> Vec<MinuteRow> {
        let conn = store.reader();
        let mut stmt = conn
            .prepare("SELECT series_id, minute_ms, count, sum, min, max, last FROM minute_agg ORDER BY series_id, minute_ms")
            .unwrap();
        stmt.query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?))
        })
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
    }

    /// The minute aggregates recomputed from the raw samples, in the same form.
    fn minute_rows_from_raw(store: &Store) -> Vec<MinuteRow> {
        let conn = store.reader();
        let mut stmt = conn
            .prepare("SELECT series_id, ts_ms, value FROM samples ORDER BY series_id, ts_ms, rowid")
            .unwrap();
        let raw: Vec<(i64, i64, f64)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let mut out: Vec<MinuteRow> = Vec::new();
        for (id, ts, v) in raw {
            let minute = minute_of(ts);
            match out.last_mut() {
                Some(r) if r.0 == id && r.1 == minute => {
                    r.2 += 1;
                    r.3 += v;
                    r.4 = r.4.min(v);
                    r.5 = r.5.max(v);
                    r.6 = v;
                }
                _ => out.push((id, minute, 1, v, v, v, v)),
            }
        }
        out
    }

    #[test]
    fn open_minutes_are_written_once_per_minute_and_rebuilt_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("omen.db");
        let t0 = 1_793_577_600_000;
        // 150 one-second batches of three series: minutes t0 and t0+1 close, t0+2 stays open.
        let batch = |i: i64| -> Vec<Sample> {
            (0..3)
                .map(|layer| sample(t0 + i * 1000, "kv", &layer.to_string(), (i * (layer + 1)) as f64 * 0.5))
                .collect()
        };
        {
            let store = Store::open(&path).unwrap();
            for i in 0..150 {
                store.insert(&batch(i)).unwrap();
            }
            // Only the two closed minutes have rows: one write per series per minute.
            let rows = minute_rows(&store);
            assert_eq!(rows.len(), 6, "{rows:?}");
            assert!(rows.iter().all(|r| r.2 == 60));
            // Minute-resolution reads include the open minute all the same.
            let m =
                store.range("kv", &BTreeMap::new(), t0, t0 + 180_000, 60_000, Resolution::Minute).unwrap();
            let r = store.range("kv", &BTreeMap::new(), t0, t0 + 180_000, 60_000, Resolution::Raw).unwrap();
            assert_eq!(m, r);
            assert_eq!(m[0].points.len(), 3);
            // kill -9: no flush, no destructor.
            std::mem::forget(store);
        }
        let store = Store::open(&path).unwrap();
        let m = store.range("kv", &BTreeMap::new(), t0, t0 + 180_000, 60_000, Resolution::Minute).unwrap();
        let r = store.range("kv", &BTreeMap::new(), t0, t0 + 180_000, 60_000, Resolution::Raw).unwrap();
        assert_eq!(m, r, "the open minute is rebuilt from its raw samples");
        // More samples of the rebuilt minute, then a clean close.
        for i in 150..170 {
            store.insert(&batch(i)).unwrap();
        }
        drop(store);
        let store = Store::open(&path).unwrap();
        let rows = minute_rows(&store);
        assert_eq!(rows.len(), 9);
        assert_eq!(rows, minute_rows_from_raw(&store));
    }

    fn log_rows(store: &Store) -> i64 {
        store.reader().query_row("SELECT COUNT(*) FROM minute_log", [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn decimated_samples_of_the_open_minute_survive_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("omen.db");
        let t0 = 1_793_577_600_000;
        // 150 one-second batches of two series, 1 in 10 samples kept raw: minutes t0 and
        // t0+1 close, t0+2 (30 samples, 3 of them raw) is open at the crash.
        let batch = |i: i64| -> Vec<Sample> {
            (0..2)
                .map(|layer| sample(t0 + i * 1000, "kv", &layer.to_string(), (i * (layer + 1)) as f64))
                .collect()
        };
        let keep = |i: i64| vec![i % 10 == 0; 2];
        let before_crash = {
            let store = Store::open(&path).unwrap();
            for i in 0..150 {
                store.insert_with_raw(&batch(i), &keep(i)).unwrap();
            }
            let m =
                store.range("kv", &BTreeMap::new(), t0, t0 + 180_000, 60_000, Resolution::Minute).unwrap();
            // Mean of minute t0+2 over all 30 samples (i = 120..149), not only the raw ones.
            assert_eq!(m[0].points[2], (t0 + 120_000, 134.5), "{m:?}");
            std::mem::forget(store); // kill -9
            m
        };
        let store = Store::open(&path).unwrap();
        let m = store.range("kv", &BTreeMap::new(), t0, t0 + 180_000, 60_000, Resolution::Minute).unwrap();
        assert_eq!(m, before_crash, "the open minute comes back whole, decimated samples included");
        // It goes on folding, and a clean close writes it with all 60 samples.
        for i in 150..180 {
            store.insert_with_raw(&batch(i), &keep(i)).unwrap();
        }
        drop(store);
        let store = Store::open(&path).unwrap();
        let rows = minute_rows(&store);
        assert_eq!(rows.len(), 6, "{rows:?}");
        assert!(rows.iter().all(|r| r.2 == 60), "{rows:?}");
        assert_eq!(log_rows(&store), 0, "a clean close leaves no log");
    }

    #[test]
    fn the_minute_log_stays_short_even_when_a_series_goes_quiet() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("omen.db");
        let t0 = 1_793_577_600_000;
        {
            let store = Store::open(&path).unwrap();
            // Series "0" is pushed for 30 s and then stops; series "1" goes on for 10 minutes.
            for i in 0..600i64 {
                let mut b = vec![sample(t0 + i * 1000, "kv", "1", 1.0)];
                if i < 30 {
                    b.push(sample(t0 + i * 1000, "kv", "0", 2.0));
                }
                let keep = vec![i % 10 == 0; b.len()];
                store.insert_with_raw(&b, &keep).unwrap();
                // One row per batch, for at most the current and the previous minute (+ this one).
                assert!(log_rows(&store) <= 180, "{} log rows at {i}", log_rows(&store));
            }
            // The quiet series' minute was written once the log moved past it.
            let rows = minute_rows(&store);
            assert!(rows.iter().any(|r| r.1 == t0 && r.2 == 30 && (r.3 - 60.0).abs() < 1e-9), "{rows:?}");
            std::mem::forget(store);
        }
        let store = Store::open(&path).unwrap();
        let m = store.range("kv", &BTreeMap::new(), t0, t0 + 600_000, 60_000, Resolution::Minute).unwrap();
        let counts: i64 =
            store.reader().query_row("SELECT SUM(count) FROM minute_agg", [], |r| r.get(0)).unwrap();
        // Written rows plus the open minute of series "1" (60 samples, rebuilt) hold all 630.
        let open: i64 =
            store.writer.lock().unwrap().minutes.iter().filter_map(|(_, m)| m.open.map(|o| o.1.count)).sum();
        assert_eq!(counts + open, 630, "{m:?}");
    }

    #[test]
    fn late_samples_of_a_written_minute_add_to_its_row() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        let t0 = 1_793_577_600_000;
        store.insert(&[sample(t0, "kv", "0", 1.0), sample(t0 + 60_000, "kv", "0", 2.0)]).unwrap();
        // Late: minute t0 is written already, and minute t0 + 1 is open.
        store.insert(&[sample(t0 + 30_000, "kv", "0", 3.0)]).unwrap();
        store.flush().unwrap();
        assert_eq!(minute_rows(&store), minute_rows_from_raw(&store));
        // After a restart, replayed data for an old minute also adds to its row.
        drop(store);
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        store.insert(&[sample(t0 + 45_000, "kv", "0", 4.0)]).unwrap();
        store.flush().unwrap();
        assert_eq!(minute_rows(&store), minute_rows_from_raw(&store));
        assert_eq!(minute_rows(&store)[0].2, 3);
    }

    #[test]
    fn a_failed_batch_leaves_the_open_minutes_as_committed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        let t0 = 1_793_577_600_000;
        store.insert(&[sample(t0, "kv", "0", 1.0), sample(t0 + 1000, "kv", "0", 2.0)]).unwrap();
        // NaN binds as NULL and violates NOT NULL: the whole batch rolls back, including
        // the write of minute t0 that its first sample triggered, and the new series.
        let bad = [sample(t0 + 60_000, "kv", "0", 5.0), sample(t0 + 60_000, "kv", "9", f64::NAN)];
        assert!(store.insert(&bad).is_err());
        assert!(minute_rows(&store).is_empty());
        store.insert(&[sample(t0 + 2000, "kv", "0", 3.0), sample(t0 + 2000, "kv", "9", 7.0)]).unwrap();
        store.flush().unwrap();
        assert_eq!(minute_rows(&store), minute_rows_from_raw(&store));
        assert_eq!(minute_rows(&store)[0].2, 3);
        let only9 = store
            .range(
                "kv",
                &[("layer".to_owned(), "9".to_owned())].into(),
                t0,
                t0 + 60_000,
                60_000,
                Resolution::Raw,
            )
            .unwrap();
        assert_eq!(only9.len(), 1);
        assert_eq!(only9[0].points, vec![(t0, 7.0)]);
    }

    #[test]
    fn range_reads_only_the_series_its_matchers_select() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        let t0 = 1_793_577_600_000;
        let two = |gpu: &str, layer: &str, v: f64| Sample {
            ts_ms: t0,
            signal: "kvf_ratio".into(),
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
            store.range("kvf_ratio", &m, t0, t0 + 1000, 1000, Resolution::Raw).unwrap()
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
    fn known_ids_skip_the_lookup_and_new_ones_are_filled_in() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        let t0 = 1_793_577_600_000;
        let batch = |ts: i64| vec![sample(ts, "kv", "0", 1.0), sample(ts, "kv", "1", 2.0)];
        let mut ids = vec![None, None];
        store.insert_with_ids(&batch(t0), &[], &mut ids).unwrap();
        assert!(ids[0].is_some() && ids[1].is_some() && ids[0] != ids[1]);
        let known = ids.clone();
        store.insert_with_ids(&batch(t0 + 1000), &[], &mut ids).unwrap();
        assert_eq!(ids, known);
        let r = store.range("kv", &BTreeMap::new(), t0, t0 + 2000, 1000, Resolution::Raw).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].points, vec![(t0, 1.0), (t0 + 1000, 1.0)]);
        assert_eq!(r[1].points, vec![(t0, 2.0), (t0 + 1000, 2.0)]);
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
