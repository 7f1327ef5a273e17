//! RCI, the consistency decay index in [0, 1] (higher is worse):
//! RCI = a (1 - BLEU) + b (1 - BERTScore F1) + c RepetitionRatio, a + b + c = 1.

use std::sync::Arc;

use crate::bleu::{BleuReference, BleuScore, StreamingBleu};
use crate::{invalid, SignalError};

/// Weights a, b, c of the three RCI parts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RciWeights {
    /// a: weight of 1 - BLEU.
    pub bleu: f64,
    /// b: weight of 1 - BERTScore F1.
    pub semantic: f64,
    /// c: weight of the repetition ratio.
    pub repetition: f64,
}

impl Default for RciWeights {
    fn default() -> Self {
        Self { bleu: 0.4, semantic: 0.4, repetition: 0.2 }
    }
}

impl RciWeights {
    /// Tolerance on a + b + c = 1, for weights typed as decimals in a config file.
    const SUM_TOLERANCE: f64 = 1e-6;

    /// Validated weights: each in [0, 1] and summing to 1.
    pub fn new(bleu: f64, semantic: f64, repetition: f64) -> Result<Self, SignalError> {
        for (name, w) in [
            ("rci.weights.bleu", bleu),
            ("rci.weights.semantic", semantic),
            ("rci.weights.repetition", repetition),
        ] {
            if !(0.0..=1.0).contains(&w) {
                return Err(invalid(name, w, "each weight must be in [0, 1]"));
            }
        }
        let sum = bleu + semantic + repetition;
        if (sum - 1.0).abs() > Self::SUM_TOLERANCE {
            return Err(invalid(
                "rci.weights",
                format!("{bleu} + {semantic} + {repetition} = {sum}"),
                "the weights must sum to 1",
            ));
        }
        Ok(Self { bleu, semantic, repetition })
    }

    /// Weights with the semantic part dropped and a, c rescaled to sum to 1 (no embedding model).
    pub fn without_semantic(&self) -> Self {
        let rest = self.bleu + self.repetition;
        if rest == 0.0 {
            // Only the semantic part had weight: fall back to BLEU alone.
            return Self { bleu: 1.0, semantic: 0.0, repetition: 0.0 };
        }
        Self { bleu: self.bleu / rest, semantic: 0.0, repetition: self.repetition / rest }
    }
}

/// The measured parts of RCI for one answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RciParts {
    /// Sentence BLEU as a fraction in [0, 1].
    pub bleu: f64,
    /// BERTScore F1 in [0, 1]; `None` when no semantic model is configured.
    pub semantic_f1: Option<f64>,
    /// 1 - distinct 3-grams / total 3-grams of the answer's 13a tokens.
    pub repetition_ratio: f64,
}

/// An RCI value with the parts and the weights actually applied.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rci {
    /// RCI in [0, 1], higher is worse.
    pub value: f64,
    /// The parts it was computed from.
    pub parts: RciParts,
    /// The weights applied (renormalised when the semantic part is absent).
    pub weights: RciWeights,
}

/// A semantic similarity between an answer and its reference, in [0, 1] (BERTScore F1).
pub trait SemanticSimilarity {
    /// Error type of the model behind the score.
    type Error: std::error::Error + Send + Sync + 'static;
    /// F1 similarity of `candidate` to `reference`.
    fn f1(&self, candidate: &str, reference: &str) -> Result<f64, Self::Error>;
}

/// Combines RCI parts with `weights`; without a semantic score the weights are renormalised.
pub fn consistency_decay_index(parts: RciParts, weights: RciWeights) -> Result<Rci, SignalError> {
    for (name, v) in [
        ("bleu", Some(parts.bleu)),
        ("semantic_f1", parts.semantic_f1),
        ("repetition_ratio", Some(parts.repetition_ratio)),
    ] {
        if let Some(v) = v {
            if !(0.0..=1.0).contains(&v) {
                return Err(invalid(name, v, "RCI parts must be in [0, 1]"));
            }
        }
    }
    let (weights, semantic_term) = match parts.semantic_f1 {
        Some(f1) => (weights, weights.semantic * (1.0 - f1)),
        None => (weights.without_semantic(), 0.0),
    };
    let value =
        weights.bleu * (1.0 - parts.bleu) + semantic_term + weights.repetition * parts.repetition_ratio;
    Ok(Rci { value: value.clamp(0.0, 1.0), parts, weights })
}

/// 1 - distinct 3-grams / total 3-grams; 0 for fewer than three tokens.
pub fn repetition_ratio<S: AsRef<str>>(tokens: &[S]) -> f64 {
    if tokens.len() < 3 {
        return 0.0;
    }
    let total = tokens.len() - 2;
    let distinct: foldhash::HashSet<[&str; 3]> =
        tokens.windows(3).map(|w| [w[0].as_ref(), w[1].as_ref(), w[2].as_ref()]).collect();
    1.0 - distinct.len() as f64 / total as f64
}

/// BLEU and repetition parts of RCI for a finished answer (batch form).
pub fn lexical_parts(answer: &str, reference: &BleuReference) -> (BleuScore, f64) {
    let tokens = reference.tokenizer().tokenize(answer);
    let bleu = reference.stats_for_tokens(&tokens).score();
    (bleu, repetition_ratio(&tokens))
}

