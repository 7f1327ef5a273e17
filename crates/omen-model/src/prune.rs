//! Structured pruning of the autoencoder's LSTMs: each keeps the hidden units with the
//! largest L1 norm, and a smaller network is built from the sliced gate weights and the
//! matching input columns of the layer downstream. An optional short fine-tune follows;
//! the POT threshold is refitted, since the errors change.

use tch::nn;
use tch::{Device, Kind, Tensor};

use crate::lstm_ae::{Dims, LstmAutoencoder, LstmError, Net};
use crate::ModelError;

/// Default share of hidden units kept.
pub const DEFAULT_KEEP: f64 = 0.6;

/// Which units were kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneReport {
    /// Encoder units kept (indices into the old layer).
    pub encoder_kept: Vec<usize>,
    /// Decoder units kept.
    pub decoder_kept: Vec<usize>,
    /// Parameters before.
    pub parameters_before: usize,
    /// Parameters after.
    pub parameters_after: usize,
}

/// Number of units kept of `n` at ratio `keep` (at least 1).
pub fn kept_units(n: usize, keep: f64) -> usize {
    ((n as f64 * keep).round() as usize).clamp(1, n)
}

/// L1 norm of each hidden unit of an LSTM: its rows in the four gates of both weight
/// matrices, its recurrent column, and its input column in the downstream layer.
fn unit_norms(w_ih: &Tensor, w_hh: &Tensor, downstream: &Tensor, hidden: i64) -> Vec<f64> {
    let rows = (w_ih.abs().sum_dim_intlist([1i64].as_slice(), false, Kind::Double)
        + w_hh.abs().sum_dim_intlist([1i64].as_slice(), false, Kind::Double))
    .view([4, hidden])
    .sum_dim_intlist([0i64].as_slice(), false, Kind::Double);
    let cols = w_hh.abs().sum_dim_intlist([0i64].as_slice(), false, Kind::Double)
        + downstream.abs().sum_dim_intlist([0i64].as_slice(), false, Kind::Double);
    Vec::<f64>::try_from(&(rows + cols)).expect("1-d double tensor")
}

