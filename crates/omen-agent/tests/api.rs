//! The agent's HTTP API end to end: a real agent on loopback, real HTTP requests.

use std::time::Duration;

use omen_agent::config::Config;
use serde_json::{json, Value};

fn config(dir: &std::path::Path, extra: &str) -> Config {
    let yaml = format!(
        "store:\n  path: {}\nhttp:\n  listen: 127.0.0.1:0\n  metrics_listen: 127.0.0.1:0\n{extra}",
        dir.join("omen.db").display()
    );
    Config::from_yaml(&yaml).unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap()
}

/// POST `body` as JSON to `url`.
async fn post_json(c: &reqwest::Client, url: String, body: &Value) -> reqwest::Response {
    c.post(url).json(body).send().await.unwrap()
}

/// GET `url` and decode the body as JSON.
async fn get_json(c: &reqwest::Client, url: String) -> Value {
    c.get(url).send().await.unwrap().json().await.unwrap()
}

/// Send only the headers (and a first chunk) of a POST that declares `content_length`
/// bytes of JSON, and return the status line the server answers with.
async fn oversized_post_status(addr: std::net::SocketAddr, path: &str, content_length: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {content_length}\r\n\r\n{{\"logits\": [0.0"
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    while !reply.windows(2).any(|w| w == b"\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "the server closed the connection without an answer");
        reply.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&reply);
    text.lines().next().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_query_and_export() {
    let dir = tempfile::tempdir().unwrap();
    let agent = omen_agent::run::start(config(dir.path(), "")).await.unwrap();
    let base = format!("http://{}", agent.api_addr);
    let c = client();

    // readiness on both listeners
    for addr in [agent.api_addr, agent.metrics_addr.unwrap()] {
        let r = c.get(format!("http://{addr}/readyz")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(c.get(format!("http://{addr}/healthz")).send().await.unwrap().status(), 200);
    }

    // 16 blocks, used 0, 1 and 8: free runs of 6 and 7 -> KVF 13/7
    let r = c
        .post(format!("{base}/v1/ingest/kvcache"))
        .json(&json!({"gpu": "0", "layers": [{"layer": 3, "bitmap_b64": "AwE=", "num_blocks": 16}, {"layer": 4, "total_blocks": 10, "used_blocks": 9}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = c
        .post(format!("{base}/v1/ingest/logits"))
        .json(&json!({"canary": "c1", "logits": [0.0, 0.0, 0.0, 0.0]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["accepted"], 1);
    let r = post_json(
        &c,
        format!("{base}/v1/ingest/samples"),
        &json!({"samples": [{"signal": "queue_depth", "value": 7}]}),
    )
    .await;
    assert_eq!(r.status(), 200);

    // bad payloads: 4xx with the field, agent keeps running
    let r = c
        .post(format!("{base}/v1/ingest/kvcache"))
        .json(&json!({"layers": [{"layer": 1, "total_blocks": 4, "used_blocks": 9}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    assert_eq!(r.json::<Value>().await.unwrap()["field"], "layers[0].used_blocks");
    let r = c
        .post(format!("{base}/v1/ingest/samples"))
        .header("content-type", "application/json")
        .body("{\"samples\": [{\"signal\": 5}]}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.json::<Value>().await.unwrap()["field"].as_str().unwrap().starts_with("samples"));
    let r = c.post(format!("{base}/v1/ingest/nonsense")).json(&json!({})).send().await.unwrap();
    assert_eq!(r.status(), 404);
    // An oversized body is refused from its Content-Length, before it is read. The server
    // may close the socket while a client is still writing, so a plain client can see a
    // broken pipe instead of the answer: speak HTTP on a raw socket and read the reply.
    let status = oversized_post_status(agent.api_addr, "/v1/ingest/logits", 12_000_000).await;
    assert!(status.starts_with("HTTP/1.1 413"), "{status}");
    // The agent is still there after it.
    assert_eq!(c.get(format!("{base}/healthz")).send().await.unwrap().status(), 200);

    // /scores
    let r: Value = get_json(&c, format!("{base}/scores?signal=kv_fragmentation&layer=3&since=now-1h")).await;
    assert_eq!(r["signal"], "kv_fragmentation");
    let series = r["series"].as_array().unwrap();
    assert_eq!(series.len(), 1);
    let v = series[0]["points"][0][1].as_f64().unwrap();
    assert!((v - 13.0 / 7.0).abs() < 1e-12, "{r}");
    // a short span of one series takes the inline read path: the same answer
    let short: Value =
        get_json(&c, format!("{base}/scores?signal=kv_fragmentation&layer=3&since=now-5m")).await;
    assert_eq!(short["series"].as_array().unwrap().len(), 1, "{short}");
    assert_eq!(short["series"][0]["points"][0][1], series[0]["points"][0][1]);
    assert_eq!(short["resolution"], "raw");
    let r = c.get(format!("{base}/scores?signal=kv_fragmentation&since=yesterday")).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["field"], "since");
    assert_eq!(c.get(format!("{base}/scores")).send().await.unwrap().status(), 400);
    assert_eq!(
        c.get(format!("{base}/scores?signal=x&since=now-30d&step=1s")).send().await.unwrap().status(),
        400
    );
    let latest: Value = get_json(&c, format!("{base}/scores/latest")).await;
    assert!(latest["signals"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["signal"] == "tle_bits" && (s["value"].as_f64().unwrap() - 2.0).abs() < 1e-6));
    assert!(latest["health"]["health_score"].as_f64().is_some(), "{latest}");
    // a client that accepts gzip gets the same body, gzipped
    let plain = c.get(format!("{base}/scores/latest")).send().await.unwrap().bytes().await.unwrap();
    let r = c
        .get(format!("{base}/scores/latest"))
        .header("accept-encoding", "br;q=1.0, gzip;q=0.8")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["content-encoding"], "gzip");
    assert_eq!(r.headers()["vary"], "accept-encoding");
    let zipped = r.bytes().await.unwrap();
    let mut unzipped = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&zipped[..]), &mut unzipped).unwrap();
    // A health tick may land between the two requests; the signals stay as pushed.
    let (plain, unzipped): (Value, Value) =
        (serde_json::from_slice(&plain).unwrap(), serde_json::from_slice(&unzipped).unwrap());
    assert_eq!(unzipped["signals"], plain["signals"]);
    assert!(unzipped["health"]["health_score"].as_f64().is_some(), "{unzipped}");
    let r =
        c.get(format!("{base}/scores/latest")).header("accept-encoding", "gzip;q=0").send().await.unwrap();
    assert!(r.headers().get("content-encoding").is_none());
    // filtered by signal and labels: only the matching series, the same shape
    let only: Value = get_json(&c, format!("{base}/scores/latest?signal=kv_fragmentation&layer=3")).await;
    let signals = only["signals"].as_array().unwrap();
    assert_eq!(signals.len(), 1, "{only}");
    assert_eq!(signals[0]["labels"], json!({"gpu": "0", "layer": "3"}));
    assert!((signals[0]["value"].as_f64().unwrap() - 13.0 / 7.0).abs() < 1e-12);
    assert_eq!(only["health"], latest["health"]);
    assert_eq!(only["ts"], latest["ts"]);
    let r = c.get(format!("{base}/scores/latest?signal=Bad-Name")).send().await.unwrap();
    assert_eq!(r.status(), 400);
    // a new value shows in the next /scores/latest (the cached body follows the gauges)
    let r = post_json(
        &c,
        format!("{base}/v1/ingest/samples"),
        &json!({"samples": [{"signal": "queue_depth", "value": 9}]}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let depth: Value = get_json(&c, format!("{base}/scores/latest?signal=queue_depth")).await;
    assert_eq!(depth["signals"][0]["value"], 9.0, "{depth}");
    // /scores answers are cached per store write: the same query twice is the same
    // answer, and the next acknowledged write shows in it (minute aggregates: pushes
    // this close together are decimated from the raw table)
    let query = format!("{base}/scores?signal=queue_depth&since=now-7h&step=1h");
    let first: Value = get_json(&c, query.clone()).await;
    let mean_before = first["series"][0]["points"][0][1].as_f64().unwrap();
    assert!(mean_before < 11.0, "{first}");
    assert_eq!(get_json(&c, query.clone()).await, first);
    let r = post_json(
        &c,
        format!("{base}/v1/ingest/samples"),
        &json!({"samples": [{"signal": "queue_depth", "value": 11}]}),
    )
    .await;
    assert_eq!(r.status(), 200);
    // the hour's mean moves towards the new 11
    let second: Value = get_json(&c, query).await;
    let mean_after = second["series"][0]["points"][0][1].as_f64().unwrap();
    assert!(mean_before < mean_after && mean_after < 11.0, "{first} then {second}");

    // /metrics on the metrics listener: OpenMetrics when asked for (Prometheus' own Accept
    // header), the 0.0.4 text format otherwise
    let prometheus_accept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let r = c
        .get(format!("http://{}/metrics", agent.metrics_addr.unwrap()))
        .header("accept", prometheus_accept)
        .send()
        .await
        .unwrap();
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("application/openmetrics-text"));
    let openmetrics = r.text().await.unwrap();
    assert!(openmetrics.ends_with("# EOF\n") && openmetrics.contains("# TYPE omen_ingest_rejected counter"));
    let r = c.get(format!("http://{}/metrics", agent.metrics_addr.unwrap())).send().await.unwrap();
    assert_eq!(r.headers()["content-type"], "text/plain; version=0.0.4; charset=utf-8");
    let text = r.text().await.unwrap();
    assert!(!text.contains("# EOF") && text.contains("# TYPE omen_ingest_rejected_total counter"), "{text}");
    assert!(text.contains("omen_kv_fragmentation{gpu=\"0\",layer=\"3\"} 1.857142857142857"), "{text}");
    assert!(text.contains("omen_kvcache_usage_ratio{gpu=\"0\",layer=\"4\"} 0.9"), "{text}");
    assert!(text.contains("omen_ingest_rejected_total{endpoint=\"kvcache\",status=\"422\"} 1"), "{text}");
    assert!(text.contains("omen_health_score "), "{text}");
    // the metrics listener does not accept pushes
    assert_eq!(
        c.post(format!("http://{}/v1/ingest/samples", agent.metrics_addr.unwrap()))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_token_is_enforced() {
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("OMEN_TEST_INGEST_TOKEN", "s3cret");
    let agent = omen_agent::run::start(config(dir.path(), "  ingest_token_env: OMEN_TEST_INGEST_TOKEN\n"))
        .await
        .unwrap();
    let url = format!("http://{}/v1/ingest/samples", agent.api_addr);
    let body = json!({"samples": [{"signal": "x", "value": 1}]});
    let c = client();
    assert_eq!(c.post(&url).json(&body).send().await.unwrap().status(), 401);
    assert_eq!(c.post(&url).bearer_auth("wrong").json(&body).send().await.unwrap().status(), 401);
    assert_eq!(c.post(&url).bearer_auth("s3cret").json(&body).send().await.unwrap().status(), 200);
    agent.stop().await.unwrap();
}
