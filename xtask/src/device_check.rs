//! `cargo xtask device-check`: a device (a GPU) computes what the CPU computes.
//!
//! For each model folder, a fixed ragged batch (left-padded prompts, right-padded completions)
//! is scored on the CPU in f32 (the reference: the CPU forward matches transformers to 1e-4)
//! and on the device, in f32 and in bf16 mixed precision (f32 master weights, bf16 compute):
//!
//! - the logits of `CausalLm::forward`;
//! - the log-probs and entropies of `atomrl_logprob::get_action_log_probs`;
//! - the gradients of a masked log-likelihood with respect to every trainable variable;
//! - the shared-prompt pass (`get_shared_prompt_log_probs`) and its gradients;
//! - LoRA (frozen-base custom op) with gradient checkpointing (recompute custom op): the
//!   adapters' gradients;
//! - KV-cache decoding: the sampling log-probs `generate_samples` returns on the device (its
//!   generation view: fused kernels, grouped-query attention, the static decode step replayed
//!   as a CUDA graph and device-side sampling on a GPU), against the CPU scoring the same
//!   sequences with one full forward;
//! - the static decode step (`atomrl_model::StaticDecode`: a fixed-capacity cache, the
//!   kernels of `cuda/decode.cu`, a CUDA graph) fed fixed tokens through a batch that drops
//!   rows, compacts and grows its cache: its logits against the CPU's cached decoding and
//!   against cached decoding on the same device (the tensor-op step it replaces).
//!
//! The default models are the repository's fixtures, the embedded model and a random model
//! with a vocabulary large enough for the fused LM head ([`wide_vocab_model`]).
//!
//! - each fused decoder kernel alone (RMSNorm, SwiGLU, RoPE, attention softmax: output and
//!   input gradients, `atomrl_model::kernel_check`), the selective log-softmax and the device
//!   draw of the next tokens (`atomrl_sample::kernel_check`), in f32 and bf16, against the
//!   CPU's f32 fused kernel and against the tensor-op form on the same device;
//! - the optimizer's in-place kernels (gradient accumulation, global-norm clipping, AdamW:
//!   `atomrl-optim`'s CUDA kernels on a GPU, the multi-tensor launches over every parameter
//!   among them) after two updates, against the CPU and against the tensor-op forms on the
//!   same device (`ATOMRL_CUDA_FUSED=0`).
//!
//! Then a few GRPO steps of the embedded model run on the device, in f32 and in bf16 with LoRA
//! and gradient checkpointing, and must not skip a step.
//!
//! On `--device cpu` the f32 rows compare the CPU with itself (0) and the bf16 rows measure
//! candle's CPU bf16 path: that is what CI runs, so the checks stay exercised without a GPU.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use atomrl_core::DeviceSpec;
use atomrl_logprob::{get_action_log_probs, get_shared_prompt_log_probs, SharedPromptBatch};
use atomrl_model::{Architecture, CausalLm, ForwardInput, LoraConfig, ModelConfig, StaticDecode};
use atomrl_sample::{generate_samples, BatchDecoder, CacheMode, SamplingParams};
use atomrl_trainer::config::load_args;
use atomrl_trainer::run::run_recipe;
use candle_core::{DType, Device, Tensor, Var};
use serde_json::json;

/// Options of `cargo xtask device-check`.
#[derive(Debug, clap::Args)]
pub struct DeviceCheckArgs {
    /// The device to compare with the CPU: `cuda`, `cuda:N` (needs `--features cuda`) or `cpu`.
    #[arg(long, default_value = "cuda")]
    pub device: DeviceSpec,
    /// Model folders (Hugging Face layout). Default: the repository's fixture models
    /// (Qwen2, Qwen3, untied Qwen2, Llama, bf16-saved Qwen3) and the embedded model.
    #[arg(long = "model")]
    pub models: Vec<PathBuf>,
    /// GRPO steps of the embedded model on the device, per precision (0: no training run).
    #[arg(long, default_value_t = 3)]
    pub grpo_steps: usize,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// How a difference is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// `max |got − want|`: log-probs and entropies, already on a natural scale.
    Abs,
    /// `max |got − want| / max |want|`: logits, scale-free.
    RelMax,
    /// `‖got − want‖₂ / ‖want‖₂` over all the tensors together: gradients, as the optimizer sees
    /// them (the global norm clipping uses). A per-tensor maximum would be dominated by tensors
    /// whose gradient is nearly zero.
    RelNorm,
}

impl Metric {
    fn label(self) -> &'static str {
        match self {
            Metric::Abs => "abs",
            Metric::RelMax => "rel",
            Metric::RelNorm => "norm",
        }
    }
}

/// How far a quantity may move.
#[derive(Debug, Clone, Copy)]
struct Tolerance {
    bound: f32,
    metric: Metric,
}

