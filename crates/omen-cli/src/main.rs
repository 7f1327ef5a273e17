//! `omen`: the sidecar agent. `omen run --config omen.yaml` is the daemon;
//! `omen check-config` validates a config; `omen replay TRACE` runs the same
//! pipeline offline and writes a report; `omen bench` load-tests an endpoint,
//! `omen compare` compares two bench reports, `omen simulate` writes a labelled
//! scenario trace and `omen evaluate-warnings` scores the warnings on a set of them;
//! `omen train` / `omen evaluate` fit and judge the LSTM autoencoder in the model worker.
//!
//! The daemon is omen-agent; `replay`, `simulate` and `evaluate-warnings` come from
//! omen-lab (feature `lab`), `bench` and `compare` from omen-bench (feature `bench`). The
//! sidecar image builds without those two features, so it links neither.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use omen_agent::config::Config;

#[derive(Parser)]
#[command(
    name = "omen",
    version,
    about = "Early warning for LLM serving degradation",
    after_help = "Examples:\n  \
        omen run --config deploy/omen.local.yaml       the agent on the demo trace (what `make run` does)\n  \
        omen check-config --print omen.yaml            validate a config and show it with every default\n  \
        curl -s '127.0.0.1:9464/scores/latest'         the health level, its reasons and the forecasts\n\n\
        Every key of omen.yaml: deploy/omen.example.yaml. Each command's help has an example."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: sources -> pipeline -> store, HTTP API and exporters.
    #[command(after_help = "Example: omen run --config deploy/omen.local.yaml\n\
        (the demo trace replayed into .omen/omen.db; then curl 127.0.0.1:9464/scores/latest)")]
    Run {
        /// Config file (YAML).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate a config file and report every problem by field path.
    #[command(after_help = "Example: omen check-config --print deploy/omen.local.yaml\n\
        (exit code 2 and one line per problem when the file is not valid)")]
    CheckConfig {
        /// Config file (YAML).
        config: PathBuf,
        /// Also print the effective config: the file with every default filled in (secrets redacted).
        #[arg(long)]
        print: bool,
    },
    #[cfg(feature = "lab")]
    /// Replay a JSONL trace through the pipeline offline and write report.json and report.svg.
    #[command(after_help = "Example: omen replay deploy/traces/demo-degradation.jsonl.gz --out omen-replay")]
    Replay {
        /// JSONL trace (plain or .gz).
        trace: PathBuf,
        /// Output folder (created).
        #[arg(long, short, default_value = "omen-replay")]
        out: PathBuf,
        /// Optional config (signal, health and forecast settings).
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    #[cfg(feature = "bench")]
    /// Load-test an OpenAI-compatible endpoint with a dialogue workflow and write a JSON report.
    #[command(after_help = "Example: omen bench --workflow deploy/workflows/chat.yaml \
        --endpoint http://127.0.0.1:8000/v1 --max-requests 200 --out a.json")]
    Bench {
        /// Workflow file (YAML), e.g. deploy/workflows/chat.yaml.
        #[arg(long, short)]
        workflow: PathBuf,
        /// API root including /v1, e.g. http://127.0.0.1:18080/v1.
        #[arg(long, short)]
        endpoint: String,
        /// Report file (JSON).
        #[arg(long, short, default_value = "bench.json")]
        out: PathBuf,
        /// Model name (overrides the workflow's; default: the first the endpoint lists).
        #[arg(long)]
        model: Option<String>,
        /// Bearer token; default from $OMEN_BENCH_API_KEY.
        #[arg(long, env = "OMEN_BENCH_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        /// Stop after this many requests (overrides the workflow's max_requests).
        #[arg(long)]
        max_requests: Option<u64>,
        /// Stop starting requests after this long, e.g. 60s (overrides the workflow's duration).
        #[arg(long, value_parser = humantime::parse_duration)]
        duration: Option<std::time::Duration>,
        /// No progress bar (it is only drawn when stderr is a terminal anyway).
        #[arg(long)]
        no_progress: bool,
        /// Run the workload N times; with N >= 3 the first and last runs are dropped, the
        /// report pools the rest and says whether their P95 latencies agree.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        repeat: u32,
        /// Largest (max - min) / median of the kept runs' P95s that counts as stable.
        #[arg(long, default_value_t = omen_bench::trust::DEFAULT_STABLE_SPREAD)]
        stable_spread: f64,
        /// Exit with status 4 when the repeated runs are not stable.
        #[arg(long)]
        require_stable: bool,
        /// Price table (YAML, e.g. deploy/bench/prices.yaml): adds the run's cost to the report.
        #[arg(long)]
        prices: Option<PathBuf>,
        /// An omen agent beside the server (e.g. http://127.0.0.1:9464): its GPU memory
        /// reading gives output tokens per GB of VRAM in the cost section.
        #[arg(long)]
        omen: Option<String>,
        /// The server's Prometheus page (e.g. http://127.0.0.1:8000/metrics), scraped before
        /// and after the measured runs to split TTFT into queueing and prefill.
        #[arg(long)]
        server_metrics: Option<String>,
        /// An extension hook: a command speaking JSON lines on stdin/stdout (see
        /// deploy/bench/hooks/answer_words.py) or `builtin:chunk_stats`; repeat for more.
        #[arg(long)]
        hook: Vec<String>,
        /// Longest a command hook may take to answer before it is switched off.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        hook_timeout: std::time::Duration,
    },
    #[cfg(feature = "bench")]
    /// Find the highest session rate a server sustains within P99 TTFT and E2EL bounds.
    #[command(after_help = "Example: omen capacity --workflow deploy/workflows/chat.yaml \
        --endpoint http://127.0.0.1:8000/v1 --p99-ttft 2s --p99-e2el 10s --out capacity.json\n\
        Writes the report (JSON) and the rate-vs-P99 picture beside it (capacity.svg).")]
    Capacity {
        /// Workflow file (YAML); its arrival rate, QPS caps, back-off and bounds are replaced per step.
        #[arg(long, short)]
        workflow: PathBuf,
        /// API root including /v1, e.g. http://127.0.0.1:18080/v1.
        #[arg(long, short)]
        endpoint: String,
        #[command(flatten)]
        search: omen_bench::capacity::CapacityOptions,
        /// Model name (default: the workflow's, else the first the endpoint lists).
        #[arg(long)]
        model: Option<String>,
        /// Bearer token; default from $OMEN_BENCH_API_KEY.
        #[arg(long, env = "OMEN_BENCH_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        /// Report file (JSON); the picture goes beside it with the extension .svg.
        #[arg(long, short, default_value = "capacity.json")]
        out: PathBuf,
    },
    #[cfg(feature = "bench")]
    /// Sweep workflow knobs and report the Pareto front of cost (or latency) against answer quality.
    #[command(after_help = "Example: omen pareto --workflow w.yaml --endpoint http://127.0.0.1:8000/v1 \
        --sweep max_tokens=8,16,32 --sweep temperature=0,0.7 --prices deploy/bench/prices.yaml --out pareto.json\n\
        The workflow's states need `references` (answer quality is BLEU against them). Writes the \
        report (JSON) and the front beside it (pareto.svg).")]
    Pareto {
        /// Workflow file (YAML) with `references`.
        #[arg(long, short)]
        workflow: PathBuf,
        /// API root including /v1.
        #[arg(long, short)]
        endpoint: String,
        /// A knob and its values: NAME=V1,V2 (concurrency, max_tokens, temperature,
        /// ignore_eos, or extra_body.FIELD for any request field); repeat for a grid.
        #[arg(long, required = true)]
        sweep: Vec<omen_bench::pareto::Knob>,
        /// Price table: the objective is the mean cost per request (else the P95 E2EL).
        #[arg(long)]
        prices: Option<PathBuf>,
        /// Requests per point (overrides the workflow's max_requests).
        #[arg(long)]
        max_requests: Option<u64>,
        /// A point with a larger share of failed requests is kept off the front.
        #[arg(long, default_value_t = 0.05)]
        max_error_rate: f64,
        /// Model name (default: the workflow's, else the first the endpoint lists).
        #[arg(long)]
        model: Option<String>,
        /// Bearer token; default from $OMEN_BENCH_API_KEY.
        #[arg(long, env = "OMEN_BENCH_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        /// Report file (JSON); the picture goes beside it with the extension .svg.
        #[arg(long, short, default_value = "pareto.json")]
        out: PathBuf,
    },
    #[cfg(feature = "bench")]
    /// Compare two bench reports: Delta-Metric, bootstrap interval and verdict per metric.
    #[command(after_help = "Example: omen compare a.json b.json --min-effect 0.05 --json delta.json\n\
        Gate a release: omen compare golden.json candidate.json --tolerances deploy/bench/tolerances.yaml\n\
        exits 0 when every metric is within its tolerance, 3 when one breaches at the table's fail_on risk or above.")]
    Compare {
        /// Baseline report.
        a: PathBuf,
        /// Candidate report.
        b: PathBuf,
        /// Also write the comparison as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Confidence level of the intervals.
        #[arg(long, default_value_t = 0.95)]
        confidence: f64,
        /// Bootstrap resamples.
        #[arg(long, default_value_t = 2000)]
        resamples: usize,
        /// Bootstrap seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Smallest relative change that counts (e.g. 0.05 for 5%); smaller ones are noise.
        #[arg(long, default_value_t = 0.0)]
        min_effect: f64,
        /// Tolerance table (YAML, e.g. deploy/bench/tolerances.yaml): A is the golden
        /// baseline, B the candidate; exit status 3 when a metric breaches it.
        #[arg(long)]
        tolerances: Option<PathBuf>,
    },
    #[cfg(feature = "lab")]
    /// Simulate a degradation scenario: write DIR/trace.jsonl.gz and DIR/labels.json.
    #[command(after_help = "Example: omen simulate deploy/scenarios/vram-leak.yaml --out vram-leak")]
    Simulate {
        /// Scenario file (YAML, see deploy/scenarios/).
        scenario: PathBuf,
        /// Output folder (created).
        #[arg(long, short, default_value = "omen-simulate")]
        out: PathBuf,
    },
    /// Train the LSTM autoencoder on normal data (CSV, JSONL trace or store) and write the model file.
    #[command(after_help = "Example: omen train --data deploy/traces/demo-healthy.jsonl.gz --step 10m \
        --features raw,diff --out model.ot")]
    Train(omen_protocol::training::TrainArgs),
    /// Score data with a model: window-based precision, recall, F1 and the NAB score against labels.
    #[command(after_help = "Example: omen evaluate --model model.ot --data omen-simulate/trace.jsonl.gz \
        --step 10m --labels omen-simulate/labels.json")]
    Evaluate(omen_protocol::training::EvaluateArgs),
    /// The LSTM autoencoder on SKAB by the leaderboard's protocol (fit per file on the first 400 rows), scored by SKAB's scorer, full and pruned.
    #[command(after_help = "Example: omen evaluate-skab --json skab-lstm-ae.json")]
    EvaluateSkab(omen_protocol::training::SkabArgs),
    #[cfg(feature = "lab")]
    /// Stress a model with perturbed prompts and report each prompt's stability boundary.
    #[command(
        after_help = "Example: omen stress --endpoint http://127.0.0.1:18080/v1 --prompt capital=\"What is the capital of France? Answer in one sentence.\" --adaptive --svg stress.svg"
    )]
    Stress {
        /// API root including /v1.
        #[arg(long)]
        endpoint: String,
        /// Model name (default: the first the endpoint lists).
        #[arg(long)]
        model: Option<String>,
        /// A prompt as ID=TEXT (repeatable); or take the canary prompts of --config.
        #[arg(long = "prompt")]
        prompts: Vec<String>,
        /// An agent config whose sources.canary.prompts are stressed.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Most output tokens per answer.
        #[arg(long, default_value_t = 32)]
        max_tokens: u32,
        /// Strengths of the sweep, each in (0, 1].
        #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,0.75,1")]
        strengths: Vec<f64>,
        /// Raise the strength step by step until a bound is crossed (entropy-driven annealing).
        #[arg(long)]
        adaptive: bool,
        /// Adaptive step.
        #[arg(long, default_value_t = 0.1)]
        step: f64,
        /// Bound on the first-token entropy change, bits.
        #[arg(long, default_value_t = 1.0)]
        max_entropy_shift: f64,
        /// Bound on the BLEU drop against the unperturbed answer.
        #[arg(long, default_value_t = 0.5)]
        max_bleu_drop: f64,
        /// Perturbation seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// JSON report.
        #[arg(long, short, default_value = "stress.json")]
        out: PathBuf,
        /// Also draw the boundaries (SVG) here.
        #[arg(long)]
        svg: Option<PathBuf>,
        /// all-MiniLM-L6-v2 folder (`make setup`: .models/all-MiniLM-L6-v2): also BERTScore F1 against the unperturbed answer, computed by omen-worker.
        #[arg(long)]
        bertscore_model_dir: Option<PathBuf>,
        /// Push each prompt's boundary to this agent (its API root, e.g. http://127.0.0.1:9464) as canary_stability_boundary.
        #[arg(long)]
        push: Option<String>,
    },
    #[cfg(feature = "lab")]
    /// Explain a latency change from a store's history: fit L = c + a/T + b*F + g*(1-Q) and split the change by term.
    #[command(
        after_help = "Example: omen explain --store .omen/omen.db --since now-6h --until now --svg explain.svg"
    )]
    Explain {
        /// The agent's store (store.path).
        #[arg(long)]
        store: PathBuf,
        /// Window start: RFC 3339, Unix seconds, now or now-6h (now = the store's newest sample).
        #[arg(long, default_value = "now-24h")]
        since: String,
        /// Window end, same forms.
        #[arg(long, default_value = "now")]
        until: String,
        /// Where "before" ends and "after" begins (default: the window's middle).
        #[arg(long)]
        split: Option<String>,
        /// Confidence level of the coefficients' intervals.
        #[arg(long, default_value_t = 0.95)]
        confidence: f64,
        /// Least R2 for an attribution.
        #[arg(long, default_value_t = 0.5)]
        min_r_squared: f64,
        /// Also write the result as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Also draw the attribution as a bar chart (SVG) here.
        #[arg(long)]
        svg: Option<PathBuf>,
    },
    #[cfg(feature = "lab")]
    /// Simulate every scenario in a folder, replay each through the pipeline and score the warnings.
    #[command(
        after_help = "Example: omen evaluate-warnings --scenarios deploy/scenarios --seeds 3 --out warnings.json"
    )]
    EvaluateWarnings {
        /// Folder of scenario files (*.yaml).
        #[arg(long)]
        scenarios: PathBuf,
        /// JSON report path.
        #[arg(long, short, default_value = "evaluate-warnings.json")]
        out: PathBuf,
        /// Folder for the simulated traces and stores (default: a folder next to the report).
        #[arg(long)]
        work: Option<PathBuf>,
        /// Optional config (signal, health and forecast settings).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Runs per scenario: its own seed, then seed + 1, ... (lead times are then medians over seeds).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
        seeds: u64,
        /// Replays run at once (default: the number of CPUs).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=256))]
        jobs: Option<u64>,
        /// Also score Prometheus' predict_linear(daily indicator[7d], 14 * 86400) alert on each
        /// trace, computed by the real Prometheus (needs prometheus and promtool on PATH).
        #[arg(long)]
        baseline: bool,
    },
    #[cfg(feature = "lab")]
    /// Score omen's detectors and the published ones on NAB with NAB's own scoring, per
    /// profile and category, and omen's tunable detector leave-one-category-out.
    #[command(after_help = "Example: omen evaluate-detectors --nab data/nab --json detectors.json\n\
        (about 20 s on 2 cores in a release build; the Markdown tables go to stdout)")]
    EvaluateDetectors {
        /// A NAB checkout (data/, labels/, config/, results/; plain or gzipped CSVs).
        #[arg(long, default_value = "data/nab")]
        nab: PathBuf,
        /// A SKAB copy (data/<folder>/<n>.csv, published/<algorithm>/...; plain or gzipped).
        #[arg(long, default_value = "data/skab")]
        skab: PathBuf,
        /// Published detectors to re-score from results/ (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "ARTime,numenta,contextOSE,null")]
        published: Vec<String>,
        /// Also write the results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Also fit omen's LSTM autoencoder per SKAB file (the model worker, about a minute) and rank it in the SKAB table.
        #[arg(long)]
        lstm_ae: bool,
        /// The SKAB table only (skips NAB's minutes).
        #[arg(long)]
        skab_only: bool,
        /// No progress bar (it is only drawn when stderr is a terminal anyway).
        #[arg(long)]
        no_progress: bool,
    },
    #[cfg(feature = "lab")]
    /// Fill a new store with weeks of a large node's KV-cache history in accelerated time,
    /// through the agent's pipeline, and report its size and tick times.
    #[command(
        after_help = "Example: omen fill-history --days 30 --gpus 8 --layers 80 --store /tmp/omen-30d.db"
    )]
    FillHistory {
        /// The new store file (must not exist).
        #[arg(long)]
        store: PathBuf,
        /// Days of history, ending now.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=400))]
        days: u32,
        /// GPUs on the node.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
        gpus: u32,
        /// Layers per GPU.
        #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u32).range(1..=1024))]
        layers: u32,
        /// Time between two samples of a series (default: the config's store.raw_min_interval).
        #[arg(long, value_parser = humantime::parse_duration)]
        period: Option<std::time::Duration>,
        /// Optional config (store retention, health interval, signal settings).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// JSON report path.
        #[arg(long, short, default_value = "fill-history.json")]
        out: PathBuf,
    },
}

