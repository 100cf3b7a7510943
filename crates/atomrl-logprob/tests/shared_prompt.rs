//! `get_shared_prompt_log_probs` gives the numbers and the gradients of `get_action_log_probs`
//! on the concatenated rows (which the transformers golden cases pin down).
#![allow(clippy::unwrap_used)]

use atomrl_logprob::{
    get_action_log_probs, get_shared_prompt_last_hidden, get_shared_prompt_log_probs,
    SharedPromptBatch,
};
use atomrl_model::{CausalLm, ForwardInput};
use candle_core::{DType, Device, Tensor};

fn model(name: &str) -> CausalLm {
    let dir = format!(
        "{}/../../tests/fixtures/reference/models/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu).unwrap()
}

/// Two prompts of different lengths (left-padded to 4), five completions (right-padded to 3),
/// the rows not in prompt order, one completion a single token.
fn grouped() -> (SharedPromptBatch, Tensor, Tensor) {
    let d = Device::Cpu;
    let prompts: [&[u32]; 2] = [&[11, 12, 13, 14], &[21, 22]];
    let completions: [(&[u32], usize); 5] = [
        (&[31, 32, 33], 0),
        (&[41, 42], 1),
        (&[51], 0),
        (&[61, 62, 63], 1),
        (&[71, 72], 0),
    ];
    let (p, t) = (4, 3);
    let left = |x: &[u32]| {
        let mut ids = vec![0u32; p - x.len()];
        ids.extend(x);
        let mask: Vec<u32> = (0..p).map(|i| u32::from(i >= p - x.len())).collect();
        (ids, mask)
    };
    let right = |x: &[u32]| {
        let mut ids = x.to_vec();
        ids.resize(t, 0);
        let mask: Vec<u32> = (0..t).map(|i| u32::from(i < x.len())).collect();
        (ids, mask)
    };
    let (mut pi, mut pm, mut ci, mut cm) = (vec![], vec![], vec![], vec![]);
    let (mut index, mut full_ids, mut full_mask) = (vec![], Vec::<u32>::new(), Vec::<u32>::new());
    for prompt in prompts {
        let (ids, mask) = left(prompt);
        pi.extend(ids);
        pm.extend(mask);
    }
    for (completion, k) in completions {
        let (ids, mask) = right(completion);
        let (pids, pmask) = left(prompts[k]);
        full_ids.extend(pids.iter().chain(&ids));
        full_mask.extend(pmask.iter().chain(&mask));
        ci.extend(ids);
        cm.extend(mask);
        index.push(k as u32);
    }
    let n = completions.len();
    let shared = SharedPromptBatch {
        prompt_ids: Tensor::from_vec(pi, (2, p), &d).unwrap(),
        prompt_mask: Tensor::from_vec(pm, (2, p), &d).unwrap(),
        completion_ids: Tensor::from_vec(ci, (n, t), &d).unwrap(),
        completion_mask: Tensor::from_vec(cm, (n, t), &d).unwrap(),
        prompt_index: Tensor::from_vec(index, n, &d).unwrap(),
    };
    let ids = Tensor::from_vec(full_ids, (n, p + t), &d).unwrap();
    let mask = Tensor::from_vec(full_mask, (n, p + t), &d).unwrap();
    (shared, ids, mask)
}

/// `max |a − b| / max(1, max |b|)`: float32 agreement relative to the values' size (log-probs
/// of ~−15 carry ~1e-6 of rounding when the two forms sum in different orders).
fn max_rel_diff(a: &Tensor, b: &Tensor) -> f32 {
    let scale: f32 = b.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
    max_abs_diff(a, b) / scale.max(1.0)
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap()
}

/// The gradients of losses `a` and `b` agree on every trainable variable of `m`, to 1e-5 of
/// each gradient's size.
fn assert_same_gradients(m: &CausalLm, a: &Tensor, b: &Tensor) {
    let (ga, gb) = (a.backward().unwrap(), b.backward().unwrap());
    let mut compared = 0;
    for var in m.trainable_vars() {
        let (x, y) = (ga.get(&var).unwrap(), gb.get(&var).unwrap());
        let scale = y
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(max_abs_diff(x, y) <= 1e-5 * scale.max(1.0));
        compared += 1;
    }
    assert!(compared > 10);
}

#[test]
fn log_probs_and_entropies_match_the_row_by_row_forward() {
    for name in ["tiny-qwen2", "tiny-qwen3"] {
        let m = model(name);
        let (shared, ids, mask) = grouped();
        for temperature in [1.0, 0.7] {
            let a = get_shared_prompt_log_probs(&m, &shared, temperature, true).unwrap();
            let b = get_action_log_probs(&m, &ids, &mask, 3, temperature, true).unwrap();
            assert!(max_rel_diff(&a.log_probs, &b.log_probs) < 1e-5, "{name}");
            let (ea, eb) = (a.entropy.unwrap(), b.entropy.unwrap());
            assert!(max_rel_diff(&ea, &eb) < 1e-5, "{name}");
            // Padding scores 0, as in the row-by-row form.
            assert_eq!(a.log_probs.to_vec2::<f32>().unwrap()[2][1], 0.0);
        }
    }
}

#[test]
fn gradients_match_the_row_by_row_forward() {
    let m = model("tiny-qwen2");
    let (shared, ids, mask) = grouped();
    let weights = Tensor::new(
        &[
            [0.3f32, -1.0, 0.5],
            [1.0, 0.2, 0.0],
            [-0.7, 0.0, 0.0],
            [0.1, 0.4, -0.2],
            [0.9, -0.3, 0.0],
        ],
        &Device::Cpu,
    )
    .unwrap();
    let loss = |lp: Tensor| lp.mul(&weights).unwrap().sum_all().unwrap();
    let a = loss(
        get_shared_prompt_log_probs(&m, &shared, 1.0, false)
            .unwrap()
            .log_probs,
    );
    let b = loss(
        get_action_log_probs(&m, &ids, &mask, 3, 1.0, false)
            .unwrap()
            .log_probs,
    );
    assert_same_gradients(&m, &a, &b);
}

#[test]
fn bad_input_names_the_argument() {
    let m = model("tiny-qwen2");
    let (shared, _, _) = grouped();
    let err = |b: SharedPromptBatch| {
        get_shared_prompt_log_probs(&m, &b, 1.0, false)
            .unwrap_err()
            .to_string()
    };
    let d = Device::Cpu;
    let mut b = shared.clone();
    b.prompt_index = Tensor::new(&[0u32, 1, 2, 0, 0], &d).unwrap();
    let e = err(b);
    assert!(e.contains("prompt_index[2]") && e.contains("[0, 2)"), "{e}");
    let mut b = shared.clone();
    b.prompt_mask = Tensor::new(&[[1u32, 1, 1, 0], [0, 0, 1, 1]], &d).unwrap();
    assert!(err(b).contains("prompt_mask[0, 3]"));
    let mut b = shared.clone();
    b.completion_mask = Tensor::zeros((5, 2), DType::U32, &d).unwrap();
    assert!(err(b).contains("completion_mask"));
    let mut b = shared;
    b.completion_ids = Tensor::new(&[[9999u32; 3]; 5], &d).unwrap();
    assert!(err(b).contains("completion_ids[0, 0]"));
}

/// The padded rows' hidden state at each row's last real token `[N, H]` (what a reward model
/// pools), from the row-by-row forward.
fn last_real_states(m: &CausalLm, ids: &Tensor, mask: &Tensor) -> Tensor {
    let input = ForwardInput::new(ids.clone()).with_attention_mask(mask.clone());
    let hidden = m.forward_hidden(&input, None).unwrap();
    let rows: Vec<Vec<u32>> = mask.to_vec2().unwrap();
    let states: Vec<Tensor> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let last = r.iter().rposition(|&x| x != 0).unwrap();
            hidden.get(i).unwrap().get(last).unwrap()
        })
        .collect();
    Tensor::stack(&states, 0).unwrap()
}

