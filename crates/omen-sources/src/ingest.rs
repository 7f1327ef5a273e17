//! Push-ingest payloads (`POST /v1/ingest/{kvcache,logits,samples}`): parsing,
//! validation and conversion into samples. Every rejection says which field is
//! wrong and how to fix it; the HTTP layer turns it into a 4xx.

use std::collections::BTreeMap;

use base64::Engine as _;
use omen_signals::{
    catalogue, first_token_entropy_bits, first_token_entropy_from_top_logprobs, fragmentation_from_bitmap,
    fragmentation_from_extents, Fragmentation,
};
use serde::Deserialize;

use crate::Sample;

/// Most samples one `/v1/ingest/samples` request may carry.
pub const MAX_SAMPLES_PER_REQUEST: usize = 10_000;
/// Most labels one sample may carry.
pub const MAX_LABELS: usize = 8;
/// Most layers one `/v1/ingest/kvcache` request may carry (8 GPUs x 128 layers).
pub const MAX_LAYERS_PER_REQUEST: usize = 1024;
/// Largest block pool per layer accepted in a block map.
pub const MAX_BLOCKS_PER_LAYER: usize = 1 << 22;

/// A payload that was rejected, naming the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct IngestError {
    /// JSON path of the offending field, e.g. `layers[3].bitmap_b64`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub reason: String,
}

fn reject(field: impl Into<String>, reason: impl Into<String>) -> IngestError {
    IngestError { field: field.into(), reason: reason.into() }
}

/// Timestamps in payloads: Unix milliseconds; absent means "now" (the caller's clock).
fn resolve_ts(ts_ms: Option<i64>, now_ms: i64, field: &str) -> Result<i64, IngestError> {
    match ts_ms {
        None => Ok(now_ms),
        Some(ts) if ts <= 0 => Err(reject(field, format!("{ts} is not a Unix time in milliseconds"))),
        // More than a day in the future is a clock or unit error (seconds vs ms is the usual one).
        Some(ts) if ts > now_ms + 86_400_000 => Err(reject(
            field,
            format!("{ts} is more than a day ahead of the agent's clock; send Unix milliseconds"),
        )),
        Some(ts) if ts < 1_000_000_000_000 => {
            Err(reject(field, format!("{ts} looks like seconds; send Unix milliseconds")))
        }
        Some(ts) => Ok(ts),
    }
}

/// Checks a signal or label name: `[a-z_][a-z0-9_]*`, at most 64 bytes (Prometheus-safe).
pub fn check_name(field: &str, name: &str) -> Result<(), IngestError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .enumerate()
            .all(|(i, b)| b == b'_' || b.is_ascii_lowercase() || (i > 0 && b.is_ascii_digit()));
    if ok {
        Ok(())
    } else {
        Err(reject(field, format!("{name:?} is not a valid name; use lower-case letters, digits and _ (at most 64), not starting with a digit")))
    }
}

// ---------------------------------------------------------------- kvcache

/// `POST /v1/ingest/kvcache`: KV-cache state of one GPU / engine, per layer (`layers`) or
/// per KV-cache group (`groups`: one block pool shared by a group's layers, as vLLM's is).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvCachePayload {
    /// Unix ms; default now.
    pub ts_ms: Option<i64>,
    /// GPU index or name; becomes the `gpu` label.
    pub gpu: Option<String>,
    /// Labels added to every sample (e.g. `server`, `model`, `engine`); names `[a-z_][a-z0-9_]*`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// One entry per layer.
    #[serde(default)]
    pub layers: Vec<KvLayer>,
    /// One entry per KV-cache group.
    #[serde(default)]
    pub groups: Vec<KvGroup>,
    /// Requests the engine is running, at the snapshot.
    pub requests_running: Option<u64>,
    /// Requests waiting in the engine's queue, at the snapshot.
    pub requests_waiting: Option<u64>,
}

