//! Writing batches: each batch of samples, the series it creates and the minutes it
//! closes commit in one transaction, and the call returns only after the commit.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use anyhow::Result;
use omen_sources::{Sample, SeriesKey};
use rusqlite::params;

use crate::minutes::{
    close_stale_minutes, flush_open_minutes, log_entry, minute_of, upsert_minute, MinuteFold, SeriesMinutes,
    UPSERT_MINUTE,
};
use crate::query::Catalog;
use crate::schema::labels_json;
use crate::{SeriesId, SeriesIds, Store, Unit, Writer};

/// Creates a series row.
pub(crate) const INSERT_SERIES: &str = "INSERT INTO series (signal, labels) VALUES (?1, ?2)";

/// Series created inside one write transaction. The writer's ids know them at once (later
/// rows of the same transaction find them); the catalog learns them after the commit, and
/// the writer forgets them again when the transaction fails.
#[derive(Default)]
pub(crate) struct NewSeries(Vec<(SeriesId, SeriesKey)>);

impl NewSeries {
    /// The id of series `key`, created in `tx` (with `insert`, a prepared [`INSERT_SERIES`])
    /// when `series_ids` does not know it.
    pub(crate) fn id(
        &mut self,
        tx: &rusqlite::Connection,
        insert: &mut rusqlite::CachedStatement<'_>,
        series_ids: &mut SeriesIds,
        signal: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<SeriesId> {
        if let Some(id) = series_ids.get(signal).and_then(|f| f.get(labels)) {
            return Ok(*id);
        }
        insert.execute(params![signal, labels_json(labels)])?;
        let id = tx.last_insert_rowid();
        self.0.push((id, SeriesKey { signal: signal.to_owned(), labels: labels.clone() }));
        let family = match series_ids.get_mut(signal) {
            Some(f) => f,
            None => series_ids.entry(signal.to_owned()).or_default(),
        };
        family.insert(labels.clone(), id);
        Ok(id)
    }

    /// After the commit: range queries find the new series.
    pub(crate) fn publish(self, catalog: &std::sync::RwLock<Catalog>) {
        if self.0.is_empty() {
            return;
        }
        let mut catalog = catalog.write().unwrap_or_else(|e| e.into_inner());
        for (id, key) in self.0 {
            catalog.entry(key.signal).or_default().push((id, key.labels));
        }
    }

    /// After a failed transaction: the ids handed out inside it are void.
    pub(crate) fn forget(&self, series_ids: &mut SeriesIds) {
        for (_, key) in &self.0 {
            if let Some(f) = series_ids.get_mut(&key.signal) {
                f.remove(&key.labels);
            }
        }
    }
}

impl Store {
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
        // Checked before the batch begins: an offline store's batch has no savepoint (see Unit).
        if let Some(s) = samples.iter().find(|s| s.value.is_nan()) {
            anyhow::bail!(
                "sample of {} {:?} at {} ms is NaN; the store keeps numbers only: drop the sample or give it a value",
                s.signal,
                s.labels,
                s.ts_ms
            );
        }
        let mut w = self.writer()?;
        let mut created = NewSeries::default();
        let mut undo: Vec<(i64, SeriesMinutes)> = Vec::with_capacity(samples.len());
        let result = insert_batch(&mut w, &mut created, &mut undo, samples, keep_raw, ids).and_then(|()| {
            // The agent's batch is committed either way; a failure here only keeps log rows
            // longer. An offline store's failure rolled the batch back with the rest of its
            // held writes: that is the batch's error.
            match close_stale_minutes(&mut w) {
                Err(e) if w.usable().is_err() => {
                    Err(e.context("the batch was written, then lost with the offline store's held writes"))
                }
                Err(e) => {
                    tracing::warn!(
                        "store {}: stale open minutes not written yet: {e:#}",
                        self.path.display()
                    );
                    Ok(())
                }
                Ok(()) => Ok(()),
            }
        });
        match result {
            Ok(()) => {
                // Decimated samples are stored too (in their minute's aggregate): "now" for
                // relative queries is the newest of all of them, not only of the raw rows, or
                // a sample decimated into a new minute would fall outside `now-…` windows.
                if let Some(ts) = samples.iter().map(|s| s.ts_ms).max() {
                    self.latest_stored_ts.fetch_max(ts, Ordering::Relaxed);
                }
                self.changed();
                created.publish(&self.catalog);
                if w.offline {
                    w.held_writes += 1;
                    if w.held_writes >= crate::HELD_WRITES_MAX {
                        w.commit_held()?;
                    }
                }
                Ok(())
            }
            Err(e) => {
                // The batch rolled back: ids handed out inside it are void, and the open
                // minutes go back to what was committed.
                let Writer { series_ids, minutes, .. } = &mut *w;
                created.forget(series_ids);
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
        let mut w = self.writer()?;
        let written = flush_open_minutes(&mut w)?;
        w.commit_held()?;
        self.changed();
        Ok(written)
    }
}

/// Writes one batch in one transaction. The
/// open minutes are updated in place; `undo` records a series' state before each change.
fn insert_batch(
    w: &mut Writer,
    created: &mut NewSeries,
    undo: &mut Vec<(i64, SeriesMinutes)>,
    samples: &[Sample],
    keep_raw: &[bool],
    ids: &mut [Option<SeriesId>],
) -> Result<()> {
    let Writer { conn, series_ids, minutes, newest_minute, open_view, offline, .. } = w;
    let tx = Unit::begin(conn, *offline)?;
    // Decimated samples folded into open minutes, for minute_log (see the module doc).
    let mut logged: Vec<u8> = Vec::new();
    let mut logged_minute = i64::MIN;
    let mut batch_newest_minute = i64::MIN;
    {
        let mut new_series = tx.prepare_cached(INSERT_SERIES)?;
        let mut insert =
            tx.prepare_cached("INSERT INTO samples (series_id, ts_ms, value) VALUES (?1, ?2, ?3)")?;
        let mut upsert = tx.prepare_cached(UPSERT_MINUTE)?;
        // Samples for a minute that is no longer open (late or replayed data), folded per batch.
        let mut late: HashMap<(i64, i64), MinuteFold> = HashMap::new();
        for (i, s) in samples.iter().enumerate() {
            let id = match ids.get(i).copied().flatten() {
                Some(id) => id,
                None => created.id(&tx, &mut new_series, series_ids, &s.signal, &s.labels)?,
            };
            if let Some(slot) = ids.get_mut(i) {
                *slot = Some(id);
            }
            let raw = keep_raw.get(i).copied().unwrap_or(true);
            if raw {
                insert.execute(params![id, s.ts_ms, s.value])?;
            }
            let bucket = minute_of(s.ts_ms);
            batch_newest_minute = batch_newest_minute.max(bucket);
            let m = minutes.slot(id);
            undo.push((id, *m));
            if raw {
                m.note_raw_row(s.ts_ms);
            }
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
                        // A field, not note_minute_row: `open` still borrows m.open.
                        m.oldest_minute_row = Some(m.oldest_minute_row.map_or(o, |t| t.min(o)));
                    }
                    m.open = Some((bucket, MinuteFold::new(s.value)));
                    log_it(&mut logged);
                }
                _ => {
                    late.entry((id, bucket))
                        .and_modify(|a| a.add(s.value))
                        .or_insert_with(|| MinuteFold::new(s.value));
                    m.newest_row = Some(m.newest_row.map_or(bucket, |r| r.max(bucket)));
                    m.note_minute_row(bucket);
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
    // Readers see the batch's rows and its open minutes together (see OpenView).
    let mut view = open_view.write().unwrap_or_else(|e| e.into_inner());
    tx.commit()?;
    for (id, _) in undo.iter() {
        view.set(*id, minutes.get(*id).and_then(|m| m.open));
    }
    drop(view);
    *newest_minute = (*newest_minute).max(batch_newest_minute);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use omen_sources::Sample;

    use crate::test_util::{minute_rows, minute_rows_from_raw, sample};
    use crate::{Resolution, Store};

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
    fn the_newest_sample_is_now_even_when_it_was_decimated() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        let t0 = 1_793_577_659_000; // one second before a minute starts
        store.insert(&[sample(t0 - 3 * 86_400_000, "old", "0", 1.0)]).unwrap();
        store.insert_with_raw(&[sample(t0, "q", "0", 7.0)], &[true]).unwrap();
        // Decimated (no raw row) and in the next minute: still the newest stored sample.
        store.insert_with_raw(&[sample(t0 + 2_000, "q", "0", 11.0)], &[false]).unwrap();
        assert_eq!(store.latest_ts().unwrap(), Some(t0 + 2_000));
        let m = store
            .range("q", &BTreeMap::new(), t0 - 60_000, t0 + 2_001, 3_600_000, Resolution::Minute)
            .unwrap();
        assert_eq!(m[0].points.len(), 1);
        assert_eq!(m[0].points[0].1, 9.0, "both minutes are in the window");
        // Retention that deletes older rows keeps it.
        assert!(store.apply_retention(t0 + 2_000, 1, 1, 1).unwrap() > 0);
        assert_eq!(store.latest_ts().unwrap(), Some(t0 + 2_000));
    }

    #[test]
    fn a_failed_batch_leaves_the_open_minutes_as_committed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        let t0 = 1_793_577_600_000;
        store.insert(&[sample(t0, "kv", "0", 1.0), sample(t0 + 1000, "kv", "0", 2.0)]).unwrap();
        // The disk fills in the middle of the batch: it rolls back whole, including the
        // write of minute t0 that its first sample triggered, and its new series.
        set_max_pages(&store, None);
        assert!(store.insert(&filling_batch(t0 + 60_000)).is_err());
        assert!(minute_rows(&store).is_empty());
        assert_eq!(store.catalog.read().unwrap().values().flatten().count(), 1, "no series of the batch");
        set_max_pages(&store, Some(1 << 30));
        goes_on_after_a_refused_batch(&store, t0);
    }