/// f32 logits: transformers agreement is checked at 1e-4 absolute on logits of magnitude ~10;
/// another backend only reorders f32 reductions (~1e-6 relative).
const F32_LOGITS: Tolerance = Tolerance {
    bound: 1e-5,
    metric: Metric::RelMax,
};
const F32_LOG_PROBS: Tolerance = Tolerance {
    bound: 1e-4,
    metric: Metric::Abs,
};
/// Gradients sum over every position and row, so reordered reductions add up more.
const F32_GRADS: Tolerance = Tolerance {
    bound: 1e-4,
    metric: Metric::RelNorm,
};
/// bf16 keeps 8 mantissa bits (3.9e-3 relative per rounding), compounded over the layers. The
/// bounds are about 1.7x the worst that candle's CPU bf16 path measures against f32 on the
/// default models (`cargo xtask device-check --device cpu`), whose random weights make larger
/// logits than trained ones.
const BF16_LOGITS: Tolerance = Tolerance {
    bound: 5e-2,
    metric: Metric::RelMax,
};
const BF16_LOG_PROBS: Tolerance = Tolerance {
    bound: 0.25,
    metric: Metric::Abs,
};
/// The entropy `H = −Σ p log p` moves by up to twice the largest log-prob error over the
/// whole vocabulary, where the log-prob rows see only the chosen tokens': twice their bound.
/// (tiny-qwen2's bf16 entropy is off by 0.139 on the CPU and 0.20–0.27 on an H100, where cuBLAS
/// sums in another order; its chosen-token log-probs by 0.145 and 0.17.)
const BF16_ENTROPY: Tolerance = Tolerance {
    bound: 0.5,
    metric: Metric::Abs,
};
const BF16_GRADS: Tolerance = Tolerance {
    bound: 0.15,
    metric: Metric::RelNorm,
};

/// One comparison's outcome.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// `model / what / precision`.
    pub name: String,
    /// The measured difference.
    pub diff: f32,
    /// The bound it must stay under.
    pub bound: f32,
    /// How `diff` is measured.
    pub metric: Metric,
    /// The tensor (a variable's name) that differs most, when there are several.
    pub worst: Option<String>,
}

impl Comparison {
    /// Whether the difference is within its bound (a NaN is not).
    pub fn passed(&self) -> bool {
        self.diff <= self.bound
    }
}

/// The comparisons collected so far.
#[derive(Default)]
struct Report {
    rows: Vec<Comparison>,
}

/// Named tensors (a model's gradients, by variable name).
type Named = Vec<(String, Tensor)>;

impl Report {
    fn compare(&mut self, name: String, got: &Tensor, want: &Tensor, tol: Tolerance) -> Result<()> {
        let one = |t: &Tensor| vec![(String::new(), t.clone())];
        self.compare_all(&name, &one(got), &one(want), tol)
    }

    /// One row for a list of tensors.
    fn compare_all(&mut self, name: &str, got: &Named, want: &Named, tol: Tolerance) -> Result<()> {
        let got_names: Vec<&String> = got.iter().map(|(n, _)| n).collect();
        let want_names: Vec<&String> = want.iter().map(|(n, _)| n).collect();
        if got_names != want_names {
            bail!("{name}: tensors {got_names:?} on the device, {want_names:?} on the CPU");
        }
        let (mut diff, mut err_sq, mut ref_sq) = (0.0f32, 0.0f64, 0.0f64);
        let (mut worst, mut worst_score) = (None, -1.0f64);
        for ((n, g), (_, w)) in got.iter().zip(want) {
            let (g, w) = (to_cpu_f32(g)?, to_cpu_f32(w)?);
            if g.dims() != w.dims() {
                bail!(
                    "{name} {n}: shape {:?} on the device, {:?} on the CPU",
                    g.dims(),
                    w.dims()
                );
            }
            let d = values(&(&g - &w)?)?;
            let w = values(&w)?;
            let (d_max, w_max) = (max_abs(&d), max_abs(&w));
            let d_sq: f64 = d.iter().map(|x| f64::from(*x).powi(2)).sum();
            err_sq += d_sq;
            ref_sq += w.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>();
            let one = match tol.metric {
                Metric::Abs => d_max,
                _ => d_max / w_max.max(1e-12),
            };
            diff = if one.is_nan() || diff.is_nan() {
                f32::NAN
            } else {
                diff.max(one)
            };
            let score = if tol.metric == Metric::RelNorm {
                d_sq
            } else {
                f64::from(one)
            };
            if score.is_nan() || score > worst_score {
                worst_score = if score.is_nan() { f64::INFINITY } else { score };
                worst = Some(n.clone()).filter(|n| !n.is_empty());
            }
        }
        if tol.metric == Metric::RelNorm {
            diff = (err_sq.sqrt() / ref_sq.sqrt().max(1e-30)) as f32;
        }
        let row = Comparison {
            name: name.into(),
            diff,
            bound: tol.bound,
            metric: tol.metric,
            worst,
        };
        println!(
            "{:<56} {:>9.2e} {:>4} {:>8.2e}  {:<4} {}",
            row.name,
            row.diff,
            row.metric.label(),
            row.bound,
            if row.passed() { "ok" } else { "FAIL" },
            row.worst
                .as_deref()
                .map(|w| format!("(most: {w})"))
                .unwrap_or_default()
        );
        self.rows.push(row);
        Ok(())
    }
}

