//! The LSTM autoencoder the agent trains itself (`model` without `path`): once the store
//! holds `model.train_after` of data, and then every `model.retrain_every`, the newest
//! `model.train_window` of the `model.signals` series goes to `omen-worker train` in a
//! process of its own; the candidate is validated on the newest `model.holdout` of that
//! data (held back from training) and refused when its windows there alarm more often than
//! `model.max_alarm_rate`. An accepted candidate replaces the model file by renames (the
//! old one stays as `lstm-ae.previous.ot` to roll back to) and is loaded into the model
//! worker; a candidate the worker cannot load is rolled back.
//!
//! Time is event time, as everywhere in the pipeline. A trace replayed as fast as possible
//! waits for each training, so the model joins at the same point of the trace every run;
//! live, training runs beside the pipeline and the model is swapped in at the next tick.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What /scores/latest says about the LSTM-AE.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelStatus {
    /// `file` (model.path), `trained` (by the agent) or `none` yet.
    pub origin: &'static str,
    /// `active`, `training` (beside an active model or not), `waiting_for_data` (before
    /// `model.train_after`) or `none_accepted` (trainings ran, none passed; see `last_training`).
    pub state: &'static str,
    /// The model file in use.
    pub path: Option<PathBuf>,
    /// End of the data the model in use was trained on, ms (trained models).
    pub trained_until_ms: Option<i64>,
    /// Event time since then, seconds.
    pub age_seconds: Option<f64>,
    /// Its input series.
    pub inputs: Vec<String>,
    /// Its validation on the held-back data (trained models).
    pub validation: Option<Validation>,
    /// The last training the agent ran.
    pub last_training: Option<TrainingOutcome>,
    /// The last few trainings, newest first (the last one included).
    pub recent_trainings: Vec<TrainingOutcome>,
    /// Event time from which the next training may start, ms.
    pub next_training_ms: Option<i64>,
}

/// A trained model's figures on the data held back from its training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Validation {
    /// Windows that end in the held-back rows.
    pub windows: usize,
    /// Of those, windows at or above the model's threshold.
    pub alarms: usize,
    /// alarms / windows.
    pub alarm_rate: f64,
    /// The bound it had to meet (`model.max_alarm_rate`).
    pub max_alarm_rate: f64,
}

/// How a training ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingOutcome {
    /// Event time it started, ms.
    pub started_ms: i64,
    /// `accepted`, `refused` or `failed`.
    pub outcome: String,
    /// What happened, in words.
    pub detail: String,
}

/// Model file names in `model.dir`.
pub const CURRENT: &str = "lstm-ae.ot";
/// The model before the current one, kept to roll back to.
pub const PREVIOUS: &str = "lstm-ae.previous.ot";
#[cfg(feature = "lstm")]
const TRAINING_DATA: &str = "training-data.jsonl";
#[cfg(feature = "lstm")]
const TRAINING_LOG: &str = "training.log";
#[cfg(feature = "lstm")]
const SCHEDULE: &str = "schedule.json";
/// Trainings kept in `recent_trainings`.
#[cfg(feature = "lstm")]
const RECENT: usize = 5;

/// The accept-or-refuse rule: enough held-back windows, and few enough alarms on them.
pub fn judge(
    report: &omen_protocol::training::TrainReport,
    max_alarm_rate: f64,
) -> Result<Validation, String> {
    let v = Validation {
        windows: report.holdout_windows,
        alarms: report.holdout_alarms,
        alarm_rate: report.holdout_alarm_rate(),
        max_alarm_rate,
    };
    if v.windows == 0 {
        return Err(format!(
            "no held-back window to validate on ({} rows, {} trained on): raise model.train_window or model.holdout",
            report.rows, report.train_rows
        ));
    }
    if v.alarm_rate > max_alarm_rate {
        return Err(format!(
            "alarms on {} of {} held-back windows ({:.2}% > model.max_alarm_rate {:.2}%)",
            v.alarms,
            v.windows,
            100.0 * v.alarm_rate,
            100.0 * max_alarm_rate
        ));
    }
    Ok(v)
}

