//! LSTM autoencoder on tch: windows of the normalised feature vector -> encoder LSTM ->
//! latent -> decoder LSTM -> reconstruction. Trained on normal windows with Adam and early
//! stopping on a chronological validation split; the score of a window is its mean squared
//! reconstruction error, thresholded by POT on validation errors and mapped to [0, 1].
//! One file holds weights, normaliser, features, threshold and hyper-parameters.

use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tch::nn::{self, OptimizerConfig, RNN};
use tch::{Device, Kind, Tensor};

use crate::features::FeatureSet;
use crate::{ModelError, Normalizer, PotThreshold, SeverityMap};

/// Name written into every model file.
pub const FORMAT_NAME: &str = "omen-lstm-ae";
/// Version of the model file layout; bump when the layout or the architecture changes.
pub const FORMAT_VERSION: u32 = 1;
/// Name of the tensor that carries the JSON metadata.
const META_TENSOR: &str = "__omen_meta__";
/// Windows per forward pass when scoring a whole series.
const SCORE_CHUNK: usize = 2048;

/// Sets libtorch's intra-op thread count (the agent and the CLI use few cores).
pub fn set_threads(n: usize) {
    tch::set_num_threads(n.max(1) as i32);
}

/// Errors of the autoencoder; each names the input and the fix.
#[derive(Debug, thiserror::Error)]
pub enum LstmError {
    /// Bad data or parameters.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// libtorch failed.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// A model file that cannot be used.
    #[error("model file {path}: {problem}; {fix}")]
    File {
        /// The file.
        path: String,
        /// What is wrong.
        problem: String,
        /// What to do.
        fix: &'static str,
    },
}

/// Hyper-parameters of training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LstmAeConfig {
    /// Window length, rows.
    pub window: usize,
    /// Encoder LSTM hidden units.
    pub hidden: usize,
    /// Decoder LSTM hidden units.
    pub decoder_hidden: usize,
    /// Latent size.
    pub latent: usize,
    /// Most epochs.
    pub epochs: usize,
    /// Mini-batch size.
    pub batch_size: usize,
    /// Adam learning rate.
    pub learning_rate: f64,
    /// Epochs without a better validation loss before stopping.
    pub patience: usize,
    /// Share of the (chronologically last) rows held out for validation and the threshold.
    pub validation_fraction: f64,
    /// Rows between training windows.
    pub stride: usize,
    /// Seed of libtorch's generator (initialisation and batch order).
    pub seed: i64,
    /// POT initial quantile (lowered automatically for small validation sets).
    pub pot_initial_quantile: f64,
    /// POT risk: the probability a normal window exceeds the threshold.
    pub pot_risk: f64,
}

impl Default for LstmAeConfig {
    fn default() -> Self {
        Self {
            window: 32,
            hidden: 32,
            decoder_hidden: 32,
            latent: 8,
            epochs: 60,
            batch_size: 32,
            learning_rate: 5e-3,
            patience: 8,
            validation_fraction: 0.25,
            stride: 1,
            seed: 0,
            pot_initial_quantile: 0.98,
            pot_risk: 1e-3,
        }
    }
}

impl LstmAeConfig {
    fn check(&self) -> Result<(), ModelError> {
        let bad = |parameter: &'static str, reason: &str| {
            Err(ModelError::Parameter { parameter, reason: reason.to_string() })
        };
        if self.window < 2 {
            return bad("window", "must be at least 2 rows");
        }
        if self.hidden == 0 || self.decoder_hidden == 0 || self.latent == 0 {
            return bad("hidden", "hidden, decoder_hidden and latent must be at least 1");
        }
        if self.epochs == 0 || self.batch_size == 0 || self.stride == 0 {
            return bad("epochs", "epochs, batch_size and stride must be at least 1");
        }
        if !(self.learning_rate > 0.0 && self.learning_rate.is_finite()) {
            return bad("learning_rate", "must be > 0, e.g. 0.005");
        }
        if !(self.validation_fraction > 0.0 && self.validation_fraction < 0.9) {
            return bad("validation_fraction", "must be in (0, 0.9), e.g. 0.25");
        }
        Ok(())
    }
}

