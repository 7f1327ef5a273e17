//! `omen run`: starts the store, the pipeline thread, the sources and the HTTP
//! listeners, and shuts down cleanly on SIGINT/SIGTERM after draining the queue.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::config::Config;
use crate::engine::Engine;
use crate::http::{self, AppState, IngestJob};
use crate::metrics::{self, LiveMetrics};
use crate::semantic::{self, SemanticModel};
use crate::store::Store;
use crate::trace_file;

/// A running agent's handles (for tests and the binary).
pub struct Agent {
    /// Address the API listens on.
    pub api_addr: std::net::SocketAddr,
    /// Address of the metrics-only listener, if configured.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The shared state.
    pub state: AppState,
    shutdown: tokio::sync::watch::Sender<bool>,
    pipeline: std::thread::JoinHandle<Result<()>>,
    servers: Vec<tokio::task::JoinHandle<()>>,
    trace_done: tokio::sync::watch::Receiver<bool>,
    otlp: Option<crate::otlp::OtlpExporter>,
}

/// Runs until SIGINT or SIGTERM.
pub async fn run(cfg: Config) -> Result<()> {
    let agent = start(cfg).await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install the SIGTERM handler")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => info!("SIGINT: shutting down"),
        _ = term.recv() => info!("SIGTERM: shutting down"),
    }
    agent.stop().await
}

impl Agent {
    /// Resolves when a configured trace source has been fully replayed.
    pub async fn trace_finished(&mut self) {
        while !*self.trace_done.borrow() {
            if self.trace_done.changed().await.is_err() {
                return;
            }
        }
    }

    /// Stops listeners and sources, drains the pipeline queue, and waits for it.
    pub async fn stop(self) -> Result<()> {
        let _ = self.shutdown.send(true);
        for s in self.servers {
            let _ = s.await;
        }
        drop(self.state);
        tokio::task::spawn_blocking(move || self.pipeline.join())
            .await
            .context("pipeline join")?
            .map_err(|_| anyhow::anyhow!("the pipeline thread panicked"))??;
        // After the pipeline, so that the last values are flushed; never fails the stop.
        if let Some(x) = self.otlp {
            match tokio::task::spawn_blocking(move || x.shutdown()).await {
                Ok(Err(e)) => warn!("{e}"),
                Err(e) => warn!("OTLP shutdown task: {e}"),
                Ok(Ok(())) => {}
            }
        }
        info!("stopped");
        Ok(())
    }
}