#[cfg(feature = "lstm")]
pub use trainer::AutoTrainer;

#[cfg(feature = "lstm")]
mod trainer {
    use std::collections::BTreeMap;
    use std::io::Write;
    use std::path::{Path, PathBuf};
    use std::sync::{mpsc, Arc, Mutex};
    use std::time::{Duration, Instant};

    use anyhow::{bail, Context, Result};
    use omen_protocol::training::TrainReport;
    use omen_store::{Resolution, Store};

    use super::*;
    use crate::config::ModelConfig;
    use crate::lstm_live::LiveModel;
    use crate::metrics::LiveMetrics;
    use crate::worker::{Worker, WorkerError};

    /// The record kept beside a model file (`<file>.json`).
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub(super) struct ModelRecord {
        /// The end of its training data (the training's start, event time), ms.
        pub(super) trained_until_ms: i64,
        /// CRC-32 of the model file, so that a record never describes another file.
        pub(super) crc32: u32,
        pub(super) validation: Validation,
        pub(super) report: TrainReport,
    }

    /// What survives a restart besides the model: the schedule and the recent outcomes.
    #[derive(Debug, Clone, Default, Serialize, Deserialize)]
    struct Schedule {
        last_start_ms: Option<i64>,
        recent: Vec<TrainingOutcome>,
    }

    pub(super) fn record_path(model: &Path) -> PathBuf {
        model.with_extension("json")
    }

    pub(super) fn crc32(path: &Path) -> std::io::Result<u32> {
        let mut crc = flate2::Crc::new();
        crc.update(&std::fs::read(path)?);
        Ok(crc.sum())
    }

    fn remove_model(path: &Path) {
        for p in [path.to_owned(), record_path(path)] {
            let _ = std::fs::remove_file(p);
        }
    }

    /// A failed retry comes sooner than a scheduled retraining.
    const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(3600);

    /// A training in flight: its start (event time), the end of its data, its files and result.
    struct Job {
        started_ms: i64,
        candidate: PathBuf,
        done: mpsc::Receiver<Result<TrainReport>>,
        child: Arc<Mutex<std::process::Child>>,
    }

    /// Trains, validates and swaps the agent's own LSTM-AE (see the module doc).
    pub struct AutoTrainer {
        cfg: ModelConfig,
        step: Duration,
        dir: PathBuf,
        worker: Arc<Worker>,
        live: Arc<LiveMetrics>,
        wait: bool,
        job: Option<Job>,
        schedule: Schedule,
        /// The store's oldest raw sample, once seen (how long the agent has had data).
        first_data_ms: Option<i64>,
        current: Option<ModelRecord>,
        inputs: Vec<String>,
    }

    impl Drop for AutoTrainer {
        /// A training still running when the agent stops is killed, not left behind.
        fn drop(&mut self) {
            if let Some(job) = self.job.take() {
                let mut child = job.child.lock().unwrap_or_else(|e| e.into_inner());
                if matches!(child.try_wait(), Ok(None)) {
                    let _ = child.kill();
                    let _ = child.wait();
                    tracing::info!("LSTM-AE: the training in progress was stopped with the agent");
                }
                remove_model(&job.candidate);
            }
        }
    }

