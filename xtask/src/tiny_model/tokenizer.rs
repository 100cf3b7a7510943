//! The embedded model's tokenizer: a byte-level BPE trained on the synthetic corpus.
//!
//! - Pre-tokenizer `Sequence[Digits(individual_digits), ByteLevel(add_prefix_space = false)]`,
//!   so every digit is its own token (numbers are spelled digit by digit, which small models
//!   learn arithmetic from far more easily than from merged multi-digit tokens).
//! - Ids 0, 1, 2 are the special tokens `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` (as in
//!   Qwen's ChatML); the 256 byte symbols follow, then the merges.
//! - The four format tags `<think>`, `</think>`, `<answer>`, `</answer>` are added (not
//!   special) tokens at the end of the vocabulary: one token each, kept by decoding.
//!
//! Training is deterministic: the corpus comes in a fixed order, and the BPE trainer breaks
//! ties between equally frequent pairs by their ids.

use std::path::Path;

use anyhow::{anyhow, bail, ensure, Context, Result};
use atomrl_sample::{ChatMessage, ChatTokenizer};
use atomrl_trainer::data::Example;
use serde_json::{json, Value};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    TokenizerBuilder, TokenizerImpl,
};

/// Vocabulary size in total: special tokens, byte symbols, merges and the tags.
pub const VOCAB_SIZE: usize = 512;
/// Special tokens, with ids 0, 1, 2.
pub const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// The format tags, added (non-special) tokens with the last ids.
pub const TAGS: [&str; 4] = ["<think>", "</think>", "<answer>", "</answer>"];
/// Qwen's ChatML template (as in `tests/fixtures/reference/models/tiny-qwen2`).
pub const CHAT_TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

type Impl = TokenizerImpl<
    BPE,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// A training example as the model sees it: ChatML-wrapped prompt, completion, end of turn.
fn chatml(example: &Example) -> Result<String> {
    let prompt = example
        .prompt
        .as_text()
        .ok_or_else(|| anyhow!("synthetic prompts are plain text"))?;
    let completion = example
        .completion
        .as_deref()
        .ok_or_else(|| anyhow!("synthetic examples have a completion"))?;
    Ok(format!(
        "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n{completion}<|im_end|>\n"
    ))
}

/// `text` cut at every special token and tag (which must not take part in the merges: they
/// are whole tokens of their own), in order, without empty pieces.
fn pieces(text: &str, tags: &[&str]) -> Vec<String> {
    let mut out = vec![text.to_string()];
    for token in SPECIAL_TOKENS.iter().chain(tags.iter()) {
        out = out
            .iter()
            .flat_map(|p| p.split(token).map(str::to_string).collect::<Vec<_>>())
            .collect();
    }
    out.retain(|p| !p.is_empty());
    out
}

/// Trains the tokenizer on `corpus` and writes `tokenizer.json`, `tokenizer_config.json` and
/// `generation_config.json` into `dir`.
///
/// # Errors
/// Training or I/O failures, or a vocabulary that does not come out as specified.
pub fn train_tokenizer(corpus: &[Example], dir: &Path) -> Result<()> {
    train_tokenizer_with(corpus, dir, &TAGS, CHAT_TEMPLATE)
}

/// [`train_tokenizer`] with other added tags (each one token, never merged) and chat template:
/// the tool model's tokenizer adds `<tool_call>`, `</tool_call>`, `<tool_response>` and
/// `</tool_response>` (single tokens in Qwen3's vocabulary too).
///
/// # Errors
/// As [`train_tokenizer`].
pub fn train_tokenizer_with(
    corpus: &[Example],
    dir: &Path,
    tags: &[&str],
    chat_template: &str,
) -> Result<()> {
    let mut texts = Vec::new();
    for example in corpus {
        texts.extend(pieces(&chatml(example)?, tags));
    }
    let special: Vec<AddedToken> = SPECIAL_TOKENS
        .iter()
        .map(|t| AddedToken::from(*t, true).normalized(false))
        .collect();
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(VOCAB_SIZE - tags.len())
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(special)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let pre = Sequence::new(vec![
        PreTokenizerWrapper::Digits(Digits::new(true)),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, true)),
    ]);
    let mut tok: Impl = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(None)
        .with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(pre)))
        .with_post_processor(Some(PostProcessorWrapper::ByteLevel(ByteLevel::new(
            false, false, false,
        ))))
        .with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::new(
            false, false, false,
        ))))
        .build()
        .map_err(|e| anyhow!("building the tokenizer: {e}"))?;
    tok.train(&mut trainer, texts.iter())
        .map_err(|e| anyhow!("training the tokenizer: {e}"))?;
    let added: Vec<AddedToken> = tags
        .iter()
        .map(|t| AddedToken::from(*t, false).normalized(false))
        .collect();
    tok.add_tokens(added)
        .map_err(|e| anyhow!("adding the tags: {e}"))?;
    for (i, t) in SPECIAL_TOKENS.iter().enumerate() {
        ensure!(
            tok.token_to_id(t) == Some(i as u32),
            "{t} should have id {i}"
        );
    }
    let size = tok.get_vocab_size(true);
    ensure!(
        size <= VOCAB_SIZE,
        "tokenizer vocabulary {size} > {VOCAB_SIZE}"
    );

    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    tok.save(dir.join("tokenizer.json"), true)
        .map_err(|e| anyhow!("saving tokenizer.json: {e}"))?;
    write_json(
        &dir.join("tokenizer_config.json"),
        &tokenizer_config(&tok, tags, chat_template)?,
    )?;
    write_json(
        &dir.join("generation_config.json"),
        &json!({ "bos_token_id": 0, "eos_token_id": [2, 0], "pad_token_id": 0 }),
    )?;
    Ok(())
}

