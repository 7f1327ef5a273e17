//! The BERT encoder's forward pass on tch (libtorch, CPU, f32), computed as Hugging Face's
//! `BertModel` does: word + position + token-type embeddings and LayerNorm, then
//! `num_layers` post-LayerNorm transformer blocks with exact (erf) GELU. Inference only.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tch::{Device, Kind, TchError, Tensor};

use super::BertScoreError;

/// The fields of a Hugging Face BERT `config.json` the forward pass needs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BertConfig {
    /// Rows of the word-embedding table.
    pub vocab_size: i64,
    /// Width of every hidden state.
    pub hidden_size: i64,
    /// Transformer blocks in the checkpoint.
    pub num_hidden_layers: usize,
    /// Attention heads per block; divides `hidden_size`.
    pub num_attention_heads: i64,
    /// Width of the feed-forward layer.
    pub intermediate_size: i64,
    /// Longest input, tokens (rows of the position-embedding table).
    pub max_position_embeddings: i64,
    /// Rows of the token-type table.
    pub type_vocab_size: i64,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// Activation of the feed-forward layer; only "gelu" (exact) is implemented.
    #[serde(default = "default_hidden_act")]
    pub hidden_act: String,
    /// Only "absolute" position embeddings are implemented.
    #[serde(default = "default_position_embedding_type")]
    pub position_embedding_type: String,
}

fn default_hidden_act() -> String {
    "gelu".into()
}

fn default_position_embedding_type() -> String {
    "absolute".into()
}

impl BertConfig {
    /// Reads and checks `config.json`.
    pub fn load(path: &Path) -> Result<Self, BertScoreError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| BertScoreError::Read { path: path.to_owned(), source })?;
        let config: Self = serde_json::from_str(&text)
            .map_err(|e| BertScoreError::Config { path: path.to_owned(), reason: e.to_string() })?;
        let bad = |reason: String| BertScoreError::Config { path: path.to_owned(), reason };
        if config.hidden_act != "gelu" {
            return Err(bad(format!("hidden_act {:?} is not implemented; only \"gelu\"", config.hidden_act)));
        }
        if config.position_embedding_type != "absolute" {
            return Err(bad(format!(
                "position_embedding_type {:?} is not implemented; only \"absolute\"",
                config.position_embedding_type
            )));
        }
        if config.num_attention_heads <= 0 || config.hidden_size % config.num_attention_heads != 0 {
            return Err(bad(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                config.hidden_size, config.num_attention_heads
            )));
        }
        if config.num_hidden_layers == 0 {
            return Err(bad("num_hidden_layers is 0".into()));
        }
        Ok(config)
    }
}

/// `x W^T + b`.
struct Linear {
    weight: Tensor,
    bias: Tensor,
}

impl Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor, TchError> {
        x.f_linear(&self.weight, Some(&self.bias))
    }
}

/// LayerNorm over the last dimension.
struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor, TchError> {
        x.f_layer_norm(self.weight.size(), Some(&self.weight), Some(&self.bias), self.eps, false)
    }
}

/// One post-LayerNorm transformer block (`BertLayer`).
struct Block {
    query: Linear,
    key: Linear,
    value: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

impl Block {
    /// `x`: [batch, tokens, hidden]; every token attends to every token (no padding).
    fn forward(&self, x: &Tensor, heads: i64) -> Result<Tensor, TchError> {
        let (batch, tokens, hidden) = x.size3()?;
        let split = |y: Tensor| y.f_reshape([batch, tokens, heads, hidden / heads])?.f_transpose(1, 2);
        let q = split(self.query.forward(x)?)?;
        let k = split(self.key.forward(x)?)?;
        let v = split(self.value.forward(x)?)?;
        // softmax(q k^T / sqrt(head width)) v, as BertSelfAttention.
        let context = Tensor::f_scaled_dot_product_attention(
            &q,
            &k,
            &v,
            None::<Tensor>,
            0.0,
            false,
            None::<f64>,
            false,
        )?;
        let context = context.f_transpose(1, 2)?.f_reshape([batch, tokens, hidden])?;
        let attended = self.attention_norm.forward(&self.attention_out.forward(&context)?.f_add(x)?)?;
        let inner = self.intermediate.forward(&attended)?.f_gelu("none")?;
        self.output_norm.forward(&self.output.forward(&inner)?.f_add(&attended)?)
    }
}

/// A BERT encoder with its weights on the CPU.
pub struct BertEncoder {
    config: BertConfig,
    word_embeddings: Tensor,
    position_embeddings: Tensor,
    token_type_embeddings: Tensor,
    embedding_norm: LayerNorm,
    blocks: Vec<Block>,
}

/// The tensors of a safetensors file, taken out one by one with their shapes checked.
struct Checkpoint {
    path: PathBuf,
    tensors: HashMap<String, Tensor>,
}

impl Checkpoint {
    fn take(&mut self, name: &str, shape: &[i64]) -> Result<Tensor, BertScoreError> {
        let bad = |reason: String| BertScoreError::Weights { path: self.path.clone(), reason };
        let tensor = self.tensors.remove(name).ok_or_else(|| bad(format!("has no tensor {name}")))?;
        if tensor.size() != shape {
            return Err(bad(format!("{name} has shape {:?}; expected {shape:?}", tensor.size())));
        }
        tensor.f_to_kind(Kind::Float).map_err(|e| bad(format!("{name}: {e}")))
    }

