//! Numenta Anomaly Benchmark (NAB) scoring, ported from NAB's sweeper/scorer/runner:
//! labelled anomaly windows, a probationary period, the scaled sigmoid that rewards
//! early detections, the cost-matrix profiles, the threshold sweep and the
//! normalisation between the null and the perfect detector.

pub mod skab;

use std::collections::BTreeMap;
use std::path::Path;

/// Errors while loading or scoring NAB inputs; each names the input and the fix.
#[derive(Debug, thiserror::Error)]
pub enum NabError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}; check that the NAB data directory is complete")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A file did not have the expected shape.
    #[error("{path}: {problem}; fix the file or point at an unmodified NAB checkout")]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        problem: String,
    },
}

/// Weights of one NAB application profile (config/profiles.json `CostMatrix`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
pub struct CostMatrix {
    /// Weight of a detected window.
    #[serde(rename = "tpWeight")]
    pub tp: f64,
    /// Weight of a false positive.
    #[serde(rename = "fpWeight")]
    pub fp: f64,
    /// Weight of a missed window.
    #[serde(rename = "fnWeight")]
    pub fn_: f64,
    /// Weight of a true negative (unused by NAB's score, kept for completeness).
    #[serde(rename = "tnWeight")]
    pub tn: f64,
}

/// The three NAB profile names, in NAB's order.
pub const PROFILES: [&str; 3] = ["standard", "reward_low_FP_rate", "reward_low_FN_rate"];

/// NAB's share of each file that is never scored.
pub const PROBATION_PERCENT: f64 = 0.15;

/// Rows at the start of a file of `n` rows that are never scored: min(floor(0.15 n), 750).
pub fn probation_length(n: usize) -> usize {
    let a = (PROBATION_PERCENT * n as f64).floor();
    let b = PROBATION_PERCENT * 5000.0;
    a.min(b) as usize
}

/// The range of the probationary rows of `values` (the rows a detector may learn from),
/// widened by `pad` x that range on each side (at least 1e-9, so a flat start still has a
/// range): the bins a detector that needs a fixed value range uses.
pub fn learning_range(values: &[f64], pad: f64) -> (f64, f64) {
    let seen = &values[..probation_length(values.len()).max(1).min(values.len())];
    let (lo, hi) = seen.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
    let margin = ((hi - lo) * pad).max(1e-9);
    (lo - margin, hi + margin)
}

/// NAB's scaled sigmoid of a relative position in (or past) a window.
pub fn scaled_sigmoid(rel: f64) -> f64 {
    if rel > 3.0 {
        -1.0
    } else {
        2.0 / (1.0 + (5.0 * rel).exp()) - 1.0
    }
}

/// One scorable row: its anomaly score, the score it would earn if detected, and its window.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepPoint {
    /// The detector's anomaly score in [0, 1].
    pub anomaly: f64,
    /// The weighted NAB score this row earns when detected.
    pub sweep_score: f64,
    /// Global window id when the row lies in a window; `None` outside windows.
    pub window: Option<usize>,
}

/// One threshold's outcome of the sweep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThresholdScore {
    /// Rows with an anomaly score >= this threshold are detections.
    pub threshold: f64,
    /// Raw NAB score.
    pub score: f64,
    /// True-positive rows.
    pub tp: usize,
    /// True-negative rows.
    pub tn: usize,
    /// False-positive rows.
    pub fp: usize,
    /// False-negative rows.
    pub fn_: usize,
}

/// Normalises a timestamp so that `2014-01-01 00:00:00.000000` and `2014-01-01 00:00:00` match.
fn ts_key(s: &str) -> &str {
    s.trim().split('.').next().unwrap_or("")
}

