//! SKAB's scoring (the Skoltech Anomaly Benchmark, waico/SKAB `core/metrics.py`), ported:
//! outlier detection as binary classification over the test rows (F1, FAR %, MAR %), and
//! changepoint detection scored NAB-style with SKAB's own scoring curve, an anomaly window
//! of `window_s` seconds to the right of each true changepoint, overlapping windows cut
//! on the right, and the first prediction in a window counted.
//!
//! Figures are summed over files before normalising, and rounded to 2 decimals as SKAB
//! prints them ([`SkabScores::rounded`]).

use std::path::{Path, PathBuf};

use crate::NabError;

/// Errors while reading SKAB data or scoring on it; each names the file and the fix.
#[derive(Debug, thiserror::Error)]
pub enum SkabError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}; check that the SKAB copy (data/, published/) is complete")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A file did not have the expected shape.
    #[error("{path}: {problem}; fix the file or point at an unmodified SKAB copy")]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        problem: String,
    },
}

impl From<NabError> for SkabError {
    fn from(e: NabError) -> Self {
        match e {
            NabError::Io { path, source } => SkabError::Io { path, source },
            NabError::Format { path, problem } => SkabError::Format { path, problem },
        }
    }
}

/// The training rows of every SKAB file (the leaderboard's protocol).
pub const TRAINING_ROWS: usize = 400;

/// SKAB's NAB profiles: (name, A_tp, A_fp, A_fn).
pub const PROFILES: [(&str, f64, f64, f64); 3] =
    [("standard", 1.0, -0.11, -1.0), ("low_fp", 1.0, -0.22, -1.0), ("low_fn", 1.0, -0.11, -2.0)];

/// Points of SKAB's scoring curve over a window.
const CURVE_POINTS: usize = 1000;

/// One SKAB file's test part: time stamps (seconds) and its labels.
#[derive(Debug, Clone, PartialEq)]
pub struct SkabFile {
    /// `folder/file.csv`.
    pub rel: String,
    /// Time stamps of the test rows, Unix seconds.
    pub times: Vec<i64>,
    /// `anomaly` of the test rows.
    pub anomaly: Vec<bool>,
    /// `changepoint` of the test rows.
    pub changepoint: Vec<bool>,
    /// The sensor columns' names.
    pub columns: Vec<String>,
    /// Every row's sensor values (training rows first), row-major.
    pub rows: Vec<Vec<f64>>,
}

/// Confusion counts over test rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Confusion {
    /// True positives.
    pub tp: u64,
    /// True negatives.
    pub tn: u64,
    /// False positives.
    pub fp: u64,
    /// False negatives.
    pub fn_: u64,
}

/// NAB sums of one or more files: (score, null, perfect) per profile.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NabSums {
    /// Per profile of [`PROFILES`]: the detector's raw score.
    pub score: [f64; 3],
    /// The null detector's (every window missed).
    pub null: [f64; 3],
    /// The perfect detector's.
    pub perfect: [f64; 3],
}

/// SKAB's figures for a detector over a set of files.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SkabScores {
    /// F1 of the outlier problem.
    pub f1: f64,
    /// False alarm rate, %.
    pub far_pct: f64,
    /// Missing alarm rate, %.
    pub mar_pct: f64,
    /// NAB standard profile of the changepoint problem.
    pub nab_standard: f64,
    /// NAB LowFP.
    pub nab_low_fp: f64,
    /// NAB LowFN.
    pub nab_low_fn: f64,
}

impl SkabScores {
    /// Every figure rounded to 2 decimals, as SKAB reports them.
    pub fn rounded(&self) -> Self {
        let r = |x: f64| (x * 100.0).round() / 100.0;
        Self {
            f1: r(self.f1),
            far_pct: r(self.far_pct),
            mar_pct: r(self.mar_pct),
            nab_standard: r(self.nab_standard),
            nab_low_fp: r(self.nab_low_fp),
            nab_low_fn: r(self.nab_low_fn),
        }
    }
}

/// Binary confusion of `prediction` against `truth` over the rows predicted (`None`:
/// not predicted, counted nowhere, as SKAB's time-aligned series do).
pub fn confusion(truth: &[bool], prediction: &[Option<bool>]) -> Confusion {
    let mut c = Confusion::default();
    for (&t, p) in truth.iter().zip(prediction) {
        let Some(p) = *p else { continue };
        match (t, p) {
            (true, true) => c.tp += 1,
            (false, false) => c.tn += 1,
            (false, true) => c.fp += 1,
            (true, false) => c.fn_ += 1,
        }
    }
    c
}

