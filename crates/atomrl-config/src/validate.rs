//! Range and name checks of [`GRPOArgs`], each error naming the key.

use atomrl_core::{Error, Result};

use super::args::{GRPOArgs, Recipe};

const FUNC: &str = "config";

/// Checks every option's range, the reward names and the resume folder (the closed sets of
/// choices are enums, checked when the configuration is parsed).
///
/// # Errors
/// [`Error::Value`] / [`Error::UnknownChoice`] naming the key.
pub fn validate(a: &GRPOArgs) -> Result<()> {
    check_sources(a)?;
    check_ranges(a)?;
    check_counts(a)?;
    check_recipe(a)?;
    check_critic(a)?;
    check_dpo(a)?;
    check_resume(a)
}

/// The model, the data and where they run.
fn check_sources(a: &GRPOArgs) -> Result<()> {
    if a.model.trim().is_empty() {
        return Err(Error::missing(
            FUNC,
            "model",
            "a local Hugging Face folder or a hub id",
        ));
    }
    if a.output_dir.trim().is_empty() {
        // An empty path is the current folder: the run's files would land among the user's.
        return Err(Error::missing(
            FUNC,
            "output_dir",
            "a folder for the run's checkpoints and metrics",
        ));
    }
    let out = std::path::Path::new(&a.output_dir);
    if out.exists() && !out.is_dir() {
        let got = format!("{}, which is a file", out.display());
        return Err(Error::value(
            FUNC,
            "output_dir",
            "a folder (or a path to create one at)",
            got,
        ));
    }
    if a.dataset.trim().is_empty() {
        return Err(Error::missing(
            FUNC,
            "dataset",
            "a JSONL/parquet file or a hub dataset id",
        ));
    }
    if a.workers > 1 && !a.device.is_cpu() {
        return Err(Error::value(
            FUNC,
            "workers",
            "1 on a GPU (data-parallel workers are a CPU feature)",
            a.workers,
        ));
    }
    Ok(())
}

/// The real-valued options' ranges.
fn check_ranges(a: &GRPOArgs) -> Result<()> {
    positive("lr", a.lr)?;
    positive("temperature", a.temperature)?;
    positive("adam_eps", a.adam_eps)?;
    positive("advantage_eps", a.advantage_eps)?;
    non_negative("weight_decay", a.weight_decay)?;
    non_negative("max_grad_norm", a.max_grad_norm)?;
    non_negative("beta", a.beta)?;
    non_negative("clip_low", a.clip_low)?;
    non_negative("clip_high", a.clip_high)?;
    non_negative("entropy_coef", a.entropy_coef)?;
    non_negative("time_budget_s", a.time_budget_s)?;
    non_negative("overlong_penalty_factor", a.overlong_penalty_factor)?;
    for (key, v) in [("adam_beta1", a.adam_beta1), ("adam_beta2", a.adam_beta2)] {
        if !(0.0..1.0).contains(&v) {
            return Err(Error::value(FUNC, key, "in [0, 1)", v));
        }
    }
    for (key, v) in [
        ("top_p", a.top_p),
        ("warmup_ratio", a.warmup_ratio),
        ("min_lr_ratio", a.min_lr_ratio),
    ] {
        if !(0.0..=1.0).contains(&v) {
            return Err(Error::value(FUNC, key, "in [0, 1]", v));
        }
    }
    check_lr_horizon(a)?;
    if !(0.0..1.0).contains(&a.min_p) {
        return Err(Error::value(FUNC, "min_p", "in [0, 1)", a.min_p));
    }
    positive("repetition_penalty", a.repetition_penalty)?;
    if let Some(c) = a.clip_ratio_c {
        if !(c.is_finite() && c > 1.0) {
            return Err(Error::value(FUNC, "clip_ratio_c", "a finite number > 1", c));
        }
    }
    Ok(())
}

/// `lr_horizon_exponent`'s range; a rule with `lr_horizon_steps` set needs it (0 steps: off).
fn check_lr_horizon(a: &GRPOArgs) -> Result<()> {
    let e = a.lr_horizon_exponent;
    if !(0.0..=1.0).contains(&e) {
        return Err(Error::value(FUNC, "lr_horizon_exponent", "in [0, 1]", e));
    }
    if a.lr_horizon_steps > 0 && e == 0.0 {
        return Err(Error::value(
            FUNC,
            "lr_horizon_exponent",
            format!(
                "in (0, 1] when lr_horizon_steps is set (it is {})",
                a.lr_horizon_steps
            ),
            e,
        ));
    }
    Ok(())
}

