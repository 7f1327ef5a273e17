//! What a batch adds to the store: the samples (raw ones decimated), the signals the
//! engine derives from them (anomaly scores, VRAM headroom), and the store ids that
//! spare the store a lookup per sample.

use anyhow::Result;
use omen_signals::catalogue;
use omen_sources::Sample;

use super::{to_labels, Engine};
use omen_store::SeriesId;

/// A batch on its way to the store, built sample by sample by `Engine::process`.
pub(super) struct Batch {
    /// (sample, keep raw) for what the engine derives: anomaly scores, VRAM headroom.
    pub(super) derived: Vec<(Sample, bool)>,
    /// Per incoming sample: keep it as a raw sample (decimation).
    keep_raw: Vec<bool>,
    /// Store ids known for the incoming samples, so that the store looks up only new series.
    ids: Vec<Option<SeriesId>>,
    /// (derived index, id, index of the scored sample) for the anomaly scores.
    anomaly_ids: Vec<(usize, Option<SeriesId>, usize)>,
    /// Raw samples of one series closer together than this are not kept raw.
    raw_every_ms: i64,
}

impl Batch {
    /// An empty batch for `n` incoming samples.
    pub(super) fn new(n: usize, raw_every_ms: i64) -> Self {
        Self {
            derived: Vec::new(),
            keep_raw: Vec::with_capacity(n),
            ids: Vec::with_capacity(n),
            anomaly_ids: Vec::new(),
            raw_every_ms,
        }
    }

    /// Records the next incoming sample: whether to keep it raw, and its store id if known.
    pub(super) fn push(&mut self, keep_raw: bool, id: Option<SeriesId>) {
        self.keep_raw.push(keep_raw);
        self.ids.push(id);
    }

    /// Adds the anomaly score of the `scored`th incoming sample, whose store id may be known.
    pub(super) fn push_anomaly(
        &mut self,
        sample: Sample,
        keep_raw: bool,
        id: Option<SeriesId>,
        scored: usize,
    ) {
        self.anomaly_ids.push((self.derived.len(), id, scored));
        self.derived.push((sample, keep_raw));
    }

    /// Whether a sample at `ts` is kept raw, given the last one kept (updated when it is):
    /// one per `raw_min_interval`, and always after time went backwards.
    pub(super) fn keep(&self, last: &mut Option<i64>, ts: i64) -> bool {
        let k = last.is_none_or(|l| ts - l >= self.raw_every_ms || ts < l);
        if k {
            *last = Some(ts);
        }
        k
    }
}

impl Engine {
    /// Canary latencies feed the histograms; GPU used/total pairs give headroom.
    pub(super) fn observe_special(&mut self, s: &Sample, derived: &mut Vec<(Sample, bool)>) {
        let canary_labels = || to_labels(&s.labels);
        // The catalogue's names as constants, so that they can be match patterns.
        const CANARY_TTFT: &str = catalogue::CANARY_TTFT_SECONDS.name;
        const CANARY_TPOT: &str = catalogue::CANARY_TPOT_SECONDS.name;
        const CANARY_E2E: &str = catalogue::CANARY_E2E_SECONDS.name;
        const CANARY_TOKENS: &str = catalogue::CANARY_TOKENS.name;
        const GPU_USED: &str = catalogue::GPU_MEMORY_USED_BYTES.name;
        const GPU_TOTAL: &str = catalogue::GPU_MEMORY_TOTAL_BYTES.name;
        match s.signal.as_str() {
            CANARY_TTFT => self.live.record_latency(catalogue::TTFT_SECONDS.name, canary_labels(), s.value),
            CANARY_TPOT => self.live.record_latency(catalogue::TPOT_SECONDS.name, canary_labels(), s.value),
            CANARY_E2E => self.live.record_latency(catalogue::E2E_SECONDS.name, canary_labels(), s.value),
            CANARY_TOKENS => self.live.record_output_tokens(canary_labels(), s.value),
            GPU_USED | GPU_TOTAL => {
                // Used and total of one GPU share its labels (gpu, UUID, modelName from NVML).
                let entry = self.gpu_memory.entry(s.labels.clone()).or_default();
                if s.signal == GPU_USED {
                    entry.0 = Some(s.value);
                } else {
                    entry.1 = Some(s.value);
                }
                if let (Some(used), Some(total)) = *entry {
                    if let Some(value) = catalogue::gpu_memory_headroom(used, total) {
                        *entry = (None, None);
                        let headroom = Sample {
                            ts_ms: s.ts_ms,
                            signal: catalogue::GPU_MEMORY_HEADROOM_RATIO.name.into(),
                            labels: s.labels.clone(),
                            value,
                        };
                        derived.push((headroom, true));
                    }
                }
            }
            _ => {}
        }
    }

    /// Stores `samples` and what `batch` derived from them in one commit, then remembers
    /// the store ids of series new to the engine (the rare, slow path).
    pub(super) fn commit(&mut self, samples: Vec<Sample>, batch: Batch) -> Result<()> {
        let Batch { derived, keep_raw, mut ids, anomaly_ids, .. } = batch;
        let n = samples.len();
        let mut all = samples;
        let mut flags = keep_raw;
        for (sample, keep) in derived {
            all.push(sample);
            flags.push(keep);
            ids.push(None);
        }
        for &(k, id, _) in &anomaly_ids {
            ids[n + k] = id;
        }
        let unknown: Vec<usize> = (0..n).filter(|&i| ids[i].is_none()).collect();
        let unknown_anomaly: Vec<(usize, usize)> =
            anomaly_ids.iter().filter(|a| a.1.is_none()).map(|&(k, _, i)| (n + k, i)).collect();
        self.store.insert_with_ids(&all, &flags, &mut ids)?;
        // Committed: remember the ids of series new to the engine (the rare, slow path).
        for i in unknown {
            let s = &all[i];
            if let Some(st) = self.series.get_mut(&s.signal).and_then(|f| f.get_mut(&s.labels)) {
                st.store_id = ids[i];
            }
        }
        for (j, i) in unknown_anomaly {
            let s = &all[i];
            if let Some(st) = self.series.get_mut(&s.signal).and_then(|f| f.get_mut(&s.labels)) {
                st.anomaly_store_id = ids[j];
            }
        }
        Ok(())
    }
}
