//! The canaries' semantic similarity: BERTScore F1 of an answer against its reference
//! (omen-model, all-MiniLM-L6-v2 on tch), loaded once at start-up from
//! `sources.canary.bertscore_model_dir`. Without it, or in a build without the
//! `bertscore` feature, RCI drops its semantic part and renormalises the other weights.

use std::sync::Arc;

use anyhow::Result;
use tracing::info;

use crate::config::Config;

/// The loaded BERTScore model, shared by the probes; the encoder runs on a blocking thread.
#[cfg(feature = "bertscore")]
pub struct SemanticModel(std::sync::Mutex<omen_model::bertscore::BertScorer>);

/// This build has no BERTScore code, so no model can exist.
#[cfg(not(feature = "bertscore"))]
pub enum SemanticModel {}

/// Loads the model the config names (`None`, logged once, when none is configured).
pub async fn load(cfg: &Config) -> Result<Option<Arc<SemanticModel>>> {
    let Some(canary) = &cfg.sources.canary else {
        return Ok(None);
    };
    let Some(dir) = canary.bertscore_model_dir.clone() else {
        info!(
            "BERTScore is off (sources.canary.bertscore_model_dir is not set): canary RCI uses BLEU and \
             repetition with renormalised weights"
        );
        return Ok(None);
    };
    load_dir(dir).await.map(|m| Some(Arc::new(m)))
}

#[cfg(feature = "bertscore")]
async fn load_dir(dir: std::path::PathBuf) -> Result<SemanticModel> {
    use anyhow::Context;
    let started = std::time::Instant::now();
    let shown = dir.display().to_string();
    let scorer = tokio::task::spawn_blocking(move || omen_model::bertscore::BertScorer::load(&dir))
        .await
        .context("BERTScore loading task")?
        .with_context(|| format!("sources.canary.bertscore_model_dir: {shown}"))?;
    // A sidecar shares its node with the inference server: one libtorch thread, unless the
    // operator sets OMP_NUM_THREADS (spinning OpenMP threads on busy cores cost ~15x).
    let threads = std::env::var("OMP_NUM_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let scorer = scorer.with_threads(threads);
    info!(
        model_dir = %shown,
        layer = scorer.num_layers(),
        threads,
        load_ms = started.elapsed().as_millis() as u64,
        "BERTScore on: canary RCI includes 1 - BERTScore F1"
    );
    Ok(SemanticModel(std::sync::Mutex::new(scorer)))
}

#[cfg(not(feature = "bertscore"))]
async fn load_dir(_dir: std::path::PathBuf) -> Result<SemanticModel> {
    anyhow::bail!(
        "sources.canary.bertscore_model_dir: this omen was built without the `bertscore` feature; \
         rebuild with default features or remove the key"
    )
}

impl SemanticModel {
    /// BERTScore F1 in [0, 1] of `answer` against `reference`, computed on a blocking thread.
    #[cfg(feature = "bertscore")]
    pub async fn f1(self: &Arc<Self>, answer: String, reference: String) -> Result<f64> {
        use anyhow::Context;
        use omen_signals::rci::SemanticSimilarity;
        let model = self.clone();
        tokio::task::spawn_blocking(move || {
            // A panic in another probe's forward pass leaves the model intact (it is read-only).
            let scorer = model.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            scorer.f1(&answer, &reference)
        })
        .await
        .context("BERTScore task")?
        .context("BERTScore of the canary answer")
    }

    /// Never called: no model exists in this build.
    #[cfg(not(feature = "bertscore"))]
    pub async fn f1(self: &Arc<Self>, _answer: String, _reference: String) -> Result<f64> {
        match **self {}
    }
}
