//! Sealed history in compressed blocks. Raw samples and minute aggregates are written as
//! rows (cheap to append, durable per batch) and, once their span lies [`SEAL_LAG_MS`] in
//! the past, moved into one block per series and span: columns compressed with pco
//! (lossless; regular time stamps and slowly moving values cost a few bits each). As rows,
//! 8 GPUs x 80 layers for 30 days would take about 12 GB (some 45 bytes per value with
//! the indexes); as blocks, see docs/reliability.md for the measured size.
//!
//! Reads merge both. A block and the rows of its span are disjoint sets of samples (rows
//! there are late samples that came after the block was written), so sums and counts
//! add; the next compaction folds such rows into the block. Compaction is bounded per call
//! ([`Store::compact`]) so that a batch waiting behind it waits briefly.

use anyhow::{Context, Result};
use omen_signals::MINUTE_MS;
use rusqlite::{params, OptionalExtension};

use crate::minutes::MinuteFold;
use crate::{Store, Unit};

/// Span of a raw block: one hour (360 samples at the default 10 s raw interval).
pub(crate) const RAW_BLOCK_MS: i64 = 3_600_000;
/// Span of a minute block: six hours (360 minutes).
pub(crate) const MINUTE_BLOCK_MS: i64 = 6 * 3_600_000;
/// Rows younger than this (event time) stay rows: late samples of the last minutes land
/// in rows, and a series' open minute is never sealed (crash recovery rebuilds it from rows).
pub(crate) const SEAL_LAG_MS: i64 = 10 * MINUTE_MS;

/// Version byte at the start of a raw block; a block of another version is refused, not misread.
const RAW_BLOCK_FORMAT: u8 = 1;
/// Version byte of the minute blocks this omen writes: format 2 puts the block's hour sums
/// before its columns, so that a query at a step of an hour or more reads them without
/// decoding a column. Format 1 blocks (no hour sums) are still read.
const MINUTE_BLOCK_FORMAT: u8 = 2;
/// The minute block formats this omen reads.
const MINUTE_BLOCK_FORMATS: &[u8] = &[1, MINUTE_BLOCK_FORMAT];

pub(crate) use omen_signals::HOUR_MS;

/// A start (or bucket index) with the sum and count of the values that fall in it.
pub(crate) type SumCount = (i64, f64, i64);
/// The sum and count of a block's minutes by the hour they start in: (hour start, sum, count).
pub(crate) type HourSum = SumCount;
/// Bytes of one hour sum in a format-2 minute block: hour start, count (i64 LE), sum (f64 LE).
const HOUR_SUM_BYTES: usize = 24;

/// Start of the span of `span_ms` that `ts_ms` falls in (floor, also before 1970).
pub(crate) fn span_start(ts_ms: i64, span_ms: i64) -> i64 {
    ts_ms.div_euclid(span_ms) * span_ms
}

/// One raw block: time stamps in order, with their values.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RawBlock {
    pub(crate) ts: Vec<i64>,
    pub(crate) values: Vec<f64>,
}

/// One minute block: minutes in order, with their folds. A sealed minute keeps count,
/// sum, min and max; not the value of its last sample, which nothing reads and which
/// would cost a quarter of the minute tier (its `last` reads as NaN once decoded).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct MinuteBlock {
    pub(crate) minutes: Vec<i64>,
    pub(crate) folds: Vec<MinuteFold>,
}

/// Mantissa bits a sealed value keeps: f32's 23, so a relative error of at most 2^-24
/// (6e-8, seven significant digits) with f64's range. Full f64 noise costs pco about 6
/// bytes a value, 23 bits about 2.6 (measured on an AR(1) series of 360 values).
const SEALED_MANTISSA_BITS: u32 = 23;

/// `v` rounded to [`SEALED_MANTISSA_BITS`] (to nearest; infinities and NaN unchanged, and
/// a value that would round past f64::MAX stays as it is; subnormals, below 2.2e-308,
/// keep an absolute error under 2^-1046).
pub(crate) fn seal_value(v: f64) -> f64 {
    if !v.is_finite() {
        return v;
    }
    let dropped = 52 - SEALED_MANTISSA_BITS;
    let bits = v.to_bits();
    let rounded = f64::from_bits(((bits + (1 << (dropped - 1))) >> dropped) << dropped);
    if rounded.is_finite() {
        rounded
    } else {
        v
    }
}

/// pco's compression level for the blocks of a store that is kept: pco's default.
pub(crate) const COMPRESSION_LEVEL: usize = pco::DEFAULT_COMPRESSION_LEVEL;

/// pco's compression level for an offline store's blocks (a replay's, rebuilt at will).
/// On blocks this small pco spends most of its time choosing bins: at level 2 a 42-day,
/// 9-series replay takes 9.0-9.3 s instead of 10.2-10.4 s for 0.03% more bytes, with the
/// same report (docs/evaluation.md, "Replay speed").
pub(crate) const OFFLINE_COMPRESSION_LEVEL: usize = 2;

/// Appends one column compressed at pco's `level`: its byte length (u32 LE), then pco's bytes.
fn put_column<T: pco::data_types::Number>(out: &mut Vec<u8>, column: &[T], level: usize) -> Result<()> {
    let config = pco::ChunkConfig::default().with_compression_level(level);
    let bytes =
        pco::standalone::simple_compress(column, &config).context("cannot compress a block column")?;
    let len = u32::try_from(bytes.len()).context("a block column over 4 GiB")?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&bytes);
    Ok(())
}

