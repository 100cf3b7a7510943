//! Optimisation: AdamW with savable state, learning-rate schedules, gradient accumulation and
//! clipping.

mod adamw;
mod adamw_kernel;
mod grads;
mod schedule;

pub use adamw::{AdamW, AdamWConfig};
pub use grads::Gradients;
pub use schedule::{budget_schedule_step, learning_rate, warmup_steps};
