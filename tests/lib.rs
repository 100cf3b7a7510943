//! Helpers for AtomRL's cross-crate integration tests (see the `[[test]]` targets beside this
//! file).