/// One layer's KV block pool. Give `bitmap_b64` (+`num_blocks`), or `free_extents`
/// (+`total_blocks`), or just `used_blocks` + `total_blocks` (usage only).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvLayer {
    /// Layer index.
    pub layer: u32,
    /// Blocks in the pool.
    pub total_blocks: Option<u64>,
    /// Blocks in use.
    pub used_blocks: Option<u64>,
    /// Base64 of the occupancy bitmap, bit i % 8 of byte i / 8 set = block i in use.
    pub bitmap_b64: Option<String>,
    /// Number of blocks the bitmap describes.
    pub num_blocks: Option<u64>,
    /// Sizes of the free extents, in blocks.
    pub free_extents: Option<Vec<u64>>,
}

/// One KV-cache group's block pool: the block map fields of [`KvLayer`], plus the free
/// blocks as the engine counts them and the free blocks that still hold a cached prefix.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvGroup {
    /// Group index; becomes the `kv_group` label.
    pub group: u32,
    /// Attention type of the group's layers (e.g. `full_attention`); becomes the `attention` label.
    pub attention: Option<String>,
    /// Blocks in the pool.
    pub total_blocks: Option<u64>,
    /// Blocks in use.
    pub used_blocks: Option<u64>,
    /// Base64 of the occupancy bitmap, bit i % 8 of byte i / 8 set = block i in use.
    pub bitmap_b64: Option<String>,
    /// Number of blocks the bitmap describes.
    pub num_blocks: Option<u64>,
    /// Sizes of the free extents, in blocks.
    pub free_extents: Option<Vec<u64>>,
    /// Free blocks as the engine counts them; must agree with the block map when both are given.
    pub free_blocks: Option<u64>,
    /// Free blocks that still hold a cached prefix (reusable until evicted).
    pub cached_blocks: Option<u64>,
}

