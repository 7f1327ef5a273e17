//! omen's benchmark side: a load generator for OpenAI-compatible servers (`omen bench`,
//! [`loadgen`]) and the A/B Delta-Metric comparison of two of its reports (`omen compare`,
//! [`compare`]). The binary `omen-push-load` loads the agent's own push-ingest API.

pub mod compare;
pub mod loadgen;
