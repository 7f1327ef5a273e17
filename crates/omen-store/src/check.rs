//! What is wrong with a store file that cannot be opened as an omen store, found before
//! anything is written to it: not SQLite at all, cut short, damaged, or another
//! program's database. [`Store::open_or_move_aside`] can move such a file aside.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use rusqlite::Connection;

use crate::Store;

/// A store file that cannot be used as it is; the message names the file and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum BadStoreFile {
    /// Not an SQLite database.
    #[error("{path} is not an SQLite database ({detail})")]
    NotADatabase {
        /// The file.
        path: PathBuf,
        /// What gave it away.
        detail: String,
    },
    /// Shorter than its own header says.
    #[error("{path} is cut short: its header counts {expected} bytes of pages, the file has {actual}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Bytes the header's page count needs.
        expected: u64,
        /// Bytes in the file.
        actual: u64,
    },
    /// SQLite reports damage.
    #[error("{path} is damaged ({detail})")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// SQLite's complaint.
        detail: String,
    },
    /// An SQLite database without omen's tables.
    #[error("{path} is an SQLite database of something else (tables: {tables}), not an omen store")]
    Foreign {
        /// The file.
        path: PathBuf,
        /// Its tables.
        tables: String,
    },
}

/// The 100-byte header's checks: magic string and, where the header's page count is valid,
/// a file at least that long. A missing or empty file is fine (a new store).
pub(crate) fn check_header(path: &Path) -> Result<(), BadStoreFile> {
    // Only the header is read: a store may be gigabytes.
    let mut bytes = Vec::with_capacity(100);
    let read = std::fs::File::open(path).and_then(|f| f.take(100).read_to_end(&mut bytes));
    if read.is_err() {
        return Ok(());
    }
    if bytes.is_empty() {
        return Ok(());
    }
    let not_db =
        |detail: &str| BadStoreFile::NotADatabase { path: path.to_owned(), detail: detail.to_owned() };
    if bytes.len() < 100 || !bytes.starts_with(b"SQLite format 3\0") {
        return Err(not_db("its first bytes are not the SQLite header"));
    }
    let u32_at = |i: usize| u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    let page_size = match u16::from_be_bytes([bytes[16], bytes[17]]) {
        1 => 65_536u64,
        n => n as u64,
    };
    // The header's page count is valid only when written by the same change as the counter.
    if u32_at(24) == u32_at(92) {
        let expected = page_size * u32_at(28) as u64;
        let actual = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        if actual < expected {
            return Err(BadStoreFile::Truncated { path: path.to_owned(), expected, actual });
        }
    }
    Ok(())
}

/// Omen's tables or none: any other table set is another program's database. An SQLite
/// error reading the catalogue is passed on for [`Store::open`] to judge.
pub(crate) fn check_tables(conn: &Connection, path: &Path) -> anyhow::Result<()> {
    let tables: Vec<String> = conn
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    if tables.is_empty() || tables.iter().any(|t| t == "meta") {
        return Ok(());
    }
    Err(BadStoreFile::Foreign { path: path.to_owned(), tables: tables.join(", ") }.into())
}

/// An SQLite error that says the file is damaged or not a database, as the [`BadStoreFile`]
/// it points to; None for any other error (a lock, a full disk, permissions).
pub(crate) fn classify(e: &rusqlite::Error, path: &Path) -> Option<BadStoreFile> {
    let (path, detail) = (path.to_owned(), e.to_string());
    match e.sqlite_error_code()? {
        rusqlite::ErrorCode::NotADatabase => Some(BadStoreFile::NotADatabase { path, detail }),
        rusqlite::ErrorCode::DatabaseCorrupt => Some(BadStoreFile::Corrupt { path, detail }),
        _ => None,
    }
}

/// Whether an error of [`Store::open`] says the file itself is bad (rather than, e.g., a
/// folder without permission or a newer schema).
pub fn bad_file(e: &anyhow::Error) -> Option<&BadStoreFile> {
    e.chain().find_map(|c| c.downcast_ref::<BadStoreFile>())
}

