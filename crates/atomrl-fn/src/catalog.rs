//! Every atomic function known to `atomrl-fn`, collected from the atomic crates.

use atomrl_core::AtomicFn;

/// All registered functions, sorted by crate then in each crate's own order.
pub fn all() -> Vec<AtomicFn> {
    let mut fns = Vec::new();
    fns.extend(atomrl_advantage::functions());
    fns.extend(atomrl_loss::functions());
    fns.extend(atomrl_reward::functions());
    fns.extend(atomrl_logprob::functions());
    fns.extend(atomrl_sample::functions());
    fns.extend(atomrl_optim::functions());
    fns
}

/// The function named `name`.
pub fn find<'a>(fns: &'a [AtomicFn], name: &str) -> Option<&'a AtomicFn> {
    fns.iter().find(|f| f.spec.name == name)
}
