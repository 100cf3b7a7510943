//! Preference pairs made online from scored groups (online / iterative DPO): the best
//! completion of each prompt against its worst.

use atomrl_core::{CandleContext, Error, Result};
use candle_core::{Device, Tensor};

use crate::experience::{Experience, LossNormalizer, PairRole, TokenRow};

/// The preference pairs of `exp`'s groups: in each group whose rewards differ, the first row
/// with the highest reward is chosen and the first with the lowest rejected (RLHFlow's
/// iterative DPO; TRL's online DPO with two completions is the `G = 2` case). Groups whose
/// rewards are all equal give no pair. The rows come out interleaved, `[chosen₀, rejected₀,
/// chosen₁, …]` (the layout [`split_pairs`] reads), with [`Experience::pairs`] set and a
/// normaliser of the kept rows: DPO's loss is a mean over pairs.
///
/// # Errors
/// [`Error::Value`] when `exp` has no rewards; tensor failures.
///
/// ```
/// use atomrl_rollout::{best_worst_pairs, Experience};
/// use candle_core::Device;
/// let rows: [(&[u32], &[u32], &[bool]); 4] =
///     [(&[1], &[2], &[true]), (&[1], &[3, 4], &[true; 2]), (&[5], &[6], &[true]), (&[5], &[7], &[true])];
/// let mut e = Experience::from_rows(&rows, &[0.0; 4], &[true; 4], 0, &Device::Cpu)?;
/// e.rewards = vec![0.0, 1.0, 0.5, 0.5]; // group 1 is flat: no pair
/// e.groups = vec![0, 0, 1, 1];
/// let p = best_worst_pairs(&e)?;
/// assert_eq!(p.input_ids.to_vec2::<u32>()?, [[1, 3, 4], [1, 2, 0]]);
/// assert_eq!((p.normalizer.rows, p.normalizer.tokens), (2, 3.0));
/// assert!(p.pairs.as_ref().is_some_and(|r| r[0].chosen && !r[1].chosen));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn best_worst_pairs(exp: &Experience) -> Result<Experience> {
    let func = "best_worst_pairs";
    if exp.rewards.len() != exp.num_rows() {
        return Err(Error::value(
            func,
            "experience.rewards",
            format!("one reward per row ({})", exp.num_rows()),
            exp.rewards.len(),
        ));
    }
    let mut order = Vec::new();
    let mut roles = Vec::new();
    let mut start = 0;
    while start < exp.num_rows() {
        let group = exp.groups[start];
        let end = start
            + exp.groups[start..]
                .iter()
                .take_while(|&&g| g == group)
                .count();
        if let Some((best, worst)) = extremes(&exp.rewards[start..end]) {
            let pair = roles.len() as u32 / 2;
            order.extend([(start + best) as u32, (start + worst) as u32]);
            for chosen in [true, false] {
                roles.push(PairRole {
                    pair,
                    chosen,
                    margin: 0.0,
                });
            }
        }
        start = end;
    }
    if order.is_empty() {
        let mut empty = exp.rows(0, 0)?;
        empty.pairs = Some(Vec::new());
        empty.normalizer = LossNormalizer::default();
        return Ok(empty);
    }
    let mut pairs = exp.select(&order)?.compact()?;
    pairs.pairs = Some(roles);
    pairs.normalizer = LossNormalizer {
        tokens: pairs.loss_tokens(func)?,
        rows: pairs.num_rows(),
    };
    Ok(pairs)
}

/// A preference pair's token ids: the prompt, the chosen and the rejected completion.
pub type PairRow<'a> = (&'a [u32], &'a [u32], &'a [u32]);

