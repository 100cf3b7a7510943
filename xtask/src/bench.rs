//! `cargo xtask bench`: decode throughput, one GRPO training step and peak memory on a
//! random-weight model of a given shape (no download: the GPU machine has no network).
//!
//! Decode: `atomrl_sample::generate_samples` (temperature 1, no stop token) on `B` random
//! prompts of `--prompt-len` tokens, `--new-tokens` new tokens each; the prefill is timed
//! separately (same call with one new token) so that decode tokens/s counts the cached steps
//! only. The memory-bandwidth bound of a decode step is the bytes it must read (every weight
//! once, in the compute dtype, plus the KV cache at the mean context length) over the HBM
//! bandwidth; the table shows the fraction of it reached.
//!
//! Training: one GRPO step on `--train-rows` completions of `--completion-len` tokens after a
//! `--prompt-len` prompt, in micro-batches of `--micro-batch` rows: forward and backward
//! through `atomrl_logprob::get_action_log_probs` and `atomrl_loss::compute_policy_loss`
//! (gradients summed over micro-batches), global-norm clipping and the trainer's AdamW on f32
//! master weights. One untimed warm-up step first, then `--train-steps` timed steps: the
//! figure (and `--profile`'s phases) are the median step's; the JSON keeps every step's time.
//!
//! Profile (`--profile`): the same measurements with the phases of [`atomrl_core::profile`]
//! on: each phase's time with the device synchronised at its boundaries, and the tensor
//! buffers (≈ tensor ops, kernel launches on a GPU) and bytes it allocated, per decode step,
//! per micro-batch forward and backward, and per optimizer step. One worker, so that phases
//! do not overlap; synchronising at every boundary makes the profiled step slower than the
//! plain one, so take step times from a run without `--profile`.
//!
//! Memory: on CUDA the process's GPU memory as `nvidia-smi` reports it (the whole GPU's used
//! memory where the container hides process ids), polled every 50 ms; on the CPU the resident
//! set size. Both are peaks over each measured phase, so they include candle's cached blocks.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use atomrl_core::{profile, CandleContext, ComputeDtype, DeviceSpec};
use atomrl_loss::{compute_policy_loss, AggOptions, PolicyLossOptions};
use atomrl_model::{Architecture, CausalLm, ModelConfig};
use atomrl_optim::{AdamW, AdamWConfig, Gradients};
use atomrl_sample::{generate_samples, SamplingParams};
use candle_core::{DType, Device, Tensor};
use serde_json::{json, Value};

