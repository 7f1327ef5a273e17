//! omen's offline tools, all running the agent's own pipeline: [`simulate`] writes labelled
//! degradation traces, [`replay`] runs a trace through the pipeline into a report with a
//! picture, and [`evaluate_warnings`] scores the early warnings on a set of scenarios.

pub mod evaluate_warnings;
pub mod replay;
pub mod simulate;
