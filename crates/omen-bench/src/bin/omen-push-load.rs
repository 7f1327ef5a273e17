//! Load generator for the agent's push-ingest API, used by `scripts/bench-agent.sh`.
//!
//! Every round (default once a second) it sends what a busy 8-GPU node would:
//! per GPU one `POST /v1/ingest/kvcache` carrying every layer's block-occupancy
//! bitmap, per canary one `POST /v1/ingest/logits` with 20 top-k logprobs, and one
//! `POST /v1/ingest/samples` with each canary's TTFT, TPOT, end-to-end latency and
//! RCI. Occupancy comes from a small block allocator per (GPU, layer) pool whose
//! load drifts slowly, so usage and fragmentation move the way a serving engine's do.
//!
//! With `--backfill N` it first pushes the last N seconds of history (past timestamps,
//! each round acknowledged before the next), so a query over a recent window meets
//! the store a long-running agent would have.
//!
//! Every response must be a 200; the run prints its counts and exits non-zero if any
//! request failed. It is bounded: `--seconds` of rounds, each request with a timeout,
//! and the whole run with a hard deadline. Only loopback URLs are accepted unless
//! `--allow-non-loopback` is given.
//!
//! With `--parse-only` it sends nothing: it builds `--seconds` rounds of the same payloads
//! and times the agent's own parser on them (`omen_agent::http::parse_ingest`, everything
//! the agent does to a push before its pipeline), printing one JSON line, so that the
//! benchmark can set the agent's CPU per sample beside the cost of merely parsing it.
//!
//! ```text
//! cargo run --release -p omen-bench --bin omen-push-load -- --url http://127.0.0.1:9464 --seconds 60
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use omen_signals::catalogue;
use omen_sources::now_ms;

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use tokio::task::JoinSet;

#[derive(Debug, Parser)]
#[command(about = "Push-ingest load generator for the omen agent (loopback benchmark)")]
struct Args {
    /// Base URL of the agent's API listener.
    #[arg(long, default_value = "http://127.0.0.1:9464")]
    url: String,
    /// GPUs (one kvcache request each per round).
    #[arg(long, default_value_t = 8)]
    gpus: u32,
    /// Layers per GPU (one bitmap each).
    #[arg(long, default_value_t = 80)]
    layers: u32,
    /// KV blocks per layer pool.
    #[arg(long, default_value_t = 4096)]
    blocks: u32,
    /// Canaries (one logits request each per round, plus their latencies and RCI).
    #[arg(long, default_value_t = 4)]
    canaries: u32,
    /// How long to push, seconds (rounds = seconds x rate).
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// First push this many seconds of history (timestamps in the past), as fast as the
    /// agent acknowledges, so that queries over recent windows see a full store.
    #[arg(long, default_value_t = 0)]
    backfill: u64,
    /// Rounds per second.
    #[arg(long, default_value_t = 1.0)]
    rate: f64,
    /// Per-request timeout, seconds.
    #[arg(long, default_value_t = 10)]
    timeout: u64,
    /// Seed of the occupancy and canary simulation.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Bearer token for the ingest endpoints (when the agent sets http.ingest_token_env);
    /// default: the OMEN_INGEST_TOKEN environment variable, if set.
    #[arg(long)]
    token: Option<String>,
    /// Allow a URL whose host is not loopback.
    #[arg(long)]
    allow_non_loopback: bool,
    /// Send nothing: time the agent's parser on `--seconds` rounds of payloads and print
    /// the cost per sample and per KV block map as one JSON line.
    #[arg(long)]
    parse_only: bool,
}

// ---------------------------------------------------------------- small utilities

/// xorshift64* — a deterministic, dependency-free generator (statistical quality is ample here).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform integer in [lo, hi].
    fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.next_u64() % u64::from(hi - lo + 1)) as u32
    }
    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let u1 = self.f64().max(1e-12);
        let u2 = self.f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// Standard base64 with padding (RFC 4648).
fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(T[(n >> 18) as usize & 63] as char);
        out.push(T[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 { T[(n >> 6) as usize & 63] as char } else { '=' });
        out.push(if chunk.len() > 2 { T[n as usize & 63] as char } else { '=' });
    }
    out
}

// ---------------------------------------------------------------- KV block pool simulation

