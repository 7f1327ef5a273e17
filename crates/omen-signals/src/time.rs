//! Time units shared by every crate: time stamps are Unix milliseconds (i64).
//! Reading the clock is the callers' job (omen-sources' `now_ms`); this module only names units.

/// Milliseconds in one minute (the store's folding unit).
pub const MINUTE_MS: i64 = 60_000;

/// Milliseconds in one day (the forecasts' aggregation unit).
pub const DAY_MS: i64 = 86_400_000;
