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
}

impl Default for NvmlSourceConfig {
    fn default() -> Self {
        Self { enabled: true, interval: Duration::from_secs(10) }
    }
}

impl NvmlSourceConfig {
    /// Every problem of the section as (field path within the section, what to do).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut p = Vec::new();
        if self.interval < Duration::from_millis(100) {
            p.push(("interval".to_owned(), "must be at least 100ms".to_owned()));
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

/// Reads GPU memory from NVML for every visible GPU.
pub struct GpuSampler {
    nvml: Nvml,
    count: u32,
}

impl std::fmt::Debug for GpuSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSampler").field("gpus", &self.count).finish_non_exhaustive()
    }
}

impl GpuSampler {
    /// Loads and initialises NVML; [`NvmlError::Unavailable`] when there is no driver or GPU.
    pub fn new() -> Result<Self, NvmlError> {
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
        Ok(Self { nvml, count })
    }

    /// Number of GPUs NVML sees.
    pub fn gpu_count(&self) -> u32 {
        self.count
    }

    /// Memory samples at `ts_ms`: `gpu_memory_used_bytes{gpu}`, `gpu_memory_total_bytes{gpu}`,
    /// `gpu_process_memory_bytes{gpu,pid}`, and the readings that failed (a GPU whose reading
    /// fails is left out of the samples).
    pub fn sample_with_errors(&self, ts_ms: i64) -> (Vec<Sample>, Vec<NvmlError>) {
        let mut out = Vec::new();
        let mut errors = Vec::new();
        for index in 0..self.count {
            let gpu = index.to_string();
            let call = |call, source| NvmlError::Call { call, gpu: gpu.clone(), source };
            let device = match self.nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    errors.push(call("device_by_index", e));
                    continue;
                }
            };
            let labels: BTreeMap<String, String> = [("gpu".to_owned(), gpu.clone())].into();
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
