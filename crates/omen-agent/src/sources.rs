//! The agent's sources wired to the pipeline: NVML, the server /metrics scrape and the
//! canary prober each on its own interval, and a recorded trace; each reports `source_up`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use omen_signals::catalogue;
use omen_sources::now_ms;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::config::Config;
use crate::metrics::LiveMetrics;
use crate::pipeline::{offer, IngestJob};
use crate::semantic::SemanticModel;
use omen_store::Store;

/// Replays the configured trace, if any; the returned watch turns true when it has finished.
pub fn spawn_trace(
    cfg: &Config,
    live: &Arc<LiveMetrics>,
    ingest_tx: &mpsc::Sender<IngestJob>,
    shutdown_rx: &tokio::sync::watch::Receiver<bool>,
    servers: &mut Vec<tokio::task::JoinHandle<()>>,
) -> tokio::sync::watch::Receiver<bool> {
    let (trace_done_tx, trace_done) = tokio::sync::watch::channel(cfg.sources.trace.is_none());
    if let Some(trace) = cfg.sources.trace.clone() {
        live.set_gauge(catalogue::SOURCE_UP.name, vec![("source".into(), "trace".into())], 1.0);
        let tx = ingest_tx.clone();
        let live = live.clone();
        let mut stop = shutdown_rx.clone();
        servers.push(tokio::spawn(async move {
            let path: PathBuf = trace.path.clone();
            let result = tokio::select! {
                r = replay_trace(trace.path, trace.speed, tx) => r,
                _ = stop.changed() => Ok(0),
            };
            match result {
                Ok(n) => info!(trace = %path.display(), samples = n, "trace source finished; still serving the API"),
                Err(e) => {
                    live.set_gauge(catalogue::SOURCE_UP.name, vec![("source".into(), "trace".into())], 0.0);
                    error!("trace source {}: {e:#}", path.display());
                }
            }
            let _ = trace_done_tx.send(true);
        }));
    }
    trace_done
}

fn source_up(live: &LiveMetrics, source: &str, up: bool) {
    live.set_gauge(
        catalogue::SOURCE_UP.name,
        vec![("source".into(), source.into())],
        if up { 1.0 } else { 0.0 },
    );
}

/// A source's failures as a spell: the first failure of a spell is logged, the rounds that
/// follow are only counted, and the recovery is logged with the count, so a server that is
/// down for an hour gives two log lines, not one per interval.
#[derive(Default)]
struct Spell {
    failed_rounds: u64,
}

impl Spell {
    /// Records a failed round of `what`.
    fn failed(&mut self, what: &str, error: &dyn std::fmt::Display) {
        if self.failed_rounds == 0 {
            warn!("{what} failing: {error} (logged once until it recovers; source_up is 0 meanwhile)");
        }
        self.failed_rounds += 1;
    }

    /// Records a good round of `what`.
    fn succeeded(&mut self, what: &str) {
        if self.failed_rounds > 0 {
            info!("{what} recovered after {} failed round(s)", self.failed_rounds);
            self.failed_rounds = 0;
        }
    }
}

/// A task that runs `tick` every `interval` until shutdown.
fn every<F, Fut>(
    interval: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
    mut tick: F,
) -> tokio::task::JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut timer = tokio::time::interval(interval);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = timer.tick() => tick().await,
                _ = stop.changed() => return,
            }
        }
    })
}

