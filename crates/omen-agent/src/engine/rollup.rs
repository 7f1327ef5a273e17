//! Day roll-ups, compaction and retention. Each tick continues the day aggregates of the
//! days that ended since the last one (persisted, so a restart resumes where it left off)
//! within a fixed budget, so that a tick stays short however many series there are, and at
//! most hourly drops what is older than each tier's retention. Compaction (sealed rows into
//! compressed blocks) runs apart from the tick, in [`Engine::maintain`] steps.

use anyhow::Result;

use super::Engine;
use omen_store::DAY_MS;

/// Retention runs at most this often, in event time.
const RETENTION_EVERY_MS: i64 = 3_600_000;

/// Series rolled up per tick. 8 GPUs x 80 layers give 2,560 series (values and anomaly
/// scores): a day's roll-up spreads over 80 ticks of the default 1-minute interval.
const ROLL_UP_SERIES_PER_TICK: usize = 32;

/// Blocks one [`Engine::maintain`] call compacts: about 10 ms of work (measured: some
/// 1.3 ms a block of 360 rows), the longest a batch waits for it.
const COMPACT_BLOCKS_PER_STEP: usize = 8;

impl Engine {
    /// Continues the day roll-ups: the complete days before `now_ms`'s day not rolled up
    /// yet (from the first stored sample on a new store), at most
    /// [`ROLL_UP_SERIES_PER_TICK`] series per call; records each day once it is complete.
    pub(super) fn roll_up_days(&mut self, now_ms: i64) -> Result<()> {
        let today = now_ms.div_euclid(DAY_MS) * DAY_MS;
        let mut budget = ROLL_UP_SERIES_PER_TICK;
        loop {
            let (day, from_id) = match self.roll_up_cursor {
                Some(cursor) => cursor,
                None => {
                    let from = match self.rolled_until_day_ms {
                        Some(d) => d,
                        None => {
                            self.store.earliest_ts()?.map(|t| t.div_euclid(DAY_MS) * DAY_MS).unwrap_or(today)
                        }
                    };
                    (from, 0)
                }
            };
            if day >= today {
                self.rolled_until_day_ms = Some(self.rolled_until_day_ms.unwrap_or(day).max(today));
                return Ok(());
            }
            if budget == 0 {
                self.roll_up_cursor = Some((day, from_id));
                return Ok(());
            }
            let done = self.store.roll_up_day(day, from_id, budget)?;
            self.day_agg_generation += 1;
            budget -= done.visited.min(budget);
            match done.next_id {
                Some(id) => self.roll_up_cursor = Some((day, id)),
                None => {
                    self.store.set_meta("rolled_until_day_ms", &(day + DAY_MS).to_string())?;
                    self.rolled_until_day_ms = Some(day + DAY_MS);
                    self.roll_up_cursor = None;
                }
            }
        }
    }

    /// One step of the store's upkeep outside the tick: moves sealed rows into compressed
    /// blocks, [`COMPACT_BLOCKS_PER_STEP`] at most. Returns whether more is waiting; the
    /// pipeline calls it while no batch is queued, so that a batch waits for one step at most.
    pub fn maintain(&mut self) -> Result<bool> {
        Ok(self.store.compact(self.clock_ms, COMPACT_BLOCKS_PER_STEP)?.pending)
    }

    /// Applies the store's retention when an hour of event time has passed since it last
    /// completed (a backlog is worked off one bounded call per tick).
    pub(super) fn apply_retention(&mut self, now_ms: i64) -> Result<()> {
        if now_ms - self.last_retention_ms >= RETENTION_EVERY_MS {
            let st = &self.cfg.store;
            // The day aggregates retention deletes (day_ms < cutoff) change only when the
            // cutoff passes a day boundary: only then may a cached forecast input be stale.
            // Bumped before the call: it is not one transaction, so a failure part-way may
            // already have deleted some of them; and the day is recorded only after it
            // succeeds, so that its retry bumps again.
            let cutoff = now_ms - st.day_retention_days as i64 * DAY_MS;
            let first_kept_day = (cutoff + DAY_MS - 1).div_euclid(DAY_MS);
            if self.day_retention_first_kept != Some(first_kept_day) {
                self.day_agg_generation += 1;
            }
            let deleted = self.store.apply_retention(
                now_ms,
                st.raw_retention_days,
                st.minute_retention_days,
                st.day_retention_days,
            )?;
            self.day_retention_first_kept = Some(first_kept_day);
            // A bounded call that hit its bound may have left more: go on at the next tick.
            if deleted < omen_store::RETENTION_BLOCKS_PER_CALL {
                self.last_retention_ms = now_ms;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::engine;
    use super::*;

    #[test]
    fn retention_invalidates_the_day_aggregates_only_when_its_cutoff_passes_a_day() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = engine(dir.path(), "");
        // The cutoff (now less the day tier's retention) at exactly a midnight.
        let midnight = 1_793_577_600_000 + e.cfg.store.day_retention_days as i64 * DAY_MS;
        let mut bumps = Vec::new();
        for hour in 0..=26 {
            let before = e.day_agg_generation;
            e.apply_retention(midnight + hour * RETENTION_EVERY_MS).unwrap();
            if e.day_agg_generation != before {
                bumps.push(hour);
            }
        }
        // The first run; then the run after each midnight, when day_ms < cutoff first
        // takes in the day before (at midnight itself it deletes what the run before did).
        assert_eq!(bumps, vec![0, 1, 25]);
    }
}
