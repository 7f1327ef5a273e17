//! GPU memory through NVML (nvml-wrapper, which loads `libnvidia-ml.so.1` at run time).
//!
//! On a machine without the NVIDIA driver, [`GpuSampler::new`] returns
//! [`NvmlError::Unavailable`]; the agent logs it once and runs with GPU signals off.

use std::collections::BTreeMap;
use std::time::Duration;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper::Nvml;
use omen_signals::catalogue;
use serde::{Deserialize, Serialize};

use crate::Sample;

/// The NVML source's section of the agent config (`sources.nvml` in omen.yaml).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NvmlSourceConfig {
    /// Try NVML at start-up.
    pub enabled: bool,
    /// Sampling interval.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Only these GPUs, by NVML UUID (`GPU-...`, as `nvidia-smi -L` prints them): the GPUs of
    /// the watched server when omen sees the whole node. Empty: every GPU NVML sees.
    pub uuids: Vec<String>,
}

impl Default for NvmlSourceConfig {
    fn default() -> Self {
        Self { enabled: true, interval: Duration::from_secs(10), uuids: Vec::new() }
    }
}

impl NvmlSourceConfig {
    /// Every problem of the section as (field path within the section, what to do).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut p = Vec::new();
        if self.interval < Duration::from_millis(100) {
            p.push(("interval".to_owned(), "must be at least 100ms".to_owned()));
        }
        for (i, uuid) in self.uuids.iter().enumerate() {
            if !uuid.starts_with("GPU-") {
                p.push((
                    format!("uuids[{i}]"),
                    format!("{uuid:?} is not an NVML GPU UUID; write it as `nvidia-smi -L` prints it, e.g. GPU-5a3c...."),
                ));
            }
        }
        p
    }
}

/// Why GPU sampling is off or a reading failed.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// NVML cannot be used on this machine: no library, no driver, or no GPU.
    #[error(
        "NVML is unavailable ({reason}): libnvidia-ml.so could not be used, so GPU signals are off; \
         on a GPU host install the NVIDIA driver, or in a container run with the NVIDIA container \
         toolkit so that libnvidia-ml.so.1 is mounted"
    )]
    Unavailable {
        /// What NVML reported.
        reason: String,
    },
    /// `sources.nvml.uuids` names GPUs that NVML does not see on this machine.
    #[error(
        "sources.nvml.uuids names {missing:?}, which NVML does not see here (it sees {seen:?}); \
         GPU signals are off: fix the list, or empty it to read every GPU"
    )]
    UnknownUuids {
        /// The configured UUIDs NVML does not know.
        missing: Vec<String>,
        /// The UUIDs NVML sees.
        seen: Vec<String>,
    },
    /// NVML is loaded but a call failed.
    #[error("NVML {call} failed for GPU {gpu}: {source}; check the driver with nvidia-smi")]
    Call {
        /// The NVML call, e.g. `memory_info`.
        call: &'static str,
        /// GPU index (`-` when not about one GPU).
        gpu: String,
        /// The NVML error.
        source: WrapperError,
    },
}

/// Is this init error "NVML is not usable here" rather than a fault worth reporting as such?
fn is_unavailable(e: &WrapperError) -> bool {
    matches!(
        e,
        WrapperError::LibloadingError(_)
            | WrapperError::FailedToLoadSymbol(_)
            | WrapperError::LibraryNotFound
            | WrapperError::DriverNotLoaded
            | WrapperError::NoPermission
            | WrapperError::FunctionNotFound
            | WrapperError::GpuLost
            | WrapperError::Unknown
    )
}

/// Who a GPU is: what its samples are labelled with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuIdentity {
    /// NVML index on this machine (not stable across reboots or containers).
    pub index: u32,
    /// NVML UUID, stable for the GPU's life.
    pub uuid: String,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub model: String,
}

impl GpuIdentity {
    /// The labels of this GPU's samples: `gpu` (index), `UUID` and `modelName`, as
    /// dcgm-exporter names them, so that omen's series join with DCGM's.
    pub fn labels(&self) -> BTreeMap<String, String> {
        [
            ("gpu".to_owned(), self.index.to_string()),
            ("UUID".to_owned(), self.uuid.clone()),
            ("modelName".to_owned(), self.model.clone()),
        ]
        .into()
    }
}

/// The GPUs to sample: all of `seen` when `wanted` is empty, else those whose UUID is listed
/// (case-insensitively); every listed UUID must be seen.
pub fn select_gpus(seen: Vec<GpuIdentity>, wanted: &[String]) -> Result<Vec<GpuIdentity>, NvmlError> {
    if wanted.is_empty() {
        return Ok(seen);
    }
    let missing: Vec<String> =
        wanted.iter().filter(|w| !seen.iter().any(|g| g.uuid.eq_ignore_ascii_case(w))).cloned().collect();
    if !missing.is_empty() {
        return Err(NvmlError::UnknownUuids { missing, seen: seen.into_iter().map(|g| g.uuid).collect() });
    }
    Ok(seen.into_iter().filter(|g| wanted.iter().any(|w| g.uuid.eq_ignore_ascii_case(w))).collect())
}

/// Reads GPU memory from NVML for the selected GPUs.
pub struct GpuSampler {
    nvml: Nvml,
    gpus: Vec<GpuIdentity>,
}

impl std::fmt::Debug for GpuSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSampler").field("gpus", &self.gpus).finish_non_exhaustive()
    }
}

