//! A reward model's score of each row of an experience, each shared prompt run once.

use std::collections::HashMap;

use atomrl_core::{CandleContext, Result};
use atomrl_model::ValueModel;
use candle_core::{DType, Tensor};

use crate::experience::Experience;

/// Each row's score `[R]` (f32) by the reward model `model`: its head at the row's last real
/// token, the number [`ValueModel::sequence_scores`] gives on the padded rows. Rows that share
/// a prompt (the two sides of a preference pair, GRPO's G completions) run it through the
/// transformer once ([`atomrl_logprob::get_shared_prompt_last_hidden`]): a reward model's
/// pairs spend about two thirds of their tokens on the prompt (the embedded GSM8K pairs: ~44
/// prompt tokens, ~22 per completion). Without shared prompts, or with gradient checkpointing
/// (which the cached prompt pass does not do), the padded rows run as they are. A row that
/// repeats another (the same prompt and completion: identical samples in a GRPO group, one
/// answer in several pairs of its prompt) is scored once and its score copied; the gradients
/// of the copies add up.
/// Differentiable with respect to the model's trainable variables.
///
/// # Errors
/// A row without a real token; model failures.
///
/// ```
/// use atomrl_model::{CausalLm, ValueModel};
/// use atomrl_rollout::{experience_scores, Experience};
/// use candle_core::{DType, Device};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let rm = ValueModel::reward_model_from_policy(&CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?)?;
/// for (name, var) in rm.named_vars() {
///     if name == "score.weight" { // a head that is not all zeros
///         var.set(&var.as_tensor().ones_like()?)?;
///     }
/// }
/// let rows: [(&[u32], &[u32], &[u32]); 2] = [(&[1, 2], &[3, 4], &[5]), (&[6], &[7], &[8, 9])];
/// let exp = Experience::from_pairs(&rows, 0, &Device::Cpu)?;
/// let padded = rm.sequence_scores(&exp.input_ids, &exp.attention_mask)?;
/// let shared = experience_scores(&rm, &exp)?;
/// assert_eq!(shared.dims(), [4]);
/// assert!((shared - padded)?.abs()?.max_all()?.to_scalar::<f32>()? < 1e-5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn experience_scores(model: &ValueModel, exp: &Experience) -> Result<Tensor> {
    let func = "experience_scores";
    let (distinct, copy_of) = distinct_rows(exp)?;
    if distinct.len() == exp.num_rows() {
        return distinct_scores(model, exp);
    }
    let scores = distinct_scores(model, &exp.select(&distinct)?)?;
    let index = Tensor::new(copy_of, scores.device()).ctx(func)?;
    scores.index_select(&index, 0).ctx(func)
}

/// The first row of each distinct (prompt, completion), and for every row the position of its
/// own among them.
fn distinct_rows(exp: &Experience) -> Result<(Vec<u32>, Vec<u32>)> {
    let func = "experience_scores";
    let width = exp.input_ids.dim(1).ctx(func)?;
    let start = width - exp.completion_len;
    let completion = |t: &Tensor| -> candle_core::Result<Vec<Vec<u32>>> {
        t.narrow(1, start, exp.completion_len)?
            .to_dtype(DType::U32)?
            .to_vec2()
    };
    let ids = completion(&exp.input_ids).ctx(func)?;
    let mask = completion(&exp.attention_mask).ctx(func)?;
    let mut seen: HashMap<(u32, &[u32], &[u32]), u32> = HashMap::new();
    let mut distinct = Vec::new();
    let mut copy_of = Vec::with_capacity(ids.len());
    for (row, (group, (ids, mask))) in exp
        .prompt_groups
        .iter()
        .zip(ids.iter().zip(&mask))
        .enumerate()
    {
        let next = distinct.len() as u32;
        let at = *seen
            .entry((*group, ids.as_slice(), mask.as_slice()))
            .or_insert_with(|| {
                distinct.push(row as u32);
                next
            });
        copy_of.push(at);
    }
    Ok((distinct, copy_of))
}