/// Options of `cargo xtask bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// `cpu`, `cuda` or `cuda:N` (CUDA needs `--features cuda`).
    #[arg(long, default_value = "cpu")]
    pub device: DeviceSpec,
    /// Model shape: `tiny` (0.1 M parameters), `4m` (3.7 M, the shape of bench_hf_generate.py),
    /// `qwen2.5-0.5b` (494 M) or `wide-vocab` (Qwen's 151,936-token vocabulary on a 64-wide,
    /// 2-layer body: the LM head and log-softmax dominate, to measure their memory on a CPU).
    #[arg(long, default_value = "tiny")]
    pub shape: String,
    /// Compute dtypes to measure (master weights are always f32).
    #[arg(long, value_delimiter = ',', default_value = "f32,bf16")]
    pub dtypes: Vec<ComputeDtype>,
    /// Decode batch sizes.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    pub batches: Vec<usize>,
    /// Prompt tokens (decode and training).
    #[arg(long, default_value_t = 64)]
    pub prompt_len: usize,
    /// New tokens per decode row.
    #[arg(long, default_value_t = 128)]
    pub new_tokens: usize,
    /// Completions in the training step.
    #[arg(long, default_value_t = 64)]
    pub train_rows: usize,
    /// Completion tokens per training row.
    #[arg(long, default_value_t = 256)]
    pub completion_len: usize,
    /// Rows per micro-batch of the training step.
    #[arg(long, default_value_t = 8)]
    pub micro_batch: usize,
    /// Data-parallel workers of the training step (0: the trainer's automatic choice for the
    /// shape and the cores, `atomrl_trainer::runtime::cpu_plan`): each wave of `workers`
    /// micro-batches runs at once on its own threads, as the trainer's `workers` does.
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// Compute threads of each tensor op (0: the automatic choice, as `--workers`).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Recompute decoder layers in backward (gradient checkpointing).
    #[arg(long)]
    pub gradient_checkpointing: bool,
    /// Attention-score elements one attention may hold at once before it runs in chunks of
    /// queries (`CausalLm::set_attention_scores_budget`; default: the device's,
    /// `atomrl_model::default_scores_budget`: 2^24 on the CPU, 2^26 on a GPU)
    #[arg(long)]
    pub attention_scores_budget: Option<usize>,
    /// Memory bandwidth in GB/s for the decode bound (default: 3350, an H100 SXM's HBM3, on
    /// CUDA; on the CPU, measured: every core reading a 1 GiB buffer, the fastest of 3 passes).
    #[arg(long)]
    pub bandwidth_gbs: Option<f64>,
    /// Skip the decode measurements.
    #[arg(long)]
    pub skip_decode: bool,
    /// Skip the training step; decoding then runs as `atomrl-infer` runs it, one decoder on
    /// every core (unless `--threads` or `--workers` is given), not on a training worker's
    /// threads.
    #[arg(long)]
    pub skip_train: bool,
    /// Timed training steps after the warm-up: the figure is their median (a shared machine
    /// moves single steps by up to ±20%), and every step's time is printed and kept.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub train_steps: u64,
    /// Time and count the phases of each measurement (decode step, forward and backward per
    /// decoder layer, LM head, gradient clipping, optimizer...): see the module docs.
    #[arg(long)]
    pub profile: bool,
    /// Also time each op of a decoder layer alone at each decode batch (a CUDA graph of 50
    /// calls per op on a GPU: its GPU time; `atomrl_model::static_decode_op_times`).
    #[arg(long)]
    pub decode_ops: bool,
    /// Also time a decoder layer's training attention alone, at one micro-batch's rows, forward
    /// and forward with backward, in each form: tensor ops, chunks of queries, FlashAttention
    /// (CUDA) (`atomrl_model::attention_times`).
    #[arg(long)]
    pub attention_ops: bool,
    /// Also time each matrix product of a decoder layer's training step alone, at one
    /// micro-batch's rows, through the matmul kernel in use (gemm, or `ATOMRL_CBLAS`'s
    /// library): run with and without `ATOMRL_CBLAS` to compare (`matmul_bench`).
    #[arg(long)]
    pub train_matmuls: bool,
    /// Decoder layers instead of the shape's (with `--vocab`, to split a step's time between
    /// the layers and the LM head: run the shape, then fewer layers, then a small vocabulary).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Vocabulary size instead of the shape's.
    #[arg(long)]
    pub vocab: Option<usize>,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The configuration of a named shape.
pub fn shape_config(shape: &str) -> Result<ModelConfig> {
    let (vocab, hidden, inter, layers, heads, kv) = match shape {
        "tiny" => (512, 64, 128, 2, 4, 2),
        "4m" => (2048, 256, 768, 4, 4, 2),
        "wide-vocab" => (151_936, 64, 128, 2, 4, 2),
        "qwen2.5-0.5b" => (151_936, 896, 4864, 24, 14, 2),
        other => bail!("unknown --shape {other}: tiny, 4m, qwen2.5-0.5b or wide-vocab"),
    };
    let mut c = ModelConfig::new(Architecture::Qwen2, vocab, hidden, inter, layers, heads, kv)?;
    c.tie_word_embeddings = true;
    c.qkv_bias = true;
    if shape == "qwen2.5-0.5b" {
        c.rope_theta = 1_000_000.0;
        c.max_position_embeddings = 32_768;
    }
    Ok(c)
}

