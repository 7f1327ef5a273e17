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
    assert_eq!(one(&first, "server_preemptions_total"), 3.0);
    // No previous scrape: no interval p99 and no interval hit ratio yet.
    assert!(find(&first, "server_ttft_p99_seconds").is_empty());
    assert!(find(&first, "server_prefix_cache_hit_ratio").is_empty());
    // The HELP/TYPE-only family is skipped with a warning, not a failure.
    assert!(sc.warnings().iter().any(|w| w.contains("vllm:request_success_total")), "{:?}", sc.warnings());

    // 10 new requests, all slow (0.5..0.75 s); 400 of 1000 newly queried tokens hit the cache.
    let second = sc.ingest(&vllm_page(1000, 10, 2900, 11_000), TS + 15_000).expect("parses");
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
    let page = |ttft_slow: u64| {
        format!(
            r#"# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{model_name="Qwen/Qwen2.5-7B-Instruct"}} 12.0
# HELP sglang:num_used_tokens The number of used tokens.
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{{model_name="Qwen/Qwen2.5-7B-Instruct"}} 48213.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{model_name="Qwen/Qwen2.5-7B-Instruct"}} 0.62
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{{model_name="Qwen/Qwen2.5-7B-Instruct"}} 1432.5
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{model_name="Qwen/Qwen2.5-7B-Instruct"}} 3.0
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{{model_name="Qwen/Qwen2.5-7B-Instruct"}} 0.31
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{model_name="Qwen/Qwen2.5-7B-Instruct"}} 8.812e+06
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
    let first = sc.ingest(&page(0), TS).expect("parses");
    assert_eq!(sc.server(), Some(ServerKind::Sglang));
    let l = labels(&[("model", "Qwen/Qwen2.5-7B-Instruct"), ("server", "sglang")]);
    assert!(first.iter().all(|s| s.labels == l), "{first:#?}");
    assert_eq!(one(&first, "kvcache_usage_ratio"), 0.62);
    assert_eq!(one(&first, "server_requests_running"), 12.0);
    assert_eq!(one(&first, "server_requests_waiting"), 3.0);
    assert_eq!(one(&first, "server_prefix_cache_hit_ratio"), 0.31);
    assert_eq!(one(&first, "server_generation_tokens_per_second"), 1432.5);
    let second = sc.ingest(&page(4), TS + 1000).expect("parses");
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
}

#[test]
fn llamacpp_page() {
    let page = r#"# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1024
# HELP llamacpp:prompt_seconds_total Prompt process time
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 1.25
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 640
# HELP llamacpp:tokens_predicted_seconds_total Predict process time
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 4.27
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 819.2
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 149.88
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.125
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
"#;
    let mut sc = scraper();
    let s = sc.ingest(page, TS).expect("parses");
    assert_eq!(sc.server(), Some(ServerKind::LlamaCpp));
    assert_eq!(one(&s, "server_requests_running"), 1.0);
    assert_eq!(one(&s, "server_requests_waiting"), 0.0);
    assert_eq!(one(&s, "server_prompt_tokens_per_second"), 819.2);
    assert_eq!(one(&s, "server_generation_tokens_per_second"), 149.88);
    assert_eq!(one(&s, "kvcache_usage_ratio"), 0.125);
    assert!(s.iter().all(|x| x.labels == labels(&[("server", "llamacpp")])));
    // Windows line endings (some proxies) read the same.
    let crlf = page.replace('\n', "\r\n");
    assert_eq!(sc.ingest(&crlf, TS).expect("parses"), s);
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