    impl AutoTrainer {
        /// A trainer writing to `cfg.models_dir(store)`; a model a previous run trained there
        /// is returned to be loaded. One that does not match its record or that the worker
        /// refuses (another version, damage) is moved aside and a new one trained; a worker
        /// that cannot be reached is a start-up error.
        pub fn start(
            cfg: &ModelConfig,
            step: Duration,
            store_path: &Path,
            worker: Arc<Worker>,
            live: Arc<LiveMetrics>,
            wait: bool,
        ) -> Result<(Self, Option<LiveModel>)> {
            let dir = cfg.models_dir(store_path);
            std::fs::create_dir_all(&dir).with_context(|| {
                format!("model.dir: cannot create {}; choose a writable folder", dir.display())
            })?;
            // Leftovers of a run that was killed mid-training.
            for entry in std::fs::read_dir(&dir)?.flatten() {
                if entry.file_name().to_string_lossy().starts_with("lstm-ae.candidate-") {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
            let _ = std::fs::remove_file(dir.join(TRAINING_DATA));
            let schedule = std::fs::read_to_string(dir.join(SCHEDULE))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default();
            let mut me = Self {
                cfg: cfg.clone(),
                step,
                dir,
                worker,
                live,
                wait,
                job: None,
                schedule,
                first_data_ms: None,
                current: None,
                inputs: Vec::new(),
            };
            let model = me.load_current()?;
            me.publish(None);
            Ok((me, model))
        }

        fn load_current(&mut self) -> Result<Option<LiveModel>> {
            let path = self.dir.join(CURRENT);
            if !path.exists() {
                return Ok(None);
            }
            let record = std::fs::read_to_string(record_path(&path))
                .map_err(|e| format!("its record {} cannot be read ({e})", record_path(&path).display()))
                .and_then(|t| {
                    serde_json::from_str::<ModelRecord>(&t).map_err(|e| {
                        format!("its record {} is not valid ({e})", record_path(&path).display())
                    })
                })
                .and_then(|r| match crc32(&path) {
                    Ok(c) if c == r.crc32 => Ok(r),
                    Ok(_) => Err(format!(
                        "it is not the file its record {} describes",
                        record_path(&path).display()
                    )),
                    Err(e) => Err(format!("it cannot be read ({e})")),
                });
            let why = match record {
                Err(why) => why,
                Ok(record) => {
                    match LiveModel::load(self.worker.clone(), &path, self.cfg.threads, "model.dir") {
                        Ok(m) => {
                            tracing::info!(path = %path.display(), "LSTM-AE: the model trained by a previous run is in use");
                            self.inputs = m.sources().to_vec();
                            self.current = Some(record);
                            return Ok(Some(m));
                        }
                        // The worker read the file and refused it: the file is at fault.
                        Err(e)
                            if matches!(
                                e.downcast_ref::<WorkerError>(),
                                Some(WorkerError::Failed(_) | WorkerError::Unexpected { .. })
                            ) =>
                        {
                            format!("{e:#}")
                        }
                        Err(e) => return Err(e),
                    }
                }
            };
            let aside = self.dir.join(format!("lstm-ae.bad-{}.ot", chrono::Utc::now().timestamp()));
            std::fs::rename(&path, &aside)?;
            if record_path(&path).exists() {
                std::fs::rename(record_path(&path), record_path(&aside))?;
            }
            tracing::warn!(
                "LSTM-AE: the trained model {} cannot be used: {why}; moved aside to {}, a new one is trained",
                path.display(),
                aside.display()
            );
            Ok(None)
        }

        /// One tick: collects a finished training (accepting or refusing it), or starts one
        /// when due. Returns a newly accepted model for the engine to score with.
        pub fn tick(&mut self, now_ms: i64, store: &Store) -> Option<LiveModel> {
            let mut swapped = self.collect();
            if self.job.is_none() && self.due(now_ms, store) {
                self.schedule.last_start_ms = Some(now_ms);
                match self.spawn(now_ms, store) {
                    Ok(job) => self.job = Some(job),
                    Err(e) => self.finish(now_ms, "failed", format!("{e:#}")),
                }
                if self.wait && self.job.is_some() {
                    swapped = self.collect().or(swapped);
                }
            }
            self.publish(Some(now_ms));
            swapped
        }

        /// What /scores/latest shows.
        pub fn status(&self, now_ms: i64) -> ModelStatus {
            let state = match (&self.job, &self.current) {
                (Some(_), _) => "training",
                (None, Some(_)) => "active",
                (None, None) if self.schedule.recent.is_empty() => "waiting_for_data",
                (None, None) => "none_accepted",
            };
            let current = self.current.as_ref();
            ModelStatus {
                origin: if current.is_some() { "trained" } else { "none" },
                state,
                path: current.map(|_| self.dir.join(CURRENT)),
                trained_until_ms: current.map(|r| r.trained_until_ms),
                age_seconds: current.map(|r| (now_ms - r.trained_until_ms).max(0) as f64 / 1e3),
                inputs: self.inputs.clone(),
                validation: current.map(|r| r.validation.clone()),
                last_training: self.schedule.recent.first().cloned(),
                recent_trainings: self.schedule.recent.clone(),
                next_training_ms: self.next_ms(),
            }
        }

        fn next_ms(&self) -> Option<i64> {
            let start = self.schedule.last_start_ms?;
            let failed = self.schedule.recent.first().is_some_and(|o| o.outcome == "failed");
            let after =
                if failed { self.cfg.retrain_every.min(RETRY_AFTER_FAILURE) } else { self.cfg.retrain_every };
            Some(start + after.as_millis() as i64)
        }

        fn due(&mut self, now_ms: i64, store: &Store) -> bool {
            if let Some(next) = self.next_ms() {
                return now_ms >= next;
            }
            if self.first_data_ms.is_none() {
                self.first_data_ms = store.earliest_ts().ok().flatten();
            }
            self.first_data_ms.is_some_and(|first| now_ms - first >= self.cfg.train_after.as_millis() as i64)
        }

        fn publish(&self, now_ms: Option<i64>) {
            let live = &self.live;
            live.model_active.clear();
            live.model_holdout_alarm_ratio.clear();
            if let Some(r) = &self.current {
                let origin = vec![("origin".into(), "trained".into())];
                live.model_active.get_or_create(&origin).set(1);
                live.model_holdout_alarm_ratio.get_or_create(&origin).set(r.validation.alarm_rate);
                if let Some(now) = now_ms {
                    live.model_age_seconds
                        .get_or_create(&origin)
                        .set((now - r.trained_until_ms).max(0) as f64 / 1e3);
                }
            } else {
                live.model_age_seconds.clear();
            }
        }

        /// Logs, counts and keeps an outcome, and saves the schedule.
        fn finish(&mut self, started_ms: i64, outcome: &str, detail: String) {
            match outcome {
                "accepted" => tracing::info!("LSTM-AE training: {detail}"),
                _ => tracing::warn!("LSTM-AE training {outcome}: {detail}"),
            }
            self.live.model_trainings.get_or_create(&vec![("outcome".into(), outcome.into())]).inc();
            self.schedule.recent.insert(0, TrainingOutcome { started_ms, outcome: outcome.into(), detail });
            self.schedule.recent.truncate(RECENT);
            let path = self.dir.join(SCHEDULE);
            let saved = serde_json::to_string_pretty(&self.schedule)
                .map_err(std::io::Error::other)
                .and_then(|text| std::fs::write(&path, text));
            if let Err(e) = saved {
                tracing::warn!(
                    "LSTM-AE: cannot save {} ({e}); a restart may train again at once",
                    path.display()
                );
            }
        }

        /// Writes the training data and starts `omen-worker train` in a process of its own,
        /// watched by a thread that kills it after `model.train_timeout`.
        fn spawn(&self, now_ms: i64, store: &Store) -> Result<Job> {
            let data = self.dir.join(TRAINING_DATA);
            let (series, rows) = self.export(now_ms, store, &data)?;
            tracing::info!(series, rows, "LSTM-AE: training a candidate model on the store's newest data");
            let candidate = self.dir.join(format!("lstm-ae.candidate-{now_ms}.ot"));
            let report_path = record_path(&candidate);
            let log_path = self.dir.join(TRAINING_LOG);
            let log = std::fs::File::create(&log_path)
                .with_context(|| format!("model.dir: cannot write {}", log_path.display()))?;
            let program = self.worker.program().to_owned();
            let mut cmd = std::process::Command::new(&program);
            cmd.arg("train")
                .arg("--data")
                .arg(&data)
                .args(["--step", &format!("{}ms", self.step.as_millis())])
                .args(["--train-fraction", &format!("{}", 1.0 - self.cfg.holdout)])
                .args(["--epochs", &self.cfg.epochs.to_string(), "--threads", "1", "--no-progress"])
                .arg("--out")
                .arg(&candidate)
                .arg("--report")
                .arg(&report_path)
                .stdin(std::process::Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log);
            let child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    let _ = std::fs::remove_file(&data);
                    return Err(e).with_context(|| format!("cannot run {} (worker.path)", program.display()));
                }
            };
            let child = Arc::new(Mutex::new(child));
            let (tx, done) = mpsc::channel();
            let (running, timeout) = (child.clone(), self.cfg.train_timeout);
            std::thread::Builder::new().name("omen-model-training".into()).spawn(move || {
                let result = watch(&running, timeout, &program, &log_path, &report_path);
                let _ = std::fs::remove_file(&data);
                let _ = tx.send(result);
            })?;
            Ok(Job { started_ms: now_ms, candidate, done, child })
        }

