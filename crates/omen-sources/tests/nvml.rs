//! NVML through the real libnvidia-ml.so: on a machine without the NVIDIA driver
//! (this project's build and CI machines) `GpuSampler::new` must say so clearly;
//! on a GPU host it must read every GPU's memory.

use omen_sources::nvml::{GpuSampler, NvmlError};

#[test]
fn gpu_sampler_reports_unavailable_or_reads_memory() {
    match GpuSampler::new(&[]) {
        Err(err @ NvmlError::Unavailable { .. }) => {
            let msg = err.to_string();
            assert!(msg.contains("libnvidia-ml.so"), "the message must name the library: {msg}");
            assert!(msg.contains("GPU signals are off"), "the message must say what that means: {msg}");
            eprintln!("as expected on a machine without a GPU: {msg}");
        }
        Err(other) => panic!("NVML failed in an unexpected way: {other}"),
        Ok(sampler) => {
            let (samples, errors) = sampler.sample_with_errors(1_780_000_000_000);
            assert!(errors.is_empty(), "NVML readings failed: {errors:?}");
            for identity in sampler.gpus() {
                let gpu = identity.index.to_string();
                assert!(identity.uuid.starts_with("GPU-") && !identity.model.is_empty(), "{identity:?}");
                let get = |signal: &str| {
                    samples
                        .iter()
                        .find(|s| s.signal == signal && s.labels == identity.labels())
                        .map(|s| s.value)
                        .unwrap_or_else(|| panic!("no {signal} for GPU {gpu}: {samples:?}"))
                };
                let (used, total) = (get("gpu_memory_used_bytes"), get("gpu_memory_total_bytes"));
                assert!(total > 0.0 && used <= total, "GPU {gpu}: used {used} of {total}");
            }
            for s in samples.iter().filter(|s| s.signal == "gpu_process_memory_bytes") {
                assert!(s.labels.contains_key("pid") && s.labels.contains_key("UUID"), "{s:?}");
            }
        }
    }
}
