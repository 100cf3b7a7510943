//! The counter-based noise of the device draw: Philox4x32-10 (Salmon, Moraes, Dror and Shaw,
//! "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the generator of cuRAND's and
//! JAX's Philox streams), keyed by the sampling seed and indexed by (step, row, vocabulary
//! entry), so that any entry's uniform number is computed where it is needed.
//!
//! That lets the CUDA draw (`atomrl_pick_*` in `crates/atomrl-core/cuda/decode.cu`) make its
//! noise inside the kernel instead of reading a `[B, V]` f32 buffer filled by cuRAND, and
//! lets the host make the very same numbers: the CPU path, the tensor-op form and the device
//! check all draw with the noise the kernel draws with. A row's noise depends on its index in
//! the `generate_samples` call and the step, not on its position in the running batch, so a
//! row draws the same tokens whichever other rows are still decoding.
//!
//! Hand-written rather than a crate's: the same ten rounds run in `decode.cu`, and the counter
//! layout below is this project's contract between the two; the known-answer vectors of
//! Random123 (the authors' reference implementation) pin the rounds.

/// Philox4x32's multipliers and Weyl key increments (Random123's `PHILOX_M4x32_*` and
/// `PHILOX_W32_*`).
const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Philox4x32-10: four 32-bit words of `counter` under the 64-bit `key` (ten rounds, the key
/// bumped by the Weyl increments before each round after the first).
pub(crate) fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [mut c0, mut c1, mut c2, mut c3] = counter;
    let [mut k0, mut k1] = key;
    for round in 0..10 {
        if round > 0 {
            k0 = k0.wrapping_add(W0);
            k1 = k1.wrapping_add(W1);
        }
        let p0 = u64::from(M0) * u64::from(c0);
        let p1 = u64::from(M1) * u64::from(c2);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0);
    }
    [c0, c1, c2, c3]
}

/// A uniform number in `[0, 1)` from a 32-bit word: its top 24 bits over 2^24 (exact in f32;
/// 0 has probability 2^-24, and Gumbel-max maps it to a token never drawn).
pub(crate) fn unit_f32(word: u32) -> f32 {
    (word >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// The noise of one draw step: the sampling `seed` (the key) and the `step` (how many tokens
/// each row drew before in this call).
///
/// Entry `j` of row `r` is word `j % 4` of Philox4x32-10 with counter `[j / 4, r, step, 0]`
/// and key `[seed mod 2^32, seed / 2^32]`, through [`unit_f32`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepNoise {
    pub(crate) seed: u64,
    pub(crate) step: u32,
}

impl StepNoise {
    /// The key words of the seed.
    pub(crate) fn key(&self) -> [u32; 2] {
        [self.seed as u32, (self.seed >> 32) as u32]
    }

    /// Uniform numbers `[rows.len(), vocab]` (row-major) for the rows `rows` (their indices in
    /// the call), as the kernel makes them.
    pub(crate) fn uniforms(&self, rows: &[u32], vocab: usize) -> Vec<f32> {
        let key = self.key();
        let mut out = Vec::with_capacity(rows.len() * vocab);
        for &r in rows {
            for q in 0..vocab.div_ceil(4) {
                let words = philox4x32_10([q as u32, r, self.step, 0], key);
                let take = (vocab - 4 * q).min(4);
                out.extend(words[..take].iter().map(|&w| unit_f32(w)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Random123's known-answer vectors for Philox4x32-10 (its `tests/kat_vectors`).
    #[test]
    fn the_rounds_give_random123s_known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn unit_floats_cover_zero_to_just_below_one() {
        assert_eq!(unit_f32(0), 0.0);
        assert_eq!(unit_f32(255), 0.0);
        assert_eq!(unit_f32(u32::MAX), 1.0 - 1.0 / 16_777_216.0);
        assert!(unit_f32(u32::MAX) < 1.0);
    }

    /// Moments and a 16-bin histogram of 2^18 numbers: uniform on [0, 1) (mean 1/2, variance
    /// 1/12; chi-square with 15 degrees of freedom under its 0.1% critical value 37.7).
    #[test]
    fn the_numbers_are_uniform() {
        let noise = StepNoise { seed: 42, step: 3 };
        let u = noise.uniforms(&[0, 1, 2, 7], 65_536);
        let n = u.len() as f64;
        let mean = u.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = u
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
        assert!((var - 1.0 / 12.0).abs() < 0.002, "variance {var}");
        let mut bins = [0usize; 16];
        for &x in &u {
            bins[(x * 16.0) as usize] += 1;
        }
        let e = n / 16.0;
        let chi2: f64 = bins.iter().map(|&c| (c as f64 - e).powi(2) / e).sum();
        assert!(chi2 < 37.7, "chi-square {chi2}, bins {bins:?}");
    }

    #[test]
    fn rows_steps_and_seeds_have_their_own_streams_and_a_row_keeps_its_own() {
        let a = StepNoise { seed: 1, step: 0 };
        let vocab = 10; // not a multiple of 4: the last group is cut
        let both = a.uniforms(&[3, 5], vocab);
        assert_eq!(both.len(), 20);
        assert_eq!(&both[vocab..], a.uniforms(&[5], vocab).as_slice());
        assert_ne!(both[..vocab], both[vocab..]);
        assert_ne!(
            a.uniforms(&[3], vocab),
            StepNoise { seed: 1, step: 1 }.uniforms(&[3], vocab)
        );
        assert_ne!(
            a.uniforms(&[3], vocab),
            StepNoise {
                seed: 1 << 32,
                step: 0
            }
            .uniforms(&[3], vocab)
        );
        assert_eq!(a.uniforms(&[3], 7), a.uniforms(&[3], vocab)[..7]);
    }
}
