//! Day roll-ups and retention: each tick completes the day aggregates of the days that
//! ended since the last one (persisted, so a restart resumes where it left off), and at
//! most hourly drops what is older than each tier's retention.

use anyhow::Result;

use super::Engine;
use omen_store::DAY_MS;

/// Retention runs at most this often, in event time.
const RETENTION_EVERY_MS: i64 = 3_600_000;

impl Engine {
    /// Rolls up the complete days before `now_ms`'s day not rolled up yet (from the first
    /// stored sample on a new store), and records how far it got.
    pub(super) fn roll_up_days(&mut self, now_ms: i64) -> Result<()> {
        let today = now_ms.div_euclid(DAY_MS) * DAY_MS;
        let from = match self.rolled_until_day_ms {
            Some(d) => d,
            None => self.store.earliest_ts()?.map(|t| t.div_euclid(DAY_MS) * DAY_MS).unwrap_or(today),
        };
        if from < today {
            self.store.roll_up_days(from, today)?;
            self.store.set_meta("rolled_until_day_ms", &today.to_string())?;
        }
        self.rolled_until_day_ms = Some(today.max(from));
        Ok(())
    }

    /// Applies the store's retention when an hour of event time has passed since it last did.
    pub(super) fn apply_retention(&mut self, now_ms: i64) -> Result<()> {
        if now_ms - self.last_retention_ms >= RETENTION_EVERY_MS {
            let st = &self.cfg.store;
            self.store.apply_retention(
                now_ms,
                st.raw_retention_days,
                st.minute_retention_days,
                st.day_retention_days,
            )?;
            self.last_retention_ms = now_ms;
        }
        Ok(())
    }
}