/// One kernel's output and gradients in f32 on another backend or in another form: the same
/// formula with reductions in another order.
const F32_KERNEL: Tolerance = Tolerance {
    bound: 1e-5,
    metric: Metric::RelNorm,
};
/// The same in bf16 against f32 (one or two bf16 roundings of each value).
const BF16_KERNEL: Tolerance = Tolerance {
    bound: 2e-2,
    metric: Metric::RelNorm,
};

/// The per-kernel rows: each fused kernel on `device` (f32, bf16) against the CPU's f32 fused
/// kernel, and against its tensor-op form on the same device.
fn check_kernels(device: &Device, report: &mut Report) -> Result<()> {
    use atomrl_model::kernel_check::{run as kernel, KERNELS};
    for k in KERNELS {
        check_kernel(k, device, report, |d, dtype, fused| {
            Ok(kernel(k, d, dtype, fused)?)
        })?;
    }
    // atomrl-logprob's selective log-softmax (log-probs, entropies, the logits' gradient).
    check_kernel(
        "selective-log-softmax",
        device,
        report,
        |d, dtype, fused| {
            Ok(atomrl_logprob::kernel_check::selective_log_softmax(
                d, dtype, fused,
            )?)
        },
    )?;
    // atomrl-logprob's chunked LM head (logits kept and recomputed; the weight gradient summed
    // over the chunks in place, by cuBLAS with β = 1 on CUDA).
    check_kernel("lm-head", device, report, |d, dtype, fused| {
        Ok(atomrl_logprob::kernel_check::lm_head(d, dtype, fused)?)
    })?;
    // atomrl-sample's device draw (Gumbel-max and greedy tokens with their log-probs).
    check_kernel("device-pick", device, report, |d, dtype, fused| {
        Ok(atomrl_sample::kernel_check::device_pick(d, dtype, fused)?)
    })
}

/// One kernel's four rows: `run(device, dtype, fused)` in f32 and bf16, fused against the CPU's
/// f32 and against the tensor-op form on `device`.
fn check_kernel(
    k: &str,
    device: &Device,
    report: &mut Report,
    run: impl Fn(&Device, DType, bool) -> Result<Named>,
) -> Result<()> {
    let cpu = run(&Device::Cpu, DType::F32, true)?;
    for dtype in [DType::F32, DType::BF16] {
        let p = precision_name(dtype);
        let tol = if dtype == DType::F32 {
            F32_KERNEL
        } else {
            BF16_KERNEL
        };
        let fused = run(device, dtype, true)?;
        let plain = run(device, dtype, false)?;
        report.compare_all(&format!("kernel {k} vs CPU / {p}"), &fused, &cpu, tol)?;
        report.compare_all(
            &format!("kernel {k} vs tensor ops, same device / {p}"),
            &fused,
            &plain,
            tol,
        )?;
    }
    Ok(())
}

/// f32 optimizer state after two updates: the same element-wise arithmetic everywhere, but
/// the global norm sums in another order on another backend (so the clipping factor moves in
/// its last bits).
const F32_OPTIMIZER: Tolerance = Tolerance {
    bound: 1e-6,
    metric: Metric::RelNorm,
};

/// Parameters after two AdamW updates of gradients summed over three micro-batches and
/// clipped (the clip triggers), all on `device`, with the fused kernels as `fused` says.
fn optimizer_updates(device: &Device, fused: bool) -> Result<Named> {
    use atomrl_optim::{AdamW, AdamWConfig, Gradients};
    atomrl_core::device::set_cuda_fused_kernels(Some(fused));
    let shapes: [&[usize]; 3] = [&[64, 48], &[48], &[3, 1000]];
    let params: Vec<(String, Var)> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let n: usize = s.iter().product();
            let v: Vec<f32> = (0..n)
                .map(|j| ((i * 7919 + j) as f32 * 0.013).sin())
                .collect();
            Ok((format!("p{i}"), Var::from_vec(v, *s, device)?))
        })
        .collect::<Result<_>>()?;
    let config = AdamWConfig {
        weight_decay: 0.01,
        ..AdamWConfig::default()
    };
    let mut opt = AdamW::new(params.clone(), config)?;
    let mut norms = Vec::new();
    for step in 0..2 {
        let mut grads = Gradients::new();
        for micro in 0..3 {
            // d/dp Σ p · r = r: a known gradient per micro-batch.
            let mut loss = Tensor::zeros((), DType::F32, device)?;
            for (i, (_, p)) in params.iter().enumerate() {
                let r = ((p.as_tensor() * (1.3 + (step * 3 + micro + i) as f64))?.cos()? * 0.5)?;
                loss = (loss + (p.as_tensor() * r.detach())?.sum_all()?)?;
            }
            grads.accumulate(&loss.backward()?, &params)?;
        }
        // Clipping in place then a step (step 0), and the trainer's form, the clipping factor
        // applied by the optimizer as it reads each gradient (step 1).
        if step == 0 {
            norms.push(grads.clip_global_norm(0.5)? as f32);
            opt.step(&|name| grads.get(name), 1e-2)?;
        } else {
            let (norm, clip) = grads.clip_factor(0.5)?;
            norms.push(norm as f32);
            opt.step_scaled(&|name| grads.get(name), 1e-2, clip)?;
        }
    }
    atomrl_core::device::set_cuda_fused_kernels(None);
    let mut named: Named = params
        .iter()
        .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
        .collect();
    named.push(("global norms".into(), Tensor::new(norms, &Device::Cpu)?));
    Ok(named)
}

