//! omen's offline tools, all running the agent's own pipeline: [`simulate`] writes labelled
//! degradation traces, [`replay`] runs a trace through the pipeline into a report with a
//! picture, [`evaluate_warnings`] scores the early warnings on a set of scenarios, and
//! [`explain`] attributes a latency change to throughput, TTFT and quality, and [`stress`]
//! finds how much prompt perturbation a model's answers withstand. [`detectors`] prints
//! the NAB table of omen's detectors beside the published ones.

pub mod baseline;
pub mod detectors;
pub mod evaluate_warnings;
pub mod explain;
pub mod history;
pub mod replay;
pub mod simulate;
pub mod stress;