/// The sweep points of one file (probationary rows dropped), with window ids starting at
/// `first_window`. `windows` are (start, end) timestamps that must occur in `timestamps`.
pub fn sweep_points(
    timestamps: &[String],
    scores: &[f64],
    windows: &[(String, String)],
    cost: &CostMatrix,
    first_window: usize,
    name: &str,
) -> Result<Vec<SweepPoint>, NabError> {
    if timestamps.len() != scores.len() {
        return Err(NabError::Format {
            path: name.into(),
            problem: format!("{} timestamps but {} scores", timestamps.len(), scores.len()),
        });
    }
    let index_of = |t: &str| -> Result<usize, NabError> {
        timestamps.iter().position(|x| ts_key(x) == ts_key(t)).ok_or_else(|| NabError::Format {
            path: name.into(),
            problem: format!("window limit {t} is not a timestamp of the file"),
        })
    };
    let mut bounds = Vec::with_capacity(windows.len());
    for (a, b) in windows {
        bounds.push((index_of(a)?, index_of(b)?));
    }
    let max_tp = scaled_sigmoid(-1.0);
    let probation = probation_length(timestamps.len());
    let mut out = Vec::with_capacity(scores.len().saturating_sub(probation));
    let mut next = 0usize;
    let mut cur: Option<(usize, usize, f64)> = None; // (window id, right index, width)
    let mut prev: Option<(usize, f64)> = None; // (right index, width)
    for (i, &anomaly) in scores.iter().enumerate() {
        if cur.is_none() && next < bounds.len() && bounds[next].0 == i {
            let (l, r) = bounds[next];
            cur = Some((first_window + next, r, (r - l + 1) as f64));
            next += 1;
        }
        let sweep_score = match cur {
            Some((_, r, w)) => {
                let pos = -((r as f64) - (i as f64) + 1.0) / w;
                scaled_sigmoid(pos) * cost.tp / max_tp
            }
            None => {
                let unweighted = match prev {
                    None => -1.0,
                    Some((r, w)) => scaled_sigmoid((r as f64 - i as f64).abs() / (w - 1.0)),
                };
                unweighted * cost.fp
            }
        };
        if i >= probation {
            out.push(SweepPoint { anomaly, sweep_score, window: cur.map(|c| c.0) });
        }
        if let Some((_, r, w)) = cur {
            if r == i {
                prev = Some((r, w));
                cur = None;
            }
        }
    }
    Ok(out)
}

/// NAB's threshold sweep: the score and counts at every distinct anomaly score, highest
/// first, starting with a 1.1 threshold (nothing detected). Windows that have no
/// scorable row do not count.
pub fn score_by_threshold(points: &[SweepPoint], cost: &CostMatrix) -> Vec<ThresholdScore> {
    let mut sorted: Vec<&SweepPoint> = points.iter().collect();
    // Stable sort, descending, as Python's sorted(reverse=True).
    sorted.sort_by(|a, b| b.anomaly.total_cmp(&a.anomaly));
    let mut parts: BTreeMap<usize, f64> = BTreeMap::new();
    for p in &sorted {
        if let Some(w) = p.window {
            parts.insert(w, -cost.fn_);
        }
    }
    let mut fp_part = 0.0;
    let mut tn = sorted.iter().filter(|p| p.window.is_none()).count();
    let mut fn_ = sorted.len() - tn;
    let (mut tp, mut fp) = (0usize, 0usize);
    let mut thr = 1.1;
    let mut out = Vec::new();
    let total = |parts: &BTreeMap<usize, f64>, fp_part: f64| fp_part + parts.values().sum::<f64>();
    for p in sorted {
        if p.anomaly != thr {
            out.push(ThresholdScore { threshold: thr, score: total(&parts, fp_part), tp, tn, fp, fn_ });
            thr = p.anomaly;
        }
        match p.window {
            Some(w) => {
                tp += 1;
                fn_ -= 1;
                let e = parts.entry(w).or_insert(-cost.fn_);
                *e = e.max(p.sweep_score);
            }
            None => {
                fp += 1;
                tn -= 1;
                fp_part += p.sweep_score;
            }
        }
    }
    out.push(ThresholdScore { threshold: thr, score: total(&parts, fp_part), tp, tn, fp, fn_ });
    out
}

/// The sweep row that applies at `threshold` (rows >= threshold detected), as NAB picks it.
pub fn at_threshold(rows: &[ThresholdScore], threshold: f64) -> Option<ThresholdScore> {
    let mut prev = None;
    for r in rows {
        if r.threshold == threshold {
            return Some(*r);
        }
        if r.threshold < threshold {
            return prev;
        }
        prev = Some(*r);
    }
    prev
}

/// The sweep row with the highest score (NAB's optimiser; first of equals wins).
pub fn best_threshold(rows: &[ThresholdScore]) -> Option<ThresholdScore> {
    let mut best: Option<ThresholdScore> = None;
    for r in rows {
        if best.is_none_or(|b| r.score > b.score) {
            best = Some(*r);
        }
    }
    best
}

/// NAB's normalised score: 100 (raw - null) / (perfect - null), perfect = windows * A_tp.
pub fn normalise(raw: f64, null: f64, windows: usize, cost: &CostMatrix) -> f64 {
    let perfect = windows as f64 * cost.tp;
    100.0 * (raw - null) / (perfect - null)
}

