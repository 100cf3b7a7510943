//! Registration of this crate's functions with `atomrl-fn`.

use atomrl_core::{ArgSpec, AtomicFn, FnSpec, Inputs, OutputSpec, Outputs, Result};

use crate::{compute_advantages, compute_gae, filter_groups, AdvantageMode, DEFAULT_EPS};

/// The functions this crate registers with `atomrl-fn`.
pub fn functions() -> Vec<AtomicFn> {
    vec![
        AtomicFn {
            spec: COMPUTE_ADVANTAGES,
            run: run_compute_advantages,
        },
        AtomicFn {
            spec: FILTER_GROUPS,
            run: run_filter_groups,
        },
        AtomicFn {
            spec: COMPUTE_GAE,
            run: run_compute_gae,
        },
    ]
}

const COMPUTE_GAE: FnSpec = FnSpec {
    name: "compute_gae",
    crate_name: "atomrl-advantage",
    summary: "Generalized advantage estimation and returns from token-level rewards and a critic's values (PPO)",
    formula: "\
Per row, from the last token to the first (verl compute_gae_advantage_return):
  delta_t = r_t + gamma * V_next - V_t
  A_t     = delta_t + gamma * lam * A_next
  V_next, A_next <- V_t, A_t after a valid token; unchanged after a masked one
            (a tool observation inside a row carries the next value and the running GAE)
  R_t     = A_t + V_t                          (the critic's target, before whitening)
V_next and A_next start at 0. With whiten (default): A = (A - mean) / sqrt(var + 1e-8), the
masked mean sum(A*m) / (sum(m) + 1e-8) and the unbiased masked variance over the batch.
Both outputs are 0 where mask = 0. Errors: gamma or lam outside [0, 1]; whitening with fewer
than 2 valid tokens.",
    inputs: &[
        ArgSpec::tensor("rewards", "[N, T]", "f32", "token-level rewards (the outcome reward on the last valid token, plus per-token terms)"),
        ArgSpec::tensor("values", "[N, T]", "f32", "the critic's value of each token"),
        ArgSpec::tensor("mask", "[N, T]", "f32", "1 on the tokens the model generated"),
        ArgSpec::required_option("gamma", "f64", "discount, in [0, 1] (PPO on LLMs: 1)"),
        ArgSpec::required_option("lam", "f64", "GAE lambda, in [0, 1] (verl and TRL: 0.95)"),
        ArgSpec::option("whiten", "bool", "true", "standardise the advantages over the valid tokens"),
    ],
    outputs: &[
        OutputSpec::new("advantages", "[N, T]", "f32", "per-token advantages, 0 where masked"),
        OutputSpec::new("returns", "[N, T]", "f32", "per-token returns (value targets), 0 where masked"),
    ],
    example_input: r#"{"rewards": [[0, 0, 1], [0, 0, 0]], "values": [[0.5, 0.5, 0.5], [0.2, 0.1, 0.0]], "mask": [[1, 1, 1], [1, 1, 0]], "gamma": 1.0, "lam": 1.0, "whiten": false}"#,
    example_output: r#"{"advantages": {"shape": [2, 3], "data": [0.5, 0.5, 0.5, -0.2, -0.1, 0.0]}, "returns": {"shape": [2, 3], "data": [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]}}"#,
};

fn run_compute_gae(inputs: &Inputs) -> Result<Outputs> {
    let out = compute_gae(
        &inputs.float_tensor("rewards")?,
        &inputs.float_tensor("values")?,
        &inputs.float_tensor("mask")?,
        inputs.f64("gamma")?,
        inputs.f64("lam")?,
        inputs.opt_bool("whiten")?.unwrap_or(true),
    )?;
    Ok(Outputs::new()
        .tensor("advantages", &out.advantages)
        .tensor("returns", &out.returns))
}

const COMPUTE_ADVANTAGES: FnSpec = FnSpec {
    name: "compute_advantages",
    crate_name: "atomrl-advantage",
    summary: "Group-relative advantages from one reward per completion (GRPO, Dr. GRPO, RLOO, REINFORCE++, batch)",
    formula: "\
Rows are grouped consecutively: row i belongs to group i / G. mean_g and std_g are the
group's mean and unbiased (N-1) standard deviation, computed in f64.

  raw           A = r
  grpo          A = (r - mean_g) / (std_g + eps)            GRPO; verl 'grpo'; TRL default
  grpo_no_std   A = r - mean_g                              Dr. GRPO; TRL scale_rewards='none'
  batch         A = (r - mean_g) / (std(r over batch) + eps) TRL scale_rewards='batch'
  rloo          A = r_i - (sum_g r - r_i) / (G - 1)         RLOO; verl 'rloo'
  reinforce_pp  x = r - mean_g;  A = x / sqrt(sum(x^2)/(N-1) + 1e-8)   REINFORCE++ baseline

A group whose rewards are all equal gets advantages of exactly 0 in every mode but raw.
Aliases: dr_grpo = grpo_no_std.",
    inputs: &[
        ArgSpec::tensor("rewards", "[N]", "f32", "one scalar reward per completion, N = prompts x G"),
        ArgSpec::required_option("group_size", "usize", "G, completions per prompt (>= 2, divides N)"),
        ArgSpec::option("mode", "string", "grpo", "raw | grpo | grpo_no_std | batch | rloo | reinforce_pp"),
        ArgSpec::option("eps", "f64", "1e-6", "added to the std (> 0)"),
    ],
    outputs: &[
        OutputSpec::new("advantages", "[N]", "f32", "one advantage per completion"),
        OutputSpec::new("group_mean", "[N/G]", "f32", "mean reward of each group"),
        OutputSpec::new("group_std", "[N/G]", "f32", "unbiased std of each group (0 when flat)"),
        OutputSpec::new("num_flat_groups", "scalar", "int", "groups whose rewards are all equal"),
    ],
    example_input: r#"{"rewards": [1, 0, 0, 1, 1, 1, 1, 1], "group_size": 4, "mode": "grpo"}"#,
    example_output: r#"{"advantages": {"shape": [8], "data": [0.8660239, -0.8660239, -0.8660239, 0.8660239, 0.0, 0.0, 0.0, 0.0]}, "group_mean": {"shape": [2], "data": [0.5, 1.0]}, "group_std": {"shape": [2], "data": [0.57735026, 0.0]}, "num_flat_groups": 1}"#,
};

fn run_compute_advantages(inputs: &Inputs) -> Result<Outputs> {
    let rewards = inputs.float_tensor("rewards")?;
    let mode: AdvantageMode = inputs.opt_str("mode")?.unwrap_or("grpo").parse()?;
    let eps = inputs.opt_f64("eps")?.unwrap_or(DEFAULT_EPS);
    let out = compute_advantages(&rewards, inputs.usize("group_size")?, mode, eps)?;
    Ok(Outputs::new()
        .tensor("advantages", &out.advantages)
        .tensor("group_mean", &out.group_mean)
        .tensor("group_std", &out.group_std)
        .int("num_flat_groups", out.num_flat_groups as i64))
}

const FILTER_GROUPS: FnSpec = FnSpec {
    name: "filter_groups",
    crate_name: "atomrl-advantage",
    summary: "DAPO dynamic sampling: keep only groups whose metric has non-zero spread",
    formula: "\
keep_g = 1 if the G values of group g are not all equal, else 0   (verl filter_groups)
keep_mask[i] = keep_{i / G}

A group whose completions all scored the same has zero advantage under every centring
estimator, so DAPO drops it and samples more prompts to fill the batch.",
    inputs: &[
        ArgSpec::tensor(
            "metric",
            "[N]",
            "f32",
            "per-completion metric (reward or accuracy)",
        ),
        ArgSpec::required_option(
            "group_size",
            "usize",
            "G, completions per prompt (>= 2, divides N)",
        ),
    ],
    outputs: &[
        OutputSpec::new("keep_mask", "[N]", "f32", "1 for rows of kept groups"),
        OutputSpec::new("kept_groups", "[K]", "int", "indices of kept groups"),
        OutputSpec::new("num_kept", "scalar", "int", "kept groups"),
        OutputSpec::new("num_dropped", "scalar", "int", "dropped (flat) groups"),
    ],
    example_input: r#"{"metric": [1, 1, 0, 1, 0, 0], "group_size": 2}"#,
    example_output: r#"{"keep_mask": {"shape": [6], "data": [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]}, "kept_groups": [1], "num_kept": 1, "num_dropped": 2}"#,
};

fn run_filter_groups(inputs: &Inputs) -> Result<Outputs> {
    let metric = inputs.float_tensor("metric")?;
    let out = filter_groups(&metric, inputs.usize("group_size")?)?;
    Ok(Outputs::new()
        .tensor("keep_mask", &out.keep_mask)
        .json("kept_groups", out.kept_groups.into())
        .int("num_kept", out.num_kept as i64)
        .int("num_dropped", out.num_dropped as i64))
}

#[cfg(test)]
mod tests {
    #[test]
    fn worked_examples_match_their_stored_outputs() {
        for f in super::functions() {
            atomrl_core::check_example(&f).unwrap();
        }
    }
}