/// The async runtime of the subcommands that need one (`run`, `bench`, `stress`).
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")
}

fn load_config(path: &std::path::Path) -> Result<Config> {
    Config::load(path).map_err(|problems| {
        let list: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
        anyhow::anyhow!("{} has {} problem(s):\n{}", path.display(), problems.len(), list.join("\n"))
    })
}

/// How often a bench runs its workload, how the repeats are judged, and what it costs.
#[cfg(feature = "bench")]
struct BenchExtras {
    runs: u32,
    stable_spread: f64,
    require_stable: bool,
    prices: Option<PathBuf>,
    omen: Option<String>,
    server_metrics: Option<String>,
}

/// Exit status of `omen bench --require-stable` when the repeated runs disagree.
#[cfg(feature = "bench")]
const EXIT_UNSTABLE: u8 = 4;
/// Exit status of `omen compare --tolerances` when a metric breaches the gate.
#[cfg(feature = "bench")]
const EXIT_GATE_FAILED: u8 = 3;

/// Writes `report` as pretty JSON to `out` and `svg` beside it (same name, `.svg`; skipped
/// when empty); returns the picture's path.
#[cfg(feature = "bench")]
fn write_report(out: &std::path::Path, report: &serde_json::Value, svg: &str) -> Result<PathBuf> {
    let text = serde_json::to_string_pretty(report).context("cannot serialise the report")?;
    std::fs::write(out, text + "\n")
        .with_context(|| format!("cannot write the report to {}", out.display()))?;
    let svg_path = out.with_extension("svg");
    if !svg.is_empty() {
        std::fs::write(&svg_path, svg).with_context(|| format!("cannot write {}", svg_path.display()))?;
    }
    Ok(svg_path)
}

