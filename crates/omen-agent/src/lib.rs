//! The omen sidecar daemon: config, source wiring, the pipeline, HTTP API, exporters and
//! the model-worker client. The `omen` binary (crates/omen-cli) runs it with `omen run`;
//! the offline tools live in omen-lab and omen-bench, the store in omen-store.

pub mod config;
pub mod detector;
pub mod engine;
pub mod forecast_view;
pub mod history;
pub mod http;
#[cfg(feature = "lstm")]
pub mod lstm_live;
pub mod metrics;
pub mod model_training;
pub mod otlp;
pub mod pipeline;
pub mod run;
pub mod semantic;
pub mod sources;
pub mod worker;

/// Logs to stderr; `RUST_LOG` overrides the default `info` level.
pub fn logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
