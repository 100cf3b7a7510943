//! The one seeded generator of AtomRL (SplitMix64) and its finaliser: data order, random
//! initialisation, sampling seeds and per-turn seeds all derive from it.
//!
//! Why not `rand`'s `StdRng` or `SmallRng`: their algorithms are explicitly not guaranteed to
//! stay the same across `rand` versions. Data order is part of a run's identity: exact resume
//! from a checkpoint, the held-out split and the synthetic dataset must give the same examples
//! after a dependency update. SplitMix64 (Steele, Lea & Flood, 2014; the seeding generator of
//! the xoshiro family) is ten lines, passes BigCrush, and is pinned here by golden tests.

/// The SplitMix64 generator: a 64-bit counter stepped by the golden-ratio constant and mixed
/// by a bijective finaliser. Not cryptographic.
///
/// ```
/// use atomrl_core::rng::SplitMix64;
/// let mut rng = SplitMix64::new(0);
/// assert_eq!(rng.next_u64(), 0xe220_a839_7b1d_cdaf); // the published reference value
/// let x = rng.below(10);
/// assert!(x < 10);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

/// The golden-ratio increment of SplitMix64.
pub const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

impl SplitMix64 {
    /// A generator seeded with `seed` (every seed, 0 included, is fine).
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for sub-stream `stream` of `seed` (e.g. one per epoch): seeded with
    /// `mix(seed ^ mix(stream ^ GOLDEN_GAMMA))`, so that nearby seeds and streams give
    /// unrelated sequences.
    ///
    /// ```
    /// use atomrl_core::rng::SplitMix64;
    /// assert_ne!(SplitMix64::derive(1, 0), SplitMix64::derive(0, 1));
    /// ```
    pub fn derive(seed: u64, stream: u64) -> Self {
        Self::new(mix(seed ^ mix(stream ^ GOLDEN_GAMMA)))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix(self.state)
    }

    /// A uniform integer in `0..n` (Lemire's multiply-and-reject, no modulo bias); 0 when
    /// `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// A uniform integer in `lo..=hi` (`lo` when `hi <= lo`).
    ///
    /// ```
    /// let mut rng = atomrl_core::rng::SplitMix64::new(7);
    /// assert!((3..=5).contains(&rng.range_i64(3, 5)));
    /// assert_eq!(rng.range_i64(4, 2), 4);
    /// ```
    pub fn range_i64(&mut self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            return lo;
        }
        let span = hi.abs_diff(lo).saturating_add(1);
        lo.wrapping_add(self.below(span) as i64)
    }

    /// Shuffles `items` in place with Fisher–Yates (from the end: swap item `i` with a
    /// uniform item in `0..=i`).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// The SplitMix64 finaliser (Stafford's "Mix13"): a bijection on `u64`, for seeds that
/// must be unrelated for nearby inputs.
///
/// ```
/// assert_ne!(atomrl_core::rng::mix(1), atomrl_core::rng::mix(2));
/// ```
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reference_values() {
        // Published SplitMix64 outputs for seed 0 (e.g. the xoshiro reference seeding code).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xe220a8397b1dcdaf);
        assert_eq!(r.next_u64(), 0x6e789e6aa1b965f4);
        assert_eq!(r.next_u64(), 0x06c45d188009454f);
    }

    #[test]
    fn below_is_roughly_uniform() {
        let mut r = SplitMix64::new(3);
        let mut counts = [0u32; 6];
        for _ in 0..60_000 {
            counts[r.below(6) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
        assert_eq!(r.below(0), 0);
        assert_eq!(r.below(1), 0);
    }

    #[test]
    fn range_extremes() {
        let mut r = SplitMix64::new(1);
        for _ in 0..100 {
            let x = r.range_i64(i64::MIN, i64::MAX);
            let _ = x;
            let y = r.range_i64(-3, 3);
            assert!((-3..=3).contains(&y));
        }
    }
}