    #[test]
    fn a_batch_with_nan_is_refused_before_it_writes_anything() {
        for open in [Store::open, Store::open_offline] {
            let dir = tempfile::tempdir().unwrap();
            let store = open(&dir.path().join("omen.db")).unwrap();
            let t0 = 1_793_577_600_000;
            store.insert(&[sample(t0, "kv", "0", 1.0), sample(t0 + 1000, "kv", "0", 2.0)]).unwrap();
            let bad = [sample(t0 + 60_000, "kv", "0", 5.0), sample(t0 + 60_000, "kv", "9", f64::NAN)];
            let e = store.insert(&bad).unwrap_err().to_string();
            assert!(e.contains("is NaN") && e.contains("\"layer\": \"9\""), "{e}");
            assert!(minute_rows(&store).is_empty());
            goes_on_after_a_refused_batch(&store, t0);
        }
    }

    #[test]
    fn an_offline_store_that_fails_a_write_refuses_further_use_and_keeps_its_last_commit() {
        // A full disk (SQLite may end the transaction itself), and a statement that fails
        // alone (SQLite keeps the transaction: the store must roll it back).
        let full_disk = |store: &Store, ts: i64| {
            set_max_pages(store, None);
            filling_batch(ts)
        };
        let refused_row = |store: &Store, ts: i64| {
            refuse_rows(store, "samples", "ts_ms", ts);
            vec![sample(ts, "kv", "0", 5.0), sample(ts, "kv", "new", 1.0)]
        };
        // The batch writes, then writing a stale open minute after it fails: the batch is lost too.
        let refused_stale_minute = |store: &Store, ts: i64| {
            refuse_rows(store, "minute_agg", "minute_ms", ts - 60_000);
            vec![sample(ts + 60_000, "other", "0", 1.0)]
        };
        for (fail, says) in [
            (&full_disk as &dyn Fn(&Store, i64) -> Vec<Sample>, "full"),
            (&refused_row, "refused"),
            (&refused_stale_minute, "lost with the offline store's held writes"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("omen.db");
            let t0 = 1_793_577_600_000;
            {
                let store = Store::open_offline(&path).unwrap();
                store.insert(&[sample(t0, "kv", "0", 1.0), sample(t0 + 1000, "kv", "0", 2.0)]).unwrap();
                assert_eq!(store.count("kv").unwrap(), 2, "a read commits the held writes");
                store.insert(&[sample(t0 + 2000, "kv", "0", 3.0)]).unwrap();
                let failed = store.insert(&fail(&store, t0 + 60_000)).unwrap_err();
                assert!(format!("{failed:#}").contains(says), "{failed:#}");
                set_max_pages(&store, Some(1 << 30));
                for e in [
                    store.insert(&[sample(t0 + 3000, "kv", "0", 4.0)]).unwrap_err(),
                    store.count("kv").unwrap_err(),
                    store.latest_ts().unwrap_err(),
                    store.flush().unwrap_err(),
                ] {
                    let e = e.to_string();
                    assert!(e.contains("lost its held transaction") && e.contains("omen.db"), "{e}");
                }
            }
            // Reopened (as the agent would), it holds what its last commit point held.
            let store = Store::open(&path).unwrap();
            assert_eq!(store.count("kv").unwrap(), 2, "{says}");
            let series: i64 =
                store.reader().unwrap().query_row("SELECT COUNT(*) FROM series", [], |r| r.get(0)).unwrap();
            assert_eq!(series, 1, "the failed batch's series are gone ({says})");
        }
    }

    /// Makes SQLite refuse (abort) the statement that inserts a row of `table` whose
    /// `column` is `value`, leaving the transaction open.
    fn refuse_rows(store: &Store, table: &str, column: &str, value: i64) {
        let sql = format!(
            "CREATE TEMP TRIGGER refuse AFTER INSERT ON {table} WHEN NEW.{column} = {value} \
             BEGIN SELECT RAISE(ABORT, 'refused for the test'); END"
        );
        store.writer.lock().unwrap().conn.execute_batch(&sql).unwrap();
    }

    /// Caps the writer's database at `pages` (None: the pages it has now), as a full disk would.
    fn set_max_pages(store: &Store, pages: Option<i64>) {
        let w = store.writer.lock().unwrap();
        let pages = pages.unwrap_or_else(|| w.conn.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap());
        w.conn.pragma_update(None, "max_page_count", pages).unwrap();
    }

    /// A batch at `ts` that first closes minute t0 of series kv/0, then needs new pages.
    fn filling_batch(ts: i64) -> Vec<Sample> {
        let mut batch = vec![sample(ts, "kv", "0", 5.0)];
        batch.extend((0..2000).map(|i| sample(ts, "kv", &format!("filler-{i:0>40}"), 1.0)));
        batch
    }

    /// After a refused batch at minute t0 + 1: later batches write as if it never came.
    fn goes_on_after_a_refused_batch(store: &Store, t0: i64) {
        store.insert(&[sample(t0 + 2000, "kv", "0", 3.0), sample(t0 + 2000, "kv", "9", 7.0)]).unwrap();
        store.flush().unwrap();
        assert_eq!(minute_rows(store), minute_rows_from_raw(store));
        assert_eq!(minute_rows(store)[0].2, 3);
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
}