/// [`experience_scores`] of rows that are all distinct.
fn distinct_scores(model: &ValueModel, exp: &Experience) -> Result<Tensor> {
    let func = "experience_scores";
    if !model.backbone().gradient_checkpointing() {
        if let Some(shared) = exp.shared_prompts()? {
            let last = atomrl_logprob::get_shared_prompt_last_hidden(model.backbone(), &shared)?;
            let hidden = last.unsqueeze(1).ctx(func)?;
            return model.head(&hidden)?.squeeze(1).ctx(func);
        }
    }
    model.sequence_scores(&exp.input_ids, &exp.attention_mask)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use atomrl_model::CausalLm;
    use candle_core::{DType, Device};

    fn reward_model() -> ValueModel {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/reference/models/tiny-qwen2"
        );
        let policy = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu).unwrap();
        let rm = ValueModel::reward_model_from_policy(&policy).unwrap();
        for (name, var) in rm.named_vars() {
            if name == "score.weight" {
                let n = var.as_tensor().elem_count();
                let w: Vec<f32> = (0..n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 5.0).collect();
                var.set(&Tensor::from_vec(w, var.as_tensor().dims(), &Device::Cpu).unwrap())
                    .unwrap();
            }
        }
        rm
    }

    /// Three pairs, two of one prompt, prompts and completions of different lengths.
    fn pairs() -> Experience {
        let rows: [crate::PairRow<'_>; 3] = [
            (&[11, 12, 13], &[21, 22, 23, 24], &[25]),
            (&[14], &[26, 27], &[28, 29, 30]),
            (&[11, 12, 13], &[31], &[32, 33]),
        ];
        Experience::from_pairs(&rows, 0, &Device::Cpu).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap()
    }

    #[test]
    fn shared_scores_and_gradients_equal_the_padded_rows() {
        let rm = reward_model();
        let exp = pairs();
        assert!(exp.shared_prompts().unwrap().is_some());
        let shared = experience_scores(&rm, &exp).unwrap();
        let padded = rm
            .sequence_scores(&exp.input_ids, &exp.attention_mask)
            .unwrap();
        let scale: f32 = padded
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert!(scale > 1e-3, "the head scores something");
        assert!(max_diff(&shared, &padded) <= 1e-5 * scale.max(1.0));
        let weights = Tensor::new(&[1f32, -2.0, 0.5, 3.0, -1.0, 0.25], &Device::Cpu).unwrap();
        let ga = (shared * &weights)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let gb = (padded * &weights)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        for (name, var) in rm.trainable_vars() {
            let (x, y) = (ga.get(&var).unwrap(), gb.get(&var).unwrap());
            let s: f32 = y.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
            assert!(max_diff(x, y) <= 1e-5 * s.max(1.0), "{name}");
        }
    }

    /// One prompt's answers in several pairs: each distinct answer is scored once, and the
    /// scores and gradients are those of scoring every row.
    #[test]
    fn repeated_rows_are_scored_once_with_the_same_scores_and_gradients() {
        let rm = reward_model();
        let rows: [crate::PairRow<'_>; 4] = [
            (&[11, 12, 13], &[21, 22, 23], &[25]),
            (&[11, 12, 13], &[21, 22, 23], &[26, 27]),
            (&[14], &[28], &[25]),
            (&[11, 12, 13], &[26, 27], &[25]),
        ];
        let exp = Experience::from_pairs(&rows, 0, &Device::Cpu).unwrap();
        let (distinct, copy_of) = distinct_rows(&exp).unwrap();
        // Rows: c0 r0 c1 r1 c2 r2 c3 r3; c1 = c0, r3 = r0, c3 = r1 (prompt 11 12 13).
        assert_eq!(distinct, [0, 1, 3, 4, 5]);
        assert_eq!(copy_of, [0, 1, 0, 2, 3, 4, 2, 1]);
        let once = experience_scores(&rm, &exp).unwrap();
        let each = rm
            .sequence_scores(&exp.input_ids, &exp.attention_mask)
            .unwrap();
        let scale: f32 = each.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
        assert!(max_diff(&once, &each) <= 1e-5 * scale.max(1.0));
        let weights =
            Tensor::new(&[1f32, -2.0, 0.5, 3.0, -1.0, 0.25, 2.0, -0.5], &Device::Cpu).unwrap();
        let grads = |s: Tensor| {
            (s * &weights)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap()
        };
        let (ga, gb) = (grads(once), grads(each));
        for (name, var) in rm.trainable_vars() {
            let (x, y) = (ga.get(&var).unwrap(), gb.get(&var).unwrap());
            let s: f32 = y.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
            assert!(max_diff(x, y) <= 1e-5 * s.max(1.0), "{name}");
        }
    }

    #[test]
    fn gradient_checkpointing_runs_the_padded_rows() {
        let mut rm = reward_model();
        rm.set_gradient_checkpointing(true);
        let exp = pairs();
        let a = experience_scores(&rm, &exp).unwrap();
        let b = rm
            .sequence_scores(&exp.input_ids, &exp.attention_mask)
            .unwrap();
        assert_eq!(a.to_vec1::<f32>().unwrap(), b.to_vec1::<f32>().unwrap());
    }
}
