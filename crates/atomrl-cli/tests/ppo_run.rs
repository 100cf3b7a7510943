//! `atomrl-train --recipe ppo | a2c | trpo` end to end on the tiny random Qwen2 fixture: a PPO
//! run killed with SIGKILL resumes and ends with the same rows, actor and critic as an
//! uninterrupted one (also with the value head on the actor's transformer); A2C and TRPO train
//! and report their metrics; the actor can leave flat groups to the critic, and have a λ of
//! its own; the critic's settings are checked with the key named.

#![allow(clippy::unwrap_used)]

mod common;

use common::{comparable, model_dir, temp_dir, train_bin, write_dataset};
use std::path::{Path, PathBuf};

use atomrl_trainer::logging::{read_metrics, MetricRow};

fn write_config(dir: &Path, recipe: &str, max_steps: usize, critic: &str) -> PathBuf {
    let data = write_dataset(dir);
    let path = dir.join("run.toml");
    let toml = format!(
        "recipe = {recipe:?}\nmodel = {:?}\ndataset = {:?}\noutput_dir = {:?}\nmax_steps = {max_steps}\n\
         batch_size = 4\nnum_generations = 2\nnum_iterations = 2\nmax_completion_length = 12\neval_size = 4\n\
         lr = 1e-3\nbeta = 0.05\nsave_steps = 2\nprogress = false\nworkers = 2\n\
         [[rewards]]\nname = \"digit\"\n[[rewards]]\nname = \"overlong\"\noptions = {{ buffer_len = 12 }}\n\
         [critic]\n{critic}\n",
        model_dir(),
        data.display().to_string(),
        dir.join("run").display().to_string()
    );
    std::fs::write(&path, toml).unwrap();
    path
}

/// `atomrl-train --config cfg --set set`, which must succeed; the metrics rows of its
/// training steps.
fn trained_rows(cfg: &Path, set: &str) -> Vec<MetricRow> {
    let out = train_bin()
        .args(["--config", cfg.to_str().unwrap(), "--set", set])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {err}", cfg.display());
    let metrics = cfg.with_file_name("run").join("metrics.jsonl");
    let rows = read_metrics(metrics).unwrap();
    rows.into_iter().filter(|r| r.step > 0).collect()
}

fn bytes(path: PathBuf) -> Vec<u8> {
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every file under `dir`, by its path relative to `dir`, with its bytes.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            let nested = files(&path);
            let prefix = path.strip_prefix(dir).unwrap().to_path_buf();
            out.extend(nested.into_iter().map(|(p, b)| (prefix.join(p), b)));
        } else {
            out.push((
                path.strip_prefix(dir).unwrap().to_path_buf(),
                bytes(path.clone()),
            ));
        }
    }
    out.sort();
    out
}

