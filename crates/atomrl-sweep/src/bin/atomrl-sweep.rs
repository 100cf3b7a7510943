//! `atomrl-sweep`: search the hyperparameters of an AtomRL run.
//!
//! ```text
//! atomrl-sweep --config examples/configs/sweep.toml
//! mpirun -np 4 atomrl-sweep --config sweep.toml     # trials spread over 4 ranks
//! ```

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    match atomrl_sweep::run_cli(atomrl_sweep::Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
