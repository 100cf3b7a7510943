//! Asynchronous successive halving (ASHA, Li et al. 2020) as an early-stopping rule: a trial
//! that reaches a rung is stopped unless its objective there is in the top `1/η` of the values
//! recorded at that rung so far (fewer than `η` recorded: it goes on).

/// The rule's settings: rungs at `min_steps · ηᵏ` steps, below the trial budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Asha {
    /// The first rung, in optimizer steps.
    pub min_steps: usize,
    /// `η`: a rung keeps one trial in `η`.
    pub reduction_factor: usize,
}

impl Asha {
    /// The rungs below `max_steps`.
    ///
    /// ```
    /// use atomrl_sweep::asha::Asha;
    /// let a = Asha { min_steps: 20, reduction_factor: 3 };
    /// assert_eq!(a.rungs(200), [20, 60, 180]);
    /// ```
    pub fn rungs(&self, max_steps: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut r = self.min_steps.max(1);
        while r < max_steps {
            out.push(r);
            r = r.saturating_mul(self.reduction_factor.max(2));
        }
        out
    }

    /// Whether a trial with `value` at a rung goes on, given the `others` recorded there.
    ///
    /// ```
    /// use atomrl_sweep::asha::Asha;
    /// let a = Asha { min_steps: 10, reduction_factor: 2 };
    /// assert!(a.keep(0.1, &[0.5], true) == false);    // the lower half of two stops
    /// assert!(a.keep(0.1, &[], true));                // alone at the rung: goes on
    /// assert!(a.keep(0.1, &[0.5], false));            // minimising, 0.1 is the better
    /// ```
    pub fn keep(&self, value: f64, others: &[f64], maximize: bool) -> bool {
        let eta = self.reduction_factor.max(2);
        let n = others.len() + 1;
        if n < eta {
            return true;
        }
        let mut all: Vec<f64> = others.iter().copied().chain([value]).collect();
        all.sort_by(|a, b| {
            if maximize {
                b.total_cmp(a)
            } else {
                a.total_cmp(b)
            }
        });
        let cutoff = all[(n / eta).max(1) - 1];
        if maximize {
            value >= cutoff
        } else {
            value <= cutoff
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_one_in_eta() {
        let a = Asha {
            min_steps: 5,
            reduction_factor: 3,
        };
        let others = [0.9, 0.5, 0.4, 0.3, 0.2];
        // Six values: the best two go on.
        assert!(a.keep(0.95, &others, true));
        assert!(!a.keep(0.45, &others, true));
        assert!(a.keep(0.5, &[0.9, 0.4, 0.3, 0.2, 0.1], true));
    }
}
