//! Registration of this crate's functions with `atomrl-fn`.

use atomrl_core::{ArgSpec, AtomicFn, FnSpec, Inputs, OutputSpec, Outputs, Result};

use crate::{
    aggregate_loss, compute_kl_penalty, compute_policy_loss, entropy_from_logits, AggOptions,
    KlEstimator, LossAgg, PolicyLossOptions, RatioLevel, DEFAULT_CLIP_HIGH, DEFAULT_CLIP_LOW,
};
use atomrl_core::shape::scalar_f64;

/// The functions this crate registers with `atomrl-fn`.
pub fn functions() -> Vec<AtomicFn> {
    vec![
        AtomicFn {
            spec: COMPUTE_POLICY_LOSS,
            run: run_compute_policy_loss,
        },
        AtomicFn {
            spec: COMPUTE_KL_PENALTY,
            run: run_compute_kl_penalty,
        },
        AtomicFn {
            spec: AGGREGATE_LOSS,
            run: run_aggregate_loss,
        },
        AtomicFn {
            spec: ENTROPY_FROM_LOGITS,
            run: run_entropy_from_logits,
        },
        AtomicFn {
            spec: COMPUTE_SFT_LOSS,
            run: run_compute_sft_loss,
        },
        AtomicFn {
            spec: COMPUTE_VALUE_LOSS,
            run: run_compute_value_loss,
        },
        AtomicFn {
            spec: APPLY_KL_PENALTY,
            run: run_apply_kl_penalty,
        },
        AtomicFn {
            spec: COMPUTE_PG_LOSS,
            run: run_compute_pg_loss,
        },
    ]
    .into_iter()
    .chain(crate::registry_pairwise::functions())
    .collect()
}

const COMPUTE_PG_LOSS: FnSpec = FnSpec {
    name: "compute_pg_loss",
    crate_name: "atomrl-loss",
    summary: "Vanilla policy-gradient loss of A2C / REINFORCE: -A * log pi, no ratio, no clipping",
    formula: "\
l_t  = -A_t * logp_t          A per row [N] (broadcast over tokens) or per token [N, T]
loss = aggregate(l, mask) by loss_agg
Its gradient is -A * grad log pi; at ratio 1 it equals compute_policy_loss's gradient.
Differentiable w.r.t. log_probs. An entirely masked batch is an error.",
    inputs: &[
        ArgSpec::tensor(
            "log_probs",
            "[N, T]",
            "f32",
            "log-probs of the sampled tokens under the policy",
        ),
        ArgSpec::tensor(
            "advantages",
            "[N] or [N, T]",
            "f32",
            "one advantage per row, or per token (GAE)",
        ),
        ArgSpec::tensor("mask", "[N, T]", "f32", "1 on completion tokens"),
        ArgSpec::option("loss_agg", "string", "token_mean", LOSS_AGG_DOC),
        ArgSpec::optional(
            "max_len",
            "usize",
            "seq_mean_token_sum_norm's constant length (default T)",
        ),
    ],
    outputs: &[OutputSpec::new(
        "loss",
        "scalar",
        "f32",
        "aggregated -A * logp",
    )],
    example_input: r#"{"log_probs": [[-1.0, -2.0], [-0.5, -3.0]], "advantages": [1.0, -2.0], "mask": [[1, 1], [1, 0]]}"#,
    example_output: r#"{"loss": 0.6666667}"#,
};

fn run_compute_pg_loss(inputs: &Inputs) -> Result<Outputs> {
    let func = inputs.func();
    let loss = crate::compute_pg_loss(
        &inputs.float_tensor("log_probs")?,
        &inputs.float_tensor("advantages")?,
        &inputs.float_tensor("mask")?,
        &agg_options(inputs)?,
    )?;
    Ok(Outputs::new().scalar("loss", scalar_f64(func, &loss)?))
}

