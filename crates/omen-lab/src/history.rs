//! `omen fill-history`: weeks of a large node's KV-cache history pushed into a store in
//! accelerated time, through the agent's own pipeline (the [`Engine`] that `omen run` feeds
//! every pushed batch, its ticks, compaction, roll-ups and retention), to measure what the
//! store and the tick cost after that long: store size, tick time, and (with `omen run` on
//! the filled store) start-up time and query latency.
//!
//! Samples are pushed in chunks of ten minutes of event time, one engine batch each (as
//! a pusher may batch), and the engine ticks every `health.interval` of event time within
//! the chunk, after it; the tick's work (health, forecasts, roll-ups, retention) is what
//! the agent does, so its time is what the agent's ticks take. After each chunk the
//! compaction steps run until none is left, as the pipeline runs them between batches.
//!
//! Samples come every `period` (default: the store's `raw_min_interval`, 10 s): a 1 Hz push
//! stores the same rows, since the agent keeps one raw sample per series per interval and
//! folds the others into their minute's count and sum; the store's size does not depend on
//! those counts. Values follow a daily cycle with a weekend dip, per-GPU load, per-layer
//! offsets and noise: usage on the 1/4096 grid of a block pool, fragmentation as full-
//! precision floats (what compresses worst), and the anomaly scores the engine derives.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use omen_agent::config::Config;
use omen_agent::engine::Engine;
use omen_agent::metrics::LiveMetrics;
use omen_signals::catalogue;
use omen_sources::Sample;
use omen_store::{Store, DAY_MS};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

/// What to generate.
#[derive(Debug, Clone)]
pub struct HistoryOptions {
    /// Days of history, ending at `end_ms`.
    pub days: u32,
    /// GPUs on the node.
    pub gpus: u32,
    /// Layers per GPU (one usage and one fragmentation series each).
    pub layers: u32,
    /// Time between two samples of a series.
    pub period: Duration,
    /// End of the history (Unix ms, exclusive).
    pub end_ms: i64,
    /// Random seed of the values.
    pub seed: u64,
}

/// Percentiles of tick (or upkeep step) times, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct TickTimes {
    /// Ticks timed.
    pub ticks: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Slowest.
    pub max_ms: f64,
}

/// What a fill did and measured.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryReport {
    /// The store's file.
    pub store: String,
    /// Days, GPUs, layers, sample period in seconds.
    pub days: u32,
    pub gpus: u32,
    pub layers: u32,
    pub period_s: f64,
    /// Samples pushed into the engine (value series only; it adds the anomaly scores).
    pub samples: u64,
    /// Series in the store.
    pub series: usize,
    /// Wall time of the fill, seconds.
    pub fill_seconds: f64,
    /// Store size on disk (database, WAL and shared-memory files), bytes.
    pub store_bytes: u64,
    /// Tick times over the whole fill, and over its last day alone.
    pub tick_all: TickTimes,
    pub tick_last_day: TickTimes,
    /// Times of the compaction steps the pipeline runs between batches (each holds the
    /// store's writer: the longest a batch can wait for one).
    pub upkeep_step: TickTimes,
}

/// Event time pushed per commit.
const CHUNK_MS: i64 = 10 * 60_000;

/// One series' state: an AR(1) deviation around its GPU's daily cycle.
struct Layer {
    offset: f64,
    noise: f64,
    frag: f64,
}

/// Bytes of the store file and its -wal / -shm companions.
pub fn store_bytes(path: &std::path::Path) -> u64 {
    ["", "-wal", "-shm"]
        .iter()
        .filter_map(|suffix| {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            std::fs::metadata(std::path::PathBuf::from(p)).ok()
        })
        .map(|m| m.len())
        .sum()
}

fn tick_times(mut ms: Vec<f64>) -> TickTimes {
    ms.sort_by(f64::total_cmp);
    let q = |p: f64| if ms.is_empty() { 0.0 } else { ms[((ms.len() - 1) as f64 * p).round() as usize] };
    TickTimes { ticks: ms.len(), p50_ms: q(0.5), p99_ms: q(0.99), max_ms: ms.last().copied().unwrap_or(0.0) }
}

