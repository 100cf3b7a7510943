//! Golden tests: every `get_action_log_probs` reference case (transformers 5.23, float32,
//! eager attention, on the tiny Qwen2 and Qwen3 fixture models) run through the registry,
//! plus direct checks of the library forms.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use atomrl_core::{compare::json_close, Inputs};
use atomrl_logprob::{functions, get_action_log_probs, selective_log_softmax};
use atomrl_model::CausalLm;
use candle_core::{DType, Device, Tensor};
use serde_json::Value;

fn cases_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/reference/cases"
    ))
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn reference_cases_match_transformers() {
    let dir = cases_dir();
    let index = read_json(&dir.join("index.json"));
    let f = functions()
        .into_iter()
        .find(|f| f.spec.name == "get_action_log_probs")
        .unwrap();
    let mut ran = 0;
    for case in index["cases"].as_array().unwrap() {
        if case["function"] != "get_action_log_probs" {
            continue;
        }
        let id = case["id"].as_str().unwrap();
        let input_path = dir.join(case["input"].as_str().unwrap());
        let input = read_json(&input_path);
        let result = Inputs::from_json(&f.spec, input)
            .map(|i| i.with_base_dir(input_path.parent().unwrap()))
            .and_then(|i| (f.run)(&i));
        if case["expect_error"].as_bool().unwrap() {
            let err = result
                .err()
                .unwrap_or_else(|| panic!("{id}: expected an error"))
                .to_string();
            let arg = if id.contains("left_padding") {
                "attention_mask"
            } else {
                "input_ids"
            };
            assert!(err.contains(arg), "{id}: error should name `{arg}`: {err}");
        } else {
            let got = result
                .unwrap_or_else(|e| panic!("{id}: {e}"))
                .to_json()
                .unwrap();
            let expected = read_json(&dir.join(case["expected"].as_str().unwrap()));
            let tol = &case["tolerance"];
            json_close(
                &expected,
                &got,
                tol["rtol"].as_f64().unwrap(),
                tol["atol"].as_f64().unwrap(),
            )
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        }
        ran += 1;
    }
    assert_eq!(
        ran, 24,
        "expected 12 cases for each of tiny-qwen2 and tiny-qwen3"
    );
}

fn model(name: &str) -> CausalLm {
    let dir = cases_dir().join("../models").join(name);
    CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu).unwrap()
}

/// The model form with a completion start (`logits_to_keep`) equals the tail of the full
/// pure form; small chunks change nothing.
#[test]
fn model_form_equals_pure_form_on_logits() {
    let m = model("tiny-qwen3");
    let d = Device::Cpu;
    let ids = Tensor::new(&[[0u32, 0, 7, 8, 9, 10, 11], [3, 4, 5, 6, 7, 8, 9]], &d).unwrap();
    let mask = Tensor::new(&[[0u32, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]], &d).unwrap();
    let logits = m.forward_logits(&ids, Some(&mask)).unwrap();
    let pure = selective_log_softmax(
        &logits.narrow(1, 2, 4).unwrap(),
        &ids.narrow(1, 3, 4).unwrap(),
        0.8,
        true,
    )
    .unwrap();
    for chunk in [1, 3, 1 << 20] {
        let out = atomrl_logprob::get_action_log_probs_chunked(
            &m,
            &ids,
            &mask,
            4,
            0.8,
            true,
            chunk * 512,
        )
        .unwrap();
        for (a, b) in [
            (&out.log_probs, &pure.log_probs),
            (
                out.entropy.as_ref().unwrap(),
                pure.entropy.as_ref().unwrap(),
            ),
        ] {
            let diff = (a - b)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(diff < 1e-5, "chunk {chunk}: {diff}");
        }
    }
}

/// Gradients flow from the log-probs to every model weight.
#[test]
fn log_probs_are_differentiable() {
    let m = model("tiny-qwen2");
    let d = Device::Cpu;
    let ids = Tensor::new(&[[1u32, 5, 6, 7], [1, 8, 9, 0]], &d).unwrap();
    let mask = Tensor::new(&[[1u32, 1, 1, 1], [1, 1, 1, 0]], &d).unwrap();
    let out = get_action_log_probs(&m, &ids, &mask, 2, 1.0, false).unwrap();
    let grads = out.log_probs.sum_all().unwrap().backward().unwrap();
    for (name, v) in m.named_vars() {
        assert!(grads.get(v.as_tensor()).is_some(), "no gradient for {name}");
    }
}

#[test]
fn errors_name_the_argument() {
    let m = model("tiny-qwen2");
    let d = Device::Cpu;
    let ids = Tensor::new(&[[1u32, 5, 600]], &d).unwrap();
    let mask = Tensor::new(&[[1u32, 1, 1]], &d).unwrap();
    let e = get_action_log_probs(&m, &ids, &mask, 2, 1.0, false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("input_ids[0, 2]") && e.contains("[0, 512)"),
        "{e}"
    );
    let ids = Tensor::new(&[[1u32, 5, 6]], &d).unwrap();
    let e = get_action_log_probs(&m, &ids, &mask, 3, 1.0, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("logits_to_keep"), "{e}");
    let e = get_action_log_probs(&m, &ids, &mask, 2, 0.0, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("temperature"), "{e}");
    let short = Tensor::new(&[[1u32, 1]], &d).unwrap();
    let e = get_action_log_probs(&m, &ids, &short, 2, 1.0, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("attention_mask"), "{e}");
    let logits = Tensor::zeros((1, 2, 4), DType::F32, &d).unwrap();
    let e = selective_log_softmax(&logits, &Tensor::new(&[[1u32, 4]], &d).unwrap(), 1.0, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("tokens[0, 1]"), "{e}");
    let e = selective_log_softmax(&logits, &Tensor::new(&[[1u32]], &d).unwrap(), 1.0, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`tokens`"), "{e}");
}

#[test]
fn missing_model_and_unsupported_architecture_are_file_errors() {
    let f = functions()
        .into_iter()
        .find(|f| f.spec.name == "get_action_log_probs")
        .unwrap();
    let input = serde_json::json!({"model_dir": "/no/such/model", "input_ids": [[1, 2]], "attention_mask": [[1, 1]]});
    let e = f.run_json(input).unwrap_err().to_string();
    assert!(
        e.contains("model_dir") || e.contains("/no/such/model"),
        "{e}"
    );
}