impl Experience {
    /// The interleaved pair experience of `(prompt, chosen, rejected)` rows (offline DPO, reward
    /// models): rows `2i` and `2i + 1` are pair `i`'s chosen and rejected completions of its
    /// prompt, every completion token in the loss, [`Experience::pairs`] set (margins 0), each
    /// pair its own group.
    ///
    /// # Errors
    /// Tensor failures.
    ///
    /// ```
    /// use atomrl_rollout::Experience;
    /// use candle_core::Device;
    /// let rows: [(&[u32], &[u32], &[u32]); 2] = [(&[1, 2], &[3], &[4, 5]), (&[6], &[7], &[8])];
    /// let e = Experience::from_pairs(&rows, 0, &Device::Cpu)?;
    /// assert_eq!(e.input_ids.to_vec2::<u32>()?, [[1, 2, 3, 0], [1, 2, 4, 5], [0, 6, 7, 0], [0, 6, 8, 0]]);
    /// assert_eq!((e.groups.clone(), e.normalizer.rows), (vec![0, 0, 1, 1], 4));
    /// assert!(e.pairs.as_ref().is_some_and(|p| p[2].chosen && p[2].pair == 1));
    /// assert!(e.shared_prompts()?.is_some()); // each prompt runs once for both sides
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_pairs(rows: &[PairRow<'_>], pad_id: u32, device: &Device) -> Result<Self> {
        let masks: Vec<(Vec<bool>, Vec<bool>)> = rows
            .iter()
            .map(|(_, c, r)| (vec![true; c.len()], vec![true; r.len()]))
            .collect();
        let flat: Vec<TokenRow<'_>> = rows
            .iter()
            .zip(&masks)
            .flat_map(|(&(p, c, r), (mc, mr))| [(p, c, mc.as_slice()), (p, r, mr.as_slice())])
            .collect();
        let n = flat.len();
        let mut exp = Self::from_rows(&flat, &vec![0.0; n], &vec![true; n], pad_id, device)?;
        exp.groups = (0..n as u32).map(|r| r / 2).collect();
        exp.pairs = Some(
            (0..n as u32)
                .map(|r| PairRole {
                    pair: r / 2,
                    chosen: r % 2 == 0,
                    margin: 0.0,
                })
                .collect(),
        );
        Ok(exp)
    }
}

/// Each side's `per_token` values `[2N, T]` summed over its loss tokens, `([N], [N])`: the
/// sequence log-probs of DPO when `per_token` holds token log-probs, the completion lengths
/// when it is the loss mask itself.
///
/// # Errors
/// [`Error::Value`] when `exp` is not an interleaved pair experience; tensor failures.
///
/// ```
/// use atomrl_rollout::{pair_sums, Experience};
/// use candle_core::{Device, Tensor};
/// let rows: [(&[u32], &[u32], &[u32]); 1] = [(&[1], &[2, 3], &[4])];
/// let e = Experience::from_pairs(&rows, 0, &Device::Cpu)?;
/// let lp = Tensor::new(&[[-1f32, -2.0], [-4.0, -8.0]], &Device::Cpu)?; // -8 is padding
/// let (c, r) = pair_sums(&e, &lp)?;
/// assert_eq!((c.to_vec1::<f32>()?, r.to_vec1::<f32>()?), (vec![-3.0], vec![-4.0]));
/// let (lc, lr) = pair_sums(&e, &e.loss_mask)?;
/// assert_eq!((lc.to_vec1::<f32>()?, lr.to_vec1::<f32>()?), (vec![2.0], vec![1.0]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn pair_sums(exp: &Experience, per_token: &Tensor) -> Result<(Tensor, Tensor)> {
    let func = "pair_sums";
    if exp.pairs.is_none() {
        return Err(Error::value(
            func,
            "exp.pairs",
            "an interleaved pair experience",
            "rows without pairs",
        ));
    }
    let sums = (per_token * &exp.loss_mask)
        .and_then(|t| t.sum(1))
        .ctx(func)?;
    split_pairs(&sums)
}

/// The margin of each pair of an interleaved pair experience `[N]` (read from its chosen
/// rows).
///
/// # Errors
/// [`Error::Value`] when `exp` has no pairs; tensor failures.
///
/// ```
/// use atomrl_rollout::{pair_margins, Experience};
/// use candle_core::Device;
/// let rows: [(&[u32], &[u32], &[u32]); 2] = [(&[1], &[2], &[3]), (&[1], &[4], &[5])];
/// let mut e = Experience::from_pairs(&rows, 0, &Device::Cpu)?;
/// e.pairs.as_mut().unwrap()[2].margin = 1.5;
/// assert_eq!(pair_margins(&e)?.to_vec1::<f32>()?, [0.0, 1.5]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn pair_margins(exp: &Experience) -> Result<Tensor> {
    let func = "pair_margins";
    let Some(roles) = &exp.pairs else {
        return Err(Error::value(
            func,
            "exp.pairs",
            "an interleaved pair experience",
            "rows without pairs",
        ));
    };
    let margins: Vec<f32> = roles.iter().step_by(2).map(|r| r.margin).collect();
    Tensor::new(margins, exp.input_ids.device()).ctx(func)
}