/// Bytes one decode step must read at batch `b`: every weight once (a tied embedding counts
/// once, as the LM head) plus the KV cache at `ctx` positions.
pub fn decode_step_bytes(c: &ModelConfig, dtype: DType, b: usize, ctx: usize) -> f64 {
    let size = dtype.size_in_bytes() as f64;
    let kv = c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * ctx * b;
    (c.num_parameters() as f64 + kv as f64) * size
}

/// Polls a memory reading (bytes) in the background and keeps the peak.
struct PeakMemory {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    handle: Option<thread::JoinHandle<()>>,
}

impl PeakMemory {
    fn start(device: &Device) -> Self {
        let peak = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let gpu = match device.location() {
            candle_core::DeviceLocation::Cuda { gpu_id } => Some(gpu_id),
            _ => None,
        };
        let (p, s) = (peak.clone(), stop.clone());
        let handle = thread::spawn(move || loop {
            let now = match gpu {
                Some(id) => gpu_memory(id).unwrap_or(0),
                None => rss_bytes().unwrap_or(0),
            };
            p.fetch_max(now, Ordering::Relaxed);
            if s.load(Ordering::Relaxed) {
                break;
            }
            thread::sleep(Duration::from_millis(50));
        });
        Self {
            peak,
            stop,
            handle: Some(handle),
        }
    }

    /// The peak in bytes since `start`.
    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

/// The resident set size of this process.
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// GPU memory of this process on GPU `id` (the whole GPU's used memory when `nvidia-smi`
/// does not list the process, as in many containers).
fn gpu_memory(id: usize) -> Option<u64> {
    let smi = |args: &[&str]| -> Option<String> {
        let out = Command::new("nvidia-smi").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let id = id.to_string();
    let pid = std::process::id().to_string();
    if let Some(apps) = smi(&[
        "-i",
        &id,
        "--query-compute-apps=pid,used_memory",
        "--format=csv,noheader,nounits",
    ]) {
        for line in apps.lines() {
            let mut f = line.split(',').map(str::trim);
            if f.next() == Some(pid.as_str()) {
                let mib: u64 = f.next()?.parse().ok()?;
                return Some(mib << 20);
            }
        }
    }
    let used = smi(&[
        "-i",
        &id,
        "--query-gpu=memory.used",
        "--format=csv,noheader,nounits",
    ])?;
    let mib: u64 = used.trim().parse().ok()?;
    Some(mib << 20)
}

/// The CPU's model name and vendor from `/proc/cpuinfo` (figures from one vendor say little
/// about another: docs/performance.md), or `unknown CPU`.
pub fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        info.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let flags = field("flags").unwrap_or_default();
    let avx512 = if flags.split_whitespace().any(|f| f == "avx512f") {
        ", AVX-512"
    } else {
        ""
    };
    match (field("model name"), field("vendor_id")) {
        (Some(m), Some(v)) => format!("{m} ({v}{avx512})"),
        (Some(m), None) => m,
        _ => "unknown CPU".into(),
    }
}

/// Deterministic token ids in `[1, vocab)`.
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            1 + (s % (vocab as u64 - 1)) as u32
        })
        .collect()
}

fn model(c: &ModelConfig, dtype: DType, a: &BenchArgs, device: &Device) -> Result<CausalLm> {
    let mut m = CausalLm::from_config_random(c.clone(), 0, DType::F32, device)?;
    m.set_compute_dtype(dtype)?;
    m.set_gradient_checkpointing(a.gradient_checkpointing);
    if let Some(budget) = a.attention_scores_budget {
        m.set_attention_scores_budget(budget);
    }
    Ok(m)
}

