//! Pure math for omen's degradation signals: no I/O, no clocks, no globals.
//!
//! Every function here takes its inputs (values, time stamps, random generators)
//! from the caller, so the agent, the offline replay and the tests compute the
//! same numbers. Definitions follow `shared/DESIGN.md` and `docs/signals.md`.

pub mod bleu;
pub mod catalogue;
pub mod coupled;
pub mod delta;
pub mod htm_likelihood;
pub mod kvf;
pub mod novelty;
pub mod rci;
pub mod time;
pub mod tle;
pub mod trend;
pub mod window;

pub use bleu::{sentence_bleu, tokenize_13a, BleuReference, BleuScore, BleuStats};
pub use delta::{
    delta_metric, interval_from_differences, percentile_difference_ci, quantile_linear, BootstrapInterval,
    DeltaVerdict,
};
pub use htm_likelihood::{htm_log_likelihood, HtmLikelihood};
pub use kvf::{
    blocks_needed, first_fit_contiguous, fragmentation_from_bitmap, fragmentation_from_extents,
    fragmentation_from_occupancy, plan_paged_blocks, BlockPlan, Fragmentation, KVF_ALERT_THRESHOLD,
};
pub use novelty::{
    learned_range, ContextSurprise, LearningNoveltySurprise, NoveltySurprise, NoveltySurpriseConfig,
    RangeNovelty, SurpriseParts,
};
pub use rci::{
    consistency_decay_index, repetition_ratio, Rci, RciParts, RciWeights, SemanticSimilarity, StreamingRci,
};
pub use time::{day_fraction_utc, DAY_MS, HOUR_MS, MINUTE_MS};
pub use tle::{first_token_entropy_bits, first_token_entropy_from_top_logprobs, TopKEntropy};
pub use trend::{
    breach_interval, current_regime_start, days_to_breach, median, regime_starts, reset_cycle,
    residual_scale, theil_sen, trailing_worst, BreachDirection, BreachForecast, TheilSen, WeeklyProfile,
    EARLY_WARNING_DAYS, REGIME_MIN_SIDE, REGIME_SHIFT_CRITICAL, WARNING_MARGIN_DAYS, WEEKLY_PROFILE_MIN_DAYS,
};
pub use window::{window_anomaly_score_direct, WindowAnomaly, WindowScore, SKEW_WEIGHT, STD_EPSILON};

/// Errors from the signal computations; each names the input and what is wrong with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SignalError {
    /// An input slice was empty where at least `needed` values are required.
    #[error("{input} is empty; it needs at least {needed} value(s)")]
    Empty { input: &'static str, needed: usize },
    /// An input value was NaN or infinite.
    #[error(
        "{input}[{index}] is {value}, which is not a finite number; drop or repair that value before scoring"
    )]
    NonFinite { input: &'static str, index: usize, value: f64 },
    /// A parameter was outside its valid range.
    #[error("{parameter} = {value} is invalid: {reason}")]
    InvalidParameter { parameter: &'static str, value: String, reason: String },
    /// Two inputs that must have equal length did not.
    #[error("{left} has {left_len} values but {right} has {right_len}; they must be the same length")]
    LengthMismatch { left: &'static str, left_len: usize, right: &'static str, right_len: usize },
}

/// Builds an [`SignalError::InvalidParameter`] without the boilerplate.
pub(crate) fn invalid(
    parameter: &'static str,
    value: impl std::fmt::Display,
    reason: impl Into<String>,
) -> SignalError {
    SignalError::InvalidParameter { parameter, value: value.to_string(), reason: reason.into() }
}
