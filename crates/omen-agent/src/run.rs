//! `omen run`: starts the store, the pipeline thread, the sources and the HTTP
//! listeners, and shuts down cleanly on SIGINT/SIGTERM after draining the queue.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::config::Config;
use crate::engine::Engine;
use crate::http::{self, AppState};
use crate::metrics::{self, LiveMetrics};
use crate::pipeline::IngestJob;
use crate::semantic;
use crate::sources;
use omen_store::Store;

/// How long a stop waits for in-flight requests and probes before it cuts them, so that the
/// agent exits within 5 s of SIGTERM whatever its upstreams do.
pub const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

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

    /// Stops listeners and sources, drains the pipeline queue, and waits for it. Requests
    /// and probes still running after [`STOP_GRACE`] are cut (a cut push was never
    /// acknowledged); every acknowledged batch is already committed, and the open minute is
    /// flushed when the pipeline ends.
    pub async fn stop(self) -> Result<()> {
        let _ = self.shutdown.send(true);
        let deadline = tokio::time::Instant::now() + STOP_GRACE;
        let mut cut = 0;
        for s in self.servers {
            let abort = s.abort_handle();
            if tokio::time::timeout_at(deadline, s).await.is_err() {
                abort.abort();
                cut += 1;
            }
        }
        if cut > 0 {
            warn!("{cut} listener or source task(s) still busy after {STOP_GRACE:?} (a slow upstream or client): cut");
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
    let move_aside = cfg.store.on_bad_file == crate::config::OnBadStoreFile::MoveAside;
    let (store, moved) = Store::open_or_move_aside(&cfg.store.path, move_aside).map_err(|e| {
        if omen_store::bad_file(&e).is_some() {
            e.context(format!(
                "store.path: {} cannot be used; move it aside (mv it elsewhere), point store.path at a new file, \
                 or set store.on_bad_file: move_aside to have omen do that at start",
                cfg.store.path.display()
            ))
        } else {
            e
        }
    })?;
    if let Some(aside) = moved {
        warn!(
            path = %cfg.store.path.display(),
            moved_to = %aside.display(),
            "the store file was not a usable omen store: moved aside, starting a new store (store.on_bad_file: move_aside)"
        );
    }
    let store = Arc::new(store);
    info!(path = %store.path().display(), "store open");
    // Before the engine reads its first forecast inputs; a failure only costs the backfill.
    let now_ms = chrono::Utc::now().timestamp_millis();
    if let Err(e) = crate::history::backfill(&cfg, &store, now_ms).await {
        warn!("history: no backfill ({e:#}); the forecasts start from this agent's own samples");
    }
    // Before anything starts, so that a bad model folder fails start-up.
    let worker = start_worker(&cfg)?;
    let semantic = semantic::load(&cfg, worker.as_ref()).await?;
    let live = Arc::new(LiveMetrics::new());
    // Every admitted series, its anomaly score and (while a change holds) its risk, and
    // room for the engine's own gauges.
    live.set_series_limit(3 * cfg.limits.max_series + 1024);
    let registry = Arc::new(metrics::registry(live.clone()));
    // Before any source starts, so that the OTLP histograms see every latency.
    let otlp = match &cfg.otlp {
        Some(o) => {
            let client = crate::otlp::GenAiClient::new(&o.gen_ai_provider_name, cfg.sources.canary.as_ref());
            Some(crate::otlp::start(o, live.clone(), client).map_err(|e| anyhow::anyhow!("otlp: {e}"))?)
        }
        None => None,
    };
    let mut engine = Engine::new(cfg.clone(), store.clone(), live.clone())?;
    attach_model(&cfg, worker.as_ref(), &live, &mut engine)?;
    let summary = engine.summary_handle();
    let ready = Arc::new(AtomicBool::new(false));
    let (ingest_tx, ingest_rx) = mpsc::channel::<IngestJob>(cfg.http.ingest_queue);
    let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);

    let write_failure = crate::pipeline::WriteFailure::default();
    let pipeline = crate::pipeline::spawn(engine, ingest_rx, ready.clone(), write_failure.clone())?;

    let state = AppState {
        live: live.clone(),
        registry,
        store: store.clone(),
        ingest: ingest_tx.clone(),
        token: token.map(Arc::from),
        summary,
        ready,
        write_failure,
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

    let trace_done = sources::spawn_trace(&cfg, &live, &ingest_tx, &shutdown_rx, &mut servers);
    sources::spawn_live(&cfg, &store, &live, &ingest_tx, &shutdown_rx, semantic, &mut servers)?;
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
    live: &Arc<LiveMetrics>,
    engine: &mut Engine,
) -> Result<()> {
    let Some(m) = &cfg.model else {
        info!("no model section configured: running the statistical detectors only (window anomaly scores, forecasts)");
        return Ok(());
    };
    #[cfg(feature = "lstm")]
    {
        let worker = worker.context("model: no model worker was started")?.clone();
        let Some(path) = &m.path else {
            // Event time outruns training only when a trace is replayed as fast as possible;
            // beside live sources the pipeline must not wait.
            let wait = cfg.sources.trace.as_ref().is_some_and(|t| t.speed == 0.0)
                && cfg.sources.canary.is_none()
                && cfg.sources.server_metrics.is_none();
            let (trainer, model) = crate::model_training::AutoTrainer::start(
                m,
                cfg.health.interval,
                &cfg.store.path,
                worker,
                live.clone(),
                wait,
            )?;
            if model.is_none() {
                info!(
                    train_after = %humantime::format_duration(m.train_after),
                    "no model.path: the agent trains its LSTM-AE from its store once it holds model.train_after of data"
                );
            }
            if let Some(model) = model {
                engine.set_model(model);
            }
            engine.set_trainer(trainer);
            return Ok(());
        };
        let model = crate::lstm_live::LiveModel::load(worker, path, m.threads, "model.path")?;
        info!(
            path = %path.display(),
            sources = model.sources().len(),
            window = model.window(),
            "LSTM-AE model loaded in the model worker; its score joins the health score"
        );
        live.model_active.get_or_create(&vec![("origin".into(), "file".into())]).set(1);
        engine.set_model(model);
        Ok(())
    }
    #[cfg(not(feature = "lstm"))]
    {
        let _ = (engine, live, m);
        anyhow::bail!(
            "model: configured, but this omen was built without the `lstm` feature; build it with default features or remove the model section"
        )
    }
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