/// One layer's block pool: requests hold blocks taken from a FIFO free queue (as a
/// paged-attention engine's free-block queue does), so blocks freed by finished
/// requests are reused out of order and free space fragments.
struct Pool {
    blocks: u32,
    free: VecDeque<u32>,
    /// Blocks of each live request.
    requests: Vec<Vec<u32>>,
    bitmap: Vec<u8>,
}

impl Pool {
    fn new(blocks: u32) -> Self {
        Self {
            blocks,
            free: (0..blocks).collect(),
            requests: Vec::new(),
            bitmap: vec![0; blocks.div_ceil(8) as usize],
        }
    }

    fn used(&self) -> u32 {
        self.blocks - self.free.len() as u32
    }

    fn take(&mut self) -> Option<u32> {
        let b = self.free.pop_front()?;
        self.bitmap[(b / 8) as usize] |= 1 << (b % 8);
        Some(b)
    }

    fn give_back(&mut self, blocks: Vec<u32>) {
        for b in blocks {
            self.bitmap[(b / 8) as usize] &= !(1 << (b % 8));
            self.free.push_back(b);
        }
    }

    /// One second of engine activity with a target occupancy in [0, 1].
    fn step(&mut self, target: f64, rng: &mut Rng) {
        // Finished requests free their blocks (mean lifetime ~ 20 s).
        let mut i = 0;
        while i < self.requests.len() {
            if rng.f64() < 0.05 {
                let done = self.requests.swap_remove(i);
                self.give_back(done);
            } else {
                i += 1;
            }
        }
        // Decoding requests grow by a block now and then (16 tokens a block).
        for r in 0..self.requests.len() {
            if rng.f64() < 0.3 {
                match self.take() {
                    Some(b) => self.requests[r].push(b),
                    None => break,
                }
            }
        }
        // New requests are admitted (prompt of 4..64 blocks) until the target is reached.
        let goal = (target.clamp(0.0, 0.99) * f64::from(self.blocks)) as u32;
        let mut admitted = 0;
        while self.used() < goal && admitted < 64 {
            let want = rng.range(4, 64).min(goal - self.used()).max(1);
            let mut blocks = Vec::with_capacity(want as usize);
            for _ in 0..want {
                match self.take() {
                    Some(b) => blocks.push(b),
                    None => break,
                }
            }
            self.requests.push(blocks);
            admitted += 1;
        }
        // Preemption when the pool is over target by a margin (the engine evicts the newest).
        while f64::from(self.used()) > (target + 0.05).min(1.0) * f64::from(self.blocks) {
            match self.requests.pop() {
                Some(r) => self.give_back(r),
                None => break,
            }
        }
    }
}

/// One GPU: a slowly drifting load shared by its layers, plus per-layer pools.
struct Gpu {
    base: f64,
    walk: f64,
    period_s: f64,
    phase: f64,
    pools: Vec<Pool>,
    rng: Rng,
}

impl Gpu {
    fn new(index: u32, layers: u32, blocks: u32, seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ (u64::from(index) + 1).wrapping_mul(0xA24B_AED4_963E_E407));
        Self {
            base: 0.45 + 0.3 * rng.f64(),
            walk: 0.0,
            period_s: 300.0 + 600.0 * rng.f64(),
            phase: std::f64::consts::TAU * rng.f64(),
            pools: (0..layers).map(|_| Pool::new(blocks)).collect(),
            rng,
        }
    }

    /// Advances one round and returns the kvcache payload.
    fn round(&mut self, gpu: u32, t_s: f64, ts_ms: i64) -> Value {
        self.walk = (self.walk + 0.01 * self.rng.normal()).clamp(-0.15, 0.15);
        let load =
            self.base + 0.12 * (std::f64::consts::TAU * t_s / self.period_s + self.phase).sin() + self.walk;
        let blocks = self.pools.first().map_or(0, |p| p.blocks);
        let mut layers = Vec::with_capacity(self.pools.len());
        for (layer, pool) in self.pools.iter_mut().enumerate() {
            // Layers of one engine track the same load; a small per-layer offset keeps them distinct.
            let target = load + 0.02 * self.rng.normal();
            pool.step(target, &mut self.rng);
            layers.push(json!({
                "layer": layer,
                "bitmap_b64": base64(&pool.bitmap),
                "num_blocks": blocks,
            }));
        }
        json!({ "ts_ms": ts_ms, "gpu": gpu.to_string(), "layers": layers })
    }
}

