//! generate_samples and BatchDecoder on the tiny fixture models, against full forwards.

#![allow(clippy::unwrap_used)] // helpers panic on failure, as the tests do

use atomrl_logprob::get_action_log_probs;
use atomrl_model::{CausalLm, ForwardInput};
use atomrl_sample::{
    generate_samples, generate_samples_with, BatchDecoder, CacheMode, ChatTokenizer, FinishReason,
    RolloutBatch, SamplingParams,
};
use candle_core::{DType, Device, Tensor};

fn model_dir(name: &str) -> String {
    format!(
        "{}/../../tests/fixtures/reference/models/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn load(name: &str) -> CausalLm {
    CausalLm::from_hf_dir(model_dir(name), DType::F32, &Device::Cpu).unwrap()
}

/// Prompts of different lengths, so that the batch is left-padded.
fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![1, 40, 41, 42, 43, 44, 45],
        vec![1, 50],
        vec![1, 60, 61, 62],
        vec![7],
    ]
}

/// Logits `[V]` of the next token after `seq` (one unpadded row, no cache).
fn next_logits(model: &CausalLm, seq: &[u32]) -> Vec<f32> {
    let ids = Tensor::new(seq, &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let logits = model.forward(&ForwardInput::new(ids), None).unwrap();
    logits
        .get(0)
        .unwrap()
        .get(seq.len() - 1)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn check_masks(out: &RolloutBatch) {
    let mask = out.completion_mask.to_vec2::<f32>().unwrap();
    let lp = out.sampling_log_probs.to_vec2::<f32>().unwrap();
    for (r, row) in mask.iter().enumerate() {
        let len = out.lengths[r];
        assert!(
            row[..len].iter().all(|&m| m == 1.0) && row[len..].iter().all(|&m| m == 0.0),
            "row {r}"
        );
        assert!(
            lp[r][..len].iter().all(|&x| x <= 0.0 && x.is_finite())
                && lp[r][len..].iter().all(|&x| x == 0.0)
        );
    }
    assert_eq!(out.num_generated_tokens, out.lengths.iter().sum::<usize>());
}

#[test]
fn greedy_decode_equals_the_argmax_of_full_forward_logits_step_by_step() {
    for name in ["tiny-qwen2", "tiny-qwen3"] {
        let model = load(name);
        let params = SamplingParams {
            num_generations: 2,
            max_new_tokens: 12,
            temperature: 0.0,
            stop_token_ids: vec![2],
            ..Default::default()
        };
        let out = generate_samples(&model, &prompts(), &params, None).unwrap();
        check_masks(&out);
        let rows = out.completion_rows().unwrap();
        assert_eq!(rows.len(), 8);
        for (r, completion) in rows.iter().enumerate() {
            let mut seq = prompts()[r / 2].clone();
            for (t, &tok) in completion.iter().enumerate() {
                assert_eq!(
                    argmax(&next_logits(&model, &seq)),
                    tok,
                    "{name}: row {r}, step {t}"
                );
                seq.push(tok);
            }
            let expected = if completion.last() == Some(&2) {
                FinishReason::Eos
            } else {
                FinishReason::Length
            };
            assert_eq!(out.finish_reasons[r], expected);
            if expected == FinishReason::Length {
                assert_eq!(completion.len(), 12);
            }
        }
        // Greedy: both generations of a prompt agree.
        assert!(rows.chunks(2).all(|g| g[0] == g[1]));
    }
}

#[test]
fn kv_cache_decode_logits_equal_full_forward_logits_with_left_padding() {
    for name in ["tiny-qwen2", "tiny-qwen3"] {
        let model = load(name);
        // The static decoder (a fixed cache, CUDA's graph path, here in its tensor-op form) with
        // a cache too small for the 8 steps: it grows, keeps finished rows, then compacts.
        for (mode, fixed) in [
            (CacheMode::KvCache, false),
            (CacheMode::KvCache, true),
            (CacheMode::Recompute, false),
        ] {
            let prompts = prompts();
            let copies = 2;
            let mut dec = BatchDecoder::new(&model, mode)
                .with_static_decode(fixed)
                .with_max_new_tokens(3);
            let mut logits = dec.prefill(&prompts, copies).unwrap();
            let mut seqs: Vec<Vec<u32>> = (0..prompts.len() * copies)
                .map(|r| prompts[r / copies].clone())
                .collect();
            assert_eq!(dec.uses_static_decode(), fixed);
            let mut worst = 0f32;
            for step in 0..8 {
                let rows = dec.active_rows().to_vec();
                let got = logits.to_vec2::<f32>().unwrap();
                assert_eq!(got.len(), rows.len());
                for (a, &r) in rows.iter().enumerate() {
                    let want = next_logits(&model, &seqs[r]);
                    let diff = want
                        .iter()
                        .zip(&got[a])
                        .map(|(x, y)| (x - y).abs())
                        .fold(0f32, f32::max);
                    worst = worst.max(diff);
                    assert!(
                        diff < 1e-4,
                        "{name} {mode:?} (static {fixed}): step {step}, row {r}: max |diff| {diff}"
                    );
                }
                // Drop rows as generation would: the longest prompt's rows first (which
                // leaves padding every remaining row shares, trimmed from the cache), then more.
                let keep: Vec<usize> = match step {
                    2 => (0..rows.len()).filter(|&a| rows[a] >= 2).collect(),
                    5 => (0..rows.len()).filter(|&a| rows[a] % 2 == 0).collect(),
                    _ => (0..rows.len()).collect(),
                };
                dec.retain(&keep).unwrap();
                let next: Vec<u32> = keep
                    .iter()
                    .map(|&a| (argmax(&got[a]) + step as u32 * 7) % 500 + 3)
                    .collect();
                for (&a, &t) in keep.iter().zip(&next) {
                    seqs[rows[a]].push(t);
                }
                logits = dec.step(&next).unwrap();
            }
            assert_eq!(dec.active_rows(), &[2, 4, 6]);
            assert_eq!(dec.uses_static_decode(), fixed);
            eprintln!(
                "{name} {mode:?} (static {fixed}): worst |decode - full forward| = {worst:e}"
            );
        }
    }
}

#[test]
fn sampling_log_probs_equal_get_action_log_probs_on_the_same_sequences() {
    for name in ["tiny-qwen2", "tiny-qwen3"] {
        let model = load(name);
        for (temperature, top_k, top_p, min_p, rep) in [
            (1.0, 0, 1.0, 0.0, 1.0),
            (0.7, 50, 0.9, 0.02, 1.3),
            (0.0, 0, 1.0, 0.0, 1.0),
        ] {
            let params = SamplingParams {
                num_generations: 3,
                max_new_tokens: 10,
                temperature,
                top_k,
                top_p,
                min_p,
                repetition_penalty: rep,
                stop_token_ids: vec![2, 0, 300, 301, 302, 303, 304, 305],
                seed: 11,
                ..Default::default()
            };
            let out = generate_samples(&model, &prompts(), &params, None).unwrap();
            check_masks(&out);
            let (ids, mask) = out.full_sequences().unwrap();
            let t = out.completion_ids.dims()[1];
            let recomputed_t = if temperature > 0.0 { temperature } else { 1.0 };
            let lp = get_action_log_probs(&model, &ids, &mask, t, recomputed_t, false).unwrap();
            let want = lp.log_probs.to_vec2::<f32>().unwrap();
            let got = out.sampling_log_probs.to_vec2::<f32>().unwrap();
            let diff = want
                .iter()
                .flatten()
                .zip(got.iter().flatten())
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(diff < 1e-4, "{name}, T = {temperature}: max |diff| {diff}");
        }
    }
}

#[test]
fn eos_ends_a_row_and_other_rows_are_unaffected_by_dropping_it() {
    let model = load("tiny-qwen2");
    let base = SamplingParams {
        num_generations: 2,
        max_new_tokens: 9,
        seed: 3,
        ..Default::default()
    };
    let free = generate_samples(&model, &prompts(), &base, None).unwrap();
    assert!(free
        .finish_reasons
        .iter()
        .all(|r| *r == FinishReason::Length));
    assert!(free.lengths.iter().all(|&l| l == 9));
    let rows = free.completion_rows().unwrap();
    // A stop id that row 0 samples at step 3 for the first time.
    let stop = rows[0][3];
    assert!(!rows[0][..3].contains(&stop), "pick another step");
    let params = SamplingParams {
        stop_token_ids: vec![stop],
        ..base.clone()
    };
    let out = generate_samples(&model, &prompts(), &params, None).unwrap();
    check_masks(&out);
    let got = out.completion_rows().unwrap();
    for (r, row) in rows.iter().enumerate() {
        match row.iter().position(|&t| t == stop) {
            Some(i) => {
                assert_eq!(out.finish_reasons[r], FinishReason::Eos, "row {r}");
                assert_eq!(
                    got[r],
                    row[..=i].to_vec(),
                    "row {r}: the stop token is kept"
                );
            }
            None => {
                assert_eq!(out.finish_reasons[r], FinishReason::Length, "row {r}");
                assert_eq!(&got[r], row, "row {r} changed when other rows were dropped");
            }
        }
    }
    assert_eq!(out.lengths[0], 4);
    assert_eq!(
        out.completion_ids.dims(),
        &[8, *out.lengths.iter().max().unwrap()]
    );
    let ids = out.completion_ids.to_vec2::<u32>().unwrap();
    assert!(
        ids[0][4..].iter().all(|&t| t == 0),
        "right padding with pad id 0"
    );
}

#[test]
fn same_seed_same_outputs_and_cache_modes_agree() {
    let model = load("tiny-qwen3");
    let params = SamplingParams {
        num_generations: 4,
        max_new_tokens: 16,
        temperature: 1.0,
        top_k: 40,
        stop_token_ids: vec![2],
        seed: 77,
        ..Default::default()
    };
    let a = generate_samples(&model, &prompts(), &params, None).unwrap();
    let b = generate_samples(&model, &prompts(), &params, None).unwrap();
    let c = generate_samples_with(&model, &prompts(), &params, None, CacheMode::Recompute).unwrap();
    assert_eq!(a.completion_rows().unwrap(), b.completion_rows().unwrap());
    assert_eq!(a.completion_rows().unwrap(), c.completion_rows().unwrap());
    assert_eq!(a.finish_reasons, c.finish_reasons);
    let other = SamplingParams { seed: 78, ..params };
    let d = generate_samples(&model, &prompts(), &other, None).unwrap();
    assert_ne!(a.completion_rows().unwrap(), d.completion_rows().unwrap());
    // Prompt tensors: left-padded, prompt-major.
    let pm = a.prompt_mask.to_vec2::<f32>().unwrap();
    let pi = a.prompt_ids.to_vec2::<u32>().unwrap();
    assert_eq!(pm[4], vec![0., 0., 0., 0., 0., 1., 1.]);
    assert_eq!(pi[4][5..], [1, 50]);
    assert_eq!(a.group_index, (0..16).map(|r| r / 4).collect::<Vec<_>>());
}

#[test]
fn stop_strings_spanning_token_boundaries_end_the_completion() {
    let dir = model_dir("tiny-qwen2");
    let model = load("tiny-qwen2");
    let tok = ChatTokenizer::from_hf_dir(&dir).unwrap();
    let prompts = vec![
        tok.encode_chat_prompt("Tell me a story.").unwrap(),
        tok.encode_chat_prompt("2+2=").unwrap(),
    ];
    let base = SamplingParams {
        num_generations: 2,
        max_new_tokens: 30,
        seed: 5,
        ..Default::default()
    };
    let free = generate_samples(&model, &prompts, &base, Some(&tok)).unwrap();
    let rows = free.completion_rows().unwrap();
    let c = &rows[0];
    let clean = |t: &str| !t.is_empty() && t.chars().all(|ch| ch.is_ascii_graphic() || ch == ' ');
    let mut found = None;
    for j in 1..c.len() {
        let (a, b) = (
            tok.decode(&c[j - 1..j], true).unwrap(),
            tok.decode(&c[j..=j], true).unwrap(),
        );
        if !(clean(&a) && clean(&b)) {
            continue;
        }
        let s = format!("{}{}", a.chars().last().unwrap(), b.chars().next().unwrap());
        // The first token at which the decoded text contains s.
        let end = (0..c.len())
            .find(|&e| tok.decode(&c[..=e], true).unwrap().contains(&s))
            .unwrap();
        if !tok.decode(&c[end..=end], true).unwrap().contains(&s) {
            found = Some((s, end));
            break;
        }
    }
    let (stop, end) = found.expect("no token boundary with printable text on both sides");
    let params = SamplingParams {
        stop_strings: vec![stop.clone()],
        ..base.clone()
    };
    let out = generate_samples(&model, &prompts, &params, Some(&tok)).unwrap();
    check_masks(&out);
    let got = out.completion_rows().unwrap();
    assert_eq!(out.finish_reasons[0], FinishReason::Stop);
    assert_eq!(
        got[0],
        c[..=end].to_vec(),
        "stop string {stop:?} spans tokens {} and {end}",
        end - 1
    );
    // Other rows: stopped where their own text first contains the string, or unchanged.
    for (r, row) in rows.iter().enumerate().skip(1) {
        match (0..row.len()).find(|&e| tok.decode(&row[..=e], true).unwrap().contains(&stop)) {
            Some(e) => assert_eq!(
                (out.finish_reasons[r], got[r].len()),
                (FinishReason::Stop, e + 1),
                "row {r}"
            ),
            None => assert_eq!(
                (out.finish_reasons[r], &got[r]),
                (FinishReason::Length, row),
                "row {r}"
            ),
        }
    }
    // The decoded text stops before the stop string.
    let texts = tok.decode_completions(&out, &params.stop_strings).unwrap();
    let full = tok.decode(&got[0], true).unwrap();
    assert_eq!(texts[0], full[..full.find(&stop).unwrap()]);
    // Stop strings need a tokenizer.
    let e = generate_samples(&model, &prompts, &params, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("stop_decoder"), "{e}");
}

#[test]
fn invalid_inputs_are_named() {
    let model = load("tiny-qwen2");
    let p = SamplingParams::default();
    let e = generate_samples(&model, &[], &p, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`prompts`"), "{e}");
    let e = generate_samples(&model, &[vec![1], vec![]], &p, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`prompts[1]`"), "{e}");
    let e = generate_samples(&model, &[vec![1, 512]], &p, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`prompts[0][1]`"), "{e}");
    let bad = SamplingParams {
        num_generations: 0,
        ..Default::default()
    };
    let e = generate_samples(&model, &[vec![1]], &bad, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`num_generations`"), "{e}");
}