/// The optimizer rows: in-place kernels on `device` against the CPU reference, and against
/// the tensor-op forms on the same device.
fn check_optimizer(device: &Device, report: &mut Report) -> Result<()> {
    let fused = optimizer_updates(device, true)?;
    let cpu = optimizer_updates(&Device::Cpu, true)?;
    let plain = optimizer_updates(device, false)?;
    let name = "optimizer / accumulate+clip+AdamW in place";
    report.compare_all(&format!("{name} vs CPU / f32"), &fused, &cpu, F32_OPTIMIZER)?;
    report.compare_all(
        &format!("{name} vs tensor ops, same device / f32"),
        &fused,
        &plain,
        F32_OPTIMIZER,
    )
}

fn to_cpu_f32(t: &Tensor) -> Result<Tensor> {
    Ok(t.to_device(&Device::Cpu)?.to_dtype(DType::F32)?)
}

fn values(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}

/// The largest magnitude, NaN if any element is NaN (a reduction on the device might skip it).
fn max_abs(values: &[f32]) -> f32 {
    values.iter().fold(0.0f32, |m, x| {
        if m.is_nan() || x.is_nan() {
            f32::NAN
        } else {
            m.max(x.abs())
        }
    })
}

/// The repository root: the current folder when it holds the fixtures (as on the GPU machine,
/// which runs the binary in a copy of the working tree), else where xtask was built from.
fn repo_root() -> PathBuf {
    let here = PathBuf::from(".");
    if here.join("tests/fixtures/reference/models").is_dir() {
        here
    } else {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
    }
}

/// A random model with a vocabulary of `FUSED_HEAD_MIN_VOCAB` + 1,000 tokens, written to
/// `scratch/wide-vocab`: the fixtures' vocabularies are small, and from that size on scoring
/// fuses the LM head with the log-softmax (another custom op to check on the device).
pub fn wide_vocab_model(scratch: &Path) -> Result<PathBuf> {
    let vocab = atomrl_logprob::FUSED_HEAD_MIN_VOCAB + 1_000;
    let mut c = ModelConfig::new(Architecture::Qwen2, vocab, 32, 64, 2, 4, 2)?;
    c.initializer_range = 0.1;
    let dir = scratch.join("wide-vocab");
    CausalLm::from_config_random(c, 17, DType::F32, &Device::Cpu)?.save_hf(&dir)?;
    Ok(dir)
}

/// The default model folders.
pub fn default_models() -> Vec<PathBuf> {
    let root = repo_root();
    let reference = root.join("tests/fixtures/reference/models");
    let own = root.join("crates/atomrl-model/tests/fixtures/models");
    vec![
        reference.join("tiny-qwen2"),
        reference.join("tiny-qwen3"),
        own.join("tiny-qwen2-untied"),
        own.join("tiny-llama"),
        own.join("tiny-qwen3-bf16"),
        embedded_model(),
    ]
}

fn embedded_model() -> PathBuf {
    repo_root().join("examples/grpo_gsm8k/model")
}

/// A fixed ragged batch: 2 distinct prompts (one left-padded) of [`PROMPT`] columns, 2
/// completions each of [`COMPLETION`] columns (right-padded to different lengths).
struct Batch {
    shared: SharedPromptBatch,
    /// Prompt and completion concatenated per row.
    ids: Tensor,
    mask: Tensor,
}

const PROMPT: usize = 6;
const COMPLETION: usize = 5;

