//! BERTScore's greedy matching over a token-by-token cosine-similarity matrix, as
//! `bert_score.utils.greedy_cos_idf` computes it without idf: every token's best match
//! is searched among all tokens of the other side ([CLS] and [SEP] included), and the
//! mean over a side skips its [CLS]/[SEP] (bert_score gives them idf weight 0).

/// BERTScore of a candidate against a reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BertScore {
    /// Mean over candidate tokens of the best cosine to a reference token.
    pub precision: f64,
    /// Mean over reference tokens of the best cosine to a candidate token.
    pub recall: f64,
    /// Harmonic mean of precision and recall (0 where both are 0).
    pub f1: f64,
}

/// Cosine similarities, row-major: `rows` candidate tokens by `cols` reference tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Similarities {
    /// `rows * cols` values; entry (i, j) at `i * cols + j`.
    pub values: Vec<f32>,
    /// Candidate tokens.
    pub rows: usize,
    /// Reference tokens.
    pub cols: usize,
}

impl Similarities {
    fn at(&self, i: usize, j: usize) -> f32 {
        self.values[i * self.cols + j]
    }
}

/// Greedy-matching P, R and F1; `*_counted[i]` says whether token i enters its side's mean
/// (false for [CLS]/[SEP]). A side with no counted token scores P = R = F1 = 0, as
/// bert_score does for an empty sentence.
pub fn greedy_match(sim: &Similarities, candidate_counted: &[bool], reference_counted: &[bool]) -> BertScore {
    assert_eq!(sim.values.len(), sim.rows * sim.cols, "similarity matrix size");
    assert_eq!(candidate_counted.len(), sim.rows, "one flag per candidate token");
    assert_eq!(reference_counted.len(), sim.cols, "one flag per reference token");
    let zero = BertScore { precision: 0.0, recall: 0.0, f1: 0.0 };
    let (n_cand, n_ref) =
        (candidate_counted.iter().filter(|&&c| c).count(), reference_counted.iter().filter(|&&c| c).count());
    if n_cand == 0 || n_ref == 0 {
        return zero;
    }
    let best_in_row = |i: usize| (0..sim.cols).map(|j| sim.at(i, j)).fold(f32::NEG_INFINITY, f32::max);
    let best_in_col = |j: usize| (0..sim.rows).map(|i| sim.at(i, j)).fold(f32::NEG_INFINITY, f32::max);
    let precision =
        (0..sim.rows).filter(|&i| candidate_counted[i]).map(|i| f64::from(best_in_row(i))).sum::<f64>()
            / n_cand as f64;
    let recall =
        (0..sim.cols).filter(|&j| reference_counted[j]).map(|j| f64::from(best_in_col(j))).sum::<f64>()
            / n_ref as f64;
    let f1 = 2.0 * precision * recall / (precision + recall);
    // bert_score maps the NaN of P + R = 0 to 0.
    BertScore { precision, recall, f1: if f1.is_nan() { 0.0 } else { f1 } }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn unit_rows(raw: &[Vec<f32>]) -> Vec<Vec<f32>> {
        raw.iter()
            .map(|v| {
                let n = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
                v.iter().map(|x| x / n).collect()
            })
            .collect()
    }

    fn cosines(a: &[Vec<f32>], b: &[Vec<f32>]) -> Similarities {
        let values =
            a.iter().flat_map(|x| b.iter().map(move |y| x.iter().zip(y).map(|(p, q)| p * q).sum())).collect();
        Similarities { values, rows: a.len(), cols: b.len() }
    }

    fn transpose(s: &Similarities) -> Similarities {
        let values = (0..s.cols).flat_map(|j| (0..s.rows).map(move |i| s.at(i, j))).collect();
        Similarities { values, rows: s.cols, cols: s.rows }
    }

    #[test]
    fn hand_worked_example() {
        // candidate tokens [CLS] a b [SEP]; reference [CLS] c [SEP]
        let sim = Similarities {
            values: vec![
                1.0, 0.1, 0.2, //
                0.3, 0.8, 0.0, //
                0.9, 0.4, 0.1, // b's best match is the reference's [CLS]
                0.2, 0.1, 1.0,
            ],
            rows: 4,
            cols: 3,
        };
        let s = greedy_match(&sim, &[false, true, true, false], &[false, true, false]);
        assert!((s.precision - (0.8 + 0.9) / 2.0).abs() < 1e-7, "{s:?}");
        assert!((s.recall - 0.8).abs() < 1e-7, "{s:?}");
        let f1 = 2.0 * s.precision * s.recall / (s.precision + s.recall);
        assert!((s.f1 - f1).abs() < 1e-12);
    }

    #[test]
    fn a_side_without_counted_tokens_scores_zero() {
        let sim = Similarities { values: vec![1.0; 6], rows: 2, cols: 3 };
        let s = greedy_match(&sim, &[false, false], &[false, true, false]);
        assert_eq!(s, BertScore { precision: 0.0, recall: 0.0, f1: 0.0 });
    }

    fn embeddings(max_tokens: usize) -> impl Strategy<Value = Vec<Vec<f32>>> {
        prop::collection::vec(prop::collection::vec(-1.0f32..1.0, 4), 1..max_tokens)
    }

    proptest! {
        #[test]
        fn identical_sides_score_one(raw in embeddings(12)) {
            let e = unit_rows(&raw);
            let counted = vec![true; e.len()];
            let s = greedy_match(&cosines(&e, &e), &counted, &counted);
            prop_assert!((s.precision - 1.0).abs() < 1e-5 && (s.recall - 1.0).abs() < 1e-5, "{:?}", s);
            prop_assert!((s.f1 - 1.0).abs() < 1e-5);
        }

        #[test]
        fn swapping_sides_swaps_precision_and_recall(a in embeddings(10), b in embeddings(10)) {
            let (a, b) = (unit_rows(&a), unit_rows(&b));
            let (ca, cb) = (vec![true; a.len()], vec![true; b.len()]);
            let sim = cosines(&a, &b);
            let ab = greedy_match(&sim, &ca, &cb);
            let ba = greedy_match(&transpose(&sim), &cb, &ca);
            prop_assert!((ab.precision - ba.recall).abs() < 1e-12 && (ab.recall - ba.precision).abs() < 1e-12);
            prop_assert!((ab.f1 - ba.f1).abs() < 1e-12);
        }

        #[test]
        fn scores_are_cosines_and_f1_lies_between_p_and_r(a in embeddings(10), b in embeddings(10)) {
            let (a, b) = (unit_rows(&a), unit_rows(&b));
            let s = greedy_match(&cosines(&a, &b), &vec![true; a.len()], &vec![true; b.len()]);
            prop_assert!((-1.0 - 1e-5..=1.0 + 1e-5).contains(&s.precision));
            prop_assert!((-1.0 - 1e-5..=1.0 + 1e-5).contains(&s.recall));
            if s.precision > 0.0 && s.recall > 0.0 {
                prop_assert!(s.f1 >= s.precision.min(s.recall) - 1e-12 && s.f1 <= s.precision.max(s.recall) + 1e-12);
            }
        }

        #[test]
        fn adding_reference_tokens_never_lowers_precision(a in embeddings(8), b in embeddings(8), extra in embeddings(4)) {
            // every candidate token keeps its old best match as a choice
            let (a, b, extra) = (unit_rows(&a), unit_rows(&b), unit_rows(&extra));
            let more: Vec<Vec<f32>> = b.iter().chain(&extra).cloned().collect();
            let ca = vec![true; a.len()];
            let before = greedy_match(&cosines(&a, &b), &ca, &vec![true; b.len()]);
            let after = greedy_match(&cosines(&a, &more), &ca, &vec![true; more.len()]);
            prop_assert!(after.precision >= before.precision - 1e-12);
        }
    }
}
