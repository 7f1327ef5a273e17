//! `omen evaluate-detectors`: the NAB table from the shipped code. Every detector is scored by
//! omen-nab's port of NAB's scorer on the same files with the same threshold sweep:
//! the published detectors from their result files, omen's own from their score streams.
//! omen's tunable detector is also judged leave-one-category-out: its parameters and
//! threshold are chosen on the other categories and scored on the left-out one, which is
//! how its defaults are expected to fare on files nobody tuned them on.

use std::path::{Path, PathBuf};

use omen_agent::config::{DetectorKind, SignalsConfig};
use omen_agent::detector::SeriesDetector;
use omen_nab::{self as nab, CostMatrix, NabCorpus, SweepPoint, ThresholdScore, PROFILES};
use omen_signals::NoveltySurpriseConfig;

/// Errors of the NAB evaluation; each names the input.
#[derive(Debug, thiserror::Error)]
pub enum DetectorsError {
    /// The NAB data could not be read.
    #[error(transparent)]
    Nab(#[from] nab::NabError),
    /// A detector rejected a value of a file.
    #[error("{file}: detector {detector}: {source}")]
    Signal {
        /// The data file.
        file: String,
        /// The detector.
        detector: String,
        /// The cause.
        source: omen_signals::SignalError,
    },
    /// Nothing to score.
    #[error("{0}")]
    Empty(String),
}

/// One NAB data file, read once.
#[derive(Debug, Clone)]
pub struct NabFile {
    /// `category/file.csv`.
    pub rel: String,
    /// Row timestamps as written.
    pub timestamps: Vec<String>,
    /// Row values.
    pub values: Vec<f64>,
}

/// A NAB checkout read into memory: labels, profiles and every data file.
#[derive(Debug, Clone)]
pub struct NabData {
    /// The checkout.
    pub dir: PathBuf,
    /// Windows and cost matrices.
    pub corpus: NabCorpus,
    /// Data files in NAB order.
    pub files: Vec<NabFile>,
}

impl NabData {
    /// Reads every data file of the checkout at `dir`.
    pub fn load(dir: &Path) -> Result<Self, DetectorsError> {
        let corpus = NabCorpus::load(dir)?;
        let mut files = Vec::new();
        for rel in nab::data_files(dir)? {
            let (timestamps, values) = nab::read_csv_column(&dir.join("data").join(&rel), "value")?;
            files.push(NabFile { rel, timestamps, values });
        }
        if files.is_empty() {
            return Err(DetectorsError::Empty(format!("{}: no data files under data/", dir.display())));
        }
        Ok(Self { dir: dir.to_path_buf(), corpus, files })
    }

    /// The categories present, in order.
    pub fn categories(&self) -> Vec<String> {
        let mut out: Vec<String> = self.files.iter().map(|f| nab::category_of(&f.rel).to_string()).collect();
        out.dedup();
        out
    }

    fn windows(&self, files: &[usize]) -> Result<usize, DetectorsError> {
        files.iter().map(|&i| Ok(self.corpus.windows_of(&self.files[i].rel)?.len())).sum()
    }
}

/// A detector the table scores.
#[derive(Debug, Clone)]
pub enum Detector {
    /// A published detector, read from `results/<name>/`.
    Published(String),
    /// The agent's per-series detector ([`SeriesDetector`], the object the pipeline runs on
    /// every live sample) with these `signals` settings.
    Agent(Box<SignalsConfig>),
}

impl Detector {
    /// The detector's name in the table.
    pub fn name(&self) -> String {
        match self {
            Self::Published(n) => n.clone(),
            Self::Agent(c) => match c.detector {
                DetectorKind::NoveltySurprise => {
                    let n = &c.novelty_surprise;
                    if n.detector_config() == NoveltySurpriseConfig::default() {
                        "omen novelty_surprise (default parameters)".into()
                    } else {
                        format!(
                            "omen novelty_surprise (bins {}, order {}, refractory {})",
                            n.bins, n.order, n.refractory
                        )
                    }
                }
                DetectorKind::Window => format!("omen window (w={})", c.window),
            },
        }
    }

