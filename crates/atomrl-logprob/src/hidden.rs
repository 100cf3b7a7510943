//! Log-probs from hidden states a caller already has: one forward pass serving both the
//! policy's log-probs and a value head on the same states (PPO with a shared backbone).

use atomrl_core::{Error, Result};
use atomrl_model::CausalLm;
use candle_core::Tensor;

use crate::action::{score_hidden, ScoreSettings};
use crate::selective::{check_mask, check_temperature, chunk_elements_for};
use crate::shared_prompt::token_ids;
use crate::TokenLogProbs;

/// Log-probs (and entropies) of `targets` from the final hidden states that predict them,
/// exactly as [`crate::get_action_log_probs`] and [`crate::get_shared_prompt_log_probs`]
/// score theirs (LM head and log-softmax a chunk of rows at a time, zeroed where `keep` is 0).
/// Differentiable through `hidden`.
///
/// # Shapes
/// `hidden [N, T, H]` (`H` the model's hidden size; position `t` predicts `targets[:, t]`, as
/// [`crate::get_shared_prompt_hidden`] returns them), `targets [N, T]` integer ids, `keep
/// [N, T]` of 0/1 → `log_probs [N, T]`, `entropy [N, T]`.
///
/// # Errors
/// Shapes that differ from these, ids outside the vocabulary, a mask with values other than
/// 0 and 1, a temperature that is not a finite number > 0.
///
/// ```
/// use atomrl_logprob::{get_action_log_probs, get_hidden_log_probs};
/// use atomrl_model::{CausalLm, ForwardInput};
/// use candle_core::{DType, Device, Tensor};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
/// let d = Device::Cpu;
/// let ids = Tensor::new(&[[5u32, 6, 7, 8]], &d)?;
/// let hidden = model.forward_hidden(&ForwardInput::new(ids.clone()), None)?;
/// // The states after [5, 6] and [5, 6, 7] predict tokens 7 and 8.
/// let keep = Tensor::ones((1, 2), DType::F32, &d)?;
/// let a = get_hidden_log_probs(&model, &hidden.narrow(1, 1, 2)?, &ids.narrow(1, 2, 2)?, &keep, 1.0, false)?;
/// let b = get_action_log_probs(&model, &ids, &Tensor::ones((1, 4), DType::U32, &d)?, 2, 1.0, false)?;
/// assert!((a.log_probs - b.log_probs)?.abs()?.max_all()?.to_scalar::<f32>()? < 1e-6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn get_hidden_log_probs(
    model: &CausalLm,
    hidden: &Tensor,
    targets: &Tensor,
    keep: &Tensor,
    temperature: f64,
    with_entropy: bool,
) -> Result<TokenLogProbs> {
    let func = "get_hidden_log_probs";
    check_temperature(func, temperature)?;
    let h = model.config().hidden_size;
    let (n, t) = match hidden.dims() {
        &[n, t, hh] if hh == h && n >= 1 && t >= 1 => (n, t),
        d => {
            return Err(Error::shape(
                func,
                "hidden",
                format!("[N, T, {h}] with N, T >= 1"),
                d,
            ))
        }
    };
    for (arg, x) in [("targets", targets), ("keep", keep)] {
        if x.dims() != [n, t] {
            return Err(Error::shape(func, arg, format!("[{n}, {t}]"), x.dims()));
        }
    }
    let targets = token_ids(func, "targets", targets, model.config().vocab_size)?;
    let keep = check_mask(func, "keep", keep)?;
    let settings = ScoreSettings {
        temperature,
        with_entropy,
        chunk_elements: chunk_elements_for(model.device()),
    };
    score_hidden(func, model, hidden, &targets, &keep, &settings)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use atomrl_model::{Architecture, ModelConfig};
    use candle_core::{DType, Device};

    fn model() -> CausalLm {
        let c = ModelConfig::new(Architecture::Qwen2, 16, 8, 8, 1, 2, 1).unwrap();
        CausalLm::from_config_random(c, 3, DType::F32, &Device::Cpu).unwrap()
    }

    #[test]
    fn bad_shapes_and_ids_name_the_argument() {
        let m = model();
        let d = Device::Cpu;
        let hidden = Tensor::zeros((2, 3, 8), DType::F32, &d).unwrap();
        let ids = Tensor::zeros((2, 3), DType::U32, &d).unwrap();
        let keep = Tensor::ones((2, 3), DType::F32, &d).unwrap();
        let err = |h: &Tensor, i: &Tensor, k: &Tensor| {
            get_hidden_log_probs(&m, h, i, k, 1.0, false)
                .unwrap_err()
                .to_string()
        };
        let wide = Tensor::zeros((2, 3, 9), DType::F32, &d).unwrap();
        assert!(err(&wide, &ids, &keep).contains("`hidden`"));
        let short = Tensor::zeros((2, 2), DType::U32, &d).unwrap();
        assert!(err(&hidden, &short, &keep).contains("`targets`"));
        assert!(err(&hidden, &ids, &keep.narrow(1, 0, 2).unwrap()).contains("`keep`"));
        let big = (ids.ones_like().unwrap() * 16.0).unwrap();
        assert!(err(&hidden, &big, &keep).contains("targets[0, 0]"));
        let halves = (keep.clone() * 0.5).unwrap();
        assert!(err(&hidden, &ids, &halves).contains("keep"));
        let ok = get_hidden_log_probs(&m, &hidden, &ids, &keep.zeros_like().unwrap(), 1.0, true)
            .unwrap();
        assert_eq!(ok.log_probs.to_vec2::<f32>().unwrap(), [[0.0; 3]; 2]);
    }
}
