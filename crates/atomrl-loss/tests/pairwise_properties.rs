//! Properties of the pairwise preference losses (proptest): DPO's gradient is TRL's closed
//! form, swapping chosen and rejected mirrors the rewards, the robust loss at ε = 0 is the
//! sigmoid loss, shifting both sides' rewards leaves the reward-model loss unchanged.

#![allow(clippy::unwrap_used)]

use atomrl_loss::{compute_dpo_loss, compute_reward_model_loss, DpoLossType, DpoOptions};
use candle_core::{Device, Tensor, Var};
use proptest::prelude::*;

fn vec(n: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-40.0f32..=-0.5, n)
}

fn pairs() -> impl Strategy<Value = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, f64)> {
    (1usize..=8).prop_flat_map(|n| (vec(n), vec(n), vec(n), vec(n), 0.01f64..=2.0))
}

fn t(v: &[f32]) -> Tensor {
    Tensor::new(v, &Device::Cpu).unwrap()
}

proptest! {
    /// d loss / d chosen_i = −β·σ(−β·Δ_i)/N, and the rejected side's gradient is its negative.
    #[test]
    fn sigmoid_gradient_is_the_closed_form((c, r, rc, rr, beta) in pairs()) {
        let n = c.len() as f64;
        let cv = Var::new(c.as_slice(), &Device::Cpu).unwrap();
        let rv = Var::new(r.as_slice(), &Device::Cpu).unwrap();
        let opts = DpoOptions { beta, ..Default::default() };
        let out = compute_dpo_loss(cv.as_tensor(), rv.as_tensor(), &t(&rc), &t(&rr), None, &opts).unwrap();
        let grads = out.loss.backward().unwrap();
        let gc: Vec<f32> = grads.get(cv.as_tensor()).unwrap().to_vec1().unwrap();
        let gr: Vec<f32> = grads.get(rv.as_tensor()).unwrap().to_vec1().unwrap();
        for i in 0..c.len() {
            let delta = f64::from((c[i] - rc[i]) - (r[i] - rr[i]));
            let want = -beta / (1.0 + (beta * delta).exp()) / n;
            prop_assert!((f64::from(gc[i]) - want).abs() < 1e-5, "{} vs {}", gc[i], want);
            prop_assert!((f64::from(gr[i]) + want).abs() < 1e-5);
        }
    }

    /// Swapping chosen and rejected swaps the rewards and mirrors accuracy and margin (ties
    /// count for neither side).
    #[test]
    fn swapping_the_sides_mirrors_the_rewards((c, r, rc, rr, beta) in pairs()) {
        let opts = DpoOptions { beta, loss_type: DpoLossType::Hinge, label_smoothing: 0.0 };
        let a = compute_dpo_loss(&t(&c), &t(&r), &t(&rc), &t(&rr), None, &opts).unwrap();
        let b = compute_dpo_loss(&t(&r), &t(&c), &t(&rr), &t(&rc), None, &opts).unwrap();
        prop_assert_eq!(a.chosen_rewards.to_vec1::<f32>().unwrap(), b.rejected_rewards.to_vec1::<f32>().unwrap());
        prop_assert!((a.reward_margin + b.reward_margin).abs() < 1e-4);
        prop_assert!(a.reward_accuracy + b.reward_accuracy <= 1.0 + 1e-12);
    }

    /// The robust loss with no assumed label noise is the sigmoid loss.
    #[test]
    fn robust_at_zero_smoothing_is_sigmoid((c, r, rc, rr, beta) in pairs()) {
        let sig = DpoOptions { beta, ..Default::default() };
        let rob = DpoOptions { loss_type: DpoLossType::Robust, ..sig };
        let a = compute_dpo_loss(&t(&c), &t(&r), &t(&rc), &t(&rr), None, &sig).unwrap();
        let b = compute_dpo_loss(&t(&c), &t(&r), &t(&rc), &t(&rr), None, &rob).unwrap();
        prop_assert_eq!(a.losses.to_vec1::<f32>().unwrap(), b.losses.to_vec1::<f32>().unwrap());
    }

    /// The Bradley–Terry loss sees only differences: adding one constant to every reward leaves
    /// it, the accuracy and the margin unchanged (no centring term).
    #[test]
    fn reward_model_loss_ignores_a_common_shift((c, r, _, _, shift) in pairs()) {
        let moved = |v: &[f32]| v.iter().map(|x| x + shift as f32).collect::<Vec<_>>();
        let a = compute_reward_model_loss(&t(&c), &t(&r), None, None).unwrap();
        let b = compute_reward_model_loss(&t(&moved(&c)), &t(&moved(&r)), None, None).unwrap();
        let (la, lb) = (a.loss.to_scalar::<f32>().unwrap(), b.loss.to_scalar::<f32>().unwrap());
        prop_assert!((la - lb).abs() < 1e-4 * (1.0 + la.abs()), "{la} vs {lb}");
        prop_assert!((a.margin - b.margin).abs() < 1e-4);
    }
}

#[test]
fn bad_inputs_name_the_argument() {
    let one = t(&[-1.0]);
    let two = t(&[-1.0, -2.0]);
    let opts = DpoOptions::default();
    let e = compute_dpo_loss(&one, &two, &one, &one, None, &opts)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`rejected_log_probs`") && e.contains("[1]"),
        "{e}"
    );
    let ipo = DpoOptions {
        loss_type: DpoLossType::Ipo,
        ..opts
    };
    let e = compute_dpo_loss(&one, &one, &one, &one, None, &ipo)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`chosen_lengths`"), "{e}");
    let robust = DpoOptions {
        loss_type: DpoLossType::Robust,
        label_smoothing: 0.5,
        ..opts
    };
    let e = compute_dpo_loss(&one, &one, &one, &one, None, &robust)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`label_smoothing`") && e.contains("0.5"), "{e}");
    let e = compute_reward_model_loss(&two, &one, None, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`rejected_rewards`"), "{e}");
    let e = compute_reward_model_loss(&one, &one, None, Some(-1.0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`center_rewards_coefficient`"), "{e}");
}