/// Predicted changepoints: where the prediction changes, and the first predicted row if
/// it is set; rows not predicted are none.
pub fn changepoints(prediction: &[Option<bool>]) -> Vec<bool> {
    let mut previous: Option<bool> = None;
    prediction
        .iter()
        .map(|p| match (*p, previous) {
            (None, _) => false,
            (Some(v), None) => {
                previous = Some(v);
                v
            }
            (Some(v), Some(before)) => {
                previous = Some(v);
                v != before
            }
        })
        .collect()
}

/// Windows `[t, t + width]` to the right of each true changepoint time, in order; a
/// window starting inside the previous one starts where it ends (SKAB's "cut right window").
pub fn windows(changepoint_times: &[i64], width: i64) -> Vec<(i64, i64)> {
    let mut w: Vec<(i64, i64)> = changepoint_times.iter().map(|&t| (t, t + width)).collect();
    for i in 1..w.len() {
        if w[i - 1].1 >= w[i].0 {
            w[i].0 = w[i - 1].1;
        }
    }
    w
}

/// SKAB's scoring curve at the first detection `t` of window `(start, end)`: A_tp at the
/// window's start falling along a tanh to A_fp at its end, sampled at 1000 points.
pub fn window_score(start: i64, t: i64, end: i64, a_tp: f64, a_fp: f64) -> f64 {
    let rel = if end > start { (t - start) as f64 / (end - start) as f64 } else { 0.0 };
    let index = ((rel * CURVE_POINTS as f64) as usize).min(CURVE_POINTS - 1);
    let half_pi = std::f64::consts::FRAC_PI_2;
    let x = -half_pi + index as f64 * (2.0 * half_pi) / (CURVE_POINTS - 1) as f64;
    let half = (a_tp - a_fp) / 2.0;
    -half * x.tanh() / half_pi.tanh() + half + a_fp
}

/// NAB sums of one file: predicted changepoints at `times` against `windows`.
pub fn nab_sums(times: &[i64], predicted: &[bool], windows: &[(i64, i64)]) -> NabSums {
    let detections: Vec<i64> = times.iter().zip(predicted).filter(|(_, &p)| p).map(|(&t, _)| t).collect();
    let mut false_positives = 0usize;
    let mut first_in_window: Vec<Option<i64>> = Vec::with_capacity(windows.len());
    for (i, &(start, end)) in windows.iter().enumerate() {
        first_in_window.push(detections.iter().copied().find(|&t| t >= start && t <= end));
        // Detections before the first window, and between this window and the next.
        let before = |t: i64| if i == 0 { t < start } else { false };
        let after = |t: i64| match windows.get(i + 1) {
            Some(&(next, _)) => t > end && t < next,
            None => t > end,
        };
        false_positives += detections.iter().filter(|&&t| before(t) || after(t)).count();
    }
    if windows.is_empty() {
        false_positives = detections.len();
    }
    let missed = first_in_window.iter().filter(|f| f.is_none()).count();
    let mut sums = NabSums::default();
    for (k, &(_, a_tp, a_fp, a_fn)) in PROFILES.iter().enumerate() {
        let mut score = a_fp * false_positives as f64 + a_fn * missed as f64;
        for (&(start, end), first) in windows.iter().zip(&first_in_window) {
            if let Some(t) = first {
                score += window_score(start, *t, end, a_tp, a_fp);
            }
        }
        sums.score[k] = score;
        sums.null[k] = windows.len() as f64 * a_fn;
        sums.perfect[k] = windows.len() as f64 * a_tp;
    }
    sums
}

/// SKAB's figures for `predictions` (one per file, one per test row, `None` where the
/// detector gives none) on `files`, with NAB windows `window_s` seconds wide (SKAB uses 60).
pub fn score(
    files: &[SkabFile],
    predictions: &[Vec<Option<bool>>],
    window_s: i64,
) -> Result<SkabScores, SkabError> {
    let mut c = Confusion::default();
    let mut sums = NabSums::default();
    for (f, p) in files.iter().zip(predictions) {
        if p.len() != f.times.len() {
            return Err(SkabError::Format {
                path: f.rel.clone(),
                problem: format!(
                    "{} predictions for {} test rows; predict every row after the first {TRAINING_ROWS}",
                    p.len(),
                    f.times.len()
                ),
            });
        }
        let fc = confusion(&f.anomaly, p);
        c.tp += fc.tp;
        c.tn += fc.tn;
        c.fp += fc.fp;
        c.fn_ += fc.fn_;
        let truth: Vec<i64> =
            f.times.iter().zip(&f.changepoint).filter(|(_, &cp)| cp).map(|(&t, _)| t).collect();
        let s = nab_sums(&f.times, &changepoints(p), &windows(&truth, window_s));
        for k in 0..3 {
            sums.score[k] += s.score[k];
            sums.null[k] += s.null[k];
            sums.perfect[k] += s.perfect[k];
        }
    }
    let (tp, tn, fp, fn_) = (c.tp as f64, c.tn as f64, c.fp as f64, c.fn_ as f64);
    let nab = |k: usize| 100.0 * (sums.score[k] - sums.null[k]) / (sums.perfect[k] - sums.null[k]);
    Ok(SkabScores {
        f1: tp / (tp + (fn_ + fp) / 2.0),
        far_pct: fp / (fp + tn) * 100.0,
        mar_pct: fn_ / (fn_ + tp) * 100.0,
        nab_standard: nab(0),
        nab_low_fp: nab(1),
        nab_low_fn: nab(2),
    })
}

