//! The caller-owned key/value cache for incremental decoding.

use atomrl_core::{CandleContext, Result};
use candle_core::Tensor;

/// Keys and values of every layer for the tokens seen so far: a plain struct the caller owns,
/// passes to [`CausalLm::forward`](crate::CausalLm::forward), and can reshape between steps
/// (e.g. [`KvCache::index_select`] to drop finished rows from a running batch).
///
/// # Shapes
/// `layers[i] = Some((k, v))` with `k`, `v` of shape `[N, num_key_value_heads, S, head_dim]`
/// (keys after RoPE); `S` is the number of cached positions, the same for every row (padding
/// included) and every layer.
///
/// ```
/// use atomrl_model::KvCache;
/// let cache = KvCache::new(2);
/// assert_eq!(cache.seq_len(), 0);
/// assert_eq!(cache.batch_size(), None);
/// ```
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    /// One `(k, v)` pair per layer, `None` before the first forward.
    pub layers: Vec<Option<(Tensor, Tensor)>>,
}

impl KvCache {
    /// An empty cache for a model with `num_layers` layers.
    ///
    /// ```
    /// assert_eq!(atomrl_model::KvCache::new(3).layers.len(), 3);
    /// ```
    pub fn new(num_layers: usize) -> Self {
        Self {
            layers: vec![None; num_layers],
        }
    }

    /// Number of cached positions `S` (0 when empty).
    ///
    /// ```
    /// assert_eq!(atomrl_model::KvCache::new(1).seq_len(), 0);
    /// ```
    pub fn seq_len(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .next()
            .map_or(0, |(k, _)| k.dims().get(2).copied().unwrap_or(0))
    }

    /// Number of rows `N` of the cached batch, if anything is cached.
    ///
    /// ```
    /// assert_eq!(atomrl_model::KvCache::new(1).batch_size(), None);
    /// ```
    pub fn batch_size(&self) -> Option<usize> {
        self.layers
            .iter()
            .flatten()
            .next()
            .map(|(k, _)| k.dims()[0])
    }

    /// The cache restricted to the rows `rows` (u32 indices into the batch), in that order.
    ///
    /// # Errors
    /// [`atomrl_core::Error::Candle`] when an index is out of range.
    ///
    /// ```
    /// use atomrl_model::KvCache;
    /// use candle_core::{DType, Device, Tensor};
    /// let k = Tensor::zeros((3, 1, 4, 2), DType::F32, &Device::Cpu)?;
    /// let cache = KvCache { layers: vec![Some((k.clone(), k))] };
    /// let kept = cache.index_select(&Tensor::new(&[0u32, 2], &Device::Cpu)?)?;
    /// assert_eq!((kept.batch_size(), kept.seq_len()), (Some(2), 4));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn index_select(&self, rows: &Tensor) -> Result<Self> {
        let layers = self
            .layers
            .iter()
            .map(|l| match l {
                Some((k, v)) => Ok(Some((
                    k.contiguous()?.index_select(rows, 0)?,
                    v.contiguous()?.index_select(rows, 0)?,
                ))),
                None => Ok(None),
            })
            .collect::<candle_core::Result<Vec<_>>>()
            .ctx("KvCache::index_select")?;
        Ok(Self { layers })
    }

    /// Empties the cache (keeps the number of layers).
    ///
    /// ```
    /// let mut c = atomrl_model::KvCache::new(2);
    /// c.clear();
    /// assert_eq!(c.layers.len(), 2);
    /// ```
    pub fn clear(&mut self) {
        self.layers.iter_mut().for_each(|l| *l = None);
    }
}
