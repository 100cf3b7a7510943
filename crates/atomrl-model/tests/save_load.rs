//! Saving and loading: one AdamW step then save/load gives the same logits; bf16 checkpoints
//! load into f32 weights; sharded checkpoints; the hub cache layout; typed errors.
#![allow(clippy::unwrap_used)]

mod common;

use atomrl_model::{CausalLm, ForwardInput};
use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use common::{expected, max_diff, max_diff_masked, model_dir, temp_dir};

fn batch() -> (Tensor, Tensor) {
    let d = Device::Cpu;
    let ids = Tensor::new(&[[1u32, 40, 41, 42, 2], [1, 50, 51, 0, 0]], &d).unwrap();
    let mask = Tensor::new(&[[1u32, 1, 1, 1, 1], [1, 1, 1, 0, 0]], &d).unwrap();
    (ids, mask)
}

fn train_step(model: &CausalLm) {
    let (ids, mask) = batch();
    let logits = model.forward_logits(&ids, Some(&mask)).unwrap();
    let lp = candle_nn::ops::log_softmax(&logits.narrow(1, 0, 4).unwrap().contiguous().unwrap(), 2)
        .unwrap();
    let picked = lp
        .gather(
            &ids.narrow(1, 1, 4)
                .unwrap()
                .contiguous()
                .unwrap()
                .unsqueeze(2)
                .unwrap(),
            2,
        )
        .unwrap();
    let loss = picked.neg().unwrap().mean_all().unwrap();
    let params = ParamsAdamW {
        lr: 1e-2,
        ..Default::default()
    };
    let mut opt = AdamW::new(model.trainable_vars(), params).unwrap();
    opt.backward_step(&loss).unwrap();
}

#[test]
fn adamw_step_then_save_and_load_gives_the_same_logits() {
    for name in ["tiny-qwen3", "tiny-qwen2-untied"] {
        let model = CausalLm::from_hf_dir(model_dir(name), DType::F32, &Device::Cpu).unwrap();
        let (ids, mask) = batch();
        let before = model.forward_logits(&ids, Some(&mask)).unwrap();
        train_step(&model);
        let after = model.forward_logits(&ids, Some(&mask)).unwrap();
        assert!(
            max_diff(&before, &after) > 1e-3,
            "{name}: the step must change the model"
        );
        let dir_tmp = temp_dir(&format!("adamw_{name}"));
        let dir = dir_tmp.path();
        model.save_hf(dir).unwrap();
        let loaded = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu).unwrap();
        let again = loaded.forward_logits(&ids, Some(&mask)).unwrap();
        assert_eq!(max_diff(&after, &again), 0.0, "{name}");
        assert_eq!(loaded.config(), model.config());
        // Every file the model came with, its tokenizer's included, is saved with it.
        for f in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
        ] {
            let expected = model_dir(name).join(f).is_file();
            assert_eq!(dir.join(f).is_file(), expected, "{name}: {f}");
        }
    }
}

#[test]
fn saved_files_use_hf_names_and_metadata() {
    let model = CausalLm::from_hf_dir(model_dir("tiny-qwen2"), DType::F32, &Device::Cpu).unwrap();
    let dir_tmp = temp_dir("names");
    let dir = dir_tmp.path();
    model.save_hf_as(dir, DType::BF16).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(meta.metadata().as_ref().unwrap()["format"], "pt");
    let names: std::collections::BTreeSet<_> = meta.tensors().keys().cloned().collect();
    let original = std::fs::read(model_dir("tiny-qwen2").join("model.safetensors")).unwrap();
    let (_, orig_meta) = safetensors::SafeTensors::read_metadata(&original).unwrap();
    let orig_names: std::collections::BTreeSet<_> = orig_meta.tensors().keys().cloned().collect();
    assert_eq!(
        names, orig_names,
        "same tensor names as transformers wrote (no tied lm_head)"
    );
    assert!(meta
        .tensors()
        .values()
        .all(|t| t.dtype == safetensors::Dtype::BF16));
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["torch_dtype"], "bfloat16");
    assert_eq!(cfg["architectures"][0], "Qwen2ForCausalLM");
}