#[test]
fn last_hidden_states_match_the_row_by_row_forward() {
    for name in ["tiny-qwen2", "tiny-qwen3"] {
        let m = model(name);
        let (shared, ids, mask) = grouped();
        let a = get_shared_prompt_last_hidden(&m, &shared).unwrap();
        let b = last_real_states(&m, &ids, &mask);
        assert_eq!(a.dims(), b.dims());
        assert!(max_rel_diff(&a, &b) < 1e-5, "{name}");
    }
}

#[test]
fn a_completion_of_padding_alone_reads_the_prompts_last_token() {
    let m = model("tiny-qwen2");
    let (mut shared, ids, mask) = grouped();
    // Row 2 (prompt 0, completion [51]) loses its one completion token.
    let mut cm: Vec<Vec<u32>> = shared.completion_mask.to_vec2().unwrap();
    cm[2][0] = 0;
    shared.completion_mask = Tensor::new(cm, &Device::Cpu).unwrap();
    let a = get_shared_prompt_last_hidden(&m, &shared).unwrap();
    let b = last_real_states(&m, &ids, &mask);
    let prompt_only = m
        .forward_hidden(
            &ForwardInput::new(Tensor::new(&[[11u32, 12, 13, 14]], &Device::Cpu).unwrap()),
            None,
        )
        .unwrap()
        .get(0)
        .unwrap()
        .get(3)
        .unwrap();
    assert!(max_rel_diff(&a.get(2).unwrap(), &prompt_only) < 1e-5);
    for row in [0, 1, 3, 4] {
        assert!(max_rel_diff(&a.get(row).unwrap(), &b.get(row).unwrap()) < 1e-5);
    }
}

#[test]
fn last_hidden_gradients_match_the_row_by_row_forward() {
    let m = model("tiny-qwen2");
    let (shared, ids, mask) = grouped();
    let h = m.config().hidden_size;
    // A fixed projection of each state, different per row, as a reward head would apply.
    let w: Vec<f32> = (0..5 * h)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) / 6.0)
        .collect();
    let w = Tensor::from_vec(w, (5, h), &Device::Cpu).unwrap();
    let loss = |x: Tensor| x.mul(&w).unwrap().sum_all().unwrap();
    let a = loss(get_shared_prompt_last_hidden(&m, &shared).unwrap());
    let b = loss(last_real_states(&m, &ids, &mask));
    assert_same_gradients(&m, &a, &b);
}
