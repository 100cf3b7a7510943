//! ChatTokenizer against transformers' tokenisation, and the registered function's example.

#![allow(clippy::unwrap_used)] // helpers panic on failure, as the tests do

use atomrl_core::compare::json_close;
use atomrl_core::Inputs;
use atomrl_sample::{ChatMessage, ChatTokenizer};
use serde_json::json;

fn repo_root() -> String {
    format!("{}/../..", env!("CARGO_MANIFEST_DIR"))
}

fn tiny(name: &str) -> String {
    format!("{}/tests/fixtures/reference/models/{name}", repo_root())
}

#[test]
fn chat_prompts_tokenise_as_transformers_does() {
    // Expected ids from transformers 5.23: tok.apply_chat_template([{"role": "user",
    // "content": s}], add_generation_prompt=True, tokenize=True) and tok.encode(s).
    type Case = (&'static str, Vec<u32>, Vec<u32>);
    let qwen2: Vec<Case> = vec![
        (
            "What is 2+2?",
            vec![
                1, 372, 201, 57, 285, 86, 286, 223, 20, 13, 20, 33, 2, 201, 1, 364, 201,
            ],
            vec![57, 285, 86, 286, 223, 20, 13, 20, 33],
        ),
        (
            "héllo wörld, 123!\n  ok",
            vec![
                1, 372, 201, 74, 130, 105, 78, 78, 81, 223, 89, 130, 117, 84, 78, 70, 14, 223, 19,
                20, 21, 3, 201, 223, 344, 77, 2, 201, 1, 364, 201,
            ],
            vec![
                74, 130, 105, 78, 78, 81, 223, 89, 130, 117, 84, 78, 70, 14, 223, 19, 20, 21, 3,
                201, 223, 344, 77,
            ],
        ),
    ];
    let qwen3: Vec<Case> = vec![
        (
            "What is 2+2?",
            vec![
                1, 358, 201, 57, 74, 67, 86, 291, 223, 20, 13, 20, 33, 2, 201, 1, 357, 201,
            ],
            vec![57, 74, 67, 86, 291, 223, 20, 13, 20, 33],
        ),
        (
            "héllo wörld, 123!\n  ok",
            vec![
                1, 358, 201, 74, 130, 105, 78, 78, 81, 223, 89, 130, 117, 84, 78, 70, 14, 223, 19,
                20, 21, 3, 201, 223, 342, 77, 2, 201, 1, 357, 201,
            ],
            vec![
                74, 130, 105, 78, 78, 81, 223, 89, 130, 117, 84, 78, 70, 14, 223, 19, 20, 21, 3,
                201, 223, 342, 77,
            ],
        ),
    ];
    for (name, cases, decoded) in [
        ("tiny-qwen2", qwen2, "FGPac total"),
        ("tiny-qwen3", qwen3, "FGP f co"),
    ] {
        let tok = ChatTokenizer::from_hf_dir(tiny(name)).unwrap();
        for (text, chat, plain) in &cases {
            assert_eq!(
                &tok.encode_chat_prompt(text).unwrap(),
                chat,
                "{name}: {text:?}"
            );
            assert_eq!(&tok.encode(text, true).unwrap(), plain, "{name}: {text:?}");
            assert_eq!(&tok.decode(plain, true).unwrap(), text);
        }
        assert_eq!(tok.decode(&[40, 41, 50, 300, 411], true).unwrap(), decoded);
        assert_eq!(tok.eos_token_ids(), vec![2, 0]);
        assert_eq!(tok.pad_token_id(), 0);
        let multi = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::user("Hi"),
            ChatMessage::new("assistant", "Hello"),
        ];
        assert_eq!(
            tok.apply_chat_template(&multi, false).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
        );
    }
}

