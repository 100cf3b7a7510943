//! Per-group statistics in f64.
//!
//! Accumulating in f64 keeps `r − mean` of a group of equal rewards at exactly 0: in f32 a
//! naive std leaves ~6e-8, which `eps = 1e-6` would amplify into advantages of ~0.06.

/// Mean and unbiased standard deviation of one group, and whether all its values are equal.
///
/// ```
/// use atomrl_advantage::GroupStats;
/// let s = GroupStats::of(&[1.0, 0.0]);
/// assert_eq!((s.mean, s.flat), (0.5, false));
/// assert!((s.std - 0.5f64.sqrt()).abs() < 1e-12);
/// assert!(GroupStats::of_groups(&[3.0, 3.0, 1.0, 2.0], 2)[0].flat);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupStats {
    /// The group's mean (its common value when flat).
    pub mean: f64,
    /// The unbiased (N−1) standard deviation (exactly 0 when flat).
    pub std: f64,
    /// Every value of the group is equal: no learning signal.
    pub flat: bool,
}

impl GroupStats {
    /// The statistics of each consecutive group of `group_size` values (a last, shorter group
    /// gets its own statistics).
    ///
    /// See [`GroupStats`] for an example.
    pub fn of_groups(values: &[f64], group_size: usize) -> Vec<Self> {
        values.chunks(group_size.max(1)).map(Self::of).collect()
    }

    /// Statistics of `values` (an empty group is flat, with a NaN mean).
    ///
    /// See [`GroupStats`] for an example.
    pub fn of(values: &[f64]) -> Self {
        let Some(&first) = values.first() else {
            // No values: nothing to learn from, and no mean.
            return Self {
                mean: f64::NAN,
                std: 0.0,
                flat: true,
            };
        };
        if values.iter().all(|&v| v == first) {
            // Treat zero spread exactly: the mean is the common value and the std is 0.
            return Self {
                mean: first,
                std: 0.0,
                flat: true,
            };
        }
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
        Self {
            mean,
            std: var.sqrt(),
            flat: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_have_exact_zero_spread() {
        let s = GroupStats::of(&[0.1, 0.1, 0.1]);
        assert_eq!(
            s,
            GroupStats {
                mean: 0.1,
                std: 0.0,
                flat: true
            }
        );
    }

    #[test]
    fn std_is_unbiased() {
        let s = GroupStats::of(&[1.0, 0.0, 0.0, 1.0]);
        assert_eq!(s.mean, 0.5);
        assert!((s.std - (1.0f64 / 3.0).sqrt()).abs() < 1e-15);
    }
}