const APPLY_KL_PENALTY: FnSpec = FnSpec {
    name: "apply_kl_penalty",
    crate_name: "atomrl-loss",
    summary: "KL penalty in the reward (PPO): token-level rewards = scores - beta * KL(policy || reference)",
    formula: "\
kl_t     = estimator(log_probs_t, ref_log_probs_t) * m_t          (as compute_kl_penalty)
reward_t = (scores_t - beta * kl_t) * m_t                          verl apply_kl_penalty
kl_mean  = mean over rows of sum_t kl_t / (sum_t m_t + 1e-8)       verl actor/reward_kl_penalty
beta may come from an adaptive controller (atomrl_loss::AdaptiveKlController:
beta *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon).",
    inputs: &[
        ArgSpec::tensor("scores", "[N, T]", "f32", "token-level scores (the outcome reward on the last valid token)"),
        ArgSpec::tensor("log_probs", "[N, T]", "f32", "log-probs of the sampled tokens under the policy that sampled them"),
        ArgSpec::tensor("ref_log_probs", "[N, T]", "f32", "log-probs under the reference policy"),
        ArgSpec::tensor("mask", "[N, T]", "f32", "1 on completion tokens"),
        ArgSpec::required_option("beta", "f64", "KL coefficient (>= 0)"),
        ArgSpec::option("estimator", "string", "k1", "k1 | k2 | k3 | abs (aliases kl, mse, low_var_kl); verl's default kl_penalty is kl = k1"),
    ],
    outputs: &[
        OutputSpec::new("rewards", "[N, T]", "f32", "scores - beta * kl, 0 where masked"),
        OutputSpec::new("kl", "[N, T]", "f32", "per-token KL estimate, 0 where masked"),
        OutputSpec::new("kl_mean", "scalar", "f64", "mean over rows of each row's masked token mean"),
    ],
    example_input: r#"{"scores": [[0, 1]], "log_probs": [[-1.0, -2.0]], "ref_log_probs": [[-1.5, -2.0]], "mask": [[1, 1]], "beta": 0.1}"#,
    example_output: r#"{"rewards": {"shape": [1, 2], "data": [-0.05, 1.0]}, "kl": {"shape": [1, 2], "data": [0.5, 0.0]}, "kl_mean": 0.25}"#,
};

fn run_apply_kl_penalty(inputs: &Inputs) -> Result<Outputs> {
    let estimator: KlEstimator = inputs.opt_str("estimator")?.unwrap_or("k1").parse()?;
    let out = crate::apply_kl_penalty(
        &inputs.float_tensor("scores")?,
        &inputs.float_tensor("log_probs")?,
        &inputs.float_tensor("ref_log_probs")?,
        &inputs.float_tensor("mask")?,
        inputs.f64("beta")?,
        estimator,
    )?;
    Ok(Outputs::new()
        .tensor("rewards", &out.rewards)
        .tensor("kl", &out.kl)
        .scalar("kl_mean", out.kl_mean))
}

const COMPUTE_VALUE_LOSS: FnSpec = FnSpec {
    name: "compute_value_loss",
    crate_name: "atomrl-loss",
    summary: "Clipped value loss of a PPO critic, with its clip fraction",
    formula: "\
v_clip    = clamp(values, old_values - c, old_values + c)      c = clip_range_value
l         = max((values - returns)^2, (v_clip - returns)^2)
loss      = 0.5 * aggregate(l, mask) by loss_agg              verl compute_value_loss
clip_frac = masked mean of [(v_clip - returns)^2 > (values - returns)^2]
Differentiable w.r.t. values. An entirely masked batch is an error.",
    inputs: &[
        ArgSpec::tensor("values", "[N, T]", "f32", "the critic's new predictions"),
        ArgSpec::tensor(
            "old_values",
            "[N, T]",
            "f32",
            "its predictions when the experience was made",
        ),
        ArgSpec::tensor(
            "returns",
            "[N, T]",
            "f32",
            "the value targets (compute_gae's returns)",
        ),
        ArgSpec::tensor(
            "mask",
            "[N, T]",
            "f32",
            "1 on the tokens the model generated",
        ),
        ArgSpec::required_option(
            "clip_range_value",
            "f64",
            "c > 0 (verl cliprange_value 0.5, TRL 0.2)",
        ),
        ArgSpec::option("loss_agg", "string", "token_mean", LOSS_AGG_DOC),
        ArgSpec::optional(
            "max_len",
            "usize",
            "seq_mean_token_sum_norm's constant length (default T)",
        ),
    ],
    outputs: &[
        OutputSpec::new(
            "loss",
            "scalar",
            "f32",
            "0.5 * aggregated clipped squared error",
        ),
        OutputSpec::new(
            "clip_frac",
            "scalar",
            "f64",
            "share of valid tokens where the clipped error is larger",
        ),
    ],
    example_input: r#"{"values": [[1.0, 0.0]], "old_values": [[0.0, 0.0]], "returns": [[1.0, 0.5]], "mask": [[1, 1]], "clip_range_value": 0.2}"#,
    example_output: r#"{"loss": 0.2225, "clip_frac": 0.5}"#,
};

