//! [`TrainState`]: what an update changes — the policy's weights, the optimizer — and the
//! ranks it is shared with.

use std::rc::Rc;

use atomrl_core::Result;
use atomrl_dist::{Collective, SingleProcess};
use atomrl_model::CausalLm;
use candle_core::Var;

use crate::optim::{AdamW, AdamWConfig};

/// The state a training step updates: the policy, its trainable parameters (the LoRA
/// adapters only, with LoRA), the optimizer, and the data-parallel ranks the update is
/// shared with. A recipe's update takes it mutably; everything else of the run is read-only.
pub struct TrainState {
    /// The trainable policy.
    pub model: CausalLm,
    /// The trainable parameters, by name (the optimizer's).
    pub params: Vec<(String, Var)>,
    /// AdamW over `params`.
    pub optimizer: AdamW,
    /// The data-parallel ranks ([`SingleProcess`] by default).
    pub comm: Rc<dyn Collective>,
}

impl TrainState {
    /// The state of training `model` (its LoRA adapters when it has them, else every weight)
    /// with AdamW, in one process.
    ///
    /// # Errors
    /// Optimizer allocation failures.
    ///
    /// ```
    /// use atomrl_trainer::optim::AdamWConfig;
    /// use atomrl_trainer::TrainState;
    /// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let model = atomrl_model::CausalLm::from_hf_dir(dir, candle_core::DType::F32, &candle_core::Device::Cpu)?;
    /// let state = TrainState::new(model, AdamWConfig::default())?;
    /// assert_eq!((state.optimizer.step_count(), state.comm.world_size()), (0, 1));
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn new(model: CausalLm, adamw: AdamWConfig) -> Result<Self> {
        // With LoRA only the adapters train; the optimizer holds nothing else.
        let params = if model.lora_config().is_some() {
            model.lora_vars()
        } else {
            model.named_vars()
        };
        let optimizer = AdamW::new(params.clone(), adamw)?;
        Ok(Self {
            model,
            params,
            optimizer,
            comm: Rc::new(SingleProcess),
        })
    }
}
