//! The caller-owned key/value cache for incremental decoding.

use atomrl_core::{CandleContext, Result};
use candle_core::{Tensor, TensorId};

/// Keys and values of every layer for the tokens seen so far: a plain struct the caller owns,
/// passes to [`CausalLm::forward`](crate::CausalLm::forward), and can reshape between steps
/// (e.g. [`KvCache::index_select`] to drop finished rows from a running batch).
///
/// # Shapes
/// `layers[i] = Some((k, v))` with `k`, `v` of shape `[N, num_key_value_heads, S, head_dim]`
/// (keys after RoPE); `S` is the number of cached positions, the same for every row (padding
/// included) and every layer.
///
/// Decoding appends in place: each layer's keys and values live in a buffer with room for
/// more positions (`[N, num_key_value_heads, capacity, head_dim]`, doubled when full), and
/// `layers` holds views of its first `S` positions, so a step copies its new positions only
/// instead of the whole cache. Appends that need a gradient (a cache on a backward graph, as
/// in `get_shared_prompt_log_probs`) concatenate instead. A clone shares the cached positions
/// but not the spare room (its first append makes a buffer of its own).
///
/// ```
/// use atomrl_model::KvCache;
/// let cache = KvCache::new(2);
/// assert_eq!(cache.seq_len(), 0);
/// assert_eq!(cache.batch_size(), None);
/// ```
#[derive(Debug, Default)]
pub struct KvCache {
    /// One `(k, v)` pair per layer, `None` before the first forward.
    pub layers: Vec<Option<(Tensor, Tensor)>>,
    /// Per layer, the buffers that `layers` views (see the type's docs).
    room: Vec<Option<Room>>,
}

/// A layer's key and value buffers `[N, KV, capacity, d]`, the `len` positions from `start`
/// valid, and the ids of the views of them last handed out (an entry of `layers` that is not
/// one of these views was replaced by the caller, and the buffer no longer applies).
#[derive(Debug)]
struct Room {
    k: Tensor,
    v: Tensor,
    start: usize,
    len: usize,
    views: (TensorId, TensorId),
}

impl Room {
    /// Whether `layer` is the pair of views this room handed out last.
    fn holds(&self, layer: &(Tensor, Tensor)) -> bool {
        self.views == (layer.0.id(), layer.1.id())
    }

    /// Views of the valid positions, remembered as the ones handed out.
    fn views(&mut self) -> candle_core::Result<(Tensor, Tensor)> {
        let k = self.k.narrow(2, self.start, self.len)?;
        let v = self.v.narrow(2, self.start, self.len)?;
        self.views = (k.id(), v.id());
        Ok((k, v))
    }
}

impl Clone for KvCache {
    /// The same cached positions; no spare room, so that two clones never write into one
    /// buffer.
    fn clone(&self) -> Self {
        Self::from_layers(self.layers.clone())
    }
}

impl KvCache {
    /// An empty cache for a model with `num_layers` layers.
    ///
    /// ```
    /// assert_eq!(atomrl_model::KvCache::new(3).layers.len(), 3);
    /// ```
    pub fn new(num_layers: usize) -> Self {
        Self::from_layers(vec![None; num_layers])
    }