impl GpuSampler {
    /// Loads and initialises NVML and picks the GPUs `uuids` names (all when empty);
    /// [`NvmlError::Unavailable`] when there is no driver or GPU.
    pub fn new(uuids: &[String]) -> Result<Self, NvmlError> {
        let nvml = Nvml::init().map_err(|e| {
            if is_unavailable(&e) {
                NvmlError::Unavailable { reason: e.to_string() }
            } else {
                NvmlError::Call { call: "init", gpu: "-".into(), source: e }
            }
        })?;
        let count = nvml.device_count().map_err(|source| NvmlError::Call {
            call: "device_count",
            gpu: "-".into(),
            source,
        })?;
        if count == 0 {
            return Err(NvmlError::Unavailable { reason: "the driver is loaded but reports no GPU".into() });
        }
        let mut seen = Vec::new();
        for index in 0..count {
            let call = |call, source| NvmlError::Call { call, gpu: index.to_string(), source };
            let device = nvml.device_by_index(index).map_err(|e| call("device_by_index", e))?;
            let uuid = device.uuid().map_err(|e| call("uuid", e))?;
            let model = device.name().map_err(|e| call("name", e))?;
            seen.push(GpuIdentity { index, uuid, model });
        }
        let gpus = select_gpus(seen, uuids)?;
        Ok(Self { nvml, gpus })
    }

    /// Number of GPUs sampled.
    pub fn gpu_count(&self) -> u32 {
        self.gpus.len() as u32
    }

    /// The GPUs sampled.
    pub fn gpus(&self) -> &[GpuIdentity] {
        &self.gpus
    }

    /// Memory samples at `ts_ms`: `gpu_memory_used_bytes`, `gpu_memory_total_bytes`,
    /// `gpu_process_memory_bytes{pid}`, each labelled by [`GpuIdentity::labels`], and the
    /// readings that failed (a GPU whose reading fails is left out of the samples).
    pub fn sample_with_errors(&self, ts_ms: i64) -> (Vec<Sample>, Vec<NvmlError>) {
        let mut out = Vec::new();
        let mut errors = Vec::new();
        for gpu in &self.gpus {
            let call = |call, source| NvmlError::Call { call, gpu: gpu.index.to_string(), source };
            let device = match self.nvml.device_by_uuid(gpu.uuid.as_str()) {
                Ok(d) => d,
                Err(e) => {
                    errors.push(call("device_by_uuid", e));
                    continue;
                }
            };
            let labels = gpu.labels();
            match device.memory_info() {
                Ok(m) => {
                    out.push(Sample {
                        ts_ms,
                        signal: catalogue::GPU_MEMORY_USED_BYTES.name.into(),
                        labels: labels.clone(),
                        value: m.used as f64,
                    });
                    out.push(Sample {
                        ts_ms,
                        signal: catalogue::GPU_MEMORY_TOTAL_BYTES.name.into(),
                        labels: labels.clone(),
                        value: m.total as f64,
                    });
                }
                Err(e) => errors.push(call("memory_info", e)),
            }
            // A process can be both a compute and a graphics client; count it once.
            let mut per_pid: BTreeMap<u32, u64> = BTreeMap::new();
            for (what, list) in [
                ("running_compute_processes", device.running_compute_processes()),
                ("running_graphics_processes", device.running_graphics_processes()),
            ] {
                match list {
                    Ok(list) => {
                        for p in list {
                            if let UsedGpuMemory::Used(bytes) = p.used_gpu_memory {
                                let e = per_pid.entry(p.pid).or_default();
                                *e = (*e).max(bytes);
                            }
                        }
                    }
                    Err(WrapperError::NotSupported) => {}
                    Err(e) => errors.push(call(what, e)),
                }
            }
            for (pid, bytes) in per_pid {
                let mut labels = labels.clone();
                labels.insert("pid".into(), pid.to_string());
                out.push(Sample {
                    ts_ms,
                    signal: catalogue::GPU_PROCESS_MEMORY_BYTES.name.into(),
                    labels,
                    value: bytes as f64,
                });
            }
        }
        (out, errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, uuid: &str) -> GpuIdentity {
        GpuIdentity { index, uuid: uuid.into(), model: "NVIDIA H100 80GB HBM3".into() }
    }

    #[test]
    fn no_uuids_selects_every_gpu_and_a_list_only_those() {
        let seen = vec![gpu(0, "GPU-aaa"), gpu(1, "GPU-bbb"), gpu(2, "GPU-ccc")];
        assert_eq!(select_gpus(seen.clone(), &[]).unwrap(), seen);
        let picked = select_gpus(seen.clone(), &["gpu-CCC".into(), "GPU-aaa".into()]).unwrap();
        assert_eq!(picked, vec![gpu(0, "GPU-aaa"), gpu(2, "GPU-ccc")]);
    }

    #[test]
    fn an_unknown_uuid_names_what_is_missing_and_what_is_there() {
        let e = select_gpus(vec![gpu(0, "GPU-aaa")], &["GPU-zzz".into()]).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("GPU-zzz") && text.contains("GPU-aaa") && text.contains("sources.nvml.uuids"),
            "{text}"
        );
    }

    #[test]
    fn labels_are_dcgm_exporters() {
        let labels = gpu(3, "GPU-ddd").labels();
        assert_eq!(labels["gpu"], "3");
        assert_eq!(labels["UUID"], "GPU-ddd");
        assert_eq!(labels["modelName"], "NVIDIA H100 80GB HBM3");
    }

    #[test]
    fn a_uuid_that_is_not_one_is_a_config_problem() {
        let cfg = NvmlSourceConfig { uuids: vec!["GPU-1".into(), "0".into()], ..Default::default() };
        let p = cfg.problems();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].0, "uuids[1]");
    }
}
