//! End to end against a real llama.cpp `llama-server` (SmolLM2-135M-Instruct) on
//! loopback, installed by `make setup` (scripts/setup-llm.sh). The binary is found
//! the same way scripts/llm-server.sh finds it (`scripts/llm-server.sh path`); when
//! it is missing these tests fail and say to run `make setup`.

use std::io::Read as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use omen_signals::rci::lexical_parts;
use omen_signals::{BleuReference, RciWeights};
use omen_sources::canary::{probe, Canary, CanaryError, CanaryTarget};
use omen_sources::scrape::{ScrapeError, Scraper, ServerKind};

const MODEL: &str = "smollm2-135m";
/// SmolLM2's vocabulary size, as its GGUF records it.
const SMOLLM2_VOCAB: usize = 49152;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// (server binary, GGUF) from `scripts/llm-server.sh path`.
fn installed() -> (PathBuf, PathBuf) {
    let script = repo_root().join("scripts/llm-server.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("path")
        .output()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", script.display()));
    if !out.status.success() {
        panic!(
            "the llama.cpp server is not installed; run `make setup` (or scripts/setup-llm.sh).\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    match (lines.next(), lines.next()) {
        (Some(server), Some(model)) => (PathBuf::from(server), PathBuf::from(model)),
        _ => panic!("scripts/llm-server.sh path printed {text:?}; expected the server and model paths"),
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local address").port()
}

/// One llama-server at a time: on a 2-core machine parallel servers only slow each other down.
static ONE_SERVER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A running llama-server; killed when dropped, also when a test panics.
struct LlamaServer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl LlamaServer {
    /// Starts llama-server on a free loopback port and waits for GET /health.
    async fn start(metrics: bool) -> Self {
        let (server, model) = installed();
        let port = free_port();
        let log = std::env::temp_dir().join(format!("omen-llama-server-{port}.log"));
        let log_file = std::fs::File::create(&log).expect("create the server log");
        let mut cmd = Command::new(&server);
        cmd.arg("-m").arg(&model);
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()]);
        // One thread that sleeps when idle: tests run side by side on 2 cores (see support/mod.rs).
        cmd.args(["-c", "2048", "-np", "1", "-t", "1", "--poll", "0", "--alias", MODEL]);
        if metrics {
            cmd.arg("--metrics");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("clone log handle"))
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {}: {e}; run `make setup`", server.display()));
        let mut me = Self { child, port, log };
        me.wait_healthy().await;
        me
    }

    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    async fn wait_healthy(&mut self) {
        let client = reqwest::Client::new();
        let url = format!("http://127.0.0.1:{}/health", self.port);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("llama-server exited during startup ({status}); log:\n{}", self.log_tail());
            }
            let ok = client.get(&url).timeout(Duration::from_secs(2)).send().await;
            if let Ok(r) = ok {
                if r.status().is_success() && r.text().await.unwrap_or_default().contains("ok") {
                    return;
                }
            }
            if Instant::now() > deadline {
                panic!("llama-server did not answer {url} within 60 s; log:\n{}", self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    fn metrics_url(&self) -> String {
        format!("http://127.0.0.1:{}/metrics", self.port)
    }
}

fn target(server: &LlamaServer) -> CanaryTarget {
    let mut t = CanaryTarget::new(server.base_url(), MODEL);
    t.max_tokens = 32;
    t.timeout = Duration::from_secs(120);
    t
}

fn capital_canary() -> Canary {
    Canary {
        id: "capital".into(),
        prompt: "What is the capital of France? Answer in one short sentence.".into(),
        reference: Some("The capital of France is Paris.".into()),
        chat: true,
    }
}

fn colours_canary() -> Canary {
    Canary {
        id: "colours".into(),
        prompt: "The three primary colours of light are".into(),
        reference: None,
        chat: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_probes_a_real_llama_server() {
    let _one = ONE_SERVER.lock().await;
    let server = LlamaServer::start(true).await;
    let client = reqwest::Client::new();
    let target = target(&server);
    let weights = RciWeights::default();

    let vocab = target.vocab_size(&client).await.expect("llama.cpp reports meta.n_vocab");
    assert_eq!(vocab, SMOLLM2_VOCAB);
    let max_bits = (vocab as f64).log2();

    // With a reference (chat endpoint).
    let capital = capital_canary();
    let a1 = probe(&client, &target, &capital, None, weights).await.expect("probe with a reference");
    let a2 = probe(&client, &target, &capital, None, weights).await.expect("second probe");
    for r in [&a1, &a2] {
        assert!(r.ttft_s > 0.0 && r.ttft_s <= r.e2e_s, "ttft {} e2e {}", r.ttft_s, r.e2e_s);
        assert!(r.tokens > 0 && r.tokens <= 32, "tokens {}", r.tokens);
        assert!(!r.answer.trim().is_empty());
        assert!((0.0..=max_bits).contains(&r.tle.entropy_bits), "TLE {:?}", r.tle);
        assert!(r.tle.lower_bits <= r.tle.upper_bits && r.tle.upper_bits <= max_bits + 1e-9, "{:?}", r.tle);
        if r.tokens > 1 {
            let tpot = r.tpot_s.expect("tpot for a multi-token answer");
            assert!(tpot > 0.0 && tpot < r.e2e_s, "tpot {tpot}");
        }
        let rci = r.rci.expect("a canary with a reference gets an RCI");
        assert!((0.0..=1.0).contains(&rci.value), "{rci:?}");
        assert_eq!(rci.parts.semantic_f1, None);
    }
    assert_eq!(a1.answer, a2.answer, "greedy decoding must give the same answer twice");
    assert_eq!(a1.tokens, a2.tokens);
    assert!((a1.tle.entropy_bits - a2.tle.entropy_bits).abs() < 1e-3, "{:?} vs {:?}", a1.tle, a2.tle);
    eprintln!(
        "capital: {:?} tokens={} ttft={:.4}s tpot={:?} e2e={:.4}s tle={:.4} bits rci={:.4}",
        a1.answer,
        a1.tokens,
        a1.ttft_s,
        a1.tpot_s,
        a1.e2e_s,
        a1.tle.entropy_bits,
        a1.rci.map(|r| r.value).unwrap_or(f64::NAN)
    );

    // Without a reference (completions endpoint): no RCI, the answer becomes the reference.
    let colours = colours_canary();
    let b1 = probe(&client, &target, &colours, None, weights).await.expect("probe without a reference");
    assert!(b1.rci.is_none());
    assert!(b1.tokens > 0 && !b1.answer.is_empty(), "{b1:?}");
    assert!((0.0..=max_bits).contains(&b1.tle.entropy_bits), "TLE {:?}", b1.tle);
    let reference = Arc::new(BleuReference::new(&[b1.answer.as_str()]).expect("answer as reference"));
    let b2 = probe(&client, &target, &colours, Some(reference.clone()), weights).await.expect("probe again");
    assert_eq!(b1.answer, b2.answer, "greedy decoding must give the same answer twice");
    let rci = b2.rci.expect("RCI against the stored answer");
    // Against itself the answer has BLEU 1, so only its own repetition remains.
    assert!((rci.parts.bleu - 1.0).abs() < 1e-9, "{rci:?}");
    let (batch_bleu, batch_rep) = lexical_parts(&b2.answer, &reference);
    assert!((batch_bleu.fraction() - rci.parts.bleu).abs() < 1e-12);
    assert!((batch_rep - rci.parts.repetition_ratio).abs() < 1e-12);
    let expected = weights.without_semantic().repetition * rci.parts.repetition_ratio;
    assert!((rci.value - expected).abs() < 1e-9, "RCI {rci:?}, expected {expected}");
    eprintln!("colours: {:?} tokens={} rci={:?}", b1.answer, b1.tokens, rci);

    // Samples carry the canary label and the full set of signals.
    let samples = b2.samples(1_780_000_000_000, &colours.id);
    for name in [
        "tle_bits",
        "tle_bits_upper",
        "rci",
        "rci_bleu",
        "rci_repetition_ratio",
        "canary_ttft_seconds",
        "canary_e2e_seconds",
        "canary_tokens",
    ] {
        assert!(samples.iter().any(|s| s.signal == name), "no {name} in {samples:?}");
    }
    assert!(samples.iter().all(|s| s.labels.get("canary") == Some(&colours.id)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_maps_real_llama_server_metrics() {
    let _one = ONE_SERVER.lock().await;
    let server = LlamaServer::start(true).await;
    let client = reqwest::Client::new();
    let mut scraper = Scraper::new(&server.metrics_url()).expect("metrics URL");
    let before = scraper.scrape(&client, 1_780_000_000_000).await.expect("scrape /metrics");
    assert_eq!(scraper.server(), Some(ServerKind::LlamaCpp), "samples: {before:?}");
    // Generate some tokens so the throughput gauges move.
    probe(&client, &target(&server), &capital_canary(), None, RciWeights::default()).await.expect("probe");
    let after = scraper.scrape(&client, 1_780_000_015_000).await.expect("scrape /metrics again");
    eprintln!("llama.cpp samples: {after:#?}");
    for name in ["server_requests_running", "server_requests_waiting", "server_generation_tokens_per_second"]
    {
        let s = after.iter().find(|s| s.signal == name).unwrap_or_else(|| panic!("no {name} in {after:?}"));
        assert_eq!(s.labels.get("server").map(String::as_str), Some("llamacpp"));
        assert!(s.value.is_finite() && s.value >= 0.0, "{s:?}");
    }
    let tps =
        after.iter().find(|s| s.signal == "server_generation_tokens_per_second").map_or(0.0, |s| s.value);
    assert!(tps > 0.0, "after a probe the generation throughput is positive: {after:?}");
    // KV use from GET /slots: the one slot (-np 1 -c 2048) keeps the probe's tokens cached.
    let value = |name: &str| after.iter().find(|s| s.signal == name).map(|s| s.value);
    assert_eq!(value("server_kvcache_capacity_tokens"), Some(2048.0), "{after:?}");
    let held = value("server_kvcache_tokens").expect("tokens held");
    assert!(held > 0.0 && held <= 2048.0, "{held}");
    assert_eq!(value("kvcache_usage_ratio"), Some(held / 2048.0));
    assert!(scraper.warnings().is_empty(), "{:?}", scraper.warnings());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_the_endpoint_and_the_fix() {
    let _one = ONE_SERVER.lock().await;
    let client = reqwest::Client::new();
    // Nothing listens on this port.
    let port = free_port();
    let mut t = CanaryTarget::new(format!("http://127.0.0.1:{port}/v1"), MODEL);
    t.vocab_size = Some(SMOLLM2_VOCAB);
    let err = probe(&client, &t, &capital_canary(), None, RciWeights::default()).await.expect_err("refused");
    assert!(matches!(err, CanaryError::Request { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("127.0.0.1:{port}")) && msg.contains("server is running"), "{msg}");
    eprintln!("refused probe: {msg}");

    let mut scraper = Scraper::new(&format!("http://127.0.0.1:{port}/metrics")).expect("URL");
    let err = scraper.scrape(&client, 0).await.expect_err("refused");
    assert!(matches!(err, ScrapeError::Request { .. }), "{err:?}");

    // A real llama-server started without --metrics: the scrape error says what to add,
    // and a wrong model name is reported with the server's own message.
    let server = LlamaServer::start(false).await;
    let mut scraper = Scraper::new(&server.metrics_url()).expect("URL");
    let err = scraper.scrape(&client, 0).await.expect_err("no /metrics without --metrics");
    let msg = err.to_string();
    assert!(matches!(err, ScrapeError::Status { .. }) && msg.contains("--metrics"), "{msg}");
    eprintln!("scrape without --metrics: {msg}");
    let mut t = target(&server);
    t.base_url = format!("http://127.0.0.1:{}/nope", server.port);
    t.vocab_size = Some(SMOLLM2_VOCAB);
    let err = probe(&client, &t, &capital_canary(), None, RciWeights::default()).await.expect_err("404");
    assert!(matches!(err, CanaryError::Status { status: 404, .. }), "{err:?}");
    assert!(err.to_string().contains("/v1"), "{err}");
    eprintln!("wrong base_url: {err}");
}