/// Streaming RCI: BLEU counts and repetition updated per streamed token in O(1) amortised.
///
/// The semantic part needs the whole answer, so it joins at [`StreamingRci::finish`].
#[derive(Debug, Clone)]
pub struct StreamingRci {
    bleu: StreamingBleu,
    weights: RciWeights,
}

impl StreamingRci {
    /// Starts scoring one answer against a prepared reference.
    pub fn new(reference: Arc<BleuReference>, weights: RciWeights) -> Self {
        Self { bleu: StreamingBleu::new(reference), weights }
    }

    /// Appends one streamed token's text.
    pub fn push_token(&mut self, text: &str) {
        self.bleu.push(text);
    }

    /// Lexical parts so far (BLEU fraction, repetition ratio).
    pub fn lexical(&mut self) -> (BleuScore, f64) {
        self.bleu.score_and_repetition()
    }

    /// RCI of the answer so far with an optional semantic F1 (BERTScore) for the whole answer.
    pub fn finish(&mut self, semantic_f1: Option<f64>) -> Result<Rci, SignalError> {
        let (bleu, repetition_ratio) = self.lexical();
        consistency_decay_index(
            RciParts { bleu: bleu.fraction(), semantic_f1, repetition_ratio },
            self.weights,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn weights_are_validated() {
        assert!(RciWeights::new(0.4, 0.4, 0.2).is_ok());
        assert!(RciWeights::new(0.5, 0.5, 0.2).is_err());
        assert!(RciWeights::new(-0.1, 0.9, 0.2).is_err());
        let w = RciWeights::default().without_semantic();
        assert!((w.bleu - 2.0 / 3.0).abs() < 1e-12 && (w.repetition - 1.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn perfect_answer_has_zero_rci() {
        let reference = Arc::new(BleuReference::new(&["Paris is the capital of France."]).unwrap());
        let mut s = StreamingRci::new(reference, RciWeights::default());
        for t in ["Paris", " is", " the", " capital", " of", " France", "."] {
            s.push_token(t);
        }
        let rci = s.finish(Some(1.0)).unwrap();
        assert!(rci.value.abs() < 1e-12, "{rci:?}");
    }

    #[test]
    fn repetition_of_a_loop() {
        let toks: Vec<String> = "a b c a b c a b c".split(' ').map(String::from).collect();
        // 7 trigrams, 3 distinct
        assert!((repetition_ratio(&toks) - (1.0 - 3.0 / 7.0)).abs() < 1e-12);
        assert_eq!(repetition_ratio(&["a", "b"]), 0.0);
    }

    #[test]
    fn parts_out_of_range_are_rejected() {
        let p = RciParts { bleu: 1.5, semantic_f1: None, repetition_ratio: 0.0 };
        assert!(consistency_decay_index(p, RciWeights::default()).is_err());
    }

    proptest! {
        #[test]
        fn rci_is_in_unit_interval(bleu in 0.0f64..=1.0, f1 in prop::option::of(0.0f64..=1.0), rep in 0.0f64..=1.0,
                                   a in 0.0f64..1.0, b in 0.0f64..1.0) {
            let (a, b) = if a + b > 1.0 { (a / 2.0, b / 2.0) } else { (a, b) };
            let w = RciWeights::new(a, b, 1.0 - a - b).unwrap();
            let r = consistency_decay_index(RciParts { bleu, semantic_f1: f1, repetition_ratio: rep }, w).unwrap();
            prop_assert!((0.0..=1.0).contains(&r.value));
        }

        #[test]
        fn reading_after_every_token_equals_batch_of_the_prefix(words in prop::collection::vec(prop::sample::select(vec![
            "Paris", "is", "the", "capital", "of", "France", ".", ",", "3.5", "it", "-", "\n", "(", "x"]), 1..60)) {
            let reference = Arc::new(BleuReference::new(&["Paris is the capital of France, it is."]).unwrap());
            let mut s = StreamingRci::new(reference.clone(), RciWeights::default());
            let mut text = String::new();
            for (i, w) in words.iter().enumerate() {
                let piece = if i == 0 { w.to_string() } else { format!(" {w}") };
                s.push_token(&piece);
                text.push_str(&piece);
                let (bleu, rep) = s.lexical();
                let (bleu_b, rep_b) = lexical_parts(&text, &reference);
                prop_assert_eq!(bleu.score.to_bits(), bleu_b.score.to_bits(), "text {:?}", text);
                prop_assert_eq!(rep.to_bits(), rep_b.to_bits(), "text {:?}", text);
            }
        }

        #[test]
        fn streaming_lexical_equals_batch(words in prop::collection::vec(prop::sample::select(vec![
            "Paris", "is", "the", "capital", "of", "France", ".", ",", "3.5", "it", "is", "-", "\n"]), 0..80)) {
            let reference = Arc::new(BleuReference::new(&["Paris is the capital of France, it is."]).unwrap());
            let text = words.join(" ");
            let mut s = StreamingRci::new(reference.clone(), RciWeights::default());
            for (i, w) in words.iter().enumerate() {
                s.push_token(&if i == 0 { w.to_string() } else { format!(" {w}") });
            }
            let (bleu, rep) = s.lexical();
            let (bleu_b, rep_b) = lexical_parts(&text, &reference);
            prop_assert_eq!(bleu.score.to_bits(), bleu_b.score.to_bits());
            prop_assert_eq!(rep.to_bits(), rep_b.to_bits());
        }
    }
}