/// Layer sizes of a built network (pruning changes the hidden sizes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dims {
    /// Input features.
    pub input: usize,
    /// Encoder hidden units.
    pub hidden: usize,
    /// Latent size.
    pub latent: usize,
    /// Decoder hidden units.
    pub decoder_hidden: usize,
}

/// What training did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainReport {
    /// Epochs run (early stopping may end sooner).
    pub epochs_run: usize,
    /// Epoch (1-based) with the best validation loss; its weights are kept.
    pub best_epoch: usize,
    /// Mean training loss of the best epoch.
    pub train_loss: f64,
    /// Best validation loss.
    pub val_loss: f64,
    /// Training windows.
    pub train_windows: usize,
    /// Validation windows.
    pub val_windows: usize,
    /// Whether the threshold came from validation errors only (else all windows, a small set).
    pub threshold_from_validation: bool,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// Everything besides the weights that a model file carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelMeta {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    /// [`FORMAT_VERSION`] of the writer.
    pub version: u32,
    /// Hyper-parameters used in training.
    pub config: LstmAeConfig,
    /// Layer sizes.
    pub dims: Dims,
    /// Source columns and derived features, in input order.
    pub features: FeatureSet,
    /// Normaliser fitted on the training rows.
    pub normalizer: Normalizer,
    /// POT threshold of the reconstruction error.
    pub pot: PotThreshold,
    /// Training summary.
    pub training: TrainReport,
}

/// One epoch's progress.
#[derive(Debug, Clone, Copy)]
pub struct EpochProgress {
    /// 1-based epoch.
    pub epoch: usize,
    /// Most epochs.
    pub epochs: usize,
    /// Mean training loss.
    pub train_loss: f64,
    /// Validation loss.
    pub val_loss: f64,
}

/// The network: encoder LSTM, latent projection, decoder LSTM, output projection.
#[derive(Debug)]
pub(crate) struct Net {
    pub(crate) encoder: nn::LSTM,
    pub(crate) to_latent: nn::Linear,
    pub(crate) decoder: nn::LSTM,
    pub(crate) to_output: nn::Linear,
}

impl Net {
    pub(crate) fn new(root: &nn::Path, d: Dims) -> Self {
        let (i, h, l, dh) = (d.input as i64, d.hidden as i64, d.latent as i64, d.decoder_hidden as i64);
        Self {
            encoder: nn::lstm(root / "encoder", i, h, Default::default()),
            to_latent: nn::linear(root / "to_latent", h, l, Default::default()),
            decoder: nn::lstm(root / "decoder", l, dh, Default::default()),
            to_output: nn::linear(root / "to_output", dh, i, Default::default()),
        }
    }

    /// [batch, time, feature] -> its reconstruction.
    pub(crate) fn forward(&self, x: &Tensor) -> Tensor {
        let (_, state) = self.encoder.seq(x);
        let z = state.h().squeeze_dim(0).apply(&self.to_latent);
        let steps = x.size()[1];
        let repeated = z.unsqueeze(1).expand([-1, steps, -1], false);
        let (out, _) = self.decoder.seq(&repeated);
        out.apply(&self.to_output)
    }
}

/// A trained LSTM autoencoder with its normaliser and threshold.
#[derive(Debug)]
pub struct LstmAutoencoder {
    pub(crate) vs: nn::VarStore,
    pub(crate) net: Net,
    /// Metadata saved beside the weights.
    pub meta: ModelMeta,
}

/// Windows (rows `start..start+len` for every start) as a [n, len, width] float tensor.
fn windows_tensor(rows: &[Vec<f64>], len: usize, stride: usize) -> Tensor {
    let width = rows.first().map_or(0, Vec::len);
    let starts: Vec<usize> =
        if rows.len() >= len { (0..=rows.len() - len).step_by(stride).collect() } else { vec![] };
    let mut flat = Vec::with_capacity(starts.len() * len * width);
    for &s in &starts {
        for row in &rows[s..s + len] {
            flat.extend(row.iter().map(|&v| v as f32));
        }
    }
    Tensor::from_slice(&flat).view([starts.len() as i64, len as i64, width as i64])
}

