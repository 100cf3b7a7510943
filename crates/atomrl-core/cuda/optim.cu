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

// AdamW's whole update of one parameter in one pass (adamw_kernel.rs, UpdateScalars::apply):
// g = g * grad_scale + 0 when has_scale; m = (m * beta1 + 0) + (g * (1 - beta1) + 0);
// v = (v * beta2 + 0) + (g * g * (1 - beta2) + 0);
// theta = decayed - (update * lr + 0), update = (m * inv1 + 0) / (sqrt(v * inv2 + 0) * 1 + eps),
// decayed = theta * decay + 0 when has_decay, else theta.
extern "C" __global__ void atomrl_adamw_f32(float *theta, float *m, float *v, const float *g,
                                            float grad_scale, int has_scale, float beta1,
                                            float one_minus_beta1, float beta2,
                                            float one_minus_beta2, float inv1, float inv2,
                                            float eps, float lr, float decay, int has_decay,
                                            size_t n) {
    GRID_STRIDE(i, n) {
        float gi = g[i];
        if (has_scale) gi = __fadd_rn(__fmul_rn(gi, grad_scale), 0.0f);
        float mi = __fadd_rn(__fadd_rn(__fmul_rn(m[i], beta1), 0.0f),
                             __fadd_rn(__fmul_rn(gi, one_minus_beta1), 0.0f));
        float vi = __fadd_rn(__fadd_rn(__fmul_rn(v[i], beta2), 0.0f),
                             __fadd_rn(__fmul_rn(__fmul_rn(gi, gi), one_minus_beta2), 0.0f));
        m[i] = mi;
        v[i] = vi;
        float mh = __fadd_rn(__fmul_rn(mi, inv1), 0.0f);
        float vh = __fadd_rn(__fmul_rn(vi, inv2), 0.0f);
        float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vh), 1.0f), eps);
        float update = __fdiv_rn(mh, denom);
        float t = theta[i];
        float decayed = has_decay ? __fadd_rn(__fmul_rn(t, decay), 0.0f) : t;
        theta[i] = __fsub_rn(decayed, __fadd_rn(__fmul_rn(update, lr), 0.0f));
    }
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