/// NVML, server /metrics and the canary prober, each on its own interval.
pub fn spawn_live(
    cfg: &Arc<Config>,
    store: &Arc<Store>,
    live: &Arc<LiveMetrics>,
    tx: &mpsc::Sender<IngestJob>,
    stop: &tokio::sync::watch::Receiver<bool>,
    semantic: Option<Arc<SemanticModel>>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Result<()> {
    if cfg.sources.nvml.enabled {
        match omen_sources::GpuSampler::new(&cfg.sources.nvml.uuids) {
            Ok(sampler) => {
                let uuids: Vec<&str> = sampler.gpus().iter().map(|g| g.uuid.as_str()).collect();
                info!(gpus = sampler.gpu_count(), ?uuids, "NVML: sampling GPU memory");
                let sampler = Arc::new(sampler);
                let (live, tx) = (live.clone(), tx.clone());
                let spell = Arc::new(std::sync::Mutex::new(Spell::default()));
                tasks.push(every(cfg.sources.nvml.interval, stop.clone(), move || {
                    let (sampler, live, tx, spell) =
                        (sampler.clone(), live.clone(), tx.clone(), spell.clone());
                    async move {
                        let result =
                            tokio::task::spawn_blocking(move || sampler.sample_with_errors(now_ms())).await;
                        let mut spell = spell.lock().unwrap_or_else(|e| e.into_inner());
                        match result {
                            Ok((samples, errors)) => {
                                match errors.first() {
                                    Some(e) => spell.failed("NVML", e),
                                    None => spell.succeeded("NVML"),
                                }
                                source_up(&live, "nvml", errors.is_empty());
                                offer(&live, &tx, samples, "nvml");
                            }
                            Err(e) => {
                                source_up(&live, "nvml", false);
                                spell.failed("NVML", &format!("the sampling task failed: {e}"));
                            }
                        }
                    }
                }));
            }
            // No GPU here: say so once and keep running without GPU signals.
            Err(e @ omen_sources::NvmlError::Unavailable { .. }) => info!("{e}"),
            // GPUs there, but not the configured ones, or NVML failing: omen keeps running
            // (it must not take the server's pod down), GPU signals off, said loudly.
            Err(e) => {
                source_up(live, "nvml", false);
                tracing::error!("{e}");
            }
        }
    }
    if let Some(m) = cfg.sources.server_metrics.clone() {
        let scraper = omen_sources::Scraper::new(&m.url)?.with_timeout(m.timeout);
        let scraper = Arc::new(tokio::sync::Mutex::new((scraper, Spell::default())));
        let client = reqwest::Client::builder().timeout(m.timeout).build()?;
        let (live, tx) = (live.clone(), tx.clone());
        tasks.push(every(m.interval, stop.clone(), move || {
            let (scraper, client, live, tx) = (scraper.clone(), client.clone(), live.clone(), tx.clone());
            async move {
                let mut guard = scraper.lock().await;
                let (s, spell) = &mut *guard;
                match s.scrape(&client, now_ms()).await {
                    Ok(samples) => {
                        spell.succeeded("server metrics");
                        let url = s.url().to_owned();
                        for w in s.changed_warnings().unwrap_or_default() {
                            warn!("server metrics {url}: {w}");
                        }
                        source_up(&live, "server_metrics", true);
                        offer(&live, &tx, samples, "server_metrics");
                    }
                    Err(e) => {
                        source_up(&live, "server_metrics", false);
                        spell.failed("server metrics", &e);
                    }
                }
            }
        }));
    }
    if let Some(c) = cfg.sources.canary.clone() {
        let mut target = c.target.clone();
        if let Some(var) = &c.api_key_env {
            target.api_key = Some(std::env::var(var).with_context(|| {
                format!("sources.canary.api_key_env: environment variable {var} is not set; export it or remove the key")
            })?);
        }
        let w = &cfg.signals.rci_weights;
        let weights = omen_signals::RciWeights::new(w.bleu, w.semantic, w.repetition)?;
        let client = reqwest::Client::builder().build()?;
        let target = Arc::new(target);
        let prompts = Arc::new(c.prompts.clone());
        let (live, tx, store) = (live.clone(), tx.clone(), store.clone());
        let spells: Arc<tokio::sync::Mutex<Vec<Spell>>> =
            Arc::new(tokio::sync::Mutex::new(c.prompts.iter().map(|_| Spell::default()).collect()));
        tasks.push(every(c.interval, stop.clone(), move || {
            let (client, target, prompts, live, tx, store, semantic, spells) = (
                client.clone(),
                target.clone(),
                prompts.clone(),
                live.clone(),
                tx.clone(),
                store.clone(),
                semantic.clone(),
                spells.clone(),
            );
            async move {
                let mut spells = spells.lock().await;
                let mut all_ok = true;
                for (canary, spell) in prompts.iter().zip(spells.iter_mut()) {
                    let what = format!("canary {}", canary.id);
                    let began = std::time::Instant::now();
                    match probe_canary(&client, &target, canary, &store, weights, semantic.as_ref(), &live)
                        .await
                    {
                        Ok(samples) => {
                            spell.succeeded(&what);
                            offer(&live, &tx, samples, "canary");
                        }
                        Err(e) => {
                            all_ok = false;
                            spell.failed(&what, &format!("{e:#}"));
                            // The probe's own failures (CanaryError) have an OTLP error.type; a
                            // store or model-worker fault is omen's and is not a request's.
                            if let Some(probe) = e.downcast_ref::<omen_sources::CanaryError>() {
                                let labels = vec![("canary".to_owned(), canary.id.clone())];
                                live.record_failed_probe(
                                    labels,
                                    probe.error_type(),
                                    began.elapsed().as_secs_f64(),
                                );
                            }
                        }
                    }
                }
                source_up(&live, "canary", all_ok);
            }
        }));
    }
    Ok(())
}

/// One probe; the first answer of a canary without a configured reference becomes its stored
/// reference. With a semantic model, RCI of an answer that has a reference includes BERTScore F1.
async fn probe_canary(
    client: &reqwest::Client,
    target: &omen_sources::CanaryTarget,
    canary: &omen_sources::Canary,
    store: &Arc<Store>,
    weights: omen_signals::RciWeights,
    semantic: Option<&Arc<SemanticModel>>,
    live: &LiveMetrics,
) -> Result<Vec<omen_sources::Sample>> {
    let stored = match &canary.reference {
        Some(_) => None,
        None => {
            let (store, id) = (store.clone(), canary.id.clone());
            tokio::task::spawn_blocking(move || store.canary_reference(&id)).await??
        }
    };
    let reference_text = canary.reference.clone().or_else(|| stored.clone());
    let reference = match stored {
        Some(text) => Some(Arc::new(omen_signals::BleuReference::new(&[text])?)),
        None => None,
    };
    let mut result = omen_sources::probe(client, target, canary, reference, weights).await?;
    if let (Some(model), Some(reference_text), Some(_)) = (semantic, reference_text, &result.rci) {
        let f1 = model.f1(result.answer.clone(), reference_text).await?;
        result.set_semantic_f1(&canary.id, f1)?;
    }
    if canary.reference.is_none() && result.rci.is_none() {
        let (store, id, answer) = (store.clone(), canary.id.clone(), result.answer.clone());
        tokio::task::spawn_blocking(move || store.set_canary_reference(&id, &answer, now_ms())).await??;
        info!(canary = %canary.id, "captured the canary's reference answer");
    }
    // What only the OTLP GenAI metrics carry: the answering model and the prompt's tokens.
    live.note_probe(&canary.id, result.response_model.as_deref(), result.input_tokens);
    Ok(result.samples(now_ms(), &canary.id))
}

/// Feeds a trace into the pipeline; with `speed` > 0 it paces by trace time / speed.
async fn replay_trace(path: PathBuf, speed: f64, tx: mpsc::Sender<IngestJob>) -> Result<usize> {
    let (batch_tx, mut batch_rx) = mpsc::channel::<Result<Vec<omen_sources::Sample>>>(64);
    let reader = tokio::task::spawn_blocking(move || -> Result<()> {
        for batch in omen_sources::trace_file::batches(&path)? {
            if batch_tx.blocking_send(batch.map_err(anyhow::Error::from)).is_err() {
                break;
            }
        }
        Ok(())
    });
    let mut total = 0;
    let mut prev_ts: Option<i64> = None;
    while let Some(batch) = batch_rx.recv().await {
        let batch = batch?;
        if speed > 0.0 {
            if let Some(p) = prev_ts {
                let wait = ((batch[0].ts_ms - p).max(0) as f64 / speed) as u64;
                tokio::time::sleep(Duration::from_millis(wait.min(60_000))).await;
            }
        }
        prev_ts = Some(batch[0].ts_ms);
        total += batch.len();
        // Our own source: wait for room rather than shed.
        tx.send(IngestJob { samples: batch, ack: None })
            .await
            .map_err(|_| anyhow::anyhow!("the pipeline stopped"))?;
    }
    reader.await??;
    Ok(total)
}
