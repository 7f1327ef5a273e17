//! `omen bench` and `omen compare` end to end against a real llama.cpp
//! `llama-server` (SmolLM2-135M-Instruct, installed by `make setup`) on loopback,
//! with a handful of short requests.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "../../omen-agent/tests/support/mod.rs"]
mod support;

use support::Server;

fn start_llama_server() -> (Server, u16) {
    // --metrics: the latency breakdown reads the server's own token and time counters.
    let (me, port) = support::start_llama_server(&["--metrics"]);
    // Generous: on a loaded 2-core machine the model load alone can take tens of seconds.
    let deadline = Instant::now() + Duration::from_secs(120);
    let url = format!("http://127.0.0.1:{port}/health");
    while !Command::new("curl")
        .args(["-fsS", "--max-time", "2", &url])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        assert!(Instant::now() < deadline, "llama-server did not become healthy on {url}");
        std::thread::sleep(Duration::from_millis(100));
    }
    (me, port)
}

/// A long user message (~50 tokens) so that a few turns overflow a small context bound.
const LONG: &str = "Please explain, in plain words and without any lists, why the sky looks blue during \
the day and red or orange at sunset, and mention what role the thickness of the atmosphere plays.";

/// One session (the next would arrive after ~100 s) so that the turns, and so the context
/// growth and back-off, do not depend on timing; `cap` lets turn 1 fit and turn 2 overflow.
fn workflow(api: &str, policy: &str, requests: u64, cap: u32) -> String {
    format!(
        "name: test-{api}\napi: {api}\nmax_tokens: 8\nignore_eos: true\nconcurrency: 1\nseed: 1\n\
         arrival: {{ rate: 0.01, rate_shape: 4, change_every: 2s }}\n\
         max_context_tokens: {cap}\ncontext_policy: {policy}\nmax_requests: {requests}\nduration: 120s\n\
         rtt_backoff: {{ ratio: 50, baseline_requests: 3 }}\nstart: ask\nstates:\n\
         \x20 ask:\n    prompts: [\"{LONG}\"]\n    timeout: 60s\n    retries: 1\n    qps: 5\n\
         \x20   transitions: [{{ to: follow, probability: 0.999 }}, {{ to: end, probability: 0.001 }}]\n\
         \x20 follow:\n    prompts: [\"{LONG}\"]\n\
         \x20   transitions: [{{ to: follow, probability: 0.999 }}, {{ to: end, probability: 0.001 }}]\n"
    )
}

fn omen(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_omen")).args(args).output().expect("run omen");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "omen {args:?} failed ({}):\n{stdout}\n{stderr}", out.status);
    (stdout, stderr)
}

