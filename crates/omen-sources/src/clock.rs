//! The one wall clock: sources stamp samples with it, the agent ticks by it. Everything
//! below (signals, pipeline, store) takes time stamps as arguments instead.

/// Now, as Unix milliseconds (UTC).
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