/// Reads the next column of `n` numbers written by [`put_column`].
fn take_column<T: pco::data_types::Number>(data: &mut &[u8], n: usize) -> Result<Vec<T>> {
    let (len, rest) = data.split_first_chunk::<4>().context("a block cut short before a column")?;
    let len = u32::from_le_bytes(*len) as usize;
    anyhow::ensure!(rest.len() >= len, "a block cut short inside a column ({} of {len} bytes)", rest.len());
    let (bytes, rest) = rest.split_at(len);
    *data = rest;
    let column: Vec<T> =
        pco::standalone::simple_decompress(bytes).context("a block column that does not decode")?;
    anyhow::ensure!(column.len() == n, "a block column of {} values where the header says {n}", column.len());
    Ok(column)
}

/// The header of a block: format byte and number of entries.
fn put_header(out: &mut Vec<u8>, format: u8, n: usize) -> Result<()> {
    out.push(format);
    out.extend_from_slice(&u32::try_from(n).context("a block over 2^32 entries")?.to_le_bytes());
    Ok(())
}

/// Reads a block header of one of the `formats`: (format, number of entries).
fn take_header(data: &mut &[u8], formats: &[u8]) -> Result<(u8, usize)> {
    let (&format, rest) = data.split_first().context("an empty block")?;
    anyhow::ensure!(
        formats.contains(&format),
        "a block of format {format}; this omen reads formats {formats:?}"
    );
    let (n, rest) = rest.split_first_chunk::<4>().context("a block cut short in its header")?;
    *data = rest;
    Ok((format, u32::from_le_bytes(*n) as usize))
}

/// Appends the hour sums of a format-2 minute block: their number (u8), then each.
fn put_hour_sums(out: &mut Vec<u8>, hours: &[HourSum]) -> Result<()> {
    out.push(u8::try_from(hours.len()).context("a minute block over 255 hours")?);
    for &(hour, sum, count) in hours {
        out.extend_from_slice(&hour.to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&sum.to_le_bytes());
    }
    Ok(())
}

/// Reads the hour sums written by [`put_hour_sums`].
fn take_hour_sums(data: &mut &[u8]) -> Result<Vec<HourSum>> {
    let (&n, rest) = data.split_first().context("a minute block cut short before its hour sums")?;
    let len = n as usize * HOUR_SUM_BYTES;
    anyhow::ensure!(rest.len() >= len, "a minute block cut short inside its hour sums");
    let (bytes, rest) = rest.split_at(len);
    *data = rest;
    Ok(bytes
        .chunks_exact(HOUR_SUM_BYTES)
        .map(|e| {
            let word = |i: usize| <[u8; 8]>::try_from(&e[i * 8..i * 8 + 8]).expect("8 bytes");
            (i64::from_le_bytes(word(0)), f64::from_le_bytes(word(2)), i64::from_le_bytes(word(1)))
        })
        .collect())
}

/// Adds (sum, count) to entry `key` of `list`, whose keys come in nondecreasing order.
pub(crate) fn add_in_order(list: &mut Vec<SumCount>, key: i64, sum: f64, count: i64) {
    match list.last_mut() {
        Some(last) if last.0 == key => {
            last.1 += sum;
            last.2 += count;
        }
        _ => list.push((key, sum, count)),
    }
}

impl RawBlock {
    /// The block's bytes: header, time stamps (i64), values (f64), compressed at pco's `level`.
    pub(crate) fn encode(&self, level: usize) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(64 + self.ts.len() * 2);
        put_header(&mut out, RAW_BLOCK_FORMAT, self.ts.len())?;
        put_column(&mut out, &self.ts, level)?;
        put_column(&mut out, &self.values.iter().map(|&v| seal_value(v)).collect::<Vec<_>>(), level)?;
        Ok(out)
    }

    /// A block from its bytes.
    pub(crate) fn decode(mut data: &[u8]) -> Result<Self> {
        let (_, n) = take_header(&mut data, &[RAW_BLOCK_FORMAT])?;
        let ts = take_column(&mut data, n)?;
        let values = take_column(&mut data, n)?;
        Ok(Self { ts, values })
    }

    /// Adds `later` (rows that came after this block was written) in time order; at equal
    /// time stamps this block's samples stay first, as they arrived first.
    pub(crate) fn merge(self, later: RawBlock) -> RawBlock {
        if self.ts.is_empty() {
            return later;
        }
        let mut out = RawBlock::default();
        let (mut i, mut j) = (0, 0);
        while i < self.ts.len() || j < later.ts.len() {
            if j == later.ts.len() || (i < self.ts.len() && self.ts[i] <= later.ts[j]) {
                out.ts.push(self.ts[i]);
                out.values.push(self.values[i]);
                i += 1;
            } else {
                out.ts.push(later.ts[j]);
                out.values.push(later.values[j]);
                j += 1;
            }
        }
        out
    }
}

