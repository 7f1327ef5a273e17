//! omen-signals against vectors computed by sacreBLEU, numpy, pandas and scipy
//! (scripts/gen_reference_vectors.py writes tests/fixtures/*.json).

use std::sync::Arc;

use omen_signals::bleu::{BleuReference, StreamingBleu, Tokenizer13a};
use omen_signals::{
    first_token_entropy_bits, first_token_entropy_from_top_logprobs, quantile_linear, repetition_ratio,
    sentence_bleu, theil_sen, WindowAnomaly, SKEW_WEIGHT, STD_EPSILON,
};
use serde::Deserialize;

fn fixture<T: for<'de> Deserialize<'de>>(name: &str) -> T {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}; run `make fixtures`"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[derive(Deserialize)]
struct BleuFile {
    cases: Vec<BleuCase>,
}

#[derive(Deserialize)]
struct BleuCase {
    hypothesis: String,
    references: Vec<String>,
    score: f64,
    precisions: Vec<f64>,
    brevity_penalty: f64,
    sys_len: usize,
    ref_len: usize,
    counts: Vec<u64>,
    totals: Vec<u64>,
    hypothesis_tokens: Vec<String>,
    repetition_ratio: f64,
}

#[test]
fn bleu_matches_sacrebleu_sentence_bleu() {
    let file: BleuFile = fixture("bleu.json");
    assert!(file.cases.len() > 400);
    let tokenizer = Tokenizer13a::new();
    for case in &file.cases {
        let ctx = format!("hyp {:?} refs {:?}", case.hypothesis, case.references);
        assert_eq!(tokenizer.tokenize(&case.hypothesis), case.hypothesis_tokens, "{ctx}");
        let s = sentence_bleu(&case.hypothesis, &case.references).unwrap();
        assert!((s.score - case.score).abs() <= 1e-6, "{ctx}: {} vs {}", s.score, case.score);
        assert!((s.fraction() - (case.score / 100.0).min(1.0)).abs() <= 1e-6, "{ctx}");
        assert!((s.brevity_penalty - case.brevity_penalty).abs() <= 1e-12, "{ctx}");
        for n in 0..4 {
            assert!((s.precisions[n] - case.precisions[n]).abs() <= 1e-9, "{ctx}: p{n}");
        }
        assert_eq!((s.stats.sys_len, s.stats.ref_len), (case.sys_len, case.ref_len), "{ctx}");
        assert_eq!(s.stats.correct.to_vec(), case.counts, "{ctx}");
        assert_eq!(s.stats.total.to_vec(), case.totals, "{ctx}");
        assert_eq!(repetition_ratio(&case.hypothesis_tokens), case.repetition_ratio, "{ctx}");
    }
}

#[test]
fn streaming_bleu_equals_sacrebleu_for_every_split() {
    let file: BleuFile = fixture("bleu.json");
    for case in file.cases.iter().take(200) {
        let reference = Arc::new(BleuReference::new(&case.references).unwrap());
        let chars: Vec<char> = case.hypothesis.chars().collect();
        // one character per push: the hardest split for the streaming pipeline
        let mut streaming = StreamingBleu::new(reference.clone());
        for c in &chars {
            streaming.push(&c.to_string());
        }
        let (s, rep) = streaming.score_and_repetition();
        assert!((s.score - case.score).abs() <= 1e-6, "{:?}: {} vs {}", case.hypothesis, s.score, case.score);
        assert_eq!(rep, case.repetition_ratio, "{:?}", case.hypothesis);
        // and a coarse split, reading the score in between
        let mut streaming = StreamingBleu::new(reference);
        for piece in chars.chunks(3) {
            streaming.push(&piece.iter().collect::<String>());
            let _ = streaming.score();
        }
        assert!((streaming.score().score - case.score).abs() <= 1e-6, "{:?}", case.hypothesis);
    }
}

#[derive(Deserialize)]
struct TleFile {
    full: Vec<FullCase>,
    topk: Vec<TopKCase>,
}

#[derive(Deserialize)]
struct FullCase {
    name: String,
    logits: Vec<Option<f64>>,
    entropy_bits: f64,
}

#[derive(Deserialize)]
struct TopKCase {
    vocab_size: usize,
    logprobs: Vec<f64>,
    known_mass: f64,
    residual_mass: f64,
    lower_bits: f64,
    upper_bits: f64,
    true_entropy_bits: f64,
}

#[test]
fn tle_matches_numpy_softmax_entropy() {
    let file: TleFile = fixture("tle.json");
    for case in &file.full {
        let logits: Vec<f32> =
            case.logits.iter().map(|v| v.map_or(f32::NEG_INFINITY, |x| x as f32)).collect();
        let h = first_token_entropy_bits(&logits).unwrap();
        // f32 exp kernel: relative error ~2e-7 per term
        assert!(
            (h - case.entropy_bits).abs() <= 2e-6 * case.entropy_bits.max(1.0),
            "{}: {h} vs {}",
            case.name,
            case.entropy_bits
        );
    }
    for case in &file.topk {
        let r = first_token_entropy_from_top_logprobs(&case.logprobs, case.vocab_size).unwrap();
        assert!((r.known_mass - case.known_mass).abs() <= 1e-12);
        assert!((r.residual_mass - case.residual_mass).abs() <= 1e-12);
        assert!((r.lower_bits - case.lower_bits).abs() <= 1e-9, "{} vs {}", r.lower_bits, case.lower_bits);
        assert!((r.upper_bits - case.upper_bits).abs() <= 1e-9, "{} vs {}", r.upper_bits, case.upper_bits);
        assert_eq!(r.entropy_bits, r.lower_bits);
        assert!(
            r.lower_bits <= case.true_entropy_bits + 1e-9 && case.true_entropy_bits <= r.upper_bits + 1e-9
        );
    }
}

