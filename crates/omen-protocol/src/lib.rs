//! What the `omen` agent and its model worker `omen-worker` share, and nothing else: the
//! worker's JSON-lines protocol ([`worker`]) and the training data that `omen train` and
//! `omen evaluate` read ([`training`]). Both sides depend on this crate, so the worker needs
//! neither the agent's HTTP server nor its exporters.

pub mod training;
pub mod worker;