/// Converts a kvcache payload into samples: `kvcache_usage_ratio` and `kv_fragmentation` per layer
/// or group, block counts per group, and the request counts.
pub fn kvcache_samples(payload: &KvCachePayload, now_ms: i64) -> Result<Vec<Sample>, IngestError> {
    let ts_ms = resolve_ts(payload.ts_ms, now_ms, "ts_ms")?;
    let entries = payload.layers.len() + payload.groups.len();
    if entries == 0 {
        return Err(reject("layers", "is empty; send at least one layer (or one entry in groups)"));
    }
    if entries > MAX_LAYERS_PER_REQUEST {
        return Err(reject(
            if payload.layers.is_empty() { "groups" } else { "layers" },
            format!("has {entries} entries; at most {MAX_LAYERS_PER_REQUEST} layers and groups per request"),
        ));
    }
    let mut common = check_labels("labels", &payload.labels, MAX_LABELS - 3)?;
    if let Some(gpu) = &payload.gpu {
        check_label_value("gpu", gpu)?;
        common.insert("gpu".to_owned(), gpu.clone());
    }
    let mut out = Vec::with_capacity(entries * 2 + 2);
    let mut push = |signal: &str, labels: &BTreeMap<String, String>, value: f64| {
        out.push(Sample { ts_ms, signal: signal.to_owned(), labels: labels.clone(), value })
    };
    let mut seen = std::collections::HashSet::new();
    for (i, layer) in payload.layers.iter().enumerate() {
        let path = |f: &str| format!("layers[{i}].{f}");
        if !seen.insert(layer.layer) {
            return Err(reject(path("layer"), format!("layer {} appears twice", layer.layer)));
        }
        let map = BlockMap {
            total_blocks: layer.total_blocks,
            used_blocks: layer.used_blocks,
            bitmap_b64: layer.bitmap_b64.as_deref(),
            num_blocks: layer.num_blocks,
            free_extents: layer.free_extents.as_deref(),
        };
        let state = layer_state(&map, &path)?;
        let mut labels = common.clone();
        labels.insert("layer".to_owned(), layer.layer.to_string());
        push(catalogue::KVCACHE_USAGE_RATIO.name, &labels, state.usage());
        if let Some(f) = state.fragmentation {
            push(catalogue::KV_FRAGMENTATION.name, &labels, f.kv_fragmentation);
        }
    }
    let mut seen = std::collections::HashSet::new();
    for (i, group) in payload.groups.iter().enumerate() {
        let path = |f: &str| format!("groups[{i}].{f}");
        if !seen.insert(group.group) {
            return Err(reject(path("group"), format!("group {} appears twice", group.group)));
        }
        let map = BlockMap {
            total_blocks: group.total_blocks,
            used_blocks: group.used_blocks,
            bitmap_b64: group.bitmap_b64.as_deref(),
            num_blocks: group.num_blocks,
            free_extents: group.free_extents.as_deref(),
        };
        let state = layer_state(&map, &path)?;
        let free = state.total - state.used;
        if let Some(stated) = group.free_blocks {
            if stated != free {
                return Err(reject(
                    path("free_blocks"),
                    format!("is {stated} but the block map has {free} free of {} blocks; send one snapshot's figures", state.total),
                ));
            }
        }
        if let Some(cached) = group.cached_blocks {
            if cached > free {
                return Err(reject(
                    path("cached_blocks"),
                    format!("{cached} cached blocks exceed the {free} free ones"),
                ));
            }
        }
        let mut labels = common.clone();
        labels.insert("kv_group".to_owned(), group.group.to_string());
        if let Some(attention) = &group.attention {
            check_label_value(&path("attention"), attention)?;
            labels.insert("attention".to_owned(), attention.clone());
        }
        push(catalogue::KVCACHE_USAGE_RATIO.name, &labels, state.usage());
        if let Some(f) = state.fragmentation {
            push(catalogue::KV_FRAGMENTATION.name, &labels, f.kv_fragmentation);
        }
        push(catalogue::SERVER_KVCACHE_CAPACITY_BLOCKS.name, &labels, state.total as f64);
        push(catalogue::SERVER_KVCACHE_USED_BLOCKS.name, &labels, state.used as f64);
        if let Some(cached) = group.cached_blocks {
            push(catalogue::SERVER_KVCACHE_CACHED_BLOCKS.name, &labels, cached as f64);
        }
    }
    if let Some(n) = payload.requests_running {
        push(catalogue::SERVER_REQUESTS_RUNNING.name, &common, n as f64);
    }
    if let Some(n) = payload.requests_waiting {
        push(catalogue::SERVER_REQUESTS_WAITING.name, &common, n as f64);
    }
    Ok(out)
}

/// Checks the label names and values of `labels` (at most `max`), naming `field` on failure.
fn check_labels(
    field: &str,
    labels: &BTreeMap<String, String>,
    max: usize,
) -> Result<BTreeMap<String, String>, IngestError> {
    if labels.len() > max {
        return Err(reject(field, format!("has {} labels; at most {max}", labels.len())));
    }
    for (k, v) in labels {
        check_name(field, k)?;
        if matches!(k.as_str(), "gpu" | "layer" | "kv_group" | "attention") {
            return Err(reject(
                format!("{field}.{k}"),
                "is set by the payload's own fields; leave it out of labels",
            ));
        }
        check_label_value(&format!("{field}.{k}"), v)?;
    }
    Ok(labels.clone())
}

fn check_label_value(field: &str, value: &str) -> Result<(), IngestError> {
    if value.len() > 128 {
        return Err(reject(field, "is longer than 128 bytes"));
    }
    Ok(())
}

/// The block-map fields one layer or group may carry.
struct BlockMap<'a> {
    total_blocks: Option<u64>,
    used_blocks: Option<u64>,
    bitmap_b64: Option<&'a str>,
    num_blocks: Option<u64>,
    free_extents: Option<&'a [u64]>,
}

/// What a block map says: blocks in all and in use, and fragmentation when the map has it.
struct PoolState {
    total: u64,
    used: u64,
    fragmentation: Option<Fragmentation>,
}

impl PoolState {
    /// Share of the blocks in use.
    fn usage(&self) -> f64 {
        self.used as f64 / self.total as f64
    }
}