fn run_compute_value_loss(inputs: &Inputs) -> Result<Outputs> {
    let func = inputs.func();
    let out = crate::compute_value_loss(
        &inputs.float_tensor("values")?,
        &inputs.float_tensor("old_values")?,
        &inputs.float_tensor("returns")?,
        &inputs.float_tensor("mask")?,
        inputs.f64("clip_range_value")?,
        &agg_options(inputs)?,
    )?;
    Ok(Outputs::new()
        .scalar("loss", scalar_f64(func, &out.loss)?)
        .scalar("clip_frac", out.clip_frac))
}

const COMPUTE_SFT_LOSS: FnSpec = FnSpec {
    name: "compute_sft_loss",
    crate_name: "atomrl-loss",
    summary: "Supervised fine-tuning loss: token cross-entropy on completion tokens only (ignore_index = -100)",
    formula: "\
logp[n, t] = log_softmax(logits[n, t, :])[labels[n, t]]
scored     = labels != -100  (and mask = 1 when a mask is given)
loss       = sum(-logp * scored) / sum(scored)

As torch.nn.functional.cross_entropy(logits.view(-1, V), labels.view(-1), ignore_index=-100):
prompt and padding positions carry the label -100 (or mask 0) and do not count.
The library form compute_sft_loss(log_probs, mask, global_tokens) takes log-probs directly and
an optional global token count for exact gradient accumulation.",
    inputs: &[
        ArgSpec::tensor("logits", "[N, T, V]", "f32", "logits; position t predicts labels[:, t]"),
        ArgSpec::tensor("labels", "[N, T]", "i64", "target token ids, -100 = not scored"),
        ArgSpec::optional_tensor("mask", "[N, T]", "f32", "optional 0/1 mask of scored tokens"),
    ],
    outputs: &[
        OutputSpec::new("loss", "scalar", "f32", "mean NLL over scored tokens"),
        OutputSpec::new("per_token_loss", "[N, T]", "f32", "-log p(label), 0 where not scored"),
        OutputSpec::new("num_tokens", "scalar", "int", "scored tokens"),
    ],
    example_input: r#"{"logits": [[[0, 0], [1, 3]]], "labels": [[1, -100]]}"#,
    example_output: r#"{"loss": 0.6931472, "per_token_loss": {"shape": [1, 2], "data": [0.6931472, 0.0]}, "num_tokens": 1}"#,
};

fn run_compute_sft_loss(inputs: &Inputs) -> Result<Outputs> {
    let logits = inputs.float_tensor("logits")?;
    let labels = inputs.float_tensor("labels")?;
    let mask = inputs.opt_float_tensor("mask")?;
    let out = crate::compute_sft_loss_from_logits(&logits, &labels, mask.as_ref())?;
    Ok(Outputs::new()
        .scalar("loss", scalar_f64(inputs.func(), &out.loss)?)
        .tensor("per_token_loss", &out.per_token_loss)
        .int("num_tokens", out.num_tokens as i64))
}