    /// A cache holding `layers` (`(k, v)` pairs of shape `[N, KV, S, d]`, see the type's docs).
    ///
    /// ```
    /// use atomrl_model::KvCache;
    /// use candle_core::{DType, Device, Tensor};
    /// let k = Tensor::zeros((2, 1, 3, 4), DType::F32, &Device::Cpu)?;
    /// let cache = KvCache::from_layers(vec![Some((k.clone(), k))]);
    /// assert_eq!((cache.batch_size(), cache.seq_len()), (Some(2), 3));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_layers(layers: Vec<Option<(Tensor, Tensor)>>) -> Self {
        Self {
            layers,
            room: Vec::new(),
        }
    }

    /// Appends new keys and values `[N, KV, L, d]` to layer `layer` and returns the layer's
    /// whole keys and values `[N, KV, S + L, d]`.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        if self.room.len() < self.layers.len() {
            self.room.resize_with(self.layers.len(), || None);
        }
        let prev = self.layers[layer].take();
        let on_graph = |t: &Tensor| t.track_op();
        let graph = on_graph(k)
            || on_graph(v)
            || prev
                .as_ref()
                .is_some_and(|(a, b)| on_graph(a) || on_graph(b));
        let (k, v) = if graph {
            match prev {
                Some((pk, pv)) => (Tensor::cat(&[&pk, k], 2)?, Tensor::cat(&[&pv, v], 2)?),
                None => (k.clone(), v.clone()),
            }
        } else {
            append_in_place(&mut self.room[layer], prev, k, v)?
        };
        self.layers[layer] = Some((k.clone(), v.clone()));
        Ok((k, v))
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
    /// let cache = KvCache::from_layers(vec![Some((k.clone(), k))]);
    /// let kept = cache.index_select(&Tensor::new(&[0u32, 2], &Device::Cpu)?)?;
    /// assert_eq!((kept.batch_size(), kept.seq_len()), (Some(2), 4));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn index_select(&self, rows: &Tensor) -> Result<Self> {
        self.pick_rows(rows).ctx("KvCache::index_select")
    }

    fn pick_rows(&self, rows: &Tensor) -> candle_core::Result<Self> {
        let mut picked = Self::new(self.layers.len());
        picked.room.resize_with(self.layers.len(), || None);
        for (i, layer) in self.layers.iter().enumerate() {
            let Some(layer) = layer else { continue };
            let room = self.room.get(i).and_then(Option::as_ref);
            match room.filter(|r| r.holds(layer)) {
                // The rows of the whole buffer, spare room included: one copy, and the next
                // append writes into it instead of copying the cache into a new buffer.
                Some(r) => {
                    let mut new = Room {
                        k: r.k.index_select(rows, 0)?,
                        v: r.v.index_select(rows, 0)?,
                        start: r.start,
                        len: r.len,
                        views: r.views,
                    };
                    picked.layers[i] = Some(new.views()?);
                    picked.room[i] = Some(new);
                }
                None => {
                    let (k, v) = layer;
                    picked.layers[i] = Some((
                        k.contiguous()?.index_select(rows, 0)?,
                        v.contiguous()?.index_select(rows, 0)?,
                    ));
                }
            }
        }
        Ok(picked)
    }

    /// Drops the first `n` cached positions of every layer (padding columns that no row
    /// needs any more); later appends still write in place.
    ///
    /// # Errors
    /// [`atomrl_core::Error::Candle`] when a layer holds fewer than `n` positions.
    ///
    /// ```
    /// use atomrl_model::KvCache;
    /// use candle_core::{DType, Device, Tensor};
    /// let k = Tensor::zeros((2, 1, 5, 4), DType::F32, &Device::Cpu)?;
    /// let mut cache = KvCache::from_layers(vec![Some((k.clone(), k))]);
    /// cache.drop_front(2)?;
    /// assert_eq!(cache.seq_len(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn drop_front(&mut self, n: usize) -> Result<()> {
        let func = "KvCache::drop_front";
        for (i, slot) in self.layers.iter_mut().enumerate() {
            let Some(layer) = slot.as_mut() else { continue };
            let room = self.room.get_mut(i).and_then(Option::as_mut);
            match room.filter(|r| r.holds(layer) && r.len >= n) {
                Some(r) => {
                    r.start += n;
                    r.len -= n;
                    *layer = r.views().ctx(func)?;
                }
                None => {
                    let s = layer.0.dim(2).ctx(func)?;
                    let keep = s.saturating_sub(n);
                    layer.0 = layer.0.narrow(2, n, keep).ctx(func)?;
                    layer.1 = layer.1.narrow(2, n, keep).ctx(func)?;
                }
            }
        }
        Ok(())
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
        self.room.clear();
    }
}