    /// The detector's anomaly score of every row of `file`.
    pub fn scores(&self, dir: &Path, file: &NabFile) -> Result<Vec<f64>, DetectorsError> {
        let signal =
            |source| DetectorsError::Signal { file: file.rel.clone(), detector: self.name(), source };
        match self {
            Self::Published(name) => {
                let (ts, scores) =
                    nab::read_csv_column(&nab::result_path(dir, name, &file.rel), "anomaly_score")?;
                if ts.len() != file.values.len() {
                    return Err(DetectorsError::Empty(format!(
                        "{}: {} rows, but {name}'s result has {}; use results from the same NAB data",
                        file.rel,
                        file.values.len(),
                        ts.len()
                    )));
                }
                Ok(scores)
            }
            Self::Agent(config) => {
                // NAB lets a detector learn from the probationary rows: the agent's detector
                // learns from exactly those. NAB sweeps thresholds over [0, 1], so the window
                // score (unbounded) is squashed s / (1 + s), which keeps its order.
                let probation = nab::probation_length(file.values.len());
                let mut d = SeriesDetector::with_learning(config, probation).map_err(signal)?;
                let squash = config.detector == DetectorKind::Window;
                file.values
                    .iter()
                    .zip(&file.timestamps)
                    .map(|(&v, t)| {
                        let score = d.push(timestamp_ms(&file.rel, t)?, v).map_err(signal)?.score;
                        Ok(score.map_or(0.0, |s| if squash { s / (1.0 + s) } else { s }))
                    })
                    .collect()
            }
        }
    }
}

/// A NAB time stamp (`YYYY-MM-DD HH:MM:SS[.f]`, no zone) as Unix ms, read as UTC.
fn timestamp_ms(file: &str, t: &str) -> Result<i64, DetectorsError> {
    chrono::NaiveDateTime::parse_from_str(t, "%Y-%m-%d %H:%M:%S%.f")
        .map(|d| d.and_utc().timestamp_millis())
        .map_err(|e| {
            DetectorsError::Empty(format!("{file}: time stamp {t:?} is not YYYY-MM-DD HH:MM:SS ({e})"))
        })
}

/// omen's detectors with their shipped settings: the NAB detector with its defaults and
/// the agent's window score with the default `signals.window`.
pub fn omen_detectors() -> Vec<Detector> {
    let novelty = SignalsConfig { detector: DetectorKind::NoveltySurprise, ..SignalsConfig::default() };
    let window = SignalsConfig { detector: DetectorKind::Window, ..SignalsConfig::default() };
    vec![Detector::Agent(Box::new(novelty)), Detector::Agent(Box::new(window))]
}

/// A category's share of a detector's result at the corpus threshold.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CategoryScore {
    /// The category.
    pub category: String,
    /// Normalised score of the category alone; `None` when it has no anomaly windows
    /// (NAB's normalisation is undefined there: read `false_positives`).
    pub normalised: Option<f64>,
    /// Raw NAB score.
    pub raw: f64,
    /// Rows detected outside every window.
    pub false_positives: usize,
}

/// A detector's result under one profile.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProfileScore {
    /// The profile.
    pub profile: String,
    /// The threshold NAB's sweep found best on the whole corpus.
    pub threshold: f64,
    /// Normalised score on the whole corpus.
    pub normalised: f64,
    /// Per category, at the same threshold.
    pub by_category: Vec<CategoryScore>,
}

/// A detector's row of the table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DetectorScore {
    /// The detector.
    pub detector: String,
    /// One entry per profile.
    pub profiles: Vec<ProfileScore>,
}

/// Sweep points of each file under one cost matrix, with global window ids.
struct Points {
    per_file: Vec<Vec<SweepPoint>>,
}

impl Points {
    fn new(data: &NabData, scores: &[Vec<f64>], cost: &CostMatrix) -> Result<Self, DetectorsError> {
        let mut per_file = Vec::with_capacity(scores.len());
        let mut first = 0;
        for (f, sc) in data.files.iter().zip(scores) {
            let w = data.corpus.windows_of(&f.rel)?;
            per_file.push(nab::sweep_points(&f.timestamps, sc, w, cost, first, &f.rel)?);
            first += w.len();
        }
        Ok(Self { per_file })
    }

    fn sweep(&self, files: &[usize], cost: &CostMatrix) -> Vec<ThresholdScore> {
        let all: Vec<SweepPoint> = files.iter().flat_map(|&i| self.per_file[i].iter().cloned()).collect();
        nab::score_by_threshold(&all, cost)
    }
}

fn normalised(raw: f64, windows: usize, cost: &CostMatrix) -> Option<f64> {
    (windows > 0).then(|| nab::normalise(raw, -(windows as f64) * cost.fn_, windows, cost))
}

fn files_of(data: &NabData, category: &str) -> Vec<usize> {
    (0..data.files.len()).filter(|&i| nab::category_of(&data.files[i].rel) == category).collect()
}

