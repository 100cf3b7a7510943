//! Small experiences shared by the trainer's update tests (kept apart from `common`, which
//! other crates' tests include and which must not need candle).

#![allow(dead_code, clippy::unwrap_used)]

/// Six rows of ragged prompts and completions with advantages `adv`: row `i` reads prompt
/// `prompt_of(i)` (2–4 tokens; rows with the same prompt share it) and has `completion_len(i)`
/// completion tokens, all in the loss.
pub fn ragged_experience(
    adv: &[f32; 6],
    prompt_of: fn(usize) -> usize,
    completion_len: fn(usize) -> usize,
) -> atomrl_trainer::rollout::Experience {
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|i| {
            let p = prompt_of(i);
            (0..(2 + p % 3))
                .map(|j| ((p * 7 + j * 3) % 31 + 1) as u32)
                .collect()
        })
        .collect();
    let completions: Vec<Vec<u32>> = (0..6)
        .map(|i| {
            (0..completion_len(i))
                .map(|j| ((i * 11 + j * 5) % 31 + 1) as u32)
                .collect()
        })
        .collect();
    let masks: Vec<Vec<bool>> = completions.iter().map(|c| vec![true; c.len()]).collect();
    let rows: Vec<(&[u32], &[u32], &[bool])> = prompts
        .iter()
        .zip(&completions)
        .zip(&masks)
        .map(|((p, c), m)| (p.as_slice(), c.as_slice(), m.as_slice()))
        .collect();
    atomrl_trainer::rollout::Experience::from_rows(
        &rows,
        adv,
        &[true; 6],
        0,
        &candle_core::Device::Cpu,
    )
    .unwrap()
}
