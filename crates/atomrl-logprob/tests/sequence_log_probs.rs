//! `get_sequence_log_probs` against `get_action_log_probs` (itself checked against
//! transformers): the pairs' sums are the per-token log-probs summed over each completion, with
//! sides of different lengths and prompts of different lengths; the gradient reaches the model.

#![allow(clippy::unwrap_used)]

use atomrl_logprob::{get_action_log_probs, get_sequence_log_probs, SequenceBatch};
use atomrl_model::CausalLm;
use candle_core::{DType, Device, Tensor};

const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/reference/models/tiny-qwen2"
);

/// Right-padded rows of `(prompt, completion)` to length `l`.
fn side(rows: &[(&[u32], &[u32])], l: usize) -> SequenceBatch {
    let d = Device::Cpu;
    let (mut ids, mut mask, mut comp) = (Vec::new(), Vec::new(), Vec::new());
    for (p, c) in rows {
        for j in 0..l {
            let (id, m, cm) = if j < p.len() {
                (p[j], 1f32, 0f32)
            } else if j < p.len() + c.len() {
                (c[j - p.len()], 1.0, 1.0)
            } else {
                (0, 0.0, 0.0)
            };
            ids.push(id);
            mask.push(m);
            comp.push(cm);
        }
    }
    let n = rows.len();
    SequenceBatch {
        input_ids: Tensor::from_vec(ids, (n, l), &d).unwrap(),
        attention_mask: Tensor::from_vec(mask, (n, l), &d).unwrap(),
        completion_mask: Tensor::from_vec(comp, (n, l), &d).unwrap(),
    }
}

#[test]
fn pair_sums_are_the_per_token_log_probs_summed() {
    let model = CausalLm::from_hf_dir(MODEL, DType::F32, &Device::Cpu).unwrap();
    let chosen_rows: [(&[u32], &[u32]); 2] = [(&[5, 6], &[7, 8, 9]), (&[11, 12, 13], &[14])];
    let rejected_rows: [(&[u32], &[u32]); 2] =
        [(&[5, 6], &[20]), (&[11, 12, 13], &[21, 22, 23, 24])];
    let chosen = side(&chosen_rows, 6);
    let rejected = side(&rejected_rows, 8);
    let out = get_sequence_log_probs(&model, &chosen, &rejected, 0.7).unwrap();
    for (rows, batch, got, lengths) in [
        (&chosen_rows, &chosen, &out.chosen, &out.chosen_lengths),
        (
            &rejected_rows,
            &rejected,
            &out.rejected,
            &out.rejected_lengths,
        ),
    ] {
        let l = batch.input_ids.dim(1).unwrap();
        let lp: Vec<Vec<f32>> = get_action_log_probs(
            &model,
            &batch.input_ids,
            &batch.attention_mask,
            l - 1,
            0.7,
            false,
        )
        .unwrap()
        .log_probs
        .to_vec2()
        .unwrap();
        let got: Vec<f32> = got.to_vec1().unwrap();
        let lengths: Vec<f32> = lengths.to_vec1().unwrap();
        for (r, (p, c)) in rows.iter().enumerate() {
            let want: f32 = (p.len()..p.len() + c.len()).map(|j| lp[r][j - 1]).sum();
            assert!(
                (got[r] - want).abs() < 1e-4,
                "row {r}: {} vs {want}",
                got[r]
            );
            assert_eq!(lengths[r], c.len() as f32);
        }
    }
}

#[test]
fn bad_pairs_name_the_argument() {
    let model = CausalLm::from_hf_dir(MODEL, DType::F32, &Device::Cpu).unwrap();
    let one = side(&[(&[5], &[6])], 2);
    let two = side(&[(&[5], &[6]), (&[5], &[7])], 2);
    let e = get_sequence_log_probs(&model, &one, &two, 1.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rejected.input_ids"), "{e}");
    let mut starts_with_completion = one.clone();
    starts_with_completion.completion_mask = Tensor::new(&[[1f32, 1.0]], &Device::Cpu).unwrap();
    let e = get_sequence_log_probs(&model, &starts_with_completion, &one, 1.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("chosen.completion_mask[0, 0]"), "{e}");
}