fn mean_loss(net: &Net, x: &Tensor) -> f64 {
    if x.size()[0] == 0 {
        return f64::NAN;
    }
    tch::no_grad(|| net.forward(x).mse_loss(x, tch::Reduction::Mean).double_value(&[]))
}

/// Per-window mean squared error of `x` [n, T, F], in chunks.
fn window_errors(net: &Net, x: &Tensor) -> Vec<f64> {
    let n = x.size()[0];
    let mut out = Vec::with_capacity(n as usize);
    tch::no_grad(|| {
        let mut start = 0;
        while start < n {
            let len = (SCORE_CHUNK as i64).min(n - start);
            let xb = x.narrow(0, start, len);
            let e = (net.forward(&xb) - &xb).square().mean_dim([1i64, 2].as_slice(), false, Kind::Double);
            out.extend(Vec::<f64>::try_from(&e).expect("a 1-d double tensor"));
            start += len;
        }
    });
    out
}

/// Training and validation windows of normalised rows: rows are split in time first, so
/// no validation row is seen in training.
fn split_windows(rows: &[Vec<f64>], cfg: &LstmAeConfig) -> Result<(Tensor, Tensor), ModelError> {
    let n_val = ((rows.len() as f64) * cfg.validation_fraction).round() as usize;
    let n_train = rows.len() - n_val;
    if n_train < cfg.window + cfg.batch_size.min(8) || n_val < cfg.window + 1 {
        return Err(ModelError::TooFew {
            what: "rows for training and validation windows",
            have: rows.len(),
            need: ((cfg.window + 8) as f64 / (1.0 - cfg.validation_fraction)).ceil() as usize
                + cfg.window
                + 1,
        });
    }
    let train = windows_tensor(&rows[..n_train], cfg.window, cfg.stride);
    let val = windows_tensor(&rows[n_train..], cfg.window, 1);
    Ok((train, val))
}

impl LstmAutoencoder {
    /// Trains on `raw` rows (one per time step, columns in `features.sources` order) that are normal.
    pub fn train(
        features: FeatureSet,
        raw: &[Vec<f64>],
        cfg: &LstmAeConfig,
        progress: &mut dyn FnMut(EpochProgress),
    ) -> Result<Self, LstmError> {
        cfg.check()?;
        let started = Instant::now();
        let rows = features.transform_all(raw)?;
        let n_val = ((rows.len() as f64) * cfg.validation_fraction).round() as usize;
        let normalizer = Normalizer::fit(&rows[..rows.len() - n_val.min(rows.len())])?;
        let rows = normalizer.transform(&rows)?;
        let (train_x, val_x) = split_windows(&rows, cfg)?;
        tch::manual_seed(cfg.seed);
        let vs = nn::VarStore::new(Device::Cpu);
        let dims = Dims {
            input: features.width(),
            hidden: cfg.hidden,
            latent: cfg.latent,
            decoder_hidden: cfg.decoder_hidden,
        };
        let net = Net::new(&vs.root(), dims);
        let placeholder =
            PotThreshold { initial: 0.0, shape: 0.0, scale: 0.0, threshold: 0.0, risk: cfg.pot_risk };
        let meta = ModelMeta {
            format: FORMAT_NAME.into(),
            version: FORMAT_VERSION,
            config: cfg.clone(),
            dims,
            features,
            normalizer,
            pot: placeholder,
            training: TrainReport {
                epochs_run: 0,
                best_epoch: 0,
                train_loss: f64::NAN,
                val_loss: f64::NAN,
                train_windows: train_x.size()[0] as usize,
                val_windows: val_x.size()[0] as usize,
                threshold_from_validation: true,
                seconds: 0.0,
            },
        };
        let mut model = Self { vs, net, meta };
        model.fit(&train_x, &val_x, cfg.epochs, progress)?;
        model.calibrate(&train_x, &val_x)?;
        model.meta.training.seconds = started.elapsed().as_secs_f64();
        Ok(model)
    }