fn layer_state(layer: &BlockMap, path: &dyn Fn(&str) -> String) -> Result<PoolState, IngestError> {
    match (layer.bitmap_b64, layer.free_extents) {
        (Some(_), Some(_)) => {
            Err(reject(path("bitmap_b64"), "give either bitmap_b64 or free_extents, not both"))
        }
        (Some(b64), None) => {
            let blocks =
                layer.num_blocks.ok_or_else(|| reject(path("num_blocks"), "is required with bitmap_b64"))?
                    as usize;
            if blocks == 0 || blocks > MAX_BLOCKS_PER_LAYER {
                return Err(reject(
                    path("num_blocks"),
                    format!("{blocks} is outside 1..={MAX_BLOCKS_PER_LAYER}"),
                ));
            }
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| reject(path("bitmap_b64"), format!("is not valid base64 ({e})")))?;
            if bytes.len() != blocks.div_ceil(8) {
                return Err(reject(
                    path("bitmap_b64"),
                    format!(
                        "decodes to {} bytes but num_blocks = {blocks} needs {}",
                        bytes.len(),
                        blocks.div_ceil(8)
                    ),
                ));
            }
            let words: Vec<u64> = bytes
                .chunks(8)
                .map(|c| {
                    let mut w = [0u8; 8];
                    w[..c.len()].copy_from_slice(c);
                    u64::from_le_bytes(w)
                })
                .collect();
            let f = fragmentation_from_bitmap(&words, blocks)
                .map_err(|e| reject(path("bitmap_b64"), e.to_string()))?;
            let total = blocks as u64;
            let used = total - f.total_free;
            Ok(PoolState { total, used, fragmentation: Some(f) })
        }
        (None, Some(extents)) => {
            let total = layer
                .total_blocks
                .ok_or_else(|| reject(path("total_blocks"), "is required with free_extents"))?;
            let f = fragmentation_from_extents(extents.iter().copied());
            if total == 0 || f.total_free > total {
                return Err(reject(
                    path("free_extents"),
                    format!("sum to {} free blocks but total_blocks = {total}", f.total_free),
                ));
            }
            let used = total - f.total_free;
            Ok(PoolState { total, used, fragmentation: Some(f) })
        }
        (None, None) => {
            let total = layer.total_blocks.ok_or_else(|| {
                reject(
                    path("total_blocks"),
                    "give bitmap_b64, free_extents, or used_blocks with total_blocks",
                )
            })?;
            let used = layer.used_blocks.ok_or_else(|| {
                reject(path("used_blocks"), "is required with total_blocks when no block map is given")
            })?;
            if total == 0 || used > total {
                return Err(reject(
                    path("used_blocks"),
                    format!("{used} used of {total} total is impossible"),
                ));
            }
            Ok(PoolState { total, used, fragmentation: None })
        }
    }
}

// ---------------------------------------------------------------- logits

/// `POST /v1/ingest/logits`: the first decoding step of a request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogitsPayload {
    /// Unix ms; default now.
    pub ts_ms: Option<i64>,
    /// Canary or prompt id; becomes the `canary` label (default `pushed`).
    pub canary: Option<String>,
    /// Full first-step logits over the vocabulary.
    pub logits: Option<Vec<Option<f32>>>,
    /// Or: the top-k natural-log probabilities an API returned.
    pub top_logprobs: Option<Vec<f64>>,
    /// Vocabulary size, required with `top_logprobs`.
    pub vocab_size: Option<usize>,
}

