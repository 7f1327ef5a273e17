//! omen's benchmark side.
//!
//! - [`loadgen`]: the load generator for OpenAI-compatible servers (`omen bench`), and
//!   [`suite`], one bench invocation with its extras: repeat runs and their stability
//!   ([`trust`]), the latency breakdown from the client's and the server's view
//!   ([`breakdown`]), the cost ([`cost`]), the picture ([`picture`]) and the user's
//!   extension hooks ([`hooks`]).
//! - [`capacity`]: the highest rate a server sustains within P99 bounds (`omen capacity`).
//! - [`compare`]: the A/B Delta-Metric comparison of two reports (`omen compare`), and
//!   [`trust`]'s golden-baseline gate on it.
//! - [`pareto`]: the front of cost (or latency) against answer quality over swept knobs
//!   (`omen pareto`).
//!
//! - [`yaml`]: reading the YAML inputs with errors that name the field.
//!
//! The binary `omen-push-load` loads the agent's own push-ingest API.

/// A command-line option is out of range: names it, the value given and what is allowed.
#[derive(Debug, thiserror::Error)]
#[error("{option} = {value}: {reason}")]
pub struct BadOption {
    /// The option, e.g. `--start-rate`.
    pub option: &'static str,
    /// The value given.
    pub value: String,
    /// What is allowed.
    pub reason: &'static str,
}

pub mod breakdown;
pub mod capacity;
pub mod compare;
pub mod cost;
pub mod hooks;
pub mod loadgen;
pub mod pareto;
pub mod picture;
pub mod suite;
pub mod trust;
pub mod yaml;