/// Indices of the `k` largest values, ascending.
fn top_k(norms: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..norms.len()).collect();
    idx.sort_by(|&a, &b| norms[b].total_cmp(&norms[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx.sort_unstable();
    idx
}

fn index(kept: &[usize]) -> Tensor {
    Tensor::from_slice(&kept.iter().map(|&i| i as i64).collect::<Vec<_>>())
}

/// Row indices of the kept units in all four gate blocks (PyTorch's i, f, g, o order).
fn gate_rows(kept: &[usize], hidden: usize) -> Tensor {
    let rows: Vec<i64> = (0..4).flat_map(|g| kept.iter().map(move |&u| (g * hidden + u) as i64)).collect();
    Tensor::from_slice(&rows)
}

impl LstmAutoencoder {
    /// A smaller model keeping the share `keep` of each LSTM's hidden units; with `data`
    /// (the normal raw rows of training) it fine-tunes for `fine_tune_epochs` and refits the threshold.
    pub fn prune(
        &self,
        keep: f64,
        data: Option<&[Vec<f64>]>,
        fine_tune_epochs: usize,
    ) -> Result<(Self, PruneReport), LstmError> {
        if !(keep > 0.0 && keep <= 1.0) {
            return Err(ModelError::Parameter {
                parameter: "keep",
                reason: format!("{keep} must be in (0, 1]"),
            }
            .into());
        }
        let old = self.vs.variables();
        let d = self.meta.dims;
        let enc_k = top_k(
            &unit_norms(
                &old["encoder.weight_ih_l0"],
                &old["encoder.weight_hh_l0"],
                &old["to_latent.weight"],
                d.hidden as i64,
            ),
            kept_units(d.hidden, keep),
        );
        let dec_k = top_k(
            &unit_norms(
                &old["decoder.weight_ih_l0"],
                &old["decoder.weight_hh_l0"],
                &old["to_output.weight"],
                d.decoder_hidden as i64,
            ),
            kept_units(d.decoder_hidden, keep),
        );
        let dims = Dims { hidden: enc_k.len(), decoder_hidden: dec_k.len(), ..d };
        let vs = nn::VarStore::new(Device::Cpu);
        let net = Net::new(&vs.root(), dims);
        let new = vs.variables();
        let slice_lstm = |prefix: &str, kept: &[usize], hidden: usize| -> Vec<(String, Tensor)> {
            let (rows, cols) = (gate_rows(kept, hidden), index(kept));
            vec![
                (
                    format!("{prefix}.weight_ih_l0"),
                    old[&format!("{prefix}.weight_ih_l0")].index_select(0, &rows),
                ),
                (
                    format!("{prefix}.weight_hh_l0"),
                    old[&format!("{prefix}.weight_hh_l0")].index_select(0, &rows).index_select(1, &cols),
                ),
                (format!("{prefix}.bias_ih_l0"), old[&format!("{prefix}.bias_ih_l0")].index_select(0, &rows)),
                (format!("{prefix}.bias_hh_l0"), old[&format!("{prefix}.bias_hh_l0")].index_select(0, &rows)),
            ]
        };
        let mut sliced = slice_lstm("encoder", &enc_k, d.hidden);
        sliced.extend(slice_lstm("decoder", &dec_k, d.decoder_hidden));
        sliced.push(("to_latent.weight".into(), old["to_latent.weight"].index_select(1, &index(&enc_k))));
        sliced.push(("to_latent.bias".into(), old["to_latent.bias"].copy()));
        sliced.push(("to_output.weight".into(), old["to_output.weight"].index_select(1, &index(&dec_k))));
        sliced.push(("to_output.bias".into(), old["to_output.bias"].copy()));
        assert_eq!(sliced.len(), new.len(), "every tensor of the pruned network is filled");
        tch::no_grad(|| {
            for (name, t) in &sliced {
                new[name].shallow_clone().copy_(t);
            }
        });
        let mut meta = self.meta.clone();
        meta.dims = dims;
        let mut pruned = Self { vs, net, meta };
        if let Some(raw) = data {
            let (train_x, val_x) = self.split(raw)?;
            if fine_tune_epochs > 0 {
                // Seeded as training is, so a pruned model does not depend on what else drew
                // from libtorch's global generator before.
                tch::manual_seed(self.meta.config.seed);
                pruned.fit(&train_x, &val_x, fine_tune_epochs, &mut |_| {})?;
            }
            pruned.calibrate(&train_x, &val_x)?;
        }
        let report = PruneReport {
            encoder_kept: enc_k,
            decoder_kept: dec_k,
            parameters_before: self.parameter_count(),
            parameters_after: pruned.parameter_count(),
        };
        Ok((pruned, report))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lstm_ae::tests::{periodic, small_config, trained};

    #[test]
    fn pruning_keeps_the_requested_fraction_and_still_reconstructs() {
        let (m, data) = trained();
        let (p, r) = {
            let _turn = crate::lstm_ae::tests::TRAINING.lock().unwrap_or_else(|e| e.into_inner());
            m.prune(DEFAULT_KEEP, Some(&data), small_config().epochs).unwrap()
        };
        assert_eq!(r.encoder_kept.len(), kept_units(16, 0.6));
        assert_eq!(p.meta.dims.hidden, 10);
        assert_eq!(p.meta.dims.decoder_hidden, 10);
        assert!(r.parameters_after < r.parameters_before);
        assert_eq!(r.parameters_after, p.parameter_count());
        // The kept units are the largest by L1 norm.
        let v = m.vs.variables();
        let norms =
            unit_norms(&v["encoder.weight_ih_l0"], &v["encoder.weight_hh_l0"], &v["to_latent.weight"], 16);
        let min_kept = r.encoder_kept.iter().map(|&i| norms[i]).fold(f64::INFINITY, f64::min);
        let max_dropped =
            (0..16).filter(|i| !r.encoder_kept.contains(i)).map(|i| norms[i]).fold(0.0, f64::max);
        assert!(min_kept >= max_dropped);
        // Still reconstructs: test error on normal data stays near the full model's, far below
        // the variance (1) of normalised data.
        let test = periodic(1200)[800..].to_vec();
        let mean = |s: Vec<Option<f64>>| {
            let v: Vec<f64> = s.into_iter().flatten().collect();
            v.iter().sum::<f64>() / v.len() as f64
        };
        let (full, small) = (mean(m.score_series(&test).unwrap()), mean(p.score_series(&test).unwrap()));
        assert!(small < 0.3 && small < 4.0 * full + 0.02, "pruned {small} vs full {full}");
        // Without fine-tuning the slicing alone keeps a working network of the right shape.
        let (raw_p, _) = m.prune(0.5, None, 0).unwrap();
        assert_eq!(raw_p.score_series(&test).unwrap().len(), test.len());
        assert!(m.prune(0.0, None, 0).is_err());
    }
}