impl Batch {
    fn new(vocab: usize) -> Result<Self> {
        // Spread the ids over the vocabulary without an RNG (any fixed ids will do).
        let id = |i: usize| ((i * 7919 + 13) % vocab) as u32;
        let prompt_lens = [PROMPT, PROMPT - 2];
        let completion_lens = [COMPLETION, 3, COMPLETION - 1, 1];
        let mut prompt_ids = vec![];
        let mut prompt_mask = vec![];
        for (k, &len) in prompt_lens.iter().enumerate() {
            for j in 0..PROMPT {
                let real = j >= PROMPT - len;
                prompt_ids.push(if real { id(k * 31 + j) } else { 0 });
                prompt_mask.push(u32::from(real));
            }
        }
        let mut completion_ids = vec![];
        let mut completion_mask = vec![];
        for (r, &len) in completion_lens.iter().enumerate() {
            for j in 0..COMPLETION {
                let real = j < len;
                completion_ids.push(if real { id(500 + r * 17 + j) } else { 0 });
                completion_mask.push(u32::from(real));
            }
        }
        let cpu = Device::Cpu;
        let rows = completion_lens.len();
        let shared = SharedPromptBatch {
            prompt_ids: Tensor::from_vec(prompt_ids, (2, PROMPT), &cpu)?,
            prompt_mask: Tensor::from_vec(prompt_mask, (2, PROMPT), &cpu)?,
            completion_ids: Tensor::from_vec(completion_ids, (rows, COMPLETION), &cpu)?,
            completion_mask: Tensor::from_vec(completion_mask, (rows, COMPLETION), &cpu)?,
            prompt_index: Tensor::new(&[0u32, 0, 1, 1], &cpu)?,
        };
        let per_row = |t: &Tensor| t.index_select(&shared.prompt_index, 0);
        let ids = Tensor::cat(&[&per_row(&shared.prompt_ids)?, &shared.completion_ids], 1)?;
        let mask = Tensor::cat(
            &[&per_row(&shared.prompt_mask)?, &shared.completion_mask],
            1,
        )?;
        Ok(Self { shared, ids, mask })
    }

    fn to_device(&self, d: &Device) -> Result<Self> {
        let s = &self.shared;
        Ok(Self {
            shared: SharedPromptBatch {
                prompt_ids: s.prompt_ids.to_device(d)?,
                prompt_mask: s.prompt_mask.to_device(d)?,
                completion_ids: s.completion_ids.to_device(d)?,
                completion_mask: s.completion_mask.to_device(d)?,
                prompt_index: s.prompt_index.to_device(d)?,
            },
            ids: self.ids.to_device(d)?,
            mask: self.mask.to_device(d)?,
        })
    }
}

/// What a model computes on a [`Batch`], the comparison's two sides.
struct Scores {
    logits: Tensor,
    log_probs: Tensor,
    entropy: Tensor,
    grads: Named,
}

/// `−Σ log p · mask / Σ mask` over the completion tokens: every token's log-prob contributes,
/// so every weight on the path gets a gradient.
fn nll(log_probs: &Tensor, completion_mask: &Tensor) -> Result<Tensor> {
    let m = completion_mask.to_dtype(log_probs.dtype())?;
    let count = m.sum_all()?.to_dtype(DType::F32)?.to_scalar::<f32>()?;
    Ok(((log_probs * &m)?.sum_all()?.neg()? / f64::from(count))?)
}

/// The gradient of every trainable variable, by name (LoRA adapters when attached).
fn gradients(model: &CausalLm, loss: &Tensor) -> Result<Named> {
    let grads = loss.backward()?;
    let named = if model.lora_config().is_some() {
        model.lora_vars()
    } else {
        model.named_vars()
    };
    named
        .into_iter()
        .map(|(name, v)| match grads.get(v.as_tensor()) {
            Some(g) => Ok((name, g.clone())),
            None => bail!("{name} got no gradient"),
        })
        .collect()
}

impl Scores {
    /// Scores through `get_action_log_probs` (rows whole).
    fn rows_whole(model: &CausalLm, b: &Batch) -> Result<Self> {
        let input = ForwardInput::new(b.ids.clone()).with_attention_mask(b.mask.clone());
        // A left-padded query sees only masked keys: its logits are unspecified (transformers'
        // eager and SDPA attention disagree there too, and rounding decides them in bf16), so
        // they are compared where the mask is 1.
        let attended = b.mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let logits = model
            .forward(&input, None)?
            .to_dtype(DType::F32)?
            .broadcast_mul(&attended)?;
        let out = get_action_log_probs(model, &b.ids, &b.mask, COMPLETION, 1.0, true)?;
        let grads = gradients(model, &nll(&out.log_probs, &b.shared.completion_mask)?)?;
        let entropy = out.entropy.context("entropy was asked for")?;
        Ok(Self {
            logits,
            log_probs: out.log_probs,
            entropy,
            grads,
        })
    }
}

/// Log-probs and gradients through `get_shared_prompt_log_probs` (one pass per prompt).
fn shared_prompt_scores(model: &CausalLm, b: &Batch) -> Result<(Tensor, Named)> {
    let out = get_shared_prompt_log_probs(model, &b.shared, 1.0, false)?;
    let grads = gradients(model, &nll(&out.log_probs, &b.shared.completion_mask)?)?;
    Ok((out.log_probs, grads))
}

