//! Where the next trial's parameters come from: a grid, independent uniform draws, or TPE
//! (the `tpe` crate's univariate Tree-structured Parzen Estimator, one per parameter, after a
//! few random start-up trials).
//!
//! Samplers work in unit coordinates (`u ∈ [0, 1]` per parameter, [`crate::space::Param::value_at`]).
//! A trial's draw depends only on the seed, its number and the results it is given, so the
//! same seed and the same results give the same parameters.

use rand::{Rng, SeedableRng};

use crate::error::{Result, SweepError};
use crate::space::Param;

/// The sampler of a sweep (`sweep.sampler`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamplerKind {
    /// Every combination of the parameters' grid values, in order.
    Grid,
    /// Independent uniform draws.
    Random,
    /// TPE after `startup_trials` random ones.
    Tpe,
}

impl std::str::FromStr for SamplerKind {
    type Err = SweepError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "grid" => Ok(Self::Grid),
            "random" => Ok(Self::Random),
            "tpe" => Ok(Self::Tpe),
            other => Err(SweepError::config(
                "sweep.sampler",
                "grid, random or tpe",
                other,
            )),
        }
    }
}

/// One finished trial as a sampler sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The parameters in unit coordinates.
    pub units: Vec<f64>,
    /// The objective (larger is better when the sweep maximises).
    pub objective: f64,
}

/// The sampler with its settings.
#[derive(Debug, Clone)]
pub struct Sampler {
    /// Which sampler.
    pub kind: SamplerKind,
    /// The seed of every draw.
    pub seed: u64,
    /// Random trials before TPE models the results.
    pub startup_trials: usize,
    /// Points per continuous parameter on a grid.
    pub grid_points: usize,
    /// Whether the objective is maximised.
    pub maximize: bool,
}

