//! The cost section's VRAM figure read from a real omen agent on loopback: the GPU memory
//! it holds (pushed here as its NVML source would record it), summed over GPUs; and the
//! reason when it has none or cannot be reached.

use omen_agent::config::Config;
use omen_bench::cost::{vram_from_omen, Vram};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vram_comes_from_the_agents_gpu_memory_reading() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "store:\n  path: {}\nhttp:\n  listen: 127.0.0.1:0\n  metrics_listen: 127.0.0.1:0\n",
        dir.path().join("omen.db").display()
    );
    let agent = omen_agent::run::start(Config::from_yaml(&yaml).unwrap()).await.unwrap();
    let base = format!("http://{}", agent.api_addr);

    // No GPU reading yet: said so, with the reason.
    match vram_from_omen(&base).await {
        Vram::Unavailable { reason } => {
            assert!(reason.contains("no gpu_memory_used_bytes reading"), "{reason}")
        }
        other => panic!("{other:?}"),
    }

    let samples = json!({"samples": [
        {"signal": "gpu_memory_used_bytes", "labels": {"gpu": "0"}, "value": 3.0e9},
        {"signal": "gpu_memory_used_bytes", "labels": {"gpu": "1"}, "value": 1.0e9},
        {"signal": "gpu_memory_total_bytes", "labels": {"gpu": "0"}, "value": 80.0e9}
    ]});
    let r =
        reqwest::Client::new().post(format!("{base}/v1/ingest/samples")).json(&samples).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    match vram_from_omen(&format!("{base}/")).await {
        Vram::Measured { used_bytes, gpus, source } => {
            assert_eq!((used_bytes, gpus), (4.0e9, 2));
            assert!(source.ends_with("/scores/latest?signal=gpu_memory_used_bytes"), "{source}");
        }
        other => panic!("{other:?}"),
    }

    // Nothing listening: the reason names the URL and the option.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    match vram_from_omen(&format!("http://{closed}")).await {
        Vram::Unavailable { reason } => {
            assert!(reason.contains(&closed.to_string()) && reason.contains("--omen"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}
