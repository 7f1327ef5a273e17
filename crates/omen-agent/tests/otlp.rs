//! OTLP export end to end: the exporter pushes to a real OTLP/gRPC receiver (a
//! tonic `MetricsService` server started here on loopback).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use omen_agent::config::OtlpConfig;
use omen_agent::metrics::LiveMetrics;
use omen_agent::otlp::{self, GenAiClient, OtlpError};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point, Metric};

/// Keeps every export request it receives.
#[derive(Clone, Default)]
struct Receiver {
    requests: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
}

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.requests.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse { partial_success: None }))
    }
}

impl Receiver {
    /// The most recent exported instance of the metric `name` (cumulative: it holds everything so far).
    fn latest(&self, name: &str) -> Option<Metric> {
        let requests = self.requests.lock().unwrap();
        requests
            .iter()
            .rev()
            .flat_map(|r| &r.resource_metrics)
            .flat_map(|rm| &rm.scope_metrics)
            .flat_map(|sm| &sm.metrics)
            .find(|m| m.name == name)
            .cloned()
    }

    fn resource_attribute(&self, key: &str) -> Option<String> {
        let requests = self.requests.lock().unwrap();
        let rm = requests.iter().flat_map(|r| &r.resource_metrics).next()?;
        string_attr(&rm.resource.as_ref()?.attributes, key)
    }
}

fn string_attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        _ => None,
    })
}

/// Gauge points of a metric as (attributes, value).
fn gauge_points(m: &Metric) -> Vec<(Vec<KeyValue>, f64)> {
    let Some(metric::Data::Gauge(g)) = &m.data else { panic!("{} is not a gauge: {:?}", m.name, m.data) };
    g.data_points
        .iter()
        .map(|p| {
            let v = match p.value {
                Some(number_data_point::Value::AsDouble(v)) => v,
                Some(number_data_point::Value::AsInt(v)) => v as f64,
                None => f64::NAN,
            };
            (p.attributes.clone(), v)
        })
        .collect()
}

/// Starts the receiver on 127.0.0.1:0; returns its endpoint and a stop handle.
async fn start_receiver(receiver: Receiver) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(MetricsServiceServer::new(receiver))
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stop_rx.await;
            })
            .await
            .unwrap();
    });
    (format!("http://{addr}"), stop_tx)
}

fn otlp_config(endpoint: String, interval: Duration) -> OtlpConfig {
    OtlpConfig { endpoint, interval, gen_ai_provider_name: "openai".into() }
}

