//! Optimisation for AtomRL: AdamW with savable state, learning-rate schedules, gradient
//! accumulation and clipping.
//!
//! - [`AdamW`]: decoupled weight decay, f32 moments whatever the parameters' dtype, updated in
//!   place on the CPU and on CUDA; its state saves to and loads from safetensors for exact resume.
//! - [`Gradients`]: a named gradient set that accumulates micro-batches, scales and clips by
//!   global norm.
//! - [`learning_rate`], [`warmup_steps`], [`budget_schedule_step`]: warm-up then constant,
//!   linear or cosine decay ([`LrSchedule`]).
//!
//! ```
//! use atomrl_optim::{learning_rate, AdamW, AdamWConfig, LrSchedule};
//! use candle_core::{Device, Var};
//!
//! let w = Var::new(&[1f32, -1.0], &Device::Cpu)?;
//! let mut opt = AdamW::new(vec![("w".into(), w.clone())], AdamWConfig::default())?;
//! let grads = w.as_tensor().sqr()?.sum_all()?.backward()?;
//! let lr = learning_rate(LrSchedule::Cosine, 0.1, 0, 10, 0.0, 0);
//! opt.step(&|_: &str| grads.get(w.as_tensor()).cloned(), lr)?;
//! assert!((w.as_tensor().to_vec1::<f32>()?[0] - 0.9).abs() < 1e-6);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

mod adamw;
mod adamw_kernel;
mod cpu_loops;
#[cfg(feature = "cuda")]
mod cuda;
mod flat;
mod grads;
mod inplace;
#[cfg(test)]
mod kernels_sim;
mod registry;
mod schedule;
mod step_settings;
mod trpo;
mod trust_region;

pub use adamw::{AdamW, AdamWConfig};
pub use flat::{flatten_vars, set_vars_from_flat};
pub use grads::Gradients;
pub use registry::functions;
pub use schedule::{
    budget_horizon, budget_schedule_step, learning_rate, warmup_steps, LrHorizon, LrSchedule,
    RunSchedule, HORIZON_PACE_SHARE,
};
pub use step_settings::StepSettings;
pub use trpo::{
    backtracking_line_search, conjugate_gradient, fisher_vector_product, trust_region_step,
    CgSolution, LineSearchResult,
};
pub use trust_region::{trust_region_update, TrustRegion, TrustRegionOutcome};