/// Scores `detectors` on every profile: the corpus optimum and each category at it.
/// `progress(done, total)` is called after each detector's files are scored.
pub fn evaluate(
    data: &NabData,
    detectors: &[Detector],
    mut progress: impl FnMut(usize, usize),
) -> Result<Vec<DetectorScore>, DetectorsError> {
    let all: Vec<usize> = (0..data.files.len()).collect();
    let mut out = Vec::new();
    for (k, det) in detectors.iter().enumerate() {
        let scores: Vec<Vec<f64>> =
            data.files.iter().map(|f| det.scores(&data.dir, f)).collect::<Result<_, _>>()?;
        let mut profiles = Vec::new();
        for prof in PROFILES {
            let cost = data.corpus.cost(prof)?;
            let points = Points::new(data, &scores, &cost)?;
            let best = nab::best_threshold(&points.sweep(&all, &cost))
                .ok_or_else(|| DetectorsError::Empty("no scorable rows".into()))?;
            let mut by_category = Vec::new();
            for category in data.categories() {
                let files = files_of(data, &category);
                let at = nab::at_threshold(&points.sweep(&files, &cost), best.threshold)
                    .ok_or_else(|| DetectorsError::Empty(format!("{category}: no scorable rows")))?;
                by_category.push(CategoryScore {
                    normalised: normalised(at.score, data.windows(&files)?, &cost),
                    category,
                    raw: at.score,
                    false_positives: at.fp,
                });
            }
            let total = normalised(best.score, data.windows(&all)?, &cost)
                .ok_or_else(|| DetectorsError::Empty("the corpus has no anomaly windows".into()))?;
            profiles.push(ProfileScore {
                profile: prof.into(),
                threshold: best.threshold,
                normalised: total,
                by_category,
            });
        }
        out.push(DetectorScore { detector: det.name(), profiles });
        progress(k + 1, detectors.len());
    }
    Ok(out)
}

/// The leave-one-category-out result of one category.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LeftOut {
    /// The category scored.
    pub category: String,
    /// The parameters chosen on the other categories.
    pub chosen: String,
    /// The threshold chosen on the other categories.
    pub threshold: f64,
    /// The left-out category's normalised score (`None`: no windows there).
    pub normalised: Option<f64>,
    /// Its raw score.
    pub raw: f64,
}

/// omen's tunable detector judged leave-one-category-out under one profile.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LeaveOneOut {
    /// The profile.
    pub profile: String,
    /// Parameter sets tried.
    pub candidates: usize,
    /// Per left-out category.
    pub categories: Vec<LeftOut>,
    /// The left-out raw scores summed and normalised over the whole corpus: the score of
    /// a detector that never saw the files it is scored on.
    pub normalised: f64,
    /// For comparison: the best candidate chosen and thresholded on the whole corpus.
    pub tuned_on_all: f64,
    /// That candidate.
    pub tuned_on_all_chosen: String,
}

/// The parameter sets [`leave_one_category_out`] chooses from: the defaults' neighbours in
/// bins, context order and refractory period. Declared before looking at any score.
pub fn novelty_surprise_grid() -> Vec<SignalsConfig> {
    let mut out = Vec::new();
    for bins in [8, 16, 32] {
        for order in [2, 3, 4] {
            for refractory in [100, 200, 400] {
                let mut c =
                    SignalsConfig { detector: DetectorKind::NoveltySurprise, ..SignalsConfig::default() };
                c.novelty_surprise.bins = bins;
                c.novelty_surprise.order = order;
                c.novelty_surprise.refractory = refractory;
                out.push(c);
            }
        }
    }
    out
}

