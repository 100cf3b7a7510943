//! The parameter list of a model (Hugging Face names and shapes) and its random initialisation.

use crate::config::{Architecture, ModelConfig};

/// How a parameter is initialised in a new model (transformers' `_init_weights`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Init {
    /// Normal(0, initializer_range): linear and embedding weights.
    Normal,
    /// Ones: RMSNorm weights.
    Ones,
    /// Zeros: biases.
    Zeros,
}

/// One parameter: HF name, shape, initialisation.
#[derive(Debug, Clone)]
pub(crate) struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub init: Init,
}

/// Every parameter of a model with this configuration, in a fixed order (the tied LM head is
/// not listed).
pub(crate) fn param_specs(c: &ModelConfig) -> Vec<ParamSpec> {
    let mut out = Vec::new();
    let mut push =
        |name: String, shape: Vec<usize>, init: Init| out.push(ParamSpec { name, shape, init });
    let (h, d) = (c.hidden_size, c.head_dim);
    let (q, kv) = (c.num_attention_heads * d, c.num_key_value_heads * d);
    push(
        "model.embed_tokens.weight".into(),
        vec![c.vocab_size, h],
        Init::Normal,
    );
    for i in 0..c.num_hidden_layers {
        let p = format!("model.layers.{i}");
        for (name, out_f, in_f) in [
            ("q_proj", q, h),
            ("k_proj", kv, h),
            ("v_proj", kv, h),
            ("o_proj", h, q),
        ] {
            push(
                format!("{p}.self_attn.{name}.weight"),
                vec![out_f, in_f],
                Init::Normal,
            );
            let bias = if name == "o_proj" {
                c.o_bias
            } else {
                c.qkv_bias
            };
            if bias {
                push(
                    format!("{p}.self_attn.{name}.bias"),
                    vec![out_f],
                    Init::Zeros,
                );
            }
        }
        if c.architecture == Architecture::Qwen3 {
            push(format!("{p}.self_attn.q_norm.weight"), vec![d], Init::Ones);
            push(format!("{p}.self_attn.k_norm.weight"), vec![d], Init::Ones);
        }
        let m = c.intermediate_size;
        push(
            format!("{p}.mlp.gate_proj.weight"),
            vec![m, h],
            Init::Normal,
        );
        push(format!("{p}.mlp.up_proj.weight"), vec![m, h], Init::Normal);
        push(
            format!("{p}.mlp.down_proj.weight"),
            vec![h, m],
            Init::Normal,
        );
        push(format!("{p}.input_layernorm.weight"), vec![h], Init::Ones);
        push(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            Init::Ones,
        );
    }
    push("model.norm.weight".into(), vec![h], Init::Ones);
    if !c.tie_word_embeddings {
        push("lm_head.weight".into(), vec![c.vocab_size, h], Init::Normal);
    }
    out
}

/// Uniform and normal draws from atomrl-core's SplitMix64, so that a seed gives the same model
/// on every platform and candle version.
#[derive(Debug, Clone)]
pub(crate) struct Rng(atomrl_core::rng::SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(atomrl_core::rng::SplitMix64::new(
            seed ^ atomrl_core::rng::GOLDEN_GAMMA,
        ))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in (0, 1).
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn counts_match_the_config_formula() {
        for arch in Architecture::ALL {
            let mut c = ModelConfig::new(arch, 50, 16, 24, 2, 4, 2).unwrap();
            for tie in [true, false] {
                c.tie_word_embeddings = tie;
                let n: usize = param_specs(&c)
                    .iter()
                    .map(|p| p.shape.iter().product::<usize>())
                    .sum();
                assert_eq!(n, c.num_parameters(), "{arch:?} tie={tie}");
            }
        }
    }

    #[test]
    fn normal_has_unit_variance() {
        let mut r = Rng::new(1);
        let xs: Vec<f64> = (0..20000).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "{mean} {var}"
        );
    }
}
