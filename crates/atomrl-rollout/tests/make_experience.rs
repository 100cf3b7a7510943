//! `make_experience` on the tiny fixture model: the experience's shapes, advantages, groups,
//! normaliser and log-prob columns, and the same experience whatever the sharding.

#![allow(clippy::unwrap_used)]

use atomrl_advantage::AdvantageMode;
use atomrl_dist::SingleProcess;
use atomrl_model::CausalLm;
use atomrl_reward::{Accuracy, FnReward, WeightedRewards};
use atomrl_rollout::parallel::Parallel;
use atomrl_rollout::{
    experience_log_probs, make_experience, EncodedPrompt, Experience, ExperienceConfig,
    RolloutContext,
};
use atomrl_sample::{ChatTokenizer, SamplingParams};
use candle_core::{DType, Device};

const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/reference/models/tiny-qwen2"
);

fn config(dynamic: bool, drop_zero: bool, old: bool) -> ExperienceConfig {
    ExperienceConfig {
        group_advantages: true,
        sampling: SamplingParams {
            num_generations: 4,
            max_new_tokens: 6,
            seed: 7,
            ..Default::default()
        },
        batch_size: 3,
        dynamic_sampling: dynamic,
        max_rounds: 3,
        advantage_mode: AdvantageMode::Grpo,
        advantage_eps: 1e-6,
        mask_truncated_completions: false,
        drop_zero_advantage: drop_zero,
        old_log_probs: old,
        micro_batches: 2,
        pad_token_id: 0,
        log_records: 6,
    }
}

/// Prompts whose first number is even score a flat 1: those groups carry no signal.
fn rewards() -> WeightedRewards {
    let picky = FnReward::new(
        "picky",
        |c: &str, ctx: &atomrl_reward::RewardContext, row| {
            let prompt = &ctx.prompts.as_ref().unwrap()[row];
            if prompt.contains("even") {
                1.0
            } else {
                (c.chars().count() % 3) as f32
            }
        },
    );
    WeightedRewards::new().with(picky, 1.0).unwrap()
}

fn make(
    config: &ExperienceConfig,
    workers: usize,
    reference: Option<&CausalLm>,
) -> (Experience, atomrl_rollout::RolloutSummary) {
    let model = CausalLm::from_hf_dir(MODEL, DType::F32, &Device::Cpu).unwrap();
    let tok = ChatTokenizer::from_hf_dir(MODEL).unwrap();
    let rewards = rewards();
    let accuracy = Accuracy::default();
    let ctx = RolloutContext {
        model: &model,
        tokenizer: &tok,
        rewards: &rewards,
        accuracy: &accuracy,
        tools: None,
    };
    let mut round = 0;
    let mut next = || {
        round += 1;
        let prompts = (0..3)
            .map(|i| {
                let text = if (i + round) % 2 == 0 { "even" } else { "odd" };
                let text = format!("{text} {i} {round}");
                Ok(EncodedPrompt {
                    ids: tok.encode(&text, false)?,
                    text,
                    truncated: false,
                })
            })
            .collect::<atomrl_core::Result<Vec<_>>>()?;
        Ok((prompts, vec!["1".to_string(); 3]))
    };
    let par = Parallel {
        workers,
        comm: &SingleProcess,
    };
    make_experience(&ctx, par, reference, config, 1, &mut next).unwrap()
}