/// Text preference pairs from the policy's own samples (what a reward model or offline DPO
/// can train on): for each example, `params.num_generations` completions scored by
/// `ctx.rewards`; where the scores differ, up to `pairs_per_prompt` distinct pairs of a
/// best-scoring answer preferred to a worst-scoring one (with 1, the first best against the
/// first worst, [`best_worst_pairs`]' rule; more pairs pair every best with every worst,
/// spread over both sides). Pairs whose two answers are the same text, or an empty one, are
/// left out. Each pair keeps its example's prompt and ground truth; no margin is set.
///
/// # Errors
/// Prompt encoding, generation or reward failures; a failed collective.
pub fn sample_preference_pairs(
    ctx: &crate::RolloutContext<'_>,
    par: crate::parallel::Parallel<'_>,
    params: &atomrl_sample::SamplingParams,
    encoder: &crate::PromptEncoder,
    examples: &[atomrl_data::Example],
    pairs_per_prompt: usize,
) -> Result<Vec<atomrl_data::Example>> {
    let prompts = examples
        .iter()
        .map(|e| encoder.encode(ctx.tokenizer, e))
        .collect::<Result<Vec<_>>>()?;
    let truth: Vec<String> = examples.iter().map(|e| e.ground_truth.clone()).collect();
    let scored = crate::rollout::generate_group_rows(ctx, par, params, &prompts, &truth)?;
    let g = params.num_generations.max(1);
    let mut out = Vec::new();
    for (i, example) in examples.iter().enumerate() {
        let rows = i * g..(i + 1) * g;
        let answer = |k: usize| scored.completions[rows.start + k].answer.as_str();
        let mut seen = std::collections::HashSet::new();
        for (best, worst) in extreme_pairs(&scored.rewards[rows.clone()]) {
            let (chosen, rejected) = (answer(best), answer(worst));
            if seen.len() >= pairs_per_prompt
                || chosen == rejected
                || chosen.trim().is_empty()
                || rejected.trim().is_empty()
                || !seen.insert((chosen, rejected))
            {
                continue;
            }
            out.push(atomrl_data::Example {
                preference: Some(atomrl_data::Preference {
                    chosen: chosen.to_string(),
                    rejected: rejected.to_string(),
                    margin: None,
                }),
                completion: None,
                ..example.clone()
            });
        }
    }
    Ok(out)
}

/// Every (best, worst) index pair of a group whose rewards differ, in an order that spreads
/// both sides: `(b₀, w₀), (b₁, w₁), …`, diagonal by diagonal.
fn extreme_pairs(rewards: &[f32]) -> Vec<(usize, usize)> {
    let Some((b, w)) = extremes(rewards) else {
        return Vec::new();
    };
    let best: Vec<usize> = (0..rewards.len())
        .filter(|&i| rewards[i] == rewards[b])
        .collect();
    let worst: Vec<usize> = (0..rewards.len())
        .filter(|&i| rewards[i] == rewards[w])
        .collect();
    let mut pairs: Vec<(usize, usize)> = (0..best.len())
        .flat_map(|i| (0..worst.len()).map(move |j| (i, j)))
        .collect();
    pairs.sort_by_key(|&(i, j)| ((j + worst.len() - i % worst.len()) % worst.len(), i));
    pairs
        .into_iter()
        .map(|(i, j)| (best[i], worst[j]))
        .collect()
}

/// The first index of the highest and of the lowest reward, unless they are equal.
fn extremes(rewards: &[f32]) -> Option<(usize, usize)> {
    let mut best = 0;
    let mut worst = 0;
    for (i, &r) in rewards.iter().enumerate() {
        if r > rewards[best] {
            best = i;
        }
        if r < rewards[worst] {
            worst = i;
        }
    }
    (rewards.get(best)? > &rewards[worst]).then_some((best, worst))
}