// ---------------------------------------------------------------- canary emulation

/// A canary's first-token distribution and latency profile; results jitter round to round.
struct Canary {
    name: String,
    top_p: f64,
    decay: f64,
    ttft_s: f64,
    tpot_s: f64,
    tokens: f64,
    rci: f64,
}

impl Canary {
    fn new(i: u32, rng: &mut Rng) -> Self {
        Self {
            name: format!("c{}", i + 1),
            top_p: 0.55 + 0.35 * rng.f64(),
            decay: 0.45 + 0.3 * rng.f64(),
            ttft_s: 0.06 + 0.08 * rng.f64(),
            tpot_s: 0.012 + 0.01 * rng.f64(),
            tokens: f64::from(rng.range(32, 128)),
            rci: 0.05 + 0.1 * rng.f64(),
        }
    }

    /// 20 natural-log probabilities, descending, summing to less than 1.
    fn top_logprobs(&self, rng: &mut Rng) -> Vec<f64> {
        let p1 = (self.top_p + 0.01 * rng.normal()).clamp(0.05, 0.97);
        let rest = 1.0 - p1;
        // The remaining mass: a geometric tail of which the 19 listed tokens carry ~90%.
        let mut probs = vec![p1];
        let norm: f64 = (1..20).map(|k| self.decay.powi(k)).sum();
        for k in 1..20 {
            let p = 0.9 * rest * self.decay.powi(k) / norm;
            probs.push(p.min(*probs.last().expect("non-empty")));
        }
        probs.iter().map(|p| p.max(1e-12).ln()).collect()
    }

    /// (ttft, tpot, e2e, rci) of one probe.
    fn latencies(&self, rng: &mut Rng) -> (f64, f64, f64, f64) {
        let ttft = self.ttft_s * (0.15 * rng.normal()).exp();
        let tpot = self.tpot_s * (0.08 * rng.normal()).exp();
        let e2e = ttft + tpot * (self.tokens - 1.0);
        let rci = (self.rci + 0.01 * rng.normal()).clamp(0.0, 1.0);
        (ttft, tpot, e2e, rci)
    }
}

// ---------------------------------------------------------------- HTTP

#[derive(Default)]
struct Counters {
    sent: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    bytes: AtomicU64,
    /// Errors by kind (status code or transport error), with one example message each.
    errors: Mutex<BTreeMap<String, (u64, String)>>,
    /// Request latencies, microseconds.
    latencies_us: Mutex<Vec<u64>>,
}

impl Counters {
    fn error(&self, kind: String, example: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let mut e = self.errors.lock().expect("not poisoned");
        let entry = e.entry(kind).or_insert((0, example));
        entry.0 += 1;
    }
}

async fn post(
    client: reqwest::Client,
    url: String,
    token: Option<Arc<str>>,
    body: Vec<u8>,
    c: Arc<Counters>,
) {
    c.sent.fetch_add(1, Ordering::Relaxed);
    c.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
    let endpoint = url.rsplit('/').next().unwrap_or("?").to_owned();
    let mut req = client.post(&url).header("content-type", "application/json").body(body);
    if let Some(t) = &token {
        req = req.bearer_auth(t);
    }
    let started = Instant::now();
    match req.send().await {
        Ok(resp) => {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            c.latencies_us.lock().expect("not poisoned").push(started.elapsed().as_micros() as u64);
            if status == reqwest::StatusCode::OK {
                c.ok.fetch_add(1, Ordering::Relaxed);
            } else {
                c.error(format!("{endpoint}: HTTP {}", status.as_u16()), text.chars().take(300).collect());
            }
        }
        Err(e) => {
            let kind = if e.is_timeout() {
                "timeout"
            } else if e.is_connect() {
                "connect"
            } else {
                "transport"
            };
            // The whole cause chain: reqwest's own message omits the underlying I/O error.
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                text.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            c.error(format!("{endpoint}: {kind}"), text);
        }
    }
}

