//! Fisher–Yates shuffling of a dataset's order with [`SplitMix64`] (atomrl-core's generator,
//! re-exported here).

pub use atomrl_core::rng::SplitMix64;

/// `0..n` in a seeded random order: [`SplitMix64::new`]`(seed)` driving
/// [`SplitMix64::shuffle`]. Stable across versions of this crate's dependencies.
///
/// ```
/// let p = atomrl_data::seeded_permutation(5, 42);
/// let mut sorted = p.clone();
/// sorted.sort();
/// assert_eq!(sorted, vec![0, 1, 2, 3, 4]);
/// assert_eq!(p, atomrl_data::seeded_permutation(5, 42));
/// ```
pub fn seeded_permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    SplitMix64::new(seed).shuffle(&mut order);
    order
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn golden_permutation() {
        // Pins the shuffle itself: a change here changes every run's data order. Cross-checked
        // with an independent Python implementation of SplitMix64 + Lemire + Fisher–Yates.
        assert_eq!(seeded_permutation(10, 0), GOLDEN_10_SEED_0.to_vec());
    }

    const GOLDEN_10_SEED_0: [usize; 10] = [4, 9, 2, 5, 1, 7, 6, 0, 3, 8];
}
