//! Preference pairs ordered so that each micro-batch holds pairs of similar length.
//!
//! A micro-batch is as wide as its longest prompt plus its longest completion, so a batch of
//! pairs drawn at random spends much of its compute on padding (~65% more positions than real
//! tokens for the embedded example's reward model). Sorted by length and cut into micro-batches,
//! each is about as wide as its own pairs; the micro-batches are then dealt to the shards in a
//! snake order (shortest to shard 0, 1, …, then back), so that every worker gets a similar
//! share of long and short pairs.

use std::ops::Range;

use atomrl_core::{CandleContext, Error, Result};

use crate::experience::Experience;

impl Experience {
    /// The same pairs reordered for micro-batches `chunks` (ranges of **pairs**, in the
    /// order [`Parallel::micro_batches`](crate::parallel::Parallel::micro_batches) gives them,
    /// chunk `c` running on shard `c mod shards`): the pairs sorted by length (prompt tokens
    /// plus the longer completion; ties keep their order) fill the chunks in snake order —
    /// chunks `0, 1, …, shards − 1`, then `2·shards − 1, …, shards`, and so on — so that
    /// each chunk holds pairs of similar length and each shard a similar amount of work.
    /// Each pair's two rows stay together (chosen, then rejected); every column is reordered
    /// with them. A loss that is a sum over pairs is unchanged up to the order of the sum.
    ///
    /// # Errors
    /// [`Error::Value`] when `self` is not an interleaved pair experience or `chunks` do not
    /// cover its pairs exactly; tensor failures.
    ///
    /// ```
    /// use atomrl_rollout::Experience;
    /// use candle_core::Device;
    /// // Pair lengths 4, 2, 3, 2 (prompt + longer completion; ties keep their order).
    /// let rows: [(&[u32], &[u32], &[u32]); 4] = [
    ///     (&[1, 1], &[2, 2], &[3]),
    ///     (&[1], &[0], &[0]),
    ///     (&[1, 1], &[2], &[3]),
    ///     (&[1], &[2], &[3]),
    /// ];
    /// let e = Experience::from_pairs(&rows, 9, &Device::Cpu)?;
    /// // Two chunks of two pairs on one shard: the two shortest, then the two longest.
    /// let sorted = e.pairs_by_length(&[0..2, 2..4], 1)?;
    /// let order: Vec<u32> = sorted.pairs.unwrap().iter().step_by(2).map(|r| r.pair).collect();
    /// assert_eq!(order, [1, 3, 2, 0]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pairs_by_length(&self, chunks: &[Range<usize>], shards: usize) -> Result<Self> {
        let func = "Experience::pairs_by_length";
        if self.pairs.is_none() || self.num_rows() % 2 != 0 {
            return Err(Error::value(
                func,
                "experience",
                "an interleaved pair experience",
                "rows without pairs",
            ));
        }
        let pairs = self.num_rows() / 2;
        let covered = chunks
            .iter()
            .try_fold(0, |next, c| (c.start == next).then_some(c.end));
        if covered != Some(pairs) {
            return Err(Error::value(
                func,
                "chunks",
                format!("contiguous ranges covering the {pairs} pairs"),
                format!("{chunks:?}"),
            ));
        }
        let lengths = self.pair_lengths()?;
        let mut by_length: Vec<usize> = (0..pairs).collect();
        by_length.sort_by_key(|&p| lengths[p]);
        let mut slots: Vec<Vec<usize>> = vec![Vec::new(); chunks.len()];
        let mut next = by_length.into_iter();
        for c in snake_order(chunks.len(), shards) {
            slots[c].extend(next.by_ref().take(chunks[c].len()));
        }
        let rows: Vec<u32> = slots
            .iter()
            .flatten()
            .flat_map(|&p| [2 * p as u32, 2 * p as u32 + 1])
            .collect();
        self.select(&rows)
    }

    /// Each pair's length: its prompt's real tokens plus its longer completion's.
    fn pair_lengths(&self) -> Result<Vec<usize>> {
        let mask: Vec<Vec<f32>> = self
            .attention_mask
            .to_vec2()
            .ctx("Experience::pairs_by_length")?;
        let prompt_width = mask.first().map_or(0, Vec::len) - self.completion_len;
        let real = |row: &[f32]| row.iter().filter(|&&m| m != 0.0).count();
        Ok(mask
            .chunks(2)
            .map(|pair| {
                let prompt = real(&pair[0][..prompt_width]);
                let completion = pair.iter().map(|r| real(&r[prompt_width..])).max();
                prompt + completion.unwrap_or(0)
            })
            .collect())
    }
}

