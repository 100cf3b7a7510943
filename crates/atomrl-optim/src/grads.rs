//! Gradient accumulation over micro-batches and global-norm clipping.

use std::collections::BTreeMap;

use atomrl_dist::Collective;

use atomrl_core::{CandleContext, Error, Result};
use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};

const FUNC: &str = "Gradients";

/// Gradients of named parameters summed over micro-batches.
///
/// Kept in name order, so that [`global_norm`](Gradients::global_norm) adds the parameters'
/// squared norms in the same order in every process: data-parallel ranks must compute the
/// same clipping factor to the last bit.
///
/// A sum is first the backward pass's own gradient tensor (no copy); the first addition makes
/// a buffer of its own, and later additions and clipping write into that buffer in place
/// (bit-identical to the tensor-op form, without a parameter-sized allocation per micro-batch).
/// On CUDA a micro-batch's additions to every parameter's sum are one kernel launch.
/// A tensor returned by [`get`](Gradients::get) shares that buffer: read it before the next
/// [`accumulate`](Gradients::accumulate), [`add`](Gradients::add) or
/// [`clip_global_norm`](Gradients::clip_global_norm).
#[derive(Debug, Default)]
pub struct Gradients {
    sums: BTreeMap<String, Sum>,
}

/// One parameter's gradient sum.
#[derive(Debug)]
struct Sum {
    tensor: Tensor,
    /// Whether `tensor`'s buffer was allocated here and is shared with no backward pass, so
    /// that it may be written in place.
    owned: bool,
}

impl Sum {
    /// `self += g`: in place when the buffer is ours, else into a new buffer that is.
    fn add(&mut self, g: &Tensor) -> Result<()> {
        if self.owned && crate::inplace::applies(&[&self.tensor, g]) && g.is_contiguous() {
            self.tensor
                .inplace_op2(g, &crate::inplace::AddAssign)
                .ctx(FUNC)?;
        } else {
            self.tensor = match cpu_sum(&self.tensor, g).ctx(FUNC)? {
                Some(sum) => sum,
                None => (&self.tensor + g).ctx(FUNC)?,
            };
            self.owned = true;
        }
        Ok(())
    }

    /// Whether `self += g` goes into the multi-tensor launch of
    /// [`Gradients::add_sums`](Gradients::add_sums): contiguous f32 tensors of one shape on
    /// CUDA with the in-place kernels on.
    fn adds_in_one_launch(&self, g: &Tensor) -> bool {
        cfg!(feature = "cuda")
            && self.tensor.device().is_cuda()
            && self.tensor.dims() == g.dims()
            && self.tensor.is_contiguous()
            && g.is_contiguous()
            && crate::inplace::applies(&[&self.tensor, g])
    }

    /// `self *= scale` (candle's `tensor * scale`), in place when the buffer is ours.
    fn scale(&mut self, scale: f64) -> Result<()> {
        if self.owned && crate::inplace::applies(&[&self.tensor]) {
            self.tensor
                .inplace_op1(&crate::inplace::Scale(scale))
                .ctx(FUNC)?;
        } else {
            self.tensor = (&self.tensor * scale).ctx(FUNC)?;
            self.owned = true;
        }
        Ok(())
    }
}

/// `a + b` of two contiguous CPU f32 tensors of one shape, split over candle's threads (the
/// same bits as candle's `a + b`); `None` for other tensors.
fn cpu_sum(a: &Tensor, b: &Tensor) -> candle_core::Result<Option<Tensor>> {
    if !(a.device().is_cpu() && a.dims() == b.dims()) {
        return Ok(None);
    }
    let sum = cpu_f32s(a, |x| cpu_f32s(b, |y| Ok(crate::cpu_loops::sum(x, y))))?;
    sum.flatten()
        .map(|s| Tensor::from_vec(s, a.shape(), a.device()))
        .transpose()
}