/// The SKAB data to use: `$OMEN_SKAB_DIR`, else the repository's copy in data/skab.
pub fn data_dir() -> PathBuf {
    std::env::var_os("OMEN_SKAB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/skab"))
}

/// The anomaly files under `dir/data` (every folder but anomaly-free), as `folder/file.csv`,
/// in folder order then by file number.
pub fn data_files(dir: &Path) -> Result<Vec<String>, SkabError> {
    let data = dir.join("data");
    let mut out = Vec::new();
    let mut folders = list(&data)?;
    folders.retain(|f| f != "anomaly-free");
    folders.sort();
    for folder in folders {
        let mut files: Vec<String> = list(&data.join(&folder))?
            .into_iter()
            .filter_map(|f| f.strip_suffix(".csv.gz").or_else(|| f.strip_suffix(".csv")).map(str::to_owned))
            .collect();
        files.sort_by_key(|f| (f.parse::<u64>().unwrap_or(u64::MAX), f.clone()));
        out.extend(files.into_iter().map(|f| format!("{folder}/{f}.csv")));
    }
    if out.is_empty() {
        return Err(SkabError::Format {
            path: data.display().to_string(),
            problem:
                "no SKAB data files; point OMEN_SKAB_DIR (or --skab) at a copy with data/<folder>/<n>.csv"
                    .into(),
        });
    }
    Ok(out)
}

fn list(dir: &Path) -> Result<Vec<String>, SkabError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| SkabError::Io { path: dir.display().to_string(), source: e })?;
    Ok(entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
}

fn seconds(path: &Path, line: usize, t: &str) -> Result<i64, SkabError> {
    chrono::NaiveDateTime::parse_from_str(t.trim(), "%Y-%m-%d %H:%M:%S")
        .map(|d| d.and_utc().timestamp())
        .map_err(|e| SkabError::Format {
            path: path.display().to_string(),
            problem: format!("line {line}: time stamp {t:?} is not YYYY-MM-DD HH:MM:SS ({e})"),
        })
}

fn number(path: &Path, line: usize, column: &str, v: &str) -> Result<f64, SkabError> {
    v.trim().parse().map_err(|_| SkabError::Format {
        path: path.display().to_string(),
        problem: format!("line {line}: {column} = {v:?} is not a number"),
    })
}

/// Reads a SKAB data file (`;`-separated, `datetime` first, `anomaly` and `changepoint`
/// last; plain or `.gz`).
pub fn read_file(dir: &Path, rel: &str) -> Result<SkabFile, SkabError> {
    let path = dir.join("data").join(rel);
    let text = crate::read(&path).map_err(SkabError::from)?;
    let mut lines = text.lines().enumerate();
    let header: Vec<&str> = lines.next().map(|(_, h)| h.split(';').collect()).unwrap_or_default();
    let (Some(a), Some(c)) =
        (header.iter().position(|h| *h == "anomaly"), header.iter().position(|h| *h == "changepoint"))
    else {
        return Err(SkabError::Format {
            path: path.display().to_string(),
            problem: "the header has no anomaly and changepoint columns; is this a SKAB file?".into(),
        });
    };
    let sensors: Vec<usize> = (1..header.len()).filter(|&i| i != a && i != c).collect();
    let mut f = SkabFile {
        rel: rel.to_owned(),
        times: Vec::new(),
        anomaly: Vec::new(),
        changepoint: Vec::new(),
        columns: sensors.iter().map(|&i| header[i].to_owned()).collect(),
        rows: Vec::new(),
    };
    for (row, (i, line)) in lines.filter(|(_, l)| !l.trim().is_empty()).enumerate() {
        let cells: Vec<&str> = line.split(';').collect();
        if cells.len() != header.len() {
            return Err(SkabError::Format {
                path: path.display().to_string(),
                problem: format!("line {}: {} fields, the header has {}", i + 1, cells.len(), header.len()),
            });
        }
        f.rows.push(
            sensors.iter().map(|&k| number(&path, i + 1, header[k], cells[k])).collect::<Result<_, _>>()?,
        );
        if row >= TRAINING_ROWS {
            f.times.push(seconds(&path, i + 1, cells[0])?);
            f.anomaly.push(number(&path, i + 1, "anomaly", cells[a])? == 1.0);
            f.changepoint.push(number(&path, i + 1, "changepoint", cells[c])? == 1.0);
        }
    }
    if f.times.is_empty() {
        return Err(SkabError::Format {
            path: path.display().to_string(),
            problem: format!(
                "{} rows; SKAB files need more than the {TRAINING_ROWS} training rows",
                f.rows.len()
            ),
        });
    }
    Ok(f)
}