/// Seconds of `generate_samples` for `b` prompts and `new` new tokens.
fn time_generate(m: &CausalLm, a: &BenchArgs, b: usize, new: usize, dev: &Device) -> Result<f64> {
    let vocab = m.config().vocab_size;
    let prompts: Vec<Vec<u32>> = (0..b)
        .map(|i| tokens(a.prompt_len, vocab, i as u64 + 1))
        .collect();
    let params = SamplingParams {
        num_generations: 1,
        max_new_tokens: new,
        temperature: 1.0,
        seed: 7,
        ..Default::default()
    };
    dev.synchronize()?;
    let t = Instant::now();
    let out = generate_samples(m, &prompts, &params, None)?;
    dev.synchronize()?;
    let secs = t.elapsed().as_secs_f64();
    if out.num_generated_tokens != b * new {
        bail!(
            "generated {} tokens, expected {}",
            out.num_generated_tokens,
            b * new
        );
    }
    Ok(secs)
}

/// Decode figures of one batch size.
fn decode(m: &CausalLm, a: &BenchArgs, b: usize, bandwidth: f64, dev: &Device) -> Result<Value> {
    let mem = PeakMemory::start(dev);
    // Warm-up (kernels, allocator), then the prefill alone, then prefill + decode.
    time_generate(m, a, b, 2, dev)?;
    let prefill = time_generate(m, a, b, 1, dev)?;
    profile::reset();
    let total = time_generate(m, a, b, a.new_tokens, dev)?;
    let phases = profile::report();
    let peak = mem.finish();
    print!(
        "{}",
        profile::format_table(&format!("decode batch {b}"), &phases)
    );
    let steps = a.new_tokens.saturating_sub(1).max(1);
    let decode_secs = (total - prefill).max(1e-9);
    let tok_s = (b * steps) as f64 / decode_secs;
    let ctx = a.prompt_len + a.new_tokens / 2;
    let bound_step = decode_step_bytes(m.config(), m.compute_dtype(), b, ctx) / bandwidth;
    let bound_tok_s = b as f64 / bound_step;
    Ok(json!({
        "batch": b,
        "prefill_s": prefill,
        "total_s": total,
        "decode_tokens_per_s": tok_s,
        "decode_ms_per_step": 1e3 * decode_secs / steps as f64,
        "bound_tokens_per_s": bound_tok_s,
        "fraction_of_bound": tok_s / bound_tok_s,
        "cuda_graphs": dev.is_cuda() && atomrl_core::device::cuda_graphs(),
        "peak_memory_bytes": peak,
        "profile": profile_json(&phases),
    }))
}

/// `plan` with no worker left idle by a step of `micro_batches` micro-batches: fewer workers
/// with more threads each when there are fewer micro-batches than workers (the trainer never
/// has this case: it splits a step's rows into `accumulation × workers` micro-batches, while
/// the bench's `--micro-batch` fixes the rows per micro-batch). At 8 rows in one micro-batch
/// the automatic plan of a 2-core machine ran the step on one core of two.
fn fill_cores(
    plan: atomrl_trainer::runtime::CpuPlan,
    micro_batches: usize,
) -> atomrl_trainer::runtime::CpuPlan {
    let workers = plan.workers.min(micro_batches).max(1);
    atomrl_trainer::runtime::CpuPlan {
        threads: plan.threads * plan.workers / workers,
        workers,
    }
}