fn check_loopback(url: &str) -> Result<()> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("--url {url:?}: only http:// URLs are supported (the client has no TLS)"))?;
    let authority = rest.split('/').next().unwrap_or("");
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    let loopback =
        host == "localhost" || host.parse::<std::net::IpAddr>().map(|ip| ip.is_loopback()).unwrap_or(false);
    if !loopback {
        bail!("--url host {host:?} is not loopback; pass --allow-non-loopback to push elsewhere");
    }
    Ok(())
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1000.0
}

/// What one round sends: the simulated node and its canaries.
struct Node {
    base: String,
    gpus: Vec<Gpu>,
    canaries: Vec<Canary>,
    rng: Rng,
}

impl Node {
    /// (url, JSON body) of every request of one round at simulated time `t_s`, stamped `ts_ms`.
    fn round(&mut self, t_s: f64, ts_ms: i64) -> Result<Vec<(String, Vec<u8>)>> {
        let base = &self.base;
        let mut bodies: Vec<(String, Vec<u8>)> = Vec::new();
        for (g, gpu) in self.gpus.iter_mut().enumerate() {
            let payload = gpu.round(g as u32, t_s, ts_ms);
            bodies.push((format!("{base}/v1/ingest/kvcache"), serde_json::to_vec(&payload)?));
        }
        let mut samples = Vec::new();
        for c in &self.canaries {
            let lp = c.top_logprobs(&mut self.rng);
            let payload =
                json!({ "ts_ms": ts_ms, "canary": c.name, "top_logprobs": lp, "vocab_size": 128_256 });
            bodies.push((format!("{base}/v1/ingest/logits"), serde_json::to_vec(&payload)?));
            let (ttft, tpot, e2e, rci) = c.latencies(&mut self.rng);
            for (signal, value) in [
                (catalogue::CANARY_TTFT_SECONDS.name, ttft),
                (catalogue::CANARY_TPOT_SECONDS.name, tpot),
                (catalogue::CANARY_E2E_SECONDS.name, e2e),
                (catalogue::RCI.name, rci),
            ] {
                samples.push(json!({ "signal": signal, "labels": { "canary": c.name }, "value": value, "ts_ms": ts_ms }));
            }
        }
        if !samples.is_empty() {
            bodies.push((
                format!("{base}/v1/ingest/samples"),
                serde_json::to_vec(&json!({ "samples": samples }))?,
            ));
        }
        Ok(bodies)
    }
}

