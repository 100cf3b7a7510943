//! [`BatchDecoder`]: batched incremental decoding with a KV cache, left-padded prompts, and
//! finished rows dropped from the running batch.

use atomrl_core::{CandleContext, Error, Result};
use atomrl_model::{CausalLm, ForwardInput, KvCache, StaticDecode};
use candle_core::{Device, Tensor};

/// How [`BatchDecoder`] computes each step's logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheMode {
    /// Keys and values of past positions are kept in a [`KvCache`]; each step feeds one
    /// token per row. The prompt is run once per distinct prompt (not once per generation).
    #[default]
    KvCache,
    /// No cache: each step re-runs the whole (left-padded) sequence. The reference baseline;
    /// gives the same logits up to float rounding.
    Recompute,
}

/// A running batch of sequences being decoded: prefill the prompts, then one token per active
/// row per step. Rows can be dropped at any time ([`BatchDecoder::retain`]); their cache
/// rows are removed (`KvCache::index_select`), and padding columns every remaining row has
/// are trimmed from the cache, so finished rows and long-gone padding cost nothing.
///
/// Positions are explicit (`prompt_len + generated so far` for each row); the key-padding
/// mask is sent only while some active row still has padding.
///
/// On CUDA the steps after the prefill run as a [`StaticDecode`] (a KV cache of fixed
/// capacity, each step one replayed CUDA graph): finished rows stay in its batch, fed the pad
/// token, until half the rows have finished, when the batch is compacted (a new graph).
/// `ATOMRL_CUDA_GRAPHS=0` (or `ATOMRL_CUDA_FUSED=0`) decodes with the eager cached steps
/// instead. [`BatchDecoder::with_static_decode`] turns the static decoder on elsewhere (the
/// CPU, for tests; on CUDA without graphs when they are off) or off;
/// [`BatchDecoder::with_max_new_tokens`] sizes the cache.
///
/// # Shapes
/// [`BatchDecoder::prefill`]: `B` prompts × `copies` → logits `[B·copies, V]` at the last
/// prompt token (row `b·copies + c`). [`BatchDecoder::step`]: one token per active row →
/// logits `[A, V]` for the next token, rows in [`BatchDecoder::active_rows`] order.
///
/// ```
/// use atomrl_model::CausalLm;
/// use atomrl_sample::{BatchDecoder, CacheMode};
/// use candle_core::{DType, Device};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
/// let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
/// let mut dec = BatchDecoder::new(&model, CacheMode::KvCache);
/// let logits = dec.prefill(&[vec![1, 5, 6], vec![1, 7]], 2)?;
/// assert_eq!(logits.dims(), &[4, 512]);
/// dec.retain(&[0, 3])?; // keep rows 0 and 3
/// let logits = dec.step(&[9, 10])?;
/// assert_eq!((logits.dims(), dec.active_rows()), (&[2, 512][..], &[0, 3][..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct BatchDecoder<'m> {
    model: &'m CausalLm,
    mode: CacheMode,
    cache: KvCache,
    rows: Vec<usize>,
    pads: Vec<usize>,
    lens: Vec<usize>,
    width: usize,
    seqs: Vec<Vec<u32>>,
    pad_id: u32,
    /// `None`: static decoding on CUDA only; `Some(on)`: wherever supported, or never.
    static_choice: Option<bool>,
    max_new_tokens: usize,
    /// The static decoder of the running batch, when used.
    fixed: Option<StaticDecode>,
    /// Its row of each active row, and its rows' positions.
    slots: Vec<usize>,
    slot_positions: Vec<u32>,
}

/// Positions a static cache makes room for past the prompt when the caller gave no
/// `max_new_tokens` (it grows when full).
const DEFAULT_ROOM: usize = 256;

const FUNC: &str = "BatchDecoder";

impl<'m> BatchDecoder<'m> {
    /// A decoder on `model` (use an inference view, [`CausalLm::detached`], so that no
    /// backward graph is recorded).
    ///
    /// See [`BatchDecoder`] for an example.
    pub fn new(model: &'m CausalLm, mode: CacheMode) -> Self {
        Self {
            model,
            mode,
            cache: model.new_kv_cache(),
            rows: Vec::new(),
            pads: Vec::new(),
            lens: Vec::new(),
            width: 0,
            seqs: Vec::new(),
            pad_id: 0,
            static_choice: None,
            max_new_tokens: 0,
            fixed: None,
            slots: Vec::new(),
            slot_positions: Vec::new(),
        }
    }