/// The chosen and rejected halves `([N], [N])` of a per-row column `[2N]` of an interleaved
/// pair experience (`[chosen₀, rejected₀, …]`, as [`best_worst_pairs`] lays them out).
///
/// # Errors
/// [`Error::Value`] when `per_row` is not a vector of even length.
///
/// ```
/// use atomrl_rollout::split_pairs;
/// use candle_core::{Device, Tensor};
/// let (c, r) = split_pairs(&Tensor::new(&[1f32, 2., 3., 4.], &Device::Cpu)?)?;
/// assert_eq!((c.to_vec1::<f32>()?, r.to_vec1::<f32>()?), (vec![1., 3.], vec![2., 4.]));
/// assert!(split_pairs(&Tensor::new(&[1f32, 2., 3.], &Device::Cpu)?).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn split_pairs(per_row: &Tensor) -> Result<(Tensor, Tensor)> {
    let func = "split_pairs";
    let rows = match per_row.dims() {
        [r] if r % 2 == 0 => *r,
        dims => {
            return Err(Error::value(
                func,
                "per_row",
                "a vector [2N] of interleaved chosen and rejected rows",
                format!("{dims:?}"),
            ))
        }
    };
    let halves = per_row.reshape((rows / 2, 2)).ctx(func)?;
    let side = |i: usize| halves.narrow(1, i, 1).and_then(|t| t.squeeze(1)).ctx(func);
    Ok((side(0)?, side(1)?))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use candle_core::Device;
    use proptest::prelude::*;

    /// `groups` groups of random sizes and rewards (few distinct values, so ties and flat
    /// groups are common), each row's completion its own row number.
    fn experience(groups: &[Vec<u8>]) -> Experience {
        let rewards: Vec<f32> = groups.iter().flatten().map(|&r| f32::from(r % 3)).collect();
        let prompts: Vec<[u32; 1]> = (0..groups.len()).map(|g| [g as u32 + 1]).collect();
        let completions: Vec<[u32; 1]> = (0..rewards.len()).map(|r| [r as u32 + 100]).collect();
        let mut rows = Vec::new();
        let mut ids = Vec::new();
        for (g, group) in groups.iter().enumerate() {
            for _ in group {
                let r = ids.len();
                rows.push((
                    prompts[g].as_slice(),
                    completions[r].as_slice(),
                    [true].as_slice(),
                ));
                ids.push(g as u32);
            }
        }
        let n = rows.len();
        let mut e =
            Experience::from_rows(&rows, &vec![0.0; n], &vec![true; n], 0, &Device::Cpu).unwrap();
        e.rewards = rewards;
        e.groups = ids;
        e
    }

    proptest! {
        #[test]
        fn each_group_with_spread_gives_its_best_against_its_worst(
            groups in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..6), 1..6),
        ) {
            let e = experience(&groups);
            let p = best_worst_pairs(&e).unwrap();
            let spread = groups
                .iter()
                .filter(|g| g.iter().map(|r| r % 3).min() != g.iter().map(|r| r % 3).max())
                .count();
            prop_assert_eq!(p.num_rows(), 2 * spread);
            prop_assert_eq!(p.normalizer.rows, 2 * spread);
            let roles = p.pairs.clone().unwrap();
            let ids: Vec<u32> = p.input_ids.to_vec2::<u32>().unwrap().iter().map(|r| r[1] - 100).collect();
            for k in 0..spread {
                let (c, r) = (2 * k, 2 * k + 1);
                prop_assert!(roles[c].chosen && !roles[r].chosen);
                prop_assert_eq!(roles[c].pair, k as u32);
                prop_assert_eq!(p.groups[c], p.groups[r]);
                prop_assert!(p.rewards[c] > p.rewards[r]);
                let group: Vec<f32> = (0..e.num_rows())
                    .filter(|&i| e.groups[i] == p.groups[c])
                    .map(|i| e.rewards[i])
                    .collect();
                let max = group.iter().cloned().fold(f32::MIN, f32::max);
                let min = group.iter().cloned().fold(f32::MAX, f32::min);
                prop_assert_eq!((p.rewards[c], p.rewards[r]), (max, min));
                // The first row of each extreme, and the source row's reward travelled with it.
                prop_assert_eq!(e.rewards[ids[c] as usize], max);
                let first = (0..e.num_rows()).find(|&i| e.groups[i] == p.groups[c] && e.rewards[i] == max);
                prop_assert_eq!(first, Some(ids[c] as usize));
            }
        }
    }

    #[test]
    fn extreme_pairs_spread_both_sides_without_repeats() {
        // Best rows 1, 4 (reward 2); worst rows 0, 2, 3 (reward 0).
        let pairs = extreme_pairs(&[0.0, 2.0, 0.0, 0.0, 2.0, 1.0]);
        assert_eq!(pairs.len(), 6);
        assert_eq!(&pairs[..2], [(1, 0), (4, 2)]);
        let unique: std::collections::HashSet<_> = pairs.iter().collect();
        assert_eq!(unique.len(), 6);
        assert!(extreme_pairs(&[1.0, 1.0]).is_empty());
    }

    #[test]
    fn no_pair_and_bad_rewards() {
        let e = experience(&[vec![0, 3], vec![1]]);
        let p = best_worst_pairs(&e).unwrap();
        assert_eq!((p.num_rows(), p.normalizer.tokens), (0, 0.0));
        assert_eq!(p.pairs, Some(Vec::new()));
        let mut bad = e.clone();
        bad.rewards.pop();
        let err = best_worst_pairs(&bad).unwrap_err().to_string();
        assert!(err.contains("experience.rewards"), "{err}");
    }
}