/// A NAB data directory: labels and profiles.
#[derive(Debug, Clone)]
pub struct NabCorpus {
    /// Window limits per relative data path (e.g. `realKnownCause/nyc_taxi.csv`).
    pub windows: BTreeMap<String, Vec<(String, String)>>,
    /// Cost matrix per profile name.
    pub profiles: BTreeMap<String, CostMatrix>,
}

/// Reads `path` as text, or `path.gz` decompressed when `path` itself is absent (the
/// repository keeps NAB's CSVs gzipped; an upstream checkout has them plain).
fn read(path: &Path) -> Result<String, NabError> {
    let io = |p: &Path, source| NabError::Io { path: p.display().to_string(), source };
    let plain = match std::fs::read_to_string(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => e,
        other => return other.map_err(|e| io(path, e)),
    };
    let mut gz = path.as_os_str().to_owned();
    gz.push(".gz");
    let gz = std::path::PathBuf::from(gz);
    // Neither exists: name the plain file, what a user with an upstream checkout looks for.
    let file = std::fs::File::open(&gz).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => io(path, plain),
        _ => io(&gz, e),
    })?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(file), &mut text)
        .map_err(|e| io(&gz, e))?;
    Ok(text)
}

fn fmt_err(path: &Path, problem: impl Into<String>) -> NabError {
    NabError::Format { path: path.display().to_string(), problem: problem.into() }
}

impl NabCorpus {
    /// Loads `labels/combined_windows.json` and `config/profiles.json` under `dir`.
    pub fn load(dir: &Path) -> Result<Self, NabError> {
        let wpath = dir.join("labels/combined_windows.json");
        let windows: BTreeMap<String, Vec<(String, String)>> = serde_json::from_str(&read(&wpath)?)
            .map_err(|e| fmt_err(&wpath, format!("not a map of [start, end] windows: {e}")))?;
        #[derive(serde::Deserialize)]
        struct Profile {
            #[serde(rename = "CostMatrix")]
            cost: CostMatrix,
        }
        let ppath = dir.join("config/profiles.json");
        let raw: BTreeMap<String, Profile> = serde_json::from_str(&read(&ppath)?)
            .map_err(|e| fmt_err(&ppath, format!("not a map of profiles with a CostMatrix: {e}")))?;
        let profiles = raw.into_iter().map(|(k, v)| (k, v.cost)).collect();
        Ok(Self { windows, profiles })
    }

    /// The cost matrix of `profile`.
    pub fn cost(&self, profile: &str) -> Result<CostMatrix, NabError> {
        self.profiles.get(profile).copied().ok_or_else(|| NabError::Format {
            path: "config/profiles.json".into(),
            problem: format!("no profile named {profile}; known: {:?}", self.profiles.keys()),
        })
    }

    /// The windows of the data file `rel` (e.g. `realKnownCause/nyc_taxi.csv`).
    pub fn windows_of(&self, rel: &str) -> Result<&[(String, String)], NabError> {
        self.windows.get(rel).map(|v| v.as_slice()).ok_or_else(|| NabError::Format {
            path: "labels/combined_windows.json".into(),
            problem: format!("no windows for {rel}; use a file of the NAB corpus"),
        })
    }
}

/// The category folders under `dir/data`, sorted (NAB's categories present in a checkout).
pub fn categories(dir: &Path) -> Result<Vec<String>, NabError> {
    let folder = dir.join("data");
    let io = |source| NabError::Io { path: folder.display().to_string(), source };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&folder).map_err(io)? {
        let entry = entry.map_err(io)?;
        if entry.file_type().map_err(io)?.is_dir() {
            out.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(fmt_err(&folder, "no category folders; point at a NAB checkout's top directory"));
    }
    Ok(out)
}

/// Every data file under `dir/data` as `category/file.csv` (a gzipped `file.csv.gz` is
/// listed as `file.csv`), sorted by category, then by name: the order every NAB table
/// here uses.
pub fn data_files(dir: &Path) -> Result<Vec<String>, NabError> {
    let mut out = Vec::new();
    for category in categories(dir)? {
        let folder = dir.join("data").join(&category);
        let io = |source| NabError::Io { path: folder.display().to_string(), source };
        let mut names: Vec<String> = Vec::new();
        for entry in std::fs::read_dir(&folder).map_err(io)? {
            let name = entry.map_err(io)?.file_name().to_string_lossy().into_owned();
            let csv = name.strip_suffix(".gz").unwrap_or(&name);
            if csv.ends_with(".csv") {
                names.push(csv.to_string());
            }
        }
        names.sort();
        out.extend(names.into_iter().map(|name| format!("{category}/{name}")));
    }
    Ok(out)
}

