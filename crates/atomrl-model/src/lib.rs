//! AtomRL's trainable causal LM (being written).
