//! AtomRL's examples live beside this file (`grpo_gsm8k/`); run them with
//! `cargo run --release --example NAME`. This library is empty: it only gives the examples a
//! package.
