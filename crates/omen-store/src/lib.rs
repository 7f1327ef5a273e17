//! The omen agent's SQLite store (WAL): raw samples with retention, and minute and day
//! aggregates kept for weeks, so that a restart keeps the history the 14-day forecast needs.
//!
//! A batch is acknowledged only after its transaction commits; with WAL and
//! synchronous=NORMAL a committed transaction survives `kill -9` (it is in the
//! WAL file; only an OS crash or power loss can drop the last ones). Minute aggregates
//! are folded in memory and written once per minute, and the open minute is rebuilt
//! after a crash (see `minutes.rs`), so nothing acknowledged is lost.
//!
//! One `Store` at a time per database file: a second one would hold the same open minutes.
//!
//! Modules: `schema` (tables, connections, meta rows), `minutes` (minute folding, the
//! minute log and crash recovery), `insert` (batches), `blocks` (sealed history in
//! compressed blocks), `query` (readers and queries), `retention` (day roll-up and deletion).

mod blocks;
mod check;
mod insert;
mod minutes;
mod query;
mod retention;
mod schema;
#[cfg(test)]
mod test_util;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use anyhow::{Context, Result};
use rusqlite::Connection;

use minutes::{flush_open_minutes, read_minute_log, recover_minutes, MinuteTable, OpenView};
use query::{Catalog, PooledReader, ReaderPool};

pub use blocks::Compaction;
pub use check::{bad_file, BadStoreFile};
/// One day in milliseconds (re-exported so that users of the store need not name omen-signals).
pub use omen_signals::DAY_MS;
pub use query::{DayAggregate, RangeSeries, Resolution};
pub use retention::{RollUp, RETENTION_BLOCKS_PER_CALL};

/// A write error as a user reads it: a full disk (or a store past its size) names the file
/// and what to do; anything else is the error's chain.
pub fn explain_write_error(e: &anyhow::Error, path: &Path) -> String {
    let full = e.chain().any(|cause| {
        cause.downcast_ref::<rusqlite::Error>().and_then(rusqlite::Error::sqlite_error_code)
            == Some(rusqlite::ErrorCode::DiskFull)
    });
    if full {
        format!(
            "the disk holding {} is full (SQLite: database or disk is full); free space on it or move store.path elsewhere: \
             writes resume by themselves once there is room, and reads keep working meanwhile",
            path.display()
        )
    } else {
        format!("{e:#}")
    }
}

/// Page cache of the writer connection, KiB (see [`Store::open`]).
const WRITER_CACHE_KIB: i64 = 16 * 1024;

/// Identity of a stored series, as [`Store::insert_with_ids`] hands it out.
pub type SeriesId = i64;

/// Series ids by signal, then labels: looked up by reference, without building a key.
type SeriesIds = HashMap<String, HashMap<BTreeMap<String, String>, i64>>;

/// The store: one writer connection and a pool of readers (WAL lets them run concurrently).
pub struct Store {
    path: PathBuf,
    writer: Mutex<Writer>,
    readers: ReaderPool,
    /// Committed series, so that a range query reads only the series its matchers select.
    catalog: RwLock<Catalog>,
    /// Newest committed sample time, raw or folded into a minute (i64::MIN: none).
    latest_stored_ts: AtomicI64,
    /// Bumped after every committed change, so readers can cache what they read.
    generation: AtomicU64,
    /// The committed open minutes, read by range queries without the writer's lock.
    open_view: Arc<RwLock<OpenView>>,
}

/// The writer connection and the state only writes change, behind one lock.
struct Writer {
    conn: Connection,
    series_ids: SeriesIds,
    minutes: MinuteTable,
    /// Newest minute any sample fell in (event time).
    newest_minute: i64,
    /// Open minutes before this one have been written and their log rows deleted.
    log_floor: i64,
    /// The store's [`OpenView`]: every commit that changes `minutes[..].open` publishes it here.
    open_view: Arc<RwLock<OpenView>>,
}

impl Store {
    /// Opens (creating if needed) the store at `path`. A file that is not a usable omen
    /// store fails with a [`BadStoreFile`] in the error's chain (see [`bad_file`]).
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_checked(path).map_err(|e| {
            if bad_file(&e).is_some() {
                return e;
            }
            let damaged = e
                .chain()
                .filter_map(|c| c.downcast_ref::<rusqlite::Error>())
                .find_map(|sqlite| check::classify(sqlite, path));
            match damaged {
                Some(bad) => anyhow::Error::new(bad),
                None => e,
            }
        })
    }

    fn open_checked(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("store.path: cannot create the folder {}; fix its permissions or choose another store.path", dir.display()))?;
        }
        check::check_header(path)?;
        let conn = schema::open_connection(path)?;
        // The writer's page cache holds the index pages a batch touches (one per series of
        // the batch: 2,560 pages, 10 MB, for 8 GPUs x 80 layers); SQLite's default 2 MB
        // made every batch read them back and spill dirty ones mid-transaction.
        conn.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)?;
        check::check_tables(&conn, path)?;
        schema::create_or_check(&conn, path)?;
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
        let latest = blocks::newest_raw_ts(&conn)?;
        let readers = ReaderPool::open(path)?;
        let open_view = Arc::new(RwLock::new(OpenView::of(&minutes)));
        Ok(Self {
            path: path.to_owned(),
            writer: Mutex::new(Writer {
                conn,
                series_ids,
                minutes,
                newest_minute: i64::MIN,
                log_floor: i64::MIN,
                open_view: open_view.clone(),
            }),
            readers,
            catalog: RwLock::new(catalog),
            latest_stored_ts: AtomicI64::new(latest.unwrap_or(i64::MIN)),
            generation: AtomicU64::new(0),
            open_view,
        })
    }

    /// File path of the database.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A reader connection from the pool (waits while all are lent out).
    fn reader(&self) -> PooledReader<'_> {
        self.readers.get()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::sample;

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
}