/// The category of a relative data path (`realKnownCause/nyc_taxi.csv` -> `realKnownCause`).
pub fn category_of(rel: &str) -> &str {
    rel.split_once('/').map_or("", |(c, _)| c)
}

/// `results/<detector>/<category>/<detector>_<file>`: a detector's published scores of
/// the data file `category/file`.
pub fn result_path(dir: &Path, detector: &str, rel: &str) -> std::path::PathBuf {
    let (category, file) = rel.split_once('/').unwrap_or(("", rel));
    dir.join("results").join(detector).join(category).join(format!("{detector}_{file}"))
}

/// Reads the `timestamp` column and the named numeric column of a NAB CSV (no quoting).
pub fn read_csv_column(path: &Path, column: &str) -> Result<(Vec<String>, Vec<f64>), NabError> {
    let text = read(path)?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().ok_or_else(|| fmt_err(path, "empty file"))?.split(',').collect();
    let find = |name: &str| {
        header.iter().position(|h| h.trim() == name).ok_or_else(|| fmt_err(path, format!("no {name} column")))
    };
    let (ti, vi) = (find("timestamp")?, find(column)?);
    let (mut ts, mut vs) = (Vec::new(), Vec::new());
    for (n, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split(',').collect();
        let (Some(t), Some(v)) = (f.get(ti), f.get(vi)) else {
            return Err(fmt_err(path, format!("line {} has too few fields", n + 2)));
        };
        let v: f64 =
            v.trim().parse().map_err(|_| fmt_err(path, format!("line {}: {v:?} is not a number", n + 2)))?;
        ts.push(t.to_string());
        vs.push(v);
    }
    Ok((ts, vs))
}

/// The NAB checkout to use: `$OMEN_NAB_DIR`, else the repository's copy in data/nab.
pub fn data_dir() -> std::path::PathBuf {
    std::env::var_os("OMEN_NAB_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/nab"))
}

/// The time of day of a NAB timestamp (`YYYY-MM-DD HH:MM:SS[.ffffff]`) as a fraction of
/// the day, for detectors that learn daily patterns.
pub fn day_fraction(timestamp: &str) -> Result<f64, NabError> {
    let field = |r: std::ops::Range<usize>| timestamp.get(r).and_then(|s| s.parse::<u32>().ok());
    match (field(11..13), field(14..16), field(17..19)) {
        (Some(h), Some(m), Some(s)) if h < 24 && m < 60 && s < 60 => {
            Ok(f64::from(h * 3600 + m * 60 + s) / 86_400.0)
        }
        _ => Err(NabError::Format {
            path: timestamp.into(),
            problem: "a timestamp is not YYYY-MM-DD HH:MM:SS".into(),
        }),
    }
}

/// The per-file result of scoring at one threshold, as in `<detector>_<profile>_scores.csv`.
#[derive(Debug, Clone, PartialEq)]
pub struct FileScore {
    /// Relative data path.
    pub file: String,
    /// Outcome at the threshold.
    pub row: ThresholdScore,
    /// All rows of the file (NAB's Total_Count).
    pub total: usize,
}

/// Scores one file's anomaly scores at `threshold` under `cost`.
pub fn score_file(
    corpus: &NabCorpus,
    rel: &str,
    timestamps: &[String],
    scores: &[f64],
    cost: &CostMatrix,
    threshold: f64,
) -> Result<FileScore, NabError> {
    let pts = sweep_points(timestamps, scores, corpus.windows_of(rel)?, cost, 0, rel)?;
    let rows = score_by_threshold(&pts, cost);
    let row = at_threshold(&rows, threshold).ok_or_else(|| NabError::Format {
        path: rel.into(),
        problem: format!("threshold {threshold} is above every sweep row"),
    })?;
    Ok(FileScore { file: rel.into(), row, total: timestamps.len() })
}

/// Sweeps the threshold over several files at once (NAB's optimiser); returns all rows.
pub fn sweep_corpus(
    corpus: &NabCorpus,
    files: &[(String, Vec<String>, Vec<f64>)],
    cost: &CostMatrix,
) -> Result<Vec<ThresholdScore>, NabError> {
    let mut all = Vec::new();
    let mut first = 0;
    for (rel, ts, sc) in files {
        let w = corpus.windows_of(rel)?;
        all.extend(sweep_points(ts, sc, w, cost, first, rel)?);
        first += w.len();
    }
    Ok(score_by_threshold(&all, cost))
}

