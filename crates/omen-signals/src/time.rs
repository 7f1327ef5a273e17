//! Time units shared by every crate: time stamps are Unix milliseconds (i64).
//! Reading the clock is the callers' job (omen-sources' `now_ms`); this module only names units.

/// Milliseconds in one minute (the store's folding unit).
pub const MINUTE_MS: i64 = 60_000;

/// Milliseconds in one hour.
pub const HOUR_MS: i64 = 3_600_000;

/// Milliseconds in one day (the forecasts' aggregation unit).
pub const DAY_MS: i64 = 86_400_000;

/// The time of day of a Unix-millisecond time stamp as a fraction of the UTC day, in [0, 1).
pub fn day_fraction_utc(ts_ms: i64) -> f64 {
    ts_ms.rem_euclid(DAY_MS) as f64 / DAY_MS as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn day_fraction_wraps_at_midnight_and_before_the_epoch() {
        assert_eq!(day_fraction_utc(0), 0.0);
        assert_eq!(day_fraction_utc(DAY_MS / 4), 0.25);
        assert_eq!(day_fraction_utc(3 * DAY_MS + DAY_MS / 2), 0.5);
        assert_eq!(day_fraction_utc(-DAY_MS / 4), 0.75);
        assert!(day_fraction_utc(DAY_MS - 1) < 1.0);
    }
}
