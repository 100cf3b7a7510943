//! The AtomRL commands (`atomrl-train`, `atomrl-infer`, `atomrl-compare`) and what only they
//! need: [`infer`], answering questions with a checkpoint, which `atomrl-infer` wraps, and
//! [`compare`], runs side by side, which `atomrl-compare` wraps. Training itself lives in
//! `atomrl-trainer`, which these commands configure and run.

#![deny(missing_docs)]

pub mod compare;
pub mod infer;
#[cfg(feature = "test-hooks")]
pub mod test_faults;