const LOSS_AGG_DOC: &str =
    "token_mean | seq_mean_token_mean | seq_mean_token_sum | seq_mean_token_sum_norm \
(aliases: grpo, bnpo, dr_grpo, dapo, verl's hyphenated names)";

fn agg_options(inputs: &Inputs) -> Result<AggOptions> {
    let func = inputs.func();
    Ok(AggOptions {
        mode: LossAgg::parse_for(
            func,
            "loss_agg",
            inputs.opt_str("loss_agg")?.unwrap_or("token_mean"),
        )?,
        max_len: inputs.opt_usize("max_len")?,
        global_tokens: inputs.opt_f64("global_tokens")?,
        global_seqs: inputs.opt_f64("global_seqs")?,
    })
}

const COMPUTE_POLICY_LOSS: FnSpec = FnSpec {
    name: "compute_policy_loss",
    crate_name: "atomrl-loss",
    summary: "Clipped surrogate policy loss (PPO, GRPO, DAPO clip-higher, Dr. GRPO, GSPO, dual clip) with clip statistics",
    formula: "\
r   = exp(clamp(logp - old, -20, 20))                        ratio_level = token
    | exp(clamp(sum_t m*(logp - old) / sum_t m, -20, 20))    ratio_level = sequence (GSPO), per row
l   = max(-A*r, -A*clip(r, 1 - clip_low, 1 + clip_high))     PPO clipped surrogate, per token
l   = min(l, -A*c)  where A < 0                              dual clip, only when clip_ratio_c = c is given
loss = aggregate(l, m) by loss_agg:
  token_mean               loss = sum(l*m) / L_tok                      verl token-mean; TRL bnpo, dapo
  seq_mean_token_mean      loss = sum_i(sum_t l*m / max(sum_t m, 1)) / N_seq   verl seq-mean-token-mean; TRL grpo
  seq_mean_token_sum       loss = sum(l*m) / N_seq                      verl seq-mean-token-sum
  seq_mean_token_sum_norm  loss = sum(l*m) / (N_seq * max_len)          verl seq-mean-token-sum-norm; TRL dr_grpo
with L_tok = global_tokens or sum(m), N_seq = global_seqs or N (fully-masked rows count),
max_len defaulting to T. For gradient accumulation pass the whole batch's global_tokens /
global_seqs: the micro-batch losses then sum to the full-batch loss.
Differentiable w.r.t. log_probs. Masked positions are ignored; an entirely masked batch is an
error. Clip values >= 0 are accepted (0 included, as in verl's fixtures).
Statistics over valid tokens: clip_frac = share where -A*clip(r) > -A*r (verl pg_clipfrac),
split into clip_frac_low (A < 0) and clip_frac_high (A > 0); clip_frac_lower = share with
A < 0 and l > -A*c (verl pg_clipfrac_lower, dual clip only); ppo_kl = mean(old - logp) of the
clamped token log-ratio; ratio_mean, ratio_max of r.",
    inputs: &[
        ArgSpec::tensor("log_probs", "[N, T]", "f32", "log-probs of the sampled tokens under the current policy"),
        ArgSpec::tensor("old_log_probs", "[N, T]", "f32", "log-probs under the behaviour (rollout) policy"),
        ArgSpec::tensor("advantages", "[N] or [N, T]", "f32", "one advantage per completion (broadcast) or per token"),
        ArgSpec::tensor("mask", "[N, T]", "f32", "1 on completion tokens, 0 elsewhere"),
        ArgSpec::option("clip_low", "f64", "0.2", "epsilon_low: ratio clipped below at 1 - clip_low (>= 0)"),
        ArgSpec::option("clip_high", "f64", "0.2", "epsilon_high: ratio clipped above at 1 + clip_high (>= 0; DAPO 0.28)"),
        ArgSpec::optional("clip_ratio_c", "f64", "dual-clip constant c > 1 (verl clip_ratio_c, usually 3); absent = no dual clip"),
        ArgSpec::option("loss_agg", "string", "token_mean", LOSS_AGG_DOC),
        ArgSpec::optional("max_len", "usize", "seq_mean_token_sum_norm's constant length (default T)"),
        ArgSpec::option("ratio_level", "string", "token", "token | sequence (GSPO)"),
        ArgSpec::optional("global_tokens", "f64", "valid tokens over all micro-batches (token_mean normaliser)"),
        ArgSpec::optional("global_seqs", "f64", "rows over all micro-batches (seq_mean_* normaliser)"),
    ],
    outputs: &[
        OutputSpec::new("loss", "scalar", "f32", "the aggregated loss"),
        OutputSpec::new("per_token_loss", "[N, T]", "f32", "per-token loss l, 0 where masked"),
        OutputSpec::new("clip_frac", "scalar", "f64", "share of valid tokens where the clipped term is taken"),
        OutputSpec::new("clip_frac_low", "scalar", "f64", "... clipped at 1 - clip_low (A < 0)"),
        OutputSpec::new("clip_frac_high", "scalar", "f64", "... clipped at 1 + clip_high (A > 0)"),
        OutputSpec::new("clip_frac_lower", "scalar", "f64", "share where the dual-clip bound applies (with clip_ratio_c only)"),
        OutputSpec::new("ppo_kl", "scalar", "f64", "masked mean of old - logp (clamped)"),
        OutputSpec::new("ratio_mean", "scalar", "f64", "masked mean of r"),
        OutputSpec::new("ratio_max", "scalar", "f64", "max of r over valid tokens"),
    ],
    example_input: r#"{"log_probs": [[-1.0, -0.5, -0.2], [-2.0, -0.5, -3.0]], "old_log_probs": [[-1.0, -1.0, -0.3], [-1.5, -2.0, -0.5]], "advantages": [1.0, -1.0], "mask": [[1, 1, 1], [1, 1, 0]], "clip_high": 0.28, "clip_ratio_c": 3.0}"#,
    example_output: r#"{"loss": 0.0829658, "per_token_loss": {"shape": [2, 3], "data": [-1.0, -1.28, -1.1051710, 0.8, 3.0, 0.0]}, "clip_frac": 0.4, "clip_frac_low": 0.2, "clip_frac_high": 0.2, "clip_frac_lower": 0.2, "ppo_kl": -0.32, "ratio_mean": 1.7684223, "ratio_max": 4.4816890}"#,
};

fn run_compute_policy_loss(inputs: &Inputs) -> Result<Outputs> {
    let func = inputs.func();
    let opts = PolicyLossOptions {
        clip_low: inputs.opt_f64("clip_low")?.unwrap_or(DEFAULT_CLIP_LOW),
        clip_high: inputs.opt_f64("clip_high")?.unwrap_or(DEFAULT_CLIP_HIGH),
        clip_ratio_c: inputs.opt_f64("clip_ratio_c")?,
        ratio_level: inputs
            .opt_str("ratio_level")?
            .unwrap_or("token")
            .parse::<RatioLevel>()?,
        agg: agg_options(inputs)?,
    };
    let out = compute_policy_loss(
        &inputs.float_tensor("log_probs")?,
        &inputs.float_tensor("old_log_probs")?,
        &inputs.float_tensor("advantages")?,
        &inputs.float_tensor("mask")?,
        &opts,
    )?;
    let mut o = Outputs::new()
        .scalar("loss", scalar_f64(func, &out.loss)?)
        .tensor("per_token_loss", &out.per_token_loss)
        .scalar("clip_frac", out.clip_frac)
        .scalar("clip_frac_low", out.clip_frac_low)
        .scalar("clip_frac_high", out.clip_frac_high);
    if let Some(x) = out.clip_frac_lower {
        o = o.scalar("clip_frac_lower", x);
    }
    Ok(o.scalar("ppo_kl", out.ppo_kl)
        .scalar("ratio_mean", out.ratio_mean)
        .scalar("ratio_max", out.ratio_max))
}

const COMPUTE_KL_PENALTY: FnSpec = FnSpec {
    name: "compute_kl_penalty",
    crate_name: "atomrl-loss",
    summary: "Per-token KL estimate between policy and reference (k1, k2, k3 / low_var_kl, abs)",
    formula: "\
d = logp - ref  (log-probs of the sampled tokens)
  k1   kl = d                                                   verl kl / k1
  k2   kl = 0.5 * d^2                                           verl mse / k2
  k3   kl = clamp(exp(x) - x - 1, -10, 10), x = clamp(-d, -20, 20)   verl low_var_kl / k3; GRPO, TRL beta
  abs  kl = |d|                                                 verl abs
kl = 0 where masked; kl_mean = sum(kl*m) / sum(m). Differentiable w.r.t. log_probs.
An entirely masked batch is an error.",
    inputs: &[
        ArgSpec::tensor("log_probs", "[N, T]", "f32", "log-probs of the sampled tokens under the policy"),
        ArgSpec::tensor("ref_log_probs", "[N, T]", "f32", "log-probs under the reference policy"),
        ArgSpec::tensor("mask", "[N, T]", "f32", "1 on completion tokens"),
        ArgSpec::option("estimator", "string", "k3", "k1 | k2 | k3 | abs (aliases kl, mse, low_var_kl)"),
    ],
    outputs: &[
        OutputSpec::new("kl", "[N, T]", "f32", "per-token KL estimate, 0 where masked"),
        OutputSpec::new("kl_mean", "scalar", "f32", "masked token mean of kl"),
    ],
    example_input: r#"{"log_probs": [[-1.0, -2.0, -0.5], [-0.1, -0.7, -1.2]], "ref_log_probs": [[-1.0, -1.0, -9.0], [-0.3, -0.6, -1.0]], "mask": [[1, 1, 0], [1, 1, 1]], "estimator": "k3"}"#,
    example_output: r#"{"kl": {"shape": [2, 3], "data": [0.0, 0.7182817, 0.0, 0.0187308, 0.0051708, 0.0214027]}, "kl_mean": 0.1527172}"#,
};

fn run_compute_kl_penalty(inputs: &Inputs) -> Result<Outputs> {
    let func = inputs.func();
    let estimator: KlEstimator = inputs.opt_str("estimator")?.unwrap_or("k3").parse()?;
    let out = compute_kl_penalty(
        &inputs.float_tensor("log_probs")?,
        &inputs.float_tensor("ref_log_probs")?,
        &inputs.float_tensor("mask")?,
        estimator,
    )?;
    Ok(Outputs::new()
        .tensor("kl", &out.kl)
        .scalar("kl_mean", scalar_f64(func, &out.kl_mean)?))
}

const AGGREGATE_LOSS: FnSpec = FnSpec {
    name: "aggregate_loss",
    crate_name: "atomrl-loss",
    summary: "Reduce a per-token loss [N, T] to a scalar (token_mean, seq_mean_token_mean, seq_mean_token_sum, Dr. GRPO norm)",
    formula: "\
l = per_token_loss, m = mask:
  token_mean               loss = sum(l*m) / L_tok                      verl token-mean; TRL bnpo, dapo
  seq_mean_token_mean      loss = sum_i(sum_t l*m / max(sum_t m, 1)) / N_seq   verl seq-mean-token-mean; TRL grpo
  seq_mean_token_sum       loss = sum(l*m) / N_seq                      verl seq-mean-token-sum
  seq_mean_token_sum_norm  loss = sum(l*m) / (N_seq * max_len)          verl seq-mean-token-sum-norm; TRL dr_grpo
with L_tok = global_tokens or sum(m), N_seq = global_seqs or N (fully-masked rows count),
max_len defaulting to T. For gradient accumulation pass the whole batch's global_tokens /
global_seqs: the micro-batch losses then sum to the full-batch loss.
Masked positions are ignored; an entirely masked batch is an error.",
    inputs: &[
        ArgSpec::tensor("per_token_loss", "[N, T]", "f32", "per-token loss"),
        ArgSpec::tensor("mask", "[N, T]", "f32", "1 on completion tokens"),
        ArgSpec::option("loss_agg", "string", "token_mean", LOSS_AGG_DOC),
        ArgSpec::optional("max_len", "usize", "seq_mean_token_sum_norm's constant length (default T)"),
        ArgSpec::optional("global_tokens", "f64", "valid tokens over all micro-batches (token_mean normaliser)"),
        ArgSpec::optional("global_seqs", "f64", "rows over all micro-batches (seq_mean_* normaliser)"),
    ],
    outputs: &[OutputSpec::new("loss", "scalar", "f32", "the aggregated loss")],
    example_input: r#"{"per_token_loss": [[1, 2, 3], [4, 0, 0]], "mask": [[1, 1, 1], [1, 0, 0]], "loss_agg": "seq_mean_token_mean"}"#,
    example_output: r#"{"loss": 3.0}"#,
};

fn run_aggregate_loss(inputs: &Inputs) -> Result<Outputs> {
    let loss = aggregate_loss(
        &inputs.float_tensor("per_token_loss")?,
        &inputs.float_tensor("mask")?,
        &agg_options(inputs)?,
    )?;
    Ok(Outputs::new().scalar("loss", scalar_f64(inputs.func(), &loss)?))
}

const ENTROPY_FROM_LOGITS: FnSpec = FnSpec {
    name: "entropy_from_logits",
    crate_name: "atomrl-loss",
    summary: "Per-token entropy of softmax(logits), computed in chunks over positions",
    formula: "\
log_p = log_softmax(z) over V;  H = -sum_v exp(log_p) * log_p;  H = 0 where masked
entropy_mean = sum(H*m) / sum(m)  (0 when the mask is all zeros)
Processed in chunks of about 2^22 elements (rows x V), so a vocabulary of 151,936 needs no
second [N, T, V] buffer.",
    inputs: &[
        ArgSpec::tensor("logits", "[N, T, V]", "f32", "next-token logits"),
        ArgSpec::tensor("mask", "[N, T]", "f32", "1 on completion tokens"),
    ],
    outputs: &[
        OutputSpec::new(
            "entropy",
            "[N, T]",
            "f32",
            "per-token entropy (nats), 0 where masked",
        ),
        OutputSpec::new("entropy_mean", "scalar", "f64", "masked mean entropy"),
    ],
    example_input: r#"{"logits": [[[0, 0, 0, 0], [2, 1, 0, -1]]], "mask": [[1, 1]]}"#,
    example_output: r#"{"entropy": {"shape": [1, 2], "data": [1.3862944, 0.9475371]}, "entropy_mean": 1.1669157}"#,
};

fn run_entropy_from_logits(inputs: &Inputs) -> Result<Outputs> {
    let func = inputs.func();
    let mask = inputs.float_tensor("mask")?;
    let h = entropy_from_logits(&inputs.float_tensor("logits")?, &mask)?;
    let m = atomrl_core::shape::flat_f64(func, &mask)?;
    let hv = atomrl_core::shape::flat_f64(func, &h)?;
    let valid: f64 = m.iter().sum();
    let mean = if valid > 0.0 {
        hv.iter().zip(&m).map(|(h, m)| h * m).sum::<f64>() / valid
    } else {
        0.0
    };
    Ok(Outputs::new()
        .tensor("entropy", &h)
        .scalar("entropy_mean", mean))
}

#[cfg(test)]
mod tests {
    #[test]
    fn worked_examples_match_their_stored_outputs() {
        for f in super::functions() {
            atomrl_core::check_example(&f).unwrap();
        }
    }

    #[test]
    fn formulas_name_the_aggregations() {
        for f in super::functions() {
            assert!(!f.spec.formula.is_empty(), "{}", f.spec.name);
        }
    }
}

#[cfg(test)]
mod print_examples {
    #[test]
    #[ignore = "prints the worked examples' outputs, to refresh example_output"]
    fn print() {
        for f in super::functions() {
            let input: serde_json::Value = serde_json::from_str(f.spec.example_input).unwrap();
            println!(
                "{}: {}",
                f.spec.name,
                f.run_json(input).unwrap().to_json().unwrap()
            );
        }
    }
}
