//! `omen`: the sidecar agent. `omen run --config omen.yaml` is the daemon;
//! `omen check-config` validates a config; `omen replay TRACE` runs the same
//! pipeline offline and writes a report; `omen simulate` writes a labelled
//! scenario trace and `omen evaluate-warnings` scores the warnings on a set of them.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use omen_agent::config::Config;

#[derive(Parser)]
#[command(name = "omen", version, about = "Early warning for LLM serving degradation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: sources -> pipeline -> store, HTTP API and exporters.
    Run {
        /// Config file (YAML).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate a config file and report every problem by field path.
    CheckConfig {
        /// Config file (YAML).
        config: PathBuf,
    },
    /// Replay a JSONL trace through the pipeline offline and write report.json and report.svg.
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
    /// Simulate a degradation scenario: write DIR/trace.jsonl.gz and DIR/labels.json.
    Simulate {
        /// Scenario file (YAML, see deploy/scenarios/).
        scenario: PathBuf,
        /// Output folder (created).
        #[arg(long, short, default_value = "omen-simulate")]
        out: PathBuf,
    },
    /// Simulate every scenario in a folder, replay each through the pipeline and score the warnings.
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
    },
}

fn load_config(path: &std::path::Path) -> Result<Config> {
    Config::load(path).map_err(|problems| {
        let list: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
        anyhow::anyhow!("{} has {} problem(s):\n{}", path.display(), problems.len(), list.join("\n"))
    })
}

fn simulate(scenario: &std::path::Path, out: &std::path::Path) -> Result<()> {
    let scenario = omen_agent::simulate::Scenario::load(scenario)?;
    let labels = omen_agent::simulate::simulate(&scenario, out)?;
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

fn evaluate_warnings(
    cfg: &Config,
    scenarios: &std::path::Path,
    out: &std::path::Path,
    work: Option<PathBuf>,
) -> Result<()> {
    let work = work.unwrap_or_else(|| out.with_extension("work"));
    let report = omen_agent::evaluate_warnings::evaluate(cfg, scenarios, &work)?;
    print!("{}", omen_agent::evaluate_warnings::table(&report));
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
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            rt.block_on(omen_agent::run::run(cfg))
        }),
        Command::CheckConfig { config } => match Config::load(&config) {
            Ok(_) => {
                println!("{}: ok", config.display());
                Ok(())
            }
            Err(problems) => {
                for p in &problems {
                    eprintln!("{}: {p}", config.display());
                }
                return ExitCode::from(2);
            }
        },
        Command::Replay { trace, out, config } => {
            let cfg = match config {
                Some(path) => load_config(&path),
                None => Ok(Config::default()),
            };
            cfg.and_then(|cfg| omen_agent::replay::replay(cfg, &trace, &out))
        }
        Command::Simulate { scenario, out } => simulate(&scenario, &out),
        Command::EvaluateWarnings { scenarios, out, work, config } => {
            let cfg = match config {
                Some(path) => load_config(&path),
                None => Ok(Config::default()),
            };
            cfg.and_then(|cfg| evaluate_warnings(&cfg, &scenarios, &out, work))
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
