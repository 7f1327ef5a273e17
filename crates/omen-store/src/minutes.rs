//! Minute aggregates. The open minute of each series is folded in memory and written
//! once, when a sample of a later minute arrives (or at [`crate::Store::flush`] / drop), so
//! the store writes about one aggregate row per series per minute instead of one
//! upsert per sample.
//!
//! Raw samples are durable per batch; the samples that decimation keeps out of the raw
//! table are appended, packed in one row per batch, to `minute_log` in the batch's
//! transaction. After a `kill -9` the open minute is rebuilt from that minute's raw and
//! logged samples when the store reopens, so it loses nothing acknowledged. Log rows go
//! once their minutes are written.

use std::collections::HashMap;

use anyhow::Result;
use omen_signals::MINUTE_MS;
use rusqlite::{params, Connection};

#[cfg(doc)]
use crate::Store;
use crate::{Unit, Writer};

/// A minute bucket of one series; `last` is the value of its last sample in arrival order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MinuteFold {
    pub(crate) count: i64,
    pub(crate) sum: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) last: f64,
}

impl MinuteFold {
    /// A fold of one sample: a minute starts with its first sample.
    pub(crate) fn new(value: f64) -> Self {
        Self { count: 1, sum: value, min: value, max: value, last: value }
    }

    /// Folds in the next sample in arrival order.
    pub(crate) fn add(&mut self, value: f64) {
        self.count += 1;
        self.sum += value;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
        self.last = value;
    }

    /// Folds in a later fold of the same minute (its samples came after this one's).
    pub(crate) fn merge(&mut self, later: &MinuteFold) {
        self.count += later.count;
        self.sum += later.sum;
        self.min = self.min.min(later.min);
        self.max = self.max.max(later.max);
        self.last = later.last;
    }
}

/// The minute-aggregate state of one series.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct SeriesMinutes {
    /// The newest minute, folded in memory and not yet written.
    pub(crate) open: Option<(i64, MinuteFold)>,
    /// The newest minute that may have a row in minute_agg; `open` is always newer.
    pub(crate) newest_row: Option<i64>,
    /// The oldest raw row (`samples`) and minute row (`minute_agg`) not yet in a block,
    /// at most as new as the real one: compaction finds its work here without a scan.
    pub(crate) oldest_raw_row: Option<i64>,
    pub(crate) oldest_minute_row: Option<i64>,
}

impl SeriesMinutes {
    /// Records a raw row written at `ts_ms` (for compaction).
    pub(crate) fn note_raw_row(&mut self, ts_ms: i64) {
        self.oldest_raw_row = Some(self.oldest_raw_row.map_or(ts_ms, |t| t.min(ts_ms)));
    }

    /// Records a minute row written for `minute` (for compaction).
    pub(crate) fn note_minute_row(&mut self, minute: i64) {
        self.oldest_minute_row = Some(self.oldest_minute_row.map_or(minute, |t| t.min(minute)));
    }
}

/// The minute state of every series, indexed by series id: ids are SQLite rowids handed
/// out as max + 1, so they are dense and a vector beats a hash map on the per-sample path.
#[derive(Default)]
pub(crate) struct MinuteTable(Vec<SeriesMinutes>);

impl MinuteTable {
    /// The state of series `id`, if it has any yet.
    pub(crate) fn get(&self, id: i64) -> Option<&SeriesMinutes> {
        usize::try_from(id).ok().and_then(|i| self.0.get(i))
    }

    /// The state of series `id`, grown to hold it (a new series starts empty).
    pub(crate) fn slot(&mut self, id: i64) -> &mut SeriesMinutes {
        let i = usize::try_from(id).expect("series ids are rowids >= 1");
        if i >= self.0.len() {
            self.0.resize(i + 1, SeriesMinutes::default());
        }
        &mut self.0[i]
    }

    /// Every series' state with its id.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (i64, &SeriesMinutes)> {
        self.0.iter().enumerate().map(|(i, m)| (i as i64, m))
    }

    /// Every series' state with its id, to change.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (i64, &mut SeriesMinutes)> {
        self.0.iter_mut().enumerate().map(|(i, m)| (i as i64, m))
    }
}

/// The open minute of every series as of the last commit, indexed by series id: what a
/// range query adds to the rows of its snapshot. It lives outside the writer's lock so
/// that a query never waits for a batch; a commit that changes open minutes happens while
/// its write lock is held, and a query starts its snapshot under the read lock, so that
/// a minute written meanwhile is counted exactly once (as a row or as open, never both).
#[derive(Default)]
pub(crate) struct OpenView(Vec<Option<(i64, MinuteFold)>>);

impl OpenView {
    /// The committed open minute of series `id`, if any.
    pub(crate) fn get(&self, id: i64) -> Option<(i64, MinuteFold)> {
        usize::try_from(id).ok().and_then(|i| self.0.get(i)).copied().flatten()
    }