impl Store {
    /// Opens the store at `path`; when the file is bad (see [`BadStoreFile`]) and
    /// `move_aside` is set, renames it (and its -wal and -shm files) to
    /// `<path>.bad-<unix seconds>` and opens a new store. Returns the store and where a bad
    /// file went.
    pub fn open_or_move_aside(path: &Path, move_aside: bool) -> anyhow::Result<(Self, Option<PathBuf>)> {
        match Self::open(path) {
            Ok(store) => Ok((store, None)),
            Err(e) if move_aside && bad_file(&e).is_some() => {
                let stamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let aside = PathBuf::from(format!("{}.bad-{stamp}", path.display()));
                std::fs::rename(path, &aside).map_err(|io| {
                    anyhow::anyhow!("{e:#}; moving it aside to {} failed: {io}", aside.display())
                })?;
                for suffix in ["-wal", "-shm"] {
                    let side = PathBuf::from(format!("{}{suffix}", path.display()));
                    if side.exists() {
                        let _ = std::fs::rename(&side, format!("{}{suffix}", aside.display()));
                    }
                }
                let store = Self::open(path)?;
                Ok((store, Some(aside)))
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::sample;

    /// A store with a few samples, closed so that its WAL is folded into the file.
    fn written_store(path: &Path) {
        let store = Store::open(path).unwrap();
        let t0 = 1_793_577_600_000;
        let batch: Vec<_> =
            (0..2000).map(|i| sample(t0 + i * 1000, "kv", &(i % 50).to_string(), i as f64)).collect();
        store.insert(&batch).unwrap();
    }

    fn open_err(path: &Path) -> String {
        let e = Store::open(path).err().expect("a bad file is refused");
        assert!(bad_file(&e).is_some(), "{e:#}");
        format!("{e:#}")
    }

    #[test]
    fn a_file_that_is_not_sqlite_is_named_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("omen.db");
        std::fs::write(&path, "this is a text file, not a database\n".repeat(10)).unwrap();
        let e = open_err(&path);
        assert!(e.contains(&path.display().to_string()) && e.contains("not an SQLite database"), "{e}");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "this is a text file, not a database\n".repeat(10)
        );
    }

    #[test]
    fn a_truncated_store_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("omen.db");
        written_store(&path);
        let len = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len / 2).unwrap();
        let e = open_err(&path);
        assert!(e.contains("cut short"), "{e}");
    }

    #[test]
    fn a_damaged_store_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("omen.db");
        written_store(&path);
        let mut bytes = std::fs::read(&path).unwrap();
        let page = u16::from_be_bytes([bytes[16], bytes[17]]) as usize;
        for b in &mut bytes[page..] {
            *b = 0xA5;
        }
        std::fs::write(&path, bytes).unwrap();
        let e = open_err(&path);
        assert!(e.contains("damaged") || e.contains("not an SQLite database"), "{e}");
    }

    #[test]
    fn another_programs_database_is_not_touched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO users VALUES (1, 'a');",
            )
            .unwrap();
        }
        let e = open_err(&path);
        assert!(e.contains("something else (tables: users)"), "{e}");
        let conn = Connection::open(&path).unwrap();
        let tables: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(tables, 1, "no omen table was added to it");
    }

    #[test]
    fn a_bad_file_moves_aside_and_a_new_store_starts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("omen.db");
        std::fs::write(&path, vec![7u8; 4096]).unwrap();
        assert!(Store::open_or_move_aside(&path, false).is_err(), "refused without move_aside");
        let (store, aside) = Store::open_or_move_aside(&path, true).unwrap();
        let aside = aside.expect("moved aside");
        assert!(aside.display().to_string().starts_with(&format!("{}.bad-", path.display())));
        assert_eq!(std::fs::read(&aside).unwrap(), vec![7u8; 4096], "the bad file is kept as it was");
        store.insert(&[sample(1_793_577_600_000, "kv", "0", 1.0)]).unwrap();
        assert_eq!(store.count("kv").unwrap(), 1);
        // A good store is never moved.
        drop(store);
        let (_, aside) = Store::open_or_move_aside(&path, true).unwrap();
        assert_eq!(aside, None);
    }

    #[test]
    fn a_newer_schema_is_not_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("omen.db");
        written_store(&path);
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'", []).unwrap();
        }
        let e = Store::open_or_move_aside(&path, true).err().expect("refused");
        assert!(bad_file(&e).is_none());
        assert!(format!("{e:#}").contains("schema version 99"), "{e:#}");
        assert!(path.exists(), "not moved");
    }
}
