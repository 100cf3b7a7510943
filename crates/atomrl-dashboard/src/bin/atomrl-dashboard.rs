//! `atomrl-dashboard [RUNS_DIR] [--port N] [--host ADDR]`: the dashboard over a runs folder.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use atomrl_dashboard::{Dashboard, DEFAULT_HOST, DEFAULT_PORT};
use clap::Parser;

/// A local web dashboard over a folder of runs: live curves, a rollout browser, comparisons.
/// Read-only; listens on 127.0.0.1 unless `--host` says otherwise.
#[derive(Parser)]
#[command(name = "atomrl-dashboard", version)]
struct Cli {
    /// The folder of runs (each run a folder with metrics.jsonl; sweeps' trials included).
    #[arg(default_value = "runs")]
    runs_dir: PathBuf,
    /// The port (0: any free port).
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// The address to listen on. Anything but a loopback address lets other machines read
    /// every run: the dashboard has no login.
    #[arg(long, default_value_t = DEFAULT_HOST)]
    host: IpAddr,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let dashboard = match Dashboard::bind(&cli.runs_dir, cli.host, cli.port) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(w) = dashboard.exposure_warning() {
        eprintln!("{w}");
    }
    println!(
        "AtomRL dashboard of {} at {}",
        cli.runs_dir.display(),
        dashboard.url()
    );
    match dashboard.serve() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
