// In-place optimizer kernels for f32 CUDA tensors (launched by atomrl-optim, feature `cuda`).
//
// Each replaces a chain of candle tensor ops that allocated a fresh buffer per op: gradient
// accumulation (a += b), clipping (a *= s) and AdamW's update (both moments and the parameter).
// Arithmetic is the CPU kernels' (adamw_kernel.rs, inplace.rs), operation for operation, with the
// round-to-nearest intrinsics so that nvcc cannot contract a multiply and an add into an FMA: the
// results equal the CPU's f32 results bit for bit (checked by `xtask device-check`).
//
// Grid-stride loops: one launch covers a tensor of any size with a bounded grid.

#include "common.cuh"

// a[i] += b[i]
extern "C" __global__ void atomrl_add_assign_f32(float *a, const float *b, size_t n) {
    GRID_STRIDE(i, n) { a[i] = __fadd_rn(a[i], b[i]); }
}

// a[i] = a[i] * s + 0 (candle's affine with add = 0, as `tensor * scalar`)
extern "C" __global__ void atomrl_scale_f32(float *a, float s, size_t n) {
    GRID_STRIDE(i, n) { a[i] = __fadd_rn(__fmul_rn(a[i], s), 0.0f); }
}

// AdamW's scalars for one step (adamw_kernel.rs, UpdateScalars), passed by value.
struct AdamWArgs {
    float grad_scale;
    int has_scale;
    float beta1, one_minus_beta1, beta2, one_minus_beta2, inv1, inv2, eps, lr, decay;
    int has_decay;
};

// AdamW's whole update of element i of one parameter (adamw_kernel.rs, UpdateScalars::apply):
// g = g * grad_scale + 0 when has_scale; m = (m * beta1 + 0) + (g * (1 - beta1) + 0);
// v = (v * beta2 + 0) + (g * g * (1 - beta2) + 0);
// theta = decayed - (update * lr + 0), update = (m * inv1 + 0) / (sqrt(v * inv2 + 0) * 1 + eps),
// decayed = theta * decay + 0 when has_decay, else theta.
__device__ __forceinline__ void adamw_element(float *theta, float *m, float *v, const float *g,
                                              size_t i, const AdamWArgs &s) {
    float gi = g[i];
    if (s.has_scale) gi = __fadd_rn(__fmul_rn(gi, s.grad_scale), 0.0f);
    float mi = __fadd_rn(__fadd_rn(__fmul_rn(m[i], s.beta1), 0.0f),
                         __fadd_rn(__fmul_rn(gi, s.one_minus_beta1), 0.0f));
    float vi = __fadd_rn(__fadd_rn(__fmul_rn(v[i], s.beta2), 0.0f),
                         __fadd_rn(__fmul_rn(__fmul_rn(gi, gi), s.one_minus_beta2), 0.0f));
    m[i] = mi;
    v[i] = vi;
    float mh = __fadd_rn(__fmul_rn(mi, s.inv1), 0.0f);
    float vh = __fadd_rn(__fmul_rn(vi, s.inv2), 0.0f);
    float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vh), 1.0f), s.eps);
    float update = __fdiv_rn(mh, denom);
    float t = theta[i];
    float decayed = s.has_decay ? __fadd_rn(__fmul_rn(t, s.decay), 0.0f) : t;
    theta[i] = __fsub_rn(decayed, __fadd_rn(__fmul_rn(update, s.lr), 0.0f));
}

// part[blockIdx.x] = Σ a[i]² over the elements this block's threads stride over (f32). With a
// fixed grid the partial sums, and their sum on the host, are the same on every run: a
// deterministic squared norm in one pass with every SM busy (candle's sum_all reduces a whole
// tensor in one block).
extern "C" __global__ void atomrl_sq_norm_part_f32(const float *a, float *part, size_t n) {
    float acc = 0.0f;
    GRID_STRIDE(i, n) { acc += a[i] * a[i]; }
    acc = block_sum(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

// ---- Multi-tensor launches: one launch over every parameter of a model instead of one per
// parameter (~290 at Qwen2.5-0.5B's shape), the way apex's and PyTorch's `_foreach` optimizers
// do. A table in device memory lists the tensors; each owns a run of the grid's blocks, which
// stride over its elements as a launch of that many blocks would on the tensor alone, so the
// results are those of the per-tensor launches to the bit (atomrl-optim's sim tests).

// One tensor of a multi-tensor launch (atomrl-optim's cuda.rs writes it as 7 u64s): up to four
// f32 buffers of `n` elements (AdamW: the parameter, m, v and the gradient; the squared norm:
// the tensor alone) and the blocks first_block .. first_block + blocks that own them.
struct MultiTensorEntry {
    float *buf[4];
    unsigned long long n;
    unsigned long long first_block;
    unsigned long long blocks;
};

// The entry that owns this block: the last one whose first block is at or before it (the
// table is sorted by first_block, the first at 0, every entry with at least one block).
__device__ __forceinline__ const MultiTensorEntry *owning_entry(const MultiTensorEntry *table,
                                                                int count) {
    const unsigned long long b = blockIdx.x;
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (table[mid].first_block <= b) lo = mid;
        else hi = mid - 1;
    }
    return &table[lo];
}

// The grid-stride loop of GRID_STRIDE over one entry's elements with its blocks alone.
#define ENTRY_STRIDE(i, e)                                                                   \
    for (size_t i = (size_t)(blockIdx.x - (e)->first_block) * blockDim.x + threadIdx.x;     \
         i < (e)->n; i += (size_t)blockDim.x * (e)->blocks)

// AdamW's update (adamw_element) of every entry of the table: buf = (theta, m, v, g).
extern "C" __global__ void atomrl_adamw_multi_f32(const MultiTensorEntry *table, int count,
                                                  AdamWArgs s) {
    const MultiTensorEntry *e = owning_entry(table, count);
    float *theta = e->buf[0], *m = e->buf[1], *v = e->buf[2];
    const float *g = e->buf[3];
    ENTRY_STRIDE(i, e) { adamw_element(theta, m, v, g, i, s); }
}

// atomrl_sq_norm_part_f32 over every entry of the table (buf[0] the tensor): part[blockIdx.x]
// is the partial sum a launch of the entry's blocks on that tensor alone writes.
extern "C" __global__ void atomrl_sq_norm_multi_f32(const MultiTensorEntry *table, int count,
                                                    float *part) {
    const MultiTensorEntry *e = owning_entry(table, count);
    const float *a = e->buf[0];
    float acc = 0.0f;
    ENTRY_STRIDE(i, e) { acc += a[i] * a[i]; }
    acc = block_sum(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

// buf[0] = buf[1] + buf[2] over every entry of the table, in place when buf[0] is buf[1]: a
// micro-batch's gradients added to the sums in one launch, into the sums' own buffers or, for a
// sum that is still a backward's gradient, into a new one.
extern "C" __global__ void atomrl_add_multi_f32(const MultiTensorEntry *table, int count) {
    const MultiTensorEntry *e = owning_entry(table, count);
    float *out = e->buf[0];
    const float *a = e->buf[1], *b = e->buf[2];
    ENTRY_STRIDE(i, e) { out[i] = __fadd_rn(a[i], b[i]); }
}