/// Fills the store of `cfg` (which must not exist yet) with `opts`' history; ticks every
/// `health.interval` of event time, as the agent does, and times each tick. Logs one line
/// per simulated day.
pub fn fill_history(cfg: Config, opts: &HistoryOptions) -> Result<HistoryReport> {
    anyhow::ensure!(opts.days >= 1, "--days must be at least 1");
    anyhow::ensure!(opts.gpus >= 1 && opts.layers >= 1, "--gpus and --layers must be at least 1");
    let period_ms = i64::try_from(opts.period.as_millis()).context("--period too long")?;
    anyhow::ensure!(period_ms >= 1000, "--period must be at least 1s");
    let path = cfg.store.path.clone();
    anyhow::ensure!(
        !path.exists(),
        "{} exists; fill-history writes a new store: remove it or choose another --store",
        path.display()
    );
    let tick_every_ms = (cfg.health.interval.as_millis() as i64).max(1);
    // Ticks are driven here, once per health.interval of event time, after the chunk that
    // covers them; the engine's own tick-on-ingest is pushed out of the way.
    let mut cfg = cfg;
    cfg.health.interval = Duration::from_secs(1 << 40);
    let store = Arc::new(Store::open(&path)?);
    let mut engine = Engine::new(Arc::new(cfg), store.clone(), Arc::new(LiveMetrics::new()))?;

    let mut rng = StdRng::seed_from_u64(opts.seed);
    let gpu_load: Vec<f64> = (0..opts.gpus).map(|_| rng.random_range(0.3..0.6)).collect();
    let mut layers: Vec<Layer> = (0..opts.gpus * opts.layers)
        .map(|_| Layer {
            offset: rng.random_range(-0.05..0.05),
            noise: 0.0,
            frag: rng.random_range(0.0..0.3),
        })
        .collect();
    let labels: Vec<std::collections::BTreeMap<String, String>> = (0..opts.gpus)
        .flat_map(|g| {
            (0..opts.layers)
                .map(move |l| [("gpu".to_owned(), g.to_string()), ("layer".to_owned(), l.to_string())].into())
        })
        .collect();

    let start_ms = (opts.end_ms - opts.days as i64 * DAY_MS).div_euclid(period_ms) * period_ms;
    let last_day_ms = opts.end_ms - DAY_MS;
    let started = Instant::now();
    let (mut ticks, mut ticks_last_day, mut upkeep) = (Vec::new(), Vec::new(), Vec::new());
    let mut next_tick = start_ms;
    let mut samples = 0u64;
    let mut day_logged = start_ms;
    let mut ts = start_ms;
    let mut batch = Vec::new();
    while ts < opts.end_ms {
        let day_phase = (ts.rem_euclid(DAY_MS)) as f64 / DAY_MS as f64;
        // 1970-01-01 was a Thursday: days 2 and 3 after it are the weekend.
        let weekend = matches!(ts.div_euclid(DAY_MS).rem_euclid(7), 2 | 3);
        let cycle =
            0.2 * (2.0 * std::f64::consts::PI * (day_phase - 0.3)).sin() - if weekend { 0.15 } else { 0.0 };
        for (i, layer) in layers.iter_mut().enumerate() {
            let g = i / opts.layers as usize;
            layer.noise = 0.98 * layer.noise + 0.01 * normal(&mut rng);
            layer.frag = (0.995 * layer.frag + 0.005 * 0.2 + 0.01 * normal(&mut rng)).clamp(0.0, 1.0);
            let usage = (gpu_load[g] + cycle + layer.offset + layer.noise).clamp(0.0, 1.0);
            let usage = (usage * 4096.0).round() / 4096.0;
            let kvf = 1.0 + layer.frag * (1.0 + usage);
            for (signal, value) in
                [(catalogue::KVCACHE_USAGE_RATIO.name, usage), (catalogue::KV_FRAGMENTATION.name, kvf)]
            {
                batch.push(Sample { ts_ms: ts, signal: signal.into(), labels: labels[i].clone(), value });
            }
        }
        ts += period_ms;
        // Chunks of CHUNK_MS of event time, one commit each: one commit per 10 s step would
        // rewrite one index page per series each time and spend the fill on write-ahead-log I/O.
        if ts % CHUNK_MS != 0 && ts < opts.end_ms {
            continue;
        }
        samples += batch.len() as u64;
        engine.process(std::mem::take(&mut batch))?;
        while next_tick < ts {
            let t = Instant::now();
            engine.tick(next_tick)?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            ticks.push(ms);
            if next_tick >= last_day_ms {
                ticks_last_day.push(ms);
            }
            next_tick += tick_every_ms;
        }
        // Compaction as the pipeline runs it between batches, timed step by step.
        loop {
            let t = Instant::now();
            let more = engine.maintain()?;
            upkeep.push(t.elapsed().as_secs_f64() * 1e3);
            if !more {
                break;
            }
        }
        if ts - day_logged >= DAY_MS {
            day_logged = ts;
            let done = (ts - start_ms) as f64 / (opts.end_ms - start_ms) as f64;
            let elapsed = started.elapsed().as_secs_f64();
            tracing::info!(
                "fill-history: day {} of {} ({:.0}%), store {:.0} MB, {:.0} s so far, about {:.0} s left",
                (ts - start_ms) / DAY_MS,
                opts.days,
                done * 100.0,
                store_bytes(&path) as f64 / 1e6,
                elapsed,
                elapsed / done.max(1e-9) * (1.0 - done)
            );
        }
    }
    engine.flush()?;
    let series = store.signals()?.iter().map(|s| store.series_matching(s, &Default::default())).sum();
    Ok(HistoryReport {
        store: path.display().to_string(),
        days: opts.days,
        gpus: opts.gpus,
        layers: opts.layers,
        period_s: period_ms as f64 / 1e3,
        samples,
        series,
        fill_seconds: started.elapsed().as_secs_f64(),
        store_bytes: store_bytes(&path),
        tick_all: tick_times(ticks),
        tick_last_day: tick_times(ticks_last_day),
        upkeep_step: tick_times(upkeep),
    })
}