#[test]
fn grpo_experience_has_zero_sum_group_advantages_and_whole_groups() {
    let (exp, summary) = make(&config(false, false, false), 1, None);
    assert_eq!(exp.num_rows(), 12);
    assert_eq!(exp.normalizer.rows, 12);
    assert_eq!(exp.groups, (0..12).map(|r| r / 4).collect::<Vec<u32>>());
    let adv: Vec<f32> = exp.advantages.to_vec1().unwrap();
    for g in adv.chunks(4) {
        assert!(g.iter().sum::<f32>().abs() < 1e-5, "{g:?}");
    }
    assert_eq!(exp.rewards.len(), 12);
    assert_eq!(exp.loss_tokens("test").unwrap(), exp.normalizer.tokens);
    assert!(exp.old_log_probs.is_none() && exp.ref_log_probs.is_none());
    assert_eq!(
        (summary.rounds, summary.completions, summary.kept),
        (1, 12, 12)
    );
    // Round 1: prompts 1 (odd) … the flat "even" groups are counted.
    assert!(summary.zero_std_groups_frac > 0.0);
    // The sample log: whole groups within the bound (6 → one group of 4), each record with
    // the row's reward, per-function score, advantage, length and finish reason.
    assert_eq!(summary.records.len(), 4);
    for (i, r) in summary.records.iter().enumerate() {
        assert_eq!(r.group, 0);
        assert_eq!(r.reward, f64::from(exp.rewards[i]));
        assert_eq!(r.rewards["picky"], r.reward);
        assert_eq!(r.advantage, Some(f64::from(adv[i])));
        assert!(r.completion_tokens > 0 && r.completion_tokens <= 6);
        assert!(["eos", "stop", "length"].contains(&r.finish_reason.as_str()));
        assert!(r.correct.is_some());
    }
}

#[test]
fn dynamic_sampling_keeps_groups_with_spread_and_drops_flat_rows() {
    let (exp, summary) = make(&config(true, true, false), 1, None);
    assert!(summary.rounds >= 2, "refills: {}", summary.rounds);
    assert!(summary.dropped_groups > 0);
    // Flat groups are gone; zero-advantage rows left the experience, not the normaliser.
    assert!(exp.normalizer.rows >= exp.num_rows());
    let adv: Vec<f32> = exp.advantages.to_vec1().unwrap();
    assert!(adv.iter().all(|&a| a != 0.0));
    assert_eq!(exp.normalizer.rows % 4, 0);
}

#[test]
fn old_and_reference_log_probs_are_the_policys_and_do_not_depend_on_workers() {
    let reference = CausalLm::from_hf_dir(MODEL, DType::F32, &Device::Cpu).unwrap();
    let (one, _) = make(&config(false, false, true), 1, Some(&reference));
    let (two, _) = make(&config(false, false, true), 2, Some(&reference));
    let old = one.old_log_probs.clone().unwrap();
    let reference_lp = one.ref_log_probs.clone().unwrap();
    assert_eq!(old.dims(), [one.num_rows(), one.completion_len]);
    // The reference is the same weights: its log-probs equal the old policy's.
    assert_eq!(
        old.to_vec2::<f32>().unwrap(),
        reference_lp.to_vec2::<f32>().unwrap()
    );
    // And what the update recomputes on the experience, on the scored tokens.
    let model = CausalLm::from_hf_dir(MODEL, DType::F32, &Device::Cpu).unwrap();
    let now = experience_log_probs(&model.detached(), &one, 1.0, false)
        .unwrap()
        .log_probs;
    let diff = ((now - &old).unwrap() * &one.loss_mask)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(diff < 1e-5, "{diff}");
    // Two workers sample other completions (per-shard seeds), so compare a worker-split
    // experience with its own rows scored in one pass.
    let again = experience_log_probs(&model.detached(), &two, 1.0, false)
        .unwrap()
        .log_probs;
    let d2 = ((again - two.old_log_probs.unwrap()).unwrap() * &two.loss_mask)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(d2 < 1e-5, "{d2}");
}