/// Runs a bench; Ok(false) when `--require-stable` was given and the runs were not stable.
#[cfg(feature = "bench")]
fn bench(
    workflow: &std::path::Path,
    opts: &omen_bench::loadgen::BenchOptions,
    extras: &BenchExtras,
    out: &std::path::Path,
) -> Result<bool> {
    use omen_bench::{cost, loadgen, suite};
    let wf = loadgen::workflow::Workflow::load(workflow)?;
    let prices = match &extras.prices {
        Some(p) => Some((p.display().to_string(), cost::PriceTable::load(p)?)),
        None => None,
    };
    let options = suite::SuiteOptions {
        repeat: extras.runs,
        stable_spread: extras.stable_spread,
        require_stable: extras.require_stable,
        prices,
        omen: extras.omen.clone(),
        server_metrics: extras.server_metrics.clone(),
    };
    options.validate()?;
    let rt = runtime()?;
    let result = rt.block_on(suite::run(&wf, opts, &options, |line| eprintln!("{line}")))?;
    let svg_path = write_report(out, &result.report, &result.svg)?;
    eprintln!(
        "{}\nreport: {}, picture: {}",
        loadgen::report::summary(&result.report),
        out.display(),
        svg_path.display()
    );
    Ok(result.stable != Some(false) || !extras.require_stable)
}