/// `f` of the elements of a contiguous CPU f32 tensor; `None` for any other tensor.
fn cpu_f32s<R>(
    t: &Tensor,
    f: impl FnOnce(&[f32]) -> candle_core::Result<R>,
) -> candle_core::Result<Option<R>> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(s) => crate::inplace::contiguous_f32s(s, layout)
            .map(f)
            .transpose(),
        _ => Ok(None),
    }
}

/// `‖t‖²` of a contiguous CPU f32 tensor with the bits of candle's `t.sqr().sum_all()`, without
/// the buffer of squares; `None` for any other tensor (or where candle's order is not known).
fn cpu_squared_norm(t: &Tensor) -> candle_core::Result<Option<f32>> {
    Ok(cpu_f32s(t, |x| Ok(crate::cpu_loops::sum_of_squares(x)))?.flatten())
}

/// `[sum, g]` for each `(name, g)` of `list`, the sum of `name` from `sums`.
#[cfg(feature = "cuda")]
fn sum_pairs<'a>(
    sums: &'a BTreeMap<String, Sum>,
    list: &[&'a (String, Tensor)],
) -> Result<Vec<[&'a Tensor; 2]>> {
    list.iter()
        .map(|(name, g)| match sums.get(name) {
            Some(s) => Ok([&s.tensor, g]),
            None => Err(Error::value(FUNC, name, "a gradient sum", "none")),
        })
        .collect()
}

impl Gradients {
    /// No gradients yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the gradients of one backward pass for `params`.
    ///
    /// # Errors
    /// When two gradients of a parameter cannot be added (shape mismatch).
    pub fn accumulate(&mut self, store: &GradStore, params: &[(String, Var)]) -> Result<()> {
        let _p = params
            .first()
            .map(|(_, v)| atomrl_core::profile::phase("grads.accumulate", v.device()));
        let mut incoming = Vec::with_capacity(params.len());
        for (name, var) in params {
            let Some(g) = store.get(var.as_tensor()) else {
                continue;
            };
            let tensor = g.to_dtype(DType::F32).ctx(FUNC)?;
            let sum = Sum {
                tensor,
                owned: false,
            };
            incoming.push((name.clone(), sum));
        }
        self.add_sums(incoming)
    }

    /// Adds each `(name, g)` to the sum of `name`; a first gradient is kept as it is. On CUDA
    /// the additions go in one multi-tensor launch instead of one per parameter.
    fn add_sums(&mut self, incoming: Vec<(String, Sum)>) -> Result<()> {
        let mut batched: Vec<(String, Tensor)> = Vec::new();
        for (name, g) in incoming {
            match self.sums.get_mut(&name) {
                Some(sum) if sum.adds_in_one_launch(&g.tensor) => batched.push((name, g.tensor)),
                Some(sum) => sum.add(&g.tensor)?,
                None => {
                    self.sums.insert(name, g);
                }
            }
        }
        if batched.is_empty() {
            return Ok(());
        }
        self.add_in_one_launch(batched)
    }

    /// Adds each `(name, g)` to the sum of `name` in one CUDA launch: into the sum's buffer when
    /// it is ours, else into a new buffer that is.
    #[cfg(feature = "cuda")]
    fn add_in_one_launch(&mut self, batched: Vec<(String, Tensor)>) -> Result<()> {
        let (owned, shared): (Vec<_>, Vec<_>) = batched
            .iter()
            .partition(|(name, _)| self.sums.get(name).is_some_and(|s| s.owned));
        let made = crate::cuda::add_multi(
            &sum_pairs(&self.sums, &owned)?,
            &sum_pairs(&self.sums, &shared)?,
        )
        .ctx(FUNC)?;
        let names: Vec<String> = shared.iter().map(|(name, _)| name.clone()).collect();
        for (name, tensor) in names.into_iter().zip(made) {
            self.sums.insert(
                name,
                Sum {
                    tensor,
                    owned: true,
                },
            );
        }
        Ok(())
    }

