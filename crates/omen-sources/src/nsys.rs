//! Arena fragmentation over time from an Nsight Systems SQLite export
//! (`nsys export --type sqlite`): CUDA_GPU_MEMORY_USAGE_EVENTS holds every
//! allocation and free by address. Per device, the live allocations' address
//! span is the arena; the gaps between allocations inside it are its free
//! extents, and KVF = total gap / largest gap.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use omen_signals::{catalogue, fragmentation_from_extents};
use rusqlite::{Connection, OpenFlags, OptionalExtension};

use crate::Sample;

/// A problem reading an nsys export.
#[derive(Debug, thiserror::Error)]
pub enum NsysError {
    /// The file could not be opened or queried.
    #[error("{path}: {message}")]
    Sqlite {
        /// The export's path.
        path: String,
        /// What failed.
        message: String,
    },
    /// The export lacks the table (memory tracing was off).
    #[error("{path} has no CUDA_GPU_MEMORY_USAGE_EVENTS table; profile with `nsys profile --cuda-memory-usage=true` and export with `nsys export --type sqlite`")]
    NoMemoryEvents {
        /// The export's path.
        path: String,
    },
    /// A memory event with values no nsys export holds.
    #[error("{path}: memory event {row} {reason}; the export is damaged or not from nsys")]
    BadEvent {
        /// The export's path.
        path: String,
        /// The event's position in start order (from 1).
        row: usize,
        /// What is impossible about it.
        reason: &'static str,
    },
}

