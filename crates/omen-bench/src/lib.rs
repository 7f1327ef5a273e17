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
//! The binary `omen-push-load` loads the agent's own push-ingest API.

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
