//! The one wall clock: sources stamp samples with it, the agent ticks by it. Everything
//! below (signals, pipeline, store) takes time stamps as arguments instead. Also the one
//! reader of the times users write (/scores, `omen explain`), and the one writer of the
//! times omen shows them.

/// Now, as Unix milliseconds (UTC).
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// `ms` (Unix milliseconds) as RFC 3339 in UTC to the second (`2026-11-02T10:00:00Z`);
/// `None` beyond the calendar's range.
pub fn rfc3339(ms: i64) -> Option<String> {
    chrono::DateTime::from_timestamp_millis(ms).map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

/// A time a user wrote: `now`, `now-6h` (any humantime duration), Unix seconds, or RFC 3339;
/// `now` is `now_ms` (the caller's clock: the wall clock, or a store's newest sample).
pub fn parse_time(text: &str, now_ms: i64) -> Result<i64, String> {
    let text = text.trim();
    if text == "now" {
        return Ok(now_ms);
    }
    if let Some(rel) = text.strip_prefix("now-") {
        let d = humantime::parse_duration(rel).map_err(|e| format!("{text:?}: {e}; write e.g. now-6h"))?;
        return i64::try_from(d.as_millis()).ok().and_then(|back| now_ms.checked_sub(back)).ok_or_else(
            || format!("{text:?} reaches back beyond any representable time; write e.g. now-30d"),
        );
    }
    if let Ok(secs) = text.parse::<f64>() {
        if secs.is_finite() {
            return Ok((secs * 1000.0) as i64);
        }
    }
    chrono::DateTime::parse_from_rfc3339(text).map(|t| t.timestamp_millis()).map_err(|_| {
        format!("{text:?} is not a time; use RFC 3339 (2026-11-02T10:00:00Z), Unix seconds, now or now-6h")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_times_parse_in_every_form() {
        let now = 1_800_000_000_000;
        assert_eq!(parse_time("now", now), Ok(now));
        assert_eq!(parse_time("now-6h", now), Ok(now - 6 * 3_600_000));
        assert_eq!(parse_time("1800000000", now), Ok(now));
        assert_eq!(parse_time("2027-01-15T08:00:00Z", now), Ok(now));
        assert!(parse_time("yesterday", now).unwrap_err().contains("RFC 3339"));
        assert!(parse_time("now-100000000000y", now).unwrap_err().contains("beyond"));
        assert!(parse_time("now-6x", now).unwrap_err().contains("now-6h"));
    }
}