    /// Decodes through a [`StaticDecode`] wherever the model has one (`true`; on the CPU its
    /// tensor-op form) or never (`false`); by default only on CUDA with graphs on.
    ///
    /// ```
    /// use atomrl_model::CausalLm;
    /// use atomrl_sample::{BatchDecoder, CacheMode};
    /// use candle_core::{DType, Device};
    /// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
    /// let mut dec = BatchDecoder::new(&model, CacheMode::KvCache).with_static_decode(true);
    /// dec.prefill(&[vec![1, 5, 6], vec![1, 7]], 1)?;
    /// assert!(dec.uses_static_decode());
    /// assert_eq!(dec.step(&[9, 10])?.dims(), &[2, 512]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_static_decode(mut self, on: bool) -> Self {
        self.static_choice = Some(on);
        self
    }

    /// The most tokens a row will be fed after its prompt: a static cache is sized for it
    /// (else it makes room for 256 and grows).
    ///
    /// See [`BatchDecoder::with_static_decode`]; [`crate::generate_samples`] passes its
    /// `max_new_tokens`.
    pub fn with_max_new_tokens(mut self, n: usize) -> Self {
        self.max_new_tokens = n;
        self
    }

    /// Whether the running batch decodes through a [`StaticDecode`].
    ///
    /// See [`BatchDecoder::with_static_decode`] for an example.
    pub fn uses_static_decode(&self) -> bool {
        self.fixed.is_some()
    }

    /// Whether a prefilled batch continues as a [`StaticDecode`].
    fn wants_static(&self) -> bool {
        // One new token is the prefill's: no step would use the static cache.
        self.mode == CacheMode::KvCache
            && self.max_new_tokens != 1
            && self.static_choice.unwrap_or_else(|| {
                self.model.device().is_cuda() && atomrl_core::device::cuda_graphs()
            })
            && StaticDecode::supports(self.model)
    }

    /// Runs the prompts (left-padded to the longest) and returns the next-token logits
    /// `[B·copies, V]` (f32 or the model's dtype); row `b·copies + c` is copy `c` of prompt
    /// `b`. The prompts are computed once each; the cache rows are then repeated.
    ///
    /// # Errors
    /// [`Error::Value`] for an empty prompt list, an empty prompt, `copies = 0` or a token
    /// id outside the vocabulary (naming `prompts[b][j]`); model errors otherwise.
    ///
    /// See [`BatchDecoder`] for an example.
    pub fn prefill(&mut self, prompts: &[Vec<u32>], copies: usize) -> Result<Tensor> {
        let func = "BatchDecoder::prefill";
        check_prompts(func, prompts, self.model.config().vocab_size)?;
        if copies == 0 {
            return Err(Error::value(func, "copies", "at least 1", 0));
        }
        let device = self.model.device().clone();
        let b = prompts.len();
        let p = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let pads: Vec<usize> = prompts.iter().map(|x| p - x.len()).collect();
        let mut ids = Vec::with_capacity(b * p);
        for (x, &pad) in prompts.iter().zip(&pads) {
            ids.extend(std::iter::repeat_n(self.pad_id, pad));
            ids.extend_from_slice(x);
        }
        let ids_t = Tensor::from_vec(ids.clone(), (b, p), &Device::Cpu).ctx(func)?;
        // The next token's logits need the last position's state alone.
        let mut input = ForwardInput::new(ids_t).with_last_position_only();
        if pads.iter().any(|&x| x > 0) {
            input = input.with_attention_mask(pad_mask(&pads, p)?);
        }
        self.cache = self.model.new_kv_cache();
        let cache = match self.mode {
            CacheMode::KvCache => Some(&mut self.cache),
            CacheMode::Recompute => None,
        };
        let hidden = self.model.forward_hidden(&input, cache)?;
        let last = hidden.squeeze(1).ctx(func)?;
        let mut logits = self.model.logits(&last)?;
        let expand = |v: &[usize]| -> Vec<usize> {
            v.iter()
                .flat_map(|&x| std::iter::repeat_n(x, copies))
                .collect()
        };
        self.pads = expand(&pads);
        self.lens = expand(&prompts.iter().map(Vec::len).collect::<Vec<_>>());
        self.rows = (0..b * copies).collect();
        self.width = p;
        self.seqs = match self.mode {
            CacheMode::KvCache => Vec::new(),
            CacheMode::Recompute => (0..b * copies)
                .map(|r| ids[(r / copies) * p..(r / copies + 1) * p].to_vec())
                .collect(),
        };
        if copies > 1 {
            let idx: Vec<u32> = (0..b as u32)
                .flat_map(|x| std::iter::repeat_n(x, copies))
                .collect();
            let idx = Tensor::new(idx, &device).ctx(func)?;
            logits = logits.index_select(&idx, 0).ctx(func)?;
            if self.mode == CacheMode::KvCache {
                self.cache = self.cache.index_select(&idx)?;
            }
        }
        self.fixed = None;
        if self.wants_static() {
            let room = if self.max_new_tokens > 0 {
                self.max_new_tokens
            } else {
                DEFAULT_ROOM
            };
            let fixed = StaticDecode::new(self.model, &self.cache, &self.pads, p + room)?;
            self.fixed = Some(fixed);
            self.slots = (0..b * copies).collect();
            self.slot_positions = self.lens.iter().map(|&l| l as u32).collect();
            self.cache = self.model.new_kv_cache();
        }
        Ok(logits)
    }

    /// A step of the static decoder: the active rows' tokens at their rows, the pad token
    /// elsewhere; logits of the active rows.
    fn static_step(&mut self, tokens: &[u32]) -> Result<Tensor> {
        let func = "BatchDecoder::step";
        let Some(fixed) = self.fixed.as_mut() else {
            return Err(Error::missing(func, "static decoder", "a prefill"));
        };
        if fixed.width() >= fixed.capacity() {
            let more = fixed.capacity() + fixed.capacity() / 2 + 1;
            *fixed = fixed.with_capacity(self.model, more)?;
        }
        let mut ids = vec![self.pad_id; fixed.rows()];
        for ((&slot, &t), &len) in self.slots.iter().zip(tokens).zip(&self.lens) {
            ids[slot] = t;
            self.slot_positions[slot] = len as u32;
        }
        let logits = fixed.step(&ids, &self.slot_positions)?;
        if self.slots.len() == fixed.rows() {
            return Ok(logits);
        }
        let idx: Vec<u32> = self.slots.iter().map(|&s| s as u32).collect();
        let idx = Tensor::new(idx, self.model.device()).ctx(func)?;
        logits.index_select(&idx, 0).ctx(func)
    }

    /// Drops finished rows from the static decoder once they are at least half its batch.
    fn compact_static(&mut self) -> Result<()> {
        let Some(fixed) = self.fixed.as_ref() else {
            return Ok(());
        };
        if self.slots.is_empty() {
            self.fixed = None;
            return Ok(());
        }
        if 2 * self.slots.len() > fixed.rows() {
            return Ok(());
        }
        let compacted = fixed.select_rows(self.model, &self.slots)?;
        self.slot_positions = self.slots.iter().map(|&s| self.slot_positions[s]).collect();
        self.slots = (0..self.slots.len()).collect();
        self.fixed = Some(compacted);
        Ok(())
    }

    /// Feeds one token per active row and returns the next-token logits `[A, V]`.
    ///
    /// # Errors
    /// [`Error::Value`] when `tokens` does not have one id per active row or an id is outside
    /// the vocabulary; model errors otherwise.
    ///
    /// See [`BatchDecoder`] for an example.
    pub fn step(&mut self, tokens: &[u32]) -> Result<Tensor> {
        let func = "BatchDecoder::step";
        let a = self.rows.len();
        if tokens.len() != a || a == 0 {
            return Err(Error::value(
                func,
                "tokens",
                format!("{a} ids (one per active row)"),
                tokens.len(),
            ));
        }
        let vocab = self.model.config().vocab_size;
        if let Some(i) = tokens.iter().position(|&t| t as usize >= vocab) {
            return Err(Error::value(
                func,
                format!("tokens[{i}]"),
                format!("a token id in [0, {vocab})"),
                tokens[i],
            ));
        }
        let device = self.model.device().clone();
        let any_pad = self.pads.iter().any(|&x| x > 0);
        let logits = match self.mode {
            CacheMode::KvCache if self.fixed.is_some() => self.static_step(tokens)?,
            CacheMode::KvCache => {
                let ids = Tensor::from_vec(tokens.to_vec(), (a, 1), &Device::Cpu).ctx(func)?;
                let pos: Vec<u32> = self.lens.iter().map(|&l| l as u32).collect();
                let pos = Tensor::from_vec(pos, (a, 1), &device).ctx(func)?;
                let mut input = ForwardInput::new(ids).with_position_ids(pos);
                if any_pad {
                    input = input.with_attention_mask(pad_mask(&self.pads, self.width + 1)?);
                }
                let logits = self.model.forward(&input, Some(&mut self.cache))?;
                logits.squeeze(1).ctx(func)?
            }
            CacheMode::Recompute => {
                for (s, &t) in self.seqs.iter_mut().zip(tokens) {
                    s.push(t);
                }
                let l = self.width + 1;
                let ids = Tensor::from_vec(self.seqs.concat(), (a, l), &Device::Cpu).ctx(func)?;
                let mut input = ForwardInput::new(ids).with_last_position_only();
                if any_pad {
                    input = input.with_attention_mask(pad_mask(&self.pads, l)?);
                }
                let hidden = self.model.forward_hidden(&input, None)?;
                let last = hidden.squeeze(1).ctx(func)?;
                self.model.logits(&last)?
            }
        };
        self.lens.iter_mut().for_each(|l| *l += 1);
        self.width += 1;
        Ok(logits)
    }

    /// Keeps only the active rows at positions `keep` (indices into
    /// [`BatchDecoder::active_rows`], increasing), dropping the others from the cache; then
    /// trims the padding columns all remaining rows share.
    ///
    /// # Errors
    /// [`Error::Value`] when `keep` is not increasing or indexes past the active rows.
    ///
    /// See [`BatchDecoder`] for an example.
    pub fn retain(&mut self, keep: &[usize]) -> Result<()> {
        let func = "BatchDecoder::retain";
        let a = self.rows.len();
        if keep.windows(2).any(|w| w[0] >= w[1]) || keep.last().is_some_and(|&k| k >= a) {
            return Err(Error::value(
                func,
                "keep",
                format!("increasing indices below {a}"),
                format!("{keep:?}"),
            ));
        }
        if keep.len() == a {
            return Ok(());
        }
        let pick = |v: &[usize]| -> Vec<usize> { keep.iter().map(|&k| v[k]).collect() };
        self.rows = pick(&self.rows);
        self.pads = pick(&self.pads);
        self.lens = pick(&self.lens);
        if self.fixed.is_some() {
            // The static cache keeps its columns: no padding is trimmed.
            self.slots = pick(&self.slots);
            return self.compact_static();
        }
        if !self.seqs.is_empty() {
            self.seqs = keep
                .iter()
                .map(|&k| std::mem::take(&mut self.seqs[k]))
                .collect();
        }
        if keep.is_empty() {
            self.cache.clear();
            return Ok(());
        }
        if self.mode == CacheMode::KvCache {
            let idx: Vec<u32> = keep.iter().map(|&k| k as u32).collect();
            let idx = Tensor::new(idx, self.model.device()).ctx(func)?;
            self.cache = self.cache.index_select(&idx)?;
        }
        let trim = self.pads.iter().copied().min().unwrap_or(0);
        if trim > 0 {
            self.pads.iter_mut().for_each(|p| *p -= trim);
            self.width -= trim;
            self.seqs.iter_mut().for_each(|s| {
                s.drain(..trim);
            });
            self.cache.drop_front(trim)?;
        }
        Ok(())
    }

    /// The global row index (from [`BatchDecoder::prefill`]) of each active row, in the
    /// order of the logits.
    ///
    /// See [`BatchDecoder`] for an example.
    pub fn active_rows(&self) -> &[usize] {
        &self.rows
    }

    /// Number of positions per row (padding included) the next step attends to.
    ///
    /// ```
    /// # use atomrl_model::CausalLm;
    /// # use atomrl_sample::{BatchDecoder, CacheMode};
    /// # use candle_core::{DType, Device};
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reference/models/tiny-qwen2");
    /// # let model = CausalLm::from_hf_dir(dir, DType::F32, &Device::Cpu)?;
    /// let mut dec = BatchDecoder::new(&model, CacheMode::KvCache);
    /// dec.prefill(&[vec![1, 5, 6], vec![1]], 1)?;
    /// assert_eq!(dec.width(), 3);
    /// dec.retain(&[1])?; // the short prompt's 2 padding columns are trimmed
    /// assert_eq!(dec.width(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn width(&self) -> usize {
        self.width
    }
}

