//! `atomrl-train`: run a GRPO, DAPO or SFT recipe from a TOML configuration.
//!
//! ```text
//! atomrl-train --config run.toml
//! atomrl-train --config run.toml --recipe dapo --set lr=3e-6 --set num_generations=16
//! atomrl-train --config run.toml --resume          # continue from the latest checkpoint
//! atomrl-train --config run.toml --dashboard       # live dashboard at http://127.0.0.1:6060/
//! mpirun -np 4 atomrl-train --config run.toml      # 4 data-parallel ranks (feature `mpi`)
//! ```
//!
//! Built with feature `nccl` (which implies `cuda` and `mpi`), a run under `mpirun` whose
//! `device` is CUDA sums gradients and broadcasts weights through NCCL, one GPU per rank
//! (`device = "cuda"`: rank r on `cuda:LOCAL_RANK`); other runs are unchanged.

use std::path::PathBuf;
use std::process::ExitCode;
use std::rc::Rc;

use anyhow::Result;

/// Counts allocations for `ATOMRL_PROFILE=1` runs (one atomic load per allocation otherwise).
#[global_allocator]
static ALLOCATOR: atomrl_core::profile::CountingAllocator = atomrl_core::profile::CountingAllocator;
use atomrl_core::DeviceSpec;
use atomrl_dist::{Collective, SingleProcess};
use atomrl_trainer::config::{load_args, GRPOArgs, Recipe};
use atomrl_trainer::run::{build_trainer, print_summary};
use clap::Parser;

/// Train a language model with GRPO, DAPO, SFT, PPO, A2C, TRPO or DPO.
///
/// Every option of the run lives in the TOML file (see docs/recipes.md for all keys and their
/// defaults); `--set key=value` overrides one, `--recipe` picks the preset the file is applied
/// on top of.
#[derive(Parser)]
#[command(
    name = "atomrl-train",
    version,
    after_help = "Example: atomrl-train --config examples/configs/tiny.toml --set max_steps=20"
)]
struct Cli {
    /// The run's TOML configuration.
    #[arg(long, short, value_name = "FILE.toml")]
    config: Option<PathBuf>,
    /// Override one option (TOML value): `--set lr=1e-5 --set lora.r=8`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// The preset the configuration is applied on: grpo, dapo, sft, ppo, a2c, trpo or dpo.
    #[arg(long, value_parser = parse_recipe)]
    recipe: Option<Recipe>,
    /// Continue from the latest complete checkpoint in output_dir (same as resume = "auto").
    #[arg(long)]
    resume: bool,
    /// Serve the dashboard of output_dir's parent folder (this run and its siblings) on
    /// 127.0.0.1:PORT while the run trains (PORT 6060 when not given); it ends with the run,
    /// after which `atomrl-dashboard FOLDER` serves the same.
    #[arg(long, value_name = "PORT", num_args = 0..=1, default_missing_value = "6060")]
    dashboard: Option<u16>,
}

fn parse_recipe(s: &str) -> Result<Recipe, String> {
    s.parse().map_err(|e: atomrl_core::Error| e.to_string())
}

fn main() -> ExitCode {
    atomrl_trainer::runtime::tune_allocator();
    let cli = Cli::parse();
    if let Err(e) = atomrl_trainer::runtime::cblas_from_env() {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    let ranks = match collective() {
        Ok(ranks) => ranks,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let dashboard = cli.dashboard;
    let mut args = match load(cli) {
        Ok(args) => args,
        Err(e) => return fail(ranks.collective(), &e),
    };
    let comm = match ranks.for_device(&mut args.device) {
        Ok(comm) => comm,
        // NcclCollective::new returns the same error on every rank (or has ended the job).
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    if let (Some(port), 0) = (dashboard, comm.rank()) {
        start_dashboard(&args.output_dir, port);
    }
    match train(args, Rc::clone(&comm)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&*comm, &e),
    }
}

/// Serves the dashboard of `output_dir`'s parent folder on 127.0.0.1:`port` from a background
/// thread. A dashboard that cannot start (a port in use) is a warning: the run goes on.
fn start_dashboard(output_dir: &str, port: u16) {
    let out = std::path::Path::new(output_dir);
    let folder = match out.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(p) => p.to_path_buf(),
        None => PathBuf::from("."),
    };
    let started = std::fs::create_dir_all(out)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            atomrl_dashboard::Dashboard::bind(&folder, atomrl_dashboard::DEFAULT_HOST, port)
                .map_err(|e| e.to_string())
        })
        .and_then(|d| {
            let url = d.url();
            d.spawn().map(|_| url).map_err(|e| e.to_string())
        });
    match started {
        Ok(url) => eprintln!(
            "dashboard of {} at {url} (until the run ends; then: atomrl-dashboard {})",
            folder.display(),
            folder.display()
        ),
        Err(e) => eprintln!("warning: no dashboard: {e}"),
    }
}