#[derive(Deserialize)]
struct WindowFile {
    std_epsilon: f64,
    skew_weight: f64,
    cases: Vec<WindowCase>,
}

#[derive(Deserialize)]
struct WindowCase {
    name: String,
    window: usize,
    values: Vec<f64>,
    mean: Vec<f64>,
    std: Vec<f64>,
    z: Vec<f64>,
    skew: Vec<f64>,
    score: Vec<f64>,
}

/// 1e-9 relative (floor 1), plus the rounding error the float64 reference itself
/// carries where a window is ill-conditioned (spread tiny against its magnitude):
/// numpy's mean and pandas' moments are exact only to ~eps * max|W|, which
/// |x - mean| / (std + 1e-8) amplifies by 1 / (std + 1e-8).
fn tolerance(reference: f64, z: f64, skew: f64, std: f64, magnitude: f64) -> f64 {
    let rounding = 64.0 * f64::EPSILON * magnitude;
    let z_term = rounding * (1.0 + z) / (std + STD_EPSILON);
    let skew_term = if std > 0.0 { SKEW_WEIGHT * skew.abs() * 3.0 * rounding / std } else { 0.0 };
    1e-9 * reference.abs().max(1.0) + z_term + skew_term
}

#[test]
fn window_score_matches_numpy_and_pandas() {
    let file: WindowFile = fixture("window.json");
    assert_eq!(file.std_epsilon, STD_EPSILON);
    assert_eq!(file.skew_weight, SKEW_WEIGHT);
    let mut strict = 0usize;
    let mut total = 0usize;
    for case in &file.cases {
        let w = case.window;
        let mut scorer = WindowAnomaly::new(w).unwrap();
        for (i, &x) in case.values.iter().enumerate() {
            let got = scorer.push(x).unwrap();
            if i < w {
                assert!(got.is_none());
                continue;
            }
            let got = got.unwrap();
            let k = i - w;
            let magnitude = case.values[i - w..=i].iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let tol = tolerance(case.score[k], case.z[k], case.skew[k], case.std[k], magnitude);
            let diff = (got.score - case.score[k]).abs();
            assert!(
                diff <= tol,
                "{} i={i}: score {} vs {} (z {} vs {}, skew {} vs {}, std {} vs {}, mean {} vs {}) tol {tol:e}",
                case.name,
                got.score,
                case.score[k],
                got.z,
                case.z[k],
                got.skew,
                case.skew[k],
                got.std,
                case.std[k],
                got.mean,
                case.mean[k]
            );
            let degenerate = case.values[i - w..i].iter().all(|&v| v == case.values[i - w]);
            if degenerate {
                assert_eq!(got.skew, 0.0, "{} i={i}: degenerate window", case.name);
            }
            total += 1;
            strict += usize::from(diff <= 1e-9 * case.score[k].abs().max(1.0));
        }
    }
    println!("window reference: {strict}/{total} points within 1e-9 relative without the conditioning term");
    assert!(total > 30_000);
}

#[derive(Deserialize)]
struct TheilSenFile {
    cases: Vec<TheilSenCase>,
}

#[derive(Deserialize)]
struct TheilSenCase {
    name: String,
    confidence: f64,
    x: Vec<f64>,
    y: Vec<f64>,
    slope: f64,
    intercept: f64,
    low_slope: f64,
    high_slope: f64,
}

#[test]
fn theil_sen_matches_scipy() {
    let file: TheilSenFile = fixture("theil_sen.json");
    for case in &file.cases {
        let fit = theil_sen(&case.x, &case.y, case.confidence).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1.0);
        assert!(close(fit.slope, case.slope), "{}: slope {} vs {}", case.name, fit.slope, case.slope);
        assert!(
            close(fit.intercept, case.intercept),
            "{}: intercept {} vs {}",
            case.name,
            fit.intercept,
            case.intercept
        );
        assert!(
            close(fit.low_slope, case.low_slope),
            "{}: low {} vs {}",
            case.name,
            fit.low_slope,
            case.low_slope
        );
        assert!(
            close(fit.high_slope, case.high_slope),
            "{}: high {} vs {}",
            case.name,
            fit.high_slope,
            case.high_slope
        );
    }
}

#[derive(Deserialize)]
struct QuantileFile {
    cases: Vec<QuantileCase>,
}

#[derive(Deserialize)]
struct QuantileCase {
    data: Vec<f64>,
    q: Vec<f64>,
    expected: Vec<f64>,
}

#[test]
fn quantiles_match_numpy_linear() {
    let file: QuantileFile = fixture("quantile.json");
    for case in &file.cases {
        let mut sorted = case.data.clone();
        sorted.sort_by(f64::total_cmp);
        for (&q, &expected) in case.q.iter().zip(&case.expected) {
            assert_eq!(quantile_linear(&sorted, q), expected, "n={} q={q}", sorted.len());
        }
    }
}