fn load(dir: &Path, device: &Device, compute: DType) -> Result<CausalLm> {
    let mut m = CausalLm::from_hf_dir(dir, DType::F32, device)
        .with_context(|| format!("loading {} on {device:?}", dir.display()))?;
    if compute != DType::F32 {
        m.set_compute_dtype(compute)?;
    }
    Ok(m)
}

/// Copies the CPU model's trainable values into the device model (LoRA adapters are initialised
/// by each device's RNG, so they must be made equal before comparing).
fn copy_trainable(from: &CausalLm, to: &CausalLm) -> Result<()> {
    let (a, b) = (from.trainable_vars(), to.trainable_vars());
    if a.len() != b.len() {
        bail!(
            "{} trainable variables on the CPU, {} on the device",
            a.len(),
            b.len()
        );
    }
    for (src, dst) in a.iter().zip(&b) {
        dst.set(&src.as_tensor().to_device(to.device())?)?;
    }
    Ok(())
}

/// Rank-4 adapters on every linear layer.
fn lora_config() -> Result<LoraConfig> {
    Ok(LoraConfig::new(4, 8.0).with_targets(&["all-linear"])?)
}

/// Adapters with non-zero B (a fresh LoRA adds exactly 0), the same on both sides.
fn with_lora(model: &mut CausalLm) -> Result<()> {
    model.add_lora(lora_config()?, 1)?;
    for v in model.trainable_vars() {
        nudge(&v)?;
    }
    Ok(())
}

fn nudge(v: &Var) -> Result<()> {
    Ok(v.set(&(v.as_tensor() + 0.05)?)?)
}

fn precision_name(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => "f32",
    }
}

fn check_model(dir: &Path, device: &Device, report: &mut Report) -> Result<()> {
    let name = dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let cpu = load(dir, &Device::Cpu, DType::F32)?;
    let batch = Batch::new(cpu.config().vocab_size)?;
    let on_device = batch.to_device(device)?;
    let want = Scores::rows_whole(&cpu, &batch)?;
    let mut cpu_lora = load(dir, &Device::Cpu, DType::F32)?;
    with_lora(&mut cpu_lora)?;
    let lora_want = Scores::rows_whole(&cpu_lora, &batch)?;
    for compute in [DType::F32, DType::BF16] {
        let p = precision_name(compute);
        let (logits, lp, grads) = if compute == DType::F32 {
            (F32_LOGITS, F32_LOG_PROBS, F32_GRADS)
        } else {
            (BF16_LOGITS, BF16_LOG_PROBS, BF16_GRADS)
        };
        let model = load(dir, device, compute)?;
        let got = Scores::rows_whole(&model, &on_device)?;
        report.compare(
            format!("{name} / logits / {p}"),
            &got.logits,
            &want.logits,
            logits,
        )?;
        report.compare(
            format!("{name} / log-probs / {p}"),
            &got.log_probs,
            &want.log_probs,
            lp,
        )?;
        report.compare(
            format!("{name} / entropy / {p}"),
            &got.entropy,
            &want.entropy,
            if compute == DType::F32 {
                lp
            } else {
                BF16_ENTROPY
            },
        )?;
        report.compare_all(
            &format!("{name} / gradients / {p}"),
            &got.grads,
            &want.grads,
            grads,
        )?;

        let (shared_lp, shared_grads) = shared_prompt_scores(&model, &on_device)?;
        report.compare(
            format!("{name} / shared-prompt log-probs / {p}"),
            &shared_lp,
            &want.log_probs,
            lp,
        )?;
        report.compare_all(
            &format!("{name} / shared-prompt gradients / {p}"),
            &shared_grads,
            &want.grads,
            grads,
        )?;

        let mut dev_lora = load(dir, device, DType::F32)?;
        dev_lora.add_lora(lora_config()?, 1)?;
        copy_trainable(&cpu_lora, &dev_lora)?;
        if compute != DType::F32 {
            dev_lora.set_compute_dtype(compute)?;
        }
        dev_lora.set_gradient_checkpointing(true);
        let lora_got = Scores::rows_whole(&dev_lora, &on_device)?;
        report.compare(
            format!("{name} / LoRA+checkpointing log-probs / {p}"),
            &lora_got.log_probs,
            &lora_want.log_probs,
            lp,
        )?;
        report.compare_all(
            &format!("{name} / LoRA+checkpointing gradients / {p}"),
            &lora_got.grads,
            &lora_want.grads,
            grads,
        )?;

        check_decoding(&name, &cpu, &model, p, lp, report)?;
        if !StaticDecode::supports(&model.generation_view()) {
            continue;
        }
        let fixed = decode_logits(&model, true)?;
        report.compare(
            format!("{name} / static decode logits vs CPU / {p}"),
            &fixed,
            &decode_logits(&cpu, false)?,
            logits,
        )?;
        report.compare(
            format!("{name} / static decode vs cached, same device / {p}"),
            &fixed,
            &decode_logits(&model, false)?,
            logits,
        )?;
    }
    Ok(())
}