/// Reads a published detector's predictions for `file` (`published/<algorithm>/<rel>`,
/// `datetime;prediction`): a contiguous run of its test rows, `None` for the rows it does
/// not cover (detectors with an input window, such as MSCRED, start later).
pub fn read_prediction(dir: &Path, algorithm: &str, file: &SkabFile) -> Result<Vec<Option<bool>>, SkabError> {
    let path = dir.join("published").join(algorithm).join(&file.rel);
    let text = crate::read(&path).map_err(SkabError::from)?;
    let bad = |problem: String| SkabError::Format { path: path.display().to_string(), problem };
    let mut out = vec![None; file.times.len()];
    let mut next: Option<usize> = None;
    for (i, line) in text.lines().enumerate().skip(1).filter(|(_, l)| !l.trim().is_empty()) {
        let (t, p) = line
            .split_once(';')
            .ok_or_else(|| bad(format!("line {}: expected datetime;prediction", i + 1)))?;
        let ts = seconds(&path, i + 1, t)?;
        let row = match next {
            None => file.times.iter().position(|&x| x == ts),
            Some(r) => (file.times.get(r) == Some(&ts)).then_some(r),
        }
        .ok_or_else(|| {
            bad(format!(
                "line {}: {t} is not the next test row of {}; predict consecutive test rows",
                i + 1,
                file.rel
            ))
        })?;
        out[row] = Some(number(&path, i + 1, "prediction", p)? == 1.0);
        next = Some(row + 1);
    }
    if next.is_none() {
        return Err(bad(format!("no predictions for {}", file.rel)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_curve_runs_from_a_tp_at_the_start_to_a_fp_at_the_end() {
        assert!((window_score(0, 0, 60, 1.0, -0.11) - 1.0).abs() < 1e-12);
        assert!((window_score(0, 60, 60, 1.0, -0.11) + 0.11).abs() < 1e-12);
        let mid = window_score(0, 30, 60, 1.0, -0.11);
        assert!((mid - 0.445).abs() < 0.01, "{mid}");
    }

    #[test]
    fn overlapping_windows_are_cut_on_the_right() {
        assert_eq!(windows(&[0, 30, 200], 60), [(0, 60), (60, 90), (200, 260)]);
    }

    #[test]
    fn detections_are_hits_misses_and_false_positives() {
        let times: Vec<i64> = (0..300).collect();
        let mut p = vec![false; 300];
        p[5] = true; // before the first window: FP
        p[100] = true; // first in window 1 at its start: A_tp
        p[110] = true; // second in window 1: ignored
        p[250] = true; // after the last window: FP
        let s = nab_sums(&times, &p, &[(100, 160), (180, 240)]);
        // standard: 2 FPs x -0.11, one miss x -1, one hit at the start = 1.
        assert!((s.score[0] - (1.0 - 1.0 - 0.22)).abs() < 1e-12, "{s:?}");
        assert_eq!((s.null[0], s.perfect[0]), (-2.0, 2.0));
        let some = |v: &[bool]| v.iter().map(|&b| Some(b)).collect::<Vec<_>>();
        assert_eq!(changepoints(&some(&[true, true, false, true])), [true, false, true, true]);
        assert_eq!(changepoints(&[None, Some(true), Some(true)]), [false, true, false]);
        let c = confusion(&[true, false, true, true], &[Some(true), Some(true), Some(false), None]);
        assert_eq!(c, Confusion { tp: 1, tn: 0, fp: 1, fn_: 1 });
    }
}