/// Writes `k`, `v` after the `prev` positions in the layer's buffers (made, or remade with
/// twice the room, when they do not hold `prev` or are full) → views of all positions.
fn append_in_place(
    room: &mut Option<Room>,
    prev: Option<(Tensor, Tensor)>,
    k: &Tensor,
    v: &Tensor,
) -> candle_core::Result<(Tensor, Tensor)> {
    let (n, kv, l, d) = k.dims4()?;
    let len = prev.as_ref().map_or(Ok(0), |(pk, _)| pk.dim(2))?;
    let usable = room.as_ref().is_some_and(|r| {
        r.len == len
            && (len == 0 || prev.as_ref().is_some_and(|p| r.holds(p)))
            && r.k.dims4().is_ok_and(|(rn, rkv, cap, rd)| {
                (rn, rkv, rd) == (n, kv, d) && cap >= r.start + len + l
            })
            && r.k.dtype() == k.dtype()
    });
    if !usable {
        let capacity = (len + l) + (len + l).max(32);
        let kb = Tensor::zeros((n, kv, capacity, d), k.dtype(), k.device())?;
        let vb = Tensor::zeros((n, kv, capacity, d), v.dtype(), v.device())?;
        if let Some((pk, pv)) = &prev {
            kb.slice_set(&pk.contiguous()?, 2, 0)?;
            vb.slice_set(&pv.contiguous()?, 2, 0)?;
        }
        *room = Some(Room {
            k: kb,
            v: vb,
            start: 0,
            len,
            views: (k.id(), v.id()),
        });
    }
    let Some(r) = room.as_mut() else {
        candle_core::bail!("KvCache: no buffer after allocation");
    };
    r.k.slice_set(&k.contiguous()?, 2, r.start + len)?;
    r.v.slice_set(&v.contiguous()?, 2, r.start + len)?;
    r.len = len + l;
    r.views()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    fn block(n: usize, l: usize, seed: f32) -> Tensor {
        Tensor::arange(0f32, (n * 2 * l * 3) as f32, &Device::Cpu)
            .and_then(|t| (t + seed as f64)?.reshape((n, 2, l, 3)))
            .expect("block")
    }

    fn rows(t: &Tensor) -> Vec<f32> {
        t.flatten_all().and_then(|t| t.to_vec1()).expect("values")
    }

    #[test]
    fn appends_in_place_equal_concatenation_across_growth() {
        let mut cache = KvCache::new(1);
        let mut expected: Option<Tensor> = None;
        // A 5-position prefill, then 60 single steps: the buffer grows twice.
        for (step, l) in std::iter::once(5)
            .chain(std::iter::repeat_n(1, 60))
            .enumerate()
        {
            let k = block(2, l, step as f32 * 100.0);
            let v = (&k * 2.0).expect("v");
            let (ka, va) = cache.append(0, &k, &v).expect("append");
            let e = match expected.take() {
                Some(e) => Tensor::cat(&[&e, &k], 2).expect("cat"),
                None => k.clone(),
            };
            assert_eq!(rows(&ka), rows(&e), "step {step}");
            assert_eq!(rows(&va), rows(&(&e * 2.0).expect("2e")));
            expected = Some(e);
        }
        assert_eq!(cache.seq_len(), 65);
    }

    #[test]
    fn clones_and_replaced_layers_never_share_writes() {
        let mut a = KvCache::new(1);
        a.append(0, &block(1, 4, 0.0), &block(1, 4, 0.0))
            .expect("prefill");
        let mut b = a.clone();
        let (ka, _) = a
            .append(0, &block(1, 1, 1000.0), &block(1, 1, 1000.0))
            .expect("a");
        let (kb, _) = b
            .append(0, &block(1, 1, 2000.0), &block(1, 1, 2000.0))
            .expect("b");
        let last = |t: &Tensor| rows(&t.narrow(2, 4, 1).expect("narrow"));
        assert_eq!(last(&ka), rows(&block(1, 1, 1000.0)));
        assert_eq!(last(&kb), rows(&block(1, 1, 2000.0)));
        // The caller puts back an older state: the next append starts from it.
        let old = b.layers[0].clone();
        b.append(0, &block(1, 1, 3000.0), &block(1, 1, 3000.0))
            .expect("b2");
        let (k_old, _) = old.clone().expect("old");
        b.layers[0] = old;
        let (k, _) = b
            .append(0, &block(1, 1, 4000.0), &block(1, 1, 4000.0))
            .expect("b3");
        assert_eq!(k.dim(2).expect("len"), 6);
        assert_eq!(rows(&k.narrow(2, 0, 5).expect("prefix")), rows(&k_old));
        assert_eq!(
            last(&k.narrow(2, 1, 5).expect("tail")),
            rows(&block(1, 1, 4000.0))
        );
    }

    #[test]
    fn a_cache_on_a_backward_graph_keeps_its_gradient() {
        let w = Var::from_tensor(&block(1, 2, 0.0)).expect("var");
        let mut cache = KvCache::new(1);
        let k = (w.as_tensor() * 3.0).expect("k");
        cache.append(0, &k, &k).expect("first");
        let (all, _) = cache
            .append(0, &block(1, 1, 9.0), &block(1, 1, 9.0))
            .expect("second");
        let grads = all.sum_all().and_then(|s| s.backward()).expect("backward");
        let g = grads
            .get(w.as_tensor())
            .expect("a gradient reaches the cached keys");
        assert!(rows(g).iter().all(|&x| x == 3.0));
        assert_eq!(all.dtype(), DType::F32);
    }
}
