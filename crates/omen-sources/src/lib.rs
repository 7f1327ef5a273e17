//! Collectors that turn the outside world into omen samples: trace readers,
//! push-ingest payloads, server /metrics scrapes, canary probes and NVML.

pub mod canary;
pub mod clock;
pub mod http;
pub mod ingest;
pub mod nsys;
pub mod nvml;
pub mod openai_stream;
pub mod sample;
pub mod scrape;
pub mod trace;
pub mod trace_file;

pub use canary::CanarySourceConfig;
pub use canary::{error_chain, probe, Canary, CanaryError, CanaryResult, CanaryTarget};
pub use clock::now_ms;
pub use nvml::NvmlSourceConfig;
pub use nvml::{GpuSampler, NvmlError};
pub use sample::{Sample, SeriesKey};
pub use scrape::ServerMetricsConfig;
pub use scrape::{ScrapeError, Scraper, ServerKind};
pub use trace::{read_jsonl_trace, TraceError};
pub use trace_file::{TraceBatch, TraceFileError, TraceSourceConfig};