/// Logits (f32, on the CPU) of a prefill and six decode steps of `model`'s generation view
/// through [`BatchDecoder`], with the static decoder (`fixed`) or the eager cached step: six
/// rows of three ragged prompts, fed tokens fixed by a rule; two rows drop at step 2 (kept in
/// the static batch) and two more at step 4 (the static batch compacts), and the cache, sized
/// for four new tokens, grows.
fn decode_logits(model: &CausalLm, fixed: bool) -> Result<Tensor> {
    let vocab = model.config().vocab_size as u32;
    let prompts = vec![
        vec![1 % vocab, 20 % vocab, 30 % vocab],
        vec![40 % vocab],
        vec![7 % vocab, 9 % vocab],
    ];
    let view = model.generation_view();
    let mut dec = BatchDecoder::new(&view, CacheMode::KvCache)
        .with_static_decode(fixed)
        .with_max_new_tokens(4);
    let host = |t: Tensor| to_cpu_f32(&t);
    let mut out = vec![host(dec.prefill(&prompts, 2)?)?];
    for step in 0..6u32 {
        let rows = dec.active_rows().to_vec();
        let keep: Vec<usize> = (0..rows.len())
            .filter(|&a| match step {
                2 => !rows[a].is_multiple_of(3),
                4 => rows[a].is_multiple_of(2),
                _ => true,
            })
            .collect();
        dec.retain(&keep)?;
        let tokens: Vec<u32> = keep
            .iter()
            .map(|&a| (rows[a] as u32 * 13 + step * 7 + 3) % vocab)
            .collect();
        out.push(host(dec.step(&tokens)?)?);
    }
    if dec.uses_static_decode() != fixed {
        bail!("the decoder did not take the static path it was asked for ({fixed})");
    }
    Ok(Tensor::cat(&out, 0)?)
}

/// Samples on the device with the KV cache and compares the log-probs it reports with one full
/// forward of the same sequences on the CPU.
fn check_decoding(
    name: &str,
    cpu: &CausalLm,
    model: &CausalLm,
    p: &str,
    tol: Tolerance,
    report: &mut Report,
) -> Result<()> {
    let vocab = cpu.config().vocab_size as u32;
    let prompts = vec![vec![1 % vocab, 20 % vocab, 30 % vocab], vec![40 % vocab]];
    let params = SamplingParams {
        num_generations: 2,
        max_new_tokens: 8,
        seed: 7,
        ..Default::default()
    };
    let out = generate_samples(model, &prompts, &params, None)?;
    let (ids, mask) = out.full_sequences()?;
    let (ids, mask) = (ids.to_device(&Device::Cpu)?, mask.to_device(&Device::Cpu)?);
    let t = out.completion_ids.dims()[1];
    let want = get_action_log_probs(cpu, &ids, &mask, t, 1.0, false)?.log_probs;
    report.compare(
        format!("{name} / KV-cache decode log-probs / {p}"),
        &out.sampling_log_probs,
        &want,
        tol,
    )
}

/// A few GRPO steps of the embedded model on the device; they must run without a skipped step.
fn check_grpo(device: DeviceSpec, steps: usize, extra: &[&str]) -> Result<serde_json::Value> {
    let out = std::env::temp_dir().join(format!("atomrl-device-check-{}", std::process::id()));
    let mut set: Vec<String> = vec![
        format!("model={:?}", embedded_model().display().to_string()),
        "dataset=\"synthetic\"".into(),
        format!("output_dir={:?}", out.display().to_string()),
        format!("device=\"{device}\""),
        format!("max_steps={steps}"),
        "batch_size=4".into(),
        "num_generations=8".into(),
        "max_completion_length=48".into(),
        "eval_size=0".into(),
        "save_steps=0".into(),
        "progress=false".into(),
    ];
    set.extend(extra.iter().map(|s| s.to_string()));
    let args = load_args(None, None, &set)?;
    let start = Instant::now();
    let summary = run_recipe(args)?;
    let seconds = start.elapsed().as_secs_f64();
    std::fs::remove_dir_all(&out).ok();
    let label = if extra.is_empty() {
        "f32".to_string()
    } else {
        extra.join(" ")
    };
    println!(
        "grpo {label}: {} steps, {} skipped, {seconds:.1} s",
        summary.steps, summary.skipped_steps
    );
    if summary.steps != steps as u64 || summary.skipped_steps != 0 {
        bail!(
            "GRPO on {device} ({label}): {} of {steps} steps, {} skipped",
            summary.steps,
            summary.skipped_steps
        );
    }
    Ok(json!({"settings": label, "steps": summary.steps, "seconds": seconds}))
}