/// Prints one phase's counts; returns the number of failed requests.
fn report(phase: &str, c: &Counters, rounds_done: u64, rounds: u64, elapsed: f64, build_us: u64) -> u64 {
    let sent = c.sent.load(Ordering::Relaxed);
    let ok = c.ok.load(Ordering::Relaxed);
    let failed = c.failed.load(Ordering::Relaxed);
    let bytes = c.bytes.load(Ordering::Relaxed) as f64;
    let mut lat = c.latencies_us.lock().expect("not poisoned").clone();
    lat.sort_unstable();
    println!(
        "push_load {phase}: {rounds_done}/{rounds} rounds in {elapsed:.1} s; {sent} requests, {ok} ok, {failed} failed"
    );
    println!(
        "push_load {phase}: {:.1} MB sent ({:.0} kB/round); request latency ms: p50 {:.1}, p99 {:.1}, max {:.1}; payload build {:.1} ms/round",
        bytes / 1e6,
        bytes / 1e3 / rounds_done.max(1) as f64,
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().map_or(f64::NAN, |v| *v as f64 / 1000.0),
        build_us as f64 / 1e3 / rounds_done.max(1) as f64,
    );
    for (kind, (n, example)) in c.errors.lock().expect("not poisoned").iter() {
        println!("push_load {phase}: error {kind}: {n}x, e.g. {example}");
    }
    failed
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    if !args.allow_non_loopback {
        check_loopback(&args.url)?;
    }
    if !(args.rate > 0.0 && args.rate <= 100.0) {
        bail!("--rate {} must be in (0, 100] rounds per second", args.rate);
    }
    if args.gpus == 0 || args.layers == 0 || args.blocks == 0 {
        bail!("--gpus, --layers and --blocks must be at least 1");
    }
    if args.seconds > 86_400 || args.backfill > 86_400 {
        bail!("--seconds and --backfill are capped at 86400");
    }
    if args.seconds == 0 && args.backfill == 0 {
        bail!("nothing to do: give --seconds and/or --backfill");
    }
    if args.parse_only {
        return parse_only(&args);
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(args.timeout))
        .pool_max_idle_per_host(64)
        .build()?;
    let token: Option<Arc<str>> = args
        .token
        .clone()
        .or_else(|| std::env::var("OMEN_INGEST_TOKEN").ok().filter(|t| !t.is_empty()))
        .map(Arc::from);

    let mut rng = Rng::new(args.seed.wrapping_add(0x5EED));
    let canaries: Vec<Canary> = (0..args.canaries).map(|i| Canary::new(i, &mut rng)).collect();
    let mut node = Node {
        base: args.url.trim_end_matches('/').to_owned(),
        gpus: (0..args.gpus).map(|g| Gpu::new(g, args.layers, args.blocks, args.seed)).collect(),
        canaries,
        rng,
    };
    let period_ms = 1000.0 / args.rate;
    eprintln!(
        "push_load: {} GPUs x {} layers x {} blocks, {} canaries to {}; backfill {} s, then {} s at {}/s",
        args.gpus, args.layers, args.blocks, args.canaries, node.base, args.backfill, args.seconds, args.rate
    );

    // SIGINT / SIGTERM end the schedule early; what is in flight is drained and reported.
    let stop = Arc::new(tokio::sync::Notify::new());
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            let term = async {
                match term.as_mut() {
                    Some(t) => {
                        t.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term => {}
            }
            stop.notify_one();
        });
    }
    let mut failed = 0u64;
    let mut stopped = false;
    let mut overrun = false;

    // Backfill: the last --backfill seconds of history, back to back, each round acknowledged
    // before the next (so the store holds what a long-running agent would before the timing starts).
    if args.backfill > 0 {
        let counters = Arc::new(Counters::default());
        let rounds = ((args.backfill as f64) * args.rate).ceil() as u64;
        let deadline = Instant::now() + Duration::from_secs(60 + args.backfill);
        let started = Instant::now();
        let first_ms = now_ms() - (rounds as f64 * period_ms) as i64;
        let (mut done, mut build_us) = (0u64, 0u64);
        for round in 0..rounds {
            if Instant::now() >= deadline {
                overrun = true;
                break;
            }
            let t = Instant::now();
            let bodies =
                node.round(round as f64 / args.rate, first_ms + (round as f64 * period_ms) as i64)?;
            build_us += t.elapsed().as_micros() as u64;
            let mut set: JoinSet<()> = JoinSet::new();
            for (url, body) in bodies {
                set.spawn(post(client.clone(), url, token.clone(), body, counters.clone()));
            }
            let all = async { while set.join_next().await.is_some() {} };
            tokio::select! {
                _ = all => {}
                _ = stop.notified() => {
                    stopped = true;
                    break;
                }
            }
            done += 1;
        }
        failed += report("backfill", &counters, done, rounds, started.elapsed().as_secs_f64(), build_us);
    }

    // Live schedule: one round per period, requests of a round sent concurrently.
    if args.seconds > 0 && !stopped && !overrun {
        let counters = Arc::new(Counters::default());
        let rounds = ((args.seconds as f64) * args.rate).ceil().max(1.0) as u64;
        // Hard stop: the schedule plus one request timeout plus slack.
        let deadline = Instant::now() + Duration::from_secs(args.seconds + args.timeout + 5);
        let started = Instant::now();
        let mut ticker = tokio::time::interval(Duration::from_secs_f64(period_ms / 1000.0));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut inflight: JoinSet<()> = JoinSet::new();
        let (mut done, mut build_us) = (0u64, 0u64);
        for round in 0..rounds {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.notified() => {
                    stopped = true;
                    break;
                }
            }
            if Instant::now() >= deadline {
                overrun = true;
                break;
            }
            while inflight.try_join_next().is_some() {}
            let t = Instant::now();
            let bodies = node.round((args.backfill + round) as f64 / args.rate, now_ms())?;
            build_us += t.elapsed().as_micros() as u64;
            for (url, body) in bodies {
                inflight.spawn(post(client.clone(), url, token.clone(), body, counters.clone()));
            }
            done += 1;
        }
        // Drain what is in flight, bounded by the deadline.
        let drain = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), async {
            while inflight.join_next().await.is_some() {}
        })
        .await;
        if drain.is_err() {
            let n = inflight.len() as u64;
            inflight.abort_all();
            counters.error("deadline".into(), format!("{n} requests still in flight at the deadline"));
        }
        failed += report("live", &counters, done, rounds, started.elapsed().as_secs_f64(), build_us);
        if counters.ok.load(Ordering::Relaxed) == 0 {
            failed += 1;
        }
    }
    if overrun {
        println!("push_load: stopped early at a deadline (the agent did not keep up)");
    }
    if stopped {
        println!("push_load: stopped early by a signal");
    }
    if failed > 0 || overrun {
        std::process::exit(1);
    }
    Ok(())
}

