//! The mixed-precision casts of the trainable weights, shared by the training forwards of one
//! optimizer step ([`crate::CausalLm::share_weight_casts`]).
//!
//! A bf16 training forward over f32 master weights starts by casting every trainable weight
//! with a differentiable `to_dtype`. Between two optimizer steps the weights do not change, so
//! the micro-batches of a step can share one cast: on an H100 at the Qwen2.5-0.5B shape a
//! cast costs ~4 ms (`forward.cast_weights`, docs/measurements/gpu-h100-2026-11-26/8-final),
//! eight of them a step of eight micro-batches. Sharing is scoped, not cached by default: only
//! the code that runs a step knows when the weights stop changing, so a cast is reused only
//! while a [`SharedWeightCasts`] guard is alive, and dropped with the last one.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::linear::Linear;
use crate::network::Network;
use crate::Result;

/// The cast network and LM head a training forward runs on.
pub(crate) type Cast = (Network, Linear);

#[derive(Default)]
struct Slot {
    /// Live [`SharedWeightCasts`] guards.
    scopes: usize,
    /// The shared cast, made by the first forward inside a scope.
    cast: Option<Cast>,
}

/// A model's shared cast, if a scope is open. A clone of the model starts with none of its
/// own: sharing is per model value, as the scopes are.
#[derive(Default)]
pub(crate) struct CastCache(Arc<Mutex<Slot>>);

impl Clone for CastCache {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl CastCache {
    /// The slot, even after a panic elsewhere: a slot is only ever left whole.
    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The cast to run a training forward on: `cast()`'s result outside a scope; inside one,
    /// the scope's shared cast, made by `cast()` on first use. The lock is held while casting,
    /// so workers that start a forward together wait for one cast instead of each making one.
    pub(crate) fn get_or_cast(&self, cast: impl FnOnce() -> Result<Cast>) -> Result<Cast> {
        let mut slot = self.slot();
        if slot.scopes == 0 {
            drop(slot);
            return cast();
        }
        if let Some(shared) = &slot.cast {
            return Ok(shared.clone());
        }
        let made = cast()?;
        slot.cast = Some(made.clone());
        Ok(made)
    }

    /// Whether a shared cast is held now (tests).
    #[cfg(test)]
    pub(crate) fn holds_cast(&self) -> bool {
        self.slot().cast.is_some()
    }

    pub(crate) fn open(&self) -> SharedWeightCasts<'_> {
        self.slot().scopes += 1;
        SharedWeightCasts { cache: self }
    }
}

/// While alive, the training forwards of the model it came from share one cast of the weights
/// ([`crate::CausalLm::share_weight_casts`]). Dropping the last guard drops the cast, so a
/// forward after the optimizer step casts the updated weights. Guards nest.
#[must_use = "the weights' cast is shared only while the guard is alive"]
pub struct SharedWeightCasts<'a> {
    cache: &'a CastCache,
}

impl std::fmt::Debug for SharedWeightCasts<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedWeightCasts").finish_non_exhaustive()
    }
}

impl Drop for SharedWeightCasts<'_> {
    fn drop(&mut self) {
        let mut slot = self.cache.slot();
        slot.scopes = slot.scopes.saturating_sub(1);
        if slot.scopes == 0 {
            slot.cast = None;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use candle_core::{DType, Device, Tensor};

    use crate::{Architecture, CausalLm, ForwardInput, ModelConfig};

    /// A bf16-compute model over f32 weights, its LM head tied or not.
    fn model(tied: bool) -> CausalLm {
        let mut c = ModelConfig::new(Architecture::Qwen2, 48, 16, 32, 2, 4, 2).unwrap();
        c.tie_word_embeddings = tied;
        let mut m = CausalLm::from_config_random(c, 3, DType::F32, &Device::Cpu).unwrap();
        m.set_compute_dtype(DType::BF16).unwrap();
        m
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.flatten_all()
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .into_iter()
            .map(f32::to_bits)
            .collect()
    }

    /// Each micro-batch's logits and every variable's gradient, as bits.
    fn micro_batches(m: &CausalLm) -> Vec<(Vec<u32>, Vec<Vec<u32>>)> {
        let batches = [
            [[1u32, 5, 9, 2], [7, 3, 3, 40]],
            [[11, 0, 4, 4], [2, 2, 30, 8]],
        ];
        batches
            .iter()
            .map(|ids| {
                let ids = Tensor::new(ids, &Device::Cpu).unwrap();
                let logits = m.forward(&ForwardInput::new(ids), None).unwrap();
                let loss = logits.to_dtype(DType::F32).unwrap().sqr().unwrap();
                let grads = loss.mean_all().unwrap().backward().unwrap();
                let g = m
                    .trainable_vars()
                    .iter()
                    .map(|v| bits(grads.get(v.as_tensor()).unwrap()))
                    .collect();
                (bits(&logits), g)
            })
            .collect()
    }

    #[test]
    fn a_shared_cast_gives_the_logits_and_gradients_of_a_cast_per_forward() {
        for tied in [false, true] {
            let m = model(tied);
            let apart = micro_batches(&m);
            assert!(!m.casts.holds_cast());
            let shared = {
                let _casts = m.share_weight_casts();
                let out = micro_batches(&m);
                assert!(m.casts.holds_cast(), "the first forward made the cast");
                out
            };
            assert!(!m.casts.holds_cast(), "the last guard dropped the cast");
            assert_eq!(apart, shared, "tied = {tied}");
        }
    }

    #[test]
    fn guards_nest_and_a_forward_after_the_last_sees_new_weights() {
        let m = model(false);
        let ids = Tensor::new(&[[1u32, 2, 3]], &Device::Cpu).unwrap();
        let logits =
            |m: &CausalLm| bits(&m.forward(&ForwardInput::new(ids.clone()), None).unwrap());
        let outer = m.share_weight_casts();
        let before = logits(&m);
        {
            let _inner = m.share_weight_casts();
            assert_eq!(logits(&m), before);
        }
        assert!(m.casts.holds_cast(), "the outer guard still holds the cast");
        let head = m
            .trainable_vars()
            .into_iter()
            .find(|v| v.dims() == [48, 16])
            .unwrap();
        head.set(&head.as_tensor().affine(2.0, 0.5).unwrap())
            .unwrap();
        assert_eq!(
            logits(&m),
            before,
            "inside the scope: the cast made before the update"
        );
        drop(outer);
        assert_ne!(logits(&m), before, "after it: the updated weights");
    }

    #[test]
    fn f32_compute_shares_nothing() {
        let mut m = model(false);
        m.set_compute_dtype(DType::F32).unwrap();
        let _casts = m.share_weight_casts();
        let ids = Tensor::new(&[[1u32, 2, 3]], &Device::Cpu).unwrap();
        m.forward(&ForwardInput::new(ids), None).unwrap();
        assert!(!m.casts.holds_cast());
    }
}
