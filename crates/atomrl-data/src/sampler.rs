//! Seeded per-epoch shuffling with an exactly resumable position.

use atomrl_core::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::shuffle::SplitMix64;

/// Where an [`EpochSampler`] is: the epoch it is in and how many indices of that epoch's order
/// it has handed out. Saved in checkpoints; [`EpochSampler::from_state`] resumes from it.
///
/// ```
/// use atomrl_data::SamplerState;
/// let s = SamplerState { epoch: 2, position: 40 };
/// let json = serde_json::to_string(&s)?;
/// assert_eq!(json, r#"{"epoch":2,"position":40}"#);
/// assert_eq!(serde_json::from_str::<SamplerState>(&json)?, s);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct SamplerState {
    /// Completed epochs (0 during the first pass over the data).
    pub epoch: u64,
    /// Indices already taken from this epoch's order, `< num_examples`.
    pub position: usize,
}

/// Hands out example indices in batches, reshuffled every epoch, with exact resume.
///
/// The order of epoch `e` is `0..num_examples` shuffled by Fisher–Yates driven by
/// [`SplitMix64::derive`]`(seed, e)` — a pure function of `(num_examples, seed, e)`, stable
/// across dependency versions — so a sampler rebuilt with [`EpochSampler::from_state`] from a
/// saved [`state`](EpochSampler::state) yields exactly the batches the original would have.
/// A batch that crosses the end of an epoch takes the rest of that epoch and continues with the
/// start of the next (so it may hold the same index twice on very small datasets).
///
/// ```
/// use atomrl_data::EpochSampler;
/// let mut s = EpochSampler::new(10, 42);
/// let first = s.next_batch(4);
/// let saved = s.state();
/// let mut resumed = EpochSampler::from_state(10, 42, &saved)?;
/// for _ in 0..5 {
///     assert_eq!(s.next_batch(4), resumed.next_batch(4));
/// }
/// assert_eq!(s.epoch(), 2); // 4 + 5 × 4 = 24 indices: two full epochs and 4 more
/// assert_eq!(first.len(), 4);
/// # Ok::<(), atomrl_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct EpochSampler {
    num_examples: usize,
    seed: u64,
    epoch: u64,
    position: usize,
    order: Vec<usize>,
}

impl EpochSampler {
    /// A sampler at the start of epoch 0. With `num_examples == 0` every batch is empty.
    pub fn new(num_examples: usize, seed: u64) -> Self {
        Self {
            num_examples,
            seed,
            epoch: 0,
            position: 0,
            order: epoch_order(num_examples, seed, 0),
        }
    }

    /// A sampler at a saved position, for the same dataset size and seed as the one saved.
    ///
    /// # Errors
    /// [`Error::Value`] when `state.position >= num_examples` (other than 0 for an empty
    /// dataset), which means the dataset changed since the state was saved.
    ///
    /// ```
    /// use atomrl_data::{EpochSampler, SamplerState};
    /// let s = EpochSampler::from_state(8, 1, &SamplerState { epoch: 3, position: 5 })?;
    /// assert_eq!((s.epoch(), s.position()), (3, 5));
    /// assert!(EpochSampler::from_state(8, 1, &SamplerState { epoch: 0, position: 8 }).is_err());
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn from_state(num_examples: usize, seed: u64, state: &SamplerState) -> Result<Self> {
        if state.position >= num_examples.max(1) {
            return Err(Error::value(
                "EpochSampler::from_state",
                "state.position",
                format!(
                    "smaller than the number of examples ({num_examples}); was the dataset \
                     changed since the state was saved?"
                ),
                state.position,
            ));
        }
        Ok(Self {
            num_examples,
            seed,
            epoch: state.epoch,
            position: state.position,
            order: epoch_order(num_examples, seed, state.epoch),
        })
    }

    /// The next `batch_size` indices (into the dataset), moving into the next epoch — with a
    /// fresh shuffle — when this one runs out. Empty when `batch_size` or the dataset is 0.
    pub fn next_batch(&mut self, batch_size: usize) -> Vec<usize> {
        if self.num_examples == 0 {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(batch_size);
        while out.len() < batch_size {
            let take = (batch_size - out.len()).min(self.num_examples - self.position);
            out.extend_from_slice(&self.order[self.position..self.position + take]);
            self.position += take;
            if self.position == self.num_examples {
                self.epoch = self.epoch.saturating_add(1);
                self.position = 0;
                self.order = epoch_order(self.num_examples, self.seed, self.epoch);
            }
        }
        out
    }

    /// The epoch the next index comes from (the number of completed passes over the data).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Indices already taken from the current epoch.
    pub fn position(&self) -> usize {
        self.position
    }

    /// The dataset size.
    pub fn num_examples(&self) -> usize {
        self.num_examples
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The current position, to save in a checkpoint.
    pub fn state(&self) -> SamplerState {
        SamplerState {
            epoch: self.epoch,
            position: self.position,
        }
    }
}

fn epoch_order(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    SplitMix64::derive(seed, epoch).shuffle(&mut order);
    order
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn each_epoch_is_a_permutation_and_differs() {
        let mut s = EpochSampler::new(7, 3);
        let e0 = s.next_batch(7);
        assert_eq!(s.epoch(), 1);
        let e1 = s.next_batch(7);
        let mut a = e0.clone();
        a.sort();
        assert_eq!(a, (0..7).collect::<Vec<_>>());
        let mut b = e1.clone();
        b.sort();
        assert_eq!(b, a);
        assert_ne!(e0, e1);
    }

    #[test]
    fn empty_and_zero() {
        let mut s = EpochSampler::new(0, 1);
        assert!(s.next_batch(4).is_empty());
        assert!(EpochSampler::from_state(0, 1, &SamplerState::default()).is_ok());
        let mut s = EpochSampler::new(3, 1);
        assert!(s.next_batch(0).is_empty());
        assert_eq!(s.next_batch(10).len(), 10);
        assert_eq!(
            s.state(),
            SamplerState {
                epoch: 3,
                position: 1
            }
        );
    }
}