/// Reports `e`; with more than one rank, ends the job, since the other ranks wait for this
/// one in their next collective.
fn fail(comm: &dyn Collective, e: &anyhow::Error) -> ExitCode {
    if comm.world_size() > 1 {
        eprintln!("error on rank {}: {e:#}", comm.rank());
        comm.abort(2)
    }
    eprintln!("error: {e:#}");
    ExitCode::from(2)
}

/// The ranks of the run before its device is known.
enum Ranks {
    /// This process alone, or MPI's world (feature `mpi`).
    Ready(Rc<dyn Collective>),
    /// MPI's world (feature `nccl`), to become an `atomrl_dist::NcclCollective` when the run
    /// is on a CUDA device.
    #[cfg(feature = "nccl")]
    Mpi(atomrl_dist::MpiCollective),
}

impl Ranks {
    fn collective(&self) -> &dyn Collective {
        match self {
            Ranks::Ready(comm) => &**comm,
            #[cfg(feature = "nccl")]
            Ranks::Mpi(mpi) => mpi,
        }
    }

    /// The collective of a run on `device`. With feature `nccl`, MPI's world on a CUDA device
    /// becomes NCCL's: on `cuda:N` if given, else on `cuda:LOCAL_RANK`, which `device` is then
    /// set to (the trainer opens that same device).
    #[cfg_attr(not(feature = "nccl"), allow(unused_variables))]
    fn for_device(self, device: &mut DeviceSpec) -> Result<Rc<dyn Collective>> {
        match self {
            Ranks::Ready(comm) => Ok(comm),
            #[cfg(feature = "nccl")]
            Ranks::Mpi(mpi) => {
                let DeviceSpec::Cuda(index) = *device else {
                    return Ok(Rc::new(mpi));
                };
                let ordinal = index.unwrap_or_else(|| mpi.local_rank());
                *device = DeviceSpec::Cuda(Some(ordinal));
                Ok(Rc::new(atomrl_dist::NcclCollective::new(mpi, ordinal)?))
            }
        }
    }
}

/// The ranks of the run: MPI's world when started by `mpirun` (feature `mpi`), else this
/// process alone.
fn collective() -> Result<Ranks> {
    #[cfg(feature = "mpi")]
    if atomrl_dist::launched_by_mpi() {
        let comm = atomrl_dist::MpiCollective::init()?;
        comm.abort_on_panic(101);
        #[cfg(feature = "nccl")]
        return Ok(Ranks::Mpi(comm));
        #[cfg(not(feature = "nccl"))]
        return Ok(Ranks::Ready(Rc::new(comm)));
    }
    #[cfg(not(feature = "mpi"))]
    if let Some(n) = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse::<usize>().ok())
        .filter(|&n| n > 1)
    {
        // Each process would train alone, all into the same output folder.
        anyhow::bail!("started as one of {n} MPI processes, but this atomrl-train was built without the `mpi` feature: cargo build --release --features mpi --bin atomrl-train");
    }
    Ok(Ranks::Ready(Rc::new(SingleProcess)))
}

/// The run's options: the configuration file, the preset and the overrides.
fn load(cli: Cli) -> Result<GRPOArgs> {
    let mut overrides = cli.set;
    if cli.resume {
        overrides.push("resume=\"auto\"".into());
    }
    Ok(load_args(cli.config.as_deref(), cli.recipe, &overrides)?)
}

fn train(args: GRPOArgs, comm: Rc<dyn Collective>) -> Result<()> {
    let lead = comm.rank() == 0;
    #[cfg(feature = "test-hooks")]
    let faults = atomrl_cli::test_faults::from_env(comm.rank());
    #[allow(unused_mut)]
    let mut trainer = build_trainer(args, comm)?;
    #[cfg(feature = "test-hooks")]
    if let Some(hook) = faults {
        trainer = trainer.with_experience_hook(hook);
    }
    let summary = trainer.train()?;
    if lead {
        print_summary(&summary);
    }
    Ok(())
}