/// One GRPO optimizer step (forward + backward over micro-batches, clipping, AdamW).
fn train_step(
    m: &CausalLm,
    workers: usize,
    opt: &mut AdamW,
    batch: &(Tensor, Tensor, Tensor, Tensor),
    a: &BenchArgs,
) -> Result<f64> {
    let (ids, mask, completion_mask, adv) = batch;
    let rows = ids.dim(0)?;
    let params: Vec<(String, candle_core::Var)> = opt.params().to_vec();
    let opts = PolicyLossOptions {
        agg: AggOptions {
            global_tokens: Some((rows * a.completion_len) as f64),
            global_seqs: Some(rows as f64),
            ..AggOptions::default()
        },
        ..PolicyLossOptions::default()
    };
    let mut grads = Gradients::new();
    let mut loss_sum = 0.0;
    let chunks = atomrl_trainer::parallel::split_even(rows, rows.div_ceil(a.micro_batch.max(1)));
    // As the trainer does: the micro-batches share one mixed-precision cast of the weights.
    let casts = m.share_weight_casts();
    for wave in chunks.chunks(workers.max(1)) {
        let results = atomrl_trainer::parallel::run_shards("bench", wave.len(), |i| {
            let (start, len) = (wave[i].start, wave[i].len());
            let forward = profile::phase("train.forward", ids.device());
            let lp = atomrl_logprob::get_action_log_probs(
                m,
                &ids.narrow(0, start, len).ctx("bench")?,
                &mask.narrow(0, start, len).ctx("bench")?,
                a.completion_len,
                1.0,
                false,
            )?
            .log_probs;
            let out = compute_policy_loss(
                &lp,
                &lp.detach(),
                &adv.narrow(0, start, len).ctx("bench")?,
                &completion_mask.narrow(0, start, len).ctx("bench")?,
                &opts,
            )?;
            let loss = out
                .loss
                .to_dtype(DType::F64)
                .and_then(|l| l.to_scalar::<f64>())
                .ctx("bench")?;
            drop(forward);
            let _p = profile::phase("train.backward", ids.device());
            Ok((loss, out.loss.backward().ctx("bench")?))
        })?;
        for (loss, store) in results {
            loss_sum += loss;
            grads.accumulate(&store, &params)?;
        }
    }
    drop(casts);
    // As the trainer does (atomrl_trainer::clip_and_step): the clipping factor is applied by
    // the optimizer as it reads each gradient.
    let (_, clip) = grads.clip_factor(1.0)?;
    opt.step_scaled(&|name| grads.get(name), 1e-6, clip)?;
    Ok(loss_sum)
}

/// Training-step figures of one dtype.
fn train(m: &CausalLm, a: &BenchArgs, workers: usize, dev: &Device) -> Result<Value> {
    let vocab = m.config().vocab_size;
    let (rows, l) = (a.train_rows, a.prompt_len + a.completion_len);
    let ids = Tensor::from_vec(tokens(rows * l, vocab, 99), (rows, l), dev)?;
    let mask = Tensor::ones((rows, l), DType::U32, dev)?;
    let completion_mask = Tensor::ones((rows, a.completion_len), DType::F32, dev)?;
    let adv: Vec<f32> = (0..rows)
        .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    let adv = Tensor::from_vec(adv, rows, dev)?;
    let batch = (ids, mask, completion_mask, adv);
    let mut opt = AdamW::new(m.named_vars(), AdamWConfig::default())?;
    let mem = PeakMemory::start(dev);
    train_step(m, workers, &mut opt, &batch, a)?; // warm-up
    dev.synchronize()?;
    let mut timed = Vec::new();
    for _ in 0..a.train_steps {
        profile::reset();
        let t = Instant::now();
        let loss = train_step(m, workers, &mut opt, &batch, a)?;
        dev.synchronize()?;
        let secs = t.elapsed().as_secs_f64();
        if !loss.is_finite() {
            bail!("non-finite loss {loss}");
        }
        timed.push((secs, (loss, profile::report())));
    }
    let peak = mem.finish();
    let each: Vec<f64> = timed.iter().map(|(secs, _)| *secs).collect();
    let (secs, (loss, phases)) = median_by_time(timed).context("no training step was timed")?;
    print!("{}", profile::format_table("the training step", &phases));
    let tokens = (rows * l) as f64;
    Ok(json!({
        "rows": rows,
        "seq_len": l,
        "micro_batch": a.micro_batch,
        "workers": workers,
        "step_s": secs,
        "step_s_each": each,
        "tokens_per_s": tokens / secs,
        "loss": loss,
        "peak_memory_bytes": peak,
        "profile": profile_json(&phases),
    }))
}

/// The phases as JSON rows (empty when profiling is off).
fn profile_json(phases: &[profile::PhaseStats]) -> Value {
    json!(phases)
}

/// The entry of `timed` with the median time (the upper one of an even count), with what was
/// measured with it; `None` when `timed` is empty.
fn median_by_time<T>(mut timed: Vec<(f64, T)>) -> Option<(f64, T)> {
    timed.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mid = timed.len() / 2;
    (mid < timed.len()).then(|| timed.swap_remove(mid))
}

