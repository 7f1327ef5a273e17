//! The canaries' semantic similarity: BERTScore F1 of an answer against its reference
//! (omen-model, all-MiniLM-L6-v2 on tch, run by the model worker: worker.rs), loaded once
//! at start-up from `sources.canary.bertscore_model_dir`. Without it, or in a build
//! without the `bertscore` feature, RCI drops its semantic part and renormalises the
//! other weights.

use std::sync::Arc;

use anyhow::Result;
use tracing::info;

use crate::config::Config;

/// The BERTScore model, loaded in the model worker and shared by the probes.
#[cfg(feature = "bertscore")]
pub struct SemanticModel(Arc<crate::worker::Worker>);

/// This build has no BERTScore code, so no model can exist.
#[cfg(not(feature = "bertscore"))]
pub enum SemanticModel {}

/// Loads the model the config names into `worker` (`None`, logged once, when none is configured).
pub async fn load(
    cfg: &Config,
    #[cfg_attr(not(feature = "bertscore"), allow(unused_variables))] worker: Option<
        &Arc<crate::worker::Worker>,
    >,
) -> Result<Option<Arc<SemanticModel>>> {
    let Some(dir) = cfg.sources.canary.as_ref().and_then(|c| c.bertscore_model_dir.clone()) else {
        if cfg.sources.canary.is_some() {
            info!(
                "BERTScore is off (sources.canary.bertscore_model_dir is not set): canary RCI uses BLEU and \
                 repetition with renormalised weights"
            );
        }
        return Ok(None);
    };
    load_dir(dir, worker, "sources.canary.bertscore_model_dir").await.map(Some)
}

/// Loads the BERTScore model in `dir` into `worker`; errors name `field` (the config key or
/// flag that gave the folder).
pub async fn load_dir(
    dir: std::path::PathBuf,
    #[cfg_attr(not(feature = "bertscore"), allow(unused_variables))] worker: Option<
        &Arc<crate::worker::Worker>,
    >,
    field: &str,
) -> Result<Arc<SemanticModel>> {
    #[cfg(feature = "bertscore")]
    {
        use anyhow::Context;
        let worker = worker.context(format!("{field}: no model worker was started"))?.clone();
        let started = std::time::Instant::now();
        let shown = dir.display().to_string();
        // A sidecar shares its node with the inference server: one libtorch thread, unless the
        // operator sets OMP_NUM_THREADS (spinning OpenMP threads on busy cores cost ~15x).
        let threads = std::env::var("OMP_NUM_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
        let w = worker.clone();
        let reply = tokio::task::spawn_blocking(move || {
            w.load(crate::worker::Request::LoadBertscore { dir, threads })
        })
        .await
        .context("BERTScore loading task")?
        .with_context(|| format!("{field}: {shown}"))?;
        let crate::worker::Reply::BertscoreLoaded { layers } = reply else {
            return Err(crate::worker::WorkerError::unexpected("load_bertscore", reply))
                .with_context(|| format!("{field}: {shown}"));
        };
        info!(
            model_dir = %shown,
            layer = layers,
            threads,
            load_ms = started.elapsed().as_millis() as u64,
            "BERTScore on: canary RCI includes 1 - BERTScore F1"
        );
        Ok(Arc::new(SemanticModel(worker)))
    }
    #[cfg(not(feature = "bertscore"))]
    anyhow::bail!(
        "{field}: {} is set, but this omen was built without the `bertscore` feature; rebuild with \
         default features or remove it",
        dir.display()
    )
}

impl SemanticModel {
    /// BERTScore F1 in [0, 1] of `answer` against `reference`, computed by the worker.
    #[cfg(feature = "bertscore")]
    pub async fn f1(self: &Arc<Self>, answer: String, reference: String) -> Result<f64> {
        use anyhow::Context;
        let model = self.clone();
        let reply = tokio::task::spawn_blocking(move || {
            model.0.call(&crate::worker::Request::BertscoreF1 { answer, reference })
        })
        .await
        .context("BERTScore task")?
        .context("BERTScore of the canary answer")?;
        match reply {
            crate::worker::Reply::BertscoreF1 { f1 } => Ok(f1),
            other => Err(crate::worker::WorkerError::unexpected("bertscore_f1", other).into()),
        }
    }

    /// Never called: no model exists in this build.
    #[cfg(not(feature = "bertscore"))]
    pub async fn f1(self: &Arc<Self>, _answer: String, _reference: String) -> Result<f64> {
        match **self {}
    }
}