/// Converts a logits payload into `tle_bits{canary}` (and the upper bound for top-k input).
pub fn logits_samples(payload: &LogitsPayload, now_ms: i64) -> Result<Vec<Sample>, IngestError> {
    let ts_ms = resolve_ts(payload.ts_ms, now_ms, "ts_ms")?;
    let canary = payload.canary.clone().unwrap_or_else(|| "pushed".to_owned());
    if canary.is_empty() || canary.len() > 128 {
        return Err(reject("canary", "must be 1 to 128 characters"));
    }
    let labels: BTreeMap<String, String> = [("canary".to_owned(), canary)].into();
    let sample =
        |signal: &str, value: f64| Sample { ts_ms, signal: signal.into(), labels: labels.clone(), value };
    match (&payload.logits, &payload.top_logprobs) {
        (Some(_), Some(_)) => Err(reject("logits", "give either logits or top_logprobs, not both")),
        (Some(logits), None) => {
            // JSON has no -inf: null marks a masked token.
            let values: Vec<f32> = logits.iter().map(|v| v.unwrap_or(f32::NEG_INFINITY)).collect();
            let h = first_token_entropy_bits(&values).map_err(|e| reject("logits", e.to_string()))?;
            Ok(vec![sample(catalogue::TLE_BITS.name, h)])
        }
        (None, Some(lp)) => {
            let vocab = payload.vocab_size.ok_or_else(|| {
                reject("vocab_size", "is required with top_logprobs (the model's vocabulary size)")
            })?;
            let r = first_token_entropy_from_top_logprobs(lp, vocab)
                .map_err(|e| reject("top_logprobs", e.to_string()))?;
            Ok(vec![
                sample(catalogue::TLE_BITS.name, r.entropy_bits),
                sample(catalogue::TLE_BITS_UPPER.name, r.upper_bits),
            ])
        }
        (None, None) => {
            Err(reject("logits", "give logits (full vocabulary) or top_logprobs with vocab_size"))
        }
    }
}

// ---------------------------------------------------------------- generic samples

/// `POST /v1/ingest/samples`: generic samples.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplesPayload {
    /// The samples.
    pub samples: Vec<PushedSample>,
}

/// One pushed sample.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushedSample {
    /// Unix ms; default now.
    pub ts_ms: Option<i64>,
    /// Signal name, `[a-z_][a-z0-9_]*`.
    pub signal: String,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Value; must be finite.
    pub value: f64,
}