#[test]
fn bf16_checkpoint_loads_into_f32_weights() {
    let name = "tiny-qwen3-bf16";
    let model = CausalLm::from_hf_dir(model_dir(name), DType::F32, &Device::Cpu).unwrap();
    assert!(model
        .named_vars()
        .iter()
        .all(|(_, v)| v.dtype() == DType::F32));
    let exp = expected(name);
    let (ids, mask) = (&exp["right_input_ids"], &exp["right_attention_mask"]);
    let got = model
        .forward_logits(&ids.to_dtype(DType::U32).unwrap(), Some(mask))
        .unwrap();
    assert!(max_diff_masked(&got, &exp["right_logits"], mask) < 1e-4);
}

#[test]
fn sharded_checkpoints_load() {
    let src = model_dir("tiny-qwen2");
    let dir_tmp = temp_dir("sharded");
    let dir = dir_tmp.path();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let all = candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    let mut names: Vec<_> = all.keys().cloned().collect();
    names.sort();
    let mut map = serde_json::Map::new();
    for (i, part) in names.chunks(names.len() / 2 + 1).enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let tensors: std::collections::HashMap<_, _> =
            part.iter().map(|n| (n.clone(), all[n].clone())).collect();
        candle_core::safetensors::save(&tensors, dir.join(&file)).unwrap();
        for n in part {
            map.insert(n.clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let a = CausalLm::from_hf_dir(&src, DType::F32, &Device::Cpu).unwrap();
    let b = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu).unwrap();
    let (ids, mask) = batch();
    let diff = max_diff(
        &a.forward_logits(&ids, Some(&mask)).unwrap(),
        &b.forward_logits(&ids, Some(&mask)).unwrap(),
    );
    assert_eq!(diff, 0.0);
}

#[test]
fn hub_cache_layout_loads_offline() {
    let cache_tmp = temp_dir("hub");
    let cache = cache_tmp.path();
    let repo = cache.join("models--atomrl--tiny-qwen3");
    let snap = repo.join("snapshots").join("0123abcd");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abcd\n").unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(model_dir("tiny-qwen3").join(f), snap.join(f)).unwrap();
    }
    // Cache only: no test touches the network.
    std::env::set_var("HF_HUB_OFFLINE", "1");
    let m = CausalLm::from_hub_cache(cache, "atomrl/tiny-qwen3", None, DType::F32, &Device::Cpu)
        .unwrap();
    assert_eq!(m.config().vocab_size, 512);
    let by_commit = CausalLm::from_hub_cache(
        cache,
        "atomrl/tiny-qwen3",
        Some("0123abcd"),
        DType::F32,
        &Device::Cpu,
    );
    assert!(by_commit.is_ok());
    let e = CausalLm::from_hub_cache(
        cache,
        "atomrl/tiny-qwen3",
        Some("v2"),
        DType::F32,
        &Device::Cpu,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("atomrl/tiny-qwen3@v2") && e.to_string().contains("HF_HUB_OFFLINE"),
        "{e}"
    );
}

#[test]
fn file_errors_name_the_file() {
    let d = Device::Cpu;
    let dir_tmp = temp_dir("errors");
    let dir = dir_tmp.path();
    let e = CausalLm::from_hf_dir(dir, DType::F32, &d)
        .unwrap_err()
        .to_string();
    assert!(e.contains("config.json"), "{e}");
    let mut cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(model_dir("tiny-qwen2").join("config.json")).unwrap(),
    )
    .unwrap();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let e = CausalLm::from_hf_dir(dir, DType::F32, &d)
        .unwrap_err()
        .to_string();
    assert!(e.contains("model.safetensors"), "{e}");
    cfg["architectures"] = serde_json::json!(["MistralForCausalLM"]);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let e = CausalLm::from_hf_dir(dir, DType::F32, &d)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("config.json") && e.contains("unsupported architecture `MistralForCausalLM`"),
        "{e}"
    );
    // A checkpoint whose shapes disagree with config.json.
    cfg["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
    cfg["intermediate_size"] = 96.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(
        model_dir("tiny-qwen2").join("model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    let e = CausalLm::from_hf_dir(dir, DType::F32, &d)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.safetensors") && e.contains("gate_proj.weight") && e.contains("[96, 64]"),
        "{e}"
    );
}