/// `  (median of 3: 1.010, 1.500, 1.030 s)`, every timed step in order, when there were several.
fn steps_note(each: &Value) -> String {
    let each: Vec<String> = each
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_f64)
        .map(|s| format!("{s:.3}"))
        .collect();
    if each.len() < 2 {
        return String::new();
    }
    format!("  (median of {}: {} s)", each.len(), each.join(", "))
}

fn gib(bytes: &Value) -> String {
    format!("{:.2}", bytes.as_f64().unwrap_or(0.0) / (1u64 << 30) as f64)
}

/// Runs the benchmark and prints the table (and writes `--json`).
pub fn run(a: &BenchArgs) -> Result<()> {
    let mut config = shape_config(&a.shape)?;
    if let Some(layers) = a.layers {
        config.num_hidden_layers = layers;
    }
    if let Some(vocab) = a.vocab {
        config.vocab_size = vocab;
    }
    // Before any tensor work: candle sizes its thread pools once.
    let plan = if a.device.is_cpu() {
        atomrl_trainer::runtime::cpu_plan(config.num_parameters(), a.threads, a.workers)
    } else {
        atomrl_trainer::runtime::CpuPlan {
            threads: a.threads,
            workers: 1,
        }
    };
    let plan = if a.device.is_cpu() && a.skip_train && a.workers == 0 && a.threads == 0 {
        // Decoding alone is one decoder, as `atomrl-infer` runs it: every core on each op.
        atomrl_trainer::runtime::CpuPlan {
            threads: plan.threads * plan.workers,
            workers: 1,
        }
    } else if a.device.is_cpu() && !a.skip_train && a.workers == 0 {
        let micro_batches = a.train_rows.div_ceil(a.micro_batch.max(1));
        let filled = fill_cores(plan, micro_batches);
        if filled != plan {
            println!(
                "{micro_batches} micro-batch(es) for {} workers: {} worker(s) of {} threads, so \
                 that no core idles",
                plan.workers, filled.workers, filled.threads
            );
        }
        filled
    } else {
        plan
    };
    let plan = if a.profile && plan.workers > 1 {
        println!(
            "--profile: 1 worker of {} threads (phases of concurrent workers would overlap)",
            plan.threads * plan.workers
        );
        atomrl_trainer::runtime::CpuPlan {
            threads: plan.threads * plan.workers,
            workers: 1,
        }
    } else {
        plan
    };
    atomrl_trainer::runtime::set_threads(plan.threads);
    profile::enable(a.profile);
    let device = a.device.open()?;
    let (bandwidth, bandwidth_source) = match a.bandwidth_gbs {
        Some(gbs) => (gbs * 1e9, "given"),
        None if device.is_cuda() => (3350e9, "an H100 SXM's HBM3"),
        None if a.skip_decode => (20e9, "assumed"),
        None => (
            crate::read_bandwidth::cpu_read_bandwidth_in_child()?,
            "measured",
        ),
    };
    let mem_kind = if device.is_cuda() {
        "GPU memory (nvidia-smi)"
    } else {
        "RSS"
    };
    println!(
        "AtomRL bench: shape {} ({:.1} M parameters), device {}, prompt {}, decode {} new \
         tokens, train {} × {} in micro-batches of {}{}; {} worker(s) of {} thread(s); bandwidth \
         bound at {:.1} GB/s ({bandwidth_source}); memory = peak {mem_kind}; CPU: {}; f32 CPU matmuls: {}",
        a.shape,
        config.num_parameters() as f64 / 1e6,
        a.device,
        a.prompt_len,
        a.new_tokens,
        a.train_rows,
        a.completion_len,
        a.micro_batch,
        if a.gradient_checkpointing {
            ", gradient checkpointing"
        } else {
            ""
        },
        plan.workers,
        candle_core::utils::get_num_threads(),
        bandwidth / 1e9,
        cpu_model(),
        atomrl_core::cblas::describe(),
    );
    let mut results = Vec::new();
    for name in &a.dtypes {
        let dtype = name.dtype();
        let m = model(&config, dtype, a, &device)
            .with_context(|| format!("building the {name} model"))?;
        let mut decode_rows = Vec::new();
        if !a.skip_decode {
            for &b in &a.batches {
                let r = decode(&m, a, b, bandwidth, &device)
                    .with_context(|| format!("decode {name} batch {b}"))?;
                println!(
                    "decode {name:>4} batch {b:>4}: {:>10.1} tok/s  {:>8.2} ms/step  \
                     prefill {:>7.3} s  bound {:>10.1} tok/s ({:>5.1}%)  peak {} GiB",
                    r["decode_tokens_per_s"].as_f64().unwrap_or(0.0),
                    r["decode_ms_per_step"].as_f64().unwrap_or(0.0),
                    r["prefill_s"].as_f64().unwrap_or(0.0),
                    r["bound_tokens_per_s"].as_f64().unwrap_or(0.0),
                    100.0 * r["fraction_of_bound"].as_f64().unwrap_or(0.0),
                    gib(&r["peak_memory_bytes"]),
                );
                decode_rows.push(r);
            }
        }
        let mut op_rows = Vec::new();
        if a.decode_ops {
            for &b in &a.batches {
                let cap = a.prompt_len + a.new_tokens;
                let times =
                    atomrl_model::static_decode_op_times(&config, b, cap, dtype, &device, 50)
                        .with_context(|| format!("decode ops {name} batch {b}"))?;
                println!(
                    "decode ops {name} batch {b} (µs per call, one layer's ops and the LM head):"
                );
                for (op, us) in &times {
                    println!("  {op:<64} {us:>9.1}");
                }
                let ops: Vec<Value> = times
                    .iter()
                    .map(|(op, us)| json!({"op": op, "us": us}))
                    .collect();
                op_rows.push(json!({"batch": b, "cap": cap, "ops": ops}));
            }
        }
        let attention_rows = if a.attention_ops {
            attention_ops(&config, a, dtype, &device)
                .with_context(|| format!("attention ops {name}"))?
        } else {
            Vec::new()
        };
        let mut matmul_rows = Vec::new();
        if a.train_matmuls {
            let seq = a.prompt_len + a.completion_len;
            let times = crate::matmul_bench::train_matmul_times(
                &config,
                a.micro_batch,
                seq,
                dtype,
                &device,
            )
            .with_context(|| format!("training matmuls {name}"))?;
            println!(
                "training matmuls {name}, one decoder layer, {} × {seq} rows ({}):",
                a.micro_batch,
                atomrl_core::cblas::describe()
            );
            for t in &times {
                let (b, m, k, n) = t.dims;
                println!(
                    "  {:<24} [{b}, {m}, {k}] · [{k}, {n}]  {:>9.3} ms  {:>7.1} GFLOPS",
                    t.name,
                    t.ms,
                    t.gflops()
                );
                matmul_rows.push(json!({"op": t.name, "dims": [b, m, k, n], "ms": t.ms}));
            }
            let layer: f64 = times
                .iter()
                .map(|t| t.ms * if t.name.contains("×2") { 2.0 } else { 1.0 })
                .sum();
            println!("  a layer's products in all: {layer:.2} ms");
        }
        let train_row = if a.skip_train {
            Value::Null
        } else {
            let r = train(&m, a, plan.workers, &device)
                .with_context(|| format!("training step {name}"))?;
            println!(
                "train  {name:>4} {} × {}: {:>8.3} s/step  {:>10.1} tok/s  peak {} GiB{}",
                a.train_rows,
                a.prompt_len + a.completion_len,
                r["step_s"].as_f64().unwrap_or(0.0),
                r["tokens_per_s"].as_f64().unwrap_or(0.0),
                gib(&r["peak_memory_bytes"]),
                steps_note(&r["step_s_each"]),
            );
            r
        };
        results.push(json!({"dtype": name, "decode": decode_rows, "decode_ops": op_rows, "attention_ops": attention_rows, "train_matmuls": matmul_rows, "train": train_row}));
    }
    if let Some(path) = &a.json {
        let doc = json!({
            "framework": "atomrl-candle",
            "shape": a.shape,
            "device": a.device,
            "num_parameters": config.num_parameters(),
            "prompt_len": a.prompt_len,
            "new_tokens": a.new_tokens,
            "bandwidth_gbs": bandwidth / 1e9,
            "bandwidth_source": bandwidth_source,
            "gradient_checkpointing": a.gradient_checkpointing,
            "attention_scores_budget": a
                .attention_scores_budget
                .unwrap_or_else(|| atomrl_model::default_scores_budget(&device)),
            "cpu": cpu_model(),
            "cpu_matmuls": atomrl_core::cblas::describe(),
            // `ATOMRL_FLASH_ATTENTION` as this process read it (CUDA only): Off,
            // PastBudgetOnTensorCores (the default), PastBudget or Always.
            "flash_attention": format!("{:?}", atomrl_model::FlashPolicy::current()),
            "profiled": a.profile,
            "results": results,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// `--attention-ops`: each attention form's time at one micro-batch's rows, printed and as
/// JSON rows.
fn attention_ops(
    config: &ModelConfig,
    a: &BenchArgs,
    dtype: DType,
    device: &Device,
) -> Result<Vec<Value>> {
    let seq = a.prompt_len + a.completion_len;
    let times = atomrl_model::attention_times(config, a.micro_batch, seq, dtype, device, 10)?;
    println!(
        "attention ops {dtype:?}, one decoder layer, {} × {seq} tokens (ms per call):",
        a.micro_batch
    );
    Ok(times
        .iter()
        .map(|t| {
            println!(
                "  {:<28} forward {:>9.3}  forward + backward {:>9.3}",
                t.form, t.forward_ms, t.forward_backward_ms
            );
            json!({"form": t.form, "forward_ms": t.forward_ms,
                   "forward_backward_ms": t.forward_backward_ms})
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::{fill_cores, median_by_time, steps_note};
    use atomrl_trainer::runtime::CpuPlan;
    use serde_json::json;

    #[test]
    fn the_median_step_keeps_its_own_measurements() {
        let timed = vec![(1.5, "slow"), (1.0, "fast"), (1.2, "middle")];
        assert_eq!(median_by_time(timed), Some((1.2, "middle")));
        // An even count takes the upper of the two middle steps.
        let timed = vec![(0.9, 'a'), (1.1, 'b'), (1.0, 'c'), (2.0, 'd')];
        assert_eq!(median_by_time(timed), Some((1.1, 'b')));
        assert_eq!(median_by_time(Vec::<(f64, ())>::new()), None);
    }

    #[test]
    fn several_steps_are_listed_after_their_median() {
        assert_eq!(steps_note(&json!([1.0])), "");
        assert_eq!(
            steps_note(&json!([1.01, 1.5, 1.03])),
            "  (median of 3: 1.010, 1.500, 1.030 s)"
        );
    }

    #[test]
    fn fewer_micro_batches_than_workers_get_the_idle_workers_threads() {
        let two = CpuPlan {
            threads: 1,
            workers: 2,
        };
        let one_of_two = CpuPlan {
            threads: 2,
            workers: 1,
        };
        assert_eq!(fill_cores(two, 1), one_of_two);
        assert_eq!(fill_cores(two, 2), two);
        assert_eq!(fill_cores(two, 8), two);
        // Threads stay whole: 3 workers of 2 threads for 2 micro-batches give 2 of 3.
        let three = CpuPlan {
            threads: 2,
            workers: 3,
        };
        assert_eq!(
            fill_cores(three, 2),
            CpuPlan {
                threads: 3,
                workers: 2
            }
        );
        // No micro-batch (a step skipped): the plan keeps one worker.
        assert_eq!(fill_cores(two, 0), one_of_two);
    }
}
