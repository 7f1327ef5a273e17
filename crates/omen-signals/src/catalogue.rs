//! The signal catalogue: every signal omen stores or exports, defined once — its name,
//! help text, unit, OTLP name, whether omen derives it from other signals, and which SLO
//! indicator reads it. The sources name their samples from here, the pipeline and the
//! simulator read the indicators from here, and the Prometheus and OTLP exporters take help
//! and units from here; docs/signals.md's table lists the same entries (a test checks it).
//!
//! Signals that a user pushes under names of their own (`/v1/ingest/samples`) are not in
//! the catalogue; they are exported with a generic help text and a unit from their suffix.

/// One signal of the catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signal {
    /// Stored and exported name (Prometheus adds the `omen_` prefix).
    pub name: &'static str,
    /// Help text of the exported metric.
    pub help: &'static str,
    /// UCUM unit ("1" for ratios, "" when dimensionless without being a ratio).
    pub unit: &'static str,
    /// OTLP instrument name.
    pub otlp_name: &'static str,
    /// Computed by omen from other signals (scores, forecasts): never scored again nor fed
    /// to the models.
    pub derived: bool,
    /// The SLO indicator (config `forecast.slos[].indicator`) that reads this signal.
    pub indicator: Option<&'static str>,
    /// How it is exported.
    pub kind: Kind,
}

/// How a signal is exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The latest value of each series.
    Gauge,
    /// Observations in buckets (the canary latencies).
    Histogram,
}

impl Signal {
    /// The unit for exporters that leave a dimensionless unit out.
    pub fn unit(&self) -> Option<&'static str> {
        (!self.unit.is_empty()).then_some(self.unit)
    }
}