/// A seed for trial `index` that differs between trials and samplers (SplitMix64).
fn trial_seed(seed: u64, index: usize, salt: u64) -> u64 {
    let mut z = seed
        .wrapping_add((index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(salt);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Sampler {
    /// The number of grid combinations (`None` for other samplers).
    pub fn grid_size(&self, params: &[Param]) -> Option<usize> {
        (self.kind == SamplerKind::Grid).then(|| {
            params
                .iter()
                .map(|p| p.cardinality().unwrap_or(self.grid_points.max(1)))
                .product()
        })
    }

    /// The unit coordinates of trial `index` given the `history` of finished trials.
    ///
    /// # Errors
    /// A grid index past the last combination, or TPE failing on the history.
    ///
    /// ```
    /// use atomrl_sweep::sampler::{Sampler, SamplerKind};
    /// use atomrl_sweep::space::parse_search;
    /// let params = parse_search(&toml::from_str("lr = { log_uniform = [1e-5, 1e-3] }")?)?;
    /// let s = Sampler { kind: SamplerKind::Random, seed: 7, startup_trials: 2, grid_points: 3, maximize: true };
    /// assert_eq!(s.units(&params, 3, &[])?, s.units(&params, 3, &[])?);
    /// assert_ne!(s.units(&params, 3, &[])?, s.units(&params, 4, &[])?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn units(
        &self,
        params: &[Param],
        index: usize,
        history: &[Observation],
    ) -> Result<Vec<f64>> {
        match self.kind {
            SamplerKind::Grid => self.grid_units(params, index),
            SamplerKind::Random => Ok(self.random_units(params.len(), index)),
            SamplerKind::Tpe if history.len() < self.startup_trials.max(1) => {
                Ok(self.random_units(params.len(), index))
            }
            SamplerKind::Tpe => self.tpe_units(params, index, history),
        }
    }

    fn random_units(&self, n: usize, index: usize) -> Vec<f64> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(trial_seed(self.seed, index, 1));
        (0..n).map(|_| rng.random::<f64>()).collect()
    }

    fn grid_units(&self, params: &[Param], index: usize) -> Result<Vec<f64>> {
        let size = self.grid_size(params).unwrap_or(0);
        if index >= size {
            return Err(SweepError::config(
                "sweep.trials",
                format!("at most the grid's {size} combinations"),
                index + 1,
            ));
        }
        // Mixed radix, the last parameter fastest.
        let mut rest = index;
        let mut units = vec![0.0; params.len()];
        for (i, p) in params.iter().enumerate().rev() {
            let n = p.cardinality().unwrap_or(self.grid_points.max(1));
            let k = rest % n;
            rest /= n;
            units[i] = match p.cardinality() {
                Some(_) => (k as f64 + 0.5) / n as f64,
                None if n == 1 => 0.5,
                None => k as f64 / (n - 1) as f64,
            };
        }
        Ok(units)
    }

    fn tpe_units(
        &self,
        params: &[Param],
        index: usize,
        history: &[Observation],
    ) -> Result<Vec<f64>> {
        use rand_tpe::SeedableRng as _;
        let mut rng = rand_tpe::rngs::StdRng::seed_from_u64(trial_seed(self.seed, index, 2));
        let sign = if self.maximize { -1.0 } else { 1.0 };
        let fail = |p: &Param, e: String| {
            SweepError::config(format!("search.{}", p.key), "a space TPE can sample", e)
        };
        params
            .iter()
            .enumerate()
            .map(|(i, p)| match p.cardinality() {
                Some(n) => {
                    let range = tpe::categorical_range(n).map_err(|e| fail(p, e.to_string()))?;
                    let mut opt = tpe::TpeOptimizer::new(tpe::histogram_estimator(), range);
                    for o in history {
                        let k = ((o.units[i] * n as f64).floor() as usize).min(n - 1);
                        opt.tell(k as f64, sign * o.objective)
                            .map_err(|e| fail(p, e.to_string()))?;
                    }
                    let k = opt.ask(&mut rng).map_err(|e| fail(p, e.to_string()))?;
                    Ok((k + 0.5) / n as f64)
                }
                None => {
                    let range = tpe::range(0.0, 1.0).map_err(|e| fail(p, e.to_string()))?;
                    let mut opt = tpe::TpeOptimizer::new(tpe::parzen_estimator(), range);
                    for o in history {
                        // The range is half-open: keep u = 1 inside it.
                        let u = o.units[i].clamp(0.0, 1.0 - 1e-12);
                        opt.tell(u, sign * o.objective)
                            .map_err(|e| fail(p, e.to_string()))?;
                    }
                    opt.ask(&mut rng).map_err(|e| fail(p, e.to_string()))
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::parse_search;

    fn params() -> Vec<Param> {
        parse_search(
            &toml::from_str("lr = { log_uniform = [1e-5, 1e-3] }\ng = { choice = [4, 8, 16] }")
                .unwrap(),
        )
        .unwrap()
    }

    fn sampler(kind: SamplerKind) -> Sampler {
        Sampler {
            kind,
            seed: 3,
            startup_trials: 3,
            grid_points: 2,
            maximize: true,
        }
    }

    #[test]
    fn the_grid_enumerates_every_combination_once() {
        let s = sampler(SamplerKind::Grid);
        let p = params();
        assert_eq!(s.grid_size(&p), Some(6));
        let all: Vec<Vec<f64>> = (0..6).map(|i| s.units(&p, i, &[]).unwrap()).collect();
        for (i, a) in all.iter().enumerate() {
            assert!(all[i + 1..].iter().all(|b| b != a));
        }
        assert!(s
            .units(&p, 6, &[])
            .unwrap_err()
            .to_string()
            .contains("sweep.trials"));
    }

    #[test]
    fn tpe_is_deterministic_and_moves_towards_good_results() {
        let s = sampler(SamplerKind::Tpe);
        let p = params();
        // Results better for small u on lr: TPE's next draws should favour small u.
        let history: Vec<Observation> = (0..12)
            .map(|i| {
                let units = s.random_units(2, 100 + i);
                Observation {
                    objective: 1.0 - units[0],
                    units,
                }
            })
            .collect();
        let a = s.units(&p, 20, &history).unwrap();
        assert_eq!(a, s.units(&p, 20, &history).unwrap());
        let mean: f64 = (20..40)
            .map(|i| s.units(&p, i, &history).unwrap()[0])
            .sum::<f64>()
            / 20.0;
        assert!(mean < 0.4, "mean u of lr {mean}");
    }
}