/// Passes over the payloads in `--parse-only`: at least this many, and more until
/// [`PARSE_MIN_SECONDS`] have passed. The fastest pass is reported (the others carry page
/// faults and cache misses of the first touch, or another process's interference).
const PARSE_PASSES: usize = 5;
/// Least time spent parsing in `--parse-only`, so that a small load is timed as well as a large one.
const PARSE_MIN_SECONDS: f64 = 1.0;

/// `--parse-only`: the agent's parse step, timed on the payloads a run of `--seconds` rounds sends.
fn parse_only(args: &Args) -> Result<()> {
    let mut rng = Rng::new(args.seed.wrapping_add(0x5EED));
    let canaries: Vec<Canary> = (0..args.canaries).map(|i| Canary::new(i, &mut rng)).collect();
    let mut node = Node {
        base: String::new(),
        gpus: (0..args.gpus).map(|g| Gpu::new(g, args.layers, args.blocks, args.seed)).collect(),
        canaries,
        rng,
    };
    let rounds = ((args.seconds as f64) * args.rate).ceil().max(1.0) as u64;
    let now = now_ms();
    let mut bodies: Vec<(String, Vec<u8>)> = Vec::new();
    for round in 0..rounds {
        bodies.extend(node.round(round as f64 / args.rate, now + round as i64 * 1000)?);
    }
    let kinds: Vec<(&str, &[u8])> =
        bodies.iter().map(|(url, body)| (url.rsplit('/').next().unwrap_or(""), body.as_slice())).collect();
    // Counts: samples each push yields, and the KV block maps (layers) the kvcache pushes carry.
    let (mut samples, mut kv_samples) = (0usize, 0usize);
    for (kind, body) in &kinds {
        let n = omen_agent::http::parse_ingest(kind, body, now)
            .with_context(|| format!("the agent's parser refused a generated {kind} payload"))?
            .len();
        samples += n;
        if *kind == "kvcache" {
            kv_samples += n;
        }
    }
    let kv_maps = rounds as usize * args.gpus as usize * args.layers as usize;
    let bytes: usize = kinds.iter().map(|(_, b)| b.len()).sum();
    // Fastest pass: the full parse, its kvcache share, and a bare JSON scan.
    let (mut full, mut kv_only, mut scan) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
    let started = Instant::now();
    let mut passes = 0;
    while passes < PARSE_PASSES || started.elapsed().as_secs_f64() < PARSE_MIN_SECONDS {
        passes += 1;
        let (mut total, mut kv) = (0.0, 0.0);
        for (kind, body) in &kinds {
            let t = Instant::now();
            let parsed = omen_agent::http::parse_ingest(kind, body, now);
            let dt = t.elapsed().as_secs_f64();
            std::hint::black_box(parsed).ok();
            total += dt;
            if *kind == "kvcache" {
                kv += dt;
            }
        }
        full = full.min(total);
        kv_only = kv_only.min(kv);
        let t = Instant::now();
        for (_, body) in &kinds {
            std::hint::black_box(serde_json::from_slice::<serde::de::IgnoredAny>(body))?;
        }
        scan = scan.min(t.elapsed().as_secs_f64());
    }
    let report = json!({
        "rounds": rounds,
        "requests": kinds.len(),
        "bytes": bytes,
        "samples": samples,
        "kv_samples": kv_samples,
        "kv_maps": kv_maps,
        "passes": passes,
        "parse_us_per_sample": full * 1e6 / samples.max(1) as f64,
        "parse_us_per_kv_map": kv_only * 1e6 / kv_maps.max(1) as f64,
        "json_scan_us_per_sample": scan * 1e6 / samples.max(1) as f64,
        "parse_us_per_round": full * 1e6 / rounds as f64,
    });
    println!("{report}");
    Ok(())
}