macro_rules! signals {
    ($($(#[$doc:meta])* $id:ident = $name:literal, $unit:literal, $otlp:literal, $derived:literal, $indicator:expr, $help:literal $(, $kind:ident)?;)*) => {
        $( $(#[$doc])* pub const $id: Signal = Signal {
            name: $name, help: $help, unit: $unit, otlp_name: $otlp, derived: $derived, indicator: $indicator,
            kind: signals!(@kind $($kind)?),
        }; )*
        /// Every signal of the catalogue, in the order of docs/signals.md's table.
        pub const ALL: &[Signal] = &[$($id),*];
    };
    (@kind) => { Kind::Gauge };
    (@kind $kind:ident) => { Kind::$kind };
}

signals! {
    /// First-token entropy (TLE), lower bound from top-k logprobs.
    TLE_BITS = "tle_bits", "bit", "omen.tle_bits", false, None,
        "First-token entropy of a canary prompt, bits (lower bound from top-k logprobs)";
    /// Upper bound of the first-token entropy.
    TLE_BITS_UPPER = "tle_bits_upper", "bit", "omen.tle_bits_upper", false, None,
        "Upper bound of the first-token entropy from top-k logprobs, bits";
    /// Consistency decay index (RCI).
    RCI = "rci", "1", "omen.rci", false, Some("rci"),
        "Consistency decay index of a canary answer, [0,1], higher is worse";
    /// The BLEU part of RCI.
    RCI_BLEU = "rci_bleu", "1", "omen.rci_bleu", false, None,
        "Sentence BLEU of a canary answer against its reference, [0,1]";
    /// The BERTScore part of RCI.
    RCI_BERTSCORE_F1 = "rci_bertscore_f1", "1", "omen.rci_bertscore_f1", false, None,
        "BERTScore F1 of a canary answer against its reference, [0,1]";
    /// The repetition part of RCI.
    RCI_REPETITION_RATIO = "rci_repetition_ratio", "1", "omen.rci_repetition_ratio", false, None,
        "1 - distinct/total 3-grams of a canary answer";
    /// Canary time to first token.
    CANARY_TTFT_SECONDS = "canary_ttft_seconds", "s", "omen.canary_ttft_seconds", false, Some("ttft_p99"),
        "Time to first token of a canary request, seconds";
    /// Canary time per output token after the first.
    CANARY_TPOT_SECONDS = "canary_tpot_seconds", "s", "omen.canary_tpot_seconds", false, None,
        "Time per output token after the first of a canary request, seconds";
    /// Canary end-to-end latency.
    CANARY_E2E_SECONDS = "canary_e2e_seconds", "s", "omen.canary_e2e_seconds", false, None,
        "End-to-end latency of a canary request, seconds";
    /// Canary time to first token, as a histogram.
    TTFT_SECONDS = "ttft_seconds", "s", "gen_ai.client.inference.time_to_first_chunk", false, None,
        "Canary time to first token, seconds", Histogram;
    /// Canary time per output token after the first, as a histogram.
    TPOT_SECONDS = "tpot_seconds", "s", "gen_ai.client.inference.time_per_output_chunk", false, None,
        "Canary time per output token, seconds", Histogram;
    /// Canary end-to-end latency, as a histogram.
    E2E_SECONDS = "e2e_seconds", "s", "gen_ai.client.inference.duration", false, None,
        "Canary end-to-end latency, seconds", Histogram;
    /// The highest prompt-perturbation strength a canary's answer withstands (`omen stress`).
    CANARY_STABILITY_BOUNDARY = "canary_stability_boundary", "1", "omen.canary_stability_boundary", false, None,
        "Highest prompt-perturbation strength in [0,1] at which a canary's answer stays within the stress bounds (omen stress)";
    /// Tokens of a canary answer.
    CANARY_TOKENS = "canary_tokens", "", "omen.canary_tokens", false, None,
        "Output tokens of a canary answer";
    /// KV-cache fragmentation (KVF): a factor >= 1, not a ratio, so it has no unit.
    KV_FRAGMENTATION = "kv_fragmentation", "", "omen.kv_fragmentation", false, Some("kvf"),
        "KV-cache fragmentation (KVF): total free / largest free extent, >= 1 (1 = all free space contiguous)";
    /// KV-cache usage.
    KVCACHE_USAGE_RATIO = "kvcache_usage_ratio", "1", "omen.kvcache_usage_ratio", false, Some("kv_usage"),
        "KV-cache blocks in use / total, per layer";
    /// GPU memory in use.
    GPU_MEMORY_USED_BYTES = "gpu_memory_used_bytes", "By", "hw.gpu.memory.usage", false, None,
        "GPU memory in use, bytes (NVML)";
    /// GPU memory in total.
    GPU_MEMORY_TOTAL_BYTES = "gpu_memory_total_bytes", "By", "hw.gpu.memory.limit", false, None,
        "GPU memory in total, bytes (NVML)";
    /// GPU memory headroom, derived from used and total by the pipeline.
    GPU_MEMORY_HEADROOM_RATIO = "gpu_memory_headroom_ratio", "1", "omen.gpu_memory_headroom_ratio", false,
        Some("vram_headroom"), "1 - used/total GPU memory";
    /// Bytes in use in a CUDA memory arena (Nsight Systems export).
    ARENA_USED_BYTES = "arena_used_bytes", "By", "omen.arena_used_bytes", false, None,
        "Bytes allocated in a CUDA memory arena, from an Nsight Systems export";
    /// GPU memory of one process.
    GPU_PROCESS_MEMORY_BYTES = "gpu_process_memory_bytes", "By", "omen.gpu_process_memory_bytes", false, None,
        "GPU memory used by one process, bytes (NVML)";
    /// Anomaly score of one series from the configured detector.
    ANOMALY_SCORE = "anomaly_score", "", "omen.anomaly_score", true, None,
        "Anomaly score of a signal from signals.detector: novelty_surprise in [0,1] (default), or the window score |x-mean|/(std+1e-8) + 0.3|skew|";
    /// Debounced risk of one series while a change holds.
    ANOMALY_RISK = "anomaly_risk", "", "omen.anomaly_risk", true, None,
        "Risk in (0,1] of a signal whose change has held for signals.persistence samples (not the weekly cycle); present only while it holds";
    /// A lasting level shift of one series, stored at its onset.
    LEVEL_SHIFT = "level_shift", "", "omen.level_shift", true, None,
        "A change that held for signals.latch (not the weekly cycle): new mean minus old mean in old standard deviations, stored at the change's onset";
    /// LSTM autoencoder score.
    LSTM_AE_SCORE = "lstm_ae_score", "", "omen.lstm_ae_score", true, None,
        "LSTM autoencoder anomaly score, [0,1]";
    /// The combined health score.
    HEALTH_SCORE = "health_score", "", "omen.health_score", true, None,
        "Combined degradation score, [0,1]: 0 healthy, >= 0.6 warning, >= 0.8 critical";
    /// Time until an SLO breach, seconds (the base unit; /scores/latest says days_to_breach).
    FORECAST_TIME_TO_BREACH = "forecast_time_to_breach_seconds", "s", "omen.forecast_time_to_breach", true, None,
        "Seconds until the SLO indicator's trend crosses its threshold (divide by 86400 for days)";
    /// Far end of the time-to-breach interval, seconds.
    FORECAST_TIME_TO_BREACH_UPPER = "forecast_time_to_breach_upper_seconds", "s",
        "omen.forecast_time_to_breach_upper", true, None,
        "Far end of the time-to-breach interval, seconds";
    /// Whether an SLO's early warning stands (the agent's warning rule), 1 or 0.
    FORECAST_EARLY_WARNING = "forecast_early_warning", "", "omen.forecast_early_warning", true, None,
        "1 while the SLO's early warning stands (breach forecast within forecast.horizon_days by the agent's rule, kept forecast.keep_warning_days after it last warned), else 0";
    /// Whether a source's last collection succeeded.
    SOURCE_UP = "source_up", "", "omen.source_up", false, None,
        "1 when the source's last collection succeeded, else 0";
    /// Build information.
    BUILD_INFO = "build_info", "", "omen.build_info", false, None, "omen build information";
    /// Requests waiting in the server's queue (scraped).
    SERVER_REQUESTS_WAITING = "server_requests_waiting", "", "omen.server_requests_waiting", false, None,
        "Requests waiting in the inference server's queue (scraped)";
    /// Requests the server is running (scraped).
    SERVER_REQUESTS_RUNNING = "server_requests_running", "", "omen.server_requests_running", false, None,
        "Requests the inference server is running (scraped)";
    /// Preemptions per second (scraped counter rate).
    SERVER_PREEMPTIONS_PER_SECOND = "server_preemptions_per_second", "", "omen.server_preemptions_per_second",
        false, None,
        "Requests preempted (vLLM) or retracted (SGLang) per second over the last scrape interval, from the server's counter";
    /// Aborted requests per second (scraped counter rate).
    SERVER_ABORTED_REQUESTS_PER_SECOND = "server_aborted_requests_per_second", "",
        "omen.server_aborted_requests_per_second", false, None,
        "Requests the inference server aborted per second over the last scrape interval, from its counter";
    /// Corrupted requests per second (vLLM: NaN in the logits).
    SERVER_CORRUPTED_REQUESTS_PER_SECOND = "server_corrupted_requests_per_second", "",
        "omen.server_corrupted_requests_per_second", false, None,
        "Requests vLLM flagged as corrupted (NaN logits) per second over the last scrape interval, from its counter";
    /// Server-side TTFT p99 over the scrape interval.
    SERVER_TTFT_P99_SECONDS = "server_ttft_p99_seconds", "s", "omen.server_ttft_p99_seconds", false, None,
        "P99 time to first token over the last scrape interval, from the server's histogram, seconds";
    /// Server-side inter-token latency p99 over the scrape interval.
    SERVER_ITL_P99_SECONDS = "server_itl_p99_seconds", "s", "omen.server_itl_p99_seconds", false, None,
        "P99 inter-token latency over the last scrape interval, from the server's histogram, seconds";
    /// Server-side end-to-end latency p99 over the scrape interval.
    SERVER_E2E_P99_SECONDS = "server_e2e_p99_seconds", "s", "omen.server_e2e_p99_seconds", false, None,
        "P99 end-to-end request latency over the last scrape interval, from the server's histogram, seconds";
    /// Server-side queueing time p99 over the scrape interval.
    SERVER_QUEUE_P99_SECONDS = "server_queue_p99_seconds", "s", "omen.server_queue_p99_seconds", false, None,
        "P99 queueing time over the last scrape interval, from the server's histogram, seconds";
    /// Server-side prefill time p99 over the scrape interval.
    SERVER_PREFILL_P99_SECONDS = "server_prefill_p99_seconds", "s", "omen.server_prefill_p99_seconds", false, None,
        "P99 prefill time of a request over the last scrape interval, from the server's histogram, seconds";
    /// Server-side decode time p99 over the scrape interval.
    SERVER_DECODE_P99_SECONDS = "server_decode_p99_seconds", "s", "omen.server_decode_p99_seconds", false, None,
        "P99 decode time of a request (first to last token) over the last scrape interval, from the server's histogram, seconds";
    /// Server-side inference time (prefill + decode) p99 over the scrape interval.
    SERVER_INFERENCE_P99_SECONDS = "server_inference_p99_seconds", "s", "omen.server_inference_p99_seconds",
        false, None,
        "P99 time a request spent running (prefill + decode, no queueing) over the last scrape interval, from the server's histogram, seconds";
    /// p99 across requests of each request's mean time per output token (TGI).
    SERVER_REQUEST_MEAN_TPOT_P99_SECONDS = "server_request_mean_tpot_p99_seconds", "s",
        "omen.server_request_mean_tpot_p99_seconds", false, None,
        "P99 across the last scrape interval's requests of each request's mean time per output token (a per-request mean, not inter-token latency), seconds";
    /// Prefix-cache hit ratio (scraped).
    SERVER_PREFIX_CACHE_HIT_RATIO = "server_prefix_cache_hit_ratio", "1", "omen.server_prefix_cache_hit_ratio",
        false, None, "Prefix-cache hits / queries of the inference server (scraped)";
    /// Prompt tokens per second (scraped).
    SERVER_PROMPT_TOKENS_PER_SECOND = "server_prompt_tokens_per_second", "", "omen.server_prompt_tokens_per_second",
        false, None, "Prompt tokens processed per second by the inference server (scraped)";
    /// Generated tokens per second (scraped).
    SERVER_GENERATION_TOKENS_PER_SECOND = "server_generation_tokens_per_second", "",
        "omen.server_generation_tokens_per_second", false, None,
        "Tokens generated per second by the inference server (scraped)";
    /// Tokens in the server's KV cache (scraped).
    SERVER_KVCACHE_TOKENS = "server_kvcache_tokens", "", "omen.server_kvcache_tokens", false, None,
        "Tokens in the inference server's KV cache (scraped)";
    /// KV-cache capacity in tokens (scraped or read from the server's slots).
    SERVER_KVCACHE_CAPACITY_TOKENS = "server_kvcache_capacity_tokens", "", "omen.server_kvcache_capacity_tokens",
        false, None, "Tokens the inference server's KV cache can hold";
    /// KV-cache capacity in blocks (scraped; block-based servers).
    SERVER_KVCACHE_CAPACITY_BLOCKS = "server_kvcache_capacity_blocks", "", "omen.server_kvcache_capacity_blocks",
        false, None, "Blocks in the inference server's KV block pool (vLLM, TensorRT-LLM)";
    /// Tokens per KV block (scraped; block-based servers).
    SERVER_KVCACHE_BLOCK_SIZE_TOKENS = "server_kvcache_block_size_tokens", "",
        "omen.server_kvcache_block_size_tokens", false, None,
        "Tokens one block of the inference server's KV block pool holds (vLLM, TensorRT-LLM)";
    /// Free KV blocks that still hold a cached prefix (pushed by the vLLM plugin).
    SERVER_KVCACHE_CACHED_BLOCKS = "server_kvcache_cached_blocks", "", "omen.server_kvcache_cached_blocks", false,
        None, "Free blocks of the inference server's KV block pool that still hold a cached prefix (pushed)";
    /// KV blocks in use (scraped; block-based servers).
    SERVER_KVCACHE_USED_BLOCKS = "server_kvcache_used_blocks", "", "omen.server_kvcache_used_blocks", false, None,
        "Blocks of the inference server's KV block pool in use (pushed, or scraped from TensorRT-LLM)";
    /// Busy slots per decode step (llama.cpp, scraped).
    SERVER_BUSY_SLOTS_PER_DECODE = "server_busy_slots_per_decode", "", "omen.server_busy_slots_per_decode", false,
        None, "Busy slots per decode step of llama.cpp's server (scraped)";
}

/// Signals renamed since a release, (old name, current name): pushes, traces, queries and
/// stores that use an old name are read as the current one (the CHANGELOG lists each).
pub const RENAMED: &[(&str, &str)] = &[("kvf_ratio", KV_FRAGMENTATION.name)];

/// The current name of a signal: `name` itself unless it is an old name in [`RENAMED`].
pub fn current_name(name: &str) -> &str {
    RENAMED.iter().find(|(old, _)| *old == name).map_or(name, |(_, new)| new)
}

/// The catalogue entry named `name`, if omen defines it.
pub fn find(name: &str) -> Option<&'static Signal> {
    ALL.iter().find(|s| s.name == name)
}

/// The names of the signals omen derives itself (a test checks them against [`ALL`]); a
/// short list, since the pipeline asks for every sample.
pub const DERIVED: [&str; 8] = [
    ANOMALY_SCORE.name,
    ANOMALY_RISK.name,
    LEVEL_SHIFT.name,
    LSTM_AE_SCORE.name,
    HEALTH_SCORE.name,
    FORECAST_TIME_TO_BREACH.name,
    FORECAST_TIME_TO_BREACH_UPPER.name,
    FORECAST_EARLY_WARNING.name,
];

/// Whether `name` is a signal omen derives itself (not scored again, not a model input).
pub fn is_derived(name: &str) -> bool {
    DERIVED.contains(&name)
}

/// [`GPU_MEMORY_HEADROOM_RATIO`] of one GPU from its used and total bytes: 1 - used/total
/// in [0, 1]; `None` without a positive total.
pub fn gpu_memory_headroom(used_bytes: f64, total_bytes: f64) -> Option<f64> {
    (total_bytes > 0.0).then(|| (1.0 - used_bytes / total_bytes).clamp(0.0, 1.0))
}

/// The signal that the SLO indicator `indicator` (its config spelling) reads.
pub fn indicator_signal(indicator: &str) -> Option<&'static Signal> {
    ALL.iter().find(|s| s.indicator == Some(indicator))
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_old_name_reads_as_the_current_one_and_others_are_kept() {
        assert_eq!(current_name("kvf_ratio"), "kv_fragmentation");
        assert_eq!(current_name("kv_fragmentation"), "kv_fragmentation");
        assert_eq!(current_name("my_own_signal"), "my_own_signal");
        for (old, new) in RENAMED {
            assert!(find(old).is_none() && find(new).is_some(), "{old} -> {new}");
        }
    }
    use super::*;

    #[test]
    fn names_and_otlp_names_are_unique_and_well_formed() {
        for (i, a) in ALL.iter().enumerate() {
            assert!(
                a.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{a:?}"
            );
            assert!(!a.help.is_empty(), "{} has no help", a.name);
            for b in &ALL[i + 1..] {
                assert_ne!(a.name, b.name);
                assert_ne!(a.otlp_name, b.otlp_name);
            }
        }
    }

    #[test]
    fn every_indicator_reads_one_signal() {
        for indicator in ["ttft_p99", "kv_usage", "kvf", "vram_headroom", "rci"] {
            assert_eq!(ALL.iter().filter(|s| s.indicator == Some(indicator)).count(), 1, "{indicator}");
        }
        assert_eq!(indicator_signal("kvf"), Some(&KV_FRAGMENTATION));
    }

    #[test]
    fn derived_signals_are_the_scores_and_forecasts() {
        let derived: Vec<&str> = ALL.iter().filter(|s| s.derived).map(|s| s.name).collect();
        assert_eq!(derived, DERIVED);
        assert!(is_derived("health_score") && !is_derived("kv_fragmentation") && !is_derived("queue_depth"));
    }
}
