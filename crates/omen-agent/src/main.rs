//! `omen`: the sidecar agent. `omen run --config omen.yaml` is the daemon;
//! `omen check-config` validates a config; `omen replay TRACE` runs the same
//! pipeline offline and writes a report.

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
}

fn load_config(path: &std::path::Path) -> Result<Config> {
    Config::load(path).map_err(|problems| {
        let list: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
        anyhow::anyhow!("{} has {} problem(s):\n{}", path.display(), problems.len(), list.join("\n"))
    })
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
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("omen: {e:#}");
            ExitCode::FAILURE
        }
    }
}
