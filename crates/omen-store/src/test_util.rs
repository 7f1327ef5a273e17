//! Helpers shared by the modules' tests.

use omen_sources::Sample;

use crate::minutes::minute_of;
use crate::Store;

/// A sample of `signal` with one label, `layer`.
pub(crate) fn sample(ts_ms: i64, signal: &str, layer: &str, value: f64) -> Sample {
    Sample { ts_ms, signal: signal.into(), labels: [("layer".to_owned(), layer.to_owned())].into(), value }
}

/// Every minute_agg row, (series id, minute, count, sum, min, max, last).
pub(crate) type MinuteRow = (i64, i64, i64, f64, f64, f64, f64);

/// The stored minute rows, by series and minute.
pub(crate) fn minute_rows(store: &Store) -> Vec<MinuteRow> {
    let conn = store.reader().unwrap();
    let mut stmt = conn
        .prepare("SELECT series_id, minute_ms, count, sum, min, max, last FROM minute_agg ORDER BY series_id, minute_ms")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

/// The minute aggregates recomputed from the raw samples, in the same form.
pub(crate) fn minute_rows_from_raw(store: &Store) -> Vec<MinuteRow> {
    let conn = store.reader().unwrap();
    let mut stmt =
        conn.prepare("SELECT series_id, ts_ms, value FROM samples ORDER BY series_id, ts_ms, rowid").unwrap();
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

/// Rows in `minute_log`: how much a crash would have to replay.
pub(crate) fn log_rows(store: &Store) -> i64 {
    store.reader().unwrap().query_row("SELECT COUNT(*) FROM minute_log", [], |r| r.get(0)).unwrap()
}