/// A critic's values and GAE on a made experience: the same on 1 and 2 workers (up to the
/// rounding of other micro-batches), 0 off the
/// loss mask, returns = values + raw advantages.
#[test]
fn values_and_gae_join_the_experience_whatever_the_workers() {
    use atomrl_rollout::{attach_values_and_gae, GaeConfig};
    let (exp, _) = make(&config(false, false, false), 1, None);
    let policy = CausalLm::from_hf_dir(MODEL, DType::F32, &Device::Cpu).unwrap();
    let critic = atomrl_model::ValueModel::from_policy(&policy).unwrap();
    // A head that is not zero, so that the values depend on the tokens.
    for (name, var) in critic.named_vars() {
        if name == atomrl_model::SCORE_WEIGHT {
            let w = (var.as_tensor().ones_like().unwrap() * 0.05).unwrap();
            var.set(&w).unwrap();
        }
    }
    let gae = GaeConfig {
        gamma: 1.0,
        lam: 0.95,
        actor_lam: None,
        whiten: false,
        micro_batches: 2,
    };
    let run = |workers| {
        let mut e = exp.clone();
        let par = Parallel {
            workers,
            comm: &SingleProcess,
        };
        attach_values_and_gae(&mut e, &critic, par, &gae).unwrap();
        e
    };
    let (one, two) = (run(1), run(2));
    let v1: Vec<Vec<f32>> = one.values.clone().unwrap().to_vec2().unwrap();
    // The micro-batches differ (2 or 4), so do the prompts each shares: equal up to rounding.
    let v2: Vec<Vec<f32>> = two.values.clone().unwrap().to_vec2().unwrap();
    let most = v1
        .iter()
        .flatten()
        .zip(v2.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(most < 1e-5, "{most}");
    assert_eq!(one.advantages.dims(), [one.num_rows(), one.completion_len]);
    let m: Vec<Vec<f32>> = one.loss_mask.to_vec2().unwrap();
    let adv: Vec<Vec<f32>> = one.advantages.to_vec2().unwrap();
    let ret: Vec<Vec<f32>> = one.returns.clone().unwrap().to_vec2().unwrap();
    for r in 0..m.len() {
        for t in 0..m[r].len() {
            if m[r][t] == 0.0 {
                assert_eq!((adv[r][t], ret[r][t]), (0.0, 0.0));
            } else {
                assert!((ret[r][t] - (adv[r][t] + v1[r][t])).abs() < 1e-5);
            }
        }
    }
    // Micro-batches of a GAE experience keep per-token advantages.
    assert_eq!(
        one.rows(0, 2).unwrap().advantages.dims(),
        [2, one.completion_len]
    );
    // Decoupled λ: the returns stay λ = 0.95's; the advantages are λ = 1's, which with γ = 1
    // and the reward on the last token are the row's reward minus each token's value.
    let mut decoupled = exp.clone();
    let par = Parallel {
        workers: 1,
        comm: &SingleProcess,
    };
    let actor_one = GaeConfig {
        actor_lam: Some(1.0),
        ..gae
    };
    attach_values_and_gae(&mut decoupled, &critic, par, &actor_one).unwrap();
    let ret_d: Vec<Vec<f32>> = decoupled.returns.clone().unwrap().to_vec2().unwrap();
    assert_eq!(ret_d, ret);
    let adv_d: Vec<Vec<f32>> = decoupled.advantages.to_vec2().unwrap();
    let mut differs = false;
    for r in 0..m.len() {
        for t in 0..m[r].len() {
            let want = if m[r][t] == 0.0 {
                0.0
            } else {
                one.rewards[r] - v1[r][t]
            };
            assert!((adv_d[r][t] - want).abs() < 1e-5, "row {r} token {t}");
            differs |= (adv_d[r][t] - adv[r][t]).abs() > 1e-4;
        }
    }
    assert!(differs, "λ = 1 and λ = 0.95 gave the same advantages");
}

/// The critic's values with the shared-prompt forward (each prompt once) equal those of the
/// padded rows, on the completion tokens; and they carry a gradient to the critic.
#[test]
fn shared_prompt_values_equal_the_padded_rows_values() {
    use atomrl_rollout::experience_values;
    let (exp, _) = make(&config(false, false, false), 1, None);
    assert!(exp.shared_prompts().unwrap().is_some());
    let policy = CausalLm::from_hf_dir(MODEL, DType::F32, &Device::Cpu).unwrap();
    let critic = atomrl_model::ValueModel::from_policy(&policy).unwrap();
    for (name, var) in critic.named_vars() {
        if name == atomrl_model::SCORE_WEIGHT {
            let w = (var.as_tensor().ones_like().unwrap() * 0.05).unwrap();
            var.set(&w).unwrap();
        }
    }
    let shared = experience_values(&critic, &exp).unwrap();
    let padded = critic
        .completion_values(&exp.input_ids, &exp.attention_mask, exp.completion_len)
        .unwrap();
    let diff = ((shared.clone() - padded).unwrap() * &exp.loss_mask)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(diff < 1e-5, "{diff}");
    let grads = shared.sum_all().unwrap().backward().unwrap();
    let trained = critic
        .trainable_vars()
        .iter()
        .filter(|(_, v)| grads.get(v.as_tensor()).is_some())
        .count();
    assert!(trained > 3, "{trained}");
}