/// The optimised (best-threshold) raw score of several files and its normalised score,
/// with the null baseline (nothing detected) and perfect score (every window) of the same files.
pub fn optimised_normalised(
    corpus: &NabCorpus,
    files: &[(String, Vec<String>, Vec<f64>)],
    cost: &CostMatrix,
) -> Result<(ThresholdScore, f64), NabError> {
    let rows = sweep_corpus(corpus, files, cost)?;
    let best = best_threshold(&rows)
        .ok_or_else(|| NabError::Format { path: "<corpus>".into(), problem: "no scorable rows".into() })?;
    let windows: usize =
        files.iter().map(|f| corpus.windows_of(&f.0).map(|w| w.len())).sum::<Result<_, _>>()?;
    let null = -(windows as f64) * cost.fn_;
    Ok((best, normalise(best.score, null, windows, cost)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STD: CostMatrix = CostMatrix { tp: 1.0, fp: 0.11, fn_: 1.0, tn: 1.0 };

    #[test]
    fn day_fraction_reads_the_clock_time() {
        assert_eq!(day_fraction("2014-01-16 00:00:00").unwrap(), 0.0);
        assert_eq!(day_fraction("2014-01-16 18:00:00.000000").unwrap(), 0.75);
        assert!(day_fraction("2014-01-16").is_err() && day_fraction("2014-01-16 24:00:00").is_err());
    }

    #[test]
    fn data_files_and_result_paths_follow_nab_layout() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/nab");
        let cats = categories(&dir).unwrap();
        assert_eq!(cats.len(), 6, "{cats:?}");
        let files = data_files(&dir).unwrap();
        assert_eq!(files.len(), 51, "{files:?}");
        assert!(files.iter().all(|f| f.ends_with(".csv") && cats.contains(&category_of(f).to_string())));
        assert!(files.windows(2).all(|w| w[0] < w[1]), "sorted within and across categories");
        assert_eq!(
            result_path(&dir, "null", "realKnownCause/nyc_taxi.csv"),
            dir.join("results/null/realKnownCause/null_nyc_taxi.csv")
        );
        // Gzipped files read as the plain name.
        let (ts, v) = read_csv_column(&result_path(&dir, "numenta", &files[5]), "anomaly_score").unwrap();
        assert!(!ts.is_empty() && ts.len() == v.len());
        let e = data_files(&dir.join("missing")).unwrap_err();
        assert!(e.to_string().contains("missing/data"), "{e}");
        let e = read_csv_column(&dir.join("data/none.csv"), "value").unwrap_err();
        assert!(e.to_string().contains("data/none.csv") && e.to_string().contains("complete"), "{e}");
    }

    #[test]
    fn sigmoid_and_probation_match_nab() {
        assert!((scaled_sigmoid(-1.0) - 0.986_614_298_151_43).abs() < 1e-12);
        assert_eq!(scaled_sigmoid(0.0), 0.0);
        assert_eq!(scaled_sigmoid(3.5), -1.0);
        assert_eq!(probation_length(4032), 604);
        assert_eq!(probation_length(22695), 750);
    }

    #[test]
    fn early_detection_scores_full_tp_and_normalises_to_100() {
        let ts: Vec<String> = (0..100).map(|i| format!("t{i:03}")).collect();
        let windows = vec![("t050".to_string(), "t059".to_string())];
        let corpus = NabCorpus {
            windows: [("f.csv".to_string(), windows)].into_iter().collect(),
            profiles: [("standard".to_string(), STD)].into_iter().collect(),
        };
        let mut sc = vec![0.0; 100];
        sc[50] = 1.0;
        let files = vec![("f.csv".to_string(), ts.clone(), sc.clone())];
        let (best, norm) = optimised_normalised(&corpus, &files, &STD).unwrap();
        assert!((best.score - 1.0).abs() < 1e-12 && (norm - 100.0).abs() < 1e-9);
        assert_eq!((best.tp, best.fp, best.fn_), (1, 0, 9));
        // A detection right after the window costs a weighted FP.
        sc[60] = 1.0;
        let r = score_file(&corpus, "f.csv", &ts, &sc, &STD, 1.0).unwrap().row;
        assert!((r.score - (1.0 + 0.11 * scaled_sigmoid(1.0 / 9.0))).abs() < 1e-12);
    }
}
