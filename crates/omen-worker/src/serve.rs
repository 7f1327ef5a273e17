//! `omen-worker serve`: one request per stdin line, one reply per stdout line, in order
//! (the protocol is omen_protocol::worker's). A request that fails gets an `error` reply and
//! the worker goes on; end of input (the agent exited) ends it.

use std::collections::VecDeque;
use std::io::{BufRead, Write};

use anyhow::{Context, Result};
use omen_model::bertscore::BertScorer;
use omen_model::features::FeatureBuilder;
use omen_model::lstm_ae::{self, LstmAutoencoder};
use omen_protocol::worker::{Reply, Request};
use omen_signals::rci::SemanticSimilarity;

/// An LSTM-AE model with its streaming feature state.
struct Lstm {
    model: LstmAutoencoder,
    builder: FeatureBuilder,
    rows: VecDeque<Vec<f64>>,
}

/// What the worker has loaded.
#[derive(Default)]
pub struct Models {
    lstm: Option<Lstm>,
    bertscore: Option<BertScorer>,
}

impl Models {
    /// Answers one request; errors become `error` replies.
    pub fn handle(&mut self, request: Request) -> Reply {
        self.try_handle(request).unwrap_or_else(|e| Reply::Error { message: format!("{e:#}") })
    }

    fn try_handle(&mut self, request: Request) -> Result<Reply> {
        Ok(match request {
            Request::LoadLstm { path, threads } => {
                lstm_ae::set_threads(threads);
                let model = LstmAutoencoder::load(&path)?;
                let builder = model.meta.features.builder();
                let reply = Reply::LstmLoaded {
                    sources: model.meta.features.sources.clone(),
                    window: model.window(),
                };
                self.lstm = Some(Lstm { model, builder, rows: VecDeque::new() });
                reply
            }
            Request::LstmTick { raw } => {
                let l = self.lstm.as_mut().context("no LSTM-AE model is loaded; send load_lstm first")?;
                let row = l.builder.push(&raw)?;
                l.rows.push_back(row);
                if l.rows.len() > l.model.window() {
                    l.rows.pop_front();
                }
                if l.rows.len() < l.model.window() {
                    Reply::LstmFilling
                } else {
                    let window: Vec<Vec<f64>> = l.rows.iter().cloned().collect();
                    let (error, contributions) = l.model.score_window_by_source(&window)?;
                    Reply::LstmScored { error, severity: l.model.severity(error), contributions }
                }
            }
            Request::LoadBertscore { dir, threads } => {
                let scorer = BertScorer::load(&dir)?.with_threads(threads);
                let reply = Reply::BertscoreLoaded { layers: scorer.num_layers() };
                self.bertscore = Some(scorer);
                reply
            }
            Request::BertscoreF1 { answer, reference } => {
                let s = self
                    .bertscore
                    .as_ref()
                    .context("no BERTScore model is loaded; send load_bertscore first")?;
                Reply::BertscoreF1 { f1: s.f1(&answer, &reference)? }
            }
        })
    }
}

/// Serves requests from `input` until it ends.
pub fn serve(input: impl BufRead, mut output: impl Write) -> Result<()> {
    let mut models = Models::default();
    for line in input.lines() {
        let line = line.context("reading a request from stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Request>(&line) {
            Ok(request) => models.handle(request),
            Err(e) => Reply::Error {
                message: format!("the model worker cannot read the request ({e}); omen and omen-worker must come from the same build"),
            },
        };
        let mut text = serde_json::to_string(&reply).context("encoding a reply")?;
        text.push('\n');
        output
            .write_all(text.as_bytes())
            .and_then(|()| output.flush())
            .context("writing a reply to stdout")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replies(input: &str) -> Vec<Reply> {
        let mut out = Vec::new();
        serve(input.as_bytes(), &mut out).unwrap();
        String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    #[test]
    fn requests_before_a_load_and_bad_lines_get_errors_and_the_worker_goes_on() {
        let r = replies("{\"lstm_tick\":{\"raw\":[1.0]}}\nnot json\n\n{\"bertscore_f1\":{\"answer\":\"a\",\"reference\":\"b\"}}\n");
        assert_eq!(r.len(), 3);
        let msg = |r: &Reply| match r {
            Reply::Error { message } => message.clone(),
            other => panic!("{other:?}"),
        };
        assert!(msg(&r[0]).contains("load_lstm"), "{r:?}");
        assert!(msg(&r[1]).contains("cannot read the request"), "{r:?}");
        assert!(msg(&r[2]).contains("load_bertscore"), "{r:?}");
    }

    #[test]
    fn a_missing_model_file_is_named() {
        let r = replies("{\"load_lstm\":{\"path\":\"/nonexistent/model.ot\",\"threads\":1}}\n");
        let Reply::Error { message } = &r[0] else { panic!("{r:?}") };
        assert!(message.contains("/nonexistent/model.ot"), "{message}");
    }
}