/// The sizes and counts.
fn check_counts(a: &GRPOArgs) -> Result<()> {
    at_least("batch_size", a.batch_size, 1)?;
    at_least(
        "gradient_accumulation_steps",
        a.gradient_accumulation_steps,
        1,
    )?;
    at_least("max_prompt_length", a.max_prompt_length, 1)?;
    at_least("max_completion_length", a.max_completion_length, 1)?;
    at_least("num_iterations", a.num_iterations, 1)?;
    if let Some(budget) = a.attention_scores_budget {
        at_least("attention_scores_budget", budget, 1)?;
    }
    at_least("max_num_gen_batches", a.max_num_gen_batches, 1)?;
    if a.max_steps == 0 {
        at_least("epochs", a.epochs, 1)?;
    }
    check_step_rows(a)?;
    for (key, v) in [("threads", a.threads), ("workers", a.workers)] {
        if v > MAX_THREADS_OR_WORKERS {
            return Err(Error::value(
                FUNC,
                key,
                format!("at most {MAX_THREADS_OR_WORKERS} (0 = chosen from the cores)"),
                v,
            ));
        }
    }
    Ok(())
}

/// The most rows one step may hold: the bound of one generation call
/// ([`atomrl_sample::MAX_ROWS`]). A step's rows (prompts × completions) are all in memory at
/// once, in tensors and per-row host buffers; a count past this is a typo, and without the
/// check it ends in an allocation failure (an abort) minutes into the run instead of an error
/// naming the key.
pub const MAX_STEP_ROWS: usize = atomrl_sample::MAX_ROWS;

/// The most compute threads of an op, and the most data-parallel workers: more than the
/// largest CPU servers' hardware threads. Each worker holds its own gradient store, and
/// without the bound a typo spawned threads until the run aborted.
pub const MAX_THREADS_OR_WORKERS: usize = 1024;

/// A step's rows (prompts × completions when the recipe samples) within [`MAX_STEP_ROWS`].
fn check_step_rows(a: &GRPOArgs) -> Result<()> {
    if matches!(a.recipe, Recipe::Sft | Recipe::Reward) {
        if a.batch_size > MAX_STEP_ROWS {
            let expected = format!("at most {MAX_STEP_ROWS} (the rows of a step)");
            return Err(Error::value(FUNC, "batch_size", expected, a.batch_size));
        }
        return Ok(());
    }
    let (b, g) = (a.batch_size, a.num_generations);
    let rows = match b.checked_mul(g) {
        Some(rows) if rows <= MAX_STEP_ROWS => return Ok(()),
        Some(rows) => rows.to_string(),
        None => "more than usize holds".to_string(),
    };
    let expected = format!(
        "such that batch_size × num_generations, the rows of a step, is at most {MAX_STEP_ROWS}"
    );
    let (key, got) = if g > b {
        (
            "num_generations",
            format!("{g} (× batch_size {b} = {rows} rows)"),
        )
    } else {
        (
            "batch_size",
            format!("{b} (× num_generations {g} = {rows} rows)"),
        )
    };
    Err(Error::value(FUNC, key, expected, got))
}

/// What the recipe needs: groups and rewards for GRPO/DAPO, a valid `[lora]` table.
fn check_recipe(a: &GRPOArgs) -> Result<()> {
    if !matches!(a.recipe, Recipe::Sft | Recipe::Reward) {
        // A critic is its own baseline; a group's mean needs two completions.
        let min = if a.recipe.has_critic() { 1 } else { 2 };
        at_least("num_generations", a.num_generations, min)?;
        if a.rewards.is_empty() {
            return Err(Error::missing(
                FUNC,
                "rewards",
                "at least one reward function",
            ));
        }
    }
    super::rewards::build_rewards(a)?;
    super::rewards::build_accuracy(a)?;
    super::tools::build_tools(a)?;
    if let Some(lora) = &a.lora {
        at_least("lora.r", lora.r, 1)?;
        positive("lora.alpha", lora.alpha)?;
        if !(0.0..1.0).contains(&lora.dropout) {
            return Err(Error::value(
                FUNC,
                "lora.dropout",
                "in [0, 1)",
                lora.dropout,
            ));
        }
    }
    Ok(())
}

