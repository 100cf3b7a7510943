//! What a run computes with: the CPU plan (threads, workers, allocator), the model (local
//! folder or hub id, with optional LoRA) and its tokenizer. The device is
//! [`atomrl_core::DeviceSpec::open`].

use std::path::PathBuf;

use atomrl_core::Result;
use atomrl_model::{CausalLm, LoraConfig};
use atomrl_sample::ChatTokenizer;
use candle_core::{DType, Device};

use crate::config::GRPOArgs;
use crate::data::{DataSource, Example};

/// Keeps freed tensor buffers in the process (see [`atomrl_core::allocator`]).
pub use atomrl_core::allocator::tune_allocator;

/// `ATOMRL_CBLAS=/path/to/libmkl_rt.so.3` (or another CBLAS library): candle's f32 CPU
/// matmuls through that library's `cblas_sgemm` ([`atomrl_core::cblas`]); says so on stderr.
/// Unset, nothing changes.
///
/// # Errors
/// The variable names a file that is not a CBLAS library.
pub fn cblas_from_env() -> Result<()> {
    if let Some(path) = atomrl_core::cblas::use_library_from_env()? {
        eprintln!(
            "f32 CPU matmuls: cblas_sgemm of {} ({})",
            path.display(),
            atomrl_core::cblas::ENV
        );
    }
    Ok(())
}

/// `ATOMRL_PROFILE=1`: time and count the phases of a training run
/// ([`atomrl_core::profile`]; synchronising the device at every phase boundary slows the run).
/// Turns profiling on when the variable says so; returns whether it did.
pub fn profile_from_env() -> bool {
    let on = std::env::var("ATOMRL_PROFILE").is_ok_and(|v| !matches!(v.trim(), "" | "0"));
    if on {
        atomrl_core::profile::enable(true);
        atomrl_core::profile::reset();
    }
    on
}

/// Writes the recorded phases to `output_dir/profile.json` and returns them as a table.
///
/// # Errors
/// The file cannot be written.
pub fn write_profile(output_dir: &std::path::Path) -> Result<String> {
    let phases = atomrl_core::profile::report();
    let path = output_dir.join("profile.json");
    let json = serde_json::to_string_pretty(&phases)
        .map_err(|e| atomrl_core::Error::file(path.display(), e))?;
    std::fs::write(&path, json).map_err(|e| atomrl_core::Error::file(path.display(), e))?;
    Ok(atomrl_core::profile::format_table("the run", &phases))
}

/// How a CPU run spreads over the cores (see [`atomrl_core::cpu_plan`]).
pub use atomrl_core::cpu_plan::{
    apply_cpu_plan, cpu_plan, cpu_plan_for, set_threads, CpuPlan, TWO_WORKERS_MAX_PARAMS,
    WORKERS_MAX_PARAMS,
};

/// The local folder of a model: `model` itself when it is a folder, else the hub id
/// `org/name[@revision]` from the hub cache, downloaded first when the cache lacks it (the
/// `hub` feature, on by default; [`atomrl_hub::resolve_model`]).
///
/// # Errors
/// [`atomrl_core::Error::File`] naming the repository and file (unknown, gated, unreachable, offline).
pub fn resolve_model_dir(model: &str) -> Result<PathBuf> {
    atomrl_hub::model_dir(model)
}

/// The examples of `split` of `source`; a hub dataset's split comes from the hub cache, or is
/// downloaded when the cache lacks it ([`atomrl_hub::resolve_dataset_split`]).
///
/// # Errors
/// Those of [`DataSource::load_with`] and of the hub resolver.
pub fn load_split(source: &DataSource, split: &str) -> Result<Vec<Example>> {
    source.load_with(split, |id, revision, config, split| {
        let spec = atomrl_hub::RepoSpec {
            id: id.to_string(),
            revision: revision.unwrap_or("main").to_string(),
        };
        atomrl_hub::resolve_dataset_split(
            &spec,
            config,
            split,
            &atomrl_hub::HubSettings::from_env(),
        )
    })
}

/// The error of a `key` asking for `n` of `policy`'s decoder layers (a smaller critic or
/// reward model) when it has fewer.
pub(crate) fn layers_error(key: &str, policy: &CausalLm, n: usize) -> atomrl_core::Error {
    let layers = policy.config().num_hidden_layers;
    let expected = format!("in 1..={layers} (the policy's decoder layers)");
    atomrl_core::Error::value("config", key, expected, n)
}

/// The adapters `[lora]` asks for.
///
/// # Errors
/// An unknown target module, a dropout outside `[0, 1)`.
pub fn lora_config(l: &crate::config::LoraArgs) -> Result<LoraConfig> {
    let targets: Vec<&str> = l.target_modules.iter().map(String::as_str).collect();
    LoraConfig::new(l.r, l.alpha)
        .with_targets(&targets)?
        .with_dropout(l.dropout)
}

/// Loads the policy model of `args` (with fresh LoRA adapters when `[lora]` is set) and its
/// tokenizer.
///
/// The weights (master copy, gradients, optimizer state) are always f32; `args.dtype` sets
/// the compute dtype of the forward and backward ([`CausalLm::set_compute_dtype`]), and
/// `args.gradient_checkpointing` turns on [`CausalLm::set_gradient_checkpointing`].
///
/// # Errors
/// Missing files, an unsupported architecture, bad LoRA settings, an unknown dtype.
pub fn load_policy(args: &GRPOArgs, device: &Device) -> Result<(CausalLm, ChatTokenizer)> {
    let dir = resolve_model_dir(&args.model)?;
    let compute = args.dtype.dtype();
    let mut model = CausalLm::from_hf_dir(&dir, DType::F32, device)?;
    if let Some(l) = &args.lora {
        model
            .add_lora(lora_config(l)?, args.seed)
            .map_err(|e| e.in_table("lora"))?;
    }
    model.set_compute_dtype(compute)?;
    model.set_gradient_checkpointing(args.gradient_checkpointing);
    if let Some(budget) = args.attention_scores_budget {
        model.set_attention_scores_budget(budget);
    }
    let tokenizer = ChatTokenizer::from_hf_dir(&dir)?;
    Ok((model, tokenizer))
}