fn int_attr(attrs: &[KeyValue], key: &str) -> Option<i64> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
        any_value::Value::IntValue(v) => Some(*v),
        _ => None,
    })
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_gauges_and_latency_histograms_to_a_real_receiver() {
    let receiver = Receiver::default();
    let (endpoint, stop_receiver) = start_receiver(receiver.clone()).await;

    let live = Arc::new(LiveMetrics::new());
    live.set_gauge("kv_fragmentation", labels(&[("gpu", "0"), ("layer", "3")]), 1.9);
    live.set_gauge("kvcache_usage_ratio", labels(&[("gpu", "0"), ("layer", "3")]), 0.5);
    live.set_gauge("health_score", vec![], 0.25);
    live.set_gauge("gpu_memory_used_bytes", labels(&[("gpu", "0")]), 4.0e9);

    let cfg = otlp_config(endpoint.clone(), Duration::from_millis(200));
    // The attributes of a canary source probing a vLLM on 127.0.0.1:8000 with one chat canary.
    let canary: omen_sources::CanarySourceConfig = serde_yaml::from_str(
        "target: {base_url: 'http://127.0.0.1:8000/v1', model: smollm2}\nprompts: [{id: c1, prompt: hi}]\n",
    )
    .unwrap();
    let client = GenAiClient::new("openai", Some(&canary));
    let exporter = otlp::start(&cfg, live.clone(), client).unwrap();

    // Observations after start go through the latency tap; a gauge set after start is discovered.
    let c1 = labels(&[("canary", "c1")]);
    live.record_latency("ttft_seconds", c1.clone(), 0.04);
    live.record_latency("ttft_seconds", c1.clone(), 0.06);
    live.record_latency("tpot_seconds", c1.clone(), 0.01);
    live.record_latency("e2e_seconds", c1.clone(), 0.5);
    live.record_output_tokens(c1.clone(), 12.0);
    live.set_gauge("forecast_time_to_breach_seconds", labels(&[("slo", "ttft_p99")]), 9.5 * 86_400.0);

    let ready = |r: &Receiver| {
        let ttft_done =
            r.latest("gen_ai.client.inference.time_to_first_chunk").is_some_and(|m| match &m.data {
                Some(metric::Data::Histogram(h)) => h.data_points.iter().any(|p| p.count == 2),
                _ => false,
            });
        ttft_done && r.latest("omen.forecast_time_to_breach").is_some()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    // The receiver stores a request before the exporter sees the reply, so wait for both.
    while !ready(&receiver) || exporter.stats().exports == 0 {
        assert!(
            Instant::now() < deadline,
            "no complete export within 10 s; {} requests, stats {:?}",
            receiver.requests.lock().unwrap().len(),
            exporter.stats()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    assert_eq!(receiver.resource_attribute("service.name").as_deref(), Some("omen"));
    assert_eq!(receiver.resource_attribute("service.version").as_deref(), Some(env!("CARGO_PKG_VERSION")));

    let kvf = receiver.latest("omen.kv_fragmentation").expect("omen.kv_fragmentation exported");
    let points = gauge_points(&kvf);
    assert!(
        points.iter().any(|(a, v)| string_attr(a, "layer").as_deref() == Some("3")
            && string_attr(a, "gpu").as_deref() == Some("0")
            && (*v - 1.9).abs() < 1e-12),
        "{points:?}"
    );
    assert_eq!(kvf.unit, "", "a factor >= 1 is dimensionless without being a ratio");

    let usage = receiver.latest("omen.kvcache_usage_ratio").expect("KV usage exported");
    assert!(gauge_points(&usage)
        .iter()
        .any(|(a, v)| string_attr(a, "layer").as_deref() == Some("3") && *v == 0.5));

    let health = receiver.latest("omen.health_score").expect("omen.health_score exported");
    assert_eq!(gauge_points(&health), vec![(vec![], 0.25)]);
    assert!(receiver.latest("omen.build_info").is_some());
    // GPU memory by the hardware conventions: an int up-down counter in bytes, the GPU as hw.id.
    let gpu = receiver.latest("hw.gpu.memory.usage").expect("hw.gpu.memory.usage exported");
    assert_eq!(gpu.unit, "By");
    let Some(metric::Data::Sum(sum)) = &gpu.data else { panic!("hw.gpu.memory.usage is not a sum: {gpu:?}") };
    assert!(!sum.is_monotonic, "an up-down counter");
    let point = &sum.data_points[0];
    assert_eq!(point.value, Some(number_data_point::Value::AsInt(4_000_000_000)));
    assert_eq!(string_attr(&point.attributes, "hw.id").as_deref(), Some("0"));
    let to_breach = receiver.latest("omen.forecast_time_to_breach").unwrap();
    assert_eq!(to_breach.unit, "s");
    let seconds = gauge_points(&to_breach);
    assert_eq!(string_attr(&seconds[0].0, "slo").as_deref(), Some("ttft_p99"));
    assert_eq!(seconds[0].1, 9.5 * 86_400.0);

    let ttft = receiver.latest("gen_ai.client.inference.time_to_first_chunk").unwrap();
    assert_eq!(ttft.unit, "s");
    let Some(metric::Data::Histogram(h)) = &ttft.data else { panic!("{ttft:?}") };
    let p = &h.data_points[0];
    assert_eq!(p.count, 2);
    assert!((p.sum.unwrap() - 0.1).abs() < 1e-12, "{:?}", p.sum);
    assert_eq!(p.bucket_counts.iter().sum::<u64>(), 2);
    // The GenAI client attributes, and the conventions' bucket boundaries.
    let genai = [
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.provider.name", "openai"),
        ("gen_ai.request.model", "smollm2"),
        ("server.address", "127.0.0.1"),
        ("omen.canary", "c1"),
    ];
    for (name, count, sum) in [
        ("gen_ai.client.inference.time_to_first_chunk", 2, 0.1),
        ("gen_ai.client.inference.time_per_output_chunk", 1, 0.01),
        ("gen_ai.client.inference.duration", 1, 0.5),
    ] {
        let m = receiver.latest(name).unwrap_or_else(|| panic!("{name} exported"));
        assert_eq!(m.unit, "s", "{name}");
        let Some(metric::Data::Histogram(h)) = &m.data else { panic!("{m:?}") };
        let p = &h.data_points[0];
        assert_eq!(p.count, count, "{name}");
        assert!((p.sum.unwrap() - sum).abs() < 1e-12, "{name}: {:?}", p.sum);
        assert_eq!(p.explicit_bounds, otlp::DURATION_BUCKETS.to_vec(), "{name}");
        for (key, value) in genai {
            assert_eq!(string_attr(&p.attributes, key).as_deref(), Some(value), "{name} {key}");
        }
        assert_eq!(int_attr(&p.attributes, "server.port"), Some(8000), "{name}");
    }
    let tokens = receiver.latest("gen_ai.client.inference.operation.output_tokens").expect("output tokens");
    assert_eq!(tokens.unit, "{token}");
    let Some(metric::Data::Histogram(h)) = &tokens.data else { panic!("{tokens:?}") };
    assert_eq!((h.data_points[0].count, h.data_points[0].sum), (1, Some(12.0)));
    assert_eq!(h.data_points[0].explicit_bounds, otlp::TOKEN_BUCKETS.to_vec());
    let usage = receiver.latest("gen_ai.client.inference.usage.output_tokens").expect("output token usage");
    let Some(metric::Data::Sum(sum)) = &usage.data else { panic!("{usage:?}") };
    assert!(sum.is_monotonic);
    assert_eq!(sum.data_points[0].value, Some(number_data_point::Value::AsInt(12)));
    assert_eq!(string_attr(&sum.data_points[0].attributes, "gen_ai.token.modality").as_deref(), Some("text"));

    let stats = exporter.stats();
    assert!(stats.exports >= 1 && stats.failures == 0, "{stats:?}");

    // Shutdown flushes: an observation made just before it reaches the receiver.
    live.record_latency("ttft_seconds", c1.clone(), 0.2);
    tokio::task::spawn_blocking(move || exporter.shutdown()).await.unwrap().unwrap();
    let ttft = receiver.latest("gen_ai.client.inference.time_to_first_chunk").unwrap();
    let Some(metric::Data::Histogram(h)) = &ttft.data else { panic!("{ttft:?}") };
    assert_eq!(h.data_points[0].count, 3);
    let _ = stop_receiver.send(());
}

#[test]
fn an_endpoint_with_nothing_listening_is_counted_not_fatal() {
    // A port that was just free: connections to it are refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let live = Arc::new(LiveMetrics::new());
    live.set_gauge("health_score", vec![], 0.1);
    let cfg = otlp_config(endpoint.clone(), Duration::from_millis(200));
    let exporter = otlp::start(&cfg, live, GenAiClient::default()).unwrap();

    let deadline = Instant::now() + Duration::from_secs(10);
    while exporter.stats().failures == 0 {
        assert!(Instant::now() < deadline, "no failed export within 10 s: {:?}", exporter.stats());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(exporter.stats().exports, 0);

    let began = Instant::now();
    let result = exporter.shutdown();
    assert!(began.elapsed() < Duration::from_secs(8), "shutdown took {:?}", began.elapsed());
    match result {
        Err(e @ OtlpError::Shutdown { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&endpoint) && text.contains("collector"), "{text}");
        }
        other => panic!("expected a Shutdown error for the failed final export, got {other:?}"),
    }
}

#[test]
fn unusable_endpoints_fail_at_start_with_the_fix() {
    let live = Arc::new(LiveMetrics::new());
    for endpoint in ["https://collector:4317", "collector:4317"] {
        let cfg = otlp_config(endpoint.into(), Duration::from_secs(30));
        let e = otlp::start(&cfg, live.clone(), GenAiClient::default()).unwrap_err();
        assert!(matches!(e, OtlpError::Endpoint { .. }), "{e:?}");
        assert!(e.to_string().contains("http://127.0.0.1:4317"), "{e}");
    }
}

#[test]
fn a_receiver_that_never_answers_does_not_hang_shutdown() {
    // Accepts TCP connections (kernel backlog) but never speaks HTTP/2.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    let live = Arc::new(LiveMetrics::new());
    let cfg = otlp_config(endpoint, Duration::from_millis(200));
    let exporter = otlp::start(&cfg, live, GenAiClient::default()).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let began = Instant::now();
    let result = exporter.shutdown();
    assert!(began.elapsed() < Duration::from_secs(8), "shutdown took {:?}", began.elapsed());
    assert!(result.is_err(), "a final export nobody answered cannot succeed");
    drop(silent);
}

#[path = "support/mod.rs"]
mod support;

/// The agent itself (`omen_agent::run::start` with an `otlp` section), probing the real
/// llama.cpp server from `make setup`: the canary metrics reach the receiver under the GenAI
/// client names, with the attributes taken from the canary target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_exports_its_canary_probes_by_the_genai_client_conventions() {
    let receiver = Receiver::default();
    let (endpoint, stop_receiver) = start_receiver(receiver.clone()).await;
    let (server, port) = support::start_llama_server(&[]);
    let c = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !c.get(format!("http://127.0.0.1:{port}/health")).send().await.is_ok_and(|r| r.status() == 200) {
        assert!(Instant::now() < deadline, "llama-server did not become healthy");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "store: {{path: {db}}}\nhttp: {{listen: '127.0.0.1:0'}}\nsources:\n  nvml: {{enabled: false}}\n  canary:\n    interval: 1s\n    target: {{base_url: 'http://127.0.0.1:{port}/v1', model: smollm2-135m, max_tokens: 8}}\n    prompts:\n      - {{id: capital, prompt: What is the capital of France?}}\n      - {{id: raw, prompt: The capital of France is, chat: false}}\notlp: {{endpoint: '{endpoint}', interval: 500ms, gen_ai_provider_name: llama.cpp}}\n",
        db = dir.path().join("omen.db").display(),
    );
    let agent = omen_agent::run::start(omen_agent::config::Config::from_yaml(&yaml).unwrap()).await.unwrap();
    let names = [
        "gen_ai.client.inference.duration",
        "gen_ai.client.inference.time_to_first_chunk",
        "gen_ai.client.inference.operation.output_tokens",
    ];
    // Both canaries probed at least once, in every instrument.
    let both = |m: &Metric| match &m.data {
        Some(metric::Data::Histogram(h)) => h.data_points.len() == 2,
        _ => false,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !names.iter().all(|n| receiver.latest(n).is_some_and(|m| both(&m))) {
        assert!(Instant::now() < deadline, "no complete canary export within 60 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for name in names {
        let m = receiver.latest(name).unwrap();
        let Some(metric::Data::Histogram(h)) = &m.data else { unreachable!() };
        for p in &h.data_points {
            let canary = string_attr(&p.attributes, "omen.canary").expect("omen.canary");
            let operation = if canary == "raw" { "text_completion" } else { "chat" };
            assert_eq!(
                string_attr(&p.attributes, "gen_ai.operation.name").as_deref(),
                Some(operation),
                "{name}"
            );
            assert_eq!(
                string_attr(&p.attributes, "gen_ai.provider.name").as_deref(),
                Some("llama.cpp"),
                "{name}"
            );
            assert_eq!(string_attr(&p.attributes, "gen_ai.request.model").as_deref(), Some("smollm2-135m"));
            assert_eq!(string_attr(&p.attributes, "server.address").as_deref(), Some("127.0.0.1"));
            assert_eq!(int_attr(&p.attributes, "server.port"), Some(i64::from(port)));
            assert!(p.count >= 1 && p.sum.is_some_and(|s| s > 0.0), "{name}: {p:?}");
            let answered = string_attr(&p.attributes, "gen_ai.response.model");
            assert!(answered.is_some_and(|m| !m.is_empty()), "{name}: no gen_ai.response.model in {p:?}");
        }
    }
    let input = receiver.latest("gen_ai.client.inference.usage.input_tokens").expect("prompt tokens counted");
    let Some(metric::Data::Sum(sum)) = &input.data else { panic!("{input:?}") };
    assert!(sum
        .data_points
        .iter()
        .all(|p| matches!(p.value, Some(number_data_point::Value::AsInt(n)) if n > 0)));

    // The server gone: the failed probes' durations carry error.type (connection refused).
    drop(server);
    let failed = |r: &Receiver| {
        r.latest("gen_ai.client.inference.duration").is_some_and(|m| match &m.data {
            Some(metric::Data::Histogram(h)) => h
                .data_points
                .iter()
                .any(|p| string_attr(&p.attributes, "error.type").as_deref() == Some("transport")),
            _ => false,
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !failed(&receiver) {
        assert!(Instant::now() < deadline, "no failed probe with error.type within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let duration = receiver.latest("gen_ai.client.inference.duration").unwrap();
    let Some(metric::Data::Histogram(h)) = &duration.data else { unreachable!() };
    let p = h.data_points.iter().find(|p| string_attr(&p.attributes, "error.type").is_some()).unwrap();
    assert_eq!(
        string_attr(&p.attributes, "gen_ai.response.model"),
        None,
        "a failed probe has no answering model"
    );
    assert_eq!(string_attr(&p.attributes, "gen_ai.request.model").as_deref(), Some("smollm2-135m"));
    agent.stop().await.unwrap();
    let _ = stop_receiver.send(());
}