fn tokenizer_config(tok: &Impl, tags: &[&str], chat_template: &str) -> Result<Value> {
    let mut decoder = serde_json::Map::new();
    let added = SPECIAL_TOKENS
        .iter()
        .map(|t| (*t, true))
        .chain(tags.iter().map(|t| (*t, false)));
    for (content, special) in added {
        let id = tok
            .token_to_id(content)
            .ok_or_else(|| anyhow!("{content} missing from the vocabulary"))?;
        decoder.insert(
            id.to_string(),
            json!({
                "content": content,
                "lstrip": false,
                "normalized": false,
                "rstrip": false,
                "single_word": false,
                "special": special,
            }),
        );
    }
    Ok(json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1024,
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": null,
        "add_bos_token": false,
        "add_eos_token": false,
        "clean_up_tokenization_spaces": false,
        "split_special_tokens": false,
        "padding_side": "right",
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "added_tokens_decoder": decoder,
        "chat_template": chat_template,
    }))
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// What [`check_tokenizer`] measured.
#[derive(Debug, Clone)]
pub struct TokenizerStats {
    /// Vocabulary size with the added tokens.
    pub vocab_size: usize,
    /// Mean / max tokens of a chat-templated prompt.
    pub prompt_tokens: (f64, usize),
    /// Mean / max tokens of a completion with its end-of-turn token.
    pub completion_tokens: (f64, usize),
}

/// Loads the tokenizer in `dir` as the trainer does ([`ChatTokenizer::from_hf_dir`]) and checks
/// it: templated prompts and completions round-trip, digits are one token each, the tags and
/// special tokens are single tokens, EOS is `<|im_end|>` and padding `<|endoftext|>`. Returns
/// token counts over `examples`.
///
/// # Errors
/// Any check that fails.
pub fn check_tokenizer(dir: &Path, examples: &[Example]) -> Result<TokenizerStats> {
    let tok = ChatTokenizer::from_hf_dir(dir).map_err(|e| anyhow!("{e}"))?;
    ensure!(
        tok.eos_token_ids().first() == Some(&2),
        "eos should be <|im_end|> = 2, got {:?}",
        tok.eos_token_ids()
    );
    ensure!(tok.pad_token_id() == 0, "pad should be <|endoftext|> = 0");
    for (i, t) in SPECIAL_TOKENS.iter().chain(TAGS.iter()).enumerate() {
        let ids = tok.encode(t, false).map_err(|e| anyhow!("{e}"))?;
        ensure!(ids.len() == 1, "{t} is {} tokens, not one", ids.len());
        if i < SPECIAL_TOKENS.len() {
            ensure!(ids[0] == i as u32, "{t} has id {}, not {i}", ids[0]);
        }
    }
    let digits = tok
        .encode("Pay 1234567890 now", false)
        .map_err(|e| anyhow!("{e}"))?;
    let digit_tokens = digits
        .iter()
        .filter_map(|&id| tok.inner().id_to_token(id))
        .filter(|t| t.chars().any(|c| c.is_ascii_digit()))
        .collect::<Vec<_>>();
    ensure!(
        digit_tokens.len() == 10 && digit_tokens.iter().all(|t| t.chars().count() == 1),
        "digits must be one token each: {digit_tokens:?}"
    );
    let (mut prompt_sum, mut prompt_max, mut comp_sum, mut comp_max) = (0usize, 0, 0usize, 0);
    for example in examples {
        let q = example
            .prompt
            .as_text()
            .ok_or_else(|| anyhow!("text prompt"))?;
        let text = tok
            .apply_chat_template(&[ChatMessage::user(q)], true)
            .map_err(|e| anyhow!("{e}"))?;
        ensure!(
            text == format!("<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"),
            "unexpected chat template output: {text:?}"
        );
        let ids = tok.encode(&text, false).map_err(|e| anyhow!("{e}"))?;
        let back = tok.decode(&ids, false).map_err(|e| anyhow!("{e}"))?;
        ensure!(
            back == text,
            "prompt does not round-trip: {text:?} -> {back:?}"
        );
        prompt_sum += ids.len();
        prompt_max = prompt_max.max(ids.len());

        let completion = example.completion.as_deref().unwrap_or_default();
        let ids = tok.encode(completion, false).map_err(|e| anyhow!("{e}"))?;
        // Decoding as evaluation does (special tokens skipped) must keep the tags.
        let back = tok.decode(&ids, true).map_err(|e| anyhow!("{e}"))?;
        if back != completion {
            bail!("completion does not round-trip: {completion:?} -> {back:?}");
        }
        comp_sum += ids.len() + 1;
        comp_max = comp_max.max(ids.len() + 1);
    }
    let n = examples.len().max(1) as f64;
    Ok(TokenizerStats {
        vocab_size: tok.vocab_size(),
        prompt_tokens: (prompt_sum as f64 / n, prompt_max),
        completion_tokens: (comp_sum as f64 / n, comp_max),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_drop_special_tokens_and_tags() {
        let p = pieces(
            "<|im_start|>user\nhi<|im_end|>\n<think>\n1+2=3\n</think>",
            &TAGS,
        );
        assert_eq!(p, vec!["user\nhi", "\n", "\n1+2=3\n"]);
    }
}
