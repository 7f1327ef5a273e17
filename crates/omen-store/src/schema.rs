//! The tables, the settings every connection shares, and the small key-value rows
//! (meta, canary references) that live beside the time series.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use rusqlite::{params, Connection, OptionalExtension};

use crate::Store;

/// Version of [`SCHEMA`], kept in `meta`: a file of a newer version is refused rather than
/// misread; an older one is migrated ([`create_or_check`]). 2 added the block tables; 3
/// renamed signals (omen_signals::catalogue::RENAMED), also where a derived series names
/// them in its `signal` label.
const SCHEMA_VERSION: i64 = 3;

/// Every table, created if missing; `IF NOT EXISTS` makes opening an existing store a no-op.
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
CREATE TABLE IF NOT EXISTS sample_blocks (
    series_id INTEGER NOT NULL, start_ms INTEGER NOT NULL, count INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (series_id, start_ms)
);
CREATE INDEX IF NOT EXISTS sample_blocks_by_start ON sample_blocks (start_ms);
CREATE TABLE IF NOT EXISTS minute_blocks (
    series_id INTEGER NOT NULL, start_ms INTEGER NOT NULL, count INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (series_id, start_ms)
);
CREATE INDEX IF NOT EXISTS minute_blocks_by_start ON minute_blocks (start_ms);
CREATE TABLE IF NOT EXISTS canary_reference (canary TEXT PRIMARY KEY, reference TEXT NOT NULL, captured_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS minute_log (minute_ms INTEGER NOT NULL, entries BLOB NOT NULL);
";

/// Opens one connection in WAL mode: readers never block the writer, and with
/// synchronous=NORMAL a committed transaction survives a process crash.
pub(crate) fn open_connection(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path).with_context(|| format!("cannot open the store {}", path.display()))?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(conn)
}

/// Creates the tables of a new store; refuses a store written with another schema version.
pub(crate) fn create_or_check(conn: &Connection, path: &Path) -> Result<()> {
    conn.execute_batch(SCHEMA).context("cannot create the store's tables")?;
    let version: Option<String> =
        conn.query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0)).optional()?;
    match version {
        None => {
            conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?1)", [SCHEMA_VERSION.to_string()])?;
        }
        Some(v) if v == SCHEMA_VERSION.to_string() => {}
        // Version 1 lacked only the block tables, which SCHEMA has just created: its rows
        // are read as they are and compacted into blocks as the agent runs. Versions 1 and
        // 2 name signals that have been renamed since.
        Some(v) if v == "1" || v == "2" => {
            let tx = conn.unchecked_transaction()?;
            rename_signals(&tx).with_context(|| format!("cannot migrate the store {}", path.display()))?;
            tx.execute("UPDATE meta SET value = ?1 WHERE key = 'schema_version'", [SCHEMA_VERSION.to_string()])?;
            tx.commit()?;
        }
        Some(v) => anyhow::bail!(
            "store {} has schema version {v}; this omen uses {SCHEMA_VERSION}; point store.path at a new file or upgrade omen",
            path.display()
        ),
    }
    Ok(())
}

/// Renames the series of every renamed signal, and the `signal` label of the series derived
/// from them (anomaly scores, level shifts); label JSON keeps its key order.
fn rename_signals(conn: &Connection) -> rusqlite::Result<()> {
    for (old, new) in omen_signals::catalogue::RENAMED {
        conn.execute("UPDATE series SET signal = ?2 WHERE signal = ?1", params![old, new])?;
        let (from, to) =
            (format!("\"signal\":{}", labels_value(old)), format!("\"signal\":{}", labels_value(new)));
        conn.execute(
            "UPDATE series SET labels = replace(labels, ?1, ?2) WHERE instr(labels, ?1) > 0",
            params![from, to],
        )?;
    }
    Ok(())
}

/// A label value as it appears in [`labels_json`].
fn labels_value(v: &str) -> String {
    serde_json::to_string(v).expect("a string serialises")
}

/// The `series.labels` column: JSON of the sorted label map, so equal label sets give equal text.
pub(crate) fn labels_json(labels: &BTreeMap<String, String>) -> String {
    serde_json::to_string(labels).expect("string map serialises")
}

impl Store {
    /// Reads a value from the meta table.
    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        let conn = self.reader()?;
        Ok(conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).optional()?)
    }

    /// Writes a value to the meta table.
    pub fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        let w = self.writer()?;
        w.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)", params![key, value])?;
        Ok(())
    }

    /// The stored reference answer of a canary.
    pub fn canary_reference(&self, canary: &str) -> Result<Option<String>> {
        let conn = self.reader()?;
        Ok(conn
            .query_row("SELECT reference FROM canary_reference WHERE canary = ?1", [canary], |r| r.get(0))
            .optional()?)
    }

    /// Stores a canary's reference answer (first capture wins).
    pub fn set_canary_reference(&self, canary: &str, reference: &str, now_ms: i64) -> Result<()> {
        let w = self.writer()?;
        w.conn.execute(
            "INSERT OR IGNORE INTO canary_reference (canary, reference, captured_ms) VALUES (?1, ?2, ?3)",
            params![canary, reference, now_ms],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