    /// Without the `cuda` feature no sum is batched ([`Sum::adds_in_one_launch`]).
    #[cfg(not(feature = "cuda"))]
    fn add_in_one_launch(&mut self, batched: Vec<(String, Tensor)>) -> Result<()> {
        Err(Error::value(
            FUNC,
            "gradients",
            "CPU tensors",
            format!("{} CUDA sums without the `cuda` feature", batched.len()),
        ))
    }

    /// Adds `other`'s gradients to these (`self + other`, element by element, in f32); a
    /// parameter only one of them has keeps that gradient. Data-parallel workers each sum
    /// their own micro-batches, then the workers' sums are added in worker order.
    ///
    /// # Errors
    /// When two gradients of a parameter have different shapes.
    ///
    /// ```
    /// use atomrl_optim::Gradients;
    /// use candle_core::{Device, Var};
    /// let w = Var::new(&[3f32, 4.0], &Device::Cpu)?;
    /// let params = [("w".to_string(), w.clone())];
    /// let store = w.as_tensor().sum_all()?.backward()?; // gradient [1, 1]
    /// let (mut a, mut b) = (Gradients::new(), Gradients::new());
    /// a.accumulate(&store, &params)?;
    /// b.accumulate(&store, &params)?;
    /// a.add(b)?;
    /// assert_eq!(a.get("w").unwrap().to_vec1::<f32>()?, vec![2.0, 2.0]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn add(&mut self, other: Gradients) -> Result<()> {
        self.add_sums(other.sums.into_iter().collect())
    }

    /// Sums these gradients over the ranks of `comm` (in rank order, bit-identical on every
    /// rank; see [`Collective::all_reduce_sum_f32`]): one all-reduce of every parameter's
    /// gradient, in the order of `params`, followed by one flag per parameter, so that a
    /// parameter gets a gradient when any rank had one (a rank without one adds zeros) and
    /// none when no rank did. A no-op for a world of one rank.
    ///
    /// # Errors
    /// A failed collective ([`Error::Value`] naming the rank's error), a tensor read failure.
    ///
    /// ```
    /// use atomrl_dist::SingleProcess;
    /// use atomrl_optim::Gradients;
    /// use candle_core::{Device, Var};
    /// let w = Var::new(&[3f32, 4.0], &Device::Cpu)?;
    /// let params = [("w".to_string(), w.clone())];
    /// let mut g = Gradients::new();
    /// g.accumulate(&w.as_tensor().sum_all()?.backward()?, &params)?;
    /// g.all_reduce_sum(&params, &SingleProcess)?; // one rank: unchanged
    /// assert_eq!(g.get("w").unwrap().to_vec1::<f32>()?, vec![1.0, 1.0]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_reduce_sum(
        &mut self,
        params: &[(String, Var)],
        comm: &dyn Collective,
    ) -> Result<()> {
        if comm.world_size() <= 1 {
            return Ok(());
        }
        let sizes: Vec<usize> = params
            .iter()
            .map(|(_, v)| v.as_tensor().elem_count())
            .collect();
        let total: usize = sizes.iter().sum();
        let mut flat = Vec::with_capacity(total + params.len());
        for ((name, _), &n) in params.iter().zip(&sizes) {
            match self.sums.get(name) {
                Some(g) => flat.extend(
                    g.tensor
                        .flatten_all()
                        .and_then(|g| g.to_vec1::<f32>())
                        .ctx(FUNC)?,
                ),
                None => flat.resize(flat.len() + n, 0.0),
            }
        }
        flat.extend(
            params
                .iter()
                .map(|(name, _)| f32::from(u8::from(self.sums.contains_key(name)))),
        );
        comm.all_reduce_sum_f32(&mut flat)
            .map_err(|e| Error::value(FUNC, "gradients", "an all-reduce over every rank", e))?;
        let mut offset = 0;
        for (i, ((name, var), &n)) in params.iter().zip(&sizes).enumerate() {
            let piece = &flat[offset..offset + n];
            offset += n;
            if flat[total + i] > 0.0 {
                let t = var.as_tensor();
                let g = Tensor::from_slice(piece, t.dims(), t.device()).ctx(FUNC)?;
                self.sums.insert(
                    name.clone(),
                    Sum {
                        tensor: g,
                        owned: true,
                    },
                );
            } else {
                self.sums.remove(name);
            }
        }
        Ok(())
    }

    /// The summed gradient of `name`.
    pub fn get(&self, name: &str) -> Option<Tensor> {
        self.sums.get(name).map(|s| s.tensor.clone())
    }

    /// `sqrt(Σ ‖g‖²)` over every parameter (computed in f64; NaN/Inf propagate).
    ///
    /// # Errors
    /// A tensor read failure.
    pub fn global_norm(&self) -> Result<f64> {
        #[cfg(feature = "cuda")]
        if let Some(total) = self.cuda_squared_norm()? {
            return Ok(total.sqrt());
        }
        if let Some(total) = self.cpu_squared_norm()? {
            return Ok(total.sqrt());
        }
        // Every squared norm stays on the device until one read at the end: on a GPU, one
        // host synchronisation per step instead of one per parameter. The f32 partial sums
        // are added in f64 in name order, as before, so the norm is unchanged to the bit.
        let partials = self
            .sums
            .values()
            .map(|g| g.tensor.sqr().and_then(|x| x.sum_all()))
            .collect::<candle_core::Result<Vec<_>>>()
            .ctx(FUNC)?;
        if partials.is_empty() {
            return Ok(0.0);
        }
        let host = Tensor::stack(&partials, 0)
            .and_then(|p| p.to_vec1::<f32>())
            .ctx(FUNC)?;
        let total: f64 = host.iter().map(|&s| s as f64).sum();
        Ok(total.sqrt())
    }

    /// `Σ ‖g‖²` on the CPU without a buffer of squares: each parameter's f32 sum in candle's
    /// order ([`cpu_squared_norm`]), the parameters shared among candle's threads, the sums
    /// added in f64 in name order: the bits of the tensor-op form below. `None` unless every
    /// gradient is a contiguous CPU f32 tensor.
    fn cpu_squared_norm(&self) -> Result<Option<f64>> {
        use rayon::prelude::*;
        let ts: Vec<&Tensor> = self.sums.values().map(|s| &s.tensor).collect();
        if ts.is_empty() || !ts.iter().all(|t| t.device().is_cpu()) {
            return Ok(None);
        }
        // With one compute thread the loop stays on this thread: handing it to rayon's
        // one-thread pool would start that thread, which then holds a malloc arena the
        // data-parallel workers need (atomrl_core::allocator::arenas_for_workers).
        let partials = if candle_core::utils::get_num_threads() > 1 {
            ts.par_iter()
                .map(|t| cpu_squared_norm(t))
                .collect::<candle_core::Result<Vec<_>>>()
        } else {
            ts.iter().map(|t| cpu_squared_norm(t)).collect()
        }
        .ctx(FUNC)?;
        Ok(partials
            .into_iter()
            .collect::<Option<Vec<f32>>>()
            .map(|p| p.iter().map(|&s| s as f64).sum()))
    }

    /// `Σ ‖g‖²` from AtomRL's CUDA squared-norm kernel (every SM busy, one host copy), when
    /// every gradient is an f32 CUDA tensor and the kernels are on; else `None`.
    #[cfg(feature = "cuda")]
    fn cuda_squared_norm(&self) -> Result<Option<f64>> {
        let ts: Vec<&Tensor> = self.sums.values().map(|s| &s.tensor).collect();
        if ts.is_empty()
            || !ts.iter().all(|t| t.device().is_cuda())
            || !crate::inplace::applies(&ts)
        {
            return Ok(None);
        }
        let norms = crate::cuda::squared_norms(&ts).ctx(FUNC)?;
        Ok(Some(norms.iter().sum()))
    }

    /// Scales every gradient so that the global norm is at most `max_norm` (PyTorch's
    /// `clip_grad_norm_`: factor `max_norm / (norm + 1e-6)` when `norm > max_norm`); returns
    /// the norm before clipping. `max_norm = 0` disables clipping.
    ///
    /// # Errors
    /// A tensor operation failure.
    ///
    /// ```
    /// use atomrl_optim::Gradients;
    /// use candle_core::{Device, Var};
    /// let w = Var::new(&[3f32, 4.0], &Device::Cpu)?;
    /// let store = w.as_tensor().sum_all()?.backward()?; // gradient [1, 1]
    /// let mut g = Gradients::new();
    /// g.accumulate(&store, &[("w".into(), w.clone())])?;
    /// g.accumulate(&store, &[("w".into(), w)])?;       // two micro-batches: [2, 2]
    /// let norm = g.clip_global_norm(1.0)?;
    /// assert!((norm - 8f64.sqrt()).abs() < 1e-6);
    /// assert!((g.global_norm()? - 1.0).abs() < 1e-5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn clip_global_norm(&mut self, max_norm: f64) -> Result<f64> {
        let _p = self.profile_phase("grads.clip");
        let (norm, factor) = self.norm_and_clip_factor(max_norm)?;
        if let Some(scale) = factor {
            for g in self.sums.values_mut() {
                g.scale(scale)?;
            }
        }
        Ok(norm)
    }

    /// A profile phase on the gradients' device (none without gradients).
    fn profile_phase(&self, name: &'static str) -> Option<atomrl_core::profile::Phase> {
        self.sums
            .values()
            .next()
            .map(|s| atomrl_core::profile::phase(name, s.tensor.device()))
    }

    /// The global norm and the factor [`clip_global_norm`](Gradients::clip_global_norm)
    /// would scale every gradient by (`None`: the norm is within `max_norm`, not finite, or
    /// clipping is off), leaving the gradients as they are: for
    /// [`AdamW::step_scaled`](crate::AdamW::step_scaled), which applies the factor as it
    /// reads each gradient.
    ///
    /// # Errors
    /// A tensor read failure.
    ///
    /// ```
    /// use atomrl_optim::Gradients;
    /// use candle_core::{Device, Var};
    /// let w = Var::new(&[3f32, 4.0], &Device::Cpu)?;
    /// let store = w.as_tensor().sqr()?.sum_all()?.backward()?; // gradient [6, 8]
    /// let mut g = Gradients::new();
    /// g.accumulate(&store, &[("w".into(), w)])?;
    /// let (norm, factor) = g.clip_factor(5.0)?;
    /// assert!((norm - 10.0).abs() < 1e-6);
    /// assert!((factor.unwrap() - 5.0 / (10.0 + 1e-6)).abs() < 1e-12);
    /// assert_eq!(g.clip_factor(20.0)?.1, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn clip_factor(&self, max_norm: f64) -> Result<(f64, Option<f64>)> {
        let _p = self.profile_phase("grads.clip");
        self.norm_and_clip_factor(max_norm)
    }

    /// [`clip_factor`](Gradients::clip_factor) without a profile phase.
    fn norm_and_clip_factor(&self, max_norm: f64) -> Result<(f64, Option<f64>)> {
        let norm = self.global_norm()?;
        let clip = max_norm > 0.0 && norm.is_finite() && norm > max_norm;
        Ok((norm, clip.then(|| max_norm / (norm + 1e-6))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Three backward passes of `Σ w · r_k` (gradient `r_k`), with `w` used twice in the
    /// first so that its gradient is a sum candle made.
    fn stores(w: &Var) -> Vec<(GradStore, Tensor)> {
        (0..3)
            .map(|k| {
                let r: Vec<f32> = (0..300)
                    .map(|i| ((i * 7 + k * 13) as f32 * 0.37).sin() * 1e-2)
                    .collect();
                let r = Tensor::from_vec(r, 300, &Device::Cpu).expect("r");
                let loss = (w.as_tensor() * &r)
                    .and_then(|x| x.sum_all())
                    .expect("loss");
                let store = loss.backward().expect("backward");
                let g = store
                    .get(w.as_tensor())
                    .expect("grad")
                    .copy()
                    .expect("copy");
                (store, g)
            })
            .collect()
    }

    #[test]
    fn in_place_sums_and_clipping_equal_the_tensor_ops_and_leave_the_stores_alone() {
        let w = Var::from_vec(vec![0.5f32; 300], 300, &Device::Cpu).expect("w");
        let params = [("w".to_string(), w.clone())];
        let runs = stores(&w);
        let mut grads = Gradients::new();
        for (store, _) in &runs {
            grads.accumulate(store, &params).expect("accumulate");
        }
        let expected = ((&runs[0].1 + &runs[1].1).expect("sum") + &runs[2].1).expect("sum");
        let got = grads.get("w").expect("w");
        assert_eq!(
            got.to_vec1::<f32>().expect("got"),
            expected.to_vec1::<f32>().expect("expected")
        );
        // The backward passes' own tensors are untouched by the in-place additions.
        for (store, original) in &runs {
            let now = store.get(w.as_tensor()).expect("grad");
            assert_eq!(
                now.to_vec1::<f32>().expect("now"),
                original.to_vec1::<f32>().expect("original")
            );
        }
        let norm = grads.global_norm().expect("norm");
        grads.clip_global_norm(norm / 4.0).expect("clip");
        let scaled = (expected * ((norm / 4.0) / (norm + 1e-6))).expect("scaled");
        assert_eq!(
            grads
                .get("w")
                .expect("w")
                .to_vec1::<f32>()
                .expect("clipped"),
            scaled.to_vec1::<f32>().expect("scaled")
        );
    }

    /// The CPU norm (no buffer of squares, parameters on several threads) against the
    /// tensor-op form, to the bit, over parameters around candle's 32-element blocks and a few
    /// large ones.
    #[test]
    fn the_cpu_norm_has_the_bits_of_the_tensor_ops() {
        let mut grads = Gradients::new();
        let mut expected = 0f64;
        for (i, n) in [1usize, 31, 32, 33, 300, 70_001, 300_007]
            .into_iter()
            .enumerate()
        {
            let v: Vec<f32> = (0..n)
                .map(|j| ((j * 7 + i * 13) as f32 * 0.37).sin() * 1e-2)
                .collect();
            let g = Tensor::from_vec(v, n, &Device::Cpu).expect("g");
            let square_sum: f32 = g
                .sqr()
                .and_then(|x| x.sum_all())
                .and_then(|x| x.to_scalar())
                .expect("tensor ops");
            expected += square_sum as f64;
            let sum = Sum {
                tensor: g,
                owned: false,
            };
            grads.add_sums(vec![(format!("p{i}"), sum)]).expect("add");
        }
        let norm = grads.global_norm().expect("norm");
        assert_eq!(norm.to_bits(), expected.sqrt().to_bits());
    }

    #[test]
    fn a_single_micro_batch_is_clipped_without_touching_its_store() {
        let w = Var::from_vec(vec![0.5f32; 300], 300, &Device::Cpu).expect("w");
        let params = [("w".to_string(), w.clone())];
        let runs = stores(&w);
        let mut grads = Gradients::new();
        grads.accumulate(&runs[0].0, &params).expect("accumulate");
        grads.clip_global_norm(1e-6).expect("clip");
        let now = runs[0].0.get(w.as_tensor()).expect("grad");
        assert_eq!(
            now.to_vec1::<f32>().expect("now"),
            runs[0].1.to_vec1::<f32>().expect("original")
        );
    }
}
