//! The agent's live sources against a real llama.cpp server on loopback
//! (installed by `make setup`): canary probes with reference capture, the
//! server /metrics scrape, NVML absent on a machine without a GPU, and BERTScore
//! (all-MiniLM-L6-v2 from `make setup`) joining the canary's RCI.

use std::time::{Duration, Instant};

use omen_agent::config::Config;

mod support;

use support::start_llama_server;

/// The value of the exposition line that starts with `series`.
fn metric_value(text: &str, series: &str) -> f64 {
    let line =
        text.lines().find(|l| l.starts_with(series)).unwrap_or_else(|| panic!("no {series} in\n{text}"));
    line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("bad value in {line:?}"))
}

async fn wait_healthy(c: &reqwest::Client, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while c
        .get(format!("http://127.0.0.1:{port}/health"))
        .send()
        .await
        .map(|r| r.status() != 200)
        .unwrap_or(true)
    {
        assert!(Instant::now() < deadline, "llama-server did not become healthy");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_and_scrape_sources_feed_the_pipeline() {
    let (_server, port) = start_llama_server(&["--metrics"]);
    let c = reqwest::Client::new();
    wait_healthy(&c, port).await;

    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "store:\n  path: {db}\nhttp:\n  listen: 127.0.0.1:0\nhealth:\n  interval: 1s\nsources:\n  canary:\n    interval: 1s\n    target:\n      base_url: http://127.0.0.1:{port}/v1\n      model: smollm2-135m\n      max_tokens: 16\n    prompts:\n      - id: capital\n        prompt: What is the capital of France? Answer in one sentence.\n  server_metrics:\n    url: http://127.0.0.1:{port}/metrics\n    interval: 1s\n",
        db = dir.path().join("omen.db").display()
    );
    let agent = omen_agent::run::start(Config::from_yaml(&yaml).unwrap()).await.unwrap();
    let base = format!("http://{}", agent.api_addr);
    let deadline = Instant::now() + Duration::from_secs(120);
    let metrics = loop {
        let text = c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
        // two probes: the first captures the reference, the second scores RCI against it
        if text.contains("omen_rci{canary=\"capital\"}") && text.contains("omen_server_requests_running{") {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "sources produced no canary RCI or server metrics in 120 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(metrics.contains("omen_source_up{source=\"canary\"} 1"), "{metrics}");
    assert!(metrics.contains("omen_source_up{source=\"server_metrics\"} 1"), "{metrics}");
    assert!(!metrics.contains("source=\"nvml\""), "no GPU here: NVML is off, not down\n{metrics}");
    assert!(metrics.contains("omen_ttft_seconds_bucket{"), "{metrics}");
    let tle = metric_value(&metrics, "omen_tle_bits{canary=\"capital\"}");
    assert!(tle > 0.0 && tle < 49152f64.log2(), "{tle}");
    // greedy decoding of the same prompt reproduces the captured reference: lexical RCI ~ 0
    let rci = metric_value(&metrics, "omen_rci{canary=\"capital\"}");
    assert!(rci < 0.05, "{rci}");
    // no bertscore_model_dir: RCI without its semantic part
    assert!(!metrics.contains("omen_rci_bertscore_f1"), "{metrics}");
    let reference = agent.state.store.canary_reference("capital").unwrap();
    assert!(reference.is_some_and(|r| !r.is_empty()));
    agent.stop().await.unwrap();
}

/// The BERTScore model folder `make setup` installs (or OMEN_BERTSCORE_MODEL_DIR).
#[cfg(feature = "bertscore")]
fn bertscore_model_dir() -> std::path::PathBuf {
    let dir =
        std::env::var_os("OMEN_BERTSCORE_MODEL_DIR").map(std::path::PathBuf::from).unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.models/all-MiniLM-L6-v2")
        });
    assert!(
        dir.join("model.safetensors").is_file(),
        "no BERTScore model in {}; run `make setup` (scripts/setup-bertscore-model.sh)",
        dir.display()
    );
    dir
}

#[cfg(feature = "bertscore")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_with_bertscore_exports_its_f1_and_weighs_it_into_rci() {
    let model_dir = bertscore_model_dir();
    let (_server, port) = start_llama_server(&["--metrics"]);
    let c = reqwest::Client::new();
    wait_healthy(&c, port).await;
    let dir = tempfile::tempdir().unwrap();
    // With a configured reference every probe scores RCI, BERTScore included. SmolLM2 answers
    // "The capital of France is Paris."; a reference in other words keeps BLEU and F1 below 1,
    // so that the weights applied can be told apart.
    let reference = "Paris, a city on the Seine, has long been the French capital.";
    let yaml = format!(
        "store:\n  path: {db}\nhttp:\n  listen: 127.0.0.1:0\nhealth:\n  interval: 1s\nsources:\n  canary:\n    interval: 1s\n    bertscore_model_dir: {model}\n    target:\n      base_url: http://127.0.0.1:{port}/v1\n      model: smollm2-135m\n      max_tokens: 16\n    prompts:\n      - id: capital\n        prompt: What is the capital of France? Answer in one sentence.\n        reference: {reference}\n",
        db = dir.path().join("omen.db").display(),
        model = model_dir.display(),
    );
    let agent = omen_agent::run::start(Config::from_yaml(&yaml).unwrap()).await.unwrap();
    let base = format!("http://{}", agent.api_addr);
    // RCI = 0.4 (1 - BLEU) + 0.4 (1 - F1) + 0.2 repetition with the default weights, none
    // renormalised away. A /metrics read can fall between two probes' gauge updates, so
    // wait for a snapshot of one probe rather than assert on the first read.
    let parts = |text: &str| {
        let v = |name: &str| metric_value(text, &format!("omen_{name}{{canary=\"capital\"}}"));
        (v("rci"), v("rci_bleu"), v("rci_bertscore_f1"), v("rci_repetition_ratio"))
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let (metrics, (rci, bleu, f1, repetition)) = loop {
        let text = c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
        if text.contains("omen_rci_bertscore_f1{canary=\"capital\"}") {
            let (rci, bleu, f1, rep) = parts(&text);
            if (rci - (0.4 * (1.0 - bleu) + 0.4 * (1.0 - f1) + 0.2 * rep)).abs() < 1e-9 {
                break (text, (rci, bleu, f1, rep));
            }
        }
        assert!(
            Instant::now() < deadline,
            "no omen_rci_bertscore_f1, or RCI without the BERTScore part, in 120 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(metrics.contains("omen_source_up{source=\"canary\"} 1"), "{metrics}");
    // A paraphrase: a semantic match far above a non-answer's (~0.06), below an identical answer's 1.
    assert!(f1 > 0.3 && f1 < 0.99, "BERTScore F1 {f1} (BLEU {bleu}, repetition {repetition}, RCI {rci})");
    let renormalised = 2.0 / 3.0 * (1.0 - bleu) + 1.0 / 3.0 * repetition;
    assert!((rci - renormalised).abs() > 1e-3, "RCI {rci} is the value without BERTScore");
    eprintln!("canary: BERTScore F1 {f1:.4}, BLEU {bleu:.4}, repetition {repetition:.4}, RCI {rci:.4}");
    agent.stop().await.unwrap();
}