    fn linear(&mut self, prefix: &str, out: i64, input: i64) -> Result<Linear, BertScoreError> {
        Ok(Linear {
            weight: self.take(&format!("{prefix}.weight"), &[out, input])?,
            bias: self.take(&format!("{prefix}.bias"), &[out])?,
        })
    }

    fn layer_norm(&mut self, prefix: &str, width: i64, eps: f64) -> Result<LayerNorm, BertScoreError> {
        Ok(LayerNorm {
            weight: self.take(&format!("{prefix}.weight"), &[width])?,
            bias: self.take(&format!("{prefix}.bias"), &[width])?,
            eps,
        })
    }
}

impl BertEncoder {
    /// Loads `BertModel` weights (names as Hugging Face saves them, optionally under `bert.`).
    pub fn load(config: BertConfig, weights: &Path) -> Result<Self, BertScoreError> {
        let tensors = Tensor::read_safetensors(weights)
            .map_err(|e| BertScoreError::Weights { path: weights.to_owned(), reason: e.to_string() })?;
        // Checkpoints of task models (BertForMaskedLM, ...) put the encoder under `bert.`.
        let tensors = tensors
            .into_iter()
            .map(|(name, t)| (name.strip_prefix("bert.").map(str::to_owned).unwrap_or(name), t))
            .collect();
        let mut ckpt = Checkpoint { path: weights.to_owned(), tensors };
        let (h, eps) = (config.hidden_size, config.layer_norm_eps);
        let word_embeddings = ckpt.take("embeddings.word_embeddings.weight", &[config.vocab_size, h])?;
        let position_embeddings =
            ckpt.take("embeddings.position_embeddings.weight", &[config.max_position_embeddings, h])?;
        let token_type_embeddings =
            ckpt.take("embeddings.token_type_embeddings.weight", &[config.type_vocab_size, h])?;
        let embedding_norm = ckpt.layer_norm("embeddings.LayerNorm", h, eps)?;
        let mut blocks = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            blocks.push(Block {
                query: ckpt.linear(&format!("{p}.attention.self.query"), h, h)?,
                key: ckpt.linear(&format!("{p}.attention.self.key"), h, h)?,
                value: ckpt.linear(&format!("{p}.attention.self.value"), h, h)?,
                attention_out: ckpt.linear(&format!("{p}.attention.output.dense"), h, h)?,
                attention_norm: ckpt.layer_norm(&format!("{p}.attention.output.LayerNorm"), h, eps)?,
                intermediate: ckpt.linear(&format!("{p}.intermediate.dense"), config.intermediate_size, h)?,
                output: ckpt.linear(&format!("{p}.output.dense"), h, config.intermediate_size)?,
                output_norm: ckpt.layer_norm(&format!("{p}.output.LayerNorm"), h, eps)?,
            });
        }
        Ok(Self {
            config,
            word_embeddings,
            position_embeddings,
            token_type_embeddings,
            embedding_norm,
            blocks,
        })
    }

    /// The checkpoint's configuration.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// Hidden states after block `num_layers` (1-based; 0 = the embeddings) for one
    /// sequence of token ids, all of token type 0: a [tokens, hidden] tensor.
    pub fn hidden_states(&self, ids: &[u32], num_layers: usize) -> Result<Tensor, TchError> {
        let _no_grad = tch::no_grad_guard();
        let ids: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
        let tokens = ids.len() as i64;
        let ids = Tensor::f_from_slice(&ids)?.f_unsqueeze(0)?;
        let positions = Tensor::f_arange(tokens, (Kind::Int64, Device::Cpu))?.f_unsqueeze(0)?;
        let types = positions.f_zeros_like()?;
        let embedded = Tensor::f_embedding(&self.word_embeddings, &ids, -1, false, false)?
            .f_add(&Tensor::f_embedding(&self.position_embeddings, &positions, -1, false, false)?)?
            .f_add(&Tensor::f_embedding(&self.token_type_embeddings, &types, -1, false, false)?)?;
        let mut x = self.embedding_norm.forward(&embedded)?;
        for block in &self.blocks[..num_layers.min(self.blocks.len())] {
            x = block.forward(&x, self.config.num_attention_heads)?;
        }
        x.f_squeeze_dim(0)
    }
}
