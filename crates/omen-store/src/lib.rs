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
//! An offline store ([`Store::open_offline`], for replays whose output can be rebuilt)
//! holds its writes in one open transaction and commits before every read, on flush and
//! every [`HELD_WRITES_MAX`] batches: a replay commits about once an hour of trace time
//! instead of three times a minute, and reads see every write made before them. Its
//! batches write without a savepoint (`Unit`), so a write that fails part-way loses the
//! writes held since the last commit point, and the store then refuses further use.
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

/// An offline store commits at least once per this many batches, so that its WAL stays small.
pub const HELD_WRITES_MAX: usize = 4096;

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
    /// Opened with [`Store::open_offline`]: reads commit the held writes first.
    offline: bool,
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
    /// Offline store: a transaction is held open between commit points.
    offline: bool,
    /// Batches written since the held transaction began.
    held_writes: usize,
}

impl Writer {
    /// Commits an offline store's held transaction and begins the next (no-op otherwise).
    fn commit_held(&mut self) -> Result<()> {
        if !self.offline {
            return Ok(());
        }
        self.usable()?;
        // A failed COMMIT either leaves the transaction open (the writes stay held) or
        // rolls it back, which `usable` reports from then on.
        self.conn.execute_batch("COMMIT").context("cannot commit the offline store's held writes")?;
        self.held_writes = 0;
        self.conn.execute_batch("BEGIN").context("cannot begin the offline store's transaction")
    }

    /// Whether the store can still be written and read: an offline store whose held
    /// transaction is gone (a failed write rolled it back) has lost writes it acknowledged.
    fn usable(&self) -> Result<()> {
        if self.offline && self.conn.is_autocommit() {
            anyhow::bail!(
                "the offline store {} lost its held transaction: an earlier write failed and rolled \
                 its held writes back (see that error); it cannot be read or written any more: \
                 rebuild it by running the replay again",
                self.conn.path().unwrap_or("(in memory)")
            );
        }
        Ok(())
    }
}

/// One unit of writing. In the agent's store it is a savepoint, so that a failed unit
/// rolls back alone. In an offline store it writes straight into the held transaction:
/// a savepoint there copies every page the unit first touches into a journal (a fifth of
/// a replay's time), and a failed unit rolls the whole held transaction back instead, after
/// which the store refuses further use ([`Writer::usable`]). Writers check their input
/// before they write, so that bad input fails before a unit begins.
pub(crate) struct Unit<'c> {
    alone: Option<rusqlite::Savepoint<'c>>,
    held: Option<&'c Connection>,
}

impl<'c> Unit<'c> {
    /// Begins a unit on `conn`, the writer's connection.
    pub(crate) fn begin(conn: &'c mut Connection, offline: bool) -> Result<Self> {
        Ok(if offline {
            Self { alone: None, held: Some(conn) }
        } else {
            Self { alone: Some(conn.savepoint()?), held: None }
        })
    }

    /// Ends the unit: its writes are committed (online) or stay held (offline).
    pub(crate) fn commit(mut self) -> Result<()> {
        self.held = None;
        match self.alone.take() {
            Some(savepoint) => Ok(savepoint.commit()?),
            None => Ok(()),
        }
    }
}

impl std::ops::Deref for Unit<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        match (&self.alone, self.held) {
            (Some(savepoint), _) => savepoint,
            (None, Some(conn)) => conn,
            (None, None) => unreachable!("a unit is used only before its commit"),
        }
    }
}

