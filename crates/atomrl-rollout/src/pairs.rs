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
            roles.push(PairRole { pair, chosen: true });
            roles.push(PairRole {
                pair,
                chosen: false,
            });
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
    /// prompt, every completion token in the loss, [`Experience::pairs`] set, each pair its own
    /// group.
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