/// A standard normal draw (Box-Muller).
fn normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random_range(0.0..1.0);
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_fill_goes_through_the_pipeline_into_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::default();
        cfg.store.path = dir.path().join("omen.db");
        let end_ms = 1_793_577_600_000 + 2 * DAY_MS;
        let opts =
            HistoryOptions { days: 2, gpus: 1, layers: 2, period: Duration::from_secs(10), end_ms, seed: 1 };
        let report = fill_history(cfg.clone(), &opts).unwrap();
        assert_eq!(report.samples, 2 * 8640 * 2 * 2);
        assert!(report.tick_all.ticks >= 2 * 1440 - 1, "{:?}", report.tick_all);
        let store = Store::open(&cfg.store.path).unwrap();
        let all = Default::default();
        for signal in [catalogue::KVCACHE_USAGE_RATIO.name, catalogue::KV_FRAGMENTATION.name] {
            assert_eq!(store.series_matching(signal, &all), 2, "{signal}: one series per layer");
        }
        assert_eq!(store.series_matching(catalogue::ANOMALY_SCORE.name, &all), 4, "one per value series");
        // The first day is rolled up from its blocks: 8640 samples of each series.
        let days =
            store.day_aggregates(catalogue::KVCACHE_USAGE_RATIO.name, end_ms - 2 * DAY_MS, end_ms).unwrap();
        assert!(days.iter().any(|d| d.day_ms == end_ms - 2 * DAY_MS && d.count == 8640), "{days:?}");
        assert_eq!(
            store.count(catalogue::KV_FRAGMENTATION.name).unwrap(),
            2 * 8640 * 2,
            "every sample, in rows or blocks"
        );
        let sealed: i64 =
            rusqlite_count(&cfg.store.path, "SELECT COALESCE(SUM(count), 0) FROM sample_blocks");
        assert!(sealed > 8640 * 8, "at least a day of every series is sealed: {sealed}");
        assert!(fill_history(cfg, &opts).unwrap_err().to_string().contains("exists"));
    }

    fn rusqlite_count(path: &std::path::Path, sql: &str) -> i64 {
        rusqlite::Connection::open(path).unwrap().query_row(sql, [], |r| r.get(0)).unwrap()
    }
}