#[test]
fn missing_files_and_templates_are_named() {
    let e = ChatTokenizer::from_hf_dir("/nonexistent")
        .unwrap_err()
        .to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
    // A folder with a tokenizer but no template or configs.
    let dir = std::env::temp_dir().join(format!("atomrl-sample-notemplate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        format!("{}/tokenizer.json", tiny("tiny-qwen2")),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    let tok = ChatTokenizer::from_hf_dir(&dir).unwrap();
    assert!(!tok.has_chat_template());
    assert!(tok.eos_token_ids().is_empty());
    let e = tok.encode_chat_prompt("hi").unwrap_err().to_string();
    assert!(e.contains("chat_template"), "{e}");
    // A template given as chat_template.jinja, raising an exception.
    std::fs::write(
        dir.join("chat_template.jinja"),
        "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}ok",
    )
    .unwrap();
    let tok = ChatTokenizer::from_hf_dir(&dir).unwrap();
    let e = tok.encode_chat_prompt("hi").unwrap_err().to_string();
    assert!(e.contains("system first"), "{e}");
    assert_eq!(
        tok.apply_chat_template(&[ChatMessage::new("system", "s")], true)
            .unwrap(),
        "ok"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn registered_example_runs_from_the_repository_root() {
    let f = atomrl_sample::functions()
        .into_iter()
        .find(|f| f.spec.name == "generate_samples")
        .unwrap();
    let input: serde_json::Value = serde_json::from_str(f.spec.example_input).unwrap();
    let inputs = Inputs::from_json(&f.spec, input)
        .unwrap()
        .with_base_dir(repo_root());
    let got = (f.run)(&inputs).unwrap().to_json().unwrap();
    let expected: serde_json::Value = serde_json::from_str(f.spec.example_output).unwrap();
    json_close(&expected, &got, 1e-5, 1e-5).unwrap();
}

#[test]
fn text_prompts_give_g_completions_each_with_masks_lengths_and_reasons() {
    let f = atomrl_sample::functions().into_iter().next().unwrap();
    let input = json!({
        "model_dir": "tests/fixtures/reference/models/tiny-qwen3",
        "prompts": ["What is 2+2?", "Name a colour."],
        "num_generations": 3,
        "max_new_tokens": 6,
        "temperature": 1.0,
        "top_p": 0.9,
        "seed": 9,
        "stop_strings": ["e"],
    });
    let inputs = Inputs::from_json(&f.spec, input)
        .unwrap()
        .with_base_dir(repo_root());
    let out = (f.run)(&inputs).unwrap().to_json().unwrap();
    assert_eq!(out["completion_ids"]["shape"][0], 6);
    assert_eq!(
        out["completion_mask"]["shape"],
        out["completion_ids"]["shape"]
    );
    assert_eq!(
        out["sampling_log_probs"]["shape"],
        out["completion_ids"]["shape"]
    );
    assert_eq!(out["lengths"]["shape"], json!([6]));
    assert_eq!(out["group_index"], json!([0, 0, 0, 1, 1, 1]));
    let reasons = out["finish_reason"].as_array().unwrap();
    let texts = out["completions"].as_array().unwrap();
    assert_eq!((reasons.len(), texts.len()), (6, 6));
    for (r, t) in reasons.iter().zip(texts) {
        assert!(["eos", "stop", "length"].contains(&r.as_str().unwrap()));
        assert!(
            !t.as_str().unwrap().contains('e'),
            "text is cut before the stop string: {t}"
        );
    }
    // Both prompt forms at once is an error naming the field.
    let both = json!({"model_dir": "tests/fixtures/reference/models/tiny-qwen2", "prompts": ["a"], "prompt_ids": [[1]]});
    let e = (f.run)(
        &Inputs::from_json(&f.spec, both)
            .unwrap()
            .with_base_dir(repo_root()),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("`prompts`"), "{e}");
    let none = json!({"model_dir": "tests/fixtures/reference/models/tiny-qwen2"});
    let e = (f.run)(&Inputs::from_json(&f.spec, none).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("`prompt_ids`"), "{e}");
}