    /// Adam over shuffled mini-batches, keeping the weights of the best validation epoch.
    pub(crate) fn fit(
        &mut self,
        train_x: &Tensor,
        val_x: &Tensor,
        epochs: usize,
        progress: &mut dyn FnMut(EpochProgress),
    ) -> Result<(), LstmError> {
        let cfg = self.meta.config.clone();
        let mut opt = nn::Adam::default().build(&self.vs, cfg.learning_rate)?;
        let n = train_x.size()[0];
        // (val loss, train loss, epoch, weights) of the best epoch so far.
        type Best = (f64, f64, usize, Vec<(String, Tensor)>);
        let mut best: Option<Best> = None;
        let mut since_best = 0;
        let mut run = 0;
        for epoch in 1..=epochs {
            run = epoch;
            let perm = Tensor::randperm(n, (Kind::Int64, Device::Cpu));
            let (mut sum, mut batches) = (0.0, 0);
            let mut start = 0;
            while start < n {
                let len = (cfg.batch_size as i64).min(n - start);
                let xb = train_x.index_select(0, &perm.narrow(0, start, len));
                let loss = self.net.forward(&xb).mse_loss(&xb, tch::Reduction::Mean);
                opt.backward_step(&loss);
                sum += loss.double_value(&[]);
                batches += 1;
                start += len;
            }
            let train_loss = sum / batches as f64;
            let val_loss = mean_loss(&self.net, val_x);
            progress(EpochProgress { epoch, epochs, train_loss, val_loss });
            if best.as_ref().is_none_or(|b| val_loss < b.0 * (1.0 - 1e-4)) {
                let snapshot = self.vs.variables().into_iter().map(|(k, v)| (k, v.detach().copy())).collect();
                best = Some((val_loss, train_loss, epoch, snapshot));
                since_best = 0;
            } else {
                since_best += 1;
                if since_best >= cfg.patience {
                    break;
                }
            }
        }
        let (val_loss, train_loss, best_epoch, snapshot) = best.expect("at least one epoch");
        let vars = self.vs.variables();
        tch::no_grad(|| {
            for (name, saved) in &snapshot {
                vars[name].shallow_clone().copy_(saved);
            }
        });
        let t = &mut self.meta.training;
        t.epochs_run = run;
        t.best_epoch = best_epoch;
        t.train_loss = train_loss;
        t.val_loss = val_loss;
        Ok(())
    }

    /// Fits the POT threshold on validation errors (all windows when validation is too small for POT).
    pub(crate) fn calibrate(&mut self, train_x: &Tensor, val_x: &Tensor) -> Result<(), LstmError> {
        let cfg = &self.meta.config;
        let val = window_errors(&self.net, val_x);
        let (errors, from_val) = if val.len() >= 100 {
            (val, true)
        } else {
            let mut all = window_errors(&self.net, train_x);
            all.extend(val);
            (all, false)
        };
        // POT needs about 10 excesses: lower the initial quantile for small sets.
        let q = cfg.pot_initial_quantile.min(1.0 - 12.0 / errors.len() as f64).max(0.5);
        let risk = cfg.pot_risk.min(0.5 * (1.0 - q));
        self.meta.pot = PotThreshold::fit(&errors, q, risk)?;
        self.meta.training.threshold_from_validation = from_val;
        Ok(())
    }

    /// Normalised windows of `raw` rows for continued training (pruning's fine-tune).
    pub(crate) fn split(&self, raw: &[Vec<f64>]) -> Result<(Tensor, Tensor), LstmError> {
        let rows = self.meta.normalizer.transform(&self.meta.features.transform_all(raw)?)?;
        Ok(split_windows(&rows, &self.meta.config)?)
    }

    /// Window length.
    pub fn window(&self) -> usize {
        self.meta.config.window
    }