#[cfg(feature = "bench")]
fn pareto(
    workflow: &std::path::Path,
    bench: &omen_bench::loadgen::BenchOptions,
    knobs: &[omen_bench::pareto::Knob],
    prices: Option<&std::path::Path>,
    max_error_rate: f64,
    out: &std::path::Path,
) -> Result<()> {
    use omen_bench::{cost, pareto};
    let wf = omen_bench::loadgen::workflow::Workflow::load(workflow)?;
    let prices = match prices {
        Some(p) => Some((p.display().to_string(), cost::PriceTable::load(p)?)),
        None => None,
    };
    let rt = runtime()?;
    let points: usize = knobs.iter().map(|k| k.values.len()).product();
    eprintln!("pareto: {points} points, one bench run each");
    let report =
        rt.block_on(pareto::sweep(&wf, bench, knobs, prices, max_error_rate, |line| eprintln!("{line}")))?;
    print!("{}", report.table());
    let json = serde_json::to_value(&report).context("cannot serialise the report")?;
    let svg_path = write_report(out, &json, &report.svg()?)?;
    eprintln!("report: {}, picture: {}", out.display(), svg_path.display());
    Ok(())
}

#[cfg(feature = "bench")]
fn capacity(
    workflow: &std::path::Path,
    bench: &omen_bench::loadgen::BenchOptions,
    opts: &omen_bench::capacity::CapacityOptions,
    out: &std::path::Path,
) -> Result<()> {
    use omen_bench::capacity;
    let wf = omen_bench::loadgen::workflow::Workflow::load(workflow)?;
    opts.validate()?;
    let rt = runtime()?;
    let per_step = opts.warmup + opts.steady;
    eprintln!(
        "capacity: steps of {} ({} warm-up + {} steady) from {} sessions/s, doubling until a bound breaks, then bisecting",
        humantime::format_duration(per_step),
        humantime::format_duration(opts.warmup),
        humantime::format_duration(opts.steady),
        opts.start_rate
    );
    let report = rt.block_on(capacity::search(&wf, bench, opts, |i, p| {
        eprintln!(
            "step {i}: {:.3} sessions/s -> {:.2} req/s, P99 TTFT {:.0} ms, P99 E2EL {:.0} ms, errors {:.1}%: {}",
            p.rate,
            p.request_throughput,
            p.p99_ttft_ms,
            p.p99_e2el_ms,
            p.error_rate * 100.0,
            if p.pass { "pass".to_owned() } else { format!("FAIL ({})", p.broken.join(", ")) }
        );
        for (kind, e) in &p.errors {
            eprintln!("  {} x {kind}, e.g. {}", e.count, e.example);
        }
    }))?;
    let json = serde_json::to_value(&report).context("cannot serialise the report")?;
    let svg_path = write_report(out, &json, &report.svg()?)?;
    eprintln!("{}\nreport: {}, picture: {}", report.verdict, out.display(), svg_path.display());
    Ok(())
}

