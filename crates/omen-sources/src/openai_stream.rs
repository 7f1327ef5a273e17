//! The wire format of OpenAI-compatible streamed completions (SSE `data:` chunks of
//! `chat.completion.chunk` or `text_completion`), shared by the canary prober and the
//! load generator. Every field is optional and unknown fields are ignored, since vLLM,
//! SGLang, TGI and llama.cpp each send a different subset.

use std::collections::HashMap;

use serde::Deserialize;

/// One streamed chunk (`chat.completion.chunk` or `text_completion`); unknown fields are ignored.
#[derive(Debug, Deserialize)]
pub struct Chunk {
    /// The choices this chunk extends (one for n = 1; none in a usage-only chunk).
    #[serde(default)]
    pub choices: Vec<Choice>,
    /// Token counts, in the last chunk when asked for.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// An error the server reports inside the stream.
    #[serde(default)]
    pub error: Option<serde_json::Value>,
    /// The model that answered, as the server names it.
    #[serde(default)]
    pub model: Option<String>,
}

/// One choice of a chunk: a chat `delta` or a completions `text`, and its logprobs if asked for.
#[derive(Debug, Deserialize)]
pub struct Choice {
    /// Which choice this is.
    #[serde(default)]
    pub index: u32,
    /// Chat completions: the new text.
    #[serde(default)]
    pub delta: Option<Delta>,
    /// Legacy completions: the new text.
    #[serde(default)]
    pub text: Option<String>,
    /// Logprobs of this chunk's tokens, when requested.
    #[serde(default)]
    pub logprobs: Option<Logprobs>,
}

impl Choice {
    /// The text this chunk adds: the chat `delta.content`, else the completions `text`.
    pub fn new_text(&self) -> Option<&str> {
        self.delta.as_ref().and_then(|d| d.content.as_deref()).or(self.text.as_deref())
    }
}

/// The new text of a chat chunk.
#[derive(Debug, Deserialize)]
pub struct Delta {
    /// New text (absent or empty in role-only chunks).
    #[serde(default)]
    pub content: Option<String>,
}

/// Both layouts: chat (`content[]`, also what llama.cpp sends for completions) and the
/// legacy completions one (`tokens[]`, `top_logprobs[]` of token -> logprob maps).
#[derive(Debug, Deserialize)]
pub struct Logprobs {
    /// Chat layout: one entry per token.
    #[serde(default)]
    pub content: Option<Vec<TokenLogprob>>,
    /// Legacy layout: the tokens.
    #[serde(default)]
    pub tokens: Option<Vec<String>>,
    /// Legacy layout: per token, the top alternatives.
    #[serde(default)]
    pub top_logprobs: Option<Vec<LegacyTop>>,
}

/// One step of the legacy layout: token text -> logprob (absent for a masked token).
pub type LegacyTop = Option<HashMap<String, Option<f64>>>;

/// One token of the chat layout and its top alternatives.
#[derive(Debug, Deserialize)]
pub struct TokenLogprob {
    /// The top alternatives at this step.
    #[serde(default)]
    pub top_logprobs: Vec<TopLogprob>,
}

/// One alternative's logprob (absent for a masked token).
#[derive(Debug, Deserialize)]
pub struct TopLogprob {
    /// Natural-log probability.
    #[serde(default)]
    pub logprob: Option<f64>,
}

/// Token counts of the request, in the last chunk when `stream_options.include_usage` is set.
#[derive(Debug, Deserialize)]
pub struct Usage {
    /// Tokens in the prompt.
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    /// Tokens generated.
    #[serde(default)]
    pub completion_tokens: Option<u64>,
}