/// The critic and the trust region of `ppo`, `a2c` and `trpo`.
fn check_critic(a: &GRPOArgs) -> Result<()> {
    if !a.recipe.has_critic() {
        return Ok(());
    }
    let recipe = a.recipe;
    let c = a.critic.clone().unwrap_or_default();
    let Some(lr) = c.lr else {
        return Err(Error::missing(
            FUNC,
            "critic.lr",
            format!(
                "the critic's learning rate, which `{recipe}` needs (e.g. `--set critic.lr=1e-5`)"
            ),
        ));
    };
    positive("critic.lr", lr)?;
    positive("critic.vf_coef", c.vf_coef)?;
    positive("critic.clip_range_value", c.clip_range_value)?;
    positive("critic.kl_horizon", c.kl_horizon)?;
    let actor_lam = ("critic.actor_lam", c.actor_lam.unwrap_or(c.lam));
    for (key, v) in [("critic.gamma", c.gamma), ("critic.lam", c.lam), actor_lam] {
        if !(0.0..=1.0).contains(&v) {
            return Err(Error::value(FUNC, key, "in [0, 1]", v));
        }
    }
    if let Some(t) = c.kl_target {
        positive("critic.kl_target", t)?;
    }
    // Both cut a copy of the policy: a critic folder or the policy's own transformer has
    // nothing to cut.
    let other = match (&c.model, c.share_backbone) {
        (Some(_), _) => Some("`critic.model` (a critic of its own size)"),
        (None, true) => Some("`critic.share_backbone` (the policy's whole transformer)"),
        (None, false) => None,
    };
    for (key, size) in [
        ("critic.num_layers", c.num_layers),
        ("critic.intermediate_size", c.intermediate_size),
        ("critic.num_attention_heads", c.num_attention_heads),
    ] {
        let Some(n) = size else { continue };
        at_least(key, n, 1)?;
        if let Some(other) = other {
            return Err(Error::value(FUNC, key, format!("absent with {other}"), n));
        }
    }
    if c.actor_skip_flat_groups && (recipe == Recipe::Trpo || c.share_backbone) {
        return Err(Error::value(
            FUNC,
            "critic.actor_skip_flat_groups",
            "false with `trpo` or `critic.share_backbone` (the actor's rows are the critic's)",
            true,
        ));
    }
    if c.share_backbone {
        if recipe == Recipe::Trpo {
            return Err(Error::value(
                FUNC,
                "critic.share_backbone",
                "false with `trpo` (its trust-region step moves the policy alone)",
                true,
            ));
        }
        if let Some(m) = &c.model {
            return Err(Error::value(
                FUNC,
                "critic.share_backbone",
                "false with `critic.model` (a shared head reads the policy's transformer)",
                format!("true with critic.model = {m:?}"),
            ));
        }
    }
    if let (Recipe::Trpo, Some(t)) = (recipe, &a.trpo) {
        positive("trpo.max_kl", t.max_kl)?;
        positive("trpo.fvp_shift", t.fvp_shift)?;
        non_negative("trpo.damping", t.damping)?;
        at_least("trpo.cg_iters", t.cg_iters, 1)?;
        at_least("trpo.max_backtracks", t.max_backtracks, 1)?;
        if !(t.fisher_fraction > 0.0 && t.fisher_fraction <= 1.0) {
            return Err(Error::value(
                FUNC,
                "trpo.fisher_fraction",
                "in (0, 1]",
                t.fisher_fraction,
            ));
        }
        if !(0.0..=1.0).contains(&t.accept_ratio) {
            return Err(Error::value(
                FUNC,
                "trpo.accept_ratio",
                "in [0, 1]",
                t.accept_ratio,
            ));
        }
    }
    Ok(())
}

/// DPO's and the reward model's loss settings.
fn check_dpo(a: &GRPOArgs) -> Result<()> {
    if a.recipe == Recipe::Reward {
        let r = a.reward_model();
        if let Some(c) = r.center_rewards_coefficient {
            non_negative("reward_model.center_rewards_coefficient", c)?;
        }
        if let Some(n) = r.num_layers {
            at_least("reward_model.num_layers", n, 1)?;
        }
        return Ok(());
    }
    if a.recipe != Recipe::Dpo {
        return Ok(());
    }
    let d = a.dpo();
    positive("dpo.beta", d.beta)?;
    let (range, high) = match d.loss_type {
        atomrl_loss::DpoLossType::Robust => ("in [0, 0.5) for loss_type = \"robust\"", 0.5),
        _ => ("in [0, 1)", 1.0),
    };
    if !(0.0..high).contains(&d.label_smoothing) {
        return Err(Error::value(
            FUNC,
            "dpo.label_smoothing",
            range,
            d.label_smoothing,
        ));
    }
    Ok(())
}

/// A `resume` folder exists.
fn check_resume(a: &GRPOArgs) -> Result<()> {
    if let Some(dir) = a.resume.path() {
        if !dir.is_dir() {
            return Err(Error::value(
                FUNC,
                "resume",
                "auto, never or an existing checkpoint folder",
                dir.display(),
            ));
        }
    }
    Ok(())
}

fn positive(key: &str, v: f64) -> Result<()> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(Error::value(FUNC, key, "a finite number > 0", v))
    }
}

fn non_negative(key: &str, v: f64) -> Result<()> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(Error::value(FUNC, key, "a finite number >= 0", v))
    }
}

fn at_least(key: &str, v: usize, min: usize) -> Result<()> {
    if v >= min {
        Ok(())
    } else {
        Err(Error::value(FUNC, key, format!(">= {min}"), v))
    }
}