/// Runs every check; fails when one is out of bounds.
pub fn run(a: &DeviceCheckArgs) -> Result<Vec<Comparison>> {
    let device = a.device.open()?;
    let scratch =
        std::env::temp_dir().join(format!("atomrl-device-check-models-{}", std::process::id()));
    let models = if a.models.is_empty() {
        let mut m = default_models();
        m.push(wide_vocab_model(&scratch)?);
        m
    } else {
        a.models.clone()
    };
    println!("device-check: {} against the CPU (f32 reference)", a.device);
    println!(
        "{:<56} {:>9} {:>4} {:>8}",
        "model / what / precision", "diff", "", "bound"
    );
    let mut report = Report::default();
    for dir in &models {
        check_model(dir, &device, &mut report)?;
    }
    std::fs::remove_dir_all(&scratch).ok();
    check_kernels(&device, &mut report)?;
    check_optimizer(&device, &mut report)?;
    let mut grpo = vec![];
    if a.grpo_steps > 0 {
        grpo.push(check_grpo(a.device, a.grpo_steps, &[])?);
        let lora = "lora={r=8, alpha=16.0, target_modules=[\"all-linear\"]}";
        grpo.push(check_grpo(
            a.device,
            a.grpo_steps,
            &["dtype=\"bf16\"", lora, "gradient_checkpointing=true"],
        )?);
    }
    if let Some(path) = &a.json {
        let rows: Vec<_> = report
            .rows
            .iter()
            .map(|r| json!({"name": r.name, "diff": r.diff, "bound": r.bound, "metric": r.metric.label(), "worst": r.worst, "passed": r.passed()}))
            .collect();
        let doc = json!({"device": a.device, "comparisons": rows, "grpo": grpo});
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let failed: Vec<&str> = report
        .rows
        .iter()
        .filter(|r| !r.passed())
        .map(|r| r.name.as_str())
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} of {} comparisons out of bounds: {}",
            failed.len(),
            report.rows.len(),
            failed.join("; ")
        );
    }
    println!(
        "device-check: all {} comparisons within bounds",
        report.rows.len()
    );
    Ok(report.rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the CPU the f32 rows compare the CPU with itself and the bf16 rows measure candle's CPU
    /// bf16 path against f32: all must pass, and the f32 rows must be exactly equal (same code,
    /// same device), which also shows that the comparison is not vacuous.
    #[test]
    fn the_cpu_agrees_with_itself_and_bf16_stays_within_bounds() {
        let scratch =
            std::env::temp_dir().join(format!("atomrl-device-check-test-{}", std::process::id()));
        let args = DeviceCheckArgs {
            device: DeviceSpec::Cpu,
            models: vec![
                default_models()[0].clone(),
                wide_vocab_model(&scratch).unwrap(),
            ],
            grpo_steps: 1,
            json: None,
        };
        let rows = run(&args).unwrap();
        std::fs::remove_dir_all(&scratch).ok();
        // models × precisions × rows, (5 decoder kernels, RoPE on a token-major input among
        // them, + the decode step's 2 + chunked attention + FlashAttention + the log-softmax +
        // the LM head + the device draw) × precisions × references, the optimizer's two.
        // The static decode rows: f32 only (the CPU has no bf16 static step).
        assert_eq!(rows.len(), 2 * 2 * 9 + 2 * 2 + 12 * 2 * 2 + 2);
        // The optimizer's rows: the same code on the same device.
        assert!(rows
            .iter()
            .filter(|r| r.name.starts_with("optimizer /"))
            .all(|r| r.diff == 0.0));
        let same_code = [
            "/ logits /",
            "/ log-probs /",
            "/ entropy /",
            "/ gradients /",
        ];
        for r in rows.iter().filter(|r| r.name.ends_with("/ f32")) {
            if same_code.iter().any(|s| r.name.contains(s)) {
                assert_eq!(r.diff, 0.0, "{}", r.name);
            }
        }
        // bf16 differs from f32 (else the bf16 path would not be running in bf16); on the CPU
        // a bf16 kernel row against the tensor ops compares the same code (no fused bf16 CPU
        // kernels), and the device draw's logits are exact in bf16 by design.
        assert!(rows
            .iter()
            .filter(|r| {
                r.name.ends_with("/ bf16")
                    && !r.name.contains("same device")
                    && !r.name.contains("device-pick")
            })
            .all(|r| r.diff > 0.0));
    }

    #[test]
    fn a_difference_out_of_bounds_fails_the_comparison() {
        let mut report = Report::default();
        let a = Tensor::new(&[1.0f32, 2.0], &Device::Cpu).unwrap();
        let b = Tensor::new(&[1.0f32, 2.1], &Device::Cpu).unwrap();
        report.compare("x".into(), &a, &b, F32_LOG_PROBS).unwrap();
        report.compare("y".into(), &a, &a, F32_LOG_PROBS).unwrap();
        let nan = Tensor::new(&[f32::NAN, 2.0], &Device::Cpu).unwrap();
        report.compare("z".into(), &nan, &a, F32_LOGITS).unwrap();
        let passed: Vec<bool> = report.rows.iter().map(Comparison::passed).collect();
        assert_eq!(passed, vec![false, true, false]);
    }
}