impl MinuteBlock {
    /// The block's bytes: header, hour sums, minutes and counts (i64), then sum, min, max (f64).
    /// An hour's sum adds the sealed minute sums, so that hours and minutes agree. Columns
    /// are compressed at pco's `level`.
    pub(crate) fn encode(&self, level: usize) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(256 + self.minutes.len() * 4);
        put_header(&mut out, MINUTE_BLOCK_FORMAT, self.minutes.len())?;
        put_hour_sums(&mut out, &self.hours())?;
        put_column(&mut out, &self.minutes, level)?;
        put_column(&mut out, &self.folds.iter().map(|f| f.count).collect::<Vec<_>>(), level)?;
        for field in [|f: &MinuteFold| f.sum, |f: &MinuteFold| f.min, |f: &MinuteFold| f.max] {
            let column: Vec<f64> = self.folds.iter().map(|f| seal_value(field(f))).collect();
            put_column(&mut out, &column, level)?;
        }
        Ok(out)
    }

    /// The hour sums of the block's minutes, adding the sealed minute sums (sealing a
    /// decoded, already sealed sum changes nothing).
    fn hours(&self) -> Vec<HourSum> {
        let mut hours = Vec::new();
        for (&minute, f) in self.minutes.iter().zip(&self.folds) {
            add_in_order(&mut hours, span_start(minute, HOUR_MS), seal_value(f.sum), f.count);
        }
        hours
    }

    /// The block's hour sums: read from a format-2 block, computed from the minutes of a
    /// format-1 one.
    pub(crate) fn hour_sums(mut data: &[u8]) -> Result<Vec<HourSum>> {
        let whole = data;
        let (format, _) = take_header(&mut data, MINUTE_BLOCK_FORMATS)?;
        if format >= 2 {
            return take_hour_sums(&mut data);
        }
        Ok(Self::decode(whole)?.hours())
    }

    /// A block from its bytes.
    pub(crate) fn decode(mut data: &[u8]) -> Result<Self> {
        let (format, n) = take_header(&mut data, MINUTE_BLOCK_FORMATS)?;
        if format >= 2 {
            take_hour_sums(&mut data)?;
        }
        let minutes = take_column(&mut data, n)?;
        let count: Vec<i64> = take_column(&mut data, n)?;
        let sum: Vec<f64> = take_column(&mut data, n)?;
        let min: Vec<f64> = take_column(&mut data, n)?;
        let max: Vec<f64> = take_column(&mut data, n)?;
        let folds = (0..n)
            .map(|i| MinuteFold { count: count[i], sum: sum[i], min: min[i], max: max[i], last: f64::NAN })
            .collect();
        Ok(Self { minutes, folds })
    }

    /// Adds `later` (rows written after this block): a minute in both folds the later one
    /// in after this block's (its `last` wins).
    pub(crate) fn merge(self, later: MinuteBlock) -> MinuteBlock {
        let mut out = MinuteBlock::default();
        let (mut i, mut j) = (0, 0);
        while i < self.minutes.len() || j < later.minutes.len() {
            let take_mine =
                j == later.minutes.len() || (i < self.minutes.len() && self.minutes[i] < later.minutes[j]);
            let take_later =
                i == self.minutes.len() || (j < later.minutes.len() && later.minutes[j] < self.minutes[i]);
            if take_mine {
                out.minutes.push(self.minutes[i]);
                out.folds.push(self.folds[i]);
                i += 1;
            } else if take_later {
                out.minutes.push(later.minutes[j]);
                out.folds.push(later.folds[j]);
                j += 1;
            } else {
                let mut f = self.folds[i];
                f.merge(&later.folds[j]);
                out.minutes.push(self.minutes[i]);
                out.folds.push(f);
                i += 1;
                j += 1;
            }
        }
        out
    }
}

/// Which rows a compaction step seals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Tier {
    Raw,
    Minute,
}

impl Tier {
    /// The span of one block of this tier.
    fn span(self) -> i64 {
        match self {
            Tier::Raw => RAW_BLOCK_MS,
            Tier::Minute => MINUTE_BLOCK_MS,
        }
    }

    /// The start of the span holding a row at `t`, if that span ends by `limit` (is sealed).
    fn sealed_span(self, t: i64, limit: i64) -> Option<i64> {
        let start = span_start(t, self.span());
        (start + self.span() <= limit).then_some(start)
    }
}

/// What one [`Store::compact`] call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Compaction {
    /// Blocks written (new or grown).
    pub blocks: usize,
    /// Rows moved into blocks.
    pub rows: usize,
    /// Sealed rows are left for a later call (the call's budget ran out).
    pub pending: bool,
}

/// Reads the block of series `id` at `start` in `table`, if any.
fn block_bytes(tx: &rusqlite::Connection, table: &str, id: i64, start: i64) -> Result<Option<Vec<u8>>> {
    let sql = format!("SELECT data FROM {table} WHERE series_id = ?1 AND start_ms = ?2");
    Ok(tx.prepare_cached(&sql)?.query_row(params![id, start], |r| r.get(0)).optional()?)
}

