//! `omen-worker`: the models on libtorch in a process of their own, so that the `omen`
//! agent never links libtorch (whose load alone costs about 130 MB of RSS).
//!
//! - `omen-worker serve`: the agent starts it when a model is configured and sends it
//!   JSON-line requests on stdin (omen_protocol::worker); replies go to stdout, logs to stderr.
//! - `omen-worker train ...` / `omen-worker evaluate ...` / `omen-worker evaluate-skab ...`:
//!   what `omen train`, `omen evaluate` and `omen evaluate-skab` run, with the same arguments.

mod commands;
mod serve;
mod skab;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "omen-worker",
    version,
    about = "omen's model worker: LSTM autoencoder and BERTScore on libtorch"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the agent's model requests: JSON lines on stdin, replies on stdout.
    Serve,
    /// Train the LSTM autoencoder on normal data (CSV, JSONL trace or store) and write the model file.
    Train(omen_protocol::training::TrainArgs),
    /// Score data with a model: window-based precision, recall, F1 and the NAB score against labels.
    Evaluate(omen_protocol::training::EvaluateArgs),
    /// The LSTM autoencoder on SKAB by the leaderboard's protocol, scored by SKAB's scorer.
    EvaluateSkab(omen_protocol::training::SkabArgs),
}

/// Logs to stderr (the agent's log, since the agent passes its stderr on); `RUST_LOG`
/// overrides the default `info` level.
fn logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve => {
            logging();
            serve::serve(std::io::stdin().lock(), std::io::stdout().lock())
        }
        Command::Train(args) => commands::train(&args),
        Command::Evaluate(args) => commands::evaluate(&args),
        Command::EvaluateSkab(args) => skab::evaluate_skab(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `omen train` runs this binary: name the command the user typed.
            eprintln!("omen: {e:#}");
            ExitCode::FAILURE
        }
    }
}
