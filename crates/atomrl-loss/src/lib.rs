//! AtomRL loss functions (being written).

#![deny(missing_docs)]

/// The functions this crate registers with `atomrl-fn`.
pub fn functions() -> Vec<atomrl_core::AtomicFn> {
    Vec::new()
}