/// Moves the raw rows of series `id` in [start, start + RAW_BLOCK_MS) into its block,
/// compressed at pco's `level`; returns the rows moved.
fn seal_raw(tx: &rusqlite::Connection, id: i64, start: i64, level: usize) -> Result<usize> {
    let end = start + RAW_BLOCK_MS;
    let mut rows = RawBlock::default();
    {
        let mut stmt = tx.prepare_cached(
            "SELECT ts_ms, value FROM samples WHERE series_id = ?1 AND ts_ms >= ?2 AND ts_ms < ?3 ORDER BY ts_ms, rowid",
        )?;
        let mut q = stmt.query(params![id, start, end])?;
        while let Some(r) = q.next()? {
            rows.ts.push(r.get(0)?);
            rows.values.push(r.get(1)?);
        }
    }
    let moved = rows.ts.len();
    if moved == 0 {
        return Ok(0);
    }
    let block = match block_bytes(tx, "sample_blocks", id, start)? {
        Some(bytes) => RawBlock::decode(&bytes)
            .with_context(|| format!("raw block of series {id} at {start} in the store"))?
            .merge(rows),
        None => rows,
    };
    tx.prepare_cached(
        "INSERT OR REPLACE INTO sample_blocks (series_id, start_ms, count, data) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![id, start, block.ts.len() as i64, block.encode(level)?])?;
    tx.prepare_cached("DELETE FROM samples WHERE series_id = ?1 AND ts_ms >= ?2 AND ts_ms < ?3")?
        .execute(params![id, start, end])?;
    Ok(moved)
}

/// Moves the minute rows of series `id` in [start, start + MINUTE_BLOCK_MS) into its block,
/// compressed at pco's `level`; returns the rows moved.
fn seal_minutes(tx: &rusqlite::Connection, id: i64, start: i64, level: usize) -> Result<usize> {
    let end = start + MINUTE_BLOCK_MS;
    let mut rows = MinuteBlock::default();
    {
        let mut stmt = tx.prepare_cached(
            "SELECT minute_ms, count, sum, min, max, last FROM minute_agg
             WHERE series_id = ?1 AND minute_ms >= ?2 AND minute_ms < ?3 ORDER BY minute_ms",
        )?;
        let mut q = stmt.query(params![id, start, end])?;
        while let Some(r) = q.next()? {
            rows.minutes.push(r.get(0)?);
            rows.folds.push(MinuteFold {
                count: r.get(1)?,
                sum: r.get(2)?,
                min: r.get(3)?,
                max: r.get(4)?,
                last: r.get(5)?,
            });
        }
    }
    let moved = rows.minutes.len();
    if moved == 0 {
        return Ok(0);
    }
    let block = match block_bytes(tx, "minute_blocks", id, start)? {
        Some(bytes) => MinuteBlock::decode(&bytes)
            .with_context(|| format!("minute block of series {id} at {start} in the store"))?
            .merge(rows),
        None => rows,
    };
    tx.prepare_cached(
        "INSERT OR REPLACE INTO minute_blocks (series_id, start_ms, count, data) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![id, start, block.minutes.len() as i64, block.encode(level)?])?;
    tx.prepare_cached("DELETE FROM minute_agg WHERE series_id = ?1 AND minute_ms >= ?2 AND minute_ms < ?3")?
        .execute(params![id, start, end])?;
    Ok(moved)
}

/// The oldest row of series `id` left in a tier's row table.
fn oldest_row(tx: &rusqlite::Connection, tier: Tier, id: i64) -> Result<Option<i64>> {
    let sql = match tier {
        Tier::Raw => "SELECT MIN(ts_ms) FROM samples WHERE series_id = ?1",
        Tier::Minute => "SELECT MIN(minute_ms) FROM minute_agg WHERE series_id = ?1",
    };
    Ok(tx.prepare_cached(sql)?.query_row([id], |r| r.get(0))?)
}

impl Store {
    /// Moves sealed rows (spans ending [`SEAL_LAG_MS`] before `now_ms`, event time) into
    /// compressed blocks, at most `max_blocks` blocks per call, oldest spans first, in one
    /// transaction. Call it regularly (the agent's pipeline does, between batches); what is
    /// not sealed yet is read from rows meanwhile, so this only bounds the store's size, never
    /// what a query sees.
    pub fn compact(&self, now_ms: i64, max_blocks: usize) -> Result<Compaction> {
        let mut w = self.writer()?;
        let sealed = now_ms.saturating_sub(SEAL_LAG_MS);
        let mut work: Vec<(i64, Tier, i64)> = Vec::new();
        for (id, m) in w.minutes.iter() {
            // The open minute's raw rows stay rows: crash recovery rebuilds it from them.
            let raw_limit = m.open.map_or(sealed, |(minute, _)| sealed.min(minute));
            if let Some(start) = m.oldest_raw_row.and_then(|t| Tier::Raw.sealed_span(t, raw_limit)) {
                work.push((start, Tier::Raw, id));
            }
            if let Some(start) = m.oldest_minute_row.and_then(|t| Tier::Minute.sealed_span(t, sealed)) {
                work.push((start, Tier::Minute, id));
            }
        }
        let mut done = Compaction { pending: work.len() > max_blocks, ..Compaction::default() };
        if work.is_empty() || max_blocks == 0 {
            return Ok(done);
        }
        work.sort_unstable();
        work.truncate(max_blocks);
        let mut next: Vec<(i64, Tier, Option<i64>)> = Vec::with_capacity(work.len());
        let level = if w.offline { OFFLINE_COMPRESSION_LEVEL } else { COMPRESSION_LEVEL };
        let offline = w.offline;
        let tx = Unit::begin(&mut w.conn, offline)?;
        for &(start, tier, id) in &work {
            done.rows += match tier {
                Tier::Raw => seal_raw(&tx, id, start, level)?,
                Tier::Minute => seal_minutes(&tx, id, start, level)?,
            };
            done.blocks += 1;
            next.push((id, tier, oldest_row(&tx, tier, id)?));
        }
        tx.commit()?;
        for (id, tier, oldest) in next {
            let m = w.minutes.slot(id);
            match tier {
                Tier::Raw => m.oldest_raw_row = oldest,
                Tier::Minute => m.oldest_minute_row = oldest,
            }
            // More sealed spans of this series (a backlog) mean more work for the next call.
            done.pending |= oldest.and_then(|t| tier.sealed_span(t, sealed)).is_some();
        }
        self.changed();
        Ok(done)
    }

    /// Compacts until nothing sealed is left (tests, tools and shutdown-free bulk loads).
    pub fn compact_all(&self, now_ms: i64) -> Result<Compaction> {
        let mut total = Compaction::default();
        loop {
            let c = self.compact(now_ms, 1024)?;
            total.blocks += c.blocks;
            total.rows += c.rows;
            if !c.pending {
                return Ok(total);
            }
        }
    }
}

/// The newest raw time stamp stored, in rows or in blocks.
pub(crate) fn newest_raw_ts(conn: &rusqlite::Connection) -> Result<Option<i64>> {
    let in_rows: Option<i64> = conn.query_row("SELECT MAX(ts_ms) FROM samples", [], |r| r.get(0))?;
    // Blocks are whole spans: only the newest span's blocks can hold a newer sample, and
    // only when no row lies past that span's end (the usual case has rows there).
    let newest_start: Option<i64> =
        conn.query_row("SELECT MAX(start_ms) FROM sample_blocks", [], |r| r.get(0))?;
    let Some(start) = newest_start.filter(|&s| in_rows.is_none_or(|t| t < s + RAW_BLOCK_MS)) else {
        return Ok(in_rows);
    };
    let mut newest = in_rows;
    raw_from_all_blocks_at(conn, start, |ts| newest = Some(newest.map_or(ts, |n: i64| n.max(ts))))?;
    Ok(newest)
}

/// The oldest raw time stamp stored, in rows or in blocks.
pub(crate) fn oldest_raw_ts(conn: &rusqlite::Connection) -> Result<Option<i64>> {
    let in_rows: Option<i64> = conn.query_row("SELECT MIN(ts_ms) FROM samples", [], |r| r.get(0))?;
    let oldest_start: Option<i64> =
        conn.query_row("SELECT MIN(start_ms) FROM sample_blocks", [], |r| r.get(0))?;
    let Some(start) = oldest_start.filter(|&s| in_rows.is_none_or(|t| t >= s)) else { return Ok(in_rows) };
    let mut oldest = in_rows;
    raw_from_all_blocks_at(conn, start, |ts| oldest = Some(oldest.map_or(ts, |o: i64| o.min(ts))))?;
    Ok(oldest)
}

/// Every time stamp in the raw blocks of any series that start at `start`.
fn raw_from_all_blocks_at(conn: &rusqlite::Connection, start: i64, mut each: impl FnMut(i64)) -> Result<()> {
    let mut stmt = conn.prepare_cached("SELECT series_id, data FROM sample_blocks WHERE start_ms = ?1")?;
    let mut q = stmt.query([start])?;
    while let Some(r) = q.next()? {
        let id: i64 = r.get(0)?;
        let bytes: Vec<u8> = r.get(1)?;
        let block =
            RawBlock::decode(&bytes).with_context(|| format!("raw block of series {id} in the store"))?;
        block.ts.iter().for_each(|&t| each(t));
    }
    Ok(())
}

/// The raw samples of series `id` in [since, until) held in blocks, in time order.
pub(crate) fn raw_from_blocks(
    conn: &rusqlite::Connection,
    id: i64,
    since: i64,
    until: i64,
    mut each: impl FnMut(i64, f64),
) -> Result<()> {
    let mut stmt = conn.prepare_cached(
        "SELECT data FROM sample_blocks WHERE series_id = ?1 AND start_ms > ?2 AND start_ms < ?3 ORDER BY start_ms",
    )?;
    let mut q = stmt.query(params![id, since.saturating_sub(RAW_BLOCK_MS), until])?;
    while let Some(r) = q.next()? {
        let bytes: Vec<u8> = r.get(0)?;
        let block =
            RawBlock::decode(&bytes).with_context(|| format!("raw block of series {id} in the store"))?;
        for (&ts, &v) in block.ts.iter().zip(&block.values) {
            if ts >= since && ts < until {
                each(ts, v);
            }
        }
    }
    Ok(())
}

/// The minute folds of series `id` with minutes in [since, until) held in blocks, in time order.
pub(crate) fn minutes_from_blocks(
    conn: &rusqlite::Connection,
    id: i64,
    since: i64,
    until: i64,
    mut each: impl FnMut(i64, &MinuteFold),
) -> Result<()> {
    each_minute_block(conn, id, since, until, |bytes| {
        let block = MinuteBlock::decode(bytes)?;
        for (&minute, fold) in block.minutes.iter().zip(&block.folds) {
            if minute >= since && minute < until {
                each(minute, fold);
            }
        }
        Ok(())
    })
}

/// Calls `each` with the bytes of every minute block of series `id` that may hold a minute
/// in [since, until), in time order; an error of `each` names the series.
fn each_minute_block(
    conn: &rusqlite::Connection,
    id: i64,
    since: i64,
    until: i64,
    mut each: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let mut stmt = conn.prepare_cached(
        "SELECT data FROM minute_blocks WHERE series_id = ?1 AND start_ms > ?2 AND start_ms < ?3 ORDER BY start_ms",
    )?;
    let mut q = stmt.query(params![id, since.saturating_sub(MINUTE_BLOCK_MS), until])?;
    while let Some(r) = q.next()? {
        each(r.get_ref(0)?.as_blob()?)
            .with_context(|| format!("minute block of series {id} in the store"))?;
    }
    Ok(())
}

/// The hour sums of series `id` for hours starting in [since, until) held in blocks, in time order.
pub(crate) fn hours_from_blocks(
    conn: &rusqlite::Connection,
    id: i64,
    since: i64,
    until: i64,
    mut each: impl FnMut(HourSum),
) -> Result<()> {
    each_minute_block(conn, id, since, until, |bytes| {
        MinuteBlock::hour_sums(bytes)?
            .into_iter()
            .filter(|h| h.0 >= since && h.0 < until)
            .for_each(&mut each);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::test_util::sample;
    use crate::{RangeSeries, Resolution, DAY_MS};

    const T0: i64 = 1_793_577_600_000; // a UTC midnight

    /// Raw and minute means per 10 minutes, and (count, mean, p50, p99) of each day aggregate.
    type Views = (Vec<RangeSeries>, Vec<RangeSeries>, Vec<(i64, f64, f64, f64)>);

    /// Both series' views.
    fn views(store: &Store, until: i64) -> Views {
        let all = BTreeMap::new();
        let raw = store.range("kv_fragmentation", &all, T0, until, 600_000, Resolution::Raw).unwrap();
        let minute = store.range("kv_fragmentation", &all, T0, until, 600_000, Resolution::Minute).unwrap();
        let days = store
            .day_aggregates("kv_fragmentation", T0, T0 + DAY_MS)
            .unwrap()
            .iter()
            .map(|d| (d.count, d.mean, d.p50, d.p99))
            .collect();
        (raw, minute, days)
    }

    fn assert_close(a: &[RangeSeries], b: &[RangeSeries]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.labels, y.labels);
            assert_eq!(x.points.len(), y.points.len());
            for (p, q) in x.points.iter().zip(&y.points) {
                // Sealed values keep 24 significant bits (seal_value).
                assert!(p.0 == q.0 && (p.1 - q.1).abs() <= 2e-7 * q.1.abs().max(1.0), "{p:?} vs {q:?}");
            }
        }
    }

    /// Three hours of two series at 10 s, every third sample kept raw (decimation).
    fn three_hours(store: &Store) {
        for hour in 0..3 {
            let batch: Vec<_> = (0..360)
                .flat_map(|i| {
                    let ts = T0 + hour * 3_600_000 + i * 10_000;
                    [
                        sample(ts, "kv_fragmentation", "0", 1.0 + (i % 7) as f64),
                        sample(ts, "kv_fragmentation", "1", (i as f64).sqrt()),
                    ]
                })
                .collect();
            let keep: Vec<bool> = (0..batch.len()).map(|j| (j / 2) % 3 == 0).collect();
            store.insert_with_raw(&batch, &keep).unwrap();
        }
    }

    #[test]
    fn compaction_keeps_every_read_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        three_hours(&store);
        let until = T0 + 3 * 3_600_000;
        store.roll_up_days(T0, T0 + DAY_MS).unwrap();
        let before = views(&store, until);
        let raw_count = store.raw_sample_count().unwrap();

        // Two hours are sealed ten minutes after they end; the third is not (its last minute is open).
        let c = store.compact_all(until + 10 * MINUTE_MS).unwrap();
        assert_eq!(c.blocks, 2 * 2, "two raw hours of two series; no six-hour minute span has ended");
        assert_eq!(c.rows as i64, 2 * 2 * 120);
        let sealed: i64 = store
            .reader()
            .unwrap()
            .query_row("SELECT COUNT(*) FROM sample_blocks", [], |r| r.get(0))
            .unwrap();
        assert_eq!(sealed, 4);
        store.roll_up_days(T0, T0 + DAY_MS).unwrap();
        let after = views(&store, until);
        assert_close(&after.0, &before.0);
        assert_close(&after.1, &before.1);
        assert_eq!(after.2.len(), before.2.len());
        for (a, b) in after.2.iter().zip(&before.2) {
            assert_eq!(a.0, b.0);
            for (x, y) in [(a.1, b.1), (a.2, b.2), (a.3, b.3)] {
                assert!((x - y).abs() <= 2e-7 * y.abs(), "{a:?} vs {b:?}");
            }
        }
        assert_eq!(store.raw_sample_count().unwrap(), raw_count);
        assert_eq!(store.earliest_ts().unwrap(), Some(T0));

        // A day later everything is sealed, minutes included, and still reads the same.
        store.flush().unwrap();
        let c = store.compact_all(T0 + DAY_MS).unwrap();
        assert_eq!(c.blocks, 2 + 2, "the third raw hour and the first minute span, of two series");
        let after = views(&store, until);
        assert_close(&after.0, &before.0);
        assert_close(&after.1, &before.1);
        let rows: i64 = store
            .reader()
            .unwrap()
            .query_row("SELECT (SELECT COUNT(*) FROM samples) + (SELECT COUNT(*) FROM minute_agg)", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(rows, 0);
        drop(store);
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        assert_eq!(store.latest_ts().unwrap(), Some(until - 30_000), "the newest raw sample (i = 357)");
        assert_close(&views(&store, until).1, &before.1);
    }

    /// Hour and minute answers of both series over [T0, until) at `step`, aligned to the hour.
    fn hour_and_minute(store: &Store, until: i64, step: i64) -> (Vec<RangeSeries>, Vec<RangeSeries>) {
        let all = BTreeMap::new();
        (
            store.range("kv_fragmentation", &all, T0, until, step, Resolution::Hour).unwrap(),
            store.range("kv_fragmentation", &all, T0, until, step, Resolution::Minute).unwrap(),
        )
    }

    #[test]
    fn hour_resolution_agrees_with_minutes_on_whole_hours_in_rows_blocks_and_both() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        // Eight hours: the first six-hour span seals, the rest stays rows; the last minute is open.
        for _ in 0..2 {
            three_hours(&store);
        }
        let t = T0 + 6 * 3_600_000;
        store
            .insert(
                &(0..720)
                    .map(|i| sample(t + i * 10_000, "kv_fragmentation", "0", (i % 13) as f64))
                    .collect::<Vec<_>>(),
            )
            .unwrap();
        let until = t + 2 * 3_600_000;
        let check = |what: &str| {
            for step in [3_600_000, 7_200_000] {
                let (hours, minutes) = hour_and_minute(&store, until, step);
                assert!(!hours.is_empty() && hours[0].points.len() == minutes[0].points.len(), "{what}");
                assert_close(&hours, &minutes);
            }
        };
        check("rows and the open minute");
        store.compact_all(t + 10 * MINUTE_MS).unwrap();
        let blocks: i64 = store
            .reader()
            .unwrap()
            .query_row("SELECT COUNT(*) FROM minute_blocks", [], |r| r.get(0))
            .unwrap();
        assert_eq!(blocks, 2);
        check("blocks, rows and the open minute");
        // Late samples of a sealed hour land in rows beside its block.
        store.insert(&[sample(T0 + 5, "kv_fragmentation", "1", 100.0)]).unwrap();
        check("late rows beside a block");
        store.flush().unwrap();
        store.compact_all(until + DAY_MS).unwrap();
        check("blocks only");
    }

    #[test]
    fn each_hour_counts_in_the_bucket_its_start_falls_in() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        // Hour h holds the value h.
        let batch: Vec<_> = (0..6 * 60)
            .map(|m| sample(T0 + m * MINUTE_MS, "kv_fragmentation", "0", (m / 60) as f64))
            .collect();
        store.insert(&batch).unwrap();
        store.flush().unwrap();
        store.compact_all(T0 + DAY_MS).unwrap();
        let all = BTreeMap::new();
        // Half past: the hour that starts before `since` is left out, and so is the one
        // that starts at `until`; hours that straddle a bucket's end count where they start.
        let since = T0 + 1_800_000;
        let r = store
            .range("kv_fragmentation", &all, since, T0 + 5 * 3_600_000, 7_200_000, Resolution::Hour)
            .unwrap();
        assert_eq!(r[0].points, vec![(since, 1.5), (since + 7_200_000, 3.5)]);
    }

    #[test]
    fn minute_blocks_of_format_1_still_read_at_every_resolution() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        three_hours(&store);
        store.flush().unwrap();
        store.compact_all(T0 + DAY_MS).unwrap();
        let until = T0 + 3 * 3_600_000;
        let (hours, minutes) = hour_and_minute(&store, until, 3_600_000);
        // Rewrite every minute block as the previous release did: format 1, no hour sums.
        {
            let w = store.writer.lock().unwrap();
            let blocks: Vec<(i64, Vec<u8>)> = w
                .conn
                .prepare("SELECT rowid, data FROM minute_blocks")
                .unwrap()
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            assert_eq!(blocks.len(), 2);
            for (rowid, data) in blocks {
                let mut rest = &data[..];
                let (format, _) = take_header(&mut rest, MINUTE_BLOCK_FORMATS).unwrap();
                assert_eq!(format, 2);
                take_hour_sums(&mut rest).unwrap();
                let mut old = data[..5].to_vec();
                old[0] = 1;
                old.extend_from_slice(rest);
                w.conn
                    .execute("UPDATE minute_blocks SET data = ?1 WHERE rowid = ?2", params![old, rowid])
                    .unwrap();
            }
        }
        let (old_hours, old_minutes) = hour_and_minute(&store, until, 3_600_000);
        assert_close(&old_hours, &hours);
        assert_close(&old_minutes, &minutes);
        assert_close(&old_hours, &minutes);
    }

    #[test]
    fn late_samples_after_compaction_are_read_and_folded_in() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        three_hours(&store);
        store.flush().unwrap();
        store.compact_all(T0 + DAY_MS).unwrap();
        let all = BTreeMap::new();
        let first_minute = |store: &Store| {
            store
                .range(
                    "kv_fragmentation",
                    &[("layer".to_owned(), "0".to_owned())].into(),
                    T0,
                    T0 + 60_000,
                    60_000,
                    Resolution::Minute,
                )
                .unwrap()[0]
                .points[0]
        };
        // Minute 0 of layer 0: six samples 1..=6, mean 3.5. A late 10.5 makes it 4.5.
        assert_eq!(first_minute(&store), (T0, 3.5));
        store.insert(&[sample(T0 + 5_000, "kv_fragmentation", "0", 10.5)]).unwrap();
        store.flush().unwrap();
        assert_eq!(first_minute(&store), (T0, 4.5));
        let raw = store.range("kv_fragmentation", &all, T0, T0 + 10_000, 10_000, Resolution::Raw).unwrap();
        assert_eq!(raw[0].points, vec![(T0, (1.0 + 10.5) / 2.0)], "the sealed sample at T0 and the late one");
        let c = store.compact_all(T0 + DAY_MS).unwrap();
        assert_eq!((c.blocks, c.rows), (2, 2), "one raw row and one minute row folded into their blocks");
        assert_eq!(first_minute(&store), (T0, 4.5));
        let raw = store.range("kv_fragmentation", &all, T0, T0 + 10_000, 10_000, Resolution::Raw).unwrap();
        assert_eq!(raw[0].points, vec![(T0, (1.0 + 10.5) / 2.0)]);
    }

    #[test]
    fn the_open_minute_stays_in_rows_and_survives_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("omen.db");
        {
            let store = Store::open(&path).unwrap();
            // One series goes quiet inside an hour: its last minute stays open.
            store.insert(&[sample(T0, "quiet", "0", 1.0), sample(T0 + 20_000, "quiet", "0", 3.0)]).unwrap();
            let c = store.compact(T0 + DAY_MS, 100).unwrap();
            assert_eq!(c.blocks, 0, "the open minute's hour is not sealed");
            std::mem::forget(store);
        }
        let store = Store::open(&path).unwrap();
        let r = store.range("quiet", &BTreeMap::new(), T0, T0 + 60_000, 60_000, Resolution::Minute).unwrap();
        assert_eq!(r[0].points, vec![(T0, 2.0)], "rebuilt from its raw rows");
    }

    #[test]
    fn retention_drops_whole_blocks_past_the_cutoff() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        three_hours(&store);
        store.flush().unwrap();
        store.compact_all(T0 + DAY_MS).unwrap();
        // Raw cutoff at T0 + 1.5 h (of a 1-day retention): the first hour's blocks go, the second's stay.
        store.apply_retention(T0 + DAY_MS + 5_400_000, 1, 30, 30).unwrap();
        let starts: Vec<i64> = store
            .reader()
            .unwrap()
            .prepare("SELECT DISTINCT start_ms FROM sample_blocks ORDER BY 1")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(starts, vec![T0 + 3_600_000, T0 + 7_200_000]);
        assert_eq!(store.earliest_ts().unwrap(), Some(T0 + 3_600_000));
    }

    #[test]
    fn retention_after_a_long_outage_deletes_in_bounded_calls() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("omen.db")).unwrap();
        // One more raw block than a call deletes: 2561 series with an hour each.
        let n = crate::RETENTION_BLOCKS_PER_CALL + 1;
        let batch: Vec<_> = (0..n).map(|i| sample(T0, "kv_fragmentation", &i.to_string(), 1.0)).collect();
        store.insert(&batch).unwrap();
        store.flush().unwrap();
        store.compact_all(T0 + DAY_MS).unwrap();
        let blocks = |store: &Store| -> i64 {
            store.reader().unwrap().query_row("SELECT COUNT(*) FROM sample_blocks", [], |r| r.get(0)).unwrap()
        };
        assert_eq!(blocks(&store), n as i64);
        let later = T0 + 30 * DAY_MS;
        let first = store.apply_retention(later, 1, 60, 400).unwrap();
        assert!(first >= crate::RETENTION_BLOCKS_PER_CALL, "{first}: the bound was reached");
        assert_eq!(blocks(&store), 1, "one block left for the next call");
        store.apply_retention(later, 1, 60, 400).unwrap();
        assert_eq!(blocks(&store), 0);
    }

    #[test]
    fn blocks_round_trip_exactly_at_either_compression_level() {
        for level in [COMPRESSION_LEVEL, OFFLINE_COMPRESSION_LEVEL] {
            round_trip(level);
        }
    }

    fn round_trip(level: usize) {
        let raw = RawBlock {
            ts: (0..360).map(|i| 1_793_577_600_000 + i * 10_000).collect(),
            values: (0..360).map(|i| (i as f64 * 0.37).sin() * 1e-3 + f64::EPSILON * i as f64).collect(),
        };
        let back = RawBlock::decode(&raw.encode(level).unwrap()).unwrap();
        assert_eq!(back.ts, raw.ts, "time stamps are exact");
        for (b, v) in back.values.iter().zip(&raw.values) {
            assert!((b - v).abs() <= v.abs() * 2f64.powi(-24), "{b} vs {v}");
        }
        // Values with at most 24 significant bits (block counts, usage on a 1/4096 grid) are exact.
        let grid = RawBlock { ts: vec![1, 2, 3], values: vec![0.0, 1234.0 / 4096.0, -85_899_345_920.0] };
        assert_eq!(RawBlock::decode(&grid.encode(level).unwrap()).unwrap(), grid);
        let minutes = MinuteBlock {
            minutes: (0..5).map(|i| i * MINUTE_MS).collect(),
            folds: (0..5).map(|i| MinuteFold::new(i as f64 / 4.0)).collect(),
        };
        let back = MinuteBlock::decode(&minutes.encode(level).unwrap()).unwrap();
        assert_eq!(back.minutes, minutes.minutes);
        for (b, f) in back.folds.iter().zip(&minutes.folds) {
            assert_eq!((b.count, b.sum, b.min, b.max), (f.count, f.sum, f.min, f.max));
            assert!(b.last.is_nan(), "a sealed minute does not keep its last sample");
        }
    }

    #[test]
    fn special_values_survive_sealing() {
        for v in [f64::INFINITY, f64::NEG_INFINITY, f64::MAX, f64::MIN_POSITIVE, -0.0] {
            let s = seal_value(v);
            assert!(s == v || (s - v).abs() <= v.abs() * 2f64.powi(-24), "{v} -> {s}");
        }
        // Subnormals have fewer bits to keep: the error is absolute, at most 2^-1046.
        for v in [5e-324, 3.5e-309, -1e-310] {
            assert!((seal_value(v) - v).abs() <= f64::from_bits(1 << 28), "{v}");
            // 2^-1046
        }
        assert!(seal_value(f64::NAN).is_nan());
    }

    proptest::proptest! {
        #[test]
        fn sealing_keeps_seven_significant_digits(v in proptest::num::f64::NORMAL | proptest::num::f64::ZERO) {
            let s = seal_value(v);
            proptest::prop_assert!((s - v).abs() <= v.abs() * 2f64.powi(-24), "{} -> {}", v, s);
            proptest::prop_assert_eq!(seal_value(s), s, "sealing twice changes nothing");
        }
    }

    #[test]
    fn damaged_blocks_are_errors_not_panics() {
        let raw = RawBlock { ts: vec![1, 2, 3], values: vec![0.5, 0.25, 0.125] };
        let bytes = raw.encode(COMPRESSION_LEVEL).unwrap();
        for cut in 0..bytes.len() {
            assert!(RawBlock::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut other = bytes.clone();
        other[0] = 9;
        assert!(RawBlock::decode(&other).unwrap_err().to_string().contains("format 9"));
    }

    #[test]
    fn merges_keep_time_order_and_fold_shared_minutes() {
        let a = RawBlock { ts: vec![1, 3, 5], values: vec![1.0, 3.0, 5.0] };
        let b = RawBlock { ts: vec![2, 3, 6], values: vec![2.0, 30.0, 6.0] };
        let m = a.merge(b);
        assert_eq!(m.ts, vec![1, 2, 3, 3, 5, 6]);
        assert_eq!(m.values, vec![1.0, 2.0, 3.0, 30.0, 5.0, 6.0]);
        let a =
            MinuteBlock { minutes: vec![0, 60_000], folds: vec![MinuteFold::new(1.0), MinuteFold::new(2.0)] };
        let b = MinuteBlock {
            minutes: vec![60_000, 120_000],
            folds: vec![MinuteFold::new(4.0), MinuteFold::new(8.0)],
        };
        let m = a.merge(b);
        assert_eq!(m.minutes, vec![0, 60_000, 120_000]);
        let shared = m.folds[1];
        assert_eq!((shared.count, shared.sum, shared.min, shared.max, shared.last), (2, 6.0, 2.0, 4.0, 4.0));
    }
}
