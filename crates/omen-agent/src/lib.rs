//! The omen agent: config, pipeline, store, HTTP API and exporters. The binary
//! `omen` (main.rs) is a thin CLI over this library, which the tests drive directly.

pub mod compare;
pub mod config;
pub mod engine;
pub mod evaluate_warnings;
pub mod http;
pub mod loadgen;
#[cfg(feature = "lstm")]
pub mod lstm_live;
pub mod metrics;
pub mod model_cli;
pub mod otlp;
pub mod replay;
pub mod run;
pub mod semantic;
pub mod simulate;
pub mod store;
pub mod trace_file;
pub mod worker;

/// Logs to stderr; `RUST_LOG` overrides the default `info` level.
pub fn logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