/// `[N, width]` u8 mask: 0 on each row's leading `pads[r]` columns, 1 after. On the host: the
/// model reads its rows there (a GPU decode step then makes no device-to-host copy for it).
fn pad_mask(pads: &[usize], width: usize) -> Result<Tensor> {
    let mut m = Vec::with_capacity(pads.len() * width);
    for &p in pads {
        m.extend(std::iter::repeat_n(0u8, p));
        m.extend(std::iter::repeat_n(1u8, width - p));
    }
    Tensor::from_vec(m, (pads.len(), width), &Device::Cpu).ctx(FUNC)
}

pub(crate) fn check_prompts(func: &str, prompts: &[Vec<u32>], vocab: usize) -> Result<()> {
    if prompts.is_empty() {
        return Err(Error::value(
            func,
            "prompts",
            "at least one prompt",
            "an empty list",
        ));
    }
    for (b, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(Error::value(
                func,
                format!("prompts[{b}]"),
                "at least one token",
                "an empty prompt",
            ));
        }
        if let Some(j) = p.iter().position(|&t| t as usize >= vocab) {
            return Err(Error::value(
                func,
                format!("prompts[{b}][{j}]"),
                format!("a token id in [0, {vocab})"),
                p[j],
            ));
        }
    }
    Ok(())
}