/// Validates generic samples.
pub fn generic_samples(payload: &SamplesPayload, now_ms: i64) -> Result<Vec<Sample>, IngestError> {
    if payload.samples.is_empty() {
        return Err(reject("samples", "is empty"));
    }
    if payload.samples.len() > MAX_SAMPLES_PER_REQUEST {
        return Err(reject(
            "samples",
            format!("has {} entries; at most {MAX_SAMPLES_PER_REQUEST} per request", payload.samples.len()),
        ));
    }
    payload
        .samples
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let ts_ms = resolve_ts(s.ts_ms, now_ms, &format!("samples[{i}].ts_ms"))?;
            check_name(&format!("samples[{i}].signal"), &s.signal)?;
            if s.labels.len() > MAX_LABELS {
                return Err(reject(
                    format!("samples[{i}].labels"),
                    format!("has {} labels; at most {MAX_LABELS}", s.labels.len()),
                ));
            }
            for (k, v) in &s.labels {
                check_name(&format!("samples[{i}].labels"), k)?;
                check_label_value(&format!("samples[{i}].labels.{k}"), v)?;
            }
            if !s.value.is_finite() {
                return Err(reject(format!("samples[{i}].value"), "must be a finite number"));
            }
            // Pushers written before a rename keep working under the current name.
            let signal = catalogue::current_name(&s.signal).to_owned();
            Ok(Sample { ts_ms, signal, labels: s.labels.clone(), value: s.value })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_793_613_600_000;

    fn kv(json: &str) -> Result<Vec<Sample>, IngestError> {
        kvcache_samples(&serde_json::from_str(json).unwrap(), NOW)
    }

    #[test]
    fn kvcache_bitmap_gives_usage_and_kvf() {
        // 16 blocks: used 0,1 and 8; free runs 2..8 (6) and 9..16 (7)
        let bitmap = base64::engine::general_purpose::STANDARD.encode([0b0000_0011u8, 0b0000_0001]);
        let s = kv(&format!(
            r#"{{"gpu": "0", "layers": [{{"layer": 3, "bitmap_b64": "{bitmap}", "num_blocks": 16}}]}}"#
        ))
        .unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].signal, "kvcache_usage_ratio");
        assert!((s[0].value - 3.0 / 16.0).abs() < 1e-12);
        assert_eq!(s[1].signal, "kv_fragmentation");
        assert!((s[1].value - 13.0 / 7.0).abs() < 1e-12);
        assert_eq!(s[1].labels["layer"], "3");
        assert_eq!(s[1].labels["gpu"], "0");
        assert_eq!(s[0].ts_ms, NOW);
    }

    #[test]
    fn kvcache_errors_name_the_field() {
        let e = kv(r#"{"layers": [{"layer": 1, "total_blocks": 10, "used_blocks": 11}]}"#).unwrap_err();
        assert_eq!(e.field, "layers[0].used_blocks");
        let e = kv(r#"{"layers": [{"layer": 1, "bitmap_b64": "!!", "num_blocks": 8}]}"#).unwrap_err();
        assert_eq!(e.field, "layers[0].bitmap_b64");
        let e = kv(r#"{"layers": [{"layer": 1, "bitmap_b64": "AA==", "num_blocks": 9}]}"#).unwrap_err();
        assert!(e.reason.contains("needs 2"), "{e}");
        let e = kv(r#"{"layers": []}"#).unwrap_err();
        assert_eq!(e.field, "layers");
        let e = kv(r#"{"ts_ms": 1793613600, "layers": [{"layer": 1, "total_blocks": 4, "used_blocks": 1}]}"#)
            .unwrap_err();
        assert!(e.reason.contains("seconds"), "{e}");
        let e = kv(r#"{"layers": [{"layer": 1, "total_blocks": 4, "used_blocks": 1}, {"layer": 1, "total_blocks": 4, "used_blocks": 1}]}"#).unwrap_err();
        assert!(e.reason.contains("twice"));
    }

    #[test]
    fn kvcache_groups_as_the_vllm_plugin_sends_them() {
        // 16 blocks, blocks 0, 1 and 8 in use: "AwE=" = 0b00000011, 0b00000001.
        let s = kv(r#"{"labels": {"server": "vllm", "model": "smollm2", "engine": "0"},
            "groups": [{"group": 0, "attention": "full_attention", "num_blocks": 16, "bitmap_b64": "AwE=",
                        "free_blocks": 13, "cached_blocks": 4}],
            "requests_running": 2, "requests_waiting": 1}"#)
        .unwrap();
        let get =
            |signal: &str| s.iter().find(|x| x.signal == signal).unwrap_or_else(|| panic!("{signal}: {s:?}"));
        let usage = get("kvcache_usage_ratio");
        assert_eq!(usage.value, 3.0 / 16.0);
        let want: BTreeMap<String, String> = [
            ("attention", "full_attention"),
            ("engine", "0"),
            ("kv_group", "0"),
            ("model", "smollm2"),
            ("server", "vllm"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(usage.labels, want);
        assert!(get("kv_fragmentation").value >= 1.0);
        assert_eq!(get("server_kvcache_capacity_blocks").value, 16.0);
        assert_eq!(get("server_kvcache_used_blocks").value, 3.0);
        assert_eq!(get("server_kvcache_cached_blocks").value, 4.0);
        let running = get("server_requests_running");
        assert_eq!(running.value, 2.0);
        assert!(!running.labels.contains_key("kv_group"));
        assert_eq!(get("server_requests_waiting").value, 1.0);
    }

    #[test]
    fn kvcache_groups_that_contradict_themselves_are_rejected() {
        let group = |extra: &str| {
            format!(r#"{{"groups": [{{"group": 0, "num_blocks": 16, "bitmap_b64": "AwE="{extra}}}]}}"#)
        };
        let e = kv(&group(r#", "free_blocks": 12"#)).unwrap_err();
        assert_eq!(e.field, "groups[0].free_blocks");
        assert!(e.reason.contains("13 free of 16"), "{e}");
        let e = kv(&group(r#", "cached_blocks": 14"#)).unwrap_err();
        assert_eq!(e.field, "groups[0].cached_blocks");
        // A bitmap longer than the pool it claims.
        let e = kv(r#"{"groups": [{"group": 0, "num_blocks": 8, "bitmap_b64": "AwE="}]}"#).unwrap_err();
        assert_eq!(e.field, "groups[0].bitmap_b64");
        assert!(e.reason.contains("needs 1"), "{e}");
        let e = kv(r#"{"groups": [{"group": 0, "total_blocks": 4, "used_blocks": 1}, {"group": 0, "total_blocks": 4, "used_blocks": 1}]}"#).unwrap_err();
        assert_eq!(e.field, "groups[1].group");
        let e =
            kv(r#"{"labels": {"Bad": "x"}, "groups": [{"group": 0, "total_blocks": 4, "used_blocks": 1}]}"#)
                .unwrap_err();
        assert_eq!(e.field, "labels");
        let e = kv(
            r#"{"labels": {"layer": "x"}, "groups": [{"group": 0, "total_blocks": 4, "used_blocks": 1}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.field, "labels.layer");
        let e = kv(r#"{"requests_running": 3}"#).unwrap_err();
        assert_eq!(e.field, "layers");
    }

    #[test]
    fn kvcache_extents_and_usage_only() {
        let s = kv(r#"{"layers": [{"layer": 0, "total_blocks": 100, "free_extents": [10, 30]}, {"layer": 1, "total_blocks": 8, "used_blocks": 2}]}"#).unwrap();
        assert_eq!(s.len(), 3);
        assert!((s[0].value - 0.6).abs() < 1e-12);
        assert!((s[1].value - 40.0 / 30.0).abs() < 1e-12);
        assert!((s[2].value - 0.25).abs() < 1e-12);
    }

    #[test]
    fn logits_full_and_topk() {
        let p: LogitsPayload =
            serde_json::from_str(r#"{"canary": "c1", "logits": [0.0, 0.0, null, 0.0, 0.0]}"#).unwrap();
        let s = logits_samples(&p, NOW).unwrap();
        assert!((s[0].value - 2.0).abs() < 1e-6);
        assert_eq!(s[0].labels["canary"], "c1");
        let p: LogitsPayload =
            serde_json::from_str(r#"{"top_logprobs": [-0.1, -3.0], "vocab_size": 32000}"#).unwrap();
        let s = logits_samples(&p, NOW).unwrap();
        assert_eq!(s.len(), 2);
        assert!(s[0].value <= s[1].value);
        let p: LogitsPayload = serde_json::from_str(r#"{"top_logprobs": [-0.1]}"#).unwrap();
        assert_eq!(logits_samples(&p, NOW).unwrap_err().field, "vocab_size");
        let p: LogitsPayload = serde_json::from_str(r#"{"logits": []}"#).unwrap();
        assert_eq!(logits_samples(&p, NOW).unwrap_err().field, "logits");
    }

    #[test]
    fn generic_samples_are_validated() {
        let p: SamplesPayload = serde_json::from_str(
            r#"{"samples": [{"signal": "queue_depth", "labels": {"pool": "a"}, "value": 3}]}"#,
        )
        .unwrap();
        assert_eq!(generic_samples(&p, NOW).unwrap()[0].value, 3.0);
        let p: SamplesPayload =
            serde_json::from_str(r#"{"samples": [{"signal": "Queue-Depth", "value": 3}]}"#).unwrap();
        assert_eq!(generic_samples(&p, NOW).unwrap_err().field, "samples[0].signal");
        let p: SamplesPayload = serde_json::from_str(r#"{"samples": []}"#).unwrap();
        assert!(generic_samples(&p, NOW).is_err());
        // A pusher still using a renamed signal's old name.
        let p: SamplesPayload =
            serde_json::from_str(r#"{"samples": [{"signal": "kvf_ratio", "value": 1.5}]}"#).unwrap();
        assert_eq!(generic_samples(&p, NOW).unwrap()[0].signal, "kv_fragmentation");
    }
}
