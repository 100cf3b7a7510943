//! The actor-critic recipes — PPO, A2C and TRPO — on a learned critic
//! ([`atomrl_model::ValueModel`]) with GAE: the experience is GRPO's plus the critic's values,
//! per-token advantages and returns; the update trains the actor (clipped epochs, the vanilla
//! gradient, or a natural-gradient step in a trust region) and then the critic. See
//! docs/ppo.md.

mod critic;
mod step;
mod trpo;

pub use critic::CRITIC_DIR;
pub(crate) use step::ActorCriticStep;