    /// Number of trainable parameters.
    pub fn parameter_count(&self) -> usize {
        self.vs.trainable_variables().iter().map(|t| t.numel()).sum()
    }

    /// The severity map (0.6 at the POT threshold).
    pub fn severity_map(&self) -> SeverityMap {
        SeverityMap { threshold: self.meta.pot.threshold }
    }

    /// Severity in [0, 1] of a reconstruction error.
    pub fn severity(&self, error: f64) -> f64 {
        self.severity_map().severity(error)
    }

    /// One window of feature rows (not yet normalised, exactly [`Self::window`] of them),
    /// normalised as the model was trained, as the network's input.
    fn one_window(&self, feature_rows: &[Vec<f64>]) -> Result<Tensor, LstmError> {
        if feature_rows.len() != self.window() {
            return Err(ModelError::TooFew {
                what: "rows in the window",
                have: feature_rows.len(),
                need: self.window(),
            }
            .into());
        }
        let rows = self.meta.normalizer.transform(feature_rows)?;
        Ok(windows_tensor(&rows, rows.len(), 1))
    }

    /// Reconstruction error of one window of feature rows (not yet normalised), oldest first.
    pub fn score_window(&self, feature_rows: &[Vec<f64>]) -> Result<f64, LstmError> {
        let x = self.one_window(feature_rows)?;
        Ok(window_errors(&self.net, &x)[0])
    }

    /// Reconstruction error of one window of feature rows (as [`Self::score_window`]) and
    /// each source's share of it, in the order of `features.sources` (shares sum to 1; all
    /// 0 for a perfect reconstruction). A source's share sums its features' squared errors in
    /// normalised units, so it says which inputs the model could not reconstruct.
    pub fn score_window_by_source(&self, feature_rows: &[Vec<f64>]) -> Result<(f64, Vec<f64>), LstmError> {
        let x = self.one_window(feature_rows)?;
        let per_feature: Vec<f64> = tch::no_grad(|| {
            let e = (self.net.forward(&x) - &x).square().mean_dim([0i64, 1].as_slice(), false, Kind::Double);
            Vec::<f64>::try_from(&e).expect("a 1-d double tensor")
        });
        // The window's error is the mean over its features of these per-feature means.
        let error = per_feature.iter().sum::<f64>() / per_feature.len().max(1) as f64;
        let mut shares = vec![0.0; self.meta.features.sources.len()];
        for (spec, e) in self.meta.features.features.iter().zip(&per_feature) {
            shares[spec.source] += e;
        }
        let total: f64 = shares.iter().sum();
        if total > 0.0 {
            shares.iter_mut().for_each(|s| *s /= total);
        }
        Ok((error, shares))
    }

    /// Reconstruction error of the window ending at each raw row (`None` until a window is full).
    pub fn score_series(&self, raw: &[Vec<f64>]) -> Result<Vec<Option<f64>>, LstmError> {
        let rows = self.meta.normalizer.transform(&self.meta.features.transform_all(raw)?)?;
        let w = self.window();
        let mut out = vec![None; rows.len().min(w - 1)];
        if rows.len() >= w {
            out.extend(window_errors(&self.net, &windows_tensor(&rows, w, 1)).into_iter().map(Some));
        }
        Ok(out)
    }

    /// Writes weights and metadata to one file (tch's multi-tensor format).
    pub fn save(&self, path: &Path) -> Result<(), LstmError> {
        let json = serde_json::to_vec(&self.meta).expect("metadata serialises");
        let mut named: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        named.push((META_TENSOR.into(), Tensor::from_slice(&json)));
        Tensor::save_multi(&named, path).map_err(|e| LstmError::File {
            path: path.display().to_string(),
            problem: format!("cannot write: {e}"),
            fix: "check that the folder exists and is writable",
        })
    }