/// Compares two reports; Ok(false) when a tolerance table was given and the gate failed.
#[cfg(feature = "bench")]
fn compare(
    a: &std::path::Path,
    b: &std::path::Path,
    json: Option<&std::path::Path>,
    tolerances: Option<&std::path::Path>,
    opts: omen_bench::compare::CompareOptions,
) -> Result<bool> {
    use omen_bench::{compare, trust};
    // A bad table fails before any work.
    let table = tolerances.map(trust::Tolerances::load).transpose()?;
    let (la, lb) = (compare::load(a)?, compare::load(b)?);
    let metrics = compare::compare(&la, &lb, opts)?;
    print!("{}", compare::table(&metrics, opts.confidence));
    let gate = match &table {
        Some(table) => {
            let read = |p: &std::path::Path| -> Result<serde_json::Value> {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("cannot read bench report {}; check the path", p.display()))?;
                serde_json::from_str(&text).with_context(|| {
                    format!("{} is not JSON; produce it with `omen bench --out {}`", p.display(), p.display())
                })
            };
            let (ga, gb) = (read(a)?, read(b)?);
            let (an, bn) = (a.display().to_string(), b.display().to_string());
            let rows = trust::gate((&an, &ga), (&bn, &gb), table)?;
            print!("\ngate against the golden baseline {an}:\n{}", trust::gate_table(&rows));
            let failed: Vec<&str> = rows.iter().filter(|r| r.fails_gate).map(|r| r.metric.as_str()).collect();
            if failed.is_empty() {
                println!("gate: pass");
            } else {
                println!("gate: FAILED on {}", failed.join(", "));
            }
            Some(rows)
        }
        None => None,
    };
    let passed = gate.as_ref().is_none_or(|rows| rows.iter().all(|r| !r.fails_gate));
    if let Some(path) = json {
        let c = compare::Comparison {
            a: a.display().to_string(),
            b: b.display().to_string(),
            confidence: opts.confidence,
            resamples: opts.resamples,
            min_effect: opts.min_effect,
            metrics,
        };
        let mut value = serde_json::to_value(&c).context("cannot serialise the comparison")?;
        if let Some(rows) = &gate {
            value["gate"] = serde_json::json!({"passed": passed, "metrics": rows});
        }
        let text = serde_json::to_string_pretty(&value).context("cannot serialise the comparison")?;
        std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(passed)
}

#[cfg(feature = "lab")]
fn simulate(scenario: &std::path::Path, out: &std::path::Path) -> Result<()> {
    let scenario = omen_lab::simulate::Scenario::load(scenario)?;
    let labels = omen_lab::simulate::simulate(&scenario, out)?;
    println!(
        "simulated {} ({:?}): {} samples; onset {}, breach of {} {}; wrote {} and {}",
        labels.scenario,
        labels.fault,
        labels.samples,
        labels.onset.as_deref().unwrap_or("-"),
        labels.slo.as_deref().unwrap_or("-"),
        labels.breach.as_deref().unwrap_or("none in the trace"),
        out.join("trace.jsonl.gz").display(),
        out.join("labels.json").display()
    );
    Ok(())
}

