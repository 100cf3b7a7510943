//! From `FUSED_HEAD_MIN_VOCAB` tokens on, `get_action_log_probs` recomputes the LM head in
//! backward. Its log-probs, entropies and the gradients of every trainable variable must be
//! those of the logits of one full forward followed by a log-softmax (tied and untied heads,
//! the full model and LoRA, whose head is frozen), in one chunk of rows or several (the
//! head's weight gradient summed over them in one buffer).
#![allow(clippy::unwrap_used)]

use atomrl_logprob::{get_action_log_probs, get_action_log_probs_chunked, FUSED_HEAD_MIN_VOCAB};
use atomrl_model::{Architecture, CausalLm, ForwardInput, LoraConfig, ModelConfig};
use candle_core::{DType, Device, Tensor, D};

fn model(tied: bool, lora: bool) -> CausalLm {
    let vocab = FUSED_HEAD_MIN_VOCAB + 1_000;
    let mut c = ModelConfig::new(Architecture::Qwen2, vocab, 16, 32, 1, 2, 1).unwrap();
    c.tie_word_embeddings = tied;
    c.initializer_range = 0.3;
    let mut m = CausalLm::from_config_random(c, 5, DType::F32, &Device::Cpu).unwrap();
    if lora {
        m.add_lora(
            LoraConfig::new(2, 4.0)
                .with_targets(&["all-linear"])
                .unwrap(),
            1,
        )
        .unwrap();
        for v in m.trainable_vars() {
            v.set(&(v.as_tensor() + 0.1).unwrap()).unwrap();
        }
    }
    m
}

/// Right-padded rows; the last 4 positions are scored.
fn batch() -> (Tensor, Tensor) {
    let d = Device::Cpu;
    let ids = Tensor::new(
        &[[5u32, 17_000, 9, 300, 16_900, 2], [7, 8, 17_300, 11, 0, 0]],
        &d,
    )
    .unwrap();
    let mask = Tensor::new(&[[1u32, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], &d).unwrap();
    (ids, mask)
}

/// Log-probs and entropies `[N, T]` at temperature `temp` from one full forward, as tensor ops.
fn reference(m: &CausalLm, ids: &Tensor, mask: &Tensor, t: usize, temp: f64) -> (Tensor, Tensor) {
    let l = ids.dim(1).unwrap();
    let logits = m
        .forward(
            &ForwardInput::new(ids.clone()).with_attention_mask(mask.clone()),
            None,
        )
        .unwrap();
    let z = (logits.narrow(1, l - 1 - t, t).unwrap() / temp).unwrap();
    let max = z.max_keepdim(D::Minus1).unwrap().detach();
    let s = z.broadcast_sub(&max).unwrap();
    let e = s.exp().unwrap();
    let sum = e.sum_keepdim(D::Minus1).unwrap();
    let lse = sum.log().unwrap();
    let targets = ids
        .narrow(1, l - t, t)
        .unwrap()
        .contiguous()
        .unwrap()
        .unsqueeze(2)
        .unwrap();
    let lp = s
        .gather(&targets, 2)
        .unwrap()
        .broadcast_sub(&lse)
        .unwrap()
        .squeeze(2)
        .unwrap();
    let ent = (lse
        - (e * &s)
            .unwrap()
            .sum_keepdim(D::Minus1)
            .unwrap()
            .broadcast_div(&sum)
            .unwrap())
    .unwrap()
    .squeeze(2)
    .unwrap();
    let keep = mask
        .narrow(1, l - t, t)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    ((lp * &keep).unwrap(), (ent * &keep).unwrap())
}

fn max_abs(t: &Tensor) -> f32 {
    t.abs().unwrap().max_all().unwrap().to_scalar().unwrap()
}

#[test]
fn recomputing_the_head_gives_the_full_forward_numbers_and_gradients() {
    let (ids, mask) = batch();
    let (t, temp) = (4, 0.8);
    let vocab = FUSED_HEAD_MIN_VOCAB + 1_000;
    for (tied, lora, chunk_rows) in [
        (true, false, None),
        (false, false, None),
        (true, true, None),
        (true, false, Some(3)),
        (false, false, Some(1)),
    ] {
        let m = model(tied, lora);
        let out = match chunk_rows {
            None => get_action_log_probs(&m, &ids, &mask, t, temp, true),
            Some(r) => get_action_log_probs_chunked(&m, &ids, &mask, t, temp, true, r * vocab),
        }
        .unwrap();
        let ent = out.entropy.unwrap();
        let (want_lp, want_ent) = reference(&m, &ids, &mask, t, temp);
        let what = format!("tied={tied} lora={lora} chunk rows {chunk_rows:?}");
        assert!(
            max_abs(&(&out.log_probs - &want_lp).unwrap()) < 1e-4,
            "{what}: log-probs"
        );
        assert!(
            max_abs(&(&ent - &want_ent).unwrap()) < 1e-4,
            "{what}: entropy"
        );
        let loss = |lp: &Tensor, h: &Tensor| {
            (lp.sum_all().unwrap() + (h * 0.2).unwrap().sum_all().unwrap()).unwrap()
        };
        let got = loss(&out.log_probs, &ent).backward().unwrap();
        let want = loss(&want_lp, &want_ent).backward().unwrap();
        let vars = m.trainable_vars();
        assert!(!vars.is_empty());
        for v in vars {
            let (g, w) = (
                got.get(v.as_tensor()).unwrap(),
                want.get(v.as_tensor()).unwrap(),
            );
            let d = max_abs(&(g - w).unwrap()) / max_abs(w).max(1e-12);
            assert!(d < 1e-4, "{what}: gradient differs by {d} (relative)");
        }
    }
}
