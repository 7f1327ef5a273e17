//! The unit everything downstream consumes: one value of one signal at one time.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One observation: `signal` (an exported name without the `omen_` prefix, e.g.
/// `kv_fragmentation`) with its labels (`layer`, `gpu`, `canary`) at `ts_ms` (Unix ms).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Unix time in milliseconds.
    pub ts_ms: i64,
    /// Signal name, e.g. `tle_bits`, `kvcache_usage_ratio`.
    pub signal: String,
    /// Series labels; empty for a signal with a single series.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The value.
    pub value: f64,
}

/// Identity of a time series: signal name plus sorted labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SeriesKey {
    /// Signal name.
    pub signal: String,
    /// Sorted labels.
    pub labels: BTreeMap<String, String>,
}

impl Sample {
    /// The series this sample belongs to.
    pub fn series_key(&self) -> SeriesKey {
        SeriesKey { signal: self.signal.clone(), labels: self.labels.clone() }
    }
}

impl std::fmt::Display for SeriesKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.signal)?;
        if !self.labels.is_empty() {
            f.write_str("{")?;
            for (i, (k, v)) in self.labels.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{k}=\"{v}\"")?;
            }
            f.write_str("}")?;
        }
        Ok(())
    }
}