impl Drop for Unit<'_> {
    /// A unit dropped before its commit failed: online its savepoint rolls back by itself;
    /// offline the held transaction goes with it, since part of the unit may be in it.
    fn drop(&mut self) {
        if let Some(conn) = self.held.take() {
            if !conn.is_autocommit() {
                if let Err(e) = conn.execute_batch("ROLLBACK") {
                    tracing::warn!("offline store: cannot roll back after a failed write: {e:#}");
                }
            }
        }
    }
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
                offline: false,
                held_writes: 0,
            }),
            readers,
            catalog: RwLock::new(catalog),
            offline: false,
            latest_stored_ts: AtomicI64::new(latest.unwrap_or(i64::MIN)),
            generation: AtomicU64::new(0),
            open_view,
        })
    }

    /// Opens the store at `path` for offline work (replay, evaluation): writes are held in
    /// one transaction and committed before each read, on [`Store::flush`], every
    /// [`HELD_WRITES_MAX`] batches and on drop. Reads see every write made before them, but a
    /// crash, or a write that fails part-way (a full disk), loses the writes since the last
    /// commit point, so use it only where the output can be rebuilt; the agent's own store
    /// is opened with [`Store::open`].
    pub fn open_offline(path: &Path) -> Result<Self> {
        let mut store = Self::open(path)?;
        store.offline = true;
        let w = store.writer.get_mut().unwrap_or_else(|e| e.into_inner());
        w.offline = true;
        // Sorts and temporary indexes in memory, not in temp files.
        w.conn.pragma_update(None, "temp_store", "MEMORY")?;
        w.conn.execute_batch("BEGIN").context("cannot begin the offline store's transaction")?;
        Ok(store)
    }

    /// File path of the database.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A reader connection from the pool (waits while all are lent out). An offline store
    /// commits its held writes first, so that the read sees them.
    fn reader(&self) -> Result<PooledReader<'_>> {
        if self.offline {
            self.writer()?.commit_held()?;
        }
        Ok(self.readers.get())
    }

    /// The writer, locked; an error when the store can no longer be written ([`Writer::usable`]).
    fn writer(&self) -> Result<std::sync::MutexGuard<'_, Writer>> {
        let w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        w.usable()?;
        Ok(w)
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
        if let Err(e) = w.usable() {
            // Its writes are gone; nothing written now would be whole.
            tracing::warn!("store {}: closed without writing: {e:#}", self.path.display());
            return;
        }
        if let Err(e) = flush_open_minutes(w) {
            let lost = if w.usable().is_err() {
                ", and the offline store's held writes were lost with them"
            } else {
                ""
            };
            tracing::warn!(
                "store {}: open minute aggregates not written at close{lost}: {e:#}",
                self.path.display()
            );
        }
        // An offline store's held writes would roll back when the connection closes.
        if w.offline && !w.conn.is_autocommit() {
            if let Err(e) = w.conn.execute_batch("COMMIT") {
                tracing::warn!("store {}: held writes not committed at close: {e:#}", self.path.display());
            }
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
        store.insert(&[sample(t0, "kv_fragmentation", "0", 1.0)]).unwrap();
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

    /// Rows of `table` as another process sees them (committed only).
    fn committed_rows(path: &Path, table: &str) -> i64 {
        let conn = Connection::open(path).unwrap();
        conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn an_offline_store_commits_at_reads_and_close_and_reads_like_a_plain_one() {
        let dir = tempfile::tempdir().unwrap();
        let (offline_path, plain_path) = (dir.path().join("offline.db"), dir.path().join("plain.db"));
        let t0 = 1_793_577_600_000;
        let batches: Vec<Vec<_>> = (0..180)
            .map(|i| {
                vec![sample(t0 + i * 20_000, "kv", "0", i as f64), sample(t0 + i * 20_000, "kv", "1", 0.5)]
            })
            .collect();
        let plain = Store::open(&plain_path).unwrap();
        let offline = Store::open_offline(&offline_path).unwrap();
        for b in &batches {
            plain.insert(b).unwrap();
            offline.insert(b).unwrap();
        }
        // Held: nothing committed yet, while the plain store committed every batch.
        assert_eq!(committed_rows(&offline_path, "samples"), 0);
        assert_eq!(committed_rows(&plain_path, "samples"), 360);
        // A read commits first and sees every write.
        assert_eq!(offline.count("kv").unwrap(), 360);
        assert_eq!(committed_rows(&offline_path, "samples"), 360);
        let range = |s: &Store| {
            s.range("kv", &BTreeMap::new(), t0, t0 + 3_600_000, 60_000, Resolution::Minute).unwrap()
        };
        assert_eq!(range(&offline), range(&plain));
        // Writes after the last read are committed on close.
        offline.insert(&[sample(t0 + 3_600_000, "kv", "0", 9.0)]).unwrap();
        drop(offline);
        assert_eq!(committed_rows(&offline_path, "samples"), 361);
        let reopened = Store::open(&offline_path).unwrap();
        plain.insert(&[sample(t0 + 3_600_000, "kv", "0", 9.0)]).unwrap();
        plain.flush().unwrap();
        assert_eq!(range(&reopened), range(&plain));
        assert_eq!(reopened.count("kv").unwrap(), 361);
    }

    #[test]
    fn an_offline_store_compacts_at_its_own_level_and_reads_like_a_plain_one() {
        let dir = tempfile::tempdir().unwrap();
        let plain = Store::open(&dir.path().join("plain.db")).unwrap();
        let offline = Store::open_offline(&dir.path().join("offline.db")).unwrap();
        let t0 = 1_793_577_600_000;
        for i in 0..(8 * 360) {
            let b = [
                sample(t0 + i * 10_000, "kv", "0", (i as f64 * 0.37).sin()),
                sample(t0 + i * 10_000, "kv", "1", 0.5),
            ];
            plain.insert(&b).unwrap();
            offline.insert(&b).unwrap();
        }
        let sealed_all = t0 + 8 * 3_600_000;
        let (a, b) = (offline.compact_all(sealed_all).unwrap(), plain.compact_all(sealed_all).unwrap());
        assert!(a.blocks > 0 && (a.blocks, a.rows) == (b.blocks, b.rows), "{a:?} {b:?}");
        for resolution in [Resolution::Raw, Resolution::Minute] {
            let range =
                |s: &Store| s.range("kv", &BTreeMap::new(), t0, sealed_all, 60_000, resolution).unwrap();
            assert_eq!(range(&offline), range(&plain));
        }
        // Each store's blocks are what its own level encodes, and the two levels differ here.
        let first_block = |s: &Store| -> Vec<u8> {
            let conn = s.reader().unwrap();
            let sql = "SELECT data FROM sample_blocks ORDER BY series_id, start_ms LIMIT 1";
            conn.query_row(sql, [], |r| r.get(0)).unwrap()
        };
        let (offline_bytes, plain_bytes) = (first_block(&offline), first_block(&plain));
        let block = blocks::RawBlock::decode(&plain_bytes).unwrap();
        assert_eq!(block.encode(blocks::COMPRESSION_LEVEL).unwrap(), plain_bytes);
        assert_eq!(block.encode(blocks::OFFLINE_COMPRESSION_LEVEL).unwrap(), offline_bytes);
        assert_ne!(offline_bytes, plain_bytes);
    }

    #[test]
    fn an_offline_store_commits_after_its_batch_bound_without_a_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("offline.db");
        let store = Store::open_offline(&path).unwrap();
        let t0 = 1_793_577_600_000;
        for i in 0..HELD_WRITES_MAX as i64 {
            store.insert(&[sample(t0 + i * 1000, "kv", "0", 1.0)]).unwrap();
        }
        assert_eq!(committed_rows(&path, "samples"), HELD_WRITES_MAX as i64);
        store.insert(&[sample(t0 - 1000, "kv", "0", 1.0)]).unwrap();
        assert_eq!(committed_rows(&path, "samples"), HELD_WRITES_MAX as i64);
    }
}