/// The prompts of `omen stress`: `ID=TEXT` flags, else the canary prompts of a config.
#[cfg(feature = "lab")]
fn stress_prompts(flags: Vec<String>, config: Option<&std::path::Path>) -> Result<Vec<(String, String)>> {
    let mut prompts = Vec::new();
    for f in flags {
        let (id, text) = f.split_once('=').with_context(|| {
            format!("--prompt {f:?}: write ID=TEXT, e.g. capital=\"What is the capital of France?\"")
        })?;
        prompts.push((id.trim().to_owned(), text.trim().to_owned()));
    }
    if let Some(path) = config {
        let cfg = load_config(path)?;
        let canary = cfg
            .sources
            .canary
            .with_context(|| format!("{}: no sources.canary section to take prompts from", path.display()))?;
        prompts.extend(canary.prompts.into_iter().map(|c| (c.id, c.prompt)));
    }
    if prompts.is_empty() {
        anyhow::bail!(
            "no prompts: give --prompt ID=TEXT (repeatable) or --config with sources.canary.prompts"
        );
    }
    Ok(prompts)
}

#[cfg(feature = "lab")]
fn stress(
    mut options: omen_lab::stress::StressOptions,
    bertscore_model_dir: Option<PathBuf>,
    out: &std::path::Path,
    svg: Option<&std::path::Path>,
    push: Option<&str>,
) -> Result<()> {
    let rt = runtime()?;
    let report = rt.block_on(async {
        if options.target.model.is_empty() {
            let client = reqwest::Client::new();
            options.target.model =
                omen_bench::loadgen::client::first_model(&client, &options.target.base_url).await?;
        }
        if let Some(dir) = bertscore_model_dir {
            let program = omen_agent::worker::find_program(None).context("--bertscore-model-dir")?;
            let worker = std::sync::Arc::new(omen_agent::worker::Worker::new(
                program,
                std::time::Duration::from_secs(30),
            ));
            options.semantic =
                Some(omen_agent::semantic::load_dir(dir, Some(&worker), "--bertscore-model-dir").await?);
        }
        omen_lab::stress::run(&options, |line| eprintln!("stress: {line}")).await
    })?;
    print!("{}", omen_lab::stress::table(&report));
    std::fs::write(out, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("cannot write the report {}", out.display()))?;
    println!("wrote {}", out.display());
    if let Some(path) = svg {
        omen_lab::stress::plot(&report, path)?;
        println!("wrote {}", path.display());
    }
    if let Some(agent) = push {
        let url = format!("{}/v1/ingest/samples", agent.trim_end_matches('/'));
        let body = omen_lab::stress::boundary_samples(&report);
        rt.block_on(async {
            let r = reqwest::Client::new()
                .post(&url)
                .json(&body)
                .send()
                .await
                .with_context(|| format!("cannot push to {url}; is the agent running there?"))?;
            let status = r.status();
            if !status.is_success() {
                anyhow::bail!("{url} answered {status}: {}", r.text().await.unwrap_or_default());
            }
            Ok(())
        })?;
        println!("pushed {} boundary sample(s) to {url}", report.prompts.len());
    }
    Ok(())
}

#[cfg(feature = "lab")]
fn evaluate_detectors(
    dir: &std::path::Path,
    skab_dir: &std::path::Path,
    published: &[String],
    json: Option<&std::path::Path>,
    tables: omen_lab::detectors::Tables,
    no_progress: bool,
) -> Result<()> {
    use indicatif::{ProgressBar, ProgressStyle};
    use omen_lab::detectors::{self, Detector, NabData};
    use std::io::IsTerminal;
    // Both corpora are read before any scoring: a wrong path fails at once.
    let data = (!tables.skab_only)
        .then(|| {
            NabData::load(dir).with_context(|| {
                format!(
                    "cannot read NAB from {}; pass --nab with a NAB checkout (the repository has data/nab)",
                    dir.display()
                )
            })
        })
        .transpose()?;
    // SKAB first (a second): a wrong --skab fails before the NAB minute.
    let (mut skab, skab_files) = detectors::skab_published(skab_dir).with_context(|| {
        format!(
            "cannot score SKAB from {}; pass --skab with a SKAB copy (the repository has data/skab)",
            skab_dir.display()
        )
    })?;
    if tables.lstm_ae {
        // The model worker fits and scores the files (about a minute).
        if !no_progress && std::io::stderr().is_terminal() {
            eprintln!("SKAB: fitting omen's LSTM autoencoder per file in the model worker ...");
        }
        skab.extend(lstm_ae_skab_rows(skab_dir)?);
        skab.sort_by(|a, b| b.scores.f1.total_cmp(&a.scores.f1));
    }
    let write = |body: serde_json::Value| -> Result<()> {
        if let Some(path) = json {
            let text = serde_json::to_string_pretty(&body).context("cannot serialise the results")?;
            std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))?;
        }
        Ok(())
    };
    let skab_json = serde_json::json!({ "dir": skab_dir, "files": skab_files, "detectors": skab });
    // --skab-only: no NAB was read.
    let Some(data) = data else {
        print!("{}", detectors::skab_table(&skab, skab_files));
        return write(serde_json::json!({ "skab": skab_json }));
    };
    let mut dets: Vec<Detector> = published.iter().map(|p| Detector::Published(p.clone())).collect();
    dets.extend(detectors::omen_detectors());
    let grid = detectors::novelty_surprise_grid();
    let bar = if no_progress || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        ProgressBar::new((dets.len() + grid.len()) as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("{msg:28} [{bar:30}] {pos}/{len} {elapsed}").expect("a valid template"),
    );
    bar.set_message(format!("NAB, {} files: detectors", data.files.len()));
    let scores = detectors::evaluate(&data, &dets, |done, _| bar.set_position(done as u64))?;
    bar.set_message("leave one category out");
    let loco = detectors::leave_one_category_out(&data, &grid, "standard", |done, _| {
        bar.set_position((dets.len() + done) as u64)
    })?;
    bar.finish_and_clear();
    print!("{}", detectors::table(&scores, Some(&loco), data.files.len()));
    print!("{}", detectors::skab_table(&skab, skab_files));
    write(serde_json::json!({
        "nab": dir, "files": data.files.len(), "detectors": scores, "leave_one_category_out": loco,
        "skab": skab_json,
    }))
}