fn read(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn check_report(r: &Value, n: u64) {
    let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("no {k} in report"));
    assert_eq!(r["completed"], n, "{r:#}");
    assert_eq!(r["failed"], 0);
    assert!(f("total_output_tokens") > 0.0 && f("total_output_tokens") <= 8.0 * n as f64);
    assert!(f("total_input_tokens") > 0.0);
    assert!(f("duration") > 0.0 && f("request_throughput") > 0.0 && f("output_throughput") > 0.0);
    assert!(f("total_token_throughput") > f("output_throughput"));
    for m in ["ttft", "tpot", "itl", "e2el"] {
        let (mean, median, p90, p99) = (
            f(&format!("mean_{m}_ms")),
            f(&format!("median_{m}_ms")),
            f(&format!("p90_{m}_ms")),
            f(&format!("p99_{m}_ms")),
        );
        assert!(
            mean > 0.0 && median > 0.0 && median <= p90 && p90 <= p99,
            "{m}: {mean} {median} {p90} {p99}"
        );
    }
    assert!(f("mean_ttft_ms") < f("mean_e2el_ms"));
    let requests = r["requests"].as_array().unwrap();
    assert_eq!(requests.len() as u64, n);
    for q in requests {
        assert_eq!(q["success"], true, "{q}");
        let (ttft, e2el) = (q["ttft_ms"].as_f64().unwrap(), q["e2el_ms"].as_f64().unwrap());
        assert!(ttft > 0.0 && ttft <= e2el, "{q}");
        let out = q["output_tokens"].as_u64().unwrap();
        assert_eq!(out, 8, "ignore_eos gives max_tokens tokens: {q}");
    }
    // Context grows within a session: turn 1 carries turn 0.
    let turn = |q: &Value, t: u64| q["turn"] == t;
    let grown = requests.iter().filter(|q| turn(q, 1)).any(|second| {
        let first = requests.iter().find(|q| q["session"] == second["session"] && turn(q, 0)).unwrap();
        second["history_turns"] == 1 && second["input_tokens"].as_u64() > first["input_tokens"].as_u64()
    });
    assert!(grown, "no session carried its first turn into the second: {requests:#?}");
    assert!(r["omen"]["max_history_turns"].as_u64().unwrap() >= 1);
    assert!(r["omen"]["rtt_backoff"]["baseline_ttft_ms"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_and_compare_against_a_real_llama_server() {
    let (_server, port) = start_llama_server();
    let endpoint = format!("http://127.0.0.1:{port}/v1");
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| -> PathBuf { dir.path().join(name) };

    std::fs::write(path("chat.yaml"), workflow("chat", "reset", 10, 170)).unwrap();
    let (_, stderr) = omen(&[
        "bench",
        "--workflow",
        path("chat.yaml").to_str().unwrap(),
        "--endpoint",
        &endpoint,
        "--out",
        path("a.json").to_str().unwrap(),
    ]);
    eprintln!("{stderr}");
    let a = read(&path("a.json"));
    check_report(&a, 10);
    assert_eq!(a["model_id"], "smollm2-135m", "discovered from GET /v1/models");
    assert!(a["omen"]["context_resets"].as_u64().unwrap() >= 1, "{:#}", a["omen"]);
    let reset = a["requests"].as_array().unwrap().iter().find(|q| q["context"] == "reset").unwrap();
    assert_eq!(reset["history_turns"], 0, "{reset}");

    std::fs::write(path("completions.yaml"), workflow("completions", "truncate", 8, 128)).unwrap();
    let (_, stderr) = omen(&[
        "bench",
        "--workflow",
        path("completions.yaml").to_str().unwrap(),
        "--endpoint",
        &endpoint,
        "--out",
        path("b.json").to_str().unwrap(),
        "--model",
        "smollm2-135m",
    ]);
    eprintln!("{stderr}");
    let b = read(&path("b.json"));
    check_report(&b, 8);
    assert!(b["omen"]["context_truncations"].as_u64().unwrap() >= 1, "{:#}", b["omen"]);

    let (table, _) = omen(&[
        "compare",
        path("a.json").to_str().unwrap(),
        path("b.json").to_str().unwrap(),
        "--json",
        path("cmp.json").to_str().unwrap(),
        "--resamples",
        "500",
    ]);
    println!("{table}");
    for m in ["mean_ttft_ms", "p99_e2el_ms", "request_throughput", "output_throughput", "error_rate"] {
        assert!(table.contains(m), "{m} missing from\n{table}");
    }
    let cmp = read(&path("cmp.json"));
    let rows = cmp["metrics"].as_array().unwrap();
    assert!(rows.len() >= 19, "{cmp:#}");
    for row in rows {
        let v = row["verdict"].as_str().unwrap();
        assert!(["regression", "improvement", "noise"].contains(&v), "{row}");
        assert!(row["delta_lower"].as_f64().unwrap() <= row["delta_upper"].as_f64().unwrap(), "{row}");
    }
    let err = rows.iter().find(|r| r["metric"] == "error_rate").unwrap();
    assert_eq!(err["verdict"], "noise", "no errors in either run");
}

/// Runs omen and returns its exit status and both outputs.
fn omen_status(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_omen")).args(args).output().expect("run omen");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Single-turn sessions with a reference answer, so every request is scored by BLEU.
const SCORED: &str = "name: scored\nmax_tokens: 8\nignore_eos: true\nconcurrency: 1\nseed: 3\n\
    arrival: { rate: 5 }\nmax_requests: 3\nduration: 60s\nstart: ask\nstates:\n\
    \x20 ask:\n    prompts: [\"Name the capital of France in one word.\"]\n\
    \x20   references: [\"Paris is the capital of France.\"]\n    timeout: 30s\n";

/// A llama-server and a scratch folder holding the SCORED workflow as `scored.yaml`.
struct Fixture {
    server: Server,
    port: u16,
    endpoint: String,
    dir: tempfile::TempDir,
}

impl Fixture {
    fn start() -> Self {
        let (server, port) = start_llama_server();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("scored.yaml"), SCORED).unwrap();
        Fixture { server, port, endpoint: format!("http://127.0.0.1:{port}/v1"), dir }
    }

    /// A file in the scratch folder.
    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_owned()
    }

    /// `omen SUBCOMMAND --workflow WORKFLOW --endpoint ... EXTRA...`, WORKFLOW in the folder.
    fn omen(&self, subcommand: &str, workflow: &str, extra: &[&str]) -> (Option<i32>, String, String) {
        let workflow = self.path(workflow);
        let mut args = vec![subcommand, "--workflow", &workflow, "--endpoint", &self.endpoint];
        args.extend_from_slice(extra);
        omen_status(&args)
    }

    fn read(&self, name: &str) -> Value {
        read(Path::new(&self.path(name)))
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn deploy(file: &str) -> String {
    repo().join("deploy").join(file).to_str().unwrap().to_owned()
}

/// `--repeat` pools the kept runs and judges their spread; `--prices` adds the cost (and says
/// that VRAM is unknown without an agent); `--server-metrics` the server's view;
/// `compare --tolerances` gates with exit status 3.
#[test]
fn repeat_cost_and_the_golden_gate_against_a_real_llama_server() {
    let f = Fixture::start();
    let (prices, metrics) = (deploy("bench/prices.yaml"), format!("http://127.0.0.1:{}/metrics", f.port));
    let golden = f.path("golden.json");
    let (code, _, stderr) = f.omen(
        "bench",
        "scored.yaml",
        &[
            "--out",
            &golden,
            "--server-metrics",
            &metrics,
            "--repeat",
            "4",
            "--stable-spread",
            "100",
            "--prices",
            &prices,
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("run 1/4 (not kept)") && stderr.contains("run 4/4 (not kept)"), "{stderr}");
    assert!(stderr.contains("stable") && stderr.contains("VRAM unknown"), "{stderr}");
    let g = f.read("golden.json");
    assert_eq!(g["completed"], 6, "only the kept (middle) runs are reported: {g:#}");
    let repeat = &g["omen"]["repeat"];
    assert_eq!(repeat["runs"], 4);
    assert_eq!(repeat["kept"], serde_json::json!([2, 3]));
    assert_eq!(repeat["stable"], true, "a spread within 10000%: {repeat:#}");
    assert_eq!(repeat["p95_ms"]["p95_e2el_ms"].as_array().unwrap().len(), 2);
    assert!(g["p95_e2el_ms"].as_f64().unwrap() > 0.0);
    let bleu = g["mean_bleu"].as_f64().unwrap();
    assert!((0.0..=100.0).contains(&bleu) && g["scored_requests"] == 6, "{g:#}");
    let cost = &g["omen"]["cost"];
    // 8 output tokens per request at 0.06 per million plus the prompt at 0.02 per million.
    let per_request = cost["mean_cost_per_request"].as_f64().unwrap();
    let input = g["total_input_tokens"].as_f64().unwrap() / 6.0;
    assert!((per_request - (input * 0.02 + 8.0 * 0.06) / 1e6).abs() < 1e-15, "{cost:#}");
    assert_eq!(cost["vram"]["status"], "unavailable");
    assert!(cost["output_tokens_per_unit_cost"].as_f64().unwrap() > 0.0);
    // The breakdown: the client's view always; llama.cpp's counters give the server's two
    // speeds over the kept runs, and its lack of phase histograms is said.
    let split = &g["omen"]["latency_breakdown"];
    assert!(split["client"]["prefill_tokens_per_s"].as_f64().unwrap() > 0.0, "{split:#}");
    assert!(split["client"]["decode_tokens_per_s"].as_f64().unwrap() > 0.0, "{split:#}");
    let server = &split["server"];
    assert_eq!(server["kind"], "llamacpp", "{split:#}");
    assert!(server["prefill_tokens_per_s"].as_f64().unwrap() > 0.0, "{split:#}");
    assert!(server["decode_tokens_per_s"].as_f64().unwrap() > 0.0, "{split:#}");
    assert!(server["missing"][0].as_str().unwrap().contains("no per-request phase histograms"));
    assert!(split["ttft_split_ms"].is_null());
    // The drift view needs 30+ requests; six are too few, and it says so.
    assert_eq!(g["omen"]["p99_drift"]["verdict"], "too_short");
    let svg = std::fs::read_to_string(f.path("golden.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("TTFT of a request"), "the picture beside the report");

    // A model the price table lacks is refused before any load.
    let (code, _, stderr) = f.omen(
        "bench",
        "scored.yaml",
        &["--out", &f.path("x.json"), "--model", "gpt-9", "--prices", &prices],
    );
    assert_eq!(code, Some(1));
    assert!(stderr.contains("no price for model \"gpt-9\"") && stderr.contains("models.gpt-9"), "{stderr}");
    assert!(!Path::new(&f.path("x.json")).exists());

    // The gate: the golden report against itself passes; a candidate 50% slower at P95 and
    // with 20% less throughput fails with exit status 3 and names both metrics.
    let tol = deploy("bench/tolerances.yaml");
    let gate = |candidate: &str, extra: &[&str]| {
        let mut args = vec!["compare", &golden, candidate, "--tolerances", &tol, "--resamples", "200"];
        args.extend_from_slice(extra);
        omen_status(&args)
    };
    let (code, table, stderr) = gate(&golden, &[]);
    assert_eq!(code, Some(0), "{table}{stderr}");
    assert!(table.contains("gate: pass"), "{table}");
    let mut worse = g.clone();
    worse["p95_e2el_ms"] = (g["p95_e2el_ms"].as_f64().unwrap() * 1.5).into();
    worse["request_throughput"] = (g["request_throughput"].as_f64().unwrap() * 0.8).into();
    std::fs::write(f.path("worse.json"), worse.to_string()).unwrap();
    let (code, table, stderr) = gate(&f.path("worse.json"), &["--json", &f.path("gate.json")]);
    assert_eq!(code, Some(3), "{table}{stderr}");
    assert!(table.contains("gate: FAILED on p95_e2el_ms, request_throughput"), "{table}");
    assert_eq!(f.read("gate.json")["gate"]["passed"], false);
    // A table naming a metric the reports lack is an error (status 1), not a pass.
    std::fs::write(f.path("bad.yaml"), "metrics:\n  p95_ttft_s: { increase: 1, risk: high }\n").unwrap();
    let (code, _, stderr) = omen_status(&["compare", &golden, &golden, "--tolerances", &f.path("bad.yaml")]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("no numeric `p95_ttft_s`"), "{stderr}");
}

/// `omen capacity` climbs the rate against the real server and writes the curve and its picture.
#[test]
fn capacity_search_against_a_real_llama_server() {
    let f = Fixture::start();
    let out = f.path("cap.json");
    let (code, _, stderr) = f.omen(
        "capacity",
        "scored.yaml",
        &[
            "--out",
            &out,
            "--p99-ttft",
            "10s",
            "--p99-e2el",
            "15s",
            "--start-rate",
            "0.5",
            "--max-rate",
            "4",
            "--resolution",
            "1",
            "--warmup",
            "1s",
            "--steady",
            "4s",
        ],
    );
    eprintln!("{stderr}");
    assert_eq!(code, Some(0), "{stderr}");
    let r = f.read("cap.json");
    let points = r["points"].as_array().unwrap();
    let rates: Vec<f64> = points.iter().map(|p| p["rate"].as_f64().unwrap()).collect();
    for p in points {
        assert!(p["requests"].as_u64().unwrap() > 0, "{p}");
        assert_eq!(p["pass"].as_bool().unwrap(), p["broken"].as_array().unwrap().is_empty(), "{p}");
    }
    // Bounds this loose hold at half a session per second even on a busy 2-core machine; the
    // search climbs by doubling (no bisection at resolution 1) to a failing rate or to --max-rate.
    let best = r["max_sustained"]["rate"].as_f64().unwrap_or_else(|| panic!("{r:#}"));
    assert!(r["verdict"].as_str().unwrap().starts_with("sustains"), "{r:#}");
    assert_eq!(rates, [0.5, 1.0, 2.0, 4.0][..rates.len()], "{r:#}");
    match r["first_failing"]["rate"].as_f64() {
        Some(fail) => assert!(best < fail && rates.last() == Some(&fail), "{r:#}"),
        None => assert!(r["capped_at_max_rate"] == true && best == 4.0, "{r:#}"),
    }
    let at_best = points.iter().find(|p| p["rate"] == best).unwrap();
    assert!(
        at_best["request_throughput"].as_f64().unwrap() > 0.0
            && at_best["mean_concurrency"].as_f64().unwrap() > 0.0
    );
    let svg = std::fs::read_to_string(f.path("cap.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("P99 E2EL bound"), "{}", &svg[..200.min(svg.len())]);
    assert!(stderr.contains("step 1: 0.500 sessions/s"), "{stderr}");
}

/// `omen pareto` sweeps two answer lengths and keeps the undominated ones.
#[test]
fn pareto_sweep_against_a_real_llama_server() {
    let f = Fixture::start();
    let prices = deploy("bench/prices.yaml");
    let out = f.path("pareto.json");
    let (code, table, stderr) = f.omen(
        "pareto",
        "scored.yaml",
        &[
            "--sweep",
            "max_tokens=2,12",
            "--sweep",
            "extra_body.top_k=1",
            "--prices",
            &prices,
            "--max-requests",
            "2",
            "--out",
            &out,
        ],
    );
    assert_eq!(code, Some(0), "{table}{stderr}");
    assert!(stderr.contains("point 2/2: max_tokens=12 top_k=1"), "{stderr}");
    let r = f.read("pareto.json");
    assert_eq!(r["objective"], "cost");
    let points = r["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    for p in points {
        assert_eq!(p["completed"], 2, "{p}");
        assert!(p["objective"].as_f64().unwrap() > 0.0 && p["quality"].as_f64().is_some(), "{p}");
    }
    // Two output tokens cost less than twelve.
    let short = points.iter().find(|p| p["settings"][0][1] == "2").unwrap();
    let long = points.iter().find(|p| p["settings"][0][1] == "12").unwrap();
    assert!(short["objective"].as_f64() < long["objective"].as_f64(), "{r:#}");
    // On the front exactly when no other point is as cheap and as good, and better in one.
    let (o, q) = (|p: &Value| p["objective"].as_f64().unwrap(), |p: &Value| p["quality"].as_f64().unwrap());
    for p in points {
        let dominated = points.iter().any(|x| o(x) <= o(p) && q(x) >= q(p) && (o(x) < o(p) || q(x) > q(p)));
        assert_eq!(p["on_front"], !dominated, "{r:#}");
    }
    assert!(table.lines().nth(1).unwrap().ends_with('*'), "the front comes first: {table}");
    let svg = std::fs::read_to_string(f.path("pareto.svg")).unwrap();
    assert!(svg.contains("Pareto front") && svg.contains("max_tokens=12 top_k=1"));
    // A workflow without references cannot be scored, and says how to fix it.
    let plain = SCORED.replace("    references: [\"Paris is the capital of France.\"]\n", "");
    std::fs::write(f.path("plain.yaml"), plain).unwrap();
    let (code, _, stderr) = f.omen("pareto", "plain.yaml", &["--sweep", "max_tokens=2"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("gives no `references`"), "{stderr}");
}

/// The shipped example hook and a built-in report their metrics over the kept run only; a
/// hook that never answers is switched off and reported, and the run completes every request.
#[test]
fn extension_hooks_against_a_real_llama_server() {
    let f = Fixture::start();
    let example = format!("python3 {}", deploy("bench/hooks/answer_words.py"));
    let out = f.path("hooked.json");
    let (code, _, stderr) = f.omen(
        "bench",
        "scored.yaml",
        &[
            "--out",
            &out,
            "--repeat",
            "3",
            "--hook",
            &example,
            "--hook",
            "builtin:chunk_stats",
            "--hook",
            "sleep 60",
            "--hook-timeout",
            "2s",
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let r = f.read("hooked.json");
    assert_eq!((r["completed"].as_u64(), r["failed"].as_u64()), (Some(3), Some(0)), "{r:#}");
    let hooks = r["omen"]["hooks"].as_array().unwrap();
    let by_name =
        |n: &str| hooks.iter().find(|h| h["name"] == n).unwrap_or_else(|| panic!("no hook {n}: {hooks:#?}"));
    let words = by_name("answer_words");
    assert_eq!(words["disabled"], false, "{words:#}");
    assert_eq!(words["calls"]["before_request"], 3, "the kept run's 3 requests, not all 9: {words:#}");
    assert_eq!(words["metrics"]["answers"], 3, "{words:#}");
    assert!(words["metrics"]["mean_words_per_answer"].as_f64().unwrap() > 0.0, "{words:#}");
    let chunks = by_name("chunk_stats");
    assert!(chunks["metrics"]["chunks"].as_u64().unwrap() >= 3, "{chunks:#}");
    let silent = by_name("sleep");
    assert_eq!(silent["disabled"], true, "{silent:#}");
    assert!(silent["error"].as_str().unwrap().contains("no answer within 2s"), "{silent:#}");
    assert_eq!(silent["calls"]["before_request"], 1, "switched off after its first silence");
    assert!(stderr.contains("hook sleep: FAILED and switched off"), "{stderr}");
    // An unknown built-in is refused before any load.
    let (code, _, stderr) = f.omen("bench", "scored.yaml", &["--hook", "builtin:nope"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("builtin:nope"), "{stderr}");
}

/// A server that stalls (SIGSTOP) is counted, not waited for: every request fails by its
/// state's timeout, the failures are reported by kind, and the run ends on time.
#[test]
fn a_stalled_server_is_counted_and_the_run_ends_on_time() {
    let f = Fixture::start();
    std::fs::write(f.path("stall.yaml"), SCORED.replace("timeout: 30s", "timeout: 2s")).unwrap();
    let signal = |sig: &str| {
        let ok = Command::new("kill").args([sig, &f.server.pid().to_string()]).status().unwrap().success();
        assert!(ok, "kill {sig}");
    };
    signal("-STOP");
    let started = Instant::now();
    let out = f.path("stall.json");
    let (code, _, stderr) = f.omen("bench", "stall.yaml", &["--model", "smollm2-135m", "--out", &out]);
    let took = started.elapsed();
    signal("-CONT");
    assert_eq!(code, Some(0), "failed requests are results, not a crash: {stderr}");
    let r = f.read("stall.json");
    assert_eq!((r["completed"].as_u64(), r["failed"].as_u64()), (Some(0), Some(3)), "{r:#}");
    assert_eq!(r["omen"]["errors_by_kind"]["timeout"], 3, "{:#}", r["omen"]);
    // Three sessions of one request each, concurrency 1: at most 3 x 2 s of timeouts plus start-up.
    assert!(took < Duration::from_secs(20), "the run took {took:?}");
}