/// Reads the export and returns, per device and per `bucket_ms` of trace time
/// with any event, `kv_fragmentation{gpu, layer="arena"}` and `arena_used_bytes{gpu}`.
pub fn arena_samples(path: &Path, bucket_ms: i64) -> Result<Vec<Sample>, NsysError> {
    let p = path.display().to_string();
    let sql_err = |e: rusqlite::Error| NsysError::Sqlite { path: p.clone(), message: e.to_string() };
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(sql_err)?;
    let has_table: Option<String> = conn
        .query_row(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'CUDA_GPU_MEMORY_USAGE_EVENTS'",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql_err)?;
    if has_table.is_none() {
        return Err(NsysError::NoMemoryEvents { path: p });
    }
    // Session start in Unix ns, when the export has it; event times are relative to it.
    let base_ns: i64 = conn
        .query_row("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1", [], |r| r.get(0))
        .optional()
        .unwrap_or(None)
        .unwrap_or(0);
    let mut stmt = conn
        .prepare("SELECT start, deviceId, address, bytes, memoryOperationType FROM CUDA_GPU_MEMORY_USAGE_EVENTS ORDER BY start")
        .map_err(sql_err)?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
            ))
        })
        .map_err(sql_err)?;
    let bucket_ms = bucket_ms.max(1);
    // device -> (address -> size) of live allocations
    let mut live: HashMap<i64, BTreeMap<u64, u64>> = HashMap::new();
    let mut dirty: Vec<i64> = Vec::new();
    let mut out = Vec::new();
    let mut bucket: Option<i64> = None;
    let flush = |bucket_ts: i64,
                 devices: &mut Vec<i64>,
                 live: &HashMap<i64, BTreeMap<u64, u64>>,
                 out: &mut Vec<Sample>| {
        devices.sort_unstable();
        devices.dedup();
        for &d in devices.iter() {
            let allocs = &live[&d];
            let used: u64 = allocs.values().fold(0u64, |a, &b| a.saturating_add(b));
            let mut gaps = Vec::new();
            let mut end: Option<u64> = None;
            for (&addr, &size) in allocs {
                if let Some(e) = end {
                    if addr > e {
                        gaps.push(addr - e);
                    }
                }
                // Checked at insert: addr + size does not overflow.
                end = Some(end.map_or(addr + size, |e| e.max(addr + size)));
            }
            let f = fragmentation_from_extents(gaps);
            let gpu = d.to_string();
            out.push(Sample {
                ts_ms: bucket_ts,
                signal: catalogue::KV_FRAGMENTATION.name.into(),
                labels: [("gpu".to_owned(), gpu.clone()), ("layer".to_owned(), "arena".to_owned())].into(),
                value: f.kv_fragmentation,
            });
            out.push(Sample {
                ts_ms: bucket_ts,
                signal: catalogue::ARENA_USED_BYTES.name.into(),
                labels: [("gpu".to_owned(), gpu)].into(),
                value: used as f64,
            });
        }
        devices.clear();
    };
    for (i, row) in rows.enumerate() {
        let (start_ns, device, address, bytes, op) = row.map_err(sql_err)?;
        let bad = |reason| NsysError::BadEvent { path: p.clone(), row: i + 1, reason };
        let ts_ms =
            base_ns.checked_add(start_ns).ok_or_else(|| bad("starts outside any representable time"))?
                / 1_000_000;
        if address < 0 || bytes < 0 || (address as u64).checked_add(bytes as u64).is_none() {
            return Err(bad("has a negative address or size, or one past the end of the address space"));
        }
        let b = ts_ms.div_euclid(bucket_ms).saturating_mul(bucket_ms);
        if bucket.is_some_and(|cur| cur != b) {
            flush(bucket.unwrap_or(b).saturating_add(bucket_ms), &mut dirty, &live, &mut out);
        }
        bucket = Some(b);
        let allocs = live.entry(device).or_default();
        match op {
            0 if bytes > 0 => {
                allocs.insert(address as u64, bytes as u64);
            }
            1 => {
                allocs.remove(&(address as u64));
            }
            _ => continue, // other operation kinds carry no residency change
        }
        dirty.push(device);
    }
    if let Some(b) = bucket {
        flush(b.saturating_add(bucket_ms), &mut dirty, &live, &mut out);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export(events: &[(i64, i64, i64, i64, i64)]) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        let c = Connection::open(f.path()).unwrap();
        c.execute_batch(
            "CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (start INTEGER NOT NULL, globalPid INTEGER NOT NULL, deviceId INTEGER NOT NULL,
               contextId INTEGER NOT NULL, address INTEGER NOT NULL, pc INTEGER NOT NULL, bytes INTEGER NOT NULL,
               memKind INTEGER NOT NULL, memoryOperationType INTEGER NOT NULL);
             CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT);
             INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1793613600000000000, '', '');",
        )
        .unwrap();
        for &(start, dev, addr, bytes, op) in events {
            c.execute(
                "INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (?1, 1, ?2, 1, ?3, 0, ?4, 2, ?5)",
                [start, dev, addr, bytes, op],
            )
            .unwrap();
        }
        f
    }

    #[test]
    fn impossible_events_are_named_not_wrapped() {
        // A negative address (read as u64 it would wrap the arena's end), then a start past i64 time.
        let f = export(&[(0, 0, -4096, 100, 0)]);
        let e = arena_samples(f.path(), 1000).unwrap_err().to_string();
        assert!(e.contains("memory event 1") && e.contains("negative address"), "{e}");
        let f = export(&[(i64::MAX, 0, 4096, 100, 0)]);
        let e = arena_samples(f.path(), 1000).unwrap_err().to_string();
        assert!(e.contains("representable time"), "{e}");
    }

    #[test]
    fn frees_in_the_middle_fragment_the_arena() {
        let ms = 1_000_000;
        // four 100-byte blocks back to back, then the 2nd and 4th... the 2nd freed: one gap of 100
        let f = export(&[
            (0, 0, 1000, 100, 0),
            (1, 0, 1100, 100, 0),
            (2, 0, 1200, 100, 0),
            (3, 0, 1300, 100, 0),
            (2000 * ms, 0, 1100, 100, 1),
            (4000 * ms, 0, 1500, 50, 0), // a new block past a 100-byte gap at 1400..1500
        ]);
        let s = arena_samples(f.path(), 1000).unwrap();
        let kvf: Vec<f64> = s.iter().filter(|x| x.signal == "kv_fragmentation").map(|x| x.value).collect();
        assert_eq!(kvf, vec![1.0, 1.0, 2.0]);
        let used: Vec<f64> = s.iter().filter(|x| x.signal == "arena_used_bytes").map(|x| x.value).collect();
        assert_eq!(used, vec![400.0, 300.0, 350.0]);
        assert_eq!(s[0].ts_ms, 1_793_613_601_000);
        assert_eq!(s[0].labels["layer"], "arena");
    }

    #[test]
    fn missing_table_says_how_to_profile() {
        let f = tempfile::NamedTempFile::new().unwrap();
        Connection::open(f.path())
            .unwrap()
            .execute_batch("CREATE TABLE StringIds (id INTEGER, value TEXT);")
            .unwrap();
        let e = arena_samples(f.path(), 1000).unwrap_err();
        assert!(e.to_string().contains("--cuda-memory-usage=true"), "{e}");
    }
}