        /// The newest `train_window` of every `signals` series with data in at least half of
        /// the steps, both of the whole window and of its held-back part (a series that went
        /// silent would never be scored live), at most `max_series` of them (those with the
        /// most data), as a JSONL trace of per-step means.
        fn export(&self, now_ms: i64, store: &Store, path: &Path) -> Result<(usize, usize)> {
            let step_ms = (self.step.as_millis() as i64).max(1);
            let earliest = store.earliest_ts()?.unwrap_or(now_ms);
            let since = (now_ms - self.cfg.train_window.as_millis() as i64).max(earliest);
            let held_back_from = now_ms - ((now_ms - since) as f64 * self.cfg.holdout) as i64;
            // Minute aggregates cover the whole window; raw samples are needed below a minute.
            let resolution = if step_ms < 60_000 { Resolution::Raw } else { Resolution::Minute };
            let steps = ((now_ms - since) / step_ms).max(1) as usize;
            let held_back_steps = ((now_ms - held_back_from) / step_ms).max(1) as usize;
            let mut chosen = Vec::new();
            for signal in &self.cfg.signals {
                for s in store.range(signal, &BTreeMap::new(), since, now_ms + 1, step_ms, resolution)? {
                    let recent = s.points.iter().filter(|p| p.0 >= held_back_from).count();
                    if s.points.len() * 2 >= steps && recent * 2 >= held_back_steps {
                        chosen.push((signal.clone(), s));
                    }
                }
            }
            if chosen.is_empty() {
                bail!(
                    "the store has no series of model.signals {:?} with data in most of the last {} \
                     (and of its held-back part); name signals the agent receives",
                    self.cfg.signals,
                    humantime::format_duration(Duration::from_millis((now_ms - since) as u64))
                );
            }
            chosen.sort_by_key(|c| std::cmp::Reverse(c.1.points.len()));
            if chosen.len() > self.cfg.max_series {
                let dropped: Vec<String> = chosen[self.cfg.max_series..]
                    .iter()
                    .map(|(sig, s)| {
                        omen_sources::SeriesKey { signal: sig.clone(), labels: s.labels.clone() }.to_string()
                    })
                    .collect();
                tracing::info!(?dropped, "LSTM-AE: more series than model.max_series; these are left out");
                chosen.truncate(self.cfg.max_series);
            }
            let mut lines: Vec<(i64, String)> = Vec::new();
            for (signal, s) in &chosen {
                for &(ts_ms, value) in &s.points {
                    let sample = omen_sources::Sample {
                        ts_ms,
                        signal: signal.clone(),
                        labels: s.labels.clone(),
                        value,
                    };
                    lines.push((ts_ms, serde_json::to_string(&sample)?));
                }
            }
            lines.sort_by_key(|l| l.0);
            let mut f = std::io::BufWriter::new(
                std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))?,
            );
            for (_, l) in &lines {
                writeln!(f, "{l}")?;
            }
            f.flush()?;
            Ok((chosen.len(), steps))
        }

        /// Collects a finished training; an accepted candidate is swapped in and returned.
        fn collect(&mut self) -> Option<LiveModel> {
            let job = self.job.as_ref()?;
            let result = if self.wait {
                job.done.recv().unwrap_or_else(|_| Err(anyhow::anyhow!("the training thread died")))
            } else {
                match job.done.try_recv() {
                    Ok(r) => r,
                    Err(mpsc::TryRecvError::Empty) => return None,
                    Err(mpsc::TryRecvError::Disconnected) => Err(anyhow::anyhow!("the training thread died")),
                }
            };
            let job = self.job.take().expect("checked above");
            let outcome = result.and_then(|report| {
                let crc32 = crc32(&job.candidate)
                    .with_context(|| format!("cannot read {}", job.candidate.display()))?;
                Ok((report, crc32))
            });
            let (report, crc32) = match outcome {
                Ok(r) => r,
                Err(e) => {
                    remove_model(&job.candidate);
                    self.finish(job.started_ms, "failed", format!("{e:#}"));
                    return None;
                }
            };
            let validation = match judge(&report, self.cfg.max_alarm_rate) {
                Ok(v) => v,
                Err(why) => {
                    remove_model(&job.candidate);
                    self.finish(job.started_ms, "refused", format!("candidate refused: {why}"));
                    return None;
                }
            };
            let record = ModelRecord { trained_until_ms: job.started_ms, crc32, validation, report };
            match swap_in(&self.dir, &job.candidate, &record, |path| {
                LiveModel::load(self.worker.clone(), path, self.cfg.threads, "model.dir")
            }) {
                Ok(model) => {
                    let v = &record.validation;
                    let detail = format!(
                        "candidate accepted and in use: {} inputs, {} training rows, alarms on {} of {} held-back windows ({:.2}%)",
                        record.report.columns.len(),
                        record.report.train_rows,
                        v.alarms,
                        v.windows,
                        100.0 * v.alarm_rate
                    );
                    self.finish(job.started_ms, "accepted", detail);
                    self.inputs = model.sources().to_vec();
                    self.current = Some(record);
                    Some(model)
                }
                Err(e) => {
                    remove_model(&job.candidate);
                    self.finish(
                        job.started_ms,
                        "failed",
                        format!("the candidate passed validation but {e:#}"),
                    );
                    None
                }
            }
        }
    }

    /// Waits for the training process (killing it after `timeout`) and reads its report.
    fn watch(
        child: &Mutex<std::process::Child>,
        timeout: Duration,
        program: &Path,
        log_path: &Path,
        report_path: &Path,
    ) -> Result<TrainReport> {
        let started = Instant::now();
        // Polled, so that the trainer can kill the child while this thread waits.
        let status = loop {
            let mut c = child.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(status) = c.try_wait()? {
                break status;
            }
            if started.elapsed() > timeout {
                let _ = c.kill();
                let _ = c.wait();
                bail!(
                    "the training ran longer than model.train_timeout ({}) and was killed; raise it, or lower \
                     model.train_window or model.epochs",
                    humantime::format_duration(timeout)
                );
            }
            drop(c);
            std::thread::sleep(Duration::from_millis(50));
        };
        if !status.success() {
            let log = std::fs::read_to_string(log_path).unwrap_or_default();
            let mut tail: Vec<&str> = log.lines().rev().take(3).collect();
            tail.reverse();
            bail!(
                "{} train exited with {status}: {} (log: {})",
                program.display(),
                tail.join(" / "),
                log_path.display()
            );
        }
        let text = std::fs::read_to_string(report_path)
            .with_context(|| format!("the worker wrote no report {}", report_path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{}: not a training report", report_path.display()))
    }

    /// Makes `candidate` the current model: the current one is linked to `lstm-ae.previous.ot`
    /// first, so that `lstm-ae.ot` always exists (a worker restart replays its load), and the
    /// candidate is renamed over it in one step. `load` then loads it into the worker; when it
    /// fails, the previous model is renamed back (the worker kept it loaded) and the error says so.
    pub(super) fn swap_in<M>(
        dir: &Path,
        candidate: &Path,
        record: &ModelRecord,
        load: impl FnOnce(&Path) -> Result<M>,
    ) -> Result<M> {
        let (current, previous) = (dir.join(CURRENT), dir.join(PREVIOUS));
        std::fs::write(record_path(candidate), serde_json::to_string_pretty(record)?)?;
        let had_current = current.exists();
        if had_current {
            remove_model(&previous);
            if std::fs::hard_link(&current, &previous).is_err() {
                std::fs::copy(&current, &previous)?;
            }
            if record_path(&current).exists() {
                std::fs::copy(record_path(&current), record_path(&previous))?;
            }
        }
        // The file first: a crash between the two renames leaves a record whose CRC does not
        // match, which start-up detects (the file is moved aside and a model trained again).
        std::fs::rename(candidate, &current)?;
        std::fs::rename(record_path(candidate), record_path(&current))?;
        match load(&current) {
            Ok(m) => Ok(m),
            Err(e) => {
                let undone = if had_current {
                    std::fs::rename(&previous, &current)
                        .and_then(|()| std::fs::rename(record_path(&previous), record_path(&current)))
                } else {
                    std::fs::remove_file(&current).and_then(|()| std::fs::remove_file(record_path(&current)))
                };
                let state = match (had_current, undone) {
                    (true, Ok(())) => "the previous model stays in use".to_owned(),
                    (false, Ok(())) => "no model is in use".to_owned(),
                    (_, Err(u)) => format!("and undoing the swap failed too ({u}); check {}", dir.display()),
                };
                Err(e.context(format!("the model worker could not load it; {state}")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(windows: usize, alarms: usize) -> omen_protocol::training::TrainReport {
        omen_protocol::training::TrainReport {
            rows: 1000,
            train_rows: 800,
            columns: vec!["a".into()],
            epochs_run: 3,
            train_loss: 0.1,
            val_loss: 0.1,
            seconds: 1.0,
            threshold: 0.5,
            holdout_windows: windows,
            holdout_alarms: alarms,
        }
    }

    /// A trainer on a store holding two days of `a` at one sample a minute.
    #[cfg(feature = "lstm")]
    fn trainer(dir: &std::path::Path, signals: &[&str], program: &str) -> (AutoTrainer, omen_store::Store) {
        let store = omen_store::Store::open(&dir.join("omen.db")).unwrap();
        let samples: Vec<omen_sources::Sample> = (0..2 * 1440)
            .map(|m| omen_sources::Sample {
                ts_ms: m * 60_000,
                signal: "a".into(),
                labels: Default::default(),
                value: (m % 7) as f64,
            })
            .collect();
        store.insert(&samples).unwrap();
        let cfg = crate::config::ModelConfig {
            train_after: std::time::Duration::from_secs(86_400),
            signals: signals.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let live = std::sync::Arc::new(crate::metrics::LiveMetrics::new());
        let worker = std::sync::Arc::new(crate::worker::Worker::new(
            program.into(),
            std::time::Duration::from_secs(1),
        ));
        let (t, model) = AutoTrainer::start(
            &cfg,
            std::time::Duration::from_secs(60),
            &dir.join("omen.db"),
            worker,
            live,
            true,
        )
        .unwrap();
        assert!(model.is_none());
        (t, store)
    }

    #[cfg(feature = "lstm")]
    #[test]
    fn a_training_that_cannot_run_is_a_failed_outcome_and_waits_for_the_schedule() {
        let dir = tempfile::tempdir().unwrap();
        let (mut t, store) = trainer(dir.path(), &["nothing_here"], "/nonexistent/omen-worker");
        // Before train_after: waiting.
        assert!(t.tick(20 * 3_600_000, &store).is_none());
        assert_eq!(t.status(20 * 3_600_000).state, "waiting_for_data");
        assert!(t.tick(86_400_000, &store).is_none());
        let s = t.status(86_400_000);
        assert_eq!((s.origin, s.state), ("none", "none_accepted"));
        let last = s.last_training.unwrap();
        assert_eq!(last.outcome, "failed");
        assert!(
            last.detail.contains("model.signals") && last.detail.contains("nothing_here"),
            "{}",
            last.detail
        );
        // A failure is retried after an hour (retrain_every when shorter).
        assert_eq!(s.next_training_ms, Some(86_400_000 + 3_600_000));
        // Data present, but the worker binary missing: the failure names it.
        let dir = tempfile::tempdir().unwrap();
        let (mut t, store) = trainer(dir.path(), &["a"], "/nonexistent/omen-worker");
        assert!(t.tick(86_400_000, &store).is_none());
        let last = t.status(86_400_000).last_training.unwrap();
        assert!(
            last.detail.contains("/nonexistent/omen-worker") && last.detail.contains("worker.path"),
            "{}",
            last.detail
        );
        assert!(!dir.path().join("models").join(TRAINING_DATA).exists(), "the training data is removed");
        // Nothing is retried within the hour; then it is, and both failures are listed.
        assert!(t.tick(86_400_000 + 1_800_000, &store).is_none());
        assert_eq!(t.status(0).recent_trainings.len(), 1);
        assert!(t.tick(86_400_000 + 3_600_000, &store).is_none());
        let recent = t.status(0).recent_trainings;
        assert_eq!(
            recent.iter().map(|o| o.started_ms).collect::<Vec<_>>(),
            [86_400_000 + 3_600_000, 86_400_000]
        );
        // The schedule survives a restart: no training at once.
        drop((t, store));
        let (t, _store) = trainer(dir.path(), &["a"], "/nonexistent/omen-worker");
        assert_eq!(t.status(0).recent_trainings.len(), 2);
        assert_eq!(t.status(0).next_training_ms, Some(86_400_000 + 2 * 3_600_000));
    }

    #[cfg(feature = "lstm")]
    #[test]
    fn a_swap_the_worker_cannot_load_is_undone() {
        use trainer::{crc32, record_path, swap_in, ModelRecord};
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let record = |crc| ModelRecord {
            trained_until_ms: 1,
            crc32: crc,
            validation: judge(&report(100, 0), 0.05).unwrap(),
            report: report(100, 0),
        };
        std::fs::write(d.join(CURRENT), b"old model").unwrap();
        let old = serde_json::to_string(&record(crc32(&d.join(CURRENT)).unwrap())).unwrap();
        std::fs::write(d.join("lstm-ae.json"), old).unwrap();
        let candidate = d.join("lstm-ae.candidate-5.ot");
        std::fs::write(&candidate, b"new model").unwrap();
        let rec = record(crc32(&candidate).unwrap());
        // The worker refuses it: the old model is current again, named as staying in use.
        let e = swap_in(d, &candidate, &rec, |_| -> anyhow::Result<()> { anyhow::bail!("bad file") })
            .unwrap_err();
        assert!(format!("{e:#}").contains("the previous model stays in use"), "{e:#}");
        assert_eq!(std::fs::read(d.join(CURRENT)).unwrap(), b"old model");
        let kept = std::fs::read_to_string(record_path(&d.join(CURRENT))).unwrap();
        let kept: ModelRecord = serde_json::from_str(&kept).unwrap();
        assert_eq!(kept.crc32, crc32(&d.join(CURRENT)).unwrap());
        // Loaded: the candidate is current, the old model previous, each with its record.
        std::fs::write(&candidate, b"new model").unwrap();
        let seen = swap_in(d, &candidate, &rec, |p| Ok(std::fs::read(p).unwrap())).unwrap();
        assert_eq!(seen, b"new model");
        assert_eq!(std::fs::read(d.join(PREVIOUS)).unwrap(), b"old model");
        assert!(record_path(&d.join(PREVIOUS)).is_file() && !candidate.exists());
        // Without a model before, a refused load leaves none.
        let dir = tempfile::tempdir().unwrap();
        let candidate = dir.path().join("lstm-ae.candidate-6.ot");
        std::fs::write(&candidate, b"new model").unwrap();
        let e = swap_in(dir.path(), &candidate, &rec, |_| -> anyhow::Result<()> { anyhow::bail!("bad") })
            .unwrap_err();
        assert!(format!("{e:#}").contains("no model is in use"), "{e:#}");
        assert!(!dir.path().join(CURRENT).exists());
    }

    #[test]
    fn a_candidate_is_refused_on_too_many_alarms_or_no_held_back_window() {
        assert_eq!(judge(&report(200, 4), 0.02).unwrap().alarm_rate, 0.02);
        let e = judge(&report(200, 5), 0.02).unwrap_err();
        assert!(e.contains("5 of 200") && e.contains("model.max_alarm_rate"), "{e}");
        let e = judge(&report(0, 0), 0.02).unwrap_err();
        assert!(e.contains("model.holdout"), "{e}");
    }
}