/// Starts everything and returns once the listeners are bound.
pub async fn start(cfg: Config) -> Result<Agent> {
    let cfg = Arc::new(cfg);
    let token = cfg.ingest_token().map_err(|p| anyhow::anyhow!("{p}"))?;
    let store = Arc::new(Store::open(&cfg.store.path)?);
    info!(path = %store.path().display(), "store open");
    // Before anything starts, so that a bad model folder fails start-up.
    let worker = start_worker(&cfg)?;
    let semantic = semantic::load(&cfg, worker.as_ref()).await?;
    let live = Arc::new(LiveMetrics::new());
    let registry = Arc::new(metrics::registry(live.clone()));
    // Before any source starts, so that the OTLP histograms see every latency.
    let otlp = match &cfg.otlp {
        Some(o) => Some(crate::otlp::start(o, live.clone()).map_err(|e| anyhow::anyhow!("otlp: {e}"))?),
        None => None,
    };
    let mut engine = Engine::new(cfg.clone(), store.clone(), live.clone())?;
    attach_model(&cfg, worker.as_ref(), &mut engine)?;
    let summary = engine.summary_handle();
    let ready = Arc::new(AtomicBool::new(false));
    let (ingest_tx, mut ingest_rx) = mpsc::channel::<IngestJob>(cfg.http.ingest_queue);
    let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);

    // The pipeline owns the engine on its own thread: SQLite writes block.
    let pipeline_ready = ready.clone();
    let pipeline =
        std::thread::Builder::new().name("omen-pipeline".into()).spawn(move || -> Result<()> {
            pipeline_ready.store(true, Ordering::Relaxed);
            while let Some(job) = ingest_rx.blocking_recv() {
                let n = job.samples.len();
                let result = engine.process(job.samples);
                if let Err(e) = &result {
                    error!("pipeline: batch of {n} samples not stored: {e:#}");
                }
                if let Some(ack) = job.ack {
                    let _ = ack.send(result.map_err(|e| format!("{e:#}")));
                }
            }
            pipeline_ready.store(false, Ordering::Relaxed);
            // The open minute aggregates; they would be rebuilt from raw samples anyway.
            if let Err(e) = engine.flush() {
                error!("pipeline: open minute aggregates not written at shutdown: {e:#}");
            }
            Ok(())
        })?;

    let state = AppState {
        live: live.clone(),
        registry,
        store: store.clone(),
        ingest: ingest_tx.clone(),
        token: token.map(Arc::from),
        summary,
        ready,
        latest: Arc::default(),
        store_reads: Arc::new(tokio::sync::Semaphore::new(http::STORE_READS)),
        range_cache: Default::default(),
    };
    let mut servers = Vec::new();
    let api = tokio::net::TcpListener::bind(cfg.http.listen).await.with_context(|| {
        format!(
            "http.listen: cannot bind {}; is another omen running? choose a free address",
            cfg.http.listen
        )
    })?;
    let api_addr = api.local_addr()?;
    info!(%api_addr, "API listening (/scores, /metrics, /v1/ingest/*)");
    servers.push(serve(api, http::router(state.clone(), cfg.http.max_body_bytes), shutdown_rx.clone()));
    let metrics_addr = match cfg.http.metrics_listen {
        Some(addr) => {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("http.metrics_listen: cannot bind {addr}; choose a free address"))?;
            let a = l.local_addr()?;
            info!(metrics_addr = %a, "metrics listening (/metrics, /healthz, /readyz)");
            servers.push(serve(l, http::metrics_router(state.clone()), shutdown_rx.clone()));
            Some(a)
        }
        None => None,
    };

    let (trace_done_tx, trace_done) = tokio::sync::watch::channel(cfg.sources.trace.is_none());
    if let Some(trace) = cfg.sources.trace.clone() {
        live.set_gauge("source_up", vec![("source".into(), "trace".into())], 1.0);
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
                    live.set_gauge("source_up", vec![("source".into(), "trace".into())], 0.0);
                    error!("trace source {}: {e:#}", path.display());
                }
            }
            let _ = trace_done_tx.send(true);
        }));
    }
    spawn_live_sources(&cfg, &store, &live, &ingest_tx, &shutdown_rx, semantic, &mut servers)?;
    drop(ingest_tx);
    Ok(Agent { api_addr, metrics_addr, state, shutdown, pipeline, servers, trace_done, otlp })
}

/// The model worker, when the config names a model it must run; `None` otherwise, so a
/// sidecar without a model never starts libtorch.
fn start_worker(cfg: &Config) -> Result<Option<Arc<crate::worker::Worker>>> {
    if !cfg.needs_worker() {
        return Ok(None);
    }
    let program = crate::worker::find_program(cfg.worker.path.as_deref()).context("worker.path")?;
    Ok(Some(Arc::new(crate::worker::Worker::new(program, cfg.worker.timeout))))
}

/// Loads the configured LSTM-AE model into the engine; a model that cannot be used stops start-up.
fn attach_model(
    cfg: &Config,
    #[cfg_attr(not(feature = "lstm"), allow(unused_variables))] worker: Option<&Arc<crate::worker::Worker>>,
    engine: &mut Engine,
) -> Result<()> {
    let Some(m) = &cfg.model else {
        info!("no model.path configured: running the statistical detectors only (window anomaly scores, forecasts)");
        return Ok(());
    };
    #[cfg(feature = "lstm")]
    {
        let worker = worker.context("model.path: no model worker was started")?.clone();
        let model = crate::lstm_live::LiveModel::load(worker, &m.path, m.threads)?;
        info!(
            path = %m.path.display(),
            sources = model.sources().len(),
            window = model.window(),
            "LSTM-AE model loaded in the model worker; its score joins the health score"
        );
        engine.set_model(model);
        Ok(())
    }
    #[cfg(not(feature = "lstm"))]
    {
        let _ = engine;
        anyhow::bail!(
            "model.path: {} is configured, but this omen was built without the `lstm` feature; build it with default features or remove the model section",
            m.path.display()
        )
    }
}

