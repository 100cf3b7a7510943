//! The rows of the groups whose rewards differ.
//!
//! A group whose completions all got the same reward says nothing about which completion was
//! better. GRPO's advantages are exactly 0 there, so its update leaves those rows out; an
//! actor-critic recipe gives them the critic's advantages instead, and can choose to leave
//! them out of the actor's update the same way while its critic still learns from them
//! (`critic.actor_skip_flat_groups`, docs/ppo.md).

use std::collections::HashMap;

use atomrl_advantage::GroupStats;
use atomrl_core::Result;

use crate::experience::{Experience, LossNormalizer};

impl Experience {
    /// The rows of the groups (`groups`) whose `rewards` are not all equal, in their order,
    /// without the columns that are then padding everywhere
    /// ([`compact`](Self::compact)), with a normaliser of their own (their loss tokens and
    /// rows): the kept rows are the batch, as after verl's `filter_groups`. (GRPO's
    /// [`without_zero_advantage`](Self::without_zero_advantage) keeps the step's instead: its
    /// rows left out have advantage 0 and count as rows whose loss is 0; here they have the
    /// critic's advantages, which the actor is not to see.) No row left: an experience of 0
    /// rows and a zero normaliser.
    ///
    /// # Errors
    /// Tensor failures.
    ///
    /// ```
    /// use atomrl_rollout::Experience;
    /// use candle_core::Device;
    /// let rows: [(&[u32], &[u32], &[bool]); 4] =
    ///     [(&[1], &[2], &[true]), (&[1], &[3, 4], &[true; 2]), (&[5], &[6], &[true]), (&[5], &[7], &[true])];
    /// let mut e = Experience::from_rows(&rows, &[0.0; 4], &[true; 4], 0, &Device::Cpu)?;
    /// e.groups = vec![0, 0, 1, 1];
    /// e.rewards = vec![1.0, 0.0, 0.5, 0.5]; // group 1 is flat
    /// let kept = e.without_flat_groups()?;
    /// assert_eq!((kept.num_rows(), kept.rewards.clone()), (2, vec![1.0, 0.0]));
    /// assert_eq!((kept.normalizer.tokens, kept.normalizer.rows), (3.0, 2)); // their own
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn without_flat_groups(&self) -> Result<Self> {
        // Flat as the experience's groups are judged (`zero_std_groups_frac`, GRPO's advantages).
        let mut members = HashMap::<u32, Vec<f64>>::new();
        for (&g, &r) in self.groups.iter().zip(&self.rewards) {
            members.entry(g).or_default().push(f64::from(r));
        }
        let flat: HashMap<u32, bool> = members
            .into_iter()
            .map(|(g, rewards)| (g, GroupStats::of(&rewards).flat))
            .collect();
        let keep: Vec<u32> = (0..self.groups.len().min(self.rewards.len()))
            .filter(|&i| flat.get(&self.groups[i]) == Some(&false))
            .map(|i| i as u32)
            .collect();
        let mut kept = if keep.is_empty() {
            self.rows(0, 0)?
        } else {
            self.select(&keep)?.compact()?
        };
        kept.normalizer = LossNormalizer {
            tokens: kept.loss_tokens("Experience::without_flat_groups")?,
            rows: kept.num_rows(),
        };
        Ok(kept)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use candle_core::Device;

    use super::*;

    fn experience(groups: &[u32], rewards: &[f32]) -> Experience {
        let rows: Vec<(&[u32], &[u32], &[bool])> = groups
            .iter()
            .map(|_| (&[1u32][..], &[2u32, 3][..], &[true, true][..]))
            .collect();
        let adv = vec![0.5; groups.len()];
        let mask = vec![true; groups.len()];
        let mut e = Experience::from_rows(&rows, &adv, &mask, 0, &Device::Cpu).unwrap();
        e.groups = groups.to_vec();
        e.rewards = rewards.to_vec();
        e
    }

    #[test]
    fn keeps_the_groups_whose_rewards_differ_in_order() {
        let e = experience(&[0, 0, 1, 1, 2, 2], &[1.0, 1.0, 0.0, 1.0, 0.2, 0.2]);
        let kept = e.without_flat_groups().unwrap();
        assert_eq!(kept.groups, vec![1, 1]);
        assert_eq!(kept.rewards, vec![0.0, 1.0]);
        // Two rows of two tokens: the kept rows' own normaliser, not the step's (6 rows).
        assert_eq!((kept.normalizer.tokens, kept.normalizer.rows), (4.0, 2));
    }

    #[test]
    fn all_flat_or_one_row_groups_leave_nothing() {
        let e = experience(&[0, 0, 1], &[1.0, 1.0, 0.0]);
        let kept = e.without_flat_groups().unwrap();
        assert_eq!((kept.num_rows(), kept.normalizer.tokens), (0, 0.0));
    }
}