    /// Publishes the open minute of series `id` (called with a commit, under the write lock).
    pub(crate) fn set(&mut self, id: i64, open: Option<(i64, MinuteFold)>) {
        let i = usize::try_from(id).expect("series ids are rowids >= 1");
        if i >= self.0.len() {
            if open.is_none() {
                return;
            }
            self.0.resize(i + 1, None);
        }
        self.0[i] = open;
    }

    /// The view of every series' open minute in `table`.
    pub(crate) fn of(table: &MinuteTable) -> Self {
        Self(table.0.iter().map(|m| m.open).collect())
    }
}

/// Start of the minute that `ts_ms` falls in (floor, also before 1970).
pub(crate) fn minute_of(ts_ms: i64) -> i64 {
    ts_ms.div_euclid(MINUTE_MS) * MINUTE_MS
}

/// Bytes of one `minute_log` entry: series id, timestamp (i64 LE each), value (f64 LE).
const LOG_ENTRY_BYTES: usize = 24;

/// Appends one decimated sample to a batch's `minute_log` entries.
pub(crate) fn log_entry(out: &mut Vec<u8>, id: i64, ts_ms: i64, value: f64) {
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&ts_ms.to_le_bytes());
    out.extend_from_slice(&value.to_le_bytes());
}

/// Logged decimated samples by series id, (ts, value) in log order.
type MinuteLog = HashMap<i64, Vec<(i64, f64)>>;

/// Reads every `minute_log` row; a row whose length is not a whole number of entries is corrupt.
pub(crate) fn read_minute_log(conn: &Connection) -> Result<MinuteLog> {
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

/// Adds a fold to a minute's row: a minute written before (late or replayed samples) grows.
pub(crate) const UPSERT_MINUTE: &str = "INSERT INTO minute_agg (series_id, minute_ms, count, sum, min, max, last) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
     ON CONFLICT (series_id, minute_ms) DO UPDATE SET count = count + excluded.count, sum = sum + excluded.sum,
     min = min(min, excluded.min), max = max(max, excluded.max), last = excluded.last";

/// Writes one minute's fold through [`UPSERT_MINUTE`].
pub(crate) fn upsert_minute(
    stmt: &mut rusqlite::CachedStatement<'_>,
    id: i64,
    minute: i64,
    a: &MinuteFold,
) -> Result<()> {
    stmt.execute(params![id, minute, a.count, a.sum, a.min, a.max, a.last])?;
    Ok(())
}

/// The minute state of one series after a restart: its newest aggregate row, and its
/// newest minute (of raw or logged samples) when that minute has no row yet (it was open
/// at the crash), folded from both in time order.
pub(crate) fn recover_minutes(conn: &Connection, id: i64, logged: &[(i64, f64)]) -> Result<SeriesMinutes> {
    let newest_row: Option<i64> = conn
        .prepare_cached("SELECT MAX(minute_ms) FROM minute_agg WHERE series_id = ?1")?
        .query_row([id], |r| r.get(0))?;
    let newest_raw: Option<i64> = conn
        .prepare_cached("SELECT MAX(ts_ms) FROM samples WHERE series_id = ?1")?
        .query_row([id], |r| r.get(0))?;
    let newest_logged = logged.iter().map(|e| e.0).max();
    let oldest_raw_row: Option<i64> = conn
        .prepare_cached("SELECT MIN(ts_ms) FROM samples WHERE series_id = ?1")?
        .query_row([id], |r| r.get(0))?;
    let oldest_minute_row: Option<i64> = conn
        .prepare_cached("SELECT MIN(minute_ms) FROM minute_agg WHERE series_id = ?1")?
        .query_row([id], |r| r.get(0))?;
    let mut state = SeriesMinutes { open: None, newest_row, oldest_raw_row, oldest_minute_row };
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

/// Writes every open minute (at shutdown); returns the rows written.
pub(crate) fn flush_open_minutes(w: &mut Writer) -> Result<usize> {
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
pub(crate) fn close_stale_minutes(w: &mut Writer) -> Result<()> {
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
    let tx = Unit::begin(&mut w.conn, w.offline)?;
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
    let mut view = w.open_view.write().unwrap_or_else(|e| e.into_inner());
    tx.commit()?;
    for &id in &closed {
        let m = w.minutes.slot(id);
        if let Some((minute, _)) = m.open.take() {
            m.newest_row = Some(minute);
            m.note_minute_row(minute);
        }
        view.set(id, None);
    }
    Ok(closed.len())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use omen_sources::Sample;

    use crate::test_util::{log_rows, minute_rows, minute_rows_from_raw, sample};
    use crate::{Resolution, Store};

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
        let conn = store.reader().unwrap();
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
            store.reader().unwrap().query_row("SELECT SUM(count) FROM minute_agg", [], |r| r.get(0)).unwrap();
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
}