/// For each category: pick the candidate and threshold that score best on the other
/// categories, then score the category with them. `progress(done, total)` per candidate.
pub fn leave_one_category_out(
    data: &NabData,
    candidates: &[SignalsConfig],
    profile: &str,
    mut progress: impl FnMut(usize, usize),
) -> Result<LeaveOneOut, DetectorsError> {
    let cost = data.corpus.cost(profile)?;
    let categories = data.categories();
    let all: Vec<usize> = (0..data.files.len()).collect();
    let mut points = Vec::new();
    for (k, c) in candidates.iter().enumerate() {
        let det = Detector::Agent(Box::new(c.clone()));
        let scores: Vec<Vec<f64>> =
            data.files.iter().map(|f| det.scores(&data.dir, f)).collect::<Result<_, _>>()?;
        points.push((det.name(), Points::new(data, &scores, &cost)?));
        progress(k + 1, candidates.len());
    }
    if points.is_empty() {
        return Err(DetectorsError::Empty("no candidate parameters".into()));
    }
    // The best (candidate, threshold) on `files`, by normalised score; first of equals wins.
    let best_on = |files: &[usize]| -> Result<(usize, ThresholdScore), DetectorsError> {
        let windows = data.windows(files)?;
        let mut best: Option<(usize, ThresholdScore, f64)> = None;
        for (k, (_, p)) in points.iter().enumerate() {
            let Some(b) = nab::best_threshold(&p.sweep(files, &cost)) else { continue };
            let n = normalised(b.score, windows, &cost).unwrap_or(b.score);
            if best.as_ref().is_none_or(|x| n > x.2) {
                best = Some((k, b, n));
            }
        }
        best.map(|(k, b, _)| (k, b)).ok_or_else(|| DetectorsError::Empty("no scorable rows".into()))
    };
    let mut left = Vec::new();
    let mut raw_sum = 0.0;
    for category in &categories {
        let held: Vec<usize> = files_of(data, category);
        let rest: Vec<usize> = all.iter().copied().filter(|i| !held.contains(i)).collect();
        let (k, b) = best_on(&rest)?;
        let at = nab::at_threshold(&points[k].1.sweep(&held, &cost), b.threshold)
            .ok_or_else(|| DetectorsError::Empty(format!("{category}: no scorable rows")))?;
        raw_sum += at.score;
        left.push(LeftOut {
            category: category.clone(),
            chosen: points[k].0.clone(),
            threshold: b.threshold,
            normalised: normalised(at.score, data.windows(&held)?, &cost),
            raw: at.score,
        });
    }
    let windows = data.windows(&all)?;
    let (k, b) = best_on(&all)?;
    let norm = |raw| normalised(raw, windows, &cost).unwrap_or(f64::NAN);
    Ok(LeaveOneOut {
        profile: profile.into(),
        candidates: candidates.len(),
        categories: left,
        normalised: norm(raw_sum),
        tuned_on_all: norm(b.score),
        tuned_on_all_chosen: points[k].0.clone(),
    })
}

fn cell(c: &CategoryScore) -> String {
    match c.normalised {
        Some(n) => format!("{n:.2}"),
        None => format!("{} FP", c.false_positives),
    }
}

/// The results as Markdown: one table per profile (total and per category), then the
/// leave-one-category-out table when there is one.
pub fn table(scores: &[DetectorScore], loco: Option<&LeaveOneOut>, files: usize) -> String {
    let mut s = String::new();
    let Some(first) = scores.first() else { return s };
    for (p, prof) in first.profiles.iter().enumerate() {
        let cats: Vec<&str> = prof.by_category.iter().map(|c| c.category.as_str()).collect();
        s += &format!(
            "\nNAB {} profile, {files} files (threshold optimised on all of them):\n\n",
            prof.profile
        );
        s += &format!("| detector | total | threshold | {} |\n", cats.join(" | "));
        s += &format!("|---|---|---|{}\n", "---|".repeat(cats.len()));
        for d in scores {
            let r = &d.profiles[p];
            let per: Vec<String> = r.by_category.iter().map(cell).collect();
            s += &format!(
                "| {} | {:.2} | {:.4} | {} |\n",
                d.detector,
                r.normalised,
                r.threshold,
                per.join(" | ")
            );
        }
    }
    if let Some(l) = loco {
        s += &format!(
            "\nLeave one category out ({} profile, {} parameter sets): chosen and thresholded on the \
             other categories, scored on the left-out one:\n\n",
            l.profile, l.candidates
        );
        s += "| left out | chosen on the others | threshold | score |\n|---|---|---|---|\n";
        for c in &l.categories {
            let score = c.normalised.map_or(format!("raw {:.2}", c.raw), |n| format!("{n:.2}"));
            s += &format!("| {} | {} | {:.4} | {score} |\n", c.category, c.chosen, c.threshold);
        }
        s += &format!(
            "| **all, left out** | | | **{:.2}** |\n\nTuned on all files instead: {:.2} ({}).\n",
            l.normalised, l.tuned_on_all, l.tuned_on_all_chosen
        );
    }
    s
}

/// Which tables `omen evaluate-detectors` computes beside the published SKAB rows.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tables {
    /// omen's LSTM autoencoder on SKAB, fitted per file by the model worker.
    pub lstm_ae: bool,
    /// The SKAB table only, without NAB.
    pub skab_only: bool,
}

/// One SKAB row: a published leaderboard detector's predictions scored by the port.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SkabRow {
    /// The algorithm, as its folder under `published/` names it.
    pub algorithm: String,
    /// Its figures on the files, rounded as SKAB prints them.
    pub scores: omen_nab::skab::SkabScores,
}