/// Values of config.json that transformers takes as given but that can only give NaN or a
/// wrong model here are refused at load, naming the field: a layer count the checkpoint does
/// not hold (fewer layers would be dropped in silence), a non-positive RoPE θ, a negative
/// RMSNorm ε, and an optional field of the wrong type (it was read as its default).
#[test]
fn config_values_that_cannot_be_this_checkpoint_are_refused() {
    let d = Device::Cpu;
    let src = model_dir("tiny-qwen2");
    let base: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let dir_tmp = temp_dir("config-values");
    let dir = dir_tmp.path();
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    for (key, value, needle) in [
        (
            "num_hidden_layers",
            serde_json::json!(1),
            "num_hidden_layers = 1, but the checkpoint holds 2 decoder layers",
        ),
        (
            "num_hidden_layers",
            serde_json::json!(1_000_000_000_000u64),
            "holds 2 decoder layers",
        ),
        (
            "rope_theta",
            serde_json::json!(0.0),
            "`rope_theta` must be a finite number > 0",
        ),
        (
            "rms_norm_eps",
            serde_json::json!(-1.0),
            "`rms_norm_eps` must be a finite number >= 0",
        ),
        (
            "rms_norm_eps",
            serde_json::json!("1e-6"),
            "`rms_norm_eps` must be a number, got \"1e-6\"",
        ),
        (
            "num_key_value_heads",
            serde_json::json!("2"),
            "`num_key_value_heads` must be a non-negative integer",
        ),
        (
            "tie_word_embeddings",
            serde_json::json!("yes"),
            "`tie_word_embeddings` must be true or false",
        ),
    ] {
        let mut cfg = base.clone();
        cfg[key] = value;
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        let e = CausalLm::from_hf_dir(dir, DType::F32, &d)
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{key}: {e}");
    }
    // `null` reads as absent, as in transformers: the default.
    let mut cfg = base.clone();
    cfg["rms_norm_eps"] = serde_json::Value::Null;
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    // An integral float is the integer Python would read it as.
    cfg["max_position_embeddings"] = serde_json::json!(4096.0);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let m = CausalLm::from_hf_dir(dir, DType::F32, &d).unwrap();
    assert_eq!(m.config().rms_norm_eps, 1e-6);
    assert_eq!(m.config().max_position_embeddings, 4096);
}

#[test]
fn input_errors_name_the_argument() {
    let d = Device::Cpu;
    let m = CausalLm::from_hf_dir(model_dir("tiny-qwen2"), DType::F32, &d).unwrap();
    let e = m
        .forward_logits(&Tensor::new(&[[1u32, 512]], &d).unwrap(), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("input_ids[0, 1]") && e.contains("[0, 512)"),
        "{e}"
    );
    let e = m
        .forward_logits(&Tensor::new(&[1u32, 2], &d).unwrap(), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`input_ids`") && e.contains("[N, L]"), "{e}");
    let e = m
        .forward_logits(
            &Tensor::new(&[[1u32, 2]], &d).unwrap(),
            Some(&Tensor::new(&[[1u32, 1, 1]], &d).unwrap()),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("attention_mask"), "{e}");
    let input = ForwardInput::new(Tensor::new(&[[1u32, 2]], &d).unwrap())
        .with_position_ids(Tensor::new(&[[0u32]], &d).unwrap());
    assert!(m
        .forward(&input, None)
        .unwrap_err()
        .to_string()
        .contains("position_ids"));
}