    /// Reads a file written by [`LstmAutoencoder::save`], checking its format and version.
    pub fn load(path: &Path) -> Result<Self, LstmError> {
        let file_err = |problem: String, fix: &'static str| LstmError::File {
            path: path.display().to_string(),
            problem,
            fix,
        };
        const RETRAIN: &str = "retrain it with `omen train --data ... --out FILE` from this omen version";
        if !path.is_file() {
            return Err(file_err("no such file".into(), "give the path of a model written by `omen train`"));
        }
        let tensors = Tensor::load_multi(path)
            .map_err(|e| file_err(format!("not a readable omen model ({e})"), RETRAIN))?;
        let meta_t = tensors
            .iter()
            .find(|(n, _)| n == META_TENSOR)
            .ok_or_else(|| file_err("has no omen metadata (not an omen LSTM-AE model)".into(), RETRAIN))?;
        let bytes = Vec::<u8>::try_from(&meta_t.1)
            .map_err(|e| file_err(format!("metadata is not bytes ({e})"), RETRAIN))?;
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| file_err(format!("metadata is not JSON ({e})"), RETRAIN))?;
        let (format, version) =
            (value.get("format").and_then(|v| v.as_str()), value.get("version").and_then(|v| v.as_u64()));
        if format != Some(FORMAT_NAME) {
            return Err(file_err(format!("format is {format:?}, expected {FORMAT_NAME:?}"), RETRAIN));
        }
        if version != Some(FORMAT_VERSION as u64) {
            return Err(file_err(
                format!("format version {version:?}, this omen reads version {FORMAT_VERSION}"),
                RETRAIN,
            ));
        }
        let meta: ModelMeta = serde_json::from_value(value).map_err(|e| {
            file_err(format!("metadata does not match version {FORMAT_VERSION} ({e})"), RETRAIN)
        })?;
        let vs = nn::VarStore::new(Device::Cpu);
        let net = Net::new(&vs.root(), meta.dims);
        let vars = vs.variables();
        let mut found = 0;
        tch::no_grad(|| -> Result<(), LstmError> {
            for (name, t) in &tensors {
                if name == META_TENSOR {
                    continue;
                }
                let Some(var) = vars.get(name) else {
                    return Err(file_err(format!("unexpected tensor {name}"), RETRAIN));
                };
                if var.size() != t.size() {
                    return Err(file_err(
                        format!(
                            "tensor {name} has shape {:?}, the metadata implies {:?}",
                            t.size(),
                            var.size()
                        ),
                        RETRAIN,
                    ));
                }
                var.shallow_clone().copy_(t);
                found += 1;
            }
            Ok(())
        })?;
        if found != vars.len() {
            return Err(file_err(format!("{found} of {} weight tensors present", vars.len()), RETRAIN));
        }
        Ok(Self { vs, net, meta })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A periodic two-feature series with mild noise (deterministic).
    pub(crate) fn periodic(n: usize) -> Vec<Vec<f64>> {
        (0..n)
            .map(|i| {
                let t = i as f64 * std::f64::consts::TAU / 24.0;
                let noise = (((i * 7919) % 101) as f64 / 101.0 - 0.5) * 0.05;
                vec![t.sin() + noise, 0.5 * (t * 2.0).cos() - noise]
            })
            .collect()
    }

    pub(crate) fn small_config() -> LstmAeConfig {
        LstmAeConfig {
            window: 24,
            hidden: 16,
            decoder_hidden: 16,
            latent: 4,
            epochs: 40,
            patience: 6,
            ..Default::default()
        }
    }

    /// libtorch's generator is global: tests that train take turns so each run is seeded alike.
    pub(crate) static TRAINING: std::sync::Mutex<()> = std::sync::Mutex::new(());

    pub(crate) fn trained() -> (LstmAutoencoder, Vec<Vec<f64>>) {
        let _turn = TRAINING.lock().unwrap_or_else(|e| e.into_inner());
        tch::set_num_threads(1);
        let data = periodic(800);
        let features = FeatureSet::raw(vec!["a".into(), "b".into()]);
        let m = LstmAutoencoder::train(features, &data, &small_config(), &mut |_| {}).unwrap();
        (m, data)
    }

    #[test]
    fn the_source_that_breaks_the_pattern_takes_most_of_the_error() {
        let (m, _) = trained();
        let mut window = periodic(1200)[800..800 + m.window()].to_vec();
        let (normal, _) = m.score_window_by_source(&window).unwrap();
        assert!((normal - m.score_window(&window).unwrap()).abs() < 1e-6 * normal.max(1e-3));
        for row in &mut window[10..14] {
            row[1] += 3.0;
        }
        let (error, shares) = m.score_window_by_source(&window).unwrap();
        assert!((error - m.score_window(&window).unwrap()).abs() < 1e-6 * error.max(1e-3));
        assert_eq!(shares.len(), 2);
        assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{shares:?}");
        assert!(shares[1] > 0.8, "source b was disturbed: {shares:?}");
        assert!(m.score_window_by_source(&window[1..]).is_err());
    }

    #[test]
    fn injected_anomalies_score_above_threshold_and_normal_below() {
        let (m, _) = trained();
        assert!(m.meta.training.val_loss < 0.2, "{:?}", m.meta.training);
        let mut test = periodic(1200)[800..].to_vec();
        let normal = m.score_series(&test).unwrap();
        let normal: Vec<f64> = normal.into_iter().flatten().collect();
        let above = normal.iter().filter(|&&e| e > m.meta.pot.threshold).count();
        assert!(
            above <= normal.len() / 50,
            "{above} of {} normal windows above {:?}",
            normal.len(),
            m.meta.pot
        );
        for row in &mut test[200..206] {
            row[0] += 3.0;
        }
        let scores = m.score_series(&test).unwrap();
        let peak = scores[200..240].iter().flatten().copied().fold(0.0, f64::max);
        assert!(peak > m.meta.pot.threshold, "peak {peak} vs {:?}", m.meta.pot);
        assert!(m.severity(peak) >= 0.6 && m.severity(normal[10]) < 0.6);
    }

    #[test]
    fn save_load_round_trip_gives_identical_scores() {
        let (m, data) = trained();
        let dir = std::env::temp_dir().join(format!("omen-lstm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.ot");
        m.save(&path).unwrap();
        let back = LstmAutoencoder::load(&path).unwrap();
        assert_eq!(back.meta, m.meta);
        assert_eq!(back.score_series(&data[..200]).unwrap(), m.score_series(&data[..200]).unwrap());
        let w = &data[100..124];
        assert_eq!(back.score_window(w).unwrap(), m.score_window(w).unwrap());
        // One window alone and the same window in a batch agree to float rounding.
        let batched = m.score_series(&data[..124]).unwrap()[123].unwrap();
        assert!((back.score_window(w).unwrap() - batched).abs() < 1e-5 * batched.max(1e-3));

        // A different version is refused with the file and the fix.
        let mut meta = m.meta.clone();
        meta.version = FORMAT_VERSION + 1;
        let json = serde_json::to_vec(&meta).unwrap();
        let mut named: Vec<(String, Tensor)> = m.vs.variables().into_iter().collect();
        named.push((META_TENSOR.into(), Tensor::from_slice(&json)));
        let old = dir.join("v2.ot");
        Tensor::save_multi(&named, &old).unwrap();
        let e = LstmAutoencoder::load(&old).unwrap_err().to_string();
        assert!(e.contains("v2.ot") && e.contains("version") && e.contains("omen train"), "{e}");
        // A corrupt file too.
        let bad = dir.join("bad.ot");
        std::fs::write(&bad, b"not a model").unwrap();
        let e = LstmAutoencoder::load(&bad).unwrap_err().to_string();
        assert!(e.contains("bad.ot") && e.contains("omen train"), "{e}");
        let e = LstmAutoencoder::load(&dir.join("missing.ot")).unwrap_err().to_string();
        assert!(e.contains("missing.ot") && e.contains("no such file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn too_little_data_is_an_error() {
        let features = FeatureSet::raw(vec!["a".into(), "b".into()]);
        let e = LstmAutoencoder::train(features, &periodic(40), &small_config(), &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("rows for training"), "{e}");
    }
}