/// The order in which `chunks` chunks dealt round-robin to `shards` shards are filled: each
/// round of `shards` chunks forwards, the next backwards.
fn snake_order(chunks: usize, shards: usize) -> impl Iterator<Item = usize> {
    let shards = shards.max(1);
    (0..chunks).map(move |i| {
        let (round, j) = (i / shards, i % shards);
        let start = round * shards;
        let width = shards.min(chunks - start);
        if round % 2 == 0 {
            start + j
        } else {
            start + width - 1 - j
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::parallel::split_even;
    use candle_core::Device;
    use proptest::prelude::*;

    #[test]
    fn snake_order_alternates_direction() {
        assert_eq!(
            snake_order(8, 2).collect::<Vec<_>>(),
            [0, 1, 3, 2, 4, 5, 7, 6]
        );
        assert_eq!(snake_order(5, 3).collect::<Vec<_>>(), [0, 1, 2, 4, 3]);
        assert_eq!(snake_order(3, 1).collect::<Vec<_>>(), [0, 1, 2]);
    }

    #[test]
    fn rejects_rows_without_pairs_and_bad_chunks() {
        let rows: [(&[u32], &[u32], &[bool]); 2] = [(&[1], &[2], &[true]), (&[1], &[3], &[true])];
        let plain = Experience::from_rows(&rows, &[0.0; 2], &[true; 2], 0, &Device::Cpu).unwrap();
        let one_pair = [Range { start: 0, end: 1 }];
        let err = plain.pairs_by_length(&one_pair, 1).unwrap_err().to_string();
        assert!(err.contains("experience"), "{err}");
        let pairs: [crate::PairRow<'_>; 2] = [(&[1], &[2], &[3]), (&[1], &[4], &[5])];
        let e = Experience::from_pairs(&pairs, 0, &Device::Cpu).unwrap();
        let err = e.pairs_by_length(&one_pair, 1).unwrap_err().to_string();
        assert!(err.contains("chunks") && err.contains("2 pairs"), "{err}");
    }

    proptest! {
        /// Every pair comes out once with its two rows together; chunks visited in snake
        /// order hold non-decreasing lengths.
        #[test]
        fn a_permutation_of_whole_pairs_sorted_along_the_snake(
            lens in prop::collection::vec((1usize..6, 1usize..6, 1usize..6), 1..24),
            shards in 1usize..4,
            per_shard in 1usize..4,
        ) {
            let ids: Vec<(Vec<u32>, Vec<u32>, Vec<u32>)> = lens
                .iter()
                .enumerate()
                .map(|(i, &(p, c, r))| (vec![1; p], vec![10 + i as u32; c], vec![100 + i as u32; r]))
                .collect();
            let rows: Vec<crate::PairRow<'_>> =
                ids.iter().map(|(p, c, r)| (p.as_slice(), c.as_slice(), r.as_slice())).collect();
            let e = Experience::from_pairs(&rows, 0, &Device::Cpu).unwrap();
            let chunks = split_even(lens.len(), shards * per_shard);
            let sorted = e.pairs_by_length(&chunks, shards).unwrap();
            let roles = sorted.pairs.clone().unwrap();
            let mut seen: Vec<u32> = roles.iter().step_by(2).map(|r| r.pair).collect();
            for (k, pair) in roles.chunks(2).enumerate() {
                prop_assert!(pair[0].chosen && !pair[1].chosen && pair[0].pair == pair[1].pair);
                // The chosen row's completion starts with its pair's own token.
                let row: Vec<u32> = sorted.input_ids.get(2 * k).unwrap().to_vec1().unwrap();
                prop_assert!(row.contains(&(10 + pair[0].pair)));
            }
            let length = |p: u32| { let (a, b, c) = lens[p as usize]; a + b.max(c) };
            let mut visited = Vec::new();
            for c in snake_order(chunks.len(), shards) {
                visited.extend(chunks[c].clone().map(|i| length(roles[2 * i].pair)));
            }
            prop_assert!(visited.windows(2).all(|w| w[0] <= w[1]), "{visited:?}");
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..lens.len() as u32).collect::<Vec<_>>());
        }
    }
}