/// A PPO run with the `[critic]` keys `extra` (and LoRA on the actor and the critic when
/// `lora`) killed after step 3 and resumed from its step-2 checkpoint ends with the rows and
/// checkpoint files of an uninterrupted run.
fn a_killed_ppo_run_resumes_exactly(name: &str, extra: &str, lora: bool) {
    let mut critic = format!("lr = 1e-3\nkl_target = 0.01\nkl_horizon = 100.0\n{extra}");
    if lora {
        critic.push_str("\n[lora]\nr = 4\nalpha = 8.0");
    }
    let straight = temp_dir(&format!("{name}-straight"));
    let cfg = write_config(&straight, "ppo", 6, &critic);
    let out = train_bin()
        .args(["--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let killed = temp_dir(&format!("{name}-killed"));
    let cfg = write_config(&killed, "ppo", 6, &critic);
    let status = train_bin()
        .args(["--config", cfg.to_str().unwrap()])
        .env("ATOMRL_TEST_KILL_AFTER_STEP", "3")
        .status()
        .unwrap();
    assert!(!status.success());
    assert!(killed
        .join("run/checkpoint-2/critic/model.safetensors")
        .is_file());
    let out = train_bin()
        .args(["--config", cfg.to_str().unwrap(), "--resume"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let a = comparable(&straight.join("run/metrics.jsonl"));
    assert_eq!(a, comparable(&killed.join("run/metrics.jsonl")));
    let rows = read_metrics(straight.join("run/metrics.jsonl")).unwrap();
    let learning = rows
        .iter()
        .filter(|r| r.get("critic/grad_norm").is_some_and(|g| g > 0.0))
        .filter(|r| r.get("grad_norm").is_some_and(|g| g > 0.0))
        .count();
    assert!(
        learning >= 4,
        "only {learning} steps trained actor and critic"
    );
    // The adaptive KL coefficient moved, and was restored on resume (the rows are equal).
    let coefs: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.get("kl_reward/coef"))
        .collect();
    assert!(coefs.len() == 6 && coefs[5] != 0.05, "{coefs:?}");
    let (x, y) = (
        files(&straight.join("run/checkpoint-6")),
        files(&killed.join("run/checkpoint-6")),
    );
    let names: Vec<String> = x.iter().map(|(p, _)| p.display().to_string()).collect();
    for wanted in [
        "critic/model.safetensors",
        "critic/optimizer.safetensors",
        "optimizer.safetensors",
    ] {
        assert!(names.iter().any(|n| n == wanted), "{wanted} in {names:?}");
    }
    if lora {
        assert!(
            names
                .iter()
                .any(|n| n == "critic/critic_adapters.safetensors"),
            "{names:?}"
        );
        assert!(
            names.iter().any(|n| n == "adapter_model.safetensors"),
            "{names:?}"
        );
    }
    assert_eq!(x.len(), y.len());
    for ((p, a), (_, b)) in x.iter().zip(&y) {
        assert!(a == b, "{} differs after resuming", p.display());
    }
    let cfg =
        std::fs::read_to_string(straight.join("run/checkpoint-6/critic/config.json")).unwrap();
    assert!(cfg.contains("ForTokenClassification") && cfg.contains("\"num_labels\": 1"));
    // A narrowed critic is saved at its own width and head count.
    for key in ["intermediate_size", "num_attention_heads"] {
        let prefix = format!("{key} = ");
        if let Some(m) = extra.lines().find_map(|l| l.strip_prefix(prefix.as_str())) {
            assert!(cfg.contains(&format!("\"{key}\": {m}")), "{cfg}");
        }
    }
}

#[test]
fn a_killed_ppo_run_resumes_with_the_same_rows_actor_and_critic() {
    a_killed_ppo_run_resumes_exactly("ppo", "", false);
}

#[test]
fn a_killed_ppo_run_with_a_shared_value_head_resumes_exactly() {
    a_killed_ppo_run_resumes_exactly("ppo-shared", "share_backbone = true", false);
}

#[test]
fn a_killed_ppo_run_with_lora_resumes_with_the_same_adapters() {
    a_killed_ppo_run_resumes_exactly("ppo-lora", "", true);
}

/// The `ppo_gsm8k` example's critic settings: a critic of the policy's first layer with its MLP
/// cut to a quarter of its neurons, the actor on the groups whose rewards differ; plus a λ of
/// the actor's own (the example's earlier default).
#[test]
fn a_killed_ppo_run_with_the_examples_small_critic_resumes_exactly() {
    a_killed_ppo_run_resumes_exactly(
        "ppo-small-critic",
        "num_layers = 1\nintermediate_size = 32\nactor_skip_flat_groups = true\nactor_lam = 0.95",
        false,
    );
}

/// A critic of the policy's first layer with its MLP cut to a quarter of its neurons and its
/// attention to half its heads, with adapters of its own on the cut projections.
#[test]
fn a_killed_ppo_run_with_a_narrowed_lora_critic_resumes_exactly() {
    a_killed_ppo_run_resumes_exactly(
        "ppo-narrow-critic",
        "num_layers = 1\nintermediate_size = 32\nnum_attention_heads = 2",
        true,
    );
}

#[test]
fn a2c_and_trpo_train_with_their_metrics() {
    for (recipe, key) in [("a2c", "critic/value_loss"), ("trpo", "trpo/step_fraction")] {
        let dir = temp_dir(&format!("{recipe}-run"));
        let cfg = write_config(&dir, recipe, 3, "lr = 1e-3\nwarmup_steps = 1");
        let trained = trained_rows(&cfg, "trpo = { max_kl = 0.05, cg_iters = 4 }");
        assert_eq!(trained.len(), 3, "{recipe}");
        // Step 1 trains the critic only (warm-up): no policy loss.
        assert!(trained[0].get("loss").is_none_or(f64::is_nan), "{recipe}");
        assert!(
            trained[0].get("critic/value_loss").is_some_and(|v| v > 0.0),
            "{recipe}"
        );
        assert!(
            trained[2].get(key).is_some_and(f64::is_finite),
            "{recipe}: {key}"
        );
        if recipe == "trpo" {
            // The accepted step keeps the KL inside the trust region.
            let kl = trained[2].get("trpo/kl").unwrap();
            assert!((0.0..=0.05).contains(&kl), "trpo/kl = {kl}");
        }
    }
}

/// A trust region or a finite-difference shift so large that the policy turns NaN: TRPO skips
/// those steps and says so, as every recipe skips a step that meets NaN or Inf; the run ends
/// normally with the policy unchanged by them.
#[test]
fn trpo_skips_a_step_that_meets_non_finite_log_probs() {
    for (name, trpo) in [
        ("trpo-nan-step", "trpo = { max_kl = 1e30, cg_iters = 2 }"),
        ("trpo-nan-fvp", "trpo = { fvp_shift = 1e30, cg_iters = 2 }"),
    ] {
        let dir = temp_dir(name);
        let cfg = write_config(&dir, "trpo", 2, "lr = 1e-3");
        let out = train_bin()
            .args(["--config", cfg.to_str().unwrap(), "--set", trpo])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {err}");
        assert!(err.contains("update skipped"), "{name}: {err}");
        let rows = read_metrics(dir.join("run/metrics.jsonl")).unwrap();
        let skipped: f64 = rows.iter().filter_map(|r| r.get("skipped_step")).sum();
        assert!(skipped >= 1.0, "{name}: {skipped} steps skipped");
    }
}

/// With `critic.actor_skip_flat_groups` the critic trains every step; the actor trains on the
/// steps that have a group whose rewards differ, and only then.
#[test]
fn the_actor_skips_flat_groups_and_the_critic_does_not() {
    let dir = temp_dir("ppo-skip-flat");
    let cfg = write_config(&dir, "ppo", 6, "lr = 1e-3\nactor_skip_flat_groups = true");
    // Room past the overlong buffer: completions of different lengths get different rewards,
    // and over 6 steps some steps have no group whose rewards differ.
    let trained = trained_rows(&cfg, "max_completion_length=24");
    assert_eq!(trained.len(), 6);
    let mut actor_steps = 0;
    for r in &trained {
        assert!(r.get("critic/value_loss").is_some_and(|v| v > 0.0), "{r:?}");
        for key in ["time/critic_values_s", "time/critic_train_s"] {
            assert!(r.get(key).is_some_and(|t| t > 0.0), "{key}: {r:?}");
        }
        let all_flat = r.get("zero_std_groups_frac") == Some(1.0);
        assert_eq!(r.get("skipped_step") == Some(1.0), all_flat, "{r:?}");
        actor_steps += usize::from(!all_flat);
    }
    // Both kinds of step happen: the check above is not vacuous.
    assert!(
        0 < actor_steps && actor_steps < trained.len(),
        "{trained:?}"
    );
}

/// `critic.actor_lam` (decoupled GAE) changes the actor's advantages, and so its loss, but
/// not the returns the critic learns: the first step's value loss is the same to the bit.
#[test]
fn the_actors_lambda_moves_the_actor_and_not_the_critic() {
    let step_one = |name: &str, critic: &str| {
        let dir = temp_dir(name);
        let cfg = write_config(&dir, "ppo", 1, critic);
        let trained = trained_rows(&cfg, "max_completion_length=24");
        let get = |key| trained[0].get(key).unwrap_or(f64::NAN);
        (get("loss"), get("critic/value_loss"))
    };
    let (actor, critic) = step_one("ppo-lam", "lr = 1e-3\nlam = 0.9");
    let (actor_d, critic_d) = step_one("ppo-actor-lam", "lr = 1e-3\nlam = 0.9\nactor_lam = 0.3");
    assert!(
        critic > 0.0 && critic.to_bits() == critic_d.to_bits(),
        "{critic} {critic_d}"
    );
    assert!(
        actor.is_finite() && actor_d.is_finite() && actor != actor_d,
        "{actor} {actor_d}"
    );
}

#[test]
fn critic_settings_are_checked_with_the_key_named() {
    let dir = temp_dir("ppo-config-errors");
    let bad_critic = dir.join("bad-critic");
    std::fs::create_dir_all(&bad_critic).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(Path::new(&model_dir()).join(f), bad_critic.join(f)).unwrap();
    }
    for (critic, needle) in [
        ("", "`critic.lr`"),
        ("lr = 1e-4\ngamma = 1.5", "`critic.gamma`"),
        ("lr = 1e-4\nlam = -0.1", "`critic.lam`"),
        (
            "lr = 1e-4\nclip_range_value = 0.0",
            "`critic.clip_range_value`",
        ),
        ("lr = 1e-4\nbogus = 1", "bogus"),
        // The fixture has 2 decoder layers.
        ("lr = 1e-4\nnum_layers = 3", "`critic.num_layers`"),
        // Its MLPs are 128 wide.
        (
            "lr = 1e-4\nintermediate_size = 129",
            "`critic.intermediate_size`",
        ),
        // 4 query heads over 2 key/value heads: 3 would split a group.
        (
            "lr = 1e-4\nnum_attention_heads = 3",
            "`critic.num_attention_heads` must be a multiple of 2",
        ),
        // A causal LM is no critic: it has no one-label head over its hidden size.
        (
            &format!("lr = 1e-4\nmodel = {:?}", bad_critic.display().to_string()),
            "score.weight",
        ),
    ] {
        let cfg = write_config(&dir, "ppo", 2, critic);
        let out = train_bin()
            .args(["--config", cfg.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{critic}: {err}");
        assert!(err.contains(needle), "{critic}: {err}");
    }
}