/// omen's LSTM-AE rows (full and pruned) of the SKAB table, from `omen-worker evaluate-skab`.
#[cfg(feature = "lab")]
fn lstm_ae_skab_rows(skab_dir: &std::path::Path) -> Result<Vec<omen_lab::detectors::SkabRow>> {
    let program = omen_agent::worker::find_program(None).context("--lstm-ae runs the model worker")?;
    let json = std::env::temp_dir().join(format!("omen-skab-lstm-ae-{}.json", std::process::id()));
    let out = std::process::Command::new(&program)
        .args(["evaluate-skab", "--no-progress", "--skab"])
        .arg(skab_dir)
        .arg("--json")
        .arg(&json)
        .output()
        .with_context(|| format!("cannot run {}", program.display()))?;
    if !out.status.success() {
        anyhow::bail!(
            "{} evaluate-skab failed ({}): {}",
            program.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = std::fs::read(&json).context("cannot read the worker's SKAB report");
    let _ = std::fs::remove_file(&json);
    let report: serde_json::Value =
        serde_json::from_slice(&text?).context("the worker's SKAB report is not JSON")?;
    let rows = report["rows"].as_array().context("the worker's SKAB report has no rows")?;
    rows.iter()
        .map(|r| {
            Ok(omen_lab::detectors::SkabRow {
                algorithm: r["model"].as_str().context("a SKAB row without its model")?.to_owned(),
                scores: serde_json::from_value(r["scores"].clone()).context("a SKAB row's scores")?,
            })
        })
        .collect()
}

#[cfg(feature = "lab")]
fn explain(
    options: &omen_lab::explain::ExplainOptions,
    json: Option<&std::path::Path>,
    svg: Option<&std::path::Path>,
) -> Result<()> {
    let e = omen_lab::explain::run(options)?;
    print!("{}", omen_lab::explain::table(&e));
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_vec_pretty(&e)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = svg {
        omen_lab::explain::plot(&e, path)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(feature = "lab")]
fn evaluate_warnings(
    cfg: &Config,
    scenarios: &std::path::Path,
    out: &std::path::Path,
    work: Option<PathBuf>,
    options: omen_lab::evaluate_warnings::EvaluateOptions,
) -> Result<()> {
    let work = work.unwrap_or_else(|| out.with_extension("work"));
    let report = omen_lab::evaluate_warnings::evaluate(cfg, scenarios, &work, options)?;
    print!("{}", omen_lab::evaluate_warnings::table(&report));
    std::fs::write(out, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("cannot write the report {}", out.display()))?;
    println!("wrote {} (traces and stores under {})", out.display(), work.display());
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: Result<()> = match cli.command {
        Command::Run { config } => load_config(&config).and_then(|cfg| {
            omen_agent::logging();
            let rt = runtime()?;
            rt.block_on(omen_agent::run::run(cfg))
        }),
        Command::CheckConfig { config, print } => match Config::load(&config) {
            Ok(effective) => {
                if print {
                    print!("{}", effective.to_yaml());
                }
                eprintln!("{}: ok", config.display());
                Ok(())
            }
            Err(problems) => {
                for p in &problems {
                    eprintln!("{}: {p}", config.display());
                }
                return ExitCode::from(2);
            }
        },
        #[cfg(feature = "lab")]
        Command::Replay { trace, out, config } => {
            // What the trace reader put right (late samples, repeats, gaps) goes to stderr.
            omen_agent::logging();
            let cfg = match config {
                Some(path) => load_config(&path),
                None => Ok(Config::default()),
            };
            cfg.and_then(|cfg| omen_lab::replay::replay(cfg, &trace, &out))
        }
        #[cfg(feature = "bench")]
        Command::Bench {
            workflow,
            endpoint,
            out,
            model,
            api_key,
            max_requests,
            duration,
            no_progress,
            repeat,
            stable_spread,
            require_stable,
            prices,
            omen,
            server_metrics,
            hook,
            hook_timeout,
        } => {
            let hooks: Result<Vec<_>> = hook
                .iter()
                .map(|h| {
                    omen_bench::hooks::from_arg(h, hook_timeout)
                        .map(omen_bench::hooks::Guarded::new)
                        .map_err(anyhow::Error::from)
                })
                .collect();
            let hooks = match hooks {
                Ok(h) => h,
                Err(e) => {
                    eprintln!("omen: {e:#}");
                    return ExitCode::FAILURE;
                }
            };
            let opts = omen_bench::loadgen::BenchOptions {
                max_requests,
                duration,
                progress: !no_progress,
                hooks,
                ..omen_bench::loadgen::BenchOptions::new(endpoint, model, api_key)
            };
            let repeat =
                BenchExtras { runs: repeat, stable_spread, require_stable, prices, omen, server_metrics };
            match bench(&workflow, &opts, &repeat, &out) {
                Ok(false) => return ExitCode::from(EXIT_UNSTABLE),
                other => other.map(|_| ()),
            }
        }
        #[cfg(feature = "bench")]
        Command::Capacity { workflow, endpoint, search, model, api_key, out } => {
            let bench = omen_bench::loadgen::BenchOptions::new(endpoint, model, api_key);
            capacity(&workflow, &bench, &search, &out)
        }
        #[cfg(feature = "bench")]
        Command::Pareto {
            workflow,
            endpoint,
            sweep,
            prices,
            max_requests,
            max_error_rate,
            model,
            api_key,
            out,
        } => {
            let bench = omen_bench::loadgen::BenchOptions {
                max_requests,
                ..omen_bench::loadgen::BenchOptions::new(endpoint, model, api_key)
            };
            pareto(&workflow, &bench, &sweep, prices.as_deref(), max_error_rate, &out)
        }
        #[cfg(feature = "bench")]
        Command::Compare { a, b, json, confidence, resamples, seed, min_effect, tolerances } => {
            let opts = omen_bench::compare::CompareOptions { confidence, resamples, seed, min_effect };
            match compare(&a, &b, json.as_deref(), tolerances.as_deref(), opts) {
                Ok(false) => return ExitCode::from(EXIT_GATE_FAILED),
                other => other.map(|_| ()),
            }
        }
        #[cfg(feature = "lab")]
        Command::Simulate { scenario, out } => simulate(&scenario, &out),
        // Parsed here for --help and errors; run by the model worker, which takes the same line.
        Command::Train(_) | Command::Evaluate(_) | Command::EvaluateSkab(_) => {
            let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
            match omen_agent::worker::run_in_worker(&args) {
                Ok(code) => return ExitCode::from(code),
                Err(e) => Err(e),
            }
        }
        #[cfg(feature = "lab")]
        Command::Stress {
            endpoint,
            model,
            prompts,
            config,
            max_tokens,
            strengths,
            adaptive,
            step,
            max_entropy_shift,
            max_bleu_drop,
            seed,
            out,
            svg,
            push,
            bertscore_model_dir,
        } => stress_prompts(prompts, config.as_deref()).and_then(|prompts| {
            let mut target = omen_sources::canary::CanaryTarget::new(endpoint, model.unwrap_or_default());
            target.max_tokens = max_tokens;
            let options = omen_lab::stress::StressOptions {
                target,
                prompts,
                strengths,
                adaptive,
                step,
                max_entropy_shift,
                max_bleu_drop,
                seed,
                semantic: None,
            };
            stress(options, bertscore_model_dir, &out, svg.as_deref(), push.as_deref())
        }),
        #[cfg(feature = "lab")]
        Command::Explain { store, since, until, split, confidence, min_r_squared, json, svg } => {
            let options =
                omen_lab::explain::ExplainOptions { store, since, until, split, confidence, min_r_squared };
            explain(&options, json.as_deref(), svg.as_deref())
        }
        #[cfg(feature = "lab")]
        Command::EvaluateDetectors { nab, skab, published, json, lstm_ae, skab_only, no_progress } => {
            let tables = omen_lab::detectors::Tables { lstm_ae, skab_only };
            evaluate_detectors(&nab, &skab, &published, json.as_deref(), tables, no_progress)
        }
        #[cfg(feature = "lab")]
        Command::EvaluateWarnings { scenarios, out, work, config, seeds, jobs, baseline } => {
            // A full evaluation takes minutes: each finished run is logged to stderr.
            omen_agent::logging();
            let cfg = match config {
                Some(path) => load_config(&path),
                None => Ok(Config::default()),
            };
            let options = omen_lab::evaluate_warnings::EvaluateOptions {
                seeds: seeds as usize,
                jobs: jobs.map_or_else(
                    || std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
                    |j| j as usize,
                ),
                baseline,
            };
            cfg.and_then(|cfg| evaluate_warnings(&cfg, &scenarios, &out, work, options))
        }
        #[cfg(feature = "lab")]
        Command::FillHistory { store, days, gpus, layers, period, config, out } => {
            // Tens of minutes for 30 days of 640 layers: progress goes to stderr once per day.
            omen_agent::logging();
            let cfg = match config {
                Some(path) => load_config(&path),
                None => Ok(Config::default()),
            };
            cfg.and_then(|mut cfg| {
                cfg.store.path = store;
                let options = omen_lab::history::HistoryOptions {
                    days,
                    gpus,
                    layers,
                    period: period.unwrap_or(cfg.store.raw_min_interval.max(std::time::Duration::from_secs(1))),
                    end_ms: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64),
                    seed: 1,
                };
                let report = omen_lab::history::fill_history(cfg, &options)?;
                let text = serde_json::to_string_pretty(&report).context("cannot serialise the report")?;
                std::fs::write(&out, text + "\n").with_context(|| format!("cannot write {}", out.display()))?;
                eprintln!(
                    "fill-history: {} series, {:.0} MB on disk after {} days; tick p50 {:.2} ms, p99 {:.2} ms, max {:.1} ms; report: {}",
                    report.series,
                    report.store_bytes as f64 / 1e6,
                    report.days,
                    report.tick_all.p50_ms,
                    report.tick_all.p99_ms,
                    report.tick_all.max_ms,
                    out.display()
                );
                Ok(())
            })
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("omen: {e:#}");
            ExitCode::FAILURE
        }
    }
}