/// Scores every published SKAB detector under `dir/published` on the anomaly files of
/// `dir/data` with SKAB's protocol (60 s changepoint windows); returns the rows and the
/// number of files.
pub fn skab_published(dir: &Path) -> Result<(Vec<SkabRow>, usize), omen_nab::skab::SkabError> {
    use omen_nab::skab;
    let rels = skab::data_files(dir)?;
    let files: Vec<_> = rels.iter().map(|r| skab::read_file(dir, r)).collect::<Result<_, _>>()?;
    let published = dir.join("published");
    let mut algorithms: Vec<String> = std::fs::read_dir(&published)
        .map_err(|e| skab::SkabError::Io { path: published.display().to_string(), source: e })?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    algorithms.sort();
    let mut rows = Vec::new();
    for algorithm in algorithms {
        let predictions: Vec<_> =
            files.iter().map(|f| skab::read_prediction(dir, &algorithm, f)).collect::<Result<_, _>>()?;
        let scores = skab::score(&files, &predictions, 60)?.rounded();
        rows.push(SkabRow { algorithm, scores });
    }
    rows.sort_by(|a, b| b.scores.f1.total_cmp(&a.scores.f1));
    Ok((rows, files.len()))
}

/// The SKAB rows as a Markdown table.
pub fn skab_table(rows: &[SkabRow], files: usize) -> String {
    let mut out = format!(
        "\nSKAB, {files} files (published leaderboard predictions, scored by omen's port of SKAB's scorer):\n\n\
         | algorithm | F1 | FAR % | MAR % | NAB standard | NAB LowFP | NAB LowFN |\n|---|---|---|---|---|---|---|\n"
    );
    for r in rows {
        let s = &r.scores;
        out.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
            r.algorithm, s.f1, s.far_pct, s.mar_pct, s.nab_standard, s.nab_low_fp, s.nab_low_fn
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> NabData {
        NabData::load(&nab::data_dir()).expect("data/nab in the repository")
    }

    #[test]
    fn published_detectors_re_score_to_their_known_totals_and_rank() {
        let d = data();
        assert_eq!(d.files.len(), 51);
        assert_eq!(d.categories().len(), 6);
        let dets = [Detector::Published("ARTime".into()), Detector::Published("null".into())];
        let mut calls = Vec::new();
        let r = evaluate(&d, &dets, |a, b| calls.push((a, b))).unwrap();
        assert_eq!(calls, [(1, 2), (2, 2)]);
        let std = |k: usize| &r[k].profiles[0];
        assert_eq!(std(0).profile, "standard");
        // null detects nothing useful: 0 by NAB's normalisation, on the corpus and per category.
        assert!(std(1).normalised.abs() < 1e-9, "{:?}", std(1));
        assert!(std(0).normalised > 60.0, "ARTime {:?}", std(0));
        let no_windows = std(0).by_category.iter().find(|c| c.category == "artificialNoAnomaly").unwrap();
        assert!(no_windows.normalised.is_none());
        let t = table(&r, None, d.files.len());
        assert!(t.contains("| ARTime |") && t.contains("reward_low_FN_rate") && t.contains("FP |"), "{t}");
    }

    #[test]
    fn leave_one_out_scores_each_category_with_parameters_chosen_elsewhere() {
        let d = data();
        let mut grid = novelty_surprise_grid();
        grid.truncate(2);
        let l = leave_one_category_out(&d, &grid, "standard", |_, _| {}).unwrap();
        assert_eq!(l.categories.len(), 6);
        assert!(l.normalised.is_finite() && l.tuned_on_all.is_finite());
        let window = SignalsConfig { detector: DetectorKind::Window, window: 16, ..SignalsConfig::default() };
        let t = table(&evaluate(&d, &[Detector::Agent(Box::new(window))], |_, _| {}).unwrap(), Some(&l), 51);
        assert!(t.contains("all, left out") && t.contains("omen window (w=16)"), "{t}");
    }

    #[test]
    fn skab_rows_are_the_published_detectors_ranked_by_f1() {
        let (rows, files) = skab_published(&omen_nab::skab::data_dir()).unwrap();
        assert_eq!((rows.len(), files), (10, 30));
        assert!(rows.windows(2).all(|w| w[0].scores.f1 >= w[1].scores.f1));
        let t = skab_table(&rows, files);
        assert!(t.contains("| Conv_AE | 0.79 | 13.09 | 27.86 | 24.86 | 22.81 | 28.88 |"), "{t}");
        let e = skab_published(Path::new("/nonexistent/skab")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/skab"), "{e}");
    }

    #[test]
    fn a_missing_checkout_names_the_path() {
        let e = NabData::load(Path::new("/nonexistent/nab")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/nab"), "{e}");
    }
}