fn source_up(live: &LiveMetrics, source: &str, up: bool) {
    live.set_gauge("source_up", vec![("source".into(), source.into())], if up { 1.0 } else { 0.0 });
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

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Hands a source's samples to the pipeline; our sources never block on a full
/// queue: they shed the round and count it.
fn offer(live: &LiveMetrics, tx: &mpsc::Sender<IngestJob>, samples: Vec<omen_sources::Sample>, source: &str) {
    let n = samples.len() as u64;
    if !samples.is_empty() && tx.try_send(IngestJob { samples, ack: None }).is_err() {
        live.shed.get_or_create(&vec![("reason".into(), format!("queue_full_{source}"))]).inc_by(n);
    }
}

/// NVML, server /metrics and the canary prober, each on its own interval.
fn spawn_live_sources(
    cfg: &Arc<Config>,
    store: &Arc<Store>,
    live: &Arc<LiveMetrics>,
    tx: &mpsc::Sender<IngestJob>,
    stop: &tokio::sync::watch::Receiver<bool>,
    semantic: Option<Arc<SemanticModel>>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Result<()> {
    if cfg.sources.nvml.enabled {
        match omen_sources::GpuSampler::new() {
            Ok(sampler) => {
                info!(gpus = sampler.gpu_count(), "NVML: sampling GPU memory");
                let sampler = Arc::new(sampler);
                let (live, tx) = (live.clone(), tx.clone());
                tasks.push(every(cfg.sources.nvml.interval, stop.clone(), move || {
                    let (sampler, live, tx) = (sampler.clone(), live.clone(), tx.clone());
                    async move {
                        match tokio::task::spawn_blocking(move || sampler.sample_with_errors(now_ms())).await
                        {
                            Ok((samples, errors)) => {
                                for e in &errors {
                                    warn!("NVML: {e}");
                                }
                                source_up(&live, "nvml", errors.is_empty());
                                offer(&live, &tx, samples, "nvml");
                            }
                            Err(e) => {
                                source_up(&live, "nvml", false);
                                warn!("NVML sampling task failed: {e}");
                            }
                        }
                    }
                }));
            }
            // No GPU here: say so once and keep running without GPU signals.
            Err(e) => info!("{e}"),
        }
    }
    if let Some(m) = cfg.sources.server_metrics.clone() {
        let scraper = omen_sources::Scraper::new(&m.url)?.with_timeout(m.timeout);
        let scraper = Arc::new(tokio::sync::Mutex::new(scraper));
        let client = reqwest::Client::builder().timeout(m.timeout).build()?;
        let (live, tx) = (live.clone(), tx.clone());
        tasks.push(every(m.interval, stop.clone(), move || {
            let (scraper, client, live, tx) = (scraper.clone(), client.clone(), live.clone(), tx.clone());
            async move {
                let mut s = scraper.lock().await;
                match s.scrape(&client, now_ms()).await {
                    Ok(samples) => {
                        source_up(&live, "server_metrics", true);
                        offer(&live, &tx, samples, "server_metrics");
                    }
                    Err(e) => {
                        source_up(&live, "server_metrics", false);
                        warn!("server metrics: {e}");
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
        tasks.push(every(c.interval, stop.clone(), move || {
            let (client, target, prompts, live, tx, store, semantic) = (
                client.clone(),
                target.clone(),
                prompts.clone(),
                live.clone(),
                tx.clone(),
                store.clone(),
                semantic.clone(),
            );
            async move {
                let mut all_ok = true;
                for canary in prompts.iter() {
                    match probe_canary(&client, &target, canary, &store, weights, semantic.as_ref()).await {
                        Ok(samples) => offer(&live, &tx, samples, "canary"),
                        Err(e) => {
                            all_ok = false;
                            warn!(canary = %canary.id, "canary probe failed: {e:#}");
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
    Ok(result.samples(now_ms(), &canary.id))
}

fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let result = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stop.changed().await;
            })
            .await;
        if let Err(e) = result {
            warn!("HTTP server stopped: {e}");
        }
    })
}

/// Feeds a trace into the pipeline; with `speed` > 0 it paces by trace time / speed.
async fn replay_trace(path: PathBuf, speed: f64, tx: mpsc::Sender<IngestJob>) -> Result<usize> {
    let (batch_tx, mut batch_rx) = mpsc::channel::<Result<Vec<omen_sources::Sample>>>(64);
    let reader = tokio::task::spawn_blocking(move || -> Result<()> {
        for batch in trace_file::batches(&path)? {
            if batch_tx.blocking_send(batch).is_err() {
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
